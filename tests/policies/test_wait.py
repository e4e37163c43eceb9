"""WAIT (seed-wait.md §3): gating, per-stage quotas, the cohort and memory invariants of §3.4."""

from __future__ import annotations

import numpy as np
import pytest
from paper_host import FakeReq, decoding, drive, make_view

from harness.policies.fluid import FluidType, equilibrium
from harness.policies.registry import make_policy
from harness.policies.thresholds import wait_memory, wait_thresholds


def _poisson(types, rates, n, seed):
    rng = np.random.default_rng(seed)
    total = sum(rates)
    t = np.cumsum(rng.exponential(1 / total, n))
    kinds = rng.choice(len(types), size=n, p=np.array(rates) / total)
    return [
        {
            "request_id": f"r{i}",
            "arrival_s": float(t[i]),
            "prompt_len": types[k][0],
            "max_tokens": types[k][1],
        }
        for i, k in enumerate(kinds)
    ]


def test_type_gating_and_stage_quota():
    pol = make_policy("wait", output_lens=[10, 20], thresholds=[2, 3], on_idle="wait")
    waiting = [FakeReq(f"a{i}", 10, 10, arrival_s=i) for i in range(1)]  # type 0: 1 < 2
    waiting += [FakeReq(f"b{i}", 10, 20, arrival_s=i) for i in range(4)]  # type 1: 4 >= 3
    running = [decoding(f"c{i}", 10, 3, 10) for i in range(2)]  # type 0, stage 3: paused
    running += [decoding(f"d{i}", 10, 5, 20, arrival_s=i) for i in range(4)]  # type 1, stage 5
    plan = pol.schedule(make_view(waiting, running, now=3.5))
    assert [rid for rid, _ in plan.admit] == ["b0", "b1", "b2"]  # exactly n_1, oldest first
    assert all(n == 10 for _, n in plan.admit)  # whole prompt
    assert [rid for rid, _ in plan.run] == ["d0", "d1", "d2"]  # min(n_1, 4) at stage 5
    assert not any(rid.startswith("c") for rid, _ in plan.run)  # type 0 paused, KV kept


def test_idle_when_no_type_eligible_then_flush():
    pol = make_policy("wait", output_lens=[10], thresholds=[4], flush_after_s=1.0, on_idle="wait")
    waiting = [FakeReq("a", 10, 10, arrival_s=0.0)]
    assert not pol.schedule(make_view(waiting, now=0.5)).admit  # wait for the threshold
    plan = pol.schedule(make_view(waiting, now=1.5))  # waited 1.5 s > flush_after_s
    assert plan.admit == [("a", 10)]
    assert pol.flushes == 1
    pure = make_policy("wait", output_lens=[10], thresholds=[4], flush_after_s=None, on_idle="wait")
    assert not pure.schedule(make_view(waiting, now=1e6)).admit


def test_type_of_uses_known_length():
    pol = make_policy("wait", output_lens=[10, 20, 30], thresholds=[1, 1, 1])
    assert pol.type_of(FakeReq("x", 5, 99, predicted_output_len=15)) == 1
    assert pol.type_of(FakeReq("x", 5, 10)) == 0
    assert pol.type_of(FakeReq("x", 5, 500)) == 2  # longer than every type: the last


@pytest.mark.parametrize("seed", [0, 1])
def test_never_exceeds_threshold_memory_and_cohorts_lockstep(seed):
    """§3.4: with C >= M^π WAIT never evicts, and every type-j decode stage holds 0 or n_j."""
    types = [(10, 10), (10, 20)]
    th = [4, 2]
    m_pi = int(wait_memory([FluidType(10, 10, 1), FluidType(10, 20, 1)], th))
    pol = make_policy(
        "wait", output_lens=[10, 20], thresholds=th, flush_after_s=0.5, on_idle="wait"
    )
    peak = []

    def check(core, out):
        peak.append(core.kv_used_tokens)
        assert core.kv_used_tokens <= m_pi
        if pol.flushes == 0:
            counts: dict[tuple[int, int], int] = {}
            for r in core.running:
                if r.num_output_tokens > 0:
                    key = (pol.type_of(r), r.num_output_tokens)
                    counts[key] = counts.get(key, 0) + 1
            for (j, _k), c in counts.items():
                assert c == th[j], counts

    core, times = drive(pol, _poisson(types, [60.0, 30.0], 400, seed), kv_tokens=m_pi, check=check)
    assert core.preemptions_total == 0
    assert core.num_finished == 400
    assert max(peak) > 0.5 * m_pi  # the memory is actually used


def test_fcfs_evicts_at_fluid_memory_wait_never_at_its_threshold_memory():
    """Prop 3 / Example 2 spirit: FCFS (vllm) at C = M* evicts; WAIT at C = M^π never does."""
    ft = [FluidType(10, 10, 80.0), FluidType(10, 20, 40.0)]
    reqs = _poisson([(10, 10), (10, 20)], [80.0, 40.0], 1500, 3)
    th = wait_thresholds(ft, d0=0.01, d1=1e-5, slack=0.05)
    assert th.feasible and th.memory_tokens >= equilibrium(ft, 0.01, 1e-5).memory_tokens
    wait_core, _ = drive(make_policy("wait", **th.params()), reqs, kv_tokens=int(th.memory_tokens))
    assert wait_core.preemptions_total == 0
    m_star = int(equilibrium(ft, 0.01, 1e-5).memory_tokens)
    fcfs_core, _ = drive(make_policy("vllm"), reqs, kv_tokens=m_star)
    assert fcfs_core.preemptions_total > 0


def test_admission_variant_runs_all_decodes():
    pol = make_policy("wait", output_lens=[10, 20], thresholds=[2, 1], gating="admission")
    running = [decoding("c0", 10, 3, 10), decoding("c1", 10, 4, 10), decoding("d0", 10, 2, 20)]
    waiting = [FakeReq("a0", 10, 10), FakeReq("a1", 10, 10), FakeReq("b0", 10, 20)]
    plan = pol.schedule(make_view(waiting, running))
    assert {rid for rid, _ in plan.run} == {"c0", "c1", "d0"}
    # type 0: L = 2·11 = 22 in flight allowed, quota min(2, 22-2) = 2; type 1: min(1, 21-1) = 1
    assert [rid for rid, _ in plan.admit] == ["a0", "a1", "b0"]


def test_bad_parameters():
    with pytest.raises(ValueError):
        make_policy("wait", output_lens=[20, 10], thresholds=[1, 1])
    with pytest.raises(ValueError):
        make_policy("wait", output_lens=[10], thresholds=[1, 2])


def test_on_idle_flush_and_trace_end():
    waiting = [FakeReq("a", 10, 10, arrival_s=0.0)]
    eager = make_policy("wait", output_lens=[10], thresholds=[4])  # on_idle="flush" default
    assert eager.schedule(make_view(waiting, now=0.0)).admit == [("a", 10)]
    ended = make_policy(
        "wait",
        output_lens=[10],
        thresholds=[4],
        on_idle="wait",
        trace_end_s=2.0,
        flush_after_s=None,
    )
    assert not ended.schedule(make_view(waiting, now=1.0)).admit
    assert ended.schedule(make_view(waiting, now=2.0)).admit == [("a", 10)]


def test_step_cap_is_a_per_step_request_cap():
    pol = make_policy("wait", output_lens=[10], thresholds=[3], step_cap=4)
    run = [decoding(f"d{i}", 5, 2, 10, arrival_s=i) for i in range(3)]
    wait = [FakeReq(f"w{i}", 5, 10, arrival_s=10 + i) for i in range(3)]
    plan = pol.schedule(make_view(wait, run))
    assert len(plan.run) + len(plan.admit) == 4


@pytest.mark.parametrize("seed", range(6))
def test_flush_plan_keeps_each_type_stage_groups_oldest_quota(seed: int) -> None:
    # The end-of-run flush runs, of every (type, stage) group, its oldest n_j (§3.3, #14);
    # whether that is every decode is counted per group (issue 13): check against a count
    # done here by hand.
    rng = np.random.default_rng(seed)
    lens, n = [32, 64, 128], [3, 2, 1]
    running = [
        decoding(
            f"d{i}",
            10,
            int(rng.integers(1, 24)),
            int(rng.choice(lens)),
            arrival_s=float(rng.random()),
        )
        for i in range(2 + 6 * seed)  # from every decode running to quotas cutting groups
    ]
    pol = make_policy("wait", output_lens=lens, thresholds=n)
    plan = pol.schedule(make_view(running=running, now=10.0))  # flush: nothing new for 5 s
    groups: dict[tuple[int, int], list] = {}
    for r in sorted(running, key=lambda r: (r.arrival_s, r.request_id)):
        groups.setdefault((lens.index(r.max_tokens), r.num_output_tokens), []).append(r)
    expect = {r.request_id for (j, _k), rs in groups.items() for r in rs[: n[j]]}
    assert {rid for rid, _ in plan.run} == expect
