"""Report, sweep and CLI behaviour without a browser."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from harness.cli.main import app
from harness.report import render_report, write_report
from harness.report.data import load_run_view
from harness.report.figures import binned, cdf_points, paired_diff
from harness.results.sweep import SweepConfig, capacities, parse_rates, run_sweep

runner = CliRunner()


def test_parse_rates() -> None:
    assert parse_rates("10,20, 40") == [10.0, 20.0, 40.0]
    assert parse_rates("5:20:5") == [5.0, 10.0, 15.0, 20.0]
    assert parse_rates("0.5:1.5:0.5") == [0.5, 1.0, 1.5]
    for bad in ("", "a,b", "0,1", "-1", "5:1:1", "1:5:0", "1:1000:1"):
        with pytest.raises(ValueError, match="--rates"):
            parse_rates(bad)


def _pt(policy: str, rate: float, verdict: str, meets: bool) -> dict:
    return {
        "policy": policy,
        "rate": rate,
        "verdict": verdict,
        "meets_slos": meets,
        "passes": verdict == "stable" and meets,
    }


def test_capacity_is_largest_rate_with_every_lower_rate_passing() -> None:
    pts = [
        _pt("a", 10, "stable", True),
        _pt("a", 20, "stable", True),
        _pt("a", 30, "stable", False),  # SLOs missed
        _pt("a", 40, "stable", True),  # a noisy pass above a failure does not count
        _pt("b", 10, "inconclusive", True),
        _pt("b", 20, "unstable", False),
    ]
    caps = capacities(pts)
    assert caps["a"]["capacity_rps"] == 20 and caps["a"]["max_passing_rate"] == 40
    assert caps["a"]["confirmed"] is True and caps["a"]["hint"] is None
    assert caps["a"]["first_failure"] == {"rate": 30, "verdict": "stable", "meets_slos": False}
    # inconclusive with SLOs met is not a failure (issue 20), but leaves capacity unconfirmed
    assert caps["b"]["capacity_rps"] == 10 and caps["b"]["confirmed"] is False
    assert caps["b"]["max_passing_rate"] is None
    assert caps["b"]["first_failure"]["rate"] == 20


def test_inconclusive_sweep_says_run_longer() -> None:
    pts = [
        {**_pt("a", r, "inconclusive", True), "num_requests": 200, "fails": False} for r in (1, 2)
    ]
    c = capacities(pts)["a"]
    assert c["capacity_rps"] == 2 and c["confirmed"] is False
    assert "run longer" in c["hint"] and "--num-requests 1000" in c["hint"]
    from harness.cli.sweep import capacity_line

    line = capacity_line("a", c)
    assert "2 req/s" in line and "unconfirmed" in line and "none of" not in line


def test_capacity_per_tier() -> None:
    pts = [
        {**_pt("a", 1, "stable", True), "tier_meets": {"paid": True, "free": True}},
        {**_pt("a", 2, "stable", False), "tier_meets": {"paid": False, "free": True}},
        {**_pt("a", 3, "stable", False), "tier_meets": {"paid": False, "free": False}},
    ]
    for p in pts:
        p["slo_attainment"] = {"paid": None, "free": None}
    c = capacities(pts)["a"]
    assert c["capacity_rps"] == 1 and c["by_tier"] == {"paid": 1, "free": 2}


def test_downsampling_helpers() -> None:
    v = np.random.default_rng(0).exponential(1.0, 1_000_000)
    x, p = cdf_points(v, 300)
    assert len(x) == 300 and p[0] == 0 and p[-1] == 1
    assert x[150] == pytest.approx(np.log(2), rel=0.01)  # the median of Exp(1)
    c, s, w = binned(np.array([0.1, 0.2, 1.5, 9.9]), np.array([1, 2, 3, 4.0]), 10.0, bins=10)
    assert w == 1 and s.tolist() == [3, 3, 0, 0, 0, 0, 0, 0, 0, 4] and c[0] == 0.5


def test_paired_difference_known_answer(runs_dir: Path) -> None:
    a = load_run_view(runs_dir / "slots8")
    b = load_run_view(runs_dir / "slots12")
    assert a.trace_hash == b.trace_hash  # same frozen trace, different service
    d = paired_diff(a, b, "ttft_s")
    assert d["pairs"] == int(a.rm["success"].sum())
    expected = (b.rm["ttft_s"] - a.rm["ttft_s"]).to_numpy() * 1000
    assert d["mean_ms"] == pytest.approx(np.nanmean(expected))
    # more slots never wait longer in a FCFS queue with the same arrivals and sizes
    assert d["mean_ms"] <= 0 and d["mean_ci_ms"][0] <= d["mean_ms"] <= d["mean_ci_ms"][1]


def test_report_is_self_contained(runs_dir: Path, tmp_path: Path) -> None:
    html = render_report([runs_dir / "slots8", runs_dir / "slots12"])
    assert "Content-Security-Policy" in html and "default-src 'none'" in html
    # no remote asset outside plotly.js itself (whose strings the browser test shows unused)
    outside = re.sub(r"<script>.*?</script>", "", html, count=1, flags=re.S)
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", outside)
    assert "<link" not in html
    assert html.count("Plotly.newPlot") == 2  # once inside plotly.js, once in our init loop
    assert html.count("plotly.js v") <= 2
    assert "Paired per-request differences" in html
    out = write_report([runs_dir / "slots8"], tmp_path / "x" / "r.html")
    assert out.is_file() and out.stat().st_size < 20_000_000


def test_write_report_bad_input(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        write_report([])
    with pytest.raises(FileNotFoundError, match="not a run directory"):
        write_report([tmp_path])


def test_cli_report_errors_are_one_line(runs_dir: Path, tmp_path: Path) -> None:
    r = runner.invoke(app, ["report", str(tmp_path / "missing")])
    assert r.exit_code == 2 and "no such directory" in r.output
    r = runner.invoke(app, ["report", str(tmp_path)])
    assert r.exit_code == 2 and "not a run directory" in r.output
    assert "Traceback" not in r.output
    r = runner.invoke(app, ["report", str(runs_dir / "slots8"), "-o", str(tmp_path / "ok.html")])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "ok.html").is_file()


def test_cli_sweep_bad_input() -> None:
    for args, msg in (
        (["--rates", "0,1"], "positive"),
        (["--rates", "1:2:0"], "STEP"),
        (["--rates", "5", "--policy", "nope"], "unknown policy"),
        (["--rates", "5", "--min-attainment", "2"], "0..1"),
    ):
        r = runner.invoke(app, ["sweep", *args])
        assert r.exit_code == 2, (args, r.output)
        assert msg in r.output and "Traceback" not in r.output


def test_simulated_sweep_finds_capacity(tmp_path: Path) -> None:
    """Engineer E's simulator: 3 req/s is far below capacity, 80 far above (fluid critical
    rate ≈ 30 req/s for the synthetic mix), so capacity = 3 for both policies."""
    pytest.importorskip("harness.engine.simulate")
    cfg = SweepConfig(
        rates=[3.0, 80.0],
        policies=["vllm", "orca"],
        base={"trace": "synthetic", "num_requests": 500, "kv_tokens": 100_000},
        out_dir=tmp_path / "sw",
        min_attainment=0.5,
    )
    out = run_sweep(cfg)
    data = json.loads((out / "sweep.json").read_text())
    assert [(p["policy"], p["rate"]) for p in data["runs"]] == [
        ("vllm", 3.0),
        ("orca", 3.0),
        ("vllm", 80.0),
        ("orca", 80.0),
    ]
    v = {(p["policy"], p["rate"]): p for p in data["runs"]}
    assert v["vllm", 3.0]["verdict"] == "stable" and v["vllm", 80.0]["verdict"] == "unstable"
    assert data["capacity"]["vllm"]["capacity_rps"] == 3.0
    assert data["capacity"]["orca"]["capacity_rps"] == 3.0
    assert all((out / p["run_dir"] / "summary.json").is_file() for p in data["runs"])
    assert (out / "report.html").is_file()


def test_sweep_repeats_give_capacity_interval(tmp_path: Path) -> None:
    """Two seeds per point: sweep.json keeps each seed's row, aggregates per (policy, rate)
    with per-tier ranges, and gives the capacity with the range of per-seed capacities."""
    cfg = SweepConfig(
        rates=[3.0, 80.0],
        policies=["vllm"],
        base={"trace": "synthetic", "num_requests": 300, "kv_tokens": 100_000, "seed": 5},
        out_dir=tmp_path / "sw",
        min_attainment=0.5,
        repeats=2,
        warmup={"requests": 10},
        report=False,
    )
    data = json.loads((run_sweep(cfg) / "sweep.json").read_text())
    assert sorted((p["rate"], p["seed"]) for p in data["seed_runs"]) == [
        (3.0, 5),
        (3.0, 6),
        (80.0, 5),
        (80.0, 6),
    ]
    assert [(r["rate"], r["seeds"]) for r in data["runs"]] == [(3.0, [5, 6]), (80.0, [5, 6])]
    low = data["runs"][0]
    assert low["completed"] == 290  # 300 minus the 10 warm-up requests, in each seed
    assert sum(t["completed"] for t in low["tiers"].values()) == 290
    assert len(low["tiers_ci"]["free"]["p99_itl_ms"]) == 2
    c = data["capacity"]["vllm"]
    assert c["capacity_rps"] == 3.0 and c["capacity_by_seed"] == {"5": 3.0, "6": 3.0}
    assert (c["capacity_lo"], c["capacity_hi"]) == (3.0, 3.0)
    assert c["interval_coverage"] == 0.5
    html = render_report([], sweep=data)
    assert "3 [3, 3]" in html and "free capacity" in html


def test_all_failed_run_still_renders(tmp_path: Path) -> None:
    """No successful request: no chunks, the latency panels say so instead of crashing."""
    from harness.report.synthetic import write_synthetic_run

    d = write_synthetic_run(tmp_path / "dead", num_requests=40, rate=2.0, fail_fraction=1.0)
    html = write_report([d]).read_text(encoding="utf-8")
    # every empty panel is labelled (issue 20: three unlabelled "no data" lines)
    for panel in ("TTFT CDF per tier", "TBT CDF per tier", "Time between tokens"):
        assert f"{panel}: no successful request to plot" in html
    assert "no data for this panel" not in html
    assert "all 40 requests failed (http_status: 40)" in html  # the banner says why
    assert "http_status" in html  # the errors table
    # an empty tier: '–', never "0" in red (issue 20), in the report and on the terminal
    assert 'class="bad">0<' not in html
    from harness.results.console import tier_table
    from harness.results.rundir import read_run
    from harness.results.summary import compute_summary

    table = tier_table(compute_summary(read_run(d)))
    from rich.console import Console

    con = Console(record=True, width=120, force_terminal=True, color_system="standard")
    con.print(table)
    assert " 0.0 " not in con.export_text(clear=False)
    assert "\x1b[31m" not in con.export_text(styles=True)  # nothing red


def test_issue20_report_defects(tmp_path: Path) -> None:
    """Title of a five-run comparison, one fallback banner, completions binned coarsely, the
    P99 bar coloured against the tier's own SLO, stability values explained."""
    from harness.report import comparison_title
    from harness.report.data import _notices, stability_rows
    from harness.report.figures import SLO_MET, SLO_MISSED, completion_bins, itl_distribution
    from harness.report.synthetic import write_synthetic_run

    labels = [f"p{i}" for i in range(5)]
    assert comparison_title(labels) == "Comparison: p0 vs p1 vs p2 vs p3 vs p4"
    assert comparison_title([f"p{i}" for i in range(9)]).endswith("p4 and 4 more")

    reason = "HF hub unreachable"
    meta = {
        "trace_meta": {
            "fallback": True,
            "reason": reason,
            "notes": [f"lmsys: real dataset not available ({reason}); using the length profile"],
        },
        "notes": ["trace fell back to a length profile"],
    }
    notices = _notices(meta, {})
    assert sum("fallback" in t or "length profile" in t for _, t in notices) == 1

    # ~1 completion/s over 300 s: ~25 per bin, never 0.1 s bins of 0 or 10
    assert completion_bins(300, 300.0) == 12 and completion_bins(0, 10.0) == 1

    # the free tier (500 ms SLO) meets it, the paid tier (1 ms SLO) misses: green / red
    d = write_synthetic_run(
        tmp_path / "r",
        num_requests=200,
        rate=3.0,
        tiers=(("paid", 0.3, 2.0, 0.001), ("free", 0.7, 10.0, 0.5)),
    )
    fig = itl_distribution(load_run_view(d))
    bars = [t for t in fig.data if t.type == "bar"][0]
    assert list(bars.x) == ["paid", "free"] and list(bars.marker.color) == [SLO_MISSED, SLO_MET]

    rows = {
        label: (v, h)
        for label, v, h in stability_rows(
            {
                "little_law_ratio": 0.0613,
                "queue_mean": 0.0,
                "mean_backlog": 56.0,
                "conditional_drift": [
                    {"level_lo": 1.0, "level_hi": 5.0, "drift_per_s": 2.5, "points": 9},
                    {"level_lo": 5.0, "level_hi": 9.0, "drift_per_s": -1.25, "points": 9},
                ],
            }
        )
    }
    assert (
        rows["Little's law L/(λW)"][0] == "0.061" and "censored" in rows["Little's law L/(λW)"][1]
    )
    assert (
        rows["engine queue, mean"][0] == "0 requests"
        and "not queued" in rows["engine queue, mean"][1]
    )
    assert rows["conditional drift"][0] == "1–5: +2.500/s · 5–9: -1.250/s"
