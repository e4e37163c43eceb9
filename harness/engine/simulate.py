"""Discrete-event simulation in virtual time: a Trace through the engine core and a policy.

Event order is total and explicit: events are keyed ``(time, priority, seq)`` with
``ARRIVAL (0) < STEP_START (1)`` and ``seq`` = the trace row (style-examples take-away 5). So an
arrival at exactly the end of a step is visible to the step that starts then, and simultaneous
arrivals join ``waiting`` in trace order. With one engine there is at most one pending step, so
the loop keeps the next arrival and the next step start instead of a heap; the order is the
same.

Speed: a ``steady`` plan lets the core fast-forward a run of identical decode steps in closed
form up to the next arrival/finish/KV boundary (base.py Plan.steady); per-token times are
written in bulk (numpy) and one telemetry row covers a whole fast-forwarded run.

Output: one run directory per policy in exactly the replay format (harness.results.schema):
request rows with ``send_s`` = arrival, chunk rows with one token each at its step end, and
engine telemetry per step into samples (``source="engine"``; ``t_s`` = the step's end, state
after it; a fast-forwarded run is one row with ``num_steps`` > 1 and its total duration).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from operator import attrgetter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from harness.engine.config import EngineConfig
from harness.engine.core import EngineCore
from harness.engine.costmodel import (
    DEFAULT_COST_MODEL,
    HARDWARE,
    CostModel,
    JitteredCostModel,
    get_cost_model,
)
from harness.engine.fastsim import fast_budget, fast_planner, fast_simulate, row_meta
from harness.engine.reference_core import ReferenceCore
from harness.engine.simresult import (
    SAMPLE_COLS,
    ChunkLog,
    LivelockWatch,
    SimResult,
    SimulationStalled,
    new_samples,
    no_cyclic_gc,
)
from harness.policies.base import Policy
from harness.policies.registry import make_policy, policy_class
from harness.results import schema
from harness.workload.trace import Trace

ARRIVAL = 0
STEP_START = 1
_row_of = attrgetter("index")  # a request's trace row, in C (it runs per token)
UNBOUNDED_KV_TOKENS = 1 << 26  # "memory-free" model (seed-stability.md §7 REC 11)


def simulate(
    trace: Trace,
    policy: Policy,
    cost_model: CostModel,
    config: EngineConfig,
    *,
    stop_at_s: float | None = None,
    chunk_sink: Callable[[np.ndarray, np.ndarray], None] | None = None,
    chunk_flush_rows: int = 2_000_000,
    fast_forward: bool = True,
    max_stall_calls: int = 1000,
    kernel: str = "auto",
    on_interrupt: str = "raise",
) -> SimResult:
    """Run ``trace`` through one engine core in virtual time and return the raw results.

    ``stop_at_s``: stop at this virtual time (requests still in flight become cancelled); the
    default runs until every request finished or was rejected. ``chunk_sink(req, t)`` receives
    token-time arrays in time order as they are produced (else they are kept in memory).
    ``on_interrupt="return"``: Ctrl-C ends the run early and returns what was simulated
    (``counters["interrupted"]``), and so does a stall or livelock (``counters["stalled"]``,
    its message; else :class:`SimulationStalled` is raised), so :func:`write_run` can write a
    partial run directory.
    ``kernel``: ``auto`` uses the vectorised kernel (fastsim.py) for policies that declare the
    FCFS token-budget rule (base.BudgetRule) or plan from columns (policies.columns
    ``ColumnPolicy``) (a trace of lengths has no prefix identities; README "Simulator speed"
    lists which policies), and the engine core otherwise; ``core`` always uses the engine
    core (the host the server and the adapters share); ``reference`` always uses the reference
    step (:mod:`harness.engine.reference_core`), the yardstick of the identity tests.
    """
    if kernel not in ("auto", "core", "reference"):
        raise ValueError(f"kernel must be 'auto', 'core' or 'reference', not {kernel!r}")
    with no_cyclic_gc():
        return _simulate(
            trace,
            policy,
            cost_model,
            config,
            stop_at_s=stop_at_s,
            chunk_sink=chunk_sink,
            chunk_flush_rows=chunk_flush_rows,
            fast_forward=fast_forward,
            max_stall_calls=max_stall_calls,
            kernel=kernel,
            on_interrupt=on_interrupt,
        )


def _simulate(
    trace: Trace,
    policy: Policy,
    cost_model: CostModel,
    config: EngineConfig,
    *,
    stop_at_s: float | None,
    chunk_sink: Callable[[np.ndarray, np.ndarray], None] | None,
    chunk_flush_rows: int,
    fast_forward: bool,
    max_stall_calls: int,
    kernel: str,
    on_interrupt: str,
) -> SimResult:
    if kernel == "auto" and (
        fast_budget(policy, config) is not None or fast_planner(policy, config) is not None
    ):
        return fast_simulate(
            trace,
            policy,
            cost_model,
            config,
            stop_at_s=stop_at_s,
            chunk_sink=chunk_sink,
            chunk_flush_rows=chunk_flush_rows,
            fast_forward=fast_forward,
            max_stall_calls=max_stall_calls,
            on_interrupt=on_interrupt,
        )
    wall0 = time.perf_counter()
    df = trace.df
    n = len(df)
    arr = df["arrival_s"].to_numpy(dtype=float)
    plen = df["prompt_len"].to_numpy(dtype=np.int64).tolist()
    olen = df["output_len"].to_numpy(dtype=np.int64).tolist()
    arr_l = arr.tolist()
    meta = row_meta(trace, arr_l, olen, config)  # ids, tiers and their priorities and SLOs
    rids = meta.ids

    core = (ReferenceCore if kernel == "reference" else EngineCore)(policy, cost_model, config)
    first_s = np.full(n, np.nan)
    last_s = np.full(n, np.nan)
    out_tokens = np.zeros(n, dtype=np.int64)
    status = np.zeros(n, dtype=np.int8)
    preempts = np.zeros(n, dtype=np.int64)
    errors: dict[int, str] = {}
    chunks = ChunkLog(chunk_sink, chunk_flush_rows)
    samples = new_samples()
    s_t = samples["t_s"]
    s_k = samples["num_steps"]
    s_d = samples["step_duration_s"]
    s_p = samples["prefill_tokens"]
    s_dec = samples["decode_tokens"]
    s_kv = samples["kv_used_tokens"]
    s_use = samples["kv_usage"]
    s_w = samples["num_waiting"]
    s_r = samples["num_running"]
    s_pre = samples["preemptions_total"]
    bs = config.block_size
    total_blocks = core.total_blocks

    stop = math.inf if stop_at_s is None else float(stop_at_s)
    i = 0
    t = 0.0
    calls = 0
    stall = 0
    watch = LivelockWatch(chunks)
    interrupted = False
    stalled = ""
    try:
        while True:
            # (time, ARRIVAL, seq) events at or before the next step start go first.
            while i < n and arr_l[i] <= t:
                ok = core.add_request(
                    rids[i],
                    plen[i],
                    olen[i],
                    arrival_s=arr_l[i],
                    tier=meta.tier[i],
                    priority=meta.priority[i],
                    ttft_slo_s=meta.ttft[i],
                    tbt_slo_s=meta.tbt[i],
                    index=i,
                )
                if not ok:
                    status[i] = 2
                    errors[i] = core.rejections.pop(rids[i])
                i += 1
            if not core.has_work():
                if i >= n:
                    break
                t = arr_l[i]
                if t >= stop:
                    break
                continue
            if t >= stop:
                break
            nxt = arr_l[i] if i < n else math.inf
            out = core.step(
                t,
                fast_forward_until=min(nxt, stop) if fast_forward else None,
                hold_until=stop if fast_forward else None,
            )
            calls += 1
            if core.preemptions_total >= watch.next_at:
                watch.check(
                    core.preemptions_total,
                    i < n,
                    f"policy {getattr(policy, 'name', policy)!r} with {core.num_waiting} waiting "
                    f"and {core.num_running} running requests",
                )
            if out.idle:
                stall += 1
                if out.preempted and stall < max_stall_calls:
                    continue  # the preemption changed the state: plan again at the same time
                if i < n:
                    t = max(t, nxt)
                    continue
                raise SimulationStalled(
                    f"policy {getattr(policy, 'name', policy)!r} scheduled nothing with "
                    f"{core.num_waiting} waiting and {core.num_running} running requests and no "
                    "arrival left"
                )
            stall = 0
            end = out.end_s
            rows = list(map(_row_of, out.sampled))
            if out.num_steps == 1:
                chunks.add_step(end, rows)
            else:
                chunks.add_run(out.step_ends, rows)
            for r in out.finished:
                j = r.index
                first_s[j] = r.first_token_s
                last_s[j] = r.last_token_s
                out_tokens[j] = r.num_output_tokens
                status[j] = 1
                preempts[j] = r.num_preemptions
            rep = out.report
            s_t.append(end)
            s_k.append(out.num_steps)
            s_d.append(out.duration_s)
            s_p.append(rep.prefill_tokens)
            s_dec.append(rep.decode_tokens)
            used = core.used_blocks
            s_kv.append(used * bs)
            s_use.append(used / total_blocks)
            s_w.append(core.num_waiting)
            s_r.append(len(core._running))
            s_pre.append(core.preemptions_total)
            t = end
    except KeyboardInterrupt:
        if on_interrupt == "raise":
            raise
        interrupted = True  # keep what was simulated; the caller writes it
    except SimulationStalled as e:
        if on_interrupt == "raise":
            raise
        stalled = str(e)  # the same: the caller writes the run, then reports the stall

    # Requests still in flight (stop_at_s): keep what they produced, mark them cancelled.
    for r in list(core._running) + core.waiting:
        j = r.index
        first_s[j] = np.nan if r.first_token_s is None else r.first_token_s
        last_s[j] = np.nan if r.last_token_s is None else r.last_token_s
        out_tokens[j] = r.num_output_tokens
        preempts[j] = r.num_preemptions
    chunk_req, chunk_t = (None, None) if chunk_sink is not None else chunks.arrays()
    if chunk_sink is not None:
        chunks.flush()
    return SimResult(
        policy=getattr(policy, "name", type(policy).__name__),
        first_s=first_s,
        last_s=last_s,
        out_tokens=out_tokens,
        status=status,
        errors=errors,
        preemptions=preempts,
        samples=samples,
        chunk_req=chunk_req,
        chunk_t=chunk_t,
        end_s=t,
        num_steps=core.num_steps_total,
        num_calls=calls,
        wall_s=time.perf_counter() - wall0,
        counters={
            "preemptions_total": core.preemptions_total,
            "num_rejected": core.num_rejected,
            "num_finished": core.num_finished,
            "unfinished": int(n - core.num_finished - core.num_rejected),
            "interrupted": interrupted,
            "stalled": stalled,
            "kernel": kernel if kernel == "reference" else "core",
        },
    )


def requests_table(trace: Trace, res: SimResult) -> pa.Table:
    """REQUESTS rows of a simulated run (send = arrival; no HTTP, so no http_status)."""
    df = trace.df
    n = len(df)
    arr = df["arrival_s"].to_numpy(dtype=float)
    success = res.status == 1
    kind = np.full(n, None, dtype=object)
    msg = np.full(n, None, dtype=object)
    kind[res.status == 2] = schema.ERROR_REJECTED
    kind[res.status == 0] = schema.ERROR_CANCELLED
    pending = res.status == 0
    msg[pending] = "still in flight when the simulation stopped"
    msg[pending & (arr > res.end_s)] = "not yet arrived when the simulation stopped"
    for j, m in res.errors.items():
        msg[j] = m
    return pa.table(
        {
            "req": np.arange(n, dtype=np.int64),
            "request_id": df["request_id"].astype(str).to_numpy(),
            "tier": df["tier"].astype(str).to_numpy(),
            "prompt_len": df["prompt_len"].to_numpy(np.int64),
            "output_len": df["output_len"].to_numpy(np.int64),
            "prompt_tokens": df["prompt_len"].to_numpy(np.int64),
            "output_tokens": res.out_tokens,
            "target_s": arr,
            "arrival_s": arr,
            "send_s": arr,
            "first_chunk_s": res.first_s,
            "last_chunk_s": res.last_s,
            "num_chunks": res.out_tokens,
            "success": success,
            "error_kind": pa.array(kind, type=pa.string()),
            "error": pa.array(msg, type=pa.string()),
            "http_status": pa.nulls(n, type=pa.int64()),
        },
        schema=schema.REQUESTS,
    )


def samples_table(res: SimResult) -> pa.Table:
    s = res.samples
    m = len(s["t_s"])
    cols: dict[str, Any] = {k: np.asarray(v) for k, v in s.items()}
    cols["source"] = pa.array(["engine"] * m, type=pa.string())
    for f in schema.SAMPLES:
        if f.name not in cols:
            cols[f.name] = pa.nulls(m, type=f.type)
    return pa.table({f.name: cols[f.name] for f in schema.SAMPLES}, schema=schema.SAMPLES)


def chunks_table(req: np.ndarray, t: np.ndarray) -> pa.Table:
    return pa.table(
        {
            "req": pa.array(req, type=pa.int64()),
            "t_s": pa.array(t, type=pa.float64()),
            "tokens": pa.array(np.ones(len(req), dtype=np.int32), type=pa.int32()),
        },
        schema=schema.CHUNKS,
    )


# ------------------------------------------------------------------------------------------
class SimulateConfig(BaseModel):
    """Everything ``harness simulate`` needs; validated before anything runs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    trace: str = Field(description="trace source name (lmsys, sharegpt, ...) or file path")
    rate: float | None = Field(None, description="arrival rate, req/s (None: trace timestamps)")
    arrival: str = Field("poisson", description="arrival process")
    burstiness: float = Field(1.0, gt=0, description="gamma shape (1 = Poisson)")
    num_requests: int | None = Field(None, ge=1, description="requests to draw")
    arrival_window_s: float | None = Field(None, gt=0, description="keep arrivals in (0, d]")
    tiers: str | None = Field(None, description="tier spec (default: SLAI paper's)")
    seed: int = Field(0, description="seed of every random stream")
    policies: list[str] = Field(["vllm"], min_length=1, description="policy names")
    policy_params: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="per-policy constructor keywords"
    )
    cost_model: str = Field(DEFAULT_COST_MODEL, description="preset, preset:k=v,.. or file")
    block_size: int = Field(16, ge=1, description="KV block size, tokens")
    kv_tokens: int | None = Field(None, ge=1, description="KV capacity, tokens")
    num_blocks: int | None = Field(None, ge=1, description="KV capacity, blocks")
    gpu_mem_gib: float | None = Field(None, gt=0, description="GPU memory, GiB")
    kv_bytes_per_token: int | None = Field(None, ge=1, description="model KV bytes per token")
    model_weights_gib: float | None = Field(None, ge=0, description="model weights, GiB")
    token_budget: int = Field(2048, ge=1, description="max tokens per step")
    max_num_seqs: int = Field(256, ge=1, description="max requests holding KV")
    known_output_lengths: bool = Field(False, description="policies see max_tokens as oracle")
    stop_at_s: float | None = Field(None, gt=0, description="stop the clock here (virtual s)")
    out_dir: Path = Field(Path("reports"), description="parent folder of the run dirs")
    label: str | None = Field(None, description="run name prefix")

    @field_validator("rate")
    @classmethod
    def _rate(cls, v: float | None) -> float | None:
        if v is not None and not v > 0:
            raise ValueError(f"rate must be > 0 req/s, got {v}")
        return v

    @field_validator("policies")
    @classmethod
    def _policies(cls, v: list[str]) -> list[str]:
        for name in v:
            policy_class(name)  # raises UnknownPolicyError (a ValueError) with the list
        if len(set(v)) != len(v):
            raise ValueError("a policy is listed twice")
        return v

    @field_validator("cost_model")
    @classmethod
    def _cost(cls, v: str) -> str:
        get_cost_model(v)
        return v

    @model_validator(mode="after")
    def _engine(self) -> SimulateConfig:
        self.engine_config()
        return self

    def engine_config(self) -> EngineConfig:
        """KV from the flags, else from the preset's hardware, else unbounded (memory-free)."""
        kw: dict[str, Any] = {
            "block_size": self.block_size,
            "token_budget": self.token_budget,
            "max_num_seqs": self.max_num_seqs,
            "known_output_lengths": self.known_output_lengths,
        }
        if self.num_blocks is not None:
            kw["num_blocks"] = self.num_blocks
        elif self.kv_tokens is not None:
            kw["kv_tokens"] = self.kv_tokens
        else:
            hw = dict(HARDWARE.get(self.cost_model.partition(":")[0], {}))
            for k in ("gpu_mem_gib", "kv_bytes_per_token", "model_weights_gib"):
                if getattr(self, k) is not None:
                    hw[k] = getattr(self, k)
            if hw.get("gpu_mem_gib") and hw.get("kv_bytes_per_token"):
                kw.update(hw)
            elif self.gpu_mem_gib is not None or self.kv_bytes_per_token is not None:
                raise ValueError(
                    "sizing KV from GPU memory needs both gpu_mem_gib and kv_bytes_per_token "
                    f"(the cost model {self.cost_model!r} has no hardware defaults)"
                )
            else:
                kw["kv_tokens"] = UNBOUNDED_KV_TOKENS
        return EngineConfig(**kw)


def load_trace(cfg: SimulateConfig) -> Trace:
    from harness.workload import build_trace

    return build_trace(
        cfg.trace,
        num_requests=cfg.num_requests,
        rate=cfg.rate,
        arrival=cfg.arrival,
        burstiness=cfg.burstiness,
        duration_s=cfg.arrival_window_s,
        tiers=cfg.tiers,
        seed=cfg.seed,
    )


def _run_dir(cfg: SimulateConfig, policy: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    base = f"{cfg.label or 'sim'}-{stamp}-{policy}"
    d = cfg.out_dir / base
    k = 1
    while d.exists():
        d = cfg.out_dir / f"{base}-{k}"
        k += 1
    return d


def _json_safe(d: dict[str, Any]) -> dict[str, Any]:
    """Policy parameters for run.json; anything that is not plain JSON is recorded as repr."""
    import json

    out: dict[str, Any] = {}
    for k, v in d.items():
        try:
            json.dumps(v)
            out[k] = v
        except (TypeError, ValueError):
            out[k] = repr(v)
    return out


def write_run(
    run_dir: Path,
    trace: Trace,
    policy: Policy,
    cost_model: CostModel,
    config: EngineConfig,
    meta: dict[str, Any],
    *,
    stop_at_s: float | None = None,
) -> tuple[Path, SimResult]:
    """Simulate one policy and write its run directory (requests, chunks, samples, run.json)."""
    from harness.results.rundir import RunWriter

    params = _json_safe(policy.params() if hasattr(policy, "params") else {})
    full = {
        "kind": "simulate",
        "backend": "simulator",
        "policy": getattr(policy, "name", type(policy).__name__),
        "policy_params": params,
        "cost_model": cost_model.to_dict(),
        "engine": config.describe(),
        "tiers": [t.to_dict() for t in trace.tiers],
        "trace_meta": dict(trace.meta),
        # build_trace stores the hash it computed (0.5 s at 100k rows); else compute it
        "trace_hash": trace.meta.get("content_hash") or trace.content_hash(),
        "num_requests": len(trace),
        "t0_unix": time.time(),
        **meta,
    }
    with RunWriter(run_dir, full, stream_chunks=True) as w:
        res = simulate(
            trace,
            policy,
            cost_model,
            config,
            stop_at_s=stop_at_s,
            chunk_sink=lambda req, t: w.add_chunks_table(chunks_table(req, t)),
            on_interrupt="return",
        )
        w.add_requests_table(requests_table(trace, res))
        w.add_samples_table(samples_table(res))
        w.update_meta(
            duration_s=res.end_s,
            sim={
                "wall_s": res.wall_s,
                "num_steps": res.num_steps,
                "policy_calls": res.num_calls,
                "end_s": res.end_s,
                **res.counters,
            },
        )
        if res.counters.get("interrupted"):
            raise KeyboardInterrupt  # RunWriter marks the run partial, everything written
        if res.counters.get("stalled"):
            raise SimulationStalled(res.counters["stalled"])  # the same, then the CLI's error
    return run_dir, res


def run_simulation(cfg: SimulateConfig, trace: Trace | None = None) -> list[Path]:
    """Simulate every policy of ``cfg`` on one trace; one run dir each, with summary.json."""
    from harness.results.summary import write_summary

    trace = trace if trace is not None else load_trace(cfg)
    cost = get_cost_model(cfg.cost_model)
    econf = cfg.engine_config()
    out: list[Path] = []
    for name in cfg.policies:
        policy = make_policy(name, **cfg.policy_params.get(name, {}))
        # a cost model with a step-time spread starts its stream afresh for every policy: the
        # policies of one run see the same draws, and each run as it would alone
        model = cost.reseeded(cost.seed) if isinstance(cost, JitteredCostModel) else cost
        meta = {
            "seed": cfg.seed,
            "rate": cfg.rate,
            "burstiness": cfg.burstiness,
            "trace_source": cfg.trace,
            "config": cfg.model_dump(mode="json", exclude={"arrival_window_s"}),
            "arrival_window_s": cfg.arrival_window_s,
            "label": f"{cfg.label or 'sim'}-{name}",
        }
        run_dir, _ = write_run(
            _run_dir(cfg, name), trace, policy, model, econf, meta, stop_at_s=cfg.stop_at_s
        )
        write_summary(run_dir)
        out.append(run_dir)
    return out


__all__ = [
    "SAMPLE_COLS",
    "SimResult",
    "SimulateConfig",
    "SimulationStalled",
    "UNBOUNDED_KV_TOKENS",
    "run_simulation",
    "simulate",
    "write_run",
]
