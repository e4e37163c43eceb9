"""MC-SF vs the α-protection baselines: average latency vs number of arrivals (seed-mcsf.md §4).

Setup (§4.1-§4.4): LMSYS-Chat lengths (here the project's token-length sample; the paper used
word counts of 10,000 conversations), Poisson arrivals at λ = 50/s (high demand) and 10/s
(low), KV limit M = 16,492 tokens as the paper states (block size 1, the paper's token
model), no compute caps (whole prompts, every running request in every batch). For each N the
first N arrivals of one trace are simulated to completion and the average end-to-end latency
(AEL) recorded; the slope of AEL against N is compared (§4.5: high demand MC-SF ≈ 1/6 vs best
baseline ≈ 1/2, "approximately three times"; low demand 1/800 vs 1/100, "eight times").

Cost model: the paper used Vidur for Llama-2-70B on two A100s; no preset exists, so this uses
the A100 Llama-2-7B Vidur fit with every coefficient ×5 (70B/7B weights over 2 GPUs; an
inferred stand-in). Compare slope *ratios* and the ranking, as the spec advises (A9).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from harness.experiments.common import (
    Config,
    ExperimentResult,
    load_lengths,
    make_trace,
    mean_ci,
    ols_slope,
    run_config,
)
from harness.workload.trace import Trace

M_TOKENS = 16_492
COST = "a100-llama2-7b:base_s=0.011,per_token_s=0.000321,floor_s=0.047,per_kv_s=0.00000185"


def configs(full: bool) -> list[Config]:
    base = [
        Config("MC-SF (Algorithm 2)", "mcsf", {}),
        Config("alpha-greedy a=0.25", "mcsf-alpha", {"alpha": 0.25}),
        Config("alpha-beta a=0.2 b=0.2", "mcsf-alpha-beta", {"alpha": 0.2, "beta": 0.2}),
    ]
    if not full:
        return base
    return base + [
        Config("alpha-greedy a=0.30", "mcsf-alpha", {"alpha": 0.30}),
        Config("alpha-beta a=0.2 b=0.1", "mcsf-alpha-beta", {"alpha": 0.2, "beta": 0.1}),
        Config("alpha-beta a=0.1 b=0.2", "mcsf-alpha-beta", {"alpha": 0.1, "beta": 0.2}),
        Config("alpha-beta a=0.1 b=0.1", "mcsf-alpha-beta", {"alpha": 0.1, "beta": 0.1}),
    ]


def _engine() -> Any:
    from harness.engine.config import EngineConfig

    return EngineConfig(
        block_size=1,
        kv_tokens=M_TOKENS,
        token_budget=1 << 22,
        max_num_seqs=1 << 16,
        known_output_lengths=True,
    )


# The paper's LMSYS-Chat statistics are word counts (seed-mcsf.md §4.1): input mean 40.6 /
# median 11, output mean 85 / median 45. Word-like lengths map the token sample's ranks onto
# lognormals with those medians and means (σ² = 2 ln(mean/median)), keeping the sample's joint
# order (long prompts still pair with the same outputs).
WORD_STATS = {"prompt_len": (40.6, 11.0), "output_len": (85.0, 45.0)}


def word_like(lengths: pd.DataFrame) -> pd.DataFrame:
    """``lengths`` with each column quantile-mapped to a lognormal of the paper's word stats."""
    from scipy.stats import norm, rankdata

    out = lengths.copy()
    for col, (mean, median) in WORD_STATS.items():
        sigma = math.sqrt(2.0 * math.log(mean / median))
        u = (rankdata(lengths[col].to_numpy(), method="ordinal") - 0.5) / len(lengths)
        out[col] = np.maximum(1, np.round(median * np.exp(sigma * norm.ppf(u)))).astype(np.int64)
    out.attrs["source"] = f"{lengths.attrs.get('source', '')}, word-like (quantile-mapped)"
    return out


def _slopes(
    out_dir: Path,
    lengths: pd.DataFrame,
    rate: float,
    counts: list[int],
    seed: int,
    full: bool,
    tag: str,
    cm: Any,
    rows: list[dict[str, Any]],
) -> dict[str, float]:
    big = make_trace(lengths, counts[-1], rate, seed=seed, meta={"experiment": "mcsf"})
    slopes: dict[str, float] = {}
    for cfg in configs(full):
        ael = []
        for n in counts:
            trace = Trace.from_frame(big.df.iloc[:n], big.tiers, dict(big.meta, n=n))
            label = f"{tag} seed{seed} {cfg.label} N={n}"
            run_dir, m = run_config(
                out_dir,
                Config(label, cfg.policy, cfg.params),
                trace,
                cm,
                _engine(),
                {"experiment": "mcsf", "demand": tag, "n": n, "seed": seed},
            )
            ael.append(m["e2e_mean_s"])
            rows.append(
                {
                    "setting": tag,
                    "seed": seed,
                    "config": cfg.label,
                    "arrivals": n,
                    "ael_s": m["e2e_mean_s"],
                    "finished": m["finished"],
                    "preemptions": m["preemptions"],
                    "clearings": m.get("clearings"),
                    "run_dir": run_dir.name,
                }
            )
        slopes[cfg.label] = ols_slope(counts, ael)
    return slopes


def run(out_dir: Path, *, full: bool = False, seed: int = 0) -> ExperimentResult:
    from harness.engine.costmodel import get_cost_model

    cm = get_cost_model(COST)
    tokens = load_lengths("lmsys_sample_lengths.csv")
    lengths_source = tokens.attrs["source"]
    kinds = {"word-like": word_like(tokens)}
    if full:
        kinds["tokens"] = tokens
    demands = {"high (50/s)": 50.0, "low (10/s)": 10.0} if full else {"high (50/s)": 50.0}
    counts = [1000, 2500, 5000, 7500, 10000] if full else [250, 500, 750, 1000]
    seeds = [seed + i for i in range(5 if full else 3)]  # >= 5 seeds at paper size
    rows: list[dict[str, Any]] = []
    claims: list[dict[str, Any]] = []
    for kname, lengths in kinds.items():
        for dname, rate in demands.items():
            tag = f"{dname}, {kname}"
            ratios: list[float] = []
            best_names: list[str] = []
            ours_s: list[float] = []
            for sd in seeds:
                slopes = _slopes(out_dir, lengths, rate, counts, sd, full, tag, cm, rows)
                ours = slopes[configs(full)[0].label]
                base = {k: v for k, v in slopes.items() if k != configs(full)[0].label}
                best = min(base, key=lambda k: base[k] if math.isfinite(base[k]) else math.inf)
                best_names.append(best)
                ours_s.append(ours)
                ratios.append(base[best] / ours if ours and math.isfinite(ours) else float("nan"))
                for name, v in slopes.items():
                    rows.append(
                        {
                            "setting": tag,
                            "seed": sd,
                            "config": name,
                            "arrivals": "slope",
                            "ael_s": v,
                        }
                    )
            r_mean, r_hw = mean_ci(ratios)
            target = 3.0 if rate >= 50 else 8.0
            ok = abs(r_mean / target - 1) <= 0.25
            claims.append(
                {
                    "claim": f"{tag}: AEL-slope ratio, best baseline / MC-SF",
                    "paper": ("1/2 vs 1/6 (x3)" if rate >= 50 else "1/100 vs 1/800 (x8)")
                    + " (paper, word counts)",
                    "measured": f"x{r_mean:.1f} ± {r_hw:.1f} (95% CI, {len(seeds)} seeds; "
                    f"MC-SF slope {np.mean(ours_s):.3g} s/arrival; best baseline "
                    f"{max(set(best_names), key=best_names.count)})",
                    "delta_pct": (r_mean / target - 1) * 100,
                    "ratio": r_mean,
                    "agrees": "yes" if ok else ("same direction" if r_mean > 1 else "no"),
                    "verdict": "reproduced (within 25%)" if ok else "not reproduced",
                    "cause": "token lengths are longer-tailed than the paper's word counts"
                    if kname == "tokens"
                    else "word-like lengths match the paper's statistics",
                }
            )
    notes = [
        f"Lengths: {lengths_source}.",
        f"N in {counts}: the first N arrivals of one trace, each run to completion (A10).",
        "Requests whose prompt + output - 1 exceeds M are rejected by the host (A6) and left "
        "out of AEL. Cleared requests keep their generated tokens (the host's recompute "
        "preemption) and the clearing step costs nothing extra; the paper loses their progress. "
        "A 'progress lost' clearing needs a restart mode in the engine core (not built), so the "
        "baselines here are somewhat favoured.",
        f"Cost model: {COST} (inferred 70B/2xA100 stand-in).",
    ]
    return ExperimentResult(
        "mcsf",
        "MC-SF vs alpha-protection baselines (AEL vs arrivals)",
        rows,
        claims,
        notes,
        out_dir,
        full,
    )
