"""The built-in server's prefix cache over real HTTP: the same core, token ids from the prompt's
words, vLLM's counters on /metrics (issue 16)."""

from __future__ import annotations

import pytest
from server_testlib import TEST_POLICY

from harness.loadgen.prefix_poller import prefix_counters
from harness.server import embedded

pytestmark = pytest.mark.timeout(60)


async def _complete(session, url: str, prompt: str, rid: str) -> None:
    body = {"prompt": prompt, "max_tokens": 3, "stream": True}
    async with session.post(url + "/v1/completions", json=body, headers={"x-request-id": rid}) as r:
        assert r.status == 200
        await r.read()


async def test_repeated_prefix_hits_and_vllm_counters(session):
    system = " ".join(f"sys{i}" for i in range(40))  # 40 words = 2 full blocks of 16 + 8
    async with embedded(policy=TEST_POLICY, speed=4.0) as url:
        await _complete(session, url, system + " first question", "a")
        await _complete(session, url, system + " another one here", "b")
        await _complete(session, url, "unrelated words only", "c")
        async with session.get(url + "/metrics") as r:
            text = await r.text()
    got = prefix_counters(text)  # what replay's MetricsPoller reads from vLLM
    assert got == (42 + 43 + 3, 32)


async def test_prefix_caching_off_by_engine_param(session):
    system = " ".join(f"w{i}" for i in range(40))
    async with embedded(policy=TEST_POLICY, speed=4.0, engine={"prefix_caching": False}) as url:
        for rid in "ab":
            await _complete(session, url, system, rid)
        async with session.get(url + "/metrics") as r:
            text = await r.text()
    assert prefix_counters(text) == (0, 0)


async def test_replicas_sum_their_counters(session):
    system = " ".join(f"s{i}" for i in range(40))
    async with embedded(policy=TEST_POLICY, speed=4.0, replicas=2) as url:
        for rid in "abcd":
            await _complete(session, url, system + f" {rid}", rid)
        async with session.get(url + "/metrics") as r:
            text = await r.text()
    queries, hits = prefix_counters(text)
    assert queries == 4 * 41
    assert hits >= 2 * 32  # each replica's second request at least hits its first's blocks
