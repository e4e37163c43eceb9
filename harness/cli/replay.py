"""`harness replay`: replay a trace open-loop against an engine and write a run directory.

Parses flags, builds a :class:`~harness.loadgen.replay.ReplayConfig`, calls ``run_replay``,
prints the per-tier summary table and the run directory. Bad input: one line, exit 2.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from harness.cli.errors import HarnessError, fail, one_line
from harness.cli.params import (
    MaxActiveSessions,
    MaxContext,
    MaxRetries,
    Patience,
    RetryBackoff,
    SessionRate,
    ThinkTime,
)

# ReplayConfig fields whose CLI flag has another name (so errors name the real flag).
_FLAGS = {
    "duration_s": "duration",
    "timeout_s": "timeout",
    "drain_timeout_s": "drain-timeout",
    "ready_timeout_s": "ready-timeout",
    "sample_interval_s": "sample-interval",
    "send_priority": "priority",
    "trace_options": "opt",
}


def _kv_options(items: list[str] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, val = item.partition("=")
        if not sep or not key:
            fail(f"--opt {item!r}: expected key=value")
        try:
            out[key] = json.loads(val)
        except ValueError:
            out[key] = val
    return out


def replay(
    trace: Annotated[
        str,
        typer.Option(
            "--trace",
            help="Trace name (lmsys, sharegpt, synthetic, "
            "azure-conv...) or file (parquet/jsonl/csv).",
        ),
    ],
    rate: Annotated[
        float | None, typer.Option(help="Offered rate, req/s (not with --arrival trace).")
    ] = None,
    target: Annotated[
        str | None,
        typer.Option(
            help="Base URL of an OpenAI-compatible server; default: start the built-in engine "
            "in a child process on a free loopback port."
        ),
    ] = None,
    model: Annotated[
        str | None, typer.Option(help="Model name (default: first of /v1/models).")
    ] = None,
    engine: Annotated[
        str | None,
        typer.Option(
            help="Dialect: vllm, sglang, openai, builtin "
            "(default: builtin without --target, else "
            "vllm)."
        ),
    ] = None,
    endpoint: Annotated[
        str, typer.Option(help="completions, chat, or generate (SGLang native; --engine sglang).")
    ] = "completions",
    arrival: Annotated[
        str | None,
        typer.Option(
            help="poisson, gamma, constant, or trace (the trace's own timestamps). "
            "Default: poisson with --rate, trace without."
        ),
    ] = None,
    burstiness: Annotated[
        float, typer.Option(help="Gamma shape (vLLM --burstiness); 1 = Poisson.")
    ] = 1.0,
    time_scale: Annotated[float, typer.Option(help="Multiplies trace timestamps.")] = 1.0,
    num_requests: Annotated[int | None, typer.Option(help="Send at most N requests.")] = None,
    duration: Annotated[
        float | None,
        typer.Option(help="Send no request after S seconds; in-flight ones get --drain-timeout."),
    ] = None,
    max_concurrency: Annotated[int | None, typer.Option(help="Cap on requests in flight.")] = None,
    workers: Annotated[
        int | None,
        typer.Option(
            help="Load-generator processes, the schedule sharded by session "
            "(default: automatic from the peak rate and the cores; 1 = in-process)."
        ),
    ] = None,
    ray: Annotated[
        str | None,
        typer.Option(
            "--ray",
            help="Ray cluster address (or auto): run the --workers shards as Ray actors "
            "spread over its hosts, clocks aligned by measured offsets (needs the [ray] extra).",
        ),
    ] = None,
    tiers: Annotated[
        str | None,
        typer.Option(
            help="Tier spec, e.g. paid:0.05:ttft=2s:tbt=100ms,free:0.95:ttft=10s:tbt=500ms."
        ),
    ] = None,
    goodput: Annotated[
        list[str] | None,
        typer.Option(
            help="Goodput SLOs in ms: ttft:MS tpot:MS e2el:MS (repeat, or quote several)."
        ),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed (arrivals, sampling, tiers).")] = 0,
    out: Annotated[
        Path | None,
        typer.Option(
            "-o",
            "--out",
            help="Folder this replay writes: the run directory (default reports/replay-...); "
            "with --repeats, a folder of one run directory per seed.",
        ),
    ] = None,
    policy: Annotated[str | None, typer.Option(help="Built-in only: scheduling policy.")] = None,
    cost_model: Annotated[str | None, typer.Option(help="Built-in only: cost model.")] = None,
    kv_tokens: Annotated[
        int | None, typer.Option(help="Built-in only: KV capacity, tokens.")
    ] = None,
    speed: Annotated[float | None, typer.Option(help="Built-in only: speed-up factor.")] = None,
    faults: Annotated[str | None, typer.Option(help="Built-in only: fault spec.")] = None,
    timeout: Annotated[float, typer.Option(help="Longest silence within one response, s.")] = 600.0,
    drain_timeout: Annotated[
        float, typer.Option(help="With --duration: time in-flight requests get, s.")
    ] = 30.0,
    ready_timeout: Annotated[
        float, typer.Option(help="How long the target may take to answer, s.")
    ] = 5.0,
    priority: Annotated[
        bool,
        typer.Option(
            "--priority/--no-priority", help="Send the tier as the body 'priority' field."
        ),
    ] = True,
    extra_body: Annotated[
        str | None, typer.Option(help="JSON object merged into every request body.")
    ] = None,
    api_key: Annotated[
        str | None, typer.Option(envvar="HARNESS_API_KEY", help="Bearer token.")
    ] = None,
    sample_interval: Annotated[
        float, typer.Option(help="Engine /metrics + GPU sampling period, s (0 = off).")
    ] = 0.25,
    gpu: Annotated[bool, typer.Option("--gpu/--no-gpu", help="Sample GPU memory via NVML.")] = True,
    progress: Annotated[
        bool, typer.Option("--progress/--no-progress", help="Live progress bar.")
    ] = True,
    source_option: Annotated[
        list[str] | None,
        typer.Option(
            "--opt",
            "--source-option",
            help="Trace source option KEY=VALUE (repeat), as in `harness trace build --opt`.",
        ),
    ] = None,
    repeats: Annotated[
        int, typer.Option(help="Replays with seeds SEED, SEED+1, ...; report with intervals.")
    ] = 1,
    warmup: Annotated[
        str | None,
        typer.Option(
            help="Exclude the first N requests or DURATION (30s) from metrics (kept, marked).",
            show_default=False,
        ),
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Replace an existing run directory at --out.")
    ] = False,
    report: Annotated[
        bool, typer.Option("--report/--no-report", help="Write report.html into the run dir.")
    ] = True,
    # Sessions (multi-turn conversations, agent graphs): harness.loadgen.sessions.
    session_rate: SessionRate = None,
    num_sessions: Annotated[int | None, typer.Option(help="Sessions: replay at most N.")] = None,
    max_active_sessions: MaxActiveSessions = None,
    history: Annotated[
        str | None,
        typer.Option(help="Sessions: 'trace' (the trace's replies) or 'reply' (the server's)."),
    ] = None,
    think_time: ThinkTime = None,
    patience: Patience = None,
    max_retries: MaxRetries = None,
    retry_backoff: RetryBackoff = None,
    max_context: MaxContext = None,
) -> None:
    """Replay a trace open-loop (absolute schedule) and record every streamed chunk."""
    if arrival is None:
        arrival = "poisson" if rate is not None else "trace"
    from pydantic import ValidationError

    from harness.loadgen.replay import ReplayConfig, default_run_dir, run_replay
    from harness.results.metrics import parse_goodput
    from harness.workload.session_options import session_options

    if ray is not None:
        from harness.distributed import require_ray

        try:
            require_ray()
        except HarnessError as exc:
            fail(str(exc))

    try:
        gp = parse_goodput(" ".join(goodput)) if goodput else None
    except ValueError as exc:
        fail(f"--goodput: {exc}")
    body: dict[str, Any] | None = None
    if extra_body is not None:
        try:
            body = json.loads(extra_body)
        except ValueError as exc:
            fail(f"--extra-body is not JSON: {exc}")
        if not isinstance(body, dict):
            fail("--extra-body must be a JSON object")
    try:
        cfg = ReplayConfig(
            trace=trace,
            rate=rate,
            target=target,
            model=model,
            engine=engine,
            endpoint=endpoint,
            arrival=arrival,
            burstiness=burstiness,
            time_scale=time_scale,
            num_requests=num_requests,
            duration_s=duration,
            max_concurrency=max_concurrency,
            workers=workers,
            ray=ray,
            tiers=tiers,
            goodput=gp,
            seed=seed,
            out=out,
            policy=policy,
            cost_model=cost_model,
            kv_tokens=kv_tokens,
            speed=speed,
            faults=faults,
            timeout_s=timeout,
            drain_timeout_s=drain_timeout,
            ready_timeout_s=ready_timeout,
            send_priority=priority,
            extra_body=body,
            api_key=api_key,
            sample_interval_s=sample_interval if sample_interval > 0 else None,
            gpu=gpu,
            progress=progress,
            trace_options=_kv_options(source_option),
            sessions=session_options(
                trace,
                session_rate=session_rate,
                num_sessions=num_sessions,
                max_active_sessions=max_active_sessions,
                history=history,
                think_time=think_time,
                patience_s=patience,
                max_retries=max_retries,
                retry_backoff_s=retry_backoff,
                max_context=max_context,
            ),
        )
    except ValidationError as exc:
        fail(one_line(exc, _FLAGS))
    if cfg.out is None:
        cfg = cfg.model_copy(update={"out": default_run_dir(cfg, trace)})
    warmup_spec = _warmup_spec(warmup, repeats)
    if repeats > 1:
        _replay_repeats(cfg, repeats, warmup_spec, report=report, force=force)
        return
    run_dir = cfg.out
    assert run_dir is not None
    from harness.results.rundir import claim_run_dir

    try:
        claim_run_dir(run_dir, force)
    except FileExistsError as exc:
        fail(f"--out: {exc}")
    interrupted = False
    received: list[int] = []
    restore = _stop_signals_like_sigint(received)
    try:
        run_replay(cfg)
    except HarnessError as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        interrupted = True
    finally:
        restore()
    signum = received[0] if received else int(signal.SIGINT)
    if warmup_spec is not None and not interrupted and (run_dir / "run.json").is_file():
        from harness.results.summary import apply_warmup

        apply_warmup(run_dir, warmup_spec)
    _print_result(run_dir, cfg.goodput, interrupted, signum)
    if report and (run_dir / "run.json").is_file():
        from harness.report import write_report

        _echo(f"report: {write_report([run_dir])}")
    if interrupted:
        raise typer.Exit(128 + signum)


def _stop_signals_like_sigint(received: list[int]) -> Callable[[], None]:
    """SIGTERM (``timeout``, ``docker stop``, CI cancellation) and SIGHUP (closed terminal)
    stop a replay exactly like Ctrl-C: whatever SIGINT handler is current (asyncio's, which
    cancels the run so the writer closes it as partial, or Python's KeyboardInterrupt) is
    called; the signal is remembered for the exit code 128+signal. Returns the undo."""

    def handler(signum: int, frame: Any) -> None:
        received.append(signum)
        current = signal.getsignal(signal.SIGINT)
        if callable(current):
            current(signal.SIGINT, frame)
        else:
            raise KeyboardInterrupt

    old: dict[int, Any] = {}
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        # Started as a shell's background job, the process inherits SIGINT ignored:
        # asyncio.Runner then installs no handler, SIGINT is lost and SIGTERM's KeyboardInterrupt
        # lands inside the event loop, which swallows it: the replay cannot be stopped. Take
        # Ctrl-C's default back for the run (as CPython's own test runner does, gh-154167).
        with contextlib.suppress(ValueError, OSError):  # not the main thread
            old[signal.SIGINT] = signal.signal(signal.SIGINT, signal.default_int_handler)
    for name in ("SIGTERM", "SIGHUP"):
        sig = getattr(signal, name, None)
        if sig is not None:
            with contextlib.suppress(ValueError, OSError):  # not the main thread
                old[sig] = signal.signal(sig, handler)

    def restore() -> None:
        for sig, h in old.items():
            with contextlib.suppress(ValueError, OSError, TypeError):
                signal.signal(sig, h)

    return restore


def _echo(text: str) -> None:
    """stdout line that survives a closed pipe (``harness replay ... | head``): the run's
    files are already written, so a reader that went away is no error."""
    try:
        typer.echo(text)
    except BrokenPipeError:
        _silence_stdout()


def _stdout_console() -> Any:
    """A rich Console for stdout that goes quiet when the reader leaves (rich's default on a
    broken pipe is ``SystemExit(1)``, which would skip the summary and report)."""
    from rich.console import Console

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True
            _silence_stdout()

    return _Console()


def _silence_stdout() -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    with contextlib.suppress(OSError):
        os.dup2(devnull, sys.stdout.fileno())


def _print_result(
    run_dir: Path, goodput: dict[str, float] | None, interrupted: bool, signum: int = 2
) -> None:
    try:
        _print_result_inner(run_dir, goodput, interrupted, signum)
    except BrokenPipeError:  # `| head`: the reader left; the files are written regardless
        _silence_stdout()
        if interrupted or not (run_dir / "summary.json").is_file():
            from harness.results.summary import write_summary

            with contextlib.suppress(Exception):
                write_summary(run_dir, goodput=goodput)


def _print_result_inner(
    run_dir: Path, goodput: dict[str, float] | None, interrupted: bool, signum: int
) -> None:
    from harness.results import schema

    console = _stdout_console()
    if not (run_dir / schema.RUN_JSON).is_file():
        if interrupted:
            fail("interrupted before the run started", code=128 + signum)
        return
    summary = None
    try:
        from harness.results.console import print_summary
        from harness.results.summary import write_summary

        sp = run_dir / schema.SUMMARY_JSON
        if sp.is_file() and not interrupted:
            summary = json.loads(sp.read_text(encoding="utf-8"))
        else:
            summary = write_summary(run_dir, goodput=goodput)
        print_summary(summary, console=console)
        from harness.results.sessions import add_session_summary, print_session_summary

        if interrupted:  # the replay stopped before adding its session figures
            add_session_summary(run_dir)

        print_session_summary(run_dir, console)  # session runs only
    except ImportError:
        pass
    _print_warnings(run_dir)
    # soft_wrap: the path stays on one line (copyable) whatever the terminal width.
    if interrupted:
        from rich.markup import escape

        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = str(signum)
        console.print(
            f"[bold yellow]interrupted ({name}):[/] partial run in {escape(str(run_dir))}",
            soft_wrap=True,
        )
    else:
        console.print(f"run directory: {run_dir}", soft_wrap=True, highlight=False, markup=False)


def _print_warnings(run_dir: Path) -> None:
    """run.json's ``warnings`` (cause and fix, e.g. the open-file limit), one line each."""
    from harness.cli.errors import warn
    from harness.results import schema

    try:
        meta = json.loads((run_dir / schema.RUN_JSON).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    for line in meta.get("warnings") or []:
        warn(str(line))


def register(app: typer.Typer) -> None:
    app.command("replay")(replay)


def _warmup_spec(warmup: str | None, repeats: int) -> dict[str, Any] | None:
    """--repeats / --warmup checked before anything runs (one error line, exit 2)."""
    if repeats < 1:
        fail(f"--repeats {repeats}: must be >= 1")
    if warmup is None:
        return None
    from harness.results.warmup import parse_warmup

    try:
        return parse_warmup(warmup)
    except ValueError as exc:
        fail(str(exc))


def _replay_repeats(
    cfg: Any, repeats: int, warmup_spec: dict[str, Any] | None, *, report: bool, force: bool
) -> None:
    """--repeats K: K replays, seeds cfg.seed.., one run directory each under --out, then
    runs.json and one report with 95% intervals over seeds (harness.results.repeats)."""
    from harness.loadgen.replay import run_replay
    from harness.results.repeats import mark_run, seeds_for, write_index
    from harness.results.rundir import claim_run_dir

    folder = cfg.out
    group = str(cfg.policy or cfg.engine or "replay")
    runs: list[tuple[Path, str, int]] = []
    for i, s in enumerate(seeds_for(cfg.seed, repeats)):
        run_dir = folder / f"seed-{s}"
        try:
            claim_run_dir(run_dir, force)
        except FileExistsError as exc:
            fail(f"--out: {exc}")
        try:
            run_replay(cfg.model_copy(update={"seed": s, "out": run_dir}))
        except HarnessError as exc:
            fail(str(exc))
        except KeyboardInterrupt:
            _echo(f"interrupted: partial run in {run_dir}")
            raise typer.Exit(130) from None
        mark_run(run_dir, group=group, seed=s, index=i, of=repeats)
        if warmup_spec is not None:
            from harness.results.summary import apply_warmup

            apply_warmup(run_dir, warmup_spec)
        _print_result(run_dir, cfg.goodput, False, int(signal.SIGINT))
        runs.append((run_dir, group, s))
    write_index(folder, "replay", runs)
    if report:
        from harness.report import write_report

        _echo(f"report: {write_report([folder])}")
