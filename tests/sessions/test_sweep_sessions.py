"""`harness sweep` over a session trace: each rate judged by session-level SLO attainment per
tier (summary.json["sessions"]), capacity in sessions/s per tier."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from echo_thread import FifoDelay, echo_in_thread
from typer.testing import CliRunner

from harness.cli.main import app
from harness.results.sweep import aggregate_seeds, capacities, sweep_point

runner = CliRunner()
TIERS = "paid:0.5:ttft=0.2s,free:0.5:ttft=30s"


def run(*args: str):  # noqa: ANN202
    return runner.invoke(app, list(args))


def write_run(d: Path, paid_requests: float, paid_sessions: float | None) -> Path:
    """A finished run's summary.json: per-tier request attainment, optionally a sessions
    block (a session run), stability judged stable."""
    d.mkdir(parents=True)
    tiers = {
        "paid": {"slo_attainment": paid_requests, "ttft_slo_ms": 200.0, "tbt_slo_ms": None},
        "free": {"slo_attainment": 1.0, "ttft_slo_ms": None, "tbt_slo_ms": None},
    }
    summary: dict[str, Any] = {"stability": {"verdict": "stable"}, "tiers": tiers}
    if paid_sessions is not None:
        summary["sessions"] = {
            "sessions": 10,
            "slo_attainment": paid_sessions,
            "tiers": {
                "paid": {"sessions": 5, "slo_attainment": paid_sessions},
                "free": {"sessions": 5, "slo_attainment": 0.1},  # no SLO: not judged
            },
        }
    (d / "summary.json").write_text(json.dumps(summary))
    return d


def test_a_session_run_is_judged_per_session(tmp_path: Path) -> None:
    # 95% of paid calls met their SLO, but only 60% of paid sessions had every call meet it
    plain = sweep_point(write_run(tmp_path / "a", 0.95, None), "p", 2.0, 0.9)
    sess = sweep_point(write_run(tmp_path / "b", 0.95, 0.6), "p", 2.0, 0.9)
    assert plain["unit"] == "req/s" and plain["meets_slos"] and plain["passes"]
    assert sess["unit"] == "sessions/s" and not sess["meets_slos"] and sess["fails"]
    assert sess["slo_attainment"] == {"paid": 0.6, "free": None}
    assert sess["sessions"]["tiers"]["paid"]["slo_attainment"] == 0.6
    low = sweep_point(write_run(tmp_path / "c", 0.99, 0.95), "p", 1.0, 0.9)
    cap = capacities([low, sess])["p"]
    assert cap["unit"] == "sessions/s" and cap["capacity_rps"] == 1.0
    assert cap["by_tier"] == {"paid": 1.0, "free": 2.0}
    # --repeats: the seeds' mean session attainment (0.8) decides, not the calls' (0.95)
    other = sweep_point(write_run(tmp_path / "d", 0.95, 1.0), "p", 2.0, 0.9)
    (row,) = aggregate_seeds([sess, other], 0.9)
    assert row["unit"] == "sessions/s" and row["slo_attainment"]["paid"] == 0.8
    assert not row["meets_slos"]


def test_live_sweep_reports_capacity_in_sessions_per_s_per_tier(tmp_path: Path) -> None:
    trace = tmp_path / "s.jsonl"
    r = run("trace", "build", "synthetic-conv", "-n", "16", "--rate", "1", "--tiers", TIERS,
            "--opt", "turns=2", "--opt", "max_turns=2", "--opt", "prompt_len=4",
            "--opt", "output_len=3", "-o", str(trace))  # fmt: skip
    assert r.exit_code == 0, r.output
    out = tmp_path / "sweep"
    # One FIFO server, 50 ms of work per call: at 4 sessions/s a call rarely waits; at 1000
    # sessions/s all 16 arrive at once and at most the first 4 calls start within 200 ms.
    with echo_in_thread(first_delay=FifoDelay(0.05)) as srv:
        r = run("sweep", "--rates", "4,1000", "--trace", str(trace), "--target", srv.url,
                "--tiers", TIERS, "--min-attainment", "0.6", "--no-report",
                "-o", str(out))  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "@ 4 sessions/s" in r.output and "capacity vllm: 4 sessions/s" in r.output
    assert "paid 4" in r.output and "free 1000" in r.output  # capacity per tier
    assert "inconclusive at 4 sessions/s" in r.output
    data = json.loads((out / "sweep.json").read_text())
    cap = data["capacity"]["vllm"]
    assert cap["unit"] == "sessions/s" and cap["by_tier"] == {"paid": 4.0, "free": 1000.0}
    for p in data["runs"]:  # each rate judged by its run's session attainment
        s = json.loads((out / p["run_dir"] / "summary.json").read_text())["sessions"]
        assert p["slo_attainment"]["paid"] == s["tiers"]["paid"]["slo_attainment"]
        assert p["slo_attainment"]["free"] == s["tiers"]["free"]["slo_attainment"] == 1.0
        assert s["sessions"] == 16
    low, high = sorted(data["runs"], key=lambda p: p["rate"])
    assert low["slo_attainment"]["paid"] >= 0.6 > high["slo_attainment"]["paid"]


def test_simulated_session_sweep_is_refused_in_one_line(tmp_path: Path) -> None:
    r = run("sweep", "--rates", "1,2", "--trace", "synthetic-conv", "-o", str(tmp_path / "s"))
    assert r.exit_code == 2 and "a session trace sweeps live" in r.output


def test_frozen_session_parquet_sweep_is_refused(tmp_path: Path) -> None:
    frozen = tmp_path / "s.parquet"
    r = run("trace", "build", "synthetic-conv", "-n", "2", "--rate", "1", "-o", str(frozen))
    assert r.exit_code == 0, r.output
    r = run("sweep", "--rates", "1,2", "--trace", str(frozen), "--target", "http://127.0.0.1:9",
            "-o", str(tmp_path / "s"))  # fmt: skip
    assert r.exit_code == 2 and "keeps its own arrivals at every rate" in r.output
