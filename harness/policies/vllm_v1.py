"""``vllm``: vLLM v1's default scheduler (FCFS, chunked prefill on).

Rules (anchors-engines.md §1.4, ``Scheduler.schedule()``):

- Pass 1: every RUNNING request in running order gets ``num_tokens - num_computed_tokens``
  tokens (a decode is 1, a partial prefill its rest), capped by ``long_prefill_token_threshold``
  (if > 0) and by the token budget left (this is chunked prefill). When KV runs out the tail of
  the running list is preempted (recompute) - the host does that (base.py rule 2).
- Pass 2 (only if nothing was preempted): WAITING requests FCFS (preempted ones at the front),
  each ``min(remaining, budget left)``, while ``max_num_seqs`` and KV allow; the first that does
  not fit blocks the rest. With chunked prefill disabled a prompt larger than the budget left
  stops admission.

``scheduling_policy="priority"`` follows vLLM's ``--scheduling-policy priority`` (§1.8): waiting
sorted by (priority, arrival), and the KV victim is the running request with the largest
(priority, arrival). The contract takes victims from the tail of the run order, so the run
order is sorted by (priority, arrival) too; vLLM iterates running in admission order, so the
two differ only in which request the budget clips when running requests alone exhaust it.

``steady`` is set when every running request decodes and nobody can be admitted (waiting is
empty, or the head cannot get a seat or its first chunk's KV).
"""

from __future__ import annotations

from harness.policies.base import BasePolicy, BudgetRule, Plan, RequestView, StepReport, View
from harness.policies.common import SortedWaiting, admit_list
from harness.policies.registry import register


@register("vllm")
class VLLMV1Policy(BasePolicy):
    """vLLM v1 default: running first in order, chunked prefill within the budget, FCFS."""

    def __init__(
        self,
        long_prefill_token_threshold: int = 0,
        chunked_prefill: bool = True,
        scheduling_policy: str = "fcfs",
    ):
        if long_prefill_token_threshold < 0:
            raise ValueError("long_prefill_token_threshold must be >= 0")
        if scheduling_policy not in ("fcfs", "priority"):
            raise ValueError(
                f"scheduling_policy must be fcfs or priority, not {scheduling_policy!r}"
            )
        self.long_prefill_token_threshold = int(long_prefill_token_threshold)
        self.chunked_prefill = bool(chunked_prefill)
        self.scheduling_policy = scheduling_policy
        # priority order kept through the hooks (stable over the host queue, like
        # common.ordered_waiting), so a step does not sort the whole queue (issue 13)
        self._wq: SortedWaiting | None = None
        if scheduling_policy == "priority":
            self._wq = SortedWaiting(lambda r: (r.priority, r.arrival_s), host_order=True)

    def on_arrival(self, request: RequestView, now: float) -> None:
        if self._wq is not None:
            self._wq.add(request)

    def on_step(self, report: StepReport) -> None:
        if self._wq is not None:
            self._wq.on_step(report)

    def budget_rule(self) -> BudgetRule | None:
        """FCFS with chunked prefill and no per-request cap is base.BudgetRule: prefilling
        requests are always a suffix of vLLM's running list (a chunked prefill exhausts the
        budget, later admissions sit behind it), so running order is "decodes first"."""
        fcfs = self.scheduling_policy == "fcfs"
        if fcfs and self.chunked_prefill and self.long_prefill_token_threshold == 0:
            return BudgetRule()
        return None

    def schedule(self, view: View) -> Plan:
        budget = view.token_budget
        cap = self.long_prefill_token_threshold
        run: list[tuple[str, int]] = []
        all_decode = True
        running = view.running
        if self.scheduling_policy == "priority":
            # the run order's tail is the KV victim: vLLM picks max((priority, arrival_time))
            running = sorted(running, key=lambda r: (r.priority, r.arrival_s))
        for r in running:
            n = r.num_tokens - r.num_computed_tokens
            if n != 1 or r.num_output_tokens == 0:
                all_decode = False
                if cap and n > cap:
                    n = cap
            if n > budget:
                n = budget  # 0 once the budget is spent: listed anyway, so it stays in the
            run.append((r.request_id, n))  # run order that KV preemption picks victims from
            budget -= n
            if n == 0:
                all_decode = False
        seats = view.max_num_seqs - len(view.running)
        admit: list[tuple[str, int]] = []
        if view.waiting and budget > 0 and seats > 0:
            # KV that pass 1 will allocate is unknown here; the host enforces it exactly.
            queue = None
            if self._wq is not None:
                self._wq.sync(view)
                queue = self._wq.iter()
            admit = admit_list(
                view,
                budget,
                seats,
                order=self.scheduling_policy,
                whole=not self.chunked_prefill,
                free_blocks=None,
                queue=queue,
            )
            if cap:
                admit = [(rid, min(n, cap)) for rid, n in admit]
        steady = all_decode and not admit
        return Plan(run=run, admit=admit, steady=steady)
