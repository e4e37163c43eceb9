"""A cluster that decomposes: route first, then simulate each engine alone (issue 16, speed).

When every call's engine is known before anything runs, the engines never interact and the
cluster is N independent single-engine simulations, each on the fastest exact kernel
(:func:`harness.engine.simulate.simulate`: the vectorised one for policies that declare the
budget rule). That holds, exactly, when

- the trace is plain (no session can release a call at another call's finish), with no
  session options (patience, retries, slots), and no agents;
- the router never reads an engine's load: it is probed on a copy with views that raise on
  any read, and keeps the base class's ``on_finish`` (its choices then cannot depend on
  when calls finish). Round-robin and RAD's random planner pass; load- or cache-aware
  routers fail the probe and run on the event loop of :mod:`harness.engine.cluster`.

Same answers as the event loop (a test); results come back as one request table and per-engine
telemetry, ready for :func:`harness.engine.cluster_run.write_cluster_run`.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from harness.engine.cluster import EngineSpec
from harness.engine.simresult import SimResult
from harness.engine.simulate import simulate
from harness.loadgen.sessions import SessionOptions
from harness.routers.base import RouteCall, Router
from harness.workload.trace import Trace


class _LoadRead(Exception):
    """The router read an engine's load: its choices depend on the run."""


class _Blind:
    """An engine view that refuses every read but its index."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    def __getattr__(self, name: str) -> Any:
        raise _LoadRead(name)


def split_plan(
    trace: Trace,
    engines: Sequence[EngineSpec],
    router: Router | None,
    options: SessionOptions | None,
) -> np.ndarray | None:
    """Engine index of every trace row when the cluster decomposes (module docstring)."""
    if not is_plain(engines, trace, options):
        return None
    df = trace.df
    n = len(df)
    if len(engines) == 1:
        return np.zeros(n, dtype=np.int64)
    if router is None or type(router).on_finish is not Router.on_finish:
        return None
    probe = copy.deepcopy(router)
    views = [_Blind(i) for i in range(len(engines))]
    rids = df["request_id"].astype(str).tolist()
    plen = df["prompt_len"].to_numpy(np.int64).tolist()
    olen = df["output_len"].to_numpy(np.int64).tolist()
    tiers = df["tier"].astype(str).tolist()
    arr = df["arrival_s"].to_numpy(float).tolist()
    order = np.argsort(np.asarray(arr), kind="stable")  # routing happens in release order
    out = np.empty(n, dtype=np.int64)
    k = len(engines)
    try:
        for j in order.tolist():
            c = RouteCall(rids[j], plen[j], olen[j], tiers[j], rids[j])
            e = probe.route(c, views, arr[j])
            if not 0 <= e < k:
                return None
            out[j] = e
    except _LoadRead:
        return None
    return out


def simulate_split(
    trace: Trace,
    engines: Sequence[EngineSpec],
    plan: np.ndarray,
    *,
    stop_at_s: float | None = None,
    chunk_sink: Callable[[np.ndarray, np.ndarray], None] | None = None,
) -> tuple[SimResult, list[SimResult]]:
    """Each engine alone on its rows; the merged result (trace rows) and the engines' own."""
    wall0 = time.perf_counter()
    n = len(trace)
    first = np.full(n, np.nan)
    last = np.full(n, np.nan)
    out_tokens = np.zeros(n, dtype=np.int64)
    status = np.zeros(n, dtype=np.int8)
    preempts = np.zeros(n, dtype=np.int64)
    errors: dict[int, str] = {}
    parts: list[SimResult] = []
    req_parts: list[np.ndarray] = []
    t_parts: list[np.ndarray] = []
    end = 0.0
    for i, spec in enumerate(engines):
        rows = np.flatnonzero(plan == i)
        if len(rows) == 0:
            parts.append(_empty(spec))
            continue
        sub = Trace(trace.df.iloc[rows].reset_index(drop=True), trace.tiers, dict(trace.meta))

        def sink(req: np.ndarray, t: np.ndarray, rows: np.ndarray = rows) -> None:
            g = rows[req]
            if chunk_sink is not None:
                chunk_sink(g, t)
            else:
                req_parts.append(g)
                t_parts.append(t)

        res = simulate(
            sub, spec.policy, spec.cost_model, spec.config, stop_at_s=stop_at_s, chunk_sink=sink
        )
        first[rows] = res.first_s
        last[rows] = res.last_s
        out_tokens[rows] = res.out_tokens
        status[rows] = res.status
        preempts[rows] = res.preemptions
        for j, msg in res.errors.items():
            errors[int(rows[j])] = f"{spec.name}: {msg}"
        end = max(end, res.end_s)
        parts.append(res)
    # token times: handed to the sink (None here), else kept (empty arrays when none)
    chunk_req = chunk_t = None
    if chunk_sink is None:
        chunk_req = np.concatenate(req_parts) if req_parts else np.empty(0, np.int64)
        chunk_t = np.concatenate(t_parts) if t_parts else np.empty(0)
    merged = merged_result(
        parts, first, last, out_tokens, status, errors, preempts, chunk_req, chunk_t, end, wall0
    )
    return merged, parts


def is_plain(engines: Sequence[EngineSpec], trace: Trace, options: SessionOptions | None) -> bool:
    """A plain trace on a cluster: no agents, no session columns, default session options, so
    every release is a known arrival without prompt identity (the split kernel and the array
    engines both need this)."""
    if any(s.agent is not None for s in engines):
        return False
    if "session_id" in trace.df.columns or "agent" in trace.df.columns:
        return False
    return options is None or options == SessionOptions()


def merged_result(
    parts: list[SimResult],
    first: np.ndarray,
    last: np.ndarray,
    out_tokens: np.ndarray,
    status: np.ndarray,
    errors: dict[int, str],
    preempts: np.ndarray,
    chunk_req: np.ndarray | None,
    chunk_t: np.ndarray | None,
    end: float,
    wall0: float,
    **counters: int,
) -> SimResult:
    """The cluster's result over trace rows from its engines' own results (``parts``); the
    split kernel and the array-engine loop both report this way."""
    return SimResult(
        policy="+".join(sorted({p.policy for p in parts})),
        first_s=first,
        last_s=last,
        out_tokens=out_tokens,
        status=status,
        errors=errors,
        preemptions=preempts,
        samples={},
        chunk_req=chunk_req,
        chunk_t=chunk_t,
        end_s=end,
        num_steps=sum(p.num_steps for p in parts),
        num_calls=sum(p.num_calls for p in parts),
        wall_s=time.perf_counter() - wall0,
        counters={
            "num_finished": int((status == 1).sum()),
            "num_rejected": int((status == 2).sum()),
            "preemptions_total": int(sum(p.counters.get("preemptions_total", 0) for p in parts)),
            **counters,
        },
    )


def _empty(spec: EngineSpec) -> SimResult:
    from harness.engine.simresult import new_samples

    z = np.zeros(0)
    return SimResult(
        policy=getattr(spec.policy, "name", "?"),
        first_s=z,
        last_s=z,
        out_tokens=np.zeros(0, np.int64),
        status=np.zeros(0, np.int8),
        errors={},
        preemptions=np.zeros(0, np.int64),
        samples=new_samples(),
        chunk_req=None,
        chunk_t=None,
        end_s=0.0,
        num_steps=0,
        num_calls=0,
        wall_s=0.0,
    )


__all__ = ["simulate_split", "split_plan"]
