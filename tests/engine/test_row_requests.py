"""The column host's request objects (harness/engine/row_requests.py)."""

from __future__ import annotations

import pytest

from harness.engine.fastsim import Rows
from harness.engine.row_requests import RowMeta, RowRequest, WaitingRows
from harness.engine.waiting_queue import WaitingQueue


def test_row_requests_are_current_while_waiting_and_refuse_when_running() -> None:
    rows = Rows([10, 20], [5, 6])
    rows.meta = RowMeta(
        ["a", "b"], [0.5, 1.5], ["paid", "free"], [0, 1], [2.0, 10.0], [0.1, 0.5], None
    )
    q = WaitingQueue()
    q.append(0)
    q.append(1)
    objs: dict[int, RowRequest] = {}

    def obj(j: int) -> RowRequest:
        return objs.setdefault(j, RowRequest(rows, rows.meta, j))

    waiting = WaitingRows(q, obj)
    a, b = list(waiting)
    assert (a.request_id, a.arrival_s, a.tier, a.priority, a.tbt_slo_s) == (
        "a",
        0.5,
        "paid",
        0,
        0.1,
    )
    assert a.num_tokens == 10 and a.num_computed_tokens == 0 and a.predicted_output_len is None
    rows.Orow[1] = 3  # b was preempted after 3 tokens: its re-prefill covers them
    rows.last[1] = 4.0
    assert b.num_tokens == 23 and b.last_token_s == 4.0 and b.first_token_s is None
    assert waiting[1] is b and len(waiting) == 2
    rows.state[0] = 1  # running: the columns hold its state, not the object
    with pytest.raises(RuntimeError, match="running"):
        _ = a.num_output_tokens
