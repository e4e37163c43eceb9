"""Vectorised simulation kernel for policies that declare the FCFS token-budget rule.

Why: the engine core (:class:`~harness.engine.core.EngineCore` + a policy object) costs a few
Python operations per running request per step, so near capacity (hundreds of running
requests, a step per arrival) it simulates a few thousand requests/s. This kernel keeps request
state in numpy arrays indexed by trace row and does a step in a fixed number of array
operations.

It is reached through the policy contract, not by policy type: a policy whose plans are
exactly :class:`harness.policies.base.BudgetRule` says so through its ``budget_rule()`` hook
(today ``vllm`` with its defaults and FCFS ``sarathi``), and :func:`fast_budget` admits it only
while that declaration still describes the object (base.declared_rule: a subclass that
overrides planning gets the engine core). The kernel executes that one rule under the host
semantics of base.py:

- run order = decoding requests (running order), then the others (running order), each
  granted its remaining tokens clipped to the budget left;
- KV shortage preempts from the end of that order (recompute, budget refunded), then no
  admission that step (base.py rules 2-3) - done by an exact sequential fallback, rare;
- FCFS admission (preempted first) while budget, ``max_num_seqs`` and KV allow, head-of-line;
- a step with only decodes and no admission is fast-forwarded in closed form (Plan.steady).

The kernel has no prefix cache: requests with a prefix identity take the engine core. Parity
with the engine core and the reference step is a test (tests/engine/test_fastsim.py,
test_identity.py): identical per-request token times on traces with preemptions, seat and
budget limits.
"""

from __future__ import annotations

import math
import time
from collections import deque
from typing import Any

import numpy as np

from harness.engine.config import EngineConfig
from harness.engine.core import decode_steps_that_fit, fit_problem
from harness.engine.costmodel import CostModel
from harness.engine.simresult import ChunkLog, SimResult, SimulationStalled, new_samples
from harness.policies.base import Policy, declared_rule
from harness.workload.trace import Trace

_PENDING, _RUNNING, _FINISHED, _REJECTED, _WAITING = 0, 1, 2, 3, 4
_NONE_LEFT = 1 << 62  # ``left`` with nobody running


def fast_budget(policy: Policy, config: EngineConfig) -> int | None:
    """The step budget if this kernel executes ``policy`` exactly, else None: the policy
    declares :class:`~harness.policies.base.BudgetRule` (base.declared_rule).

    The kernel keeps no prefix cache, so it is exact only for requests without a prefix
    identity: a :class:`~harness.workload.trace.Trace` of lengths carries none (nothing can
    hit, whatever ``EngineConfig.prefix_caching`` says); hosts that add identities (sessions)
    run the engine core."""
    rule = declared_rule(policy)
    if rule is None or getattr(policy, "preempt_restarts", False):
        return None  # no rule, or preemption that discards output (engine core only)
    return config.token_budget if rule.budget is None else min(config.token_budget, rule.budget)


def fast_simulate(
    trace: Trace,
    policy: Policy,
    cost_model: CostModel,
    config: EngineConfig,
    *,
    stop_at_s: float | None = None,
    chunk_sink: Any = None,
    chunk_flush_rows: int = 2_000_000,
    fast_forward: bool = True,
    on_interrupt: str = "raise",
) -> Any:
    """Same contract and result as :func:`harness.engine.simulate.simulate`."""
    budget_cap = fast_budget(policy, config)
    if budget_cap is None:
        raise ValueError(f"no fast kernel for policy {getattr(policy, 'name', policy)!r}")
    wall0 = time.perf_counter()
    df = trace.df
    n = len(df)
    arr_l = df["arrival_s"].to_numpy(dtype=float).tolist()
    P_l = df["prompt_len"].to_numpy(dtype=np.int64).tolist()
    M_l = df["output_len"].to_numpy(dtype=np.int64).tolist()
    # Per trace row: outputs so far (kept across preemptions), results.
    Orow = np.zeros(n, dtype=np.int64)
    first = np.full(n, np.nan)
    last = np.full(n, np.nan)
    state = np.zeros(n, dtype=np.int8)
    npre = np.zeros(n, dtype=np.int64)
    errors: dict[int, str] = {}

    bs = config.block_size
    total = config.total_blocks
    max_seqs = config.max_num_seqs
    # Running requests as parallel arrays in running (admission) order, first R slots used.
    cap = max(1, min(max_seqs, n))  # running never exceeds either
    IA = np.zeros((6, cap), np.int64)  # prompt, outputs, computed, max_tokens, blocks, row
    FA = np.full((2, cap), np.nan)  # first / last token time
    Pr, Or, Cr, Mr, NBr, IDr = IA
    Fr, Lr = FA
    R = 0
    # min over running requests of max_tokens - outputs (exact): steps until the first finish
    # of a pure decode run, so pure steps skip the per-request finish test
    left = _NONE_LEFT
    npf = 0  # running requests that are not decoding (prefilling or recomputing)
    used = 0
    preempt_total = 0
    finished_total = 0
    rejected = 0
    steps_total = 0
    calls = 0
    waiting: deque[int] = deque()
    step_time = cost_model.step_time
    use_attn = bool(getattr(cost_model, "uses_prefill_attn", False))

    def retire(keep: np.ndarray, R: int) -> int:
        """Compact the running arrays to the rows in ``keep`` (a mask over the first R)."""
        return drop(np.flatnonzero(~keep), keep, R)

    def drop(gone: np.ndarray, keep: np.ndarray | None, R: int) -> int:
        """Remove the running positions ``gone`` (ascending; ``keep`` is its complement mask
        over the first R, or None to derive it), keeping the running order."""
        if len(gone) <= 8:  # usually one or two: shift the tails left (memmove-speed slices)
            for p in gone[::-1].tolist():
                IA[:, p : R - 1] = IA[:, p + 1 : R]
                FA[:, p : R - 1] = FA[:, p + 1 : R]
                R -= 1
            return R
        if keep is None:
            keep = np.ones(R, dtype=bool)
            keep[gone] = False
        idx = np.flatnonzero(keep)
        k = len(idx)
        IA[:, :k] = IA[:, idx]
        FA[:, :k] = FA[:, idx]
        return k

    chunks = ChunkLog(chunk_sink, chunk_flush_rows)
    samples = new_samples()
    s_t, s_k, s_d = samples["t_s"], samples["num_steps"], samples["step_duration_s"]
    s_p, s_dec, s_kv = (
        samples["prefill_tokens"],
        samples["decode_tokens"],
        samples["kv_used_tokens"],
    )
    s_use, s_w, s_r = samples["kv_usage"], samples["num_waiting"], samples["num_running"]
    s_pre = samples["preemptions_total"]

    stop = math.inf if stop_at_s is None else float(stop_at_s)
    i = 0
    t = 0.0
    interrupted = False
    try:
        while True:
            while i < n and arr_l[i] <= t:
                problem = fit_problem(P_l[i], M_l[i], bs, total)
                if problem is None:
                    waiting.append(i)
                    state[i] = _WAITING
                else:
                    state[i] = _REJECTED
                    errors[i] = problem
                    rejected += 1
                i += 1
            if R == 0 and not waiting:
                if i >= n:
                    break
                t = arr_l[i]
                if t >= stop:
                    break
                continue
            if t >= stop:
                break
            nxt = arr_l[i] if i < n else math.inf
            until = min(nxt, stop)
            calls += 1

            # ---- pass 1: running requests, decodes first ---------------------------------------
            budget = budget_cap
            free = total - used
            preempted_any = False
            pure = False  # every running request decodes and all got their token
            sp: np.ndarray | None = None  # scheduled positions (None = all R, one token each)
            sg: np.ndarray | None = None
            prefill = n_decode = kv_read = 0
            attn = 0.0  # sum over prefill chunks of chunk * (context before it + chunk / 2)
            if R:
                Cv = Cr[:R]
                if npf == 0 and budget >= R:
                    grow = Cv % bs == 0  # a decode writes position C: a new block at a boundary
                    tot_need = int(np.count_nonzero(grow))
                    if tot_need <= free:
                        NBr[:R] += grow
                        used += tot_need
                        free -= tot_need
                        budget -= R
                        pure = True
                        n_decode = R
                        kv_read = int(Cv.sum()) + R
                if not pure:
                    Ov = Or[:R]
                    rem = Pr[:R] + Ov - Cv
                    dec = (Ov > 0) & (rem == 1)
                    n_dec_all = int(np.count_nonzero(dec))
                    if n_dec_all == R:
                        ordp = np.arange(R)
                    else:
                        ordp = np.concatenate((np.flatnonzero(dec), np.flatnonzero(~dec)))
                    remo = rem[ordp]
                    tot_rem = int(remo.sum())
                    if tot_rem <= budget:
                        grant = remo
                    else:
                        cum = np.cumsum(remo)
                        grant = np.minimum(remo, np.maximum(budget - cum + remo, 0))
                    Co = Cv[ordp]
                    need = (Co + grant + (bs - 1)) // bs - NBr[ordp]
                    tot_need = int(need.sum())
                    if tot_need <= free:
                        NBr[ordp] += need
                        used += tot_need
                        free -= tot_need
                        budget -= int(grant.sum())
                        sp, sg = ordp, grant
                    else:
                        # Exact sequential semantics, preemption from the tail (base.py rule 2).
                        alive = np.ones(R, dtype=bool)
                        order = ordp.tolist()
                        sched: dict[int, int] = {}
                        budget = budget_cap
                        for pos, rj in zip(order[:], remo.tolist(), strict=True):
                            if not alive[pos]:
                                continue
                            g = rj if rj < budget else budget
                            if g <= 0:
                                continue
                            nd = -(-(int(Cr[pos]) + g) // bs) - int(NBr[pos])
                            if nd > free:
                                while nd > free and order:
                                    v = order.pop()
                                    if not alive[v]:
                                        continue
                                    got = sched.pop(v, None)
                                    if got is not None:
                                        budget += got
                                    alive[v] = False
                                    used -= int(NBr[v])
                                    row = int(IDr[v])
                                    Orow[row] = Or[v]
                                    first[row] = Fr[v]
                                    last[row] = Lr[v]
                                    npre[row] += 1
                                    state[row] = _WAITING
                                    waiting.appendleft(row)
                                    preempt_total += 1
                                    free = total - used
                                    preempted_any = True
                                    if v == pos:
                                        break
                                if not alive[pos]:
                                    continue
                            NBr[pos] += nd
                            used += nd
                            free -= nd
                            sched[pos] = g
                            budget -= g
                        # positions shift after compaction: map old -> new
                        newpos = np.cumsum(alive) - 1
                        sp = newpos[np.fromiter(sched.keys(), dtype=np.int64, count=len(sched))]
                        sg = np.fromiter(sched.values(), dtype=np.int64, count=len(sched))
                        R = retire(alive, R)
                    if len(sp):
                        Co = Cr[sp]
                        d = (Or[sp] > 0) & (Pr[sp] + Or[sp] - Co == 1)
                        pos_g = sg > 0
                        n_decode = int(np.count_nonzero(d & pos_g))
                        prefill = int(sg[~d].sum())
                        if use_attn:
                            pg = sg[~d]
                            attn = float((pg * (Co[~d] + pg / 2)).sum())
                        kv_read = int((Co + sg)[pos_g].sum())

            # ---- pass 2: FCFS admissions (head-of-line) ----------------------------------------
            R0 = R
            adm_g: list[int] = []
            adm_left = _NONE_LEFT
            if not preempted_any and waiting:
                seats = max_seqs - R
                while waiting and budget > 0 and seats > 0:
                    j = waiting[0]
                    oj = int(Orow[j])
                    rj = P_l[j] + oj
                    g = rj if rj < budget else budget
                    nd = -(-g // bs)
                    if nd > free:
                        break
                    waiting.popleft()
                    state[j] = _RUNNING
                    used += nd
                    free -= nd
                    Pr[R] = P_l[j]
                    Or[R] = oj
                    Cr[R] = 0
                    Mr[R] = M_l[j]
                    NBr[R] = nd
                    IDr[R] = j
                    Fr[R] = first[j]
                    Lr[R] = last[j]
                    R += 1
                    adm_g.append(g)
                    lj = M_l[j] - oj - (g == rj)  # its first token comes with a whole prefill
                    if lj < adm_left:
                        adm_left = lj
                    budget -= g
                    seats -= 1
                    prefill += g
                    kv_read += g
                    attn += g * g / 2

            if n_decode == 0 and prefill == 0:
                if preempted_any:
                    left = int((Mr[:R] - Or[:R]).min()) if R else _NONE_LEFT
                    continue  # state changed: plan again at the same time
                if i < n:
                    t = max(t, nxt)
                    continue
                raise SimulationStalled(
                    f"{getattr(policy, 'name', policy)!r} scheduled nothing with work left"
                )
            if use_attn:
                dur = step_time(prefill, n_decode, kv_read, prefill_attn=attn)
            else:
                dur = step_time(prefill, n_decode, kv_read)

            # ---- fast-forward a steady run of pure decode steps --------------------------------
            k = 1
            if fast_forward and pure and not adm_g and t + dur < until:
                k_max = left
                if k_max > 1:
                    k_max = decode_steps_that_fit(Cr[:R], k_max, bs, free)
                    if k_max > 1:
                        steps = np.arange(k_max)
                        durs = cost_model.step_times(
                            np.zeros(k_max), np.full(k_max, R), kv_read + steps * R
                        )
                        ends = t + np.cumsum(durs)
                        k = 1 + int(np.searchsorted(ends[:-1], until, side="left"))
                        k = max(1, min(k, k_max))
            if k > 1:
                ends = ends[:k]
                end = float(ends[-1])
                Cv = Cr[:R]
                Cv += k
                Or[:R] += k
                nb = (Cv + (bs - 1)) // bs
                used += int(nb.sum() - NBr[:R].sum())
                NBr[:R] = nb
                Lr[:R] = end
                chunks.add_run(ends, IDr[:R].copy())
                s_p.append(0)
                s_dec.append(R * k)
            else:
                end = t + dur
                if pure:
                    Cr[:R0] += 1
                    Or[:R0] += 1
                    Lr[:R0] = end
                    samp_ids = IDr[:R0].copy()
                elif sp is not None and len(sp):
                    Cr[sp] += sg
                    hit = sp[Cr[sp] == Pr[sp] + Or[sp]]
                    Or[hit] += 1
                    Lr[hit] = end
                    fh = Fr[hit]
                    Fr[hit] = np.where(np.isnan(fh), end, fh)
                    samp_ids = IDr[hit]
                else:
                    samp_ids = None
                if samp_ids is not None and len(samp_ids):
                    chunks.add_step(end, samp_ids)
                if adm_g:
                    # few per step: scalar updates beat a handful of tiny array operations
                    hits: list[int] = []
                    for q, g in enumerate(adm_g, start=R0):
                        Cr[q] = g
                        if g == Pr[q] + Or[q]:
                            Or[q] += 1
                            Lr[q] = end
                            if Fr[q] != Fr[q]:  # NaN: the first token
                                Fr[q] = end
                            hits.append(int(IDr[q]))
                    if hits:
                        chunks.add_step(end, hits)
                    npf += len(adm_g) - len(hits)
                s_p.append(prefill)
                s_dec.append(n_decode)
            if pure:  # everyone running before admission sampled k tokens
                left -= k
                if adm_left < left:
                    left = adm_left
            if not pure or left <= 0:
                done = Or[:R] >= Mr[:R]
                gone = np.flatnonzero(done)
                if len(gone):
                    rows = IDr[gone]
                    state[rows] = _FINISHED
                    Orow[rows] = Or[gone]
                    first[rows] = Fr[gone]
                    last[rows] = Lr[gone]
                    used -= int(NBr[gone].sum())
                    R = drop(gone, None, R)
                    finished_total += len(rows)
                left = int((Mr[:R] - Or[:R]).min()) if R else _NONE_LEFT
            if not pure:
                v = Or[:R]
                npf = R - int(np.count_nonzero((v > 0) & (Pr[:R] + v - Cr[:R] == 1)))
            steps_total += k
            s_t.append(end)
            s_k.append(k)
            s_d.append(end - t)
            s_kv.append(used * bs)
            s_use.append(used / total)
            s_w.append(len(waiting))
            s_r.append(R)
            s_pre.append(preempt_total)
            t = end
    except KeyboardInterrupt:
        if on_interrupt == "raise":
            raise
        interrupted = True  # keep what was simulated; the caller writes it

    # Requests still running at stop_at_s keep what they produced (cancelled).
    rows = IDr[:R]
    Orow[rows] = Or[:R]
    first[rows] = Fr[:R]
    last[rows] = Lr[:R]
    out_tokens = Orow.copy()
    status = np.zeros(n, dtype=np.int8)
    status[state == _FINISHED] = 1
    status[state == _REJECTED] = 2
    chunk_req, chunk_t = (None, None) if chunk_sink is not None else chunks.arrays()
    if chunk_sink is not None:
        chunks.flush()
    return SimResult(
        policy=getattr(policy, "name", type(policy).__name__),
        first_s=first,
        last_s=last,
        out_tokens=out_tokens,
        status=status,
        errors=errors,
        preemptions=npre,
        samples=samples,
        chunk_req=chunk_req,
        chunk_t=chunk_t,
        end_s=t,
        num_steps=steps_total,
        num_calls=calls,
        wall_s=time.perf_counter() - wall0,
        counters={
            "preemptions_total": preempt_total,
            "num_rejected": rejected,
            "num_finished": finished_total,
            "unfinished": int(n - finished_total - rejected),
            "kernel": "fast",
            "interrupted": interrupted,
        },
    )
