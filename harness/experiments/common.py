"""Shared machinery of the paper reproductions: traces, one simulated configuration, metrics,
comparison tables.

Every configuration is simulated by the engine core (``harness.engine.simulate.write_run``)
into its own run directory (the same format as a live replay), then measured here from that
run directory, so a reader can re-check every number with ``harness report``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from harness.workload.tiers import Tier, parse_tiers
from harness.workload.trace import Trace

# The bundled length profile fitted to each shared sample (scripts/fit_profiles.py).
PROFILE_OF_FILE = {
    "lmsys_sample_lengths.csv": "lmsys",
    "sharegpt4_lengths_llama2.csv": "sharegpt",
    "azure_conv_2023.csv": "azure-conv",
}


def load_lengths(name: str) -> pd.DataFrame:
    """``prompt_len``/``output_len`` columns from a Vidur-style length CSV of the shared data
    folder (``HARNESS_DATA_DIR`` overrides it).

    Where the file is absent (an installed package, a checkout without ``../shared``), the
    experiment still runs on as many rows drawn from the bundled profile fitted to that file,
    announced on stderr; ``attrs["source"]`` says which was used, for the experiment's notes.
    """
    from harness.shared_data import shared_data_dir

    path = shared_data_dir() / name
    if path.is_file():
        df = pd.read_csv(path)
        out = pd.DataFrame(
            {
                "prompt_len": df["num_prefill_tokens"].astype(np.int64),
                "output_len": df["num_decode_tokens"].astype(np.int64),
            }
        )
        out = out[(out.prompt_len >= 1) & (out.output_len >= 1)].reset_index(drop=True)
        out.attrs["source"] = f"{name} ({len(out)} rows, the real sample)"
        return out
    profile = PROFILE_OF_FILE.get(name)
    if profile is None:
        from harness.cli.errors import HarnessError

        raise HarnessError(f"data file {path} not found (set HARNESS_DATA_DIR to its folder)")
    from harness.workload.profile import load_profile
    from harness.workload.sources.base import announce

    prof = load_profile(profile)
    n = int((prof.stats or {}).get("n", 20_000))
    p, o = prof.sample(n, np.random.default_rng([0, 7]))  # fixed: the same rows every run
    out = pd.DataFrame({"prompt_len": p, "output_len": o})
    out.attrs["source"] = (
        f"{n} rows drawn from the bundled profile {profile!r}, because {path} was not found "
        f"(set HARNESS_DATA_DIR to use the real sample)"
    )
    announce(f"experiment lengths: {out.attrs['source']}")
    return out


def make_trace(
    lengths: pd.DataFrame,
    n: int,
    rate: float,
    *,
    seed: int,
    tiers: str | list[Tier] = "default:1.0",
    shuffle: bool = True,
    meta: dict[str, Any] | None = None,
) -> Trace:
    """``n`` rows (shuffled without replacement, like the SLAI code) with Poisson arrivals.

    Arrivals and tiers use their own RNG streams, so changing the rate keeps the same
    requests and the same paid/free split (a rate sweep compares like with like).
    """
    rng = np.random.default_rng([seed, 1])
    idx = rng.permutation(len(lengths)) if shuffle else np.arange(len(lengths))
    idx = np.resize(idx, n)
    rows = lengths.iloc[idx].reset_index(drop=True)
    gaps = np.random.default_rng([seed, 2]).exponential(1.0 / rate, n) if rate < math.inf else 0
    tier_list = parse_tiers(tiers) if isinstance(tiers, str) else tiers
    from harness.workload.tiers import assign_tiers

    df = pd.DataFrame(
        {
            "request_id": [f"r{i}" for i in range(n)],
            "arrival_s": np.cumsum(gaps) if rate < math.inf else np.zeros(n),
            "prompt_len": rows["prompt_len"].to_numpy(),
            "output_len": rows["output_len"].to_numpy(),
            "tier": assign_tiers(n, tier_list, seed),
        }
    )
    return Trace.from_frame(df, tier_list, {"rate": rate, "seed": seed, **(meta or {})})


def typed_trace(
    types: Sequence[tuple[int, int, float]],
    n: int,
    *,
    seed: int,
    meta: dict[str, Any] | None = None,
) -> Trace:
    """Synthetic multi-type Poisson workload: ``(prompt, output, rate)`` per type (WAIT §6.2)."""
    rates = np.array([t[2] for t in types], dtype=float)
    rng = np.random.default_rng([seed, 4])
    kinds = rng.choice(len(types), size=n, p=rates / rates.sum())
    t = np.cumsum(rng.exponential(1.0 / rates.sum(), n))
    tier_list = parse_tiers("default:1.0")
    df = pd.DataFrame(
        {
            "request_id": [f"r{i}" for i in range(n)],
            "arrival_s": t,
            "prompt_len": [types[k][0] for k in kinds],
            "output_len": [types[k][1] for k in kinds],
            "tier": "default",
        }
    )
    return Trace.from_frame(df, tier_list, {"types": [list(x) for x in types], **(meta or {})})


@dataclass
class Config:
    """One simulated configuration: a policy (with parameters) on one trace and engine."""

    label: str
    policy: str
    params: dict[str, Any] = field(default_factory=dict)


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")


def run_config(
    out_dir: Path,
    cfg: Config,
    trace: Trace,
    cost_model: Any,
    engine: Any,
    meta: dict[str, Any] | None = None,
    *,
    stop_at_s: float | None = None,
) -> tuple[Path, dict[str, Any]]:
    """Simulate ``cfg`` on ``trace`` into ``out_dir/<label>`` and return its metrics."""
    import shutil

    from harness.engine.simulate import write_run
    from harness.policies.registry import make_policy
    from harness.results.rundir import read_run

    run_dir = out_dir / slug(cfg.label)
    if run_dir.exists():
        shutil.rmtree(run_dir)
    policy = make_policy(cfg.policy, **cfg.params)
    full_meta = {"experiment_label": cfg.label, "label": cfg.label, **(meta or {})}
    _, res = write_run(run_dir, trace, policy, cost_model, engine, full_meta, stop_at_s=stop_at_s)
    run = read_run(run_dir)
    m = measure(run.requests, run.chunks)
    m["run"] = run
    m["preemptions"] = int(res.counters.get("preemptions_total", 0))
    m["sim_wall_s"] = round(res.wall_s, 3)
    for attr in ("clearings", "flushes", "critical_total", "deferred_total"):
        if hasattr(policy, attr):
            m[attr] = getattr(policy, attr)
    (run_dir / "experiment_metrics.json").write_text(
        json.dumps(_clean({k: v for k, v in m.items() if k != "run"}), indent=2)
    )
    return run_dir, m


def measure(requests: pd.DataFrame, chunks: pd.DataFrame) -> dict[str, Any]:
    """The reproduction's metrics, each with its definition in its name.

    ``ttft_*``: first token - arrival, over requests that got a token. ``tbt_p99_<tier>``:
    P99 of pooled inter-token gaps per tier (first token excluded; seed-rad-slai.md §7 #15).
    ``e2e_mean_s``: mean (last token - arrival) over finished requests (MC-SF's AEL).
    ``decode_tput``: output tokens of finished requests / makespan (WAIT's throughput).
    """
    req = requests
    ok = req["success"].to_numpy(bool)
    arr = req["arrival_s"].to_numpy(float)
    first = req["first_chunk_s"].to_numpy(float)
    last = req["last_chunk_s"].to_numpy(float)
    ttft = first - arr
    has = ~np.isnan(ttft)
    makespan = float(np.nanmax(last) - arr.min()) if has.any() else float("nan")
    out: dict[str, Any] = {
        "requests": int(len(req)),
        "finished": int(ok.sum()),
        "ttft_median_s": float(np.median(ttft[has])) if has.any() else float("nan"),
        "ttft_mean_s": float(np.mean(ttft[has])) if has.any() else float("nan"),
        "e2e_mean_s": float(np.mean((last - arr)[ok])) if ok.any() else float("nan"),
        "decode_tput": float(req["output_tokens"].to_numpy()[ok].sum() / makespan)
        if ok.any() and makespan > 0
        else float("nan"),
        "makespan_s": makespan,
    }
    if len(chunks):
        c = chunks.sort_values(["req", "t_s"], kind="stable")
        r = c["req"].to_numpy()
        t = c["t_s"].to_numpy(float)
        same = r[1:] == r[:-1]
        gaps = (t[1:] - t[:-1])[same]
        gap_req = r[1:][same]
        tier_of = req.set_index("req")["tier"]
        gap_tier = tier_of.reindex(gap_req).to_numpy()
        for name in sorted(set(req["tier"])):
            g = gaps[gap_tier == name]
            out[f"tbt_p99_{name}_s"] = float(np.percentile(g, 99)) if len(g) else float("nan")
    return out


def _clean(o: Any) -> Any:
    if isinstance(o, dict):
        return {k: _clean(v) for k, v in o.items()}
    if isinstance(o, list | tuple):
        return [_clean(v) for v in o]
    if isinstance(o, float) and not math.isfinite(o):
        return None
    if isinstance(o, np.generic):
        return _clean(o.item())
    return o


@dataclass
class ExperimentResult:
    """Rows (one per configuration), the paper's claims against what was measured, notes."""

    name: str
    title: str
    rows: list[dict[str, Any]]
    claims: list[dict[str, Any]]
    notes: list[str]
    out_dir: Path
    full: bool

    def markdown(self) -> str:
        lines = [f"# {self.title}", "", f"Size: {'full' if self.full else 'small'}", ""]
        if self.claims:
            lines += ["## Paper claims vs this reproduction", ""]
            lines += [
                "Labels in the paper column say where each number comes from: (paper), "
                "(authors' code) or (spec author, not in the paper).",
                "",
                "| claim | paper | measured (seeds, CI) | verdict | cause |",
                "|---|---|---|---|---|",
            ]
            for c in self.claims:
                verdict = c.get("verdict", c.get("agrees", ""))
                lines.append(
                    f"| {c['claim']} | {c['paper']} | {c['measured']} | {verdict} "
                    f"| {c.get('cause', '')} |"
                )
            lines.append("")
        if self.rows:
            cols = list(dict.fromkeys(k for r in self.rows for k in r))
            lines += ["## Configurations", ""]
            lines.append("| " + " | ".join(cols) + " |")
            lines.append("|" + "---|" * len(cols))
            for r in self.rows:
                lines.append("| " + " | ".join(_fmt(r.get(c)) for c in cols) + " |")
            lines.append("")
        if self.notes:
            lines += ["## Notes", ""] + [f"- {n}" for n in self.notes] + [""]
        return "\n".join(lines)

    def write(self) -> tuple[Path, Path]:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        md = self.out_dir / "comparison.md"
        js = self.out_dir / "comparison.json"
        md.write_text(self.markdown())
        js.write_text(
            json.dumps(
                _clean(
                    {
                        "experiment": self.name,
                        "title": self.title,
                        "full": self.full,
                        "claims": self.claims,
                        "rows": self.rows,
                        "notes": self.notes,
                    }
                ),
                indent=2,
            )
        )
        return md, js


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        if not math.isfinite(v):
            return "–"
        return f"{v:.4g}"
    return "" if v is None else str(v)


def pct_change(new: float, old: float) -> float:
    return (
        (new / old - 1.0) * 100.0
        if old and math.isfinite(old) and math.isfinite(new)
        else float("nan")
    )


def mean_ci(xs: Sequence[float]) -> tuple[float, float]:
    """Mean and the 95% normal-approximation half-width over seeds (nan for one seed)."""
    a = np.asarray([x for x in xs if math.isfinite(x)], dtype=float)
    if not len(a):
        return float("nan"), float("nan")
    hw = 1.96 * float(a.std(ddof=1)) / math.sqrt(len(a)) if len(a) > 1 else float("nan")
    return float(a.mean()), hw


def ols_slope(x: Sequence[float], y: Sequence[float]) -> float:
    xa, ya = np.asarray(x, float), np.asarray(y, float)
    ok = np.isfinite(xa) & np.isfinite(ya)
    if ok.sum() < 2:
        return float("nan")
    return float(np.polyfit(xa[ok], ya[ok], 1)[0])


def crossing(xs: Sequence[float], ys: Sequence[float], limit: float) -> float:
    """Largest x (linear interpolation) before ``ys`` first exceeds ``limit`` (capacity search)."""
    xs, ys = list(xs), list(ys)
    if not xs or not (ys[0] <= limit):
        return float("nan") if not xs else (xs[0] if ys[0] <= limit else float("nan"))
    for i in range(1, len(xs)):
        if not ys[i] <= limit:
            y0, y1 = ys[i - 1], ys[i]
            if not math.isfinite(y1):
                return xs[i - 1]
            return xs[i - 1] + (limit - y0) / (y1 - y0) * (xs[i] - xs[i - 1])
    return xs[-1]
