"""`harness simulate`: run a trace through the engine core in virtual time, one run dir per policy.

Parses flags, builds a :class:`~harness.engine.simulate.SimulateConfig`, calls
``run_simulation``, prints each run's per-tier summary and directory. Bad input (unknown
policy or preset, negative rate, malformed trace or tiers): one line, exit 2.

Session traces (conversations, agent graphs), ``--replicas N`` and ``--agents FILE`` run on
the cluster simulator (:mod:`harness.engine.cluster`, issue 16); a plain trace on one
replica keeps the single-engine kernel and never imports the cluster modules (nor, through
the session options, the load generator's HTTP client). ``--tokenizer`` counts a session
trace's prompts in the model's tokens (:func:`harness.workload.token_identity.
tokenize_session_trace`): a trace's lengths are hints (ShareGPT: bytes / 4), and the prefix
cache's hit rate depends on where its blocks end.
"""

from __future__ import annotations

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
from harness.engine.costmodel import DEFAULT_COST_MODEL

_FLAGS = {
    "policies": "policy",
    "arrival_window_s": "duration",
    "stop_at_s": "stop-at",
    "out_dir": "out",
    "policy_params": "param",
}


def _params(items: list[str] | None) -> dict[str, dict[str, Any]]:
    """``--param sarathi.order=spf`` -> {"sarathi": {"order": "spf"}}."""
    from harness.cli.params import parse_params

    try:
        return parse_params(items)
    except ValueError as e:
        fail(str(e))


def simulate(
    trace: Annotated[
        str,
        typer.Option(help="Trace name (lmsys, sharegpt, synthetic, azure-conv) or file."),
    ],
    rate: Annotated[
        float | None, typer.Option(help="Arrival rate, req/s (default: trace timestamps).")
    ] = None,
    policy: Annotated[
        str, typer.Option(help="Comma-separated policies, e.g. vllm,sarathi (see `policies`).")
    ] = "vllm",
    cost_model: Annotated[
        str,
        typer.Option(help="Preset (a100-llama2-7b, h100-llama2-7b, ...), preset:k=v, or file."),
    ] = DEFAULT_COST_MODEL,
    kv_tokens: Annotated[
        int | None, typer.Option(help="KV capacity in tokens (default: from the preset).")
    ] = None,
    num_blocks: Annotated[int | None, typer.Option(help="KV capacity in blocks.")] = None,
    gpu_mem_gib: Annotated[
        float | None, typer.Option(help="Derive KV from GPU memory (GiB) instead of the preset's.")
    ] = None,
    kv_bytes_per_token: Annotated[
        int | None, typer.Option(help="Model KV bytes per token (Llama-2-7B fp16: 524288).")
    ] = None,
    model_weights_gib: Annotated[
        float | None, typer.Option(help="Model weights, GiB (subtracted from GPU memory).")
    ] = None,
    block_size: Annotated[int, typer.Option(help="KV block size, tokens.")] = 16,
    token_budget: Annotated[int, typer.Option(help="Max tokens per step.")] = 2048,
    max_num_seqs: Annotated[int, typer.Option(help="Max requests holding KV.")] = 256,
    num_requests: Annotated[int | None, typer.Option(help="Requests to draw.")] = None,
    duration: Annotated[
        float | None, typer.Option(help="Keep arrivals within this many seconds.")
    ] = None,
    stop_at: Annotated[
        float | None, typer.Option(help="Stop the virtual clock here; in-flight = cancelled.")
    ] = None,
    arrival: Annotated[str, typer.Option(help="poisson, gamma, constant or trace.")] = "poisson",
    burstiness: Annotated[float, typer.Option(help="Gamma shape; 1 = Poisson.")] = 1.0,
    tiers: Annotated[
        str | None, typer.Option(help="Tier spec, e.g. paid:0.05:tbt=100ms,free:0.95:tbt=500ms.")
    ] = None,
    known_output_lengths: Annotated[
        bool, typer.Option(help="Policies see each request's max_tokens as its known length.")
    ] = False,
    param: Annotated[
        list[str] | None, typer.Option(help="Policy parameter POLICY.NAME=VALUE (repeatable).")
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of every random stream.")] = 0,
    out: Annotated[
        Path | None,
        typer.Option(
            "-o",
            "--out",
            help="Folder this simulation writes: one run directory per policy (and seed), "
            "runs.json and comparison.html (default reports/sim-<UTC time>).",
            show_default=False,
        ),
    ] = None,
    label: Annotated[str | None, typer.Option(help="Run name prefix.")] = None,
    repeats: Annotated[
        int,
        typer.Option(
            help="Runs per policy with seeds SEED, SEED+1, ...: the comparison then gives "
            "95% intervals over seeds and requests."
        ),
    ] = 1,
    warmup: Annotated[
        str | None,
        typer.Option(
            help="Exclude the first N requests, or those arriving in the first DURATION "
            "(e.g. 30s), from every metric (kept in the run directory, marked).",
            show_default=False,
        ),
    ] = None,
    report: Annotated[
        bool, typer.Option(help="Write report.html per run (and a comparison for several).")
    ] = True,
    replicas: Annotated[
        int, typer.Option(help="Engines behind the router (a cluster on one virtual clock).")
    ] = 1,
    router: Annotated[
        str | None,
        typer.Option(help="Router over the replicas (`harness policies` lists them; round-robin)."),
    ] = None,
    router_param: Annotated[
        list[str] | None, typer.Option(help="Router parameter NAME=VALUE (repeatable).")
    ] = None,
    agents: Annotated[
        str | None,
        typer.Option(help="Agent graph file whose agents' 'engine' entries size their engines."),
    ] = None,
    prefix_caching: Annotated[
        bool, typer.Option(help="Cluster engines cache prompt prefixes (vLLM's default: on).")
    ] = True,
    session_rate: SessionRate = None,
    num_sessions: Annotated[int | None, typer.Option(help="Sessions: simulate at most N.")] = None,
    max_active_sessions: MaxActiveSessions = None,
    history: Annotated[
        str | None,
        typer.Option(help="Sessions: 'trace' (the trace's replies) or 'reply' (generated)."),
    ] = None,
    think_time: ThinkTime = None,
    patience: Patience = None,
    max_retries: MaxRetries = None,
    retry_backoff: RetryBackoff = None,
    max_context: MaxContext = None,
    call_overhead: Annotated[
        float | None,
        typer.Option(
            help="Sessions: s from each call's release to its arrival at the engine (the "
            "client and API server's share of a live call; benchmarks/prefix_cache_vs_vllm.py "
            "measures it on a replay).",
            show_default=False,
        ),
    ] = None,
    tokenizer: Annotated[
        str | None,
        typer.Option(
            help="Sessions: count prompts in this tokenizer's tokens (tokenizer.json or its "
            "folder); with --history trace the composed prompts become token ids, so the "
            "prefix cache hashes what the server hashes.",
            show_default=False,
        ),
    ] = None,
    processes: Annotated[
        int | None,
        typer.Option(
            help="Cluster: worker processes that simulate the engines of a cluster whose "
            "router never reads the engines' load (round-robin, random), in parallel "
            "(default: one per usable core; 1: in this process). Same run directories either "
            "way.",
            show_default=False,
        ),
    ] = None,
    ray: Annotated[
        str | None,
        typer.Option(
            "--ray",
            help="Run each policy as a Ray task on 'auto' (a running cluster, else a local "
            "one) or a cluster ADDRESS (needs the [ray] extra).",
        ),
    ] = None,
) -> None:
    """Simulate policies on a trace in virtual time; writes one run directory per policy."""
    from pydantic import ValidationError

    from harness.engine.costmodel import CostModelError
    from harness.engine.simulate import SimulateConfig, SimulationStalled, run_simulation
    from harness.workload.tiers import TierSpecError
    from harness.workload.trace import TraceError

    policies = [p.strip() for p in policy.split(",") if p.strip()]
    if not policies:
        fail("--policy: give at least one policy name")
    if out is not None and out.exists() and not out.is_dir():
        fail(f"--out {out}: is a file; give a folder for the run directories")
    from harness.cli.params import check_params

    try:
        check_params(_params(param), policies)  # typos: one line listing the valid names
    except ValueError as e:
        fail(str(e))
    if repeats < 1:
        fail(f"--repeats {repeats}: must be >= 1")
    warmup_spec = None
    if warmup is not None:
        from harness.results.warmup import parse_warmup

        try:
            warmup_spec = parse_warmup(warmup)
        except ValueError as e:
            fail(str(e))
    if out is None:
        import time

        out = Path("reports") / time.strftime("sim-%Y%m%d-%H%M%S", time.gmtime())
    if ray is not None:
        from harness.distributed import require_ray

        try:
            require_ray()
        except HarnessError as e:
            fail(str(e))
    try:
        cfg = SimulateConfig(
            trace=trace,
            rate=rate,
            arrival=arrival,
            burstiness=burstiness,
            num_requests=num_requests,
            arrival_window_s=duration,
            tiers=tiers,
            seed=seed,
            policies=policies,
            policy_params=_params(param),
            cost_model=cost_model,
            block_size=block_size,
            kv_tokens=kv_tokens,
            num_blocks=num_blocks,
            gpu_mem_gib=gpu_mem_gib,
            kv_bytes_per_token=kv_bytes_per_token,
            model_weights_gib=model_weights_gib,
            token_budget=token_budget,
            max_num_seqs=max_num_seqs,
            known_output_lengths=known_output_lengths,
            stop_at_s=stop_at,
            out_dir=out,
            label=label,
        )
    except (ValidationError, ValueError) as e:
        fail(one_line(e, _FLAGS))
    session_flags = {
        "session_rate": session_rate,
        "num_sessions": num_sessions,
        "max_active_sessions": max_active_sessions,
        "history": history,
        "think_time": think_time,
        "patience_s": patience,
        "max_retries": max_retries,
        "retry_backoff_s": retry_backoff,
        "max_context": max_context,
        "call_overhead_s": call_overhead,
    }
    copts = None
    cluster = False
    if _maybe_cluster(
        trace, replicas, agents, router is not None or bool(router_param), session_flags
    ):
        copts = _cluster_options(
            trace,
            replicas=replicas,
            router=router,
            router_param=router_param,
            agents=agents,
            prefix_caching=prefix_caching,
            sessions=session_flags,
        )
        from harness.engine.cluster_config import needs_cluster

        cluster = needs_cluster(cfg, copts)
    if processes is not None and processes < 1:
        fail(f"--processes {processes}: must be >= 1")
    if cluster and ray is not None:
        fail("--ray runs single-engine simulations; a cluster (--replicas, sessions) runs here")
    tok = None
    if tokenizer is not None:
        from harness.engine.cluster_config import is_session_run

        if copts is None or not is_session_run(cfg, copts):
            fail(f"--tokenizer counts a session trace's prompts; {trace} has no sessions")
        from harness.workload.prompts import load_tokenizer

        try:
            tok = load_tokenizer(tokenizer)
        except TraceError as e:
            fail(f"--tokenizer: {e}")
    from harness.results.console import print_summary
    from harness.results.repeats import mark_run, seeds_for, write_index
    from harness.results.rundir import read_run

    runs: list[tuple[Path, str, int]] = []
    for i, s in enumerate(seeds_for(seed, repeats)):
        scfg = cfg.model_copy(
            update={"seed": s, "label": f"{label}-s{s}" if label else f"s{s}"}
            if repeats > 1
            else {}
        )
        try:
            if cluster:
                dirs = _run_cluster(scfg, copts, tok, processes)
            elif ray is None:
                dirs = run_simulation(scfg)
            else:
                from harness.distributed.pool import simulate_each_policy

                dirs = simulate_each_policy(scfg, ray)
        except (
            TraceError,
            TierSpecError,
            CostModelError,
            SimulationStalled,
            HarnessError,
            FileNotFoundError,
            ValueError,
            TypeError,
        ) as e:
            fail(one_line(e, _FLAGS))
        for pol, d in zip(policies, dirs, strict=True):
            group = f"{label}-{pol}" if label else pol
            mark_run(d, group=group, seed=s, index=i, of=repeats)
            if warmup_spec is not None:
                from harness.results.summary import apply_warmup

                apply_warmup(d, warmup_spec)
            runs.append((d, group, s))
    write_index(out, "simulate", runs)
    dirs = [d for d, _, _ in runs]
    for d in dirs if repeats == 1 else []:
        run = read_run(d, requests=False, chunks=False, samples=False)
        typer.echo(f"\n== {run.meta.get('policy')} ==")
        if run.summary is not None:
            print_summary(run.summary)
        typer.echo(str(d))
    if repeats > 1:
        typer.echo(
            f"{len(dirs)} runs: {len(policies)} policies x seeds {seed}..{seed + repeats - 1}"
        )
    if len(policies) > 1 or repeats > 1:
        _print_verdicts(dirs)
    if report:
        from harness.report import write_report

        for d in dirs:
            path = write_report([d])
            if repeats == 1:
                typer.echo(f"report: {path}")
        if len(dirs) > 1:
            cmp_path = write_report([out], out=out / "comparison.html")
            typer.echo(f"comparison report: {cmp_path}")
    typer.echo(f"output folder: {out}")


def _maybe_cluster(
    trace: str, replicas: int, agents: str | None, routed: bool, session_flags: dict[str, Any]
) -> bool:
    """False only when the run is certainly a plain trace on one engine (no replicas, agent
    file, router or session flag, and not a session source): the cluster modules are then
    never loaded.
    :func:`harness.engine.cluster_config.needs_cluster` decides every other case."""
    if replicas != 1 or agents is not None or routed:
        return True
    if any(v is not None for v in session_flags.values()):
        return True
    from harness.workload.sources.conversations import is_session_source

    return is_session_source(trace)


def _run_cluster(cfg: Any, copts: Any, tok: Any, processes: int | None) -> list[Path]:
    """One cluster run per policy; with a tokenizer, on the trace counted in its tokens."""
    from harness.engine.cluster_config import load_cluster_trace, run_cluster_simulation

    if tok is None:
        return run_cluster_simulation(cfg, copts, processes=processes)
    from harness.workload.token_identity import tokenize_session_trace

    history = copts.sessions.history if copts.sessions is not None else "trace"
    trace = tokenize_session_trace(
        load_cluster_trace(cfg, copts), tok, history=history, seed=cfg.seed
    )
    return run_cluster_simulation(cfg, copts, trace=trace, processes=processes)


def _cluster_options(
    trace: str,
    *,
    replicas: int,
    router: str | None,
    router_param: list[str] | None,
    agents: str | None,
    prefix_caching: bool,
    sessions: dict[str, Any],
) -> Any:
    """The cluster flags as :class:`~harness.engine.cluster_config.ClusterOptions`; a bad
    value is one ``error:`` line (exit 2)."""
    from pydantic import ValidationError

    from harness.engine.cluster_config import ClusterOptions
    from harness.routers.registry import parse_router_params
    from harness.workload.session_options import session_options

    if replicas < 1:
        fail(f"--replicas {replicas}: must be >= 1")
    if router_param and router is None:
        fail("--router-param needs --router")
    if agents is not None and not Path(agents).is_file():
        fail(f"--agents {agents}: no such file")
    try:
        params = parse_router_params(router, router_param) if router is not None else {}
        opts = session_options(trace, **sessions)
        return ClusterOptions(
            replicas=replicas,
            router=router,
            router_params=params,
            agents_file=agents,
            sessions=opts,
            prefix_caching=prefix_caching,
        )
    except (ValidationError, ValueError) as e:
        fail(
            one_line(
                e,
                {
                    "patience_s": "patience",
                    "retry_backoff_s": "retry-backoff",
                    "call_overhead_s": "call-overhead",
                },
            )
        )


def _print_verdicts(dirs: list[Path]) -> None:
    """The answer on the terminal: per tier, P99 TBT and SLO attainment of each policy
    against the first, at 95% confidence (the comparison report has every metric)."""
    from harness.report.data import load_run_view
    from harness.results.compare import compare_groups, groups_of

    res = compare_groups(groups_of([load_run_view(d) for d in dirs]))
    lines = [v for v in res["verdicts"] if v["metric"] in ("p99_tbt", "slo_attainment")]
    if lines:
        typer.echo("\nverdicts (95% bootstrap intervals; see the comparison report for all):")
    for v in lines:
        typer.echo(f"  {v['sentence']}")


def register(app: typer.Typer) -> None:
    app.command("simulate")(simulate)
