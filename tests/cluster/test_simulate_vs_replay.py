"""`simulate` and `replay` of one session trace write comparable run directories (issue 16):
the same tables and columns, the same calls with the same composed prompt lengths, the same
session outcomes. The live side is a real replay against the built-in server."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

from harness.engine.cluster_run import write_cluster_run
from harness.loadgen.replay import ReplayConfig, run_replay_async
from harness.results import schema
from harness.server.embed import embedded
from harness.workload.session_build import build_session_trace
from harness.workload.session_options import SessionOptions

from .conftest import engines


async def test_simulate_and_replay_write_comparable_run_dirs(tmp_path: Path) -> None:
    trace = build_session_trace(
        "synthetic-conv",
        num_sessions=5,
        session_rate=4.0,
        seed=1,
        think_time="exp:0.1",
        quiet=True,
    )
    async with embedded(policy="vllm", kv_tokens=1 << 15, speed=4.0) as url:
        cfg = ReplayConfig(
            trace="synthetic-conv",
            arrival="trace",
            target=url,
            progress=False,
            out=tmp_path / "live",
            sample_interval_s=None,
            sessions=SessionOptions(),
        )
        live = await run_replay_async(cfg, trace=trace)
    sim, _ = write_cluster_run(
        tmp_path / "sim",
        trace,
        engines(1, kv_tokens=1 << 15),
        None,
        {},
        options=SessionOptions(),
    )
    key = ["request_id", "call_index", "parents", "attempt", "prompt_len", "output_tokens"]
    tables = {}
    for name, d in (("live", live), ("sim", sim)):
        req = pq.read_table(d / schema.REQUESTS_FILE)
        assert req.schema.names == schema.REQUESTS_SESSIONS.names, name
        sess = pq.read_table(d / schema.SESSIONS_FILE)
        assert sess.schema.names == schema.SESSIONS.names, name
        df = req.to_pandas().sort_values("request_id").reset_index(drop=True)
        assert df["success"].all(), name
        tables[name] = (df[key], sess.to_pandas().sort_values("session_id"))
    live_req, live_sess = tables["live"]
    sim_req, sim_sess = tables["sim"]
    assert live_req.to_dict("records") == sim_req.to_dict("records")
    assert list(live_sess["end_reason"]) == list(sim_sess["end_reason"]) == ["complete"] * 5
    assert list(live_sess["calls_done"]) == list(sim_sess["calls_done"])
