"""Fixtures for the results tests: build run directories from small literal frames or from a
seeded random "replay" (requests with multi-token chunks, failures, missing usage)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from harness.results.rundir import RunWriter

TIERS_META = [
    {"name": "paid", "share": 0.3, "ttft_slo_s": 0.2, "tbt_slo_s": 0.05, "priority": 0},
    {"name": "free", "share": 0.7, "ttft_slo_s": 1.0, "tbt_slo_s": 0.2, "priority": 1},
]


def _request_row(i: int, **kw: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "req": i,
        "request_id": f"r{i}",
        "tier": None,
        "prompt_len": 10,
        "output_len": 10,
        "prompt_tokens": 10,
        "output_tokens": None,
        "target_s": 0.0,
        "arrival_s": 0.0,
        "send_s": 0.0,
        "first_chunk_s": None,
        "last_chunk_s": None,
        "num_chunks": 0,
        "success": True,
        "error_kind": None,
        "error": None,
        "http_status": 200,
    }
    row.update(kw)
    return row


@pytest.fixture
def make_run(tmp_path: Path) -> Callable[..., Path]:
    """``make_run(requests=[dict...], chunks={req: [(t, tokens), ...]}, meta={...})`` writes a
    complete run directory and returns it. Request dicts only need the keys they care about;
    first/last chunk times and counts are filled from ``chunks``."""
    counter = iter(range(10_000))

    def build(
        requests: list[dict[str, Any]],
        chunks: dict[int, list[tuple[float, int]]] | None = None,
        meta: dict[str, Any] | None = None,
    ) -> Path:
        chunks = chunks or {}
        run_dir = tmp_path / f"run{next(counter)}"
        with RunWriter(run_dir, meta or {}) as w:
            for i, r in enumerate(requests):
                req = r.get("req", i)
                ch = chunks.get(req, [])
                extra: dict[str, Any] = {}
                if ch:
                    extra = {
                        "first_chunk_s": ch[0][0],
                        "last_chunk_s": ch[-1][0],
                        "num_chunks": len(ch),
                    }
                w.add_request(_request_row(req, **{**extra, **r}))
                if ch:
                    w.add_chunks(req, [c[0] for c in ch], [c[1] for c in ch])
        return run_dir

    return build


def random_replay(seed: int, n: int = 300) -> tuple[list[dict[str, Any]], dict[int, list]]:
    """A plausible replay: Poisson sends, per-request chunk streams with 1-3 tokens per chunk,
    ~10% failures (some with partial chunks: stream cut), some usage missing, some 1-token
    answers, two tiers."""
    rng = np.random.default_rng(seed)
    reqs: list[dict[str, Any]] = []
    chunks: dict[int, list[tuple[float, int]]] = {}
    t = 0.0
    for i in range(n):
        t += float(rng.exponential(0.02))
        lag = float(rng.exponential(0.0005))
        send = t + lag
        out_len = int(rng.choice([1, 2, 5, int(rng.integers(3, 80))]))
        times, toks = [], []
        clock = send + float(rng.gamma(2.0, 0.05))
        left = out_len
        while left > 0:
            k = int(min(left, rng.choice([1, 1, 1, 2, 3])))
            times.append(clock)
            toks.append(k)
            left -= k
            clock += float(rng.exponential(0.02)) * (20 if rng.random() < 0.01 else 1)
        fail = rng.random() < 0.1
        row: dict[str, Any] = {
            "req": i,
            "tier": "paid" if rng.random() < 0.3 else "free",
            "prompt_len": int(rng.integers(5, 500)),
            "output_len": out_len,
            "target_s": t,
            "arrival_s": send,
            "send_s": send,
        }
        row["prompt_tokens"] = row["prompt_len"] + int(rng.integers(0, 3))
        if fail:
            cut = int(rng.integers(0, len(times) + 1))
            times, toks = times[:cut], toks[:cut]
            row.update(
                success=False,
                error_kind=str(rng.choice(["http_status", "stream_cut", "timeout"])),
                error="boom",
                output_tokens=None,
            )
        else:
            row["output_tokens"] = None if rng.random() < 0.1 else sum(toks)
        reqs.append(row)
        if times:
            chunks[i] = list(zip(times, toks, strict=True))
    return reqs, chunks


@pytest.fixture
def replay() -> Callable[..., tuple[list[dict[str, Any]], dict[int, list]]]:
    """The :func:`random_replay` generator (fixtures keep tests free of conftest imports)."""
    return random_replay
