"""``fastertransformer``: FasterTransformer, decode-prioritised request-level batching.

Rule (seed-stability.md §2.3 "FasterTransformer", §7 REC 9): while any request is decoding,
steps are decode-only (one token per decoding request, running order, up to the budget) and no
prompt is admitted; only when nobody decodes does a prefill-only step admit whole prompts FCFS
while their sum fits the budget (an oversize prompt starts alone, chunked, REC 6). So each
cohort runs to completion before the next is admitted: the coarse-grained batching that makes FT
unstable below capacity (§2.5, closed form mu_FT = n / (t(n v_p) + v_d t(n))).
"""

from __future__ import annotations

from harness.policies.base import BasePolicy, Plan, View
from harness.policies.common import admit_list, split_running
from harness.policies.registry import register


@register("fastertransformer")
class FasterTransformerPolicy(BasePolicy):
    """Decode-only steps while anyone decodes; otherwise a prefill-only cohort admission."""

    def schedule(self, view: View) -> Plan:
        decoding, prefilling = split_running(view.running)
        if decoding:
            run = [(r.request_id, 1) for r in decoding[: view.token_budget]]
            # Arrivals never change this decision, so the plan holds until a finish.
            steady = len(run) == len(view.running)
            return Plan(run=run, steady=steady, hold=steady)
        budget = view.token_budget
        run: list[tuple[str, int]] = []
        for r in prefilling:
            if budget <= 0:
                break
            n = min(r.num_tokens - r.num_computed_tokens, budget)
            run.append((r.request_id, n))
            budget -= n
        admit: list[tuple[str, int]] = []
        seats = view.max_num_seqs - len(view.running)
        if view.waiting and budget > 0 and seats > 0:
            admit = admit_list(view, budget, seats, whole=True)
        return Plan(run=run, admit=admit)
