"""``HarnessScheduler``: a vLLM v1 scheduler whose every step is decided by a harness policy.

Use with ``--scheduler-cls adapters.vllm.scheduler.HarnessScheduler --no-async-scheduling``
(the repo root on the engine-core process's ``PYTHONPATH``). Pinned to vLLM 0.32.0.

Each ``schedule()`` call (one engine step):

1. builds a :class:`~harness.policies.base.View` from vLLM's own state: ``self.waiting``
   (arrival order, preempted at the front), ``self.running``, the block pool's free blocks,
   ``max_num_scheduled_tokens`` and ``max_num_seqs`` (anchors-engines.md §1.4, §1.6);
2. asks the policy for a :class:`~harness.policies.base.Plan`;
3. makes vLLM execute exactly that plan under the host semantics of ``harness/policies/base.py``
   by shaping the inputs of vLLM's own ``Scheduler.schedule()`` rather than re-implementing it:

   - rule 1 (explicit preemptions): ``_preempt_request`` on each, before the pass (recompute,
     KV freed, front of ``waiting``);
   - rule 2 (run in order, clip, preempt from the end of the run order): ``self.running`` is set
     to the plan's run list for the duration of the call, so vLLM's running pass walks it in
     order and its FCFS victim (``self.running.pop()``) is the last-listed request; each
     request's token count is capped at the plan's value through the
     ``_reserve_prefill_lookahead`` hook, which vLLM applies to every candidate right before
     allocating KV (a 0 cap skips the request);
   - rule 3 (admission, head-of-line, only if step 2 preempted nothing): ``self.waiting`` is a
     queue holding only the plan's admit list, in order; vLLM's waiting pass is skipped after a
     preemption and stops at the first request that does not fit (budget, KV, ``max_num_seqs``);
   - rule 4 (paused requests keep KV): running requests outside the plan are withheld from the
     pass (and from victim selection) and counted against ``max_num_seqs``;
   - rule 5: the forward pass is vLLM's; finishing is vLLM's ``check_stop``.

4. when the policy holds every request back (an empty plan while work waits, e.g. a WAIT
   threshold), sleeps one step's worth of time (1 to 20 ms) before returning the empty step:
   vLLM's engine loop never blocks while it has requests (0.32 only yields 1 ms after an
   empty step), so it would re-ask the policy hundreds of times a second; the built-in server
   re-asks on the same clock (``EngineServer.idle_recheck_s``). Measured on the CPU tier
   with one request held: the engine-core process used 0.40 cores without this, 0.27 with
   it (tiny model, so 1 ms steps; with GPU-sized steps the wait is longer and the saving
   larger);
5. reports the step back (``Policy.on_step``) from ``update_from_output()`` with the measured
   duration, and optionally logs it to ``HARNESS_STEP_LOG`` (JSONL, see ``steplog``).

Ready stamp (:func:`stamp_ready_times`): vLLM's engine core takes requests in on an input
thread (``EngineCoreProc.process_input_sockets``: decode, ``preprocess_add_request``, then
``input_queue.put_nowait``), while the busy loop drains that queue only between steps, so the
scheduler's ``add_request`` sees a request up to a whole step after it became available. The
host wraps ``EngineCore.preprocess_add_request`` to stamp each request with ``time.time()`` on
its return, the last thing before the put: the instant the loop could have taken it, which the
step log records as ``ready_s`` (``harness.server.fidelity.engine_ready_times``).

Prefix caching (vLLM's default) is supported: a waiting request's view counts its cached
prompt prefix as computed (:meth:`HarnessScheduler.prefix_hit_tokens`, the lookup vLLM's own
waiting pass makes), so the policy budgets only the tokens vLLM will actually compute, and the
plan's token count caps what vLLM schedules beyond the hit.

Why the synchronous ``Scheduler`` and ``--no-async-scheduling``: with async scheduling (on by
default in 0.32) step k+1 is planned before step k's tokens are known and requests carry output
placeholders (anchors-engines.md §1.2), so the policy would see token counts that disagree with
the contract's accounting (a decoding request would show 0 remaining tokens). The host refuses to
start under async scheduling rather than silently plan on stale state.

vLLM's ``--scheduling-policy priority`` heap is replaced by an FCFS queue: ordering is the
policy's job, and ``priority`` still reaches it through each request's view.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any

import vllm
from adapters.host_base import StepTally, idle_wait_s
from adapters.vllm import SUPPORTED_VLLM_VERSION
from adapters.vllm.config import PolicyChoice, build_policy, resolve_policy
from adapters.vllm.steplog import StepLog, request_row
from adapters.vllm.view import VllmRequestView
from harness.policies.base import KVView, Plan, View
from vllm.v1.core.sched.request_queue import SchedulingPolicy, create_request_queue
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request, RequestStatus

logger = logging.getLogger("harness.adapters.vllm")

_WAITING_STATES = (RequestStatus.WAITING, RequestStatus.PREEMPTED)

# Attribute the wrapped ``preprocess_add_request`` sets on each vLLM ``Request``: host clock
# (``time.time()``, the clock of every other step-log time) when it was handed to the loop.
READY_ATTR = "harness_ready_time"


def stamp_ready_times() -> None:
    """Wrap ``EngineCore.preprocess_add_request`` (once per process) so each new request
    carries :data:`READY_ATTR` (see the module docstring: why this is the instant the engine
    loop could first have taken it in).

    Installed from ``HarnessScheduler.__init__``, which ``EngineCore.__init__`` runs before
    ``EngineCoreProc`` starts its input thread; the thread looks the method up per request.
    """
    from vllm.v1.engine.core import EngineCore

    orig = EngineCore.preprocess_add_request
    if getattr(orig, "_harness_stamps", False):
        return

    def preprocess_add_request(self: Any, request: Any) -> tuple[Request, int]:
        req, wave = orig(self, request)
        setattr(req, READY_ATTR, time.time())
        return req, wave

    preprocess_add_request._harness_stamps = True  # type: ignore[attr-defined]
    preprocess_add_request.__doc__ = orig.__doc__
    EngineCore.preprocess_add_request = preprocess_add_request  # type: ignore[method-assign]


@dataclass(slots=True)
class _Pending(StepTally):
    """What the host remembers between ``schedule()`` and ``update_from_output()``."""

    output_id: int
    scheduled: dict[str, int]
    out_before: dict[str, int]
    kv_tokens: int
    # Σ chunk·(context before + chunk/2) over prefill chunks: the engine core's prefill_attn
    prefill_attn: float = 0.0


def _check_version() -> None:
    if (
        vllm.__version__ != SUPPORTED_VLLM_VERSION
        and os.environ.get("HARNESS_VLLM_ANY_VERSION") != "1"
    ):
        raise RuntimeError(
            f"adapters.vllm supports vLLM {SUPPORTED_VLLM_VERSION}, found {vllm.__version__} "
            "(set HARNESS_VLLM_ANY_VERSION=1 to try anyway)"
        )


class HarnessScheduler(Scheduler):
    """vLLM v1 ``Scheduler`` hosting a harness policy (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _check_version()
        if self.scheduler_config.async_scheduling:
            raise RuntimeError(
                "HarnessScheduler needs synchronous scheduling: "
                "start vLLM with --no-async-scheduling"
            )
        if self.policy != SchedulingPolicy.FCFS:
            self.policy = SchedulingPolicy.FCFS
            self.waiting = create_request_queue(self.policy)
            self.kv_holding_waiting = create_request_queue(self.policy)
        extra = self.vllm_config.additional_config
        self.policy_choice: PolicyChoice = resolve_policy(
            extra if isinstance(extra, dict) else None
        )
        self.harness_policy = build_policy(self.policy_choice)
        self._origin = time.time()
        self._views: dict[str, VllmRequestView] = {}
        self._caps: dict[str, int] | None = None
        self._pending: _Pending | None = None
        self._aborted: list[str] = []
        self._preempted_now: list[str] = []  # this step's preemptions, in order
        self._last_step_s: float | None = None
        self._steplog = StepLog(os.environ.get("HARNESS_STEP_LOG"))
        # the log's times are seconds since this origin; the epoch time lets other clocks'
        # records (a host monitor's) be laid beside them (steplog.log_origin)
        self._steplog.write({"kind": "origin", "time_s": self._origin})
        stamp_ready_times()
        self._idle_sleep = time.sleep  # replaced in tests to observe the idle wait
        self.idle_waits = 0
        logger.warning(
            "HarnessScheduler: policy %r params %s (from %s); step log %s",
            self.policy_choice.name,
            self.policy_choice.params,
            self.policy_choice.source,
            os.environ.get("HARNESS_STEP_LOG") or "off",
        )

    # ------------------------------------------------------------------ state
    def _now(self) -> float:
        return time.time() - self._origin

    def _view_of(self, request: Request) -> VllmRequestView:
        v = self._views.get(request.request_id)
        if v is None:  # e.g. a request added before the policy existed; never expected
            v = self._views[request.request_id] = VllmRequestView(request, self._origin)
        return v

    def kv_view(self) -> KVView:
        """KV state in blocks; block 0 is vLLM's null block and never usable (§1.6)."""
        pool = self.kv_cache_manager.block_pool
        total = pool.num_gpu_blocks - 1
        return KVView(
            block_size=self.block_size,
            total_blocks=total,
            used_blocks=total - pool.get_num_free_blocks(),
        )

    def prefix_hit_tokens(self, request: Request) -> int:
        """Tokens of ``request``'s prompt vLLM would take from the prefix cache if it scheduled
        it now (the same lookup as ``Scheduler.schedule``'s waiting pass; read-only: vLLM
        records its hit/query counters only when it schedules)."""
        if not self.cache_config.enable_prefix_caching or request.num_computed_tokens > 0:
            return 0
        return int(self.kv_cache_manager.get_computed_blocks(request)[1])

    def build_view(self, now: float) -> View:
        """The policy's read-only view of this step, straight from vLLM's queues."""
        waiting = [self._view_of(r) for r in self.waiting if r.status in _WAITING_STATES]
        for v in waiting:
            v.cached_tokens = self.prefix_hit_tokens(v.request)
        return View(
            now=now,
            waiting=waiting,
            running=[self._view_of(r) for r in self.running],
            kv=self.kv_view(),
            token_budget=self.max_num_scheduled_tokens,
            max_num_seqs=self.max_num_running_reqs,
            last_step_s=self._last_step_s,
        )

    # ------------------------------------------------------------ vLLM hooks
    def add_request(self, request: Request) -> None:
        is_new = request.request_id not in self.requests
        super().add_request(request)
        if is_new and request.request_id in self.requests:
            view = VllmRequestView(request, self._origin)
            view.engine_arrival_s = self._now()
            ready = getattr(request, READY_ATTR, None)
            view.ready_s = None if ready is None else float(ready) - self._origin
            self._views[request.request_id] = view
            self.harness_policy.on_arrival(view, self._now())

    def finish_requests(self, request_ids: Any, finished_status: RequestStatus) -> list[Request]:
        done = super().finish_requests(request_ids, finished_status)
        for r in done:
            self._aborted.append(r.request_id)
            self._views.pop(r.request_id, None)
        return done

    def _reserve_prefill_lookahead(
        self, request: Request, num_computed_tokens: int, num_new_tokens: int
    ) -> int:
        """vLLM's last per-request clip before KV allocation; here it also applies the plan's
        token count for the request (base.py rule 2/3: items are clipped, never exceeded)."""
        n = super()._reserve_prefill_lookahead(request, num_computed_tokens, num_new_tokens)
        if self._caps is not None:
            n = min(n, self._caps.get(request.request_id, 0))
        return n

    def _preempt_request(self, request: Request, *args: Any, **kwargs: Any) -> None:
        self._preempted_now.append(request.request_id)
        super()._preempt_request(request, *args, **kwargs)

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        start = self._now()
        self._preempted_now = []
        plan: Plan = self.harness_policy.schedule(self.build_view(start))

        # Rule 1: explicit preemptions (recompute; front of waiting).
        for rid in plan.preempt:
            req = self.requests.get(rid)
            if req is not None and req.status == RequestStatus.RUNNING and req in self.running:
                self.running.remove(req)
                self._preempt_request(req, time.monotonic())

        caps: dict[str, int] = {}
        run_reqs: list[Request] = []
        for rid, n in plan.run:
            req = self.requests.get(rid)
            if req is None or rid in caps or n <= 0 or req.status != RequestStatus.RUNNING:
                continue
            caps[rid] = int(n)
            run_reqs.append(req)
        orig_running = list(self.running)
        paused = [r for r in orig_running if r.request_id not in caps]

        waiting_before = list(self.waiting)
        waiting_by_id = {r.request_id: r for r in waiting_before if r.status in _WAITING_STATES}
        admit_q = create_request_queue(SchedulingPolicy.FCFS)
        admit_ids: set[str] = set()
        for rid, n in plan.admit:
            req = waiting_by_id.get(rid)
            if req is None or rid in caps or n <= 0:
                continue
            caps[rid] = int(n)
            admit_ids.add(rid)
            admit_q.add_request(req)

        held_max_active = self.max_num_active_reqs
        self.running = run_reqs
        self.waiting = admit_q
        self.max_num_active_reqs = max(0, held_max_active - len(paused))
        self._caps = caps
        try:
            out = super().schedule(*args, **kwargs)
        finally:
            self._caps = None
            self.max_num_active_reqs = held_max_active
            # vLLM's victims were prepended to admit_q (front); admitted ones left it.
            victims = [r for r in self.waiting if r.request_id not in admit_ids]
            new_waiting = create_request_queue(SchedulingPolicy.FCFS)
            for r in victims:
                new_waiting.add_request(r)
            victim_set = set(victims)
            for r in waiting_before:  # original order, minus the admitted
                if (
                    r.status != RequestStatus.RUNNING
                    and not r.is_finished()
                    and r not in victim_set
                ):
                    new_waiting.add_request(r)
            self.waiting = new_waiting
            still = [r for r in orig_running if r.status == RequestStatus.RUNNING]
            still_set = set(still)
            self.running = still + [r for r in self.running if r not in still_set]

        self._record_pending(out, start)
        if self._pending is None and (self.running or self.waiting):
            self.idle_waits += 1  # held back: wait instead of spinning vLLM's busy loop
            self._idle_sleep(idle_wait_s(self._last_step_s))
        return out

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        end = self._now()
        result = super().update_from_output(scheduler_output, model_runner_output)
        pend = self._pending
        if pend is not None and pend.output_id == id(scheduler_output):
            self._pending = None
            self._report(pend, end)
        return result

    # -------------------------------------------------------------- reporting
    def _record_pending(self, out: Any, start: float) -> None:
        scheduled = dict(out.num_scheduled_tokens)
        preempted = tuple(self._preempted_now)
        if not scheduled and not preempted:  # an idle loop turn: nothing to report
            self._pending = None
            return
        prefill = decode = n_pre = n_dec = kv_tokens = 0
        attn = 0.0
        out_before: dict[str, int] = {}
        for rid, n in scheduled.items():
            req = self.requests[rid]
            before = (
                req.num_computed_tokens - n
            )  # vLLM already advanced it (_update_after_schedule)
            kv_tokens += before + n
            out_before[rid] = req.num_output_tokens
            if n == 1 and req.num_output_tokens > 0 and before == req.num_tokens - 1:
                decode += 1
                n_dec += 1
            else:
                prefill += n
                n_pre += 1
                attn += n * (before + n / 2)
        admitted = tuple(d.req_id for d in out.scheduled_new_reqs) + tuple(
            getattr(out.scheduled_cached_reqs, "resumed_req_ids", ()) or ()
        )
        self._pending = _Pending(
            output_id=id(out),
            start_s=start,
            scheduled=scheduled,
            out_before=out_before,
            prefill_tokens=prefill,
            decode_tokens=decode,
            num_prefill_seqs=n_pre,
            num_decode_seqs=n_dec,
            kv_tokens=kv_tokens,
            prefill_attn=attn,
            admitted=admitted,
            preempted=preempted,
        )

    def _report(self, pend: _Pending, end: float) -> None:
        finished: list[str] = []
        for rid in pend.scheduled:
            req = self.requests.get(rid)
            view = self._views.get(rid)
            if (
                view is not None
                and req is not None
                and req.num_output_tokens > pend.out_before[rid]
            ):
                view.saw_token(end)
            if req is None or req.is_finished():
                finished.append(rid)
        finished.extend(a for a in self._aborted if a not in finished)
        self._aborted.clear()
        for rid in finished:
            view = self._views.pop(rid, None)
            if view is not None and self._steplog.enabled:
                self._steplog.write(request_row(view, end))
        kv = self.kv_view()
        report = pend.report(end, kv.used_blocks, tuple(finished))
        duration = self._last_step_s = report.duration_s
        self.harness_policy.on_step(report)
        if self._steplog.enabled:
            self._steplog.write(
                {
                    "kind": "step",
                    "t_s": round(pend.start_s, 6),
                    "duration_s": round(duration, 6),
                    "prefill_tokens": pend.prefill_tokens,
                    "decode_tokens": pend.decode_tokens,
                    "num_prefill_seqs": pend.num_prefill_seqs,
                    "num_decode_seqs": pend.num_decode_seqs,
                    "batch_tokens": pend.prefill_tokens + pend.decode_tokens,
                    "kv_tokens": pend.kv_tokens,
                    "prefill_attn": pend.prefill_attn,
                    "kv_used_blocks": kv.used_blocks,
                    "num_running": len(self.running),
                    "num_waiting": len(self.waiting),
                    "preempted": len(pend.preempted),
                    "admitted": len(pend.admitted),
                    "finished": len(finished),
                }
            )

    def shutdown(self) -> None:
        self._steplog.close()
        super().shutdown()
