"""Prefix-cache fidelity: the engine core's prefix cache against real vLLM CPU (issue 16).

One multi-turn ShareGPT session trace is replayed once against real vLLM (CPU, the tiny
model, prefix caching on, ``--num-gpu-blocks-override N``, the harness scheduler hosting the
``vllm`` policy so its step log gives a cost model) and simulated by the engine core with the
same KV blocks (N - 1: vLLM reserves block 0), block size, token budget, policy and the
calls the real run sent. Reported: prefix-cache hit rate (hits / queried prompt tokens,
vLLM's ``prefix_cache_hits`` / ``prefix_cache_queries`` counters on ``/metrics`` vs the
core's counters) and TTFT p50 by turn index, sim vs real.

Two simulated token namings:

- ``tokens``: each call's prompt is composed exactly as replay sends it and tokenized with the
  model's tokenizer (``PromptIdentity.from_token_ids``): the same tokens vLLM hashes;
- ``segments``: :func:`harness.workload.token_identity.call_segments` (named runs, lengths as
  replay's word hints): what a session simulation without a tokenizer sees.

And ``harness simulate`` itself, run on the session trace as a user runs it (the fitted cost
model written to OUT/cost_model.json, the same KV blocks, ``--history trace``), once with the
trace's own length hints (``cli``), once with ``--tokenizer`` (``cli_tokenizer``: prompts
counted and hashed in the model's tokens), and once more with ``--call-overhead`` set to the
real run's median time a call spends between the engine and the client beyond its think time
(``cli_tokenizer_overhead``). Their hit rates are the fidelity figures; the
other variants explain the gap.

    # 1. freeze the trace; 2. start vLLM; 3. replay + simulate (the real part is skipped
    # when OUT/real already holds a run)
    harness trace build sharegpt-conv -n 40 --rate 0.5 --think-time exp:1 --seed 3 \\
        --opt max_turns=6 --opt min_turns=2 -o /tmp/sg.parquet
    scripts/vllm-cpu/serve.sh --policy vllm --kv-blocks 512 --step-log OUT/steps.jsonl \\
        --detach --pidfile /tmp/vllm.pid
    python benchmarks/prefix_cache_vs_vllm.py --trace /tmp/sg.parquet --out OUT \\
        --kv-blocks 512 --target URL
    # again on the same real run, only the two `harness simulate` runs: add --sim-only

By-turn figures are over the calls every run completed (a run may refuse a call another
served: replay's prompt + max_tokens check on the hints, vLLM's clip on its own count).
"""

from __future__ import annotations

import argparse
import heapq
import json
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from harness.engine.config import EngineConfig
from harness.engine.core import EngineCore
from harness.engine.costmodel import CostModel, fit_cost_model
from harness.engine.prefix_cache import PromptIdentity
from harness.loadgen.prefix_poller import prefix_counters
from harness.policies.registry import make_policy
from harness.results.prefix_hits import hits_by_turn
from harness.server.fidelity import residual_table
from harness.workload.sessions import Call, Session, compose, sessions_from_frame
from harness.workload.token_identity import call_identity

ROOT = Path(__file__).resolve().parents[1]
BLOCK_SIZE = 32  # the adapter's default (the CPU attention backend needs a multiple of 32)


def _metrics(url: str) -> tuple[float, float]:
    with urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=10) as r:
        got = prefix_counters(r.read().decode())
    if got is None:
        raise SystemExit("error: the target exports no vllm:prefix_cache_* counters")
    return got


def run_real(a: argparse.Namespace, real: Path) -> None:
    """Replay the trace against the running vLLM; counters read around the run."""
    q0, h0 = _metrics(a.target)
    cmd = [
        sys.executable, "-m", "harness.cli.main", "replay", "--trace", str(a.trace),
        "--arrival", "trace", "--target", a.target, "--engine", "vllm", "--history", "trace",
        "--no-progress", "--no-report", "--out", str(real),
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"error: replay failed: {proc.stderr[-800:]}")
    q1, h1 = _metrics(a.target)
    (real / "prefix_counters.json").write_text(
        json.dumps({"queries": q1 - q0, "hits": h1 - h0, "command": cmd}, indent=1)
    )


def simulate_sessions(
    sessions: list[Session],
    sent: set[tuple[str, int]],
    identity: Callable[[Session, Call], PromptIdentity],
    cfg: EngineConfig,
    cost: CostModel,
    release_at: dict[tuple[str, int], float] | None = None,
    overhead_s: float = 0.0,
) -> tuple[pd.DataFrame, EngineCore]:
    """Sessions in virtual time on one engine core: a call is released ``think_s`` after its
    last parent finished (roots: after the session's arrival), as replay does. Only calls in
    ``sent`` (those the real run sent and completed) run. ``release_at`` pins every call's
    release to a given time instead (the real engine's arrival times: the cache model
    without the timing model). ``overhead_s`` delays every release (the client and API
    server between one call's last token in the engine and the next call's arrival there)."""
    core = EngineCore(make_policy("vllm"), cost, cfg)
    heap: list[tuple[float, int, Session, Call]] = []
    seq = 0
    waiting_on: dict[tuple[str, int], int] = {}
    children: dict[tuple[str, int], list[Call]] = {}
    for s in sessions:
        for c in s.calls:
            if (s.session_id, c.index) not in sent:
                continue
            waiting_on[(s.session_id, c.index)] = len(c.parents)
            for p in c.parents:
                children.setdefault((s.session_id, p), []).append(c)
            if release_at is not None:
                heapq.heappush(heap, (release_at[(s.session_id, c.index)], seq, s, c))
                seq += 1
            elif not c.parents:
                heapq.heappush(heap, (s.arrival_s + c.think_s + overhead_s, seq, s, c))
                seq += 1
    by_rid: dict[str, tuple[Session, Call]] = {}
    rows: list[dict[str, Any]] = []
    now = 0.0
    idle = 0
    while heap or core.has_work():
        while heap and heap[0][0] <= now:
            t, _, s, c = heapq.heappop(heap)
            ident = identity(s, c)
            rid = f"{s.session_id}/{c.index}"
            by_rid[rid] = (s, c)
            if not core.add_request(
                rid, ident.num_prompt_tokens, c.output_len, arrival_s=t, identity=ident
            ):
                raise SystemExit(f"error: {rid} does not fit: {core.rejections[rid]}")
        if not core.has_work():
            now = heap[0][0]
            continue
        nxt = heap[0][0] if heap else None
        out = core.step(now, fast_forward_until=nxt, hold_until=nxt)
        if out.idle:
            idle += 1
            if idle > 1000:
                raise SystemExit("error: the simulated engine stalled")
            now = nxt if nxt is not None and nxt > now else now + 1e-3
            continue
        idle = 0
        now = out.end_s
        for r in out.finished:
            s, c = by_rid[r.request_id]
            rows.append(
                {
                    "session_id": s.session_id,
                    "call_index": c.index,
                    "prompt_tokens": r.num_prompt_tokens,
                    "cached_tokens": max(0, r.num_cached_tokens),
                    "ttft_s": r.first_token_s - r.arrival_s,
                    "e2e_s": r.finish_s - r.arrival_s,
                    "preemptions": r.num_preemptions,
                }
            )
            for ch in [] if release_at is not None else children.get((s.session_id, c.index), []):
                key = (s.session_id, ch.index)
                waiting_on[key] -= 1
                if waiting_on[key] == 0:
                    heapq.heappush(heap, (now + ch.think_s + overhead_s, seq, s, ch))
                    seq += 1
    return pd.DataFrame(rows), core


def simulate_cli(
    a: argparse.Namespace, cfg: EngineConfig, cost_file: Path, out: Path, extra: list[str]
) -> tuple[pd.DataFrame, float, list[str]]:
    """``harness simulate`` on the session trace with the real run's engine settings: its
    successful first attempts (session, turn, prompt tokens, cached tokens, TTFT) and hit
    rate (``summary.json`` sessions.prefix_cache, over every attempt as vLLM counts)."""
    import shutil

    shutil.rmtree(out, ignore_errors=True)
    cmd = [
        "harness", "simulate", "--trace", str(a.trace), "--policy", "vllm",
        "--cost-model", str(cost_file), "--num-blocks", str(cfg.num_blocks),
        "--block-size", str(cfg.block_size), "--token-budget", str(cfg.token_budget),
        "--max-num-seqs", str(cfg.max_num_seqs), "--max-context", str(a.max_context),
        "--history", "trace", "--no-report", "--out", str(out), *extra,
    ]  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "harness.cli.main", *cmd[1:]],
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"error: harness simulate failed: {proc.stderr[-800:]}")
    (run_dir,) = [d for d in out.iterdir() if d.is_dir()]
    req = pd.read_parquet(run_dir / "requests.parquet")
    hits = pd.read_parquet(run_dir / "prefix_hits.parquet")
    summary = json.loads((run_dir / "summary.json").read_text())
    rate = float(summary["sessions"]["prefix_cache"]["hit_rate"])
    df = req.merge(hits, on="req", how="left")
    df = df[df["success"] & (df["attempt"] == 0)]
    table = pd.DataFrame(
        {
            "session_id": df["session_id"],
            "call_index": df["call_index"].astype(int),
            "prompt_tokens": df["queries"].fillna(df["prompt_len"]),
            "cached_tokens": df["hits"].fillna(0),
            "ttft_s": df["first_chunk_s"] - df["arrival_s"],
            "e2e_s": df["last_chunk_s"] - df["arrival_s"],
        }
    )
    return table.reset_index(drop=True), rate, cmd


def _common(real: pd.DataFrame, sims: dict[str, pd.DataFrame]) -> set[tuple[str, int]]:
    """Calls every run completed: a run may refuse a call another served (context rules:
    replay's on the hints, vLLM's on its count), and a by-turn median over 8 to 40 calls
    moves with one call."""
    keys = set(zip(real["session_id"], real["call_index"].astype(int), strict=True))
    for df in sims.values():
        keys &= set(zip(df["session_id"], df["call_index"].astype(int), strict=True))
    return keys


def _only(df: pd.DataFrame, keys: set[tuple[str, int]]) -> pd.DataFrame:
    k = list(zip(df["session_id"], df["call_index"].astype(int), strict=True))
    return df[[x in keys for x in k]]


def _turn_table(real: pd.DataFrame, sims: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Per turn index, over the calls every run completed: TTFT p50 and mean (real: at the
    client and in the engine), prompt tokens p50, simulated hit rate."""
    keys = _common(real, sims)
    r = _only(real, keys).groupby("call_index")
    out = pd.DataFrame({"calls": r.size()})
    out["real_ttft_p50_ms"] = r["ttft_s"].median() * 1000
    out["real_ttft_mean_ms"] = r["ttft_s"].mean() * 1000
    out["real_engine_ttft_p50_ms"] = r["engine_ttft_s"].median() * 1000
    out["real_engine_ttft_mean_ms"] = r["engine_ttft_s"].mean() * 1000
    out["real_prompt_p50"] = r["prompt_tokens"].median()
    for name, df in sims.items():
        g = _only(df, keys).groupby("call_index")
        out[f"sim_{name}_ttft_p50_ms"] = g["ttft_s"].median() * 1000
        out[f"sim_{name}_ttft_mean_ms"] = g["ttft_s"].mean() * 1000
        out[f"sim_{name}_prompt_p50"] = g["prompt_tokens"].median()
        hits = hits_by_turn(df["call_index"], df["prompt_tokens"], df["cached_tokens"])
        out[f"sim_{name}_hit"] = hits.set_index("call_index")["hit_rate"]
    return out


def _shape(table: pd.DataFrame, real: str, sim: str) -> dict[str, Any]:
    """TTFT-by-turn shape of ``sim`` against ``real``: how many turn-to-turn steps move the
    same way, and the range of sim / real per turn (directions alone cannot tell a flat,
    20x-too-fast curve from a right one)."""
    dr, ds = np.sign(table[real].diff().iloc[1:]), np.sign(table[sim].diff().iloc[1:])
    ratio = table[sim] / table[real]
    return {
        "same_direction": f"{int((dr == ds).sum())}/{len(dr)}",
        "ratio_min": round(float(ratio.min()), 2),
        "ratio_max": round(float(ratio.max()), 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--kv-blocks", type=int, required=True, help="vLLM --num-gpu-blocks-override")
    ap.add_argument("--target", default=None, help="running vLLM (needed unless OUT/real exists)")
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--token-budget", type=int, default=2048)
    ap.add_argument("--max-context", type=int, default=4096, help="the server's max_model_len")
    ap.add_argument(
        "--overhead",
        type=float,
        default=None,
        help="s between a call's last token and its child's engine arrival, beyond the think "
        "time (default: measured in the real run)",
    )
    ap.add_argument("--tokenizer", default=str(ROOT / ".cache" / "tiny-llama" / "tokenizer.json"))
    ap.add_argument(
        "--sim-only", action="store_true", help="only the harness simulate runs (skip variants)"
    )
    a = ap.parse_args()
    real_dir = a.out / "real"
    if not (real_dir / "prefix_counters.json").exists():
        if not a.target:
            raise SystemExit("error: no real run in OUT/real: give --target")
        run_real(a, real_dir)
    counters = json.loads((real_dir / "prefix_counters.json").read_text())
    req = pd.read_parquet(real_dir / "requests.parquet")
    ok = req[req["success"] & (req["attempt"] == 0)].copy()
    ok["ttft_s"] = ok["first_chunk_s"] - ok["send_s"]
    sent = set(zip(ok["session_id"], ok["call_index"].astype(int), strict=True))

    from adapters.vllm.steplog import read_step_log, requests_only, step_log_samples

    log = read_step_log(a.out / "steps.jsonl")
    # the context model: a prompt chunk after cached prefix blocks pays attention over that
    # cached context (prefill_attn), and a prefill-bearing step its fixed cost; the affine
    # model charged a cache-hit chunk like a cold one of the same length (R2 0.79 vs 0.91 on
    # the step log of the issue 16 run), so the simulated engine ran fast
    fit = fit_cost_model(step_log_samples(log), kind="context")
    # the engine's own view of each call (no HTTP, no API-server queue): what the sim models
    eng = pd.DataFrame(requests_only(log))
    eng["request_id"] = eng["request_id"].str.removeprefix("cmpl-").str.rsplit("-", n=2).str[0]
    eng = eng.set_index("request_id")
    ok["engine_ttft_s"] = ok["request_id"].map(eng["first_token_s"] - eng["engine_arrival_s"])
    ok["engine_arrival_s"] = ok["request_id"].map(eng["engine_arrival_s"])
    ok["engine_last_s"] = ok["request_id"].map(eng["last_token_s"])
    t_first = ok["engine_arrival_s"].min()
    t0 = min(s.arrival_s for s in sessions_from_frame(pd.read_parquet(a.trace)))
    release_at = {
        (sid, int(ci)): t0 + t - t_first
        for sid, ci, t in zip(
            ok["session_id"], ok["call_index"], ok["engine_arrival_s"], strict=True
        )
    }
    cfg = EngineConfig(
        block_size=BLOCK_SIZE,
        num_blocks=a.kv_blocks - 1,  # vLLM reserves block 0 (the null block)
        token_budget=a.token_budget,
        max_num_seqs=a.max_num_seqs,
    )
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(a.tokenizer)
    sessions = sessions_from_frame(pd.read_parquet(a.trace))
    keys = list(zip(ok["session_id"], ok["call_index"].astype(int), strict=True))
    real_len = dict(zip(keys, ok["prompt_tokens"], strict=True))
    mismatch = 0

    def by_tokens(s: Session, c: Call) -> PromptIdentity:
        nonlocal mismatch
        prompt, _ = compose(s, c, lambda x: x.prompt or "", lambda x: x.reply or "")
        ids = tok.encode(prompt).ids
        mismatch += len(ids) != real_len[(s.session_id, c.index)]
        return PromptIdentity.from_token_ids(ids)

    def by_segments(s: Session, c: Call) -> PromptIdentity:
        return call_identity(s, c, generated_replies=False)

    # the same named runs with the model's token counts instead of word hints (separators
    # and BOS still uncounted): how much of the segments gap is the lengths
    ntok = {
        (s.session_id, c.index): (len(tok.encode(c.prompt or "", add_special_tokens=False).ids),
                                  len(tok.encode(c.reply or "", add_special_tokens=False).ids))
        for s in sessions for c in s.calls
    }  # fmt: skip
    tok_sessions = {
        s.session_id: replace(
            s,
            calls=tuple(replace(c, prompt_len=ntok[(s.session_id, c.index)][0]) for c in s.calls),
        )
        for s in sessions
    }

    def by_segments_tok(s: Session, c: Call) -> PromptIdentity:
        ts = tok_sessions[s.session_id]
        return call_identity(
            ts,
            next(x for x in ts.calls if x.index == c.index),
            reply_len=lambda x: ntok[(s.session_id, x.index)][1],
            generated_replies=False,
        )

    # the real loop's gap: next call's engine arrival - parent's last token - think time
    last = dict(zip(keys, ok["engine_last_s"], strict=True))
    think = {(s.session_id, c.index): (c.think_s, c.parents) for s in sessions for c in s.calls}
    gaps = [
        t - max(last[(sid, p)] for p in think[(sid, ci)][1]) - think[(sid, ci)][0]
        for sid, ci, t in zip(
            ok["session_id"], ok["call_index"], ok["engine_arrival_s"], strict=True
        )
        if think[(sid, ci)][1]
    ]
    gaps = [g for g in gaps if np.isfinite(g)]
    overhead = float(np.median(gaps)) if gaps else 0.0
    overhead = overhead if a.overhead is None else a.overhead
    print(f"call overhead (client + API server, median of {len(gaps)}): {overhead * 1e3:.0f} ms")
    sims: dict[str, pd.DataFrame] = {}
    rates: dict[str, float] = {}
    variants = (
        ("tokens", by_tokens, None, 0.0),
        ("tokens_overhead", by_tokens, None, overhead),
        ("segments_overhead", by_segments, None, overhead),
        ("segments_tok_overhead", by_segments_tok, None, overhead),
        ("tokens_real_times", by_tokens, release_at, 0.0),
    )
    for name, fn, rel, ovh in () if a.sim_only else variants:
        df, core = simulate_sessions(sessions, sent, fn, cfg, fit.model, rel, ovh)
        sims[name] = df
        rates[name] = core.prefix_cache_hits / core.prefix_cache_queries
        print(
            f"sim {name}: e2e p50 {df['e2e_s'].median():.3f} s, "
            f"preemptions {core.preemptions_total}, evictions {core.prefix_cache.evictions}"
        )
    print(
        f"real: e2e p50 {(ok['last_chunk_s'] - ok['send_s']).median():.3f} s (client), "
        f"engine TTFT p50 {ok['engine_ttft_s'].median() * 1000:.1f} ms"
    )
    # `harness simulate` straight from the session trace, as a user runs it
    cost_file = a.out / "cost_model.json"
    cost_file.write_text(json.dumps(fit.model.to_dict(), indent=1))
    tok = ["--tokenizer", a.tokenizer]
    cli_runs = (
        ("cli", []),
        ("cli_tokenizer", tok),
        # the measured per-call client + API server time as `--call-overhead`
        ("cli_tokenizer_overhead", [*tok, "--call-overhead", f"{overhead:.6f}"]),
    )
    for name, extra in cli_runs:
        df, rate, cmd = simulate_cli(a, cfg, cost_file, a.out / f"sim_{name}", extra)
        sims[name], rates[name] = df, rate
        print(f"sim {name}: {len(df)} calls ok; command: {' '.join(cmd)}")
    real_rate = counters["hits"] / counters["queries"]
    table = _turn_table(ok, sims)
    res = {
        "calls": len(ok),
        "kv_blocks": a.kv_blocks,
        "block_size": BLOCK_SIZE,
        "cost_model": {"r2": fit.r2, **fit.model.to_dict()},
        # where the fitted model misses the real steps: prefill-bearing steps after cached
        # context (prefix hits) vs cold ones, by chunk length
        "cost_model_residuals": residual_table(
            step_log_samples(log), fit.model, by=("kind", "context", "chunk")
        ),
        "tokenized_prompt_length_mismatches": mismatch,
        "call_overhead_s": overhead,
        "hit_rate_real": real_rate,
        **{f"hit_rate_sim_{k}": v for k, v in rates.items()},
        "ttft_p50_ms_real": float(ok["ttft_s"].median() * 1000),
        **{f"ttft_p50_ms_sim_{k}": float(v["ttft_s"].median() * 1000) for k, v in sims.items()},
        "by_turn": json.loads(table.to_json(orient="index")),
        "by_turn_calls": int(table["calls"].sum()),
    }
    print(f"calls {len(ok)}; KV {a.kv_blocks} blocks x {BLOCK_SIZE}; cost model R2 {fit.r2:.3f}")
    print(f"prompt length mismatches (tokenized vs vLLM usage): {mismatch}")
    print(
        f"hit rate: real {real_rate:.3f} | "
        + " | ".join(f"sim {k} {v:.3f}" for k, v in rates.items())
    )
    for name in [k for k in sims if k.startswith("cli")]:
        shape = {
            stat: _shape(table, f"real_ttft_{stat}_ms", f"sim_{name}_ttft_{stat}_ms")
            for stat in ("p50", "mean")
        }
        res[f"ttft_by_turn_shape_{name}"] = shape
        print(f"TTFT by turn, sim {name} vs real: {shape}")
    # the simulated TTFT is the engine's (arrival to first token, no client or API server):
    # against the real engine's, the cost model alone (tokens_real_times: same arrivals too)
    for name in sims:
        shape = {
            stat: _shape(table, f"real_engine_ttft_{stat}_ms", f"sim_{name}_ttft_{stat}_ms")
            for stat in ("p50", "mean")
        }
        res[f"engine_ttft_by_turn_shape_{name}"] = shape
        print(f"engine TTFT by turn, sim {name} vs real engine: {shape}")
    print("fitted step time residuals (real - model, ms) by step kind, context, chunk:")
    print(pd.DataFrame(res["cost_model_residuals"]).to_string(index=False))
    (a.out / "prefix_cache_vs_vllm.json").write_text(json.dumps(res, indent=1))
    cols = ["calls", "real_ttft_p50_ms", "real_ttft_mean_ms", "real_engine_ttft_p50_ms"]
    cols += ["real_engine_ttft_mean_ms"]
    cols += ["real_prompt_p50"] + [c for c in table.columns if c.startswith("sim_cli")]
    with pd.option_context("display.width", 250):
        print(table[cols].round(3).to_string())


if __name__ == "__main__":
    main()
