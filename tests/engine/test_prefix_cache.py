"""Prefix caching in the engine core (vLLM v1 semantics; harness/engine/prefix_cache.py)."""

from __future__ import annotations

import pytest

from harness.engine.config import EngineConfig
from harness.engine.conformance import (
    PREFIX_SCENARIOS,
    ScriptedPolicy,
    _everything,
    core_factory,
)
from harness.engine.core import EngineCore
from harness.engine.costmodel import AffineCostModel
from harness.engine.prefix_cache import PromptIdentity
from harness.workload.sessions import sessions_from_frame
from harness.workload.token_identity import call_identity, call_segments, reply_key


@pytest.mark.parametrize("scenario", PREFIX_SCENARIOS, ids=lambda s: s.__name__)
def test_core_prefix_scenarios(scenario) -> None:
    scenario(core_factory)


def _core(num_blocks: int = 64, block_size: int = 4, **kw) -> EngineCore:
    cfg = EngineConfig(block_size=block_size, num_blocks=num_blocks, token_budget=256, **kw)
    pol = ScriptedPolicy(lambda v, i: _everything(v))
    return EngineCore(pol, AffineCostModel(name="1ms", base_s=1e-3), cfg)


def _drain(core: EngineCore, now: float = 0.0) -> float:
    while core.has_work():
        out = core.step(now)
        now = out.end_s if not out.idle else now + 1e-3
    return now


def seg(*runs: tuple[str, int], reply: str | None = None) -> PromptIdentity:
    return PromptIdentity.from_segments(list(runs), reply_key=reply)


def test_block_hashes_chain_and_runs() -> None:
    a = seg(("sys", 8), ("u1", 5))
    b = seg(("sys", 8), ("u2", 5))
    ha, hb = a.block_hashes(4, 3), b.block_hashes(4, 3)
    assert ha[:2] == hb[:2] and ha[2] != hb[2]
    # same tokens split differently into runs are different tokens (named by run and offset)
    assert seg(("x", 4), ("y", 4)).block_hashes(4, 2)[1] != seg(("x", 8)).block_hashes(4, 2)[1]
    # a block's hash depends on its parent (the chain)
    assert (
        seg(("p", 4), ("q", 4)).block_hashes(4, 2)[1]
        != seg(("r", 4), ("q", 4)).block_hashes(4, 2)[1]
    )
    # token ids: equal ids, equal hashes; lazily extended into the reply run
    t1, t2 = (
        PromptIdentity.from_token_ids([1, 2, 3, 4, 5]),
        PromptIdentity.from_token_ids([1, 2, 3, 4, 6]),
    )
    assert t1.block_hashes(4, 1) == t2.block_hashes(4, 1)
    assert len(t1.block_hashes(4, 5)) == 5


def test_shared_system_prefix_hits_and_counters() -> None:
    core = _core()
    assert core.add_request("a", 13, 1, arrival_s=0, identity=seg(("sys", 10), ("a", 3)))
    _drain(core)
    assert core.cached_tokens(seg(("sys", 10), ("b", 6))) == 8
    assert core.add_request("b", 16, 1, arrival_s=0, identity=seg(("sys", 10), ("b", 6)))
    _drain(core)
    assert core.prefix_cache_queries == 13 + 16
    assert core.prefix_cache_hits == 8
    assert core.used_blocks == 0  # cached-but-free blocks count as free (vLLM usage)
    assert len(core.prefix_cache) > 0


def test_concurrent_sharing_counts_blocks_once() -> None:
    core = _core()
    ident = lambda k: seg(("sys", 16), (k, 4))  # noqa: E731
    assert core.add_request("a", 20, 50, arrival_s=0, identity=ident("a"))
    core.step(0.0)
    used_a = core.used_blocks  # 20 tokens + 1 = 6 blocks
    assert core.add_request("b", 20, 50, arrival_s=0, identity=ident("b"))
    core.step(0.1)
    b = core.get("b")
    assert b is not None and b.num_cached_tokens == 16
    # b shares a's 4 system blocks: it adds only its own 2
    assert core.used_blocks == used_a + 2
    _drain(core, 0.2)
    assert core.used_blocks == 0


def test_same_step_admissions_share() -> None:
    """vLLM caches full blocks at allocation: a request admitted later in the same step hits
    the blocks an earlier one is computing."""
    core = _core()
    for k in "ab":
        assert core.add_request(k, 20, 1, arrival_s=0, identity=seg(("sys", 16), (k, 4)))
    out = core.step(0.0)
    assert out.report is not None and out.report.prefill_tokens == 20 + 4


def test_reply_blocks_hit_next_turn() -> None:
    core = _core()
    t0 = seg(("s/0/text", 6), reply="s/0/reply")
    assert core.add_request("t0", 6, 11, arrival_s=0, identity=t0)
    _drain(core)
    # turn 1 holds turn 0's text and reply: 6 + 11 + 3 tokens
    t1 = seg(("s/0/text", 6), ("s/0/reply", 11), ("s/1/text", 3), reply="s/1/reply")
    # t0 computed 6 + 10 tokens (the last sampled token is never fed back): 4 full blocks
    assert core.cached_tokens(t1) == 16


def test_preemption_keeps_blocks_cached() -> None:
    core = _core(num_blocks=64)
    assert core.add_request("a", 12, 5, arrival_s=0, identity=seg(("a", 12)))
    core.step(0.0)
    core._preempt(core.get("a"))  # a recompute preemption frees KV; blocks stay cached
    assert core.used_blocks == 0
    core.step(0.1)
    a = core.get("a")
    assert a is not None and a.num_computed_tokens == 12 + 1  # 12 hit + 1 recomputed
    pc = core.prefix_cache
    assert pc is not None and pc.preempted_queries == 13 and pc.preempted_hits == 12
    assert pc.queries == 12 and pc.hits == 0


def test_off_and_plain_requests_unchanged() -> None:
    core = _core(prefix_caching=False)
    for k in "ab":
        assert core.add_request(k, 20, 1, arrival_s=0, identity=seg(("sys", 20)))
        _drain(core)
    assert core.prefix_cache is None and core.prefix_cache_hits == 0
    core = _core()
    for k in "ab":
        assert core.add_request(k, 20, 1, arrival_s=0)
        _drain(core)
    assert core.prefix_cache_hits == 0 and core.prefix_cache_queries == 40


def test_identity_length_must_match() -> None:
    core = _core()
    with pytest.raises(ValueError, match="prompt_len"):
        core.add_request("a", 5, 1, arrival_s=0, identity=seg(("x", 6)))


def test_eviction_under_pressure_keeps_accounting() -> None:
    """Many sessions through a small cache: block counts stay consistent with the cache."""
    core = _core(num_blocks=40)
    now = 0.0
    for i in range(60):
        ident = seg(("sys", 9), (f"u{i % 7}", 5 + i % 11), reply=f"r{i}")
        assert core.add_request(f"q{i}", 14 + i % 11, 3 + i % 5, arrival_s=now, identity=ident)
        if i % 3 == 0:
            now = _drain(core, now)
    _drain(core, now)
    pc = core.prefix_cache
    assert pc is not None
    assert core.used_blocks == 0
    assert all(v == 0 for v in pc.ref.values())
    assert len(pc.lru) == len(pc.hash_of) <= 40
    assert 0 < pc.hits < pc.queries


def _session_frame():
    import pandas as pd

    return pd.DataFrame(
        {
            "request_id": ["c0", "c1", "c2"],
            "arrival_s": [0.0, 0.0, 0.0],
            "prompt_len": [7, 5, 4],
            "output_len": [9, 6, 3],
            "session_id": ["s", "s", "s"],
            "call_index": [0, 1, 2],
            "system": ["you are a helpful assistant", None, None],
        }
    )


def test_call_segments_follow_compose() -> None:
    (s,) = sessions_from_frame(_session_frame())
    c0, c1, c2 = s.calls
    segs = call_segments(s, c2)
    assert [n for _, n in segs] == [5, 7, 9, 5, 6, 4]
    assert segs[2] == (reply_key(s, c0), 9)
    assert call_segments(s, c2, reply_len=lambda c: 1)[2][1] == 1
    # --history trace: the context's replies are the trace's text, not the generated run
    assert call_segments(s, c2, generated_replies=False)[2][0] != reply_key(s, c0)
    # turn 2 extends turn 1's prompt and reply: a core sees turn 1's blocks as its prefix
    core = _core()
    i1 = call_identity(s, c1)
    assert core.add_request("c1", i1.num_prompt_tokens, c1.output_len, arrival_s=0, identity=i1)
    _drain(core)
    i2 = call_identity(s, c2)
    computed = i1.num_prompt_tokens + c1.output_len - 1
    assert core.cached_tokens(i2) == computed // 4 * 4


def test_hit_rate_per_run_and_turn_from_a_run_dir(tmp_path) -> None:
    """Per-request counts (here from the core's num_cached_tokens) -> run and per-turn rates,
    and the sessions report's panel."""
    import pandas as pd

    from harness.report.sessions import prefix_hits_by_turn
    from harness.results.prefix_hits import prefix_hit_summary, write_prefix_hits

    (s,) = sessions_from_frame(_session_frame())
    core = _core()
    reqs, queries, hits = [], [], []
    for c in s.calls:  # one turn after the other, each after its parent finished
        ident = call_identity(s, c)
        assert core.add_request(
            c.request_id, ident.num_prompt_tokens, c.output_len, arrival_s=0, identity=ident
        )
        r = core.get(c.request_id)
        _drain(core)
        reqs.append(c.req)
        queries.append(r.num_prompt_tokens)
        hits.append(r.num_cached_tokens)
    assert hits[0] == 0 and hits[1] > 0 and hits[2] > hits[1]
    write_prefix_hits(tmp_path, reqs, queries, hits)
    requests = pd.DataFrame({"req": reqs, "call_index": [c.index for c in s.calls]})
    p = prefix_hit_summary(tmp_path, requests)
    assert p is not None
    assert p["hit_rate"] == pytest.approx(sum(hits) / sum(queries))
    assert [t["hit_rate"] for t in p["per_turn"]] == pytest.approx(
        [h / q for h, q in zip(hits, queries, strict=True)]
    )
    assert prefix_hits_by_turn(tmp_path, requests) is not None
    assert prefix_hit_summary(tmp_path / "none", requests) is None


def test_waiting_request_shows_its_cached_prefix_as_computed() -> None:
    """Like vLLM (and the vLLM adapter's view): the policy budgets only uncached tokens."""
    pol = ScriptedPolicy(lambda v, i: _everything(v))
    cfg = EngineConfig(block_size=4, num_blocks=64, token_budget=256)
    core = EngineCore(pol, AffineCostModel(name="1ms", base_s=1e-3), cfg)
    assert core.add_request("a", 13, 1, arrival_s=0, identity=seg(("sys", 10), ("a", 3)))
    core.step(0.0)  # a prefilled, finished: its 3 full blocks stay cached
    assert core.add_request("b", 16, 1, arrival_s=0, identity=seg(("sys", 10), ("b", 6)))
    assert core.add_request("c", 5, 1, arrival_s=0)  # no identity: nothing cached
    core.step(0.1)  # step index 1: b and c admitted
    seen = pol.views[1]
    assert seen.wait("b").num_computed_tokens == 8  # 2 blocks of "sys" (10 tokens)
    assert seen.wait("c").num_computed_tokens == 0
    assert pol.reports[1].prefill_tokens == (16 - 8) + 5
