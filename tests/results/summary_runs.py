"""Two seeded synthetic run directories whose summary.json is pinned in
``summary_golden.json`` (values produced by the pandas summary before the compact chunk path of
issue 13; the test checks the new path gives the same numbers, bit for bit).

- ``sim``: a simulator-shaped run: one token per chunk, chunk rows in global time order
  (requests interleaved), cancelled requests with partial output, rejected ones with none, a
  chunk of a request the run does not know, two tiers with SLOs, engine samples.
- ``live``: a replay-shaped run: each request's chunks written at once (contiguous groups, not in
  request order), multi-token chunks, failed requests whose chunks are split around other
  requests' (so only the successful rows are contiguous), a warm-up and goodput SLOs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from harness.results import schema
from harness.results.rundir import RunWriter

TIERS = [
    {"name": "paid", "share": 0.3, "ttft_slo_s": 0.4, "tbt_slo_s": 0.06, "priority": 0},
    {"name": "free", "share": 0.7, "ttft_slo_s": 2.0, "tbt_slo_s": 0.2, "priority": 1},
]


def _requests_table(rows: list[dict[str, Any]]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=schema.REQUESTS)


def _samples(rng: np.random.Generator, end: float) -> pa.Table:
    t = np.sort(rng.uniform(0, end, 300))
    return pa.table(
        {
            "t_s": t,
            "source": ["engine"] * t.size,
            "num_steps": np.ones(t.size, dtype=np.int64),
            "kv_usage": rng.uniform(0, 1, t.size),
            "num_waiting": rng.integers(0, 40, t.size),
            "num_running": rng.integers(0, 20, t.size),
            "preemptions_total": np.cumsum(rng.integers(0, 2, t.size)),
        }
    )


def sim_run(run_dir: Path, n: int = 400, seed: int = 1, unknown: bool = True) -> Path:
    rng = np.random.default_rng(seed)
    arr = np.cumsum(rng.exponential(1 / 20.0, n))
    tiers = np.where(rng.uniform(size=n) < 0.3, "paid", "free")
    fate = rng.choice(3, size=n, p=[0.88, 0.07, 0.05])  # 0 done, 1 cancelled, 2 rejected
    rows, creq, ct = [], [], []
    for i in range(n):
        out_len = int(rng.integers(1, 60))
        k = 0 if fate[i] == 2 else (out_len if fate[i] == 0 else int(rng.integers(1, out_len + 1)))
        gaps = rng.exponential(0.03, k) + np.where(rng.uniform(size=k) < 0.02, 0.5, 0.0)
        gaps[:1] = rng.exponential(0.3, min(k, 1))
        t = arr[i] + np.cumsum(gaps)
        creq += [i] * k
        ct += t.tolist()
        ok = fate[i] == 0
        rows.append(
            {
                "req": i,
                "request_id": f"r{i}",
                "tier": str(tiers[i]),
                "prompt_len": int(rng.integers(1, 500)),
                "output_len": out_len,
                "prompt_tokens": None,
                "output_tokens": k,
                "target_s": arr[i],
                "arrival_s": arr[i],
                "send_s": arr[i],
                "first_chunk_s": float(t[0]) if k else None,
                "last_chunk_s": float(t[-1]) if k else None,
                "num_chunks": k,
                "success": bool(ok),
                "error_kind": None if ok else ("cancelled" if fate[i] == 1 else "rejected"),
            }
        )
    if unknown:  # a chunk of a request the run does not know
        creq.append(n + 5)
        ct.append(float(arr[-1]))
    creq_a, ct_a = np.asarray(creq), np.asarray(ct)
    order = np.lexsort((creq_a, ct_a))  # global time order, requests interleaved
    creq_a, ct_a = creq_a[order], ct_a[order]
    end = float(ct_a.max())
    meta = {
        "run_id": "golden-sim",
        "created_unix": 1_700_000_000.0,
        "policy": "vllm",
        "rate": 20.0,
        "num_requests": n,
        "duration_s": end,
        "tiers": TIERS,
    }
    with RunWriter(run_dir, meta, flush_rows=5_000) as w:
        w.add_requests_table(_requests_table(rows))
        for sl in np.array_split(np.arange(creq_a.size), 4):
            w.add_chunks_table(
                pa.table(
                    {
                        "req": creq_a[sl],
                        "t_s": ct_a[sl],
                        "tokens": np.ones(sl.size, dtype=np.int32),
                    }
                )
            )
        w.add_samples_table(_samples(rng, end))
    return run_dir


def live_run(run_dir: Path, n: int = 300, seed: int = 2) -> Path:
    rng = np.random.default_rng(seed)
    arr = np.sort(rng.uniform(0, 30, n))
    tiers = np.where(rng.uniform(size=n) < 0.3, "paid", "free")
    failed = rng.uniform(size=n) < 0.1
    rows, groups = [], []
    for i in range(n):
        k = int(rng.integers(1, 40))
        send = arr[i] + rng.exponential(0.002)
        t = send + np.cumsum(np.r_[rng.exponential(0.4), rng.exponential(0.05, k - 1)])
        tok = rng.integers(1, 5, k)
        groups.append((float(t[-1]), i, t, tok))
        rows.append(
            {
                "req": i,
                "request_id": f"r{i}",
                "tier": str(tiers[i]),
                "prompt_len": int(rng.integers(1, 500)),
                "output_len": 64,
                "prompt_tokens": int(rng.integers(1, 500)),
                "output_tokens": None if rng.uniform() < 0.1 else int(tok.sum()),
                "target_s": arr[i],
                "arrival_s": arr[i] + rng.exponential(0.001),
                "send_s": send,
                "first_chunk_s": float(t[0]),
                "last_chunk_s": float(t[-1]),
                "num_chunks": k,
                "success": not failed[i],
                "error_kind": "stream_cut" if failed[i] else None,
                "http_status": 200,
            }
        )
    groups.sort(key=lambda g: g[0])  # written when each request ends: not in request order
    # A failed request's chunks split around the next request's (only failures break runs).
    split = [g for g in groups if failed[g[1]] and g[2].size >= 2][:3]
    meta = {
        "run_id": "golden-live",
        "created_unix": 1_700_000_100.0,
        "model": "m",
        "rate": 10.0,
        "num_requests": n,
        "tiers": TIERS,
        "goodput": {"ttft": 600.0, "tpot": 80.0},
        "warmup": {"requests": 25},
    }
    with RunWriter(run_dir, meta, flush_rows=2_000) as w:
        w.add_requests_table(_requests_table(rows))
        held: list[tuple[int, np.ndarray, np.ndarray]] = []
        for _, i, t, tok in groups:
            if any(i == s[1] for s in split):
                h = t.size // 2
                w.add_chunks(i, t[:h].tolist(), tok[:h].tolist())
                held.append((i, t[h:], tok[h:]))
                continue
            w.add_chunks(i, t.tolist(), tok.tolist())
            while held:
                j, tj, kj = held.pop()
                w.add_chunks(j, tj.tolist(), kj.tolist())
        for j, tj, kj in held:
            w.add_chunks(j, tj.tolist(), kj.tolist())
        w.add_samples_table(_samples(rng, float(arr[-1]) + 5))
    return run_dir


RUNS = {"sim": sim_run, "live": live_run}


def make_golden(out: Path) -> None:
    """Regenerate ``summary_golden.json`` (only when the summary's numbers change on purpose)."""
    import json
    import tempfile

    from harness.results.summary import write_summary

    golden = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, build in RUNS.items():
            golden[name] = write_summary(build(Path(tmp) / name))
    out.write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    make_golden(Path(__file__).with_name("summary_golden.json"))
