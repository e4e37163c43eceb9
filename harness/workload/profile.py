"""Bundled length profiles: the offline stand-in for LMSYS-Chat-1M, ShareGPT and Azure.

A profile is a compact statistical summary of real (prompt_len, output_len) pairs, never
the rows themselves:

- marginal quantile tables of each length (``QUANTILE_KNOTS`` probabilities, denser in the
  tails), sampled by inverse transform with linear interpolation and rounding;
- the dependence between the two as an empirical copula: a ``bins`` x ``bins`` histogram
  of the pairs' normalised ranks (ties broken at random), sampled by picking a cell and a
  uniform point in it. This keeps non-linear dependence (e.g. short prompts with long
  answers) that a single correlation number would lose, in a few hundred integers;
- optionally a quantile table of inter-arrival gaps (Azure), used when the caller asks
  for the trace's own timing; the gaps are drawn i.i.d. (autocorrelation is not kept).

Profiles are JSON files in ``harness/workload/profiles/`` (package data), fitted by
``scripts/fit_profiles.py`` from ``/work/shared/data``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from harness.workload.trace import TraceError

PROFILE_DIR = Path(__file__).parent / "profiles"
BINS = 40


def quantile_knots() -> np.ndarray:
    """0..1 in steps of 1e-3, plus 1e-4 steps in the top and bottom 1% (tails matter)."""
    core = np.linspace(0.0, 1.0, 1001)
    lo = np.linspace(0.0, 0.01, 101)
    hi = np.linspace(0.99, 1.0, 101)
    return np.unique(np.round(np.concatenate([core, lo, hi]), 6))


@dataclass
class LengthProfile:
    name: str
    origin: str
    probs: np.ndarray
    prompt_q: np.ndarray
    output_q: np.ndarray
    copula: np.ndarray  # bins x bins counts; rows = prompt rank bin, cols = output rank bin
    gap_q: np.ndarray | None = None
    stats: dict[str, Any] | None = None

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """``n`` (prompt_len, output_len) pairs, integers >= 1."""
        b = self.copula.shape[0]
        w = self.copula.ravel().astype(float)
        cell = rng.choice(w.size, size=n, p=w / w.sum())
        i, j = np.divmod(cell, b)
        up = (i + rng.random(n)) / b
        uo = (j + rng.random(n)) / b
        p = np.interp(up, self.probs, self.prompt_q)
        o = np.interp(uo, self.probs, self.output_q)
        return (
            np.maximum(1, np.rint(p)).astype(np.int64),
            np.maximum(1, np.rint(o)).astype(np.int64),
        )

    def sample_gaps(self, n: int, rng: np.random.Generator) -> np.ndarray:
        if self.gap_q is None:
            raise TraceError(f"profile {self.name!r} has no inter-arrival data; give a rate")
        return np.interp(rng.random(n), self.probs, self.gap_q)

    def sample_frame(self, n: int, rng: np.random.Generator) -> pd.DataFrame:
        p, o = self.sample(n, rng)
        df = pd.DataFrame({"prompt_len": p, "output_len": o})
        if self.gap_q is not None:
            df["timestamp_s"] = np.cumsum(self.sample_gaps(n, rng)) - 0.0
        return df

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "origin": self.origin,
            "probs": [round(float(x), 6) for x in self.probs],
            "prompt_len_quantiles": [round(float(x), 2) for x in self.prompt_q],
            "output_len_quantiles": [round(float(x), 2) for x in self.output_q],
            "copula_bins": int(self.copula.shape[0]),
            "copula_counts": self.copula.astype(int).tolist(),
            "stats": self.stats or {},
        }
        if self.gap_q is not None:
            out["gap_s_quantiles"] = [round(float(x), 6) for x in self.gap_q]
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> LengthProfile:
        return cls(
            name=d["name"],
            origin=d["origin"],
            probs=np.asarray(d["probs"], dtype=float),
            prompt_q=np.asarray(d["prompt_len_quantiles"], dtype=float),
            output_q=np.asarray(d["output_len_quantiles"], dtype=float),
            copula=np.asarray(d["copula_counts"], dtype=float),
            gap_q=np.asarray(d["gap_s_quantiles"], dtype=float) if "gap_s_quantiles" in d else None,
            stats=d.get("stats"),
        )


def fit_profile(
    prompt_len: np.ndarray,
    output_len: np.ndarray,
    *,
    name: str,
    origin: str,
    gaps_s: np.ndarray | None = None,
    bins: int = BINS,
    seed: int = 0,
) -> LengthProfile:
    """Fit a profile from real pairs (see the module docstring for the summary kept)."""
    p = np.asarray(prompt_len, dtype=float)
    o = np.asarray(output_len, dtype=float)
    if p.size != o.size or p.size < bins:
        raise TraceError(f"need at least {bins} paired lengths to fit a profile")
    probs = quantile_knots()
    rng = np.random.default_rng(seed)

    def ranks(x: np.ndarray) -> np.ndarray:
        # Random tie-breaking: discrete lengths have many ties; the copula needs a
        # continuous-looking rank so the cells of tied values are spread evenly.
        order = np.lexsort((rng.random(x.size), x))
        r = np.empty(x.size)
        r[order] = np.arange(x.size)
        return (r + 0.5) / x.size

    ip = np.minimum((ranks(p) * bins).astype(int), bins - 1)
    io = np.minimum((ranks(o) * bins).astype(int), bins - 1)
    cop = np.zeros((bins, bins), dtype=np.int64)
    np.add.at(cop, (ip, io), 1)
    from scipy.stats import spearmanr

    stats = {
        "n": int(p.size),
        "prompt_mean": float(p.mean()),
        "output_mean": float(o.mean()),
        "prompt_p50": float(np.median(p)),
        "output_p50": float(np.median(o)),
        "spearman": float(spearmanr(p, o).statistic),
    }
    gap_q = None
    if gaps_s is not None:
        g = np.asarray(gaps_s, dtype=float)
        g = g[np.isfinite(g) & (g >= 0)]
        gap_q = np.quantile(g, probs)
        stats["mean_gap_s"] = float(g.mean())
    return LengthProfile(
        name=name,
        origin=origin,
        probs=probs,
        prompt_q=np.quantile(p, probs),
        output_q=np.quantile(o, probs),
        copula=cop,
        gap_q=gap_q,
        stats=stats,
    )


def available_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.json"))


def load_profile(name: str) -> LengthProfile:
    """A bundled profile by name (``lmsys``, ``sharegpt``, ``azure-conv``) or a JSON path."""
    path = Path(name)
    if not path.suffix:
        path = PROFILE_DIR / f"{name}.json"
    if not path.exists():
        raise TraceError(
            f"no length profile {name!r} (bundled: {', '.join(available_profiles()) or 'none'})"
        )
    try:
        return LengthProfile.from_json(json.loads(path.read_text()))
    except (KeyError, ValueError) as e:
        raise TraceError(f"{path}: not a valid length profile ({e})") from None
