"""A real OpenAI-compatible completions server that echoes what it received (aiohttp,
127.0.0.1, ephemeral port), for the session tests.

Every request is logged with the prompt it carried and the server clock at receipt. The reply
is ``max_tokens`` words ``w<i>@<request id>``, one per SSE chunk, so a test can find a real
reply inside a later prompt. Per request id (``x-request-id``): ``first_delay`` holds the first
chunk back that long (patience tests) and ``fail_first`` answers HTTP 500 that many times
before succeeding (retry tests).
"""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from harness import clock

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "loadgen"))
from fakesse import start_app  # noqa: E402


@dataclass
class Received:
    request_id: str
    session_id: str | None
    prompt: str
    max_tokens: int
    t: float  # clock.now() at receipt


@dataclass
class EchoServer:
    itl_s: float = 0.0
    first_delay: dict[str, float] = field(default_factory=dict)
    fail_first: dict[str, int] = field(default_factory=dict)
    log: list[Received] = field(default_factory=list)
    context_limit: int | None = None  # HTTP 400 (vLLM's message) for longer prompt + output
    list_context: bool = True  # /v1/models lists max_model_len = context_limit
    url: str = ""

    def by_id(self) -> dict[str, Received]:
        return {r.request_id: r for r in self.log}

    @staticmethod
    def reply_text(rid: str, n: int) -> str:
        return "".join(f"w{i}@{rid} " for i in range(n))

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        rid = request.headers.get("x-request-id", "")
        chat = "messages" in body
        n = int(body.get("max_completion_tokens" if chat else "max_tokens", 1))
        prompt = json.dumps(body["messages"]) if chat else body["prompt"]
        self.log.append(Received(rid, request.headers.get("x-session-id"), prompt, n, clock.now()))
        if self.context_limit and len(prompt.split()) + n > self.context_limit:
            msg = f"This model's maximum context length is {self.context_limit} tokens."
            return web.json_response({"error": {"message": msg}}, status=400)
        base = rid.split("#")[0]
        if self.fail_first.get(base, 0) > 0:
            self.fail_first[base] -= 1
            return web.Response(status=500, text="injected failure")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        delay = self.first_delay.get(rid, 0.0)
        if delay:
            await asyncio.sleep(delay)
        for i in range(n):
            if i and self.itl_s:
                await asyncio.sleep(self.itl_s)
            piece = f"w{i}@{rid} "
            c0: dict[str, Any] = {"index": 0, "finish_reason": None}
            c0.update({"delta": {"content": piece}} if chat else {"text": piece})
            chunk = {"choices": [c0]}
            if i == n - 1:
                chunk["choices"][0]["finish_reason"] = "length"
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        usage = {"prompt_tokens": len(prompt.split()), "completion_tokens": n}
        await resp.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def models(self, request: web.Request) -> web.Response:
        model: dict[str, Any] = {"id": "echo"}
        if self.context_limit and self.list_context:
            model["max_model_len"] = self.context_limit
        return web.json_response({"data": [model]})


async def start_echo(**kw: Any) -> tuple[EchoServer, web.AppRunner]:
    srv = EchoServer(**kw)
    app = web.Application()
    app.router.add_post("/v1/completions", srv.handle)
    app.router.add_post("/v1/chat/completions", srv.handle)
    app.router.add_get("/v1/models", srv.models)
    runner, srv.url = await start_app(app)
    return srv, runner
