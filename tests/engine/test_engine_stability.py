"""The stability result of seed-stability.md, reproduced on its own parameters.

Setup (seed-stability.md §2.3, §2.5, Appendix A.1/B): v3 staircase t(beta) = 11.28 ms +
35.47 ms * ceil(beta/128), token budget b = 512, no memory limit and no batch-size cap (REC 11,
REC 5), deterministic sizes v_p = 129 prefill tokens and v_d = 112 decode iterations (REC 4:
paper-faithful, so output_len = v_d + 1 because the prefill emits the first token), Poisson
arrivals at rho = 0.9 of lambda* = (b/t_b)/(v_p+v_d) = 13.87 req/s.

Expected: the work-conserving Sarathi and Orca (and chunked-prefill vLLM v1, §2.3 table) keep a
bounded backlog; vanilla vLLM (``vllm-v0``)
and FasterTransformer grow without bound; FasterTransformer completes requests at the closed-form
saturation rate mu_FT = n / (t(n v_p) + v_d t(n)), n = floor(b/v_p) = 3, i.e. 0.557 req/s.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from engine_traces import make_trace

from harness.engine.config import EngineConfig
from harness.engine.costmodel import get_cost_model
from harness.engine.simulate import simulate
from harness.policies import make_policy

B = 512
VP, VD = 129, 112
HORIZON_S = 300.0


def _t(beta: int) -> float:
    return 0.01128 + 0.03547 * math.ceil(beta / 128)


LAMBDA_STAR = (B / _t(B)) / (VP + VD)
N_FT = B // VP
MU_FT = N_FT / (_t(N_FT * VP) + VD * _t(N_FT))


def _backlog_slope(res) -> tuple[float, float]:
    """(OLS slope of requests in system over the second half, req/s; last value)."""
    t = np.asarray(res.samples["t_s"])
    q = np.asarray(res.samples["num_waiting"]) + np.asarray(res.samples["num_running"])
    half = t >= HORIZON_S / 2
    slope = float(np.polyfit(t[half], q[half], 1)[0])
    return slope, float(q[-1])


@pytest.fixture(scope="module")
def runs() -> dict[str, object]:
    rate = 0.9 * LAMBDA_STAR
    rng = np.random.default_rng(11)
    n = int(rate * HORIZON_S * 1.1)
    arr = np.cumsum(rng.exponential(1.0 / rate, n))
    arr = arr[arr < HORIZON_S]
    trace = make_trace(arr, np.full(len(arr), VP), np.full(len(arr), VD + 1))
    cfg = EngineConfig(kv_tokens=1 << 26, token_budget=B, max_num_seqs=1 << 20)
    cost = get_cost_model("staircase")
    return {
        name: simulate(trace, make_policy(name), cost, cfg, stop_at_s=HORIZON_S)
        for name in ("sarathi", "orca", "vllm", "vllm-v0", "fastertransformer")
    } | {"rate": rate}


def test_closed_form_constants() -> None:
    # seed-stability.md §2.5 worked numbers
    lam, mu = LAMBDA_STAR, MU_FT
    assert lam == pytest.approx(13.87, abs=0.01)
    assert mu == pytest.approx(0.557, abs=0.001)


@pytest.mark.parametrize("policy", ["sarathi", "orca", "vllm"])
def test_work_conserving_policies_stay_bounded(runs, policy: str) -> None:
    slope, last = _backlog_slope(runs[policy])
    rate = runs["rate"]
    assert abs(slope) < 0.02 * rate, (policy, slope)
    assert last < 400, (policy, last)  # Appendix B: ~171 in system at 300 s for Sarathi
    done = runs[policy].counters["num_finished"]
    assert done > 0.9 * rate * HORIZON_S


def test_vanilla_vllm_grows_without_bound(runs) -> None:
    slope, last = _backlog_slope(runs["vllm-v0"])
    # Appendix B: 0.42 tokens/ms = ~1.7 req/s of 241-token requests at rho = 0.9
    assert slope > 0.5, slope
    s_slope, s_last = _backlog_slope(runs["sarathi"])
    assert last > 3 * s_last


def test_fastertransformer_saturates_at_mu_ft(runs) -> None:
    res = runs["fastertransformer"]
    done = res.counters["num_finished"]
    assert done == pytest.approx(MU_FT * HORIZON_S, rel=0.1)  # ~167 (Appendix B: 163)
    slope, _ = _backlog_slope(res)
    assert slope == pytest.approx(runs["rate"] - MU_FT, rel=0.15)


@pytest.mark.parametrize("policy", ["sarathi", "orca"])
def test_above_capacity_backlog_grows_at_fluid_rate(policy: str) -> None:
    """Thm 1(b) / Appendix A.2: at 1.1 lambda* with (v_p, v_d) = (100, 100), the token backlog of
    a work-conserving policy grows at Lambda - C = 0.334 tokens/ms (3rd-party 0.338 +- 0.046;
    Appendix B own check 0.338)."""
    vp, vd, horizon = 100, 100, 120.0
    cap_tok = B / _t(B)  # tokens/s
    rate = 1.1 * cap_tok / (vp + vd)
    rng = np.random.default_rng(3)
    arr = np.cumsum(rng.exponential(1.0 / rate, int(rate * horizon * 1.2)))
    arr = arr[arr < horizon]
    trace = make_trace(arr, np.full(len(arr), vp), np.full(len(arr), vd + 1))
    cfg = EngineConfig(kv_tokens=1 << 26, token_budget=B, max_num_seqs=1 << 20)
    res = simulate(trace, make_policy(policy), get_cost_model("staircase"), cfg, stop_at_s=horizon)
    t = np.asarray(res.samples["t_s"])
    served = np.cumsum(np.asarray(res.samples["prefill_tokens"]) + res.samples["decode_tokens"])
    arrived = (vp + vd) * np.searchsorted(arr, t, side="right")
    backlog = arrived - served
    half = t >= horizon / 2
    slope_tok_ms = float(np.polyfit(t[half], backlog[half], 1)[0]) / 1000.0
    assert (rate * (vp + vd) - cap_tok) / 1000.0 == pytest.approx(0.334, abs=0.002)
    # oracle on the realised arrivals of the window: Lambda_hat - C (one seed's Poisson noise)
    lam_hat = float(np.polyfit(t[half], arrived[half], 1)[0])
    fluid = (lam_hat - cap_tok) / 1000.0
    assert slope_tok_ms == pytest.approx(fluid, rel=0.1), (slope_tok_ms, fluid)
