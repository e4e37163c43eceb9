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

import numpy as np

from harness.policies.columns import ColumnPlan, ColumnPolicy, ColumnView, admit_head
from harness.policies.registry import register


@register("orca")
class OrcaPolicy(ColumnPolicy):
    """Prefill-first; decodes fill whatever budget the prefills leave."""

    def __init__(self, whole_prompt: bool = False):
        self.whole_prompt = bool(whole_prompt)

    def plan_columns(self, cv: ColumnView) -> ColumnPlan:
        rc = cv.running
        budget = cv.token_budget
        # the usual step has nobody prefilling: no position arrays unless decodes are cut
        prefilling = rc.prefilling()
        bs = cv.kv.block_size
        pre_tok: list[int] = []
        if len(prefilling):
            free = cv.kv.free_blocks
            comp = rc.computed[prefilling]
            rem = rc.prompt[prefilling] + rc.output[prefilling] - comp
            for i, (c, left) in enumerate(zip(comp.tolist(), rem.tolist(), strict=True)):
                n = max(0, min(left, budget))
                held = -(-c // bs)
                if i > 0:  # only what the free KV holds: a stuck prefill must not starve decodes
                    n = max(0, min(n, held * bs - c + free * bs))
                free -= -(-(c + n) // bs) - held
                pre_tok.append(n)
                budget -= n
        admit: list[int] = []
        if cv.num_waiting and budget > 0 and len(rc) < cv.max_num_seqs:
            # an admission must be able to finish its prompt in the KV the prefills leave
            free = cv.kv.free_blocks
            if len(prefilling):
                whole = rc.prompt[prefilling] + rc.output[prefilling]
                held = (rc.computed[prefilling] + (bs - 1)) // bs
                free -= int(((whole + (bs - 1)) // bs - held).sum())
            admit = admit_head(cv, budget, free_blocks=free, whole=self.whole_prompt, full_kv=True)
            budget -= sum(admit)
        # Decodes get 1 token each while budget is left. Every running request is listed (0
        # tokens when it gets none) so the whole running set stays in the run order that KV
        # preemption takes victims from (decodes last in priority, so first victims).
        n_decoding = len(rc) - len(prefilling)
        granted = min(n_decoding, max(budget, 0))
        # once nothing waits and all decode (within the budget: the host checks), every decode
        # runs: Plan.then_steady (the plan above, steady; it holds no state)
        if not len(prefilling) and granted == n_decoding:
            return ColumnPlan(None, 1, admit, steady=not admit, then_steady=True)
        decoding = rc.decoding()
        dec_tok = np.zeros(n_decoding, np.int64)
        dec_tok[:granted] = 1
        return ColumnPlan(
            np.concatenate((prefilling, decoding)),
            np.concatenate((np.array(pre_tok, np.int64), dec_tok)),
            admit,
            then_steady=True,
        )
