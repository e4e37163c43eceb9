"""Rich console tables for a summary dict (the end of ``harness replay`` / ``simulate``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.table import Table


def _ms(v: Any) -> str:
    return "-" if v is None else f"{v:,.1f}"


def _num(v: Any, fmt: str = ",.2f") -> str:
    return "-" if v is None else format(v, fmt)


def _pct(v: Any) -> str:
    return "-" if v is None else f"{100.0 * v:.1f}%"


def _met(text: str, met: Any) -> str:
    """Colour ``text`` by whether an SLO was met (plain when there is no SLO)."""
    if met is None:
        return text
    return f"[green]{text}[/]" if met else f"[red]{text}[/]"


def _dur(ms: Any) -> str:
    """Compact SLO: 100ms, 2s, '-' when absent."""
    if ms is None:
        return "-"
    return f"{ms / 1000:g}s" if ms >= 1000 else f"{ms:g}ms"


def overall_table(s: Mapping[str, Any]) -> Table:
    """Overall: requests ok/failed, duration, throughput, TTFT, TPOT, ITL, E2EL."""
    t = Table(title=f"run {s.get('run_id', '')} ({s.get('status', '?')})", title_justify="left")
    t.add_column("metric")
    t.add_column("value", justify="right")
    rows: list[tuple[str, str]] = [
        ("requests ok / failed", f"{s.get('completed', 0):,} / {s.get('failed', 0):,}"),
        ("duration (s)", _num(s.get("duration"))),
        ("request throughput (req/s)", _num(s.get("request_throughput"))),
        ("output throughput (tok/s)", _num(s.get("output_throughput"), ",.1f")),
        ("total token throughput (tok/s)", _num(s.get("total_token_throughput"), ",.1f")),
    ]
    if s.get("request_goodput") is not None:
        rows.append(("request goodput (req/s)", _num(s.get("request_goodput"))))
    rows += [
        (
            "TTFT mean / p50 / p99 (ms)",
            " / ".join(_ms(s.get(f"{k}_ttft_ms")) for k in ("mean", "p50", "p99")),
        ),
        ("TPOT mean / p99 (ms)", f"{_ms(s.get('mean_tpot_ms'))} / {_ms(s.get('p99_tpot_ms'))}"),
        ("ITL p50 / p99 (ms)", f"{_ms(s.get('p50_itl_ms'))} / {_ms(s.get('p99_itl_ms'))}"),
        ("E2EL mean / p99 (ms)", f"{_ms(s.get('mean_e2el_ms'))} / {_ms(s.get('p99_e2el_ms'))}"),
        (
            "send lag p50 / p99 (ms)",
            f"{_ms(s.get('send_lag_p50_ms'))} / {_ms(s.get('send_lag_p99_ms'))}",
        ),
    ]
    if s.get("slo_attainment") is not None:
        rows.append(("SLO attainment (all tiers)", _pct(s.get("slo_attainment"))))
    srv = s.get("server")
    if isinstance(srv, Mapping):
        rows.append(
            (
                f"KV use mean / max ({srv.get('source')})",
                f"{_pct(srv.get('kv_cache_usage_perc_mean'))} / "
                f"{_pct(srv.get('kv_cache_usage_perc_max'))}",
            )
        )
        rows.append(("preemptions", _num(srv.get("preemptions_delta"), ",.0f")))
    en = s.get("energy")
    if isinstance(en, Mapping):
        rows.append(
            (
                "energy (J) / J per token / per good token",
                f"{_num(en.get('energy_j'), ',.0f')} / {_num(en.get('j_per_output_token'), '.3g')}"
                f" / {_num(en.get('j_per_good_token'), '.3g')}",
            )
        )
    stab = s.get("stability")
    if isinstance(stab, Mapping) and stab.get("verdict"):
        rows.append(("stability", str(stab["verdict"])))
    errors = s.get("errors") or {}
    if errors:
        rows.append(("failures by kind", ", ".join(f"{k}={v}" for k, v in errors.items())))
    for k, v in rows:
        t.add_row(k, v)
    return t


def tier_table(s: Mapping[str, Any]) -> Table | None:
    """Per tier: SLOs, attainment, p99 TTFT / ITL, goodput. None when the run has no tiers."""
    tiers = s.get("tiers") or {}
    if not tiers:
        return None
    t = Table(title="per tier (p99 in green/red: meets/misses the tier SLO)", title_justify="left")
    for col, just in (
        ("tier", "left"),
        ("ok/failed", "right"),
        ("SLO ttft/tbt", "right"),
        ("attained", "right"),
        ("p99 TTFT ms", "right"),
        ("p99 ITL ms", "right"),
        ("goodput/s", "right"),
    ):
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    for name, b in tiers.items():
        done = bool(b.get("completed"))  # an empty tier has no p99 (not "0 ms" in red)
        t.add_row(
            name,
            f"{b.get('completed', 0):,}/{b.get('failed', 0):,}",
            f"{_dur(b.get('ttft_slo_ms'))}/{_dur(b.get('tbt_slo_ms'))}",
            _pct(b.get("slo_attainment")),
            _met(_ms(b.get("p99_ttft_ms")), b.get("ttft_slo_met")) if done else "-",
            _met(_ms(b.get("p99_itl_ms")), b.get("p99_itl_slo_met")) if done else "-",
            _num(b.get("goodput")),
        )
    return t


def print_summary(summary: Mapping[str, Any], console: Console | None = None) -> None:
    """Print the overall table, the per-tier table and a warning when the run is invalid."""
    console = console or Console()
    console.print(overall_table(summary))
    tt = tier_table(summary)
    if tt is not None:
        console.print(tt)
    if summary.get("schedule_kept") is False or summary.get("valid") is False:
        for reason in summary.get("invalid_reasons") or ["the run did not keep its schedule"]:
            console.print(f"[bold yellow]warning:[/] invalid run: {reason}")
    if summary.get("status") == "partial":
        console.print(
            "[bold yellow]warning:[/] partial run (stopped early); numbers cover what was recorded"
        )
