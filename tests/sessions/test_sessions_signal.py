"""A session replay ended by SIGTERM keeps its session figures (summary.json["sessions"])."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from harness.results import schema


def test_sigterm_keeps_the_session_summary(tmp_path: Path, signal_and_wait: Any) -> None:
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "harness.cli.main", "replay", "--trace", "synthetic-conv"]
    cmd += ["--session-rate", "20", "--num-sessions", "2000", "--out", str(out)]
    cmd += ["--no-progress", "--no-gpu", "--sample-interval", "0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        parts = out / (schema.REQUESTS_FILE + ".parts")
        deadline = time.monotonic() + 40
        while not (parts.is_dir() and any(parts.glob("part-*.parquet"))):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no flushed requests within 40 s"
            time.sleep(0.05)
        _, stderr = signal_and_wait(proc, signal.SIGTERM, 40)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
    assert proc.returncode == 128 + signal.SIGTERM, stderr
    assert "Traceback" not in stderr
    summary = json.loads((out / schema.SUMMARY_JSON).read_text())
    assert summary["sessions"]["sessions"] >= 1
