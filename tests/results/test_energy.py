"""Energy per token from NVML's counter: the arithmetic on synthetic samples with a known
answer, and absence without readings."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from harness.report.synthetic import write_synthetic_run
from harness.results.energy import per_token, run_energy
from harness.results.rundir import read_run
from harness.results.summary import compute_summary, write_summary


def _gpu(t: np.ndarray, idx: int, watts: float, start: float) -> pd.DataFrame:
    return pd.DataFrame(
        {"t_s": t, "source": "gpu", "gpu_index": idx, "gpu_energy_j": start + watts * t}
    )


def test_run_energy_sums_gpus_over_the_window() -> None:
    t = np.linspace(0.0, 10.0, 41)
    s = pd.concat(
        [
            _gpu(t, 0, 300.0, 5e5),
            _gpu(t, 1, 200.0, 7e6),
            pd.DataFrame({"t_s": [1.0], "source": "engine"}),
        ]
    )
    e = run_energy(s)
    assert e["energy_j"] == pytest.approx(5000.0)  # (300 + 200) W x 10 s
    assert e["per_gpu_j"] == {"0": pytest.approx(3000.0), "1": pytest.approx(2000.0)}
    assert e["mean_power_w"] == pytest.approx(500.0)
    w = run_energy(s, 2.0, 6.0)  # the measured window only (e.g. after --warmup)
    assert w["energy_j"] == pytest.approx(2000.0)


def test_no_energy_without_readings() -> None:
    assert run_energy(pd.DataFrame({"t_s": [0.0], "source": ["engine"]})) is None
    t = np.arange(5.0)
    no_counter = pd.DataFrame({"t_s": t, "source": "gpu", "gpu_index": 0})
    no_counter["gpu_energy_j"] = np.nan
    assert run_energy(no_counter) is None


def test_per_token_and_per_good_token_by_tier() -> None:
    """Two tiers doing 1/4 and 3/4 of the tokens: energy splits 250/750 J; the paid tier's
    good tokens are half its output tokens."""
    tiers = {"paid": np.array([True, False, False]), "free": np.array([False, True, True])}
    res = per_token(
        {"energy_j": 1000.0},
        tiers,
        success=np.array([True, True, True]),
        attained=np.array([True, True, False]),
        prompt_tokens=np.array([50, 100, 50]),
        output_tokens=np.array([50, 100, 250]),
    )
    assert res["j_per_output_token"] == pytest.approx(1000.0 / 400)
    assert res["j_per_good_token"] == pytest.approx(1000.0 / 150)
    paid, free = res["tiers"]["paid"], res["tiers"]["free"]
    assert paid["energy_j"] == pytest.approx(1000.0 * 100 / 600)
    assert paid["j_per_good_token"] == pytest.approx(paid["energy_j"] / 50)
    assert free["j_per_output_token"] == pytest.approx(free["energy_j"] / 350)
    assert free["j_per_good_token"] == pytest.approx(free["energy_j"] / 100)


def test_summary_has_energy_only_with_a_gpu_counter(tmp_path) -> None:
    d = write_synthetic_run(tmp_path / "gpu", num_requests=200, rate=3.0, gpu_power_w=250.0)
    run = read_run(d)
    s = compute_summary(run)
    g = run.samples[run.samples["source"] == "gpu"]["t_s"]
    g = g[g <= s["duration"]]  # the measured window: the run's duration
    assert s["energy"]["energy_j"] == pytest.approx(250.0 * (g.max() - g.min()), rel=1e-9)
    assert s["energy"]["j_per_output_token"] == pytest.approx(
        s["energy"]["energy_j"] / s["total_output_tokens"]
    )
    assert set(s["energy"]["tiers"]) == {"paid", "free"}
    # write_summary reads the samples' GPU columns only for a run with NVML rows (here):
    # the same energy, and the same stability verdict from the engine's queue gauges
    written = write_summary(d)
    assert (written["energy"], written["stability"]) == (s["energy"], s["stability"])
    cpu = write_synthetic_run(tmp_path / "cpu", num_requests=50)
    plain = compute_summary(read_run(cpu))
    assert "energy" not in plain and "energy" not in write_summary(cpu)


def test_energy_in_report_and_terminal(tmp_path) -> None:
    from rich.console import Console

    from harness.report import write_report
    from harness.results.console import print_summary

    d = write_synthetic_run(tmp_path / "gpu", num_requests=100, rate=3.0, gpu_power_w=250.0)
    html = write_report([d]).read_text(encoding="utf-8")
    assert "Energy (NVML total-energy counter" in html and "J / good token" in html
    con = Console(record=True, width=140)
    print_summary(compute_summary(read_run(d)), console=con)
    assert "J per token" in con.export_text()
    cpu = write_synthetic_run(tmp_path / "cpu", num_requests=50)
    assert "Energy (NVML" not in write_report([cpu]).read_text(encoding="utf-8")
