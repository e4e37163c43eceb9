"""Fluid-model helpers of the WAIT papers (seed-wait.md §2), usable by policies and reports.

The model: type ``j`` arrives at rate ``λ_j`` with prompt ``l_j`` and output ``l'_j``; one
step of a batch holding ``M`` tokens of KV takes ``ΔT = d0 + d1·M`` (Eq. 1). In equilibrium
(§2.2, Eqs. 7-10), with the memory-work rate ``A = Σ_j λ_j (l'_j+1)(l_j + l'_j/2)``:

* ``ΔT* = d0 / (1 - d1·A)``, ``M* = A·ΔT*``, ``n*_j/(l'_j+1) = λ_j·ΔT*`` per stage;
* throughput ``Σ λ_j l'_j`` (decode tokens of completed prompts, [L]) or ``Σ λ_j (l'_j+1)``
  (every generated token, [S]); both are reported (§2.3, ambiguity #1);
* ``d1·A >= 1`` means no policy can keep latency bounded (Proposition 1): the instability
  condition a report can quote ("the fluid model says this rate is unstable for any policy").

Also here: the token-budget capacity of seed-stability.md §1.5 (``λ(m_p + m_d) < b/t_b``),
and a fit of ``(d0, d1)`` from any cost model so every preset can feed the fluid model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True, slots=True)
class FluidType:
    """One request type: prompt ``l``, output ``l'`` tokens, arrival rate ``λ`` (1/s)."""

    prompt_len: float
    output_len: float
    rate: float

    @property
    def memory_work(self) -> float:
        """``(l'+1)(l + l'/2)``: token-steps of KV one prompt holds over its life (§2.1)."""
        return (self.output_len + 1.0) * (self.prompt_len + self.output_len / 2.0)


@dataclass(frozen=True, slots=True)
class FluidEquilibrium:
    """The fluid equilibrium of §2.2; ``stable`` False means ``d1·A >= 1`` (no equilibrium)."""

    A: float
    d0: float
    d1: float
    stable: bool
    step_s: float  # ΔT*
    memory_tokens: float  # M*
    per_stage: tuple[float, ...]  # n*_j/(l'_j+1) = λ_j ΔT*
    active: tuple[float, ...]  # n*_j
    throughput_decode: float  # Σ λ_j l'_j  (tokens/s, counted at completion)
    throughput_all: float  # Σ λ_j (l'_j+1)
    load: float  # d1·A, the fluid utilisation (< 1 stable)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def memory_work_rate(types: Sequence[FluidType]) -> float:
    """``A = Σ_j λ_j (l'_j+1)(l_j + l'_j/2)`` (Eq. 8)."""
    return float(sum(t.rate * t.memory_work for t in types))


def equilibrium(types: Sequence[FluidType], d0: float, d1: float) -> FluidEquilibrium:
    """Equilibrium step time, memory and per-stage counts (Eqs. 7-10, §2.2)."""
    A = memory_work_rate(types)
    load = d1 * A
    thr_dec = float(sum(t.rate * t.output_len for t in types))
    thr_all = float(sum(t.rate * (t.output_len + 1.0) for t in types))
    if load >= 1.0:
        inf = float("inf")
        return FluidEquilibrium(
            A,
            d0,
            d1,
            False,
            inf,
            inf,
            tuple(inf for _ in types),
            tuple(inf for _ in types),
            thr_dec,
            thr_all,
            load,
        )
    dt = d0 / (1.0 - load)
    per_stage = tuple(t.rate * dt for t in types)
    active = tuple(p * (t.output_len + 1.0) for p, t in zip(per_stage, types, strict=True))
    return FluidEquilibrium(A, d0, d1, True, dt, A * dt, per_stage, active, thr_dec, thr_all, load)


def is_unstable(types: Sequence[FluidType], d1: float) -> bool:
    """Proposition 1 (multi-type form, inferred): ``d1·A >= 1`` -> latency Ω(T) for any policy."""
    return d1 * memory_work_rate(types) >= 1.0


def types_from_lengths(
    prompt_lens: Sequence[float] | np.ndarray,
    output_lens: Sequence[float] | np.ndarray,
    rate: float,
    *,
    edges: Sequence[int] | None = None,
) -> list[FluidType]:
    """Fluid types from a length sample at total rate ``rate``.

    Without ``edges`` every request is its own type (exact ``A`` for the empirical mix).
    With ``edges`` (ascending output-length upper bounds) requests are binned: each bin's
    type has the bin's mean prompt, its *upper edge* as output (conservative), and rate
    ``rate × share`` (seed-wait.md §6.2's LMSYS binning).
    """
    p = np.asarray(prompt_lens, dtype=float)
    o = np.asarray(output_lens, dtype=float)
    if p.shape != o.shape or p.size == 0:
        raise ValueError("prompt_lens and output_lens must be equally long and non-empty")
    if edges is None:
        share = rate / p.size
        return [FluidType(float(a), float(b), share) for a, b in zip(p, o, strict=True)]
    e = np.asarray(sorted(edges), dtype=float)
    idx = np.minimum(np.searchsorted(e, o, side="left"), len(e) - 1)
    out = []
    for j, upper in enumerate(e):
        mask = idx == j
        if mask.any():
            out.append(FluidType(float(p[mask].mean()), float(upper), rate * mask.mean()))
    return out


def critical_rate(
    prompt_lens: Sequence[float] | np.ndarray, output_lens: Sequence[float] | np.ndarray, d1: float
) -> float:
    """The total arrival rate at which ``d1·A = 1`` for this length mix (req/s)."""
    p = np.asarray(prompt_lens, dtype=float)
    o = np.asarray(output_lens, dtype=float)
    if p.shape != o.shape or p.size == 0:
        raise ValueError("prompt_lens and output_lens must be equally long and non-empty")
    # memory_work_rate(types_from_lengths(p, o, 1.0)) without 100k FluidType objects: the
    # same products, summed left to right (cumsum; the same bits as sum() on Python 3.11,
    # whose float sum() is not compensated)
    per_req = float(np.cumsum((1.0 / p.size) * ((o + 1.0) * (p + o / 2.0)))[-1])
    return float("inf") if d1 <= 0 or per_req <= 0 else 1.0 / (d1 * per_req)


def memory_limited_rate(
    prompt_lens: Sequence[float] | np.ndarray,
    output_lens: Sequence[float] | np.ndarray,
    d0: float,
    d1: float,
    capacity_tokens: float,
) -> float:
    """Largest rate whose equilibrium memory fits: ``M* <= C`` <=> ``λ <= C/(a(d0 + d1 C))``."""
    a = memory_work_rate(types_from_lengths(prompt_lens, output_lens, 1.0))
    return float(capacity_tokens / (a * (d0 + d1 * capacity_tokens)))


def fluid_verdict(
    prompt_lens: Sequence[float] | np.ndarray,
    output_lens: Sequence[float] | np.ndarray,
    rate: float,
    d0: float,
    d1: float,
    capacity_tokens: float | None = None,
) -> dict[str, Any]:
    """A report-ready verdict for one offered rate: load, equilibrium and a one-line message."""
    eq = equilibrium(types_from_lengths(prompt_lens, output_lens, rate), d0, d1)
    crit = critical_rate(prompt_lens, output_lens, d1)
    out: dict[str, Any] = {
        "rate": rate,
        "load": eq.load,
        "critical_rate": crit,
        "stable": eq.stable,
        "step_s": eq.step_s,
        "memory_tokens": eq.memory_tokens,
        "throughput_decode": eq.throughput_decode,
        "throughput_all": eq.throughput_all,
    }
    if not eq.stable:
        out["message"] = (
            f"the fluid model says {rate:g} req/s is unstable for any policy "
            f"(d1·A = {eq.load:.2f} >= 1; critical rate {crit:.3g} req/s)"
        )
    elif capacity_tokens is not None and eq.memory_tokens > capacity_tokens:
        out["message"] = (
            f"stable in compute (d1·A = {eq.load:.2f}) but the equilibrium needs "
            f"{eq.memory_tokens:.0f} KV tokens > capacity {capacity_tokens:.0f}: expect evictions"
        )
        out["memory_limited_rate"] = memory_limited_rate(
            prompt_lens, output_lens, d0, d1, capacity_tokens
        )
    else:
        out["message"] = (
            f"fluid-stable: d1·A = {eq.load:.2f}, ΔT* = {eq.step_s * 1e3:.1f} ms, "
            f"M* = {eq.memory_tokens:.0f} tokens"
        )
    return out


def token_capacity_rate(
    mean_prompt: float, mean_output: float, budget: int, full_batch_s: float
) -> float:
    """seed-stability.md §1.5 Eq. (2.7): ``λ* = (b/t_b)/(m_p + m_d)`` req/s."""
    return (budget / full_batch_s) / (mean_prompt + mean_output)


def fit_linear_step(
    cost_model: Any, *, mean_context: float = 512.0, max_kv_tokens: int = 200_000
) -> tuple[float, float]:
    """Fit WAIT's ``ΔT = d0 + d1·M`` to any cost model (seed-wait.md App. B recalibration).

    Samples decode-only steps of ``n`` requests at ``mean_context`` tokens each (``M = n·ctx``)
    and least-squares ``step_time`` on ``M``; an exact affine ``linear`` preset comes back exactly.
    """
    kv = np.linspace(mean_context, max_kv_tokens, 64)
    n = np.maximum(1, np.round(kv / mean_context)).astype(int)
    kv_tokens = (n * mean_context).astype(int)
    t = np.array(
        [cost_model.step_time(0, int(d), int(k)) for d, k in zip(n, kv_tokens, strict=True)]
    )
    d1, d0 = np.polyfit(kv_tokens.astype(float), t, 1)
    return float(max(d0, 0.0)), float(max(d1, 0.0))
