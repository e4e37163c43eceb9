"""The speed-ups change no answer: every registered policy gives token-for-token identical
token times on the fast paths (optimised engine core, vectorised kernel) and on the reference
step (harness.engine.reference_core), on a small KV-pressure trace and a larger trace.

The larger trace has 1,000 requests in CI (the reference step is slow); the issue's 5k-request
check is ``HARNESS_IDENTITY_REQUESTS=5000 pytest -m slow tests/engine/test_identity.py``."""

from __future__ import annotations

import os

import numpy as np
import pytest
from engine_traces import poisson_trace

from harness.engine.config import EngineConfig
from harness.engine.costmodel import get_cost_model
from harness.engine.simulate import simulate
from harness.policies import make_policy
from harness.policies.registry import available


def _identical(a, b) -> None:
    assert a.num_steps == b.num_steps
    assert (a.status == b.status).all()
    assert (a.out_tokens == b.out_tokens).all()
    assert (a.preemptions == b.preemptions).all()
    # same tokens at the same times; times to 1e-9 s (the vectorised kernel sums step
    # durations in another order, a last-bit difference)
    np.testing.assert_allclose(a.first_s, b.first_s, rtol=0, atol=1e-9)
    np.testing.assert_allclose(a.last_s, b.last_s, rtol=0, atol=1e-9)
    oa = np.lexsort((a.chunk_t, a.chunk_req))
    ob = np.lexsort((b.chunk_t, b.chunk_req))
    np.testing.assert_array_equal(a.chunk_req[oa], b.chunk_req[ob])
    np.testing.assert_allclose(a.chunk_t[oa], b.chunk_t[ob], rtol=0, atol=1e-9)


def _check(policy: str, n: int, rate: float, cfg: EngineConfig, seed: int) -> None:
    tr = poisson_trace(n, rate, seed=seed, pmax=1500, omax=400)
    cost = get_cost_model("a100-llama2-7b")
    fast = simulate(tr, make_policy(policy), cost, cfg)
    ref = simulate(tr, make_policy(policy), cost, cfg, kernel="reference")
    _identical(fast, ref)
    assert fast.counters["num_finished"] == n


@pytest.mark.parametrize("policy", available())
def test_identical_under_kv_pressure(policy: str) -> None:
    cfg = EngineConfig(kv_tokens=8192, token_budget=512, max_num_seqs=48, block_size=16)
    _check(policy, 300, 12.0, cfg, seed=7)


@pytest.mark.slow
@pytest.mark.parametrize("policy", available())
def test_identical_on_a_larger_trace(policy: str) -> None:
    cfg = EngineConfig(kv_tokens=60_000, token_budget=2048, max_num_seqs=256, block_size=16)
    n = int(os.environ.get("HARNESS_IDENTITY_REQUESTS", "1000"))
    _check(policy, n, 20.0, cfg, seed=13)
