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

    # 1. freeze the trace; 2. start vLLM; 3. replay + simulate (the real part is skipped
    # when OUT/real already holds a run)
    harness trace build sharegpt-conv -n 40 --rate 0.5 --think-time exp:1 --seed 3 \\
        --opt max_turns=6 --opt min_turns=2 -o /tmp/sg.parquet
    scripts/vllm-cpu/serve.sh --policy vllm --kv-blocks 512 --step-log OUT/steps.jsonl \\
        --detach --pidfile /tmp/vllm.pid
    python benchmarks/prefix_cache_vs_vllm.py --trace /tmp/sg.parquet --out OUT \\
        --kv-blocks 512 --target URL
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
from harness.policies.registry import make_policy
from harness.results.prefix_hits import hits_by_turn, prefix_counters
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


def _turn_table(real: pd.DataFrame, sims: dict[str, pd.DataFrame]) -> pd.DataFrame:
    out = pd.DataFrame({"calls": real.groupby("call_index").size()})
    out["real_ttft_p50_ms"] = real.groupby("call_index")["ttft_s"].median() * 1000
    out["real_engine_ttft_p50_ms"] = real.groupby("call_index")["engine_ttft_s"].median() * 1000
    for name, df in sims.items():
        g = df.groupby("call_index")
        out[f"sim_{name}_ttft_p50_ms"] = g["ttft_s"].median() * 1000
        hits = hits_by_turn(df["call_index"], df["prompt_tokens"], df["cached_tokens"])
        out[f"sim_{name}_hit"] = hits.set_index("call_index")["hit_rate"]
    return out


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
    fit = fit_cost_model(step_log_samples(log))
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
    overhead = float(np.median(gaps)) if a.overhead is None else a.overhead
    print(f"call overhead (client + API server, median of {len(gaps)}): {overhead * 1e3:.0f} ms")
    sims, rates = {}, {}
    for name, fn, rel, ovh in (
        ("tokens", by_tokens, None, 0.0),
        ("tokens_overhead", by_tokens, None, overhead),
        ("segments_overhead", by_segments, None, overhead),
        ("segments_tok_overhead", by_segments_tok, None, overhead),
        ("tokens_real_times", by_tokens, release_at, 0.0),
    ):
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
    # the project's own session kernel (harness.engine.cluster, as `harness simulate` runs a
    # session trace): segments with replay's word-hint lengths, --history trace
    from harness.engine.cluster import EngineSpec, simulate_cluster
    from harness.loadgen.sessions import SessionOptions
    from harness.workload.frozen import load_trace

    kres = simulate_cluster(
        load_trace(a.trace),
        [EngineSpec("e0", make_policy("vllm"), fit.model, cfg)],
        options=SessionOptions(history="trace", max_context=a.max_context),
    )
    pe = kres.per_engine[0]
    rates["kernel_segments"] = pe["prefix_cache_hits"] / pe["prefix_cache_queries"]
    real_rate = counters["hits"] / counters["queries"]
    table = _turn_table(ok, sims)
    res = {
        "calls": len(ok),
        "kv_blocks": a.kv_blocks,
        "block_size": BLOCK_SIZE,
        "cost_model": {
            "r2": fit.r2,
            **{
                k: getattr(fit.model, k)
                for k in ("base_s", "per_token_s", "per_decode_s", "per_kv_s")
            },
        },
        "tokenized_prompt_length_mismatches": mismatch,
        "call_overhead_s": overhead,
        "hit_rate_real": real_rate,
        **{f"hit_rate_sim_{k}": v for k, v in rates.items()},
        "ttft_p50_ms_real": float(ok["ttft_s"].median() * 1000),
        **{f"ttft_p50_ms_sim_{k}": float(v["ttft_s"].median() * 1000) for k, v in sims.items()},
        "by_turn": json.loads(table.to_json(orient="index")),
    }
    (a.out / "prefix_cache_vs_vllm.json").write_text(json.dumps(res, indent=1))
    print(f"calls {len(ok)}; KV {a.kv_blocks} blocks x {BLOCK_SIZE}; cost model R2 {fit.r2:.3f}")
    print(f"prompt length mismatches (tokenized vs vLLM usage): {mismatch}")
    print(
        f"hit rate: real {real_rate:.3f} | "
        + " | ".join(f"sim {k} {v:.3f}" for k, v in rates.items())
    )
    print(table.round(3).to_string())


if __name__ == "__main__":
    main()
