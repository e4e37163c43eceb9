"""SLAI (seed-rad-slai.md §5): Eq. 8 deadlines, batch order, and the caps it never exceeds."""

from __future__ import annotations

import numpy as np
import pytest
from paper_host import FakeReq, decoding, drive, make_view

from harness.policies.base import StepReport
from harness.policies.registry import make_policy


def _report(duration: float, steps: int = 1) -> StepReport:
    return StepReport(0.0, duration, steps, 0, 0, 0, 0, 0)


def test_lst_eq8_and_criticality():
    pol = make_policy("slai", dynamic_offset=False, offset=10.0)
    pol.on_step(_report(0.01))
    pol.on_step(_report(0.03))  # cumulative mean 0.02
    assert pol.mean_batch_s == pytest.approx(0.02)
    r = decoding("f", 100, 3, 50, last_token_s=1.0, tbt_slo_s=0.5)
    v = make_view([], [r], now=1.29)
    assert pol.lst(r, v) == pytest.approx(1.0 + 0.5 - 10 * 0.02)
    # computed once per token: a later mean does not move it (#3) ...
    pol.on_step(_report(0.5))
    assert pol.lst(r, v) == pytest.approx(1.3)
    # ... a new token does.
    r2 = decoding("f", 100, 4, 50, last_token_s=2.0, tbt_slo_s=0.5)
    assert pol.lst(r2, v) == pytest.approx(2.0 + 0.5 - 10 * pol.mean_batch_s)


def test_fast_forward_reports_count_each_step():
    pol = make_policy("slai")
    pol.on_step(_report(0.04, steps=4))
    pol.on_step(_report(0.0, steps=0))  # a preemption-only step ran nothing
    assert pol.mean_batch_s == pytest.approx(0.01)


def test_dynamic_offset_switch():
    pol = make_policy("slai")
    assert pol.current_offset(make_view(total_blocks=100, used_blocks=95)) == 5.0
    assert pol.current_offset(make_view(total_blocks=100, used_blocks=96)) == 10.0
    fixed = make_policy("slai", dynamic_offset=False, offset=7.0)
    assert fixed.current_offset(make_view(total_blocks=100, used_blocks=99)) == 7.0


def test_batch_order_critical_partial_spf_noncritical():
    pol = make_policy("slai", token_budget=40, dynamic_offset=False, offset=0.0)
    crit = decoding("crit", 10, 2, 50, last_token_s=0.0, tbt_slo_s=0.1, arrival_s=5.0)
    non = decoding("non", 10, 2, 50, last_token_s=0.0, tbt_slo_s=0.5, arrival_s=0.0)
    part = FakeReq("part", 30, 5, num_computed_tokens=20, arrival_s=1.0)
    waiting = [FakeReq("big", 25, 5, arrival_s=2.0), FakeReq("small", 8, 5, arrival_s=3.0)]
    plan = pol.schedule(make_view(waiting, [non, part, crit], now=0.2))
    # crit (LST 0.1 <= 0.2) first, then the partial prefill's 10, then SPF: small (8), then
    # big gets the rest of the budget (40 - 1 - 10 - 8 = 21), then non-critical gets nothing.
    assert plan.run == [("crit", 1), ("part", 10)]
    assert plan.admit == [("small", 8), ("big", 21)]
    assert pol.deferred_total == 1
    fcfs = make_policy(
        "slai", token_budget=40, prefill_order="fcfs", dynamic_offset=False, offset=0
    )
    plan = fcfs.schedule(make_view(waiting, [non, part, crit], now=0.2))
    assert plan.admit == [("big", 25), ("small", 4)]


def test_paid_tier_priority_in_prefill_order():
    pol = make_policy("slai", tier_priority=True)
    waiting = [FakeReq("free", 5, 5, priority=1), FakeReq("paid", 500, 5, priority=0)]
    plan = pol.schedule(make_view(waiting))
    assert [r for r, _ in plan.admit] == ["paid", "free"]


def test_light_load_is_work_conserving_and_steady():
    pol = make_policy("slai")
    running = [decoding(f"d{i}", 10, 2, 50, last_token_s=0.0, tbt_slo_s=0.5) for i in range(5)]
    plan = pol.schedule(make_view([], running, now=0.0))
    assert len(plan.run) == 5 and plan.steady


def test_a_plan_of_every_decode_keeps_running_order_only_when_nothing_is_cut():
    # every decode runs one token: when their next blocks fit, the order cannot matter and
    # the plan keeps running order (the host's all-decode path); when they do not, the host
    # preempts from the tail of the run order, so the critical decode must come first
    pol = make_policy("slai", dynamic_offset=False, offset=0.0)
    non = decoding("non", 10, 2, 50, last_token_s=0.0, tbt_slo_s=0.5, arrival_s=0.0)
    crit = decoding("crit", 10, 2, 50, last_token_s=0.0, tbt_slo_s=0.1, arrival_s=1.0)
    waiting = [FakeReq("w", 4, 5, arrival_s=0.1)]
    roomy = pol.schedule(make_view(waiting, [non, crit], now=0.2))
    assert roomy.run == [("non", 1), ("crit", 1)] and roomy.admit == [("w", 4)]
    tight = pol.schedule(make_view(waiting, [non, crit], now=0.2, total_blocks=23))
    assert tight.run == [("crit", 1), ("non", 1)] and not tight.admit
    assert pol.critical_total == 2 and pol.noncritical_total == 2


def test_kv_watermark_blocks_admission_head_of_line():
    pol = make_policy("slai", prefill_order="fcfs")
    waiting = [FakeReq("a", 50, 5), FakeReq("b", 5, 5)]
    plan = pol.schedule(make_view(waiting, total_blocks=100, used_blocks=55, token_budget=512))
    assert not plan.admit  # a needs 50 of 45 free: stop, do not skip to b (head-of-line)


@pytest.mark.parametrize("seed", range(25))
def test_caps_never_exceeded_and_critical_first(seed):
    rng = np.random.default_rng(seed)
    budget = int(rng.integers(4, 64))
    alpha = int(rng.integers(2, 20))
    beta = int(rng.integers(1, 20))
    pol = make_policy(
        "slai",
        token_budget=budget,
        max_active=alpha,
        max_decodes=beta,
        dynamic_offset=False,
        offset=float(rng.uniform(0, 3)),
    )
    pol.on_step(_report(0.05))
    now = 1.0
    running = []
    for i in range(int(rng.integers(0, alpha + 1))):
        if rng.random() < 0.7:
            running.append(
                decoding(
                    f"d{i}",
                    int(rng.integers(1, 30)),
                    1 + i % 4,
                    99,
                    last_token_s=float(rng.uniform(0, 1)),
                    tbt_slo_s=float(rng.choice([0.1, 0.5])),
                )
            )
        else:
            p = int(rng.integers(2, 40))
            running.append(FakeReq(f"p{i}", p, 9, num_computed_tokens=int(rng.integers(1, p))))
    waiting = [FakeReq(f"w{i}", int(rng.integers(1, 40)), 9, arrival_s=0.5) for i in range(6)]
    view = make_view(waiting, running, now=now, token_budget=4096, total_blocks=10_000)
    crit_ids = {
        r.request_id for r in running if r.num_output_tokens > 0 and pol.lst(r, view) <= now
    }
    plan = pol.schedule(view)
    ids = dict(plan.run)
    tokens = sum(n for _, n in plan.run) + sum(n for _, n in plan.admit)
    assert tokens <= budget
    decodes = [rid for rid in ids if rid.startswith("d")]
    assert len(decodes) <= beta
    assert len(running) + len(plan.admit) <= max(alpha, len(running))
    if len(crit_ids) <= min(budget, beta):
        assert crit_ids <= set(ids)  # every critical decode that fits is scheduled
    # critical decodes come first in the run order wherever the order can matter: a plan
    # that runs every decode one token and nothing else (their next blocks fit here) is cut
    # by nothing, so it may keep running order
    order = [rid for rid, _ in plan.run]
    every_decode = {r.request_id for r in running if r.num_output_tokens > 0}
    if set(order) != every_decode:
        first_non = next((i for i, rid in enumerate(order) if rid not in crit_ids), len(order))
        assert all(rid not in crit_ids for rid in order[first_non:])
    else:
        assert all(n == 1 for _, n in plan.run)


def test_end_to_end_paid_decodes_tighter_than_free():
    """Two tiers under a prefill-heavy load: SLAI defers free-tier decodes, not paid ones."""
    rng = np.random.default_rng(4)
    n = 300
    t = np.cumsum(rng.exponential(1 / 25.0, n))
    tiers = rng.random(n) < 0.3
    reqs = [
        {
            "request_id": f"r{i}",
            "arrival_s": float(t[i]),
            "prompt_len": int(rng.integers(50, 600)),
            "max_tokens": int(rng.integers(5, 60)),
            "tier": "paid" if tiers[i] else "free",
            "priority": 0 if tiers[i] else 1,
            "tbt_slo_s": 0.1 if tiers[i] else 0.5,
        }
        for i in range(n)
    ]
    gaps: dict[str, list[float]] = {"paid": [], "free": []}
    last: dict[str, float] = {}

    def check(core, out):
        ends = [float(x) for x in out.step_ends]  # one per (fast-forwarded) step
        for r in out.sampled:
            prev = last.get(r.request_id)
            for e in ends:
                if prev is not None:
                    gaps[r.tier].append(e - prev)
                prev = e
            last[r.request_id] = ends[-1]

    pol = make_policy("slai", token_budget=256)
    core, _ = drive(pol, reqs, token_budget=256, check=check, kv_tokens=200_000)
    assert core.num_finished == n
    assert pol.deferred_total > 0
    assert np.percentile(gaps["paid"], 99) < np.percentile(gaps["free"], 99)
