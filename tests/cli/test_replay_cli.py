"""`harness replay` from the outside: one-line errors with exit 2, a real run against the
built-in engine, and Ctrl-C (SIGINT) leaving a readable partial run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from harness.cli.main import app
from harness.results import schema
from harness.results.rundir import read_run

runner = CliRunner()


def _cli(*args: str) -> tuple[int, str]:
    res = runner.invoke(app, ["replay", *args])
    return res.exit_code, res.output  # stdout and stderr, mixed


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--trace", "synthetic", "--rate", "5", "--tiers", "paid:0.5"], "--tiers"),
        (["--trace", "nosuchtrace", "--rate", "5"], "unknown trace 'nosuchtrace'"),
        (["--trace", "synthetic", "--rate", "-1"], "--rate"),
        (["--trace", "synthetic"], "give a rate"),
        (["--trace", "synthetic", "--arrival", "poisson"], "needs --rate"),
        (["--trace", "synthetic", "--rate", "5", "--engine", "tgi"], "--engine"),
        (["--trace", "synthetic", "--rate", "5", "--goodput", "ttft:abc"], "--goodput"),
        (
            ["--trace", "synthetic", "--rate", "5", "--target", "http://h:1", "--kv-tokens", "9"],
            "built-in",
        ),
        (["--trace", "synthetic", "--rate", "5", "--target", "ftp://h"], "http://"),
        (["--trace", "synthetic", "--rate", "5", "--extra-body", "{x"], "--extra-body"),
    ],
)
def test_bad_input_is_one_line_exit_2(args: list[str], needle: str) -> None:
    code, text = _cli(*args)
    assert code == 2, text
    lines = [ln for ln in text.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), text
    assert needle in lines[0]
    assert "Traceback" not in text


def test_malformed_trace_row_names_the_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt_len": 10, "output_len": 5}\n{"prompt_len": 10\n')
    code, text = _cli("--trace", str(bad), "--rate", "5")
    assert code == 2 and "line 2" in text and "Traceback" not in text


def test_unreachable_target_within_5s() -> None:
    import harness.loadgen.replay  # noqa: F401  (cold imports are not the readiness budget)

    t = time.monotonic()
    code, text = _cli(
        "--trace", "synthetic", "--rate", "5", "--num-requests", "3",
        "--target", "http://127.0.0.1:9", "--no-progress",
    )  # fmt: skip
    assert code == 2 and "not reachable" in text
    # the default 5 s readiness budget, plus building the trace and CLI set-up, which take
    # 0.1-0.5 s on a quiet machine and more on a loaded CI box
    assert time.monotonic() - t < 5.0 + 4.0


def _harness(*args: str) -> list[str]:
    return [sys.executable, "-m", "harness.cli.main", "replay", *args]


def test_replay_against_builtin_engine(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = subprocess.run(
        _harness(
            "--trace",
            "synthetic",
            "--rate",
            "40",
            "--num-requests",
            "20",
            "--source-option",
            "input_len=32",
            "--source-option",
            "output_len=6",
            "--out",
            str(out),
            "--no-progress",
            "--no-gpu",
            "--speed",
            "4",
            "--sample-interval",
            "0.1",
            "--goodput",
            "ttft:5000",
            "--goodput",
            "e2el:60000",
        ),  # fmt: skip
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"run directory: {out}" in proc.stdout
    run = read_run(out)
    assert run.meta["status"] == schema.STATUS_COMPLETE and run.meta["engine"] == "builtin"
    assert len(run.requests) == 20 and run.requests["success"].all()
    assert (run.requests["output_tokens"] == 6).all()
    assert run.chunks.groupby("req")["tokens"].sum().eq(6).all()
    assert (run.samples["source"] == "prometheus").any()
    summary = json.loads((out / schema.SUMMARY_JSON).read_text())
    assert summary["completed"] == 20 and summary["request_goodput"] is not None


@pytest.mark.parametrize("inherited", ["default", "ignored"])
def test_sigint_leaves_partial_run(tmp_path: Path, signal_and_wait: Any, inherited: str) -> None:
    """``ignored``: started as a shell's background job does, with SIGINT ignored; the replay
    still stops on it (else asyncio.Runner installs no handler and it runs to the end)."""

    def ignore_sigint() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    out = tmp_path / "run"
    proc = subprocess.Popen(
        _harness(
            "--trace",
            "synthetic",
            "--rate",
            "40",
            "--num-requests",
            "4000",
            "--source-option",
            "input_len=16",
            "--source-option",
            "output_len=30",
            "--out",
            str(out),
            "--no-progress",
            "--no-gpu",
            "--sample-interval",
            "0",
        ),  # fmt: skip
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=ignore_sigint if inherited == "ignored" else None,
    )
    try:
        parts = out / (schema.REQUESTS_FILE + ".parts")
        deadline = time.monotonic() + 40
        while not (parts.is_dir() and any(parts.glob("part-*.parquet"))):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no flushed requests within 40 s"
            time.sleep(0.05)
        stdout, stderr = signal_and_wait(proc, signal.SIGINT, 40)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, stderr
    assert "partial run" in stdout and "Traceback" not in stderr
    run = read_run(out)
    assert run.meta["status"] == schema.STATUS_PARTIAL
    r = run.requests
    assert r["success"].sum() >= 1
    cancelled = r[r["error_kind"] == schema.ERROR_CANCELLED]
    assert len(cancelled) >= 1  # what was in flight at Ctrl-C is recorded, not lost
    assert len(r) < 4000 and r["req"].is_unique
    assert (out / schema.SUMMARY_JSON).is_file()


def test_builtin_faults_match_the_servers_log(tmp_path: Path) -> None:
    """`harness replay --faults` on the built-in engine: every injected fault (the server's
    own log, written into the run directory) is one failed request with the matching kind."""
    import collections

    import pandas as pd

    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "harness.cli.main", "replay", "--trace", "synthetic",
         "--rate", "40", "--num-requests", "80", "--speed", "4", "--no-progress",
         "--faults", "error=0.1,drop=0.1,malformed=0.1,seed=3", "--out", str(out)],
        capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    faults = [json.loads(line) for line in (out / "faults.jsonl").read_text().splitlines()]
    req = pd.read_parquet(out / "requests.parquet")
    kind_of = {"error": "http_status", "drop": "stream_cut", "malformed": "bad_payload"}
    expected = {(f["request_id"], kind_of[f["kind"]]) for f in faults}
    failed = req.loc[~req["success"]]
    assert faults and len(faults) == len(failed)
    assert set(zip(failed["request_id"], failed["error_kind"], strict=True)) == expected
    assert collections.Counter(kind_of[f["kind"]] for f in faults) == collections.Counter(
        failed["error_kind"]
    )
