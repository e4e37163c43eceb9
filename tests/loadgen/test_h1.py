"""The lean HTTP/1.1 path (``harness.loadgen.h1``) against a raw socket server that writes
exactly the bytes a test chooses: every framing (Content-Length, chunked, read-until-close)
gives the same result, connections are reused, a redirect goes to aiohttp, and each failure is
classified as the aiohttp path classifies it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable

import pytest

from harness.loadgen import client, h1
from harness.loadgen.client import RequestResult, make_session, stream_request
from harness.results import schema

pytestmark = [pytest.mark.timeout(60), pytest.mark.skipif(not h1.AVAILABLE, reason="httptools")]


def _sse(n: int) -> bytes:
    out = b""
    for k in range(1, n + 1):
        c = {"choices": [{"index": 0, "text": "x", "finish_reason": "length" if k == n else None}],
             "usage": {"prompt_tokens": 3, "completion_tokens": k}}  # fmt: skip
        out += b"data: " + json.dumps(c, separators=(",", ":")).encode() + b"\n\n"
    return out + b"data: [DONE]\n\n"


_OK = b"HTTP/1.1 200 OK\r\n"


def _chunked(body: bytes, piece: int = 70) -> bytes:
    out = b""
    for i in range(0, len(body), piece):
        p = body[i : i + piece]
        out += f"{len(p):x}\r\n".encode() + p + b"\r\n"
    return out + b"0\r\n\r\n"


Reply = Callable[[bytes], bytes | None]  # request bytes -> reply bytes (None: close at once)


class RawServer:
    """Answers each request on a connection with ``reply(request)``; counts connections."""

    def __init__(self, reply: Reply, close_after: bool = False) -> None:
        self.reply = reply
        self.close_after = close_after
        self.connections = 0
        self.requests: list[bytes] = []
        self.url = ""

    async def handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await r.readuntil(b"\r\n\r\n")
                n = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                req = head + await r.readexactly(n)
                self.requests.append(req)
                out = self.reply(req)
                if out is None:
                    break
                w.write(out)
                await w.drain()
                if self.close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            w.close()


@pytest.fixture
async def raw() -> AsyncIterator[Callable[..., RawServer]]:
    servers: list[asyncio.Server] = []

    async def start(reply: Reply, close_after: bool = False) -> RawServer:
        srv = RawServer(reply, close_after)
        s = await asyncio.start_server(srv.handle, "127.0.0.1", 0)
        servers.append(s)
        srv.url = f"http://127.0.0.1:{s.sockets[0].getsockname()[1]}"
        return srv

    yield start  # type: ignore[misc]
    for s in servers:
        s.close()


async def _post(url: str, n: int = 4, timeout_s: float = 10.0) -> RequestResult:
    res = RequestResult(req=0, request_id="r", tier=None, prompt_len=3, output_len=n)
    async with make_session(timeout_s=timeout_s) as s:
        assert s.pool is not None
        return await stream_request(s, url + "/v1/completions", b"{}", {"x-request-id": "r"}, res)


@pytest.mark.parametrize("framing", ["length", "chunked", "close"])
async def test_every_framing_gives_the_same_result(raw, framing: str) -> None:
    body = _sse(4)
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
    if framing == "length":
        out = head + f"Content-Length: {len(body)}\r\n\r\n".encode() + body
    elif framing == "chunked":
        out = head + b"Transfer-Encoding: chunked\r\n\r\n" + _chunked(body)
    else:
        out = head + b"Connection: close\r\n\r\n" + body
    srv = await raw(lambda req: out, close_after=framing == "close")
    res = await _post(srv.url)
    assert res.success, res.error
    assert res.chunk_tokens == [1, 1, 1, 1] and res.output_tokens == 4 and res.prompt_tokens == 3
    assert res.http_status == 200


async def test_one_connection_carries_many_requests(raw) -> None:
    body = _sse(3)
    out = b"HTTP/1.1 200 OK\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    srv = await raw(lambda req: out)
    async with make_session(timeout_s=10) as s:
        for i in range(5):
            res = RequestResult(req=i, request_id=f"r{i}", tier=None, prompt_len=3, output_len=3)
            await stream_request(s, srv.url + "/v1/completions", b'{"a":1}',
                                 {"x-request-id": f"r{i}"}, res)  # fmt: skip
            assert res.success, res.error
    assert srv.connections == 1 and len(srv.requests) == 5
    first = srv.requests[0]
    assert first.startswith(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:")
    assert b"\r\nx-request-id: r0\r\n" in first and first.endswith(b'\r\n\r\n{"a":1}')


@pytest.mark.parametrize(
    ("reply", "kind"),
    [
        (b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 4\r\n\r\nboom", schema.ERROR_HTTP),
        (b"HTTP/1.1 400 Bad Request\r\nContent-Length: 26\r\n\r\nrequest rejected: too long",
         schema.ERROR_REJECTED),
        (None, schema.ERROR_CONNECT),  # closed without a reply
        (_OK + b"Content-Length: 9999\r\n\r\n" + _sse(2)[:60], schema.ERROR_STREAM_CUT),
        (_OK + b"Content-Length: 18\r\n\r\ndata: {not json}\n\n", schema.ERROR_BAD_PAYLOAD),
        (_OK + b"Content-Length: 14\r\n\r\ndata: [DONE]\n\n", schema.ERROR_NO_CHOICES),
        (b"NOT HTTP AT ALL\r\n\r\n", schema.ERROR_CONNECT),
    ],
)  # fmt: skip
async def test_failures_are_classified_as_before(raw, reply: bytes | None, kind: str) -> None:
    srv = await raw(lambda req: reply, close_after=True)
    res = await _post(srv.url)
    assert res.error_kind == kind, res.error
    if kind == schema.ERROR_HTTP:
        assert res.http_status == 500 and res.error == "HTTP 500: boom"


async def test_read_timeout_and_refused_connection() -> None:
    async def hang(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await r.readuntil(b"\r\n\r\n")
        w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n")
        await asyncio.sleep(5)
        w.close()

    s = await asyncio.start_server(hang, "127.0.0.1", 0)
    port = s.sockets[0].getsockname()[1]
    res = await _post(f"http://127.0.0.1:{port}", timeout_s=0.3)
    assert res.error_kind == schema.ERROR_TIMEOUT, res.error
    s.close()
    await s.wait_closed()
    res = await _post(f"http://127.0.0.1:{port}")
    assert res.error_kind == schema.ERROR_CONNECT, res.error


async def test_a_redirect_is_followed_through_aiohttp(raw) -> None:
    body = _sse(2)
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body

    def reply(req: bytes) -> bytes:
        if req.startswith(b"POST /v1/completions "):
            return b"HTTP/1.1 307 Temporary Redirect\r\nLocation: /v2\r\nContent-Length: 0\r\n\r\n"
        return ok

    srv = await raw(reply)
    res = await _post(srv.url, n=2)
    assert res.success and res.output_tokens == 2, res.error
    assert [r.split(b" ")[1] for r in srv.requests] == [b"/v1/completions"] * 2 + [b"/v2"]


def test_what_the_lean_path_leaves_to_aiohttp(monkeypatch: pytest.MonkeyPatch) -> None:
    async def check() -> None:
        async with make_session() as s:
            ok = s.lean_message("http://h:8000/v1/completions", b"{}", {"a": "b"})
            assert ok is not None and ok[0] == ("h", 8000)
            assert ok[1] == b"POST /v1/completions HTTP/1.1\r\nHost: h:8000\r\na: b\r\n" \
                b"Content-Length: 2\r\n\r\n{}"  # fmt: skip
            for url in ("https://h/v1", "http://u:p@h/v1", "http://h/v\u00e9"):
                assert s.lean_message(url, b"{}", {}) is None, url
            assert s.lean_message("http://h/v1", b"{}", {"a": "b\r\nx: y"}) is None
            assert s.lean_message("http://h/v1", b"{}", {"Host": "other"}) is None
        monkeypatch.setenv("HARNESS_HTTP_CLIENT", "aiohttp")
        async with make_session() as s:
            assert s.pool is None
        monkeypatch.delenv("HARNESS_HTTP_CLIENT")
        monkeypatch.setattr(h1, "AVAILABLE", False)  # httptools not installed
        async with make_session() as s:
            assert s.pool is None and isinstance(s, client.HttpSession)

    asyncio.run(check())
