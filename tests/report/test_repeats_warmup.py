"""--repeats (seeded runs grouped, compared with intervals) and --warmup (first requests kept
but not measured), end to end through the CLI on a small simulated workload."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness.cli.main import app
from harness.results.rundir import read_run
from harness.results.summary import compute_summary
from harness.results.warmup import parse_warmup, warmup_mask

runner = CliRunner()
SIM = [
    "simulate",
    "--trace",
    "synthetic",
    "--rate",
    "8",
    "--num-requests",
    "80",
    "--cost-model",
    "rtx6000ada-mistral-7b",
]


def test_parse_warmup() -> None:
    assert parse_warmup("50") == {"requests": 50}
    assert parse_warmup("30s") == {"duration_s": 30.0}
    assert parse_warmup("500ms") == {"duration_s": 0.5}
    assert parse_warmup("2m") == {"duration_s": 120.0}
    for bad in ("", "-3", "abc", "10h", "1.5"):
        with pytest.raises(ValueError, match="--warmup"):
            parse_warmup(bad)


def test_simulate_repeats_groups_seeds_and_gives_verdicts(tmp_path: Path) -> None:
    out = tmp_path / "o"
    res = runner.invoke(
        app, SIM + ["--policy", "sarathi,slai", "--repeats", "2", "--seed", "7", "-o", str(out)]
    )
    assert res.exit_code == 0, res.output
    index = json.loads((out / "runs.json").read_text())
    assert index["groups"] == ["sarathi", "slai"]
    assert [(r["group"], r["seed"]) for r in index["runs"]] == [
        ("sarathi", 7),
        ("slai", 7),
        ("sarathi", 8),
        ("slai", 8),
    ]
    runs = [
        read_run(out / r["dir"], requests=False, chunks=False, samples=False) for r in index["runs"]
    ]
    metas = [run.meta for run in runs]
    assert [m["seed"] for m in metas] == [7, 7, 8, 8]
    # the labels the runs were given after their summaries, in summary.json too
    assert [m["label"] for m in metas] == [
        "sarathi (seed 7)",
        "slai (seed 7)",
        "sarathi (seed 8)",
        "slai (seed 8)",
    ]
    assert [run.summary["label"] for run in runs] == [m["label"] for m in metas]
    assert metas[2]["repeat"] == {"group": "sarathi", "seed": 8, "index": 1, "of": 2}
    # each seed's two policies replayed the same trace: paired
    assert metas[0]["trace_meta"] == metas[1]["trace_meta"]
    assert "verdicts (95% bootstrap intervals" in res.output
    assert "paired by request, 2 seeds" in res.output
    html = (out / "comparison.html").read_text(encoding="utf-8")
    assert "Verdicts at 95% confidence (sarathi is the base)" in html
    assert "sarathi (2 seeds)" in html and "seeds resampled too" in html
    # harness report on the folder renders the same comparison
    res = runner.invoke(app, ["report", str(out)])
    assert res.exit_code == 0, res.output
    assert (out / "report.html").is_file()


def test_warmup_excludes_first_requests_but_keeps_them(tmp_path: Path) -> None:
    out = tmp_path / "w"
    res = runner.invoke(app, SIM + ["--policy", "vllm", "--warmup", "20", "-o", str(out)])
    assert res.exit_code == 0, res.output
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    run = read_run(run_dir)
    assert len(run.requests) == 80  # kept in the run directory
    assert run.meta["warmup"] == {"requests": 20}
    assert run.meta["label"] == run.summary["label"] == "vllm"  # one run: the policy
    s = run.summary
    assert s["warmup"]["excluded"] == 20 and s["completed"] == 60
    first = warmup_mask(run.requests, {"requests": 20})
    t = run.requests["target_s"].to_numpy()
    assert t[first].max() <= t[~first].min()  # the first 20 scheduled
    assert s["warmup"]["until_s"] == pytest.approx(t[first].max())
    # without the spec the same run measures all 80
    meta = dict(run.meta)
    meta.pop("warmup")
    full = compute_summary(type(run)(run.dir, meta, run.requests, run.chunks, run.samples))
    assert full["completed"] == 80 and full["warmup"] is None
    assert s["duration"] < full["duration"]
    html = (run_dir / "report.html").read_text(encoding="utf-8")
    assert "warm-up: the first 20 requests" in html


def test_bad_repeats_and_warmup_are_one_line(tmp_path: Path) -> None:
    for args, needle in ((["--repeats", "0"], "--repeats"), (["--warmup", "x"], "--warmup")):
        res = runner.invoke(app, SIM + args + ["-o", str(tmp_path / "x")])
        assert res.exit_code == 2, res.output
        assert needle in res.output and "Traceback" not in res.output


@pytest.mark.slow
def test_must_show_slai_vs_sarathi_five_seeds(tmp_path: Path) -> None:
    """Issue 20 "Must show": over 5 seeds, the report states with 95% confidence that SLAI
    beats Sarathi on paid-tier P99 TBT and does not beat it on all-tier P99 ITL."""
    out = tmp_path / "must"
    res = runner.invoke(
        app,
        [
            "simulate",
            "--trace",
            "sharegpt",
            "--rate",
            "1.5",
            "--num-requests",
            "300",
            "--policy",
            "sarathi,slai",
            "--cost-model",
            "rtx6000ada-mistral-7b",
            "--repeats",
            "5",
            "--no-report",
            "-o",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    from harness.report import render_report
    from harness.results.repeats import read_index

    html = render_report(read_index(out))
    paid = [ln for ln in html.splitlines() if "P99 TBT (ITL), paid tier: slai" in ln]
    every = [ln for ln in html.splitlines() if "P99 TBT (ITL), all tiers: slai" in ln]
    assert paid and "slai beats sarathi with 95% confidence" in paid[0]
    assert "5 seeds" in paid[0] and "paired by request" in paid[0]
    assert every and "slai does not beat sarathi" in every[0]
