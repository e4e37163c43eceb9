"""The client benchmark's pieces: the fast SSE server (separate process) and the measures."""

from __future__ import annotations

from harness.loadgen import bench


def test_fast_server_roundtrip_counts_every_token() -> None:
    with bench.fast_server() as url:
        row = bench.measure_rate(url, rate=50.0, duration_s=0.6, output_len=100)
    assert row["requests"] == 30 and row["completed"] == 30 and row["failed"] == 0
    assert row["tokens_recorded"] == 30 * 100
    assert abs(row["chunks_per_s"] * row["duration_s"] - 30 * 100) < 1e-6
    assert row["lag_p50_ms"] >= 0 and row["ttft_p99_ms"] > 0


def test_timestamp_accuracy_pairs_every_chunk_with_its_write() -> None:
    acc = bench.timestamp_accuracy(rate=40.0, duration_s=0.5, output_len=5, itl_ms=5.0)
    assert acc["chunks"] == 20 * 5
    # Same monotonic clock in both processes: a chunk is never seen before it was written.
    assert acc["negative"] == 0
    assert 0 <= acc["delay_p50_ms"] < 50  # loose: the 1 ms p99 figure is a benchmark result


def test_whole_response_writes_are_logged_per_request(tmp_path) -> None:
    """With a log, the one-write mode (itl 0) logs each request's write, before the client's
    receipt, on both clocks (replay_vs_vllm's fast table measures each client against it)."""
    import json
    import time as _time

    import httpx

    from harness import clock

    log = tmp_path / "server.jsonl"
    seen: dict[str, tuple[float, float]] = {}
    with bench.fast_server(itl_ms=0.0, log=log) as url, httpx.Client() as c:
        for i in range(5):
            rid = f"r-{i}"
            body = {"model": "bench", "prompt": "x", "max_tokens": 3, "stream": True}
            r = c.post(url + "/v1/completions", json=body, headers={"x-request-id": rid})
            seen[rid] = (clock.now(), _time.time())
            assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n")
    rows = [json.loads(x) for x in log.read_text().splitlines()]
    assert sorted(d["rid"] for d in rows) == sorted(seen)
    for d in rows:
        assert d["k"] == 0
        assert d["t"] <= seen[d["rid"]][0] and d["u"] <= seen[d["rid"]][1] + 1e-3
