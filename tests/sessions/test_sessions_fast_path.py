"""Session calls keep the load generator's byte-scan fast path (the plain OpenAI interpreter,
harness.loadgen.client.make_feed) unless the server's replies are captured as history."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from echo import EchoServer, start_echo

import harness.loadgen.sessions as ls
from harness.loadgen.client import interpret_openai
from harness.loadgen.replay import ReplayConfig, run_replay_async
from harness.results.rundir import read_run
from harness.workload.session_options import SessionOptions
from harness.workload.tiers import default_tiers
from harness.workload.trace import Trace


@pytest.fixture
async def echo() -> AsyncIterator[EchoServer]:
    srv, runner = await start_echo()
    try:
        yield srv
    finally:
        await runner.cleanup()


def _trace() -> Trace:
    df = pd.DataFrame(
        {
            "session_id": ["a"] * 3,
            "call_index": [0, 1, 2],
            "parents": ["", "0", "1"],
            "prompt": [f"question-{k}" for k in range(3)],
            "prompt_len": 1,
            "output_len": 3,
            "think_s": 0.0,
            "arrival_s": 0.0,
        }
    )
    df["request_id"] = "a/" + df["call_index"].astype(str)
    df["tier"] = default_tiers()[0].name
    return Trace.from_frame(df, default_tiers(), {"source": "test"})


@pytest.mark.parametrize("history", ["trace", "reply"])
async def test_plain_interpreter_unless_replies_are_captured(
    echo: EchoServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, history: str
) -> None:
    seen: list[Any] = []
    real = ls.stream_request

    async def spy(*args: Any) -> None:  # the real client, its interpreter noted
        seen.append(args[-1])
        await real(*args)

    monkeypatch.setattr(ls, "stream_request", spy)
    cfg = ReplayConfig(
        trace="test",
        arrival="trace",
        target=echo.url,
        progress=False,
        out=tmp_path / "r",
        sample_interval_s=None,
        sessions=SessionOptions(history=history),
    )
    run = read_run(await run_replay_async(cfg, trace=_trace()))
    assert run.requests["success"].all() and len(seen) == 3
    plain = [f is interpret_openai for f in seen]
    assert plain == ([True] * 3 if history == "trace" else [False] * 3)
    assert (run.requests["output_tokens"] == 3).all()  # same counts on either path
