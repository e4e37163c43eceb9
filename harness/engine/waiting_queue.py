"""The waiting queue of the simulator's hosts: host order (preempted requests at the front,
latest first, then arrivals in order) with removal from anywhere.

Why not a dict in arrival order (what the engine core used): popping a dict's first entries
leaves deleted slots that every later "first entry" lookup rescans until the dict is resized,
so reading the head of a long queue (overload) cost grew with the queue, on every step. A
policy that admits out of queue order (by priority, by type) also removes from the middle;
here that is a mark, skipped when the head reaches it: every operation O(1) amortised.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterator
from itertools import chain, islice
from typing import Generic, TypeVar

T = TypeVar("T", bound=Hashable)


class WaitingQueue(Generic[T]):
    """A host's waiting queue (the module docstring): the deque operations, plus ``remove``
    anywhere in O(1) amortised. Arrivals sit in a deque; one removed from the middle is only
    marked (``_gone``) and skipped when the head reaches it."""

    __slots__ = ("_front", "_rest", "_gone", "_n")

    def __init__(self) -> None:
        self._front: deque[T] = deque()  # preempted, latest first
        self._rest: deque[T] = deque()  # arrivals, in order (some maybe marked gone)
        self._gone: set[T] = set()  # items whose entry in _rest is stale
        self._n = 0

    def __len__(self) -> int:
        return self._n

    def _trim(self) -> None:
        rest, gone = self._rest, self._gone
        while rest and rest[0] in gone:
            gone.discard(rest.popleft())

    def __iter__(self) -> Iterator[T]:
        gone = self._gone
        if not gone:
            return chain(self._front, self._rest)
        return chain(self._front, (j for j in self._rest if j not in gone))

    def __getitem__(self, i: int) -> T:
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

    def append(self, j: T) -> None:
        self._rest.append(j)
        self._n += 1

    def appendleft(self, j: T) -> None:
        self._front.appendleft(j)
        self._n += 1

    def popleft(self) -> T:
        if self._front:
            self._n -= 1
            return self._front.popleft()
        self._trim()
        j = self._rest.popleft()
        self._n -= 1
        return j

    def remove(self, j: T) -> None:
        """Remove ``j``, which must be in the queue."""
        if j in self._front:  # preempted ones: few
            self._front.remove(j)
        else:
            self._gone.add(j)
        self._n -= 1


__all__ = ["WaitingQueue"]
