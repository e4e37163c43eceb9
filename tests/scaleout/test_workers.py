"""`harness replay --workers N`: sharding rules, and N processes against a real local server
(fastsse in its own process) giving one run directory like one process does."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from scaleout_traces import make_trace

from harness.loadgen.bench import fast_server
from harness.loadgen.dispatcher import Job
from harness.loadgen.replay import ReplayConfig, run_replay_async
from harness.loadgen.workers import auto_workers, peak_rate, shard_jobs, split_cap
from harness.results import schema
from harness.results.rundir import read_run


def jobs(n: int, gap_s: float = 0.01) -> list[Job]:
    return [Job(i, f"r{i}", i * gap_s, None, 8, 4, None) for i in range(n)]


def test_round_robin_without_sessions() -> None:
    shards = shard_jobs(jobs(7), 3)
    assert [[j.req for j in s] for s in shards] == [[0, 3, 6], [1, 4], [2, 5]]


def test_a_session_stays_on_one_worker_and_load_is_balanced() -> None:
    keys = ["a", "a", "b", "c", "b", "a", None, None, "c", "d"]
    shards = shard_jobs(jobs(10), 2, keys)
    where = {}
    for s, shard in enumerate(shards):
        for j in shard:
            if keys[j.req] is not None:
                assert where.setdefault(keys[j.req], s) == s
        reqs = [j.req for j in shard]
        assert reqs == sorted(reqs)  # schedule order kept
    assert sorted(j.req for s in shards for j in s) == list(range(10))
    assert abs(len(shards[0]) - len(shards[1])) <= 3  # session "a" has 3 calls


def test_auto_workers_follow_the_peak_rate() -> None:
    assert peak_rate([0.0, 0.1, 0.2, 5.0]) == 3.0
    assert auto_workers(jobs(50, gap_s=0.1)) == 1  # 10 req/s: one process, today's path
    assert split_cap(5, 2) == [3, 2] and split_cap(None, 2) == [None, None]


@pytest.mark.parametrize("workers", [1, 2])
async def test_workers_write_one_run_like_one_process(tmp_path: Path, workers: int) -> None:
    trace = make_trace(300, rate=300.0)
    with fast_server() as url:
        cfg = ReplayConfig(
            trace="test", arrival="trace", target=url, progress=False, out=tmp_path / "run",
            sample_interval_s=None, workers=workers,
        )  # fmt: skip
        seen = []
        run_dir = await run_replay_async(cfg, trace=trace, on_progress=seen.append)
    run = read_run(run_dir)
    assert run.meta["status"] == schema.STATUS_COMPLETE
    assert not list(Path(run_dir).glob("*.parts"))  # parts merged into single files
    r = run.requests.sort_values("req").reset_index(drop=True)
    assert list(r["req"]) == list(range(300)) and r["success"].all()
    assert (r["num_chunks"] == 20).all() and len(run.chunks) == 300 * 20
    assert run.meta["rows"] == {"requests": 300, "chunks": 6000, "samples": 0}
    assert run.meta["dispatch"]["completed"] == 300 and run.meta["dispatch"]["failed"] == 0
    # Every worker keeps the one schedule: targets are the trace's offsets on the one t0.
    np.testing.assert_allclose(r["target_s"], trace.df["arrival_s"], atol=1e-9)
    assert (r["arrival_s"] >= r["target_s"]).all()
    assert seen and seen[-1].done == 300  # the progress callback saw the aggregate
    if workers == 1:
        assert "workers" not in run.meta
    else:
        w = run.meta["workers"]
        assert w["count"] == 2 and sum(p["requests"] for p in w["per_worker"]) == 300
        assert all(p["completed"] == 150 for p in w["per_worker"])
        from harness.report import write_report

        html = write_report([Path(run_dir)]).read_text()
        assert "load generator" in html and "2 workers" in html


async def test_cancelling_a_sharded_run_records_in_flight_requests(tmp_path: Path) -> None:
    import asyncio

    trace = make_trace(40, rate=40.0, output_len=100)  # 100 chunks 20 ms apart: 2 s each
    with fast_server(itl_ms=20.0) as url:
        cfg = ReplayConfig(
            trace="test", arrival="trace", target=url, progress=False, out=tmp_path / "run",
            sample_interval_s=None, workers=2,
        )  # fmt: skip
        task = asyncio.ensure_future(run_replay_async(cfg, trace=trace))
        run_dir = tmp_path / "run"
        # Cancel once some requests are in flight (worker parts are on disk by then).
        for _ in range(200):
            await asyncio.sleep(0.05)
            if list(run_dir.glob("requests.parquet.parts/part-w*")) or task.done():
                break
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    run = read_run(run_dir)
    assert run.meta["status"] == schema.STATUS_PARTIAL
    assert not list(run_dir.glob("*.parts"))
    r = run.requests
    assert (r["error_kind"] == schema.ERROR_CANCELLED).any()
    assert run.meta["workers"]["count"] == 2
