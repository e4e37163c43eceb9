"""Energy per token from NVML's total-energy counter, overall and per tier.

Why: vLLM's bench and AIPerf report joules per output token through NVML; a scheduler that
meets more SLOs per joule is the better deal, so we also give joules per *good* token per
tier (tokens of requests that met their tier's SLOs), which no peer reports (issue 20).

Source: ``samples.parquet`` rows with ``source == "gpu"`` carry ``gpu_energy_j``, NVML's
``nvmlDeviceGetTotalEnergyConsumption`` (mJ since the driver loaded, Volta and newer) read
with the memory series. A run's energy is, per GPU, the counter's last minus first reading
inside the measured window, summed over GPUs. Without such rows (no GPU, no NVML, an older
GPU, a simulation) there is no energy block at all rather than a zero.

Attribution to tiers (ours; the GPU does not know tiers): a tier's share of the energy is its
share of the tokens processed (prompt + output tokens of completed requests), since step cost
grows with the tokens in the batch. Joules per good token = the tier's energy / the output
tokens of its requests that attained their SLOs (None when it has none).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd


def run_energy(
    samples: pd.DataFrame, t0: float = 0.0, t1: float = math.inf
) -> dict[str, Any] | None:
    """``{energy_j, per_gpu_j, window_s, mean_power_w}`` over ``[t0, t1]``, or None."""
    if not len(samples) or "gpu_energy_j" not in samples:
        return None
    g = samples[(samples["source"] == "gpu") & samples["gpu_energy_j"].notna()]
    g = g[(g["t_s"] >= t0) & (g["t_s"] <= t1)]
    if not len(g):
        return None
    per: dict[str, float] = {}
    lo, hi = math.inf, -math.inf
    for idx, d in g.groupby(g["gpu_index"].fillna(0).astype(int)):
        d = d.sort_values("t_s")
        if len(d) < 2:
            continue
        e = d["gpu_energy_j"].to_numpy(dtype=float)
        per[str(idx)] = float(max(e[-1] - e[0], 0.0))  # the counter only grows
        lo = min(lo, float(d["t_s"].iloc[0]))
        hi = max(hi, float(d["t_s"].iloc[-1]))
    if not per:
        return None
    total = sum(per.values())
    span = hi - lo
    return {
        "energy_j": total,
        "per_gpu_j": per,
        "window_s": [lo, hi],
        "mean_power_w": total / span if span > 0 else None,
    }


def per_token(
    energy: Mapping[str, Any],
    tiers: Mapping[str, np.ndarray],
    success: np.ndarray,
    attained: np.ndarray,
    prompt_tokens: np.ndarray,
    output_tokens: np.ndarray,
) -> dict[str, Any]:
    """J per output token overall, and per tier its attributed energy, J per output token and
    J per good token (module docstring). Arrays are per request, ``tiers`` maps tier name to
    its request mask."""
    e = float(energy["energy_j"])
    out_tok = np.nan_to_num(output_tokens.astype(float)) * success
    work = np.nan_to_num(prompt_tokens.astype(float)) * success + out_tok
    good_tok = out_tok * attained
    total_out, total_work = float(out_tok.sum()), float(work.sum())
    res: dict[str, Any] = {
        "j_per_output_token": e / total_out if total_out > 0 else None,
        "j_per_good_token": e / float(good_tok.sum()) if good_tok.sum() > 0 else None,
        "tiers": {},
    }
    for name, m in tiers.items():
        share = float(work[m].sum()) / total_work if total_work > 0 else 0.0
        e_t = e * share
        o, gd = float(out_tok[m].sum()), float(good_tok[m].sum())
        res["tiers"][name] = {
            "energy_j": e_t,
            "token_share": share,
            "j_per_output_token": e_t / o if o > 0 else None,
            "j_per_good_token": e_t / gd if gd > 0 else None,
        }
    return res
