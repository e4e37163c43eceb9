"""``vllm-v0``: vanilla vLLM (v0 default), prefill-prioritised, no mixing.

Rule (seed-stability.md §2.3 "vanilla vLLM", and the WAIT paper's Vidur vLLM baseline,
seed-wait.md §5): if any waiting prompt can be admitted, the step is prefill-only: whole prompts
FCFS while their sum fits the budget (and seats and KV); otherwise the step is decode-only: one
token for each decoding request in running order, up to the budget. A prompt longer than the
whole budget starts alone and is chunked (never a silent deadlock, §7 REC 6); its remaining
chunks then run as prefill-only steps. Preempted requests re-enter through waiting (front).
"""

from __future__ import annotations

from harness.policies.base import BasePolicy, Plan, View
from harness.policies.common import admit_list, split_running
from harness.policies.registry import register


@register("vllm-v0")
class VLLMV0Policy(BasePolicy):
    """Prefill-only steps whenever a prompt can be admitted, else decode-only steps."""

    def schedule(self, view: View) -> Plan:
        budget = view.token_budget
        decoding, prefilling = split_running(view.running)
        run: list[tuple[str, int]] = []
        for r in prefilling:  # an oversize prompt's remaining chunks (prefill-only step)
            if budget <= 0:
                break
            n = min(r.num_tokens - r.num_computed_tokens, budget)
            run.append((r.request_id, n))
            budget -= n
        admit: list[tuple[str, int]] = []
        seats = view.max_num_seqs - len(view.running)
        if view.waiting and budget > 0 and seats > 0:
            admit = admit_list(view, budget, seats, whole=True)
        if run or admit:
            return Plan(run=run, admit=admit)
        run = [(r.request_id, 1) for r in decoding[: view.token_budget]]
        return Plan(run=run, steady=len(run) == len(view.running))
