"""Live progress bar for a replay: sent, in flight, done, failed, output tokens/s.

Updated from the dispatcher's progress task a few times a second (never per request), so it
costs the event loop almost nothing; rich renders from its own thread.
"""

from __future__ import annotations

from collections import deque
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from harness import clock
from harness.loadgen.dispatcher import DispatchStats


class LiveProgress:
    """Context manager; pass :meth:`update` as the dispatcher's ``on_progress``."""

    def __init__(self, total: int | None = None, console: Console | None = None) -> None:
        self._progress = Progress(
            TextColumn("[bold]replay"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TextColumn("{task.fields[counts]}"),
            TimeElapsedColumn(),
            console=console or Console(stderr=True),
            transient=False,
            refresh_per_second=4,
        )
        self._task = self._progress.add_task("replay", total=total, counts="")
        self._window: deque[tuple[float, int]] = deque(maxlen=16)
        self._started = False

    def update(self, s: DispatchStats) -> None:
        if not self._started:  # start with the dispatch, not during the readiness check
            self._started = True
            self._progress.start()
        t = clock.now()
        self._window.append((t, s.tokens))
        t_old, tok_old = self._window[0]
        tps = (s.tokens - tok_old) / (t - t_old) if t > t_old else 0.0
        counts = (
            f"sent {s.sent}  in flight {s.in_flight}  done {s.done}  "
            f"failed {s.failed}  {tps:,.0f} tok/s"
        )
        self._progress.update(
            self._task,
            total=s.planned - s.not_sent,
            completed=s.done + s.failed,
            counts=counts,
        )

    def __enter__(self) -> LiveProgress:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._started:
            self._progress.stop()
