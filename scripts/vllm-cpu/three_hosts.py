"""One trace, one policy, three hosts: the built-in engine, real vLLM (CPU) and real SGLang (CPU).

For each policy (``vllm``, ``wait``, ``slai``, the parameters of ``fidelity.POLICIES``) the same
frozen trace is replayed by ``harness replay`` against

- the built-in engine server (``harness.server.embed``, the policy in the harness's own engine
  core, timed by a cost model: by default the one ``fidelity.py`` fitted on vLLM-CPU steps);
- vLLM 0.32 CPU with the adapter hosting the policy (``adapters.vllm.launch``);
- SGLang 0.5.23 CPU with the adapter hosting the policy (``adapters.sglang.launch``),

with the same KV capacity (tokens), step token budget and request cap. One real server at a
time. Prints a markdown table (TTFT / TPOT percentiles, per-tier TTFT attainment, the engine's
peak waiting queue from its /metrics) and writes ``three_hosts.json``; each run directory (with
``report.html``) stays under ``--out``.

    .venv/bin/python scripts/vllm-cpu/three_hosts.py --out reports/three-hosts
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fidelity import POLICIES, TIERS, build  # noqa: E402

from adapters.sglang.launch import SglangServerConfig, running_sglang  # noqa: E402
from adapters.vllm.launch import VllmServerConfig, running_vllm  # noqa: E402

BLOCK = 32
HOSTS = ("builtin", "vllm-cpu", "sglang-cpu")


def replay(url: str, engine: str, trace: Path, out: Path, extra: list[str]) -> str:
    harness = Path(sys.executable).parent / "harness"
    cmd = [str(harness), "replay", "--trace", str(trace), "--arrival", "trace", "--target", url]
    cmd += ["--engine", engine, "--no-progress", "--ready-timeout", "30", "--out", str(out)]
    cmd += ["--sample-interval", "0.1", *extra]
    p = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if p.returncode != 0:
        raise RuntimeError(f"replay against {engine} failed:\n{p.stdout[-3000:]}{p.stderr[-3000:]}")
    return p.stdout


def row(run_dir: Path) -> dict[str, Any]:
    import pandas as pd

    s = json.loads((run_dir / "summary.json").read_text())
    out: dict[str, Any] = {
        k: s.get(k)
        for k in (
            "completed",
            "failed",
            "p50_ttft_ms",
            "p99_ttft_ms",
            "p50_tpot_ms",
            "p99_tpot_ms",
            "output_throughput",
        )
    }
    out["ttft_attainment"] = {
        name: t.get("ttft_slo_attainment") for name, t in (s.get("tiers") or {}).items()
    }
    samples = pd.read_parquet(run_dir / "samples.parquet")
    eng = samples[samples["source"] == "prometheus"]
    out["engine_samples"] = int(len(eng))
    out["peak_waiting"] = float(eng["num_waiting"].max()) if len(eng) else None
    out["peak_kv_usage"] = float(eng["kv_usage"].max()) if len(eng) else None
    return out


async def _builtin(
    policy: str, params: dict, cost: str, kv: int, args: Any, trace: Path, out: Path
):
    from harness.server.embed import embedded

    engine = {"block_size": BLOCK, "token_budget": args.budget, "max_num_seqs": args.max_num_seqs}
    async with embedded(
        policy, cost, kv, process=True, policy_params=params, engine=engine, tiers=TIERS
    ) as url:
        return await asyncio.to_thread(replay, url, "builtin", trace, out, [])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / "three-hosts")
    ap.add_argument("--num-requests", type=int, default=60)
    ap.add_argument("--rate", type=float, default=5.0)
    # fidelity.py's 256 vLLM blocks of 32, less vLLM's null block
    ap.add_argument("--kv-tokens", type=int, default=255 * BLOCK)
    ap.add_argument("--budget", type=int, default=2048)
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument(
        "--cost-model", default=str(ROOT / "reports" / "fidelity" / "costmodel-vllm.json")
    )
    ap.add_argument("--trace", type=Path, default=None, help="a frozen trace (default: build)")
    ap.add_argument(
        "--vllm-runs",
        type=Path,
        default=None,
        help="reuse fidelity.py's real-vLLM runs of this trace (DIR/<policy>-evaluation)",
    )
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--hosts", default=",".join(HOSTS))
    args = ap.parse_args()
    names = [p for p in args.policies.split(",") if p]
    hosts = [h for h in args.hosts.split(",") if h]
    bad = [p for p in names if p not in POLICIES] + [h for h in hosts if h not in HOSTS]
    if bad:
        print(f"error: unknown policy/host {bad}", file=sys.stderr)
        return 2
    is_file = args.cost_model.endswith((".json", ".yaml", ".yml"))
    if "builtin" in hosts and is_file and not Path(args.cost_model).exists():
        print(f"error: --cost-model {args.cost_model} not found (run fidelity.py)", file=sys.stderr)
        return 2
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    trace = args.trace or build(out / "trace.parquet", 21, args.num_requests, args.rate)
    result: dict[str, Any] = {"config": vars(args) | {"out": str(out)}}
    for name in names:
        params = POLICIES[name]
        res = result[name] = {}
        for host in hosts:
            run_dir = out / f"{name}-{host}"
            if host == "builtin":
                asyncio.run(
                    _builtin(name, params, args.cost_model, args.kv_tokens, args, trace, run_dir)
                )
            elif host == "vllm-cpu" and args.vllm_runs is not None:
                run_dir = args.vllm_runs / f"{name}-evaluation"  # same trace, same shape
            elif host == "vllm-cpu":
                cfg = VllmServerConfig(
                    policy=name,
                    policy_params=params,
                    kv_blocks=args.kv_tokens // BLOCK + 1,  # + vLLM's null block
                    max_num_seqs=args.max_num_seqs,
                    max_num_batched_tokens=args.budget,
                    prefix_caching=False,
                    log_path=out / f"{name}-vllm.log",
                    ready_timeout_s=600,
                )
                with running_vllm(cfg) as srv:
                    replay(srv.url, "vllm", trace, run_dir, [])
            else:
                cfg_s = SglangServerConfig(
                    policy=name,
                    policy_params=params,
                    max_total_tokens=args.kv_tokens,
                    max_running_requests=args.max_num_seqs,
                    chunked_prefill_size=args.budget,
                    log_path=out / f"{name}-sglang.log",
                    ready_timeout_s=600,
                )
                with running_sglang(cfg_s) as srv:
                    text = replay(srv.url, "sglang", trace, run_dir, ["--endpoint", "completions"])
                (out / f"{name}-sglang-replay.txt").write_text(text)
            res[host] = row(run_dir)
            (out / "three_hosts.json").write_text(json.dumps(result, indent=2, default=str))
    print(
        "| policy | host | TTFT p50 / p99 ms | TPOT p50 / p99 ms | tok/s | paid / free TTFT att. |"
        " peak waiting |"
    )
    print("|---|---|---|---|---|---|---|")
    for name in names:
        for host in hosts:
            r = result[name][host]
            att = r["ttft_attainment"]
            print(
                f"| {name} | {host} | {r['p50_ttft_ms']:.0f} / {r['p99_ttft_ms']:.0f} | "
                f"{r['p50_tpot_ms']:.1f} / {r['p99_tpot_ms']:.1f} | {r['output_throughput']:.0f} | "
                f"{att.get('paid', 0) or 0:.2f} / {att.get('free', 0) or 0:.2f} | "
                f"{r['peak_waiting'] if r['peak_waiting'] is not None else '-'} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
