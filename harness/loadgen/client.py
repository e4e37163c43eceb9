"""Streaming OpenAI-compatible client: one request in, one :class:`RequestResult` out.

Timing follows ``vllm bench serve`` (anchors-harness.md §6.1) with one refinement:

- every SSE message is stamped with :func:`harness.clock.now` taken when the event loop
  delivered the network read that completed it (inside the connection's ``data_received``,
  before any parsing: :func:`_consume_at_receipt`), so the stamp is the receipt time;
  messages delivered by the same read share a stamp (anchors-harness.md §7, "Timestamps");
- a *chunk* is an SSE message whose JSON has a non-empty ``choices`` list, even with empty
  text (vLLM's TTFT/ITL rule); the usage-only message and ``[DONE]`` are not chunks.

Token count per chunk (documented rule, anchors-harness.md §6.1 ``output_tokens``; for
OpenAI streams read from the raw bytes by :mod:`harness.loadgen.fastscan` where the stream
has the usual shape, with the same results as the JSON decoding it replaces):

1. if the chunk carries ``usage.completion_tokens`` (``continuous_usage_stats``), its tokens
   are the increase of that cumulative count since the previous chunk;
2. otherwise 1 if it carries text (``text``, ``delta.content`` or reasoning content), else 0;
3. at the end, the final ``usage.completion_tokens`` N is authoritative (it becomes
   ``output_tokens``). If counts came from usage stats (rule 1), a difference is settled on
   the last chunks (added to the last one, or removed from the end, never below 0). If they
   were estimates (rule 2), N is spread evenly over the text-bearing chunks (largest-remainder,
   later chunks get the extra token), since a server without usage stats that batches
   several tokens per chunk gives no better clue. Without a final usage the counted sum is
   ``output_tokens``.

A request succeeds when the response is HTTP 200, at least one chunk arrived and the stream
ended properly (``[DONE]``, or a choice reported a ``finish_reason``). Failures are
classified with the ``ERROR_*`` kinds of :mod:`harness.results.schema` and never raise:
``connect`` (no connection / refused / connect timeout), ``http_status`` (non-200),
``rejected`` (a 400/413/422 whose message says "rejected" or "context length": refused before
running), ``timeout`` (no byte for ``timeout_s``), ``stream_cut`` (connection lost, or EOF
before ``[DONE]``), ``bad_payload`` (invalid JSON, a non-object, or an ``error`` object
in the stream), ``no_choices`` (200 but no chunk with choices), ``cancelled``,
``client_limit`` (this process ran out of file descriptors: EMFILE/ENFILE).
"""

from __future__ import annotations

import asyncio
import errno
import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from harness import clock
from harness.loadgen import h1
from harness.loadgen.fastscan import scan_openai, split_segment
from harness.loadgen.sse import DONE, SSEDecoder
from harness.results import schema

READ_BUFSIZE = 10 * 2**20  # SGLang's value; aiohttp's 64 KiB default throttles long streams
# (vllm #39963, anchors-harness.md §2.1).


@dataclass(slots=True)
class RequestResult:
    """What one request produced. Times are absolute :func:`harness.clock.now` readings
    (the dispatcher shifts them to the run clock); NaN where they never happened."""

    req: int
    request_id: str
    tier: str | None
    prompt_len: int
    output_len: int
    target: float = math.nan
    arrival: float = math.nan
    send: float = math.nan
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    chunk_t: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    success: bool = False
    error_kind: str | None = None
    error: str | None = None
    http_status: int | None = None

    @property
    def first_chunk(self) -> float:
        return self.chunk_t[0] if self.chunk_t else math.nan

    @property
    def last_chunk(self) -> float:
        return self.chunk_t[-1] if self.chunk_t else math.nan

    def fail(self, kind: str, message: str) -> None:
        self.success = False
        self.error_kind = kind
        self.error = message[:500]


def make_session(
    *, limit: int = 0, timeout_s: float | None = None, connect_timeout_s: float | None = None
) -> HttpSession:
    """The ONE client a run uses: keep-alive pool (``limit`` 0 = unbounded, else the
    concurrency cap, like vLLM's ``TCPConnector(limit=max_concurrency or 0)``), large read
    buffer, and ``timeout_s`` as the longest silence allowed between bytes. The connect
    timeout defaults to ``timeout_s`` too: under overload the accept queue (or this client's
    own loop) is slow, and a short connect timeout would turn overload into connect errors;
    an unreachable target is caught by the readiness check instead.

    Plain ``http://`` requests go through the lean client of :mod:`harness.loadgen.h1` when
    ``httptools`` is installed (issue 18: a third of aiohttp's CPU per request); everything
    else, or every request when ``HARNESS_HTTP_CLIENT=aiohttp`` is set, through aiohttp."""
    if connect_timeout_s is None:
        connect_timeout_s = timeout_s
    connector = aiohttp.TCPConnector(
        limit=limit, limit_per_host=0, keepalive_timeout=60, ttl_dns_cache=300
    )
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout_s, sock_read=timeout_s)
    aio = aiohttp.ClientSession(
        connector=connector,
        timeout=timeout,
        read_bufsize=READ_BUFSIZE,
        auto_decompress=False,
        skip_auto_headers=("User-Agent",),
    )
    pool = None
    if h1.AVAILABLE and os.environ.get("HARNESS_HTTP_CLIENT", "") != "aiohttp":
        pool = h1.Pool(
            limit=limit, connect_timeout_s=connect_timeout_s, read_timeout_s=timeout_s,
            keepalive_s=60.0,
        )  # fmt: skip
    return HttpSession(aio, pool)


_RESERVED_HEADERS = frozenset(("host", "content-length", "transfer-encoding", "connection"))


class HttpSession:
    """aiohttp's session plus the lean HTTP/1.1 pool; ``async with`` closes both."""

    def __init__(self, aio: aiohttp.ClientSession, pool: h1.Pool | None) -> None:
        self.aio = aio
        self.pool = pool
        self._targets: dict[str, tuple[tuple[str, int], str] | None] = {}

    async def __aenter__(self) -> HttpSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
        await self.aio.close()

    @property
    def closed(self) -> bool:
        return self.aio.closed

    def lean_message(
        self, url: str, body: bytes, headers: dict[str, str]
    ) -> tuple[tuple[str, int], bytes] | None:
        """(host, port) and the whole request (head and body) when the lean client can send
        it, else None (https, credentials in the URL, a non-ASCII URL, a header the request
        line owns, a header value aiohttp would refuse: the aiohttp path decides)."""
        if self.pool is None:
            return None
        tgt = self._targets.get(url, False)
        if tgt is False:
            tgt = self._targets[url] = _lean_target(url)
        if tgt is None:
            return None
        lines = "".join([f"{k}: {v}\r\n" for k, v in headers.items()])
        n = len(headers)
        # One CR and one LF per header line: any other is a header injection, refused by
        # aiohttp with ValueError (the aiohttp path keeps that behaviour).
        if lines.count("\n") != n or lines.count("\r") != n:
            return None
        for k in headers:
            if k.lower() in _RESERVED_HEADERS:
                return None
        head = f"{tgt[1]}{lines}Content-Length: {len(body)}\r\n\r\n"
        return tgt[0], head.encode() + body


def _lean_target(url: str) -> tuple[tuple[str, int], str] | None:
    """((host, port), "POST path HTTP/1.1\r\nHost: ...\r\n") for a plain http URL."""
    if not url.isascii() or any(c.isspace() for c in url):
        return None
    u = urlsplit(url)
    if u.scheme != "http" or u.username or u.password or not u.hostname:
        return None
    try:
        port = u.port or 80
    except ValueError:
        return None
    path = (u.path or "/") + (f"?{u.query}" if u.query else "")
    host = u.netloc[:-3] if u.netloc.endswith(":80") else u.netloc  # as aiohttp writes it
    return (u.hostname, port), f"POST {path} HTTP/1.1\r\nHost: {host}\r\n"


class _BadPayload(Exception):
    pass


class _StreamState:
    """Per-request parse state for OpenAI-style stream messages."""

    __slots__ = (
        "assigned",
        "usage_counted",
        "text_chunks",
        "final_completion",
        "prompt_tokens",
        "done",
        "finished_choices",
    )

    def __init__(self) -> None:
        self.assigned = 0  # tokens attributed to chunks so far
        self.usage_counted = False  # any chunk counted from continuous usage stats
        self.text_chunks: list[int] = []  # indices of chunks that carried text
        self.final_completion: int | None = None
        self.prompt_tokens: int | None = None
        self.done = False
        self.finished_choices = False


def _loads_all(payloads: list[bytes]) -> list[Any]:
    """Parse several JSON payloads with ONE ``json.loads`` call (joined as an array): the
    per-call overhead, not the C scanner, dominates for ~250-byte chunks. Falls back to one
    call per payload to name the bad one."""
    if len(payloads) > 1:
        try:
            objs = json.loads("[" + b",".join(payloads).decode() + "]")
            if len(objs) == len(payloads):
                return objs
        except ValueError:
            pass
    out = []
    for p in payloads:
        try:
            out.append(json.loads(p))
        except ValueError:
            raise _BadPayload(f"invalid JSON in stream: {p[:120]!r}") from None
    return out


def interpret_openai(payloads: list[bytes], t: float, res: RequestResult, st: _StreamState) -> None:
    """Apply the SSE data payloads of one network read (all stamped ``t``) of an
    OpenAI-compatible stream to ``res``/``st``; stops at ``[DONE]``."""
    if DONE in payloads:
        payloads = payloads[: payloads.index(DONE)]
        st.done = True
    if not payloads:
        return
    chunk_t = res.chunk_t
    chunk_tokens = res.chunk_tokens
    for obj in _loads_all(payloads):
        if type(obj) is not dict:
            raise _BadPayload(f"stream message is not a JSON object: {str(obj)[:120]}")
        usage = obj.get("usage")
        if type(usage) is not dict:
            usage = None
        choices = obj.get("choices")
        if choices:
            if type(choices) is not list or type(choices[0]) is not dict:
                raise _BadPayload(f"malformed choices: {str(choices)[:120]}")
            c0 = choices[0]
            if c0.get("finish_reason") is not None:
                st.finished_choices = True
            cum = usage.get("completion_tokens") if usage is not None else None
            if type(cum) is int:
                # Server-counted tokens; text presence only matters for estimates (rule 2).
                tok = cum - st.assigned if cum > st.assigned else 0
                st.usage_counted = True
            else:
                delta = c0.get("delta")
                if type(delta) is dict:
                    has_text = bool(
                        delta.get("content")
                        or delta.get("reasoning_content")
                        or delta.get("reasoning")
                    )
                else:
                    has_text = bool(c0.get("text"))
                tok = 1 if has_text else 0
                if has_text:
                    st.text_chunks.append(len(chunk_t))
            st.assigned += tok
            chunk_t.append(t)
            chunk_tokens.append(tok)
        elif "error" in obj:
            err = obj["error"]
            msg = err.get("message", err) if isinstance(err, dict) else err
            raise _BadPayload(f"error in stream: {str(msg)[:200]}")
        if usage is not None:
            ct = usage.get("completion_tokens")
            if type(ct) is int:
                st.final_completion = ct
            pt = usage.get("prompt_tokens")
            if type(pt) is int:
                st.prompt_tokens = pt


def interpret_sglang_generate(
    payloads: list[bytes], t: float, res: RequestResult, st: _StreamState
) -> None:
    """Apply messages of SGLang's native ``/generate`` stream (sglang 0.5.23
    ``entrypoints/http_server.py`` ``stream_results`` and ``TokenizerManager`` out dicts):
    ``data: {"text", "output_ids", "meta_info": {"id", "finish_reason", "prompt_tokens",
    "completion_tokens", "cached_tokens", ...}}`` per output event, then ``data: [DONE]``.
    ``text`` is cumulative (unless the server runs ``--incremental-streaming-output``), so
    tokens come from the increase of ``meta_info.completion_tokens`` (rule 1 of the module
    docstring); a message without it counts 1 if it has text (rule 2). Every output message is
    a chunk; ``meta_info.finish_reason`` not null ends the request like OpenAI's."""
    if DONE in payloads:
        payloads = payloads[: payloads.index(DONE)]
        st.done = True
    if not payloads:
        return
    for obj in _loads_all(payloads):
        if type(obj) is not dict:
            raise _BadPayload(f"stream message is not a JSON object: {str(obj)[:120]}")
        if "error" in obj:
            err = obj["error"]
            msg = err.get("message", err) if isinstance(err, dict) else err
            raise _BadPayload(f"error in stream: {str(msg)[:200]}")
        meta = obj.get("meta_info")
        if type(meta) is not dict:
            raise _BadPayload(f"/generate message without meta_info: {str(obj)[:120]}")
        cum = meta.get("completion_tokens")
        if type(cum) is int:
            tok = cum - st.assigned if cum > st.assigned else 0
            st.usage_counted = True
            st.final_completion = cum
        else:
            tok = 1 if obj.get("text") else 0
            if tok:
                st.text_chunks.append(len(res.chunk_t))
        pt = meta.get("prompt_tokens")
        if type(pt) is int:
            st.prompt_tokens = pt
        if meta.get("finish_reason") is not None:
            st.finished_choices = True
        st.assigned += tok
        res.chunk_t.append(t)
        res.chunk_tokens.append(tok)


Interpreter = Callable[[list[bytes], float, RequestResult, _StreamState], None]


def reconcile(res: RequestResult, st: _StreamState) -> None:
    """Settle chunk token counts against the final usage (module docstring, rule 3)."""
    toks = res.chunk_tokens
    n = st.final_completion
    if n is None or not toks:
        res.output_tokens = n if n is not None else st.assigned
        return
    res.output_tokens = n
    diff = n - sum(toks)
    if diff == 0:
        return
    if st.usage_counted:
        if diff > 0:
            toks[-1] += diff
        else:
            i = len(toks) - 1
            while diff < 0 and i >= 0:
                take = min(toks[i], -diff)
                toks[i] -= take
                diff += take
                i -= 1
        return
    idx = st.text_chunks or list(range(len(toks)))
    base, rem = divmod(n, len(idx))
    for i in range(len(toks)):
        toks[i] = 0
    for k, i in enumerate(idx):
        toks[i] = base + (1 if k >= len(idx) - rem else 0)


async def stream_request(
    session: HttpSession | aiohttp.ClientSession,
    url: str,
    body: bytes,
    headers: dict[str, str],
    res: RequestResult,
    interpret: Interpreter | None = None,
) -> RequestResult:
    """POST ``body`` and consume the SSE stream into ``res``; stamps ``res.send`` itself.

    ``interpret`` reads the stream's messages (default :func:`interpret_openai`; SGLang's
    native ``/generate`` uses :func:`interpret_sglang_generate`). Through the lean client
    where :meth:`HttpSession.lean_message` allows (a redirect reply is then sent again
    through aiohttp, which follows it), else through aiohttp; both classify failures alike.

    Never raises except :class:`asyncio.CancelledError`, which is recorded as ``cancelled``
    before it propagates.
    """
    st = _StreamState()
    interp = interpret or interpret_openai
    got_response = False
    now = clock.now
    lean = None
    if type(session) is HttpSession:
        lean = session.lean_message(url, body, headers)
        aio = session.aio
    else:
        aio = session
    try:
        res.send = now()
        if lean is not None:
            pool = session.pool  # type: ignore[union-attr]
            conn = await pool.acquire(lean[0])
            try:
                fut = conn.request(lean[1], make_feed(interp, res, st), pool.read_timeout_s)
                try:
                    reply = await fut
                except asyncio.CancelledError:
                    conn.abandon()
                    raise
            finally:
                pool.release(conn)
            got_response = True
            res.http_status = status = reply.status
            if status == 200:
                _verdict(res, st)
                return res
            if status not in h1.REDIRECTS:
                _fail_status(res, status, reply.error_body.decode("utf-8", "replace"))
                return res
            got_response = False  # a redirect: aiohttp sends it again and follows it
            res.http_status = None
        async with aio.post(url, data=body, headers=headers) as resp:
            got_response = True
            res.http_status = resp.status
            if resp.status != 200:
                try:
                    text = (await asyncio.wait_for(resp.content.read(300), 5.0)).decode(
                        "utf-8", "replace"
                    )
                except Exception:  # the status is the error; the body is only a hint
                    text = ""
                _fail_status(res, resp.status, text)
                return res
            feed = make_feed(interp, res, st)
            if not await _consume_at_receipt(resp.content, feed, st):
                async for data in resp.content.iter_any():
                    t = now()
                    if st.done:
                        continue  # drain to EOF so the connection returns to the pool
                    feed(data, t)
            _verdict(res, st)
    except asyncio.CancelledError:
        res.fail(schema.ERROR_CANCELLED, "cancelled while in flight")
        raise
    except _BadPayload as exc:
        res.fail(schema.ERROR_BAD_PAYLOAD, str(exc))
    except (TimeoutError, aiohttp.ServerTimeoutError, h1.ReadTimeout) as exc:
        if isinstance(exc, aiohttp.ConnectionTimeoutError):
            res.fail(schema.ERROR_CONNECT, f"connect timeout: {exc}")
        else:
            res.fail(schema.ERROR_TIMEOUT, f"no data within the read timeout ({exc or 'timeout'})")
    except h1.ConnectFailed as exc:
        kind = schema.ERROR_CLIENT_LIMIT if _out_of_fds(exc) else schema.ERROR_CONNECT
        res.fail(kind, str(exc))
    except (h1.Disconnected, h1.BadResponse) as exc:
        if exc.got_response:
            res.fail(schema.ERROR_STREAM_CUT, f"stream cut: {exc}")
        else:
            res.fail(schema.ERROR_CONNECT, f"{type(exc).__name__}: {exc}")
    except aiohttp.ClientPayloadError as exc:
        res.fail(schema.ERROR_STREAM_CUT, f"stream cut: {exc}")
    except aiohttp.ClientError as exc:
        kind = schema.ERROR_STREAM_CUT if got_response else schema.ERROR_CONNECT
        if _out_of_fds(exc):
            kind = schema.ERROR_CLIENT_LIMIT
        res.fail(kind, f"{type(exc).__name__}: {exc}")
    except OSError as exc:
        kind = schema.ERROR_CLIENT_LIMIT if _out_of_fds(exc) else schema.ERROR_CONNECT
        res.fail(kind, f"{type(exc).__name__}: {exc}")
    finally:
        if res.prompt_tokens is None:
            res.prompt_tokens = st.prompt_tokens if st.prompt_tokens is not None else res.prompt_len
        reconcile(res, st)
    return res


def _fail_status(res: RequestResult, status: int, text: str) -> None:
    """A non-200 reply: ``http_status``, or ``rejected`` for a refusal before running (the
    built-in engine's "request rejected: ..." for longer than KV capacity, vLLM's "maximum
    context length" 400)."""
    kind = schema.ERROR_HTTP
    low = text.lower()
    if status in (400, 413, 422) and ("rejected" in low or "context length" in low):
        kind = schema.ERROR_REJECTED
    res.fail(kind, f"HTTP {status}: {text.strip()}")


def _verdict(res: RequestResult, st: _StreamState) -> None:
    """A 200 reply that ended: success needs a chunk and a proper end ([DONE] or a
    finish_reason)."""
    if not res.chunk_t:
        res.fail(schema.ERROR_NO_CHOICES, "HTTP 200 but no chunk with choices")
    elif not (st.done or st.finished_choices):
        res.fail(schema.ERROR_STREAM_CUT, "stream ended before [DONE]")
    else:
        res.success = True


async def _consume_at_receipt(
    content: Any, feed: Callable[[bytes, float], None], st: _StreamState
) -> bool:
    """Read the body by handling each piece inside the connection's ``data_received``
    callback, where aiohttp's parser hands it to the response's stream, instead of
    buffering it and waking this task to read it (anchors-harness.md §7, "Timestamps").

    Why: the stamp is then taken when the event loop delivered the bytes, not after every
    other callback of that loop turn and a task switch (issue 18: client-minus-server TTFT
    excess), and a streamed chunk costs one function call instead of a future, a task step
    and a buffer round trip. The task itself only waits for the end of the body (EOF, a cut
    or a read timeout, all raised from ``iter_any`` exactly as before). Bytes that arrived
    together with the response headers were buffered before this hook existed: they are
    read first, stamped now, as the plain loop would. A stream error raised by ``feed`` is
    set on the stream so that this task raises it, as the plain loop did. Returns False,
    having read nothing, where the stream cannot be switched (another aiohttp stream type or
    layout): the caller then reads it the plain way."""
    if type(content) is not aiohttp.StreamReader:
        return False
    now = clock.now

    def on_data(data: bytes) -> None:
        if data and not st.done and content.exception() is None:
            try:
                feed(data if type(data) is bytes else bytes(data), now())
            except _BadPayload as exc:
                content.set_exception(exc)

    try:
        content.__class__ = _ReceiptReader
    except TypeError:
        return False
    key = id(content)
    _RECEIPT_HOOKS[key] = on_data
    try:
        early = content.read_nowait()
        if early:
            feed(early, now())
        async for _ in content.iter_any():
            pass  # never data (nothing is buffered any more); ends at EOF or raises
    finally:
        del _RECEIPT_HOOKS[key]
        content.__class__ = aiohttp.StreamReader
    return True


_RECEIPT_HOOKS: dict[int, Callable[[bytes], None]] = {}


class _ReceiptReader(aiohttp.StreamReader):
    """aiohttp's response stream whose ``feed_data`` (called by the HTTP parser inside
    ``data_received``) hands the bytes to the hook of :func:`_consume_at_receipt` instead of
    buffering them. Same layout as StreamReader (no new slots), so a live response's stream
    can be switched to it and back; without a hook it behaves as StreamReader."""

    __slots__ = ()

    def feed_data(self, data: bytes, size: int = 0) -> bool:
        hook = _RECEIPT_HOOKS.get(id(self))
        if hook is None:
            return super().feed_data(data, size)
        hook(data)
        return False  # nothing buffered, nothing pending (the parser's contract)


def make_feed(
    interp: Interpreter, res: RequestResult, st: _StreamState
) -> Callable[[bytes, float], None]:
    """The per-read step of one stream: ``feed(data, t)`` with the bytes of one network read
    and its receipt stamp. For :func:`interpret_openai` it first tries the byte scan of
    :mod:`harness.loadgen.fastscan` on the read's complete messages (same counts, no JSON,
    ~5x less CPU) and JSON-decodes only a segment the scan declines; a ``\r`` in the stream
    hands it to the general SSE decoder for good. Other interpreters get the decoder."""
    dec = SSEDecoder()
    if interp is not interpret_openai:

        def feed_any(data: bytes, t: float) -> None:
            if st.done:
                return
            payloads = dec.feed(data)
            if payloads:
                interp(payloads, t, res, st)

        return feed_any
    pending = b""
    slow = False

    def feed_openai(data: bytes, t: float) -> None:
        nonlocal pending, slow
        if st.done:
            return  # drained to the end of the body, as the connection is reused
        if not slow and b"\r" in data:
            slow = True
            data, pending = pending + data, b""
        if slow:
            payloads = dec.feed(data)
            if payloads:
                interpret_openai(payloads, t, res, st)
            return
        seg, pending = split_segment(pending + data if pending else data)
        if seg and not scan_openai(seg, t, res, st):
            interpret_openai(SSEDecoder().feed(seg), t, res, st)

    return feed_openai


def _out_of_fds(exc: BaseException) -> bool:
    """EMFILE/ENFILE: this process (or the system) ran out of descriptors, a client-side
    limit, not a connection failure of the target."""
    errno_ = getattr(exc, "errno", None) or getattr(getattr(exc, "os_error", None), "errno", None)
    return errno_ in (errno.EMFILE, errno.ENFILE) or "Too many open files" in str(exc)


_ENCODER = json.JSONEncoder(separators=(",", ":"))  # json.dumps builds one per call otherwise


def encode_body(body: dict[str, Any]) -> bytes:
    return _ENCODER.encode(body).encode()
