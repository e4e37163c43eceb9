"""`harness bench-client`: how fast the load generator itself goes (no engine involved)."""

from __future__ import annotations

from typing import Annotated

import typer

from harness.cli.errors import fail


def bench_client(
    rates: Annotated[str, typer.Option(help="Offered rates, req/s, comma-separated.")] = (
        "100,400,1000,2000"
    ),
    duration: Annotated[float, typer.Option(help="Seconds of arrivals per rate.")] = 5.0,
    output_len: Annotated[int, typer.Option(help="Tokens per response (one piece).")] = 100,
    accuracy: Annotated[
        bool, typer.Option("--accuracy/--no-accuracy", help="Also check chunk timestamps.")
    ] = True,
    vllm_python: Annotated[
        str | None, typer.Option(help="Python of a venv with vLLM: also run vllm bench serve.")
    ] = None,
    tokenizer: Annotated[
        str | None, typer.Option(help="Local tokenizer dir for vllm bench serve.")
    ] = None,
    workers: Annotated[
        str, typer.Option(help="Load-generator worker settings, e.g. 1,2,auto (1 = in-process).")
    ] = "1",
    accuracy_rate: Annotated[
        float, typer.Option(help="Offered rate of the timestamp-accuracy check, req/s.")
    ] = 100.0,
) -> None:
    """Drive a fast local SSE server (separate process) and print achieved rate, chunks/s,
    send lag and TTFT p99 per offered rate."""
    try:
        rate_list = [float(x) for x in rates.split(",") if x.strip()]
    except ValueError:
        fail(f"--rates {rates!r}: use comma-separated numbers, e.g. 100,400")
    if not rate_list or any(r <= 0 for r in rate_list):
        fail("--rates must be > 0")
    if duration <= 0 or output_len < 1:
        fail("--duration must be > 0 and --output-len >= 1")
    from harness.loadgen.bench import main, parse_workers

    try:
        worker_list = parse_workers(workers)
    except ValueError as exc:
        fail(f"--workers: {exc}")

    if vllm_python is not None and tokenizer is None:
        fail("--vllm-python needs --tokenizer (a local tokenizer dir; the HF hub is offline)")
    main(
        rate_list,
        duration,
        output_len,
        accuracy,
        vllm_python,
        tokenizer,
        worker_list,
        accuracy_rate=accuracy_rate,
    )


def register(app: typer.Typer) -> None:
    app.command("bench-client")(bench_client)
