"""What else the machine did during a measurement: hypervisor pauses, other processes' CPU.

Why: on a shared virtual machine a neighbour can stop the guest's CPUs for tens of
milliseconds. A latency measured across such a pause measures the host, not the engine, and
on a 2-core box one pause that lands on a burst decides a P99 of a few hundred requests.
Linux counts the time each virtual CPU was runnable but not run by the hypervisor as *steal*
(``/proc/stat``, 8th value of each ``cpuN`` line, in USER_HZ ticks): :class:`HostMonitor`
samples it on a thread every ``period_s`` and keeps the windows in which it grew.
(The thread's own wake-up lateness is no host signal: in a Python process it waits for the
GIL as often as for a CPU, so it is not recorded.) :func:`steal_within`
then says how much steal overlapped each request's interval, so a comparison can report the
requests a pause touched and leave them out on both sides.

The monitor reads one small file per period (~50 µs): nothing on the measured processes.

:func:`busy_cpu_s`, :func:`own_cpu_s` and :func:`group_cpu_s` measure the other half of
"a quiet machine": the CPU time that processes outside the measurement used meanwhile
(all busy time, less this process, its reaped children and a server's process group). A
load average cannot say it: a measurement that pins its own threads onto one core raises
the load by itself.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01


def read_steal(path: str = "/proc/stat") -> list[int] | None:
    """Cumulative steal ticks of each CPU (``cpuN`` lines), or None where the file has none
    (not Linux, or a kernel without steal accounting)."""
    try:
        with open(path) as fh:
            lines = fh.readlines()
    except OSError:
        return None
    out: list[int] = []
    for line in lines:
        if line.startswith("cpu") and line[3:4].isdigit():
            f = line.split()
            if len(f) < 9:
                return None
            out.append(int(f[8]))
    return out or None


class HostMonitor:
    """Samples per-CPU steal every ``period_s`` on a daemon thread, from ``__enter__`` to
    ``__exit__``. ``windows``: ``(start, end, steal_s)`` rows (``time.time()`` seconds) for
    each period in which steal grew (summed over CPUs); ``steal_total_s`` over the watch."""

    def __init__(self, period_s: float = 0.01, path: str = "/proc/stat") -> None:
        self.period_s = period_s
        self.path = path
        self.windows: list[tuple[float, float, float]] = []
        self.start_s = self.end_s = 0.0
        self.steal_total_s = 0.0
        self.periods = 0  # periods sampled so far
        self.available = read_steal(path) is not None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        prev = read_steal(self.path)
        t_prev = time.time()
        while not self._stop.wait(self.period_s):
            now = time.time()
            cur = read_steal(self.path)
            steal = 0.0
            if prev is not None and cur is not None and len(cur) == len(prev):
                steal = sum(c - p for c, p in zip(cur, prev, strict=True)) * _TICK_S
            if steal > 0:
                self.windows.append((t_prev, now, steal))
                self.steal_total_s += steal
            prev, t_prev = cur, now
            self.periods += 1

    def __enter__(self) -> HostMonitor:
        self.start_s = time.time()
        self._thread = threading.Thread(target=self._run, name="host-monitor", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.end_s = time.time()

    def to_dict(self) -> dict[str, Any]:
        return {
            "available": self.available,
            "period_s": self.period_s,
            "start_s": self.start_s,
            "end_s": self.end_s,
            "steal_total_s": round(self.steal_total_s, 3),
            "windows": [list(w) for w in self.windows],
        }

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_dict()))


def busy_cpu_s(path: str = "/proc/stat") -> float | None:
    """CPU seconds all CPUs spent running processes since boot (``/proc/stat``'s ``cpu`` line:
    user + nice + system; interrupts, idle and steal left out); None where unreadable."""
    try:
        with open(path) as fh:
            f = fh.readline().split()
        return (int(f[1]) + int(f[2]) + int(f[3])) * _TICK_S
    except (OSError, IndexError, ValueError):
        return None


def own_cpu_s() -> float:
    """CPU seconds of this process and of the children it has reaped."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def group_procs(pgid: int) -> list[tuple[Path, list[str]]]:
    """The live processes of process group ``pgid``: each one's ``/proc/PID`` and its
    ``stat`` fields from the 3rd (state) on (the command name, which may hold spaces, cut)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        f = stat[stat.rindex(")") + 2 :].split()
        if int(f[2]) == pgid:  # 5th field: process group
            out.append((d, f))
    return out


def group_cpu_s(pgid: int) -> float:
    """CPU seconds of the live processes in process group ``pgid`` (each with the children
    it reaped): a server started in its own session, measured before it is stopped."""
    ticks = sum(int(f[11]) + int(f[12]) + int(f[13]) + int(f[14]) for _, f in group_procs(pgid))
    return ticks * _TICK_S  # utime, stime, cutime, cstime


def steal_within(
    starts: np.ndarray, ends: np.ndarray, windows: list[list[float]] | np.ndarray
) -> np.ndarray:
    """Steal seconds of the windows that overlap each interval ``[starts[i], ends[i]]``
    (a window's steal counted in full where it overlaps at all: the counter says only that
    the pause fell somewhere inside the window)."""
    starts = np.asarray(starts, dtype=float)
    ends = np.asarray(ends, dtype=float)
    w = np.asarray(windows, dtype=float).reshape(-1, 3)
    out = np.zeros(len(starts))
    if len(w) == 0:
        return out
    order = np.argsort(w[:, 0], kind="stable")
    w0, w1, steal = w[order, 0], w[order, 1], w[order, 2]
    cum = np.concatenate(([0.0], np.cumsum(steal)))
    # windows do not overlap each other (one sampler), so those overlapping [s, e] are a run:
    # from the first ending after s to the last starting before e
    lo = np.searchsorted(w1, starts, side="right")
    hi = np.searchsorted(w0, ends, side="left")
    ok = hi > lo
    out[ok] = cum[hi[ok]] - cum[lo[ok]]
    return out


__all__ = [
    "HostMonitor",
    "busy_cpu_s",
    "group_cpu_s",
    "group_procs",
    "own_cpu_s",
    "read_steal",
    "steal_within",
]
