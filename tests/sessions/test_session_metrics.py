"""Per-session metrics equal hand-computed values (a run directory written by hand)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from harness.loadgen.sessions import write_sessions
from harness.results import schema
from harness.results.rundir import RunWriter, read_run
from harness.results.sessions import add_session_summary, call_metrics, per_session, read_sessions

TIERS = [
    {"name": "paid", "share": 0.5, "ttft_slo_s": 0.5, "tbt_slo_s": 0.1, "priority": 0},
    {"name": "free", "share": 0.5, "ttft_slo_s": 2.0, "tbt_slo_s": None, "priority": 1},
]


def _req(req, rid, tier, sid, k, attempt, send, chunks, ok=True, kind=None):
    return {
        "req": req,
        "request_id": rid,
        "tier": tier,
        "prompt_len": 10 * (k + 1),
        "output_len": 3,
        "prompt_tokens": 10 * (k + 1),
        "output_tokens": len(chunks) if ok else 0,
        "target_s": send,
        "arrival_s": send,
        "send_s": send,
        "first_chunk_s": chunks[0] if chunks else float("nan"),
        "last_chunk_s": chunks[-1] if chunks else float("nan"),
        "num_chunks": len(chunks),
        "success": ok,
        "error_kind": kind,
        "session_id": sid,
        "call_index": k,
        "parents": "" if k == 0 else str(k - 1),
        "attempt": attempt,
    }, chunks


def _session(sid, tier, target, start, end, planned, done, failed, abandoned, reason):
    return {
        "session_id": sid, "tier": tier, "target_s": target, "start_s": start, "end_s": end,
        "calls_planned": planned, "calls_sent": done + failed, "calls_done": done,
        "calls_failed": failed, "retries": 0, "abandoned": abandoned, "end_reason": reason,
        "errors": None,
    }  # fmt: skip


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    d = tmp_path / "run"
    rows = [
        _req(0, "A/0", "paid", "A", 0, 0, 0.0, [0.2, 0.25, 0.3]),  # TTFT 0.2, ITL 0.05: met
        _req(1, "A/1", "paid", "A", 1, 0, 1.0, [1.6, 1.65]),  # TTFT 0.6 > 0.5: missed
        _req(2, "B/0", "free", "B", 0, 0, 1.9, [], ok=False, kind="http_status"),
        _req(5, "B/0#retry1", "free", "B", 0, 1, 2.0, [2.5, 3.0]),  # last attempt: met
        _req(3, "C/0", "free", "C", 0, 0, 4.0, [4.1]),  # met
        _req(4, "C/1", "free", "C", 1, 0, 5.0, [], ok=False, kind="abandoned"),
    ]
    with RunWriter(d, {"tiers": TIERS, "sessions": {"num_sessions": 3}}) as w:
        for row, chunks in rows:
            w.add_request(row)
            if chunks:
                w.add_chunks(row["req"], chunks, [1] * len(chunks))
        w.update_meta(duration_s=10.0)
    sessions = [
        _session("A", "paid", 0.0, 0.0, 1.65, 2, 2, 0, False, "complete"),
        _session("B", "free", 1.5, 1.9, 3.0, 1, 1, 1, False, "complete"),
        _session("C", "free", 4.0, 4.0, 5.2, 3, 1, 1, True, "abandoned"),
    ]
    write_sessions(d, pa.Table.from_pylist(sessions, schema=schema.SESSIONS))
    return d


def test_per_session_values_match_hand_computation(run_dir: Path) -> None:
    calls = call_metrics(read_run(run_dir))
    assert len(calls) == 5  # B/0's failed first attempt is replaced by its retry
    s = per_session(read_sessions(run_dir), calls).set_index("session_id")
    assert s["calls_met"].to_dict() == {"A": 1, "B": 1, "C": 1}
    assert s["fraction_met"].to_dict() == pytest.approx({"A": 0.5, "B": 1.0, "C": 1 / 3})
    assert s["all_met"].to_dict() == {"A": False, "B": True, "C": False}
    assert s["duration_s"].to_dict() == pytest.approx({"A": 1.65, "B": 1.1, "C": 1.2})
    assert s["ttlt_s"].to_dict() == pytest.approx({"A": 1.65, "B": 1.5, "C": 1.2})


def test_summary_per_tier_goodput_and_turns(run_dir: Path) -> None:
    out = add_session_summary(run_dir)
    assert out is not None
    assert out["sessions"] == 3 and out["abandoned"] == 1 and out["completed"] == 2
    assert out["slo_attainment"] == pytest.approx(1 / 3)
    assert out["mean_fraction_met"] == pytest.approx((0.5 + 1 + 1 / 3) / 3)
    assert out["session_goodput"] == pytest.approx(0.1)  # 1 all-met session in 10 s
    assert out["sessions_per_s"] == pytest.approx(0.3)
    assert out["calls_per_s"] == pytest.approx(0.6)  # 6 request rows in 10 s
    assert out["tiers"]["paid"]["slo_attainment"] == 0.0
    assert out["tiers"]["free"]["slo_attainment"] == 0.5
    assert out["tiers"]["free"]["session_goodput"] == pytest.approx(0.1)
    t0, t1 = out["per_turn"]
    assert t0["calls"] == 3 and t0["ttft_mean_ms"] == pytest.approx((200 + 500 + 100) / 3)
    assert t1["calls"] == 2 and t1["success"] == 0.5 and t1["ttft_mean_ms"] == pytest.approx(600)
    assert t0["ttft_per_prompt_token_ms"] == pytest.approx((20 + 50 + 10) / 3)
    assert (run_dir / schema.SUMMARY_JSON).is_file()


def test_plain_run_has_no_session_summary(tmp_path: Path) -> None:
    with RunWriter(tmp_path / "p", {}) as w:
        w.add_request({"req": 0, "request_id": "x", "success": True})
    assert add_session_summary(tmp_path / "p") is None
    run = read_run(tmp_path / "p")
    assert list(run.requests.columns) == schema.REQUESTS.names  # plain runs read unchanged
