"""RAD (seed-rad-slai.md §3.2-§3.3): batch-shape invariants on the real engine core."""

from __future__ import annotations

import numpy as np
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
