"""Cost models: presets' arithmetic, files, overrides, vectorised form, and the fitter."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from harness.engine.costmodel import (
    PRESETS,
    CostModelError,
    JitteredCostModel,
    fit_cost_model,
    fit_step_jitter,
    get_cost_model,
)


def test_a100_llama2_preset_values() -> None:
    m = get_cost_model("a100-llama2-7b")
    # 2048 prefill tokens: 2.20 ms + 2048 * 64.2 us = 133.7 ms (anchors §5.2 lists 133.4 ms)
    assert m.step_time(2048, 0, 0) == pytest.approx(2.20e-3 + 2048 * 64.2e-6)
    # 8 decodes with 1000 KV tokens read: floor 9.4 ms + 1000 * 0.32 us (halfway in log2 from
    # 0.37 us at one decode to 0.27 at 64, Vidur's attention profile, issue 19)
    assert m.step_time(0, 8, 1000) == pytest.approx(9.4e-3 + 1000 * 0.32e-6)
    # one 4,096-token prompt with its causal attention work 4096 * 2048: Vidur's 343 ms
    assert m.step_time(4096, 0, 4096, prefill_attn=4096 * 2048.0) == pytest.approx(0.343, abs=1e-3)


def test_staircase_matches_v3_worked_numbers() -> None:
    m = get_cost_model("staircase")
    # seed-stability.md §1.3: t(512) = 153.16 ms, t(128) = 46.75 ms
    assert m.step_time(512, 0, 0) == pytest.approx(0.15316)
    assert m.step_time(100, 28, 0) == pytest.approx(0.04675)
    assert m.step_time(129, 0, 0) == pytest.approx(0.01128 + 2 * 0.03547)


def test_linear_is_wait_eq1() -> None:
    m = get_cost_model("linear:base_s=0.5,per_kv_s=0.01")
    # tau = d0 + d1 * (prefill tokens + KV of decodes) with kv_tokens carrying both
    assert m.step_time(10, 2, 40) == pytest.approx(0.5 + 0.01 * 40)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_vectorised_equals_scalar(name: str) -> None:
    m = get_cost_model(name)
    p = np.array([0, 10, 300, 0, 2048])
    d = np.array([1, 5, 0, 256, 10])
    k = np.array([100, 2000, 300, 50000, 9000])
    vec = m.step_times(p, d, k)
    assert vec == pytest.approx(
        [m.step_time(int(a), int(b), int(c)) for a, b, c in zip(p, d, k, strict=True)]
    )
    assert m.to_dict()["kind"] in ("affine", "context", "staircase", "piecewise")


def test_user_files_yaml_and_json(tmp_path) -> None:
    y = tmp_path / "mine.yaml"
    y.write_text("kind: staircase\nc_s: 0.01\na_s: 0.02\nb0: 64\n")
    m = get_cost_model(str(y))
    assert m.step_time(65, 0, 0) == pytest.approx(0.01 + 2 * 0.02)
    j = tmp_path / "mine.json"
    j.write_text(json.dumps({"kind": "affine", "base_s": 0.001, "per_token_s": 1e-5}))
    assert get_cost_model(str(j)).step_time(100, 0, 0) == pytest.approx(0.002)


@pytest.mark.parametrize(
    "spec",
    ["nope", "a100-llama2-7b:bogus=1", "a100-llama2-7b:base_s=x", "linear:base_s=-1", "x.yaml"],
)
def test_bad_specs_raise_one_clear_error(spec: str) -> None:
    with pytest.raises(CostModelError):
        get_cost_model(spec)


def test_fit_recovers_known_coefficients() -> None:
    rng = np.random.default_rng(1)
    n = 400
    p = rng.integers(0, 1500, n)
    d = rng.integers(0, 200, n)
    kv = rng.integers(0, 60000, n)
    true = get_cost_model("a100-llama2-7b:floor_s=0,per_decode_s=1e-5")
    t = true.step_times(p, d, kv) * (1 + rng.normal(0, 0.005, n))
    df = pd.DataFrame(
        {
            "source": "engine",
            "num_steps": 1,
            "step_duration_s": t,
            "prefill_tokens": p,
            "decode_tokens": d,
            "kv_used_tokens": kv,
        }
    )
    df["prefill_attn"] = p * (p / 2.0)  # one prompt per step, no context before it
    t = true.step_times(p, d, kv) + true.per_prefill_attn_s * df["prefill_attn"].to_numpy()
    df["step_duration_s"] = t * (1 + rng.normal(0, 0.005, n))
    fit = fit_cost_model(df, kind="context")
    assert fit.r2 > 0.99
    assert fit.model.per_token_s == pytest.approx(64.2e-6, rel=0.05)
    assert fit.model.per_kv_s == pytest.approx(0.37e-6, rel=0.1)
    assert fit.model.per_kv_lo_s == pytest.approx(0.27e-6, rel=0.1)
    assert fit.model.per_prefill_attn_s == pytest.approx(9.10e-9, rel=0.1)
    # the affine fit sees one KV rate, between the two ends
    flat = fit_cost_model(df).model
    assert 0.27e-6 < flat.per_kv_s < 0.37e-6
    with pytest.raises(CostModelError):
        fit_cost_model(df.head(2))


def test_context_model_terms_and_interface() -> None:
    """Issue 19: a batch-dependent KV-read rate and a prefill-attention term."""
    from harness.engine.costmodel import ContextCostModel

    m = get_cost_model(
        {
            "kind": "context",
            "base_s": 2e-3,
            "per_token_s": 50e-6,
            "per_kv_s": 0.4e-6,
            "per_kv_lo_s": 0.2e-6,
            "kv_sat_batch": 64,
            "per_prefill_attn_s": 1e-8,
        }
    )
    assert isinstance(m, ContextCostModel) and m.uses_prefill_attn
    assert m.kv_rate(1) == pytest.approx(0.4e-6)
    assert m.kv_rate(8) == pytest.approx(0.3e-6)  # halfway in log2 between 1 and 64
    assert m.kv_rate(256) == pytest.approx(0.2e-6)
    # prefill-only step: 1000 prompt tokens, no context before -> A = 1000 * 500
    t = m.step_time(1000, 0, 1000, prefill_attn=1000 * 500.0)
    assert t == pytest.approx(2e-3 + 50e-6 * 1000 + 0.4e-6 * 1000 + 1e-8 * 500_000)
    # decode-only vectorised path agrees with the scalar one
    d = np.array([1, 8, 64, 200])
    kv = d * 700
    vec = m.step_times(np.zeros(4), d, kv)
    assert vec == pytest.approx(
        [m.step_time(0, int(x), int(k)) for x, k in zip(d, kv, strict=True)]
    )
    # the affine model takes and ignores the keyword
    lin = get_cost_model("linear")
    assert not lin.uses_prefill_attn
    assert lin.step_time(10, 2, 300, prefill_attn=1e9) == lin.step_time(10, 2, 300)


def test_prefill_step_cost_fitted_and_charged_once_per_prefill_step() -> None:
    """Issue 17/16: a step running any prompt chunk pays the prefill path's fixed cost once;
    the context fit recovers it, and the presets (no such term in Vidur's profiles) keep 0."""
    true = get_cost_model(
        {
            "kind": "context",
            "base_s": 5e-3,
            "per_token_s": 25e-6,
            "per_decode_s": 0.3e-3,
            "per_kv_s": 0.5e-6,
            "per_kv_lo_s": 0.5e-6,
            "per_prefill_step_s": 4.5e-3,
        }
    )
    assert true.step_time(200, 2, 600) - true.step_time(0, 2, 600) == pytest.approx(
        4.5e-3 + 25e-6 * 200
    )
    assert true.step_times(np.array([0, 200]), np.array([2, 2]), np.array([600, 600])) == (
        pytest.approx([true.step_time(0, 2, 600), true.step_time(200, 2, 600)])
    )
    rng = np.random.default_rng(3)
    n = 600
    p = np.where(rng.random(n) < 0.15, rng.integers(50, 400, n), 0)  # few prefill steps
    d = rng.integers(0, 8, n)
    kv = rng.integers(100, 3000, n)
    attn = p * (p / 2.0)
    t = true.step_times(p, d, kv) * (1 + rng.normal(0, 0.01, n))
    df = pd.DataFrame(
        {
            "source": "engine",
            "step_duration_s": t,
            "prefill_tokens": p,
            "decode_tokens": d,
            "kv_used_tokens": kv,
            "prefill_attn": attn,
        }
    )
    fit = fit_cost_model(df, kind="context")
    assert fit.model.per_prefill_step_s == pytest.approx(4.5e-3, rel=0.1)
    assert fit.model.per_token_s == pytest.approx(25e-6, rel=0.15)
    # all steps prefill-bearing: the indicator is base_s again, so it stays 0
    only = fit_cost_model(df[df["prefill_tokens"] > 0], kind="context")
    assert only.model.per_prefill_step_s == 0.0
    for m in PRESETS.values():
        assert getattr(m, "per_prefill_step_s", 0.0) == 0.0


def _steps(rng: np.random.Generator, model, n: int, prefill_share: float, factor) -> pd.DataFrame:
    """Measured steps: ``model``'s time times ``factor(prompt, size)`` per step."""
    prompt = rng.random(n) < prefill_share
    p = np.where(prompt, rng.integers(50, 400, n), 0)
    d = rng.integers(1, 32, n)
    kv = d * rng.integers(100, 600, n)
    t = np.array(
        [model.step_time(int(a), int(b), int(c)) for a, b, c in zip(p, d, kv, strict=True)]
    )
    return pd.DataFrame(
        {
            "source": "engine",
            "step_duration_s": t * factor(prompt, n),
            "prefill_tokens": p,
            "decode_tokens": d,
            "kv_used_tokens": kv,
        }
    )


def test_step_jitter_draws_the_measured_spread_per_step_class() -> None:
    """Prompt-bearing steps scatter 0.9-1.5x (right-skewed), decode-only ones 0.95-1.05x:
    the jittered model's draws at one composition have each class's quantiles."""
    rng = np.random.default_rng(5)
    base = get_cost_model("a100-llama2-7b:per_prefill_attn_s=0")

    def factor(prompt: np.ndarray, n: int) -> np.ndarray:
        return np.where(prompt, 0.9 + 0.6 * rng.random(n) ** 3, rng.uniform(0.95, 1.05, n))

    df = _steps(rng, base, 20000, 0.3, factor)
    jit = fit_step_jitter(base, df, seed=3)
    assert isinstance(jit, JitteredCostModel) and jit.uses_prefill_attn
    pre = np.array([jit.step_time(200, 4, 2000) for _ in range(20000)])
    dec = np.array([jit.step_time(0, 4, 2000) for _ in range(20000)])
    pre /= base.step_time(200, 4, 2000)
    dec /= base.step_time(0, 4, 2000)
    # 0.9 + 0.6 u^3: median 0.9 + 0.6/8 = 0.975, 99th percentile ~1.49
    assert np.median(pre) == pytest.approx(0.975, abs=0.01)
    assert jit.factor_at(True, 0.5) == pytest.approx(0.975, abs=0.01)
    assert jit.factor_at(False, 0.0) >= 0.95 - 1e-9
    assert np.percentile(pre, 99) == pytest.approx(0.9 + 0.6 * 0.99**3, abs=0.02)
    assert dec.min() >= 0.95 - 1e-9 and dec.max() <= 1.05 + 1e-9
    assert np.median(dec) == pytest.approx(1.0, abs=0.005)
    # the vector form draws per element from the same classes
    v = jit.step_times(np.array([0, 200] * 5000), np.full(10000, 4), np.full(10000, 2000))
    assert np.median(v[1::2]) / base.step_time(200, 4, 2000) == pytest.approx(0.975, abs=0.015)
    assert v[::2].max() <= base.step_time(0, 4, 2000) * 1.05 + 1e-12


def test_step_jitter_is_seeded_and_survives_a_file(tmp_path) -> None:
    rng = np.random.default_rng(1)
    base = get_cost_model("h100-llama2-7b")
    df = _steps(rng, base, 2000, 0.2, lambda prompt, n: rng.lognormal(0.0, 0.2, n))
    jit = fit_step_jitter(base, df, seed=7)
    draws = [jit.step_time(100, 2, 500, 5000.0) for _ in range(50)]
    again = jit.reseeded(7)
    assert [again.step_time(100, 2, 500, 5000.0) for _ in range(50)] == draws
    other = jit.reseeded(8)
    assert [other.step_time(100, 2, 500, 5000.0) for _ in range(50)] != draws
    path = tmp_path / "fitted.json"
    path.write_text(json.dumps(jit.to_dict()))
    loaded = get_cost_model(str(path))
    assert isinstance(loaded, JitteredCostModel) and loaded.base == base
    assert [loaded.step_time(100, 2, 500, 5000.0) for _ in range(50)] == draws
    broken = jit.to_dict()
    del broken["base"]
    (tmp_path / "broken.json").write_text(json.dumps(broken))
    with pytest.raises(CostModelError, match="jittered"):
        get_cost_model(str(tmp_path / "broken.json"))
    unsorted = jit.to_dict() | {"decode_ratios": [1.2, 0.9]}
    (tmp_path / "unsorted.json").write_text(json.dumps(unsorted))
    with pytest.raises(CostModelError, match="ascending"):
        get_cost_model(str(tmp_path / "unsorted.json"))


def test_a_simulation_with_a_jittered_model_is_reproducible_per_seed() -> None:
    """Same model and seed, same token times; another seed, others; the lone requests' first
    tokens land around the base model's time times the measured median factor."""
    from harness.engine.config import EngineConfig
    from harness.engine.simulate import simulate
    from harness.policies.registry import make_policy
    from harness.workload import build_trace

    base = get_cost_model("h100-llama2-7b")
    q = np.linspace(0.8, 1.6, 401)  # median factor 1.2
    jit = JitteredCostModel(base, q, q, seed=0)
    trace = build_trace(
        "synthetic", num_requests=300, rate=0.2, seed=4, input_len=256, output_len=32, quiet=True
    )
    cfg = EngineConfig(block_size=16, num_blocks=4096, token_budget=2048, max_num_seqs=64)

    def run(model) -> np.ndarray:
        res = simulate(trace, make_policy("vllm"), model, cfg)
        assert (res.status == 1).all()
        return res.first_s - trace.df["arrival_s"].to_numpy()

    a, b, c = run(jit.reseeded(0)), run(jit.reseeded(0)), run(jit.reseeded(1))
    flat = run(base)
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    assert np.median(a) / np.median(flat) == pytest.approx(1.2, abs=0.05)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_decode_run_ends_are_the_vector_sums_in_scalars_too(name: str) -> None:
    # a fast-forward's step ends (core.decode_run_ends) are summed in scalars when the run is
    # short (k_max <= 32, or until within 32 of its first step) and by step_times + cumsum
    # otherwise: either way the floats the vector sum gives, cut after the first step that
    # starts at or after until
    from harness.engine.core import decode_run_ends

    m = get_cost_model(name)
    rng = np.random.default_rng(1)
    for _ in range(300):
        k_max = int(rng.choice([2, 5, 32, 33, 80, 400, 3000]))
        n = int(rng.integers(1, 300))
        kv = int(rng.integers(0, 2_000_000))
        now = float(rng.uniform(0, 5000))
        until = now + float(rng.choice([0.0, 1e-4, 0.05, 0.3, 2.0, 40.0, np.inf]))
        i = np.arange(k_max)
        full = now + np.cumsum(m.step_times(np.zeros(k_max), np.full(k_max, n), kv + i * n))
        k = 1 + int(np.searchsorted(full[:-1], until, side="left"))
        want = full[: max(1, min(k, k_max))]
        got = decode_run_ends(m, now, k_max, n, kv, until)
        assert np.array_equal(got, want), (k_max, n, kv, now, until)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_decode_run_ends_stop_at_until_exactly_on_long_runs(name: str) -> None:
    # a long run sums only the steps that can start before until (affine models: at most
    # (until - now) / first + 1 of them): with until on, just before and just after a step's
    # end, and the steps' growth tiny or large, the ends are still the full vector sum's cut
    from harness.engine.core import decode_run_ends

    m = get_cost_model(name)
    rng = np.random.default_rng(7)
    for _ in range(200):
        k_max = int(rng.choice([100, 1000, 5000]))
        n = int(rng.choice([1, 2, 64, 256]))
        kv = int(rng.integers(0, 3_000_000))
        now = float(rng.uniform(0, 5000))
        i = np.arange(k_max)
        full = now + np.cumsum(m.step_times(np.zeros(k_max), np.full(k_max, n), kv + i * n))
        j = int(rng.integers(0, k_max))
        for until in (full[j], np.nextafter(full[j], -np.inf), np.nextafter(full[j], np.inf)):
            k = 1 + int(np.searchsorted(full[:-1], until, side="left"))
            want = full[: max(1, min(k, k_max))]
            got = decode_run_ends(m, now, k_max, n, kv, float(until))
            assert np.array_equal(got, want), (k_max, n, kv, now, until)


@pytest.mark.parametrize(
    "name", sorted(n for n, m in PRESETS.items() if hasattr(m, "decode_affine"))
)
def test_decode_affine_is_step_time_bit_for_bit(name: str) -> None:
    # the fast-forward sums decode steps as fixed + rate * kv (core.decode_run_ends): the
    # same floats as step_time, or fast-forwarded runs would drift from the reference step
    # (models without decode_affine, staircase and piecewise, are summed by step_time)
    m = get_cost_model(name)
    affine = m.decode_affine
    kw = {"prefill_attn": 0.0} if getattr(m, "uses_prefill_attn", False) else {}
    rng = np.random.default_rng(0)
    for n in [1, 2, 3, 7, 64, 100, 255, 256, 1000, *rng.integers(1, 2048, 50).tolist()]:
        fixed, rate = affine(int(n))
        for kv in [0, 1, 15, 4096, *rng.integers(0, 4_000_000, 40).tolist()]:
            assert fixed + rate * int(kv) == m.step_time(0, int(n), int(kv), **kw), (n, kv)
