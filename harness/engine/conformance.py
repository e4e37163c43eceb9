"""Host conformance scenarios: the host semantics of base.py, checked the same way for every host.

A host (the engine core, the built-in server, the vLLM adapter) is driven through a small
:class:`HostDriver` made by a factory ``factory(policy, spec) -> HostDriver``. Each scenario
plugs in a :class:`ScriptedPolicy` (plans given by the scenario, every view and step report
recorded) and asserts on what the host showed the policy: the next :class:`View` and the
:class:`StepReport`. Nothing here imports a particular host.

Use from pytest::

    @pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.__name__)
    def test_conformance(scenario, my_host_factory):
        scenario(my_host_factory)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from harness.policies.base import BasePolicy, Plan, StepReport, View


@dataclass(frozen=True)
class HostSpec:
    """Engine shape a scenario needs."""

    block_size: int = 4
    num_blocks: int = 64
    token_budget: int = 64
    max_num_seqs: int = 16


class HostDriver(Protocol):
    """What a scenario needs from a host."""

    def add_request(self, request_id: str, prompt_len: int, max_tokens: int) -> bool:
        """Queue a request; False if the host rejects it (it can never fit)."""
        ...

    def step(self) -> None:
        """Run exactly one scheduling step (calls the policy's schedule and on_step)."""
        ...

    def rejection(self, request_id: str) -> str | None:
        """The reason a request was rejected, or None."""
        ...

    def num_rejected(self) -> int: ...

    def has_work(self) -> bool: ...


HostFactory = Callable[["ScriptedPolicy", HostSpec], HostDriver]


class PrefixHostDriver(HostDriver, Protocol):
    """A host with prefix caching: prompts are given as token ids (the built-in server sends
    them as text; the engine core names them with ``PromptIdentity.from_token_ids``)."""

    def add_prompt(self, request_id: str, token_ids: list[int], max_tokens: int) -> bool: ...


@dataclass
class Snap:
    """A frozen copy of one request as a view showed it."""

    request_id: str
    num_prompt_tokens: int
    num_output_tokens: int
    num_computed_tokens: int
    num_preemptions: int


def _snap(r) -> Snap:  # type: ignore[no-untyped-def]
    return Snap(
        r.request_id,
        r.num_prompt_tokens,
        r.num_output_tokens,
        r.num_computed_tokens,
        r.num_preemptions,
    )


@dataclass
class Seen:
    """One view, copied (hosts may reuse their objects)."""

    waiting: list[Snap]
    running: list[Snap]
    used_blocks: int
    total_blocks: int
    token_budget: int
    max_num_seqs: int

    def run(self, rid: str) -> Snap | None:
        return next((s for s in self.running if s.request_id == rid), None)

    def wait(self, rid: str) -> Snap | None:
        return next((s for s in self.waiting if s.request_id == rid), None)


class ScriptedPolicy(BasePolicy):
    """Returns the plans a scenario scripts (a function of the view) and records everything."""

    name = "scripted"

    def __init__(self, script: Callable[[View, int], Plan] | None = None) -> None:
        self.script = script
        self.views: list[Seen] = []
        self.reports: list[StepReport] = []
        self.calls = 0

    def schedule(self, view: View) -> Plan:
        self.views.append(
            Seen(
                [_snap(r) for r in view.waiting],
                [_snap(r) for r in view.running],
                view.kv.used_blocks,
                view.kv.total_blocks,
                view.token_budget,
                view.max_num_seqs,
            )
        )
        self.calls += 1
        if self.script is None:
            return Plan()
        return self.script(view, self.calls - 1)

    def on_step(self, report: StepReport) -> None:
        self.reports.append(report)


def _everything(view: View) -> Plan:
    """Run every running request with all its remaining tokens; admit all waiting."""
    run = [(r.request_id, r.num_tokens - r.num_computed_tokens) for r in view.running]
    admit = [(r.request_id, r.num_tokens - r.num_computed_tokens) for r in view.waiting]
    return Plan(run=run, admit=admit)


def _host(factory: HostFactory, script, spec: HostSpec | None = None):  # type: ignore[no-untyped-def]
    pol = ScriptedPolicy(script)
    return pol, factory(pol, spec or HostSpec())


def _steps(h: HostDriver, n: int) -> None:
    for _ in range(n):
        h.step()


# ---------------------------------------------------------------------------- scenarios
def budget_never_exceeded(factory: HostFactory) -> None:
    """A plan asking for more tokens than the budget is clipped (rule 2/3)."""
    spec = HostSpec(token_budget=10, num_blocks=256)
    pol, h = _host(factory, lambda v, i: _everything(v), spec)
    for k in range(4):
        assert h.add_request(f"r{k}", 25, 3)
    _steps(h, 12)
    assert pol.reports, "host never reported a step"
    for rep in pol.reports:
        assert rep.prefill_tokens + rep.decode_tokens <= 10 * rep.num_steps, rep


def max_num_seqs_cap(factory: HostFactory) -> None:
    """No more than max_num_seqs requests ever hold KV (rule 3)."""
    spec = HostSpec(max_num_seqs=2)
    pol, h = _host(factory, lambda v, i: _everything(v), spec)
    for k in range(5):
        assert h.add_request(f"r{k}", 3, 4)
    _steps(h, 6)
    assert max(len(s.running) for s in pol.views) == 2
    assert len(pol.reports[0].admitted) == 2


def kv_accounting_in_blocks(factory: HostFactory) -> None:
    """KV is held in whole blocks: ceil(computed / block_size) (base.py KVView)."""
    spec = HostSpec(block_size=4)
    pol, h = _host(factory, lambda v, i: _everything(v), spec)
    assert h.add_request("a", 5, 6)  # prefill 5 tokens -> 2 blocks
    _steps(h, 5)
    # views[i] shows the state after i steps; computed after step 1 = 5, then 6, 7, 8, 9
    for i, want_computed in ((1, 5), (2, 6), (3, 7), (4, 8)):
        s = pol.views[i].run("a")
        assert s is not None and s.num_computed_tokens == want_computed
        assert pol.views[i].used_blocks == -(-want_computed // 4), (i, pol.views[i])


def preempt_from_end_of_run_order(factory: HostFactory) -> None:
    """KV shortage preempts the last-listed request of the run order, not the newest (rule 2)."""
    spec = HostSpec(block_size=4, num_blocks=3, token_budget=64)

    def script(v: View, i: int) -> Plan:
        if i == 0:
            return Plan(admit=[(r.request_id, 4) for r in v.waiting])
        # order c, a, b: each needs a new block; 3 blocks total, all held -> preempt b (tail)
        order = {r.request_id: r for r in v.running}
        return Plan(run=[(rid, 1) for rid in ("c", "a", "b") if rid in order])

    pol, h = _host(factory, script, spec)
    for rid in ("a", "b", "c"):
        assert h.add_request(rid, 4, 5)
    _steps(h, 3)
    rep = pol.reports[1]
    assert rep.preempted[0] == "b", rep
    seen = pol.views[2]
    assert seen.run("b") is None and seen.wait("b") is not None


def recompute_resets_computed(factory: HostFactory) -> None:
    """A recompute preemption frees KV, zeroes computed tokens, counts it, and puts the request
    at the front of waiting (rule 1)."""
    spec = HostSpec(block_size=4, num_blocks=16)

    def script(v: View, i: int) -> Plan:
        if i == 0:
            return Plan(admit=[(r.request_id, 6) for r in v.waiting][:1])
        if i == 1:
            return Plan(preempt=["a"])
        return Plan()

    pol, h = _host(factory, script, spec)
    assert h.add_request("a", 6, 4)
    assert h.add_request("b", 6, 4)
    _steps(h, 3)
    assert pol.views[1].run("a").num_computed_tokens == 6
    after = pol.views[2]
    assert after.waiting[0].request_id == "a", "preempted request must be at the front"
    assert after.waiting[0].num_computed_tokens == 0
    assert after.waiting[0].num_preemptions == 1
    assert after.used_blocks == 0
    assert "a" in pol.reports[1].preempted


def pause_keeps_kv(factory: HostFactory) -> None:
    """A running request left out of the plan keeps its KV and progress (rule 4)."""

    def script(v: View, i: int) -> Plan:
        if i == 0:
            return Plan(admit=[(r.request_id, 8) for r in v.waiting])
        return Plan(run=[(r.request_id, 1) for r in v.running if r.request_id == "b"])

    pol, h = _host(factory, script, HostSpec(block_size=4))
    assert h.add_request("a", 8, 10)
    assert h.add_request("b", 8, 10)
    _steps(h, 4)
    a1 = pol.views[1].run("a")
    a3 = pol.views[3].run("a")
    assert a1 is not None and a3 is not None
    assert a3.num_computed_tokens == a1.num_computed_tokens == 8
    assert a3.num_output_tokens == a1.num_output_tokens == 1
    b3 = pol.views[3].run("b")
    assert b3 is not None and b3.num_output_tokens == 3
    assert pol.views[3].used_blocks == 2 + 3  # a: 8 tokens = 2 blocks; b: 10 tokens = 3 blocks


def admission_head_of_line(factory: HostFactory) -> None:
    """Admission stops at the first item that does not fit; later ones wait (rule 3)."""
    spec = HostSpec(block_size=4, num_blocks=4, token_budget=64)

    def script(v: View, i: int) -> Plan:
        if i == 0:
            return Plan(admit=[("hold", 8)])
        # hold grows to 3 blocks; big needs 4 (only 1 free) and blocks small behind it
        return Plan(run=[("hold", 1)], admit=[("big", 15), ("small", 2)])

    pol, h = _host(factory, script, spec)
    assert h.add_request("hold", 8, 4)
    assert h.add_request("big", 15, 2)  # peak 16 tokens = 4 blocks: fits the cache, not now
    assert h.add_request("small", 2, 2)
    _steps(h, 2)
    rep = pol.reports[-1]
    assert rep.admitted == (), rep
    assert pol.views[-1].wait("small") is not None


def no_admission_after_run_preemption(factory: HostFactory) -> None:
    """If step 2 preempted anything, nothing is admitted that step (rule 3)."""
    spec = HostSpec(block_size=4, num_blocks=2, token_budget=64)

    def script(v: View, i: int) -> Plan:
        if i == 0:
            return Plan(admit=[("a", 4), ("b", 4)])
        return Plan(run=[("a", 1), ("b", 1)], admit=[("c", 1)])

    pol, h = _host(factory, script, spec)
    for rid, p in (("a", 4), ("b", 4), ("c", 1)):
        assert h.add_request(rid, p, 3)
    _steps(h, 2)
    rep = pol.reports[1]
    assert rep.preempted == ("b",), rep
    assert rep.admitted == (), rep


def max_tokens_enforced(factory: HostFactory) -> None:
    """A request stops at exactly max_tokens (ignore-EOS) and frees its KV (rule 5)."""
    pol, h = _host(factory, lambda v, i: _everything(v))
    assert h.add_request("a", 5, 3)
    for _ in range(10):
        if not h.has_work():
            break
        h.step()
    assert not h.has_work()
    finished = [rid for rep in pol.reports for rid in rep.finished]
    assert finished == ["a"]
    outs = [s.run("a").num_output_tokens for s in pol.views if s.run("a")]
    assert max(outs) == 2  # the 3rd token finishes it, so no later view shows it
    assert pol.reports[-1].kv_used_blocks == 0
    steps = sum(r.num_steps for r in pol.reports)
    assert steps == 3  # one prefill (token 1) + two decodes


def never_fit_rejected(factory: HostFactory) -> None:
    """A request larger than the whole KV cache is rejected with a reason and counted; the host
    does not hang on it (issue 3 "Bad input")."""
    spec = HostSpec(block_size=4, num_blocks=8)  # 32 tokens
    pol, h = _host(factory, lambda v, i: _everything(v), spec)
    assert not h.add_request("huge", 30, 10)
    reason = h.rejection("huge")
    assert reason and "KV" in reason
    assert h.num_rejected() == 1
    assert not h.has_work()
    assert h.add_request("ok", 4, 2)
    for _ in range(5):
        if not h.has_work():
            break
        h.step()
    assert not h.has_work()


def plan_for_unknown_ids_is_ignored(factory: HostFactory) -> None:
    """A plan naming unknown or wrong-state requests does not break the host."""
    pol, h = _host(
        factory,
        lambda v, i: Plan(
            run=[("ghost", 3), *_everything(v).run],
            admit=[("ghost2", 3), *_everything(v).admit],
        ),
    )
    assert h.add_request("a", 2, 2)
    _steps(h, 3)
    assert not h.has_work()


# ------------------------------------------------- prefix caching (vLLM v1, prefix_cache.py)
def _prefill_of(pol: ScriptedPolicy, rid: str) -> int:
    """Prefill tokens of the step that admitted ``rid`` (it is the only request in it)."""
    rep = next(r for r in pol.reports if rid in r.admitted)
    return rep.prefill_tokens


def _drain(h: HostDriver, limit: int = 200) -> None:
    for _ in range(limit):
        if not h.has_work():
            return
        h.step()
    raise AssertionError("host did not finish its work")


def prefix_hit_counts_as_computed(factory: HostFactory) -> None:
    """A request sharing a prefix with a finished one is admitted with the cached full blocks
    computed: only the rest is prefilled (vLLM ``get_computed_blocks``)."""
    pol, h = _host(factory, lambda v, i: _everything(v), HostSpec(block_size=4))
    assert h.add_prompt("a", list(range(10)), 2)  # type: ignore[attr-defined]
    _drain(h)
    assert h.add_prompt("b", [*range(8), 100, 101, 102], 2)  # type: ignore[attr-defined]
    _drain(h)
    assert _prefill_of(pol, "a") == 10
    assert _prefill_of(pol, "b") == 3  # 2 full blocks (8 tokens) cached; a's 3rd block is not


def prefix_all_hit_recomputes_last(factory: HostFactory) -> None:
    """When every prompt token is cached the last one is still computed (to sample): the hit
    stops at num_tokens - 1, rounded down to whole blocks (vLLM ``max_cache_hit_length``)."""
    pol, h = _host(factory, lambda v, i: _everything(v), HostSpec(block_size=4))
    assert h.add_prompt("a", list(range(13)), 1)  # type: ignore[attr-defined]
    _drain(h)
    assert h.add_prompt("b", list(range(13)), 1)  # type: ignore[attr-defined]
    _drain(h)
    assert h.add_prompt("c", list(range(12)), 1)  # type: ignore[attr-defined]
    _drain(h)
    assert _prefill_of(pol, "b") == 1  # 12 cached -> only the last token computed
    assert _prefill_of(pol, "c") == 4  # hit capped at 11 tokens -> 2 whole blocks


def prefix_lru_eviction_order(factory: HostFactory) -> None:
    """Freed cached blocks are evicted least recently freed first, and only when no
    never-cached block is free (vLLM's free queue)."""
    pol, h = _host(factory, lambda v, i: _everything(v), HostSpec(block_size=4, num_blocks=8))
    a, b = list(range(8)), list(range(50, 58))
    for rid, ids in (("a", a), ("b", b), ("c", list(range(100, 120)))):
        assert h.add_prompt(rid, ids, 1)  # type: ignore[attr-defined]
        _drain(h)
    # c took the 4 never-cached blocks and evicted one of a's (a was freed before b)
    assert h.add_prompt("b2", [*b, 7], 1)  # type: ignore[attr-defined]
    _drain(h)
    assert h.add_prompt("a2", [*a, 7], 1)  # type: ignore[attr-defined]
    _drain(h)
    assert _prefill_of(pol, "b2") == 1  # b's blocks survived
    assert _prefill_of(pol, "a2") == 9  # a's were evicted first


def prefix_in_use_block_not_evicted(factory: HostFactory) -> None:
    """A cached block held by a running request is never evicted, however old."""

    def script(v: View, i: int) -> Plan:
        plan = _everything(v)
        # "hold" is admitted, then paused (rule 4): it keeps its two cached blocks
        return Plan(run=[x for x in plan.run if x[0] != "hold"], admit=plan.admit)

    pol, h = _host(factory, script, HostSpec(block_size=4, num_blocks=7))
    assert h.add_prompt("hold", list(range(8)), 3)  # type: ignore[attr-defined]
    h.step()
    # x caches 4 blocks; y needs all 5 blocks hold does not hold: 1 free + x's 4 evicted
    for rid, base, n in (("x", 100, 16), ("y", 200, 20)):
        assert h.add_prompt(rid, list(range(base, base + n)), 1)  # type: ignore[attr-defined]
        for _ in range(5):
            h.step()
    assert h.add_prompt("again", [*range(8), 9], 1)  # type: ignore[attr-defined]
    for _ in range(3):
        h.step()
    assert _prefill_of(pol, "y") == 20
    assert _prefill_of(pol, "again") == 1  # hold's blocks are still cached


PREFIX_SCENARIOS: list[Callable[[HostFactory], None]] = [
    prefix_hit_counts_as_computed,
    prefix_all_hit_recomputes_last,
    prefix_lru_eviction_order,
    prefix_in_use_block_not_evicted,
]


SCENARIOS: list[Callable[[HostFactory], None]] = [
    budget_never_exceeded,
    max_num_seqs_cap,
    kv_accounting_in_blocks,
    preempt_from_end_of_run_order,
    recompute_resets_computed,
    pause_keeps_kv,
    admission_head_of_line,
    no_admission_after_run_preemption,
    max_tokens_enforced,
    never_fit_rejected,
    plan_for_unknown_ids_is_ignored,
]


# ------------------------------------------------------------------- the core's own driver
@dataclass
class CoreDriver:
    """Drives an :class:`~harness.engine.core.EngineCore` in virtual time (1 ms per step)."""

    core: object
    now: float = 0.0
    log: list[float] = field(default_factory=list)

    def add_request(self, request_id: str, prompt_len: int, max_tokens: int) -> bool:
        return self.core.add_request(request_id, prompt_len, max_tokens, arrival_s=self.now)  # type: ignore[attr-defined]

    def add_prompt(self, request_id: str, token_ids: list[int], max_tokens: int) -> bool:
        from harness.engine.prefix_cache import PromptIdentity

        ident = PromptIdentity.from_token_ids(token_ids)
        return self.core.add_request(  # type: ignore[attr-defined]
            request_id, len(token_ids), max_tokens, arrival_s=self.now, identity=ident
        )

    def step(self) -> None:
        out = self.core.step(self.now)  # type: ignore[attr-defined]
        self.now = out.end_s if not out.idle else self.now + 1e-3

    def rejection(self, request_id: str) -> str | None:
        return self.core.rejections.get(request_id)  # type: ignore[attr-defined]

    def num_rejected(self) -> int:
        return self.core.num_rejected  # type: ignore[attr-defined]

    def has_work(self) -> bool:
        return self.core.has_work()  # type: ignore[attr-defined]


def core_factory(policy: ScriptedPolicy, spec: HostSpec) -> HostDriver:
    """Host factory for the engine core (a fixed 1 ms step)."""
    from harness.engine.core import EngineCore

    return _core_driver(EngineCore, policy, spec)


def reference_core_factory(policy: ScriptedPolicy, spec: HostSpec) -> HostDriver:
    """Host factory for the reference step (harness.engine.reference_core)."""
    from harness.engine.reference_core import ReferenceCore

    return _core_driver(ReferenceCore, policy, spec)


def _core_driver(cls: Any, policy: ScriptedPolicy, spec: HostSpec) -> HostDriver:
    from harness.engine.config import EngineConfig
    from harness.engine.costmodel import AffineCostModel

    cfg = EngineConfig(
        block_size=spec.block_size,
        num_blocks=spec.num_blocks,
        token_budget=spec.token_budget,
        max_num_seqs=spec.max_num_seqs,
    )
    return CoreDriver(cls(policy, AffineCostModel(name="1ms", base_s=1e-3), cfg))
