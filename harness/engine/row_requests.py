"""Request objects of the vectorised kernel's column host.

The kernel (:mod:`harness.engine.fastsim`) keeps requests as trace rows in arrays. A column
policy (:mod:`harness.policies.columns`) reads the running set from columns, but its hooks and
its own waiting order (a :class:`~harness.policies.common.SortedWaiting`, RAD's heap) work on
request objects: :class:`RowRequest` is that object for one row, made when first asked for.
It is current while the request waits (the only time a column policy reads one: a waiting
request's state lives in the rows); read while running it raises, so a policy that reads the
running set through objects fails loudly instead of planning from stale numbers.

:class:`WaitingRows` is the waiting queue (a :class:`~harness.engine.waiting_queue.WaitingQueue`
of rows) as such objects, for ``ColumnView.waiting``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, NoReturn

from harness.engine.waiting_queue import WaitingQueue

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
        if self._rows.state_mv[self.index] == RUNNING:
            self._running()
        return self.index

    def _running(self) -> NoReturn:
        raise RuntimeError(
            f"{self.request_id!r} is running: a column policy reads the running set from "
            "the columns, not from request objects"
        )

    @property
    def num_output_tokens(self) -> int:
        # (the check inline: policies read this of every waiting request they rank)
        rows, j = self._rows, self.index
        if rows.state_mv[j] == RUNNING:
            self._running()
        return rows.Orow_mv[j]

    @property
    def num_computed_tokens(self) -> int:
        if self._rows.state_mv[self.index] == RUNNING:  # (inline: read with the outputs)
            self._running()
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


class WaitingRows(Sequence):
    """The waiting queue as request objects (ColumnView.waiting), made lazily."""

    __slots__ = ("_queue", "_obj")

    def __init__(self, queue: WaitingQueue[int], obj: Any) -> None:
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


__all__ = ["RowMeta", "RowRequest", "WaitingRows"]
