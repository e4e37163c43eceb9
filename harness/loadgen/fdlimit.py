"""The open-file budget of a replay: how many requests may be in flight before sockets would
exhaust ``RLIMIT_NOFILE`` (EMFILE, "Too many open files").

Why: every in-flight request holds one socket; once the process runs out of descriptors the
next socket *and* the next Parquet part fail, so an overloaded run used to crash with
``Errno 24`` and lose every row. The budget keeps ``RESERVED_FDS`` descriptors for the run
writer (part files, run.json, the final merge), the sampler, worker threads and the engine
child's pipe; the dispatcher never lets more requests than the rest be in flight and records
each one it could not send as ``client_limit`` (issue 14, point 1).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

# Descriptors kept back for everything that is not a request socket: Parquet part files
# (.tmp + rename, three tables), run.json rewrites, the final merge (reads one part while
# writing the table), the sampler's HTTP connection, the asyncio self-pipe and epoll, worker
# threads, the progress bar's terminal, the built-in engine child's pipe.
RESERVED_FDS = 64


@dataclass(frozen=True)
class FdBudget:
    """``soft``/``hard``: RLIMIT_NOFILE after :func:`raise_nofile`; ``open_now``: descriptors
    already open; ``max_in_flight``: requests that may hold a socket at once (None: no limit
    is known, e.g. on a platform without ``resource``)."""

    soft: int | None
    hard: int | None
    open_now: int
    max_in_flight: int | None

    def advice(self) -> str:
        """The fix, for the terminal line that names the cause."""
        return (
            f"the open-file limit (ulimit -n {self.soft}) allows {self.max_in_flight} requests "
            "in flight; raise it (e.g. `ulimit -n 65536`) or lower --rate / set "
            "--max-concurrency"
        )


def _open_fds() -> int:
    for d in ("/proc/self/fd", "/dev/fd"):
        try:
            return len(os.listdir(d))
        except OSError:
            continue
    return 16


def raise_nofile(target: int | None = None) -> tuple[int | None, int | None]:
    """Raise the soft RLIMIT_NOFILE to the hard limit (or ``target`` if lower); return
    (soft, hard) afterwards. Never fails: a platform without the call keeps its limit."""
    try:
        import resource
    except ImportError:  # Windows
        return None, None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if target is None else min(target, hard)
    if hard == resource.RLIM_INFINITY and target is None:
        want = max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and want > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError):
            pass
    inf = resource.RLIM_INFINITY
    return (None if soft == inf else soft), (None if hard == inf else hard)


def fd_budget(reserved: int = RESERVED_FDS) -> FdBudget:
    """Raise the soft limit, then the number of requests that may be in flight (>= 1)."""
    soft, hard = raise_nofile()
    open_now = _open_fds()
    if soft is None:
        return FdBudget(soft, hard, open_now, None)
    return FdBudget(soft, hard, open_now, max(1, soft - open_now - reserved))
