"""``harness trace build|show``: freeze a replay to Parquet, and look at one.

``build`` calls :func:`harness.workload.build_trace` then ``save_trace``; ``show`` calls
:func:`harness.workload.describe.describe_trace`. Bad input is one red line, exit 2.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import typer

trace_app = typer.Typer(
    help="Build (freeze) and inspect traces.", no_args_is_help=True, add_completion=False
)


def parse_options(items: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` source options; values become int/float/bool/None where they look it."""
    from harness.cli.errors import fail

    out: dict[str, Any] = {}
    for item in items:
        key, sep, val = item.partition("=")
        if not sep or not key:
            fail(f"--opt {item!r}: expected KEY=VALUE")
        low = val.lower()
        value: Any = val
        if low in ("true", "false"):
            value = low == "true"
        elif low in ("none", "null"):
            value = None
        else:
            for cast in (int, float):
                try:
                    value = cast(val)
                    break
                except ValueError:
                    continue
        out[key.strip()] = value
    return out


@trace_app.command("build")
def build(
    source: str = typer.Argument(
        ...,
        help="lmsys | sharegpt | azure-conv | synthetic | a trace file; sessions: "
        "sharegpt-conv | lmsys-conv | synthetic-conv | an agent graph | a session file",
    ),
    out: Path = typer.Option(
        ..., "--out", "-o", help="Parquet file to write (sessions: .parquet or .jsonl)"
    ),
    num_requests: int | None = typer.Option(
        None, "--num-requests", "-n", help="requests (sessions: sessions)"
    ),
    rate: float | None = typer.Option(
        None,
        help="req/s (inf = all at 0; sessions: sessions/s); omit to use the trace's own timestamps",
    ),
    arrival: str = typer.Option("poisson", help="poisson | gamma | constant | trace"),
    burstiness: float = typer.Option(1.0, help="gamma shape (vLLM --burstiness); 1 = Poisson"),
    time_scale: float = typer.Option(1.0, help="multiplies the trace's own timestamps"),
    duration: float | None = typer.Option(None, help="keep arrivals in (0, DURATION] s"),
    tiers: str | None = typer.Option(None, help="e.g. paid:0.05:ttft=2s:tbt=100ms,free:0.95"),
    seed: int = typer.Option(0, help="seed of the arrival/sampling/tier/prompt streams"),
    rate_schedule: str | None = typer.Option(
        None, help="steps 0:10,60:50 | ramp:10:50:120 | sine:MEAN:AMP:PERIOD"
    ),
    tier_mix: str | None = typer.Option(None, help="e.g. 0:paid=0.05,60:paid=0.5,90:paid=0.05"),
    rescale: bool = typer.Option(False, help="vLLM: pin the last arrival at N/rate"),
    sample: str = typer.Option("shuffle", help="row order with a rate: shuffle | head"),
    prompts: str = typer.Option(
        "words", help="words | tokenizer:PATH | none (keep None: synthesise at send time)"
    ),
    opt: list[str] = typer.Option(
        [], "--opt", help="source option KEY=VALUE (repeat), e.g. path=..., filter=vllm"
    ),
    think_time: str | None = typer.Option(
        None, help="sessions: think time, S | exp:MEAN | lognormal:MED:SIGMA | uniform:A:B"
    ),
) -> None:
    """Freeze a replay: arrivals, prompts, lengths, tiers, seed and content hash in one file."""
    from harness.cli.errors import fail
    from harness.workload import build_trace, save_trace
    from harness.workload.sources.conversations import is_session_source
    from harness.workload.tiers import TierSpecError
    from harness.workload.trace import TraceError

    if is_session_source(source):
        plain = {
            "--time-scale": time_scale != 1.0,
            "--duration": duration is not None,
            "--rate-schedule": rate_schedule is not None,
            "--tier-mix": tier_mix is not None,
            "--rescale": rescale,
        }
        bad = [flag for flag, given in plain.items() if given]
        if bad:
            fail(f"{', '.join(bad)}: not for a session source ({source})")
        _build_sessions(source, out, num_requests, rate, arrival, burstiness, tiers, seed,
                        think_time, parse_options(opt))  # fmt: skip
        return
    if think_time is not None:
        fail(f"--think-time: only for a session source, not {source}")
    try:
        trace = build_trace(
            source,
            num_requests=num_requests,
            rate=rate,
            arrival=arrival,
            burstiness=burstiness,
            time_scale=time_scale,
            duration_s=duration,
            tiers=tiers,
            seed=seed,
            rate_schedule=rate_schedule,
            tier_mix=tier_mix,
            rescale=rescale,
            sample=sample,
            prompts=None if prompts == "none" else prompts,
            **parse_options(opt),
        )
        path = save_trace(trace, out)
    except (TraceError, TierSpecError) as e:
        fail(str(e))
    except OSError as e:
        fail(f"{out}: cannot write ({e.strerror or e})")
    typer.echo(
        f"wrote {path}: {len(trace)} requests over {trace.df['arrival_s'].iloc[-1]:.1f} s, "
        f"sha256 {trace.meta['content_hash'][:16]}"
    )


def _build_sessions(
    source: str,
    out: Path,
    num_sessions: int | None,
    session_rate: float | None,
    arrival: str,
    burstiness: float,
    tiers: str | None,
    seed: int,
    think_time: str | None,
    options: dict[str, Any],
) -> None:
    """``trace build`` of a session source: whole sessions, frozen with their columns."""
    from harness.cli.errors import fail
    from harness.workload.session_build import build_session_trace
    from harness.workload.session_freeze import save_session_trace, session_counts
    from harness.workload.tiers import TierSpecError
    from harness.workload.trace import TraceError

    if session_rate is not None and not session_rate > 0:
        fail(f"--rate {session_rate}: sessions/s must be > 0")
    if num_sessions is not None and num_sessions < 1:
        fail(f"--num-requests {num_sessions}: sessions must be >= 1")
    try:
        trace = build_session_trace(
            source,
            num_sessions=num_sessions,
            session_rate=session_rate,
            arrival="poisson" if arrival == "trace" else arrival,
            burstiness=burstiness,
            tiers=tiers,
            seed=seed,
            think_time=think_time,
            **options,
        )
        trace.meta["content_hash"] = trace.content_hash()
        path = save_session_trace(trace, out)
        counts = session_counts(trace)
    except (TraceError, TierSpecError) as e:
        fail(str(e))
    except OSError as e:
        fail(f"{out}: cannot write ({e.strerror or e})")
    typer.echo(
        f"wrote {path}: {counts['sessions']} sessions, {counts['calls']} calls over "
        f"{counts['session_span_s']:.1f} s, sha256 {trace.meta['content_hash'][:16]}"
    )


@trace_app.command("show")
def show(
    file: str = typer.Argument(..., help="a frozen trace (or any trace source)"),
    cost_model: str | None = typer.Option(
        None, help="cost-model preset or file: adds the fluid model's verdict"
    ),
    kv_tokens: int | None = typer.Option(None, help="KV capacity (tokens) for the fluid check"),
    as_json: bool = typer.Option(False, "--json", help="print JSON instead of tables"),
    opt: list[str] = typer.Option([], "--opt", help="source option KEY=VALUE (repeat)"),
) -> None:
    """Counts, length percentiles, per-tier shares, offered load, fluid verdict."""
    from harness.cli.errors import fail
    from harness.workload import build_trace
    from harness.workload.describe import describe_trace
    from harness.workload.sources.conversations import is_session_source
    from harness.workload.tiers import TierSpecError
    from harness.workload.trace import TraceError

    try:
        if is_session_source(file):
            from harness.workload.session_build import build_session_trace
            from harness.workload.session_freeze import session_counts

            trace = build_session_trace(file, quiet=as_json, **parse_options(opt))
            info = describe_trace(trace, cost_model=cost_model, kv_tokens=kv_tokens)
            info["sessions"] = session_counts(trace)
        else:
            trace = build_trace(file, quiet=as_json, **parse_options(opt))
            info = describe_trace(trace, cost_model=cost_model, kv_tokens=kv_tokens)
    except (TraceError, TierSpecError) as e:
        fail(str(e))
    except (ValueError, KeyError) as e:  # a bad cost model name / file
        fail(f"cost model {cost_model!r}: {e}")
    if as_json:
        typer.echo(json.dumps(info, indent=2, default=str))
        return
    _print(info)


def _print(info: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console()
    meta = info["meta"]
    con.print(
        f"[bold]{info['requests']}[/] requests over {info['span_s']:.1f} s  "
        f"(offered {info['offered_rate_rps']:.3g} req/s, "
        f"{info['offered_prompt_tokens_per_s']:.4g} prompt + "
        f"{info['offered_output_tokens_per_s']:.4g} output tokens/s)"
    )
    src = meta.get("frozen_meta", meta)
    con.print(
        f"source: {src.get('source')}  seed: {src.get('seed')}  hash: {info['content_hash'][:16]}"
    )
    if src.get("fallback"):
        con.print(f"[yellow]fallback length profile {src.get('profile')!r}: {src.get('reason')}")
    ses = info.get("sessions")
    if ses:
        cps, tps = ses["calls_per_session"], ses["turns_per_session"]
        rate = ses["offered_sessions_per_s"]
        con.print(
            f"[bold]{ses['sessions']}[/] sessions, {ses['calls']} calls  "
            f"(calls/session mean {cps['mean']:.2f}, p50 {cps['p50']:g}, max {cps['max']:g}; "
            f"turns mean {tps['mean']:.2f}, max {tps['max']:g}; "
            f"offered {rate:.3g} sessions/s)"
        )
    lt = Table(title="lengths (tokens)")
    lt.add_column("")
    for k in ("mean", "p50", "p90", "p99", "max"):
        lt.add_column(k, justify="right")
    for name in ("prompt_len", "output_len"):
        lt.add_row(name, *(f"{info[name][k]:.1f}" for k in ("mean", "p50", "p90", "p99", "max")))
    con.print(lt)
    tt = Table(title="tiers")
    for c in ("tier", "requests", "share", "spec", "TTFT SLO", "TBT SLO", "priority"):
        tt.add_column(c, justify="left" if c == "tier" else "right")
    for t in info["tiers"]:
        tt.add_row(
            t["name"],
            str(t["requests"]),
            f"{t['share']:.3f}",
            f"{t['spec_share']:.3f}",
            _dur(t["ttft_slo_s"]),
            _dur(t["tbt_slo_s"]),
            str(t["priority"]),
        )
    con.print(tt)
    fl = info.get("fluid")
    if fl is not None:
        if fl.get("available"):
            con.print(
                f"fluid model ({fl['cost_model']}, d0={fl['d0_s'] * 1e3:.2f} ms, "
                f"d1={fl['d1_s'] * 1e6:.3f} us/token): {fl['message']}"
            )
        else:
            con.print(f"fluid model: {fl['note']}")


def _dur(x: float | None) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x * 1e3:.0f} ms" if x < 1 else f"{x:g} s"


def register(app: typer.Typer) -> None:
    app.add_typer(trace_app, name="trace")
