"""Injected faults over real HTTP: each kind's behaviour with a raw client, then a full replay
(engineer L's load generator) whose failed requests match the server's fault log exactly."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import numpy as np
import pandas as pd
import pytest
from server_testlib import TEST_POLICY

from harness import clock
from harness.server import embedded
from harness.server.faults import read_fault_log

pytestmark = pytest.mark.timeout(60)

BODY = {
    "prompt": "a b c d",
    "max_tokens": 8,
    "stream": True,
    "stream_options": {"include_usage": True},
}


async def _raw_events(resp: aiohttp.ClientResponse) -> tuple[list[tuple[float, str]], str | None]:
    """(events, error class name if the stream broke)."""
    out: list[tuple[float, str]] = []
    buf = b""
    try:
        async for data in resp.content.iter_any():
            buf += data
            while b"\n\n" in buf:
                ev, buf = buf.split(b"\n\n", 1)
                out.append((clock.now(), ev.decode().removeprefix("data: ")))
    except aiohttp.ClientPayloadError as e:
        return out, type(e).__name__
    return out, None


async def _faults(session: aiohttp.ClientSession, url: str) -> list[dict]:
    async with session.get(url + "/harness/faults") as r:
        return await r.json()


async def test_error_fault_is_http_500_and_logged(session):
    async with embedded(policy=TEST_POLICY, faults="error=1.0") as url:
        async with session.post(
            url + "/v1/completions", json=BODY, headers={"x-request-id": "e1"}
        ) as r:
            assert r.status == 500
            assert "injected" in (await r.json())["error"]["message"]
        log = await _faults(session, url)
    assert [(e["request_id"], e["kind"]) for e in log] == [("e1", "error")]


async def test_drop_cuts_the_stream_before_the_final_chunk(session, tmp_path):
    path = tmp_path / "faults.jsonl"
    async with embedded(policy=TEST_POLICY, faults="drop=1.0", fault_log=path) as url:
        r = await session.post(url + "/v1/completions", json=BODY, headers={"x-request-id": "d1"})
        assert r.status == 200
        events, err = await _raw_events(r)
        r.close()
    assert err == "ClientPayloadError"
    log = read_fault_log(path)
    assert [(e["request_id"], e["kind"]) for e in log] == [("d1", "drop")]
    chunks = [json.loads(p) for _, p in events]
    assert len(chunks) == log[0]["at_token"] and 1 <= len(chunks) <= 7
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks)


async def test_malformed_inserts_one_bad_event_and_the_stream_goes_on(session):
    async with embedded(policy=TEST_POLICY, faults="malformed=1.0") as url:
        async with session.post(
            url + "/v1/completions", json=BODY, headers={"x-request-id": "m1"}
        ) as r:
            events, err = await _raw_events(r)
        log = await _faults(session, url)
    assert err is None and events[-1][1] == "[DONE]"
    bad = []
    for i, (_, p) in enumerate(events[:-1]):
        try:
            json.loads(p)
        except json.JSONDecodeError:
            bad.append(i)
    assert bad == [log[0]["at_token"]]
    assert len(events) == 8 + 1 + 1 + 1  # tokens, the bad one, usage, [DONE]


async def test_stall_pauses_mid_stream(session):
    async with embedded(policy=TEST_POLICY, faults="stall=1.0:300ms", speed=2.0) as url:
        async with session.post(
            url + "/v1/completions", json=BODY, headers={"x-request-id": "s1"}
        ) as r:
            events, err = await _raw_events(r)
        log = await _faults(session, url)
    assert err is None
    at = log[0]["at_token"]
    times = [t for t, _ in events]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    # The 300 ms pause sits right before token #at: the longest gap by far. (A late read of
    # token #at-1 on a loaded machine shortens the gap the client sees, hence 0.25 s.)
    assert gaps[at - 1] >= 0.25 and int(np.argmax(gaps)) == at - 1
    assert max(g for i, g in enumerate(gaps) if i != at - 1) < 0.25
    toks = [json.loads(p) for _, p in events[:-1] if json.loads(p)["choices"]]
    assert sum(len(c["choices"][0]["text"].split()) for c in toks) == 8


async def test_slow_first_delays_the_response_headers(session):
    async with embedded(policy=TEST_POLICY, faults="slow_first=1.0:250ms") as url:
        t0 = clock.now()
        async with session.post(url + "/v1/completions", json=BODY) as r:
            t_headers = clock.now()
            events, err = await _raw_events(r)
    assert t_headers - t0 >= 0.25
    assert err is None and events[-1][1] == "[DONE]"


EXPECTED_KIND = {
    "error": "http_status",
    "drop": "stream_cut",
    "malformed": "bad_payload",
    "stall": "timeout",
    "slow_first": "timeout",
}


async def test_replay_failures_match_the_fault_log_exactly(tmp_path: Path):
    from harness.loadgen.replay import ReplayConfig, run_replay_async
    from harness.workload import build_trace

    trace = build_trace(
        "synthetic",
        num_requests=150,
        rate=60.0,
        seed=3,
        input_len=64,
        output_len=24,
        range_ratio=0.5,
    )
    log_path = tmp_path / "faults.jsonl"
    spec = "error=0.06,drop=0.06,stall=0.04:5s,malformed=0.06,slow_first=0.04:5s,seed=5"
    async with embedded(policy="vllm", speed=4.0, faults=spec, fault_log=log_path) as url:
        cfg = ReplayConfig(
            trace="synthetic",
            rate=60.0,
            target=url,
            engine="builtin",
            timeout_s=1.5,  # shorter than the 5 s stalls: they become timeouts; long enough
            # that a healthy request never times out on a loaded machine (same process)
            out=tmp_path / "run",
            sample_interval_s=None,
            progress=False,
            gpu=False,
        )
        run_dir = await run_replay_async(cfg, trace=trace)
    reqs = pd.read_parquet(run_dir / "requests.parquet")
    log = read_fault_log(log_path)
    assert len(reqs) == 150
    assert len({e["kind"] for e in log}) == 5  # every kind was exercised
    assert len({e["request_id"] for e in log}) == len(log)
    failed = reqs[~reqs["success"]].set_index("request_id")["error_kind"].to_dict()
    injected = {e["request_id"]: EXPECTED_KIND[e["kind"]] for e in log}
    assert failed == injected
    ok = reqs[reqs["success"]]
    assert (ok["output_tokens"] == ok["output_len"]).all()


@pytest.mark.parametrize("kind", ["drop", "malformed", "error"])
async def test_non_streaming_faults(session, kind):
    body = {"prompt": "a b", "max_tokens": 4}
    async with embedded(policy=TEST_POLICY, faults=f"{kind}=1.0") as url:
        try:
            async with session.post(url + "/v1/completions", json=body) as r:
                status, text = r.status, await r.text()
        except aiohttp.ClientError as e:
            status, text = None, type(e).__name__
        log = await _faults(session, url)
    assert [e["kind"] for e in log] == [kind]
    if kind == "drop":
        assert status is None  # connection closed without a response
    elif kind == "malformed":
        assert status == 200
        with pytest.raises(json.JSONDecodeError):
            json.loads(text)
    else:
        assert status == 500
