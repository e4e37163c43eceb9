"""Service tiers and their SLOs, parsed from ``--tiers`` specs.

Spec grammar: ``name:share[:ttft=DUR][:tbt=DUR][:priority=INT]`` joined by commas, e.g.
``paid:0.05:ttft=2s:tbt=100ms,free:0.95:ttft=10s:tbt=500ms``. Durations take ``ms``/``s``
suffixes (bare numbers are seconds). Shares must sum to 1 (within 1e-6).

Defaults follow the SLAI paper (seed-rad-slai.md §6.2): 5% paid with a 0.1 s TBT SLO, 95% free
with 0.5 s. The paper sets no TTFT SLO per tier; 2 s / 10 s are this project's defaults.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

DEFAULT_TIERS_SPEC = "paid:0.05:ttft=2s:tbt=100ms,free:0.95:ttft=10s:tbt=500ms"


class TierSpecError(ValueError):
    """A malformed ``--tiers`` spec; the message says which part is wrong."""


@dataclass(frozen=True, slots=True)
class Tier:
    """One service tier. ``priority``: lower is more important (vLLM convention)."""

    name: str
    share: float
    ttft_slo_s: float | None = None
    tbt_slo_s: float | None = None
    priority: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Tier:
        return cls(**d)


_DUR = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(ms|s)?\s*$")


def parse_duration(text: str) -> float:
    """``'100ms'`` -> 0.1, ``'2s'`` / ``'2'`` -> 2.0 (seconds)."""
    m = _DUR.match(text)
    if not m:
        raise TierSpecError(f"bad duration {text!r} (use e.g. 100ms or 2s)")
    value = float(m.group(1))
    return value / 1000.0 if m.group(2) == "ms" else value


def parse_tiers(spec: str) -> list[Tier]:
    """Parse a ``--tiers`` spec. Priorities default to the listing order (first = 0)."""
    if not spec or not spec.strip():
        raise TierSpecError("empty tier spec")
    tiers: list[Tier] = []
    for idx, part in enumerate(spec.split(",")):
        fields = [f.strip() for f in part.strip().split(":")]
        if len(fields) < 2 or not fields[0]:
            raise TierSpecError(f"tier {part!r}: expected name:share[:ttft=..][:tbt=..]")
        name = fields[0]
        if not re.fullmatch(r"[A-Za-z0-9_\-]+", name):
            raise TierSpecError(f"tier name {name!r}: use letters, digits, '_' or '-'")
        try:
            share = float(fields[1])
        except ValueError:
            raise TierSpecError(f"tier {name!r}: share {fields[1]!r} is not a number") from None
        if not 0.0 <= share <= 1.0:
            raise TierSpecError(f"tier {name!r}: share {share} outside [0, 1]")
        kw: dict[str, Any] = {"priority": idx}
        for f in fields[2:]:
            key, sep, val = f.partition("=")
            if not sep:
                raise TierSpecError(f"tier {name!r}: {f!r} is not key=value")
            if key == "ttft":
                kw["ttft_slo_s"] = parse_duration(val)
            elif key == "tbt":
                kw["tbt_slo_s"] = parse_duration(val)
            elif key == "priority":
                try:
                    kw["priority"] = int(val)
                except ValueError:
                    raise TierSpecError(f"tier {name!r}: priority {val!r} is not an int") from None
            else:
                raise TierSpecError(f"tier {name!r}: unknown key {key!r} (ttft, tbt, priority)")
        tiers.append(Tier(name=name, share=share, **kw))
    names = [t.name for t in tiers]
    if len(set(names)) != len(names):
        raise TierSpecError(f"duplicate tier names in {spec!r}")
    total = sum(t.share for t in tiers)
    if abs(total - 1.0) > 1e-6:
        raise TierSpecError(f"tier shares sum to {total:g}, not 1")
    return tiers


def default_tiers() -> list[Tier]:
    return parse_tiers(DEFAULT_TIERS_SPEC)


def assign_tiers(n: int, tiers: list[Tier], seed: int | None) -> np.ndarray:
    """Draw one tier name per request from the shares, on its own RNG stream.

    The stream is independent of arrivals and sampling (anchors-harness.md §6.3), so changing
    the rate never reshuffles who is paid.
    """
    rng = np.random.default_rng(None if seed is None else [seed, 3])
    shares = np.array([t.share for t in tiers], dtype=float)
    idx = rng.choice(len(tiers), size=n, p=shares / shares.sum())
    return np.array([t.name for t in tiers], dtype=object)[idx]
