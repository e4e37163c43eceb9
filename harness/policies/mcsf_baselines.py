"""The MC-SF paper's baselines: α-protection greedy and α-protection β-clearing (seed-mcsf.md §3).

Both keep every running request running and admit waiting requests FCFS while the current
KV use plus the new prompt stays below ``(1 - α)·M``; there is no look-ahead, so decodes can
grow past ``M``. Before a step whose KV would exceed ``M`` (the overflow event), α-greedy
clears *all* running requests and β-clearing clears each one independently with probability
``β``; cleared requests lose their progress (recompute) and keep their arrival time, so
α-greedy re-selects the same FCFS set: the paper's infinite loop (§3.1, Fig. 7).

Decisions (seed-mcsf.md §7 A7): the overflow is detected before the step, so the host never
holds more than ``M``; the step that clears still runs what is left (an empty step for
α-greedy) and admits nothing; cleared requests rejoin the queue at their arrival position
from the next step. One independent β pass per step. ``progress="lost"`` is the paper's
semantics (A7): a cleared request's generated tokens are discarded (the engine core restarts
it from the prompt) and the clearing step stalls for the time of the batch it attempted;
``"kept"`` (the default) is the host's recompute preemption with no stall.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from harness.policies.base import RequestView, StepReport, hears_changes_only, remaining_tokens
from harness.policies.columns import ColumnPlan, ColumnPolicy, ColumnView
from harness.policies.common import SortedWaiting
from harness.policies.registry import register


class _AlphaProtection(ColumnPolicy):
    """Shared FCFS admission under ``(1 - α)·M`` and pre-step overflow clearing."""

    def __init__(
        self,
        alpha: float = 0.25,
        beta: float = 1.0,
        seed: int = 0,
        memory_tokens: int | None = None,
        progress: str = "kept",
    ) -> None:
        if not 0.0 <= alpha < 1.0:
            raise ValueError("alpha must be in [0, 1)")
        if not 0.0 < beta <= 1.0:
            raise ValueError("beta must be in (0, 1]")
        if progress not in ("kept", "lost"):
            raise ValueError("progress must be 'kept' or 'lost'")
        self.progress = progress
        self.preempt_restarts = progress == "lost"  # read by the engine core (A7)
        self.alpha = float(alpha)
        self.beta = float(beta)
        self.seed = seed
        self.memory_tokens = memory_tokens
        self.clearings = 0  # overflow events
        self.cleared = 0  # requests sent back
        self._rng = np.random.default_rng(seed)
        self._wq = SortedWaiting(lambda r: r.arrival_s)  # FCFS, kept by the hooks (issue 13)

    def _clear(self, n: int) -> np.ndarray:
        """Which of the ``n`` running requests (running order) an overflow clears."""
        raise NotImplementedError

    def plan_columns(self, cv: ColumnView) -> ColumnPlan:
        # Running order is start order: the host appends an admission (a re-admission after
        # clearing too) to its running set, so the paper's "started first" is the host's order.
        rc = cv.running
        bs = cv.kv.block_size
        capacity = self.memory_tokens if self.memory_tokens is not None else cv.kv.capacity_tokens
        comp = rc.computed
        seqs = len(rc)
        # each request's next tokens: a decode, or the rest of its prefill (at least 1); KV
        # held now (``used``) and after the step, in whole blocks
        step: np.ndarray | int
        if rc.num_prefilling == 0:  # every one decodes: a request at a block boundary opens one
            step = 1
            held, opening = rc.block_counts(bs)
            after = (held + opening) * bs
            used = held * bs
            tokens = seqs
        else:
            step = np.maximum(rc.remaining(), 1)
            after = int((((comp + step + (bs - 1)) // bs) * bs).sum())
            used = int((((comp + (bs - 1)) // bs) * bs).sum())
            tokens = int(step.sum())
        if after > capacity:  # overflow event
            cleared = self._clear(seqs)
            self.clearings += 1
            n_cleared = int(np.count_nonzero(cleared))
            self.cleared += n_cleared
            if n_cleared:
                keep = np.flatnonzero(~cleared)
                # the failed iteration: no admissions until the cleared ones are queued
                kept_steps = step if isinstance(step, int) else step[keep]
                return ColumnPlan(keep, kept_steps, preempt=np.flatnonzero(cleared))
        admit: list[tuple[RequestView, int]] = []
        # Cleared requests rejoin the queue at their arrival position from the next step on.
        self._wq.sync(cv)
        limit = (1.0 - self.alpha) * capacity
        for r in self._wq.iter():  # (arrival, request_id)
            need = remaining_tokens(r)
            if used + need > limit:
                break
            if seqs >= cv.max_num_seqs or tokens >= cv.token_budget:
                break
            chunk = min(need, cv.token_budget - tokens)  # long prompts start chunked
            admit.append((r, chunk))
            used += -(-need // bs) * bs
            tokens += chunk
            seqs += 1
        # Plan.steady: with every running request decoding and nothing admitted, the plan
        # repeats until a finish: KV use only grows, so a blocked admission stays blocked (an
        # arrival joins behind the blocked head), and the overflow check first fails on the
        # step whose blocks the host itself cannot give (its fast-forward stops before it),
        # provided the policy's M is no smaller than the host's KV.
        # Plan.then_steady, on the same proviso: once nothing waits and every running request
        # decodes with its next blocks free (the host checks these), the KV after the step fits
        # the host's KV, so M: no overflow, nothing to admit, the plan above, steady. Only an
        # overflow changes this policy's counters, and it never happens in such a step.
        fits = capacity >= cv.kv.capacity_tokens
        if rc.num_prefilling == 0:
            steady = not admit and fits
            return ColumnPlan(None, 1, admit_requests=admit, steady=steady, then_steady=fits)
        return ColumnPlan(None, step, admit_requests=admit, then_steady=fits)

    def on_arrival(self, request: RequestView, now: float) -> None:
        self._wq.add(request)

    @hears_changes_only
    def on_step(self, report: StepReport) -> None:
        self._wq.on_step(report)

    def params(self) -> dict[str, Any]:
        return {
            "alpha": self.alpha,
            "beta": self.beta,
            "seed": self.seed,
            "progress": self.progress,
        }


@register("mcsf-alpha")
class AlphaProtectionGreedy(_AlphaProtection):
    """α-protection greedy (§3.1): on overflow, clear every running request."""

    def __init__(
        self, alpha: float = 0.25, memory_tokens: int | None = None, progress: str = "kept"
    ) -> None:
        super().__init__(
            alpha=alpha, beta=1.0, seed=0, memory_tokens=memory_tokens, progress=progress
        )

    def _clear(self, n: int) -> np.ndarray:
        return np.ones(n, dtype=bool)

    def params(self) -> dict[str, Any]:
        return {"alpha": self.alpha, "progress": self.progress}


@register("mcsf-alpha-beta")
class AlphaProtectionBetaClearing(_AlphaProtection):
    """α-protection β-clearing (§3.2): on overflow, clear each running request w.p. ``β``."""

    def __init__(
        self,
        alpha: float = 0.2,
        beta: float = 0.2,
        seed: int = 0,
        memory_tokens: int | None = None,
        progress: str = "kept",
    ) -> None:
        super().__init__(
            alpha=alpha, beta=beta, seed=seed, memory_tokens=memory_tokens, progress=progress
        )

    def _clear(self, n: int) -> np.ndarray:
        return self._rng.random(n) < self.beta
