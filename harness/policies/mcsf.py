"""MC-SF: memory-constrained shortest-first admission (seed-mcsf.md §2.3, Algorithm 2).

Every running request runs every step (no pausing). Waiting requests are considered in
ascending predicted output length; each is admitted only if the *future* KV peak of all
running requests plus the admitted set stays within ``M`` at every future completion time
(Eq. 1, checked at the completion points, §2.1); the first one that fails stops admission.
Time is counted in steps, so the check is exact whatever each step's duration is, as long as
predictions are exact.

A request with ``o_cur`` tokens generated and ``num_tokens = s + o_cur`` holds
``num_tokens + τ`` tokens of KV during the step ``τ`` steps from now, until its last step
``τ_end = ô - o_cur - 1`` (Convention B, engine-exact: peak ``s + ô - 1``); Convention A
(the paper's Eq. 1) keeps it one step longer (peak ``s + ô``, conservative).

Decisions on the spec's ambiguities (seed-mcsf.md §7):

* A1 ``kv_convention`` = ``"B"`` (default, engine-exact) or ``"A"`` (paper Eq. 1).
* A2 check points: 0 and every completion ``τ_end`` of running ∪ admitted ∪ candidate.
* A3 order ``(ô, arrival, prompt_len, id)``. A4 ``on_fail`` = ``"break"`` (faithful) or
  ``"skip"``. A5 per-request ``s_i``. A6 a request that can never fit is left waiting
  (the host rejects those at ``add_request``).
* Blocks: with ``block_aware`` the load is ``Σ ceil(tokens/block)·block`` like the host.
* Predictions (§2.4): ``length_source="predicted"`` reads ``predicted_output_len`` (falls
  back to ``max_tokens``), ``"oracle"`` reads ``max_tokens``. ``noise_sigma`` multiplies
  the estimate by a per-request log-normal factor (seeded), ``margin`` adds ``δ`` tokens
  (the upper bound ``ô + δ``: the paper's ``ô - δ`` would under-reserve).
* Under-estimates (REC a): once a request reaches its estimate without finishing, its
  estimate becomes ``generated + overrun_extra``. Overflow (REC b) is left to the host,
  which preempts from the end of the run order = the most recently started request.
* Compute caps: MC-SF has none; admission also stops at the step's token budget and
  ``max_num_seqs`` so the plan is never clipped; a prompt longer than the budget left is
  admitted with a first chunk (its KV timeline then starts later than the check assumed,
  by the extra prefill steps; exact when the budget exceeds every prompt).
* It plans from the running set's columns (policies/columns.py), so the vectorised kernel
  runs it: running requests' estimates are kept per request key (``RunningColumns.key``),
  set when the plan admits them; started order is the host's running order (admissions join
  its end).
* ``then_steady`` (base.Plan) only while no running or admitted estimate is below the
  request's ``max_tokens``: such an estimate may be raised (REC a) at a plan the host would
  skip, so with noisy or short predictions MC-SF is asked every time, as before.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import numpy as np

from harness.policies import planops
from harness.policies.base import RequestView, StepReport, hears_changes_only
from harness.policies.columns import ColumnPlan, ColumnPolicy, ColumnView, per_key
from harness.policies.common import SortedWaiting
from harness.policies.registry import register


def _unit_hash(seed: int, request_id: str) -> float:
    h = hashlib.blake2b(f"{seed}:{request_id}".encode(), digest_size=8).digest()
    return (int.from_bytes(h, "big") + 0.5) / 2.0**64


def future_peak_ok(base: np.ndarray, end: np.ndarray, capacity: int, block_size: int = 1) -> bool:
    """Eq. (1): is ``Σ_j [end_j >= T]·round_up(base_j + T) <= capacity`` at every check point?

    ``base_j`` is request j's KV tokens in the current step, ``end_j`` its last step offset.
    Load only rises between completions, so checking ``T ∈ {0} ∪ {end_j}`` suffices (§2.1).

    Cost O(R·(log R + block_size)), not O(R²), for 128 requests and more (issue 13: it runs
    per admission attempt with up to ``max_num_seqs`` requests): with requests sorted by
    ``end`` descending, the set alive at ``T`` is a prefix, and with ``base = q·bs + r``,
    ``T = Q·bs + S``, ``ceil((base + T)/bs) = q + Q + [r + S >= 1] + [r + S >= bs + 1]``, so
    prefix sums of ``q`` and of per-remainder counts give every point's load exactly (integer
    arithmetic). Below 128 requests one dense pass is cheaper (fewer numpy calls), same answer.
    """
    if base.size == 0:
        return True
    # Each request's KV peaks at its last step and only requests still running count at T,
    # so the sum of the peaks bounds the load at every point: when it fits, all points do
    # (exact, O(R); the usual answer while the KV is not the bottleneck).
    alive = end >= 0
    peaks = base[alive] + end[alive]
    if block_size > 1:
        peaks = -(-peaks // block_size) * block_size
    if int(peaks.sum()) <= capacity:
        return True
    points = np.unique(np.concatenate(([0], end[end >= 0])))
    if base.size < 128:  # small sets: one dense points x requests pass has fewer numpy calls
        tokens = base[None, :] + points[:, None]
        if block_size > 1:
            tokens = -(-tokens // block_size) * block_size
        load = np.where(end[None, :] >= points[:, None], tokens, 0).sum(axis=1)
        return bool((load <= capacity).all())
    order = np.argsort(-end, kind="stable")
    k = np.searchsorted(-end[order], -points, side="right")  # #{j: end_j >= T}
    b = base[order]
    bs = block_size
    if bs <= 1:
        load = np.concatenate(([0], np.cumsum(b)))[k] + k * points
        return bool((load <= capacity).all())
    q, r = np.divmod(b, bs)
    cq = np.concatenate(([0], np.cumsum(q)))
    cnt = np.zeros((len(b) + 1, bs + 1), dtype=np.int64)
    cnt[np.arange(1, len(b) + 1), r] = 1
    cnt = cnt.cumsum(axis=0)  # cnt[k, x]: requests among the first k with remainder x
    ge = cnt[:, ::-1].cumsum(axis=1)[:, ::-1]  # ge[k, x]: ... with remainder >= x
    Q, S = np.divmod(points, bs)
    blocks = cq[k] + k * Q + ge[k, np.maximum(1 - S, 0)] + ge[k, np.minimum(bs + 1 - S, bs)]
    return bool((blocks * bs <= capacity).all())


def _dominates_any(failed: list[tuple[int, int]], base: int, end: int) -> bool:
    """Whether a candidate ``(base, end)`` holds at least the KV of a pair that failed Eq. (1)
    earlier in this plan, at every check point, so it fails too (``on_fail="skip"``,
    seed-mcsf.md A4, without its check). Exact: a candidate adds ``[end >= T] *
    round_up(base + T)`` to the load at each ``T``, non-decreasing in both, and admissions
    since that failure only added load."""
    return any(base >= b and end >= e for b, e in failed)


def _add_failure(failed: list[tuple[int, int]], base: int, end: int) -> None:
    """Record a pair that failed its check (so none recorded lies below it), dropping those
    above it: a later candidate above a dropped pair is above this one too."""
    failed[:] = [(b, e) for b, e in failed if not (b >= base and e >= end)]
    failed.append((base, end))


@register("mcsf")
class MCSFPolicy(ColumnPolicy):
    """Memory-constrained shortest-first (seed-mcsf.md §2.3)."""

    def __init__(
        self,
        *,
        kv_convention: str = "B",
        on_fail: str = "break",
        length_source: str = "predicted",
        noise_sigma: float = 0.0,
        margin: int = 0,
        overrun_extra: int = 16,
        seed: int = 0,
        block_aware: bool = True,
        memory_tokens: int | None = None,
    ) -> None:
        if kv_convention not in ("A", "B"):
            raise ValueError("mcsf: kv_convention must be 'A' or 'B'")
        if on_fail not in ("break", "skip"):
            raise ValueError("mcsf: on_fail must be 'break' or 'skip'")
        if length_source not in ("predicted", "oracle"):
            raise ValueError("mcsf: length_source must be 'predicted' or 'oracle'")
        self.kv_convention = kv_convention
        self.on_fail = on_fail
        self.length_source = length_source
        self.noise_sigma = float(noise_sigma)
        self.margin = int(margin)
        self.overrun_extra = max(1, int(overrun_extra))
        self.seed = seed
        self.block_aware = block_aware
        self.memory_tokens = memory_tokens
        self._est: dict[str, int] = {}  # by request id: the waiting queue's order reads it
        self._est_k = np.zeros(0, np.int64)  # by RunningColumns.key: running requests' (0: unset)
        # by key, set with _est_k: a running request's KV peak (its tokens at its last step,
        # rounded up to whole blocks of _pk_bs), constant while its estimate is: the quick
        # accept's running sum without per-step arithmetic over the running set
        self._pk_k = np.zeros(0, np.int64)
        self._pk_bs = 0
        # whether any estimate set under a key was below its request's max_tokens (sticky):
        # until one is, no running estimate can be raised, and then_steady needs no scan
        self._short_k = False
        # waiting in A3 order, kept by the hooks (no per-step sort of the queue, issue 13); a
        # waiting request's estimate is fixed (its output count does not move while it waits)
        self._wq = SortedWaiting(lambda r: (self.estimate(r), r.arrival_s, r.num_prompt_tokens))

    # -- estimates ---------------------------------------------------------------------
    def estimate(self, r: RequestView) -> int:
        """Planned total output length ``ô`` (never below what it has generated + 1)."""
        return self._estimate(r, r.num_output_tokens)

    def _estimate(self, r: RequestView, generated: int) -> int:
        """:meth:`estimate` of ``r``, which has generated ``generated`` tokens (read once by
        the caller: each is a property on the vectorised kernel's rows)."""
        est = self._est.get(r.request_id)
        if est is None:
            if self.length_source == "oracle" or r.predicted_output_len is None:
                raw = float(r.max_tokens)
            else:
                raw = float(r.predicted_output_len)
            if self.noise_sigma > 0:
                u = _unit_hash(self.seed, r.request_id)
                z = math.sqrt(2.0) * _erfinv(2.0 * u - 1.0)
                raw *= math.exp(self.noise_sigma * z)
            est = max(1, int(round(raw)) + self.margin)
            self._est[r.request_id] = est
        if generated >= est:  # under-estimate discovered (REC a)
            est = generated + self.overrun_extra
            self._est[r.request_id] = est
        return est

    # -- planning ------------------------------------------------------------------------
    def _peak(self, prompt: int, est: int) -> int:
        """A request's KV peak in tokens, rounded up to whole blocks of ``_pk_bs``: its tokens
        at its last step, ``s + ô - 1`` (+1 under Convention A); as ``base + end`` of
        :meth:`plan_columns`, whatever it has generated (``ô`` stays above that, REC a)."""
        extra = 1 if self.kv_convention == "A" else 0
        bs = self._pk_bs
        return -(-(prompt + est - 1 + extra) // bs) * bs

    def _set_estimate(self, key: int, prompt: int, est: int, max_tokens: int) -> None:
        """Record a running request's estimate and its KV peak under its key."""
        if key >= len(self._est_k):
            self._est_k = per_key(self._est_k, key + 1, 0)
            self._pk_k = per_key(self._pk_k, key + 1, 0)
        self._est_k[key] = est
        self._pk_k[key] = self._peak(prompt, est)
        if est < max_tokens:
            self._short_k = True

    def _raise_reached(self, cv: ColumnView) -> None:
        """Raise the per-key estimates (set at admission) that a running request has reached
        without finishing (REC a; kept in ``_est`` too, which a preempted request's place in
        the queue reads), and their KV peaks."""
        rc = cv.running
        if cv.num_keys > len(self._est_k):
            self._est_k = per_key(self._est_k, cv.num_keys, 0)
            self._pk_k = per_key(self._pk_k, cv.num_keys, 0)
        keys = rc.key
        if planops.keyed_reached(rc.output, keys, self._est_k):  # reached (or never set: 0)
            est = self._est_k[keys]
            for p in np.flatnonzero(rc.output >= est).tolist():
                key = int(keys[p])
                rid = cv.id_of(key)
                o = int(rc.output[p])
                e = int(est[p]) or self._est.get(rid) or int(rc.max_tokens[p])
                if o >= e:  # under-estimate discovered (REC a)
                    e = o + self.overrun_extra
                self._est[rid] = e
                self._set_estimate(key, int(rc.prompt[p]), e, int(rc.max_tokens[p]))

    def plan_columns(self, cv: ColumnView) -> ColumnPlan:
        # Running in admission order = the host's running order (admissions join its end).
        # Each running request's run item is max(1, remaining) (a decode's remaining is 1),
        # its KV tokens num_tokens and its last step offset (Convention A or B).
        rc = cv.running
        n = len(rc)
        extra = 1 if self.kv_convention == "A" else 0
        bs = cv.kv.block_size if self.block_aware else 1
        if bs != self._pk_bs:  # the per-key peaks are in whole blocks of this size
            self._pk_bs = bs
            self._pk_k = np.zeros(0, np.int64)
            self._est_k = np.zeros(0, np.int64)  # both set again (stale) on their next read
        self._raise_reached(cv)
        step: np.ndarray | int
        if rc.num_prefilling == 0:  # every one decodes its one token
            step, tokens_used = 1, n
        else:
            step = np.maximum(rc.prompt + rc.output - rc.computed, 1)
            tokens_used = int(step.sum())
        capacity = self.memory_tokens if self.memory_tokens is not None else cv.kv.capacity_tokens
        self._wq.sync(cv)
        admit: list[tuple[RequestView, int]] = []
        seqs = n
        # future_peak_ok's quick accept (the sum of the peaks fits), kept as a running sum so
        # an admission that passes it builds no arrays; admitted (base, end) pairs join the
        # arrays only when a candidate needs the exact check
        peak_sum = -1
        added_b: list[int] = []
        added_e: list[int] = []
        short = False  # an admitted estimate below the request's max_tokens (it may be raised)
        failed: list[tuple[int, int]] = []  # skip: the (base, end) pairs that failed (below)
        for r in self._wq.iter():  # A3: (ô, arrival, prompt_len, id)
            if seqs >= cv.max_num_seqs or tokens_used >= cv.token_budget:
                break  # compute caps: wait for the next step, keep the order
            # its KV tokens now (r.num_tokens) and last step offset (Convention A or B); the
            # request's counts read once (each a property on the vectorised kernel's rows)
            o_r = r.num_output_tokens
            b_r = r.num_prompt_tokens + o_r
            need = min(b_r - r.num_computed_tokens, cv.token_budget - tokens_used)  # chunked
            if peak_sum < 0:  # Σ base + end of the running requests, in whole blocks
                peak_sum = planops.keyed_sum(rc.key, self._pk_k)
            est_r = self._estimate(r, o_r)
            e_r = max(0, est_r - o_r - 1 + extra)
            peak = -(-(b_r + e_r) // bs) * bs
            fits = peak_sum + peak <= capacity
            if not fits and not _dominates_any(failed, b_r, e_r):
                fits = self._future_fits(
                    cv, self._est_k[rc.key], extra, [*added_b, b_r], [*added_e, e_r], capacity, bs
                )
                if not fits:
                    _add_failure(failed, b_r, e_r)
            if fits:
                admit.append((r, need))
                short = short or est_r < r.max_tokens
                key = cv.key_of(r)  # the key it runs under
                self._set_estimate(key, r.num_prompt_tokens, est_r, r.max_tokens)
                added_b.append(b_r)
                added_e.append(e_r)
                peak_sum += peak
                tokens_used += need
                seqs += 1
            elif self.on_fail == "break":
                break
        steady = not cv.num_waiting and n > 0 and rc.num_prefilling == 0 and n <= cv.token_budget
        # Plan.then_steady: once nothing waits and all decode, the plan is `steady`'s, unless
        # an estimate is raised first (REC a): so only while no running or admitted estimate
        # is below its max_tokens (reached only by finishing); the host checks the budget
        then = (
            cv.num_waiting == len(admit)  # else the host would not keep it: no check
            and not short
            and not (
                n
                and self._short_k  # else every running estimate is its max_tokens or above
                and planops.keyed_reached(rc.max_tokens - 1, rc.key, self._est_k)
            )
        )
        return ColumnPlan(None, step, admit_requests=admit, steady=steady, then_steady=then)

    @staticmethod
    def _future_fits(
        cv: ColumnView,
        est: np.ndarray,
        extra: int,
        added_b: list[int],
        added_e: list[int],
        capacity: int,
        bs: int,
    ) -> bool:
        """Eq. (1) exactly (:func:`future_peak_ok`) for the running requests, with their KV
        tokens now and last step offsets (Convention A or B), and the planned admissions."""
        rc = cv.running
        base = rc.prompt + rc.output
        end = np.maximum(est - rc.output - 1 + extra, 0)
        return future_peak_ok(
            np.concatenate((base, np.array(added_b, dtype=np.int64))),
            np.concatenate((end, np.array(added_e, dtype=np.int64))),
            capacity,
            bs,
        )

    def on_arrival(self, request: RequestView, now: float) -> None:
        self._wq.add(request)

    @hears_changes_only
    def on_step(self, report: StepReport) -> None:
        self._wq.on_step(report)
        for rid in report.finished:
            self._est.pop(rid, None)

    def params(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if not k.startswith("_")}


def _erfinv(y: float) -> float:
    """Inverse error function (scipy-free, Newton-refined) for the seeded noise factor."""
    y = min(max(y, -0.999999), 0.999999)
    a = 0.147
    ln = math.log(1.0 - y * y)
    t = 2.0 / (math.pi * a) + ln / 2.0
    x = math.copysign(math.sqrt(math.sqrt(t * t - ln / a) - t), y)
    for _ in range(2):
        err = math.erf(x) - y
        x -= err / (2.0 / math.sqrt(math.pi) * math.exp(-x * x))
    return x
