"""The router registry and round-robin (issue 16): names, errors, fresh state per instance."""

from __future__ import annotations

import pytest
from router_fakes import engines

from harness.routers import RouteCall, UnknownRouterError, available_routers, make_router


def _call(i: int, session: str | None = None) -> RouteCall:
    return RouteCall(request_id=f"r{i}", prompt_len=100, max_tokens=10, session_id=session)


def test_round_robin_is_registered_and_listed():
    assert "round-robin" in available_routers()
    assert available_routers() == sorted(available_routers())


def test_unknown_router_names_the_known_ones():
    with pytest.raises(UnknownRouterError, match="round-robin"):
        make_router("no-such-router")


def test_round_robin_cycles_in_index_order():
    r = make_router("round-robin")
    eng = engines(3)
    assert [r.route(_call(i), eng, 0.0) for i in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_round_robin_ignores_load_and_each_instance_starts_fresh():
    eng = engines(2)
    eng[0].outstanding_tokens = 10_000
    a, b = make_router("round-robin"), make_router("round-robin")
    assert a.route(_call(0), eng, 0.0) == 0
    assert b.route(_call(1), eng, 0.0) == 0


def test_round_robin_takes_no_parameters():
    with pytest.raises(TypeError):
        make_router("round-robin", seed=1)
