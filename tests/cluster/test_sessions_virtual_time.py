"""Sessions in virtual time follow the live replay's rules (harness.loadgen.sessions)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from harness.cli.main import app
from harness.engine.cluster import simulate_cluster
from harness.loadgen.replay import ReplayConfig
from harness.results import schema
from harness.results.schema import ERROR_ABANDONED
from harness.routers import make_router
from harness.workload.build import save_trace
from harness.workload.session_build import build_session_trace
from harness.workload.session_options import SessionOptions
from harness.workload.trace import Trace

from .conftest import engines, session_trace

_TWO_CALLS = [
    {"session_id": "s", "call_index": k, "parents": "" if k == 0 else "0", "prompt_len": 20,
     "output_len": 5, "arrival_s": 0.0}
    for k in range(2)
]  # fmt: skip


def _by_id(res):  # noqa: ANN001, ANN202
    return {r.request_id: r for r in res.driver.rows}


def test_release_order_think_time_and_history(chain_trace: Trace) -> None:
    res = simulate_cluster(chain_trace, engines(1))
    rows = _by_id(res)
    assert len(rows) == 6 and all(r.ok for r in rows.values())
    for s in ("a", "b"):
        assert rows[f"{s}/0"].arrival_s == (0.0 if s == "a" else 0.5)
        for k in (1, 2):
            parent = rows[f"{s}/{k - 1}"]
            assert rows[f"{s}/{k}"].arrival_s == pytest.approx(parent.last_s + 1.0)
            assert rows[f"{s}/{k}"].target_s == rows[f"{s}/{k}"].arrival_s
        # history: every earlier turn's text and reply, then the call's own text
        assert [rows[f"{s}/{k}"].prompt_len for k in range(3)] == [50, 50 + 20 + 60, 130 + 90]
    tbl = res.driver.requests_table(True)
    assert tbl.schema == schema.REQUESTS_SESSIONS
    sess = res.driver.sessions_table().to_pylist()
    assert [s["end_reason"] for s in sess] == ["complete", "complete"]
    assert sess[0]["end_s"] == rows["a/2"].last_s


def test_call_overhead_delays_every_release(chain_trace: Trace) -> None:
    # the client and API server's share of each call: roots arrive that much after their
    # session's start, children that much after parent end + think (vsessions docstring)
    base = _by_id(simulate_cluster(chain_trace, engines(1)))
    opts = SessionOptions(call_overhead_s=0.25)
    rows = _by_id(simulate_cluster(chain_trace, engines(1), options=opts))
    assert len(rows) == 6 and all(r.ok for r in rows.values())
    for s in ("a", "b"):
        assert rows[f"{s}/0"].arrival_s == pytest.approx(base[f"{s}/0"].arrival_s + 0.25)
        for k in (1, 2):
            parent = rows[f"{s}/{k - 1}"]
            assert rows[f"{s}/{k}"].arrival_s == pytest.approx(parent.last_s + 1.0 + 0.25)
    for bad in (-0.1, float("inf"), float("nan")):
        with pytest.raises(ValueError):
            SessionOptions(call_overhead_s=bad)


def test_call_overhead_is_for_simulation_only(tmp_path: Path) -> None:
    """A live replay has the real overhead: its config refuses the modelled one."""
    with pytest.raises(ValueError, match="simulate only"):
        ReplayConfig(
            trace="test",
            arrival="trace",
            target="http://127.0.0.1:9",
            out=tmp_path / "r",
            sessions=SessionOptions(call_overhead_s=0.1),
        )


def test_bad_call_overhead_flag_is_named_in_one_line(tmp_path: Path) -> None:
    trace = tmp_path / "s.parquet"
    save_trace(session_trace(_TWO_CALLS), trace)
    r = CliRunner().invoke(
        app,
        ["simulate", "--trace", str(trace), "--call-overhead", "-1", "--out", str(tmp_path / "o")],
    )
    assert r.exit_code != 0
    assert "--call-overhead:" in r.output and "--call-overhead-s" not in r.output


def test_patience_abandons_the_session_and_its_descendants() -> None:
    rows = []
    for s in range(30):
        for k in range(2):
            rows.append(
                {
                    "session_id": f"s{s}",
                    "call_index": k,
                    "parents": "" if k == 0 else "0",
                    "prompt_len": 1500,
                    "output_len": 50,
                    "arrival_s": 0.0,
                }
            )
    trace = session_trace(rows)
    opts = SessionOptions(patience_s=0.4)
    res = simulate_cluster(trace, engines(1, token_budget=512), options=opts)
    got = res.driver.rows
    gone = [r for r in got if r.error_kind == ERROR_ABANDONED]
    assert gone, "an overloaded engine must make someone give up"
    sessions = {s["session_id"]: s for s in res.driver.sessions_table().to_pylist()}
    reqs = {r.req for r in gone}
    assert not np.isin(res.chunk_req, list(reqs)).any()  # no token of an abandoned call
    for r in gone:
        sid = r.session.session.session_id
        assert sessions[sid]["abandoned"] and sessions[sid]["end_reason"] == ERROR_ABANDONED
        assert not np.isfinite(r.first_s)
        if r.call.index == 0:  # its child was never sent: no row
            assert f"{sid}/1" not in {x.request_id for x in got}
    for r in got:
        if r.ok:
            assert r.first_s <= r.arrival_s + 0.4


def test_retries_each_attempt_a_row_and_the_child_never_sent() -> None:
    trace = session_trace(
        [
            {
                "session_id": "x",
                "call_index": 0,
                "parents": "",
                "prompt_len": 5000,
                "output_len": 10,
                "arrival_s": 1.0,
            },
            {
                "session_id": "x",
                "call_index": 1,
                "parents": "0",
                "prompt_len": 10,
                "output_len": 10,
                "arrival_s": 1.0,
            },
        ]
    )
    opts = SessionOptions(max_retries=2, retry_backoff_s=0.5)
    res = simulate_cluster(trace, engines(1, kv_tokens=4096), options=opts)
    rows = sorted(res.driver.rows, key=lambda r: r.req)
    assert [r.request_id for r in rows] == ["x/0", "x/0#retry1", "x/0#retry2"]
    assert [r.attempt for r in rows] == [0, 1, 2]
    assert [r.arrival_s for r in rows] == [1.0, 1.5, 2.5]
    assert all(r.error_kind == schema.ERROR_REJECTED for r in rows)
    (sess,) = res.driver.sessions_table().to_pylist()
    assert sess["retries"] == 2 and sess["end_reason"] == "failed" and sess["calls_failed"] == 3


def test_max_active_sessions_waits_for_a_slot(chain_trace: Trace) -> None:
    res = simulate_cluster(chain_trace, engines(1), options=SessionOptions(max_active_sessions=1))
    a, b = res.driver.sessions_table().to_pylist()
    assert b["target_s"] == 0.5 and b["start_s"] == a["end_s"]
    assert _by_id(res)["b/0"].arrival_s == a["end_s"]


def test_session_cluster_deferral_is_exact() -> None:
    trace = build_session_trace(
        "synthetic-conv",
        num_sessions=40,
        session_rate=4.0,
        seed=3,
        think_time="exp:1",
        quiet=True,
    )
    runs = [
        simulate_cluster(
            trace,
            engines(2, kv_tokens=1 << 15),
            make_router("session-affinity"),
            fast_forward=ff,
        )
        for ff in (False, True)
    ]
    a, b = (sorted(r.driver.rows, key=lambda x: x.req) for r in runs)
    assert runs[1].counters["deferred_runs"] > 0
    np.testing.assert_allclose([r.first_s for r in a], [r.first_s for r in b])
    np.testing.assert_allclose([r.last_s for r in a], [r.last_s for r in b])
    assert runs[1].counters["prefix_cache_hits"] > 0  # later turns hit earlier turns' blocks
