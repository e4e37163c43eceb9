"""Helpers shared by the baseline policies (one place, not copy-pasted per policy).

All helpers only read the :class:`~harness.policies.base.View`; they never touch a host.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from harness.policies.base import RequestView, StepReport, View
from harness.policies.columns import ColumnView, admit_sizes


def split_running(
    running: Sequence[RequestView],
) -> tuple[list[RequestView], list[RequestView]]:
    """``(decoding, prefilling)`` in running order. Decoding = has output and its KV covers all
    but the last token (base.is_decoding); everything else still has prompt/recompute work."""
    dec: list[RequestView] = []
    pre: list[RequestView] = []
    for r in running:
        o = r.num_output_tokens
        if o > 0 and r.num_computed_tokens == r.num_prompt_tokens + o - 1:
            dec.append(r)
        else:
            pre.append(r)
    return dec, pre


def ordered_waiting(view: View, order: str) -> Iterable[RequestView]:
    """Waiting requests in admission order: ``fcfs`` keeps the host's queue order (preempted at
    the front, then arrivals); ``spf`` sorts by remaining prefill (shortest first, FCFS ties);
    ``priority`` sorts by (priority, arrival)."""
    if order == "fcfs":
        return view.waiting
    if order == "spf":
        return sorted(view.waiting, key=lambda r: r.num_tokens - r.num_computed_tokens)
    if order == "priority":
        # vLLM PriorityRequestQueue: smaller priority first, ties by earlier arrival; preempted
        # requests are re-sorted, not put at the front (anchors-engines.md §1.8)
        return sorted(view.waiting, key=lambda r: (r.priority, r.arrival_s))
    raise ValueError(f"unknown admission order {order!r} (fcfs, spf, priority)")


def admit_list(
    view: View,
    budget_left: int,
    seats: int,
    *,
    order: str = "fcfs",
    whole: bool = False,
    free_blocks: int | None = None,
    full_kv: bool = False,
    queue: Iterable[RequestView] | None = None,
) -> list[tuple[str, int]]:
    """Waiting requests to admit, head first, while budget, seats and KV allow.

    ``whole``: prompts are not chunked; admission stops at the first prompt that does not fit
    the budget left (vLLM ``break`` when chunked prefill is disabled, anchors-engines.md §1.4),
    except that a prompt larger than the whole budget may start alone, chunked by the host,
    so it can never deadlock (seed-stability.md §7 REC 6). Otherwise the last admission takes a
    chunk of what is left. Stops at the first request whose first chunk does not fit the free
    KV blocks (head-of-line, like the host); with ``full_kv`` at the first whose whole remaining
    prefill does not fit (so an admission never has to preempt to finish its prompt).
    ``queue``: the waiting requests already in ``order`` (a policy's :class:`SortedWaiting`),
    read lazily instead of sorting the view.
    """
    seen: list[RequestView] = []  # the requests read, so sizes map back to their ids

    def remaining() -> Iterator[int]:
        for r in ordered_waiting(view, order) if queue is None else queue:
            seen.append(r)
            yield r.num_tokens - r.num_computed_tokens

    sizes = admit_sizes(
        remaining(),
        budget_left,
        seats,
        token_budget=view.token_budget,
        block_size=view.kv.block_size,
        free_blocks=view.kv.free_blocks if free_blocks is None else free_blocks,
        whole=whole,
        full_kv=full_kv,
    )
    return [(r.request_id, n) for r, n in zip(seen, sizes, strict=False)]


def decode_blocks_needed(decoding: Sequence[RequestView], block_size: int) -> int:
    """New KV blocks a decode step of these requests allocates (those at a block boundary)."""
    return sum(1 for r in decoding if r.num_computed_tokens % block_size == 0)


class SortedWaiting:
    """``view.waiting`` in a policy's own order, kept across steps through the hooks.

    Why: sorting the whole waiting queue every step makes a step's cost grow with the queue,
    quadratic under overload (issue 13: "no scans of the whole waiting list per step"). Here
    a request is inserted once (``add`` from ``on_arrival``), leaves when the host reports it
    admitted and comes back when reported preempted (``on_step``), so a step reads only the
    head it needs. ``key(r)`` must not change while ``r`` waits; ties are broken by
    ``request_id``, so the order is exactly ``sorted(view.waiting, key=key)``. ``bucket(r)``
    optionally splits the queue (WAIT's per-type queues). If the hooks missed something (the
    sizes disagree with the view, e.g. a host aborted a waiting request), the queue is rebuilt
    from the view, so the order is always the view's.

    ``host_order``: ties are broken by the host's queue position instead (preempted at the
    front, latest preemption first, then arrivals in order), so the order is exactly the
    *stable* ``sorted(view.waiting, key=key)``.
    """

    def __init__(
        self,
        key: Callable[[RequestView], Any],
        buckets: int = 1,
        bucket: Callable[[RequestView], int] | None = None,
        *,
        host_order: bool = False,
    ) -> None:
        self._key = key
        self._bucket = bucket
        self._host_order = host_order
        self._arrived = 0  # host positions: arrivals count up, preemptions down (the front)
        self._front = 0
        self.queues: list[list[tuple[Any, int, str]]] = [[] for _ in range(buckets)]
        self._where: dict[str, tuple[int, tuple[Any, int, str]]] = {}  # rid -> (bucket, entry)
        self._known: dict[str, RequestView] = {}  # every request not yet finished

    def __len__(self) -> int:
        return len(self._where)

    def add(self, r: RequestView, *, front: bool = False) -> None:
        """``r`` joined waiting: an arrival, or (``front``) back after a preemption."""
        rid = r.request_id
        self._known[rid] = r
        if rid in self._where:
            return
        pos = 0
        if self._host_order:
            if front:
                self._front -= 1
                pos = self._front
            else:
                self._arrived += 1
                pos = self._arrived
        b = self._bucket(r) if self._bucket is not None else 0
        entry = (self._key(r), pos, rid)
        insort(self.queues[b], entry)
        self._where[rid] = (b, entry)

    def on_step(self, report: StepReport) -> None:
        """Apply a step: admitted leave the queue, preempted return, finished are forgotten."""
        for rid in report.admitted:
            got = self._where.pop(rid, None)
            if got is not None:
                q = self.queues[got[0]]
                i = bisect_left(q, got[1])
                if i < len(q) and q[i][2] == rid:
                    del q[i]
        for rid in report.preempted:  # in preemption order: each goes to the front
            r = self._known.get(rid)
            if r is not None:
                self.add(r, front=True)
        for rid in report.finished:
            self._known.pop(rid, None)

    def sync(self, view: View | ColumnView) -> None:
        """Rebuild from the view when the hooks missed something (sizes disagree)."""
        # a column view counts its waiting requests (its ``waiting`` is a lazy sequence)
        n = view.num_waiting if type(view) is ColumnView else len(view.waiting)
        if len(self._where) == n:
            return
        for q in self.queues:
            q.clear()
        self._where.clear()
        self._arrived = self._front = 0
        for r in view.waiting:  # host order: positions 1, 2, ...
            self.add(r)

    def known(self, rid: str) -> RequestView | None:
        """The request ``rid`` as last reported (waiting or running), None once finished or
        never reported."""
        return self._known.get(rid)

    def head(self, n: int, b: int = 0) -> list[RequestView]:
        """The first ``n`` waiting requests of bucket ``b``, in order."""
        known = self._known
        return [known[e[2]] for e in self.queues[b][:n]]

    def iter(self, b: int = 0) -> Iterator[RequestView]:
        """Bucket ``b`` in order (lazily: callers that stop early pay only for what they read)."""
        known = self._known
        return (known[e[2]] for e in self.queues[b])
