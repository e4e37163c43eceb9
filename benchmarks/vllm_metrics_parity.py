"""Parity check: our summary keys versus the REAL ``vllm.benchmarks.serve.calculate_metrics``
on the same per-request records (anchors-harness.md §6.5 item 4).

Builds a random run (multi-token chunks, failures, missing usage, 1-token answers), writes it
as a run directory, computes our summary, then hands vLLM's RequestFuncOutput fields to
calculate_metrics inside the vLLM virtualenv and compares every key vLLM reports.

    python benchmarks/vllm_metrics_parity.py --vllm-python .venv-vllm/bin/python

Exit status 0 when every key agrees (rel 1e-9), 1 otherwise. Needs vLLM installed in the
given interpreter; not a test.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from harness.results.rundir import RunWriter, read_run
from harness.results.summary import compute_summary

PCTS = [50, 90, 95, 99, 99.9]
GOODPUT = {"ttft": 150.0, "tpot": 25.0, "e2el": 900.0}

_VLLM_SIDE = r"""
import json, sys
from vllm.benchmarks.lib.endpoint_request_func import RequestFuncOutput
from vllm.benchmarks.serve import calculate_metrics
d = json.load(sys.stdin)
outs = []
for o in d["outputs"]:
    r = RequestFuncOutput()
    for k, v in o.items():
        setattr(r, k, v)
    outs.append(r)
m, _ = calculate_metrics(None, outs, d["dur_s"], None, d["pcts"], d["goodput"])
res = {"completed": m.completed, "failed": m.failed, "total_input_tokens": m.total_input,
       "total_output_tokens": m.total_output, "request_throughput": m.request_throughput,
       "request_goodput": m.request_goodput, "output_throughput": m.output_throughput,
       "total_token_throughput": m.total_token_throughput,
       "max_output_tokens_per_s": m.max_output_tokens_per_s,
       "max_concurrent_requests_1s": m.max_concurrent_requests}
for name in ("ttft", "tpot", "itl", "e2el"):
    for s in ("mean", "median", "std"):
        res[f"{s}_{name}_ms"] = float(getattr(m, f"{s}_{name}_ms"))
    for p, v in getattr(m, f"percentiles_{name}_ms"):
        w = str(int(p)) if int(p) == p else str(p)
        res[f"p{w}_{name}_ms"] = float(v)
print(json.dumps(res))
"""


def random_run(run_dir: Path, seed: int, n: int) -> list[dict]:
    """Write a random run and return vLLM RequestFuncOutput field dicts for it."""
    rng = np.random.default_rng(seed)
    outputs = []
    t = 0.0
    with RunWriter(run_dir, {"duration_s": n * 0.02 + 5.0}) as w:
        for i in range(n):
            t += float(rng.exponential(0.02))
            send = t + float(rng.exponential(0.0005))
            out_len = int(rng.choice([1, 2, 5, int(rng.integers(3, 80))]))
            times, toks, clk, left = [], [], send + float(rng.gamma(2.0, 0.05)), out_len
            while left > 0:
                k = int(min(left, rng.choice([1, 1, 1, 2, 3])))
                times.append(clk)
                toks.append(k)
                left -= k
                clk += float(rng.exponential(0.02))
            ok = rng.random() > 0.1
            usage = sum(toks) if rng.random() > 0.1 else None
            prompt = int(rng.integers(5, 500))
            w.add_request(
                {
                    "req": i,
                    "request_id": f"r{i}",
                    "prompt_len": prompt,
                    "prompt_tokens": prompt,
                    "output_tokens": usage if ok else None,
                    "target_s": t,
                    "arrival_s": send,
                    "send_s": send,
                    "success": ok,
                    "error_kind": None if ok else "http_status",
                }
            )
            if ok:
                w.add_chunks(i, times, toks)
            o = {"success": ok, "start_time": send, "prompt_len": prompt}
            if ok:
                o.update(
                    ttft=times[0] - send,
                    itl=list(np.diff(times)),
                    latency=times[-1] - send,
                    # vLLM re-counts generated_text when usage is missing; without a tokenizer
                    # it counts 1, so pass usage always (our fallback is the chunk-token sum).
                    output_tokens=usage if usage is not None else sum(toks),
                )
            outputs.append(o)
    return outputs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vllm-python", default=".venv-vllm/bin/python")
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    run_dir = Path(tempfile.mkdtemp(prefix="vllm_parity_")) / "run"
    outputs = random_run(run_dir, args.seed, args.requests)
    run = read_run(run_dir)
    ours = compute_summary(run, GOODPUT, stability=False)
    payload = {"outputs": outputs, "dur_s": ours["duration"], "pcts": PCTS, "goodput": GOODPUT}
    proc = subprocess.run(
        [args.vllm_python, "-c", _VLLM_SIDE],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        print(proc.stderr[-2000:], file=sys.stderr)
        return 2
    theirs = json.loads(proc.stdout.strip().splitlines()[-1])
    bad = 0
    for k, v in theirs.items():
        o = ours.get(k)
        same = o is not None and abs(o - v) <= 1e-9 * max(1.0, abs(v))
        bad += not same
        print(f"{'ok ' if same else 'BAD'} {k:32s} vllm={v!r:<24} ours={o!r}")
    print(
        f"{len(theirs) - bad}/{len(theirs)} keys agree; sweep-line max_concurrent_requests="
        f"{ours['max_concurrent_requests']}"
    )
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
