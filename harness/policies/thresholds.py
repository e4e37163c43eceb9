"""WAIT / Nested WAIT thresholds from the fluid model, a trace and a cost model.

seed-wait.md §3-§4.

So users need not hand-tune them:

* :func:`wait_thresholds`: per-type per-stage ``n_j`` satisfying Eq. (11)
  ``ΔT(n) <= n_j/λ_j`` (rule ``"fluid"``: ``n_j = ceil(c·λ_j)`` with ``c = (1+slack)·ΔT*``,
  the inferred recipe of §3.2), the paper's practical ``B·ρ_j/(l'_j+1)`` (rule ``"paper"``)
  or the authors' code ``B·λ_j/Σλ_k(l'_k+1)`` (rule ``"code"``, Appendix A; ambiguity #7).
* :func:`nested_thresholds`: per-segment ``n_i`` from ``c·Λ_1`` with ratios inside
  ``(p_i, 1)``, satisfying Eq. (12),
  the exact full-batch memory ``M^π`` (#9), the ``θ_j`` roots of Eq. (20) and the safety
  buffer memory of Eq. (14) with ``ln((m-1)S/δ)`` (#10).
* :func:`thresholds_from_trace`: the policy parameters for a trace and a cost model.

When the offered load is fluid-unstable (``d1·A >= 1``) no threshold satisfies (11); the
helpers then fall back to the ``"code"`` rule with a batch limit and say so in ``notes``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from harness.policies.fluid import (
    FluidType,
    equilibrium,
    fit_linear_step,
    types_from_lengths,
)


@dataclass
class WaitThresholds:
    """Thresholds for ``wait``; ``params()`` gives the policy's keyword arguments."""

    output_lens: list[int]
    thresholds: list[int]
    step_s: float  # ΔT_[1..m](n), the full-batch step time
    memory_tokens: float  # M^π
    feasible: bool  # Eq. (11) holds (and M^π <= C when C is given)
    rule: str
    notes: list[str] = field(default_factory=list)

    def params(self) -> dict[str, Any]:
        return {"output_lens": self.output_lens, "thresholds": self.thresholds}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class NestedThresholds:
    """Thresholds for ``nested-wait`` plus the memory Eq. (14) asks for."""

    edges: list[int]
    thresholds: list[int]
    step_s: float
    memory_tokens: float  # exact M^π
    theta: list[float]  # θ_j for j >= 2 (inf-free: nan when no root exists)
    required_memory_tokens: float  # Eq. (14) right-hand side
    feasible: bool
    notes: list[str] = field(default_factory=list)

    def params(self) -> dict[str, Any]:
        return {"edges": self.edges, "thresholds": self.thresholds}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def wait_memory(types: Sequence[FluidType], n: Sequence[float]) -> float:
    """``M^π = Σ_j n_j (l'_j+1)(l_j + l'_j/2)`` (Eq. 11)."""
    return float(sum(nj * t.memory_work for nj, t in zip(n, types, strict=True)))


def wait_thresholds(
    types: Sequence[FluidType],
    d0: float,
    d1: float,
    capacity_tokens: float | None = None,
    *,
    rule: str = "fluid",
    slack: float = 0.1,
    batch_limit: int | None = None,
) -> WaitThresholds:
    """Per-stage thresholds ``n_j`` for WAIT (seed-wait.md §3.2, Eq. 11)."""
    if rule not in ("fluid", "paper", "code"):
        raise ValueError("rule must be 'fluid', 'paper' or 'code'")
    types = sorted(types, key=lambda t: t.output_len)
    notes: list[str] = []
    eq = equilibrium(types, d0, d1)
    if rule == "fluid" and not eq.stable:
        notes.append(f"fluid-unstable load d1·A = {eq.load:.2f} >= 1: fell back to rule 'code'")
        rule = "code"
        batch_limit = batch_limit or 256
    if rule == "fluid":
        c = (1.0 + slack) * eq.step_s
        for _ in range(200):
            n = [max(1, math.ceil(c * t.rate)) for t in types]
            dt = d0 + d1 * wait_memory(types, n)
            if all(dt <= nj / t.rate for nj, t in zip(n, types, strict=True) if t.rate > 0):
                break
            c *= 1.05
    else:
        if batch_limit is None:
            raise ValueError(f"rule {rule!r} needs batch_limit (B)")
        total = sum(t.rate for t in types)
        work = sum(t.rate * (t.output_len + 1) for t in types)
        if rule == "paper":  # B·ρ_j/(l'_j+1)
            raw = [batch_limit * (t.rate / total) / (t.output_len + 1) for t in types]
        else:  # B·λ_j/Σ λ_k(l'_k+1)
            raw = [batch_limit * t.rate / work for t in types]
        n = [max(1, int(round(x))) for x in raw]
        notes.append("rounded with max(1, round(x)) (ambiguity #6 option a)")
    mem = wait_memory(types, n)
    dt = d0 + d1 * mem
    ok = all(dt <= nj / t.rate for nj, t in zip(n, types, strict=True) if t.rate > 0)
    if capacity_tokens is not None and mem > capacity_tokens:
        ok = False
        notes.append(f"M^π = {mem:.0f} tokens exceeds the KV capacity {capacity_tokens:.0f}")
    return WaitThresholds(
        output_lens=[int(round(t.output_len)) for t in types],
        thresholds=[int(x) for x in n],
        step_s=dt,
        memory_tokens=mem,
        feasible=ok,
        rule=rule,
        notes=notes,
    )


def nested_memory(prompt_len: float, edges: Sequence[int], n: Sequence[float]) -> float:
    """Exact full-batch memory ``M^π`` of Nested WAIT (seed-wait.md §4.4, ``M_exact``)."""
    total = 0.0
    prev = 0
    for i, (e, ni) in enumerate(zip(edges, n, strict=True)):
        lo = 0 if i == 0 else prev + 1
        stages = e - lo + 1
        total += ni * stages * (prompt_len + (lo + e) / 2.0)
        prev = e
    return total


def segment_stages(edges: Sequence[int]) -> list[int]:
    """Stages per segment in the policy's semantics: ``l'_i - l'_{i-1}`` with ``l'_0 = 0``
    (seed-wait.md §9 #2, vLLM stages; the authors' code counts seg 1 the same way, App. A)."""
    return [int(e) - (int(edges[i - 1]) if i else 0) for i, e in enumerate(edges)]


def batch_seats(n: Sequence[float], edges: Sequence[int]) -> int:
    """Requests a full Nested WAIT batch runs: ``Σ n_i × stages_i``. The paper's batch limit
    ``B`` is this sum (the authors' ``seg_total_i = B·count_i Λ_i / Σ_k count_k Λ_k``,
    seed-wait.md Appendix A), not ``Σ n_i``."""
    return int(sum(int(x) * s for x, s in zip(n, segment_stages(edges), strict=True)))


def _scale_to_batch(shape: Sequence[float], stages: Sequence[int], b: int) -> list[int]:
    """``n_i ∝ shape_i`` with ``Σ n_i·stages_i <= b`` (floor, at least 1 per segment)."""
    scale = b / sum(s * k for s, k in zip(shape, stages, strict=True))
    return [max(1, int(math.floor(scale * s))) for s in shape]


def theta_root(n_prev: float, n_cur: float, p: float) -> float:
    """θ > 0 solving ``e^{-θ n_j}(1 - p + p e^θ)^{n_{j-1}} = 1`` (Eq. 20); nan if none exists.

    A root exists iff ``n_{j-1}·p < n_j < n_{j-1}`` (Lemma 8).
    """
    if not (n_prev * p < n_cur < n_prev) or not 0.0 < p < 1.0:
        return float("nan")

    def g(x: float) -> float:
        return -x * n_cur + n_prev * (math.log1p(-p + p * math.exp(min(x, 700.0))))

    lo, hi = 1e-12, 1.0
    while g(hi) < 0:
        hi *= 2.0
        if hi > 1e6:
            return float("nan")
    # g < 0 just right of 0 (g'(0) = -D < 0) and convex, so the positive root is unique:
    # plain bisection on [lo, hi] (no scipy import on this path).
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if g(mid) < 0:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-13 * hi:
            break
    return 0.5 * (lo + hi)


def nested_thresholds(
    prompt_len: float,
    edges: Sequence[int],
    rates: Sequence[float],
    d0: float,
    d1: float,
    *,
    slack: float = 0.1,
    eps: float = 0.05,
    delta: float = 0.01,
    horizon_s: float = 3600.0,
    capacity_tokens: float | None = None,
    batch_limit: int | None = None,
) -> NestedThresholds:
    """Per-segment thresholds for Nested WAIT (seed-wait.md §4.4-§4.5).

    ``edges``: cumulative output lengths ``l'_1 < ... < l'_m``; ``rates``: ``λ_j`` of the
    prompts whose output is in ``(l'_{j-1}, l'_j]``. ``eps`` in (0, 1) sets ``n_{i+1}/n_i =
    p_i + ε(1 - p_i)``, strictly inside Lemma 8's window ``(p_i, 1)``; ``eps = 0`` is the
    papers' boundary choice ``n_i ∝ Λ_i`` (no finite θ, so Eq. 14 is infinite).
    """
    m = len(edges)
    if m != len(rates) or m == 0:
        raise ValueError("edges and rates need the same non-zero length")
    tails = [float(sum(rates[i:])) for i in range(m)]  # Λ_i
    notes: list[str] = []
    types = [FluidType(prompt_len, float(e), float(r)) for e, r in zip(edges, rates, strict=True)]
    eq = equilibrium(types, d0, d1)
    # n_{i+1} = n_i·(p_i + ε(1 - p_i)): a share ε of the way from Eq. (12)'s lower bound p_i
    # to Lemma 8's upper bound 1, so n_{i-1}p < n_i < n_{i-1} holds (inferred recipe).
    growth = [1.0]
    for i in range(1, m):
        p = tails[i] / tails[i - 1]
        growth.append(growth[-1] * (p + eps * (1.0 - p)))
    shape = [tails[0] * g for g in growth]  # n_i / c
    stages = segment_stages(edges)
    if eq.stable:
        c = (1.0 + slack) * eq.step_s
        for _ in range(200):
            n = [max(1, int(round(c * s))) for s in shape]
            dt = d0 + d1 * nested_memory(prompt_len, edges, n)
            if dt <= n[0] / tails[0]:
                break
            c *= 1.05
        if batch_limit is not None and batch_seats(n, edges) > batch_limit:
            notes.append(
                f"fluid thresholds need {batch_seats(n, edges)} seats > B = {batch_limit}: "
                "scaled down to B (Eq. 12's ΔT bound no longer holds)"
            )
            n = _scale_to_batch(shape, stages, batch_limit)
    else:
        b = batch_limit or 256
        notes.append(
            f"fluid-unstable load d1·A = {eq.load:.2f} >= 1: n scaled so Σ n_i·stages_i = B = {b}"
        )
        n = _scale_to_batch(shape, stages, b)
    if batch_limit is not None and sum(stages) > batch_limit:
        notes.append(
            f"{sum(stages)} stages > B = {batch_limit}: one prompt per stage already exceeds B "
            "(every n_i >= 1, as the authors' ceil gives)"
        )
    mem = nested_memory(prompt_len, edges, n)
    dt = d0 + d1 * mem
    thetas: list[float] = []
    s_steps = max(1, math.ceil(horizon_s / max(d0, 1e-6)))
    log_term = math.log(max(m - 1, 1) * s_steps / delta)
    buffer = 0.0
    for j in range(1, m):
        p = tails[j] / tails[j - 1]
        th = theta_root(n[j - 1], n[j], p)
        thetas.append(th)
        hold = prompt_len + edges[j - 1]
        buffer += hold * (n[j] + (log_term / th if th == th else float("inf")))
    required = mem + buffer
    if any(t != t for t in thetas):
        notes.append("some θ_j has no root (n_{j-1}p < n_j < n_{j-1} fails after rounding)")
    ok = eq.stable and dt <= n[0] / tails[0]
    if capacity_tokens is not None and required > capacity_tokens:
        notes.append(f"Eq. (14) asks for {required:.0f} KV tokens > capacity {capacity_tokens:.0f}")
    return NestedThresholds(
        edges=[int(e) for e in edges],
        thresholds=n,
        step_s=dt,
        memory_tokens=mem,
        theta=thetas,
        required_memory_tokens=required,
        feasible=ok,
        notes=notes,
    )


def _length_edges(output_lens: np.ndarray, num: int) -> list[int]:
    qs = np.quantile(output_lens, np.linspace(0, 1, num + 1)[1:])
    edges = sorted({int(math.ceil(q)) for q in qs})
    edges[-1] = int(output_lens.max())
    return edges


def thresholds_from_trace(
    prompt_lens: Sequence[int] | np.ndarray,
    output_lens: Sequence[int] | np.ndarray,
    rate: float,
    cost_model: Any,
    *,
    kind: str = "wait",
    num_types: int = 8,
    edges: Sequence[int] | None = None,
    capacity_tokens: float | None = None,
    batch_limit: int | None = None,
    slack: float = 0.1,
) -> WaitThresholds | NestedThresholds:
    """Thresholds for a length sample offered at ``rate`` req/s on ``cost_model``.

    Output-length bins are quantiles of the sample unless ``edges`` is given; ``(d0, d1)``
    come from :func:`harness.policies.fluid.fit_linear_step` at the sample's mean context.
    """
    p = np.asarray(prompt_lens, dtype=float)
    o = np.asarray(output_lens, dtype=float)
    bins = list(edges) if edges is not None else _length_edges(o, num_types)
    ctx = float(np.mean(p + o / 2.0))
    d0, d1 = fit_linear_step(cost_model, mean_context=max(ctx, 1.0))
    if kind == "wait":
        types = types_from_lengths(p, o, rate, edges=bins)
        return wait_thresholds(types, d0, d1, capacity_tokens, slack=slack, batch_limit=batch_limit)
    if kind == "nested":
        idx = np.minimum(np.searchsorted(np.asarray(bins), o, side="left"), len(bins) - 1)
        rates = [rate * float(np.mean(idx == j)) for j in range(len(bins))]
        keep = [j for j, r in enumerate(rates) if r > 0]
        return nested_thresholds(
            float(p.mean()),
            [bins[j] for j in keep],
            [rates[j] for j in keep],
            d0,
            d1,
            slack=slack,
            capacity_tokens=capacity_tokens,
            batch_limit=batch_limit,
        )
    raise ValueError("kind must be 'wait' or 'nested'")


def thresholds_for_trace(
    trace: Any,
    cost_model: Any,
    *,
    kind: str = "wait",
    rate: float | None = None,
    **kw: Any,
) -> WaitThresholds | NestedThresholds:
    """:func:`thresholds_from_trace` for a :class:`harness.workload.trace.Trace` (or cost-model
    name); ``rate`` defaults to the trace's own mean arrival rate."""
    if isinstance(cost_model, str):
        from harness.engine.costmodel import get_cost_model

        cost_model = get_cost_model(cost_model)
    df = trace.df
    if rate is None:
        span = float(df["arrival_s"].max() - df["arrival_s"].min())
        if span <= 0:
            raise ValueError("the trace has no arrival span: pass rate=")
        rate = (len(df) - 1) / span
    return thresholds_from_trace(
        df["prompt_len"].to_numpy(), df["output_len"].to_numpy(), rate, cost_model, kind=kind, **kw
    )
