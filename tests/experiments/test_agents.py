"""`harness experiment agents` (seed 004 §4): workloads with the spec's parameters, a short
Rybko-Stolyar run through the cluster kernel, the report panels and the CLI's bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from harness.experiments import agents as ag
from harness.policies.class_priority import class_label


@pytest.mark.parametrize("name", list(ag.NETWORKS))
def test_every_agent_has_rho_point_nine(name: str) -> None:
    """The spec's parameters (seed-stability.md §2.6): b = 768, lambda = 1.137 per slot and
    per type, 608 tokens of mean work per agent and pair of arrivals, so rho = 0.9 each."""
    spec = ag.load_network(name)
    assert spec["seed004"]["token_budget"] == 768
    assert spec["seed004"]["rate_per_slot"] == pytest.approx(0.9 * 768 / 608)
    rho = ag.nominal_rho(spec)
    assert len(rho) == (4 if name == "fork-join" else 2)
    assert all(v == pytest.approx(0.9) for v in rho.values()), rho


def test_rs_workload_matches_the_spec() -> None:
    spec = ag.load_network("rs")
    df = ag.seed004_frame(spec, 3000, seed=1)
    # Poisson arrivals at integer slots, equal rates per type
    assert (df["arrival_s"] == np.floor(df["arrival_s"])).all()
    roots = df[df["call_index"] == 0]
    for kind in "AB":
        n = int((roots["session_id"].str.split("-").str[0] == kind).sum())
        assert n / 3000 == pytest.approx(0.9 * 768 / 608, rel=0.05)
    # hops (32, 32) then (512, 32); the engine runs v_d decode iterations: output = v_d + 1
    for hop, (m_p, m_d) in enumerate([(32, 32), (512, 32)]):
        h = df[df["call_index"] == hop]
        assert h["prompt_len"].mean() == pytest.approx(m_p, rel=0.03)
        assert (h["output_len"] - 1).mean() == pytest.approx(m_d, rel=0.03)
        assert (h["context"] == "none").all()
    a = df[df["session_id"] == "A-0"].sort_values("call_index")
    assert list(a["agent"]) == ["agent1", "agent2"] and list(a["parents"]) == ["", "0"]
    # class-priority reads the type and hop from these request ids
    r = type("R", (), {"request_id": a["request_id"].iloc[0], "tier": "default"})()
    assert class_label(r, "type") == "A" and class_label(r, "hop") in ("0", "1")


def test_a_longer_horizon_extends_the_same_sample_path() -> None:
    spec = ag.load_network("fork-join")
    short = ag.seed004_frame(spec, 300, seed=3)
    long = ag.seed004_frame(spec, 600, seed=3)
    head = long[long["arrival_s"] < 300].reset_index(drop=True)
    assert short.equals(head)


def test_spec_means() -> None:
    assert ag.spec_mean("exp:32") == 32.0
    assert ag.spec_mean(512) == 512.0
    assert ag.spec_mean("uniform:10:30") == 20.0
    with pytest.raises(ValueError):
        ag.spec_mean("gamma:1")


def test_short_rs_run_reversed_bounded_fig8_up_grows(tmp_path: Path) -> None:
    """1,800 slots (two of the spec's 900-slot windows) through the cluster kernel: with the
    reversed priorities W stays near 10^4 tokens (stable); with Fig. 8 (up)'s it grows far
    beyond (the spec's own check: ~80k then ~420k)."""
    slots = 1800
    up, a_up = ag.run_one("rs", "fig8-up", tmp_path, slots, seed=7)
    down, a_down = ag.run_one("rs-reversed", "reversed", tmp_path, slots, seed=7)
    assert a_down["verdict"] == "stable", a_down["reason"]
    assert max(a_down["window_maxima"]) < 40_000
    assert len(a_up["window_maxima"]) == 2
    assert a_up["w_max"] > 5 * a_down["w_max"]
    for a in (a_up, a_down):  # every agent is offered about 0.9 of its budget
        assert all(v["rho"] == pytest.approx(0.9, abs=0.05) for v in a["loads"].values())
    # the run directory holds the network figures' data and renders them
    doc = json.loads((tmp_path / "rs-fig8-up" / "network.json").read_text())
    assert set(doc["W_agents"]) == {"agent1", "agent2"} and len(doc["t"]) == len(doc["W"])
    from harness.report import render_report

    html = render_report([tmp_path / "rs-fig8-up"])
    assert "Network token backlog W(t)" in html and "Per-agent load" in html
    assert "Per-engine utilisation" in html and "Per-engine queue" in html


@pytest.mark.slow
def test_rs_verdicts_over_the_experiment_horizon(tmp_path: Path) -> None:
    """The experiment's own horizon (9,000 slots): Fig. 8 (up) unstable with the RS flag
    (every agent under-loaded), reversed stable (seed-stability.md §2.6)."""
    res = ag.run(tmp_path, network=["rs", "rs-reversed"])
    got = {r["network"]: r["verdict"] for r in res.rows}
    assert got == {"rs": "unstable", "rs-reversed": "stable"}
    assert all(c["verdict"] == "reproduced" for c in res.claims)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness.cli.main", *args], capture_output=True, text=True
    )


def test_cli_bad_network_is_one_error_line(tmp_path: Path) -> None:
    for args, msg in (
        (["experiment", "agents", "--network", "ring", "-o", str(tmp_path)], "unknown network"),
        (["experiment", "slai", "--network", "rs", "-o", str(tmp_path)], "agents experiment"),
    ):
        proc = _cli(*args)
        lines = [x for x in proc.stderr.splitlines() if x.strip()]
        assert proc.returncode == 2, proc.stderr
        assert len(lines) == 1 and lines[0].startswith("error:") and msg in lines[0], lines
