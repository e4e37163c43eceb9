"""A decomposed cluster simulated in worker processes is the serial one: same results, same
token-time stream in the same order, same errors, no worker left behind (issue 16, speed)."""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
from typing import Any

import numpy as np
import pandas as pd
import pytest

import harness.engine.cluster_split as cs
from harness.engine.cluster_split import simulate_split, split_plan, split_workers
from harness.engine.simresult import SimulationStalled
from harness.engine.simulate import simulate
from harness.policies.base import Plan
from harness.policies.vllm_v1 import VLLMV1Policy
from harness.routers import make_router
from harness.workload.tiers import default_tiers
from harness.workload.trace import Trace

from .conftest import engines

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork workers")


def _trace(n: int, rate: float, seed: int = 0) -> Trace:
    rng = np.random.default_rng(seed)
    tl = default_tiers()
    df = pd.DataFrame(
        {
            "request_id": [f"r{i}" for i in range(n)],
            "arrival_s": np.cumsum(rng.exponential(1.0 / rate, n)),
            "prompt_len": rng.integers(1, 600, n),
            "output_len": rng.integers(1, 300, n),
            "tier": [tl[i % len(tl)].name for i in range(n)],
        }
    )
    return Trace.from_frame(df, tl, meta={"source": "test"})


@pytest.fixture
def small_flushes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Engines flush token times every 1000 rows: several flushes per engine (the workers
    inherit the patch through fork)."""
    monkeypatch.setattr(cs, "simulate", functools.partial(simulate, chunk_flush_rows=1000))


def _run(trace: Trace, specs: list, processes: int, **kw: Any) -> tuple[Any, list, list]:
    plan = split_plan(trace, specs, make_router("round-robin"), None)
    assert plan is not None
    stream: list[tuple[np.ndarray, np.ndarray]] = []
    merged, parts = simulate_split(
        trace,
        specs,
        plan,
        chunk_sink=lambda r, t: stream.append((r.copy(), t.copy())),
        processes=processes,
        **kw,
    )
    return merged, parts, stream


def _same_result(a: Any, b: Any) -> None:
    for f in ("first_s", "last_s", "out_tokens", "status", "preemptions"):
        x, y = getattr(a, f), getattr(b, f)
        assert x.dtype == y.dtype, f
        np.testing.assert_array_equal(x, y, err_msg=f)
    assert a.errors == b.errors
    assert (a.end_s, a.num_steps, a.num_calls, a.policy) == (
        b.end_s,
        b.num_steps,
        b.num_calls,
        b.policy,
    )
    assert a.counters == b.counters
    assert {k: list(v) for k, v in a.samples.items()} == {k: list(v) for k, v in b.samples.items()}


def _same_stream(a: list, b: list) -> None:
    assert len(a) == len(b)
    for (r1, t1), (r2, t2) in zip(a, b, strict=True):
        assert (r1.dtype, t1.dtype) == (r2.dtype, t2.dtype)
        np.testing.assert_array_equal(r1, r2)
        np.testing.assert_array_equal(t1, t2)


def _children() -> list[int]:
    """Live child processes of this process (zombies included)."""
    me, out = os.getpid(), []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == me:
                out.append(int(d))
    return out


@pytest.mark.parametrize(
    ("kv_tokens", "stop_at_s"),
    [(40_000, None), (2_000, None), (2_000, 6.0)],
    ids=["plain", "preempting", "stop-at"],
)
def test_workers_give_the_serial_results_and_stream(
    small_flushes: None, monkeypatch: pytest.MonkeyPatch, kv_tokens: int, stop_at_s: float | None
) -> None:
    trace = _trace(1200, 60.0, seed=3)
    serial = _run(trace, engines(5, kv_tokens=kv_tokens), 1, stop_at_s=stop_at_s)
    m, parts, stream = serial
    assert len(stream) > 5  # several flushes per engine, so order is tested
    if kv_tokens == 2_000:
        assert m.counters["preemptions_total"] > 0
    if stop_at_s is not None:
        assert (m.status == 0).any() and m.end_s <= stop_at_s + 1.0
    taken: list[int] = []
    monkeypatch.setattr(cs._Workers, "result", _spy(cs._Workers.result, taken))
    for processes in (2, 3):
        got = _run(trace, engines(5, kv_tokens=kv_tokens), processes, stop_at_s=stop_at_s)
        _same_result(m, got[0])
        for p, q in zip(parts, got[1], strict=True):
            _same_result(p, q)
        _same_stream(stream, got[2])
    assert taken == [0, 1, 2, 3, 4] * 2  # the workers simulated every engine
    assert _children() == []


def _spy(f: Any, log: list[int]) -> Any:
    def result(self: Any, i: int, sink: Any) -> Any:
        log.append(i)
        return f(self, i, sink)

    return result


def test_kept_token_times_and_idle_engines_match() -> None:
    """No sink (token times kept in the result), and an engine routed no calls."""
    trace = _trace(300, 30.0, seed=1)
    plan = np.where(np.arange(300) % 2 == 0, 0, 3)  # engines 1 and 2 idle
    a, pa = simulate_split(trace, engines(4), plan, processes=1)
    b, pb = simulate_split(trace, engines(4), plan, processes=2)
    _same_result(a, b)
    np.testing.assert_array_equal(a.chunk_req, b.chunk_req)
    np.testing.assert_array_equal(a.chunk_t, b.chunk_t)
    assert [p.num_steps for p in pa] == [p.num_steps for p in pb]
    assert pb[1].num_steps == 0 and pb[2].num_steps == 0


class _FailsAt(VLLMV1Policy):
    """vLLM's policy on the engine core (no budget rule) that raises ``exc`` at its
    ``at``-th plan, or never schedules (a stall) when ``exc`` is None."""

    def __init__(self, at: int, exc: Exception | None) -> None:
        super().__init__()
        self._at, self._exc, self._calls = at, exc, 0

    def budget_rule(self) -> None:
        return None

    def schedule(self, view: Any) -> Plan:
        self._calls += 1
        if self._calls >= self._at:
            if self._exc is None:
                return Plan()
            raise self._exc
        return super().schedule(view)


@pytest.mark.parametrize(
    ("exc", "kind", "match"),
    [
        (ValueError("bad plan at step 400"), ValueError, "bad plan at step 400"),
        (None, SimulationStalled, "scheduled nothing"),
    ],
    ids=["value-error", "stalled"],
)
def test_a_failing_worker_raises_the_serial_error(
    small_flushes: None, exc: Exception | None, kind: type, match: str
) -> None:
    """Engine 2 fails: the sink gets what the serial path gave it before the error (engines
    0 and 1, then engine 2's flushes before the failure), and the same exception."""
    trace = _trace(1500, 80.0, seed=2)
    got = {}
    for processes in (1, 2):
        specs = engines(4, kv_tokens=20_000)
        specs[2] = dataclasses.replace(specs[2], policy=_FailsAt(400, exc))
        stream: list = []
        plan = np.arange(len(trace)) % 4
        with pytest.raises(kind, match=match):
            simulate_split(
                trace,
                specs,
                plan,
                chunk_sink=lambda r, t, s=stream: s.append((r.copy(), t.copy())),
                processes=processes,
            )
        got[processes] = stream
        assert _children() == []
    assert any((r % 4 == 2).all() for r, _ in got[1])  # engine 2's flushes before the error
    _same_stream(got[1], got[2])


def test_an_error_in_the_parent_stops_the_workers(small_flushes: None) -> None:
    """Ctrl-C (or any error) while the parent writes token times: it propagates, and no
    worker is left running."""
    trace = _trace(1200, 60.0, seed=4)
    plan = np.arange(len(trace)) % 4
    calls = []

    def sink(r: np.ndarray, t: np.ndarray) -> None:
        calls.append(len(r))
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        simulate_split(trace, engines(4), plan, chunk_sink=sink, processes=2)
    assert calls == [calls[0]]
    assert _children() == []


def test_worker_count() -> None:
    cores = len(os.sched_getaffinity(0))
    assert split_workers(None, 8) == min(cores, 8)
    assert split_workers(None, 1) == 1
    assert split_workers(3, 2) == 2
    assert split_workers(1, 8) == 1
    with pytest.raises(ValueError, match="processes must be >= 1"):
        split_workers(0, 4)


def test_balance_deals_engines_by_rows() -> None:
    rows = [np.arange(k) for k in (10, 10, 40, 0, 10, 10)]
    assert cs._balance(rows, 2) == [[2], [0, 1, 4, 5]]
    assert cs._balance([np.arange(5)] * 8, 2) == [[0, 2, 4, 6], [1, 3, 5, 7]]
