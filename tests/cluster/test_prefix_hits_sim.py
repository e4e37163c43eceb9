"""Prefix-cache hits per request in a simulated session run: prefix_hits.parquet, the hit rate
by turn index (issue 16, harness.results.prefix_hits), as the sessions report reads it."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from harness.engine.cluster_run import write_cluster_run
from harness.report.sessions import prefix_hits_by_turn
from harness.results.prefix_hits import PREFIX_HITS_FILE, prefix_hit_summary
from harness.results.rundir import read_run
from harness.results.sessions import session_summary
from harness.routers.registry import make_router

from .conftest import engines, session_trace


def _trace(systems: list[str]) -> object:
    """One 3-turn conversation per system prompt (think 1 s), 0.3 s apart."""
    rows = []
    for j, system in enumerate(systems):
        for k in range(3):
            rows.append(
                {
                    "session_id": f"s{j}",
                    "call_index": k,
                    "parents": "" if k == 0 else str(k - 1),
                    "think_s": 0.0 if k == 0 else 1.0,
                    "prompt_len": 80 + 10 * k,
                    "output_len": 40,
                    "arrival_s": 0.3 * j,
                    "system": system,
                }
            )
    return session_trace(rows)


def _per_turn(run_dir: Path) -> dict[int, float]:
    req = read_run(run_dir, chunks=False, samples=False).requests
    assert prefix_hits_by_turn(run_dir, req) is not None  # the sessions report's panel
    summary = prefix_hit_summary(run_dir, req)
    assert summary is not None
    assert 0 < summary["hit_rate"] < 1
    return {int(t["call_index"]): t["hit_rate"] for t in summary["per_turn"]}


def test_simulated_session_run_writes_hits_by_turn(tmp_path: Path) -> None:
    trace = _trace([f"You are assistant number {j} of this test." for j in range(3)])
    run_dir, res = write_cluster_run(tmp_path / "run", trace, engines(1), None, {})
    hits = pd.read_parquet(run_dir / PREFIX_HITS_FILE)
    assert len(hits) == len(trace) and hits["queries"].gt(0).all()
    # the counts are the engine's own: they add up to its vLLM-style counters
    assert hits["queries"].sum() == res.counters["prefix_cache_queries"]
    assert hits["hits"].sum() == res.counters["prefix_cache_hits"]
    rate = _per_turn(run_dir)
    summary = session_summary(run_dir)
    assert summary is not None
    assert summary["prefix_cache"]["per_turn"][1]["hit_rate"] == rate[1]  # in summary.json
    assert rate[0] == 0  # distinct system prompts: a conversation's first turn shares nothing
    assert rate[1] > 0 and rate[2] > 0  # later turns hit the previous turn's prompt + reply


def test_shared_system_prompt_hits_on_first_turns_over_replicas(tmp_path: Path) -> None:
    system = " ".join(["shared"] * 40)  # 40 tokens: two full blocks of 16
    trace = _trace([system] * 3)
    router = make_router("session-affinity")
    run_dir, _ = write_cluster_run(tmp_path / "run", trace, engines(2), router, {})
    rate = _per_turn(run_dir)
    assert rate[0] > 0  # later sessions on an engine reuse the common system prompt


def test_no_prefix_cache_no_hits_file(tmp_path: Path) -> None:
    trace = _trace(["a", "b"])
    run_dir, _ = write_cluster_run(
        tmp_path / "run", trace, engines(1, prefix_caching=False), None, {}
    )
    assert not (run_dir / PREFIX_HITS_FILE).exists()
