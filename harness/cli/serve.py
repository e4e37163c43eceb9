"""``harness serve``: run the built-in OpenAI-compatible engine server in the foreground."""

from __future__ import annotations

from pathlib import Path

import typer

from harness.cli.errors import fail


def register(app: typer.Typer) -> None:
    app.command(name="serve")(serve)


def serve(
    policy: str = typer.Option("vllm", "--policy", help="Scheduling policy (harness policies)."),
    cost_model: str = typer.Option(
        None, "--cost-model", help="Cost-model preset or .yaml/.json file (step durations)."
    ),
    kv_tokens: int = typer.Option(None, "--kv-tokens", help="KV-cache capacity in tokens."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind (loopback default)."),
    port: int = typer.Option(8000, "--port", help="TCP port (0 = any free port)."),
    speed: float = typer.Option(
        1.0, "--speed", help="Run the model clock this many times faster than wall time."
    ),
    api_key: str = typer.Option(
        None, "--api-key", envvar="HARNESS_API_KEY", help="Require 'Authorization: Bearer KEY'."
    ),
    faults: str = typer.Option(
        None,
        "--faults",
        help="Inject faults, e.g. error=0.01,drop=0.01,stall=0.01:2s,malformed=0.01,"
        "slow_first=0.01:1s,seed=0",
    ),
    model: str = typer.Option(None, "--model", help="Model name to serve and echo."),
    fault_log: Path = typer.Option(None, "--fault-log", help="JSONL file of injected faults."),
    tiers: str = typer.Option(
        None, "--tiers", help="Tier spec used to resolve SLOs when a request names only a tier."
    ),
    max_num_seqs: int = typer.Option(None, "--max-num-seqs", help="Max requests holding KV."),
    token_budget: int = typer.Option(
        None, "--max-num-batched-tokens", help="Max tokens per engine step."
    ),
    block_size: int = typer.Option(None, "--block-size", help="KV block size in tokens."),
    record_requests: bool = typer.Option(
        False, "--record-requests", help="Keep per-request model times (GET /harness/requests)."
    ),
    prefix_caching: bool = typer.Option(
        True,
        "--prefix-caching/--no-prefix-caching",
        help="The engine's prefix cache (vLLM's default: on).",
    ),
    replicas: int = typer.Option(
        1, "--replicas", help="Engine cores behind the one endpoint, each with its own loop."
    ),
    router: str = typer.Option(
        "round-robin", "--router", help="Router over the replicas (harness policies)."
    ),
    router_param: list[str] = typer.Option(
        None, "--router-param", help="Router parameter NAME=VALUE (repeatable)."
    ),
) -> None:
    """Serve /v1/completions, /v1/chat/completions, /v1/models, /health and /metrics.

    With --replicas N the endpoint fronts N engine cores; --router picks one per request
    (session from the x-session-id header or the body's "user"), e.g.
    harness serve --replicas 4 --router session-affinity."""
    import asyncio

    import harness.server as srv

    engine: dict[str, int] = {}
    for key, val in (
        ("max_num_seqs", max_num_seqs),
        ("token_budget", token_budget),
        ("block_size", block_size),
    ):
        if val is not None:
            engine[key] = val
    kw = {
        "policy": policy,
        "kv_tokens": kv_tokens,
        "speed": speed,
        "api_key": api_key,
        "faults": faults,
        "fault_log": fault_log,
        "tiers": tiers,
        "engine": engine,
        "record_requests": record_requests,
        "prefix_caching": prefix_caching,
    }
    if cost_model is not None:
        kw["cost_model"] = cost_model
    if model is not None:
        kw["model"] = model
    if not 0 <= port <= 65535:
        fail(f"--port {port} is outside 0..65535")
    if not 1 <= replicas <= 256:
        fail(f"--replicas {replicas} is outside 1..256")
    try:
        from harness.routers.registry import parse_router_params

        kw["router_params"] = parse_router_params(router, router_param)
        kw["replicas"] = replicas
        kw["router"] = router
        cfg = srv.make_config(**kw)
    except ValueError as e:
        fail(str(e))
    try:
        asyncio.run(srv.serve_forever(cfg, host, port))
    except KeyboardInterrupt:
        pass
    except OSError as e:
        fail(f"cannot listen on {host}:{port}: {e.strerror or e}")
