"""What ``harness simulate --replicas N --router X`` builds: engines, router, trace (issue 16).

Engines come from the flags (``--replicas`` identical replicas: the run's policy, cost model
and KV) and, for an agent graph, from the graph file itself: each entry of its ``agents``
mapping may carry an ``engine`` mapping that overrides the flags for that agent's engine(s)::

    agents:
      agent1:
        target: "http://127.0.0.1:8001"       # replay's (unused by the simulator)
        prompt_len: "exp:128"
        engine: {policy: class-priority, params: {order: [B, A]}, cost_model: a100-llama2-7b,
                 kv_tokens: 12288, token_budget: 768, max_num_seqs: 64, replicas: 1}

Keys: ``policy``, ``params``, ``cost_model``, ``kv_tokens``/``num_blocks``, ``block_size``,
``token_budget``, ``max_num_seqs``, ``prefix_caching``, ``replicas`` (engines of that agent,
a router picks among them). ``--agents FILE`` reads the same ``agents`` mapping from another
file (e.g. for a frozen trace of the graph). A trace whose calls name agents gets one engine
per agent (times its ``replicas``); calls naming no agent go to the ``--replicas`` engines.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from harness.engine.cluster import EngineSpec
from harness.engine.costmodel import get_cost_model
from harness.engine.simulate import SimulateConfig, _run_dir, load_trace
from harness.policies.registry import make_policy
from harness.workload.session_options import SessionOptions
from harness.workload.trace import Trace, TraceError

ENGINE_KEYS = frozenset(
    {
        "policy",
        "params",
        "cost_model",
        "kv_tokens",
        "num_blocks",
        "block_size",
        "token_budget",
        "max_num_seqs",
        "prefix_caching",
        "replicas",
    }
)


class ClusterOptions(BaseModel):
    """The cluster part of ``harness simulate`` (validated before anything runs)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    replicas: int = Field(1, ge=1, description="engines behind the router (calls with no agent)")
    router: str | None = Field(None, description="router name (harness policies lists them)")
    router_params: dict[str, Any] = Field(default_factory=dict, description="router keywords")
    agents_file: str | None = Field(None, description="file with the agents' engine specs")
    sessions: SessionOptions | None = Field(None, description="session replay options")
    prefix_caching: bool = Field(True, description="engines cache prompt prefixes (vLLM)")


def is_session_run(cfg: SimulateConfig, copts: ClusterOptions) -> bool:
    from harness.workload.sources.conversations import is_session_source

    return copts.sessions is not None or is_session_source(cfg.trace)


def needs_cluster(cfg: SimulateConfig, copts: ClusterOptions) -> bool:
    """Session traces, agent graphs and several replicas run on the cluster simulator; a plain
    trace on one engine keeps the single-engine kernel (identity tests)."""
    return copts.replicas > 1 or copts.agents_file is not None or is_session_run(cfg, copts)


def load_cluster_trace(cfg: SimulateConfig, copts: ClusterOptions) -> Trace:
    """A session trace (conversations, agent graphs, session files) or a plain one."""
    if not is_session_run(cfg, copts):
        return load_trace(cfg)
    from types import SimpleNamespace

    from harness.workload.session_options import session_trace

    # replay's own builder (same session options, arrivals and seeds as a session replay)
    spec = SimpleNamespace(
        sessions=copts.sessions,
        trace=cfg.trace,
        arrival=cfg.arrival,
        num_requests=cfg.num_requests,
        rate=cfg.rate,
        burstiness=cfg.burstiness,
        seed=cfg.seed,
        trace_options={"quiet": True},
    )
    return session_trace(spec, cfg.tiers)


def agent_engine_specs(path: str) -> dict[str, dict[str, Any]]:
    """``{agent: engine mapping}`` from an agent-graph file (``{}`` for agents without one)."""
    from harness.workload.sources.conversations import load_agent_graph

    spec = load_agent_graph(Path(path))
    agents = spec.get("agents") or {}
    if not isinstance(agents, dict):
        raise TraceError(f"{path}: 'agents' must be a mapping")
    out: dict[str, dict[str, Any]] = {}
    for name, a in agents.items():
        eng = (a or {}).get("engine") or {}
        if not isinstance(eng, dict):
            raise TraceError(f"{path}: agents.{name}.engine must be a mapping")
        bad = sorted(set(eng) - ENGINE_KEYS)
        if bad:
            raise TraceError(
                f"{path}: agents.{name}.engine: unknown key(s) {bad}; "
                f"valid: {', '.join(sorted(ENGINE_KEYS))}"
            )
        out[str(name)] = eng
    return out


def _agent_spec_file(cfg: SimulateConfig, copts: ClusterOptions) -> str | None:
    if copts.agents_file is not None:
        return copts.agents_file
    from harness.workload.sources.conversations import AGENT_SUFFIXES

    p = Path(cfg.trace)
    if p.is_file() and p.suffix.lower() in AGENT_SUFFIXES:
        try:
            agent_engine_specs(str(p))
        except TraceError:
            return None
        return str(p)
    return None


def engine_specs(
    cfg: SimulateConfig, copts: ClusterOptions, policy: str, trace: Trace
) -> list[EngineSpec]:
    """The cluster's engines: one per agent the trace names (times its ``replicas``), and
    ``--replicas`` engines for calls without an agent (module docstring)."""
    base = cfg.engine_config()
    cost = get_cost_model(cfg.cost_model)
    params = cfg.policy_params.get(policy, {})
    df = trace.df
    named = sorted({str(a) for a in df["agent"].dropna().unique()}) if "agent" in df.columns else []
    unnamed = "agent" not in df.columns or bool(df["agent"].isna().any())
    file = _agent_spec_file(cfg, copts)
    per_agent = agent_engine_specs(file) if file is not None else {}
    specs: list[EngineSpec] = []
    for agent in named:
        eng = dict(per_agent.get(agent, {}))
        n = int(eng.pop("replicas", 1))
        if n < 1:
            raise ValueError(f"agents.{agent}.engine.replicas must be >= 1")
        pol = str(eng.pop("policy", policy))
        pparams = dict(eng.pop("params", params if pol == policy else {}) or {})
        cm = get_cost_model(str(eng.pop("cost_model", cfg.cost_model)))
        kw = base.model_dump()
        if "kv_tokens" in eng or "num_blocks" in eng:
            kw.update(kv_tokens=None, num_blocks=None, gpu_mem_gib=None)
        kw.update(eng)
        kw.setdefault("prefix_caching", copts.prefix_caching)
        econf = type(base)(**kw)
        for i in range(n):
            name = agent if n == 1 else f"{agent}-{i}"
            specs.append(EngineSpec(name, make_policy(pol, **pparams), cm, econf, agent=agent))
    if unnamed or not named:
        econf = base.model_copy(update={"prefix_caching": copts.prefix_caching})
        for i in range(copts.replicas):
            specs.append(EngineSpec(f"r{i}", make_policy(policy, **params), cost, econf))
    return specs


def run_cluster_simulation(
    cfg: SimulateConfig,
    copts: ClusterOptions,
    trace: Trace | None = None,
    processes: int | None = None,
) -> list[Path]:
    """One cluster run directory per policy of ``cfg`` (all engines without their own policy
    run it), with summary.json (and its sessions part for a session trace). ``processes``:
    worker processes simulating the engines of a cluster that decomposes (``None``: one per
    usable core; ``1``: none); the run directories are the same either way."""
    from harness.engine.cluster_run import write_cluster_run
    from harness.results.sessions import add_session_summary
    from harness.results.summary import write_summary
    from harness.routers.registry import make_router

    trace = trace if trace is not None else load_cluster_trace(cfg, copts)
    out: list[Path] = []
    for name in cfg.policies:
        specs = engine_specs(cfg, copts, name, trace)
        shared = len([s for s in specs if s.agent is None]) > 1 or len(
            {s.agent for s in specs if s.agent}
        ) < len([s for s in specs if s.agent])
        router = None
        if copts.router is not None or shared:
            router = make_router(copts.router or "round-robin", **copts.router_params)
        meta = {
            "seed": cfg.seed,
            "rate": cfg.rate,
            "burstiness": cfg.burstiness,
            "trace_source": cfg.trace,
            "config": cfg.model_dump(mode="json", exclude={"arrival_window_s"}),
            "cluster_options": copts.model_dump(mode="json"),
            "arrival_window_s": cfg.arrival_window_s,
            "label": f"{cfg.label or 'sim'}-{name}",
            "t0_unix": time.time(),
        }
        run_dir, _ = write_cluster_run(
            _run_dir(cfg, name),
            trace,
            specs,
            router,
            meta,
            options=copts.sessions,
            stop_at_s=cfg.stop_at_s,
            split=True,
            processes=processes,
        )
        write_summary(run_dir)
        add_session_summary(run_dir)
        out.append(run_dir)
    return out


__all__ = [
    "ClusterOptions",
    "engine_specs",
    "load_cluster_trace",
    "needs_cluster",
    "run_cluster_simulation",
]
