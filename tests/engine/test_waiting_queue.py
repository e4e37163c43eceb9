"""Both simulator hosts' waiting queue (harness/engine/waiting_queue.py)."""

from __future__ import annotations

import numpy as np
import pytest

from harness.engine.waiting_queue import WaitingQueue


def test_the_queue_matches_a_list_under_random_operations() -> None:
    rng = np.random.default_rng(1)
    q, model = WaitingQueue(), []  # model: host order, preempted at the front
    nxt = 0
    out: set[int] = set()  # rows taken out, may come back at the front
    for _ in range(5000):
        op = rng.integers(0, 5)
        if op == 0:
            q.append(nxt)
            model.append(nxt)
            nxt += 1
        elif op == 1 and out:
            j = sorted(out)[int(rng.integers(0, len(out)))]
            out.discard(j)
            q.appendleft(j)
            model.insert(0, j)
        elif op == 2 and model:
            assert q.popleft() == model.pop(0)
        elif op == 3 and model:
            j = model[int(rng.integers(0, len(model)))]  # out of order (priority admission)
            q.remove(j)
            model.remove(j)
            out.add(j)
        assert len(q) == len(model)
        assert list(q) == model
        if model:
            assert q[0] == model[0] and q[len(model) - 1] == model[-1]
    with pytest.raises(IndexError):
        WaitingQueue()[0]
