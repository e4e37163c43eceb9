"""``vllm-v0``: vanilla vLLM (v0 default), prefill-prioritised, no mixing.

Rule (seed-stability.md §2.3 "vanilla vLLM", and the WAIT paper's Vidur vLLM baseline,
seed-wait.md §5): if any waiting prompt can be admitted, the step is prefill-only: whole prompts
FCFS while their sum fits the budget (and seats and KV); otherwise the step is decode-only: one
token for each decoding request in running order, up to the budget. A prompt longer than the
whole budget starts alone and is chunked (never a silent deadlock, §7 REC 6); its remaining
chunks then run as prefill-only steps. Preempted requests re-enter through waiting (front).

Watermark: a prompt is admitted only if its blocks leave ``watermark`` (1%) of all KV blocks
free, as vLLM v0's block manager (``watermark=0.01``) and Vidur's vLLM scheduler
(``watermark_blocks_fraction=0.01``, anchors-engines.md §5.1) do, so decodes of running
requests rarely run out of blocks and get preempted. It is waived when nothing runs.
"""

from __future__ import annotations

import numpy as np

from harness.policies.columns import (
    ColumnPlan,
    ColumnPolicy,
    ColumnView,
    admit_head,
    prefill_chunks,
)
from harness.policies.registry import register


@register("vllm-v0")
class VLLMV0Policy(ColumnPolicy):
    """Prefill-only steps whenever a prompt can be admitted, else decode-only steps."""

    def __init__(self, *, watermark: float = 0.01) -> None:
        if not 0.0 <= watermark < 1.0:
            raise ValueError("vllm-v0: watermark must be in [0, 1)")
        self.watermark = float(watermark)

    def params(self) -> dict[str, float]:
        return {"watermark": self.watermark}

    def plan_columns(self, cv: ColumnView) -> ColumnPlan:
        rc = cv.running
        decoding, prefilling = rc.split()
        # an oversize prompt's remaining chunks (prefill-only step)
        run, run_tok, budget = prefill_chunks(rc, prefilling, cv.token_budget)
        admit: list[int] = []
        if cv.num_waiting:
            # With nothing running the watermark is waived: a prompt that fits the whole
            # cache but not cache - watermark must still run (never a stall, §7 REC 6).
            reserve = int(self.watermark * cv.kv.total_blocks) if len(rc) else 0
            free = max(0, cv.kv.free_blocks - reserve)
            # v0's block manager allocates a prompt's blocks whole at admission (full_kv)
            admit = admit_head(cv, budget, free_blocks=free, whole=True, full_kv=True)
        # once nothing waits and all decode (within the budget: the host checks), the
        # decode-only step runs them all: Plan.then_steady (that plan, steady; no state kept)
        if len(run) or admit:
            # decodes listed with 0 tokens: they stay KV victims for an oversize prompt's next
            # chunk, which would otherwise evict itself, re-enter and livelock (issue 13)
            if not len(run):
                return ColumnPlan(decoding, 0, admit, then_steady=True)
            return ColumnPlan(
                np.concatenate((run, decoding)),
                np.concatenate((run_tok, np.zeros(len(decoding), np.int64))),
                admit,
                then_steady=True,
            )
        k = min(len(decoding), cv.token_budget)
        if k == len(rc):
            return ColumnPlan(None, 1, steady=True, then_steady=True)
        return ColumnPlan(decoding[:k], 1, then_steady=True)
