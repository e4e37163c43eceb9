"""Vectorised simulation kernel for the built-in ``vllm`` and ``sarathi`` policies.

Why: the reference host (:class:`~harness.engine.core.EngineCore` + a policy object) costs a
few Python operations per running request per step, so near capacity (hundreds of running
requests, a step per arrival) it simulates ~2k requests/s. This kernel keeps request state in
numpy arrays indexed by trace row and does a step in a fixed number of array operations.

It implements exactly the rules of the two policies under the host semantics of base.py:

- run order = decoding requests (running order), then prefilling ones (running order), each
  granted its remaining tokens clipped to the budget left (sarathi.py rules 1-2; vllm_v1.py
  pass 1 - in vLLM v1 prefilling requests are always a suffix of the running list, since a
  chunked prefill exhausts the budget and later admissions sit behind it);
- KV shortage preempts from the end of that order (recompute, budget refunded), then no
  admission that step (base.py rules 2-3) - done by an exact sequential fallback, rare;
- FCFS admission (preempted first) while budget, ``max_num_seqs`` and KV allow, head-of-line;
- a step with only decodes and no admission is fast-forwarded in closed form (Plan.steady).

Parity with the reference host is a test (tests/engine/test_fastsim.py): identical per-request
token times on traces with preemptions, seat and budget limits. Policies with other parameters
(``spf`` order, a prefill threshold, no chunking) run on the reference host.
"""

from __future__ import annotations

import math
import time
from collections import deque
from typing import Any

import numpy as np

from harness.engine.config import EngineConfig
from harness.engine.core import fit_problem
from harness.engine.costmodel import CostModel
from harness.policies.base import Policy
from harness.workload.trace import Trace

_PENDING, _RUNNING, _FINISHED, _REJECTED, _WAITING = 0, 1, 2, 3, 4


def fast_budget(policy: Policy, config: EngineConfig) -> int | None:
    """The step budget if this kernel implements ``policy`` exactly, else None."""
    from harness.policies.sarathi import SarathiPolicy
    from harness.policies.vllm_v1 import VLLMV1Policy

    if type(policy) is VLLMV1Policy:
        if policy.long_prefill_token_threshold == 0 and policy.chunked_prefill:
            return config.token_budget
        return None
    if type(policy) is SarathiPolicy and policy.order == "fcfs":
        cs = policy.chunk_size
        return config.token_budget if cs is None else min(config.token_budget, cs)
    return None


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
) -> Any:
    """Same contract and result as :func:`harness.engine.simulate.simulate`."""
    from harness.engine.simulate import SAMPLE_COLS, SimResult, _Chunks

    budget_cap = fast_budget(policy, config)
    if budget_cap is None:
        raise ValueError(f"no fast kernel for policy {getattr(policy, 'name', policy)!r}")
    wall0 = time.perf_counter()
    df = trace.df
    n = len(df)
    arr_l = df["arrival_s"].to_numpy(dtype=float).tolist()
    P = df["prompt_len"].to_numpy(dtype=np.int64).copy()
    M = df["output_len"].to_numpy(dtype=np.int64).copy()
    P_l = P.tolist()
    M_l = M.tolist()
    O = np.zeros(n, dtype=np.int64)
    C = np.zeros(n, dtype=np.int64)
    NB = np.zeros(n, dtype=np.int64)
    first = np.full(n, np.nan)
    last = np.full(n, np.nan)
    state = np.zeros(n, dtype=np.int8)
    npre = np.zeros(n, dtype=np.int64)
    errors: dict[int, str] = {}

    bs = config.block_size
    total = config.total_blocks
    max_seqs = config.max_num_seqs
    used = 0
    preempt_total = 0
    finished_total = 0
    rejected = 0
    steps_total = 0
    calls = 0
    run = np.empty(0, dtype=np.int64)  # running order (admission order)
    waiting: deque[int] = deque()
    step_time = cost_model.step_time

    chunks = _Chunks(chunk_sink, chunk_flush_rows)
    samples: dict[str, list[Any]] = {c: [] for c in SAMPLE_COLS}
    s_t, s_k, s_d = samples["t_s"], samples["num_steps"], samples["step_duration_s"]
    s_p, s_dec, s_kv = samples["prefill_tokens"], samples["decode_tokens"], samples["kv_used_tokens"]
    s_use, s_w, s_r = samples["kv_usage"], samples["num_waiting"], samples["num_running"]
    s_pre = samples["preemptions_total"]

    stop = math.inf if stop_at_s is None else float(stop_at_s)
    i = 0
    t = 0.0
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
        R = len(run)
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

        # ---- pass 1: running requests, decodes first (vectorised) -----------------------
        budget = budget_cap
        free = total - used
        preempted_any = False
        n_dec_all = 0
        if R:
            Cr = C[run]
            Or = O[run]
            rem = P[run] + Or - Cr
            dec = (Or > 0) & (rem == 1)
            n_dec_all = int(np.count_nonzero(dec))
            if n_dec_all == R:
                ordr, remo, deco, Co = run, rem, dec, Cr
            else:
                perm = np.concatenate((np.flatnonzero(dec), np.flatnonzero(~dec)))
                ordr, remo, deco, Co = run[perm], rem[perm], dec[perm], Cr[perm]
            tot_rem = int(remo.sum())
            if tot_rem <= budget:
                grant = remo
                budget -= tot_rem
            else:
                cum = np.cumsum(remo)
                grant = np.minimum(remo, np.maximum(budget - cum + remo, 0))
                budget = 0
            newC = Co + grant
            need = (newC + (bs - 1)) // bs - NB[ordr]
            tot_need = int(need.sum())
            if tot_need <= free:
                NB[ordr] += need
                used += tot_need
                free -= tot_need
            else:
                # Exact sequential semantics with preemption from the tail (base.py rule 2).
                ordr_l = ordr.tolist()
                rem_l = remo.tolist()
                order = list(ordr_l)
                sched: dict[int, int] = {}
                budget = budget_cap
                for j, rj in zip(ordr_l, rem_l, strict=True):
                    if state[j] != _RUNNING:
                        continue
                    g = rj if rj < budget else budget
                    if g <= 0:
                        continue
                    c = int(C[j])
                    nd = -(-(c + g) // bs) - int(NB[j])
                    if nd > free:
                        while nd > free and order:
                            v = order.pop()
                            if state[v] != _RUNNING:
                                continue
                            got = sched.pop(v, None)
                            if got is not None:
                                budget += got
                            used -= int(NB[v])
                            NB[v] = 0
                            C[v] = 0
                            npre[v] += 1
                            state[v] = _WAITING
                            waiting.appendleft(v)
                            preempt_total += 1
                            free = total - used
                            preempted_any = True
                            if v == j:
                                break
                        if state[j] != _RUNNING:
                            continue
                    NB[j] += nd
                    used += nd
                    free -= nd
                    sched[j] = g
                    budget -= g
                run = run[state[run] == _RUNNING]
                ordr = np.fromiter(sched.keys(), dtype=np.int64, count=len(sched))
                grant = np.fromiter(sched.values(), dtype=np.int64, count=len(sched))
                Co = C[ordr]
                deco = (O[ordr] > 0) & (P[ordr] + O[ordr] - Co == 1)
                n_dec_all = -1  # not a pure-decode step

        # ---- pass 2: FCFS admissions (head-of-line) ----------------------------------------
        adm: list[int] = []
        adm_n: list[int] = []
        if not preempted_any and waiting:
            seats = max_seqs - len(run)
            while waiting and budget > 0 and seats > 0:
                j = waiting[0]
                rj = P_l[j] + int(O[j])
                g = rj if rj < budget else budget
                nd = -(-g // bs)
                if nd > free:
                    break
                waiting.popleft()
                state[j] = _RUNNING
                NB[j] = nd
                used += nd
                free -= nd
                adm.append(j)
                adm_n.append(g)
                budget -= g
                seats -= 1

        # ---- composition and duration ------------------------------------------------------
        if R and len(grant):
            pos = grant > 0
            n_decode = int(np.count_nonzero(deco & pos))
            prefill = int(grant[~deco].sum())
            kv_read = int((Co + grant)[pos].sum())
        else:
            n_decode = prefill = kv_read = 0
        if adm:
            a_sum = sum(adm_n)
            prefill += a_sum
            kv_read += a_sum
        if n_decode == 0 and prefill == 0:
            if preempted_any:
                continue  # state changed: plan again at the same time
            if i < n:
                t = max(t, nxt)
                continue
            from harness.engine.simulate import SimulationStalled

            raise SimulationStalled(
                f"{getattr(policy, 'name', policy)!r} scheduled nothing with work left"
            )
        dur = step_time(prefill, n_decode, kv_read)

        # ---- fast-forward a steady run of pure decode steps --------------------------------
        k = 1
        if (
            fast_forward
            and n_dec_all == R
            and R > 0
            and not adm
            and n_decode == R
            and t + dur < until
        ):
            k_max = int((M[run] - O[run]).min())
            if k_max > 1:
                c0 = C[run]
                base_blocks = (c0 + bs) // bs  # blocks for c0 + 1 tokens (already allocated)

                def extra(kk: int, c0: np.ndarray = c0, base: np.ndarray = base_blocks) -> int:
                    return int(((c0 + (kk + bs - 1)) // bs - base).sum())

                if extra(k_max) > free:
                    lo, hi = 1, k_max
                    while hi - lo > 1:
                        mid = (lo + hi) // 2
                        if extra(mid) <= free:
                            lo = mid
                        else:
                            hi = mid
                    k_max = lo
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
            Cn = C[run] + k
            C[run] = Cn
            On = O[run] + k
            O[run] = On
            nb = (Cn + (bs - 1)) // bs
            used += int(nb.sum() - NB[run].sum())
            NB[run] = nb
            last[run] = end
            chunks.add_run(ends, run.tolist())
            fin = run[On >= M[run]]
            s_p.append(0)
            s_dec.append(R * k)
        else:
            end = t + dur
            if adm:
                ordr = np.concatenate((ordr, np.asarray(adm, dtype=np.int64))) if R else (
                    np.asarray(adm, dtype=np.int64)
                )
                grant = (
                    np.concatenate((grant, np.asarray(adm_n, dtype=np.int64)))
                    if R
                    else np.asarray(adm_n, dtype=np.int64)
                )
                run = np.concatenate((run, np.asarray(adm, dtype=np.int64)))
            pos = grant > 0
            sidx = ordr[pos] if not pos.all() else ordr
            g = grant[pos] if sidx is not ordr else grant
            Cn = C[sidx] + g
            C[sidx] = Cn
            samp = sidx[Cn == P[sidx] + O[sidx]]
            On = O[samp] + 1
            O[samp] = On
            f = first[samp]
            first[samp] = np.where(np.isnan(f), end, f)
            last[samp] = end
            chunks.add_step(end, samp.tolist())
            fin = samp[On >= M[samp]]
            s_p.append(prefill)
            s_dec.append(n_decode)
        if len(fin):
            state[fin] = _FINISHED
            used -= int(NB[fin].sum())
            NB[fin] = 0
            run = run[state[run] == _RUNNING]
            finished_total += len(fin)
        steps_total += k
        s_t.append(end)
        s_k.append(k)
        s_d.append(end - t)
        s_kv.append(used * bs)
        s_use.append(used / total)
        s_w.append(len(waiting))
        s_r.append(len(run))
        s_pre.append(preempt_total)
        t = end

    out_tokens = O.copy()
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
        },
    )
