"""The HTML report: one self-contained file per run, comparison or sweep.

Why one file: a researcher mails it, opens it on a plane, attaches it to a paper review; it
must open offline (anchors-harness.md §5 item 10). So plotly.js is embedded once, figures
are JSON inside the page, no CDN, no fonts, no network (a Content-Security-Policy forbids any
fetch). Templates are jinja2 with autoescape ON: every string from a trace, a server or
run.json renders as text.

``write_report([run_dir])`` for one run, several run dirs for a comparison (overlays, a
side-by-side table, and paired per-request differences when the runs replayed the same
frozen trace), or a sweep directory (holding ``sweep.json``) for latency/throughput vs rate
with the capacity marked.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jinja2

from harness.report import figures as F
from harness.report.data import (
    RunView,
    fmt_drift,
    fmt_value,
    load_run_view,
    setup_rows,
    stability_rows,
)
from harness.results.compare import HEADLINE, compare_groups, groups_of
from harness.results.repeats import RUNS_JSON, read_index

__all__ = ["write_report", "render_report", "SWEEP_JSON", "RUNS_JSON"]

SWEEP_JSON = "sweep.json"

SUMMARY_KEYS = (
    "duration",
    "completed",
    "failed",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "request_goodput",
    "output_throughput",
    "total_token_throughput",
    "max_output_tokens_per_s",
    "max_concurrent_requests",
    "mean_ttft_ms",
    "median_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "median_tpot_ms",
    "p99_tpot_ms",
    "mean_itl_ms",
    "median_itl_ms",
    "p99_itl_ms",
    "mean_e2el_ms",
    "median_e2el_ms",
    "p99_e2el_ms",
    "tbt_token_p99_ms",
    "slo_attainment",
    "send_lag_p50_ms",
    "send_lag_p99_ms",
    "achieved_request_rate",
    "offered_request_rate",
    "valid",
)
STABILITY_KEYS = (
    "verdict",
    "reason",
    "backlog_slope_rps",
    "backlog_slope_ci",
    "ttft_slope_ms_per_s",
    "warmup_cut_s",
    "little_law_ratio",
    "little_law_ratio_server",
    "arrival_rate_rps",
    "completion_rate_rps",
    "mean_backlog",
    "max_backlog",
    "token_backlog_slope_tps",
    "token_backlog_slope_ci",
    "token_backlog_mean",
    "conditional_drift",
    "queue_mean",
    "queue_max",
    "rho",
    "fluid_capacity_rps",
    "fluid_slope_rps",
)
COMPARE_KEYS = (
    ("completed", "completed"),
    ("failed", "failed"),
    ("request_throughput", "request_throughput (req/s)"),
    ("output_throughput", "output_throughput (tok/s)"),
    ("mean_ttft_ms", "mean_ttft_ms"),
    ("p99_ttft_ms", "p99_ttft_ms"),
    ("p99_itl_ms", "p99_itl_ms"),
    ("p99_tpot_ms", "p99_tpot_ms"),
    ("p99_e2el_ms", "p99_e2el_ms"),
    ("slo_attainment", "slo_attainment"),
    ("send_lag_p99_ms", "send_lag_p99_ms"),
)

_env = jinja2.Environment(
    loader=jinja2.PackageLoader("harness.report", "templates"),
    autoescape=True,  # every string from traces/servers renders as text
    undefined=jinja2.ChainableUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)


def tier_value(block: Any, key: str) -> str:
    """A per-tier latency cell: '–' when the tier completed nothing (issue 20: an empty tier
    showed "P99 = 0 ms" in red)."""
    if not isinstance(block, dict) or not block.get("completed"):
        return "–"
    return fmt_value(block.get(key))


def tier_met(block: Any, key: str) -> str:
    if not isinstance(block, dict) or not block.get("completed"):
        return ""
    return _met(block.get(key))


def _ci_text(iv: Any, unit: str) -> str:
    """ "66.4 [65.1, 68.0]" (ms) or "95.2% [88.0, 100.0]" for an interval dict."""
    if not isinstance(iv, dict):
        return "–"

    def f(x: Any) -> str:
        if x is None or not math.isfinite(x):
            return "–"
        if unit == "%":
            return f"{100 * x:.1f}"
        return f"{x:,.0f}" if abs(x) >= 100 else f"{x:,.1f}"

    pct = "%" if unit == "%" else ""
    return f"{f(iv.get('value'))}{pct} [{f(iv.get('lo'))}, {f(iv.get('hi'))}]"


def _pct(v: Any) -> str:
    return "–" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:.1%}"


def _met(v: Any) -> str:
    return "" if v is None else ("good" if v else "bad")


def _safe_json(obj: Any) -> str:
    """JSON that is safe inside a <script> element: <, >, & and line separators escaped."""
    s = obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"))
    return (
        s.replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("&", "\\u0026")
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
    )


def _flatten(d: Any, prefix: str = "") -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    if isinstance(d, dict):
        for k, v in d.items():
            key = f"{prefix}.{k}" if prefix else str(k)
            if isinstance(v, dict) and v and len(out) < 400:
                out.extend(_flatten(v, key))
            else:
                text = v if isinstance(v, str) else json.dumps(v, default=str)
                out.append((key, text if len(text) <= 600 else text[:600] + " …"))
    return out


class _FigureStore:
    """Collects figures as plotly JSON under ids 'f0', 'f1', ..."""

    def __init__(self) -> None:
        self.items: dict[str, str] = {}

    def add(self, fig: Any) -> str | None:
        if fig is None:
            return None
        fid = f"f{len(self.items)}"
        self.items[fid] = fig.to_json(validate=False)
        return fid

    def json(self) -> str:
        return _safe_json("{" + ",".join(f'"{k}":{v}' for k, v in self.items.items()) + "}")


def _error_examples(rv: RunView) -> dict[str, str]:
    r = rv.requests
    if "error_kind" not in r or "error" not in r:
        return {}
    f = r[r["error_kind"].notna()]
    ex = f.drop_duplicates("error_kind")
    return {str(k): str(e)[:300] for k, e in zip(ex["error_kind"], ex["error"], strict=True)}


def _plotly_js() -> str:
    from plotly.offline import get_plotlyjs

    return get_plotlyjs()


RUN_PANELS: tuple[tuple[str, Any], ...] = (
    ("TTFT CDF per tier", F.ttft_cdf),
    ("TBT CDF per tier", F.tbt_cdf),
    ("Time between tokens", F.itl_distribution),
    ("Throughput over time", F.throughput),
    ("Backlog and queue", F.backlog),
    ("KV-cache and GPU memory", F.kv_gpu),
    ("Send lag", F.send_lag),
    ("Per-request timeline", F.timeline),
)


def _run_context(rv: RunView, store: _FigureStore) -> None:
    # (panel name, figure id or None): an empty panel says which one it is (issue 20)
    rv.figs = [(name, store.add(b(rv))) for name, b in RUN_PANELS]  # type: ignore[attr-defined]
    from harness.report.sessions import session_figures  # session runs only (issue 15)

    rv.figs += [(name, store.add(f)) for name, f in session_figures(rv.dir, rv.requests)]  # type: ignore[attr-defined]
    from harness.report.cluster import cluster_figures  # clusters, agent networks (issue 16)

    rv.figs += [(name, store.add(f)) for name, f in cluster_figures(rv.dir, rv.samples)]  # type: ignore[attr-defined]
    rv.fig_ids = [fid for _, fid in rv.figs]  # type: ignore[attr-defined]
    rv.meta_rows = _flatten(rv.meta)  # type: ignore[attr-defined]
    rv.setup_rows = setup_rows(rv.meta)  # type: ignore[attr-defined]
    rv.stability_rows = stability_rows(rv.stability)  # type: ignore[attr-defined]
    rv.summary_rows = [  # type: ignore[attr-defined]
        (k, fmt_value(v)) for k, v in rv.summary.items() if k not in ("tiers", "stability")
    ]
    rv.error_examples = _error_examples(rv)  # type: ignore[attr-defined]
    rv.all_failed = rv.summary.get("completed") == 0  # type: ignore[attr-defined]


def comparison_title(labels: Sequence[str], limit: int = 6) -> str:
    """ "Comparison: a vs b vs c"; past ``limit`` runs, the first ones and how many more
    (issue 20: a five-run comparison's title dropped the fifth silently)."""
    if len(labels) <= limit:
        return "Comparison: " + " vs ".join(labels)
    return (
        "Comparison: " + " vs ".join(labels[: limit - 1]) + f" and {len(labels) - limit + 1} more"
    )


def _unique_labels(runs: list[RunView]) -> None:
    seen: dict[str, int] = {}
    for rv in runs:
        if rv.label in seen:
            seen[rv.label] += 1
            rv.label = f"{rv.label} [{rv.dir.name}]"
        else:
            seen[rv.label] = 1


def _load_sweep(sweep_dir: Path) -> dict[str, Any]:
    data = json.loads((sweep_dir / SWEEP_JSON).read_text(encoding="utf-8"))
    if not isinstance(data, dict) or "runs" not in data:
        raise ValueError(f"{sweep_dir / SWEEP_JSON} is not a sweep file (no 'runs')")
    return data


def render_report(
    run_dirs: Sequence[Path | str], *, sweep: dict[str, Any] | None = None, title: str | None = None
) -> str:
    """The report HTML as a string (see :func:`write_report`)."""
    from harness import __version__

    loaded = [load_run_view(Path(d)) for d in run_dirs]
    groups = groups_of(loaded)
    # repeated runs: the page shows each group's first seed; the intervals use every seed
    runs = [g.runs[0] for g in groups]
    for g in groups:
        if len(g.runs) > 1:
            g.runs[0].label = f"{g.label}"
            g.runs[0].seed_note = (  # type: ignore[attr-defined]
                f"{len(g.runs)} seeded runs; figures and the sections below show the first "
                f"({g.runs[0].dir.name}); intervals and verdicts use all of them"
            )
    _unique_labels(runs)
    for g, rv in zip(groups, runs, strict=True):
        g.label = rv.label
    confidence = compare_groups(groups) if groups and sweep is None else None
    store = _FigureStore()
    sweep_figs: list[tuple[str, str | None]] = []
    if sweep is not None:
        sweep_figs = [(name, store.add(fig)) for name, fig in F.sweep_figures(sweep)]
    compare = len(groups) > 1
    compare_figs: list[tuple[str, str | None]] = []
    paired: list[dict] = []
    paired_fig = None
    paired_hash = ""
    if compare:
        compare_figs = [
            ("Per tier: SLO attainment and P99 TBT", store.add(F.tier_slo_bars(runs))),
            ("TBT CDF per tier", store.add(F.overlay_tier_cdf(runs, "tbt"))),
            ("TTFT CDF per tier", store.add(F.overlay_tier_cdf(runs, "ttft"))),
            ("TTFT CDF, all tiers", store.add(F.overlay_ttft(runs))),
            ("ITL CDF, all tiers", store.add(F.overlay_itl(runs))),
            ("Output tokens/s", store.add(F.overlay_throughput(runs))),
            ("Backlog", store.add(F.overlay_backlog(runs))),
        ]
        base = runs[0]
        h = base.trace_hash
        if h and sweep is None:
            for other in runs[1:]:
                if other.trace_hash == h:
                    for metric in ("ttft_s", "e2el_s"):
                        d = F.paired_diff(base, other, metric)
                        if d is not None:
                            paired.append(d)
            paired_hash = h
            ttft_pairs = [d for d in paired if d["metric"] == "ttft"]
            paired_fig = store.add(F.paired_diff_figure(ttft_pairs))
    for rv in runs:
        _run_context(rv, store)
    tiers: list[str] = []
    for rv in runs:
        for t in rv.summary.get("tiers") or {}:
            if t not in tiers:
                tiers.append(t)
    if title is None:
        if sweep is not None:
            title = f"Sweep report: {', '.join(sweep.get('policies', []))}"
        elif compare:
            title = comparison_title([rv.label for rv in runs])
        else:
            title = f"Run report: {runs[0].label}" if runs else "Report"
    nav = []
    if sweep is not None:
        nav.append(("sweep", "sweep"))
    if confidence is not None:
        nav.append(("confidence", "verdicts" if compare else "intervals"))
    if compare:
        nav.append(("compare", "comparison"))
    if len(runs) <= 12:
        nav += [(f"run{i}", rv.label) for i, rv in enumerate(runs)]
    tpl = _env.get_template("report.html.j2")
    return tpl.render(
        title=title,
        generated=_dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        version=__version__,
        runs=runs,
        sweep=sweep,
        sweep_figs=sweep_figs,
        sweep_tiers=list(
            dict.fromkeys(t for r in (sweep or {}).get("runs", []) for t in r.get("tiers") or {})
        ),
        compare=compare,
        compare_keys=COMPARE_KEYS,
        compare_tiers=tiers,
        compare_figs=compare_figs,
        paired=paired,
        confidence=confidence,
        headline=HEADLINE,
        ci=_ci_text,
        groups=groups,
        max_seeds=max((len(g.runs) for g in groups), default=0),
        paired_fig=paired_fig,
        paired_hash=paired_hash,
        summary_keys=SUMMARY_KEYS,
        stability_keys=STABILITY_KEYS,
        nav=nav,
        fmt=fmt_value,
        fmt_drift=fmt_drift,
        tier_value=tier_value,
        tier_met=tier_met,
        pct=_pct,
        met=_met,
        figure_json=store.json(),
        plotly_js=_plotly_js(),
    )


def write_report(run_dirs: list[Path], out: Path | None = None) -> Path:
    """Render one self-contained HTML report and return its path.

    One run dir: ``<run>/report.html`` by default. Several: a comparison, default
    ``<first run's parent>/compare-report.html``. A sweep dir (with ``sweep.json``):
    ``<sweep>/report.html`` covering every run of the sweep. Raises FileNotFoundError /
    ValueError with a one-line message on bad input.
    """
    dirs = [Path(d) for d in run_dirs]
    if not dirs:
        raise ValueError("no run directory given")
    sweep = None
    if len(dirs) == 1 and (dirs[0] / SWEEP_JSON).is_file():
        sweep = _load_sweep(dirs[0])
        base = dirs[0]
        # the sweep page plots the sweep; each run keeps its own report (harness report RUN)
        html_text = render_report([], sweep=sweep)
        default = base / "report.html"
    elif len(dirs) == 1 and (dirs[0] / RUNS_JSON).is_file():
        # a simulate/replay output folder: every run it lists, compared
        html_text = render_report(read_index(dirs[0]))
        default = dirs[0] / "report.html"
    else:
        for d in dirs:
            if not (d / "run.json").is_file():
                raise FileNotFoundError(f"{d} is not a run directory (no run.json)")
        html_text = render_report(dirs)
        default = (
            dirs[0] / "report.html" if len(dirs) == 1 else dirs[0].parent / "compare-report.html"
        )
    path = Path(out) if out is not None else default
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(html_text, encoding="utf-8")
    tmp.replace(path)
    return path
