"""A cluster run directory: :func:`simulate_cluster` written in the replay format (issue 16).

Same tables and columns as ``harness replay`` of the same trace (harness.results.schema):
request rows (with the session columns for a session trace, one row per attempt), chunk
rows (one token each), engine telemetry per step in samples with the ``engine`` column, and
``sessions.parquet`` for a session trace, ``prefix_hits.parquet`` when engines cache prefixes
(each attempt's lookup at first admission: the hit rate per run and per turn index); run.json
names every engine (policy, parameters, cost model, KV) and the router.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from harness.engine.cluster import (
    ClusterResult,
    EngineSpec,
    engine_samples_table,
    samples_table,
    simulate_cluster,
)
from harness.engine.cluster_fast import routed_budgets, simulate_routed
from harness.engine.cluster_split import simulate_split, split_plan
from harness.engine.simresult import SimResult, SimulationStalled
from harness.engine.simulate import _json_safe, chunks_table, requests_table
from harness.results.prefix_hits import write_prefix_hits
from harness.results.sessions import write_sessions
from harness.routers.base import Router
from harness.workload.session_options import SessionOptions
from harness.workload.sessions import has_sessions
from harness.workload.trace import Trace


def engine_meta(spec: EngineSpec) -> dict[str, Any]:
    """One engine's run.json entry."""
    p = spec.policy
    return {
        "name": spec.name,
        "agent": spec.agent,
        "policy": getattr(p, "name", type(p).__name__),
        "policy_params": _json_safe(p.params() if hasattr(p, "params") else {}),
        "cost_model": spec.cost_model.to_dict(),
        "engine": spec.config.describe(),
    }


def write_cluster_run(
    run_dir: Path,
    trace: Trace,
    engines: Sequence[EngineSpec],
    router: Router | None,
    meta: dict[str, Any],
    *,
    options: SessionOptions | None = None,
    stop_at_s: float | None = None,
    split: bool = False,
    processes: int | None = None,
) -> tuple[Path, ClusterResult | SimResult]:
    """Simulate the cluster and write its run directory (requests, chunks, samples,
    sessions.parquet for a session trace, run.json); returns a :class:`ClusterResult`.
    ``split``: take the fastest exact kernel. A cluster that decomposes
    (:func:`~harness.engine.cluster_split.split_plan`) runs as independent engines; one whose
    router reads loads, on a plain trace, runs the event loop over array engines
    (:func:`~harness.engine.cluster_fast.routed_budgets`). Same answers, faster; the result is
    then the merged :class:`SimResult`. ``processes``: worker processes for a cluster that
    decomposes (:func:`~harness.engine.cluster_split.simulate_split`: ``None`` one per usable
    core, ``1`` none); the same run directory either way."""
    from harness.results.rundir import RunWriter

    sessions = has_sessions(trace.df)
    opts = options or SessionOptions()
    policies = sorted({engine_meta(s)["policy"] for s in engines})
    first = engines[0]
    full: dict[str, Any] = {
        "kind": "simulate",
        "backend": "simulator",
        "policy": policies[0] if len(policies) == 1 else "+".join(policies),
        "policy_params": engine_meta(first)["policy_params"] if len(policies) == 1 else {},
        "cost_model": first.cost_model.to_dict(),
        "engine": first.config.describe(),
        "cluster": {
            "engines": [engine_meta(s) for s in engines],
            "router": None if router is None else router.name,
            "router_params": {} if router is None else _json_safe(router.params()),
            "replicas": sum(1 for s in engines if s.agent is None),
        },
        "tiers": [t.to_dict() for t in trace.tiers],
        "trace_meta": dict(trace.meta),
        # build_trace stores the hash it computed (0.5 s at 100k rows); else compute it
        "trace_hash": trace.meta.get("content_hash") or trace.content_hash(),
        "num_requests": len(trace),
        "t0_unix": time.time(),
        **meta,
    }
    if sessions:
        full.setdefault("sessions", {"options": opts.model_dump(mode="json")})
    plan = split_plan(trace, engines, router, options) if split else None
    budgets = None
    if split and plan is None:
        budgets = routed_budgets(trace, engines, router, options, stop_at_s)
    if plan is not None or budgets is not None:
        if plan is not None:
            full["cluster"]["split"] = True  # routed up front, engines simulated alone (exact)
        else:
            full["cluster"]["array_engines"] = True  # the event loop on array engines (exact)
        # streamed chunk row groups: no merge of parts on close, and the same bytes however
        # fast (or in how many processes) the engines were simulated (RunWriter)
        with RunWriter(run_dir, full, stream_chunks=True) as w:

            def sink(req: np.ndarray, t: np.ndarray) -> None:
                w.add_chunks_table(chunks_table(req, t))

            if plan is not None:
                merged, parts = simulate_split(
                    trace, engines, plan, stop_at_s=stop_at_s, chunk_sink=sink, processes=processes
                )
            else:
                assert budgets is not None
                merged, parts, _ = simulate_routed(trace, engines, router, budgets, chunk_sink=sink)
            w.add_requests_table(requests_table(trace, merged))
            names = [s.name for s in engines]
            w.add_samples_table(engine_samples_table(names, [p.samples for p in parts]))
            w.update_meta(
                duration_s=merged.end_s,
                sim={
                    "wall_s": merged.wall_s,
                    "end_s": merged.end_s,
                    "num_steps": merged.num_steps,
                    "policy_calls": merged.num_calls,
                    **merged.counters,
                },
                engines_stats=[
                    {"name": n, "num_steps": p.num_steps, **p.counters}
                    for n, p in zip(names, parts, strict=True)
                ],
            )
        return run_dir, merged
    with RunWriter(run_dir, full) as w:
        res = simulate_cluster(
            trace,
            engines,
            router,
            options=opts,
            stop_at_s=stop_at_s,
            chunk_sink=lambda req, t: w.add_chunks_table(chunks_table(req, t)),
            on_stall="return",
        )
        w.add_requests_table(res.driver.requests_table(sessions))
        w.add_samples_table(samples_table(res))
        if sessions:
            write_sessions(run_dir, res.driver.sessions_table())
        hits = res.driver.prefix_hit_counts()
        if hits is not None:  # per-request prefix-cache counts: the hit rate by turn
            write_prefix_hits(run_dir, *hits)
        w.update_meta(
            duration_s=res.end_s,
            sim={"wall_s": res.wall_s, "end_s": res.end_s, **res.counters},
            engines_stats=res.per_engine,
        )
        if res.counters["stalled"]:  # written above: the run is partial, the CLI says why
            raise SimulationStalled(res.counters["stalled"])
    return run_dir, res


__all__ = ["engine_meta", "write_cluster_run"]
