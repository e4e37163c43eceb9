"""The reference step: the engine core's step exactly as it was before the speed work of
issue 13, kept to prove the fast paths change no answer.

:class:`ReferenceCore` is an :class:`~harness.engine.core.EngineCore` whose ``step`` is the
plain, loop-per-rule implementation of base.py's host semantics. ``simulate(...,
kernel="reference")`` runs on it; tests/engine/test_identity.py requires token-for-token
identical results from the fast paths (the optimised engine core and the vectorised kernel)
for every registered policy.
"""

from __future__ import annotations

import numpy as np

from harness.engine.core import (
    FINISHED,
    RUNNING,
    WAITING,
    EngineCore,
    EngineRequest,
    StepOutcome,
    _blocks,
    decode_steps_that_fit,
)
from harness.policies.base import Plan, StepReport


class ReferenceCore(EngineCore):
    """The engine core with the reference (unoptimised) step."""

    def step(
        self,
        now: float,
        fast_forward_until: float | None = None,
        hold_until: float | None = None,  # noqa: ARG002 - the reference never skips arrivals
    ) -> StepOutcome:
        """Execute one step starting at ``now`` (rules 1-5 of base.py).

        With ``fast_forward_until`` set and a ``steady`` plan that decodes every running request,
        the host also executes the following identical decode steps in closed form, as long as
        each starts strictly before ``fast_forward_until`` (the next arrival), no request
        finishes before the last one, and KV blocks suffice (rule: Plan.steady).
        """
        plan: Plan = self.policy.schedule(self.view(now))
        bs = self.block_size
        budget = self.token_budget
        reqs = self._requests
        preempted: list[str] = []
        bugs: list[str] = []

        # Rule 1: explicit preemptions, in order.
        for rid in plan.preempt:
            r = reqs.get(rid)
            if r is None or r.status != RUNNING:
                bugs.append(f"preempt {rid!r}: not running")
                continue
            self._preempt(r)
            preempted.append(rid)

        # Rule 2: run items in order; KV shortage preempts from the end of the run order (the
        # last-listed request still holding KV, possibly already scheduled, possibly the
        # requester itself), like vLLM's ``self.running.pop()`` (anchors-engines.md §1.4).
        sched: dict[str, tuple[EngineRequest, int]] = {}
        items: list[tuple[EngineRequest, int]] = []
        seen: set[str] = set()
        for rid, n in plan.run:
            r = reqs.get(rid)
            if r is None or r.status != RUNNING or rid in seen:
                bugs.append(f"run {rid!r}: not a running request (or listed twice)")
                continue
            seen.add(rid)
            items.append((r, n))
        order = [r for r, _ in items]
        preempted_in_run = False
        free = self.total_blocks - self.used_blocks
        for r, n in items:
            if r.status != RUNNING:  # preempted earlier in this step as a victim
                continue
            c = r.num_computed_tokens
            rem = r.num_prompt_tokens + r.num_output_tokens - c
            if n > rem:
                n = rem
            if n > budget:
                n = budget
            if n <= 0:
                continue
            need = _blocks(c + n, bs) - r.num_blocks
            if need > free:
                while need > free and order:
                    victim = order.pop()
                    if victim.status != RUNNING:
                        continue
                    got = sched.pop(victim.request_id, None)
                    if got is not None:
                        budget += got[1]
                    self._preempt(victim)
                    free = self.total_blocks - self.used_blocks
                    preempted.append(victim.request_id)
                    preempted_in_run = True
                    if victim is r:
                        break
                if r.status != RUNNING:
                    continue
            r.num_blocks += need
            self.used_blocks += need
            free -= need
            sched[r.request_id] = (r, n)
            budget -= n

        # Rule 3: admissions in order, only if step 2 preempted nothing; head-of-line blocking.
        admitted: list[str] = []
        if not preempted_in_run:
            for rid, n in plan.admit:
                r = reqs.get(rid)
                if r is None or r.status != WAITING:
                    bugs.append(f"admit {rid!r}: not waiting")
                    continue
                if budget <= 0 or len(self._running) >= self.max_num_seqs:
                    break
                rem = r.num_prompt_tokens + r.num_output_tokens  # computed is 0 while waiting
                n = max(1, min(n, rem, budget))
                need = _blocks(n, bs)
                if need > free:
                    break
                self._waiting.remove(r)
                r.status = RUNNING
                self._running.append(r)
                r.num_blocks = need
                self.used_blocks += need
                free -= need
                sched[rid] = (r, n)
                budget -= n
                admitted.append(rid)

        if not sched:
            report = None
            if preempted:
                report = StepReport(
                    start_s=now,
                    duration_s=0.0,
                    num_steps=0,
                    prefill_tokens=0,
                    decode_tokens=0,
                    num_prefill_seqs=0,
                    num_decode_seqs=0,
                    kv_used_blocks=self.used_blocks,
                    preempted=tuple(preempted),
                )
                self.policy.on_step(report)
            return StepOutcome(
                now, 0.0, 0, np.empty(0), [], 0, [], preempted, admitted, [], report, True, bugs
            )

        # Composition (rule 5 input to the cost model).
        prefill = 0
        n_prefill = 0
        n_decode = 0
        kv_read = 0
        attn = 0.0  # sum over prefill chunks of chunk * (context before it + chunk / 2)
        scheduled: list[tuple[str, int, bool]] = []
        for rid, (r, n) in sched.items():
            c = r.num_computed_tokens
            is_dec = n == 1 and r.num_output_tokens > 0 and c == r.num_tokens - 1
            if is_dec:
                n_decode += 1
            else:
                prefill += n
                n_prefill += 1
                attn += n * (c + n / 2)
            kv_read += c + n
            scheduled.append((rid, n, is_dec))
        if self._prefill_attn:
            duration = self.cost_model.step_time(prefill, n_decode, kv_read, prefill_attn=attn)
        else:
            duration = self.cost_model.step_time(prefill, n_decode, kv_read)

        # Fast-forward (Plan.steady): every running request decodes, nothing else happens.
        k = 1
        step_ends: np.ndarray
        if (
            plan.steady
            and fast_forward_until is not None
            and n_prefill == 0
            and not preempted
            and not admitted
            and len(sched) == len(self._running)
        ):
            k, step_ends = self._fast_forward_len(
                now, duration, n_decode, kv_read, fast_forward_until
            )
        else:
            step_ends = np.array([now + duration])
        end = float(step_ends[-1])

        # Rule 5: advance, sample, finish at max_tokens (ignore-EOS), free KV.
        sampled: list[EngineRequest] = []
        finished: list[EngineRequest] = []
        if k > 1:
            t_first = float(step_ends[0])
            for r, _n in sched.values():
                c = r.num_computed_tokens + k
                r.num_computed_tokens = c
                r.num_output_tokens += k
                nb = _blocks(c, bs)
                self.used_blocks += nb - r.num_blocks
                r.num_blocks = nb
                if r.first_token_s is None:
                    r.first_token_s = t_first
                r.last_token_s = end
                sampled.append(r)
                if r.num_output_tokens >= r.max_tokens:
                    finished.append(r)
        else:
            for r, n in sched.values():
                c = r.num_computed_tokens + n
                r.num_computed_tokens = c
                if c == r.num_prompt_tokens + r.num_output_tokens:
                    r.num_output_tokens += 1
                    if r.first_token_s is None:
                        r.first_token_s = end
                    r.last_token_s = end
                    sampled.append(r)
                    if r.num_output_tokens >= r.max_tokens:
                        finished.append(r)
        if finished:
            for r in finished:
                r.status = FINISHED
                r.finish_s = end
                self.used_blocks -= r.num_blocks
                r.num_blocks = 0
                del self._requests[r.request_id]
            done = set(map(id, finished))
            self._running = [r for r in self._running if id(r) not in done]
            self.num_finished += len(finished)

        total = end - now
        self.last_step_s = total / k
        self.num_steps_total += k
        report = StepReport(
            start_s=now,
            duration_s=total,
            num_steps=k,
            prefill_tokens=prefill,
            decode_tokens=n_decode * k,
            num_prefill_seqs=n_prefill,
            num_decode_seqs=n_decode,
            kv_used_blocks=self.used_blocks,
            preempted=tuple(preempted),
            admitted=tuple(admitted),
            finished=tuple(r.request_id for r in finished),
        )
        self.policy.on_step(report)
        return StepOutcome(
            now,
            total,
            k,
            step_ends,
            sampled,
            k,
            finished,
            preempted,
            admitted,
            scheduled,
            report,
            False,
            bugs,
        )

    def _fast_forward_len(
        self, now: float, first: float, n_decode: int, kv_read: int, until: float
    ) -> tuple[int, np.ndarray]:
        """How many identical decode steps to run: bounded by the first finish, the KV blocks
        that would be needed, and start times strictly before ``until``."""
        run = self._running
        k_max = min(r.max_tokens - r.num_output_tokens for r in run)
        if k_max <= 1:
            return 1, np.array([now + first])
        bs = self.block_size
        comp = np.fromiter((r.num_computed_tokens for r in run), dtype=np.int64, count=len(run))
        # Step 1's blocks (for comp + 1 tokens) are already allocated; ``free`` is what is left.
        free = self.total_blocks - self.used_blocks

        k_max = decode_steps_that_fit(comp, k_max, bs, free)
        if k_max <= 1:
            return 1, np.array([now + first])
        i = np.arange(k_max)
        durs = self.cost_model.step_times(
            np.zeros(k_max), np.full(k_max, n_decode), kv_read + i * n_decode
        )
        ends = now + np.cumsum(durs)
        # step j (0-based) starts at ends[j-1]; it may run only if that start < until.
        k = 1 + int(np.searchsorted(ends[:-1], until, side="left"))
        k = max(1, min(k, k_max))
        return k, ends[:k]
