"""Per-engine report panels (harness.report.cluster) on a simulated 2-replica cluster run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from harness.engine.cluster import EngineSpec
from harness.engine.cluster_run import write_cluster_run
from harness.engine.config import EngineConfig
from harness.engine.costmodel import get_cost_model
from harness.policies import make_policy
from harness.report.cluster import cluster_figures, engine_budgets
from harness.routers.registry import make_router
from harness.workload.tiers import parse_tiers
from harness.workload.trace import Trace


def _run(tmp_path: Path) -> Path:
    rng = np.random.default_rng(3)
    n = 60
    df = pd.DataFrame(
        {
            "request_id": [f"r{i}" for i in range(n)],
            "arrival_s": np.cumsum(rng.exponential(0.05, n)),
            "prompt_len": rng.integers(20, 400, n),
            "output_len": rng.integers(5, 60, n),
            "tier": "default",
        }
    )
    trace = Trace.from_frame(df, parse_tiers("default:1.0"), {"source": "test"})
    cfg = EngineConfig(kv_tokens=20_000, token_budget=512)
    cm = get_cost_model("a100-llama2-7b")
    engines = [EngineSpec(f"r{i}", make_policy("sarathi"), cm, cfg) for i in range(2)]
    run_dir, _ = write_cluster_run(tmp_path / "run", trace, engines, make_router("round-robin"), {})
    return run_dir


def test_two_replicas_get_per_engine_panels(tmp_path: Path) -> None:
    run_dir = _run(tmp_path)
    samples = pd.read_parquet(run_dir / "samples.parquet")
    assert engine_budgets(run_dir) == {"r0": 512, "r1": 512}
    figs = dict(cluster_figures(run_dir, samples))
    assert set(figs) == {
        "Cluster: per-engine utilisation",
        "Cluster: per-engine queue",
        "Cluster: per-engine KV",
    }
    util = figs["Cluster: per-engine utilisation"]
    names = {t.name for t in util.data}
    assert names == {"r0 busy", "r0 batch fill", "r1 busy", "r1 batch fill"}
    for t in util.data:  # percentages
        y = np.asarray(t.y, dtype=float)
        assert np.nanmin(y) >= 0 and np.nanmax(y) <= 100.0 + 1e-9
    # a one-engine run (no engine column, or one engine) gets no cluster panels
    assert cluster_figures(run_dir, samples[samples["engine"] == "r0"]) == []
