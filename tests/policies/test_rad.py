"""RAD (seed-rad-slai.md §3.2-§3.3): batch-shape invariants on the real engine core."""

from __future__ import annotations

import numpy as np
import pytest
from paper_host import FakeReq, decoding, drive, make_view

from harness.policies.registry import make_policy


def test_decision_rule_units():
    pol = make_policy("rad", n=10, t_col=2, t_row=4, t_red=4)  # t_lcm = 4
    # |D| = 1 < t_col and P non-empty -> prefill of the FCFS-oldest, one chunk of t_lcm, alone.
    v = make_view(
        [FakeReq("b", 10, 3, arrival_s=1.0), FakeReq("a", 9, 3, arrival_s=0.5)],
        [decoding("d", 5, 1, 4)],
    )
    plan = pol.schedule(v)
    assert plan.admit == [("a", 4)] and plan.run == []
    # |D| = t_col -> decode batch of all of D, nothing else.
    v = make_view([FakeReq("a", 9, 3)], [decoding("d1", 5, 1, 4), decoding("d2", 5, 2, 4)])
    plan = pol.schedule(v)
    assert sorted(plan.run) == [("d1", 1), ("d2", 1)] and not plan.admit
    # a started prefill continues alone, chunk = min(t_lcm, rest) (off-by-one fixed)
    part = FakeReq("p", 10, 3, num_computed_tokens=8)
    plan = pol.schedule(make_view([FakeReq("a", 9, 3)], [part, decoding("d1", 5, 1, 4)]))
    assert plan.run == [("p", 2)] and not plan.admit


def test_invariants_over_a_run():
    rng = np.random.default_rng(0)
    n = 200
    t = np.cumsum(rng.exponential(1 / 40.0, n))
    reqs = [
        {
            "request_id": f"r{i}",
            "arrival_s": float(t[i]),
            "prompt_len": int(rng.integers(1, 700)),
            "max_tokens": int(rng.integers(1, 60)),
        }
        for i in range(n)
    ]
    t_col, t_lcm = 8, 256
    pol = make_policy("rad", n=32, t_col=t_col, t_row=256, t_red=32)
    full_decodes = 0

    def check(core, out):
        nonlocal full_decodes
        decodes = [s for s in out.scheduled if s[2]]
        prefills = [s for s in out.scheduled if not s[2]]
        assert not (decodes and prefills)  # never mixed
        assert len(prefills) <= 1  # one chunk of one request per prefill batch
        for rid, tokens, _ in prefills:
            r = core.get(rid)
            last_chunk = r is None or r.num_computed_tokens == r.num_tokens - 1  # token sampled
            assert tokens == t_lcm or tokens < t_lcm and last_chunk
        assert len(decodes) <= t_col
        assert sum(1 for r in core.running if r.num_output_tokens > 0) <= t_col
        if len(decodes) == t_col:
            full_decodes += 1

    core, _ = drive(pol, reqs, token_budget=4096, check=check)
    assert core.num_finished == n
    assert full_decodes > 0
    assert pol.cycles >= 1


def _rad_backlog(rho: float, horizon_s: float = 600.0) -> tuple[float, float, float]:
    """RAD alone on a tiled batch-time model at load ``rho``: (backlog slope over the second
    half in req/s, arrival rate, capacity 1/T̄^R)."""
    import pandas as pd

    from harness.engine.config import EngineConfig
    from harness.engine.costmodel import get_cost_model
    from harness.engine.simulate import simulate
    from harness.experiments.stability import backlog_slope, poisson_trace

    # The staircase batch time t = c + a*ceil(tokens/128) is the tiling model with t_col* =
    # 128: a decode batch of 128 and a 256-token prefill chunk are perfectly tiled. Prompts
    # are a multiple of t_lcm* = 256 (Assumption 3); lengths deterministic (bounded).
    cm = get_cost_model("staircase")
    prompt, output, t_col = 256, 112, 128
    # T̄^R (seed-rad-slai.md §4) under this model: the prompt's chunks, then its share of
    # full decode batches for the output - 1 tokens after the first (sampled by the prefill).
    t_bar = (prompt / 256) * cm.step_time(256, 0, 0) + (output - 1) * cm.step_time(
        0, t_col, 0
    ) / t_col
    rate = rho / t_bar
    trace = poisson_trace(rate, horizon_s, seed=3, prompt=prompt, output=output)
    t = trace.df["arrival_s"].to_numpy()
    cfg = EngineConfig(block_size=16, kv_tokens=1 << 26, token_budget=512, max_num_seqs=1 << 16)
    pol = make_policy("rad", n=1024, t_col=t_col, t_row=256, t_red=32)
    res = simulate(trace, pol, cm, cfg, stop_at_s=horizon_s)
    done = res.status == 1
    requests = pd.DataFrame({"arrival_s": t, "last_chunk_s": res.last_s, "success": done})
    slope, _ = backlog_slope(requests, horizon_s)
    return slope, rate, 1 / t_bar


def test_theorem_2_no_drift_below_capacity_and_theorem_1_growth_above():
    """seed-rad-slai.md §4: at ρ = λT̄^R = 0.9 RAD's queue does not drift upward over a long
    run (Theorem 2's test); above capacity no scheduler keeps up (Theorem 1), and RAD's backlog
    grows at about λ - 1/T̄^R."""
    slope, rate, cap = _rad_backlog(0.9)
    assert abs(slope) < 0.02 * rate, (slope, rate)  # measured: -0.003 req/s at 7.3 req/s
    slope, rate, cap = _rad_backlog(1.1)
    assert slope == pytest.approx(rate - cap, rel=0.25), (slope, rate - cap)  # 0.75 vs 0.81


def test_oldest_waiting_matches_a_sort_of_the_queue():
    """The FIFO-plus-heap of the waiting queue (rad.py's docstring) names the same request as
    a sort by (arrival, id), through ties, arrivals out of order, preemptions and finishes."""
    from types import SimpleNamespace

    rng = np.random.default_rng(7)
    pol = make_policy("rad")
    waiting: dict[str, FakeReq] = {}
    running: dict[str, FakeReq] = {}
    t = 0.0
    out_of_order = readmitted = 0

    def view():
        return SimpleNamespace(num_waiting=len(waiting), waiting=list(waiting.values()))

    def report(**kw):
        return SimpleNamespace(**{"admitted": (), "preempted": (), "finished": (), **kw})

    for i in range(3000):
        u = rng.random()
        if u < 0.45:  # an arrival: usually later, sometimes tied, sometimes earlier
            v = rng.random()
            t = t if v < 0.15 else t - 1.0 if v < 0.25 else t + float(rng.exponential())
            out_of_order += v >= 0.15 and v < 0.25
            r = FakeReq(f"q{int(rng.integers(0, 10**6))}-{i}", 5, 2, arrival_s=t)
            waiting[r.request_id] = r
            pol.on_arrival(r, t)
        elif u < 0.75 and waiting:  # admit the oldest
            rid = pol._oldest_waiting(view()).request_id
            running[rid] = waiting.pop(rid)
            pol.on_step(report(admitted=(rid,)))
        elif u < 0.9 and running:  # preempt one: back to waiting
            rid = list(running)[int(rng.integers(len(running)))]
            waiting[rid] = running.pop(rid)
            readmitted += 1
            pol.on_step(report(preempted=(rid,)))
        elif running:  # finish one
            rid = list(running)[int(rng.integers(len(running)))]
            del running[rid]
            pol.on_step(report(finished=(rid,)))
        head = pol._oldest_waiting(view())
        want = min(waiting.values(), key=lambda r: (r.arrival_s, r.request_id), default=None)
        assert head is want
    assert out_of_order > 100 and readmitted > 100
    # a host that skips the hooks: the structure is rebuilt from the view
    late = FakeReq("late", 5, 2, arrival_s=-1e9)
    waiting["late"] = late
    assert pol._oldest_waiting(view()) is late
