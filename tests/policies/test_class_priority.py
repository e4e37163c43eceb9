"""class-priority: non-preemptive class priority over decode-priority FCFS mixed batches
(seed-stability.md §2.6, §7 REC 18): hand-built batches and invariants on the real core."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from paper_host import FakeReq, decoding, make_view

from harness.engine.config import EngineConfig
from harness.engine.core import EngineCore
from harness.engine.costmodel import AffineCostModel
from harness.policies import make_policy
from harness.policies.base import StepReport
from harness.policies.class_priority import class_label, parse_classes
from harness.policies.registry import available


def _plan(view, **kw):
    p = make_policy("class-priority", **kw)
    plan = p.schedule(view)
    return dict(plan.run), dict(plan.admit), plan


def test_registered() -> None:
    assert "class-priority" in available()


def test_labels_from_agent_graph_request_ids() -> None:
    r = FakeReq("A-12/1", 5, 3, tier="gold")
    assert class_label(r, "type") == "A"
    assert class_label(r, "hop") == "1"
    assert class_label(r, "tier") == "gold"
    # a session type whose own name holds a dash keeps it (split at the last one)
    assert class_label(FakeReq("fork-join-3/2", 5, 3), "type") == "fork-join"
    assert parse_classes("B, A") == ("B", "A")
    assert parse_classes(["1", "0"]) == ("1", "0")


def test_bad_parameters_are_value_errors() -> None:
    with pytest.raises(ValueError, match="class_by"):
        make_policy("class-priority", class_by="colour")
    with pytest.raises(ValueError, match="twice"):
        make_policy("class-priority", classes="A,A")


def test_high_class_fills_the_batch_first() -> None:
    """Budget 10: B's two decodes and B's waiting prompt take all of it; A gets nothing."""
    running = [
        decoding("A-0/0", 4, 1, 9),
        decoding("B-1/0", 4, 1, 9),
        decoding("A-2/0", 4, 1, 9),
        decoding("B-3/0", 4, 1, 9),
    ]
    waiting = [FakeReq("A-4/0", 5, 3), FakeReq("B-5/0", 20, 3)]
    run, admit, plan = _plan(
        make_view(waiting, running, token_budget=10), classes="B,A", class_by="type"
    )
    assert run == {"B-1/0": 1, "B-3/0": 1, "A-0/0": 0, "A-2/0": 0}
    assert admit == {"B-5/0": 8}
    # run order lists the high class first: KV victims (the tail) are the low class
    assert [rid for rid, _ in plan.run] == ["B-1/0", "B-3/0", "A-0/0", "A-2/0"]
    assert not plan.preempt and not plan.steady


def test_low_class_mixed_in_only_with_leftover_budget() -> None:
    """B offers 1 decode + a 3-token prompt; A fills the remaining 6 (decodes, then FCFS)."""
    running = [decoding("A-0/0", 4, 1, 9), decoding("B-1/0", 4, 1, 9), decoding("A-2/0", 4, 1, 9)]
    waiting = [FakeReq("A-4/0", 5, 3), FakeReq("B-5/0", 3, 3), FakeReq("A-6/0", 5, 3)]
    run, admit, _ = _plan(
        make_view(waiting, running, token_budget=10), classes="B,A", class_by="type"
    )
    assert run == {"B-1/0": 1, "A-0/0": 1, "A-2/0": 1}
    assert admit == {"B-5/0": 3, "A-4/0": 4}
    assert sum(run.values()) + sum(admit.values()) == 10  # work-conserving: a full batch


def test_reversed_priority_reverses_the_batch() -> None:
    running = [decoding("A-0/0", 4, 1, 9), decoding("B-1/0", 4, 1, 9)]
    waiting = [FakeReq("B-5/0", 20, 3), FakeReq("A-4/0", 20, 3)]
    view = make_view(waiting, running, token_budget=8)
    run_up, admit_up, _ = _plan(view, classes="B,A", class_by="type")
    run_down, admit_down, _ = _plan(view, classes="A,B", class_by="type")
    assert (run_up, admit_up) == ({"B-1/0": 1, "A-0/0": 0}, {"B-5/0": 7})
    assert (run_down, admit_down) == ({"A-0/0": 1, "B-1/0": 0}, {"A-4/0": 7})


@pytest.mark.parametrize("head", ["A", "none"])
@pytest.mark.parametrize("classes", [None, "A,B"])
def test_a_long_queue_is_read_only_as_far_as_admissions_go(classes: str | None, head: str) -> None:
    """Under overload the waiting queue is long: a step never reads it whole (issue 13:
    grouping it every step was quadratic). With one class the host's queue is read up to the
    last admission; with classes the policy keeps each class's queue from its hooks and reads
    none of the host's, also when the higher class has nobody waiting (a scan for it read the
    whole backlog of the other, every step), and again after the admissions are reported."""
    a = [FakeReq("A-0/0", 512, 3)] if head == "A" else []
    waiting = a + [FakeReq(f"B-{i}/0", 64, 3) for i in range(1, 20_000)]
    seen: list[str] = []

    class Counting(list):
        def __iter__(self):  # noqa: ANN204
            for r in super().__iter__():
                seen.append(r.request_id)
                yield r

    kw = {"classes": classes, "class_by": "type"} if classes else {}
    p = make_policy("class-priority", **kw)
    for r in waiting:
        p.on_arrival(r, 0.0)
    want = {"A-0/0": 512} if a else {f"B-{i}/0": 64 for i in range(1, 9)}
    for _ in range(2):
        view = replace(make_view([], [], token_budget=512), waiting=Counting(waiting))
        plan = p.schedule(view)
        assert dict(plan.run) == {} and dict(plan.admit) == want
        assert len(seen) <= (len(want) + 1 if classes is None else 0)
        seen.clear()
        # the host admits them; the next step's queue is the rest (nothing ran: no KV used)
        p.on_step(StepReport(0.0, 0.01, 1, 512, 0, len(want), 0, 0, admitted=tuple(want)))
        waiting = [r for r in waiting if r.request_id not in want]
        want = (
            {f"B-{i}/0": 64 for i in range(1, 9)} if a else {f"B-{i}/0": 64 for i in range(9, 17)}
        )


def test_ongoing_low_class_prefill_is_paused_not_preempted() -> None:
    """Non-preemptive (REC 18): a half-prefilled A keeps its KV (0 tokens), never evicted."""
    part = FakeReq("A-0/0", 100, 3, num_computed_tokens=40)
    waiting = [FakeReq("B-1/0", 50, 3)]
    run, admit, plan = _plan(
        make_view(waiting, [part], token_budget=50), classes="B,A", class_by="type"
    )
    assert run == {"A-0/0": 0} and admit == {"B-1/0": 50} and plan.preempt == []


def test_unlisted_class_ranks_last_and_one_class_is_sarathi() -> None:
    running = [decoding("C-0/0", 4, 1, 9), decoding("A-1/0", 4, 1, 9)]
    run, _, _ = _plan(make_view([], running, token_budget=1), classes="A", class_by="type")
    assert run == {"A-1/0": 1, "C-0/0": 0}
    # no classes: decode-priority FCFS, the same plan as sarathi on any view
    waiting = [FakeReq("x", 30, 3), FakeReq("y", 7, 3)]
    running = [decoding("d1", 4, 2, 9), FakeReq("p1", 20, 3, num_computed_tokens=8)]
    view = make_view(waiting, running, token_budget=24)
    a = make_policy("class-priority").schedule(view)
    b = make_policy("sarathi").schedule(view)
    assert (a.run, a.admit, a.steady) == (b.run, b.admit, b.steady)


def _available_work(core: EngineCore) -> int:
    """Σ p_i + #decoding (seed-stability.md §2.1): what a full batch could take at most."""
    work = 0
    for r in list(core.running) + list(core.waiting):
        rem = r.num_tokens - r.num_computed_tokens
        work += 1 if (r.num_output_tokens > 0 and rem == 1) else rem
    return work


@pytest.mark.parametrize("classes", ["B,A", "A,B"])
def test_work_conserving_on_the_core(classes: str) -> None:
    """Every batch takes min(b, available work) tokens (§2.1, Eq. 2.6) under either order, and
    the high class is never left waiting while the low class gets tokens."""
    rng = np.random.default_rng(5)
    b = 64
    cfg = EngineConfig(kv_tokens=1 << 22, token_budget=b, max_num_seqs=100_000, block_size=16)
    core = EngineCore(
        make_policy("class-priority", classes=classes, class_by="type"),
        AffineCostModel(base_s=1.0),
        cfg,
    )
    high = classes.split(",")[0]
    t, k, steps = 0.0, 0, 0
    while steps < 400:
        for _ in range(rng.poisson(0.9)):
            kind = "AB"[rng.integers(2)]
            core.add_request(
                f"{kind}-{k}/0", int(rng.integers(1, 60)), int(rng.integers(1, 40)), arrival_s=t
            )
            k += 1
        if not core.has_work():
            t += 1.0
            continue
        avail = _available_work(core)
        high_work = sum(
            1
            if (r.num_output_tokens > 0 and r.num_tokens - r.num_computed_tokens == 1)
            else r.num_tokens - r.num_computed_tokens
            for r in list(core.running) + list(core.waiting)
            if r.request_id.startswith(high)
        )
        out = core.step(t)
        load = sum(n for _, n, _ in out.scheduled)
        assert load == min(b, avail), (steps, load, avail)
        low = sum(n for rid, n, _ in out.scheduled if not rid.startswith(high))
        if low:  # the lower class got tokens only because the high class could not fill b
            assert high_work < b
        assert not out.preempted
        t = out.end_s
        steps += 1
