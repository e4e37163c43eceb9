"""The engine core: the reference host of the policy contract.

One iteration-level engine with KV accounting in blocks, chunked prefill, recompute preemption and
``max_tokens`` enforcement (ignore-EOS). It has no clock of its own: ``step(now)`` executes one
step that starts at ``now`` and takes the cost model's duration, so the discrete-event simulator
(virtual time) and the built-in server (wall clock) share it (style-examples take-away 6).

Host semantics are exactly those of :mod:`harness.policies.base` (docstring, rules 1-5); the
comments below cite the rule they implement. Token accounting follows vLLM v1
(anchors-engines.md §1.4): ``num_computed_tokens`` catches up with ``num_tokens``; a request
samples one output token at the end of a step in which it caught up.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import islice
from operator import attrgetter
from typing import Any

import numpy as np

from harness.engine.config import EngineConfig
from harness.engine.costmodel import CostModel
from harness.engine.prefix_cache import PrefixCache, PromptIdentity
from harness.engine.waiting_queue import WaitingQueue
from harness.policies.base import KVView, Plan, Policy, StepReport, View

WAITING = 0
RUNNING = 1
FINISHED = 2
ABORTED = 3
REJECTED = 4


class EngineRequest:
    """One request's state; satisfies :class:`harness.policies.base.RequestView`."""

    __slots__ = (
        "request_id",
        "arrival_s",
        "num_prompt_tokens",
        "num_output_tokens",
        "num_computed_tokens",
        "max_tokens",
        "predicted_output_len",
        "tier",
        "priority",
        "ttft_slo_s",
        "tbt_slo_s",
        "first_token_s",
        "last_token_s",
        "num_preemptions",
        "num_blocks",
        "status",
        "index",
        "data",
        "finish_s",
        "identity",
        "block_ids",
        "num_cached_tokens",
        "hit_epoch",
    )

    def __init__(
        self,
        request_id: str,
        arrival_s: float,
        num_prompt_tokens: int,
        max_tokens: int,
        *,
        predicted_output_len: int | None = None,
        tier: str = "default",
        priority: int = 0,
        ttft_slo_s: float | None = None,
        tbt_slo_s: float | None = None,
        index: int = -1,
        data: Any = None,
        identity: PromptIdentity | None = None,
    ) -> None:
        self.request_id = request_id
        self.arrival_s = arrival_s
        self.num_prompt_tokens = num_prompt_tokens
        self.num_output_tokens = 0
        self.num_computed_tokens = 0
        self.max_tokens = max_tokens
        self.predicted_output_len = predicted_output_len
        self.tier = tier
        self.priority = priority
        self.ttft_slo_s = ttft_slo_s
        self.tbt_slo_s = tbt_slo_s
        self.first_token_s: float | None = None
        self.last_token_s: float | None = None
        self.num_preemptions = 0
        self.num_blocks = 0
        self.status = WAITING
        self.index = index
        self.data = data
        self.finish_s: float | None = None
        self.identity = identity
        # ids of the cached (hashed) blocks it holds: always its first len(block_ids) blocks
        self.block_ids: list[int] = _NO_BLOCKS
        self.num_cached_tokens = -1  # prefix-cache hit at first admission (vLLM's field)
        self.hit_epoch = -1  # eviction count when its waiting hit was last computed

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + self.num_output_tokens

    def __repr__(self) -> str:
        return (
            f"EngineRequest({self.request_id!r}, prompt={self.num_prompt_tokens}, "
            f"out={self.num_output_tokens}/{self.max_tokens}, computed={self.num_computed_tokens})"
        )


_NO_BLOCKS: list[int] = []  # shared, never mutated (requests without cached blocks)
_request_id = attrgetter("request_id")


class _WaitingSeq(Sequence):
    """Read-only view of ``waiting`` (preempted requests first, then arrivals in order).

    Iteration is O(1) per item; indexing walks (policies normally iterate from the head)."""

    __slots__ = ("_q",)

    def __init__(self, q: WaitingQueue[EngineRequest]) -> None:
        self._q = q

    def __len__(self) -> int:
        return len(self._q)

    def __iter__(self) -> Iterator[EngineRequest]:
        return iter(self._q)

    def __getitem__(self, idx):  # type: ignore[no-untyped-def]
        if isinstance(idx, slice):
            start, stop, step = idx.indices(len(self._q))
            if step == 1:
                return list(islice(iter(self._q), start, stop))
            return list(self._q)[idx]
        return self._q[idx]


@dataclass(slots=True)
class StepOutcome:
    """What one call to :meth:`EngineCore.step` did.

    ``sampled`` got ``tokens_each`` new tokens each (1, or the number of fast-forwarded steps);
    their times are ``step_ends`` (one per step). ``scheduled`` lists ``(request_id, tokens,
    is_decode)`` for the first (or only) step, in execution order.
    """

    start_s: float
    duration_s: float
    num_steps: int
    step_ends: np.ndarray
    sampled: list[EngineRequest]
    tokens_each: int
    finished: list[EngineRequest]
    preempted: list[str]
    admitted: list[str]
    # the list itself, or (sched, prefill ids) from which EngineCore.step builds it on demand:
    # only tests and telemetry read it, so a step does not pay a tuple per scheduled request
    scheduled_src: list[tuple[str, int, bool]] | tuple[dict, set]
    report: StepReport | None
    idle: bool = False
    plan_bugs: list[str] = field(default_factory=list)

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s

    @property
    def scheduled(self) -> list[tuple[str, int, bool]]:
        src = self.scheduled_src
        if isinstance(src, list):
            return src
        sched, pre = src
        return [(rid, n, rid not in pre) for rid, (_r, n) in sched.items()]

    @property
    def tokens(self) -> list[tuple[str, int]]:
        """``(request_id, new tokens sampled at step end)`` per request."""
        return [(r.request_id, self.tokens_each) for r in self.sampled]


# Fast-forward runs up to this many steps are summed in scalars (decode_run_ends).
_SCALAR_RUN = 32


def _blocks(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


def decode_run_ends(
    cost_model: Any, now: float, k_max: int, n_decode: int, kv_read: int, until: float
) -> np.ndarray:
    """End times of the identical decode steps a fast-forward runs from ``now``: at most
    ``k_max`` (>= 2), and step j (0-based) only if its start (``ends[j-1]``) is before
    ``until``; at least one (the fast-forward rule of both simulator kernels).

    Short runs (most: a fast-forward usually stops at the next arrival a few steps on) are
    summed in scalars, which costs less than the vector calls' set-up; the scalar
    ``step_time`` does the vector ``step_times``'s arithmetic in the same order and the sum
    is as sequential as ``np.cumsum``, so the ends are the same floats. A run is short when
    ``k_max`` is, or when ``until`` comes within that many of its first (shortest) step: an
    affine model's decode steps only grow with the KV read."""
    # step_time(0, n, kv) is fixed + rate * kv, bit for bit, where the model says so
    affine = getattr(cost_model, "decode_affine", None)
    fixed, rate = affine(n_decode) if affine is not None else (0.0, 0.0)
    short = k_max <= _SCALAR_RUN
    if not short and affine is not None and rate >= 0 and n_decode >= 0:
        first = fixed + rate * kv_read
        short = first > 0 and until - now < _SCALAR_RUN * first
    if short:
        ends: list[float] = []
        acc = 0.0  # 0.0 + d is d: the same sum as np.cumsum's
        step_time = cost_model.step_time
        attn = {"prefill_attn": 0.0} if getattr(cost_model, "uses_prefill_attn", False) else {}
        for j in range(k_max):
            if j and ends[-1] >= until:
                break
            kv = kv_read + j * n_decode
            acc += fixed + rate * kv if affine is not None else step_time(0, n_decode, kv, **attn)
            ends.append(now + acc)
        return np.array(ends)
    k_all = k_max
    if affine is not None:
        # an affine model's steps take at least the first's time (rate >= 0), so the steps
        # that start before ``until`` are fewer than (until - now) / first + 1: the rest are
        # not summed (+2 for the sums' rounding). The same ends up to there.
        first = fixed + rate * kv_read
        if rate >= 0 and n_decode >= 0 and first > 0 and until - now < k_max * first:
            k_all = max(1, min(k_max, int((until - now) / first) + 3))
        # fixed + rate * kv is step_time's float for each step (decode_affine), here as
        # three array operations instead of step_times' dozen
        durs = fixed + rate * (kv_read + np.arange(k_all) * n_decode)
    else:
        i = np.arange(k_all)
        durs = cost_model.step_times(
            np.zeros(k_all), np.full(k_all, n_decode), kv_read + i * n_decode
        )
    ends = now + np.cumsum(durs)
    k = 1 + int(np.searchsorted(ends[:-1], until, side="left"))
    return ends[: max(1, min(k, k_all))]


def decode_steps_that_fit(comp: np.ndarray, k_max: int, block_size: int, free: int) -> int:
    """The most identical decode steps (<= ``k_max``) whose KV blocks fit: requests with
    ``comp`` computed tokens hold step 1's blocks already; steps 2..k may take ``free`` more
    (binary search; the fast-forward bound of both simulator kernels)."""
    bs = block_size
    # steps 2..k add k - 1 tokens, so each request opens at most ceil((k - 1) / bs) blocks:
    # when that many fit for all, no need to count (numpy's int64 division is ~5 us a call)
    if len(comp) * ((k_max + bs - 2) // bs) <= free:
        return k_max
    held = (comp + bs) // bs  # blocks for comp + 1 tokens

    def extra_blocks(k: int) -> int:
        return int(((comp + k + bs - 1) // bs - held).sum())

    if extra_blocks(k_max) <= free:
        return k_max
    lo, hi = 1, k_max  # extra_blocks(lo) == 0 <= free, extra_blocks(hi) > free
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if extra_blocks(mid) <= free:
            lo = mid
        else:
            hi = mid
    return lo


def fit_problem(prompt_len: int, max_tokens: int, block_size: int, total_blocks: int) -> str | None:
    """Why a request can never run in a KV cache of ``total_blocks``, or None if it can.

    Its KV peaks at ``prompt + max_tokens - 1`` tokens (the last sampled token is never fed
    back), which must fit in the whole cache.
    """
    if prompt_len < 1:
        return f"prompt_len={prompt_len} must be >= 1"
    if max_tokens < 1:
        return f"max_tokens={max_tokens} must be >= 1"
    peak = prompt_len + max_tokens - 1
    if _blocks(peak, block_size) > total_blocks:
        return (
            f"needs {peak} KV tokens (prompt {prompt_len} + max_tokens {max_tokens} - 1) "
            f"but the KV cache holds {total_blocks * block_size}"
        )
    return None


class EngineCore:
    """Iteration-level engine hosting one :class:`~harness.policies.base.Policy`.

    Counters for telemetry: ``num_waiting``, ``num_running``, ``kv_usage``,
    ``kv_used_tokens``, ``preemptions_total``, ``num_rejected``, ``num_finished``,
    ``num_steps_total``.
    """

    def __init__(
        self, policy: Policy, cost_model: CostModel, config: EngineConfig | None = None
    ) -> None:
        self.policy = policy
        self.cost_model = cost_model
        self.config = config or EngineConfig(kv_tokens=1 << 20)
        self.block_size = self.config.block_size
        self.total_blocks = self.config.total_blocks
        self.used_blocks = 0
        self.token_budget = self.config.token_budget
        # cost models with per-request context terms get the prefill attention work too
        self._prefill_attn = bool(getattr(cost_model, "uses_prefill_attn", False))
        # A policy may declare that its preemptions lose progress (MC-SF's baselines clear
        # requests "back to the waiting queue as unprocessed", seed-mcsf.md §3.1, §7 A7).
        self._restart = bool(getattr(policy, "preempt_restarts", False))
        self.max_num_seqs = self.config.max_num_seqs
        self._requests: dict[str, EngineRequest] = {}
        # preempted at the front (latest first), then arrivals in order
        self._waiting: WaitingQueue[EngineRequest] = WaitingQueue()
        self._running: list[EngineRequest] = []  # admission order
        self.preemptions_total = 0
        self.num_rejected = 0
        self.num_finished = 0
        self.num_steps_total = 0
        self.rejections: dict[str, str] = {}
        self.last_step_s: float | None = None
        # Prefix caching (vLLM v1, harness.engine.prefix_cache): None when off. ``_pc_live``
        # counts requests with an identity so plain traces skip every prefix-cache branch.
        self.prefix_cache: PrefixCache | None = (
            PrefixCache() if self.config.prefix_caching else None
        )
        self._pc_live = 0
        self._promised = False  # the last plan's then_steady held after its step

    # ------------------------------------------------------------------ counters
    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def kv_used_tokens(self) -> int:
        return self.used_blocks * self.block_size

    @property
    def kv_usage(self) -> float:
        return self.used_blocks / self.total_blocks

    @property
    def prefix_cache_queries(self) -> int:
        """Prompt tokens looked up at first admission (vLLM ``prefix_cache_queries``)."""
        return self.prefix_cache.queries if self.prefix_cache is not None else 0

    @property
    def prefix_cache_hits(self) -> int:
        """Of which found in the prefix cache (vLLM ``prefix_cache_hits``)."""
        return self.prefix_cache.hits if self.prefix_cache is not None else 0

    def cached_tokens(self, identity: PromptIdentity) -> int:
        """Prompt tokens a request with ``identity`` would find cached now (read-only probe
        for prefix-aware routers; capped like admission: the last token is recomputed)."""
        pc = self.prefix_cache
        if pc is None or not pc.by_hash:
            return 0
        bs = self.block_size
        n = (identity.num_prompt_tokens - 1) // bs
        return len(pc.longest_hit(identity.block_hashes(bs, n), n)) * bs

    def has_work(self) -> bool:
        return bool(self._running or len(self._waiting))

    def get(self, request_id: str) -> EngineRequest | None:
        return self._requests.get(request_id)

    @property
    def running(self) -> list[EngineRequest]:
        return list(self._running)

    @property
    def waiting(self) -> list[EngineRequest]:
        return list(self._waiting)

    # ------------------------------------------------------------------ requests
    def fit_problem(self, prompt_len: int, max_tokens: int) -> str | None:
        """Why a request of this size can never run here, or None if it can."""
        return fit_problem(prompt_len, max_tokens, self.block_size, self.total_blocks)

    def add_request(
        self,
        request_id: str,
        prompt_len: int,
        max_tokens: int,
        *,
        arrival_s: float,
        tier: str = "default",
        priority: int = 0,
        ttft_slo_s: float | None = None,
        tbt_slo_s: float | None = None,
        predicted_output_len: int | None = None,
        index: int = -1,
        data: Any = None,
        identity: PromptIdentity | None = None,
    ) -> bool:
        """Queue a request. Returns False (reason in ``rejections[request_id]``, counted in
        ``num_rejected``) when it can never fit; raises ValueError on a duplicate id.

        ``identity`` names its tokens for the prefix cache (ignored when prefix caching is
        off); its prompt length must equal ``prompt_len``."""
        if request_id in self._requests:
            raise ValueError(f"duplicate request_id {request_id!r}")
        problem = self.fit_problem(prompt_len, max_tokens)
        if problem is not None:
            self.num_rejected += 1
            self.rejections[request_id] = problem
            return False
        if predicted_output_len is None and self.config.known_output_lengths:
            predicted_output_len = max_tokens
        r = EngineRequest(
            request_id,
            arrival_s,
            int(prompt_len),
            int(max_tokens),
            predicted_output_len=predicted_output_len,
            tier=tier,
            priority=priority,
            ttft_slo_s=ttft_slo_s,
            tbt_slo_s=tbt_slo_s,
            index=index,
            data=data,
        )
        if identity is not None and self.prefix_cache is not None:
            if identity.num_prompt_tokens != r.num_prompt_tokens:
                raise ValueError(
                    f"{request_id!r}: identity has {identity.num_prompt_tokens} prompt tokens, "
                    f"prompt_len is {r.num_prompt_tokens}"
                )
            r.identity = identity
            self._pc_live += 1
        self._requests[request_id] = r
        self._waiting.append(r)
        self.policy.on_arrival(r, arrival_s)
        return True

    def abort(self, request_id: str) -> bool:
        """Drop a request wherever it is, freeing its KV. False if unknown or already done."""
        r = self._requests.pop(request_id, None)
        if r is None:
            return False
        if r.status == RUNNING:
            self._running.remove(r)
            self._free(r)
        elif r.status == WAITING:
            self._waiting.remove(r)
        r.status = ABORTED
        if r.identity is not None:
            self._pc_live -= 1
        return True

    def _free(self, r: EngineRequest) -> None:
        """Free a request's KV. Its cached blocks stay cached (LRU) until evicted; the
        rest go back as never-cached free blocks (vLLM ``KVCacheManager.free``)."""
        ids = r.block_ids
        if ids:
            assert self.prefix_cache is not None
            self.used_blocks -= r.num_blocks - len(ids) + self.prefix_cache.release(ids)
            r.block_ids = _NO_BLOCKS
        else:
            self.used_blocks -= r.num_blocks
        r.num_blocks = 0

    def _make_room(self, n: int) -> None:
        """About to take ``n`` free blocks: evict cached free blocks (LRU head) for the part
        the never-cached free blocks do not cover (vLLM pops the free queue's head)."""
        pc = self.prefix_cache
        if pc is not None and pc.lru:
            over = n - (self.total_blocks - self.used_blocks - len(pc.lru))
            if over > 0:
                pc.evict(over)

    def _refresh_waiting_hits(self) -> None:
        """A waiting request's cached prefix counts as computed in the policy's view, as vLLM
        counts it when it schedules the request and as the vLLM adapter shows it
        (adapters/vllm/view.py): the policy then budgets only the tokens to compute. Blocks
        only disappear by eviction, so a hit is re-walked from the start only after one;
        otherwise it is extended (one lookup per request and step). Only the first
        ``max_num_seqs`` waiting requests are refreshed, so an overloaded queue costs no more
        per step; a deeper one a policy admits is looked up at admission anyway."""
        pc = self.prefix_cache
        assert pc is not None
        by, bs, epoch = pc.by_hash, self.block_size, pc.evictions
        for r in islice(self._waiting, self.max_num_seqs):
            ident = r.identity
            if ident is None:
                continue
            nmax = (r.num_prompt_tokens + r.num_output_tokens - 1) // bs
            k = r.num_computed_tokens // bs if r.hit_epoch == epoch else 0
            if k < nmax:
                hashes = ident.block_hashes(bs, nmax)
                while k < nmax and hashes[k] in by:
                    k += 1
            r.num_computed_tokens = k * bs
            r.hit_epoch = epoch

    def _cache_full_blocks(self, r: EngineRequest, upto: int) -> None:
        """Hash and cache the request's blocks that are full once ``upto`` tokens are computed
        (vLLM caches them at allocation, so a request scheduled later in the same step can
        already hit them)."""
        bs = self.block_size
        nfull = upto // bs
        ids = r.block_ids
        if nfull <= len(ids):
            return
        assert self.prefix_cache is not None and r.identity is not None
        if ids is _NO_BLOCKS:
            ids = r.block_ids = []
        hashes = r.identity.block_hashes(bs, nfull)
        add = self.prefix_cache.add
        for i in range(len(ids), nfull):
            ids.append(add(hashes[i]))

    def _preempt(self, r: EngineRequest) -> None:
        """Recompute preemption (base.py rule 1/2): free KV, computed := 0, front of waiting."""
        self._running.remove(r)
        self._free(r)
        r.num_computed_tokens = 0
        r.hit_epoch = -1
        r.num_preemptions += 1
        if self._restart:  # progress lost: its output is generated again from the prompt
            r.num_output_tokens = 0
            r.first_token_s = r.last_token_s = None
        r.status = WAITING
        self._waiting.appendleft(r)
        self.preemptions_total += 1

    def view(self, now: float) -> View:
        return View(
            now=now,
            waiting=_WaitingSeq(self._waiting),
            running=tuple(self._running),
            kv=KVView(self.block_size, self.total_blocks, self.used_blocks),
            token_budget=self.token_budget,
            max_num_seqs=self.max_num_seqs,
            last_step_s=self.last_step_s,
        )

    # ------------------------------------------------------------------ the step
    def step(
        self,
        now: float,
        fast_forward_until: float | None = None,
        hold_until: float | None = None,
    ) -> StepOutcome:
        """Execute one step starting at ``now`` (rules 1-5 of base.py).

        With ``fast_forward_until`` set and a ``steady`` plan that decodes every running request,
        the host also executes the following identical decode steps in closed form, as long as
        each starts strictly before ``fast_forward_until`` (the next arrival), no request
        finishes before the last one, and KV blocks suffice (rule: Plan.steady). A plan that also
        ``hold``s runs up to ``hold_until`` instead (the simulator's stop time): arrivals would
        not change it, so they join ``waiting`` after the run, at their own times.
        """
        if self._pc_live:
            self._refresh_waiting_hits()
        plan = self._promised_plan() if self._promised and fast_forward_until is not None else None
        self._promised = False
        if plan is None:
            plan = self.policy.schedule(self.view(now))
        bs = self.block_size
        budget = self.token_budget
        reqs = self._requests
        preempted: list[str] = []
        bugs: list[str] = []

        # Rule 1: explicit preemptions, in order. A restarting policy's clearing is a failed
        # iteration: it stalls for the time of the batch it attempted (seed-mcsf.md §7 A7).
        stall = self._attempted_s() if plan.preempt and self._restart else 0.0
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
        zero: set[str] = set()  # listed items that got no tokens (sched holds the others)
        # Fast pass (speed only, same result): validate, clip to remaining tokens and budget,
        # and sum the KV blocks every item needs. When they all fit (the common case) they are
        # allocated in one go; otherwise the sequential pass below decides victims exactly.
        need_total = 0
        prefill = n_prefill = n_decode = kv_read = 0
        attn = 0.0  # sum over prefill chunks of chunk * (context before it + chunk / 2)
        pre_ids: set[str] = set()  # scheduled prefill chunks (the rest are decodes)
        # Only the items whose block count changes (a decode crosses a block boundary once
        # every block_size tokens) are revisited to allocate: no second pass over the batch.
        grow: list[tuple[EngineRequest, int]] = []
        get = reqs.get
        for rid, n in plan.run:
            r = get(rid)
            if r is None or r.status != RUNNING or rid in sched or (zero and rid in zero):
                bugs.append(f"run {rid!r}: not a running request (or listed twice)")
                continue
            c = r.num_computed_tokens
            o = r.num_output_tokens
            rem = r.num_prompt_tokens + o - c
            if rem == 1 and o > 0 and n > 0 and budget > 0:
                # a decode granted its one token: the general clipping below, specialised
                # (most items of most steps; same result)
                nb = -(-(c + 1) // bs)
                if nb != r.num_blocks:
                    need_total += nb - r.num_blocks
                    grow.append((r, nb))
                sched[rid] = (r, 1)
                budget -= 1
                n_decode += 1
                kv_read += c + 1
                continue
            if n > rem:
                n = rem
            if n > budget:
                n = budget
            if n <= 0:
                zero.add(rid)
                continue
            nb = -(-(c + n) // bs)
            if nb != r.num_blocks:
                need_total += nb - r.num_blocks
                grow.append((r, nb))
            sched[rid] = (r, n)
            budget -= n
            # composition (rule 5 input to the cost model), redone below after a preemption
            if n == 1 and o > 0 and rem == 1:  # a decode: c == prompt + o - 1
                n_decode += 1
            else:
                prefill += n
                n_prefill += 1
                attn += n * (c + n / 2)
                pre_ids.add(rid)
            kv_read += c + n
        preempted_in_run = False
        free = self.total_blocks - self.used_blocks
        if need_total <= free:
            self._make_room(need_total)
            for r, nb in grow:
                self.used_blocks += nb - r.num_blocks
                r.num_blocks = nb
            free -= need_total
        else:
            sched.clear()
            budget = self.token_budget
            prefill = n_prefill = n_decode = kv_read = 0
            attn = 0.0
            pre_ids.clear()
            # the valid run items again (statuses are unchanged since the fast pass)
            items: list[tuple[EngineRequest, int]] = []
            seen: set[str] = set()
            for rid, n in plan.run:
                r = reqs.get(rid)
                if r is not None and r.status == RUNNING and rid not in seen:
                    seen.add(rid)
                    items.append((r, n))
            order = [r for r, _ in items]
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
                self._make_room(need)
                r.num_blocks += need
                self.used_blocks += need
                free -= need
                sched[r.request_id] = (r, n)
                budget -= n
            for rid, (r, n) in sched.items():  # composition of what survived
                c = r.num_computed_tokens
                o = r.num_output_tokens
                is_dec = n == 1 and o > 0 and c == r.num_prompt_tokens + o - 1
                if is_dec:
                    n_decode += 1
                else:
                    prefill += n
                    n_prefill += 1
                    attn += n * (c + n / 2)
                    pre_ids.add(rid)
                kv_read += c + n
        if self._pc_live:  # full blocks of what runs are cached now (vLLM: at allocation)
            for r, n in sched.values():
                if r.identity is not None:
                    self._cache_full_blocks(r, r.num_computed_tokens + n)

        # Rule 3: admissions in order, only if step 2 preempted nothing; head-of-line blocking.
        # With prefix caching the longest cached prefix of full blocks counts as computed
        # (vLLM ``get_computed_blocks``), capped at num_tokens - 1 so that at least the last
        # token is computed; the policy's chunk starts after the hit.
        admitted: list[str] = []
        pc = self.prefix_cache
        if not preempted_in_run:
            for rid, n in plan.admit:
                r = reqs.get(rid)
                if r is None or r.status != WAITING:
                    bugs.append(f"admit {rid!r}: not waiting")
                    continue
                if budget <= 0 or len(self._running) >= self.max_num_seqs:
                    break
                # computed is 0 while waiting, or the cached prefix it was shown (looked up
                # again below: this step's allocations may have evicted some of it)
                rem = r.num_prompt_tokens + r.num_output_tokens
                if r.identity is None:
                    hit = 0
                    n = max(1, min(n, rem, budget))
                    need = new = _blocks(n, bs)
                    if need > free:
                        break
                    if pc is not None:
                        pc.record(rem, 0, r.num_preemptions > 0)
                else:
                    assert pc is not None
                    nmax = (rem - 1) // bs
                    hit_ids = (
                        pc.longest_hit(r.identity.block_hashes(bs, nmax), nmax)
                        if nmax and pc.by_hash
                        else []
                    )
                    hit = len(hit_ids) * bs
                    n = max(1, min(n, rem - hit, budget))
                    new = _blocks(hit + n, bs) - len(hit_ids)
                    revive = pc.num_free_of(hit_ids)  # hits on free cached blocks take them
                    need = new + revive
                    if need > free:
                        break
                    pc.touch(hit_ids)
                    self.used_blocks += revive
                    r.block_ids = hit_ids or _NO_BLOCKS
                    r.num_computed_tokens = hit
                    if r.num_cached_tokens < 0:
                        r.num_cached_tokens = hit
                    pc.record(rem, hit, r.num_preemptions > 0)
                    self._make_room(new)
                self._waiting.remove(r)
                r.status = RUNNING
                self._running.append(r)
                r.num_blocks = hit // bs + new
                self.used_blocks += new
                free -= need
                sched[rid] = (r, n)
                budget -= n
                admitted.append(rid)
                prefill += n  # a prefill chunk after the cached prefix (if any)
                n_prefill += 1
                attn += n * (hit + n / 2)
                kv_read += hit + n
                pre_ids.add(rid)
                if r.identity is not None:
                    self._cache_full_blocks(r, hit + n)

        if not sched and not stall:
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

        if not sched:  # only the stall of a failed iteration
            duration = 0.0
        elif self._prefill_attn:
            duration = self.cost_model.step_time(prefill, n_decode, kv_read, prefill_attn=attn)
        else:
            duration = self.cost_model.step_time(prefill, n_decode, kv_read)
        duration += stall

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
                now,
                duration,
                n_decode,
                kv_read,
                hold_until if plan.hold and hold_until is not None else fast_forward_until,
            )
        else:
            step_ends = np.array([now + duration])
        end = float(step_ends[-1])

        # Rule 5: advance, sample, finish at max_tokens (ignore-EOS), free KV.
        sampled: list[EngineRequest] = []
        finished: list[EngineRequest] = []
        if k > 1:
            t_first = float(step_ends[0])
            if pc is not None and pc.lru:
                run = self._running
                grow = sum(_blocks(r.num_computed_tokens + k, bs) - r.num_blocks for r in run)
                self._make_room(grow)
            used = self.used_blocks
            live = self._pc_live
            sample = sampled.append
            for r, _n in sched.values():
                c = r.num_computed_tokens + k
                r.num_computed_tokens = c
                o = r.num_output_tokens + k
                r.num_output_tokens = o
                nb = -(-c // bs)
                used += nb - r.num_blocks
                r.num_blocks = nb
                if live and r.identity is not None:
                    self.used_blocks = used
                    self._cache_full_blocks(r, c)
                if r.first_token_s is None:
                    r.first_token_s = t_first
                r.last_token_s = end
                sample(r)
                if o >= r.max_tokens:
                    finished.append(r)
            self.used_blocks = used
        else:
            sample = sampled.append
            for r, n in sched.values():
                c = r.num_computed_tokens + n
                r.num_computed_tokens = c
                o = r.num_output_tokens
                if c == r.num_prompt_tokens + o:
                    o += 1
                    r.num_output_tokens = o
                    if r.first_token_s is None:
                        r.first_token_s = end
                    r.last_token_s = end
                    sample(r)
                    if o >= r.max_tokens:
                        finished.append(r)
        if finished:
            for r in finished:
                r.status = FINISHED
                r.finish_s = end
                self._free(r)
                if r.identity is not None:
                    self._pc_live -= 1
                del self._requests[r.request_id]
            if len(finished) <= 4:  # a few: C-level removals beat rebuilding the list
                remove = self._running.remove
                for r in finished:
                    remove(r)
            else:
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
            finished=tuple(map(_request_id, finished)) if finished else (),
        )
        # the next step's conditions (nothing waits, all decode, blocks fit) are checked then
        self._promised = plan.then_steady and fast_forward_until is not None and not preempted
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
            (sched, pre_ids),
            report,
            False,
            bugs,
        )

    def _promised_plan(self) -> Plan | None:
        """The plan the last one's ``then_steady`` promised (every running request decodes one
        token, steady), where its conditions hold now: nothing waits, every running request
        decodes, their next blocks fit and fit the budget. None otherwise (and while the prefix
        cache holds anything, whose evictable blocks this count does not see): the policy
        plans."""
        run = self._running
        pc = self.prefix_cache
        if not run or self._waiting or self._pc_live or (pc is not None and pc.lru):
            return None
        if len(run) > self.token_budget:
            return None
        bs = self.block_size
        need = 0
        for r in run:
            c = r.num_computed_tokens
            o = r.num_output_tokens
            if o == 0 or c != r.num_prompt_tokens + o - 1:  # not decoding
                return None
            need += c % bs == 0  # its next token opens a block
        if need > self.total_blocks - self.used_blocks:
            return None
        return Plan(run=[(r.request_id, 1) for r in run], steady=True, hold=False, then_steady=True)

    def _attempted_s(self) -> float:
        """Step time of every running request's next tokens (a decode, or the rest of its
        prefill): the batch a restarting policy found would overflow (seed-mcsf.md §7 A7)."""
        prefill = n_decode = kv_read = 0
        attn = 0.0
        for r in self._running:
            c = r.num_computed_tokens
            n = r.num_prompt_tokens + r.num_output_tokens - c
            if n == 1 and r.num_output_tokens > 0:
                n_decode += 1
            else:
                prefill += n
                attn += n * (c + n / 2)
            kv_read += c + n
        if self._prefill_attn:
            return self.cost_model.step_time(prefill, n_decode, kv_read, prefill_attn=attn)
        return self.cost_model.step_time(prefill, n_decode, kv_read)

    def _fast_forward_len(
        self, now: float, first: float, n_decode: int, kv_read: int, until: float
    ) -> tuple[int, np.ndarray]:
        """How many identical decode steps to run: bounded by the first finish, the KV blocks
        that would be needed, and start times strictly before ``until``."""
        run = self._running
        k_max = min([r.max_tokens - r.num_output_tokens for r in run])
        if k_max <= 1:
            return 1, np.array([now + first])
        bs = self.block_size
        # Step 1's blocks (for comp + 1 tokens) are already allocated; ``free`` is what is left.
        free = self.total_blocks - self.used_blocks
        # Steps 2..k add k - 1 tokens a request, so at most ceil((k - 1) / bs) blocks each:
        # when even that fits (KV not tight, the common case) the exact count is not needed.
        if len(run) * ((k_max + bs - 2) // bs) > free:
            comp = np.array([r.num_computed_tokens for r in run], dtype=np.int64)
            k_max = decode_steps_that_fit(comp, k_max, bs, free)
        if k_max <= 1:
            return 1, np.array([now + first])
        ends = decode_run_ends(self.cost_model, now, k_max, n_decode, kv_read, until)
        return len(ends), ends


__all__ = [
    "EngineConfig",
    "EngineCore",
    "EngineRequest",
    "StepOutcome",
    "fit_problem",
]
