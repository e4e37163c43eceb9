"""common.SortedWaiting keeps waiting in a policy's order through the hooks alone: after any mix
of arrivals, admissions and preemptions it equals the stable sort of the host's queue."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from harness.policies.base import StepReport
from harness.policies.common import SortedWaiting


@dataclass
class _Req:
    request_id: str
    arrival_s: float
    num_prompt_tokens: int


def _report(admitted=(), preempted=(), finished=()) -> StepReport:
    return StepReport(
        0.0, 0.0, 1, 0, 0, 0, 0, 0, tuple(preempted), tuple(admitted), tuple(finished)
    )


class _View:
    def __init__(self, waiting):
        self.waiting = waiting


@pytest.mark.parametrize("host_order", [False, True])
def test_matches_a_stable_sort_of_the_host_queue(host_order: bool) -> None:
    rng = random.Random(3)
    key = (lambda r: r.num_prompt_tokens) if host_order else (lambda r: (r.arrival_s,))
    wq = SortedWaiting(key, host_order=host_order)
    front: list[_Req] = []  # the host: preempted at the front (latest first), then arrivals
    arrivals: list[_Req] = []
    running: list[_Req] = []
    for i in range(600):
        op = rng.random()
        if op < 0.5:
            r = _Req(f"r{i}", float(i // 3), rng.randint(1, 5))  # ties in both keys
            arrivals.append(r)
            wq.add(r)
        elif op < 0.8 and (front or arrivals):
            queue = front + arrivals
            r = queue[rng.randrange(len(queue))]
            (front if r in front else arrivals).remove(r)
            running.append(r)
            wq.on_step(_report(admitted=[r.request_id]))
        elif running:
            victims = rng.sample(running, min(len(running), rng.randint(1, 2)))
            for v in victims:
                running.remove(v)
                front.insert(0, v)
            wq.on_step(_report(preempted=[v.request_id for v in victims]))
        host = front + arrivals
        expect = (
            sorted(host, key=key)
            if host_order
            else sorted(host, key=lambda r: (r.arrival_s, r.request_id))
        )
        wq.sync(_View(host))
        assert [r.request_id for r in wq.iter()] == [r.request_id for r in expect]


def test_rebuilds_from_the_view_when_the_hooks_missed_something() -> None:
    wq = SortedWaiting(lambda r: r.arrival_s)
    a, b = _Req("a", 1.0, 1), _Req("b", 0.5, 1)
    wq.add(a)
    wq.sync(_View([b, a]))  # b arrived without on_arrival
    assert [r.request_id for r in wq.head(5)] == ["b", "a"]
