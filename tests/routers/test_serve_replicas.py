"""`harness serve --replicas N --router X` over real HTTP on ephemeral ports (issue 16): one
endpoint, N engine cores, the router choosing per request; stats and metrics per replica."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys

import aiohttp
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from harness.cli.main import app
from harness.server import embedded

pytestmark = pytest.mark.timeout(60)

SPEED = 20.0  # model seconds per wall second: keeps each request to a few ms


async def _complete(s: aiohttp.ClientSession, url: str, **extra) -> dict:
    headers = extra.pop("headers", {})
    body = {"prompt": "one two three four", "max_tokens": 4, **extra}
    async with s.post(url + "/v1/completions", json=body, headers=headers) as r:
        assert r.status == 200, await r.text()
        return await r.json()


async def _stats(s: aiohttp.ClientSession, url: str) -> dict:
    async with s.get(url + "/harness/stats") as r:
        assert r.status == 200
        return await r.json()


async def test_round_robin_spreads_requests_over_every_replica():
    async with (
        embedded(replicas=4, router="round-robin", speed=SPEED) as url,
        aiohttp.ClientSession() as s,
    ):
        for _ in range(8):
            out = await _complete(s, url)
            assert out["usage"]["completion_tokens"] == 4
        st = await _stats(s, url)
        assert [e["routed"] for e in st["engines"]] == [2, 2, 2, 2]
        assert st["router"]["name"] == "round-robin" and st["in_flight"] == 0
        async with s.get(url + "/metrics") as r:
            text = await r.text()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    routed = {s.labels["replica"]: s.value for s in fams["harness:engine_routed"].samples}
    assert routed == {"0": 2.0, "1": 2.0, "2": 2.0, "3": 2.0}
    assert "vllm:num_requests_running" in fams  # the cluster's totals under vLLM's names


async def test_session_affinity_keeps_each_session_on_one_replica():
    async with (
        embedded(replicas=4, router="session-affinity", speed=SPEED) as url,
        aiohttp.ClientSession() as s,
    ):
        for _turn in range(3):
            for sid in ("a", "b", "c"):
                await _complete(s, url, headers={"x-session-id": sid})
        st = await _stats(s, url)
    routed = sorted(e["routed"] for e in st["engines"])
    assert routed == [0, 3, 3, 3]  # round-robin would give [2, 2, 2, 3]


async def test_openai_user_field_names_the_session():
    async with (
        embedded(replicas=3, router="session-affinity", speed=SPEED) as url,
        aiohttp.ClientSession() as s,
    ):
        for _ in range(4):
            await _complete(s, url, user="alice")
        st = await _stats(s, url)
    assert sorted(e["routed"] for e in st["engines"]) == [0, 0, 4]


async def test_prefix_aware_sends_a_longer_prompt_to_the_replica_caching_its_prefix():
    words = " ".join(f"w{i}" for i in range(96))  # 6 full blocks of 16
    async with (
        embedded(replicas=3, router="prefix-aware", speed=SPEED) as url,
        aiohttp.ClientSession() as s,
    ):
        await _complete(s, url, prompt=words)
        first = [e["routed"] for e in (await _stats(s, url))["engines"]]
        await _complete(s, url, prompt=words + " and then some more")
        await _complete(s, url, prompt="an unrelated prompt")
        st = await _stats(s, url)
    home = first.index(1)
    routed = [e["routed"] for e in st["engines"]]
    assert routed[home] == 2 and sorted(routed) == [0, 1, 2]
    assert st["engines"][home]["prefix_cache_hits"] >= 80  # 5 of the 6 blocks (last recomputed)


async def test_request_ids_stay_unique_across_replicas():
    async with (
        embedded(replicas=2, router="round-robin", speed=1.0) as url,
        aiohttp.ClientSession() as s,
    ):
        body = {"prompt": "a b c", "max_tokens": 40}
        outs = await asyncio.gather(
            *[_complete(s, url, headers={"x-request-id": "same"}, **body) for _ in range(3)]
        )
    ids = {o["id"] for o in outs}
    assert len(ids) == 3 and "cmpl-same" in ids


async def test_a_request_too_big_for_a_replica_is_rejected_and_forgotten():
    async with (
        embedded(replicas=2, router="session-affinity", kv_tokens=256, speed=SPEED) as url,
        aiohttp.ClientSession() as s,
    ):
        body = {"prompt": "x", "max_tokens": 4, "harness": {"prompt_len": 10_000}}
        async with s.post(url + "/v1/completions", json=body) as r:
            assert r.status == 400
            assert "rejected" in (await r.json())["error"]["message"]
        await _complete(s, url)
        st = await _stats(s, url)
    assert st["in_flight"] == 0 and sum(e["routed"] for e in st["engines"]) == 1


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--replicas", "0"], "outside 1..256"),
        (["--replicas", "2", "--router", "nope"], "unknown router 'nope'"),
        (["--replicas", "2", "--router", "random", "--router-param", "sed=1"], "valid: seed"),
        (["--replicas", "2", "--router-param", "oops"], "expected NAME=VALUE"),
    ],
)
def test_bad_cluster_flags_are_one_line_and_exit_2(args, needle):
    res = CliRunner().invoke(app, ["serve", *args])
    assert res.exit_code == 2
    out = res.output.strip()
    assert needle in out and "Traceback" not in out


def test_serve_replicas_process_on_an_ephemeral_port():
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness.cli.main", "serve", "--port", "0", "--replicas", "3",
         "--router", "prefix-aware", "--router-param", "queue_weight=1"],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "3 replicas (prefix-aware)" in line
        url = re.search(r"(http://127\.0\.0\.1:\d+)", line).group(1)
        assert httpx.get(url + "/health", timeout=10).status_code == 200
        r = httpx.post(url + "/v1/completions", json={"prompt": "a b", "max_tokens": 2}, timeout=10)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
        st = httpx.get(url + "/harness/stats", timeout=10).json()
        assert len(st["engines"]) == 3
        assert st["router"] == {
            "name": "prefix-aware",
            "params": {"prefix_weight": 3.0, "queue_weight": 1.0, "kv_weight": 0.0},
        }
    finally:
        proc.terminate()
        proc.wait(timeout=10)
