"""``class-priority``: work-conserving mixed batching with a non-preemptive class priority.

This is the per-agent scheduler of seed 004's Rybko-Stolyar experiment (seed-stability.md §2.6,
paper §4.3, Fig. 8): "all agents use work-conserving (mixed batch) scheduling algorithms", an
agent gives "non-preemptive priority" to one class, "within a type [it] uses decode-priority
FCFS", and the lower class's tokens are mixed in "only when [the higher class's] tokens cannot
form a full batch".

Rules, applied once per step over the token budget ``b`` (``View.token_budget``):

1. Classes are served in rank order (``classes``, highest first; a label not listed ranks
   below every listed one, so the policy with no ``classes`` is one class). A lower class gets
   only the budget the higher classes leave (§2.6; §7 REC 18: priority is re-evaluated at every
   batch formation and the lower class only fills leftover budget).
2. Within a class, decode-priority FCFS (§2.6, i.e. Sarathi's rule, §2.3): every decoding
   request gets its one decode token (running order), then ongoing prefills get chunks
   (running order), then waiting requests are admitted FCFS with a first chunk of what is left.
   Prefill is token-granular, so the batch is full whenever the work allows: work-conserving
   (§2.1, Eq. 2.6).
3. Non-preemptive: nothing already loaded is evicted for priority and no KV is discarded
   (§7 REC 18). A lower-class request that gets no tokens this step is only paused (it keeps
   its KV, base.py rule 4); the host preempts only for KV shortage, taking victims from the
   run-order tail, which is the lowest class (base.py rule 2).

A request's class label (``class_by``):

- ``tier``: the request's tier (``RequestView.tier``);
- ``type``: the session type of an agent-graph call, the request id's prefix before the last
  ``-`` of its session id (agent graphs name sessions ``<type>-<k>`` and calls
  ``<session>/<call index>``, harness/workload/sources/conversations.py ``agent_sessions``):
  Rybko-Stolyar's A and B;
- ``hop``: the call index of an agent-graph call (the digits after the last ``/``): in
  Rybko-Stolyar hop 0 is each type's short first task, hop 1 its long second one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from harness.policies.base import (
    BasePolicy,
    BudgetRule,
    Plan,
    RequestView,
    StepReport,
    View,
    blocks_for,
)
from harness.policies.common import SortedWaiting, split_running
from harness.policies.registry import register

CLASS_BY = ("tier", "type", "hop")


def class_label(r: RequestView, class_by: str) -> str:
    """The class label of ``r`` under ``class_by`` (module docstring)."""
    if class_by == "tier":
        return str(r.tier)
    rid = r.request_id
    session, sep, call = rid.rpartition("/")
    if class_by == "hop":
        return call if sep else "0"
    base = session if sep else rid
    kind, dash, _ = base.rpartition("-")
    return kind if dash else base


def parse_classes(value: Any) -> tuple[str, ...]:
    """``"B,A"`` / ``["B", "A"]`` / None -> ``("B", "A")`` / ``()`` (highest priority first)."""
    if value is None:
        return ()
    items = value.split(",") if isinstance(value, str) else [str(v) for v in value]
    out = tuple(s.strip() for s in items if s.strip())
    if len(set(out)) != len(out):
        raise ValueError(f"class-priority classes {value!r} name a class twice")
    return out


def _no_key(r: RequestView) -> int:
    """Every waiting request alike: within a class, the host's queue order alone."""
    return 0


@register("class-priority")
class ClassPriorityPolicy(BasePolicy):
    """Non-preemptive class priority over decode-priority FCFS mixed batches (seed 004 §4.3)."""

    def __init__(self, classes: str | Sequence[str] | None = None, class_by: str = "tier"):
        if class_by not in CLASS_BY:
            raise ValueError(f"class-priority class_by must be one of {CLASS_BY}, not {class_by!r}")
        self.classes = ",".join(parse_classes(classes))
        self.class_by = class_by
        self._rank = {c: i for i, c in enumerate(parse_classes(classes))}
        self._cache: dict[str, int] = {}  # request_id -> rank (labels never change)
        # with two classes or more: each class's waiting requests, host order, kept by the hooks
        self._wq = SortedWaiting(_no_key, len(self._rank) + 1, self.rank, host_order=True)

    def rank(self, r: RequestView) -> int:
        """0 = the highest class; unlisted labels share the lowest rank."""
        k = self._cache.get(r.request_id)
        if k is None:
            k = self._rank.get(class_label(r, self.class_by), len(self._rank))
            self._cache[r.request_id] = k
        return k

    def _groups(self, reqs: Sequence[RequestView]) -> dict[int, list[RequestView]]:
        out: dict[int, list[RequestView]] = {}
        for r in reqs:
            out.setdefault(self.rank(r), []).append(r)
        return out

    def _waiting_by_class(self, view: View) -> Callable[[int], Iterator[RequestView]]:
        """Class ``k``'s waiting requests in the host's queue order. With one class, the
        view's queue; else the per-class queues the hooks keep (``SortedWaiting`` in host
        order), so a step reads only what it admits, never the whole queue (issue 13: under
        overload a class with nobody waiting made every step scan the other classes' backlog)."""
        if not self._rank:  # one class: the queue itself
            return lambda k: iter(view.waiting) if k == 0 else iter(())
        self._wq.sync(view)
        return self._wq.iter

    def schedule(self, view: View) -> Plan:
        budget = view.token_budget
        bs = view.kv.block_size
        free = view.kv.free_blocks
        decoding, prefilling = split_running(view.running)
        dec = self._groups(decoding)
        pre = self._groups(prefilling)
        # waiting is read lazily, class by class, as far as admissions go (it can be long
        # under overload)
        wait = self._waiting_by_class(view)
        seats = view.max_num_seqs - len(view.running)
        run: list[tuple[str, int]] = []
        admit: list[tuple[str, int]] = []
        all_granted = True
        any_prefill = False
        blocked = False  # the host admits head-of-line: one misfit stops all later admissions
        for k in range(len(self._rank) + 1):  # every rank, highest first (rank())
            # rule 2: decodes first, one token each (the whole running set is listed, 0 tokens
            # once the budget is spent, so KV victims come from the lowest class: rule 3)
            for r in dec.get(k, ()):
                g = 1 if budget > 0 else 0
                if g and r.num_computed_tokens % bs == 0:
                    free -= 1
                run.append((r.request_id, g))
                budget -= g
                all_granted = all_granted and g == 1
            for r in pre.get(k, ()):
                c = r.num_computed_tokens
                n = max(0, min(r.num_tokens - c, budget))
                any_prefill = True
                free -= blocks_for(c + n, bs) - blocks_for(c, bs)
                run.append((r.request_id, n))
                budget -= n
            if blocked or budget <= 0 or seats <= 0:
                continue  # no admission this step (the loop below would stop at once)
            for r in wait(k):
                n = min(r.num_tokens - r.num_computed_tokens, budget)
                need = blocks_for(n, bs)
                if need > free:
                    blocked = True
                    break
                admit.append((r.request_id, n))
                free -= need
                budget -= n
                seats -= 1
                if budget <= 0 or seats <= 0:
                    break  # before asking for the next one: that could read the whole queue
        steady = not any_prefill and not admit and all_granted
        return Plan(run=run, admit=admit, steady=steady)

    def on_arrival(self, request: RequestView, now: float) -> None:
        if self._rank:
            self._wq.add(request)

    def on_step(self, report: StepReport) -> None:
        if self._rank:
            self._wq.on_step(report)
        for rid in report.finished:
            self._cache.pop(rid, None)

    def budget_rule(self) -> BudgetRule | None:
        """With one class (no ``classes``) the rules above are decode-priority FCFS with
        token-granular chunks: exactly the FCFS token-budget rule (base.BudgetRule; its
        admission KV check is the host's), so a host may execute it by its own path. The
        rank cache ``on_step`` keeps is only a memo, and the hooks keep no queue with one
        class; skipping them changes no plan."""
        return None if self._rank else BudgetRule()

    def params(self) -> dict[str, Any]:
        return {"classes": self.classes, "class_by": self.class_by}
