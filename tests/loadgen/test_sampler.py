"""Sampler against a real local aiohttp server serving Prometheus text (no mocks)."""

from __future__ import annotations

import asyncio
import socket

import pytest
from aiohttp import web
from fakesse import start_app

from harness import clock
from harness.loadgen.sampler import Sampler, metrics_url, parse_metrics
from harness.results.schema import SAMPLES

VLLM_TEXT = """\
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{engine="0",model_name="m"}} {kv}
vllm:kv_cache_usage_perc{{engine="1",model_name="m"}} {kv2}
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="m"}} {run}
vllm:num_requests_running{{engine="1",model_name="m"}} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",model_name="m"}} {wait}
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{{engine="0",model_name="m"}} {pre}
vllm:num_preemptions_total{{engine="1",model_name="m"}} 1.0
"""

SGLANG_TEXT = """\
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="m"} 0.25
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m"} 7
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m"} 11
# TYPE sglang:num_retracted_requests_total counter
sglang:num_retracted_requests_total{model_name="m"} 4
"""


def test_parse_vllm_sums_labels_and_averages_fraction() -> None:
    row = parse_metrics(VLLM_TEXT.format(kv=0.5, kv2=0.7, run=3, wait=9, pre=4), "vllm")
    assert row == {
        "kv_usage": pytest.approx(0.6),  # mean of 0.5 and 0.7 (fraction, not summed)
        "num_running": 5,  # 3 + 2
        "num_waiting": 9,
        "preemptions_total": 5,  # 4 + 1
    }


def test_parse_old_vllm_name_and_sglang_names() -> None:
    old = "# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc 0.125\n"
    assert parse_metrics(old, "vllm") == {"kv_usage": 0.125}
    row = parse_metrics(SGLANG_TEXT, "sglang")
    assert row == {"kv_usage": 0.25, "num_running": 7, "num_waiting": 11, "preemptions_total": 4}
    # unknown engine ("openai"): both name sets are tried
    assert parse_metrics(SGLANG_TEXT, "openai")["num_waiting"] == 11


def test_metrics_url() -> None:
    assert metrics_url("http://127.0.0.1:8000/v1/") == "http://127.0.0.1:8000/metrics"
    assert metrics_url("http://127.0.0.1:8000") == "http://127.0.0.1:8000/metrics"


async def _serve(handler) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_get("/metrics", handler)
    return await start_app(app)


async def test_sampler_scrapes_live_server_on_run_clock() -> None:
    hits = 0

    async def handler(request: web.Request) -> web.Response:
        nonlocal hits
        hits += 1
        body = VLLM_TEXT.format(kv=0.1 * min(hits, 9), kv2=0.0, run=hits, wait=2 * hits, pre=hits)
        return web.Response(text=body, content_type="text/plain")

    runner, url = await _serve(handler)
    rows: list[dict] = []
    enough = asyncio.Event()

    def sink(row: dict) -> None:
        rows.append(row)
        if sum(r["source"] == "prometheus" for r in rows) >= 5:
            enough.set()

    t0 = clock.now()
    try:
        async with Sampler(url, "vllm", sink, t0=t0, interval_s=0.02, gpu=False) as s:
            await asyncio.wait_for(enough.wait(), timeout=10)
        t_end = clock.now() - t0
    finally:
        await runner.cleanup()
    prom = [r for r in rows if r["source"] == "prometheus"]
    assert len(prom) >= 5
    ts = [r["t_s"] for r in prom]
    assert ts == sorted(ts) and ts[0] >= 0 and ts[-1] <= t_end
    # successive scrapes see the server's successive states (strictly increasing: one scrape
    # timing out on a loaded machine skips a state without breaking the order)
    seen = [r["num_running"] - 2 for r in prom]
    assert seen[0] >= 1 and all(b > a for a, b in zip(seen, seen[1:], strict=False))
    assert all(r["num_waiting"] == 2 * (r["num_running"] - 2) for r in prom)
    assert set(prom[0]) <= set(SAMPLES.names)
    meta = s.meta()
    assert meta["scrapes"] >= 5 and meta["gpu"] == {"status": "disabled"}
    assert "kv_usage" in meta["metrics_found"]


async def test_dead_endpoint_counts_errors_and_keeps_going() -> None:
    calls = 0

    async def flaky(request: web.Request) -> web.Response:
        nonlocal calls
        calls += 1
        if calls % 2:
            return web.Response(status=500, text="boom")
        return web.Response(text="this is {not prometheus", content_type="text/plain")

    runner, url = await _serve(flaky)
    rows: list[dict] = []
    try:
        s = Sampler(url, "vllm", rows.append, t0=clock.now(), interval_s=0.01, gpu=False)
        async with s:
            for _ in range(1000):
                if s.scrape_errors >= 4:
                    break
                await asyncio.sleep(0.01)
    finally:
        await runner.cleanup()
    assert s.scrape_errors >= 4 and rows == [] and s.last_error

    # a port nobody listens on: still no exception out of the sampler
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    s2 = Sampler(dead, "sglang", rows.append, t0=clock.now(), interval_s=0.01, gpu=False)
    async with s2:
        for _ in range(1000):
            if s2.scrape_errors >= 2:
                break
            await asyncio.sleep(0.01)
    assert s2.scrape_errors >= 2 and "Connect" in (s2.last_error or "")


async def test_gpu_absent_is_a_note_not_an_error() -> None:
    rows: list[dict] = []
    s = Sampler(None, "vllm", rows.append, t0=clock.now(), interval_s=0.01, gpu=True)
    async with s:
        await s.sample_once()
    gpu = s.meta()["gpu"]
    if gpu["status"] == "ok":  # a GPU box: one row per device, SAMPLES columns only
        assert rows and all(r["source"] == "gpu" and r["gpu_mem_total_mib"] > 0 for r in rows)
        assert set(rows[0]) <= set(SAMPLES.names)
    else:
        assert gpu["status"] == "unavailable" and gpu["reason"] and rows == []


def test_bad_interval() -> None:
    with pytest.raises(ValueError):
        Sampler(None, "vllm", print, t0=0.0, interval_s=0)


def test_fast_scan_matches_the_full_parser() -> None:
    """The sampler's str.find scan gives the Prometheus parser's row, on vLLM-sized text."""
    from harness.loadgen.sampler import scan_metrics

    noise = "".join(
        f'# HELP vllm:h{i} x\n# TYPE vllm:h{i} histogram\nvllm:h{i}_bucket{{le="{i}"}} {i}\n'
        for i in range(800)
    )  # ~56 KB of metrics the sampler does not need, as in vLLM's real /metrics
    for text, engine in [
        (VLLM_TEXT.format(kv=0.5, kv2=0.7, run=3, wait=9, pre=4), "vllm"),
        (noise + VLLM_TEXT.format(kv=0.25, kv2=0.5, run=1, wait=0, pre=0) + noise, "vllm"),
        (SGLANG_TEXT, "sglang"),
        (SGLANG_TEXT, "openai"),
        ("vllm:num_requests_running 4 1700000000\n", "vllm"),  # sample with a timestamp
    ]:
        assert scan_metrics(text, engine) == parse_metrics(text, engine)
    assert scan_metrics("this is {not prometheus", "vllm") is None
