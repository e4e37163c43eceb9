"""Baseline policies: the batch compositions of seed-stability.md Appendix A.4 and per-rule tests.

A.4: A, B, C are decoding with 2, 4, 3 decode tokens left; D and E (1 prefill + 1 decode token
each) arrive during batch 1. Paper-model mapping (§7 REC 4): v_d decode iterations = output
tokens after the prefill's first token, so A = prompt 1, max_tokens 3.
"""

from __future__ import annotations

import pytest

from harness.engine.config import EngineConfig
from harness.engine.core import EngineCore
from harness.engine.costmodel import AffineCostModel
from harness.policies import make_policy
from harness.policies.base import Plan

A4 = {
    "vllm-v0": (4, ["Ad Bd Cd", "Dp Ep", "Ad Bd Cd Dd", "Bd Cd Ed", "Bd"]),
    "orca": (5, ["Ad Bd Cd", "Ad Bd Cd Dp Ep", "Bd Cd Dd Ed", "Bd"]),
    "fastertransformer": (4, ["Ad Bd Cd", "Ad Bd Cd", "Bd Cd", "Bd", "Dp Ep", "Dd Ed"]),
    "sarathi": (4, ["Ad Bd Cd", "Ad Bd Cd Dp", "Bd Cd Dd Ep", "Bd Ed"]),
}


def _core(policy: str, budget: int, *, kv_tokens: int = 1 << 20, seqs: int = 1000, **kw):
    cfg = EngineConfig(kv_tokens=kv_tokens, token_budget=budget, max_num_seqs=seqs, block_size=4)
    return EngineCore(make_policy(policy, **kw), AffineCostModel(base_s=1.0), cfg)


def _a4_batches(policy: str, budget: int) -> list[str]:
    core = _core(policy, budget)
    for rid, dl in (("A", 2), ("B", 4), ("C", 3)):
        core.add_request(rid, 1, dl + 1, arrival_s=0.0)
    t = core.step(0.0).end_s  # the prefill that brings A, B, C into decoding
    batches: list[str] = []
    while core.has_work():
        out = core.step(t)
        if not batches:  # D, E arrive during batch 1
            for rid in "DE":
                core.add_request(rid, 1, 2, arrival_s=t + 0.5)
        batches.append(" ".join(sorted(f"{r}{'d' if d else 'p'}" for r, _, d in out.scheduled)))
        t = out.end_s
    return batches


@pytest.mark.parametrize("policy", sorted(A4))
def test_appendix_a4_batch_compositions(policy: str) -> None:
    budget, want = A4[policy]
    want = [" ".join(sorted(b.split())) for b in want]
    assert _a4_batches(policy, budget) == want


def test_vllm_v1_matches_sarathi_on_a4() -> None:
    # v1 with chunked prefill is Sarathi-like: running first (decodes), then new prefills.
    assert _a4_batches("vllm", 4) == _a4_batches("sarathi", 4)


def _view_core(policy: str, budget: int = 8, **kw) -> EngineCore:
    return _core(policy, budget, **kw)


def test_vllm_running_first_chunked_prefill_then_fcfs() -> None:
    core = _view_core("vllm", budget=8)
    core.add_request("a", 20, 5, arrival_s=0.0)
    core.add_request("b", 3, 5, arrival_s=0.1)
    out = core.step(0.0)
    assert out.scheduled == [("a", 8, False)]  # FCFS head takes the whole budget (chunk)
    out = core.step(out.end_s)
    assert out.scheduled == [("a", 8, False)]  # running first
    out = core.step(out.end_s)
    # a finishes its prompt (4 left), b is admitted with the rest of the budget
    assert out.scheduled == [("a", 4, False), ("b", 3, False)]
    out = core.step(out.end_s)
    assert out.scheduled == [("a", 1, True), ("b", 1, True)]


def test_vllm_long_prefill_threshold_caps_chunks() -> None:
    core = _core("vllm", 64, long_prefill_token_threshold=5)
    core.add_request("a", 12, 2, arrival_s=0.0)
    assert core.step(0.0).scheduled == [("a", 5, False)]


def test_vllm_without_chunking_blocks_oversize_head() -> None:
    core = _core("vllm", 8, chunked_prefill=False)
    core.add_request("a", 6, 3, arrival_s=0.0)
    core.add_request("b", 5, 3, arrival_s=0.0)
    # a (6) fits; b (5) does not fit the 2 left and is not chunked
    assert core.step(0.0).scheduled == [("a", 6, False)]


def test_sarathi_decode_first_then_partial_then_new() -> None:
    core = _core("sarathi", 6)
    core.add_request("a", 2, 9, arrival_s=0.0)
    core.add_request("b", 10, 3, arrival_s=0.0)
    out = core.step(0.0)  # a whole (2) + b chunk of 4
    assert out.scheduled == [("a", 2, False), ("b", 4, False)]
    core.add_request("c", 3, 2, arrival_s=out.end_s)
    out = core.step(out.end_s)
    assert out.scheduled == [("a", 1, True), ("b", 5, False)]  # decode, then partial prefill
    out = core.step(out.end_s)
    assert out.scheduled == [("a", 1, True), ("b", 1, False), ("c", 3, False)]


def test_sarathi_shortest_prefill_first() -> None:
    core = _core("sarathi", 64, order="spf")
    core.add_request("long", 30, 2, arrival_s=0.0)
    core.add_request("short", 3, 2, arrival_s=0.0)
    plan = core.policy.schedule(core.view(0.0))
    assert [rid for rid, _ in plan.admit] == ["short", "long"]
    with pytest.raises(ValueError):
        make_policy("sarathi", order="nope")


def test_orca_prefill_first_decodes_get_leftover() -> None:
    core = _core("orca", 5)
    core.add_request("a", 1, 9, arrival_s=0.0)
    core.add_request("b", 1, 9, arrival_s=0.0)
    t = core.step(0.0).end_s
    core.add_request("c", 4, 2, arrival_s=t)
    out = core.step(t)
    # c's 4 prefill tokens first, then one of the two decodes fits the budget of 5
    assert out.scheduled == [("a", 1, True), ("c", 4, False)]


def test_vllm_v0_prefill_only_when_a_prompt_is_admissible() -> None:
    core = _core("vllm-v0", 16)
    core.add_request("a", 4, 5, arrival_s=0.0)
    t = core.step(0.0).end_s
    core.add_request("b", 4, 5, arrival_s=t)
    out = core.step(t)
    assert [(r, d) for r, _, d in out.scheduled] == [("b", False)]  # no mixing: a waits
    out = core.step(out.end_s)
    assert all(d for _, _, d in out.scheduled) and len(out.scheduled) == 2


def test_oversize_prompt_never_deadlocks_non_chunking_policies() -> None:
    for name in ("vllm-v0", "fastertransformer"):
        core = _core(name, 8)
        core.add_request("big", 20, 2, arrival_s=0.0)
        t, steps = 0.0, 0
        while core.has_work() and steps < 20:
            t = core.step(t).end_s
            steps += 1
        assert not core.has_work(), name


def test_fastertransformer_blocks_admission_while_decoding() -> None:
    core = _core("fastertransformer", 64)
    core.add_request("a", 2, 4, arrival_s=0.0)
    t = core.step(0.0).end_s
    core.add_request("b", 2, 2, arrival_s=t)
    seen = []
    while core.has_work():
        out = core.step(t)
        seen.append(tuple(r for r, _, _ in out.scheduled))
        t = out.end_s
    assert seen == [("a",), ("a",), ("a",), ("b",), ("b",)]


@pytest.mark.parametrize("name", ["vllm", "sarathi", "orca", "vllm-v0", "fastertransformer"])
def test_steady_only_for_pure_decode(name: str) -> None:
    core = _core(name, 64)
    core.add_request("a", 3, 10, arrival_s=0.0)
    plan = core.policy.schedule(core.view(0.0))
    assert isinstance(plan, Plan) and not plan.steady
    t = core.step(0.0).end_s
    assert core.policy.schedule(core.view(t)).steady


def test_vllm_priority_mode_admits_and_evicts_by_priority() -> None:
    cfg = EngineConfig(num_blocks=6, block_size=4, token_budget=64, max_num_seqs=8)
    core = EngineCore(
        make_policy("vllm", scheduling_policy="priority"), AffineCostModel(base_s=1.0), cfg
    )
    core.add_request("free-old", 4, 12, arrival_s=0.0, priority=1)
    core.add_request("paid-new", 4, 12, arrival_s=0.5, priority=0)
    out = core.step(1.0)
    assert [rid for rid, _, _ in out.scheduled] == ["paid-new", "free-old"]  # priority first
    core.add_request("paid-2", 4, 12, arrival_s=1.5, priority=0)
    t = out.end_s
    preempted: list[str] = []
    while core.has_work() and not preempted:
        out = core.step(t)
        preempted = out.preempted
        t = out.end_s
    assert preempted and preempted[0] == "free-old"  # max (priority, arrival) is the victim
    with pytest.raises(ValueError):
        make_policy("vllm", scheduling_policy="edf")
