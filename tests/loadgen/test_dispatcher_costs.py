"""The dispatcher's per-request cost cuts (issue 18) change nothing it writes or sends:
chunk_column writes the chunks table's columns exactly as np.fromiter over every request's
list would (the uniform lists of one-read responses take a shortcut), and a body reused from
the previous request is the body the dialect would build."""

from __future__ import annotations

import os
import random
import sys
import threading
from itertools import chain, repeat

import numpy as np
import pytest

from harness.loadgen.client import RequestResult, encode_body
from harness.loadgen.dialects import Endpoint, get_dialect
from harness.loadgen.dispatcher import Dispatcher, Job, chunk_column
from harness.workload.tiers import Tier


def _reference(lists: list[list], dtype: type[np.generic]) -> np.ndarray:
    total = sum(len(x) for x in lists)
    return np.fromiter(chain.from_iterable(lists), dtype, total)


def _random_lists(rng: random.Random, values: list) -> list[list]:
    out = []
    for _ in range(rng.randint(0, 8)):
        k = rng.randint(0, 6)
        if rng.random() < 0.5:
            out.append([rng.choice(values)] * k)  # one read: one value repeated
        else:
            out.append([rng.choice(values) for _ in range(k)])
    return out


@pytest.mark.parametrize("seed", range(300))
def test_same_bytes_as_fromiter(seed: int) -> None:
    rng = random.Random(seed)
    floats = [1.5, 2.0, 2, 0.0, -0.0, float("nan"), rng.random(), True]
    ints = [0, 1, 1, 2, 7, True]
    for values, dtype in ((floats, np.float64), (ints, np.int32)):
        lists = _random_lists(rng, values)
        counts = [len(x) for x in lists]
        got = chunk_column(lists, counts, dtype)
        want = _reference(lists, dtype)
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), lists


def test_chunks_table_of_one_read_and_streamed_responses() -> None:
    results = []
    for i in range(50):
        r = RequestResult(i, f"r{i}", None, 4, 8, target=1.0, arrival=1.0, send=1.0)
        if i % 3:
            r.chunk_t.extend(repeat(2.0 + i, 8))  # the whole response in one read
            r.chunk_tokens.extend([1] * 8)
        else:
            r.chunk_t.extend(2.0 + i + k / 10 for k in range(8))  # read chunk by chunk
            r.chunk_tokens.extend([2, 0, 1, 1, 1, 1, 1, 1])
        results.append(r)
    d = Dispatcher.__new__(Dispatcher)
    d.t0 = 1.0
    _, chunks = d._tables(results)
    assert chunks is not None
    assert chunks["t_s"].to_pylist() == [t - 1.0 for r in results for t in r.chunk_t]
    assert chunks["tokens"].to_pylist() == [k for r in results for k in r.chunk_tokens]
    assert chunks["req"].to_pylist() == [r.req for r in results for _ in r.chunk_t]


@pytest.mark.parametrize("endpoint", [Endpoint.COMPLETIONS, Endpoint.CHAT])
def test_reused_body_is_the_dialect_body(endpoint: Endpoint) -> None:
    tiers = {"gold": Tier("gold", 0.5, ttft_slo_s=0.5), "free": Tier("free", 0.5, priority=2)}
    d = Dispatcher.__new__(Dispatcher)
    d.dialect, d.endpoint, d.model, d.tiers = get_dialect("builtin"), endpoint, "m", tiers
    d.extra_body = {"temperature": 0}
    d._last_body = (None, b"")
    rng = random.Random(3)
    for i in range(400):
        job = Job(i, f"r{i}", 0.0, None, rng.choice([4, 5]), rng.choice([8, 9]),
                  rng.choice([None, "gold", "free"]))  # fmt: skip
        prompt = rng.choice(["a b", "c d", "".join(["a", " b"])])  # equal, not identical
        tier = tiers.get(job.tier) if job.tier is not None else None
        want = encode_body(
            d.dialect.body(endpoint, "m", prompt, job.prompt_len, job.output_len, tier,
                           d.extra_body)
        )  # fmt: skip
        assert d._body(prompt, job) == want


def test_switch_interval_is_short_during_dispatches_and_restored_after() -> None:
    import sys

    from harness.loadgen.dispatcher import SWITCH_INTERVAL_S, _short_switch

    before = sys.getswitchinterval()
    _short_switch(True)
    _short_switch(True)  # two dispatches at once in one process
    assert sys.getswitchinterval() == min(before, SWITCH_INTERVAL_S)
    _short_switch(False)
    assert sys.getswitchinterval() == min(before, SWITCH_INTERVAL_S)  # one still running
    _short_switch(False)
    assert sys.getswitchinterval() == before


@pytest.mark.skipif(not hasattr(os, "setpriority"), reason="thread priorities: Linux")
def test_flush_thread_runs_at_a_lower_os_priority() -> None:
    from harness.loadgen.dispatcher import WRITER_NICE, _writer_pool

    own = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    nice = (
        _writer_pool()
        .submit(lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        .result()
    )
    assert nice == min(19, own + WRITER_NICE)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork: POSIX")
def test_a_forked_child_gets_its_own_writer_thread() -> None:
    import multiprocessing as mp

    from harness.loadgen.dispatcher import _writer_pool

    _writer_pool().submit(int).result()  # the parent's thread exists
    ctx = mp.get_context("fork")
    p = ctx.Process(target=_child_writes)
    p.start()
    p.join(30)
    assert p.exitcode == 0


def _child_writes() -> None:
    from harness.loadgen.dispatcher import _writer_pool

    assert _writer_pool().submit(int, "7").result(timeout=10) == 7


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork: POSIX")
def test_a_child_forked_during_a_dispatch_gets_the_process_interval_back() -> None:
    import multiprocessing as mp

    from harness.loadgen.dispatcher import _short_switch

    before = sys.getswitchinterval()
    _short_switch(True)
    try:
        p = mp.get_context("fork").Process(target=_child_interval, args=(before,))
        p.start()
        p.join(30)
    finally:
        _short_switch(False)
    assert p.exitcode == 0
    assert sys.getswitchinterval() == before


def _child_interval(expected: float) -> None:
    from harness.loadgen.dispatcher import _short_switch

    assert sys.getswitchinterval() == expected  # none of the parent's dispatches runs here
    _short_switch(True)
    _short_switch(False)
    assert sys.getswitchinterval() == expected
