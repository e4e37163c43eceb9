"""Reproductions of the five papers' main experiments in the simulator (issue 5).

One module per paper; each exposes ``run(out_dir, *, full=False, seed=...) ->
ExperimentResult``. The registry below is what ``harness experiment NAME`` runs.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from harness.experiments.common import ExperimentResult

EXPERIMENTS: dict[str, tuple[str, str]] = {
    "slai": ("harness.experiments.slai", "SLAI vs Sarathi-Serve, 5% paid, ShareGPT-4 (seed 002)"),
    "wait": (
        "harness.experiments.wait",
        "WAIT / Nested WAIT vs vLLM and Sarathi throughput (000/003)",
    ),
    "mcsf": (
        "harness.experiments.mcsf",
        "MC-SF vs alpha-protection: latency slope vs arrivals (001)",
    ),
    "capacity": (
        "harness.experiments.capacity",
        "a100-llama2-7b cost model: capacity vs Vidur's profile, Azure conversation (issue 19)",
    ),
    "stability": (
        "harness.experiments.stability",
        "vLLM / FasterTransformer unstable where Sarathi / Orca are stable (004)",
    ),
    "agents": (
        "harness.experiments.agents",
        "agent networks: tandem, fork-join stable; Rybko-Stolyar priorities unstable (004 §4)",
    ),
    "routers": (
        "harness.experiments.routers",
        "routers over 4 replicas, multi-turn sessions: affinity/prefix vs round-robin (issue 16)",
    ),
}


def available() -> list[str]:
    return list(EXPERIMENTS)


def run_experiment(
    name: str,
    out_dir: Path,
    *,
    full: bool = False,
    seed: int | None = None,
    options: dict[str, Any] | None = None,
) -> ExperimentResult:
    """Run one registered experiment; writes run dirs plus comparison.md/.json under out_dir.
    ``options``: experiment-specific keywords (``agents``: ``network``)."""
    if name not in EXPERIMENTS:
        raise KeyError(f"unknown experiment {name!r}; choose from: {', '.join(EXPERIMENTS)}")
    mod = importlib.import_module(EXPERIMENTS[name][0])
    kw: dict[str, Any] = {} if seed is None else {"seed": seed}
    kw.update(options or {})
    result: ExperimentResult = mod.run(Path(out_dir), full=full, **kw)
    result.write()
    return result


__all__ = ["EXPERIMENTS", "ExperimentResult", "available", "run_experiment"]
