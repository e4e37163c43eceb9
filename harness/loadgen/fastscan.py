"""Count an OpenAI-style stream's chunks and tokens from the raw SSE bytes, without JSON.

Why: JSON-decoding every chunk and walking it in Python was ~55% of the client's CPU (issue
18: 0.9-1.2 CPU-ms per 100-token request). ``vllm bench serve``, SGLang's ``bench_serving``
and GuideLLM all ``json.loads`` each chunk (anchors-harness.md §2.1); this module does less:
a handful of C-level ``bytes.count``/``re.findall`` passes per *network read*, not per chunk.

Why byte patterns are safe here: inside a JSON string a ``"`` is always escaped (``\\"``) and
a raw newline cannot occur, so a pattern that starts with an unescaped ``"`` such as
``"choices":[{`` can only be JSON structure (a key), never a model's text; and with every raw
``\\n`` of the segment being a message boundary, each message is exactly one ``data: {...}``
line. A segment is scanned only when it has the shape every OpenAI-compatible server we know
writes (vLLM, SGLang, the built-in server, compact separators); each rule below is checked by
counting, and ANY deviation (comments, ``\\r``, spaces after ``:``, an ``error`` key,
multi-choice chunks, ``[DONE]`` not last, mixed usage, chunks whose text presence differs)
returns False and the caller JSON-decodes that segment exactly as before. The results are the
same as :func:`harness.loadgen.client.interpret_openai`'s (rules 1-2 of the client module),
which ``tests/loadgen/test_fastscan.py`` checks on real streams, split at every byte.

What it does not do: check the JSON syntax of a message that has every expected key. A
server writing such a broken message (rather than a truncated one, which fails the shape
test) would have it counted instead of failed as ``bad_payload``.

Two implementations of one decision: :func:`scan_openai_py` (the rules above, ~10 C-level
passes over the segment) and :func:`scan_openai_c`, which takes the same counts in ONE pass
in the optional C extension ``harness.loadgen._sse_scan`` (``_sse_scan.c``, built by
``setup.py`` at install where a C compiler is present) and applies what it returns here: on
a 100-token vLLM-dialect response read at once (24.8 KB), ~150 us per scan in Python, ~8.5 us
in C, on this project's 2-core machine. A count too long for the C code's 64-bit integers
is handed to the Python scan. :data:`scan_openai`, the entry the client calls, is the C one
when the extension imported and the environment variable ``HARNESS_PURE_SCAN`` is not ``1``
(read at import; for tests and A/B benchmarks), else the Python one.
``tests/loadgen/test_fastscan.py`` runs its equivalence tests over both and compares them on
randomly mutated real segments.
"""

from __future__ import annotations

import json
import os
import re
from itertools import accumulate, repeat
from operator import sub
from typing import Any

import numpy as np

_DONE_MSG = b"data: [DONE]\n\n"
_COMPLETION = re.compile(rb'"completion_tokens":(\d+)[,}]')
_PROMPT = re.compile(rb'"prompt_tokens":(\d+)[,}]')


def split_segment(buf: bytes) -> tuple[bytes, bytes]:
    """(complete messages, rest): the cut after the last blank line, as the SSE decoder's."""
    end = buf.rfind(b"\n\n")
    if end < 0:
        return b"", buf
    end += 2
    if end == len(buf):
        return buf, b""
    return buf[:end], buf[end:]


def scan_openai_py(seg: bytes, t: float, res: Any, st: Any) -> bool:
    """Apply the complete SSE messages ``seg`` (one network read's, stamped ``t``) to the
    request result ``res`` and stream state ``st`` of :mod:`harness.loadgen.client`; return
    False, having changed nothing, when ``seg`` is not in the fast shape (module docstring)."""
    done = False
    if seg.endswith(_DONE_MSG):
        if len(seg) == len(_DONE_MSG):
            st.done = True
            return True
        seg = seg[: -len(_DONE_MSG)]
        done = True
    # Every message one `data: {...}` line: it starts and ends so, and the only raw newlines
    # are the message boundaries. (Long patterns: bytes.count skips fast over them; the
    # one-byte newline count goes through numpy, ~10x faster than bytes.count.)
    n = seg.count(b"}\n\ndata: {") + 1
    if not seg.startswith(b"data: {") or not seg.endswith(b"}\n\n") or _newlines(seg) != 2 * n:
        return False
    last = seg.rfind(b"\ndata: {") + 1  # where the last message starts
    full = seg.count(b'"choices":[{')  # chunks: a non-empty choices list (vLLM's TTFT rule)
    empty = n - full  # the usage-only message, if any: `"choices":[]`, last
    if empty and (
        empty != 1
        or seg.count(b'"choices":[]', last) != 1
        or b'"error"' in seg[last:]  # an error message (a chunk's extra key is ignored)
    ):
        return False
    # One choice per chunk, each with a finish_reason that is null or a string (a space
    # after the colon, or any other value, is left to the JSON path).
    nf = seg.count(b'"finish_reason":')
    if nf != full:
        return False
    running = seg.count(b'"finish_reason":null')
    if running != nf and not (
        # The usual end: the one non-null finish_reason is the last chunk's, a string
        # (counted from there only, instead of over the whole segment: same verdict).
        (running == nf - 1 and seg.count(b'"finish_reason":"', _last_chunk(seg, last, empty)) == 1)
        or seg.count(b'"finish_reason":"') == nf - running
    ):
        return False
    # usage: an object (counted) or null (ignored, as interpret_openai does); nothing else.
    nu = seg.count(b'"usage":{')
    if nu != n:
        keys = seg.count(b'"usage"')
        if keys != nu and keys != nu + seg.count(b'"usage":null'):
            return False
    cts: list[bytes] = []
    prompt = final = -1
    if nu:
        cts = _COMPLETION.findall(seg)
        if len(cts) != nu:
            return False
        # The last usage's prompt_tokens wins, as in interpret_openai.
        at = seg.rfind(b'"prompt_tokens":')
        m = _PROMPT.match(seg, at) if at > seg.rfind(b'"usage":{') else None
        if m is None:
            return False
        try:  # a count past Python's int-string digit limit: json.loads fails it too
            prompt, final = int(m.group(1)), int(cts[-1])
        except ValueError:
            return False
    if nu == n and full:
        # Rule 1 (continuous usage stats): a chunk's tokens are the rise of the cumulative
        # count; the assigned total is the running maximum, as in interpret_openai.
        a = st.assigned
        if cts[:full] == _digits(a + 1, a + full + 1):  # one token per chunk: the usual case
            toks = [1] * full
            st.assigned = a + full
        else:
            try:  # (a leading zero is not JSON: the decoding path fails it)
                cum = json.loads(b"[" + b",".join(cts[:full]) + b"]")
            except ValueError:
                return False
            acc = list(accumulate(cum, max, initial=a))
            toks = list(map(sub, acc[1:], acc[:-1]))
            st.assigned = acc[-1]
        st.usage_counted = True
    elif nu == n or (nu == empty and (not nu or seg.rfind(b'"usage":{') > last)):
        # No usage on the chunks (at most on the final usage-only message): rule 2, one token
        # per chunk with text; scanned only when every chunk has non-empty text.
        if full and not _all_chunks_have_text(seg, full):
            return False
        start = len(res.chunk_t)
        st.text_chunks.extend(range(start, start + full))
        toks = [1] * full
        st.assigned += full
    else:
        return False
    if full:
        res.chunk_t.extend(repeat(t, full))
        res.chunk_tokens.extend(toks)
    if running != nf:
        st.finished_choices = True
    if nu:
        st.final_completion = final
        st.prompt_tokens = prompt
    if done:
        st.done = True
    return True


try:
    from harness.loadgen import _sse_scan
except ImportError:  # built without a compiler: the Python scan serves
    _sse_scan = None


def scan_openai_c(seg: bytes, t: float, res: Any, st: Any) -> bool:
    """:func:`scan_openai_py`'s decision and effects, the segment scanned once in C."""
    r = _sse_scan.scan(seg, st.assigned)
    if r is None:  # a count the C code leaves to Python (over 18 digits)
        return scan_openai_py(seg, t, res, st)
    if r is False:
        return False
    full, toks, assigned, finished, final, prompt, done = r
    if full:
        if assigned is None:  # rule 2: one token per text chunk
            start = len(res.chunk_t)
            st.text_chunks.extend(range(start, start + full))
            st.assigned += full
        else:  # rule 1: continuous usage stats
            st.assigned = assigned
            st.usage_counted = True
        res.chunk_t.extend(repeat(t, full))
        res.chunk_tokens.extend(repeat(1, full) if toks is None else toks)
    if finished:
        st.finished_choices = True
    if final is not None:
        st.final_completion = final
        st.prompt_tokens = prompt
    if done:
        st.done = True
    return True


HAVE_C = _sse_scan is not None
scan_openai = (
    scan_openai_c if HAVE_C and os.environ.get("HARNESS_PURE_SCAN") != "1" else scan_openai_py
)


def _last_chunk(seg: bytes, last: int, empty: int) -> int:
    """Where the last chunk starts: the last message, or the one before a usage-only one."""
    return seg.rfind(b"\ndata: {", 0, last - 1) + 1 if empty else last


_DIGITS: list[bytes] = []


def _digits(lo: int, hi: int) -> list[bytes]:
    """The decimal byte strings of ``lo..hi-1``, as JSON writes them (a leading zero, which
    JSON forbids anyway, or any other spelling then takes the decoding path): comparing
    bytes skips decoding the cumulative counts of the usual stream."""
    if hi > len(_DIGITS):
        _DIGITS.extend(str(i).encode() for i in range(len(_DIGITS), max(hi, 2 * len(_DIGITS))))
    return _DIGITS[lo:hi]


def _newlines(seg: bytes) -> int:
    # numpy's compare-and-count runs ~10x faster than bytes.count(b"\n") on a whole response
    # but costs a few microseconds to set up: small segments (one streamed chunk) count here.
    if len(seg) < 4096:
        return seg.count(b"\n")
    return int(np.count_nonzero(np.frombuffer(seg, np.uint8) == 10))


def _all_chunks_have_text(seg: bytes, full: int) -> bool:
    """Every chunk carries non-empty text: completions ``text``, or chat ``delta.content``
    (no reasoning fields, whose presence rule 2 also counts)."""
    if b'"delta"' not in seg:
        return seg.count(b'"text":"') == full and b'"text":""' not in seg
    return (
        seg.count(b'"delta":{') == full
        and b'"reasoning' not in seg
        and seg.count(b'"content":"') == full
        and b'"content":""' not in seg
    )
