"""CPU test tier: a real SGLang 0.5.23 server, stock and hosting harness policies.

Each server (``adapters.sglang.launch``: ``--device cpu``, the tiny random Llama, the
``sgl_kernel`` stand-in) serves a replay of one frozen 16-request two-tier trace through
``harness replay --engine sglang`` (``--endpoint completions`` or ``generate``). Besides every
request completing with its exact lengths, each test checks that SGLang *itself* did what the
policy decides, from SGLang's own observables: its ``Prefill batch, #new-seq: ..,
#running-req: ..`` log lines (one per prefill step) and its ``/metrics`` queue/running samples.

One server at a time, one start per policy (20-45 s each): tests are grouped by policy in file
order and :class:`Servers` stops the previous server before starting the next.
Needs ``adapters/sglang/setup_cpu_venv.sh`` (cached); skips with that instruction otherwise.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from adapters.server_process import LaunchError

ROOT = Path(__file__).resolve().parents[2]
TIERS = "paid:0.25:ttft=2s:tbt=100ms,free:0.75:ttft=10s:tbt=500ms"
N = 16
PROMPT = 64
OUTPUT = 24
WAIT_N = 4
SLAI = {"token_budget": 48, "max_active": 3}  # budget < one prompt: one admission per step
# All N requests within 80 ms, for the tests whose rule only shows when requests overlap
# (cohorts, caps): at the trace's 16 req/s a fast box finishes each request before the next
# arrives, and neither a cohort nor a cap ever forms.
BURST = ("--arrival", "constant", "--rate", "200")


def _missing() -> str | None:
    from adapters.sglang.launch import DEFAULT_MODEL, sglang_python

    try:
        sglang_python()
    except LaunchError as e:
        return str(e)
    if not (DEFAULT_MODEL / "config.json").exists():
        return f"tiny model missing ({DEFAULT_MODEL}); run adapters/sglang/setup_cpu_venv.sh"
    return None


pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(_missing() is not None, reason=_missing() or ""),
    pytest.mark.timeout(600),
]

PREFILL = re.compile(
    r"Prefill batch, #new-seq: (?P<new_seq>\d+), #new-token: (?P<new_token>\d+), "
    r"#cached-token: (?P<cached>\d+), .*?#running-req: (?P<running>\d+), "
    r"#queue-req: (?P<queue>\d+)"
)


DECODE_QUEUE = re.compile(r"Decode batch, .*?#queue-req: (\d+)")


def prefill_lines(log: str) -> list[dict[str, int]]:
    """SGLang's per-prefill-step log lines (``metrics_reporter.report_prefill_stats``)."""
    return [{k: int(v) for k, v in m.groupdict().items()} for m in PREFILL.finditer(log)]


@dataclass
class Replay:
    run_dir: Path
    requests: pd.DataFrame
    engine: pd.DataFrame  # /metrics samples (num_waiting, num_running, kv_usage)
    summary: dict[str, Any]
    prefills: list[dict[str, int]]  # SGLang's log lines written during this replay
    log: str


@dataclass
class Servers:
    """At most one SGLang server alive; replays cached by (policy, endpoint)."""

    tmp: Path
    cli: list[str]
    trace: Path
    current: tuple[str, Any] | None = None
    done: dict[tuple[str, str], Replay] = field(default_factory=dict)

    def server(self, key: str, policy: str | None, params: dict[str, Any]) -> Any:
        from adapters.sglang.launch import SglangServer, SglangServerConfig

        if self.current and self.current[0] == key:
            return self.current[1]
        self.close()
        cfg = SglangServerConfig(
            policy=policy,
            policy_params=params,
            max_total_tokens=8192,
            # SGLang refreshes its /metrics queue/running gauges when it logs a decode step
            # (every --decode-log-interval steps, 40 by default): every step, so the samples
            # see the queue the policy holds
            decode_log_interval=1,
            log_path=self.tmp / f"sglang-{key}.log",
            ready_timeout_s=600,  # as the vLLM tier: a loaded 2-core box can take minutes
        )
        server = SglangServer(cfg)
        self.current = (key, server)
        server.wait_healthy()
        return server

    def replay(
        self,
        key: str,
        policy: str | None,
        params: dict[str, Any],
        endpoint: str,
        arrival: tuple[str, ...] = ("--arrival", "trace"),
    ) -> Replay:
        if (key, endpoint) in self.done:
            return self.done[(key, endpoint)]
        server = self.server(key, policy, params)
        log_start = len(server.log_text())
        run_dir = self.tmp / f"run-{key}-{endpoint}"
        proc = subprocess.run(
            [
                *self.cli,
                "replay",
                "--trace",
                str(self.trace),
                *arrival,
                "--target",
                server.url,
                "--engine",
                "sglang",
                "--endpoint",
                endpoint,
                "--sample-interval",
                "0.05",
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
        log = server.log_text()[log_start:]
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:] + log[-2000:]
        req, engine, summary = _check_run(run_dir)
        out = Replay(run_dir, req, engine, summary, prefill_lines(log), server.log_text())
        self.done[(key, endpoint)] = out
        return out

    def close(self) -> None:
        if self.current is not None:
            self.current[1].stop()
            self.current = None


def _check_run(run_dir: Path) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]]:
    """Every request completed with its exact lengths; the summary has both tiers."""
    from harness.results.rundir import read_run

    run = read_run(run_dir)
    assert run.meta["status"] == "complete"
    req = run.requests
    assert len(req) == N
    assert req["success"].all(), req.loc[~req["success"], "error"].tolist()
    assert (req["output_tokens"] == req["output_len"]).all()  # ignore_eos reached max_tokens
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["completed"] == N and summary["failed"] == 0
    assert set(summary["tiers"]) == {"paid", "free"}
    for name, tier in summary["tiers"].items():
        assert tier["completed"] == int((req["tier"] == name).sum())
        assert tier["ttft_slo_attainment"] is not None
    samples = run.samples
    engine = samples[samples["source"] == "prometheus"]
    assert len(engine) > 0 and engine["num_waiting"].notna().any()
    assert engine["kv_usage"].notna().any() and engine["num_running"].max() > 0
    return req, engine, summary


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory, harness_cli: list[str]) -> Iterator[Servers]:
    from adapters.sglang.launch import DEFAULT_MODEL
    from harness.workload import build_trace, save_trace

    tmp = tmp_path_factory.mktemp("sglang")
    trace = build_trace(
        "synthetic",
        num_requests=N,
        rate=16.0,
        tiers=TIERS,
        seed=5,
        input_len=PROMPT,
        output_len=OUTPUT,
        range_ratio=0.0,
        prompts=f"tokenizer:{DEFAULT_MODEL}",
    )
    pool = Servers(tmp, harness_cli, save_trace(trace, tmp / "trace.parquet"))
    try:
        yield pool
    finally:
        pool.close()


def _adapter_line(log: str) -> str | None:
    m = re.search(r"adapters\.sglang: policy '([a-z_]+)'", log)
    return m.group(1) if m else None


# ---------------------------------------------------------------- stock SGLang
def test_stock_sglang_prefills_arrivals_while_others_decode(servers: Servers) -> None:
    r = servers.replay("stock", None, {}, "completions")
    assert _adapter_line(r.log) is None and "HARNESS_POLICY" not in r.log
    assert r.prefills and sum(p["new_seq"] for p in r.prefills) == N
    # SGLang's prefill-first loop: an arrival is prefilled at the next step, joining a batch
    # that is already decoding (the contrast to fastertransformer below).
    assert any(p["running"] > 0 for p in r.prefills), r.prefills
    assert (r.requests["prompt_tokens"] == r.requests["prompt_len"]).all()


# ------------------------------------------------------- adapter: vllm policy
def test_adapter_vllm_policy_completions_and_generate(servers: Servers) -> None:
    for endpoint in ("completions", "generate"):
        r = servers.replay("vllm", "vllm", {}, endpoint)
        assert _adapter_line(r.log) == "vllm"
        assert sum(p["new_seq"] for p in r.prefills) == N
        # vLLM's FCFS continuous batching: admits while others decode, like SGLang's own.
        assert any(p["running"] > 0 for p in r.prefills), r.prefills
        assert r.summary["completed"] == N


# ------------------------------------------------ adapter: fastertransformer
def test_adapter_fastertransformer_admits_cohorts_only_when_idle(servers: Servers) -> None:
    r = servers.replay("ft", "fastertransformer", {}, "generate", arrival=BURST)
    assert _adapter_line(r.log) == "fastertransformer"
    assert sum(p["new_seq"] for p in r.prefills) == N
    # Request-level batching (seed-stability.md §2.3): SGLang prefilled only when nothing
    # was decoding, and whole cohorts at once, while the rest waited in its queue.
    assert all(p["running"] == 0 for p in r.prefills), r.prefills
    assert max(p["new_seq"] for p in r.prefills) > 1, r.prefills
    # the next cohort waited in SGLang's queue while this one decoded (its per-step log
    # lines; a cohort's decode can be shorter than the 50-ms /metrics samples)
    queued = [int(q) for q in DECODE_QUEUE.findall(r.log)]
    assert max(queued, default=0) > 0


# ---------------------------------------------------------------- adapter: wait
def test_adapter_wait_admits_in_cohorts_of_n(servers: Servers) -> None:
    params = {
        "output_lens": [OUTPUT * 2],
        "thresholds": [WAIT_N],
        "gating": "admission",
        "flush_after_s": 30.0,  # 16 = 4 cohorts of 4: the end-of-run flush is never needed
        "on_idle": "wait",  # the paper's rule: idle below the threshold
    }
    r = servers.replay("wait", "wait", params, "completions")
    assert _adapter_line(r.log) == "wait"
    seqs = [p["new_seq"] for p in r.prefills]
    # Admission only in cohorts of n (seed-wait.md §3.3), in SGLang's own prefill steps.
    assert sum(seqs) == N and all(s % WAIT_N == 0 for s in seqs), seqs
    # The gate held requests in SGLang's waiting queue while its KV pool had room.
    gated = r.engine[(r.engine["num_waiting"] > 0) & (r.engine["kv_usage"] < 0.5)]
    assert len(gated) > 0, r.engine[["t_s", "num_waiting", "num_running", "kv_usage"]]


# ---------------------------------------------------------------- adapter: slai
def test_adapter_slai_caps_admissions_and_active_requests(servers: Servers) -> None:
    r = servers.replay("slai", "slai", SLAI, "completions", arrival=BURST)
    assert _adapter_line(r.log) == "slai"
    assert sum(p["new_seq"] for p in r.prefills) == N
    # SLAI's token budget tau (seed-rad-slai.md §5.4) is below one prompt, so each step admits
    # one request; its active cap alpha bounds the requests SGLang holds (running + new).
    assert all(p["new_seq"] == 1 for p in r.prefills), r.prefills
    assert all(p["running"] + p["new_seq"] <= SLAI["max_active"] for p in r.prefills)
    assert r.engine["num_running"].max() <= SLAI["max_active"]
    # the caps kept requests in SGLang's own queue (its per-step count; the 50-ms /metrics
    # samples can fall between the steps that had one)
    assert max(p["queue"] for p in r.prefills) > 0, r.prefills
    assert max(p["running"] for p in r.prefills) == SLAI["max_active"] - 1, r.prefills
