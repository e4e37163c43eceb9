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
