"""The echo server (echo.py) on its own event loop in a thread, for tests that drive the CLI
(``harness replay`` / ``harness sweep`` run their own event loop in the test's thread)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from echo import EchoServer, start_echo


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
