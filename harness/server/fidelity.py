"""Does the built-in server reproduce the simulator? One trace, both hosts, same numbers.

Why: the server is the simulator's engine core in wall-clock time (server.py), so a replay
against it must give the simulator's TTFT and TBT distributions up to what wall-clock
execution adds (loopback latency, wake-up lateness). This module runs both and compares.

Three simulations are compared with the replay:

- ``nominal``: the trace's own arrival times. Differences then mix the load generator's
  send lag (measured separately in every replay's summary) with the server's fidelity.
- ``realised``: the same requests at the times the load generator actually sent them
  (``send_s`` of the replay).
- ``server_arrivals``: the same requests at the instants the server received them. Same
  engine decisions as the replay (see below), so the replay differs only by each request's
  delivery time and the emission/receipt lateness of its chunks: the fair comparison of what
  a client measures, free of the batching cascades a shifted arrival causes.

and, separately, the engine host alone (:func:`engine_match`): the requests simulated at the
exact model times the server stamped on their arrival must get the simulator's token times.

For a real engine (vLLM's step log, ``scripts/vllm-cpu/fidelity.py``), :func:`engine_ready_times`
gives the arrival a simulator must use: when each request became available to the engine loop,
and :func:`residual_table` says where a fitted cost model misses the measured steps.

``speed`` > 1 runs the server's model clock faster than wall time; the trace's arrivals are
compressed by the same factor and the replay's times are multiplied back, so all figures are
in model seconds.

Metrics (ms, vLLM ``bench serve`` definitions, anchors-harness.md §6.1-6.2): TTFT = first
chunk - send; ITL = gaps between consecutive chunks of a request, all requests pooled;
TPOT = (last - first) / (output tokens - 1) for requests with > 1 token.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pandas as pd

STATS = ("median", "p90", "p99")
METRICS = ("ttft", "itl", "tpot")


def latency_stats(run_dir: Path, scale: float = 1.0) -> dict[str, float]:
    """``{metric}_{stat}_ms`` from a run directory's requests and chunks tables."""
    req = pd.read_parquet(run_dir / "requests.parquet")
    ch = pd.read_parquet(run_dir / "chunks.parquet")
    ok = req[req["success"]]
    ttft = (ok["first_chunk_s"] - ok["send_s"]).to_numpy() * scale
    ch = ch[ch["req"].isin(ok["req"])].sort_values(["req", "t_s"], kind="stable")
    t = ch["t_s"].to_numpy()
    same = ch["req"].to_numpy()[1:] == ch["req"].to_numpy()[:-1]
    itl = np.diff(t)[same] * scale
    many = ok[ok["output_tokens"] > 1]
    tpot = (
        (many["last_chunk_s"] - many["first_chunk_s"]) / (many["output_tokens"] - 1)
    ).to_numpy() * scale
    out: dict[str, float] = {"completed": float(len(ok))}
    for name, v in (("ttft", ttft), ("itl", itl), ("tpot", tpot)):
        q = np.percentile(v, [50, 90, 99]) * 1e3 if len(v) else [np.nan] * 3
        for stat, x in zip(STATS, q, strict=True):
            out[f"{name}_{stat}_ms"] = float(x)
    return out


def rel_errors(got: dict[str, float], ref: dict[str, float]) -> dict[str, float]:
    """``(got - ref) / ref`` for every latency key."""
    return {
        k: (got[k] - ref[k]) / ref[k]
        for k in ref
        if k.endswith("_ms") and ref[k] and not np.isnan(ref[k])
    }


def engine_ready_times(
    api_arrival_s: np.ndarray,
    engine_arrival_s: np.ndarray,
    step_start_s: np.ndarray,
    step_end_s: np.ndarray,
    idle_gap_s: float = 5e-3,
    stamped_ready_s: np.ndarray | None = None,
) -> tuple[np.ndarray, dict[str, float]]:
    """When each request became available to a real engine's loop: the arrival a simulator
    (whose engine sees an arrival at the next step boundary) must be given.

    Why not the engine's own receipt stamp: a busy engine loop (vLLM's ``run_busy_loop``:
    drain the input queue, then one step) takes in a request only between steps, so its
    receipt stamp already includes the wait for the step in flight. A simulator given that
    stamp makes the request wait for its own step in flight again, about half a step too much
    on every TTFT (the sim-high TTFT medians of issue 17 for all three policies).

    - A request received after an idle gap (no step within ``idle_gap_s`` before it) woke the
      loop: ready = receipt.
    - A request received at a step boundary became ready during the step before, at the API
      server's stamp plus the front end's own delay ``F``, clipped to that step's start and
      to the receipt. ``F`` is the median receipt - API stamp of the idle-gap requests (the
      front end alone, no step in the way); with none, the smallest delay seen.

    - A request the host stamped (``stamped_ready_s`` finite: vLLM's step-log ``ready_s``,
      when the engine core's input thread handed it to the loop, adapters/vllm/scheduler.py)
      takes that stamp, clipped to the receipt (a stamp cannot follow its own receipt; the
      clip absorbs rounding). The estimate above is only the fallback for logs without it:
      on a loaded 2-core box about half of its guesses for arrivals that met a step in flight
      fell before that step even started.

    Returns the ready times and ``{"front_end_ms", "idle_share", "stamped_share"}``, plus
    ``estimate_mae_ms`` (mean |estimate - stamp| over stamped requests) when any is stamped.
    """
    api = np.asarray(api_arrival_s, dtype=float)
    eng = np.asarray(engine_arrival_s, dtype=float)
    order = np.argsort(step_start_s, kind="stable")
    starts = np.asarray(step_start_s, dtype=float)[order]
    ends = np.asarray(step_end_s, dtype=float)[order]
    k = np.searchsorted(starts, eng, side="left") - 1  # the last step started before receipt
    has_prev = k >= 0
    kk = np.maximum(k, 0)
    prev_end = np.where(has_prev, ends[kk], -np.inf)
    prev_start = np.where(has_prev, starts[kk], -np.inf)
    idle = eng - prev_end > idle_gap_s
    lag = eng - api
    front = float(np.median(lag[idle])) if idle.any() else float(lag.min())
    ready = np.where(idle, eng, np.minimum(eng, np.maximum(prev_start, api + front)))
    info = {"front_end_ms": front * 1e3, "idle_share": float(idle.mean()), "stamped_share": 0.0}
    if stamped_ready_s is not None:
        stamp = np.asarray(stamped_ready_s, dtype=float)
        has = np.isfinite(stamp)
        if has.any():
            info["stamped_share"] = float(has.mean())
            info["estimate_mae_ms"] = float(np.abs(ready[has] - stamp[has]).mean() * 1e3)
            ready = np.where(has, np.minimum(np.where(has, stamp, 0.0), eng), ready)
    return ready, info


def step_residuals(samples: Any, model: Any) -> pd.DataFrame:
    """Measured minus predicted time of each step (``res_ms``), with what it is grouped by:
    ``kind`` (prefill-only / mixed / decode), ``decodes`` (binned decode count), ``chunk``
    (binned prefill tokens) and ``context`` (``after``: a prompt chunk ran after context
    already in the KV cache, i.e. prefix-cache hits or earlier chunks, read from
    ``prefill_attn`` above the chunk's own ``P**2/2``; ``none``; ``-`` for decode steps).

    SAMPLES are ``adapters.vllm.steplog.step_log_samples`` rows (``step_duration_s`` is the
    step's period, what the model is fitted to)."""
    from harness.engine.costmodel import step_features

    f = step_features(samples)  # the steps as the fit read them
    p, d, kv, attn = (f[c].to_numpy() for c in ("p", "d", "kv", "attn"))
    if getattr(model, "uses_prefill_attn", False):
        pred = np.array(
            [
                model.step_time(int(a), int(b), int(c), prefill_attn=float(e))
                for a, b, c, e in zip(p, d, kv, attn, strict=True)
            ]
        )
    else:
        pred = model.step_times(p, d, kv)
    out = pd.DataFrame(
        {
            "kind": np.where(p > 0, np.where(d > 0, "mixed", "prefill"), "decode"),
            "decodes": pd.cut(
                d, [-1, 0, 1, 3, 7, 15, np.inf], labels=["0", "1", "2-3", "4-7", "8-15", "16+"]
            ).astype(str),
            "chunk": pd.cut(
                p,
                [-1, 0, 64, 256, 1024, np.inf],
                labels=["0", "1-64", "65-256", "257-1024", ">1024"],
            ).astype(str),
            # Σ chunk·ctx > 0 means some chunk attended to context before it (one token of
            # slack per chunk token absorbs rounding)
            "context": np.where(p > 0, np.where(attn - p * p / 2 > p, "after", "none"), "-"),
            "real_ms": f["t"].to_numpy() * 1e3,
        }
    )
    out["res_ms"] = out["real_ms"] - pred * 1e3
    return out


def residual_table(
    samples: Any, model: Any, by: tuple[str, ...] = ("kind", "decodes")
) -> list[dict[str, Any]]:
    """Where a fitted cost model misses: :func:`step_residuals` grouped by BY (columns of
    that frame); per group the step count, the measured median and the residual's median
    and mean, ms. A model right on average can still be low on the few steps that carry a
    first token (prefill-bearing ones), which is what TTFT sees."""
    res = step_residuals(samples, model)
    rows = []
    for key, g in res.groupby(list(by), sort=True):
        keys = key if isinstance(key, tuple) else (key,)
        rows.append(
            {
                **dict(zip(by, map(str, keys), strict=True)),
                "n": len(g),
                "real_ms_median": round(float(g["real_ms"].median()), 3),
                "res_ms_median": round(float(g["res_ms"].median()), 3),
                "res_ms_mean": round(float(g["res_ms"].mean()), 3),
            }
        )
    return rows


def engine_match(records: pd.DataFrame, trace: Any, simulate: Any) -> tuple[dict[str, float], Path]:
    """The engine host alone: simulate the requests at the model times the server stamped
    on arrival and compare each request's first/last token model times with the server's.

    With the same arrivals the wall-clock host must take exactly the simulator's decisions
    (arrival inbox, steps back to back, idle steps starting at the arrival): differences
    appear only after a resync (the loop fell ``max_catchup_s`` behind).
    """
    from harness.workload.trace import Trace

    arr = records.set_index("request_id")
    df = trace.df[trace.df["request_id"].isin(arr.index)].copy()
    t0 = float(arr["arrival_s"].min())
    df["arrival_s"] = df["request_id"].map(arr["arrival_s"]).to_numpy() - t0
    df = df.sort_values("arrival_s", kind="stable").reset_index(drop=True)
    sim_dir = simulate(Trace.from_frame(df, trace.tiers, trace.meta), "sim-server")
    sim = pd.read_parquet(sim_dir / "requests.parquet").set_index("request_id")
    srv = arr.loc[sim.index]
    d_first = (srv["first_token_s"] - t0) - sim["first_chunk_s"]
    d_last = (srv["last_token_s"] - t0) - sim["last_chunk_s"]
    both = np.maximum(d_first.abs(), d_last.abs()).to_numpy()
    return {
        "requests": float(len(both)),
        "identical_share": float((both < 1e-6).mean()) if len(both) else float("nan"),
        "max_abs_diff_ms": float(both.max() * 1e3) if len(both) else float("nan"),
    }, sim_dir


@contextlib.asynccontextmanager
async def _server(separate: bool, **kw: Any) -> AsyncIterator[str]:
    """The built-in server in this event loop, or in a child ``harness serve`` process (so
    the load generator's work cannot delay the engine loop)."""
    if not separate:
        from harness.server import embedded

        async with embedded(**kw) as url:
            yield url
        return
    cmd = [sys.executable, "-m", "harness.cli.main", "serve", "--port", "0"]
    for k, v in kw.items():
        if v is True:
            cmd.append(f"--{k.replace('_', '-')}")
        elif v is False and k == "prefix_caching":
            cmd.append("--no-prefix-caching")
        elif v is not None and v is not False:
            cmd += [f"--{k.replace('_', '-')}", str(v)]
    proc = await asyncio.create_subprocess_exec(*cmd, stdout=asyncio.subprocess.PIPE)
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        m = re.search(r"(http://\S+)", line)
        if m is None:
            raise RuntimeError(f"harness serve did not start: {line!r}")
        yield m.group(1)
    finally:
        proc.terminate()
        await proc.wait()


async def compare(
    trace: Any,
    out: Path,
    *,
    policy: str = "vllm",
    cost_model: str = "a100-llama2-7b",
    kv_tokens: int | None = None,
    speed: float = 1.0,
    separate_process: bool = False,
) -> dict[str, Any]:
    """Simulate and replay ``trace`` (a :class:`~harness.workload.trace.Trace`); return the
    stat blocks, the replay's relative errors against the simulations, the engine-host
    match and the server's lateness statistics."""
    from harness.engine.simulate import SimulateConfig, run_simulation
    from harness.loadgen.replay import ReplayConfig, run_replay_async
    from harness.workload.trace import Trace

    def simulate(tr: Trace, name: str) -> Path:
        cfg = SimulateConfig(
            trace="given",
            policies=[policy],
            cost_model=cost_model,
            kv_tokens=kv_tokens,
            out_dir=out / name,
        )
        return run_simulation(cfg, trace=tr)[0]

    df = trace.df.copy()
    df["arrival_s"] = df["arrival_s"] / speed
    fast = Trace.from_frame(df, trace.tiers, trace.meta)
    async with _server(
        separate_process,
        policy=policy,
        cost_model=cost_model,
        kv_tokens=kv_tokens,
        speed=speed,
        record_requests=True,
        # The simulations below replay plain rows, which carry no prompt identity, so their
        # engines never hit a cached prefix; the server must not either (with caching on, a
        # preempted request would re-admit onto its own cached blocks there and not here).
        prefix_caching=False,
    ) as url:
        rep_dir = await run_replay_async(
            ReplayConfig(
                trace="given",
                arrival="trace",  # the trace object below is replayed as given
                target=url,
                engine="builtin",
                out=out / "replay",
                sample_interval_s=None,
                progress=False,
                gpu=False,
            ),
            trace=fast,
        )
        async with aiohttp.ClientSession() as session:
            async with session.get(url + "/harness/stats") as r:
                server_stats = await r.json()
            async with session.get(url + "/harness/requests") as r:
                records = pd.DataFrame(await r.json())
    sent = pd.read_parquet(rep_dir / "requests.parquet").set_index("request_id")["send_s"]
    real = trace.df.copy()
    real["arrival_s"] = real["request_id"].map(sent).to_numpy() * speed
    real = real.sort_values("arrival_s", kind="stable").reset_index(drop=True)
    nominal = latency_stats(simulate(trace, "sim-nominal"))
    realised = latency_stats(simulate(Trace.from_frame(real, trace.tiers, trace.meta), "sim-real"))
    replay = latency_stats(rep_dir, scale=speed)
    engine, server_sim_dir = engine_match(records, trace, simulate)
    at_server = latency_stats(server_sim_dir)
    return {
        "engine_match": engine,
        "sim_server_arrivals": at_server,
        "err_vs_server_arrivals": rel_errors(replay, at_server),
        "sim_nominal": nominal,
        "sim_realised": realised,
        "replay": replay,
        "server": server_stats,
        "err_vs_realised": rel_errors(replay, realised),
        "err_vs_nominal": rel_errors(replay, nominal),
    }
