"""What the report needs from one run directory, computed once: summary, stability, per-request
metrics (the vLLM formulas of :mod:`harness.results.metrics`), ITL samples and time series.

Why a separate module: figures and tables only format; every number comes from the same
functions that write summary.json, so the HTML never disagrees with the JSON.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from harness.results import metrics as M
from harness.results.rundir import Run, read_run
from harness.results.stability import BacklogSeries, analyze_stability, backlog_series


@dataclass
class RunView:
    """One run, ready to plot. ``rm``: one row per request (metrics.request_metrics)."""

    dir: Path
    label: str
    meta: dict[str, Any]
    summary: dict[str, Any]
    stability: dict[str, Any]
    requests: pd.DataFrame
    samples: pd.DataFrame
    rm: pd.DataFrame
    itl_s: np.ndarray  # all ITL samples (vLLM: one per chunk after the first)
    itl_tier: np.ndarray  # tier name of each ITL sample
    chunk_t: np.ndarray  # chunk times of successful requests
    chunk_tokens: np.ndarray
    backlog: BacklogSeries
    tiers: dict[str, dict[str, Any]] = field(default_factory=dict)
    notices: list[tuple[str, str]] = field(default_factory=list)  # (level, text)
    itl_grp: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # rm row
    attained: np.ndarray | None = None  # per rm row: met its tier's SLOs (summary's rule)
    has_slo: np.ndarray | None = None

    @property
    def trace_hash(self) -> str | None:
        return trace_hash(self.meta)

    @property
    def tier_names(self) -> list[str]:
        seen = list(self.tiers)
        for t in pd.unique(self.rm["tier"].astype(object)):
            if t is not None and str(t) not in seen:
                seen.append(str(t))
        return seen


def lookup(meta: Mapping[str, Any], key: str) -> Any:
    """A run.json key at the top level or one level down (``config``, ``trace`` ...)."""
    if key in meta:
        return meta[key]
    for v in meta.values():
        if isinstance(v, Mapping) and key in v:
            return v[key]
    return None


def trace_hash(meta: Mapping[str, Any]) -> str | None:
    """The frozen trace's content hash (run.json ``trace.content_hash``, or nested in
    ``trace.meta``); runs with equal hashes replayed the same requests."""
    tr = meta.get("trace")
    if isinstance(tr, Mapping):
        h = tr.get("content_hash") or (tr.get("meta") or {}).get("content_hash")
        if h:
            return str(h)
    h = meta.get("trace_hash") or meta.get("content_hash")
    return str(h) if h else None


def tiers_from_meta(meta: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    raw = lookup(meta, "tiers")
    if not raw:
        return {}
    if isinstance(raw, str):
        from harness.workload.tiers import parse_tiers

        try:
            return {t.name: t.to_dict() for t in parse_tiers(raw)}
        except ValueError:
            return {}
    if isinstance(raw, Mapping):
        return {str(k): dict(v, name=str(k)) for k, v in raw.items() if isinstance(v, Mapping)}
    return {str(d["name"]): dict(d) for d in raw if isinstance(d, Mapping) and "name" in d}


def run_label(meta: Mapping[str, Any], run_dir: Path) -> str:
    """``label`` if set, else ``policy @ rate``, else the folder name."""
    if meta.get("label"):
        return str(meta["label"])
    policy = lookup(meta, "policy")
    rate = meta.get("rate", meta.get("request_rate"))
    if policy and isinstance(rate, int | float):
        return f"{policy} @ {rate:g} req/s"
    if policy:
        return f"{policy} ({run_dir.name})"
    return run_dir.name


def _notices(meta: Mapping[str, Any], summary: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Things a reader must not miss: fallbacks, partial runs, invalid schedules, no GPU."""
    out: list[tuple[str, str]] = []
    status = meta.get("status")
    if status in ("partial", "running"):
        why = meta.get("stopped_by")
        if status == "running":  # nobody closed it: the writer was killed (SIGKILL, OOM)
            status, why = "partial", why or "its writer died without closing it"
        out.append(("warn", f"run is {status}" + (f" (stopped by {why})" if why else "")))
    tr = meta.get("trace")
    tmeta = tr.get("meta", {}) if isinstance(tr, Mapping) else {}
    if not tmeta and isinstance(meta.get("trace_meta"), Mapping):  # the simulator's spelling
        tmeta = meta["trace_meta"]
    fallback = isinstance(tmeta, Mapping) and bool(tmeta.get("fallback"))
    if isinstance(tmeta, Mapping):
        notes = [str(n) for n in tmeta.get("notes") or []]
        if fallback:
            # one banner (issue 20: it appeared three times): the trace's own note says the
            # most (which profile, why), else the recorded reason
            said = [n for n in notes if _is_fallback_note(n)]
            reason = tmeta.get("reason") or "real dataset not available"
            text = said[0] if said else reason
            out.append(("warn", f"trace used a fallback length profile: {text}"))
            notes = [n for n in notes if not _is_fallback_note(n)]
        for n in notes:
            out.append(("info", f"trace: {n}"))
    for reason in summary.get("invalid_reasons") or []:
        out.append(("warn", f"invalid run: {reason}"))
    smp = meta.get("sampler")
    if isinstance(smp, Mapping):
        gpu = smp.get("gpu") or {}
        if isinstance(gpu, Mapping) and gpu.get("status") == "unavailable":
            out.append(("info", f"GPU metrics unavailable: {gpu.get('reason', '')}"))
        if smp.get("scrape_errors"):
            out.append(
                (
                    "warn",
                    f"/metrics scrape errors: {smp['scrape_errors']} "
                    f"(last: {smp.get('last_error')})",
                )
            )
    for n in meta.get("notes") or []:
        if not (fallback and _is_fallback_note(str(n))):
            out.append(("info", str(n)))
    done, failed = summary.get("completed"), summary.get("failed")
    if done == 0 and failed:
        kinds = ", ".join(f"{k}: {v}" for k, v in (summary.get("errors") or {}).items())
        out.insert(
            0,
            (
                "warn",
                f"all {failed} requests failed ({kinds or 'see Errors'}): the latency panels "
                "below have no data",
            ),
        )
    return out


def _warmup_notice(warm: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    if not warm:
        return []
    until = warm.get("until_s")
    when = f" (scheduled before {until:.1f} s)" if isinstance(until, int | float) else ""
    return [
        (
            "info",
            f"warm-up: the first {warm.get('excluded', 0)} requests{when} are excluded from "
            "every metric (--warmup); they stay in requests.parquet and in the backlog and "
            "timeline panels (shaded)",
        )
    ]


def _is_fallback_note(text: str) -> bool:
    low = text.lower()
    return "fallback" in low or "length profile" in low or "real dataset not available" in low


def setup_rows(meta: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The few run.json facts a reader needs up front: what was replayed, on what, how."""
    tr = meta.get("trace") if isinstance(meta.get("trace"), Mapping) else {}
    cm = meta.get("cost_model")
    if isinstance(cm, Mapping):
        cm = cm.get("name") or cm.get("kind")
    rows = [
        ("kind", meta.get("kind")),
        ("status", meta.get("status")),
        ("trace", tr.get("source") or meta.get("trace_source")),
        ("trace hash", (trace_hash(meta) or "")[:16] or None),
        ("requests", tr.get("num_requests") or meta.get("num_requests")),
        ("rate (req/s)", meta.get("rate", meta.get("request_rate"))),
        ("arrival", meta.get("arrival")),
        ("seed", meta.get("seed")),
        ("policy", lookup(meta, "policy")),
        ("cost model", cm),
        ("target", meta.get("target")),
        ("engine", meta.get("engine") if isinstance(meta.get("engine"), str) else None),
        ("model", meta.get("model")),
        ("duration (s)", meta.get("duration_s")),
        ("load generator", loadgen_text(meta.get("workers"))),
    ]
    return [(k, fmt_value(v)) for k, v in rows if v is not None and v != ""]


def loadgen_text(workers: Any) -> str | None:
    """run.json ``workers`` in one line: processes, hosts and, for a multi-host (Ray) run,
    the dispatch-skew bound between shards (issue 18), so a reader sees how far apart two
    hosts' "same instant" may be before comparing their requests."""
    if not isinstance(workers, Mapping) or not workers.get("count"):
        return None
    n = int(workers["count"])
    text = f"{n} worker{'s' if n != 1 else ''}"
    if workers.get("backend"):
        text += f" ({workers['backend']}"
        if workers.get("hosts"):
            text += f", {workers['hosts']} host{'s' if workers['hosts'] != 1 else ''}"
        text += ")"
    skew = workers.get("skew_bound_ms")
    if isinstance(skew, int | float):
        text += f"; dispatch skew bound {skew:.3g} ms"
        if workers.get("skew_rule"):
            text += f" ({workers['skew_rule']})"
    return text


def load_run_view(run_dir: Path | str, label: str | None = None) -> RunView:
    """Read a run directory and derive everything the report plots."""
    run: Run = read_run(run_dir)
    summary = run.summary
    if summary is None:
        from harness.results.summary import compute_summary

        summary = compute_summary(run)
    stab = summary.get("stability")
    if not isinstance(stab, Mapping) or stab.get("verdict") in (None, "error"):
        stab = analyze_stability(run)
    from harness.results.warmup import without_warmup

    measured, warm = without_warmup(run)  # metrics skip the warm-up; the backlog shows all
    rm, cv = M.request_metrics(measured.requests, measured.chunks)
    itl, grp = cv.itl()
    tier_arr = rm["tier"].to_numpy(dtype=object)
    itl_tier = tier_arr[grp] if itl.size else np.zeros(0, dtype=object)
    bs = backlog_series(run.requests)
    tiers = tiers_from_meta(run.meta)
    from harness.results.summary import slo_masks

    sm = slo_masks(rm, cv, tiers, itl=(itl, grp))
    return RunView(
        dir=Path(run_dir),
        label=label or run_label(run.meta, Path(run_dir)),
        meta=run.meta,
        summary=dict(summary),
        stability=dict(stab),
        requests=run.requests,
        samples=run.samples,
        rm=rm,
        itl_s=itl,
        itl_tier=itl_tier,
        chunk_t=cv.t,
        chunk_tokens=cv.tokens,
        backlog=bs,
        tiers=tiers,
        notices=_notices(run.meta, summary) + _warmup_notice(warm),
        itl_grp=grp,
        attained=sm.attained,
        has_slo=sm.has_slo,
    )


# (key, label, unit / format, what it means): the stability table explained (issue 20:
# "little_law_ratio 0.061", "queue_mean 0 beside a backlog of 56" were raw and unexplained)
STABILITY_ROWS: tuple[tuple[str, str, str, str], ...] = (
    (
        "verdict",
        "verdict",
        "",
        "stable: backlog trend's CI below ε; unstable: above ε; "
        "inconclusive: too short or too close to call",
    ),
    ("reason", "why", "", "the rule that decided the verdict"),
    (
        "backlog_slope_rps",
        "backlog trend",
        "req/s",
        "growth of requests in the system after "
        "the warm-up cut (OLS); ≈ 0 when the queue is bounded",
    ),
    ("backlog_slope_ci", "trend 95% CI", "req/s", "Newey–West interval of that slope"),
    ("warmup_cut_s", "warm-up cut", "s", "MSER-5 cut: the trend ignores the backlog before it"),
    (
        "mean_backlog",
        "mean backlog",
        "requests",
        "client-side requests in the system (arrived, not finished), after the cut",
    ),
    ("max_backlog", "max backlog", "requests", "its peak"),
    (
        "queue_mean",
        "engine queue, mean",
        "requests",
        "the engine's own waiting gauge (not "
        "yet running); small beside a large backlog = requests are running, not queued",
    ),
    ("queue_max", "engine queue, max", "requests", "its peak"),
    ("arrival_rate_rps", "arrival rate", "req/s", "measured after the cut"),
    (
        "completion_rate_rps",
        "completion rate",
        "req/s",
        "measured after the cut; below the arrival rate = backlog grows",
    ),
    (
        "little_law_ratio",
        "Little's law L/(λW)",
        "ratio",
        "mean backlog ÷ (arrival rate × "
        "mean time in system); ≈ 1 in steady state, far below 1 when many requests are still "
        "in flight at the end (censored sojourns)",
    ),
    (
        "little_law_ratio_server",
        "Little's law, engine",
        "ratio",
        "the same with the engine's running + waiting gauges",
    ),
    ("ttft_slope_ms_per_s", "TTFT trend", "ms/s", "TTFT growth over the run"),
    (
        "token_backlog_slope_tps",
        "token backlog trend",
        "tokens/s",
        "growth of unprocessed prompt + output tokens (the stability paper's measure)",
    ),
    ("token_backlog_slope_ci", "token trend 95% CI", "tokens/s", ""),
    ("token_backlog_mean", "token backlog, mean", "tokens", ""),
    (
        "conditional_drift",
        "conditional drift",
        "tokens/s per level",
        "mean change of the "
        "token backlog at four backlog levels; negative at the top level = the queue pulls back "
        "when it is high (bounded)",
    ),
    ("rho", "load ρ", "", "arrival rate ÷ the fluid model's capacity (> 1: no policy keeps up)"),
    (
        "fluid_capacity_rps",
        "fluid capacity",
        "req/s",
        "WAIT's fluid critical rate for this length mix and cost model",
    ),
    ("fluid_slope_rps", "fluid growth", "req/s", "max(0, λ − capacity)"),
)


def stability_rows(stab: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(label, formatted value with unit, explanation) for each stability key present."""
    rows = []
    for key, label, unit, help_ in STABILITY_ROWS:
        v = stab.get(key)
        if v is None or v == "":
            continue
        if key == "conditional_drift":
            text = fmt_drift(v)
        elif key.endswith("_ci") and isinstance(v, list | tuple) and len(v) == 2:
            text = f"[{fmt_value(v[0])}, {fmt_value(v[1])}]"
        else:
            text = fmt_value(v)
        if unit and unit not in ("ratio",) and not key.endswith("drift") and key != "verdict":
            text = f"{text} {unit}"
        rows.append((label, text, help_))
    return rows


def fmt_drift(bins: Any) -> str:
    """The conditional drift (stability.conditional_drift) as one line: level range -> dW/dt."""
    if not bins:
        return "–"
    if isinstance(bins, str):  # an older summary.json stored it as text
        return bins
    return " · ".join(
        f"{b['level_lo']:,.0f}–{b['level_hi']:,.0f}: "
        f"{'+' if (b['drift_per_s'] or 0) > 0 else ''}{fmt_value(b['drift_per_s'])}/s"
        for b in bins
    )


def fmt_value(v: Any) -> str:
    """Compact, human text for a table cell (numbers rounded, None as '–')."""
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if not math.isfinite(v):
            return "–"
        a = abs(v)
        if a == 0:
            return "0"
        if a >= 1000:
            return f"{v:,.0f}"
        if a >= 10:
            return f"{v:.1f}"
        if a >= 0.01:
            return f"{v:.3f}"
        return f"{v:.3g}"
    if isinstance(v, list | tuple):
        return "[" + ", ".join(fmt_value(x) for x in v) + "]"
    if isinstance(v, Mapping):
        return ", ".join(f"{k}={fmt_value(x)}" for k, x in v.items())
    return str(v)
