"""Routers over 4 replicas on a multi-turn conversation trace (issue 16, "Routers" must-show):
round-robin vs session-affinity vs prefix-aware, in simulation and live, TTFT p50/p99 and the
prefix-cache hit rate per router, the gain over round-robin stated.

Why routing matters here: turn k+1 of a conversation repeats turn k's whole prompt (history
grows every turn), and each replica's prefix cache (vLLM v1 semantics, harness.engine
.prefix_cache) holds only what that replica computed. Round-robin scatters a session's turns
over the replicas, so most turns re-prefill their history; session affinity keeps a session
where its history is cached; prefix-aware routing (llm-d's scorer) finds the replica holding
the longest prefix and trades it against load. Less prefill means shorter queues: TTFT falls
at the median and more in the tail.

One trace (``synthetic-conv`` sessions, frozen to ``trace.parquet``) runs

- simulated: ``harness simulate --replicas 4 --router R`` (the cluster kernel,
  :mod:`harness.engine.cluster`, sessions in virtual time);
- live: ``harness replay`` against ``harness serve --replicas 4 --router R`` (the built-in
  server in a child process, the same engine core in wall-clock time).

Each router's run directory lands under ``simulated/<router>`` and ``live/<router>``; the
table is ``comparison.md`` / ``comparison.json``. The live hit rate is read from the server's
``/harness/stats`` (per-replica ``prefix_cache_hits`` / ``prefix_cache_queries``).
"""

from __future__ import annotations

import asyncio
import json
import math
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from harness.experiments.common import ExperimentResult, pct_change
from harness.workload.trace import Trace

ROUTERS = ("round-robin", "session-affinity", "prefix-aware")
REPLICAS = 4
MODES = ("simulated", "live")


@dataclass(frozen=True)
class Setup:
    """The workload and engines of one comparison (every replica the same)."""

    sessions: int = 80
    session_rate: float = 2.5  # sessions/s: ~290 calls, about a minute live per router
    turns: float = 5.0  # mean turns per conversation (geometric)
    max_turns: int = 10
    prompt_len: int = 150  # median new text per turn, tokens
    output_len: int = 80  # median reply, tokens
    system_len: int = 0
    think: str = "exp:1"
    cost_model: str = "a100-llama2-7b"
    kv_tokens: int = 32768  # per replica
    policy: str = "vllm"
    replicas: int = REPLICAS


SMALL = Setup()
FULL = Setup(sessions=192, session_rate=6.0)  # ~820 calls, 2.4x the load


def build_trace(setup: Setup, seed: int, path: Path) -> Trace:
    """The session trace both modes replay (same calls, same arrivals), frozen to ``path``
    so a reader can replay it again."""
    from harness.workload.session_build import build_session_trace
    from harness.workload.session_freeze import save_session_trace

    trace = build_session_trace(
        "synthetic-conv",
        num_sessions=setup.sessions,
        session_rate=setup.session_rate,
        seed=seed,
        think_time=setup.think,
        quiet=True,
        turns=setup.turns,
        max_turns=setup.max_turns,
        prompt_len=setup.prompt_len,
        output_len=setup.output_len,
        system_len=setup.system_len,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    save_session_trace(trace, path)
    return trace


def ttft_figures(run_dir: Path) -> dict[str, Any]:
    """TTFT p50/p99 (ms) over the calls that got a first token, and the call counts."""
    from harness.results.rundir import read_run

    req = read_run(run_dir).requests
    ttft = (req["first_chunk_s"] - req["arrival_s"]).to_numpy(float)
    ttft = ttft[np.isfinite(ttft)] * 1e3
    ok = req["success"].to_numpy(bool)
    return {
        "calls": int(len(req)),
        "ok": int(ok.sum()),
        "ttft_p50_ms": float(np.percentile(ttft, 50)) if len(ttft) else math.nan,
        "ttft_p99_ms": float(np.percentile(ttft, 99)) if len(ttft) else math.nan,
    }


# -- live ------------------------------------------------------------------------------------
async def _live(trace: Trace, router: str, setup: Setup, run_dir: Path) -> dict[str, Any]:
    import httpx

    from harness.loadgen.replay import ReplayConfig, run_replay_async
    from harness.server import embedded

    server = embedded(
        policy=setup.policy,
        cost_model=setup.cost_model,
        kv_tokens=setup.kv_tokens,
        replicas=setup.replicas,
        router=router,
        process=True,
    )
    async with server as url:
        cfg = ReplayConfig(
            trace="routers-experiment",
            target=url,
            engine="builtin",
            arrival="trace",
            out=run_dir,
            progress=False,
            workers=1,
            ready_timeout_s=60.0,  # a loaded machine may start the child engine slowly
        )
        await run_replay_async(cfg, trace=trace)
        async with httpx.AsyncClient(timeout=10) as c:
            stats = (await c.get(url + "/harness/stats")).json()
    engines = stats.get("engines", [])
    queries = sum(e["prefix_cache_queries"] for e in engines)
    hits = sum(e["prefix_cache_hits"] for e in engines)
    late = stats.get("step_lateness", {})
    return {
        "hit_rate": hits / queries if queries else math.nan,
        "routed": [e["routed"] for e in engines],
        # the wall-clock host's own fidelity: how late engine steps ended vs their model time
        "step_late_p99_ms": late.get("p99_ms", math.nan),
    }


def live_one(trace: Trace, router: str, setup: Setup, run_dir: Path) -> dict[str, Any]:
    """Replay ``trace`` against ``harness serve --replicas N --router router``."""
    if run_dir.exists():
        shutil.rmtree(run_dir)
    extra = asyncio.run(_live(trace, router, setup, run_dir))
    return {**ttft_figures(run_dir), **extra}


# -- simulated -------------------------------------------------------------------------------
def simulate_one(trace: Trace, router: str, setup: Setup, run_dir: Path) -> dict[str, Any]:
    """The cluster kernel on ``trace``: ``setup.replicas`` engines exactly as the live
    server builds them (same policy, cost model and KV), the router by name."""
    from harness.engine.cluster import EngineSpec
    from harness.engine.cluster_run import write_cluster_run
    from harness.engine.config import EngineConfig
    from harness.engine.costmodel import get_cost_model
    from harness.policies.registry import make_policy
    from harness.routers.registry import make_router
    from harness.server.config import ServerConfig, engine_kwargs

    if run_dir.exists():
        shutil.rmtree(run_dir)
    server = ServerConfig(
        policy=setup.policy, cost_model=setup.cost_model, kv_tokens=setup.kv_tokens
    )
    engines = [
        EngineSpec(
            name=f"replica-{i}",
            policy=make_policy(setup.policy),
            cost_model=get_cost_model(setup.cost_model),
            config=EngineConfig(**engine_kwargs(server)),
        )
        for i in range(setup.replicas)
    ]
    _, res = write_cluster_run(run_dir, trace, engines, make_router(router), {"label": router})
    queries = res.counters.get("prefix_cache_queries", 0)
    hits = res.counters.get("prefix_cache_hits", 0)
    return {
        **ttft_figures(run_dir),
        "hit_rate": hits / queries if queries else math.nan,
        "routed": [int(p["num_finished"] + p["num_rejected"]) for p in res.per_engine],
    }


# -- the comparison ----------------------------------------------------------------------------
def gains(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per mode, each router's TTFT p50/p99 change vs round-robin (negative = faster)."""
    out = []
    for mode in MODES:
        base = next((r for r in rows if r["mode"] == mode and r["router"] == "round-robin"), None)
        if base is None:
            continue
        for r in rows:
            if r["mode"] != mode or r["router"] == "round-robin":
                continue
            p50 = pct_change(r["ttft_p50_ms"], base["ttft_p50_ms"])
            p99 = pct_change(r["ttft_p99_ms"], base["ttft_p99_ms"])
            beats = p50 < 0 and p99 < 0
            out.append(
                {
                    "claim": f"{r['router']} beats round-robin on TTFT p50 and p99 ({mode})",
                    "paper": "issue 16 must-show",
                    "measured": (
                        f"p50 {base['ttft_p50_ms']:.0f} -> {r['ttft_p50_ms']:.0f} ms "
                        f"({p50:+.0f}%), p99 {base['ttft_p99_ms']:.0f} -> "
                        f"{r['ttft_p99_ms']:.0f} ms ({p99:+.0f}%); hit rate "
                        f"{base['hit_rate']:.0%} -> {r['hit_rate']:.0%}"
                    ),
                    "verdict": "yes" if beats else "no",
                    "p50_change_pct": p50,
                    "p99_change_pct": p99,
                }
            )
    return out


def run(
    out_dir: Path,
    *,
    full: bool = False,
    seed: int = 0,
    setup: Setup | None = None,
    modes: tuple[str, ...] = MODES,
    routers: tuple[str, ...] = ROUTERS,
) -> ExperimentResult:
    """Build the trace, run every (mode, router), and compare against round-robin."""
    setup = setup or (FULL if full else SMALL)
    out_dir = Path(out_dir)
    trace = build_trace(setup, seed, out_dir / "trace.parquet")
    rows: list[dict[str, Any]] = []
    for mode in modes:
        one = simulate_one if mode == "simulated" else live_one
        for router in routers:
            m = one(trace, router, setup, out_dir / mode / router)
            rows.append({"mode": mode, "router": router, **m})
    notes = [
        f"trace: synthetic-conv, {setup.sessions} sessions at {setup.session_rate:g}/s, mean "
        f"{setup.turns:g} turns (max {setup.max_turns}), new text ~{setup.prompt_len} tokens, "
        f"replies ~{setup.output_len}, think {setup.think}, seed {seed}",
        f"engines: {setup.replicas} replicas of {setup.policy} on {setup.cost_model}, "
        f"{setup.kv_tokens} KV tokens each, prefix caching on",
        "hit rate: prompt tokens found in the chosen replica's prefix cache / prompt tokens "
        "looked up (vLLM's prefix_cache_hits / prefix_cache_queries)",
        "history is the trace's replies (--history trace) while the engine generates its own "
        "tokens, so a turn hits its predecessor's prompt, never its reply, in both modes",
        "live: built-in server in a child process, replay in this one, on a shared machine: "
        "step_late_p99_ms is how late the server's engine steps ended vs their model time",
    ]
    (out_dir / "setup.json").write_text(json.dumps(asdict(setup), indent=2))
    return ExperimentResult(
        name="routers",
        title=f"Routers over {setup.replicas} replicas on multi-turn sessions (issue 16)",
        rows=rows,
        claims=gains(rows),
        notes=notes,
        out_dir=out_dir,
        full=full,
    )
