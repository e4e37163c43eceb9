"""``fastertransformer``: FasterTransformer, decode-prioritised request-level batching.

Rule (seed-stability.md §2.3 "FasterTransformer", §7 REC 9): while any request is decoding,
steps are decode-only (one token per decoding request, running order, up to the budget) and no
prompt is admitted; only when nobody decodes does a prefill-only step admit whole prompts FCFS
while their sum fits the budget (an oversize prompt starts alone, chunked, REC 6). So each
cohort runs to completion before the next is admitted: the coarse-grained batching that makes FT
unstable below capacity (§2.5, closed form mu_FT = n / (t(n v_p) + v_d t(n))).
"""

from __future__ import annotations

from harness.policies.columns import (
    ColumnPlan,
    ColumnPolicy,
    ColumnView,
    admit_head,
    prefill_chunks,
)
from harness.policies.registry import register


@register("fastertransformer")
class FasterTransformerPolicy(ColumnPolicy):
    """Decode-only steps while anyone decodes; otherwise a prefill-only cohort admission."""

    def plan_columns(self, cv: ColumnView) -> ColumnPlan:
        rc = cv.running
        decoding, prefilling = rc.split()
        if len(decoding):
            k = min(len(decoding), cv.token_budget)
            if k == len(rc):
                # Arrivals never change this decision, so the plan holds until a finish.
                return ColumnPlan(None, 1, steady=True, hold=True)
            return ColumnPlan(decoding[:k], 1)
        run, run_tok, budget = prefill_chunks(rc, prefilling, cv.token_budget)
        return ColumnPlan(run, run_tok, admit_head(cv, budget, whole=True))
