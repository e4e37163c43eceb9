"""The vectorised kernel must reproduce the reference host (engine core + policy object)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from engine_traces import make_trace, poisson_trace

from harness.engine import fastsim
from harness.engine.config import EngineConfig
from harness.engine.costmodel import get_cost_model
from harness.engine.fastsim import fast_budget, fast_planner
from harness.engine.simulate import simulate
from harness.policies import make_policy
from harness.policies.base import (
    BasePolicy,
    BudgetRule,
    Plan,
    StepReport,
    View,
    remaining_tokens,
    reports_changes_only,
)
from harness.policies.columns import (
    NO_POSITIONS,
    ColumnPlan,
    ColumnPolicy,
    ColumnView,
    RunningColumns,
)
from harness.policies.nested_wait import NestedWaitPolicy
from harness.policies.orca import OrcaPolicy
from harness.policies.rad import RADPolicy
from harness.policies.sarathi import SarathiPolicy
from harness.policies.vllm_v1 import VLLMV1Policy
from harness.policies.wait import WaitPolicy, by_age

CASES = [
    # (kv_tokens, budget, max_num_seqs, rate): tight KV (preemptions), seat cap, small budget
    (3000, 256, 32, 8.0),
    (20000, 64, 8, 20.0),
    (1 << 20, 2048, 256, 40.0),
    (1500, 512, 1000, 5.0),
    (2000, 12, 64, 6.0),  # budget spent by decodes while KV runs out
]


def _same(a, b) -> None:
    assert a.num_steps == b.num_steps
    assert (a.status == b.status).all()
    assert (a.out_tokens == b.out_tokens).all()
    np.testing.assert_allclose(a.first_s, b.first_s, rtol=0, atol=1e-9)
    np.testing.assert_allclose(a.last_s, b.last_s, rtol=0, atol=1e-9)
    oa = np.lexsort((a.chunk_t, a.chunk_req))
    ob = np.lexsort((b.chunk_t, b.chunk_req))
    assert (a.chunk_req[oa] == b.chunk_req[ob]).all()
    np.testing.assert_allclose(a.chunk_t[oa], b.chunk_t[ob], rtol=0, atol=1e-9)
    assert (a.preemptions == b.preemptions).all()
    assert a.counters["preemptions_total"] == b.counters["preemptions_total"]


# the budget rule's declarers and the column policies without hooks (those with hooks below)
COLUMN_POLICIES = ["orca", "vllm-v0", "fastertransformer"]


@pytest.mark.parametrize("policy", ["vllm", "sarathi", "class-priority", *COLUMN_POLICIES])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"kv{c[0]}-b{c[1]}-s{c[2]}-r{c[3]}")
def test_fast_kernel_matches_the_engine_core_and_the_reference(policy: str, case) -> None:
    kv, budget, seqs, rate = case
    tr = poisson_trace(250, rate, seed=int(rate * 10), pmax=300, omax=250)
    cfg = EngineConfig(kv_tokens=kv, token_budget=budget, max_num_seqs=seqs, block_size=16)
    cost = get_cost_model("a100-llama2-7b")
    fast = simulate(tr, make_policy(policy), cost, cfg)
    core = simulate(tr, make_policy(policy), cost, cfg, kernel="core")
    ref = simulate(tr, make_policy(policy), cost, cfg, kernel="reference")
    assert (fast.counters["kernel"], core.counters["kernel"]) == ("fast", "core")
    _same(fast, core)
    _same(fast, ref)


def test_fast_kernel_rejects_and_stops_like_reference() -> None:
    tr = make_trace([0.0, 0.1, 0.2, 5.0], [10, 5000, 10, 10], [400, 2, 30, 30])
    cfg = EngineConfig(kv_tokens=1024, token_budget=64, max_num_seqs=8)
    cost = get_cost_model("a100-llama2-7b")
    for kw in ({}, {"stop_at_s": 1.0}):
        fast = simulate(tr, make_policy("sarathi"), cost, cfg, **kw)
        ref = simulate(tr, make_policy("sarathi"), cost, cfg, kernel="reference", **kw)
        _same(fast, ref)
        assert fast.errors == ref.errors and 1 in fast.errors


def test_only_exact_policies_take_the_fast_kernel() -> None:
    cfg = EngineConfig(kv_tokens=1024, token_budget=100)
    assert fast_budget(make_policy("vllm"), cfg) == 100
    assert fast_budget(make_policy("sarathi", chunk_size=50), cfg) == 50
    assert fast_budget(make_policy("sarathi", order="spf"), cfg) is None
    assert fast_budget(make_policy("vllm", long_prefill_token_threshold=8), cfg) is None
    assert fast_budget(make_policy("orca"), cfg) is None
    assert fast_budget(make_policy("vllm", scheduling_policy="priority"), cfg) is None


class _DeclaredRule(BasePolicy):
    """Not vllm nor sarathi by type: declares the rule and plans it (via FCFS Sarathi)."""

    name = "declared"

    def __init__(self) -> None:
        self._inner = SarathiPolicy(chunk_size=64)

    def budget_rule(self) -> BudgetRule:
        return BudgetRule(64)

    def schedule(self, view: View) -> Plan:
        return self._inner.schedule(view)


class _OverridesPlanning(VLLMV1Policy):
    """Inherits vllm's declaration but plans differently: must not take the fast kernel."""

    def schedule(self, view: View) -> Plan:
        plan = super().schedule(view)
        plan.admit = plan.admit[:1]
        return plan


class _CountsSteps(VLLMV1Policy):
    """Same plans, but its on_step hook must run: the fast kernel calls no hooks."""

    def on_step(self, report) -> None:
        self.steps = getattr(self, "steps", 0) + report.num_steps


def test_the_kernel_is_reached_through_the_declared_rule() -> None:
    cfg = EngineConfig(kv_tokens=3000, token_budget=256, max_num_seqs=32)
    cost = get_cost_model("a100-llama2-7b")
    assert fast_budget(_DeclaredRule(), cfg) == 64
    assert fast_budget(_OverridesPlanning(), cfg) is None
    assert fast_budget(_CountsSteps(), cfg) is None
    restarts = _DeclaredRule()
    restarts.preempt_restarts = True  # the engine core discards a cleared request's output
    assert fast_budget(restarts, cfg) is None
    tr = poisson_trace(250, 8.0, seed=80, pmax=300, omax=250)
    fast = simulate(tr, _DeclaredRule(), cost, cfg)
    ref = simulate(tr, _DeclaredRule(), cost, cfg, kernel="reference")
    assert fast.counters.get("kernel") == "fast" and ref.counters["kernel"] == "reference"
    _same(fast, ref)
    counted = _CountsSteps()
    res = simulate(tr, counted, cost, cfg)
    assert res.counters["kernel"] == "core" and counted.steps == res.num_steps
    assert simulate(tr, _OverridesPlanning(), cost, cfg).counters["kernel"] == "core"


class _AttnCost:
    """A cost model with a per-request context term: charges the prefill attention work."""

    uses_prefill_attn = True

    def __init__(self) -> None:
        self.base = get_cost_model("a100-llama2-7b")
        self.attn_seen: list[float] = []

    def step_time(self, prefill_tokens, decode_seqs, kv_tokens, prefill_attn=None) -> float:
        assert prefill_attn is not None
        self.attn_seen.append(prefill_attn)
        return self.base.step_time(prefill_tokens, decode_seqs, kv_tokens) + 1e-7 * prefill_attn

    def step_times(self, prefill_tokens, decode_seqs, kv_tokens):
        return self.base.step_times(prefill_tokens, decode_seqs, kv_tokens)


def test_prefill_attention_term_reaches_both_kernels() -> None:
    # One request, prompt 100, budget 64: chunks 64 (context 0) and 36 (context 64).
    tr = make_trace([0.0], [100], [3])
    cfg = EngineConfig(kv_tokens=4096, token_budget=64)
    # the budget rule, a column plan, and a one-item column plan (RAD's lone prefill chunks)
    for policy in ("vllm", "orca", "rad"):
        for kernel in ("auto", "reference"):
            cost = _AttnCost()
            simulate(tr, make_policy(policy), cost, cfg, kernel=kernel)
            assert cost.attn_seen[:2] == [64 * 32.0, 36 * (64 + 18.0)], (policy, kernel)
    # identical token times with the context term on a trace with preemptions
    tr = poisson_trace(250, 8.0, seed=80, pmax=300, omax=250)
    cfg = EngineConfig(kv_tokens=3000, token_budget=256, max_num_seqs=32)
    for policy in ("vllm", "sarathi", "orca", "vllm-v0", "rad"):
        fast = simulate(tr, make_policy(policy), _AttnCost(), cfg)
        ref = simulate(tr, make_policy(policy), _AttnCost(), cfg, kernel="reference")
        assert fast.counters.get("kernel") == "fast"
        _same(fast, ref)


@pytest.mark.parametrize("policy", ["vllm", "sarathi"])
def test_single_engine_and_routed_cluster_share_one_kernel(policy: str) -> None:
    """Issue 13: the single-engine kernel and the routed cluster's engines are one step
    implementation (fastsim.ArrayEngine), so a one-engine cluster on the event loop gives the
    single engine's steps, token times, chunks and preemptions (their hosts differ only in
    when a decode run is fast-forwarded, which moves no token)."""
    from harness.engine import cluster_fast
    from harness.engine.cluster import EngineSpec
    from harness.engine.fastsim import ArrayEngine

    assert issubclass(cluster_fast._ClusterEngine, ArrayEngine)
    assert "execute" not in vars(cluster_fast._ClusterEngine)  # no second copy of the step
    tr = poisson_trace(400, 8.0, seed=5, pmax=300, omax=250)
    cfg = EngineConfig(kv_tokens=3000, token_budget=256, max_num_seqs=32, block_size=16)
    cost = get_cost_model("a100-llama2-7b")
    single = simulate(tr, make_policy(policy), cost, cfg)
    assert single.counters["kernel"] == "fast"
    assert single.counters["preemptions_total"] > 20
    spec = [EngineSpec("e0", make_policy(policy), cost, cfg)]
    budgets = cluster_fast.routed_budgets(tr, spec, None, None, None)
    assert budgets is not None
    merged, _, _ = cluster_fast.simulate_routed(tr, spec, None, budgets)
    _same(single, merged)  # to 1e-9 s: a run fast-forwarded from another step sums in another order


# ---- column policies (policies/columns.py): the kernel executes their plans ------------------


@pytest.mark.parametrize("policy", COLUMN_POLICIES)
def test_column_plans_under_preemption_stop_and_no_fast_forward(policy: str) -> None:
    # long prompts in a small KV: the run's KV shortage preempts (the sequential pass)
    tr = poisson_trace(300, 25.0, seed=3, pmax=1500, omax=500)
    cfg = EngineConfig(kv_tokens=4096, token_budget=512, max_num_seqs=32, block_size=16)
    cost = get_cost_model("a100-llama2-7b")
    for kw in ({}, {"stop_at_s": 20.0}, {"fast_forward": False}):
        fast = simulate(tr, make_policy(policy), cost, cfg, **kw)
        core = simulate(tr, make_policy(policy), cost, cfg, kernel="core", **kw)
        assert fast.counters["kernel"] == "fast"
        _same(fast, core)
    if policy != "fastertransformer":  # FT admits a cohort only when nobody decodes
        assert fast.counters["preemptions_total"] > 0


class _OrcaWithHook(OrcaPolicy):
    """Orca's plans, plus hooks that must run on the column host too."""

    def on_arrival(self, request, now: float) -> None:
        self.arrived = getattr(self, "arrived", 0) + 1
        assert request.num_computed_tokens == 0 and request.arrival_s == now

    def on_step(self, report) -> None:
        self.steps = getattr(self, "steps", 0) + report.num_steps
        self.finished = getattr(self, "finished", 0) + len(report.finished)


class _OrcaPlansOtherwise(OrcaPolicy):
    def schedule(self, view: View) -> Plan:
        plan = super().schedule(view)
        plan.admit = plan.admit[:1]
        return plan


def test_the_column_host_takes_column_policies_and_calls_their_hooks() -> None:
    cfg = EngineConfig(kv_tokens=3000, token_budget=256, max_num_seqs=32)
    cost = get_cost_model("a100-llama2-7b")
    hooked_names = ("rad", "mcsf-alpha", "mcsf-alpha-beta", "slai", "mcsf", "wait", "nested-wait")
    for name in (*COLUMN_POLICIES, *hooked_names):
        assert fast_planner(make_policy(name), cfg) is not None
    for name in ("vllm", "sarathi"):
        assert fast_planner(make_policy(name), cfg) is None
    # a cleared request's output is discarded by the engine core only (seed-mcsf.md §7 A7)
    assert fast_planner(make_policy("mcsf-alpha", progress="lost"), cfg) is None
    assert fast_planner(_OrcaPlansOtherwise(), cfg) is None
    tr = poisson_trace(200, 8.0, seed=8, pmax=300, omax=250)
    hooked, hooked_core = _OrcaWithHook(), _OrcaWithHook()
    res = simulate(tr, hooked, cost, cfg)
    core = simulate(tr, hooked_core, cost, cfg, kernel="core")
    assert res.counters["kernel"] == "fast"
    _same(res, core)
    assert hooked.steps == res.num_steps == hooked_core.steps
    assert hooked.arrived == hooked_core.arrived == 200
    assert hooked.finished == hooked_core.finished == 200
    assert simulate(tr, _OrcaPlansOtherwise(), cost, cfg).counters["kernel"] == "core"


_HOOKED = {  # column policies with hooks: their parameters here, and the state to compare
    "rad": ({}, ("cycles", "requests_in_cycle")),
    "mcsf-alpha": ({"memory_tokens": 3000}, ("clearings", "cleared")),
    "mcsf-alpha-beta": ({"memory_tokens": 3000}, ("clearings", "cleared")),
    "slai": ({}, ("critical_total", "noncritical_total", "deferred_total", "critical_dropped")),
    "slai-fcfs-paid-first": (
        {"prefill_order": "fcfs", "tier_priority": True, "max_decodes": 12, "token_budget": 256},
        ("critical_total", "noncritical_total", "deferred_total", "critical_dropped"),
    ),
    "mcsf": ({}, ("_est",)),
    # noisy estimates: under-estimates raise the estimate (REC a), overflows preempt
    "mcsf-noisy": ({"noise_sigma": 0.8, "kv_convention": "A"}, ("_est",)),
    "mcsf-noisy-skip": ({"noise_sigma": 0.8, "on_fail": "skip"}, ("_est",)),
    # WAIT's flushes (on_idle="flush"), cohorts capped per step, the authors' admission gate
    "wait": ({}, ("flushes",)),
    "wait:capped": ({"step_cap": 6, "thresholds": (4, 3, 2, 1, 1)}, ("flushes",)),
    "wait:admission": ({"gating": "admission"}, ("flushes",)),
    # Nested WAIT's memory guard and segment caps (seed-wait.md App. A)
    "nested-wait": ({}, ("flushes", "guard_deferred")),
    "nested-wait:caps": (
        {"edges": (40, 80, 160), "thresholds": (6, 4, 2), "seg_caps": [12, 8, 4]},
        ("flushes", "guard_deferred"),
    ),
}


@pytest.mark.parametrize("case", list(_HOOKED))
def test_hooked_column_policies_match_the_engine_core(case: str) -> None:
    # a policy M below the KV makes the alpha-protection baselines clear (rule 1
    # preemptions); long prompts make RAD's lone prefills wait for KV; paid and free tiers
    # (make_trace) give SLAI two TBT deadlines
    policy = case.split(":")[0].split("-fcfs")[0].split("-noisy")[0]
    kw, state = _HOOKED[case]
    tr = poisson_trace(300, 25.0, seed=3, pmax=1500, omax=500)
    cfg = EngineConfig(kv_tokens=4096, token_budget=512, max_num_seqs=32, block_size=16)
    cost = get_cost_model("a100-llama2-7b")
    for run_kw in ({}, {"stop_at_s": 20.0}):
        pf, pc = make_policy(policy, **kw), make_policy(policy, **kw)
        fast = simulate(tr, pf, cost, cfg, **run_kw)
        core = simulate(tr, pc, cost, cfg, kernel="core", **run_kw)
        assert fast.counters["kernel"] == "fast"
        _same(fast, core)
        assert pf.params() == pc.params()
        assert [getattr(pf, a) for a in state] == [getattr(pc, a) for a in state]
        if not run_kw and case != "mcsf":  # the whole run preempts (and clears)
            assert fast.counters["preemptions_total"] > 0
            assert not policy.startswith("mcsf-alpha") or pf.clearings > 0
    if policy == "slai":  # the run exercised both kinds of decode
        assert pf.critical_total > 0 and pf.deferred_total > 0


_HEAR_CHANGES = ("rad", "wait", "nested-wait", "mcsf", "mcsf-alpha", "mcsf-alpha-beta")


class _RADHearingAll(RADPolicy):
    """RAD whose own on_step (unmarked) counts every report."""

    reports = 0

    def on_step(self, report: StepReport) -> None:
        self.reports += 1
        super().on_step(report)


def test_policies_that_hear_only_changes_are_told_only_of_them() -> None:
    """base.hears_changes_only: the kernel skips a marked on_step's reports of steps that
    preempted, admitted and finished nobody (the engine core still sends every one: the
    hooked-policy test above compares the two, state included); an unmarked override in a
    subclass hears every step again."""
    for name in _HEAR_CHANGES:
        assert reports_changes_only(make_policy(name)), name
    for name in ("slai", "orca", "vllm"):
        assert not reports_changes_only(make_policy(name)), name
    assert not reports_changes_only(_RADHearingAll())
    wrapped = RADPolicy()
    wrapped.on_step = lambda report: None  # type: ignore[method-assign]  # set on the object
    assert not reports_changes_only(wrapped)
    tr = poisson_trace(300, 25.0, seed=3, pmax=1500, omax=500)
    cfg = EngineConfig(kv_tokens=4096, token_budget=512, max_num_seqs=32, block_size=16)
    cost = get_cost_model("a100-llama2-7b")
    heard: list[StepReport] = []
    marked = RADPolicy()
    orig = RADPolicy.on_step

    def spy(self: RADPolicy, report: StepReport) -> None:
        heard.append(report)
        orig(self, report)

    spy.hears_changes_only = True  # type: ignore[attr-defined]
    everything = _RADHearingAll()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(RADPolicy, "on_step", spy)
        a = simulate(tr, marked, cost, cfg)
    b = simulate(tr, everything, cost, cfg)
    _same(a, b)
    assert marked.cycles == everything.cycles
    assert heard and all(r.preempted or r.admitted or r.finished for r in heard)
    assert everything.reports > len(heard)  # the quiet steps, heard only unmarked


class _SortingWait(WaitPolicy):
    """WAIT that always sorts its flush plan's decodes (age, then stage groups)."""

    def _all_in_quota(self, cv, decoding, partial) -> bool:
        return False


class _CountingWait(WaitPolicy):
    """WAIT counting the flush plans that keep their decodes in running order."""

    unsorted = 0

    def _all_in_quota(self, cv, decoding, partial) -> bool:
        whole = super()._all_in_quota(cv, decoding, partial)
        self.unsorted += whole
        return whole


@pytest.mark.parametrize(
    "kv_tokens, kw",
    [(1 << 20, {}), (6000, {"thresholds": (2, 1, 1, 1, 1)}), (6000, {"step_cap": 12})],
    ids=["kv-free", "kv-tight-small-quotas", "capped"],
)
def test_wait_flush_plans_that_run_every_decode_need_no_sort(kv_tokens: int, kw) -> None:
    # a flush plan that runs every decode with nothing cut (runs_whole) and every (type,
    # stage) group within its quota keeps running order; the step is the same as with the
    # stage rule's order (base.py rule 2). In the tight KV, preempted requests re-join at
    # stages where others of their type are: groups over their quota (small quotas), which
    # the shortcut must leave to the sort
    tr = poisson_trace(400, 30.0, seed=11, pmax=800, omax=300)
    cfg = EngineConfig(kv_tokens=kv_tokens, token_budget=1024, max_num_seqs=64, block_size=16)
    cost = get_cost_model("a100-llama2-7b")
    for kernel in ("auto", "core"):
        counting, sorting = _CountingWait(**kw), _SortingWait(**kw)
        a = simulate(tr, counting, cost, cfg, kernel=kernel)
        b = simulate(tr, sorting, cost, cfg, kernel=kernel)
        _same(a, b)
        assert counting.flushes == sorting.flushes
        assert counting.unsorted > 0
        if kv_tokens < 1 << 20:
            assert a.counters["preemptions_total"] > 0


class _SortingNestedWait(NestedWaitPolicy):
    """Nested WAIT that builds every plan's stage groups in age order."""

    def _flush_in_running_order(self, flush, decoding) -> bool:
        return False


@pytest.mark.parametrize(
    "kv_tokens, kw",
    [
        (1 << 20, {}),
        (6000, {}),
        (6000, {"edges": (40, 80, 160), "thresholds": (2, 1, 1)}),
    ],
    ids=["kv-free", "kv-tight", "kv-tight-small-quotas"],
)
def test_nested_wait_flush_plans_group_running_order_first(
    kv_tokens: int, kw, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a flush plan's stage counts come from running order; age order (by_age) only when a
    # quota cuts a group or the host would cut the run: the same steps as sorting every plan
    import harness.policies.nested_wait as nested

    sorts = {"n": 0}

    def counting_by_age(cv, positions):
        sorts["n"] += 1
        return by_age(cv, positions)

    monkeypatch.setattr(nested, "by_age", counting_by_age)
    tr = poisson_trace(400, 30.0, seed=11, pmax=800, omax=300)
    cfg = EngineConfig(kv_tokens=kv_tokens, token_budget=1024, max_num_seqs=64, block_size=16)
    cost = get_cost_model("a100-llama2-7b")
    for kernel in ("auto", "core"):
        sorts["n"] = 0
        a = simulate(tr, NestedWaitPolicy(**kw), cost, cfg, kernel=kernel)
        shortcut_sorts = sorts["n"]
        sorts["n"] = 0
        sorting = _SortingNestedWait(**kw)
        b = simulate(tr, sorting, cost, cfg, kernel=kernel)
        _same(a, b)
        assert shortcut_sorts < sorts["n"]  # some flush plans needed no sort
        if kv_tokens < 1 << 20:
            assert a.counters["preemptions_total"] > 0


class _CountingRAD(RADPolicy):
    """RAD counting its plans, and the lone-prefill plans among them."""

    plans = runs = 0

    def plan_columns(self, cv):
        plan = super().plan_columns(cv)
        self.plans += 1
        self.runs += plan.prefill_run
        return plan


def _rad_runs(tr, kv_tokens: int, *runs: tuple[RADPolicy, bool]) -> list:
    """RAD's simulations of ``tr`` (each policy with fast-forward on or off), each checked
    token for token against the reference host's."""
    cfg = EngineConfig(kv_tokens=kv_tokens, token_budget=2048, max_num_seqs=64, block_size=16)
    cost = get_cost_model("a100-llama2-7b")
    ref = simulate(tr, make_policy("rad"), cost, cfg, kernel="reference")
    out = [simulate(tr, pol, cost, cfg, fast_forward=ff) for pol, ff in runs]
    for res in out:
        _same(res, ref)
    return out


@pytest.mark.parametrize("kv_tokens", [1 << 20, 6000])
def test_a_lone_prefill_runs_its_chunks_without_planning_again(kv_tokens: int) -> None:
    # prompts of up to 8 chunks (t_lcm 256), sparse arrivals: RAD's prefills run alone
    # (seed-rad-slai.md §3.3); in a small KV some chunks wait for decodes to drain
    tr = poisson_trace(150, 3.0, seed=5, pmax=2000, omax=60)
    run, stepwise = _CountingRAD(), _CountingRAD()
    _rad_runs(tr, kv_tokens, (run, True), (stepwise, False))
    assert run.runs > 50
    # each hinted plan's further chunks ran unplanned: fewer plans, the same steps
    assert run.plans < stepwise.plans - run.runs
    assert (run.cycles, run.requests_in_cycle) == (stepwise.cycles, stepwise.requests_in_cycle)


class _HearingRAD(RADPolicy):
    """RAD keeping every report (overriding on_step, it hears every step), counting plans."""

    def __init__(self) -> None:
        super().__init__()
        self.heard: list = []
        self.plans = 0

    def plan_columns(self, cv):
        self.plans += 1
        return super().plan_columns(cv)

    def on_step(self, report) -> None:
        self.heard.append(report)
        super().on_step(report)


@pytest.mark.parametrize("kv_tokens", [1 << 20, 6000])
def test_a_lone_prefill_from_its_first_chunk_is_the_planned_step_then_the_run(
    kv_tokens: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # ArrayEngine._lone_prefill runs a lone prefill plan's first chunk as the run's first
    # step; without it, the general path runs that step and the run follows: the same token
    # times, telemetry rows, counters and policy state, each admission heard once, and
    # fewer reports (the first chunk is told with the rest)
    tr = poisson_trace(200, 12.0, seed=9, pmax=4000, omax=40)
    cfg = EngineConfig(kv_tokens=kv_tokens, token_budget=2048, max_num_seqs=64, block_size=16)
    cost = get_cost_model("a100-llama2-7b")
    lone = fastsim.ArrayEngine._lone_prefill
    runs = []

    def counted(self, plan, t, lim):
        end = lone(self, plan, t, lim)
        runs.append((end is not None, bool(plan.admit_requests)))
        return end

    monkeypatch.setattr(fastsim.ArrayEngine, "_lone_prefill", counted)
    merged = _HearingRAD()
    a = simulate(tr, merged, cost, cfg)
    monkeypatch.setattr(fastsim.ArrayEngine, "_lone_prefill", lambda *_: None)
    stepwise = _HearingRAD()
    b = simulate(tr, stepwise, cost, cfg)
    _same(a, b)
    for c in a.samples:
        np.testing.assert_array_equal(a.samples[c], b.samples[c])
    assert (a.num_calls, a.counters) == (b.num_calls, b.counters)
    state = (merged.cycles, merged.requests_in_cycle, merged.plans)
    assert state == (stepwise.cycles, stepwise.requests_in_cycle, stepwise.plans)
    # the route ran admissions (and in a short KV running requests' chunks after a wait), and
    # left the prompts one chunk completes to the rules
    assert {(True, True), (False, True)} <= set(runs)
    assert ((True, False) in runs) == (kv_tokens < 1 << 20)
    admitted = [rid for r in merged.heard for rid in r.admitted]
    assert admitted == [rid for r in stepwise.heard for rid in r.admitted]
    # (an override hears every step) every step told once; a run's first chunk with the rest
    assert sum(r.num_steps for r in merged.heard) == a.num_steps
    assert sum(r.num_steps for r in stepwise.heard) == a.num_steps
    assert len(merged.heard) < len(stepwise.heard)
    if kv_tokens < 1 << 20:
        assert a.counters["preemptions_total"] > 0


class _RADNoParkedRuns(RADPolicy):
    """RAD promising nothing of its decode batches while a prefill waits for KV."""

    def plan_columns(self, cv):
        plan = super().plan_columns(cv)
        return dataclasses.replace(plan, steady_decodes=False) if plan.steady_decodes else plan


def test_decodes_run_on_while_a_prefill_waits_for_kv(monkeypatch: pytest.MonkeyPatch) -> None:
    # RAD parks its prefill when the chunk's KV does not fit and decodes all of D until a
    # finish or preemption frees some (ColumnPlan.steady_decodes): the kernel runs those
    # steps as one decode run of the requests before the parked one; without the promise it
    # plans each. The same token times either way (and the reference host's).
    tr = poisson_trace(300, 20.0, seed=3, pmax=3000, omax=200)
    cfg = EngineConfig(kv_tokens=12000, token_budget=2048, max_num_seqs=64, block_size=16)
    cost = get_cost_model("a100-llama2-7b")
    runs = []
    ends = fastsim.ArrayEngine._decoding_run_ends

    def counted(self, t, R, *args):
        got = ends(self, t, R, *args)
        if R < self.R:  # a run of the requests before a parked one (steady runs: all of R)
            runs.append(len(got))
        return got

    monkeypatch.setattr(fastsim.ArrayEngine, "_decoding_run_ends", counted)
    ref = simulate(tr, make_policy("rad"), cost, cfg, kernel="reference")
    a = simulate(tr, make_policy("rad"), cost, cfg)
    assert sum(k > 1 for k in runs) > 10  # runs of the decoding requests happened
    n = len(runs)
    b = simulate(tr, _RADNoParkedRuns(), cost, cfg)
    assert len(runs) == n  # (none without the promise)
    _same(a, ref)
    _same(a, b)
    assert a.num_calls < b.num_calls
    assert a.counters["preemptions_total"] > 0


class _ParksTheOlder(ColumnPolicy):
    """Admits two waiting requests at once, the first with a 64-token chunk, the second whole;
    then decodes every decoding request and parks the rest (``steady_decodes``: truly, its
    plan reads only the decoding set) until none decodes, then finishes their prefills. The
    request it parks is then older than the newest, which decodes."""

    def plan_columns(self, cv: ColumnView) -> ColumnPlan:
        rc = cv.running
        decoding, prefilling = rc.split()
        if len(decoding):
            return ColumnPlan(decoding.copy(), 1, steady_decodes=True)
        if len(prefilling):
            return ColumnPlan(prefilling.copy(), rc.remaining()[prefilling])
        heads = list(cv.waiting[:2])
        chunks = [min(64, remaining_tokens(r)) if i == 0 else remaining_tokens(r) for i, r in
                  enumerate(heads)]  # fmt: skip
        return ColumnPlan(NO_POSITIONS, admit_requests=list(zip(heads, chunks, strict=True)))


class _ParksTheOlderPromisingNothing(_ParksTheOlder):
    def plan_columns(self, cv: ColumnView) -> ColumnPlan:
        return dataclasses.replace(super().plan_columns(cv), steady_decodes=False)


def test_decodes_run_on_only_when_the_request_waiting_to_prefill_is_the_newest() -> None:
    # the kernel runs a steady_decodes plan's steps as a run of the first R - 1 running
    # requests: only right when the one waiting to prefill is the last; here it is older than
    # a decoding one, so the steps run one by one, as without the hint
    tr = poisson_trace(120, 400.0, seed=4, pmax=400, omax=30)
    cfg = EngineConfig(kv_tokens=1 << 20, token_budget=2048, max_num_seqs=64, block_size=16)
    cost = get_cost_model("a100-llama2-7b")
    ref = simulate(tr, _ParksTheOlder(), cost, cfg, kernel="reference")
    a = simulate(tr, _ParksTheOlder(), cost, cfg)
    b = simulate(tr, _ParksTheOlderPromisingNothing(), cost, cfg)
    assert a.counters["kernel"] == "fast"
    _same(a, ref)
    _same(a, b)
    assert a.num_steps == b.num_steps


class _CountingRADNoHold(_CountingRAD):
    """The same RAD with its prefill runs' hold withdrawn (its decode batches keep theirs):
    each run stops at an arrival."""

    def plan_columns(self, cv):
        plan = super().plan_columns(cv)
        return dataclasses.replace(plan, hold=False) if plan.prefill_run else plan


@pytest.mark.parametrize("kv_tokens", [1 << 20, 6000])
def test_a_lone_prefill_holds_past_arrivals(kv_tokens: int) -> None:
    # long prompts (up to 16 chunks) and arrivals every ~10 steps: most runs meet one;
    # holding (ColumnPlan.hold with prefill_run) runs on past it without planning again
    tr = poisson_trace(200, 12.0, seed=9, pmax=4000, omax=40)
    held, stopped = _CountingRAD(), _CountingRADNoHold()
    a, b = _rad_runs(tr, kv_tokens, (held, True), (stopped, True))
    assert a.num_steps == b.num_steps
    assert held.plans < stopped.plans - 20  # the runs that met an arrival went on
    assert (held.cycles, held.requests_in_cycle) == (stopped.cycles, stopped.requests_in_cycle)
    if kv_tokens < 1 << 20:
        assert a.counters["preemptions_total"] > 0


def test_class_priority_declares_the_budget_rule_only_with_one_class() -> None:
    cfg = EngineConfig(kv_tokens=3000, token_budget=256, max_num_seqs=32)
    assert fast_budget(make_policy("class-priority"), cfg) == 256
    assert fast_budget(make_policy("class-priority", classes="paid,free"), cfg) is None
    cost = get_cost_model("a100-llama2-7b")
    tr = poisson_trace(250, 8.0, seed=80, pmax=300, omax=250)
    fast = simulate(tr, make_policy("class-priority"), cost, cfg)
    ref = simulate(tr, make_policy("class-priority"), cost, cfg, kernel="reference")
    assert fast.counters["kernel"] == "fast"
    _same(fast, ref)


class _OrcaKeepsViews(OrcaPolicy):
    """Orca that checks each view the kernel hands it against one built field by field
    (promising nothing, so it is asked at every host call)."""

    def __init__(self) -> None:
        super().__init__()
        self.checked = 0

    def plan_columns(self, cv: ColumnView) -> ColumnPlan:
        rc = cv.running
        assert type(cv) is ColumnView and len(cv) == len(ColumnView._fields)
        # RunningColumns, or the kernel's subclass that answers block_counts in C
        assert isinstance(rc, RunningColumns) and tuple.__len__(rc) == len(RunningColumns._fields)
        assert rc.block_counts(cv.kv.block_size) == RunningColumns(*rc).block_counts(
            cv.kv.block_size
        )
        n = len(rc)
        for f in RunningColumns._fields:
            v = getattr(rc, f)
            assert isinstance(v, int) if f == "num_prefilling" else v.shape == (n,)
        assert rc.num_prefilling == n - len(rc.decoding())
        assert cv.num_waiting == len(cv.waiting) and cv.kv.used_blocks >= 0
        assert [cv.id_of(k) for k in rc.key.tolist()] == [f"r{k}" for k in rc.key.tolist()]
        self.checked += 1
        plan = super().plan_columns(cv)
        plan.then_steady = False
        return plan


def test_the_kernels_views_hold_every_field_current() -> None:
    # the kernel builds its views from cached parts (views per running count): each must
    # still be a whole ColumnView of the current state, plan after plan
    cfg = EngineConfig(kv_tokens=3000, token_budget=256, max_num_seqs=32)
    tr = poisson_trace(300, 8.0, seed=3, pmax=300, omax=250)
    pol, ref = _OrcaKeepsViews(), OrcaPolicy()
    res = simulate(tr, pol, get_cost_model("a100-llama2-7b"), cfg)
    assert res.counters["kernel"] == "fast" and pol.checked == res.num_calls > 100
    _same(res, simulate(tr, ref, get_cost_model("a100-llama2-7b"), cfg, kernel="core"))
