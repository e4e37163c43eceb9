"""Rate sweeps: one run per (policy, rate), then the capacity of each policy.

Why: a single rate says little about a scheduler; the number a paper quotes is the largest
rate it sustains while meeting its SLOs (design.md "Metrics"; seed-stability.md §4.7:
"λ̂_max is the largest λ judged STABLE"). A sweep runs simulated (``harness.engine.simulate``:
all policies replay the same trace at each rate, so comparisons are paired) or live
(``harness.loadgen.replay`` against a target or the built-in engine).

Capacity rule (ours, where the specs leave room): a rate *fails* when its stability verdict
is ``unstable`` or a tier with an SLO has ``slo_attainment < min_attainment`` (summary.json
``tiers.<name>.slo_attainment``). It *passes* when it is ``stable`` and meets the SLOs, and
is *unconfirmed* when it meets the SLOs but the run was too short to judge stability
(``inconclusive``): that is not evidence of overload, so it does not end the capacity (issue
20), but the capacity is then ``confirmed: false`` with a hint to run longer.
``capacity_rps`` is the largest swept rate such that no rate up to it fails (a noisy pass
above a failure does not count); ``max_passing_rate`` is the largest passing rate
regardless. ``by_tier``: the same rule with only that tier's attainment (and stability).
A session run (summary.json ``sessions``; issue 15) is judged per session instead: a tier's
attainment is the share of its sessions whose every call met the SLOs, and the rates and
capacities are sessions/s (``unit``).

Output: ``<out>/sweep.json`` (this module's :func:`sweep_summary`) and the run directories
under ``<out>/``; the report reads sweep.json to draw latency/throughput vs rate.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from harness.results import schema
from harness.results.rundir import read_run, write_json

SWEEP_JSON = "sweep.json"
_RANGE = re.compile(r"^\s*([0-9.eE+-]+)\s*:\s*([0-9.eE+-]+)\s*:\s*([0-9.eE+-]+)\s*$")


def parse_rates(text: str) -> list[float]:
    """``"10,20,40"`` or ``"START:STOP:STEP"`` (STOP included within rounding) -> sorted rates.

    Raises ValueError with a one-line message on anything else (non-positive, empty, a step
    that does not advance, more than 200 points)."""
    text = (text or "").strip()
    if not text:
        raise ValueError("--rates: give e.g. 10,20,40 or 5:50:5")
    m = _RANGE.match(text)
    try:
        if m:
            a, b, step = (float(x) for x in m.groups())
            if step <= 0 or b < a:
                raise ValueError(f"--rates {text!r}: need A <= B and STEP > 0")
            n = int(math.floor((b - a) / step + 1e-9)) + 1
            rates = [round(a + k * step, 10) for k in range(n)]
        else:
            rates = [float(x) for x in text.split(",") if x.strip()]
    except ValueError as e:
        if "--rates" in str(e):
            raise
        msg = f"--rates {text!r}: not numbers (use 10,20,40 or START:STOP:STEP)"
        raise ValueError(msg) from None
    if not rates or any(not (r > 0 and math.isfinite(r)) for r in rates):
        raise ValueError(f"--rates {text!r}: every rate must be a positive number of req/s")
    if len(rates) > 200:
        raise ValueError(f"--rates {text!r}: {len(rates)} points; at most 200")
    return sorted(set(rates))


class SweepConfig(BaseModel):
    """A sweep: rates × policies, simulated or live, with the base run's options."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rates: list[float] = Field(min_length=1, description="offered rates, req/s")
    policies: list[str] = Field(
        min_length=1, description="policy names (live against an external target: labels)"
    )
    mode: Literal["simulate", "live"] = Field("simulate", description="simulator or replay")
    base: dict[str, Any] = Field(
        default_factory=dict,
        description="SimulateConfig (simulate) or ReplayConfig (live) fields besides rate, "
        "policy and output folder",
    )
    out_dir: Path = Field(Path("reports/sweep"), description="sweep folder (sweep.json, runs)")
    min_attainment: float = Field(
        0.9, ge=0, le=1, description="per-tier SLO attainment a rate needs to pass"
    )
    report: bool = Field(True, description="write <out_dir>/report.html")
    repeats: int = Field(1, ge=1, description="runs per (policy, rate), seeds seed, seed+1, ...")
    warmup: dict[str, Any] | None = Field(
        None, description="harness.results.warmup spec applied to every run"
    )

    @field_validator("rates")
    @classmethod
    def _rates(cls, v: list[float]) -> list[float]:
        if any(not (r > 0 and math.isfinite(r)) for r in v):
            raise ValueError("every rate must be > 0 req/s")
        return sorted(set(v))


def sweep_point(run_dir: Path, policy: str, rate: float, min_attainment: float) -> dict[str, Any]:
    """One sweep row from a finished run directory (summary.json written if missing)."""
    run_dir = Path(run_dir)
    if not (run_dir / schema.SUMMARY_JSON).is_file():
        from harness.results.summary import write_summary

        write_summary(run_dir)
    summary = json.loads((run_dir / schema.SUMMARY_JSON).read_text(encoding="utf-8"))
    stab = summary.get("stability") or {}
    if not stab.get("verdict") or stab.get("verdict") == "error":
        from harness.results.stability import analyze_stability

        stab = analyze_stability(read_run(run_dir))
    tiers = summary.get("tiers") or {}
    att = {name: t.get("slo_attainment") for name, t in tiers.items()}
    sessions = _session_block(run_dir, summary)
    if sessions is not None:
        att = session_attainment(tiers, sessions)
    meets = all(a is None or a >= min_attainment for a in att.values())
    verdict = stab.get("verdict", "inconclusive")
    return {
        "unit": "req/s" if sessions is None else "sessions/s",
        **({} if sessions is None else {"sessions": _session_keys(sessions)}),
        "policy": policy,
        "rate": float(rate),
        "run_dir": run_dir.name,
        "verdict": verdict,
        "backlog_slope_rps": stab.get("backlog_slope_rps"),
        "backlog_slope_ci": stab.get("backlog_slope_ci"),
        "stability_reason": stab.get("reason"),
        "rho": stab.get("rho"),
        "meets_slos": bool(meets),
        "slo_attainment": att,
        "tier_meets": {n: a is None or a >= min_attainment for n, a in att.items()},
        "passes": bool(meets and verdict == "stable"),
        "fails": bool(not meets or verdict == "unstable"),
        "num_requests": len_requests(summary),
        "tiers": {name: {k: t.get(k) for k in TIER_KEYS} for name, t in tiers.items()},
        **{
            k: summary.get(k)
            for k in (
                "completed",
                "failed",
                "duration",
                "request_throughput",
                "output_throughput",
                "mean_ttft_ms",
                "p99_ttft_ms",
                "p99_itl_ms",
                "p99_tpot_ms",
                "p99_e2el_ms",
                "send_lag_p99_ms",
                "valid",
            )
        },
    }


def _session_block(run_dir: Path, summary: dict[str, Any]) -> dict[str, Any] | None:
    """summary.json["sessions"] of a session run (computed when a rewrite, e.g. the warm-up
    cut, dropped it); None for a plain run."""
    if summary.get("sessions"):
        return summary["sessions"]
    if not (run_dir / schema.SESSIONS_FILE).is_file():
        return None
    from harness.results.sessions import add_session_summary

    return add_session_summary(run_dir)


def session_attainment(tiers: dict[str, Any], sessions: dict[str, Any]) -> dict[str, float | None]:
    """Per tier: the share of sessions whose every call met the tier's SLOs (issue 15: a
    session sweep judges each rate by the session, not the call); None for a tier without
    an SLO, as for requests."""
    out: dict[str, float | None] = {}
    for name, b in (sessions.get("tiers") or {}).items():
        t = tiers.get(name) or {}
        has_slo = t.get("ttft_slo_ms") is not None or t.get("tbt_slo_ms") is not None
        out[name] = b.get("slo_attainment") if has_slo else None
    return out


def _session_keys(s: dict[str, Any]) -> dict[str, Any]:
    keys = ("sessions", "completed", "abandoned", "slo_attainment", "session_goodput")
    return {
        **{k: s.get(k) for k in (*keys, "sessions_per_s", "calls_per_s")},
        "tiers": {n: {k: b.get(k) for k in keys} for n, b in (s.get("tiers") or {}).items()},
    }


TIER_KEYS = (
    "num_requests",
    "completed",
    "slo_attainment",
    "goodput",
    "p99_ttft_ms",
    "p99_itl_ms",
    "ttft_slo_ms",
    "tbt_slo_ms",
)


def len_requests(summary: dict[str, Any]) -> int:
    return int((summary.get("completed") or 0) + (summary.get("failed") or 0))


def _fails(p: dict[str, Any]) -> bool:
    """Old sweep.json rows have no ``fails``: there inconclusive counted as a failure."""
    if "fails" in p:
        return bool(p["fails"])
    return not p["meets_slos"] or p.get("verdict") == "unstable"


def _largest_run(rows: list[dict[str, Any]], fails: Callable[[dict[str, Any]], bool]) -> Any:
    cap, cap_rows = None, []
    for r in rows:
        if fails(r):
            break
        cap = r["rate"]
        cap_rows.append(r)
    return cap, cap_rows


def run_longer_hint(rows: Sequence[dict[str, Any]]) -> str | None:
    """What would turn ``inconclusive`` rates into verdicts: the stability test needs a
    window of >= 10 mean sojourns and >= 30 arrivals after the warm-up cut
    (harness.results.stability), so the advice is 4x the requests of the longest such run."""
    inc = [r for r in rows if r.get("verdict") == "inconclusive"]
    if not inc:
        return None
    n = max(int(r.get("num_requests") or 0) for r in inc)
    rates = ", ".join(f"{r['rate']:g}" for r in inc)
    more = f"--num-requests {max(4 * n, 1000)}" if n else "a larger --num-requests"
    unit = inc[0].get("unit", "req/s")
    return (
        f"stability inconclusive at {rates} {unit} (run too short to tell a bounded queue from "
        f"a slowly growing one); run longer, e.g. {more}"
    )


def capacities(points: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per policy: ``capacity_rps`` (largest rate with no rate up to it failing),
    ``confirmed`` (every one of those stable), ``max_passing_rate``, ``by_tier`` and the rates
    swept (module docstring)."""
    out: dict[str, dict[str, Any]] = {}
    for pol in dict.fromkeys(p["policy"] for p in points):
        rows = sorted((p for p in points if p["policy"] == pol), key=lambda p: p["rate"])
        cap, cap_rows = _largest_run(rows, _fails)
        passing = [r["rate"] for r in rows if r["passes"]]
        tiers = list(dict.fromkeys(t for r in rows for t in (r.get("slo_attainment") or {})))
        by_tier = {}
        for t in tiers:

            def tier_fails(r: dict[str, Any], t: str = t) -> bool:
                meets = (r.get("tier_meets") or {}).get(t, True)
                return r.get("verdict") == "unstable" or not meets

            by_tier[t] = _largest_run(rows, tier_fails)[0]
        confirmed = bool(cap_rows) and all(r.get("verdict") == "stable" for r in cap_rows)
        out[pol] = {
            "capacity_rps": cap,
            "confirmed": confirmed if cap is not None else None,
            "max_passing_rate": max(passing) if passing else None,
            "rates": [r["rate"] for r in rows],
            "unit": rows[0].get("unit", "req/s"),  # sessions/s: a session sweep
            "by_tier": by_tier,
            "first_failure": next(
                (
                    {"rate": r["rate"], "verdict": r["verdict"], "meets_slos": r["meets_slos"]}
                    for r in rows
                    if _fails(r)
                ),
                None,
            ),
            "hint": run_longer_hint(cap_rows),
        }
    return out


def _agg_verdict(vs: Sequence[str]) -> str:
    """Across seeds: unstable if any seed is, stable if all are, else inconclusive."""
    if "unstable" in vs:
        return "unstable"
    return "stable" if vs and all(v == "stable" for v in vs) else "inconclusive"


def _mean(xs: Sequence[Any]) -> float | None:
    v = [float(x) for x in xs if isinstance(x, int | float) and not isinstance(x, bool)]
    return sum(v) / len(v) if v else None


def _span(xs: Sequence[Any]) -> list[float] | None:
    v = [float(x) for x in xs if isinstance(x, int | float) and not isinstance(x, bool)]
    return [min(v), max(v)] if len(v) > 1 else None


def aggregate_seeds(points: Sequence[dict[str, Any]], min_attainment: float) -> list[dict]:
    """One row per (policy, rate) from its seeds: metric means, per-tier [min, max] over
    seeds (``tiers_ci``), the pooled verdict and the capacity rule on the mean attainment."""
    out = []
    keys = list(dict.fromkeys((p["policy"], p["rate"]) for p in points))
    for pol, rate in keys:
        ps = [p for p in points if p["policy"] == pol and p["rate"] == rate]
        verdict = _agg_verdict([p["verdict"] for p in ps])
        tiers = list(dict.fromkeys(t for p in ps for t in p.get("tiers") or {}))
        tblocks, tci, att = {}, {}, {}
        for t in tiers:
            vals = [(p.get("tiers") or {}).get(t) or {} for p in ps]
            tblocks[t] = {k: _mean([v.get(k) for v in vals]) for k in TIER_KEYS}
            tci[t] = {k: _span([v.get(k) for v in vals]) for k in TIER_KEYS}
            att[t] = tblocks[t]["slo_attainment"]
        if ps[0].get("unit") == "sessions/s":  # judged per session (sweep_point)
            names = dict.fromkeys(t for p in ps for t in p.get("slo_attainment") or {})
            att = {t: _mean([(p["slo_attainment"] or {}).get(t) for p in ps]) for t in names}
        meets = all(a is None or a >= min_attainment for a in att.values())
        row = {
            "unit": ps[0].get("unit", "req/s"),
            "policy": pol,
            "rate": rate,
            "seeds": [p.get("seed") for p in ps],
            "run_dir": ps[0]["run_dir"],
            "verdict": verdict,
            "meets_slos": meets,
            "slo_attainment": att,
            "tier_meets": {t: a is None or a >= min_attainment for t, a in att.items()},
            "passes": meets and verdict == "stable",
            "fails": (not meets) or verdict == "unstable",
            "num_requests": max(int(p.get("num_requests") or 0) for p in ps),
            "tiers": tblocks,
            "tiers_ci": tci,
        }
        for k in (
            "completed",
            "failed",
            "duration",
            "request_throughput",
            "output_throughput",
            "mean_ttft_ms",
            "p99_ttft_ms",
            "p99_itl_ms",
            "p99_tpot_ms",
            "p99_e2el_ms",
            "backlog_slope_rps",
            "send_lag_p99_ms",
        ):
            row[k] = _mean([p.get(k) for p in ps])
        out.append(row)
    return out


def _with_seed_interval(
    caps: dict[str, dict[str, Any]], points: Sequence[dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    """Each policy's capacity per seed and their range (``capacity_lo``/``capacity_hi``): with
    K seeds the range covers the median seed's capacity with probability 1 − 2^(1−K)
    (order statistics; 94% for K = 5)."""
    seeds = sorted({p.get("seed") for p in points if p.get("seed") is not None})
    for pol, c in caps.items():
        per = {}
        for s in seeds:
            sub = [p for p in points if p["policy"] == pol and p.get("seed") == s]
            per[s] = capacities(sub)[pol]["capacity_rps"] if sub else None
        vals = [v for v in per.values() if v is not None]
        c["capacity_by_seed"] = {str(k): v for k, v in per.items()}
        below = any(v is None for v in per.values())
        c["capacity_lo"] = None if below or not vals else min(vals)
        c["capacity_hi"] = max(vals) if vals else None
        if below and vals:
            c["capacity_lo"] = 0.0  # a seed failed at the lowest rate
        c["interval_coverage"] = 1 - 2 ** (1 - len(seeds)) if len(seeds) > 1 else None
    return caps


def sweep_summary(cfg: SweepConfig, points: list[dict[str, Any]]) -> dict[str, Any]:
    if cfg.repeats > 1:
        rows = aggregate_seeds(points, cfg.min_attainment)
        return {
            "kind": "sweep",
            "mode": cfg.mode,
            "rates": cfg.rates,
            "policies": cfg.policies,
            "min_attainment": cfg.min_attainment,
            "repeats": cfg.repeats,
            "base": cfg.base,
            "capacity_rule": "largest rate such that neither it nor any lower rate is "
            "unstable (any seed) or misses a tier's mean SLO attainment >= min_attainment; "
            "capacity_lo/hi: range of the per-seed capacities",
            "runs": rows,
            "seed_runs": points,
            "capacity": _with_seed_interval(capacities(rows), points),
        }
    return {
        "kind": "sweep",
        "mode": cfg.mode,
        "rates": cfg.rates,
        "policies": cfg.policies,
        "min_attainment": cfg.min_attainment,
        "base": cfg.base,
        "capacity_rule": "largest rate such that neither it nor any lower rate is unstable or "
        "misses a tier's SLO attainment >= min_attainment (inconclusive: unconfirmed)",
        "runs": points,
        "capacity": capacities(points),
    }


def _work(cfg: SweepConfig) -> list[float | tuple[float, int]]:
    """The units of a sweep: rates, or (rate, seed) pairs with ``repeats``."""
    if cfg.repeats == 1:
        return list(cfg.rates)
    seed0 = int(cfg.base.get("seed") or 0)
    return [(r, seed0 + i) for i in range(cfg.repeats) for r in cfg.rates]


def _rate_seed(item: float | tuple[float, int]) -> tuple[float, int | None]:
    return (item[0], item[1]) if isinstance(item, tuple) else (item, None)


def _simulate_rate(cfg: SweepConfig, item: float | tuple[float, int]) -> list[tuple[str, Path]]:
    from harness.engine.simulate import SimulateConfig, run_simulation

    rate, seed = _rate_seed(item)
    fields = {
        **cfg.base,
        "rate": rate,
        "policies": list(cfg.policies),
        "out_dir": cfg.out_dir,
        "label": f"r{rate:g}" if seed is None else f"r{rate:g}-s{seed}",
    }
    if seed is not None:
        fields["seed"] = seed
    sim = SimulateConfig(**fields)
    dirs = run_simulation(sim)
    return list(zip(cfg.policies, dirs, strict=True))


def _live_rate(cfg: SweepConfig, item: float | tuple[float, int]) -> list[tuple[str, Path]]:
    from harness.loadgen.replay import ReplayConfig, run_replay

    rate, seed = _rate_seed(item)
    out = []
    for pol in cfg.policies:
        name = f"{pol}-r{rate:g}" if seed is None else f"{pol}-r{rate:g}-s{seed}"
        fields = {**cfg.base, "rate": rate, "out": cfg.out_dir / name}
        if seed is not None:
            fields["seed"] = seed
        if fields.get("target") is None:
            fields["policy"] = pol  # the built-in engine runs the policy
        fields.setdefault("progress", False)
        rcfg = ReplayConfig(**fields)
        run_dir = run_replay(rcfg)
        meta_path = run_dir / schema.RUN_JSON
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        meta.setdefault("policy", pol)
        meta["label"] = f"{pol} @ {rate:g} req/s"
        write_json(meta_path, meta)
        out.append((pol, run_dir))
    return out


def run_sweep(
    cfg: SweepConfig,
    *,
    on_point: Callable[[dict[str, Any]], None] | None = None,
    map_fn: Callable[..., Any] | None = None,
) -> Path:
    """Run every (policy, rate), write sweep.json (after each rate, so a stopped sweep keeps
    what it measured) and the sweep report; return the sweep folder. ``map_fn`` runs the
    rates (default: ``map``, one after another; ``harness.distributed.pool.ray_map``: Ray
    tasks, results in the same order)."""
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    points: list[dict[str, Any]] = []
    runner = _simulate_rate if cfg.mode == "simulate" else _live_rate
    work = _work(cfg)
    mapped = (map_fn or map)(functools.partial(runner, cfg), work)
    for item, pairs in zip(work, mapped, strict=True):
        rate, seed = _rate_seed(item)
        for pol, run_dir in pairs:
            if cfg.warmup:
                from harness.results.summary import apply_warmup

                apply_warmup(run_dir, cfg.warmup)
            p = sweep_point(run_dir, pol, rate, cfg.min_attainment)
            p["run_dir"] = str(Path(run_dir).resolve().relative_to(cfg.out_dir.resolve()))
            if seed is not None:
                p["seed"] = seed
            points.append(p)
            if on_point is not None:
                on_point(p)
        write_json(cfg.out_dir / SWEEP_JSON, sweep_summary(cfg, points))
    if cfg.report:
        from harness.report import write_report

        write_report([cfg.out_dir])
    return cfg.out_dir
