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
    deque operations the kernel's shared helpers use."""

    __slots__ = ("_front", "_rest")

    def __init__(self) -> None:
        self._front: deque[int] = deque()  # preempted, latest first
        self._rest: dict[int, None] = {}  # arrivals, in order

    def __len__(self) -> int:
        return len(self._front) + len(self._rest)

    def __iter__(self) -> Iterator[int]:
        return chain(self._front, self._rest)

    def __getitem__(self, i: int) -> int:
        if i == 0 and self._front:
            return self._front[0]
        if i < 0:
            i += len(self)
        try:
            return next(islice(iter(self), i, None))
        except StopIteration:
            raise IndexError(i) from None

    def append(self, j: int) -> None:
        self._rest[j] = None

    def appendleft(self, j: int) -> None:
        self._front.appendleft(j)

    def popleft(self) -> int:
        if self._front:
            return self._front.popleft()
        j = next(iter(self._rest))
        del self._rest[j]
        return j

    def remove(self, j: int) -> None:
        if self._rest.pop(j, 0) is not None:  # not an arrival still queued: preempted
            self._front.remove(j)


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
