"""The CLI rough edges of issue 20: no rich emoji for ':B:', help that says what happens,
--opt everywhere, -o on every command that writes, errors that name real flags,
`policies --params`, and replay --repeats/--warmup end to end."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness.cli.main import app

runner = CliRunner()


def _help(*cmd: str) -> str:
    res = runner.invoke(app, [*cmd, "--help"], env={"COLUMNS": "200"}, terminal_width=200)
    assert res.exit_code == 0, res.output
    return res.output


def test_no_emoji_in_sweep_help_and_rates_error() -> None:
    assert "START:STOP:STEP" in _help("sweep") and "\U0001f171" not in _help("sweep")
    res = runner.invoke(app, ["sweep", "--rates", "1:a"])
    assert res.exit_code == 2
    assert "START:STOP:STEP" in res.output and "\U0001f171" not in res.output
    res = runner.invoke(app, ["sweep", "--rates", "2,3", "--policy", ":B:[bold]x"])
    assert "\U0001f171" not in res.output  # user text prints as typed


def test_replay_help_says_child_process_and_documents_opt() -> None:
    text = _help("replay")
    assert "child process" in text and "in-process." not in text
    assert "--opt" in text and re.search(r"(?<![-\w])-o\b", text)


@pytest.mark.parametrize("cmd", ["replay", "simulate", "sweep", "report", "experiment"])
def test_every_writing_command_takes_o(cmd: str) -> None:
    text = _help(cmd)
    assert "--out" in text and re.search(r"(?<![-\w])-o\b", text), text


def test_policies_params() -> None:
    res = runner.invoke(app, ["policies", "--params"])
    assert res.exit_code == 0, res.output
    assert "--param slai.prefill_order=" in res.output
    assert "--param sarathi.order=" in res.output
    plain = runner.invoke(app, ["policies"]).output.split()
    assert "slai" in plain and "--param" not in plain


def test_errors_name_real_flags() -> None:
    res = runner.invoke(
        app, ["replay", "--trace", "synthetic", "--rate", "5", "--duration", "-1", "--no-progress"]
    )
    assert res.exit_code == 2
    assert "--duration:" in res.output and "--duration-s" not in res.output
    res = runner.invoke(
        app, ["replay", "--trace", "synthetic", "--rate", "5", "--timeout", "-1", "--no-progress"]
    )
    assert res.exit_code == 2 and "--timeout:" in res.output and "timeout-s" not in res.output


@pytest.mark.slow
def test_replay_repeats_and_warmup_with_opt(tmp_path: Path) -> None:
    out = tmp_path / "rep"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness.cli.main",
            "replay",
            "--trace",
            "synthetic",
            "--rate",
            "40",
            "--num-requests",
            "20",
            "--opt",
            "input_len=32",
            "--opt",
            "output_len=6",
            "--repeats",
            "2",
            "--warmup",
            "5",
            "-o",
            str(out),
            "--no-progress",
            "--no-gpu",
            "--speed",
            "4",
            "--policy",
            "vllm",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr + proc.stdout
    index = json.loads((out / "runs.json").read_text())
    assert [r["seed"] for r in index["runs"]] == [0, 1] and index["groups"] == ["vllm"]
    for r in index["runs"]:
        summary = json.loads((out / r["dir"] / "summary.json").read_text())
        assert summary["warmup"]["excluded"] == 5 and summary["completed"] == 15
    html = (out / "report.html").read_text(encoding="utf-8")
    assert "Headline metrics with 95% intervals" in html and "vllm (2 seeds)" in html


def test_chromium_launcher_prints_no_shell_error() -> None:
    """scripts/setup-browser.sh fixes Debian's /etc/chromium.d/dev-shm snippet, which printed
    "[: ...: unexpected operator" on every launch where /dev/shm is mounted twice."""
    if not Path("/usr/bin/chromium").exists():
        pytest.skip("/usr/bin/chromium not installed: run `bash scripts/setup-browser.sh`")
    proc = subprocess.run(
        ["/usr/bin/chromium", "--headless", "--version"], capture_output=True, text=True, timeout=60
    )
    assert "unexpected operator" not in proc.stderr, proc.stderr


def test_replay_warmup_single_run(tmp_path: Path) -> None:
    out = tmp_path / "one"
    proc = subprocess.run(
        [sys.executable, "-m", "harness.cli.main", "replay", "--trace", "synthetic"]
        + ["--rate", "40", "--num-requests", "20", "--opt", "input_len=32"]
        + ["--opt", "output_len=6", "--warmup", "5", "-o", str(out), "--no-progress"]
        + ["--no-gpu", "--speed", "4"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr + proc.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["warmup"]["excluded"] == 5 and summary["completed"] == 15
    assert json.loads((out / "run.json").read_text())["warmup"] == {"requests": 5}
