"""``sarathi``: Sarathi-Serve, decode-first with chunked prefill (stall-free batching).

Rules (seed-stability.md §2.3 "Sarathi-Serve", and Vidur's ``SarathiReplicaScheduler`` as used by
the WAIT paper, seed-wait.md §5):

1. every decoding request gets its one decode token (running order), while budget lasts;
2. then ongoing (partially prefilled or recomputing) running requests get prefill chunks, in
   running order, as large as the budget left allows;
3. then new/preempted waiting requests are admitted with a first chunk of what is left, in
   ``order``: ``fcfs`` (default) or ``spf`` (shortest remaining prefill first).

The token budget (``View.token_budget``) is Sarathi's chunk size; ``chunk_size`` can lower it.
Decodes sit first in the run order, so KV shortage preempts prefills first (tail victim).
"""

from __future__ import annotations

from harness.policies.base import BasePolicy, BudgetRule, Plan, RequestView, StepReport, View
from harness.policies.common import SortedWaiting, admit_list, split_running
from harness.policies.registry import register


@register("sarathi")
class SarathiPolicy(BasePolicy):
    """Decode-first, then chunked prefills up to the token budget (work-conserving)."""

    def __init__(self, order: str = "fcfs", chunk_size: int | None = None):
        if order not in ("fcfs", "spf"):
            raise ValueError(f"sarathi order must be 'fcfs' or 'spf', not {order!r}")
        if chunk_size is not None and chunk_size < 1:
            raise ValueError("chunk_size must be >= 1")
        self.order = order
        self.chunk_size = chunk_size
        # SPF order kept through the hooks (a waiting request's remaining prefill is fixed),
        # stable over the host queue like common.ordered_waiting: no per-step sort (issue 13)
        self._wq: SortedWaiting | None = None
        if order == "spf":
            self._wq = SortedWaiting(
                lambda r: r.num_tokens - r.num_computed_tokens, host_order=True
            )

    def on_arrival(self, request: RequestView, now: float) -> None:
        if self._wq is not None:
            self._wq.add(request)

    def on_step(self, report: StepReport) -> None:
        if self._wq is not None:
            self._wq.on_step(report)

    def budget_rule(self) -> BudgetRule | None:
        """FCFS Sarathi-Serve is base.BudgetRule with its chunk size as the budget."""
        return BudgetRule(self.chunk_size) if self.order == "fcfs" else None

    def schedule(self, view: View) -> Plan:
        budget = (
            view.token_budget
            if self.chunk_size is None
            else min(view.token_budget, self.chunk_size)
        )
        all_granted = True  # every decode got its token
        decoding, prefilling = split_running(view.running)
        # Every running request is listed (0 tokens once the budget is spent) so the whole
        # running set stays in the run order that KV preemption takes victims from.
        run: list[tuple[str, int]] = []
        for r in decoding:
            g = 1 if budget > 0 else 0
            run.append((r.request_id, g))
            budget -= g
            all_granted = all_granted and g == 1
        for r in prefilling:
            n = min(r.num_tokens - r.num_computed_tokens, budget)
            run.append((r.request_id, n))
            budget -= n
        admit: list[tuple[str, int]] = []
        seats = view.max_num_seqs - len(view.running)
        if view.waiting and budget > 0 and seats > 0:
            queue = None
            if self._wq is not None:
                self._wq.sync(view)
                queue = self._wq.iter()
            admit = admit_list(view, budget, seats, order=self.order, queue=queue)
        steady = not prefilling and not admit and all_granted
        return Plan(run=run, admit=admit, steady=steady)
