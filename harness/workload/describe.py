"""What ``harness trace show`` prints: counts, length percentiles, tier shares, offered load,
and the fluid model's verdict (harness.policies.fluid, seed-wait.md §2) for a cost model."""

from __future__ import annotations

from typing import Any

import numpy as np

from harness.workload.trace import Trace


def describe_trace(
    trace: Trace, cost_model: str | None = None, kv_tokens: int | None = None
) -> dict[str, Any]:
    """A JSON-able summary. Offered rate = requests / span of arrivals (first to last);
    offered tokens/s use the same span. ``fluid`` is present only with ``cost_model``."""
    df = trace.df
    n = len(df)
    arr = df["arrival_s"].to_numpy(dtype=float)
    span = float(arr[-1] - arr[0]) if n > 1 else 0.0
    rate = (n - 1) / span if span > 0 else float("inf")
    p = df["prompt_len"].to_numpy(dtype=float)
    o = df["output_len"].to_numpy(dtype=float)

    def pct(x: np.ndarray) -> dict[str, float]:
        return {
            "mean": float(x.mean()),
            "p50": float(np.percentile(x, 50)),
            "p90": float(np.percentile(x, 90)),
            "p99": float(np.percentile(x, 99)),
            "max": float(x.max()),
        }

    tiers = []
    for t in trace.tiers:
        k = int((df["tier"] == t.name).sum())
        tiers.append(
            {
                "name": t.name,
                "requests": k,
                "share": k / n,
                "spec_share": t.share,
                "ttft_slo_s": t.ttft_slo_s,
                "tbt_slo_s": t.tbt_slo_s,
                "priority": t.priority,
            }
        )
    out: dict[str, Any] = {
        "requests": n,
        "span_s": span,
        "offered_rate_rps": rate,
        "prompt_len": pct(p),
        "output_len": pct(o),
        "offered_prompt_tokens_per_s": float(p.sum() / span) if span > 0 else float("inf"),
        "offered_output_tokens_per_s": float(o.sum() / span) if span > 0 else float("inf"),
        "tiers": tiers,
        "has_prompts": bool(df["prompt"].notna().all()),
        "content_hash": trace.content_hash(),
        "meta": trace.meta,
    }
    if cost_model is not None:
        out["fluid"] = fluid_summary(p, o, rate, cost_model, kv_tokens)
    return out


def fluid_summary(
    p: np.ndarray, o: np.ndarray, rate: float, cost_model: str, kv_tokens: int | None
) -> dict[str, Any]:
    """The fluid verdict at the offered rate; a note instead when the pieces are missing."""
    try:
        from harness.engine.costmodel import get_cost_model
        from harness.policies.fluid import fit_linear_step, fluid_verdict
    except ImportError as e:  # the fluid helpers or cost models are not in this build
        return {"available": False, "note": f"fluid model not available ({e})"}
    if not np.isfinite(rate):
        return {"available": False, "note": "all requests arrive at once: no offered rate"}
    cm = get_cost_model(cost_model)
    d0, d1 = fit_linear_step(cm, mean_context=float(np.mean(p) + np.mean(o) / 2))
    verdict = fluid_verdict(p, o, rate, d0, d1, capacity_tokens=kv_tokens)
    return {"available": True, "cost_model": cost_model, "d0_s": d0, "d1_s": d1, **verdict}
