"""The ``sglang`` dialect against a real local server that speaks SGLang's wire format.

The server below is written from sglang 0.5.23's sources (read from the wheel):

- ``POST /generate`` (``entrypoints/http_server.py`` ``stream_results``): one
  ``data: {"text", "output_ids", "meta_info"}`` message per output event, ``text`` cumulative,
  ``meta_info.completion_tokens`` cumulative, ``finish_reason`` null until the last message
  (then ``{"type": "length", "length": N}``), an ``{"error": {...}}`` message on failure, and
  always ``data: [DONE]``. ``sampling_params`` unknown keys are refused with HTTP 400
  (``sglang/api/v1/api_types.py``: "unknown keys rejected").
- ``POST /v1/completions`` and ``/v1/chat/completions`` (``entrypoints/openai/protocol.py``):
  ``custom_params`` and ``priority`` are request fields; usage per chunk with
  ``stream_options.continuous_usage_stats``.
- ``GET /metrics`` with SGLang's series names (``observability/metrics_collector.py``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from fakesse import make_trace, start_app
from pydantic import ValidationError
from typer.testing import CliRunner

from harness import clock
from harness.cli.main import app
from harness.loadgen.client import (
    RequestResult,
    encode_body,
    interpret_openai,
    interpret_sglang_generate,
    make_session,
    stream_request,
)
from harness.loadgen.dialects import Endpoint, generate_body, get_dialect
from harness.loadgen.replay import ReplayConfig, run_replay_async
from harness.results import schema
from harness.results.rundir import read_run
from harness.workload.tiers import parse_tiers

# sglang 0.5.23 sglang/api/v1/api_types.py SamplingParams (subset we may send).
SAMPLING_KEYS = {"max_new_tokens", "ignore_eos", "custom_params", "temperature", "top_p"}


@dataclass
class SGLangServer:
    tokens_per_chunk: int = 1
    itl_s: float = 0.0
    bodies: list[dict[str, Any]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    writes: dict[str, list[float]] = field(default_factory=dict)
    url: str = ""

    async def generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        self.paths.append(request.path)
        sp = body.get("sampling_params") or {}
        bad = set(sp) - SAMPLING_KEYS
        if bad or not isinstance(body.get("text"), str):
            return web.json_response({"error": f"unknown keys {sorted(bad)}"}, status=400)
        rid = request.headers.get("x-request-id", "")
        n = int(sp.get("max_new_tokens", 128))
        mode = body["text"].split()[0][5:] if body["text"].startswith("mode=") else "ok"
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        stamps = self.writes.setdefault(rid, [])
        done = 0
        while done < n:
            if mode == "error" and done >= 2:
                err = {"message": "KV cache pool is full", "type": "invalid_request_error"}
                await resp.write(b"data: " + json.dumps({"error": err}).encode() + b"\n\n")
                break
            if mode == "cut" and done >= 2:
                return resp  # no finish_reason, no [DONE]
            step = min(self.tokens_per_chunk, n - done)
            done += step
            meta = {
                "id": rid,
                "finish_reason": {"type": "length", "length": n} if done == n else None,
                "prompt_tokens": len(body["text"].split()),
                "completion_tokens": done,
                "cached_tokens": 0,
                "num_retractions": 0,
            }
            msg = {"text": " tok" * done, "output_ids": list(range(done)), "meta_info": meta}
            await resp.write(b"data: " + json.dumps(msg).encode() + b"\n\n")
            stamps.append(clock.now())
            if self.itl_s:
                await asyncio.sleep(self.itl_s)
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def openai(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        self.paths.append(request.path)
        chat = request.path.endswith("/chat/completions")
        n = int(body.get("max_completion_tokens" if chat else "max_tokens", 16))
        cont = bool((body.get("stream_options") or {}).get("continuous_usage_stats"))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(n):
            c: dict[str, Any] = {"index": 0, "finish_reason": "length" if i == n - 1 else None}
            if chat:
                c["delta"] = {"content": " tok"}
            else:
                c["text"] = " tok"
            msg: dict[str, Any] = {"id": "x", "object": "text_completion", "choices": [c]}
            if cont:
                msg["usage"] = {"prompt_tokens": 3, "completion_tokens": i + 1}
            await resp.write(b"data: " + json.dumps(msg).encode() + b"\n\n")
        usage = {"prompt_tokens": 3, "completion_tokens": n, "total_tokens": n + 3}
        await resp.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "sgl-model"}]})

    async def metrics(self, request: web.Request) -> web.Response:
        lab = '{model_name="sgl-model",engine_type="unified"}'
        text = (
            "# TYPE sglang:num_running_reqs gauge\n"
            f"sglang:num_running_reqs{lab} 3.0\n"
            "# TYPE sglang:num_queue_reqs gauge\n"
            f"sglang:num_queue_reqs{lab} 2.0\n"
            "# TYPE sglang:token_usage gauge\n"
            f"sglang:token_usage{lab} 0.4\n"
            "# TYPE sglang:num_retracted_requests_total counter\n"
            f"sglang:num_retracted_requests_total{lab} 5.0\n"
            "# TYPE sglang:time_to_first_token_seconds histogram\n"
            f'sglang:time_to_first_token_seconds_bucket{{le="0.1",model_name="sgl-model"}} 1.0\n'
            f'sglang:time_to_first_token_seconds_bucket{{le="+Inf",model_name="sgl-model"}} 2.0\n'
            'sglang:time_to_first_token_seconds_sum{model_name="sgl-model"} 0.3\n'
            'sglang:time_to_first_token_seconds_count{model_name="sgl-model"} 2.0\n'
        )
        return web.Response(text=text, content_type="text/plain")


@pytest.fixture
async def sgl_server() -> AsyncIterator[SGLangServer]:
    srv = SGLangServer()
    app_ = web.Application()
    app_.router.add_post("/generate", srv.generate)
    app_.router.add_post("/v1/completions", srv.openai)
    app_.router.add_post("/v1/chat/completions", srv.openai)
    app_.router.add_get("/v1/models", srv.models)
    app_.router.add_get("/metrics", srv.metrics)
    runner, srv.url = await start_app(app_)
    try:
        yield srv
    finally:
        await runner.cleanup()


TIERS = parse_tiers("paid:0.5:ttft=2s:tbt=100ms,free:0.5:tbt=500ms:priority=7")


def test_generate_body_matches_sglang_native_format() -> None:
    paid = TIERS[0]
    b = get_dialect("sglang").body(Endpoint.GENERATE, "m", "hello", 5, 7, paid)
    assert b == {
        "text": "hello",
        "sampling_params": {
            "max_new_tokens": 7,
            "ignore_eos": True,
            "custom_params": {"tier": "paid", "ttft_slo_ms": 2000.0, "tbt_slo_ms": 100.0},
        },
        "stream": True,
        "priority": 0,
    }
    # No tier: no custom_params/priority; --no-send-priority keeps the carrier only.
    assert "priority" not in generate_body("x", 3, None)
    assert "custom_params" not in generate_body("x", 3, None)["sampling_params"]
    b = get_dialect("sglang", send_priority=False).body(Endpoint.GENERATE, "m", "x", 1, 3, paid)
    assert "priority" not in b and b["sampling_params"]["custom_params"]["tier"] == "paid"
    # extra_body: sampling_params merge into the sampling parameters, the rest at top level.
    b = generate_body("x", 3, None, extra={"sampling_params": {"temperature": 0}, "rid": "a"})
    assert b["sampling_params"] == {"max_new_tokens": 3, "ignore_eos": True, "temperature": 0}
    assert b["rid"] == "a"
    assert get_dialect("sglang").path(Endpoint.GENERATE) == "/generate"
    assert get_dialect("sglang").interpreter(Endpoint.GENERATE) is interpret_sglang_generate
    assert get_dialect("sglang").interpreter(Endpoint.CHAT) is interpret_openai
    for other in ("vllm", "openai", "builtin"):
        with pytest.raises(ValueError, match="--engine sglang"):
            get_dialect(other).path(Endpoint.GENERATE)


async def _one(srv: SGLangServer, prompt: str, n: int) -> RequestResult:
    res = RequestResult(req=0, request_id="g0", tier=None, prompt_len=2, output_len=n)
    body = encode_body(generate_body(prompt, n, None))
    async with make_session(timeout_s=10) as s:
        return await stream_request(
            s, srv.url + "/generate", body, {"x-request-id": "g0"}, res, interpret_sglang_generate
        )


@pytest.mark.parametrize("per_chunk", [1, 3])
async def test_generate_stream_counts_tokens_from_completion_tokens(
    sgl_server: SGLangServer, per_chunk: int
) -> None:
    sgl_server.tokens_per_chunk = per_chunk
    sgl_server.itl_s = 0.01
    res = await _one(sgl_server, "hello there", 7)
    assert res.success, res.error
    expected = [per_chunk] * (7 // per_chunk) + ([7 % per_chunk] if 7 % per_chunk else [])
    assert res.chunk_tokens == expected  # deltas of the cumulative count, not text length
    assert res.output_tokens == 7 and res.prompt_tokens == 2
    # One stamp per message, each taken after the server wrote it.
    w = sgl_server.writes["g0"]
    assert len(res.chunk_t) == len(w)
    assert all(t >= s for t, s in zip(res.chunk_t, w, strict=True))


async def test_generate_error_message_and_cut_stream_are_classified(
    sgl_server: SGLangServer,
) -> None:
    res = await _one(sgl_server, "mode=error x", 6)
    assert not res.success and res.error_kind == schema.ERROR_BAD_PAYLOAD
    assert "KV cache pool is full" in (res.error or "")
    res = await _one(sgl_server, "mode=cut x", 6)
    assert not res.success and res.error_kind == schema.ERROR_STREAM_CUT


async def test_replay_generate_end_to_end_with_tiers_and_sglang_metrics(
    sgl_server: SGLangServer, tmp_path: Path
) -> None:
    sgl_server.tokens_per_chunk = 2
    sgl_server.itl_s = 0.01
    trace = make_trace(4, gap_s=0.02, output_len=5, tiers=TIERS, tier_names=["paid", "free"] * 2)
    cfg = ReplayConfig(
        trace="test",
        arrival="trace",
        target=sgl_server.url,
        engine="sglang",
        endpoint="generate",
        progress=False,
        out=tmp_path / "run",
        sample_interval_s=0.02,
        gpu=False,
    )
    run = read_run(await run_replay_async(cfg, trace=trace))
    assert set(sgl_server.paths) == {"/generate"}
    assert run.requests["success"].all()
    assert (run.requests["output_tokens"] == 5).all()
    per_req = run.chunks.groupby("req")["tokens"].apply(list)
    assert all(v == [2, 2, 1] for v in per_req)
    by_tier = {b["sampling_params"]["custom_params"]["tier"]: b for b in sgl_server.bodies}
    assert by_tier["paid"]["priority"] == 0 and by_tier["free"]["priority"] == 7
    assert by_tier["free"]["sampling_params"]["custom_params"] == {
        "tier": "free",
        "tbt_slo_ms": 500.0,
    }
    assert all("model" not in b for b in sgl_server.bodies)
    assert run.meta["endpoint"] == "generate" and run.meta["engine"] == "sglang"
    s = run.samples[run.samples["source"] == "prometheus"]
    assert len(s) >= 1
    assert (s["kv_usage"] == 0.4).all() and (s["num_running"] == 3).all()
    assert (s["num_waiting"] == 2).all() and (s["preemptions_total"] == 5).all()


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
async def test_replay_openai_endpoints_carry_custom_params(
    sgl_server: SGLangServer, tmp_path: Path, endpoint: str
) -> None:
    trace = make_trace(2, output_len=4, tiers=TIERS, tier_names=["paid", "free"])
    cfg = ReplayConfig(
        trace="test",
        arrival="trace",
        target=sgl_server.url,
        engine="sglang",
        endpoint=endpoint,
        progress=False,
        out=tmp_path / "run",
        sample_interval_s=None,
    )
    run = read_run(await run_replay_async(cfg, trace=trace))
    assert run.requests["success"].all() and (run.requests["output_tokens"] == 4).all()
    want = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
    assert set(sgl_server.paths) == {want}
    for b in sgl_server.bodies:
        assert b["custom_params"]["tier"] in ("paid", "free") and "priority" in b
        assert b["ignore_eos"] is True and b["stream_options"]["continuous_usage_stats"]


def test_generate_endpoint_needs_the_sglang_engine() -> None:
    with pytest.raises(ValidationError, match="--engine sglang"):
        ReplayConfig(trace="x", rate=1, target="http://127.0.0.1:1", endpoint="generate")
    ReplayConfig(trace="x", rate=1, target="http://h:1", endpoint="generate", engine="sglang")
    r = CliRunner().invoke(
        app,
        ["replay", "--trace", "synthetic", "--rate", "1", "--target", "http://127.0.0.1:9"]
        + ["--endpoint", "generate", "--engine", "vllm"],
    )
    assert r.exit_code == 2
    assert "--engine sglang" in r.output and "Traceback" not in r.output
