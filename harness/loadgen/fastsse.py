"""A deliberately fast OpenAI-style SSE server, for benchmarking the *client* (``bench-client``).

Raw asyncio protocol, HTTP/1.1 keep-alive, no framework: every ``POST`` gets a streamed
completion of ``max_tokens`` tokens (vLLM chunk shape, continuous usage stats, final usage
chunk, ``[DONE]``) with ``Content-Length`` framing. With ``itl_ms == 0`` the whole response
is written in ONE ``transport.write`` (prebuilt per length), so the server costs almost
nothing and the client is the bottleneck (issue 2, "Must show"). With ``itl_ms > 0`` the
headers go out at once and chunks ``itl_ms`` apart after them (the first one ``itl_ms``
after the headers, a stand-in for the prefill), and each write is logged (just before it) with
:func:`harness.clock.now` (the system-wide ``CLOCK_MONOTONIC`` behind ``perf_counter`` on
Linux, so comparable with the client's stamps in another process) for the timestamp-accuracy
check. With a log, ``itl_ms == 0`` logs its one write too (chunk 0), and every entry also
carries the wall clock (``u``, ``time.time()``) for clients that report wall-clock times.

Run: ``python -m harness.loadgen.fastsse [--port 0] [--itl-ms 0] [--log FILE]``; prints
``PORT <n>`` once listening, writes the log (JSON lines: request id, chunk index, time) on
SIGTERM/SIGINT. Binds 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import signal
import time
from collections.abc import Callable

from harness import clock

_MAX_TOKENS = re.compile(rb'"max(?:_completion)?_tokens"\s*:\s*(\d+)')
_RID = re.compile(rb"\r\nx-request-id:\s*([^\r\n]*)", re.IGNORECASE)
_CLEN = re.compile(rb"\r\ncontent-length:\s*(\d+)", re.IGNORECASE)
PROMPT_TOKENS = 32


def chunk_bytes(k: int, n: int) -> bytes:
    """The k-th (1-based) of n chunks, vLLM's completions shape with continuous usage."""
    obj = {
        "id": "cmpl-bench",
        "object": "text_completion",
        "created": 0,
        "model": "bench",
        "choices": [
            {
                "index": 0,
                "text": " tok",
                "logprobs": None,
                "finish_reason": "length" if k == n else None,
                "stop_reason": None,
            }
        ],
        "usage": {
            "prompt_tokens": PROMPT_TOKENS,
            "total_tokens": PROMPT_TOKENS + k,
            "completion_tokens": k,
        },
    }
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def tail_bytes(n: int) -> bytes:
    usage = {"prompt_tokens": PROMPT_TOKENS, "total_tokens": PROMPT_TOKENS + n,
             "completion_tokens": n}  # fmt: skip
    obj = {"id": "cmpl-bench", "object": "text_completion", "created": 0, "model": "bench",
           "choices": [], "usage": usage}  # fmt: skip
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\ndata: [DONE]\n\n"


def _head(length: int) -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: keep-alive\r\n"
        b"Content-Length: " + str(length).encode() + b"\r\n\r\n"
    )


MODELS = json.dumps({"object": "list", "data": [{"id": "bench", "object": "model"}]}).encode()


class _State:
    def __init__(self, itl_ms: float, logging: bool = False) -> None:
        self.itl_s = itl_ms / 1000.0
        self.logging = logging
        self.cache: dict[int, bytes] = {}
        self.log: list[tuple[str, int, float, float]] = []

    def whole(self, n: int) -> bytes:
        b = self.cache.get(n)
        if b is None:
            body = b"".join(chunk_bytes(k, n) for k in range(1, n + 1)) + tail_bytes(n)
            b = self.cache[n] = _head(len(body)) + body
        return b


class _Proto(asyncio.Protocol):
    def __init__(self, st: _State) -> None:
        self.st = st
        self.buf = b""
        self.tr: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.tr = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end]
            m = _CLEN.search(head)
            clen = int(m.group(1)) if m else 0
            if len(self.buf) < end + 4 + clen:
                return
            body = self.buf[end + 4 : end + 4 + clen]
            self.buf = self.buf[end + 4 + clen :]
            self._respond(head, body)

    def _respond(self, head: bytes, body: bytes) -> None:
        assert self.tr is not None
        if head.startswith(b"GET"):
            self.tr.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                + str(len(MODELS)).encode()
                + b"\r\n\r\n"
                + MODELS
            )
            return
        m = _MAX_TOKENS.search(body)
        n = max(1, int(m.group(1))) if m else 16
        r = _RID.search(head) if self.st.logging or self.st.itl_s > 0 else None
        rid = r.group(1).decode() if r else ""
        if self.st.itl_s <= 0:
            if self.st.logging:  # the one write of the whole response, stamped just before it
                self.st.log.append((rid, 0, clock.now(), time.time()))
            self.tr.write(self.st.whole(n))
            return
        parts = [chunk_bytes(k, n) for k in range(1, n + 1)]
        tail = tail_bytes(n)
        total = sum(map(len, parts)) + len(tail)
        self.tr.write(_head(total))
        loop = asyncio.get_running_loop()
        start = loop.time()
        tr, log, itl = self.tr, self.st.log, self.st.itl_s

        def write(k: int) -> Callable[[], None]:
            def go() -> None:
                if tr.is_closing():
                    return
                # Stamped just before the write: the write syscall sends at once, and a stamp
                # after it could land after the client's receipt if this process is preempted.
                log.append((rid, k, clock.now(), time.time()))
                tr.write(parts[k])
                if k == n - 1:
                    tr.write(tail)

            return go

        # Chunk k goes out (k + 1) ITLs after the headers: like a real server, which sends
        # its headers when it accepts the request and the first token after the prefill, so
        # the first chunk arrives in a read of its own (the TTFT-excess check measures that
        # read, not the one that carried the headers).
        for k in range(n):
            loop.call_at(start + (k + 1) * itl, write(k))


async def serve(port: int, itl_ms: float, log_path: str | None) -> None:
    st = _State(itl_ms, logging=bool(log_path))
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Proto(st), "127.0.0.1", port, backlog=4096)
    print(f"PORT {server.sockets[0].getsockname()[1]}", flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    server.close()
    if log_path:
        with open(log_path, "w", encoding="utf-8") as f:
            for rid, k, t, u in st.log:
                f.write(json.dumps({"rid": rid, "k": k, "t": t, "u": u}) + "\n")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--itl-ms", type=float, default=0.0)
    ap.add_argument("--log", default=None)
    a = ap.parse_args(argv)
    asyncio.run(serve(a.port, a.itl_ms, a.log))


if __name__ == "__main__":
    main()
