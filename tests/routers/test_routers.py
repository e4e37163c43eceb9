"""Each built-in router against small fake engines (issue 16): the rule it states, its params."""

from __future__ import annotations

from collections import Counter

import pytest
from router_fakes import engines

from harness.routers import RouteCall, make_router
from harness.routers.prefix_aware import queue_scores


def _call(i: int, session: str | None = None, prompt_len: int = 100, ident=None) -> RouteCall:
    return RouteCall(
        request_id=f"r{i}",
        prompt_len=prompt_len,
        max_tokens=10,
        session_id=session,
        identity=ident,
    )


def test_random_is_seeded_and_roughly_uniform():
    eng = engines(4)
    a = [make_router("random", seed=7).route(_call(i), eng, 0.0) for i in range(1)]
    r1, r2 = make_router("random", seed=7), make_router("random", seed=7)
    s1 = [r1.route(_call(i), eng, 0.0) for i in range(4000)]
    s2 = [r2.route(_call(i), eng, 0.0) for i in range(4000)]
    assert s1 == s2 and s1[:1] == a
    counts = Counter(s1)
    assert set(counts) == {0, 1, 2, 3}
    assert all(800 < c < 1200 for c in counts.values()), counts
    other = make_router("random", seed=8)
    assert [other.route(_call(i), eng, 0.0) for i in range(4000)] != s1
    assert r1.params() == {"seed": 7}


def test_least_outstanding_tokens_picks_the_lightest_and_spreads_ties():
    eng = engines(3)
    eng[0].outstanding_tokens, eng[1].outstanding_tokens, eng[2].outstanding_tokens = 50, 10, 30
    r = make_router("least-outstanding-tokens")
    assert r.route(_call(0), eng, 0.0) == 1
    idle = engines(3)
    assert sorted(r.route(_call(i), idle, 0.0) for i in range(3)) == [0, 1, 2]


def test_session_affinity_sticks_and_places_new_sessions_on_the_least_loaded():
    eng = engines(3)
    eng[0].outstanding_tokens = 500
    eng[1].outstanding_tokens = 100
    eng[2].outstanding_tokens = 300
    r = make_router("session-affinity")
    assert r.route(_call(0, "s1"), eng, 0.0) == 1
    eng[1].outstanding_tokens = 350  # now heavier than engine 2, but within the slack
    assert r.route(_call(1, "s1"), eng, 1.0) == 1
    assert r.route(_call(2, "s2"), eng, 1.0) == 2  # a new session goes to the lightest
    assert r.route(_call(3, None), eng, 1.0) == 2  # so does a call with no session


def test_session_affinity_moves_a_session_off_an_overloaded_engine():
    eng = engines(2)
    r = make_router("session-affinity", rebalance_factor=2.0)
    home = r.route(_call(0, "s", prompt_len=100), eng, 0.0)
    other = 1 - home
    eng[home].outstanding_tokens = 250  # excess 250 > 2 x 100: move
    assert r.route(_call(1, "s", prompt_len=100), eng, 1.0) == other
    assert r.moves == 1
    eng[home].outstanding_tokens = 0
    eng[other].outstanding_tokens = 150  # excess 150 <= 200: stay on the new home
    assert r.route(_call(2, "s", prompt_len=100), eng, 2.0) == other


def test_session_affinity_without_rebalance_never_moves_and_forgets_lru():
    eng = engines(2)
    r = make_router("session-affinity", rebalance_factor=None, max_sessions=2)
    home = r.route(_call(0, "a"), eng, 0.0)
    eng[home].outstanding_tokens = 10**9
    assert r.route(_call(1, "a"), eng, 0.0) == home
    r.route(_call(2, "b"), eng, 0.0)
    r.route(_call(3, "c"), eng, 0.0)  # evicts "a", the longest idle
    assert "a" not in r._home and len(r._home) == 2
    with pytest.raises(ValueError):
        make_router("session-affinity", rebalance_factor=-1)


def test_prefix_aware_prefers_the_cached_engine_until_load_outweighs_it():
    eng = engines(3)
    ident = ("conv", 1)
    eng[2].cache[ident] = 900
    for e, load in zip(eng, (100, 200, 300), strict=True):
        e.outstanding_tokens = load
    r = make_router("prefix-aware")
    # engine 2: 3 * 0.9 + 2 * 0 = 2.7 beats engine 0: 0 + 2 * 1 = 2.0
    assert r.route(_call(0, prompt_len=1000, ident=ident), eng, 0.0) == 2
    assert r.hits == 1
    # a 20% hit (0.6) does not beat the least loaded engine's 2.0
    eng[2].cache[ident] = 200
    assert r.route(_call(1, prompt_len=1000, ident=ident), eng, 0.0) == 0
    # load-only weights make it least outstanding tokens
    lot = make_router("prefix-aware", prefix_weight=0.0)
    eng[2].cache[ident] = 1000
    assert lot.route(_call(2, prompt_len=1000, ident=ident), eng, 0.0) == 0


def test_prefix_aware_without_identity_is_least_loaded():
    eng = engines(3)
    eng[0].outstanding_tokens, eng[1].outstanding_tokens = 40, 5
    eng[2].outstanding_tokens = 9
    assert make_router("prefix-aware").route(_call(0), eng, 0.0) == 1


def test_prefix_aware_equal_hits_break_ties_by_load():
    eng = engines(3)
    ident = "x"
    for e in eng[1:]:
        e.cache[ident] = 100
    eng[0].outstanding_tokens, eng[1].outstanding_tokens, eng[2].outstanding_tokens = 0, 80, 40
    # engine 0: 2.0; engine 1: 3 + 0 = 3.0; engine 2: 3 + 2*0.5 = 4.0
    assert make_router("prefix-aware").route(_call(0, prompt_len=100, ident=ident), eng, 0.0) == 2


def test_queue_scores_min_max():
    assert queue_scores([5, 5]) == [1.0, 1.0]
    assert queue_scores([0, 50, 100]) == [1.0, 0.5, 0.0]


@pytest.mark.parametrize("name", ["random", "session-affinity", "prefix-aware"])
def test_params_echo_for_run_json(name):
    p = make_router(name).params()
    assert p and all(not k.startswith("_") for k in p)
    with pytest.raises(TypeError):
        make_router(name, no_such_param=1)
