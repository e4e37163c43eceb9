"""`harness experiment routers` (issue 16): the comparison's arithmetic, and a tiny end-to-end
run of both modes (the cluster kernel and a live 4-replica server)."""

from __future__ import annotations

import math

import pytest

from harness.experiments.routers import Setup, gains, run

TINY = Setup(sessions=6, session_rate=6.0, turns=3.0, max_turns=3, think="exp:0.1")


def _row(mode: str, router: str, p50: float, p99: float, hit: float) -> dict:
    return {"mode": mode, "router": router, "ttft_p50_ms": p50, "ttft_p99_ms": p99,
            "hit_rate": hit}  # fmt: skip


def test_gains_state_the_change_against_round_robin_per_mode():
    rows = [
        _row("simulated", "round-robin", 40.0, 200.0, 0.3),
        _row("simulated", "session-affinity", 30.0, 100.0, 0.7),
        _row("live", "round-robin", 50.0, 100.0, 0.3),
        _row("live", "prefix-aware", 45.0, 120.0, 0.6),
    ]
    claims = gains(rows)
    assert [c["verdict"] for c in claims] == ["yes", "no"]
    assert claims[0]["p50_change_pct"] == pytest.approx(-25.0)
    assert claims[0]["p99_change_pct"] == pytest.approx(-50.0)
    assert "(simulated)" in claims[0]["claim"] and "30% -> 70%" in claims[0]["measured"]
    assert claims[1]["p99_change_pct"] == pytest.approx(20.0)


def test_simulated_routers_on_a_tiny_trace(tmp_path):
    res = run(tmp_path, setup=TINY, modes=("simulated",))
    assert [r["router"] for r in res.rows] == ["round-robin", "session-affinity", "prefix-aware"]
    calls = {r["calls"] for r in res.rows}
    assert len(calls) == 1 and all(r["ok"] == r["calls"] for r in res.rows)
    rr, sa = res.rows[0], res.rows[1]
    assert sum(rr["routed"]) == rr["calls"] and max(rr["routed"]) - min(rr["routed"]) <= 1
    assert sa["hit_rate"] >= rr["hit_rate"]
    assert (tmp_path / "trace.parquet").is_file()
    assert (tmp_path / "simulated" / "session-affinity" / "requests.parquet").is_file()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_live_routers_on_a_tiny_trace(tmp_path):
    res = run(tmp_path, setup=TINY, modes=("live",), routers=("round-robin", "session-affinity"))
    res.write()
    for r in res.rows:
        assert r["ok"] == r["calls"] > 0 and math.isfinite(r["ttft_p99_ms"])
        assert sum(r["routed"]) == r["calls"]
    assert (tmp_path / "comparison.md").read_text().count("| live |") == 2


def test_simulated_side_equals_harness_simulate_replicas(tmp_path):
    """The experiment's cluster run is what `harness simulate --replicas 4 --router X` gives."""
    from typer.testing import CliRunner

    from harness.cli.main import app
    from harness.experiments.routers import build_trace, simulate_one, ttft_figures

    trace = build_trace(TINY, 0, tmp_path / "trace.parquet")
    mine = simulate_one(trace, "session-affinity", TINY, tmp_path / "mine")
    args = ["simulate", "--trace", str(tmp_path / "trace.parquet"), "--replicas", "4",
            "--router", "session-affinity", "--policy", TINY.policy,
            "--cost-model", TINY.cost_model, "--kv-tokens", str(TINY.kv_tokens),
            "-o", str(tmp_path / "cli")]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    (run_dir,) = {p.parent for p in (tmp_path / "cli").rglob("requests.parquet")}
    cli = ttft_figures(run_dir)
    assert cli["calls"] == mine["calls"]
    assert cli["ttft_p50_ms"] == pytest.approx(mine["ttft_p50_ms"])
    assert cli["ttft_p99_ms"] == pytest.approx(mine["ttft_p99_ms"])
