"""Column plans: a policy that plans from arrays, so a host that keeps its running set in arrays
(the vectorised simulator kernel) runs it without building per-request objects.

Why (issue 13): planning from :class:`~harness.policies.base.View`'s request objects costs a
few Python operations per running request per step; near capacity (hundreds running, a step per
arrival) that, not the engine, bounds a simulation. A :class:`ColumnPolicy` writes its rule
once, in :meth:`ColumnPolicy.plan_columns`, over :class:`RunningColumns`; its ``schedule`` (what
every object host calls: the engine core, the reference step, the built-in server, the vLLM and
SGLang adapters) builds the columns from the view and maps the plan back to request ids. So
there is one implementation per policy, whatever the host.

Host semantics are base.py's rules 1-5 unchanged; a :class:`ColumnPlan` is a
:class:`~harness.policies.base.Plan` whose items name running requests by position and waiting
requests by their place at the head of the host's queue (preempted first, then arrivals) or,
for a policy that orders the queue itself, by request object.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import NamedTuple

import numpy as np

from harness.policies.base import BasePolicy, KVView, Plan, RequestView, View, blocks_for


def decoding_mask(prompt: np.ndarray, output: np.ndarray, computed: np.ndarray) -> np.ndarray:
    """Which requests decode (base.is_decoding over columns): they have output and their KV
    covers all but the last token."""
    return (output > 0) & (prompt + output - computed == 1)


class RunningColumns(NamedTuple):
    """The running requests, one array entry per request in running (admission) order.

    Read-only: a host may hand out views of its own state. (A NamedTuple: built every step.)"""

    prompt: np.ndarray  # int64: num_prompt_tokens
    output: np.ndarray  # int64: num_output_tokens (generated so far)
    computed: np.ndarray  # int64: num_computed_tokens
    max_tokens: np.ndarray  # int64
    arrival: np.ndarray  # float64: arrival_s
    num_prefilling: int  # how many are not decoding (base.is_decoding), kept by the host
    # int64: a small integer naming each request for as long as the host holds it (through
    # preemptions), below ColumnView.num_keys: a policy keeps per-request state in arrays
    # indexed by it (the vectorised kernel: the trace row; object hosts: RequestKeys)
    key: np.ndarray
    last: np.ndarray  # float64: last_token_s, NaN before the first token
    tbt: np.ndarray  # float64: tbt_slo_s, NaN when the request has none

    def __len__(self) -> int:
        return len(self.prompt)

    def remaining(self) -> np.ndarray:
        """Tokens each can be given next step (base.remaining_tokens)."""
        return self.prompt + self.output - self.computed

    def split(self) -> tuple[np.ndarray, np.ndarray]:
        """``(decoding positions, prefilling positions)`` in running order
        (common.split_running's rule: has output, and its KV covers all but the last token);
        the usual cases from the prefilling count alone (none, or only the newest)."""
        n = len(self.prompt)
        if self.num_prefilling == 0:
            return (_SPAN[:n] if n <= len(_SPAN) else np.arange(n, dtype=np.int64)), NO_POSITIONS
        if self.num_prefilling == 1 and self.newest_prefills():  # the usual one: the newest
            if n <= len(_SPAN):
                return _SPAN[: n - 1], _SPAN[n - 1 : n]
            return np.arange(n - 1, dtype=np.int64), np.array([n - 1], dtype=np.int64)
        dec = decoding_mask(self.prompt, self.output, self.computed)
        return np.flatnonzero(dec), np.flatnonzero(~dec)

    def newest_prefills(self) -> bool:
        """Whether the newest (last) running request is not decoding: with one prefilling
        request it usually is the one (admissions join the end), a scalar check."""
        o = self.output.item(-1)  # (.item: a Python int, twice as quick as int(a[-1]))
        return not (o > 0 and self.prompt.item(-1) + o - self.computed.item(-1) == 1)

    def decoding(self) -> np.ndarray:
        """Positions of the decoding requests (base.is_decoding), in running order."""
        return self.split()[0]

    def block_counts(self, block_size: int) -> tuple[int, int]:
        """``(blocks held, requests at a block boundary)``: the sum of ceil(computed / block)
        and how many have computed a multiple of the block (decoding one more token opens a
        block for them). A host may answer it faster from its own state (the vectorised
        kernel: in C); the answer is this one."""
        full, part = np.divmod(self.computed, block_size)
        opening = len(part) - int(np.count_nonzero(part))
        return int(full.sum()) + len(part) - opening, opening

    def decode_blocks(self, positions: np.ndarray, block_size: int) -> int:
        """New KV blocks a decode step of the requests at ``positions`` allocates: those at a
        block boundary (common.decode_blocks_needed over columns)."""
        return int(np.count_nonzero(self.computed[positions] % block_size == 0))

    def decodes_fit(self, positions: np.ndarray, block_size: int, free: int) -> bool:
        """Whether those new blocks fit in ``free``; not counted when one block each would."""
        return len(positions) <= free or self.decode_blocks(positions, block_size) <= free

    def prefilling(self) -> np.ndarray:
        """Positions of the requests with prefill (or recompute) left, in running order."""
        return self.split()[1]


# no positions (shared, never written): ColumnPlan(NO_POSITIONS) runs nothing (None: everyone)
NO_POSITIONS = np.empty(0, np.int64)
# positions 0, 1, 2, ...: RunningColumns.split's usual answers are read-only views of it (two
# fresh arrays a plan cost more than the rest of a light plan's split)
_SPAN = np.arange(1 << 12, dtype=np.int64)
_SPAN.flags.writeable = False


class ColumnView(NamedTuple):
    """What :meth:`ColumnPolicy.plan_columns` reads: :class:`~harness.policies.base.View` with
    the running set as columns. The waiting queue is there twice: its requests' remaining
    tokens (``waiting_tokens``, enough for FCFS admission and the cheapest to read) and the
    request objects (``waiting``, host queue order, read lazily: for policies that order the
    queue themselves, through their hooks). A column policy reads the *running* set from the
    columns only: a host may hand out request objects that are current only while waiting."""

    now: float
    running: RunningColumns
    num_waiting: int
    waiting_tokens: Callable[[], Iterator[int]]  # remaining tokens, host queue order (lazy)
    waiting: Sequence[RequestView]  # host queue order
    kv: KVView
    token_budget: int
    max_num_seqs: int
    num_keys: int  # every RunningColumns.key is below it
    key_of: Callable[[RequestView], int]  # the key a waiting request runs under
    id_of: Callable[[int], str]  # the request id of a running request's key


@dataclass(slots=True)
class ColumnPlan:
    """A :class:`~harness.policies.base.Plan` by position.

    ``order``: running positions in run order, or None for every running request in running
    order; ``tokens``: the tokens of each (an int: the same for all). ``admit``: first-chunk
    sizes of the waiting queue's head, in host queue order; or ``admit_requests``: waiting
    requests (the objects of ``ColumnView.waiting`` or the hooks) with their first chunks, in
    admission order (at most one of the two). ``preempt``: running positions to evict first
    (rule 1); ``order`` may still list them (the host skips them, as a Plan's stale ids).
    ``steady`` / ``hold`` as in Plan. ``prefill_run`` (a speed hint, like ``steady``): a
    one-request plan whose request is in prefill, and the policy promises to plan the same
    request again, chunk after chunk (``tokens`` each, clipped to what is left), until its
    prompt is done, as long as each chunk's KV fits and nothing arrives: a host may then run
    those chunks without planning again (RAD's lone prefill, seed-rad-slai.md §3.3). On a
    plan that only admits one request (no run order), the same promise for the admitted
    request's chunks after its first, each the size it was admitted with. ``hold`` with
    ``prefill_run``: arrivals would not change those plans either (the policy's plan for a
    prefill in progress ignores the waiting queue), so a host may run the chunks past them.
    ``then_steady`` as in Plan: a host that keeps it runs :data:`EVERY_DECODE` instead of
    planning. ``steady_decodes`` (a speed hint, like ``steady``, for the vectorised kernel):
    the plan runs every decoding request one token and nobody else, the requests with prefill
    left waiting (RAD's decode batch while its prefill waits for KV), and the policy would
    plan exactly that again until the next finish or preemption (or arrival, unless
    ``hold``): a host may fast-forward those steps as a ``steady`` plan's, over the decoding
    requests (the kernel does when one request waits, the newest). The engine core ignores
    it (it fast-forwards only steps that run every running request). ``repeats`` (a speed
    hint for the vectorised kernel): the policy would return this very plan (the same order,
    tokens and flags) for every later step until an arrival (unless ``hold``), a finish, a
    preemption or an admission, and planning changes nothing the policy keeps. A host may
    then run those steps by it without asking: chiefly the step a ``steady`` (or
    ``steady_decodes``) run stops short of for its KV, where rule 2 preempts from the tail of
    this order, which a ``steady`` plan alone does not fix (its order may move with time).
    """

    order: np.ndarray | None = None
    tokens: np.ndarray | int = 0
    admit: list[int] | tuple[int, ...] = ()
    steady: bool = False
    hold: bool = False
    admit_requests: list[tuple[RequestView, int]] | tuple[()] = ()
    preempt: np.ndarray | None = None
    prefill_run: bool = False
    then_steady: bool = False
    steady_decodes: bool = False
    repeats: bool = False

    def items(self, n_running: int) -> tuple[np.ndarray, np.ndarray]:
        """``(positions, tokens)`` as arrays."""
        order = np.arange(n_running) if self.order is None else self.order
        tok = self.tokens
        if isinstance(tok, np.ndarray):
            return order, tok
        return order, np.full(len(order), tok, dtype=np.int64)


# The plan a ``then_steady`` promise stands for: every running request decodes one token, in
# running order (their blocks fit, so the order cannot matter), steady, and promising again
# (shared by the hosts, never written).
EVERY_DECODE = ColumnPlan(None, 1, steady=True, then_steady=True)


def admit_sizes(
    remaining: Iterable[int],
    budget_left: int,
    seats: int,
    *,
    token_budget: int,
    block_size: int,
    free_blocks: int,
    whole: bool = False,
    full_kv: bool = False,
) -> list[int]:
    """First-chunk sizes for the waiting requests with these remaining tokens, head first,
    while budget, seats and KV allow (the rule of :func:`harness.policies.common.admit_list`,
    which documents ``whole`` and ``full_kv``)."""
    out: list[int] = []
    free = free_blocks
    for rem in remaining:
        if budget_left <= 0 or seats <= 0:
            break
        oversize_alone = rem > token_budget and budget_left == token_budget
        if whole and rem > budget_left and not oversize_alone:
            break
        n = min(rem, budget_left)
        need = blocks_for(rem if full_kv else n, block_size)
        if need > free:
            break
        out.append(n)
        free -= need
        budget_left -= n
        seats -= 1
    return out


def admit_head(
    cv: ColumnView,
    budget_left: int,
    *,
    free_blocks: int | None = None,
    whole: bool = False,
    full_kv: bool = False,
) -> list[int]:
    """:func:`admit_sizes` for the head of ``cv``'s queue, with the seats the running set
    leaves and the free KV (or ``free_blocks``): :func:`harness.policies.common.admit_list`
    for a column plan."""
    seats = cv.max_num_seqs - len(cv.running)
    if not cv.num_waiting or budget_left <= 0 or seats <= 0:
        return []
    return admit_sizes(
        cv.waiting_tokens(),
        budget_left,
        seats,
        token_budget=cv.token_budget,
        block_size=cv.kv.block_size,
        free_blocks=cv.kv.free_blocks if free_blocks is None else free_blocks,
        whole=whole,
        full_kv=full_kv,
    )


def prefill_chunks(
    running: RunningColumns, positions: np.ndarray, budget: int
) -> tuple[np.ndarray, np.ndarray, int]:
    """Each position in turn gets its remaining tokens clipped to the budget left, stopping
    once the budget is spent: ``(positions listed, their tokens, budget left)``."""
    if len(positions) == 0 or budget <= 0:
        return NO_POSITIONS, NO_POSITIONS, budget
    want = running.prompt[positions] + running.output[positions] - running.computed[positions]
    before = np.cumsum(want) - want
    k = int(np.searchsorted(before, budget, side="left"))  # listed: budget left > 0 before it
    got = np.minimum(want[:k], budget - before[:k])
    return positions[:k], got, budget - int(got.sum())


class RequestKeys:
    """``RunningColumns.key`` on an object host: a small integer per request id, given when
    the request is first seen running and kept while the host holds it (waiting again after a
    preemption too), so a column policy's per-request arrays are indexed alike on every host
    (the vectorised kernel uses trace rows). Keys are never reused: a policy's arrays grow
    with the requests the host has served (8 bytes a request per array). Ids the host no
    longer holds (finished, aborted) are dropped, amortised O(1) per request."""

    __slots__ = ("_of", "_id", "next")

    def __init__(self) -> None:
        self._of: dict[str, int] = {}
        self._id: dict[int, str] = {}  # the inverse
        self.next = 0  # ColumnView.num_keys

    def key(self, rid: str) -> int:
        """The key of request ``rid`` (a new one if it has none)."""
        k = self._of.get(rid)
        return self._new(rid) if k is None else k

    def key_of(self, r: RequestView) -> int:
        """The key of request ``r`` (ColumnView.key_of)."""
        return self.key(r.request_id)

    def id_of(self, key: int) -> str:
        """The request id of ``key`` (ColumnView.id_of)."""
        return self._id[key]

    def _new(self, rid: str) -> int:
        k = self._of[rid] = self.next
        self._id[k] = rid
        self.next += 1
        return k

    def of(self, view: View) -> np.ndarray:
        """The keys of ``view.running``, in running order."""
        of = self._of
        run = view.running
        keys = [of[rid] if (rid := r.request_id) in of else self._new(rid) for r in run]
        if len(of) > 2 * (len(run) + len(view.waiting)) + 1024:
            held = {r.request_id for r in run}
            held.update(r.request_id for r in view.waiting)
            self._of = {rid: k for rid, k in of.items() if rid in held}
            self._id = {k: rid for rid, k in self._of.items()}
        return np.array(keys, dtype=np.int64)


def per_key(values: np.ndarray, num_keys: int, fill: float | int) -> np.ndarray:
    """``values`` (a policy's per-key state, RunningColumns.key) with room for ``num_keys``
    keys, new entries ``fill``: itself when it has room, else grown by doubling (amortised
    O(1) a request)."""
    n = len(values)
    if num_keys <= n:
        return values
    grown = np.full(max(num_keys, 2 * n, 64), fill, dtype=values.dtype)
    grown[:n] = values
    return grown


def _nan_none(v: float | None) -> float:
    return math.nan if v is None else v


def columns_of(view: View, keys: RequestKeys | None = None) -> ColumnView:
    """The columns of an object host's view (what ``ColumnPolicy.schedule`` plans from);
    ``keys``: the policy's :class:`RequestKeys` (a fresh one names requests for this call
    only)."""
    if keys is None:
        keys = RequestKeys()
    run = view.running
    n = len(run)
    prompt = np.fromiter((r.num_prompt_tokens for r in run), np.int64, n)
    output = np.fromiter((r.num_output_tokens for r in run), np.int64, n)
    computed = np.fromiter((r.num_computed_tokens for r in run), np.int64, n)
    max_tokens = np.fromiter((r.max_tokens for r in run), np.int64, n)
    arrival = np.fromiter((r.arrival_s for r in run), np.float64, n)
    last = np.fromiter((_nan_none(r.last_token_s) for r in run), np.float64, n)
    tbt = np.fromiter((_nan_none(r.tbt_slo_s) for r in run), np.float64, n)
    n_pre = n - int(np.count_nonzero(decoding_mask(prompt, output, computed)))
    waiting = view.waiting

    def waiting_tokens() -> Iterator[int]:
        return (r.num_tokens - r.num_computed_tokens for r in waiting)

    running = RunningColumns(
        prompt, output, computed, max_tokens, arrival, n_pre, keys.of(view), last, tbt
    )
    return ColumnView(
        now=view.now,
        running=running,
        num_waiting=len(waiting),
        waiting_tokens=waiting_tokens,
        waiting=waiting,
        kv=view.kv,
        token_budget=view.token_budget,
        max_num_seqs=view.max_num_seqs,
        num_keys=keys.next,
        key_of=keys.key_of,
        id_of=keys.id_of,
    )


def plan_of(cp: ColumnPlan, view: View) -> Plan:
    """The request-id :class:`~harness.policies.base.Plan` of a column plan over ``view``."""
    run = view.running
    order, tokens = cp.items(len(run))
    items = [(run[i].request_id, t) for i, t in zip(order.tolist(), tokens.tolist(), strict=True)]
    if cp.admit_requests:
        admit = [(r.request_id, n) for r, n in cp.admit_requests]
    else:
        admit = [
            (r.request_id, n)
            for r, n in zip(islice(view.waiting, len(cp.admit)), cp.admit, strict=True)
        ]
    preempt = [] if cp.preempt is None else [run[i].request_id for i in cp.preempt.tolist()]
    return Plan(
        run=items,
        admit=admit,
        preempt=preempt,
        steady=cp.steady,
        hold=cp.hold,
        then_steady=cp.then_steady,
    )


class ColumnPolicy(BasePolicy):
    """Base of the policies that plan from columns (module docstring).

    Subclasses implement :meth:`plan_columns`, and may keep state through ``on_arrival`` /
    ``on_step`` (every host calls them; the vectorised kernel skips the quiet steps of an
    ``on_step`` marked :func:`~harness.policies.base.hears_changes_only`). A subclass that
    overrides ``schedule`` plans by another path, so column hosts do not take it
    (:func:`column_planner`)."""

    def plan_columns(self, cv: ColumnView) -> ColumnPlan:  # pragma: no cover - abstract
        raise NotImplementedError

    def request_keys(self) -> RequestKeys:
        """This policy's keys for object hosts' requests (RunningColumns.key)."""
        keys = self.__dict__.get("_request_keys")
        if keys is None:  # made here: subclasses' __init__ need not call ours
            keys = self._request_keys = RequestKeys()
        return keys

    def columns(self, view: View) -> ColumnView:
        """The columns of an object host's view, keyed by this policy's keys."""
        return columns_of(view, self.request_keys())

    def schedule(self, view: View) -> Plan:
        return plan_of(self.plan_columns(self.columns(view)), view)


def column_planner(policy: object) -> Callable[[ColumnView], ColumnPlan] | None:
    """``policy.plan_columns`` if a column host may plan ``policy`` through it: its
    ``schedule`` is :class:`ColumnPolicy`'s (a subclass that overrides it plans otherwise).
    Otherwise None."""
    if not isinstance(policy, ColumnPolicy) or type(policy).schedule is not ColumnPolicy.schedule:
        return None
    return policy.plan_columns


def has_hooks(policy: object) -> bool:
    """Whether ``policy`` has an ``on_arrival`` or ``on_step`` of its own (a host that has
    no request objects to spare may skip calling no-op hooks)."""
    cls = type(policy)
    return (
        getattr(cls, "on_arrival", BasePolicy.on_arrival) is not BasePolicy.on_arrival
        or getattr(cls, "on_step", BasePolicy.on_step) is not BasePolicy.on_step
    )


__all__ = [
    "EVERY_DECODE",
    "NO_POSITIONS",
    "ColumnPlan",
    "ColumnPolicy",
    "ColumnView",
    "RequestKeys",
    "RunningColumns",
    "admit_head",
    "admit_sizes",
    "column_planner",
    "columns_of",
    "decoding_mask",
    "has_hooks",
    "per_key",
    "plan_of",
    "prefill_chunks",
]
