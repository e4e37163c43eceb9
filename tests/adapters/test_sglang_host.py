"""The SGLang host logic (adapters/sglang/host.py) with stand-in scheduler objects.

The stand-ins follow sglang 0.5.23's contracts: ``get_new_batch_prefill`` takes requests from
``waiting_queue`` in order while its budget allows (head-of-line, like ``PrefillAdder``) and
leaves ``waiting_queue = [x for x in waiting_queue if x not in can_run]``
(``managers/scheduler.py``); ``Req`` exposes ``rid``, ``origin_input_ids``, ``output_ids``,
``sampling_params.{max_new_tokens,custom_params}``, ``priority``, ``kv.kv_committed_len``,
``retraction_count`` and ``finished()``. The same code against SGLang's real classes:
test_sglang_real.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from adapters.sglang import plugin
from adapters.sglang.host import SGLangHost
from adapters.sglang.view import SglRequestView
from harness.policies.base import Plan, StepReport, View, is_decoding
from harness.policies.registry import make_policy


@dataclass(eq=False)
class FakeReq:
    rid: str
    prompt: int
    max_new: int
    custom: dict[str, Any] | None = None
    priority: int | None = None
    output_ids: list[int] = field(default_factory=list)
    retraction_count: int = 0
    done: bool = False

    def __post_init__(self) -> None:
        self.origin_input_ids = list(range(self.prompt))
        self.sampling_params = SimpleNamespace(
            max_new_tokens=self.max_new, custom_params=self.custom
        )
        self.kv = SimpleNamespace(kv_committed_len=0)

    def finished(self) -> bool:
        return self.done


class Mode:
    def __init__(self, extend: bool) -> None:
        self.extend = extend

    def is_extend(self) -> bool:
        return self.extend


def plan_factory(batch: Any, running: Any) -> Any:
    return SimpleNamespace(batch_to_run=batch, running_batch=running)


def make_sched(waiting: list[FakeReq], budget: int = 10_000) -> Any:
    return SimpleNamespace(
        waiting_queue=list(waiting),
        chunked_req=None,
        max_total_num_tokens=4096,
        page_size=16,
        token_to_kv_pool_allocator=SimpleNamespace(available_size=lambda: 4096),
        tree_cache=SimpleNamespace(evictable_size=lambda: 0),
        max_prefill_tokens=budget,
        max_running_requests=8,
        enable_overlap=False,
        seen_queues=[],
    )


def fake_prefill(sched: Any, running: Any) -> Any:
    """SGLang's prefill contract: head-of-line over waiting_queue within max_prefill_tokens."""
    sched.seen_queues.append([r.rid for r in sched.waiting_queue])
    left = sched.max_prefill_tokens
    can_run = []
    for r in sched.waiting_queue:
        n = r.prompt + len(r.output_ids)
        if n > left:
            break
        left -= n
        can_run.append(r)
    sched.waiting_queue = [x for x in sched.waiting_queue if x not in can_run]
    if not can_run:
        return plan_factory(None, running)
    batch = SimpleNamespace(
        reqs=can_run, forward_mode=Mode(True), extend_lens=[r.prompt for r in can_run]
    )
    return plan_factory(batch, running)


class Scripted:
    """A policy that returns queued plans and records what the host showed it."""

    name = "scripted"

    def __init__(self, *plans: Plan) -> None:
        self.plans = list(plans)
        self.views: list[View] = []
        self.reports: list[StepReport] = []
        self.arrivals: list[str] = []

    def on_arrival(self, r: Any, now: float) -> None:
        self.arrivals.append(r.request_id)

    def schedule(self, view: View) -> Plan:
        self.views.append(view)
        return self.plans.pop(0) if self.plans else Plan()

    def on_step(self, report: StepReport) -> None:
        self.reports.append(report)


def running_batch(reqs: list[FakeReq]) -> Any:
    return SimpleNamespace(reqs=list(reqs))


def test_view_maps_req_fields_and_tiers() -> None:
    r = FakeReq("a", 10, 5, {"tier": "paid", "tbt_slo_ms": 80, "predicted_output_len": 4}, 2)
    v = SglRequestView(r, 1.5)
    assert (v.request_id, v.tier, v.priority, v.arrival_s) == ("a", "paid", 2, 1.5)
    assert v.tbt_slo_s == pytest.approx(0.08) and v.predicted_output_len == 4
    assert v.ttft_slo_s is not None  # paid's TTFT from the default tier table
    assert (v.num_prompt_tokens, v.num_output_tokens, v.num_computed_tokens) == (10, 0, 0)
    r.kv.kv_committed_len = 10
    r.output_ids.append(1)
    assert is_decoding(v) and v.num_tokens == 11
    r.kv.kv_committed_len = 99  # never more than the request's tokens
    assert v.num_computed_tokens == 11
    plain = SglRequestView(FakeReq("b", 3, 7), 0.0)
    assert plain.tier == "default" and plain.ttft_slo_s is None and plain.priority == 0
    r.sampling_params.max_new_tokens = None
    assert v.max_tokens == 128  # SGLang's default max_new_tokens


def test_empty_admit_is_a_decode_step_without_calling_sglang() -> None:
    a, b = FakeReq("a", 10, 3), FakeReq("b", 5, 3)
    sched = make_sched([a, b])
    pol = Scripted(Plan())
    host = SGLangHost(pol, next_batch_plan=plan_factory)
    rb = running_batch([])
    out = host.around_prefill(fake_prefill, sched, rb)
    assert out.batch_to_run is None and out.running_batch is rb
    assert sched.seen_queues == [] and [r.rid for r in sched.waiting_queue] == ["a", "b"]
    assert [v.request_id for v in pol.views[0].waiting] == ["a", "b"]
    assert pol.views[0].kv.total_blocks == 256 and pol.views[0].token_budget == 10_000


def test_holding_every_request_with_nothing_running_waits_a_step_not_a_spin() -> None:
    """SGLang's loop never sleeps while its queue holds requests (``is_fully_idle``), so a
    held-back host waits one step's worth of time; with decodes to run it never waits."""
    a = FakeReq("a", 10, 3)
    host = SGLangHost(Scripted(Plan()), next_batch_plan=plan_factory)
    waits: list[float] = []
    host._idle_sleep = waits.append
    host.around_prefill(fake_prefill, make_sched([a]), running_batch([]))
    host.around_prefill(fake_prefill, make_sched([]), running_batch([]))  # nothing waits
    b = FakeReq("b", 4, 3, output_ids=[1])
    host.around_prefill(fake_prefill, make_sched([a]), running_batch([b]))  # b decodes
    assert waits == [0.001] and host.idle_waits == 1  # no step measured yet: the 1 ms floor


def test_admit_list_is_what_sglang_sees_in_plan_order_and_queue_is_restored() -> None:
    a, b, c = FakeReq("a", 10, 3), FakeReq("b", 5, 3), FakeReq("c", 8, 3)
    sched = make_sched([a, b, c], budget=12)
    pol = Scripted(Plan(admit=[("c", 8), ("a", 10), ("zz", 1), ("b", 0)]))
    host = SGLangHost(pol, next_batch_plan=plan_factory)
    out = host.around_prefill(fake_prefill, sched, running_batch([]))
    # Unknown ids and 0-token items are dropped; SGLang sees [c, a] and its budget takes c only.
    assert sched.seen_queues == [["c", "a"]]
    assert [r.rid for r in out.batch_to_run.reqs] == ["c"]
    assert [r.rid for r in sched.waiting_queue] == ["a", "b"]  # original order, minus c
    assert host._last_admitted == ("c",)


def test_chunked_request_continues_and_late_queued_requests_go_last() -> None:
    a, b = FakeReq("a", 10, 3), FakeReq("b", 5, 3)
    late = FakeReq("late", 4, 2)
    sched = make_sched([a, b])
    sched.chunked_req = FakeReq("chunk", 50, 3)

    def prefill(s: Any, rb: Any) -> Any:
        s.seen_queues.append([r.rid for r in s.waiting_queue])
        s.waiting_queue.append(late)  # e.g. a grammar became ready
        return plan_factory(SimpleNamespace(reqs=[s.chunked_req]), rb)

    host = SGLangHost(Scripted(Plan()), next_batch_plan=plan_factory)
    out = host.around_prefill(prefill, sched, running_batch([]))
    assert sched.seen_queues == [[]] and out.batch_to_run.reqs[0].rid == "chunk"
    assert [r.rid for r in sched.waiting_queue] == ["a", "b", "late"]
    assert [v.request_id for v in host.policy.views[0].running] == ["chunk"]


def test_preempt_items_are_counted_not_applied() -> None:
    a = FakeReq("a", 10, 3)
    host = SGLangHost(Scripted(Plan(preempt=["a"])), next_batch_plan=plan_factory)
    host.around_prefill(fake_prefill, make_sched([]), running_batch([a]))
    assert host.ignored_preemptions == 1


def test_arrivals_once_and_not_for_retracted() -> None:
    pol = Scripted()
    host = SGLangHost(pol)
    a = FakeReq("a", 10, 3)
    host.on_add(a)
    host.on_add(a)
    host.on_add(FakeReq("r", 3, 3), is_retracted=True)
    assert pol.arrivals == ["a"]


def test_step_reports_tokens_admissions_first_tokens_finishes_and_retractions() -> None:
    a, b = FakeReq("a", 10, 2), FakeReq("b", 6, 2)
    sched = make_sched([a, b])
    pol = Scripted(Plan(admit=[("a", 10), ("b", 6)]))
    t = [0.0]
    host = SGLangHost(pol, clock=lambda: t[0], next_batch_plan=plan_factory)
    for r in (a, b):
        host.on_add(r)
    rb = running_batch([])

    def next_batch(s: Any, running: Any, last: Any) -> Any:
        return host.around_prefill(fake_prefill, s, running)

    host.around_next_batch(next_batch, sched, rb, None)  # step 1: prefill a+b
    for r in (a, b):  # what SGLang's forward pass + process_batch_result do
        r.kv.kv_committed_len = r.prompt
        r.output_ids.append(7)
    t[0] = 0.25
    rb.reqs = [a, b]

    def decode(s: Any, running: Any, last: Any) -> Any:
        b.retraction_count += 1  # SGLang retracted b for lack of KV
        return plan_factory(SimpleNamespace(reqs=[a], forward_mode=Mode(False)), running)

    host.around_next_batch(decode, sched, rb, None)  # reports step 1, records step 2
    r1 = pol.reports[0]
    assert (r1.prefill_tokens, r1.num_prefill_seqs, r1.decode_tokens) == (16, 2, 0)
    assert r1.admitted == ("a", "b") and r1.duration_s == pytest.approx(0.25)
    assert host.views["a"].first_token_s == pytest.approx(0.25)
    a.output_ids.append(8)
    a.done = True
    t[0] = 0.3
    host.around_next_batch(lambda s, *x: plan_factory(None, x[0]), sched, rb, None)
    r2 = pol.reports[1]
    assert (r2.decode_tokens, r2.num_decode_seqs, r2.prefill_tokens) == (1, 1, 0)
    assert r2.preempted == ("b",) and r2.finished == ("a",) and r2.admitted == ()
    assert "a" not in host.views and host.steps == 2


def test_plugin_guards_and_hooks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HARNESS_POLICY", raising=False)
    with pytest.raises(RuntimeError, match="0.5.23"):
        plugin.check_version("0.5.22")
    sched = make_sched([])
    sched.enable_overlap = True
    with pytest.raises(RuntimeError, match="--disable-overlap-schedule"):
        plugin.host_of(sched)
    sched.enable_overlap = False
    host = plugin.host_of(sched)
    assert plugin.host_of(sched) is host and host.policy.name == "vllm"
    calls: list[str] = []

    def add(s: Any, r: Any, is_retracted: bool = False) -> None:  # SGLang's contract
        calls.append(r.rid)
        if r.rid != "refused":
            s.waiting_queue.append(r)

    plugin._around_add(add, sched, FakeReq("x", 2, 2))
    plugin._around_add(add, sched, FakeReq("y", 2, 2), is_retracted=True)
    plugin._around_add(add, sched, FakeReq("refused", 2, 2))
    assert calls == ["x", "y", "refused"] and list(host.views) == ["x"]


def test_retracted_requests_are_listed_first_in_the_view() -> None:
    a, b = FakeReq("a", 10, 3), FakeReq("b", 5, 3)
    b.retraction_count = 1
    b.output_ids = [1, 2]  # kept; recompute covers prompt + output
    pol = Scripted()
    host = SGLangHost(pol, next_batch_plan=plan_factory)
    host.around_prefill(fake_prefill, make_sched([a, b]), running_batch([]))
    w = pol.views[0].waiting
    assert [v.request_id for v in w] == ["b", "a"] and w[0].num_preemptions == 1


@pytest.mark.parametrize("name", ["vllm", "wait", "slai"])
def test_registered_policies_drive_a_toy_sglang_loop_to_completion(name: str) -> None:
    """Real harness policies through the host, with a toy loop that follows SGLang's step
    structure (prefill-first, then decode every running request)."""
    reqs = [
        FakeReq(f"r{i}", 20 + 3 * i, 4, {"tier": "paid" if i % 2 else "free"}) for i in range(6)
    ]
    sched = make_sched([], budget=64)
    host = SGLangHost(make_policy(name), next_batch_plan=plan_factory)
    running: list[FakeReq] = []
    rb = running_batch(running)

    def step(s: Any, rbatch: Any, last: Any) -> Any:
        out = host.around_prefill(fake_prefill, s, rbatch)
        if out.batch_to_run is not None:
            return out
        live = [r for r in running if not r.done]
        return plan_factory(
            SimpleNamespace(reqs=live, forward_mode=Mode(False)) if live else None, rbatch
        )

    pending = list(reqs)
    for _ in range(400):
        if pending:  # one arrival per iteration
            r = pending.pop(0)
            sched.waiting_queue.append(r)
            host.on_add(r)
        out = host.around_next_batch(step, sched, rb, None)
        batch = out.batch_to_run
        for r in batch.reqs if batch is not None else []:
            r.kv.kv_committed_len = r.prompt + len(r.output_ids)
            r.output_ids.append(1)
            r.done = len(r.output_ids) >= r.max_new
            if r not in running:
                running.append(r)
        rb.reqs = [r for r in running if not r.done]
        if not pending and all(r.done for r in reqs):
            break
    assert all(r.done for r in reqs), [(r.rid, len(r.output_ids)) for r in reqs]
    assert sched.waiting_queue == []
