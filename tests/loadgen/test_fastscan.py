"""The byte-scanning fast path counts exactly what JSON decoding counts (issue 18).

Reference: the JSON path alone (``SSEDecoder`` + ``interpret_openai`` per read, the client's
loop before the fast path). Streams: real ones recorded from the built-in server (completions
and chat; continuous usage, final usage only, no usage; its ``malformed`` and ``drop``
faults), then hand-made edge cases. Every stream is replayed as one read, split at message
boundaries, at random points and byte by byte; the stamp of a read is its index, so the
comparison also checks which read each chunk is attributed to.

Both implementations run every test (``scan`` fixture): the pure-Python scan and the C one
(``harness.loadgen._sse_scan``, skipped only where the extension is not built); a randomized
test then compares the two directly on mutated real segments, and another with keys at every
offset of the C scan's 16-byte blocks, also handing the C scan copies that end at a PROT_NONE
page (a read past the buffer's end faults there instead of reading the NUL after it).
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import json
import mmap
import random
import struct
import sys
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from harness.loadgen import client, fastscan, fastsse
from harness.loadgen.client import (
    RequestResult,
    _BadPayload,
    _StreamState,
    interpret_openai,
    make_feed,
    reconcile,
)
from harness.loadgen.fastscan import split_segment
from harness.loadgen.sse import SSEDecoder
from harness.server import embedded

pytestmark = pytest.mark.timeout(120)

Scan = Callable[[bytes, float, Any, Any], bool]
NOT_BUILT = "the C scanner harness.loadgen._sse_scan is not built (no C compiler at install)"
IMPLS = [
    pytest.param("py"),
    pytest.param("c", marks=pytest.mark.skipif(not fastscan.HAVE_C, reason=NOT_BUILT)),
]


@pytest.fixture(params=IMPLS)
def scan(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Scan:
    """The scanner under test, also put where the client's per-read step calls it."""
    fn = fastscan.scan_openai_c if request.param == "c" else fastscan.scan_openai_py
    monkeypatch.setattr(client, "scan_openai", fn)
    return fn


def _outcome(res: RequestResult, st: _StreamState, err: str | None) -> dict[str, Any]:
    reconcile(res, st)
    return {
        "chunk_t": res.chunk_t,
        "chunk_tokens": res.chunk_tokens,
        "output_tokens": res.output_tokens,
        "prompt_tokens": st.prompt_tokens,
        "text_chunks": st.text_chunks,
        "usage_counted": st.usage_counted,
        "done": st.done,
        "finished": st.finished_choices,
        "error": err,
    }


def _reference(reads: list[bytes]) -> dict[str, Any]:
    res, st, dec = RequestResult(0, "r", None, 4, 8), _StreamState(), SSEDecoder()
    err = None
    try:
        for i, data in enumerate(reads):
            if st.done:
                break
            payloads = dec.feed(data)
            if payloads:
                interpret_openai(payloads, float(i), res, st)
    except _BadPayload as exc:
        err = str(exc)
    return _outcome(res, st, err)


def _client(reads: list[bytes]) -> dict[str, Any]:
    res, st = RequestResult(0, "r", None, 4, 8), _StreamState()
    feed = make_feed(interpret_openai, res, st)
    err = None
    try:
        for i, data in enumerate(reads):
            if st.done:
                break
            feed(data, float(i))
    except _BadPayload as exc:
        err = str(exc)
    return _outcome(res, st, err)


def _splits(body: bytes, seed: int = 0) -> list[list[bytes]]:
    rng = random.Random(seed)
    out = [[body]]
    msgs = body.split(b"\n\n")
    out.append([m + b"\n\n" for m in msgs[:-1]] + ([msgs[-1]] if msgs[-1] else []))
    for _ in range(4):
        cuts = sorted(rng.sample(range(1, len(body)), min(len(body) - 1, rng.randint(1, 12))))
        out.append([body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)])
    if len(body) <= 4000:
        out.append([body[i : i + 1] for i in range(len(body))])
    return out


def assert_same(scan: Scan, body: bytes, *, scanned: bool | None = None) -> None:
    for reads in _splits(body):
        assert _client(reads) == _reference(reads), reads
    if scanned is not None:  # the whole stream as one read: did the fast path take it?
        seg, _ = split_segment(body)
        res, st = RequestResult(0, "r", None, 4, 8), _StreamState()
        assert scan(seg, 0.0, res, st) is scanned


# -- real streams from the built-in server ----------------------------------------------------
async def _record(url: str, path: str, body: dict[str, Any], rid: str) -> bytes:
    async with (
        aiohttp.ClientSession() as s,
        s.post(url + path, json=body, headers={"x-request-id": rid}) as r,
    ):
        assert r.status == 200
        out = b""
        try:
            async for data in r.content.iter_any():
                out += data
        except aiohttp.ClientPayloadError:
            pass  # the drop fault: what arrived before the cut is the stream
        return out


def _body(chat: bool, n: int, usage: str) -> dict[str, Any]:
    b: dict[str, Any] = {"model": "m", "max_tokens": n, "stream": True, "ignore_eos": True}
    if chat:
        b["messages"] = [{"role": "user", "content": "a b c d"}]
    else:
        b["prompt"] = "a b c d"
    if usage != "none":
        b["stream_options"] = {"include_usage": True}
        if usage == "continuous":
            b["stream_options"]["continuous_usage_stats"] = True
    return b


@pytest.mark.parametrize("chat", [False, True])
async def test_fast_path_equals_json_on_built_in_server_streams(scan: Scan, chat: bool) -> None:
    path = "/v1/chat/completions" if chat else "/v1/completions"
    async with embedded(policy="vllm") as url:
        for usage in ("continuous", "final", "none"):
            for n in (1, 7, 40):
                raw = await _record(url, path, _body(chat, n, usage), f"r-{usage}-{n}")
                assert raw.endswith(b"data: [DONE]\n\n")
                # Continuous usage is the load generator's own request (vllm dialect): it must
                # be scanned; chat without it starts with an empty role delta (JSON path).
                assert_same(scan, raw, scanned=True if usage == "continuous" or not chat else None)
                ref = _reference([raw])
                assert ref["output_tokens"] == n and ref["finished"] and ref["error"] is None


async def test_fast_path_equals_json_on_faulty_built_in_server_streams(scan: Scan) -> None:
    for fault in ("malformed=1.0", "drop=1.0"):
        async with embedded(policy="vllm", faults=fault) as url:
            for chat in (False, True):
                path = "/v1/chat/completions" if chat else "/v1/completions"
                raw = await _record(url, path, _body(chat, 12, "continuous"), f"f-{chat}")
                assert_same(scan, raw)
                ref = _reference([raw])
                if fault.startswith("malformed"):
                    assert ref["error"] and "invalid JSON" in ref["error"]
                else:
                    assert not ref["done"] and not ref["finished"] and ref["error"] is None


def _bench_body(n: int) -> bytes:
    whole = fastsse._State(0.0).whole(n)
    return whole[whole.find(b"\r\n\r\n") + 4 :]


def test_fast_path_equals_json_on_the_bench_server_stream(scan: Scan) -> None:
    body = _bench_body(100)
    assert_same(scan, body, scanned=True)
    assert _reference([body])["chunk_tokens"] == [1] * 100


# -- hand-made edge cases ------------------------------------------------------------------------
def _msg(obj: Any, **dump: Any) -> bytes:
    dump.setdefault("separators", (",", ":"))
    return b"data: " + json.dumps(obj, **dump).encode() + b"\n\n"


def _chunk(text: Any, cum: Any = None, fin: Any = None, chat: bool = False, **extra: Any) -> dict:
    choice: dict[str, Any] = {"index": 0, "finish_reason": fin}
    if chat:
        choice["delta"] = {"content": text}
    else:
        choice["text"] = text
    obj: dict[str, Any] = {"id": "x", "choices": [choice], **extra}
    if cum is not None:
        obj["usage"] = {"prompt_tokens": 5, "completion_tokens": cum, "total_tokens": 5 + cum}
    return obj


USAGE_ONLY = {"id": "x", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 4}}
DONE = b"data: [DONE]\n\n"

EDGE_CASES: dict[str, bytes] = {
    "coalesced chunks (cumulative jumps)": b"".join(
        _msg(_chunk("a", c, "length" if c == 9 else None)) for c in (2, 2, 5, 9)
    )
    + DONE,
    "cumulative count goes down": b"".join(_msg(_chunk("a", c)) for c in (1, 3, 2, 4)) + DONE,
    "usage claims more than streamed": b"".join(_msg(_chunk("a")) for _ in range(3))
    + _msg(USAGE_ONLY)
    + DONE,
    "spaces after colons": b"".join(
        _msg(_chunk("a", c, "stop" if c == 3 else None), separators=(", ", ": ")) for c in (1, 2, 3)
    )
    + DONE,
    "space only in one finish_reason": _msg(_chunk("a", 1))
    + _msg(_chunk("a", 2)).replace(b'"finish_reason":null', b'"finish_reason": "stop"')
    + DONE,
    "text that quotes the JSON keys": b"".join(
        _msg(_chunk('"choices":[{"finish_reason":"stop"}],"usage":{"completion_tokens":99}', c))
        for c in (1, 2)
    )
    + DONE,
    "empty texts without usage": b"".join(_msg(_chunk(t)) for t in ("a", "", "b")) + DONE,
    "chat with a role delta": _msg(
        {"id": "x", "choices": [{"index": 0, "delta": {"role": "a"}, "finish_reason": None}]}
    )
    + b"".join(_msg(_chunk("a", chat=True)) for _ in range(3))
    + DONE,
    "chat reasoning content": _msg(
        {
            "id": "x",
            "choices": [{"index": 0, "delta": {"reasoning_content": "r"}, "finish_reason": None}],
        }
    )
    + _msg(_chunk("a", chat=True))
    + DONE,
    "usage null on chunks": b"".join(_msg({**_chunk("a"), "usage": None}) for _ in range(3))
    + _msg(USAGE_ONLY)
    + DONE,
    "usage not an object": _msg({**_chunk("a"), "usage": 7}) + DONE,
    "non-integer completion tokens": b"".join(
        _msg({**_chunk("a"), "usage": {"prompt_tokens": 5, "completion_tokens": 1.0}})
        for _ in range(2)
    )
    + DONE,
    "two choices per chunk": _msg(
        {
            "id": "x",
            "choices": [
                {"index": 0, "text": "a", "finish_reason": None},
                {"index": 1, "text": "b", "finish_reason": "stop"},
            ],
        }
    )
    + DONE,
    "error object mid-stream": _msg(_chunk("a", 1)) + _msg({"error": {"message": "boom"}}) + DONE,
    "error after a usage-only shape": _msg(_chunk("a", 1))
    + _msg(
        {
            "choices": [],
            "error": "overloaded",
            "usage": {"prompt_tokens": 5, "completion_tokens": 1},
        }
    )
    + DONE,
    "keep-alive comments and CRLF": b": ping\r\n\r\n"
    + _msg(_chunk("a", 1)).replace(b"\n\n", b"\r\n\r\n")
    + _msg(_chunk("b", 2, "stop"))
    + DONE,
    "comment between chunks": _msg(_chunk("a", 1))
    + b": ping\n\n"
    + _msg(_chunk("b", 2, "stop"))
    + DONE,
    "multi-line data field": b'data: {"id":"x",\ndata: "choices":[]}\n\n' + DONE,
    "raw newline inside a message": _msg(_chunk("a", 1)).replace(b',"usage"', b',\n"usage"') + DONE,
    "DONE before the last message": _msg(_chunk("a", 1)) + DONE + _msg(_chunk("b", 2)),
    "truncated JSON then a good chunk": _msg(_chunk("a", 1))
    + b'data: {"id":"x","choices":[{"index":0,"text":"\n\n'
    + _msg(_chunk("b", 2, "stop"))
    + DONE,
    "not an object": b"data: [1,2]\n\n" + DONE,
    "no DONE (cut)": b"".join(_msg(_chunk("a", c)) for c in (1, 2)),
    "only DONE": DONE,
    "extra blank lines": _msg(_chunk("a", 1)) + b"\n\n" + _msg(_chunk("b", 2, "stop")) + DONE,
    "tool-call deltas": _msg(
        {
            "id": "x",
            "choices": [
                {
                    "index": 0,
                    "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]},
                    "finish_reason": None,
                }
            ],
        }
    )
    + _msg(_chunk("a", chat=True, fin="tool_calls"))
    + DONE,
    "finish_reason on an earlier chunk, not the last": _msg(_chunk("a", 1, "stop"))
    + _msg(_chunk("b", 2))
    + _msg(_chunk("c", 3))
    + DONE,
    "finish_reason on an earlier chunk, then usage only": _msg(_chunk("a", 1, "stop"))
    + _msg(_chunk("b", 2))
    + _msg(USAGE_ONLY)
    + DONE,
    "finish_reason on the last chunk, then usage only": _msg(_chunk("a", 1))
    + _msg(_chunk("b", 2, "length"))
    + _msg(USAGE_ONLY)
    + DONE,
    "finish_reason not a string on an earlier chunk": _msg(_chunk("a", 1, 5))
    + _msg(_chunk("b", 2, "stop"))
    + DONE,
    "cumulative counts that skip and repeat": b"".join(_msg(_chunk("a", c)) for c in (2, 2, 5, 4))
    + DONE,
    "cumulative count with a leading zero": b"".join(_msg(_chunk("a", c)) for c in (1, 2)).replace(
        b'"completion_tokens":2', b'"completion_tokens":02'
    )
    + DONE,
}


@pytest.mark.parametrize("name", list(EDGE_CASES))
def test_fast_path_equals_json_on_edge_cases(scan: Scan, name: str) -> None:
    assert_same(scan, EDGE_CASES[name])


# -- the C scanner against the Python one on mutated real segments ------------------------------
# Bytes and fragments inserted or written over: the keys, digits, separators and message
# boundaries that every rule of the scan counts, and a count too long for the C code.
PIECES = [
    *(bytes([b]) for b in b'"\n\r {}[],:\\019a'),
    b"\n\n",
    b"data: {",
    b"}\n\ndata: {",
    b"data: [DONE]\n\n",
    b'"usage"',
    b'"usage":{',
    b'"usage":null',
    b'"choices":[{',
    b'"choices":[]',
    b'"finish_reason":',
    b'"finish_reason":"',
    b'"finish_reason":null',
    b'"completion_tokens":',
    b'"prompt_tokens":',
    b'"error"',
    b'"text":"',
    b'"text":""',
    b'"delta":{',
    b'"content":"',
    b'"content":""',
    b'"reasoning',
    b"null",
    b"007",
    b"12345678901234567890123",
]


# A key's tail written after a quote overlaps the key: `"text":"text":"` holds one
# `"text":"` for bytes.count, which the scan's counts follow (non-overlapping).
OVERLAPS = [b'usage"', b'usage":null', b'text":"', b'content":"', b'finish_reason":"']


def _overlapped(body: bytes) -> list[bytes]:
    """``body`` with each of OVERLAPS inserted after each of its quotes, one at a time."""
    quotes = [i + 1 for i, b in enumerate(body) if b == ord('"')]
    return [body[:i] + piece + body[i:] for i in quotes for piece in OVERLAPS]


def _mutants(body: bytes, rng: random.Random, count: int) -> list[bytes]:
    """``count`` copies of ``body`` with 1-3 deletions, insertions or overwrites each, most
    of them next to a quote, newline, digit or separator."""
    hot = [i for i, b in enumerate(body) if b in b'"\n:,{}[]0123456789']
    out = []
    for _ in range(count):
        m = bytearray(body)
        for _ in range(rng.randint(1, 3)):
            if rng.random() < 0.8:
                pos = rng.choice(hot) + rng.randint(-2, 2)
            else:
                pos = rng.randrange(len(m) + 1)
            pos = max(0, min(len(m), pos))
            piece = rng.choice(PIECES)
            op = rng.random()
            if op < 0.3:
                del m[pos : pos + rng.randint(1, 4)]
            elif op < 0.65:
                m[pos:pos] = piece
            else:
                m[pos : pos + len(piece)] = piece
        out.append(bytes(m))
    return out


def _effects(fn: Scan, seg: bytes, assigned: int, prior: int) -> tuple[Any, ...]:
    """The verdict of ``fn`` on ``seg`` and everything it did to a request part-way through
    (``prior`` chunks already counted, ``assigned`` tokens attributed to them)."""
    res, st = RequestResult(0, "r", None, 4, 8), _StreamState()
    res.chunk_t.extend([-1.0] * prior)
    res.chunk_tokens.extend([1] * prior)
    st.assigned = assigned
    try:
        verdict: Any = fn(seg, 7.0, res, st)
    except Exception as exc:  # the same failure, if any, from both
        verdict = type(exc)
    return (
        verdict,
        res.chunk_t,
        res.chunk_tokens,
        st.text_chunks,
        st.assigned,
        st.usage_counted,
        st.finished_choices,
        st.final_completion,
        st.prompt_tokens,
        st.done,
    )


async def _record_all() -> list[bytes]:
    out = []
    async with embedded(policy="vllm") as url:
        for chat in (False, True):
            path = "/v1/chat/completions" if chat else "/v1/completions"
            for usage in ("continuous", "final", "none"):
                out.append(await _record(url, path, _body(chat, 6, usage), f"m-{chat}-{usage}"))
    return out


@pytest.mark.skipif(not fastscan.HAVE_C, reason=NOT_BUILT)
def test_c_scan_equals_python_scan_on_mutated_segments() -> None:
    # (300 tokens: more counts than the C code holds on its stack.)
    bodies = [*asyncio.run(_record_all()), _bench_body(12), _bench_body(300), *EDGE_CASES.values()]
    rng = random.Random(18)
    verdicts: dict[Any, int] = {}
    for body in bodies:
        for mutant in [body, *_mutants(body, rng, 250)]:
            seg, _ = split_segment(mutant[: rng.randint(len(mutant) // 2, len(mutant))])
            if not seg:
                continue
            assigned, prior = rng.choice([(0, 0), (0, 0), (2, 2), (3, 1), (40, 5)])
            py = _effects(fastscan.scan_openai_py, seg, assigned, prior)
            c = _effects(fastscan.scan_openai_c, seg, assigned, prior)
            assert c == py, seg
            verdicts[py[0]] = verdicts.get(py[0], 0) + 1
    # Both verdicts occur many times (the mutations do not only break the shape).
    assert verdicts.get(True, 0) > 500 and verdicts.get(False, 0) > 500, verdicts
    for body in bodies[:6]:  # one short stream of each kind from the built-in server
        for mutant in _overlapped(body):
            seg, _ = split_segment(mutant)
            py = _effects(fastscan.scan_openai_py, seg, 0, 0)
            assert _effects(fastscan.scan_openai_c, seg, 0, 0) == py, seg


@pytest.mark.skipif(not fastscan.HAVE_C, reason=NOT_BUILT)
def test_c_scan_hands_counts_beyond_64_bits_to_python() -> None:
    body = b"".join(_msg(_chunk("a", c)) for c in (1, 2)) + DONE
    big = body.replace(b'"completion_tokens":2', b'"completion_tokens":123456789012345678901')
    seg, _ = split_segment(big)
    assert fastscan._sse_scan.scan(seg, 0) is None  # the C code declines to decide
    py = _effects(fastscan.scan_openai_py, seg, 0, 0)
    assert py[0] is True and py[7] == 123456789012345678901
    assert _effects(fastscan.scan_openai_c, seg, 0, 0) == py


def test_counts_past_the_int_digit_limit_fail_as_bad_payload(scan: Scan) -> None:
    big = b"9" * (sys.get_int_max_str_digits() or 4300) + b"9"
    cut = b"".join(_msg(_chunk("a", c)) for c in (1, 2)) + DONE
    final = _msg(_chunk("a")) + _msg(USAGE_ONLY) + DONE
    for body in (
        cut.replace(b'"prompt_tokens":5', b'"prompt_tokens":' + big),
        final.replace(b'"completion_tokens":4', b'"completion_tokens":' + big),
    ):
        assert_same(scan, body)
        assert "invalid JSON" in _reference([body])["error"]


# -- the C scan at its 16-byte blocks and at the buffer's last byte ------------------------------
@functools.cache  # one mapping for the process, never unmapped: its objects may outlive a test
def _page_end_factory() -> Callable[[bytes], bytes]:
    """A maker of ``bytes`` objects whose last byte is the last readable one before a
    PROT_NONE page. Every ordinary bytes object has a NUL and allocator slack after its data,
    so a C read 1-16 bytes past the end goes unseen there; here it faults. CPython's own bytes
    methods read that NUL, so these objects go to the C ``scan`` only."""
    if sys.platform != "linux" or sys.implementation.name != "cpython":
        pytest.skip("builds CPython bytes objects by hand in an mmap'd page (Linux CPython)")
    hdr = bytes.__basicsize__ - 1  # ob_refcnt, ob_type, ob_size, ob_shash; then the data
    assert hdr == struct.calcsize("qPqq")
    page, size = mmap.PAGESIZE, 16 * mmap.PAGESIZE
    region = mmap.mmap(-1, size + page)
    base = ctypes.addressof(ctypes.c_char.from_buffer(region))
    mprotect = ctypes.CDLL(None, use_errno=True).mprotect
    mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    assert mprotect(base + size, page, 0) == 0, ctypes.get_errno()  # PROT_NONE

    def make(data: bytes) -> bytes:
        assert len(data) + hdr <= size
        start = base + size - len(data) - hdr  # a refcount that never reaches 0: never freed
        ctypes.memmove(start, struct.pack("qPqq", 1 << 40, id(bytes), len(data), -1), hdr)
        ctypes.memmove(start + hdr, data, len(data))
        obj = ctypes.cast(start, ctypes.py_object).value
        assert type(obj) is bytes and len(obj) == len(data)
        return obj

    make.region = region  # type: ignore[attr-defined]  # (the cache keeps it mapped)
    return make


def _block_cases(rng: random.Random) -> list[bytes]:
    """Segments whose keys fall at every offset of the C scan's 16-byte blocks (an id padded
    0-15 bytes) and in the last bytes before the closing blank line or the ``[DONE]`` it
    trims (whole keys and keys cut one byte short), and short framed segments of 10-64 bytes."""
    keys = [p for p in PIECES if len(p) > 1]
    keys += [k[:-1] for k in keys if len(k) > 2]
    out = []
    for pad in range(16):
        for usage in ("continuous", "final", "none"):
            for chat in (False, True):
                cum = (1, 2) if usage == "continuous" else (None, None)
                body = _msg(_chunk("a", cum[0], chat=chat, id="x" * pad)) + _msg(
                    _chunk("b", cum[1], "stop", chat=chat)
                )
                if usage == "final":
                    body += _msg(USAGE_ONLY)
                for key in rng.sample(keys, 2):
                    for pos in range(len(body) - 24, len(body) - 2):
                        spliced = body[:pos] + key + body[pos:]
                        out += [spliced, spliced + DONE]
    for total in range(10, 65):
        mid = total - 10
        for key in rng.sample(keys, 4):
            if len(key) <= mid:
                for pos in {0, mid - len(key), rng.randint(0, mid - len(key))}:
                    fill = bytes(rng.choice(b'x":,{}1') for _ in range(mid - len(key)))
                    out.append(b"data: {" + fill[:pos] + key + fill[pos:] + b"}\n\n")
        out.append(bytes(rng.getrandbits(8) for _ in range(total - 10)))
    return out


@pytest.mark.skipif(not fastscan.HAVE_C, reason=NOT_BUILT)
def test_c_scan_at_block_offsets_and_the_buffers_last_byte() -> None:
    page_end = _page_end_factory()
    rng = random.Random(16)
    verdicts: dict[Any, int] = {}
    for seg in _block_cases(rng):
        assigned, prior = rng.choice([(0, 0), (1, 1), (40, 5)])
        py = _effects(fastscan.scan_openai_py, seg, assigned, prior)
        assert _effects(fastscan.scan_openai_c, seg, assigned, prior) == py, seg
        raw = fastscan._sse_scan.scan(seg, assigned)
        assert fastscan._sse_scan.scan(page_end(seg), assigned) == raw, seg
        verdicts[py[0]] = verdicts.get(py[0], 0) + 1
    assert verdicts.get(True, 0) > 200 and verdicts.get(False, 0) > 200, verdicts


def test_pure_scan_switch(fresh_python) -> None:
    """``HARNESS_PURE_SCAN=1`` selects the Python scan; otherwise the C one where built."""
    code = "from harness.loadgen import fastscan as f; print(f.scan_openai.__name__)"
    for value, want in (("1", "scan_openai_py"), ("0", None)):
        (out,) = fresh_python(code, HARNESS_PURE_SCAN=value)
        assert out == (want or ("scan_openai_c" if fastscan.HAVE_C else "scan_openai_py"))
