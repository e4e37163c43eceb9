"""``orca``: Orca, prefill-first iteration-level batching with mixed batches.

Rule (seed-stability.md §2.3 "Orca"): fill the budget with prefill tokens first (ongoing
prefills in running order, then waiting requests FCFS), token-granular so the policy is
work-conserving (§7 REC 7); decode tokens (one per decoding request, running order) only take
the budget the prefills leave. In the paper's memory-free model "only after x_i = p_i for all i"
is the same thing, since a clipped prefill leaves no budget. Under KV limits a waiting request
that cannot get KV does not block decodes (that would deadlock: decodes free the KV). Likewise
an ongoing prefill gets only the tokens the free KV holds, except the oldest one, which always
gets its chunk (the host preempts from the tail for it): so the oldest prefill always advances,
and prefills stuck on KV leave the budget to the decodes that will free it (without this two
partial prefills could preempt each other, and the decodes starve, forever: issue 13). A waiting
request is admitted only if its whole prompt fits the KV that the ongoing prefills leave, so a
newcomer's prefill never evicts a decode it cannot coexist with (thrashing, issue 13).
``whole_prompt=True`` is the realism variant: prompts are never split (may not be
work-conserving, REC 7).

Plan order follows the priority: prefills first, decodes last, so KV shortage preempts decodes
first (tail victim, base.py rule 2). The host runs ``admit`` after ``run``, so the policy
reserves the admissions' budget itself before giving decodes the rest.
"""

from __future__ import annotations

from harness.policies.base import BasePolicy, Plan, View, blocks_for
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
        bs = view.kv.block_size
        free = view.kv.free_blocks
        # Every running request is listed (0 tokens when it gets none) so the whole running set
        # stays in the run order that KV preemption takes victims from (decodes first).
        for i, r in enumerate(prefilling):
            c = r.num_computed_tokens
            n = max(0, min(r.num_tokens - c, budget))
            if i > 0:  # only what the free KV holds: a stuck prefill must not starve decodes
                n = max(0, min(n, blocks_for(c, bs) * bs - c + free * bs))
            free -= blocks_for(c + n, bs) - blocks_for(c, bs)
            run.append((r.request_id, n))
            budget -= n
        admit: list[tuple[str, int]] = []
        seats = view.max_num_seqs - len(view.running)
        if view.waiting and budget > 0 and seats > 0:
            # an admission must be able to finish its prompt in the KV the prefills leave
            free = view.kv.free_blocks - sum(
                blocks_for(r.num_tokens, bs) - blocks_for(r.num_computed_tokens, bs)
                for r in prefilling
            )
            admit = admit_list(
                view, budget, seats, whole=self.whole_prompt, free_blocks=free, full_kv=True
            )
            budget -= sum(n for _, n in admit)
        all_granted = True
        for r in decoding:
            g = 1 if budget > 0 else 0
            run.append((r.request_id, g))
            budget -= g
            all_granted = all_granted and g == 1
        steady = not prefilling and not admit and all_granted
        return Plan(run=run, admit=admit, steady=steady)
