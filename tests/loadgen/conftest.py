"""Fixtures for the load-generator tests: a real SSE server on an ephemeral port (fakesse)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from fakesse import FakeServer, start_app


@pytest.fixture
async def sse_server() -> AsyncIterator[FakeServer]:
    srv = FakeServer()
    app = web.Application()
    app.router.add_post("/v1/completions", srv.handle)
    app.router.add_post("/v1/chat/completions", srv.handle)
    app.router.add_get("/v1/models", srv.models)
    app.router.add_get("/metrics", srv.metrics)
    runner, srv.url = await start_app(app)
    try:
        yield srv
    finally:
        srv.stop.set()
        await runner.cleanup()
