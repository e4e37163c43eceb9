"""Reading a stream inside ``data_received``, through both HTTP paths (the lean client of
``harness.loadgen.h1`` and aiohttp with ``_consume_at_receipt``): every outcome is classified
alike and leaves no hook behind, streamed chunks are stamped one by one at receipt, and a bad
payload still fails the request as before."""

from __future__ import annotations

import asyncio

import pytest
from fakesse import FakeServer

from harness import clock
from harness.loadgen import client
from harness.loadgen.client import RequestResult, encode_body, make_session, stream_request
from harness.results import schema

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True, params=["lean", "aiohttp"])
def http_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test once per HTTP path (``HARNESS_HTTP_CLIENT=aiohttp`` forces aiohttp)."""
    monkeypatch.setenv("HARNESS_HTTP_CLIENT", request.param)
    return str(request.param)


def _body(mode: str, n: int = 5) -> bytes:
    return encode_body({"model": "m", "prompt": f"mode={mode}", "max_tokens": n, "stream": True,
                        "stream_options": {"include_usage": True,
                                           "continuous_usage_stats": True}})  # fmt: skip


async def _run(srv: FakeServer, mode: str, timeout_s: float = 10) -> RequestResult:
    res = RequestResult(req=0, request_id=mode, tier=None, prompt_len=2, output_len=5)
    async with make_session(timeout_s=timeout_s) as s:
        return await stream_request(
            s, srv.url + "/v1/completions", _body(mode), {"x-request-id": mode}, res
        )


@pytest.mark.parametrize(
    ("mode", "kind"),
    [("ok", None), ("cut", schema.ERROR_STREAM_CUT), ("badjson", schema.ERROR_BAD_PAYLOAD),
     ("nochoices", schema.ERROR_NO_CHOICES)],
)  # fmt: skip
async def test_every_outcome_leaves_no_hook(sse_server: FakeServer, mode: str, kind: str) -> None:
    res = await _run(sse_server, mode)
    assert res.error_kind == kind, res.error
    assert client._RECEIPT_HOOKS == {}


async def test_read_timeout_and_cancellation_leave_no_hook(sse_server: FakeServer) -> None:
    res = await _run(sse_server, "hang", timeout_s=0.3)
    assert res.error_kind == schema.ERROR_TIMEOUT
    assert client._RECEIPT_HOOKS == {}
    task = asyncio.ensure_future(_run(sse_server, "hang"))
    while not sse_server.in_flight:  # the body is awaited
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert client._RECEIPT_HOOKS == {}


async def test_streamed_chunks_are_stamped_at_receipt(sse_server: FakeServer) -> None:
    sse_server.itl_s = 0.02
    res = await _run(sse_server, "ok")
    assert res.success and len(res.chunk_t) == 5
    writes = sse_server.writes["ok"]
    # Each chunk has its own stamp, after its write and before the next one was written.
    for k in range(5):
        assert writes[k] <= res.chunk_t[k]
        if k < 4:
            assert res.chunk_t[k] < writes[k + 1]
    assert res.chunk_t[-1] <= clock.now()


async def test_a_stream_that_cannot_be_switched_is_left_to_the_plain_loop() -> None:
    from harness.loadgen.client import _consume_at_receipt, _StreamState

    def feed(data: bytes, t: float) -> None:
        raise AssertionError("nothing may be read")

    assert await client._consume_at_receipt(object(), feed, _StreamState()) is False
    assert _consume_at_receipt is client._consume_at_receipt and client._RECEIPT_HOOKS == {}
