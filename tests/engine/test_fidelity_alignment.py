"""Issue 17 fidelity: aligning a real engine's step log with the simulator.

A real engine loop (vLLM's ``run_busy_loop``) takes in requests only between steps, so its
receipt stamp includes the wait for the step in flight; the simulator must get the moment the
request became available instead (``engine_ready_times``), and tokens are compared at the
forward's end, not the loop's (``loop_overhead_s``). The "real" engine here is the simulator
itself, so the truth is known exactly.
"""

from __future__ import annotations

import numpy as np
import pytest
from engine_traces import JitteryCost

from harness.engine.config import EngineConfig
from harness.engine.costmodel import AffineCostModel, loop_overhead_s
from harness.engine.simulate import simulate
from harness.policies.registry import make_policy
from harness.server.fidelity import engine_ready_times
from harness.workload import build_trace
from harness.workload.trace import Trace

COST = AffineCostModel(name="t", base_s=2e-3, per_token_s=20e-6, per_decode_s=30e-6)
TRACE_TIERS: list = []
CFG = EngineConfig(block_size=32, num_blocks=255, token_budget=2048, max_num_seqs=64)


def _run(df, cost=COST, policy: str = "vllm"):
    tr = Trace.from_frame(df.reset_index(drop=True), TRACE_TIERS)
    return simulate(tr, make_policy(policy), cost, CFG, fast_forward=False)


def _engine_log(res, ready: np.ndarray, front_end_s: float):
    """What a step-logging host would record for this run: step starts and ends, the API
    stamp (ready - front end) and the receipt (the end of the step in flight, else ready)."""
    s = res.samples
    assert set(s["num_steps"]) == {1}
    end = np.asarray(s["t_s"], dtype=float)
    start = end - np.asarray(s["step_duration_s"], dtype=float)
    k = np.searchsorted(start, ready, side="left") - 1  # a step starting at ``ready`` takes it
    in_flight = (k >= 0) & (end[np.maximum(k, 0)] > ready)
    receipt = np.where(in_flight, end[np.maximum(k, 0)], ready)
    return start, end, ready - front_end_s, receipt


def test_ready_times_undo_the_wait_for_the_step_in_flight() -> None:
    trace = build_trace(
        "synthetic", num_requests=300, rate=40.0, seed=3, input_len=192, output_len=48,
        range_ratio=0.66,
    )  # fmt: skip
    global TRACE_TIERS
    TRACE_TIERS = trace.tiers
    df = trace.df[["request_id", "arrival_s", "prompt_len", "output_len"]].copy()
    df["tier"] = trace.df["tier"]
    truth = _run(df, JitteryCost(COST, 1, 0.8, 1.2))
    ready = df["arrival_s"].to_numpy()
    start, end, api, receipt = _engine_log(truth, ready, front_end_s=3e-3)
    assert (receipt > ready).mean() > 0.3  # many arrivals met a step in flight

    est, info = engine_ready_times(api, receipt, start, end)
    assert est == pytest.approx(ready, abs=1e-9)
    assert info["front_end_ms"] == pytest.approx(3.0)
    assert 0 < info["idle_share"] < 1

    # from the receipt stamps (the old alignment): the simulated engine's steps do not line up
    # with the real ones, so the request waits for a step in flight a second time
    real_old = np.median(truth.first_s - receipt)
    sim_old = np.median(_run(df.assign(arrival_s=receipt)).first_s - receipt)
    # from the ready times: the same origin in both, each engine's own wait
    real_new = np.median(truth.first_s - ready)
    sim_new = np.median(_run(df.assign(arrival_s=est)).first_s - est)
    assert sim_old / real_old - 1 > 0.15  # 6.3 vs 7.8 ms: the issue-17 bias
    assert abs(sim_new / real_new - 1) < 0.07  # 7.7 vs 8.1 ms


def test_ready_times_with_a_jittery_front_end_stay_between_the_bounds() -> None:
    rng = np.random.default_rng(0)
    start = np.arange(100) * 4e-3
    end = start + 3.8e-3
    ready = rng.uniform(0, 0.4, 300)
    k = np.searchsorted(start, ready, side="right") - 1
    receipt = np.where(end[k] > ready, end[k], ready)
    api = ready - 3e-3 - rng.normal(0, 3e-4, len(ready))
    est, _ = engine_ready_times(api, receipt, start, end)
    assert np.all(est <= receipt + 1e-12)
    assert np.abs(est - ready).mean() < np.abs(receipt - ready).mean() / 3


def test_loop_overhead_is_the_median_back_to_back_gap() -> None:
    rng = np.random.default_rng(1)
    dur = rng.uniform(1e-3, 4e-3, 200)
    gap = np.full(200, 0.2e-3)
    gap[::20] = 0.5  # idle: not loop work
    start = np.concatenate([[0.0], np.cumsum(dur + gap)[:-1]])
    assert loop_overhead_s(start, start + dur) == pytest.approx(0.2e-3)
    assert loop_overhead_s(start[:1], start[:1] + dur[:1]) == 0.0


def test_a_logged_ready_stamp_wins_over_the_estimate_and_is_clipped_to_the_receipt() -> None:
    """vLLM's step log carries ``ready_s`` (the adapter's stamp when the input thread handed
    the request to the loop): the ready time is that stamp, clipped to the receipt; a request
    line without one (NaN, an older log) keeps the estimate."""
    start = np.array([0.0, 10e-3, 20e-3])
    end = start + 9.8e-3
    api = np.array([1e-3, 11e-3, 12e-3, 40e-3])
    receipt = np.array([9.8e-3, 19.8e-3, 19.8e-3, 42e-3])  # three met a step; the last: idle
    # the estimate (API stamp + the idle request's 2 ms front end) is 4-6 ms early here
    stamp = np.array([7e-3, 18e-3, 19.9e-3, np.nan])  # the third is 0.1 ms past its receipt
    est, info0 = engine_ready_times(api, receipt, start, end)
    got, info = engine_ready_times(api, receipt, start, end, stamped_ready_s=stamp)
    assert got == pytest.approx([7e-3, 18e-3, 19.8e-3, 42e-3], abs=1e-12)
    assert got[3] == est[3]  # no stamp: the estimate (idle: the receipt)
    assert info["stamped_share"] == pytest.approx(0.75)
    assert info0["stamped_share"] == 0.0 and "estimate_mae_ms" not in info0
    assert info["estimate_mae_ms"] == pytest.approx(np.abs(est[:3] - stamp[:3]).mean() * 1e3)
    assert info["front_end_ms"] == info0["front_end_ms"]  # the estimate's own figures stay


def test_steplog_request_line_carries_the_ready_stamp() -> None:
    """The adapter's request line has ``ready_s`` (null when the request was not stamped)."""
    from types import SimpleNamespace

    from adapters.vllm.steplog import request_row

    view = SimpleNamespace(
        request_id="r", tier="t", arrival_s=1.0, ready_s=1.002, engine_arrival_s=1.005,
        first_token_s=1.01, last_token_s=1.02, num_prompt_tokens=8, num_output_tokens=2,
        num_preemptions=0,
    )  # fmt: skip
    row = request_row(view, 1.03)
    assert row["arrival_s"] <= row["ready_s"] <= row["engine_arrival_s"]
    del view.ready_s
    assert request_row(view, 1.03)["ready_s"] is None


def test_residual_table_groups_by_step_kind_and_cached_context() -> None:
    """Where a fitted model misses (issue 16): a prompt chunk after cached context is told
    from a cold one by ``prefill_attn`` above the chunk's own ``P**2/2``; residuals are real
    minus the model, per group."""
    from harness.server.fidelity import residual_table

    model = AffineCostModel(name="m", base_s=5e-3, per_token_s=10e-6)
    samples = [
        # decode step, exactly on the model
        {"step_duration_s": 5e-3 + 10e-6 * 2, "prefill_tokens": 0, "decode_tokens": 2,
         "kv_used_tokens": 500, "prefill_attn": 0.0},
        # cold 100-token chunk, 1 ms over the model
        {"step_duration_s": 5e-3 + 10e-6 * 100 + 1e-3, "prefill_tokens": 100,
         "decode_tokens": 0, "kv_used_tokens": 100, "prefill_attn": 100 * 50.0},
        # 100-token chunk after 1,000 cached tokens, 4 ms over the model
        {"step_duration_s": 5e-3 + 10e-6 * 101 + 4e-3, "prefill_tokens": 100,
         "decode_tokens": 1, "kv_used_tokens": 1600, "prefill_attn": 100 * (1000 + 50.0)},
    ]  # fmt: skip
    rows = {
        (r["kind"], r["context"]): r for r in residual_table(samples, model, by=("kind", "context"))
    }
    assert set(rows) == {("decode", "-"), ("prefill", "none"), ("mixed", "after")}
    assert rows[("decode", "-")]["res_ms_median"] == pytest.approx(0.0, abs=1e-9)
    assert rows[("prefill", "none")]["res_ms_median"] == pytest.approx(1.0)
    assert rows[("mixed", "after")]["res_ms_mean"] == pytest.approx(4.0)
    assert rows[("mixed", "after")]["n"] == 1
