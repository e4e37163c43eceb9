"""No registered policy stalls under KV pressure (issue 13: an overloaded or unstable policy is
what a stability study simulates, so every run must complete)."""

from __future__ import annotations

import numpy as np
import pytest
from engine_traces import make_trace

from harness.engine.config import EngineConfig
from harness.engine.costmodel import get_cost_model
from harness.engine.simulate import simulate
from harness.policies import make_policy
from harness.policies.registry import available


def _pressure_trace(n: int = 120, seed: int = 11):
    """Long prompts (up to 3/4 of the KV), long outputs, arriving far faster than served."""
    rng = np.random.default_rng(seed)
    arr = np.cumsum(rng.exponential(1.0 / 200.0, n))
    prompts = rng.integers(200, 1800, n)
    outputs = rng.integers(1, 400, n)
    return make_trace(arr, prompts, outputs)


@pytest.mark.parametrize("policy", available())
def test_every_policy_completes_under_kv_pressure(policy: str) -> None:
    tr = _pressure_trace()
    cfg = EngineConfig(kv_tokens=4096, token_budget=512, max_num_seqs=64, block_size=16)
    res = simulate(tr, make_policy(policy), get_cost_model("a100-llama2-7b"), cfg)
    fits = (tr.df["prompt_len"] + tr.df["output_len"] - 1).to_numpy() <= 4096
    assert (res.status[fits] == 1).all(), f"{policy}: {int((res.status[fits] != 1).sum())} left"
    assert (res.status[~fits] == 2).all()
    assert (res.out_tokens[fits] == tr.df["output_len"].to_numpy()[fits]).all()
    # the pressure is real: the queued prompts are many times the KV cache
    assert tr.df["prompt_len"].sum() > 20 * cfg.capacity_tokens


@pytest.mark.parametrize("policy", available())
def test_every_policy_completes_when_seats_run_out(policy: str) -> None:
    # max_num_seqs far below nested-wait's thresholds: every seat goes to prompts that then
    # pause at a segment boundary (a later quota is never met) while the rest wait for a seat;
    # the threshold rules must flush that, not deadlock (issue 13, 1.5 x overload).
    tr = make_trace([0.01 * i for i in range(200)], [10] * 200, [120] * 200)
    cfg = EngineConfig(kv_tokens=1 << 16, token_budget=512, max_num_seqs=16)
    res = simulate(tr, make_policy(policy), get_cost_model("a100-llama2-7b"), cfg)
    assert res.counters["num_finished"] == 200
