"""RAD: the resource-aware dynamic, throughput-optimal scheduler (seed-rad-slai.md §3).

RAD runs in cycles of at most ``n`` started requests. A decode batch holds *every*
decode-phase request (at most ``t_col*`` of them, the optimal GeMM tile width) and runs when
``|D| = t_col*``, when no prefill is waiting, or when the cycle has started ``n`` requests
(Algorithm 1 line 6). Otherwise the FCFS-oldest waiting request is prefilled *alone*, in
chunks of ``t_lcm* = LCM(t_row*, t_col*, t_red*)`` tokens, until its prompt is done (lines
10-18); prefill and decode never share a batch. The cycle ends when ``D`` drains (line 9).
The paper never ran RAD; this is the authors' *theoretical* scheduler, expect high TBT.

Decisions on the spec's ambiguities (seed-rad-slai.md §3.3-§3.5, §7 #18-#19):

* Chunk off-by-one fixed: ``c = min(t_lcm*, L^P - i + 1)``, i.e. the remaining prompt.
* Line 6 is not re-checked between the chunks of one prefill (the paper runs it to the end).
* Defaults ``t_col* = 128``, ``t_lcm* = 256`` (A100 tiles 256×128, ``t_red* = 32``),
  ``n = 1024`` (none are in the paper). Budget/``max_num_seqs`` of the host still apply.
* A recompute-preempted request returns to the waiting queue and is re-prefilled FCFS.
* State across cycles is only the queue and the cycle counter (Lemma 2's Markov structure).
"""

from __future__ import annotations

import math
from typing import Any

from harness.policies.base import (
    BasePolicy,
    Plan,
    StepReport,
    View,
    is_decoding,
    prefill_remaining,
    remaining_tokens,
)
from harness.policies.registry import register


@register("rad")
class RADPolicy(BasePolicy):
    """Resource-Aware Dynamic scheduler (seed-rad-slai.md §3.2, Algorithm 1)."""

    def __init__(
        self,
        n: int = 1024,
        t_col: int = 128,
        t_row: int = 256,
        t_red: int = 32,
    ) -> None:
        if min(n, t_col, t_row, t_red) < 1:
            raise ValueError("rad: n and tile sizes must be >= 1")
        self.n = int(n)
        self.t_col = int(t_col)
        self.t_row = int(t_row)
        self.t_red = int(t_red)
        self.t_lcm = math.lcm(self.t_row, self.t_col, self.t_red)
        self.requests_in_cycle = 0
        self.cycles = 0

    def schedule(self, view: View) -> Plan:
        chunk = min(self.t_lcm, view.token_budget)
        prefilling = [r for r in view.running if prefill_remaining(r) > 0]
        decoding = [r for r in view.running if is_decoding(r)]
        if prefilling:  # lines 12-16: finish the current prefill, one chunk per batch, alone
            r = min(prefilling, key=lambda r: (r.arrival_s, r.request_id))
            return Plan(run=[(r.request_id, min(chunk, prefill_remaining(r)))])
        if not decoding and self.requests_in_cycle > 0:  # line 9: D drained, new cycle
            self.requests_in_cycle = 0
            self.cycles += 1
        waiting = sorted(view.waiting, key=lambda r: (r.arrival_s, r.request_id))
        if not waiting and not decoding:
            return Plan()  # line 5: idle
        seq_room = len(view.running) < view.max_num_seqs
        if (
            len(decoding) >= self.t_col
            or not waiting
            or self.requests_in_cycle >= self.n
            or not seq_room
        ):  # lines 6-8: one batch with a DI for every request in D
            run = [(r.request_id, 1) for r in sorted(decoding, key=lambda r: r.arrival_s)]
            return Plan(run=run, steady=len(run) <= view.token_budget)
        r = waiting[0]  # lines 11-17: FCFS prefill of one request (counted in on_step)
        return Plan(admit=[(r.request_id, min(chunk, remaining_tokens(r)))])

    def on_step(self, report: StepReport) -> None:
        self.requests_in_cycle += len(report.admitted)  # line 18

    def params(self) -> dict[str, Any]:
        return {"n": self.n, "t_col": self.t_col, "t_row": self.t_row, "t_red": self.t_red}
