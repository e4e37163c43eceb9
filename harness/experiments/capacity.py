"""Cost-model capacity against Vidur's published A100 Llama-2-7B profile (issue 19).

The check: the saturated throughput (finished requests / makespan, every request offered at
once) of ``sarathi`` (chunk 512) and ``vllm-v0`` (4,096 batched tokens, 1% watermark), Vidur's
defaults (batch cap 128, block 16), on the Azure-conversation lengths, under two step-time
models:

* the preset under test (``a100-llama2-7b`` and, for contrast, the old affine one);
* :class:`VidurProfile`, the reference built only from Vidur's published numbers: the token
  ops' median times of ``mlp.csv`` (TP=1, ×32 layers, anchors-engines.md §5.2: flat 9.1-9.7 ms
  to 64 tokens, 33.4 ms at 512, 133.4 at 2048, 258.4 at 4096; piecewise linear in between),
  decode attention from Vidur's attention profile (0.37 us per KV token at batch 1, ~0.27 at
  batch >= 64; issue 19) and prefill attention scaled so one 4,096-token prompt takes Vidur's
  343 ms. It is a stand-in for a Vidur run, not one: Vidur's attention.csv is not available
  here (anchors-engines.md §5.1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from harness.engine.costmodel import ContextCostModel, get_cost_model
from harness.experiments.common import ExperimentResult, load_lengths, make_trace, pct_change

# Vidur mlp.csv (Llama-2-7B, A100, TP=1): N tokens -> seconds (anchors-engines.md §5.2).
MLP_N = np.array([1.0, 64.0, 512.0, 2048.0, 4096.0])
MLP_S = np.array([9.1e-3, 9.7e-3, 33.4e-3, 133.4e-3, 258.4e-3])
PREFILL_4096_S = 343e-3  # Vidur: one 4,096-token prompt (issue 19)

# The affine preset before issue 19, kept for contrast (issue 19 measured -6.5% vs Vidur).
OLD_A100 = {
    "kind": "affine",
    "name": "a100-llama2-7b (affine, before issue 19)",
    "base_s": 2.20e-3,
    "per_token_s": 64.2e-6,
    "floor_s": 9.4e-3,
    "per_kv_s": 0.37e-6,
}


@dataclass(frozen=True)
class VidurProfile:
    """Step time from Vidur's published profile points (module docstring)."""

    name: str = "vidur-profile (A100, Llama-2-7B)"
    kv_hi_s: float = 0.37e-6
    kv_lo_s: float = 0.27e-6
    kv_sat_batch: int = 64
    uses_prefill_attn = True

    @property
    def attn_s(self) -> float:
        """Prefill attention per unit of Σ chunk·(ctx + chunk/2), so 4,096 tokens take 343 ms."""
        rest = float(np.interp(4096, MLP_N, MLP_S)) + self.kv_hi_s * 4096
        return (PREFILL_4096_S - rest) / (4096 * 2048)

    def _kv(self, d: Any) -> Any:
        d = np.maximum(np.asarray(d, dtype=float), 1.0)
        w = np.clip(np.log2(d) / math.log2(self.kv_sat_batch), 0.0, 1.0)
        return self.kv_hi_s + (self.kv_lo_s - self.kv_hi_s) * w

    def step_time(
        self, prefill_tokens: int, decode_seqs: int, kv_tokens: int, prefill_attn: float = 0.0
    ) -> float:
        mlp = float(np.interp(prefill_tokens + decode_seqs, MLP_N, MLP_S))
        return mlp + float(self._kv(decode_seqs)) * kv_tokens + self.attn_s * prefill_attn

    def step_times(self, prefill_tokens: Any, decode_seqs: Any, kv_tokens: Any) -> np.ndarray:
        n = np.asarray(prefill_tokens, dtype=float) + np.asarray(decode_seqs, dtype=float)
        return np.interp(n, MLP_N, MLP_S) + self._kv(decode_seqs) * np.asarray(kv_tokens, float)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "vidur-profile", "name": self.name}


def saturated_capacity(policy: str, cost_model: Any, lengths: Any, n: int, seed: int = 0) -> float:
    """Finished requests per second of makespan with all ``n`` requests offered at t = 0,
    on Vidur's defaults (batch cap 128, block 16, A100 80 GiB, Llama-2-7B weights and KV)."""
    from harness.engine.config import EngineConfig
    from harness.engine.costmodel import HARDWARE
    from harness.engine.simulate import simulate
    from harness.policies.registry import make_policy

    trace = make_trace(lengths, n, math.inf, seed=seed, meta={"experiment": "capacity"})
    budget = 4096 if policy == "vllm-v0" else 512
    cfg = EngineConfig(
        block_size=16, token_budget=budget, max_num_seqs=128, **HARDWARE["a100-llama2-7b"]
    )
    # The engine core passes the prefill-attention work to models that ask for it.
    res = simulate(trace, make_policy(policy), cost_model, cfg, kernel="reference")
    done = res.status == 1
    if not done.any():
        raise RuntimeError("capacity run finished nothing")
    return float(done.sum() / np.nanmax(res.last_s[done]))


def run(out_dir: Path, *, full: bool = False, seed: int = 0) -> ExperimentResult:
    lengths = load_lengths("azure_conv_2023.csv")
    n = 4000 if full else 600
    ref = VidurProfile()
    models = {
        "a100-llama2-7b": get_cost_model("a100-llama2-7b"),
        "affine (before issue 19)": get_cost_model(dict(OLD_A100)),
    }
    rows: list[dict[str, Any]] = []
    claims: list[dict[str, Any]] = []
    for policy in ("sarathi", "vllm-v0"):
        base = saturated_capacity(policy, ref, lengths, n, seed)
        rows.append({"policy": policy, "cost_model": ref.name, "capacity_rps": base})
        for label, cm in models.items():
            cap = saturated_capacity(policy, cm, lengths, n, seed)
            d = pct_change(cap, base)
            rows.append({"policy": policy, "cost_model": label, "capacity_rps": cap, "vs_ref": d})
            if label == "a100-llama2-7b":
                claims.append(
                    {
                        "claim": f"{policy}: capacity of a100-llama2-7b vs Vidur's profile",
                        "paper": "within 3% (issue 19 must-show; reference: Vidur's published "
                        "profile, not a paper)",
                        "measured": f"{cap:.2f} vs {base:.2f} req/s ({d:+.1f}%), seed {seed}, "
                        f"{n} requests",
                        "delta_pct": d,
                        "verdict": "reproduced" if abs(d) <= 3 else "not reproduced",
                        "cause": "context terms: KV-read rate falls with the decode batch, "
                        "prefill attention grows with context",
                    }
                )
    notes = [
        f"Lengths: {lengths.attrs['source']}; {n} requests offered at t = 0; capacity = "
        "finished requests / makespan.",
        "Reference: Vidur's published profile points (mlp.csv medians, attention anchors), "
        "not a Vidur run; see harness/experiments/capacity.py.",
        f"Reference prefill attention {ref.attn_s * 1e9:.2f} ns per unit of Σ chunk·(ctx + "
        "chunk/2).",
    ]
    return ExperimentResult(
        "capacity",
        "Cost-model capacity vs Vidur's A100 Llama-2-7B profile (Azure conversation)",
        rows,
        claims,
        notes,
        out_dir,
        full,
    )


__all__ = ["ContextCostModel", "VidurProfile", "run", "saturated_capacity"]
