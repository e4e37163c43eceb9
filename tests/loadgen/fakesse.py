"""A real OpenAI-compatible SSE server for the load-generator tests (aiohttp, 127.0.0.1,
ephemeral port). It records every request body and header, and logs the clock reading right
after each chunk was written, so tests compare the client's stamps with the server's.

Behaviour per request is chosen by the prompt text (``mode=<name>``; chat: the first message):

- ``ok`` (default): ``max_tokens`` tokens, ``tokens_per_chunk`` per chunk, ``itl_s`` apart;
  usage per chunk when ``stream_options.continuous_usage_stats`` is set, a final usage chunk
  when ``include_usage`` is set, then ``[DONE]``. Chat streams start with a role-only chunk.
- ``http500``: HTTP 500. ``reject``: HTTP 400 "request rejected: ..." (built-in engine).
- ``cut``: two chunks, then the connection is dropped.
- ``badjson``: one chunk, then a line that is not JSON. ``nochoices``: only ``[DONE]``.
- ``usage+N``: like ok but the final usage claims N more completion tokens than streamed.
- ``nousage``: like ok but never sends usage (even when asked).
- ``hang``: sends headers, then nothing for 30 s. ``slowstart``: waits 0.2 s before writing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
from aiohttp import web

from harness import clock
from harness.workload.tiers import Tier, default_tiers
from harness.workload.trace import Trace


@dataclass
class FakeServer:
    tokens_per_chunk: int = 1
    itl_s: float = 0.0
    bodies: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    writes: dict[str, list[float]] = field(default_factory=dict)  # request id -> write times
    in_flight: int = 0
    max_in_flight: int = 0
    url: str = ""
    stop: asyncio.Event = field(default_factory=asyncio.Event)  # set at teardown: hangs end

    def _mode(self, body: dict[str, Any]) -> str:
        prompt = body.get("prompt")
        if prompt is None:
            prompt = body["messages"][0]["content"]
        if isinstance(prompt, str) and prompt.startswith("mode="):
            return prompt.split()[0][5:]
        return "ok"

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        rid = request.headers.get("x-request-id", "")
        self.bodies.append(body)
        self.headers.append({k.lower(): v for k, v in request.headers.items()})
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return await self._stream(request, body, rid)
        finally:
            self.in_flight -= 1

    async def _stream(
        self, request: web.Request, body: dict[str, Any], rid: str
    ) -> web.StreamResponse:
        mode = self._mode(body)
        chat = "messages" in body
        if mode == "http500":
            return web.Response(status=500, text="boom")
        if mode == "reject":
            err = {"message": "request rejected: needs 9999 KV tokens", "type": "BadRequest"}
            return web.json_response({"error": err}, status=400)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if mode == "hang":
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), 30)
            return resp
        if mode == "slowstart":
            await asyncio.sleep(0.2)
        if mode == "nochoices":
            await resp.write(b"data: [DONE]\n\n")
            return resp
        n = int(body.get("max_completion_tokens") if chat else body.get("max_tokens"))
        so = body.get("stream_options") or {}
        cont = bool(so.get("continuous_usage_stats")) and mode != "nousage"
        final_usage = bool(so.get("include_usage")) and mode != "nousage"
        log = self.writes.setdefault(rid, [])
        prompt_tokens = 7

        def msg(obj: dict[str, Any]) -> bytes:
            return b"data: " + json.dumps(obj).encode() + b"\n\n"

        def choice(text: str, finish: str | None) -> dict[str, Any]:
            if chat:
                return {"index": 0, "delta": {"content": text}, "finish_reason": finish}
            return {"index": 0, "text": text, "finish_reason": finish}

        sent = 0
        if chat:
            obj: dict[str, Any] = {
                "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]
            }
            if cont:
                obj["usage"] = {"prompt_tokens": prompt_tokens, "completion_tokens": 0}
            await resp.write(msg(obj))
            log.append(clock.now())
        k = 0
        while sent < n:
            take = min(self.tokens_per_chunk, n - sent)
            sent += take
            finish = "length" if sent >= n else None
            obj = {"choices": [choice("tok" * take, finish)]}
            if cont:
                obj["usage"] = {"prompt_tokens": prompt_tokens, "completion_tokens": sent}
            await resp.write(msg(obj))
            log.append(clock.now())
            k += 1
            if mode == "cut" and k == 2:
                request.transport.close()
                return resp
            if mode == "badjson" and k == 1:
                await resp.write(b"data: {not json\n\n")
                return resp
            if self.itl_s and sent < n:
                await asyncio.sleep(self.itl_s)
        if final_usage:
            extra = int(mode[6:]) if mode.startswith("usage+") else 0
            await resp.write(
                msg(
                    {
                        "choices": [],
                        "usage": {
                            "prompt_tokens": prompt_tokens,
                            "completion_tokens": sent + extra,
                        },
                    }
                )
            )
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "fake-model"}]})

    async def metrics(self, request: web.Request) -> web.Response:
        text = (
            "# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{model_name="fake-model"}} {self.in_flight}\n'
            "# TYPE vllm:num_requests_waiting gauge\n"
            'vllm:num_requests_waiting{model_name="fake-model"} 0\n'
            "# TYPE vllm:kv_cache_usage_perc gauge\n"
            'vllm:kv_cache_usage_perc{model_name="fake-model"} 0.25\n'
        )
        return web.Response(text=text, content_type="text/plain")


def make_trace(
    n: int,
    *,
    gap_s: float = 0.0,
    output_len: int | list[int] = 5,
    prompts: list[str | None] | None = None,
    tiers: list[Tier] | None = None,
    tier_names: list[str] | None = None,
) -> Trace:
    """A small trace built with Trace.from_frame (no workload sources needed)."""
    tiers = tiers or default_tiers()
    outs = output_len if isinstance(output_len, list) else [output_len] * n
    df = pd.DataFrame(
        {
            "request_id": [f"r{i}" for i in range(n)],
            "arrival_s": [i * gap_s for i in range(n)],
            "prompt": prompts if prompts is not None else [None] * n,
            "prompt_len": [10 + i for i in range(n)],
            "output_len": outs,
            "tier": tier_names or [tiers[i % len(tiers)].name for i in range(n)],
        }
    )
    return Trace.from_frame(df, tiers, meta={"source": "test"})


async def start_app(app: web.Application) -> tuple[web.AppRunner, str]:
    """Serve ``app`` on 127.0.0.1 at an ephemeral port: (runner to clean up, base URL)."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"
