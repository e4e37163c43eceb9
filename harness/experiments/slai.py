"""SLAI vs Sarathi-Serve (FCFS), 5% paid, ShareGPT-4 lengths (seed-rad-slai.md §6).

Setup (§6.2-§6.4): openchat ShareGPT-4 Llama-2 lengths shuffled without replacement,
Poisson arrivals, tiers Bernoulli(5%) paid with TBT 0.1 s, free 0.5 s; RTX 6000 Ada /
Mistral-7B cost model (``rtx6000ada-mistral-7b``) and KV capacity (48 GiB, 0.9 utilisation);
token budget 512, α = β = 128 (``max_num_seqs`` 128). The paper's vLLM baseline is the
prefill-prioritising scheduler with 8192 batched tokens (``vllm-v0``, budget 8192).

Claims (§6.5): median TTFT at high load 1.5 s -> 0.7 s (-53%), "high load" read as 1.6 req/s
(#14); capacity (largest rate with median TTFT <= 0.5 s, P99 TBT paid <= 0.1 s and free <=
0.5 s; linear interpolation on a rate grid, #13) 1.15 -> 1.45 req/s (+26%).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from harness.experiments.common import (
    Config,
    ExperimentResult,
    crossing,
    load_lengths,
    make_trace,
    pct_change,
    run_config,
)

TIERS = "paid:0.05:tbt=100ms,free:0.95:tbt=500ms"
TTFT_LIMIT_S = 0.5
TBT_LIMITS = {"paid": 0.1, "free": 0.5}
HIGH_LOAD = 1.6
PAPER_SARATHI_CAPACITY = 1.15  # §6.5: Sarathi-Serve's capacity on the paper's setting
# Calibration (issue 19): every step of the rtx6000ada-mistral-7b fit runs TIME_SCALE x slower,
# so Sarathi-Serve's simulated capacity is ~1.15 req/s as in the paper (1.18 small, seed 42;
# 1.46 unscaled). 1.6 req/s is then ~1.39 x capacity in both, i.e. matched relative load.
TIME_SCALE = 1.15
BASELINE = "Sarathi-Serve (FCFS)"
SLAI_BEST = "SLAI (SPF, dynamic offset)"


def configs(full: bool) -> list[Config]:
    base = [
        Config(BASELINE, "sarathi", {"order": "fcfs"}),
        Config(SLAI_BEST, "slai", {"prefill_order": "spf", "dynamic_offset": True}),
    ]
    if not full:
        return base
    return base + [
        Config("Sarathi-Serve (SPF)", "sarathi", {"order": "spf"}),
        Config(
            "SLAI (FCFS, fixed offset)", "slai", {"prefill_order": "fcfs", "dynamic_offset": False}
        ),
        Config(
            "SLAI (SPF, fixed offset)", "slai", {"prefill_order": "spf", "dynamic_offset": False}
        ),
        Config(
            "SLAI (SPF with priority, dynamic offset)",
            "slai",
            {"prefill_order": "spf", "tier_priority": True},
        ),
        Config("vLLM (prefill-first)", "vllm-v0", {}),
    ]


def _engine(budget: int) -> Any:
    from harness.engine.config import EngineConfig

    return EngineConfig(
        block_size=16,
        gpu_mem_gib=48,
        model_weights_gib=13.49,
        kv_bytes_per_token=131072,
        token_budget=budget,
        max_num_seqs=128,
    )


def capacity(rates: list[float], rows: list[dict[str, Any]]) -> float:
    """Largest rate meeting median TTFT <= 0.5 s (interpolated) while both P99 TBTs hold."""
    ttft = [r["ttft_median_s"] for r in rows]
    cap = crossing(rates, ttft, TTFT_LIMIT_S)
    for rate, r in zip(rates, rows, strict=True):
        if any(not r.get(f"tbt_p99_{t}_s", 0.0) <= lim for t, lim in TBT_LIMITS.items()):
            prev = [x for x in rates if x < rate]
            cap = min(cap, prev[-1]) if prev and math.isfinite(cap) else float("nan")
            break
    return cap


def run(
    out_dir: Path, *, full: bool = False, seed: int = 42, time_scale: float = TIME_SCALE
) -> ExperimentResult:
    """``time_scale`` 1.0 is the isolating run: the uncalibrated (faster) cost model."""
    lengths = load_lengths("sharegpt4_lengths_llama2.csv")
    lengths_source = lengths.attrs["source"]
    cm = calibrated_cost_model(time_scale)
    if full:
        rates = [round(x, 2) for x in np.arange(0.4, 2.41, 0.1)]
        n = 2000
    else:  # up to 2.4: past the matched-load and capacity points of both policies
        rates = [0.8, 1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.8, 2.0, 2.4]
        n = 300
    rows: list[dict[str, Any]] = []
    per_policy: dict[str, list[dict[str, Any]]] = {}
    for rate in rates:
        trace = make_trace(lengths, n, rate, seed=seed, tiers=TIERS, meta={"experiment": "slai"})
        for cfg in configs(full):
            budget = 8192 if cfg.policy == "vllm-v0" else 512
            label = f"{cfg.label} @ {rate:g} rps"
            run_dir, m = run_config(
                out_dir,
                Config(label, cfg.policy, cfg.params),
                trace,
                cm,
                _engine(budget),
                {"experiment": "slai", "rate": rate, "seed": seed},
            )
            row = {"config": cfg.label, "rate_rps": rate, **_pick(m), "run_dir": run_dir.name}
            rows.append(row)
            per_policy.setdefault(cfg.label, []).append(m)
    caps = {name: capacity(rates, ms) for name, ms in per_policy.items()}
    ttft_caps = {
        name: crossing(rates, [m["ttft_median_s"] for m in ms], TTFT_LIMIT_S)
        for name, ms in per_policy.items()
    }
    hi = max((r for r in rates if r <= HIGH_LOAD), default=rates[-1])
    i_hi = rates.index(hi)
    base_ttft = per_policy[BASELINE][i_hi]["ttft_median_s"]
    slai_ttft = per_policy[SLAI_BEST][i_hi]["ttft_median_s"]
    d_ttft = pct_change(slai_ttft, base_ttft)
    d_cap = pct_change(caps[SLAI_BEST], caps[BASELINE])
    d_ttft_cap = pct_change(ttft_caps[SLAI_BEST], ttft_caps[BASELINE])
    rel = hi / caps[BASELINE] if caps[BASELINE] else float("nan")
    paid_hi = max(
        (m.get("tbt_p99_paid_s", 0.0) for m in per_policy[SLAI_BEST]), default=float("nan")
    )
    setting = f"seed {seed}, 1 seed, {n} requests/rate, steps x{time_scale:g}"
    claims = [
        {
            "claim": f"median TTFT at {hi:g} req/s (paper's absolute rate; {rel:.2f} x Sarathi's "
            f"capacity here vs {HIGH_LOAD / PAPER_SARATHI_CAPACITY:.2f} x in the paper: matched "
            "relative load), SLAI vs Sarathi FCFS",
            "paper": "1.5 s -> 0.7 s (-53%) (paper)",
            "measured": f"{base_ttft:.2f} s -> {slai_ttft:.2f} s ({d_ttft:+.0f}%), {setting}",
            "delta_pct": d_ttft,
            "agrees": _agree(d_ttft, -53, 5),
            "verdict": "reproduced" if _agree(d_ttft, -53, 5) == "yes" else "not reproduced",
            "cause": "SPF prefill order with the dynamic offset keeps short prompts ahead",
        },
        {
            "claim": "capacity at median TTFT <= 0.5 s with both P99 TBT SLOs",
            "paper": "1.15 -> 1.45 req/s (+26%) (paper)",
            "measured": f"{caps[BASELINE]:.2f} -> {caps[SLAI_BEST]:.2f} req/s ({d_cap:+.0f}%), "
            f"{setting}",
            "delta_pct": d_cap,
            "agrees": _agree(d_cap, 26, 5),
            "verdict": "reproduced" if _agree(d_cap, 26, 5) == "yes" else "not reproduced",
            "cause": f"SLAI's paid P99 TBT reaches {paid_hi:.3f} s (> 0.1 s) before its median "
            "TTFT reaches 0.5 s: at the calibrated speed a 512-token step plus 128 decodes' KV "
            "reads nears 100 ms, so the TBT SLO, not TTFT, binds",
        },
        {
            "claim": "capacity at median TTFT <= 0.5 s only (isolating the TBT SLO)",
            "paper": "+26% (paper, with both SLOs)",
            "measured": f"{ttft_caps[BASELINE]:.2f} -> {ttft_caps[SLAI_BEST]:.2f} req/s "
            f"({d_ttft_cap:+.0f}%), {setting}",
            "delta_pct": d_ttft_cap,
            "agrees": _agree(d_ttft_cap, 26, 5),
            "verdict": "reproduced" if _agree(d_ttft_cap, 26, 5) == "yes" else "not reproduced",
            "cause": "TTFT-bound capacity gap without the TBT SLO",
        },
    ]
    if full and time_scale != 1.0:  # isolating run: the same small grid with steps x1.0
        iso = run(out_dir / "uncalibrated-x1", full=False, seed=seed, time_scale=1.0)
        c = iso.claims[1]
        paid_iso = max(
            (r.get("tbt_p99_paid_s") or 0.0 for r in iso.rows if r["config"] == SLAI_BEST),
            default=float("nan"),
        )
        claims.append(
            {
                "claim": "capacity with both SLOs, uncalibrated steps x1 (isolating the "
                "calibration; small grid, 300 requests/rate)",
                "paper": "1.15 -> 1.45 req/s (+26%) (paper)",
                "measured": c["measured"] + f"; SLAI's paid P99 TBT at most {paid_iso:.3f} s",
                "delta_pct": c["delta_pct"],
                "agrees": c["agrees"],
                "verdict": "isolating run",
                "cause": "x1.15 slows every step, so SLAI's paid P99 TBT (~0.09 s at x1) "
                "crosses 0.1 s and binds (+2%); at x1 no TBT binds and the TTFT gap is wider "
                "than the paper's: a uniform slowdown cannot match both the paper's capacity "
                "and its TBT headroom",
            }
        )
    for name, cap in caps.items():
        rows.append({"config": name, "rate_rps": "capacity", "capacity_rps": cap})
    notes = [
        f"Lengths: {lengths_source}.",
        f"{n} requests per rate (seed {seed}); Poisson arrivals; TTFT over requests that got a "
        "token; TBT pooled per tier, first token excluded (seed-rad-slai.md §7 #15).",
        f"Cost model rtx6000ada-mistral-7b (this project's fit to the SLAI repo's Fig. 5a data) "
        f"with every step x{TIME_SCALE:g}, calibrated so Sarathi-Serve's capacity is ~1.15 req/s "
        "as in the paper (unscaled it is ~1.46 small, ~1.56 full).",
        "The paper's runs stop at a 2100 s wall clock and count completed requests only (#25); "
        "these runs finish every request.",
        "Isolating the calibration (issue 19, small grid, seed 42, steps x1): capacity "
        "1.46 -> 2.07 req/s (+43%) with both SLOs, SLAI's paid P99 TBT <= 0.091 s at every rate "
        "up to 2.4 req/s; with steps x1.15 it reaches 0.105 s and binds (+2%). The --full run "
        "repeats this as its last claim.",
    ]
    return ExperimentResult(
        "slai",
        "SLAI vs Sarathi-Serve (FCFS), 5% paid, ShareGPT-4",
        rows,
        claims,
        notes,
        out_dir,
        full,
    )


def calibrated_cost_model(scale: float = TIME_SCALE) -> Any:
    """``rtx6000ada-mistral-7b`` with every coefficient x ``scale`` (a uniformly slower GPU)."""
    from dataclasses import replace

    from harness.engine.costmodel import get_cost_model

    base = get_cost_model("rtx6000ada-mistral-7b")
    keys = ("base_s", "per_token_s", "per_decode_s", "per_kv_s", "floor_s")
    return replace(
        base,  # type: ignore[type-var]
        name=f"rtx6000ada-mistral-7b x{scale:g}",
        **{k: getattr(base, k) * scale for k in keys},
    )


def _pick(m: dict[str, Any]) -> dict[str, Any]:
    keys = (
        "ttft_median_s",
        "ttft_mean_s",
        "tbt_p99_paid_s",
        "tbt_p99_free_s",
        "finished",
        "preemptions",
        "deferred_total",
    )
    return {k: m.get(k) for k in keys if k in m}


def _agree(measured: float, paper: float, tol: float) -> str:
    if not math.isfinite(measured):
        return "n/a"
    if abs(measured - paper) <= tol:
        return "yes"
    return "same direction" if measured * paper > 0 else "no"
