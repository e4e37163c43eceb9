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
import os
from concurrent.futures import ProcessPoolExecutor
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


# The baselines clear with the paper's semantics (seed-mcsf.md §3.1, §7 A7): progress lost and
# a stall of the attempted batch's step time; ``progress="kept"`` is the isolating variant.


def configs(full: bool, progress: str = "lost") -> list[Config]:
    pr = {"progress": progress}
    base = [
        Config("MC-SF (Algorithm 2)", "mcsf", {}),
        Config("alpha-greedy a=0.25", "mcsf-alpha", {"alpha": 0.25, **pr}),
        Config("alpha-beta a=0.2 b=0.2", "mcsf-alpha-beta", {"alpha": 0.2, "beta": 0.2, **pr}),
    ]
    if not full:
        return base
    return base + [
        Config("alpha-greedy a=0.30", "mcsf-alpha", {"alpha": 0.30, **pr}),
        Config("alpha-beta a=0.2 b=0.1", "mcsf-alpha-beta", {"alpha": 0.2, "beta": 0.1, **pr}),
        Config("alpha-beta a=0.1 b=0.2", "mcsf-alpha-beta", {"alpha": 0.1, "beta": 0.2, **pr}),
        Config("alpha-beta a=0.1 b=0.1", "mcsf-alpha-beta", {"alpha": 0.1, "beta": 0.1, **pr}),
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
    progress: str = "lost",
) -> dict[str, float]:
    big = make_trace(lengths, counts[-1], rate, seed=seed, meta={"experiment": "mcsf"})
    slopes: dict[str, float] = {}
    for cfg in configs(full, progress):
        ael = []
        for n in counts:
            trace = Trace.from_frame(big.df.iloc[:n], big.tiers, dict(big.meta, n=n))
            label = f"{tag} seed{seed} {cfg.label} N={n}"
            # α-greedy with progress lost can loop forever (§3.1): stop it, AEL = inf
            stop = 20.0 * float(trace.df["arrival_s"].iloc[-1]) + 600.0
            run_dir, m = run_config(
                out_dir,
                Config(label, cfg.policy, cfg.params),
                trace,
                cm,
                _engine(),
                {"experiment": "mcsf", "demand": tag, "n": n, "seed": seed},
                stop_at_s=stop,
            )
            rejected = int((trace.df["prompt_len"] + trace.df["output_len"] - 1 > M_TOKENS).sum())
            if m["finished"] + rejected < n:  # stopped: the infinite loop
                m["e2e_mean_s"] = math.inf
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
        looped = any(math.isinf(a) for a in ael)
        slopes[cfg.label] = math.inf if looped else ols_slope(counts, ael)
    return slopes


def _seed_job(job: tuple[Any, ...]) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """One seed's slopes and rows (a process-pool task)."""
    out_dir, lengths, rate, counts, sd, full, tag, cm, progress = job
    rows: list[dict[str, Any]] = []
    slopes = _slopes(out_dir, lengths, rate, counts, sd, full, tag, cm, rows, progress)
    return slopes, rows


# The paper's low-demand slope (1/800 s/arrival at 10/s) means its system was just over
# capacity there: slope = (1/mu - 1/lambda) / 2 gives lambda / mu = 1.025 (seed-mcsf.md §4.5).
LOW_RHO = 1.025


def _capacity(slope: float, rate: float) -> float:
    """MC-SF's service rate from its AEL slope under overload (fluid queue: the i-th arrival
    waits i (1/mu - 1/lambda), so AEL over N arrivals grows by (1/mu - 1/lambda) / 2)."""
    return 1.0 / (2.0 * slope + 1.0 / rate)


def _setting(
    out_dir: Path,
    lengths: pd.DataFrame,
    kname: str,
    dname: str,
    rate: float,
    target: float,
    counts: list[int],
    seeds: list[int],
    full: bool,
    cm: Any,
    rows: list[dict[str, Any]],
    progress: str = "lost",
) -> tuple[dict[str, Any], float]:
    """One (lengths, demand, clearing) setting over ``seeds``: its claim and MC-SF's mean slope."""
    tag = f"{dname}, {kname}" + ("" if progress == "lost" else ", progress kept")
    ratios: list[float] = []
    best_names: list[str] = []
    ours_s: list[float] = []
    first = configs(full)[0].label
    jobs = [(out_dir, lengths, rate, counts, sd, full, tag, cm, progress) for sd in seeds]
    workers = min(len(seeds), os.cpu_count() or 1)
    if workers > 1:  # seeds are independent runs: one process each (own run dirs)
        with ProcessPoolExecutor(max_workers=workers) as ex:
            done = list(ex.map(_seed_job, jobs))
    else:
        done = [_seed_job(j) for j in jobs]
    for sd, (slopes, seed_rows) in zip(seeds, done, strict=True):
        rows.extend(seed_rows)
        ours = slopes[first]
        base = {k: v for k, v in slopes.items() if k != first}
        best = min(base, key=lambda k: base[k] if math.isfinite(base[k]) else math.inf)
        best_names.append(best)
        ours_s.append(ours)
        ratios.append(base[best] / ours if ours > 0 and math.isfinite(ours) else float("nan"))
        for name, v in slopes.items():
            rows.append(
                {"setting": tag, "seed": sd, "config": name, "arrivals": "slope", "ael_s": v}
            )
    r_mean, r_hw = mean_ci(ratios)
    s_mean, s_hw = mean_ci(ours_s)
    ok = math.isfinite(r_mean) and abs(r_mean / target - 1) <= 0.25
    flat = not (s_mean - (s_hw if math.isfinite(s_hw) else 0.0) > 0)
    if flat:
        verdict, cause = (
            "not measurable",
            f"{rate:g}/s is below MC-SF's simulated capacity: AEL does not grow with N "
            "(slope CI includes 0); see the matched-load row",
        )
    elif kname == "tokens":
        verdict, cause = (
            "reproduced (within 25%)" if ok else "not reproduced",
            "token lengths are longer-tailed than the paper's word counts",
        )
    elif progress == "kept":
        verdict, cause = (
            "isolating run",
            "baselines keep their tokens and pay no stall: the clearing semantics' share of "
            "the gap",
        )
    else:
        verdict = "reproduced (within 25%)" if ok else "not reproduced"
        cause = "word-like lengths, progress-lost clearing with a stall (the paper's semantics)"
    claim = {
        "claim": f"{tag}: AEL-slope ratio, best baseline / MC-SF",
        "paper": ("1/2 vs 1/6 (x3)" if target == 3.0 else "1/100 vs 1/800 (x8)")
        + " (paper, word counts)",
        "measured": f"x{r_mean:.1f} ± {r_hw:.1f} (95% CI, {len(seeds)} seeds; MC-SF slope "
        f"{s_mean:.3g} ± {s_hw:.2g} s/arrival; best baseline "
        f"{max(set(best_names), key=best_names.count)}; N up to {counts[-1]})",
        "delta_pct": (r_mean / target - 1) * 100,
        "ratio": r_mean,
        "ratio_ci": r_hw,
        "mcsf_slope": s_mean,
        "agrees": "yes" if ok else ("same direction" if r_mean > 1 else "no"),
        "verdict": verdict,
        "cause": cause,
    }
    return claim, s_mean


def run(out_dir: Path, *, full: bool = False, seed: int = 0) -> ExperimentResult:
    from harness.engine.costmodel import get_cost_model

    cm = get_cost_model(COST)
    tokens = load_lengths("lmsys_sample_lengths.csv")
    lengths_source = tokens.attrs["source"]
    # Token lengths (longer-tailed than the paper's word counts) were measured last session
    # (x4.7 at 50/s, 1 seed); the full run keeps to the paper's statistics to stay affordable.
    kinds = {"word-like": word_like(tokens)}
    counts = [1000, 2500, 5000, 7500, 10000] if full else [250, 500, 750, 1000]
    seeds = [seed + i for i in range(5 if full else 3)]  # >= 5 seeds at paper size
    rows: list[dict[str, Any]] = []
    claims: list[dict[str, Any]] = []
    args = (counts, seeds, full, cm, rows)
    for kname, lengths in kinds.items():
        hi, s_hi = _setting(out_dir, lengths, kname, "high (50/s)", 50.0, 3.0, *args)
        claims.append(hi)
        if kname != "word-like":
            continue
        if full:  # the paper's absolute low rate, and the high ratio's load dependence
            claims.append(_setting(out_dir, lengths, kname, "low (10/s)", 10.0, 8.0, *args)[0])
            iso = _setting(out_dir, lengths, kname, "2 x high (100/s)", 100.0, 3.0, *args)[0]
            iso["verdict"] = f"isolating run: {iso['verdict']}"
            iso["cause"] = (
                "the ratio falls as demand rises past MC-SF's capacity (fluid queue: towards "
                "the capacity ratio); 50/s is 1.6 x capacity here, so the paper's x3 sits at a "
                "higher relative load"
            )
            claims.append(iso)
        mu = _capacity(s_hi, 50.0)
        low = round(LOW_RHO * mu, 1)
        name = f"low, matched load ({low:g}/s = {LOW_RHO:g} x MC-SF's capacity {mu:.1f}/s)"
        claims.append(_setting(out_dir, lengths, kname, name, low, 8.0, *args)[0])
    first = configs(full)[0].label
    base_runs = [r for r in rows if isinstance(r["arrivals"], int) and r["config"] != first]
    cleared = [r for r in base_runs if r.get("clearings")]
    claims.append(
        {
            "claim": "baselines' overflow clearing (progress lost + stall) in these runs",
            "paper": "overflows clear requests, progress lost (paper §3); the cause of the gap",
            "measured": f"{len(cleared)} of {len(base_runs)} baseline runs cleared "
            f"({sum(r.get('clearings') or 0 for r in base_runs)} clearings)",
            "delta_pct": float("nan"),
            "clearing_runs": len(cleared),
            "agrees": "n/a",
            "verdict": "isolating run",
            "cause": "with alpha = 0.2-0.25 clearing is rare and 'progress lost' vs 'kept' "
            "gives the same ratio (x4.7 both at 50/s, seed 0, N up to 10,000); the gap is the "
            "alpha share of M the baselines hold back and the ratio's dependence on relative "
            "load",
        }
    )
    notes = [
        f"Lengths: {lengths_source}.",
        f"N in {counts}: the first N arrivals of one trace, each run to completion (A10).",
        "Requests whose prompt + output - 1 exceeds M are rejected by the host (A6) and left "
        "out of AEL.",
        "Baselines clear with the paper's semantics (seed-mcsf.md §3.1, §7 A7): a cleared "
        "request loses its generated tokens and the clearing step stalls for the step time of "
        "the batch it attempted. A configuration that has not finished by 20 x the last "
        "arrival + 600 s (alpha-greedy's infinite loop) gets slope inf.",
        f"Matched load: the paper's low-demand slope 1/800 at 10/s puts it at {LOW_RHO:g} x "
        "MC-SF's capacity (fluid queue); the simulated capacity is estimated from MC-SF's "
        "high-demand slope, mu = 1 / (2 slope + 1/50). The paper's own two slopes imply "
        "different capacities (A9), so absolute rates do not carry over.",
        "Relative load decides the ratio (issue 19, word-like, N up to 10,000, alpha-beta "
        "0.2/0.2 best; seeds 0-4, 95% CI): x7.0 ± 0.6 at 31.5/s, x4.1 ± 0.3 at 50/s, x3.0 ± 0.2 "
        "at 100/s; a fluid queue "
        "gives (1/mu_b - 1/lambda) / (1/mu_m - 1/lambda), which falls from infinity at MC-SF's "
        "capacity towards the capacity ratio, so the paper's x3 sits at a higher relative load "
        "than 50/s is here.",
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
