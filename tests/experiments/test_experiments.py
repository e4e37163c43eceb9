"""Paper reproductions: measuring helpers (fast) and the small experiments themselves (slow)."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from harness.cli.main import app
from harness.experiments import run_experiment
from harness.experiments.common import crossing, measure
from harness.experiments.slai import capacity
from harness.experiments.stability import backlog_slope
from harness.shared_data import shared_data_dir


def real_sample(name: str) -> pytest.MarkDecorator:
    """Skip a test whose figures were measured on the real length sample ``name`` when the
    shared data folder lacks it: without it the experiment runs on rows drawn from the
    bundled profile (common.load_lengths), whose figures differ (that path has tests of its
    own: test_experiment_cli_runs_without_the_shared_data)."""
    path = shared_data_dir() / name
    return pytest.mark.skipif(
        not path.is_file(), reason=f"{path} not present (real length samples live outside the repo)"
    )


def _requests(rows):
    return pd.DataFrame(
        rows,
        columns=[
            "req",
            "tier",
            "arrival_s",
            "first_chunk_s",
            "last_chunk_s",
            "output_tokens",
            "success",
        ],
    )


def test_measure_arithmetic():
    req = _requests(
        [
            (0, "paid", 0.0, 1.0, 3.0, 3, True),
            (1, "free", 1.0, 1.5, 2.5, 2, True),
            (2, "free", 2.0, np.nan, np.nan, 0, False),
        ]
    )
    chunks = pd.DataFrame({"req": [0, 0, 0, 1, 1], "t_s": [1.0, 2.0, 3.0, 1.5, 2.5]})
    m = measure(req, chunks)
    assert m["ttft_median_s"] == pytest.approx(0.75)  # (1.0, 0.5)
    assert m["e2e_mean_s"] == pytest.approx((3.0 + 1.5) / 2)
    assert m["makespan_s"] == pytest.approx(3.0)
    assert m["decode_tput"] == pytest.approx(5 / 3.0)
    assert m["tbt_p99_paid_s"] == pytest.approx(1.0)  # gaps 1, 1
    assert m["tbt_p99_free_s"] == pytest.approx(1.0)  # gap 1
    assert m["finished"] == 2


def test_crossing_interpolates():
    assert crossing([1, 2, 3], [0.2, 0.4, 0.8], 0.5) == pytest.approx(2.25)
    assert crossing([1, 2], [0.1, 0.2], 0.5) == 2
    assert math.isnan(crossing([1, 2], [0.9, 1.0], 0.5))


def test_slai_capacity_respects_tbt():
    rates = [1.0, 1.2, 1.4]
    ok = {"tbt_p99_paid_s": 0.05, "tbt_p99_free_s": 0.3}
    rows = [
        {"ttft_median_s": 0.3, **ok},
        {"ttft_median_s": 0.4, **ok},
        {"ttft_median_s": 0.6, **ok},
    ]
    assert capacity(rates, rows) == pytest.approx(1.3)
    rows[1] = {"ttft_median_s": 0.4, "tbt_p99_paid_s": 0.2, "tbt_p99_free_s": 0.3}
    assert capacity(rates, rows) == pytest.approx(1.0)  # paid TBT broken at 1.2


def test_backlog_slope_linear_growth():
    t = np.arange(0, 100, 0.5)
    finish = np.where(np.arange(len(t)) % 2 == 0, t + 1.0, np.nan)  # half never finish
    req = pd.DataFrame({"arrival_s": t, "last_chunk_s": finish, "success": ~np.isnan(finish)})
    slope, backlog = backlog_slope(req, 100.0)
    assert slope == pytest.approx(1.0, rel=0.05)  # 2 req/s arrive, 1 req/s leaves
    assert backlog > 45


def test_cli_list_and_unknown():
    runner = CliRunner()
    res = runner.invoke(app, ["experiment", "list"])
    assert res.exit_code == 0 and "stability" in res.output
    res = runner.invoke(app, ["experiment", "bogus"])
    assert res.exit_code == 2
    assert "unknown experiment" in res.output


def _claims(out):
    data = json.loads((out / "comparison.json").read_text())
    assert (out / "comparison.md").read_text().startswith("# ")
    return data


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_stability_small(tmp_path):
    res = run_experiment("stability", tmp_path)
    slope = {(r["config"], r["rho"]): r["backlog_slope_rps"] for r in res.rows}
    rate = {r["rho"]: r["rate_rps"] for r in res.rows}
    # stable: the second-half backlog grows by less than 10% of the arrival rate
    for name in ("Sarathi-Serve", "Orca"):
        for rho in (0.5, 0.9):
            assert slope[(name, rho)] < 0.1 * rate[rho], (name, rho)
    assert slope[("vanilla vLLM", 0.5)] < 0.1 * rate[0.5]
    # unstable: measured +12.2 req/s for vLLM at 0.9 and +6.3 / +12.2 for FT
    assert slope[("vanilla vLLM", 0.9)] == pytest.approx(12.2, rel=0.25)
    assert slope[("FasterTransformer", 0.5)] == pytest.approx(6.3, rel=0.25)
    assert slope[("FasterTransformer", 0.9)] == pytest.approx(12.2, rel=0.25)
    spec_author = [c for c in res.claims if "spec author" in c["paper"]]
    assert [c["claim"].split(" (")[0] for c in spec_author] == ["vanilla vLLM", "FasterTransformer"]
    assert len([p for p in tmp_path.iterdir() if p.is_dir()]) == 8  # 2 loads x 4 policies
    _claims(tmp_path)


def test_mcsf_matched_load_is_the_papers_low_demand_relative_load():
    from harness.experiments.mcsf import LOW_RHO, _capacity

    # the paper's low-demand MC-SF slope 1/800 s/arrival at 10/s: 10/s is 1.025 x capacity
    assert 10.0 / _capacity(1 / 800, 10.0) == pytest.approx(LOW_RHO, abs=1e-3)
    # fluid queue: slope (1/mu - 1/lambda) / 2 inverts exactly
    mu = _capacity(0.0064, 50.0)
    assert (1 / mu - 1 / 50.0) / 2 == pytest.approx(0.0064) and mu == pytest.approx(30.5, abs=0.1)


@pytest.mark.slow
@pytest.mark.timeout(600)
@real_sample("lmsys_sample_lengths.csv")
def test_mcsf_small(tmp_path):
    res = run_experiment("mcsf", tmp_path)
    high, low, clearing = res.claims
    # word-like lengths, baselines clear with progress lost + stall, N <= 1000, 3 seeds: the
    # best baseline's AEL slope is 2.0x MC-SF's at 50/s and 2.2x at matched low load (paper
    # 3x and 8x at N up to 10,000: the small run is the early part, before the queue builds)
    assert high["ratio"] == pytest.approx(2.0, abs=0.5)
    assert high["ratio_ci"] < 0.6
    assert "matched load" in low["claim"] and low["ratio"] == pytest.approx(2.2, abs=0.7)
    # the baselines never overflow here: the clearing semantics cannot explain the gap
    assert clearing["clearing_runs"] == 0
    slopes = [r for r in res.rows if r["arrivals"] == "slope"]
    assert len({r["seed"] for r in slopes}) == 3
    mcsf_rows = [
        r for r in res.rows if r["config"].startswith("MC-SF") and isinstance(r["arrivals"], int)
    ]
    assert all(r["preemptions"] == 0 for r in mcsf_rows)  # exact lengths never overflow M
    _claims(tmp_path)


@pytest.mark.slow
@pytest.mark.timeout(120)
@real_sample("sharegpt4_lengths_llama2.csv")
def test_slai_small(tmp_path):
    res = run_experiment("slai", tmp_path)
    ttft, cap, ttft_cap = (c["delta_pct"] for c in res.claims)
    # calibrated (steps x1.15) so Sarathi's capacity is the paper's ~1.15 req/s
    caps = {r["config"]: r["capacity_rps"] for r in res.rows if r["rate_rps"] == "capacity"}
    assert caps["Sarathi-Serve (FCFS)"] == pytest.approx(1.15, abs=0.1)
    # at 1.6 req/s (matched relative load) SLAI cuts the median TTFT by 59% (paper 53%)
    assert ttft == pytest.approx(-59, abs=8)
    # capacity: +31% on TTFT alone (paper +26% with both SLOs); the paid TBT SLO binds first
    assert ttft_cap == pytest.approx(31, abs=10)
    assert cap == pytest.approx(2, abs=8)
    rows = [
        r for r in res.rows if isinstance(r["rate_rps"], float) and r["config"].startswith("SLAI")
    ]
    paid = {r["rate_rps"]: r["tbt_p99_paid_s"] for r in rows}
    assert all(v <= 0.1 for rate, v in paid.items() if rate <= 1.2)
    assert paid[1.6] == pytest.approx(0.105, abs=0.01)  # why the TBT SLO binds capacity
    _claims(tmp_path)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_wait_small(tmp_path):
    res = run_experiment("wait", tmp_path)
    rows = {(r["workload"], r["config"].split(" (")[0]): r for r in res.rows}
    tight = [w for w, _ in rows if w.startswith("W-low (KV")][0]
    # The paper's mechanism: at C = M^π prefill-first vLLM evicts and loses throughput.
    assert rows[(tight, "vLLM")]["preemptions"] > 500
    assert rows[(tight, "WAIT")]["preemptions"] == 0
    delta = {c["claim"]: c["delta_pct"] for c in res.claims}
    assert delta[f"{tight}: WAIT vs vLLM (Vidur, prefill-first)"] == pytest.approx(25, abs=8)
    # Issue 19 must-show: in the authors' setting Nested WAIT is >= +20% over vLLM on the
    # authors' metric (measured +30%, seed 0), and within a few % of Sarathi (+5%).
    authors = "authors' setting: Nested WAIT vs {} (requests in each batch per s)"
    assert delta[authors.format("vLLM")] == pytest.approx(30, abs=8)
    assert delta[authors.format("vLLM")] >= 20
    assert delta[authors.format("Sarathi")] == pytest.approx(5, abs=6)
    # B read as KV holders: paused prompts use up max_num_seqs and Nested WAIT trails vLLM;
    # read as a per-step cap it is level with vLLM.
    kv = "LMSYS, B = KV holders: Nested WAIT vs vLLM (Vidur, prefill-first)"
    step = "LMSYS, B = per-step cap: Nested WAIT vs vLLM (Vidur, prefill-first)"
    assert delta[kv] == pytest.approx(-17, abs=8)
    assert delta[step] == pytest.approx(2, abs=8)
    _claims(tmp_path)


def test_nested_fit_never_silently_returns_a_misfit():
    """Issue 19 fix 2: the fitted batch says how it fits, and 'none' when nothing does."""
    from harness.experiments.wait import EDGES, authors_seg_caps, nested_fit
    from harness.policies.thresholds import batch_seats

    rng = np.random.default_rng(0)
    p = rng.integers(10, 120, 2000)
    o = rng.integers(1, 500, 2000)
    res, how = nested_fit(p, o, 0.05, 1e-7, 10**9, 100.0, 4096)
    # integer rounding leaves some θ_j without a root, so Eq. (14) is infinite: "mpi" says so
    assert how == "mpi" and math.isinf(res.required_memory_tokens)
    assert res.memory_tokens <= 10**9
    assert batch_seats(res.thresholds, EDGES) == 3700  # <= 4096, n_1 = 12 at 50 stages
    res, how = nested_fit(p, o, 0.01, 1e-7, 1000, 5.0, 4096)
    assert how == "none" and res.memory_tokens > 1000
    caps = authors_seg_caps(o, 256)
    assert sum(caps) == pytest.approx(256, abs=len(EDGES))
    assert caps == sorted(caps, reverse=True)  # Λ_i falls with i


def test_lengths_come_from_the_shared_file_when_present(tmp_path, monkeypatch):
    from harness.experiments.common import load_lengths

    (tmp_path / "lmsys_sample_lengths.csv").write_text(
        "num_prefill_tokens,num_decode_tokens\n10,5\n0,3\n7,9\n"
    )
    monkeypatch.setenv("HARNESS_DATA_DIR", str(tmp_path))
    df = load_lengths("lmsys_sample_lengths.csv")
    assert df.values.tolist() == [[10, 5], [7, 9]]  # zero-length rows dropped
    assert "real sample" in df.attrs["source"]


def test_lengths_fall_back_to_the_bundled_profile_announced(tmp_path, monkeypatch, capsys):
    """No shared data (an installed package): the experiment runs on rows drawn from the
    profile fitted to that file, says so on stderr and in its notes, the same rows every run."""
    from harness.cli.errors import HarnessError
    from harness.experiments.common import load_lengths
    from harness.workload.profile import load_profile

    monkeypatch.setenv("HARNESS_DATA_DIR", str(tmp_path))
    a = load_lengths("sharegpt4_lengths_llama2.csv")
    err = capsys.readouterr().err
    assert "warning:" in err and "bundled profile 'sharegpt'" in err
    assert "bundled profile 'sharegpt'" in a.attrs["source"]
    stats = load_profile("sharegpt").stats
    assert len(a) == stats["n"] and (a.values >= 1).all()
    assert a["prompt_len"].mean() == pytest.approx(stats["prompt_mean"], rel=0.05)
    assert a["output_len"].mean() == pytest.approx(stats["output_mean"], rel=0.05)
    assert a.equals(load_lengths("sharegpt4_lengths_llama2.csv"))
    with pytest.raises(HarnessError, match="not found"):
        load_lengths("no_such_lengths.csv")


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize(("name", "profile"), [("mcsf", "lmsys"), ("slai", "sharegpt")])
def test_experiment_cli_runs_without_the_shared_data(tmp_path, monkeypatch, name, profile):
    monkeypatch.setenv("HARNESS_DATA_DIR", str(tmp_path / "absent"))
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["experiment", name, "--out", str(out)])
    assert res.exit_code == 0, res.output
    data = _claims(out)
    assert f"bundled profile {profile!r}" in data["notes"][0]
    # the paper's direction survives the profile's lengths: MC-SF has the smallest latency
    # slope; SLAI lowers the median TTFT at high load
    assert data["claims"][0]["agrees"] in ("yes", "same direction"), data["claims"][0]


@pytest.mark.timeout(120)
def test_capacity_within_3pct_of_vidur_profile(tmp_path):
    """Issue 19 must-show: a100-llama2-7b's saturated capacity on the Azure-conversation
    lengths is within 3% of Vidur's profile for sarathi and vllm-v0 (measured -1.9%, +1.9%);
    the affine preset before the context terms was 6-9% below it."""
    res = run_experiment("capacity", tmp_path)
    by = {(r["policy"], r["cost_model"]): r for r in res.rows}
    for policy, new, old in (("sarathi", -1.9, -9.5), ("vllm-v0", 1.9, -5.7)):
        assert by[(policy, "a100-llama2-7b")]["vs_ref"] == pytest.approx(new, abs=1.0)
        assert abs(by[(policy, "a100-llama2-7b")]["vs_ref"]) <= 3.0
        assert by[(policy, "affine (before issue 19)")]["vs_ref"] == pytest.approx(old, abs=1.5)
    assert [c["verdict"] for c in res.claims] == ["reproduced", "reproduced"]


def test_word_like_lengths_match_the_papers_word_statistics():
    """seed-mcsf.md §4.1: input mean 40.6 / median 11, output mean 85 / median 45 (words)."""
    from harness.experiments.common import load_lengths
    from harness.experiments.mcsf import word_like

    tokens = load_lengths("lmsys_sample_lengths.csv")
    w = word_like(tokens)
    assert w["prompt_len"].median() == pytest.approx(11, abs=1)
    assert w["output_len"].median() == pytest.approx(45, abs=1)
    assert w["prompt_len"].mean() == pytest.approx(40.6, rel=0.1)
    assert w["output_len"].mean() == pytest.approx(85, rel=0.1)
    # the sample's order is kept: the longest token prompt is still the longest prompt
    assert w["prompt_len"].idxmax() == tokens["prompt_len"].rank(method="first").idxmax()
