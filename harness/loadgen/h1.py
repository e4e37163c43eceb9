"""A lean HTTP/1.1 client for the load generator's hot path: one POST, one streamed reply.

Why (issue 18): with the stream scan in :mod:`harness.loadgen.fastscan`, most of the
client's CPU per request was aiohttp's request machinery (request and response objects,
header multidicts, stream readers, timers, ~20 Python frames per request) and the task
wake-ups between them. This module does the same wire work with an asyncio Protocol per
connection and ``httptools`` (the llhttp C parser uvicorn uses): the request head and body
go out in one write, each network read is stamped in ``data_received`` before any parsing
(anchors-harness.md §7, "Timestamps") and its body bytes are handed to the caller's ``feed``
in that same call, and the awaiting task wakes once, when the reply has ended.

Scope: plain ``http://`` targets, keep-alive pooling per (host, port), Content-Length,
chunked and read-until-close framing. The caller (:func:`harness.loadgen.client.stream_request`)
keeps aiohttp for everything else (https, credentials in the URL, header values it would
reject, redirects), and without ``httptools`` installed this module is not used at all
(:data:`AVAILABLE`). The request carries the caller's headers plus ``Host`` and
``Content-Length`` only: no ``Accept-Encoding``, so a server has no reason to compress.

Failures are exceptions the caller classifies like aiohttp's: :class:`ConnectFailed`
(``OSError`` or connect timeout), :class:`Disconnected` (the connection ended;
``got_response`` says whether the status line had arrived), :class:`ReadTimeout` (no byte for
the read timeout), :class:`BadResponse` (unparsable HTTP); an exception raised by ``feed``
ends the request and propagates unchanged.
"""

from __future__ import annotations

import asyncio
from typing import Any

from harness import clock

try:
    import httptools
except ImportError:  # pragma: no cover - exercised by the fallback test via AVAILABLE
    httptools = None

AVAILABLE = httptools is not None
ERROR_BODY_WAIT_S = 5.0  # as long as the aiohttp path waits for a non-200 reply's body
ERROR_BODY_BYTES = 300
REDIRECTS = frozenset((301, 302, 303, 307, 308))


class ConnectFailed(Exception):
    """No connection: ``cause`` is the OSError (errno kept for the EMFILE check) or None
    for a connect timeout."""

    def __init__(self, message: str, cause: OSError | None) -> None:
        super().__init__(message)
        self.cause = cause
        self.errno = getattr(cause, "errno", None)


class Disconnected(Exception):
    """The connection ended before the reply did."""

    def __init__(self, message: str, got_response: bool) -> None:
        super().__init__(message)
        self.got_response = got_response


class ReadTimeout(Exception):
    """No byte arrived within the read timeout."""


class BadResponse(Exception):
    """The reply is not parsable HTTP/1.x."""

    def __init__(self, message: str, got_response: bool) -> None:
        super().__init__(message)
        self.got_response = got_response


class Reply:
    """What :meth:`Connection.request` resolves to: the status, and for a non-200 reply
    the first bytes of its body (at most :data:`ERROR_BODY_BYTES`)."""

    __slots__ = ("status", "error_body")

    def __init__(self, status: int, error_body: bytes) -> None:
        self.status = status
        self.error_body = error_body


class Connection(asyncio.Protocol):
    """One keep-alive connection; at most one request at a time (no pipelining)."""

    def __init__(self, key: tuple[str, int]) -> None:
        self.key = key
        self.tr: asyncio.Transport | None = None
        self.parser: Any = httptools.HttpResponseParser(self)
        self.lost = False
        self.idle_since = 0.0
        self._reset()

    def _reset(self) -> None:
        self.fut: asyncio.Future[Reply] | None = None
        self.feed: Any = None
        self.status = 0
        self.headers_done = False
        self.complete = False
        self.framed = False  # Content-Length or Transfer-Encoding: EOF is not the end
        self.keep = False
        self.pieces: list[bytes] = []
        self.error_body: bytes | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.timeout_s: float | None = None
        self.last_rx = 0.0

    @property
    def reusable(self) -> bool:
        return self.complete and self.keep and not self.lost and self.fut is None

    # -- request ------------------------------------------------------------------------------
    def request(self, data: bytes, feed: Any, timeout_s: float | None) -> asyncio.Future[Reply]:
        """Send ``data`` (head and body); the future resolves when the reply has ended (or,
        for a non-200 reply, once the first body bytes came) or fails as the module says.
        ``feed(body_bytes, t)`` gets each read's body bytes of a 200 reply with its stamp."""
        assert self.tr is not None and self.fut is None
        self.complete = False
        self.headers_done = False
        self.status = 0
        self.framed = False
        self.error_body = None
        self.feed = feed
        loop = asyncio.get_running_loop()
        fut = self.fut = loop.create_future()
        self.timeout_s = timeout_s
        self.last_rx = clock.now()
        if timeout_s is not None:
            self.timer = loop.call_later(timeout_s, self._on_timer)
        self.tr.write(data)
        return fut

    def close(self) -> None:
        if self.tr is not None and not self.tr.is_closing():
            self.tr.close()

    def abandon(self) -> None:
        """The awaiting task went away (cancelled): the connection is not reusable."""
        self._cancel_timer()
        self.fut = None
        self.keep = False
        self.close()

    # -- protocol callbacks -------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.tr = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        t = clock.now()  # the receipt stamp, before any parsing
        self.last_rx = t
        if self.fut is None:  # bytes on an idle connection: it cannot be reused
            self.keep = False
            self.complete = False
            self.close()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(BadResponse(f"bad HTTP response: {exc}", self.headers_done))
            return
        if self.fut is None:
            return  # failed inside a callback
        pieces = self.pieces
        if pieces:
            piece = pieces[0] if len(pieces) == 1 else b"".join(pieces)
            pieces.clear()
            if self.status == 200:
                try:
                    self.feed(piece, t)
                except Exception as exc:  # the stream's own verdict (bad payload)
                    self._fail(exc)
                    return
            elif self.error_body is None:
                self.error_body = piece[:ERROR_BODY_BYTES]
                self._end()
                return
        if self.complete:
            self._end()

    def eof_received(self) -> bool | None:
        return None  # close; connection_lost decides

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.fut is None:
            return
        if self.headers_done and not self.framed and not self.complete:
            # Read-until-close framing: the end of the connection is the end of the body.
            self.complete = True
            self.keep = False
            self._end()
            return
        msg = "connection closed before the reply ended" if exc is None else f"{exc}"
        self._fail(Disconnected(msg, self.headers_done))

    # -- httptools callbacks ------------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        n = name.lower()
        if n == b"content-length" or n == b"transfer-encoding":
            self.framed = True

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        self.status = status
        if status < 200:
            return  # an interim reply (100 Continue): the real one follows
        self.headers_done = True
        self.keep = self.parser.should_keep_alive()
        if status != 200:
            # The status is the error; wait for the first body bytes as a hint, not longer
            # than the aiohttp path would (its read(300) under a 5 s wait and the read timeout).
            self._cancel_timer()
            wait = min(ERROR_BODY_WAIT_S, self.timeout_s or ERROR_BODY_WAIT_S)
            self.timer = asyncio.get_running_loop().call_later(wait, self._end)

    def on_body(self, body: bytes) -> None:
        self.pieces.append(body)

    def on_message_complete(self) -> None:
        if self.status < 200:
            self.framed = False
            return
        self.complete = True

    # -- ends ---------------------------------------------------------------------------------
    def _on_timer(self) -> None:
        self.timer = None
        if self.fut is None or self.timeout_s is None:
            return
        left = self.last_rx + self.timeout_s - clock.now()
        if left > 1e-3:
            self.timer = asyncio.get_running_loop().call_later(left, self._on_timer)
            return
        self._fail(ReadTimeout(f"no data for {self.timeout_s:g} s"))

    def _cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _end(self) -> None:
        fut = self.fut
        if fut is None:
            return
        self._cancel_timer()
        self.fut = None
        self.feed = None
        if not self.complete:
            self.keep = False
            self.close()
        if not fut.done():
            fut.set_result(Reply(self.status, self.error_body or b""))

    def _fail(self, exc: BaseException) -> None:
        fut = self.fut
        self._cancel_timer()
        self.fut = None
        self.feed = None
        self.keep = False
        self.close()
        if fut is not None and not fut.done():
            fut.set_exception(exc)


class Pool:
    """Keep-alive connections per (host, port), most recently used first; ``limit`` > 0
    caps connections in use at once (aiohttp's ``TCPConnector(limit=...)``)."""

    def __init__(
        self,
        *,
        limit: int = 0,
        connect_timeout_s: float | None = None,
        read_timeout_s: float | None = None,
        keepalive_s: float = 60.0,
    ) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.keepalive_s = keepalive_s
        self.idle: dict[tuple[str, int], list[Connection]] = {}
        self.open: set[Connection] = set()
        self.sem = asyncio.Semaphore(limit) if limit else None
        self.closed = False

    async def acquire(self, key: tuple[str, int]) -> Connection:
        """A live idle connection to ``key``, or a new one (raises :class:`ConnectFailed`)."""
        if self.sem is not None:
            await self.sem.acquire()
        try:
            idle = self.idle.get(key)
            if idle:
                now = clock.now()
                while idle:
                    c = idle.pop()
                    if not c.lost and now - c.idle_since < self.keepalive_s:
                        return c
                    c.close()
                    self.open.discard(c)
            return await self._connect(key)
        except BaseException:
            if self.sem is not None:
                self.sem.release()
            raise

    async def _connect(self, key: tuple[str, int]) -> Connection:
        loop = asyncio.get_running_loop()
        conn = Connection(key)
        try:
            coro = loop.create_connection(lambda: conn, key[0], key[1])
            if self.connect_timeout_s is None:
                await coro
            else:
                await asyncio.wait_for(coro, self.connect_timeout_s)
        except TimeoutError:
            raise ConnectFailed(
                f"connect timeout ({self.connect_timeout_s:g} s) to {key[0]}:{key[1]}", None
            ) from None
        except OSError as exc:
            raise ConnectFailed(f"cannot connect to {key[0]}:{key[1]}: {exc}", exc) from None
        self.open.add(conn)
        return conn

    def release(self, conn: Connection) -> None:
        """Give ``conn`` back after its request (pooled if it can carry another)."""
        if self.sem is not None:
            self.sem.release()
        if conn.reusable and not self.closed:
            conn.idle_since = clock.now()
            self.idle.setdefault(conn.key, []).append(conn)
        else:
            conn.close()
            self.open.discard(conn)

    def close(self) -> None:
        self.closed = True
        for c in self.open:
            c.close()
        self.open.clear()
        self.idle.clear()
