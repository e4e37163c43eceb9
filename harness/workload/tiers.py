"""Service tiers and their SLOs, parsed from ``--tiers`` specs.

Spec grammar: ``name:share[:ttft=DUR][:tbt=DUR][:priority=INT]`` joined by commas, e.g.
``paid:0.05:ttft=2s:tbt=100ms,free:0.95:ttft=10s:tbt=500ms``. Durations take ``ms``/``s``
suffixes (bare numbers are seconds). Shares must sum to 1 (within 1e-6).

Defaults follow the SLAI paper (seed-rad-slai.md §6.2): 5% paid with a 0.1 s TBT SLO, 95% free
with 0.5 s. The paper sets no TTFT SLO per tier; 2 s / 10 s are this project's defaults.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
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


# ------------------------------------------------------------------ tier mixes over time


@dataclass(frozen=True, slots=True)
class TierMix:
    """Tier shares that change over time: ``times[k]`` starts ``shares[k]`` (one row per
    step, columns in the order of the tier list). Built by :func:`parse_tier_mix`."""

    times: tuple[float, ...]
    shares: tuple[tuple[float, ...], ...]
    spec: str = ""

    def shares_at(self, t: np.ndarray) -> np.ndarray:
        """Share matrix (len(t) x tiers) in force at each time."""
        k = np.clip(np.searchsorted(np.asarray(self.times), t, side="right") - 1, 0, None)
        return np.asarray(self.shares)[k]


def parse_tier_mix(spec: str, tiers: list[Tier]) -> TierMix:
    """Parse ``--tier-mix``: ``TIME:name=share[/name=share...]`` steps joined by commas.

    Example over the default tiers: ``0:paid=0.05,60:paid=0.5,90:paid=0.05`` is a 30 s
    paid-tier burst (half the traffic paid) over a 5% base. Tiers a step does not name
    share what is left in proportion to their base shares. Before the first step (and when
    it is not at 0) the base shares apply.
    """
    names = [t.name for t in tiers]
    base = np.array([t.share for t in tiers], dtype=float)
    times: list[float] = [0.0]
    rows: list[tuple[float, ...]] = [tuple(base)]
    for part in spec.split(","):
        head, sep, body = part.strip().partition(":")
        if not sep or not body:
            raise TierSpecError(f"tier mix step {part!r}: expected TIME:name=share[/...]")
        try:
            t = float(head)
        except ValueError:
            raise TierSpecError(f"tier mix step {part!r}: time {head!r} is not a number") from None
        if t < 0 or t < times[-1] or (t == times[-1] and len(times) > 1):
            raise TierSpecError(f"tier mix step {part!r}: times must increase from 0")
        given: dict[str, float] = {}
        for item in body.split("/"):
            key, eq, val = item.partition("=")
            key = key.strip()
            if not eq or key not in names:
                raise TierSpecError(
                    f"tier mix step {part!r}: {item!r} is not name=share for a tier in {names}"
                )
            try:
                given[key] = float(val)
            except ValueError:
                raise TierSpecError(
                    f"tier mix step {part!r}: share {val!r} is not a number"
                ) from None
            if not 0.0 <= given[key] <= 1.0:
                raise TierSpecError(f"tier mix step {part!r}: share {val} outside [0, 1]")
        rest = 1.0 - sum(given.values())
        if rest < -1e-9:
            raise TierSpecError(f"tier mix step {part!r}: shares sum above 1")
        free = [i for i, n in enumerate(names) if n not in given]
        row = np.zeros(len(names))
        for i, n in enumerate(names):
            if n in given:
                row[i] = given[n]
        if free:
            w = base[free]
            row[free] = rest * (w / w.sum() if w.sum() > 0 else np.full(len(free), 1 / len(free)))
        elif abs(rest) > 1e-6:
            raise TierSpecError(f"tier mix step {part!r}: shares sum to {1 - rest:g}, not 1")
        if t == 0.0:
            rows[0] = tuple(row)
        else:
            times.append(t)
            rows.append(tuple(row))
    return TierMix(times=tuple(times), shares=tuple(rows), spec=spec)


def assign_tiers_at(
    arrival_s: np.ndarray, tiers: list[Tier], mix: TierMix | None, seed: int | None
) -> np.ndarray:
    """Tier per request with time-varying shares, on the same tier stream as
    :func:`assign_tiers` (one uniform draw per request index, inverted through the shares
    in force at its arrival), so with a constant mix both give identical tags."""
    n = len(arrival_s)
    if mix is None:
        return assign_tiers(n, tiers, seed)
    rng = np.random.default_rng(None if seed is None else [seed, 3])
    u = rng.random(n)
    cdf = np.cumsum(mix.shares_at(np.asarray(arrival_s, dtype=float)), axis=1)
    cdf /= cdf[:, -1:]
    idx = np.minimum((u[:, None] >= cdf).sum(axis=1), len(tiers) - 1)
    return np.array([t.name for t in tiers], dtype=object)[idx]


DEFAULT_TIER = "default"
"""Tier of a request that arrives at an engine without one."""

_DEFAULT_TIER_TABLE: dict[str, Tier] = {t.name: t for t in default_tiers()}


@dataclass(frozen=True, slots=True)
class RequestTags:
    """Tier, SLOs and length hint of one request, as an engine adapter sees them."""

    tier: str
    ttft_slo_s: float | None
    tbt_slo_s: float | None
    predicted_output_len: int | None


def _float_or_none(v: Any) -> float | None:
    try:
        return None if v is None else float(v)
    except (TypeError, ValueError):
        return None


def request_tags(extras: Mapping[str, Any]) -> RequestTags:
    """Read the tags the load generator sends (vLLM ``vllm_xargs`` / SGLang ``custom_params``:
    ``tier``, ``ttft_slo_ms``, ``tbt_slo_ms``, optional ``predicted_output_len``/``output_len``).

    Request-level SLOs win; else the default tier table's SLOs for that tier name; else none.
    """
    tier = extras.get("tier")
    name = str(tier) if tier not in (None, "") else DEFAULT_TIER
    known = _DEFAULT_TIER_TABLE.get(name)
    ttft = _float_or_none(extras.get("ttft_slo_ms"))
    tbt = _float_or_none(extras.get("tbt_slo_ms"))
    pred = extras.get("predicted_output_len", extras.get("output_len"))
    return RequestTags(
        tier=name,
        ttft_slo_s=ttft / 1000.0 if ttft is not None else (known.ttft_slo_s if known else None),
        tbt_slo_s=tbt / 1000.0 if tbt is not None else (known.tbt_slo_s if known else None),
        predicted_output_len=int(pred) if pred is not None else None,
    )
