"""CPU test tier: the vLLM adapter with prefix caching on (vLLM's default), multi-turn traffic.

A frozen trace of 4 conversations x 3 turns (turn k's prompt = a shared system prompt + the
conversation's turns so far, all turns of one round before the next) is replayed through
``harness replay`` against real vLLM hosting a harness policy (``slai``). vLLM's own
``/metrics`` prefix-cache counters show the cache was hit, and the adapter's step log shows
the policy's steps computed exactly the prompt tokens vLLM did *not* take from the cache
(the view counts cached tokens as computed, as vLLM does).
"""

from __future__ import annotations

import re
import subprocess
import urllib.request
from pathlib import Path

import pytest
from vllm_testlib import TINY_MODEL, requires_vllm

pytestmark = [pytest.mark.slow, pytest.mark.vllm, requires_vllm, pytest.mark.timeout(900)]

CONVERSATIONS = 4
TURNS = 3
SYSTEM_TOKENS = 128  # 4 blocks of 32: shared by every request
TURN_TOKENS = 40
OUTPUT = 16


def _counter(metrics: str, name: str) -> float:
    vals = [float(m.group(1)) for m in re.finditer(rf"^{name}\{{[^}}]*\}} (\S+)$", metrics, re.M)]
    assert vals, f"{name} not in /metrics"
    return sum(vals)


def _multi_turn_trace(path: Path) -> Path:
    from harness.workload import build_trace, save_trace
    from harness.workload.prompts import exact_prompt, load_tokenizer
    from harness.workload.trace import Trace

    n = CONVERSATIONS * TURNS
    base = build_trace(
        "synthetic",
        num_requests=n,
        rate=6.0,
        arrival="constant",
        seed=11,
        input_len=64,
        output_len=OUTPUT,
        range_ratio=0.0,
    )
    tok = load_tokenizer(str(TINY_MODEL))
    system = exact_prompt(SYSTEM_TOKENS, tok, 1, 0)
    df = base.df.copy()
    prompts = []
    for i in range(n):  # row i: round i // C of conversation i % C
        conv, turn = i % CONVERSATIONS, i // CONVERSATIONS
        turns = [exact_prompt(TURN_TOKENS, tok, 2, conv * 10 + k) for k in range(turn + 1)]
        prompts.append(" ".join([system, *turns]))
    df["prompt"] = prompts
    df["prompt_len"] = [tok.count(p) for p in prompts]
    return save_trace(Trace.from_frame(df, base.tiers, base.meta), path)


def test_multi_turn_replay_hits_vllm_prefix_cache_under_a_harness_policy(
    tmp_path: Path, harness_cli: list[str]
) -> None:
    from adapters.vllm.launch import VllmServerConfig, running_vllm
    from adapters.vllm.steplog import read_step_log, steps_only
    from harness.results.rundir import read_run

    trace = _multi_turn_trace(tmp_path / "trace.parquet")
    step_log = tmp_path / "steps.jsonl"
    cfg = VllmServerConfig(
        policy="slai",
        kv_blocks=256,
        max_num_seqs=32,
        prefix_caching=True,
        step_log=step_log,
        log_path=tmp_path / "vllm.log",
        ready_timeout_s=600,
        enforce_eager=True,  # a faster start: the tests check scheduling, not speed
    )
    run_dir = tmp_path / "run"
    with running_vllm(cfg) as server:
        assert "--enable-prefix-caching" in server.command
        proc = subprocess.run(
            [
                *harness_cli,
                "replay",
                "--trace",
                str(trace),
                "--arrival",
                "trace",
                "--target",
                server.url,
                "--engine",
                "vllm",
                "--ready-timeout",
                "30",
                "--no-progress",
                "--out",
                str(run_dir),
            ],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        with urllib.request.urlopen(server.url + "/metrics", timeout=10) as r:
            metrics = r.read().decode()
        log = server.log_text()
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "HarnessScheduler: policy 'slai'" in log
    req = read_run(run_dir).requests
    assert req["success"].all() and len(req) == CONVERSATIONS * TURNS
    hits = _counter(metrics, "vllm:prefix_cache_hits_total")
    queries = _counter(metrics, "vllm:prefix_cache_queries_total")
    # Every request after the first shares at least the system prompt's full blocks; later
    # turns also share their conversation's earlier turns.
    assert hits >= (len(req) - 1) * SYSTEM_TOKENS, (hits, queries)
    # The policy's steps computed exactly what the cache did not provide: every prompt token
    # but the hits, and every output token but the last (no preemptions with 256 blocks).
    steps = steps_only(read_step_log(step_log))
    assert sum(s["preempted"] for s in steps) == 0
    computed = sum(s["prefill_tokens"] + s["decode_tokens"] for s in steps)
    need = int((req["prompt_tokens"] + req["output_tokens"] - 1).sum())
    assert computed == need - hits, (computed, need, hits)
