"""Bundled length profiles reproduce the real samples (KS <= 0.05, Spearman within 0.05)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy.stats import ks_2samp, spearmanr

from harness.shared_data import shared_data_dir
from harness.workload.profile import available_profiles, fit_profile, load_profile
from harness.workload.trace import TraceError

DATA = shared_data_dir()
FILES = {
    "lmsys": "lmsys_sample_lengths.csv",
    "sharegpt": "sharegpt4_lengths_llama2.csv",
    "azure-conv": "azure_conv_2023.csv",
}


def test_bundled_profiles_exist() -> None:
    assert set(FILES) <= set(available_profiles())


@pytest.mark.parametrize("name", sorted(FILES))
def test_profile_matches_real_sample(name: str) -> None:
    path = DATA / FILES[name]
    if not path.exists():
        pytest.skip(f"{path} not present (real length samples live outside the repo)")
    real = pd.read_csv(path)
    real = real[(real["num_prefill_tokens"] >= 1) & (real["num_decode_tokens"] >= 1)]
    p_real = real["num_prefill_tokens"].to_numpy()
    o_real = real["num_decode_tokens"].to_numpy()
    prof = load_profile(name)
    p, o = prof.sample(len(real), np.random.default_rng(123))
    ks_p = ks_2samp(p, p_real).statistic
    ks_o = ks_2samp(o, o_real).statistic
    rho_real = spearmanr(p_real, o_real).statistic
    rho = spearmanr(p, o).statistic
    print(
        f"{name}: KS prompt={ks_p:.4f} output={ks_o:.4f} spearman real={rho_real:.3f} "
        f"profile={rho:.3f}"
    )
    assert ks_p <= 0.05 and ks_o <= 0.05
    assert abs(rho - rho_real) <= 0.05
    if "arrived_at" in real.columns:
        gaps_real = np.diff(np.sort(pd.read_csv(path)["arrived_at"].to_numpy()))
        gaps = prof.sample_gaps(len(gaps_real), np.random.default_rng(5))
        assert ks_2samp(gaps, gaps_real).statistic <= 0.05


def test_fit_recovers_nonlinear_dependence() -> None:
    # Output depends on prompt non-monotonically; the rank copula keeps the joint shape.
    rng = np.random.default_rng(0)
    p = rng.lognormal(4, 1, 20_000).round() + 1
    o = (np.where(p > np.median(p), 200, 20) * rng.lognormal(0, 0.3, p.size)).round() + 1
    prof = fit_profile(p, o, name="t", origin="test")
    sp, so = prof.sample(20_000, np.random.default_rng(1))
    assert abs(spearmanr(sp, so).statistic - spearmanr(p, o).statistic) < 0.05
    hi = sp > np.median(sp)
    assert np.median(so[hi]) > 5 * np.median(so[~hi])


def test_profile_round_trip_and_errors(tmp_path: Path) -> None:
    import json

    prof = load_profile("lmsys")
    f = tmp_path / "p.json"
    f.write_text(json.dumps(prof.to_json()))
    again = load_profile(str(f))
    rng1, rng2 = np.random.default_rng(0), np.random.default_rng(0)
    assert all(
        np.array_equal(a, b)
        for a, b in zip(prof.sample(50, rng1), again.sample(50, rng2), strict=True)
    )
    with pytest.raises(TraceError, match="no length profile"):
        load_profile("nope")
    with pytest.raises(TraceError, match="has no inter-arrival"):
        prof.sample_gaps(3, np.random.default_rng(0))
