"""Per-step JSONL log of a vLLM engine's batches (env ``HARNESS_STEP_LOG``), for cost-model fits.

One line per executed step, keys::

    t_s            step start, host clock (s since the scheduler's origin)
    duration_s     schedule() entry to update_from_output() entry (scheduling + forward + sample)
    prefill_tokens tokens of requests that were not plain decodes
    decode_tokens  tokens of plain decodes (1 each)
    num_prefill_seqs, num_decode_seqs
    kv_tokens      sum over scheduled requests of their context length after the step
                   (the attention read volume a cost model may charge for)
    prefill_attn   Σ chunk·(context before + chunk/2) over prefill chunks (causal attention's
                   query-key work; the engine core's ``prefill_attn``, costmodel.ContextCostModel)
    batch_tokens   prefill_tokens + decode_tokens
    kv_used_blocks, num_running, num_waiting, preempted, admitted, finished (counts)

Each finished request adds one ``{"kind": "request", ...}`` line (``arrival_s``, vLLM's
API-server stamp; ``ready_s``, when the engine core's input thread handed it to the engine
loop, null when not stamped; ``engine_arrival_s``, when the loop took it in, between steps,
so ``arrival_s <= ready_s <= engine_arrival_s``; first and last token
times, token counts, tier): latencies as the engine saw them, free of HTTP and client-side
delays. Step lines carry ``"kind": "step"``. The first line, ``{"kind": "origin", "time_s":
...}``, is the origin's epoch time (``time.time()``), so records on other clocks can be aligned.

Written line-buffered so a killed server leaves every finished step on disk.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO, Any


class StepLog:
    """Append-only JSONL sink; ``None`` path means disabled (every call is a no-op)."""

    def __init__(self, path: str | Path | None) -> None:
        self._fh: IO[str] | None = None
        if path:
            p = Path(path)
            p.parent.mkdir(parents=True, exist_ok=True)
            self._fh = p.open("a", buffering=1)

    @property
    def enabled(self) -> bool:
        return self._fh is not None

    def write(self, row: dict[str, Any]) -> None:
        if self._fh is not None:
            self._fh.write(json.dumps(row, separators=(",", ":")) + "\n")

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def request_row(view: Any, end_s: float) -> dict[str, Any]:
    """The log line of a finished request (host-clock seconds)."""
    return {
        "kind": "request",
        "request_id": view.request_id,
        "tier": view.tier,
        "arrival_s": round(view.arrival_s, 6),
        "ready_s": getattr(view, "ready_s", None),
        "engine_arrival_s": view.engine_arrival_s,
        "first_token_s": view.first_token_s,
        "last_token_s": view.last_token_s,
        "end_s": round(end_s, 6),
        "prompt_tokens": view.num_prompt_tokens,
        "output_tokens": view.num_output_tokens,
        "num_preemptions": view.num_preemptions,
    }


def steps_only(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The step lines of a log (lines without ``kind`` are steps too)."""
    return [r for r in rows if r.get("kind", "step") == "step"]


def requests_only(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The finished-request lines of a log."""
    return [r for r in rows if r.get("kind") == "request"]


def log_origin(rows: list[dict[str, Any]]) -> float | None:
    """The epoch time (``time.time()``) that the log's seconds count from; None in logs
    written before the origin line."""
    for r in rows:
        if r.get("kind") == "origin":
            return float(r["time_s"])
    return None


def read_step_log(path: str | Path) -> list[dict[str, Any]]:
    """Read a step log back (blank or truncated trailing lines are skipped)."""
    rows: list[dict[str, Any]] = []
    for line in Path(path).read_text().splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


# A next step that starts within this of the previous step's end is back to back (the engine
# loop went straight on); a longer gap is idle time, which no step should be charged for.
BACK_TO_BACK_S = 5e-3


def step_log_samples(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Step-log rows as SAMPLES-style dicts for ``harness.engine.costmodel.fit_cost_model``.

    ``step_duration_s`` is the step's *period* (start to the next step's start) when the next
    step follows back to back, else its measured duration. The simulator has no time between
    steps, so the engine loop's own work between ``update_from_output`` and the next
    ``schedule`` (output queueing, input handling: 0.2 ms median on the CPU tier) belongs in
    the fitted cost; fitting durations alone made the simulated TPOT 11% short (p50, vLLM-CPU
    fidelity run), periods 3%.

    ``kv_used_tokens`` is set to the step's ``kv_tokens`` (context of the scheduled requests
    after the step), which is the ``K`` the simulator feeds the cost model (engine/core.py:
    ``kv_read += c + n``), so a fitted ``per_kv_s`` means the same thing in both places.
    """
    steps = steps_only(rows)
    out: list[dict[str, Any]] = []
    for i, r in enumerate(steps):
        cost = float(r["duration_s"])
        if i + 1 < len(steps) and "t_s" in r and "t_s" in steps[i + 1]:
            period = float(steps[i + 1]["t_s"]) - float(r["t_s"])
            if cost <= period <= cost + BACK_TO_BACK_S:
                cost = period
        out.append(
            {
                "source": "engine",
                "num_steps": 1,
                "step_duration_s": cost,
                "prefill_tokens": r["prefill_tokens"],
                "decode_tokens": r["decode_tokens"],
                "kv_used_tokens": r["kv_tokens"],
                "prefill_attn": r.get("prefill_attn"),
            }
        )
    return out
