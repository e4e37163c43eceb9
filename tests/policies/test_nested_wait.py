"""Nested WAIT (seed-wait.md §4): segments, prefix rule, non-predictive, θ and Eq. (14)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from paper_host import FakeReq, decoding, drive, make_view

from harness.policies.registry import make_policy
from harness.policies.thresholds import (
    batch_seats,
    nested_memory,
    nested_thresholds,
    segment_stages,
    theta_root,
)


def test_segment_boundaries():
    pol = make_policy("nested-wait", edges=[20, 40, 80], thresholds=[3, 2, 1])
    # stage k = tokens generated; segment 1 = stages 0..19, 2 = 20..39, 3 = 40..
    assert [pol.segment_of(k) for k in (0, 19, 20, 39, 40, 79, 500)] == [0, 0, 1, 1, 2, 2, 2]
    assert [pol.first_stage(i) for i in range(3)] == [0, 20, 40]


def test_prefix_rule_pauses_later_segments():
    pol = make_policy("nested-wait", edges=[20, 40, 80], thresholds=[2, 2, 1])
    waiting = [FakeReq(f"w{i}", 10, 999, arrival_s=i * 0.01) for i in range(3)]
    running = [
        decoding("s1a", 10, 5, 999),
        decoding("s1b", 10, 5, 999),
        decoding("s1c", 10, 5, 999),
    ]
    running += [decoding("s2", 10, 20, 999)]  # 1 < n_2 = 2 at segment 2's first stage
    running += [decoding("s3", 10, 40, 999)]  # segment 3 ready on its own, but 2 is not
    plan = pol.schedule(make_view(waiting, running, now=0.05))
    assert [r for r, _ in plan.admit] == ["w0", "w1"]  # n_1 oldest
    ran = [r for r, _ in plan.run]
    assert ran == ["s1a", "s1b"]  # per-stage quota n_1 = 2; s2 and s3 paused (prefix rule)


def test_idle_until_segment_one_ready():
    pol = make_policy(
        "nested-wait", edges=[20, 40], thresholds=[3, 2], flush_after_s=None, on_idle="wait"
    )
    plan = pol.schedule(make_view([FakeReq("a", 10, 30), FakeReq("b", 10, 30)], now=5.0))
    assert not plan.admit and not plan.run


def test_non_predictive_plan_ignores_lengths():
    pol = make_policy("nested-wait", edges=[20, 40], thresholds=[2, 1])
    waiting = [FakeReq(f"w{i}", 10, 30 + i, arrival_s=i * 0.01) for i in range(3)]
    running = [decoding("a", 10, 20, 25), decoding("b", 10, 3, 400)]
    v1 = make_view(waiting, running, now=0.05)
    other = [replace(r, max_tokens=7, predicted_output_len=1000) for r in waiting]
    other_run = [replace(r, max_tokens=r.max_tokens * 3) for r in running]
    v2 = make_view(other, other_run, now=0.05)
    assert pol.schedule(v1) == pol.schedule(v2)


def test_theta_boundary_and_bounds():
    # seed-wait.md App. C: n_{k-1} = 15, n_k = 14, p = 14/15 -> D = 0, no positive root.
    assert math.isnan(theta_root(15, 14, 14 / 15))
    th = theta_root(15, 14.5, 14 / 15)
    assert th > 0
    p = 14 / 15
    assert -th * 14.5 + 15 * math.log(1 - p + p * math.exp(th)) == pytest.approx(0, abs=1e-9)
    assert th >= 8 * (14.5 - 15 * p) / 15  # Lemma 8 lower bound
    assert math.isnan(theta_root(10, 10, 0.5))  # needs n_k < n_{k-1}


def test_exact_memory_matches_brute_force():
    edges, n, prompt = [3, 7, 12], [5, 3, 2], 4
    brute = 5 * sum(prompt + k for k in range(0, 4))
    brute += 3 * sum(prompt + k for k in range(4, 8))
    brute += 2 * sum(prompt + k for k in range(8, 13))
    assert nested_memory(prompt, edges, n) == pytest.approx(brute)


def test_nested_thresholds_satisfy_eq12():
    rates = [2.0, 4.0, 8.0, 16.0]  # N-syn proportions (seed-wait.md §6.2)
    res = nested_thresholds(10, [20, 40, 80, 160], rates, d0=0.5, d1=1e-6, eps=0.3)
    tails = [sum(rates[i:]) for i in range(4)]
    n = res.thresholds
    assert res.feasible
    assert res.step_s <= n[0] / tails[0]
    for i in range(3):
        assert n[i + 1] / n[i] > tails[i + 1] / tails[i]  # drains faster than fed
    assert res.required_memory_tokens > res.memory_tokens  # the safety buffer of Eq. (14)


def test_end_to_end_completes_within_eq14_memory():
    rng = np.random.default_rng(0)
    edges = [10, 20, 40]
    rates = np.array([30.0, 20.0, 10.0])
    res = nested_thresholds(8, edges, list(rates), d0=0.1, d1=1e-5, eps=0.3, horizon_s=30)
    kinds = rng.choice(3, size=400, p=rates / rates.sum())
    lo = [1, 11, 21]
    t = np.cumsum(rng.exponential(1 / rates.sum(), 400))
    reqs = [
        {
            "request_id": f"r{i}",
            "arrival_s": float(t[i]),
            "prompt_len": 8,
            "max_tokens": int(rng.integers(lo[k], edges[k] + 1)),
        }
        for i, k in enumerate(kinds)
    ]
    cap = int(res.required_memory_tokens)
    pol = make_policy("nested-wait", **res.params(), flush_after_s=0.5, on_idle="wait")
    core, times = drive(pol, reqs, kv_tokens=cap, known_output_lengths=False)
    assert core.num_finished == 400
    assert core.preemptions_total == 0


def test_unstable_thresholds_fill_b_seats_not_b_per_stage():
    """Issue 19 fix 1: B = Σ n_i × stages_i (seed-wait.md App. A), not Σ n_i = B."""
    edges = list(range(50, 501, 50))
    rates = [55.0 * w for w in (0.3, 0.2, 0.12, 0.1, 0.08, 0.06, 0.05, 0.04, 0.03, 0.02)]
    res = nested_thresholds(60, edges, rates, d0=0.01, d1=1e-5, eps=0.3, batch_limit=2048)
    assert "fluid-unstable" in res.notes[0]
    seats = batch_seats(res.thresholds, edges)
    assert 2048 * 0.8 <= seats <= 2048  # the old Σ n_i = B read gave ~8x more seats
    assert segment_stages(edges) == [50] * 10
    # B below Σ stages: every per-stage threshold is 1 (the authors' ceil), and it says so
    small = nested_thresholds(60, edges, rates, d0=0.01, d1=1e-5, eps=0.3, batch_limit=256)
    assert small.thresholds == [1] * 10
    assert any("500 stages > B = 256" in n for n in small.notes)


def test_stable_thresholds_respect_batch_limit():
    """Issue 19 fix 2: the fluid-stable branch never asks for more than B seats."""
    edges = [10, 20, 40]
    res = nested_thresholds(8, edges, [30.0, 20.0, 10.0], d0=0.1, d1=1e-5, eps=0.3)
    free = batch_seats(res.thresholds, edges)
    assert free > 64  # unconstrained, the fluid recipe wants more than 64 seats
    capped = nested_thresholds(
        8, edges, [30.0, 20.0, 10.0], d0=0.1, d1=1e-5, eps=0.3, batch_limit=64
    )
    assert batch_seats(capped.thresholds, edges) <= 64
    assert any("scaled down to B" in n for n in capped.notes)


def test_memory_guard_shrinks_admission():
    """Issue 19 fix 5 (seed-wait.md §9 #12): admit only what fits at segment end."""
    pol = make_policy("nested-wait", edges=[10, 20], thresholds=[4, 2], on_idle="wait")
    run = [decoding(f"d{i}", 10, 3, 20) for i in range(4)]  # commit 4 x (10 + 10) = 80
    wait = [FakeReq(f"w{i}", 10, 20, arrival_s=i) for i in range(4)]  # 20 each
    view = make_view(wait, run, total_blocks=130)
    assert len(pol.schedule(view).admit) == 2  # 130 - 80 = 50 -> two of 20
    assert pol.guard_deferred == 2
    off = make_policy(
        "nested-wait", edges=[10, 20], thresholds=[4, 2], on_idle="wait", memory_guard=False
    )
    assert len(off.schedule(view).admit) == 4


def test_step_cap_limits_requests_per_step_not_kv_holders():
    pol = make_policy("nested-wait", edges=[10, 20], thresholds=[4, 2], step_cap=5)
    run = [decoding(f"d{i}", 10, 3, 20) for i in range(4)]
    wait = [FakeReq(f"w{i}", 10, 20, arrival_s=i) for i in range(4)]
    plan = pol.schedule(make_view(wait, run))
    assert len(plan.run) == 4 and len(plan.admit) == 1


def _overcommit_run(memory_guard: bool) -> tuple[int, int]:
    rng = np.random.default_rng(1)
    edges = [10, 20, 40]
    t = np.cumsum(rng.exponential(1 / 60.0, 300))
    reqs = [
        {
            "request_id": f"r{i}",
            "arrival_s": float(t[i]),
            "prompt_len": 8,
            "max_tokens": int(rng.integers(1, 41)),
        }
        for i in range(300)
    ]
    pol = make_policy(
        "nested-wait",
        edges=edges,
        thresholds=[12, 10, 8],
        flush_after_s=0.5,
        on_idle="wait",
        memory_guard=memory_guard,
    )
    core, _ = drive(pol, reqs, kv_tokens=600, known_output_lengths=False)
    return core.num_finished, core.preemptions_total


def test_memory_guard_prevents_eviction_cascade_end_to_end():
    """KV-overcommitting thresholds: without the guard prompts are evicted; with it none are."""
    done_off, pre_off = _overcommit_run(False)
    done_on, pre_on = _overcommit_run(True)
    assert done_off == done_on == 300
    assert pre_off >= 10
    assert pre_on == 0


def test_seg_caps_limit_entry_like_the_authors_code():
    """seed-wait.md App. A: a segment admits min(n_i, cap_i - prompts inside it)."""
    pol = make_policy("nested-wait", edges=[10, 20], thresholds=[1, 1], seg_caps=[3, 2])
    run = [decoding("d0", 10, 2, 20, arrival_s=0), decoding("d1", 10, 5, 20, arrival_s=1)]
    wait = [FakeReq(f"w{i}", 10, 20, arrival_s=2 + i) for i in range(3)]
    plan = pol.schedule(make_view(wait, run))
    assert [r for r, _ in plan.admit] == ["w0"]  # 3 - 2 inside -> 1, and n_1 = 1
    assert {r for r, _ in plan.run} == {"d0", "d1"}
    full = [decoding(f"d{i}", 10, 2 + i, 20, arrival_s=i) for i in range(3)]
    plan = pol.schedule(make_view(wait, full))
    assert plan.admit == [] and len(plan.run) == 3  # segment 1 full: decodes run, none enter


@pytest.mark.parametrize("policy", ["nested-wait", "wait"])
def test_flush_plans_keep_age_order_where_it_decides(policy: str) -> None:
    # Running order (admission) differs from age order (arrival) after a re-admission. A
    # flush plan lists its decodes in running order only when every one runs and nothing is
    # cut; where a quota cuts a stage group its oldest still run (§4.3, seed-wait.md §9 #14),
    # and where the KV cannot take every decode the run order (oldest first) decides who the
    # host preempts (base.py rule 2).
    kw = {"edges": [20, 40]} if policy == "nested-wait" else {"output_lens": [100, 200]}
    running = [
        decoding("young", 13, 2, 100, arrival_s=5.0),
        decoding("old", 13, 2, 100, arrival_s=1.0),
    ]
    now = 10.0  # nothing arrived for 5 s: the end-of-run flush (flush_after_s = 1)
    cut = make_policy(policy, thresholds=[1, 1], **kw)
    assert [rid for rid, _ in cut.schedule(make_view(running=running, now=now)).run] == ["old"]
    # quotas of 2: both run; a free KV: any order; one free block for two new blocks: by age
    both = make_policy(policy, thresholds=[2, 2], **kw)
    roomy = both.schedule(make_view(running=running, now=now, block_size=7))
    assert sorted(rid for rid, _ in roomy.run) == ["old", "young"]
    tight = both.schedule(make_view(running=running, now=now, block_size=7, total_blocks=5))
    assert [rid for rid, _ in tight.run] == ["old", "young"]


@pytest.mark.parametrize("seed", range(6))
def test_flush_plan_from_stage_counts_runs_what_the_stage_groups_run(seed: int) -> None:
    # A flush plan decides "every decode runs" from one count of the decodes per stage
    # (issue 13); seg_caps too large to bind keep the same quotas (§4.3) but always build the
    # stage groups, so both plans must run the same requests and admit the same ones.
    rng = np.random.default_rng(seed)
    edges, n = [4, 8, 16], [3, 2, 1]
    running = [
        decoding(f"d{i}", 10, int(rng.integers(1, 48)), 60, arrival_s=float(rng.random()))
        for i in range(2 + 4 * seed)  # from every decode running to quotas cutting groups
    ]
    waiting = [FakeReq(f"w{i}", 10, 40, arrival_s=float(i)) for i in range(int(seed % 3))]
    view = make_view(waiting, running, now=10.0, block_size=4)  # flush: nothing new for 5 s
    counted, grouped = (
        make_policy("nested-wait", edges=edges, thresholds=n, seg_caps=caps)
        for caps in (None, [10**9] * 3)
    )
    for pol in (counted, grouped):
        for r in waiting:
            pol.on_arrival(r, 0.0)
    a, b = counted.schedule(view), grouped.schedule(view)
    assert sorted(rid for rid, _ in a.run) == sorted(rid for rid, _ in b.run)
    assert a.admit == b.admit
    stages = [r.num_output_tokens for r in running]
    seg = [min(sum(k >= e for e in edges), 2) for k in stages]
    every = all(stages.count(k) <= n[s] for k, s in zip(stages, seg, strict=True))
    assert (len(a.run) == len(running)) == every
