"""Session replays against a real local echo server (tests/sessions/echo.py): history, release
rules, fork-join, patience, retries and context overflow, read back from the run directory."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.parquet as pq
import pytest
from echo import EchoServer, start_echo

from harness.loadgen.replay import ReplayConfig, run_replay_async
from harness.results import schema
from harness.results.rundir import read_run
from harness.workload.session_options import SessionOptions
from harness.workload.sessions import SEPARATOR
from harness.workload.tiers import default_tiers
from harness.workload.trace import Trace

EPS = 1e-6


@pytest.fixture
async def echo() -> AsyncIterator[EchoServer]:
    srv, runner = await start_echo()
    try:
        yield srv
    finally:
        await runner.cleanup()


def calls(rows: list[dict[str, Any]]) -> Trace:
    """A session trace from call rows (defaults: one tier, arrival 0, a chain)."""
    df = pd.DataFrame(rows)
    df["request_id"] = df["session_id"] + "/" + df["call_index"].astype(str)
    df["tier"] = default_tiers()[0].name
    for col, val in (("arrival_s", 0.0), ("prompt_len", 3), ("output_len", 3), ("think_s", 0.0)):
        df[col] = df[col].fillna(val) if col in df.columns else val
    if "parents" not in df.columns:
        df["parents"] = ["" if k == 0 else str(k - 1) for k in df["call_index"]]
    return Trace.from_frame(df, default_tiers(), {"source": "test"})


async def replay(srv: EchoServer, trace: Trace, out: Path, **opts: Any):
    cfg = ReplayConfig(
        trace="test",
        arrival="trace",
        target=srv.url,
        progress=False,
        out=out,
        sample_interval_s=None,
        sessions=SessionOptions(**opts),
    )
    run_dir = await run_replay_async(cfg, trace=trace)
    run = read_run(run_dir)
    return run, pq.read_table(run_dir / schema.SESSIONS_FILE).to_pandas()


def conversation(sid: str = "a", turns: int = 3, replies: bool = True) -> list[dict[str, Any]]:
    return [
        {
            "session_id": sid,
            "call_index": k,
            "prompt": f"question-{sid}-{k}",
            "prompt_len": 1,
            "reply": f"answer-{sid}-{k}" if replies else None,
        }
        for k in range(turns)
    ]


async def test_call_k_holds_trace_history_of_calls_before_it(echo: EchoServer, tmp_path: Path):
    run, sess = await replay(echo, calls(conversation()), tmp_path / "r")
    got = echo.by_id()
    for k in range(3):
        want = []
        for j in range(k):
            want += [f"question-a-{j}", f"answer-a-{j}"]
        want.append(f"question-a-{k}")
        assert got[f"a/{k}"].prompt == SEPARATOR.join(want)
    req = run.requests.sort_values("call_index")
    assert req["session_id"].tolist() == ["a"] * 3
    assert req["parents"].tolist() == ["", "0", "1"]
    assert req["success"].all()
    # prompt_len is the composed history: 1 word per question + 3 output tokens per answer
    assert req["prompt_len"].tolist() == [1, 1 + 3 + 1, 1 + 3 + 1 + 3 + 1]
    assert sess.loc[0, "end_reason"] == "complete" and sess.loc[0, "calls_done"] == 3
    assert run.meta["sessions"]["num_sessions"] == 1


async def test_call_k_holds_the_servers_real_replies(echo: EchoServer, tmp_path: Path):
    run, _ = await replay(echo, calls(conversation(replies=False)), tmp_path / "r", history="reply")
    got = echo.by_id()
    p2 = got["a/2"].prompt
    assert p2 == SEPARATOR.join(
        [
            "question-a-0",
            EchoServer.reply_text("a/0", 3),
            "question-a-1",
            EchoServer.reply_text("a/1", 3),
            "question-a-2",
        ]
    )
    assert run.requests["success"].all()


async def test_child_released_after_parent_finished_plus_think(echo: EchoServer, tmp_path: Path):
    echo.itl_s = 0.01
    rows = conversation("b", 3)
    rows[1]["think_s"], rows[2]["think_s"] = 0.05, 0.12
    run, sess = await replay(echo, calls(rows), tmp_path / "r")
    r = run.requests.set_index("call_index")
    for k in (1, 2):
        parent_end = r.loc[k - 1, "last_chunk_s"]
        think = rows[k]["think_s"]
        assert r.loc[k, "target_s"] == pytest.approx(parent_end + think, abs=EPS)
        assert r.loc[k, "send_s"] >= parent_end + think - EPS
        assert r.loc[k, "arrival_s"] >= parent_end + think - EPS
    assert sess.loc[0, "end_s"] == pytest.approx(r["last_chunk_s"].max())


async def test_fork_join_waits_for_both_branches(echo: EchoServer, tmp_path: Path):
    echo.itl_s = 0.01
    rows = [
        {"session_id": "f", "call_index": 0, "parents": "", "output_len": 2},
        {"session_id": "f", "call_index": 1, "parents": "0", "output_len": 2},
        {"session_id": "f", "call_index": 2, "parents": "0", "output_len": 15},
        {"session_id": "f", "call_index": 3, "parents": "1,2", "output_len": 2},
    ]
    for row in rows:
        row["context"] = "replies"
    run, _ = await replay(echo, calls(rows), tmp_path / "r")
    r = run.requests.set_index("call_index")
    assert r.loc[2, "last_chunk_s"] > r.loc[1, "last_chunk_s"]  # the slow branch ends last
    assert r.loc[3, "send_s"] >= r.loc[2, "last_chunk_s"] - EPS
    assert r.loc[3, "target_s"] == pytest.approx(r.loc[[1, 2], "last_chunk_s"].max(), abs=EPS)
    prompt = echo.by_id()["f/3"].prompt  # both branches' replies are handed to the join
    assert "w0@f/1" not in prompt  # trace mode: synthesised replies, not the server's
    assert prompt.count(SEPARATOR) == 2
    assert r.loc[3, "parents"] == "1,2"


async def test_patience_abandons_the_session(echo: EchoServer, tmp_path: Path):
    echo.first_delay["slow/1"] = 1.0
    trace = calls(conversation("slow", 3) + conversation("fast", 3))
    run, sess = await replay(echo, trace, tmp_path / "r", patience_s=0.2)
    r = run.requests.set_index("request_id")
    assert r.loc["slow/1", "error_kind"] == "abandoned"
    assert "slow/2" not in echo.by_id()  # the user left: the next turn is never sent
    assert "slow/2" not in r.index
    s = sess.set_index("session_id")
    assert bool(s.loc["slow", "abandoned"]) and s.loc["slow", "end_reason"] == "abandoned"
    assert s.loc["fast", "end_reason"] == "complete" and s.loc["fast", "calls_done"] == 3
    # the abandoned call was cut about patience after its release
    cut = s.loc["slow", "end_s"] - r.loc["slow/1", "arrival_s"]
    assert 0.2 - EPS <= cut < 0.9


async def test_retry_with_backoff_then_success(echo: EchoServer, tmp_path: Path):
    echo.fail_first["r/0"] = 2
    run, sess = await replay(
        echo, calls(conversation("r", 2)), tmp_path / "r", max_retries=2, retry_backoff_s=0.05
    )
    r = run.requests.sort_values("send_s")
    assert r["request_id"].tolist() == ["r/0", "r/0#retry1", "r/0#retry2", "r/1"]
    assert r["attempt"].tolist() == [0, 1, 2, 0]
    assert r["success"].tolist() == [False, False, True, True]
    gaps = r["send_s"].diff().tolist()
    assert gaps[1] >= 0.05 - EPS and gaps[2] >= 0.10 - EPS  # backoff doubles
    assert sess.loc[0, "retries"] == 2 and sess.loc[0, "end_reason"] == "complete"
    assert (r["req"].nunique()) == 4  # each attempt its own row and join key


async def test_retries_exhausted_fail_the_session(echo: EchoServer, tmp_path: Path):
    echo.fail_first["x/0"] = 5
    run, sess = await replay(
        echo, calls(conversation("x", 2)), tmp_path / "r", max_retries=1, retry_backoff_s=0.01
    )
    assert run.requests["error_kind"].tolist() == ["http_status", "http_status"]
    assert "x/1" not in echo.by_id()
    assert sess.loc[0, "end_reason"] == "failed" and sess.loc[0, "calls_done"] == 0


async def test_history_beyond_context_is_recorded_and_the_run_goes_on(
    echo: EchoServer, tmp_path: Path
):
    long = conversation("long", 4)
    for row in long:
        row["prompt_len"], row["output_len"] = 10, 10
    trace = calls(long + conversation("short", 2))
    run, sess = await replay(echo, trace, tmp_path / "r", max_context=45)
    r = run.requests.set_index("request_id")
    # call 1: 10 + 10 + 10 = 30 prompt + 10 output = 40 fits; call 2: 50 + 10 does not
    assert r.loc["long/1", "success"]
    assert r.loc["long/2", "error_kind"] == "context_overflow"
    assert "long/2" not in echo.by_id() and "long/3" not in r.index
    s = sess.set_index("session_id")
    assert s.loc["long", "end_reason"] == "context_overflow"
    assert s.loc["short", "end_reason"] == "complete"


async def test_max_active_sessions_serialises_sessions(echo: EchoServer, tmp_path: Path):
    echo.itl_s = 0.005
    trace = calls(conversation("p", 2) + conversation("q", 2) + conversation("z", 2))
    _, sess = await replay(echo, trace, tmp_path / "r", max_active_sessions=1)
    s = sess.sort_values("start_s")
    assert (s["start_s"].to_numpy()[1:] >= s["end_s"].to_numpy()[:-1] - EPS).all()
    assert (s["start_s"] >= s["target_s"] - EPS).all()


async def test_agent_graph_calls_go_to_each_agents_target(echo: EchoServer, tmp_path: Path):
    from harness.workload.session_build import build_session_trace

    other, runner = await start_echo()
    try:
        graph = tmp_path / "g.yaml"
        graph.write_text(
            f"agents:\n  a1: {{target: '{echo.url}', output_len: 2}}\n"
            f"  a2: {{target: '{other.url}', output_len: 2}}\n"
            "calls:\n  - {agent: a1}\n  - {agent: a2, parents: [0]}\n"
            "  - {agent: a2, parents: [0]}\n"
            "  - {agent: a1, parents: [1, 2]}\n"
        )
        trace = build_session_trace(str(graph), num_sessions=2, session_rate=50.0)
        run, sess = await replay(echo, trace, tmp_path / "r")
    finally:
        await runner.cleanup()
    assert sorted(r.request_id.split("/")[1] for r in echo.log) == ["0", "0", "3", "3"]
    assert sorted(r.request_id.split("/")[1] for r in other.log) == ["1", "1", "2", "2"]
    assert (sess["end_reason"] == "complete").all()
    # the join is fed both branches' replies (context: replies)
    assert all(r.prompt.count(SEPARATOR) == 2 for r in echo.log if r.request_id.endswith("/3"))
    import json

    summary = json.loads((run.dir / schema.SUMMARY_JSON).read_text())
    assert summary["sessions"]["sessions"] == 2 and summary["sessions"]["slo_attainment"] == 1.0


@pytest.mark.parametrize("listed", [True, False])
async def test_context_from_the_server(echo: EchoServer, tmp_path: Path, listed: bool):
    """The context comes from /v1/models max_model_len (not sent), or the engine's own 400
    "maximum context length" (sent, refused): both are recorded as context_overflow."""
    echo.context_limit, echo.list_context = 30, listed
    rows = [
        {"session_id": "c", "call_index": k, "prompt": " ".join(["w"] * 8), "prompt_len": 8}
        for k in range(3)
    ]  # call 1: 8 + 3 + 8 words + 3 out = 22 fits; call 2: 8+3+8+3+8 + 3 = 33 does not
    run, sess = await replay(echo, calls(rows), tmp_path / "r")
    r = run.requests.set_index("request_id")
    assert r.loc["c/1", "success"] and r.loc["c/2", "error_kind"] == "context_overflow"
    assert ("c/2" in echo.by_id()) is (not listed)
    assert ("max_model_len" in r.loc["c/2", "error"]) is listed
    assert sess.loc[0, "end_reason"] == "context_overflow"


async def test_report_has_session_panels(echo: EchoServer, tmp_path: Path):
    from harness.report import write_report

    rows = conversation("a", 3) + conversation("b", 2)
    run, _ = await replay(echo, calls(rows), tmp_path / "r")
    html = write_report([run.dir]).read_text(encoding="utf-8")
    for title in ("TTFT by turn", "Prompt tokens by turn", "Session SLO attainment per tier"):
        assert title in html
    assert "Timeline of 2 sessions" in html


async def test_chat_endpoint_sends_history_as_turns(echo: EchoServer, tmp_path: Path):
    import json

    rows = conversation("m", 3, replies=False)
    trace = calls(rows)
    trace.df["system"] = "be brief"
    cfg = ReplayConfig(
        trace="test",
        arrival="trace",
        target=echo.url,
        endpoint="chat",
        progress=False,
        out=tmp_path / "r",
        sample_interval_s=None,
        sessions=SessionOptions(history="reply"),
    )
    await run_replay_async(cfg, trace=trace)
    msgs = json.loads(echo.by_id()["m/2"].prompt)
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert msgs[0]["content"] == "be brief" and msgs[-1]["content"] == "question-m-2"
    assert msgs[2]["content"] == EchoServer.reply_text("m/0", 3)  # the real reply, via delta


async def test_duration_bound_cancels_sessions_in_progress(echo: EchoServer, tmp_path: Path):
    rows = conversation("d", 3)
    rows[1]["think_s"] = 30.0  # would wait long past the bound
    trace = calls(rows + conversation("e", 1))
    cfg = ReplayConfig(
        trace="test",
        arrival="trace",
        target=echo.url,
        progress=False,
        out=tmp_path / "r",
        sample_interval_s=None,
        duration_s=0.3,
        drain_timeout_s=0.2,
        sessions=SessionOptions(),
    )
    run_dir = await run_replay_async(cfg, trace=trace)
    sess = pq.read_table(run_dir / schema.SESSIONS_FILE).to_pandas().set_index("session_id")
    assert sess.loc["d", "end_reason"] == "cancelled" and sess.loc["d", "calls_done"] == 1
    assert sess.loc["e", "end_reason"] == "complete"
    assert sorted(read_run(run_dir).requests["request_id"]) == ["d/0", "e/0"]  # d/1 never sent


async def test_open_file_budget_holds_for_session_calls(
    echo: EchoServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Issue 14's fd budget (client_limit, never Errno 24) also caps session calls in flight."""
    import dataclasses

    import harness.loadgen.replay as replay_mod
    from harness.loadgen.fdlimit import fd_budget

    # the real budget, with room for one socket (as `ulimit -n` just above the reserve would)
    monkeypatch.setattr(
        replay_mod, "fd_budget", lambda: dataclasses.replace(fd_budget(), max_in_flight=1)
    )
    echo.first_delay["a/0"] = 0.5  # holds the only slot while b's call is due
    trace = calls(conversation("a", 1) + conversation("b", 1))
    run, sess = await replay(echo, trace, tmp_path / "r")
    r = run.requests.set_index("request_id")
    assert r.loc["a/0", "success"]
    assert r.loc["b/0", "error_kind"] == schema.ERROR_CLIENT_LIMIT
    assert "b/0" not in echo.by_id()  # not sent
    s = sess.set_index("session_id")
    assert s.loc["b", "calls_sent"] == 0 and s.loc["b", "end_reason"] == "failed"


def test_real_replies_from_sglang_generate_stream() -> None:
    """History in ``reply`` mode from SGLang's native /generate stream (cumulative ``text``,
    no ``choices``): the reply used to be captured as empty, dropping it from the history."""
    import json

    from harness.loadgen.sessions import _reply_texts
    from harness.loadgen.sse import DONE

    def msg(text: str) -> bytes:
        return json.dumps({"text": text, "meta_info": {"completion_tokens": 1}}).encode()

    out: list[str] = []
    _reply_texts([msg("Hel"), msg("Hello")], out)
    _reply_texts([msg("Hello there"), DONE], out)
    assert "".join(out) == "Hello there"
    inc: list[str] = []  # --incremental-streaming-output: each message a new piece
    _reply_texts([msg("Hel"), msg("lo"), msg(" there")], inc)
    assert "".join(inc) == "Hello there"
    chat: list[str] = []
    _reply_texts([json.dumps({"choices": [{"delta": {"content": "Hi"}}]}).encode()], chat)
    assert chat == ["Hi"]
