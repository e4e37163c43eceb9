"""Fitting the context cost model on a real engine's step log (issue 17 fidelity), here a
synthetic vLLM step log made from known coefficients: what ``step_log_samples`` hands the
fitter (periods, ``kv_tokens``, ``prefill_attn``) must give those coefficients back."""

from __future__ import annotations

import numpy as np
import pytest

from adapters.vllm.steplog import step_log_samples
from harness.engine.costmodel import (
    MAX_STALL_SHARE,
    ContextCostModel,
    fit_cost_model,
    loop_overhead_s,
)

TRUE = ContextCostModel(
    base_s=0.6e-3,
    per_token_s=8e-6,
    per_decode_s=25e-6,
    per_kv_s=40e-9,
    per_kv_lo_s=15e-9,
    kv_sat_batch=64,
    per_prefill_attn_s=2e-9,
)
GAP_S = 0.25e-3  # the engine loop's own work between steps


def _log(n: int = 600, seed: int = 2) -> list[dict]:
    rng = np.random.default_rng(seed)
    rows: list[dict] = []
    t = 0.0
    for i in range(n):
        n_pre = int(rng.integers(0, 4)) if i % 3 == 0 else 0
        chunks = rng.integers(16, 400, n_pre)
        ctx = rng.integers(0, 300, n_pre)  # context before each chunk (chunked prefill)
        d = int(rng.integers(0, 96))
        kv = int((chunks + ctx).sum() + rng.integers(50, 600, d).sum() + d)
        attn = float((chunks * (ctx + chunks / 2)).sum())
        p = int(chunks.sum())
        if p + d == 0:
            d = 1
        dur = TRUE.step_time(p, d, kv, prefill_attn=attn) * (1 + rng.normal(0, 0.01))
        rows.append(
            {
                "kind": "step",
                "t_s": t,
                "duration_s": dur,
                "prefill_tokens": p,
                "decode_tokens": d,
                "kv_tokens": kv,
                "prefill_attn": attn,
            }
        )
        t += dur + (GAP_S if i % 50 else 0.2)  # back to back, with an idle gap now and then
    return rows


def test_context_fit_on_a_step_log_recovers_the_coefficients() -> None:
    rows = _log()
    fit = fit_cost_model(step_log_samples(rows), kind="context")
    m = fit.model
    assert isinstance(m, ContextCostModel)
    assert fit.r2 > 0.99
    # the fitted step is the period: the loop's gap lands in the constant
    assert m.base_s == pytest.approx(TRUE.base_s + GAP_S, rel=0.1)
    assert m.per_token_s == pytest.approx(TRUE.per_token_s, rel=0.05)
    assert m.per_decode_s == pytest.approx(TRUE.per_decode_s, rel=0.1)
    assert m.per_prefill_attn_s == pytest.approx(TRUE.per_prefill_attn_s, rel=0.1)
    assert m.per_kv_s == pytest.approx(TRUE.per_kv_s, rel=0.2)
    assert m.per_kv_lo_s == pytest.approx(TRUE.per_kv_lo_s, rel=0.2)
    start = np.array([r["t_s"] for r in rows])
    end = start + np.array([r["duration_s"] for r in rows])
    assert loop_overhead_s(start, end) == pytest.approx(GAP_S)


def test_old_step_logs_without_prefill_attn_still_fit() -> None:
    rows = _log(200)
    for r in rows:
        del r["prefill_attn"]
    fit = fit_cost_model(step_log_samples(rows), kind="context")
    assert fit.model.per_prefill_attn_s == 0.0


def test_trimming_stalls_keeps_the_engine_cost() -> None:
    """Steps where a neighbour took the core (here 4% of them, +5..30 ms) are left out of
    the fit with ``trim_stalls``; plain least squares spreads them over every step.
    More than MAX_STALL_SHARE looking stalled is contention, which the fit keeps."""
    rows = _log()
    rng = np.random.default_rng(7)
    stalled = rng.random(len(rows)) < 0.04
    for r, s in zip(rows, stalled, strict=True):
        if s:
            r["duration_s"] += float(rng.uniform(5e-3, 30e-3))
    samples = step_log_samples(rows)
    plain = fit_cost_model(samples, kind="context")
    robust = fit_cost_model(samples, kind="context", trim_stalls=True)
    assert robust.extra["trimmed"] >= stalled.sum() * 0.9
    assert robust.model.per_token_s == pytest.approx(TRUE.per_token_s, rel=0.05)
    assert robust.model.base_s == pytest.approx(TRUE.base_s + GAP_S, rel=0.15)
    assert plain.model.base_s > 1.4 * (TRUE.base_s + GAP_S)
    # a machine where every third step is slowed: only the worst MAX_STALL_SHARE are left out
    for r in rows[::3]:
        r["duration_s"] += 3e-3
    busy = fit_cost_model(step_log_samples(rows), kind="context", trim_stalls=True)
    assert busy.extra["trimmed"] == int(MAX_STALL_SHARE * len(rows))

    def mean_step(m: ContextCostModel) -> float:
        return float(
            np.mean(
                [
                    m.step_time(r["prefill_tokens"], r["decode_tokens"], r["kv_tokens"],
                                prefill_attn=r["prefill_attn"])
                    for r in rows
                ]
            )
        )  # fmt: skip

    # the contention (1 ms a step on average) stays in the fitted cost
    assert mean_step(busy.model) > mean_step(robust.model) + 0.6e-3
