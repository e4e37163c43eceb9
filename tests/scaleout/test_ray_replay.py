"""`harness replay --ray ADDRESS --workers N`: shards as Ray actors on two Ray "hosts" (two
raylets with separate resources on this machine), clock offsets measured, the skew bound
stated in run.json; and the NTP-style estimate itself."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from scaleout_traces import make_trace

from harness import clock
from harness.distributed.loadgen import estimate_offset, skew_bound_s


def test_offset_estimate_is_within_half_the_round_trip() -> None:
    true_offset = 123.456
    est = estimate_offset(lambda: clock.now() + true_offset, pings=10)
    assert abs(est.offset_s - true_offset) <= est.uncertainty_s + 1e-9
    assert skew_bound_s([0.001, 0.003, 0.002], [0.0005, -0.001]) == pytest.approx(0.006)
    assert skew_bound_s([0.002]) == pytest.approx(0.002)


@pytest.mark.slow
async def test_replay_shards_on_two_ray_hosts(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    import ray
    from ray.cluster_utils import Cluster

    from harness.loadgen.bench import fast_server
    from harness.loadgen.replay import ReplayConfig, run_replay_async
    from harness.results import schema
    from harness.results.rundir import read_run

    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "resources": {"host_a": 1}, "include_dashboard": False},
    )
    cluster.add_node(num_cpus=1, resources={"host_b": 1})
    trace = make_trace(200, rate=200.0)
    try:
        with fast_server() as url:
            cfg = ReplayConfig(
                trace="test", arrival="trace", target=url, progress=False, out=tmp_path / "run",
                sample_interval_s=None, workers=2, ray=cluster.address,
            )  # fmt: skip
            run_dir = await run_replay_async(cfg, trace=trace)
    finally:
        ray.shutdown()
        cluster.shutdown()
    run = read_run(run_dir)
    assert run.meta["status"] == schema.STATUS_COMPLETE
    r = run.requests.sort_values("req").reset_index(drop=True)
    assert list(r["req"]) == list(range(200)) and r["success"].all()
    np.testing.assert_allclose(r["target_s"], trace.df["arrival_s"], atol=1e-9)
    w = run.meta["workers"]
    assert w["backend"] == "ray" and w["count"] == 2 and w["hosts"] == 2
    per = w["per_worker"]
    assert len({p["node"] for p in per}) == 2
    # One machine: the true offset is 0, so each estimate is within its own uncertainty.
    for p in per:
        assert abs(p["clock_offset_ms"]) <= p["clock_uncertainty_ms"] + 1e-6
    assert w["skew_bound_ms"] >= max(p["clock_uncertainty_ms"] for p in per)
    print(f"\nskew bound {w['skew_bound_ms']} ms; offsets", [p["clock_offset_ms"] for p in per])
    # The HTML report's run info states the bound (issue 18).
    from harness.report import write_report

    html = write_report([Path(run_dir)]).read_text()
    assert f"dispatch skew bound {w['skew_bound_ms']:.3g} ms" in html
    assert "2 workers (ray, 2 hosts)" in html


def test_run_info_line_states_the_skew_bound() -> None:
    from harness.report.data import loadgen_text

    rule = "two largest half round trips + largest offset drift over the run"
    meta = {"count": 2, "backend": "ray", "hosts": 2, "skew_bound_ms": 0.7123, "skew_rule": rule}
    assert loadgen_text(meta) == (
        "2 workers (ray, 2 hosts); dispatch skew bound 0.712 ms (two largest half round trips"
        " + largest offset drift over the run)"
    )
    assert loadgen_text({"count": 1}) == "1 worker" and loadgen_text(None) is None
