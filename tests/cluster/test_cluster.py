"""The cluster simulator: one replica is the single-engine simulator, routing conserves calls,
agents go to their engines, deferred steady runs change no answer."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from harness.engine.cluster import EngineSpec, simulate_cluster
from harness.engine.cluster_run import write_cluster_run
from harness.engine.config import EngineConfig
from harness.engine.costmodel import get_cost_model
from harness.engine.simresult import SimulationStalled
from harness.engine.simulate import simulate
from harness.policies import make_policy
from harness.policies.columns import ColumnPlan, ColumnPolicy, ColumnView
from harness.results import schema
from harness.results.rundir import read_run
from harness.routers import make_router
from harness.workload import build_trace
from harness.workload.tiers import parse_tiers
from harness.workload.trace import Trace

from .conftest import engines, session_trace


def _plain(n: int, rate: float, seed: int = 0) -> Trace:
    import os

    from harness.shared_data import shared_data_dir

    path = str(shared_data_dir() / "lmsys_sample_lengths.csv")
    if not os.path.isfile(path):
        pytest.skip("shared LMSYS lengths not available")
    return build_trace(path, num_requests=n, rate=rate, seed=seed, quiet=True)


def _rows(res):  # noqa: ANN001, ANN202
    return sorted(res.driver.rows, key=lambda r: r.req)


@pytest.mark.parametrize("rate", [3.0, 40.0])
def test_one_replica_is_the_single_engine_simulator(rate: float) -> None:
    trace = _plain(400, rate)
    cm = get_cost_model("a100-llama2-7b")
    cfg = EngineConfig(kv_tokens=20_000)
    ref = simulate(trace, make_policy("vllm"), cm, cfg)
    res = simulate_cluster(trace, [EngineSpec("e0", make_policy("vllm"), cm, cfg)])
    rows = _rows(res)
    assert [r.req for r in rows] == list(range(len(trace)))
    np.testing.assert_array_equal([r.first_s for r in rows], ref.first_s)
    np.testing.assert_array_equal([r.last_s for r in rows], ref.last_s)
    a = np.lexsort((ref.chunk_t, ref.chunk_req))
    b = np.lexsort((res.chunk_t, res.chunk_req))
    np.testing.assert_array_equal(ref.chunk_t[a], res.chunk_t[b])


@pytest.mark.parametrize("router", ["round-robin", "least-outstanding-tokens", "random"])
def test_routing_conserves_calls(router: str) -> None:
    trace = _plain(600, 60.0, seed=1)
    res = simulate_cluster(trace, engines(4, kv_tokens=20_000), make_router(router))
    rows = _rows(res)
    assert len(rows) == len(trace) and all(r.ok for r in rows)
    assert sum(p["num_finished"] for p in res.per_engine) == len(trace)
    out = trace.df["output_len"].to_numpy()
    assert np.array_equal([r.out_tokens for r in rows], out)
    assert len(res.chunk_req) == out.sum()  # one chunk per token, no token lost or doubled
    if router == "round-robin":
        assert [p["num_finished"] for p in res.per_engine] == [150] * 4
        assert [r.engine for r in rows] == [i % 4 for i in range(len(trace))]


def test_several_engines_need_a_router() -> None:
    with pytest.raises(ValueError, match="router"):
        simulate_cluster(_plain(10, 1.0), engines(2))


def test_deferred_runs_change_no_answer() -> None:
    """Deferring steady runs (no core call until something touches the engine) gives the
    token times of stepping every step."""
    trace = _plain(300, 30.0, seed=2)
    rr = make_router("round-robin")
    a = simulate_cluster(trace, engines(3, kv_tokens=20_000), rr, fast_forward=False)
    b = simulate_cluster(trace, engines(3, kv_tokens=20_000), make_router("round-robin"))
    assert b.counters["core_calls"] < a.counters["core_calls"]
    np.testing.assert_allclose([r.last_s for r in _rows(a)], [r.last_s for r in _rows(b)])
    np.testing.assert_allclose([r.first_s for r in _rows(a)], [r.first_s for r in _rows(b)])


def test_agents_go_to_their_engines() -> None:
    rows = []
    for s in range(20):
        rows.append(
            {
                "session_id": f"s{s}",
                "call_index": 0,
                "parents": "",
                "agent": "a1",
                "prompt_len": 30,
                "output_len": 10,
                "arrival_s": 0.1 * s,
                "context": "none",
            }
        )
        rows.append(
            {
                "session_id": f"s{s}",
                "call_index": 1,
                "parents": "0",
                "agent": "a2",
                "prompt_len": 5,
                "output_len": 30,
                "arrival_s": 0.1 * s,
                "context": "replies",
            }
        )
    trace = session_trace(rows)
    cm = get_cost_model("a100-llama2-7b")
    cfg = EngineConfig(kv_tokens=1 << 14)
    specs = [
        EngineSpec("agent1", make_policy("vllm"), cm, cfg, agent="a1"),
        EngineSpec("agent2", make_policy("vllm"), cm, cfg, agent="a2"),
    ]
    res = simulate_cluster(trace, specs)
    got = _rows(res)
    assert len(got) == 40 and all(r.ok for r in got)
    for r in got:
        assert r.engine == (0 if r.call.agent == "a1" else 1)
        if r.call.index == 1:  # the hand-off: fed the parent's reply (10 tokens) + own text
            assert r.prompt_len == 10 + 5
    with pytest.raises(ValueError, match="no engine"):
        simulate_cluster(trace, specs[:1])


@pytest.mark.parametrize("router", ["round-robin", "random"])
def test_split_is_the_event_loop(router: str) -> None:
    """A load-blind router decomposes the cluster into engines simulated alone: same answers
    as the event loop."""
    from harness.engine.cluster_split import simulate_split, split_plan

    trace = _plain(500, 150.0, seed=4)
    plan = split_plan(trace, engines(3, kv_tokens=20_000), make_router(router), None)
    assert plan is not None
    merged, parts = simulate_split(trace, engines(3, kv_tokens=20_000), plan)
    res = simulate_cluster(trace, engines(3, kv_tokens=20_000), make_router(router))
    rows = _rows(res)
    assert [r.engine for r in rows] == plan.tolist()
    # equal up to float rounding (a deferred run's step times are summed from its start)
    np.testing.assert_allclose([r.first_s for r in rows], merged.first_s, rtol=1e-12)
    np.testing.assert_allclose([r.last_s for r in rows], merged.last_s, rtol=1e-12)
    assert len(merged.chunk_req) == len(res.chunk_req)


def test_load_aware_routers_do_not_split() -> None:
    from harness.engine.cluster_split import split_plan

    trace = _plain(50, 10.0)
    for name in ("least-outstanding-tokens", "prefix-aware", "session-affinity"):
        assert split_plan(trace, engines(2), make_router(name), None) is None, name


def test_outstanding_tokens_view_is_exact() -> None:
    """The router's view: prompt + max_tokens of live requests minus their computed tokens."""
    from harness.routers.base import Router

    checked = []

    class Checking(Router):
        name = "checking"

        def route(self, call, engines, now_s):  # noqa: ANN001, ANN201
            for e in engines:
                live = e.core._requests.values()
                brute = sum(
                    r.num_prompt_tokens + r.max_tokens - r.num_computed_tokens for r in live
                )
                assert e.outstanding_tokens == brute
                checked.append(brute)
            return min(range(len(engines)), key=lambda i: engines[i].outstanding_tokens)

    trace = _plain(300, 80.0, seed=5)
    simulate_cluster(trace, engines(3, kv_tokens=6000), Checking(), fast_forward=False)
    assert len(checked) == 900 and max(checked) > 0


@pytest.mark.parametrize(
    ("router", "kv_tokens"),
    [
        ("least-outstanding-tokens", 20_000),
        ("least-outstanding-tokens", 6000),  # KV-bound: thousands of preemptions
        ("session-affinity", 8000),
        ("prefix-aware", 8000),
        ("random", 6000),
    ],
)
def test_array_engines_are_the_event_loop(router: str, kv_tokens: int) -> None:
    """The routed cluster on array engines (cluster_fast) gives every call the engine and the
    token times of the event loop over engine cores: the routers read the same load views at
    the same instants."""
    from harness.engine.cluster_fast import routed_budgets, simulate_routed

    trace = _plain(900, 120.0, seed=6)
    ref = simulate_cluster(trace, engines(3, kv_tokens=kv_tokens), make_router(router))
    budgets = routed_budgets(trace, engines(3), make_router(router), None, None)
    assert budgets is not None
    merged, parts, engine_of = simulate_routed(
        trace, engines(3, kv_tokens=kv_tokens), make_router(router), budgets
    )
    rows = _rows(ref)
    assert engine_of.tolist() == [r.engine for r in rows]
    np.testing.assert_array_equal([r.first_s for r in rows], merged.first_s)
    np.testing.assert_array_equal([r.last_s for r in rows], merged.last_s)
    assert merged.preemptions.tolist() == [r.preemptions for r in rows]
    assert merged.counters["preemptions_total"] == ref.counters["preemptions_total"]
    if kv_tokens == 6000:
        assert merged.counters["preemptions_total"] > 100
    assert merged.num_steps == ref.counters["num_steps"]
    a = np.lexsort((ref.chunk_t, ref.chunk_req))
    b = np.lexsort((merged.chunk_t, merged.chunk_req))
    np.testing.assert_array_equal(ref.chunk_req[a], merged.chunk_req[b])
    np.testing.assert_array_equal(ref.chunk_t[a], merged.chunk_t[b])
    for p, e, s in zip(parts, ref.per_engine, ref.samples, strict=True):
        assert p.num_steps == e["num_steps"]
        for col in s:  # the same telemetry, step by step
            np.testing.assert_array_equal(np.asarray(p.samples[col]), np.asarray(s[col]), col)


def test_array_engines_only_where_exact() -> None:
    from harness.engine.cluster_fast import routed_budgets

    trace = _plain(50, 10.0)
    lot = make_router("least-outstanding-tokens")
    assert routed_budgets(trace, engines(2), lot, None, None) is not None
    assert routed_budgets(trace, engines(2), lot, None, 1.0) is None  # a stop time
    assert routed_budgets(trace, engines(2, policy="wait"), lot, None, None) is None
    from harness.workload.session_options import SessionOptions

    assert routed_budgets(trace, engines(2), lot, SessionOptions(max_retries=1), None) is None


class _Readmits(ColumnPolicy):
    """Runs only prompts and admits the queue head with one block: with a finished prompt
    paused on a 4-block KV, the next prompt's second chunk never fits (a livelock)."""

    name = "readmits"

    def plan_columns(self, cv: ColumnView) -> ColumnPlan:
        rc = cv.running
        prefilling = np.flatnonzero(rc.output == 0)
        return ColumnPlan(
            prefilling, (rc.prompt - rc.computed)[prefilling], admit=[16] if cv.num_waiting else []
        )


def test_a_livelocked_engine_ends_the_cluster_run(tmp_path) -> None:  # noqa: ANN001
    # an 8-token prompt, then four 40-token prompts: round-robin puts three on e0 and two on
    # e1; each 4-block engine livelocks on its second 40-token prompt
    df = pd.DataFrame(
        {
            "request_id": [f"r{i}" for i in range(5)],
            "arrival_s": [0.0] + [1.0] * 4,
            "prompt_len": [8] + [40] * 4,
            "output_len": [4] + [8] * 4,
            "tier": "default",
        }
    )
    trace = Trace.from_frame(df, parse_tiers("default:1"), {"source": "test"})
    cm = get_cost_model("a100-llama2-7b")
    cfg = EngineConfig(kv_tokens=64, block_size=16, token_budget=64)
    specs = [EngineSpec(f"e{i}", _Readmits(), cm, cfg) for i in range(2)]
    with pytest.raises(SimulationStalled, match="engine 'e[01]'.*10,000 preemptions"):
        simulate_cluster(trace, specs, make_router("round-robin"))
    # the run writer keeps what was simulated, then reports the livelock (as for one engine)
    specs = [EngineSpec(f"e{i}", _Readmits(), cm, cfg) for i in range(2)]
    with pytest.raises(SimulationStalled, match="livelock"):
        write_cluster_run(tmp_path / "run", trace, specs, make_router("round-robin"), {})
    run = read_run(tmp_path / "run")
    assert run.status == schema.STATUS_PARTIAL and "livelock" in run.meta["stopped_by"]
    assert len(run.requests) == 5
    # each engine's first prompt got its first token (this policy never decodes), the second
    # livelocked: three tokens measured and kept, no request complete
    assert not run.requests["success"].any()
    assert int(run.requests["output_tokens"].sum()) == len(run.chunks) == 3
    assert len(run.samples) > 0
