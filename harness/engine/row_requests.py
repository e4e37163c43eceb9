"""Request objects and the waiting queue of the vectorised kernel's column host.

The kernel (:mod:`harness.engine.fastsim`) keeps requests as trace rows in arrays. A column
policy (:mod:`harness.policies.columns`) reads the running set from columns, but its hooks and
its own waiting order (a :class:`~harness.policies.common.SortedWaiting`, RAD's heap) work on
request objects: :class:`RowRequest` is that object for one row, made when first asked for.
It is current while the request waits (the only time a column policy reads one: a waiting
request's state lives in the rows); read while running it raises, so a policy that reads the
running set through objects fails loudly instead of planning from stale numbers.

:class:`RowQueue` is the waiting queue in host order (preempted at the front, latest first,
then arrivals) with O(1) removal from the middle: a policy that admits out of queue order (by
priority, by type) must not cost a scan of the queue per admission (issue 13).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence
from itertools import chain, islice
from typing import Any

RUNNING = 1  # fastsim's _RUNNING


class RowMeta:
    """What a request object says about each trace row besides its lengths."""

    __slots__ = ("ids", "arrival", "tier", "priority", "ttft", "tbt", "predicted")

    def __init__(
        self,
        ids: list[str],
        arrival: list[float],
        tier: list[str],
        priority: list[int],
        ttft: list[float | None],
        tbt: list[float | None],
        predicted: list[int] | None,
    ) -> None:
        self.ids = ids
        self.arrival = arrival
        self.tier = tier
        self.priority = priority
        self.ttft = ttft
        self.tbt = tbt
        self.predicted = predicted  # None: output lengths unknown to policies


class RowRequest:
    """One trace row as a :class:`~harness.policies.base.RequestView` (module docstring)."""

    __slots__ = (
        "request_id",
        "arrival_s",
        "num_prompt_tokens",
        "max_tokens",
        "predicted_output_len",
        "tier",
        "priority",
        "ttft_slo_s",
        "tbt_slo_s",
        "index",
        "_rows",
    )

    def __init__(self, rows: Any, meta: RowMeta, j: int) -> None:
        self.request_id = meta.ids[j]
        self.arrival_s = meta.arrival[j]
        self.num_prompt_tokens = rows.P[j]
        self.max_tokens = rows.M[j]
        self.predicted_output_len = None if meta.predicted is None else meta.predicted[j]
        self.tier = meta.tier[j]
        self.priority = meta.priority[j]
        self.ttft_slo_s = meta.ttft[j]
        self.tbt_slo_s = meta.tbt[j]
        self.index = j
        self._rows = rows

    def _waiting_row(self) -> int:
        if self._rows.state[self.index] == RUNNING:
            raise RuntimeError(
                f"{self.request_id!r} is running: a column policy reads the running set from "
                "the columns, not from request objects"
            )
        return self.index

    @property
    def num_output_tokens(self) -> int:
        return int(self._rows.Orow[self._waiting_row()])

    @property
    def num_computed_tokens(self) -> int:
        self._waiting_row()
        return 0  # no KV while waiting (the kernel has no prefix cache)

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + self.num_output_tokens

    @property
    def first_token_s(self) -> float | None:
        v = float(self._rows.first[self._waiting_row()])
        return None if v != v else v

    @property
    def last_token_s(self) -> float | None:
        v = float(self._rows.last[self._waiting_row()])
        return None if v != v else v

    @property
    def num_preemptions(self) -> int:
        return int(self._rows.npre[self._waiting_row()])

    def __repr__(self) -> str:
        return f"RowRequest({self.request_id!r}, row={self.index})"


class RowQueue:
    """Waiting rows in host order with O(1) removal anywhere (the module docstring); the
    deque operations the kernel's shared helpers use. Arrivals sit in a deque; one removed
    from the middle is only marked (``_gone``) and skipped when the head reaches it, so every
    operation is O(1) amortised (a dict popped from the front would rescan its deleted slots
    on every pop: quadratic in a long queue)."""

    __slots__ = ("_front", "_rest", "_gone", "_n")

    def __init__(self) -> None:
        self._front: deque[int] = deque()  # preempted, latest first
        self._rest: deque[int] = deque()  # arrivals, in order (some maybe marked gone)
        self._gone: set[int] = set()  # rows whose entry in _rest is stale
        self._n = 0

    def __len__(self) -> int:
        return self._n

    def _trim(self) -> None:
        rest, gone = self._rest, self._gone
        while rest and rest[0] in gone:
            gone.discard(rest.popleft())

    def __iter__(self) -> Iterator[int]:
        gone = self._gone
        if not gone:
            return chain(self._front, self._rest)
        return chain(self._front, (j for j in self._rest if j not in gone))

    def __getitem__(self, i: int) -> int:
        if i == 0:
            if self._front:
                return self._front[0]
            self._trim()
            if self._rest:
                return self._rest[0]
            raise IndexError(i)
        if i < 0:
            i += self._n
        try:
            return next(islice(iter(self), i, None))
        except StopIteration:
            raise IndexError(i) from None

    def append(self, j: int) -> None:
        self._rest.append(j)
        self._n += 1

    def appendleft(self, j: int) -> None:
        self._front.appendleft(j)
        self._n += 1

    def popleft(self) -> int:
        if self._front:
            self._n -= 1
            return self._front.popleft()
        self._trim()
        j = self._rest.popleft()
        self._n -= 1
        return j

    def remove(self, j: int) -> None:
        """Remove waiting row ``j`` (it must be waiting here)."""
        if j in self._front:  # preempted ones: few
            self._front.remove(j)
        else:
            self._gone.add(j)
        self._n -= 1


class WaitingRows(Sequence):
    """The waiting queue as request objects (ColumnView.waiting), made lazily."""

    __slots__ = ("_queue", "_obj")

    def __init__(self, queue: RowQueue, obj: Any) -> None:
        self._queue = queue
        self._obj = obj  # row -> RowRequest

    def __len__(self) -> int:
        return len(self._queue)

    def __iter__(self) -> Iterator[RowRequest]:
        return map(self._obj, self._queue)

    def __getitem__(self, i):  # type: ignore[no-untyped-def]
        if isinstance(i, slice):
            return [self._obj(j) for j in list(self._queue)[i]]
        return self._obj(self._queue[i])


__all__ = ["RowMeta", "RowQueue", "RowRequest", "WaitingRows"]
