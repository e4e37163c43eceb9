"""The echo server (echo.py) on its own event loop in a thread, for tests that drive the CLI
(``harness replay`` / ``harness sweep`` run their own event loop in the test's thread).

:class:`FifoDelay` as the server's ``first_delay`` makes it a single FIFO server: each
request's first chunk waits for the requests before it, then ``service_s`` of "work", so TTFT
grows with the offered load (what a capacity sweep needs).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from echo import EchoServer, start_echo

from harness import clock


class FifoDelay(dict):
    """``EchoServer.first_delay`` for a FIFO single server (the server asks it once per
    request, on the server's loop, in arrival order)."""

    def __init__(self, service_s: float) -> None:
        super().__init__()
        self.service_s = service_s
        self.free_at = 0.0

    def get(self, key: Any, default: Any = None) -> float:  # noqa: ARG002 (dict's signature)
        now = clock.now()
        self.free_at = max(now, self.free_at) + self.service_s
        return self.free_at - now


@contextmanager
def echo_in_thread(**kw: Any) -> Iterator[EchoServer]:
    """Start the echo server, yield it (``.url`` set), stop it on exit."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    srv, runner = asyncio.run_coroutine_threadsafe(start_echo(**kw), loop).result(timeout=10)
    try:
        yield srv
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()
