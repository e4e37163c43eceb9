"""Column plans (harness/policies/columns.py): the columns an object host builds, the plan
mapped back to request ids, and the shared admission and chunking rules."""

from __future__ import annotations

import numpy as np
from paper_host import FakeReq, decoding, make_view

from harness.policies.columns import (
    ColumnPlan,
    RequestKeys,
    admit_sizes,
    columns_of,
    plan_of,
    prefill_chunks,
)
from harness.policies.common import admit_list


def _view():
    running = [
        decoding("d0", 10, 3, 50),
        FakeReq("p0", 40, 20, num_computed_tokens=16),  # a partial prefill
        decoding("d1", 7, 1, 9),
        FakeReq("p1", 30, 20, num_output_tokens=2, num_computed_tokens=0),  # recompute
    ]
    waiting = [FakeReq("w0", 12, 5), FakeReq("w1", 800, 5), FakeReq("w2", 3, 5)]
    return make_view(waiting, running, block_size=16, token_budget=64, total_blocks=100)


def test_columns_of_reads_the_running_set_in_order() -> None:
    cv = columns_of(_view())
    rc = cv.running
    assert rc.prompt.tolist() == [10, 40, 7, 30]
    assert rc.output.tolist() == [3, 0, 1, 2]
    assert rc.computed.tolist() == [12, 16, 7, 0]
    assert rc.max_tokens.tolist() == [50, 20, 9, 20]
    assert rc.num_prefilling == 2
    dec, pre = rc.split()
    assert dec.tolist() == [0, 2] and pre.tolist() == [1, 3]
    assert rc.remaining().tolist() == [1, 24, 1, 32]
    assert cv.num_waiting == 3 and list(cv.waiting_tokens()) == [12, 800, 3]
    assert cv.kv.free_blocks == 100 - cv.kv.used_blocks


def test_columns_of_carries_keys_token_times_and_slos() -> None:
    running = [
        decoding("a", 10, 3, 50, last_token_s=1.5, tbt_slo_s=0.1),
        FakeReq("b", 40, 20, num_computed_tokens=16),  # no token yet, no SLO
    ]
    keys = RequestKeys()
    rc = columns_of(make_view([FakeReq("w", 5, 5)], running), keys).running
    assert rc.key.tolist() == [0, 1]
    assert rc.last[0] == 1.5 and np.isnan(rc.last[1])
    assert rc.tbt[0] == 0.1 and np.isnan(rc.tbt[1])
    # a key stays with its request while the host holds it: here "a" was preempted (waiting)
    # and "w" admitted, then "a" comes back
    cv = columns_of(make_view([running[0]], [running[1], FakeReq("w", 5, 5)]), keys)
    assert cv.running.key.tolist() == [1, 2] and cv.num_keys == 3
    assert keys.key("a") == 0
    assert columns_of(make_view([], [running[0]]), keys).running.key.tolist() == [0]


def test_request_keys_forget_what_the_host_no_longer_holds() -> None:
    keys = RequestKeys()
    for i in range(3000):  # one request at a time, each finished before the next
        keys.of(make_view([], [FakeReq(f"r{i}", 5, 5)]))
    assert len(keys._of) <= 2 * 1 + 1024 + 1  # pruned, amortised
    assert keys.next == 3000  # never reused: a policy's per-key state cannot leak across
    assert keys.key("r2999") == 2999


def test_plan_of_maps_positions_and_the_queue_head_to_ids() -> None:
    view = _view()
    cp = ColumnPlan(np.array([3, 0]), np.array([5, 1]), [12, 4], steady=False)
    plan = plan_of(cp, view)
    assert plan.run == [("p1", 5), ("d0", 1)]
    assert plan.admit == [("w0", 12), ("w1", 4)]
    everyone = plan_of(ColumnPlan(None, 1, (), steady=True, hold=True), view)
    assert [rid for rid, _ in everyone.run] == ["d0", "p0", "d1", "p1"]
    assert all(n == 1 for _, n in everyone.run) and everyone.steady and everyone.hold


def test_prefill_chunks_is_the_sequential_budget_fill() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(0, 8))
        prompt = rng.integers(1, 400, n)
        comp = np.minimum(rng.integers(0, 400, n), prompt - 1)
        cv = columns_of(
            make_view(
                (),
                [
                    FakeReq(f"r{i}", int(p), 5, num_computed_tokens=int(c))
                    for i, (p, c) in enumerate(zip(prompt, comp, strict=True))
                ],
            )
        )
        budget = int(rng.integers(0, 600))
        pos = np.arange(n)
        got_pos, got_tok, left = prefill_chunks(cv.running, pos, budget)
        want, b = [], budget
        for i in range(n):  # vllm-v0's / FT's loop over prefilling requests
            if b <= 0:
                break
            t = min(int(prompt[i] - comp[i]), b)
            want.append((i, t))
            b -= t
        assert list(zip(got_pos.tolist(), got_tok.tolist(), strict=True)) == want
        assert left == b


def _sizes(rems, budget, **kw):
    kw.setdefault("free_blocks", 99)
    return admit_sizes(rems, budget, 5, token_budget=64, block_size=16, **kw)


def test_admit_list_and_admit_sizes_are_one_rule() -> None:
    view = _view()
    for whole in (False, True):
        for full_kv in (False, True):
            ids = admit_list(view, 40, 5, whole=whole, full_kv=full_kv, free_blocks=3)
            sizes = admit_sizes(
                [12, 800, 3],
                40,
                5,
                token_budget=64,
                block_size=16,
                free_blocks=3,
                whole=whole,
                full_kv=full_kv,
            )
            assert [n for _, n in ids] == sizes
    # whole prompts stop at the 800-token one; chunked, it takes what the budget leaves
    assert _sizes([12, 800, 3], 40) == [12, 28]
    assert _sizes([12, 800, 3], 40, whole=True) == [12]
    # an oversize prompt may start alone when the whole budget is left (never a deadlock)
    assert _sizes([800], 64, whole=True) == [64]
    # full_kv: the whole remaining prefill must fit the free blocks
    assert _sizes([12, 800], 64, free_blocks=10) == [12, 52]
    assert _sizes([12, 800], 64, free_blocks=10, full_kv=True) == [12]
