"""Nested WAIT (seed-wait.md §4): segments, prefix rule, non-predictive, θ and Eq. (14)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from paper_host import FakeReq, decoding, drive, make_view

from harness.policies.registry import make_policy
from harness.policies.thresholds import nested_memory, nested_thresholds, theta_root


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
