"""`harness replay` under overload and signals, from the outside (issue 14, "Must show"):

- ``ulimit -n 256``: 3,000 requests at 1,000 req/s against a local server end with every
  request accounted for (completed + failed + not sent = planned), rows on disk, summary
  written, and one ``warning:`` line naming the open-file limit and the fix;
- SIGTERM ends a replay like Ctrl-C (partial run, summary.json, exit 128+15);
- killing the parent with SIGKILL leaves no built-in engine child behind.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.results import schema
from harness.results.rundir import read_run


def _harness(*args: str) -> list[str]:
    return [sys.executable, "-m", "harness.cli.main", "replay", *args]


@pytest.fixture
def fast_server() -> Iterator[str]:
    """benchmarks' fast SSE server (harness.loadgen.fastsse) in a child process."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness.loadgen.fastsse", "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("PORT "), line
        yield f"http://127.0.0.1:{int(line.split()[1])}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _limit_fds() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))


@pytest.mark.slow
def test_ulimit_256_every_request_accounted_for(tmp_path: Path, fast_server: str) -> None:
    out = tmp_path / "run"
    proc = subprocess.run(
        _harness("--trace", "lmsys", "--rate", "1000", "--num-requests", "3000",
                 "--target", fast_server, "--out", str(out), "--no-progress", "--no-report"),
        capture_output=True, text=True, timeout=240, preexec_fn=_limit_fds,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    run = read_run(out, chunks=False, samples=False)
    d = run.meta["dispatch"]
    assert d["planned"] == 3000
    assert d["completed"] + d["failed"] + d["not_sent"] == d["planned"]
    r = run.requests
    assert len(r) + d["not_sent"] == 3000 and r["req"].is_unique
    assert int(r["success"].sum()) == d["completed"]
    assert d["fd_limit"]["soft"] == 256
    assert set(r.loc[~r["success"], "error_kind"]) <= {schema.ERROR_CLIENT_LIMIT}
    if d["error_kinds"].get(schema.ERROR_CLIENT_LIMIT):
        assert "ulimit -n" in proc.stderr and "warning:" in proc.stderr
    assert (out / schema.SUMMARY_JSON).is_file()


def _start_long_replay(out: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        _harness("--trace", "synthetic", "--rate", "40", "--num-requests", "4000",
                 "--source-option", "input_len=16", "--source-option", "output_len=30",
                 "--out", str(out), "--no-progress", "--no-gpu", "--no-report",
                 "--sample-interval", "0", *extra),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip


def _wait_for_rows(proc: subprocess.Popen[str], out: Path) -> None:
    parts = out / (schema.REQUESTS_FILE + ".parts")
    deadline = time.monotonic() + 60
    while not (parts.is_dir() and any(parts.glob("part-*.parquet"))):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no flushed requests within 60 s"
        time.sleep(0.05)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_leave_partial_run(
    tmp_path: Path, sig: signal.Signals, signal_and_wait: Any
) -> None:
    out = tmp_path / "run"
    proc = _start_long_replay(out)
    try:
        _wait_for_rows(proc, out)
        stdout, stderr = signal_and_wait(proc, sig, 60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 128 + sig, stderr
    assert "partial run" in stdout and "Traceback" not in stderr
    run = read_run(out)
    assert run.meta["status"] == schema.STATUS_PARTIAL
    assert run.requests["success"].sum() >= 1 and run.requests["req"].is_unique
    summary = json.loads((out / schema.SUMMARY_JSON).read_text())
    # what was in flight at the signal is reported apart, not as SLO misses
    n_cancelled = int((run.requests["error_kind"] == schema.ERROR_CANCELLED).sum())
    assert n_cancelled >= 1 and summary["cancelled"] == n_cancelled


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(x) for x in text.split()]


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_killed_parent_leaves_no_engine_child(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = _start_long_replay(out)
    try:
        _wait_for_rows(proc, out)
        kids = _children(proc.pid)
        assert kids, "the built-in engine child was not found"
        proc.kill()
        proc.wait(timeout=10)
        deadline = time.monotonic() + 10
        while any(_alive(k) for k in kids):
            assert time.monotonic() < deadline, f"engine child {kids} outlived its parent"
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            proc.kill()
        for k in _children(proc.pid):
            os.kill(k, signal.SIGKILL)
    run = read_run(out)
    assert run.status == schema.STATUS_PARTIAL  # a killed writer's run reads as partial
    assert len(run.requests) >= 1


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_engine_killed_mid_run_is_marked_and_warned(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = subprocess.Popen(
        _harness("--trace", "synthetic", "--rate", "40", "--num-requests", "200",
                 "--source-option", "input_len=16", "--source-option", "output_len=30",
                 "--out", str(out), "--no-progress", "--no-gpu", "--no-report",
                 "--sample-interval", "0"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        _wait_for_rows(proc, out)
        # the engine is the spawned child that is not multiprocessing's resource tracker
        engines = [
            k
            for k in _children(proc.pid)
            if b"resource_tracker" not in Path(f"/proc/{k}/cmdline").read_bytes()
        ]
        assert len(engines) == 1
        os.kill(engines[0], signal.SIGKILL)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "Traceback" not in stderr
    assert "built-in engine process died" in stderr and "warning:" in stderr
    run = read_run(out)
    assert run.meta["status"] == schema.STATUS_PARTIAL and run.meta["engine_died"]
    d = run.meta["dispatch"]
    assert d["completed"] + d["failed"] + d["not_sent"] == d["planned"] == 200
    assert len(run.requests) == 200 and (~run.requests["success"]).any()


def test_closed_stdout_pipe_still_writes_everything(tmp_path: Path) -> None:
    """`harness replay ... | head -1`: the reader leaves early; the run, its summary and its
    report are still written and the exit code is 0."""
    out = tmp_path / "run"
    proc = subprocess.Popen(
        _harness("--trace", "synthetic", "--rate", "40", "--num-requests", "10",
                 "--source-option", "input_len=16", "--source-option", "output_len=4",
                 "--out", str(out), "--no-progress", "--no-gpu", "--sample-interval", "0",
                 "--speed", "4"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    proc.stdout.close()  # nobody reads stdout: every print hits EPIPE
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr.decode()[-2000:]
    assert b"Traceback" not in stderr
    assert (out / schema.SUMMARY_JSON).is_file() and (out / schema.REPORT_HTML).is_file()
    assert len(read_run(out).requests) == 10
