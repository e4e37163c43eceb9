"""Fluid-model helpers against seed-wait.md §2 and its Appendix C worked checks."""

from __future__ import annotations

import math

import numpy as np
import pytest

from harness.engine.costmodel import get_cost_model
from harness.policies.fluid import (
    FluidType,
    critical_rate,
    equilibrium,
    fit_linear_step,
    fluid_verdict,
    is_unstable,
    memory_work_rate,
    token_capacity_rate,
    types_from_lengths,
)
from harness.policies.thresholds import wait_memory, wait_thresholds

PROP3 = [FluidType(1, 1, 1.0), FluidType(1, 2, 1.0)]  # seed-wait.md App. C


def test_prop3_instance_numbers():
    # A = 1·2·1.5 + 1·3·2 = 9; with d0/(1-9 d1) = 1: M* = 9, ΔT* = 1.
    eq = equilibrium(PROP3, d0=0.55, d1=0.05)
    assert memory_work_rate(PROP3) == pytest.approx(9.0)
    assert eq.stable
    assert eq.step_s == pytest.approx(1.0)
    assert eq.memory_tokens == pytest.approx(9.0)
    assert eq.per_stage == pytest.approx((1.0, 1.0))
    assert eq.active == pytest.approx((2.0, 3.0))  # n*_1 = 2, n*_2 = 3
    th = wait_thresholds(PROP3, 0.55, 0.05, slack=0.0)
    assert th.thresholds == [1, 1]
    assert th.memory_tokens == pytest.approx(9.0)
    assert th.feasible


def test_fluid_consistency_sum_over_stages():
    types = [FluidType(20, 100, 6.0), FluidType(20, 200, 4.0), FluidType(20, 300, 2.0)]
    d0, d1 = 0.02, 1e-6
    eq = equilibrium(types, d0, d1)
    assert eq.step_s == pytest.approx(d0 / (1 - d1 * eq.A))
    assert eq.memory_tokens == pytest.approx(eq.A * eq.step_s)
    # Σ_j (n*_j/(l'_j+1)) Σ_{k=0}^{l'_j} (l_j + k) = M*
    direct = sum(
        ps * sum(t.prompt_len + k for k in range(int(t.output_len) + 1))
        for ps, t in zip(eq.per_stage, types, strict=True)
    )
    assert direct == pytest.approx(eq.memory_tokens)
    assert eq.throughput_decode == pytest.approx(6 * 100 + 4 * 200 + 2 * 300)
    assert eq.throughput_all == pytest.approx(6 * 101 + 4 * 201 + 2 * 301)


def test_example2_single_type():
    # l = 1, l' = 1, λ = 4: A = 12; pick d1 = 1/24, d0 = 0.5 -> ΔT* = 1, M* = 12, 4 per stage.
    eq = equilibrium([FluidType(1, 1, 4.0)], d0=0.5, d1=1 / 24)
    assert eq.step_s == pytest.approx(1.0)
    assert eq.memory_tokens == pytest.approx(12.0)
    assert eq.per_stage == pytest.approx((4.0,))
    assert eq.throughput_decode == pytest.approx(4.0)


def test_instability_condition_and_critical_rate():
    t = [FluidType(10, 10, 1000.0)]
    a = memory_work_rate(t)  # 1000 · 11 · 15
    assert a == pytest.approx(165_000)
    assert is_unstable(t, d1=1 / a)
    assert not is_unstable(t, d1=0.99 / a)
    assert not equilibrium(t, 0.01, 1 / a).stable
    crit = critical_rate([10], [10], d1=1e-6)
    assert crit == pytest.approx(1 / (1e-6 * 165))


def test_verdict_messages():
    p, o = np.array([100, 200]), np.array([50, 150])
    crit = critical_rate(p, o, 1e-5)
    bad = fluid_verdict(p, o, rate=crit * 1.2, d0=0.01, d1=1e-5)
    assert not bad["stable"]
    assert "unstable for any policy" in bad["message"]
    ok = fluid_verdict(p, o, rate=crit * 0.5, d0=0.01, d1=1e-5)
    assert ok["stable"] and ok["load"] == pytest.approx(0.5)
    tight = fluid_verdict(p, o, rate=crit * 0.5, d0=0.01, d1=1e-5, capacity_tokens=10)
    assert "evictions" in tight["message"]
    assert tight["memory_limited_rate"] < crit * 0.5


def test_types_from_lengths_binning():
    p = np.array([10, 20, 30, 40])
    o = np.array([5, 50, 60, 400])
    types = types_from_lengths(p, o, rate=8.0, edges=[50, 100, 500])
    assert [t.output_len for t in types] == [50, 100, 500]
    assert [t.rate for t in types] == pytest.approx([4.0, 2.0, 2.0])
    assert types[0].prompt_len == pytest.approx(15.0)


def test_fit_linear_step_recovers_linear_preset():
    d0, d1 = fit_linear_step(get_cost_model("linear"))
    assert d0 == pytest.approx(10e-3, rel=1e-6)
    assert d1 == pytest.approx(0.0115e-3, rel=1e-6)


def test_token_capacity_rate_staircase():
    # seed-stability.md App. A.2: (100, 100), b = 512, t(512) = 153.16 ms -> 16.71 req/s.
    cm = get_cost_model("staircase")
    tb = cm.step_time(512, 0, 0)
    assert tb == pytest.approx(0.15316, rel=1e-4)
    assert token_capacity_rate(100, 100, 512, tb) == pytest.approx(16.715, rel=1e-3)


def test_wait_memory_formula():
    types = [FluidType(10, 10, 1.0), FluidType(10, 20, 1.0)]
    assert wait_memory(types, [3, 2]) == pytest.approx(3 * 11 * 15 + 2 * 21 * 20)
    assert math.isfinite(wait_thresholds(types, 0.01, 1e-4).step_s)


def test_thresholds_for_trace_end_to_end():
    import pandas as pd

    from harness.policies.thresholds import thresholds_for_trace
    from harness.workload.tiers import parse_tiers
    from harness.workload.trace import Trace

    rng = np.random.default_rng(0)
    n = 400
    df = pd.DataFrame(
        {
            "request_id": [f"r{i}" for i in range(n)],
            "arrival_s": np.cumsum(rng.exponential(1 / 1.0, n)),
            "prompt_len": rng.integers(10, 200, n),
            "output_len": rng.integers(1, 300, n),
            "tier": "d",
        }
    )
    trace = Trace.from_frame(df, parse_tiers("d:1.0"))
    w = thresholds_for_trace(trace, "linear", kind="wait", num_types=4)
    assert len(w.output_lens) == len(w.thresholds) <= 4
    assert w.output_lens[-1] == int(df.output_len.max())
    assert w.feasible  # 1 req/s is fluid-stable on the linear preset
    nst = thresholds_for_trace(trace, "linear", kind="nested", edges=[50, 150, 300])
    assert nst.edges == [50, 150, 300]
    assert nst.thresholds[0] >= nst.thresholds[-1]
