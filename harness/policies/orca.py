"""``orca``: Orca, prefill-first iteration-level batching with mixed batches.

Rule (seed-stability.md §2.3 "Orca"): fill the budget with prefill tokens first (ongoing
prefills in running order, then waiting requests FCFS), token-granular so the policy is
work-conserving (§7 REC 7); decode tokens (one per decoding request, running order) only take
the budget the prefills leave. In the paper's memory-free model "only after x_i = p_i for all i"
is the same thing, since a clipped prefill leaves no budget. Under KV limits a waiting request
that cannot get KV does not block decodes (that would deadlock: decodes free the KV).
``whole_prompt=True`` is the realism variant: prompts are never split (may not be
work-conserving, REC 7).

Plan order follows the priority: prefills first, decodes last, so KV shortage preempts decodes
first (tail victim, base.py rule 2). The host runs ``admit`` after ``run``, so the policy
reserves the admissions' budget itself before giving decodes the rest.
"""

from __future__ import annotations

from harness.policies.base import BasePolicy, Plan, View
from harness.policies.common import admit_list, split_running
from harness.policies.registry import register


@register("orca")
class OrcaPolicy(BasePolicy):
    """Prefill-first; decodes fill whatever budget the prefills leave."""

    def __init__(self, whole_prompt: bool = False):
        self.whole_prompt = bool(whole_prompt)

    def schedule(self, view: View) -> Plan:
        budget = view.token_budget
        decoding, prefilling = split_running(view.running)
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
            admit = admit_list(view, budget, seats, whole=self.whole_prompt)
            budget -= sum(n for _, n in admit)
        for r in decoding:
            if budget <= 0:
                break
            run.append((r.request_id, 1))
            budget -= 1
        steady = not prefilling and not admit and len(run) == len(view.running)
        return Plan(run=run, admit=admit, steady=steady)
