"""`harness trace build|show` on session sources: the frozen file keeps its session columns,
reads back exactly as built (Parquet and JSONL), `show` counts sessions, and a replay of the
frozen file sends the same sessions (a real local echo server)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from echo_thread import echo_in_thread
from typer.testing import CliRunner

from harness.cli.main import app
from harness.results.rundir import read_run
from harness.workload.session_build import build_session_trace
from harness.workload.sources.conversations import is_session_source

runner = CliRunner()
REPO = Path(__file__).resolve().parents[2]
FORK_JOIN = REPO / "traces" / "agents" / "fork-join.yaml"
SESSION_COLS = ["session_id", "call_index", "parents", "think_s", "context"]
REPLAY_COLS = ["request_id", "arrival_s", "prompt_len", "output_len", "tier", *SESSION_COLS]


def run(*args: str):  # noqa: ANN202
    return runner.invoke(app, list(args))


def sharegpt_file(tmp_path: Path) -> Path:
    convs = [
        {
            "id": f"c{k}",
            "conversations": [
                m
                for t in range(k + 1)
                for m in (
                    {"from": "human", "value": f"question {k} {t} " * 3},
                    {"from": "gpt", "value": f"answer {k} {t} " * 4},
                )
            ],
        }
        for k in range(4)
    ]
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(convs))
    return path


@pytest.mark.parametrize("suffix", ["parquet", "jsonl"])
def test_synthetic_conv_frozen_replays_as_built(tmp_path: Path, suffix: str) -> None:
    out = tmp_path / f"s.{suffix}"
    args = ["-n", "6", "--rate", "2", "--seed", "3", "--think-time", "exp:0.5"]
    r = run("trace", "build", "synthetic-conv", *args, "-o", str(out))
    assert r.exit_code == 0, r.output
    assert "6 sessions" in r.output and out.is_file()
    want = build_session_trace(
        "synthetic-conv", num_sessions=6, session_rate=2.0, seed=3, think_time="exp:0.5"
    )
    assert is_session_source(str(out))
    back = build_session_trace(str(out))
    pd.testing.assert_frame_equal(back.df[REPLAY_COLS], want.df[REPLAY_COLS])
    assert back.content_hash() == want.content_hash()
    assert want.content_hash()[:16] in r.output


def test_show_counts_sessions_calls_and_turns(tmp_path: Path) -> None:
    out = tmp_path / "fj.parquet"
    r = run("trace", "build", str(FORK_JOIN), "-n", "5", "--rate", "1", "-o", str(out))
    assert r.exit_code == 0, r.output
    r = run("trace", "show", str(out), "--json")
    assert r.exit_code == 0, r.output
    s = json.loads(r.output)["sessions"]
    # fork-join: 4 calls per session on 3 rounds (agent1 -> agents 2 and 3 -> agent4)
    assert s["sessions"] == 5 and s["calls"] == 20
    assert s["calls_per_session"] == {"mean": 4.0, "p50": 4.0, "max": 4.0}
    assert s["turns_per_session"] == {"mean": 3.0, "p50": 3.0, "max": 3.0}
    assert sum(s["sessions_by_tier"].values()) == 5
    back = build_session_trace(str(out))
    assert set(back.df["agent"]) == {"agent1", "agent2", "agent3", "agent4"}
    assert back.df.groupby("session_id")["parents"].apply(sorted).iloc[0] == ["", "0", "0", "1,2"]
    r = run("trace", "show", str(out))  # the table view
    assert r.exit_code == 0, r.output
    assert "5 sessions, 20 calls" in r.output and "turns mean 3.00" in r.output


def test_sharegpt_conv_keeps_text_and_replies_in_jsonl(tmp_path: Path) -> None:
    src = sharegpt_file(tmp_path)
    out = tmp_path / "sg.jsonl"
    r = run("trace", "build", "sharegpt-conv", "--opt", f"path={src}", "--rate", "1",
            "-n", "4", "-o", str(out))  # fmt: skip
    assert r.exit_code == 0, r.output
    back = build_session_trace(str(out))
    want = build_session_trace("sharegpt-conv", path=str(src), session_rate=1.0, num_sessions=4)
    cols = [*REPLAY_COLS, "prompt", "reply"]
    pd.testing.assert_frame_equal(back.df[cols], want.df[cols])
    r = run("trace", "show", str(out), "--json")
    s = json.loads(r.output)["sessions"]
    assert s["sessions"] == 4 and s["calls"] == 1 + 2 + 3 + 4
    assert s["turns_per_session"]["max"] == 4.0 and s["calls_per_session"]["mean"] == 2.5


def test_lmsys_conv_profile_is_frozen_with_its_fallback_note(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # never the network in tests
    out = tmp_path / "l.parquet"
    r = run("trace", "build", "lmsys-conv", "-n", "10", "--rate", "2", "-o", str(out))
    assert r.exit_code == 0, r.output
    back = build_session_trace(str(out))
    assert "PROFILE" in back.meta["fallback"]
    assert back.df["session_id"].nunique() == 10


def test_replay_of_frozen_file_sends_the_frozen_sessions(tmp_path: Path) -> None:
    out = tmp_path / "s.jsonl"
    r = run("trace", "build", "synthetic-conv", "-n", "3", "--rate", "20",
            "--opt", "prompt_len=4", "--opt", "output_len=3", "--opt", "max_turns=3",
            "-o", str(out))  # fmt: skip
    assert r.exit_code == 0, r.output
    frozen = build_session_trace(str(out))
    with echo_in_thread() as srv:
        r = run("replay", "--trace", str(out), "--target", srv.url, "--no-progress",
                "--sample-interval", "0", "-o", str(tmp_path / "run"))  # fmt: skip
        assert r.exit_code == 0, r.output
        sent = {x.request_id for x in srv.log}
    run_dirs = [p.parent for p in (tmp_path / "run").rglob("run.json")]
    req = read_run(run_dirs[0]).requests
    assert sent == set(frozen.df["request_id"])
    got = req.set_index("request_id").sort_index()
    want = frozen.df.set_index("request_id").sort_index()
    assert got["session_id"].tolist() == want["session_id"].tolist()
    assert got["call_index"].tolist() == want["call_index"].tolist()
    assert got["parents"].tolist() == want["parents"].tolist()
    assert got["success"].all()


def test_session_build_errors_are_one_line(tmp_path: Path) -> None:
    out = tmp_path / "x.parquet"
    r = run("trace", "build", "synthetic-conv", "--duration", "5", "--rate", "1", "-o", str(out))
    assert r.exit_code == 2 and "--duration: not for a session source" in r.output
    r = run("trace", "build", "synthetic", "-n", "5", "--rate", "1", "--think-time", "1",
            "-o", str(out))  # fmt: skip
    assert r.exit_code == 2 and "--think-time: only for a session source" in r.output
    bad = tmp_path / "g.yaml"
    bad.write_text("calls:\n  - {parents: [1]}\n  - {parents: [0]}\n")
    r = run("trace", "build", str(bad), "-n", "1", "-o", str(out))
    assert r.exit_code == 2 and "cycle" in r.output and "Traceback" not in r.output
    r = run("trace", "build", "synthetic-conv", "-n", "2", "--rate", "1", "--think-time",
            "soon", "-o", str(out))  # fmt: skip
    assert r.exit_code == 2 and "think time 'soon'" in r.output
    assert not out.exists()


def test_non_utf8_agent_graph_is_one_line(tmp_path: Path) -> None:
    """A graph file that is not UTF-8 text used to end ``trace build`` in a traceback."""
    bad = tmp_path / "g.yaml"
    bad.write_bytes(b"calls:\n  - \xff\xfe\n")
    r = run("trace", "build", str(bad), "-n", "1", "-o", str(tmp_path / "x.parquet"))
    assert r.exit_code == 2 and isinstance(r.exception, SystemExit), r.exception
    assert "error:" in r.output and "not a readable agent graph" in r.output
