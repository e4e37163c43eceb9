"""Step-time cost models: a step's duration from its composition.

A step is described by ``prefill_tokens`` (prompt or recompute tokens processed), ``decode_seqs``
(requests decoding one token) and ``kv_tokens`` (KV tokens read by attention: for every scheduled
request, its context before the step plus the tokens it adds). Every model exposes a scalar
:meth:`step_time` and a vectorised :meth:`step_times` (used when the simulator fast-forwards a run
of identical decode steps in closed form).

Kinds:

- ``affine``: ``t = max(floor, base + per_token*(P + D) + per_decode*D) + per_kv*K``. The
  ``max`` is the weight-read floor of small batches (anchors-engines.md §5.2: "a piecewise
  ``max(a, a' + b·N_tokens)`` fits better than a single affine function"). WAIT's Eq. (1)
  ``d0 + d1·(Σ prompt + Σ KV of decodes)`` is the special case ``base=d0, per_kv=d1``
  (seed-wait.md §1.3).
- ``staircase``: ``t = c + a*ceil((P + D)/b0)`` (seed-stability.md §1.3, v3 form).
- ``piecewise``: ``t = c + a*max(0, (P + D) - b0)`` (seed-stability.md §1.3, v2 form, inferred).

Presets (:data:`PRESETS`) carry their source. Users pass a YAML/JSON file with ``kind`` and the
coefficients, or override a preset inline: ``a100-llama2-7b:per_kv_s=0``.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np


class CostModelError(ValueError):
    """An unknown preset, a malformed coefficients file or a bad override."""


@runtime_checkable
class CostModel(Protocol):
    """Duration of one engine step in seconds."""

    name: str
    uses_prefill_attn: bool

    def step_time(
        self, prefill_tokens: int, decode_seqs: int, kv_tokens: int, prefill_attn: float = 0.0
    ) -> float: ...

    def step_times(
        self, prefill_tokens: np.ndarray, decode_seqs: np.ndarray, kv_tokens: np.ndarray
    ) -> np.ndarray: ...

    def to_dict(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class _Base:
    name: str = "custom"
    source: str = ""

    # A model that sets this receives ``prefill_attn = Σ chunk·(context_before + chunk/2)`` over
    # the step's prefill chunks from the simulator (issue 19's interface); others get 0.
    uses_prefill_attn = False

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["kind"] = self.kind  # type: ignore[attr-defined]
        return d

    def _check(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, float | int) and not isinstance(v, bool) and v < 0:
                raise CostModelError(f"cost model {self.name!r}: {f.name}={v} must be >= 0")


@dataclass(frozen=True)
class AffineCostModel(_Base):
    """``t = max(floor_s, base_s + per_token_s*(P+D) + per_decode_s*D) + per_kv_s*K``."""

    kind = "affine"
    base_s: float = 0.0
    per_token_s: float = 0.0
    per_decode_s: float = 0.0
    per_kv_s: float = 0.0
    floor_s: float = 0.0

    def __post_init__(self) -> None:
        self._check()

    def step_time(
        self, prefill_tokens: int, decode_seqs: int, kv_tokens: int, prefill_attn: float = 0.0
    ) -> float:
        lin = (
            self.base_s
            + self.per_token_s * (prefill_tokens + decode_seqs)
            + self.per_decode_s * decode_seqs
        )
        return max(self.floor_s, lin) + self.per_kv_s * kv_tokens

    def decode_affine(self, decode_seqs: int) -> tuple[float, float]:
        """``(fixed, rate)`` with ``step_time(0, decode_seqs, kv) == fixed + rate * kv``
        bit for bit: the decode runs a fast-forward sums (core.decode_run_ends)."""
        lin = self.base_s + self.per_token_s * decode_seqs + self.per_decode_s * decode_seqs
        return max(self.floor_s, lin), self._kv_rate_of(decode_seqs)

    def _kv_rate_of(self, decode_seqs: int) -> float:
        return self.per_kv_s

    def step_times(
        self, prefill_tokens: np.ndarray, decode_seqs: np.ndarray, kv_tokens: np.ndarray
    ) -> np.ndarray:
        p = np.asarray(prefill_tokens, dtype=float)
        d = np.asarray(decode_seqs, dtype=float)
        lin = self.base_s + self.per_token_s * (p + d) + self.per_decode_s * d
        return np.maximum(self.floor_s, lin) + self.per_kv_s * np.asarray(kv_tokens, dtype=float)


@dataclass(frozen=True)
class ContextCostModel(AffineCostModel):
    """The affine model plus per-request context terms (issue 19):

    ``t = max(floor_s, base_s + per_token_s*(P+D) + per_decode_s*D) + r(D)*K + attn_s*A
    + prefill_step_s*[P > 0]`` (``attn_s`` = ``per_prefill_attn_s``, ``prefill_step_s`` =
    ``per_prefill_step_s``)

    * ``r(D)``, the KV-read rate, falls from ``per_kv_s`` at one decode to ``per_kv_lo_s`` at
      ``kv_sat_batch`` decodes and beyond, linearly in ``log2 D``: a batched decode kernel reads
      KV closer to peak bandwidth (Vidur's A100 Llama-2-7B attention profile: ~0.37 us/token
      at batch 1, ~0.26-0.28 at batch >= 64). Steps with no decode use ``per_kv_s``.
    * ``A = Σ chunk·(context_before + chunk/2)`` over the step's prefill chunks: causal
      attention's query-key products, so a prompt's chunks cost the same sum whatever the
      chunking, and later chunks of a long prompt cost more than early ones
      (anchors-engines.md §5.2 "∝ Σ chunk·(kv+chunk)").
    * ``[P > 0]``: a step that runs any prompt chunk pays the prefill path's fixed cost once
      (vLLM's model runner builds prefill attention metadata and runs the prefill kernel path
      per layer beside the decode path; a new request's state is set up). On vLLM CPU with
      the tiny model it is 4-6 ms per such step, fitted the same on three policies' step
      logs, and without it every prefill-bearing step was 2-6 ms over the fit (issue 17's
      sim-low TTFT medians, issue 16's fast simulated engine). 0 in every preset (Vidur's
      profiles have no separate term; their prefill fixed cost is in ``base_s``).
    """

    kind = "context"
    uses_prefill_attn = True
    per_kv_lo_s: float = 0.0
    kv_sat_batch: int = 64
    per_prefill_attn_s: float = 0.0
    per_prefill_step_s: float = 0.0

    def __post_init__(self) -> None:
        self._check()
        if self.kv_sat_batch < 2:
            raise CostModelError("context kv_sat_batch must be >= 2")
        # r(D) for D = 0..kv_sat_batch, the values kv_rate computes (constant beyond): the
        # scalar step_time runs once per simulated step, so it looks the rate up (issue 13).
        table = self.kv_rate(np.arange(self.kv_sat_batch + 1)).tolist()
        object.__setattr__(self, "_kv_table", table)

    def kv_rate(self, decode_seqs: Any) -> Any:
        """``r(D)`` per KV token (vectorised over ``D``)."""
        d = np.maximum(np.asarray(decode_seqs, dtype=float), 1.0)
        w = np.clip(np.log2(d) / math.log2(self.kv_sat_batch), 0.0, 1.0)
        return self.per_kv_s + (self.per_kv_lo_s - self.per_kv_s) * w

    def _kv_rate_of(self, decode_seqs: int) -> float:
        """Scalar ``r(D)``: a table look-up for whole ``D`` (identical values), else kv_rate."""
        table: list[float] = self._kv_table  # type: ignore[attr-defined]
        if decode_seqs.__class__ is int and decode_seqs >= 0:
            return table[decode_seqs] if decode_seqs < len(table) else table[-1]
        return float(self.kv_rate(decode_seqs))

    def step_time(
        self, prefill_tokens: int, decode_seqs: int, kv_tokens: int, prefill_attn: float = 0.0
    ) -> float:
        lin = (
            self.base_s
            + self.per_token_s * (prefill_tokens + decode_seqs)
            + self.per_decode_s * decode_seqs
        )
        return (
            max(self.floor_s, lin)
            + self._kv_rate_of(decode_seqs) * kv_tokens
            + self.per_prefill_attn_s * prefill_attn
            + (self.per_prefill_step_s if prefill_tokens > 0 else 0.0)
        )

    def step_times(
        self, prefill_tokens: np.ndarray, decode_seqs: np.ndarray, kv_tokens: np.ndarray
    ) -> np.ndarray:
        p = np.asarray(prefill_tokens, dtype=float)
        d = np.asarray(decode_seqs, dtype=float)
        lin = self.base_s + self.per_token_s * (p + d) + self.per_decode_s * d
        return (
            np.maximum(self.floor_s, lin)
            + self.kv_rate(d) * np.asarray(kv_tokens, dtype=float)
            + self.per_prefill_step_s * (p > 0)
        )


# the methods whose arithmetic _rows.step_time and _rows.run_ends repeat (step_terms)
_STEP_METHODS = ("step_time", "_kv_rate_of", "decode_affine")


def step_terms(model: Any) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """``(coef, table)`` for the simulator kernel's C ``step_time`` and ``run_ends``
    (``harness.engine._rows``) when ``model`` is an affine or context model whose
    ``step_time``, ``_kv_rate_of`` and ``decode_affine`` are this module's: coef
    ``(base_s, per_token_s, per_decode_s, floor_s)`` (+ ``per_prefill_attn_s,
    per_prefill_step_s`` for a context model), table ``r(D)`` for ``D = 0, 1, ...`` (the last
    one beyond: ``(per_kv_s,)`` for the affine model). None otherwise (another kind, a wrapper
    such as :class:`JitteredCostModel`, a subclass that computes its own, a coefficient that
    is an int or not finite): the kernel then
    calls ``model.step_time`` (and :func:`core.decode_run_ends`). Why: that call chain is ~1 us
    of a simulated step's Python."""
    if not isinstance(model, AffineCostModel):
        return None
    context = isinstance(model, ContextCostModel)
    base = ContextCostModel if context else AffineCostModel
    cls = type(model)
    if any(getattr(cls, m) is not getattr(base, m) for m in _STEP_METHODS) or (
        context and not model.uses_prefill_attn  # (the kernel passes attn only where it is)
    ):
        return None
    if context:
        table: list[float] = model._kv_table  # type: ignore[attr-defined]
        extra: tuple[float, ...] = (model.per_prefill_attn_s, model.per_prefill_step_s)
    else:
        table, extra = [model.per_kv_s], ()
    coef = (model.base_s, model.per_token_s, model.per_decode_s, model.floor_s, *extra)
    if not all(type(x) is float and math.isfinite(x) for x in (*coef, *table)):
        return None  # an int coefficient (Python's int arithmetic), or not a finite one
    return coef, tuple(table)


@dataclass(frozen=True)
class StaircaseCostModel(_Base):
    """``t = c_s + a_s*ceil((P+D)/b0)`` (seed-stability.md §1.3 / Appendix A.1, v3)."""

    kind = "staircase"
    c_s: float = 0.01128
    a_s: float = 0.03547
    b0: int = 128

    def __post_init__(self) -> None:
        self._check()
        if self.b0 < 1:
            raise CostModelError("staircase b0 must be >= 1")

    def step_time(
        self, prefill_tokens: int, decode_seqs: int, kv_tokens: int, prefill_attn: float = 0.0
    ) -> float:
        return self.c_s + self.a_s * math.ceil((prefill_tokens + decode_seqs) / self.b0)

    def step_times(
        self, prefill_tokens: np.ndarray, decode_seqs: np.ndarray, kv_tokens: np.ndarray
    ) -> np.ndarray:
        beta = np.asarray(prefill_tokens) + np.asarray(decode_seqs)
        return self.c_s + self.a_s * np.ceil(beta / self.b0)


@dataclass(frozen=True)
class PiecewiseCostModel(_Base):
    """``t = c_s + a_s*max(0, (P+D) - b0)`` (seed-stability.md §1.3, v2 reconstructed form)."""

    kind = "piecewise"
    c_s: float = 0.04675
    a_s: float = 0.03547 / 128
    b0: int = 128

    def __post_init__(self) -> None:
        self._check()

    def step_time(
        self, prefill_tokens: int, decode_seqs: int, kv_tokens: int, prefill_attn: float = 0.0
    ) -> float:
        return self.c_s + self.a_s * max(0, prefill_tokens + decode_seqs - self.b0)

    def step_times(
        self, prefill_tokens: np.ndarray, decode_seqs: np.ndarray, kv_tokens: np.ndarray
    ) -> np.ndarray:
        beta = np.asarray(prefill_tokens) + np.asarray(decode_seqs)
        return self.c_s + self.a_s * np.maximum(0, beta - self.b0)


JITTER_LEVELS = 401
"""Quantile levels a jittered model keeps per step class (0, 0.25%, ..., 100%)."""


class JitteredCostModel:
    """A model's step time times a random factor per step: the measured machine's own spread.

    Why (issue 17): a fitted model gives the *mean* step time for a composition; a real CPU's
    steps scatter around it, right-skewed (on vLLM CPU a lone prompt's step has its median
    ~0.5 ms below its mean, and a few steps stall for several times their cost). A first token
    that takes one prefill step then has its median at the steps' median, and a P99 made of
    stalls, neither of which a deterministic simulator reproduces. The factors are the ratios
    measured / fitted on the steps the model was fitted on (:func:`fit_step_jitter`), kept as
    quantiles for prompt-bearing and decode-only steps apart (their spreads differ) and drawn
    by inverse CDF from a seeded generator: the same model and seed give the same run. Out of
    sample for whatever is compared with it later: the ratios come from the fitting steps.

    ``reseeded(k)`` is the same model with an independent stream (pool several simulations).
    """

    kind = "jittered"

    def __init__(
        self,
        base: CostModel,
        prefill_ratios: Any,
        decode_ratios: Any,
        seed: int = 0,
        name: str | None = None,
        source: str = "",
    ) -> None:
        self.base = base
        self.prefill_ratios = [float(x) for x in prefill_ratios]
        self.decode_ratios = [float(x) for x in decode_ratios]
        for label, q in (("prefill", self.prefill_ratios), ("decode", self.decode_ratios)):
            if len(q) < 2 or any(b < a for a, b in zip(q, q[1:], strict=False)) or q[0] < 0:
                raise CostModelError(
                    f"jittered cost model: {label}_ratios must be >= 2 non-negative quantiles "
                    "in ascending order"
                )
        self.seed = int(seed)
        self.name = name or f"{base.name}+jitter"
        self.source = source
        self.uses_prefill_attn = bool(getattr(base, "uses_prefill_attn", False))
        self._rng = np.random.default_rng(self.seed)
        self._buf: list[float] = []

    def reseeded(self, seed: int) -> JitteredCostModel:
        return JitteredCostModel(
            self.base, self.prefill_ratios, self.decode_ratios, seed, self.name, self.source
        )

    @staticmethod
    def _at(q: list[float], u: float) -> float:
        x = u * (len(q) - 1)
        i = min(int(x), len(q) - 2)
        return q[i] + (x - i) * (q[i + 1] - q[i])

    def factor_at(self, prompt: bool, level: float) -> float:
        """The factor at quantile ``level`` (0-1) for a prompt-bearing or a decode-only step."""
        return self._at(self.prefill_ratios if prompt else self.decode_ratios, level)

    def _uniform(self) -> float:
        if not self._buf:  # one generator call per 4,096 steps: the scalar path stays cheap
            self._buf = self._rng.random(4096).tolist()
        return self._buf.pop()

    def step_time(
        self, prefill_tokens: int, decode_seqs: int, kv_tokens: int, prefill_attn: float = 0.0
    ) -> float:
        t = self.base.step_time(prefill_tokens, decode_seqs, kv_tokens, prefill_attn)
        q = self.prefill_ratios if prefill_tokens > 0 else self.decode_ratios
        return t * self._at(q, self._uniform())

    def step_times(
        self, prefill_tokens: np.ndarray, decode_seqs: np.ndarray, kv_tokens: np.ndarray
    ) -> np.ndarray:
        t = self.base.step_times(prefill_tokens, decode_seqs, kv_tokens)
        u = np.array([self._uniform() for _ in range(len(t))])
        grid = np.linspace(0.0, 1.0, len(self.prefill_ratios))
        rp = np.interp(u, grid, self.prefill_ratios)
        rd = np.interp(u, np.linspace(0.0, 1.0, len(self.decode_ratios)), self.decode_ratios)
        return t * np.where(np.asarray(prefill_tokens) > 0, rp, rd)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "source": self.source,
            "seed": self.seed,
            "base": self.base.to_dict(),
            "prefill_ratios": self.prefill_ratios,
            "decode_ratios": self.decode_ratios,
        }


def fit_step_jitter(
    model: CostModel, samples: Any, *, seed: int = 0, levels: int = JITTER_LEVELS
) -> JitteredCostModel:
    """``model`` with the spread of the measured steps around it (:class:`JitteredCostModel`).

    Every step counts, the stalls a trimmed fit left out too: they are how the machine runs.
    A class with fewer than 20 steps borrows the other's ratios."""
    f = step_features(samples)
    if len(f) < 4:
        raise CostModelError(f"need at least 4 measured steps to fit jitter, got {len(f)}")
    t, p, d, kv, attn = (f[c].to_numpy() for c in ("t", "p", "d", "kv", "attn"))
    # the scalar form: the vector one has no prefill-attention term (decode runs only)
    pred = np.array([model.step_time(*row) for row in zip(p, d, kv, attn, strict=True)])
    ok = pred > 0
    ratio, prompt = t[ok] / pred[ok], p[ok] > 0
    pools = [ratio[prompt], ratio[~prompt]]
    pools = [x if len(x) >= 20 else ratio for x in pools]
    grid = np.linspace(0.0, 1.0, levels)
    qp, qd = (np.quantile(x, grid) for x in pools)
    return JitteredCostModel(
        model,
        qp,
        qd,
        seed=seed,
        source=f"fit_step_jitter over {len(ratio)} measured steps "
        f"({int(prompt.sum())} with a prompt chunk)",
    )


KINDS: dict[str, type[_Base]] = {
    "affine": AffineCostModel,
    "linear": AffineCostModel,
    "context": ContextCostModel,
    "staircase": StaircaseCostModel,
    "piecewise": PiecewiseCostModel,
}

_VIDUR = (
    "anchors-engines.md §5.2: Vidur mlp.csv (TP=1) token-linear fit on N in [512, 4096], flat "
    "floor at N<=64, KV read from a 70%-of-peak HBM roofline (inferred)"
)

_CONTEXT = (
    "issue 19: Vidur's A100 Llama-2-7B attention profile (decode 0.37 us/KV token at batch 1, "
    "~0.27 at batch >= 64; one 4,096-token prompt 343 ms), scaled to this GPU/model (inferred)"
)

PRESETS: dict[str, _Base] = {
    # Llama-2-7B / A100: 2.20 ms + 64.2 us/token, floor ~9.1-9.7 ms (mlp.csv); KV read 0.37 us
    # per token at one decode falling to 0.27 at >= 64 (Vidur's attention profile); prefill
    # attention 9.10 ns per unit of Σ chunk·(ctx + chunk/2), so a 4,096-token prompt takes
    # 2.20 + 263.0 + 1.5 + 76.3 = 343 ms, Vidur's figure. Capacity on the Azure-conversation
    # lengths: within 2% of Vidur's profile for sarathi and vllm-v0 (harness experiment
    # capacity); the affine preset before it was 6-9% below.
    "a100-llama2-7b": ContextCostModel(
        name="a100-llama2-7b",
        source=f"{_VIDUR}; {_CONTEXT}",
        base_s=2.20e-3,
        per_token_s=64.2e-6,
        floor_s=9.4e-3,
        per_kv_s=0.37e-6,
        per_kv_lo_s=0.27e-6,
        per_prefill_attn_s=9.10e-9,
    ),
    # Llama-2-7B / H100: 2.89 ms + 20.2 us/token, floor ~5.5-5.9 ms, KV 0.22 us/token; the
    # A100 context terms scaled by HBM bandwidth (KV: 0.22 -> 0.16 at batch >= 64) and by the
    # mlp.csv compute ratio 82.9/258.4 ms at 4,096 tokens (prefill attention 2.92 ns, inferred).
    "h100-llama2-7b": ContextCostModel(
        name="h100-llama2-7b",
        source=f"{_VIDUR}; {_CONTEXT}",
        base_s=2.89e-3,
        per_token_s=20.2e-6,
        floor_s=5.7e-3,
        per_kv_s=0.22e-6,
        per_kv_lo_s=0.16e-6,
        per_prefill_attn_s=2.92e-9,
    ),
    # Llama-3-8B / A100 (GQA-8): 6.42 ms + 66.8 us/token, floor ~9.7-11.2 ms, KV 0.09 us/token
    # (0.066 at batch >= 64, the A100 ratio); prefill attention has Llama-2-7B's query FLOPs
    # (32 heads x 128) plus Vidur's 10% GQA batching overhead: 10.0 ns (inferred).
    "a100-llama3-8b": ContextCostModel(
        name="a100-llama3-8b",
        source=f"{_VIDUR}; {_CONTEXT}",
        base_s=6.42e-3,
        per_token_s=66.8e-6,
        floor_s=10.4e-3,
        per_kv_s=0.09e-6,
        per_kv_lo_s=0.066e-6,
        per_prefill_attn_s=10.0e-9,
    ),
    # Mistral-7B / RTX 6000 Ada: least squares over the SLAI repo's plot1_results.csv mean batch
    # times for chunks 256..1024 (R^2 = 0.992): 15.17 ms + 57.4 us/token; floor = the 64-token
    # chunk's 22.72 ms; KV read 128 KiB/token at 70% of 960 GB/s (inferred).
    "rtx6000ada-mistral-7b": AffineCostModel(
        name="rtx6000ada-mistral-7b",
        source="seed-rad-slai.md §1.3 (SLAI repo scripts/plot1_results.csv), own least squares",
        base_s=15.17e-3,
        per_token_s=57.4e-6,
        floor_s=22.72e-3,
        per_kv_s=0.195e-6,
    ),
    # WAIT Eq. (1): tau = d0 + d1 * (prefill tokens + KV of decodes). The papers give no numbers;
    # d1 = 0.0115 ms/token is the authors' later Vidur/A100 fit (seed-wait.md App. B); d0 = 10 ms,
    # the A100 weight-read floor (anchors-engines.md §5.2), since their 276 ms is doubtful.
    "linear": AffineCostModel(
        name="linear",
        source="seed-wait.md §1.3 Eq. (1); d1 from App. B, d0 = A100 floor (anchors §5.2)",
        base_s=10e-3,
        per_kv_s=0.0115e-3,
    ),
    # v3 staircase: CodeLlama-34B, 1x A100 80GB, TP=1: c=11.28 ms, a=35.47 ms, b0=128, R^2>0.97.
    "staircase": StaircaseCostModel(
        name="staircase",
        source="seed-stability.md §1.3 / Appendix A.1 (v3, CodeLlama-34B on A100)",
    ),
    # v2 max-form; constants chosen to agree with the staircase at multiples of b0 (inferred).
    "piecewise": PiecewiseCostModel(
        name="piecewise",
        source="seed-stability.md §1.3 (v2 form c + a*max(0, beta-b0); constants inferred)",
    ),
}


def presets() -> list[str]:
    return sorted(PRESETS)


def _coerce(model_cls: type[_Base], key: str, value: Any) -> Any:
    names = {f.name: f for f in fields(model_cls)}
    if key not in names or key in ("name", "source"):
        allowed = [n for n in names if n not in ("name", "source")]
        raise CostModelError(f"unknown coefficient {key!r} for {model_cls.kind}: {allowed}")
    try:
        return int(value) if key in ("b0", "kv_sat_batch") else float(value)
    except (TypeError, ValueError):
        raise CostModelError(f"coefficient {key}={value!r} is not a number") from None


def from_dict(d: dict[str, Any], name: str = "custom") -> _Base:
    """Build a model from ``{"kind": ..., coefficient: value, ...}`` (a parsed YAML/JSON file)."""
    if not isinstance(d, dict):
        raise CostModelError("cost model file must hold a mapping with 'kind' and coefficients")
    d = dict(d)
    kind = str(d.pop("kind", "affine"))
    if kind == JitteredCostModel.kind:
        try:
            return JitteredCostModel(  # type: ignore[return-value]
                from_dict(d["base"]),
                d["prefill_ratios"],
                d["decode_ratios"],
                seed=int(d.get("seed", 0)),
                name=str(d.get("name", name)),
                source=str(d.get("source", "")),
            )
        except CostModelError:
            raise
        except (KeyError, TypeError, ValueError) as e:
            raise CostModelError(f"jittered cost model: bad or missing field ({e})") from None
    if kind not in KINDS:
        kinds = sorted([*KINDS, JitteredCostModel.kind])
        raise CostModelError(f"unknown cost model kind {kind!r}; choose from {kinds}")
    cls = KINDS[kind]
    kw: dict[str, Any] = {"name": str(d.pop("name", name)), "source": str(d.pop("source", ""))}
    for k, v in d.items():
        kw[k] = _coerce(cls, k, v)
    return cls(**kw)


DEFAULT_COST_MODEL = "h100-llama2-7b"
"""The preset used when none is named (simulate, serve, replay on the built-in engine).

H100 is today's common serving GPU, and on it the README's main command (LMSYS at 50 req/s)
runs below capacity; the A100 preset saturates near 45 req/s on the same lengths.
"""


def get_cost_model(name_or_path: str | dict[str, Any] | CostModel) -> CostModel:
    """A preset name (optionally with ``:key=value,...`` overrides), a YAML/JSON file, or a dict."""
    if isinstance(name_or_path, dict):
        return from_dict(name_or_path)  # type: ignore[return-value]
    if not isinstance(name_or_path, str):
        return name_or_path
    spec = name_or_path.strip()
    path = Path(spec)
    if path.suffix.lower() in (".yaml", ".yml", ".json") or path.is_file():
        if not path.is_file():
            raise CostModelError(f"cost model file {spec!r} not found")
        text = path.read_text()
        try:
            if path.suffix.lower() == ".json":
                data = json.loads(text)
            else:
                import yaml

                data = yaml.safe_load(text)
        except Exception as e:  # noqa: BLE001 - any parse error becomes one line
            raise CostModelError(f"cannot parse cost model file {spec!r}: {e}") from None
        return from_dict(data, name=path.stem)  # type: ignore[return-value]
    base, _, overrides = spec.partition(":")
    if base not in PRESETS:
        raise CostModelError(
            f"unknown cost model {base!r}; choose a preset ({', '.join(presets())}) or a "
            ".yaml/.json file"
        )
    model = PRESETS[base]
    if overrides:
        kw: dict[str, Any] = {}
        for part in overrides.split(","):
            k, sep, v = part.partition("=")
            if not sep:
                raise CostModelError(f"override {part!r} is not key=value")
            kw[k.strip()] = _coerce(type(model), k.strip(), v.strip())
        model = replace(model, name=spec, **kw)
    return model  # type: ignore[return-value]


@dataclass(frozen=True)
class FitResult:
    """A fitted affine model and how well it fits (R², residual RMS, rows used)."""

    model: AffineCostModel
    r2: float
    rmse_s: float
    n: int
    extra: dict[str, Any] = field(default_factory=dict)


MAX_STALL_SHARE = 0.05
"""``fit_cost_model(trim_stalls=True)`` leaves out at most this share of the steps."""


def step_features(samples: Any) -> Any:
    """The measured steps as the fit sees them: the engine rows of SAMPLES with a duration
    and a batch, rows covering several fast-forwarded steps averaged per step. Columns: ``t``
    (s), ``p`` prefill tokens, ``d`` decodes, ``kv`` resident KV tokens, ``attn`` prefill
    attention work (``Σ chunk·(ctx + chunk/2)``; 0 without the column): one reading for
    :func:`fit_cost_model` and for the checks of a fit against the same steps."""
    import pandas as pd

    df = pd.DataFrame(samples)
    if "source" in df.columns:
        df = df[df["source"] == "engine"]
    need = ["step_duration_s", "prefill_tokens", "decode_tokens"]
    missing = [c for c in need if c not in df.columns]
    if missing:
        raise CostModelError(f"samples lack column(s) {missing} needed to fit a cost model")
    df = df.dropna(subset=need)
    steps = (
        df["num_steps"].fillna(1).clip(lower=1).to_numpy(float)
        if "num_steps" in df
        else np.ones(len(df))
    )
    zeros = np.zeros(len(df))
    return pd.DataFrame(
        {
            "t": df["step_duration_s"].to_numpy(float) / steps,
            "p": df["prefill_tokens"].to_numpy(float) / steps,
            "d": df["decode_tokens"].to_numpy(float) / steps,
            "kv": df["kv_used_tokens"].fillna(0).to_numpy(float)
            if "kv_used_tokens" in df
            else zeros,
            "attn": (
                pd.to_numeric(df["prefill_attn"], errors="coerce").fillna(0).to_numpy(float) / steps
                if "prefill_attn" in df
                else zeros
            ),
        }
    )


def fit_cost_model(
    samples: Any,
    *,
    name: str = "fitted",
    with_floor: bool = False,
    kind: str = "affine",
    kv_sat_batch: int = 64,
    trim_stalls: bool = False,
) -> FitResult:
    """Least-squares fit of a step-time model from measured engine steps (SAMPLES rows with
    ``source == "engine"``).

    ``kind="affine"``: ``t = base + per_token*(P+D) + per_decode*D + per_kv*K``.
    ``kind="context"`` (issue 19): the KV-read rate is split into its batch-1 and
    batch-``kv_sat_batch`` ends, ``K*(1-w(D))`` and ``K*w(D)`` with ``w`` as in
    :class:`ContextCostModel`, a ``prefill_attn`` column (``Σ chunk·(ctx + chunk/2)``),
    when the log has one, fits ``per_prefill_attn_s``, and ``[P > 0]`` fits
    ``per_prefill_step_s`` when the steps mix prefill-bearing and decode-only ones (otherwise
    it is ``base_s`` again and stays 0).

    Uses non-negative least squares so coefficients stay physical. ``K`` is ``kv_used_tokens``
    (the KV resident at the step, a proxy for KV read when decodes dominate). Rows covering
    several fast-forwarded steps are averaged per step. ``with_floor`` sets ``floor_s`` to the
    5th percentile of the shortest steps' durations (the weight-read floor).

    ``trim_stalls``: refit without the steps that ran far longer than the model says (residual
    above 4 robust sigmas, 1.4826 x MAD; up to three rounds). On a shared CPU another process
    can take the core mid-step; those stalls are the neighbours' cost, not the engine's, and
    least squares would spread them over every step (a fit high for typical steps and still
    short for the stalled ones). One-sided: nothing makes a step faster than its work. At most
    :data:`MAX_STALL_SHARE` of the steps go (the largest residuals): when more look stalled,
    contention is the machine's normal state, which the fit must keep (TPOT averages it).
    ``extra["trimmed"]`` counts the steps left out.
    """
    from scipy.optimize import nnls

    if kind not in ("affine", "context"):
        raise CostModelError(f"fit kind must be 'affine' or 'context', not {kind!r}")
    f = step_features(samples)
    if len(f) < 4:
        raise CostModelError(f"need at least 4 measured steps to fit, got {len(f)}")
    t, p, d, kv = (f[c].to_numpy() for c in ("t", "p", "d", "kv"))
    if kind == "affine":
        X = np.column_stack([np.ones_like(t), p + d, d, kv])
    else:
        w = np.clip(np.log2(np.maximum(d, 1.0)) / math.log2(kv_sat_batch), 0.0, 1.0)
        attn = f["attn"].to_numpy()
        has_p = (p > 0).astype(float)
        X = np.column_stack([np.ones_like(t), p + d, d, kv * (1 - w), kv * w, attn, has_p])
        if np.linalg.matrix_rank(X) == np.linalg.matrix_rank(X[:, :-1]):
            # the prefill-step indicator adds nothing the other columns cannot express (every
            # step or none has a prompt chunk; or one request at a time, where it is 1 - D):
            # left out, so it cannot take an arbitrary share of base_s / per_decode_s
            X[:, -1] = 0.0
    keep = np.ones(len(t), dtype=bool)
    coef, _ = nnls(X, t)
    for _ in range(3 if trim_stalls else 0):
        res = t - X @ coef
        sigma = 1.4826 * float(np.median(np.abs(res[keep] - np.median(res[keep]))))
        new_keep = res <= np.median(res[keep]) + 4 * sigma
        cap = int(MAX_STALL_SHARE * len(t))
        if (~new_keep).sum() > cap:  # stalls are rare by premise: only the worst `cap` go
            new_keep = np.ones(len(t), dtype=bool)
            new_keep[np.argsort(res)[len(t) - cap :]] = False
        if sigma <= 0 or new_keep.sum() < 4 or (new_keep == keep).all():
            break
        keep = new_keep
        coef, _ = nnls(X[keep], t[keep])
    X, t = X[keep], t[keep]
    pred = X @ coef
    ss_res = float(((t - pred) ** 2).sum())
    ss_tot = float(((t - t.mean()) ** 2).sum())
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0
    floor = float(np.percentile(t, 5)) if with_floor else 0.0
    common: dict[str, Any] = {
        "name": name,
        "source": f"fit_cost_model over {len(t)} measured steps",
        "base_s": float(coef[0]),
        "per_token_s": float(coef[1]),
        "per_decode_s": float(coef[2]),
        "per_kv_s": float(coef[3]),
        "floor_s": floor,
    }
    if kind == "affine":
        model: AffineCostModel = AffineCostModel(**common)
    else:
        model = ContextCostModel(
            **common,
            per_kv_lo_s=float(coef[4]),
            kv_sat_batch=kv_sat_batch,
            per_prefill_attn_s=float(coef[5]),
            per_prefill_step_s=float(coef[6]),
        )
    return FitResult(
        model=model,
        r2=r2,
        rmse_s=math.sqrt(ss_res / len(t)),
        n=len(t),
        extra={"trimmed": int((~keep).sum())},
    )


def loop_overhead_s(step_start_s: Any, step_end_s: Any, back_to_back_s: float = 5e-3) -> float:
    """Median time from a measured step's end (its tokens out) to the next step's start, over
    back-to-back steps: the engine loop's own work between steps (output processing, input
    handling; vLLM's ``update_from_output`` to the next ``schedule``).

    Why: a simulated engine has no time between steps, so a cost model fitted for it charges
    each step its period (``adapters.vllm.steplog.step_log_samples``), and the simulator's
    tokens appear at the period's end. The real tokens left this much earlier; a comparison of
    first-token times subtracts it (steady token gaps are periods in both and need nothing).
    """
    start = np.asarray(step_start_s, dtype=float)
    end = np.asarray(step_end_s, dtype=float)
    if len(start) < 2:
        return 0.0
    order = np.argsort(start, kind="stable")
    start, end = start[order], end[order]
    gap = start[1:] - end[:-1]
    gap = gap[(gap >= 0) & (gap <= back_to_back_s)]
    return float(np.median(gap)) if len(gap) else 0.0


# Default KV sizing per preset (used when no --kv-tokens/--num-blocks is given): GPU memory,
# weights (fp16 params x 2 B) and KV bytes/token (anchors-engines.md §5.2: Llama-2-7B MHA
# 512 KiB/token; Llama-3-8B / Mistral-7B GQA-8 128 KiB/token; seed-rad-slai.md §1.5). The
# paper-model presets (linear, staircase, piecewise) are memory-free (seed-stability.md §7
# REC 11), so they have no entry.
HARDWARE: dict[str, dict[str, float]] = {
    "a100-llama2-7b": {"gpu_mem_gib": 80, "model_weights_gib": 12.55, "kv_bytes_per_token": 524288},
    "h100-llama2-7b": {"gpu_mem_gib": 80, "model_weights_gib": 12.55, "kv_bytes_per_token": 524288},
    "a100-llama3-8b": {"gpu_mem_gib": 80, "model_weights_gib": 14.96, "kv_bytes_per_token": 131072},
    "rtx6000ada-mistral-7b": {
        "gpu_mem_gib": 48,
        "model_weights_gib": 13.49,
        "kv_bytes_per_token": 131072,
    },
}
