"""Host-pause monitor: steal windows sampled from a stat file, laid on request intervals."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from harness.results.hostpause import (
    HostMonitor,
    busy_cpu_s,
    group_cpu_s,
    own_cpu_s,
    read_steal,
    steal_within,
)

STAT = """cpu  10 0 10 100 0 0 0 {total} 0 0
cpu0 5 0 5 50 0 0 0 {a} 0 0
cpu1 5 0 5 50 0 0 0 {b} 0 0
intr 12345
"""


def write_stat(path: Path, a: int, b: int) -> None:
    path.write_text(STAT.format(total=a + b, a=a, b=b))


def test_read_steal_per_cpu(tmp_path: Path) -> None:
    p = tmp_path / "stat"
    write_stat(p, 7, 3)
    assert read_steal(str(p)) == [7, 3]  # the aggregate "cpu " line is not a CPU
    assert read_steal(str(tmp_path / "missing")) is None
    (tmp_path / "short").write_text("cpu0 1 2 3 4\n")  # no steal column
    assert read_steal(str(tmp_path / "short")) is None


def test_monitor_records_the_window_in_which_steal_grew(tmp_path: Path) -> None:
    p = tmp_path / "stat"
    write_stat(p, 0, 0)
    with HostMonitor(period_s=0.005, path=str(p)) as mon:
        deadline = time.monotonic() + 10
        while mon.periods < 1 and time.monotonic() < deadline:  # it has read the counters
            time.sleep(0.002)
        assert not mon.windows  # nothing stolen yet
        write_stat(p, 2, 1)  # three ticks stolen
        while not mon.windows and time.monotonic() < deadline:
            time.sleep(0.002)
    assert len(mon.windows) == 1
    start, end, steal = mon.windows[0]
    tick = mon.to_dict()["steal_total_s"] / 3
    assert steal == pytest.approx(3 * tick) and tick > 0
    assert mon.start_s <= start < end <= mon.end_s
    assert mon.available


def test_steal_within_counts_overlapping_windows() -> None:
    windows = [[10.00, 10.01, 0.01], [10.50, 10.51, 0.02], [12.00, 12.01, 0.01]]
    starts = np.array([9.0, 10.005, 10.011, 10.2, 9.0, 12.01, 13.0])
    ends = np.array([9.5, 10.02, 10.4, 10.6, 13.0, 12.5, 14.0])
    got = steal_within(starts, ends, windows)
    # [9, 9.5] none; [10.005, 10.02] the first; [10.011, 10.4] none (window ended before);
    # [10.2, 10.6] the second; [9, 13] all three; [12.01, 12.5] none (touches the end only)
    np.testing.assert_allclose(got, [0, 0.01, 0, 0.02, 0.04, 0, 0])
    assert steal_within(starts, ends, []).tolist() == [0.0] * len(starts)


def test_busy_cpu_reads_user_nice_system(tmp_path: Path) -> None:
    p = tmp_path / "stat"
    p.write_text("cpu  100 20 30 5000 40 7 8 9 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n")
    assert busy_cpu_s(str(p)) == pytest.approx(150 / os.sysconf("SC_CLK_TCK"))  # 100+20+30
    assert busy_cpu_s(str(tmp_path / "missing")) is None
    real = busy_cpu_s()
    assert real is not None and real > 0


def test_own_cpu_counts_reaped_children() -> None:
    before = own_cpu_s()
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.2: pass\n"
    subprocess.run([sys.executable, "-c", burn], check=True, timeout=60)
    assert own_cpu_s() - before >= 0.2


def test_group_cpu_counts_a_server_in_its_own_session() -> None:
    """A child in its own session that burns CPU: its group's CPU seconds see it (the
    fidelity sitting subtracts a server's group from the machine's busy time)."""
    burn = (
        "import time, sys\n"
        "t = time.process_time()\n"
        "while time.process_time() - t < 0.3: pass\n"
        "print('done', flush=True)\n"
        "sys.stdin.read()\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", burn],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "done"
        used = group_cpu_s(os.getpgid(proc.pid))
        assert 0.3 <= used < 30
    finally:
        proc.communicate("", timeout=30)
