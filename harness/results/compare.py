"""Headline metrics with confidence intervals, and "B vs A" verdicts, for runs or groups of
repeated runs (one run per seed).

Why: "SLAI's paid-tier P99 TBT is 66 ms, Sarathi's 154 ms" means nothing until it is known
to be larger than the noise between runs (issue 20). Every headline metric gets a
bootstrap interval (:mod:`harness.results.confidence`: requests resampled as clusters of
their gaps, seeds resampled too when there are several), and every other group is compared
with the first (the base) at a stated confidence, paired by request when each seed's runs
replayed the same frozen trace (equal content hashes and request ids).

Verdicts are per metric and tier: ``better`` / ``worse`` when the interval of B − A excludes
0, else ``inconclusive`` with the factor of more data (requests per run, or seeds) that
would shrink the interval enough to decide, assuming the difference stays as measured.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import pandas as pd

from harness.results.confidence import (
    DEFAULT_LEVEL,
    DEFAULT_RESAMPLES,
    Difference,
    Samples,
    difference,
    interval,
)

ALL = "all"


class RunLike(Protocol):
    """What a comparison needs of a run (harness.report.data.RunView has it)."""

    label: str
    rm: pd.DataFrame
    itl_s: np.ndarray
    itl_grp: np.ndarray
    attained: np.ndarray | None
    has_slo: np.ndarray | None
    meta: dict[str, Any]

    @property
    def trace_hash(self) -> str | None: ...


@dataclass(frozen=True)
class Metric:
    key: str
    label: str
    stat: str  # mean | pNN
    unit: str
    higher_is_better: bool = False


HEADLINE = (
    Metric("p99_tbt", "P99 TBT (ITL)", "p99", "ms"),
    Metric("p99_ttft", "P99 TTFT", "p99", "ms"),
    Metric("median_ttft", "median TTFT", "p50", "ms"),
    Metric("slo_attainment", "SLO attainment", "mean", "%", higher_is_better=True),
)


@dataclass
class Group:
    """Runs of one configuration, one per seed, in seed order."""

    label: str
    runs: list[Any]


def groups_of(runs: Sequence[Any]) -> list[Group]:
    """Runs grouped by run.json ``repeat.group`` (seed order within a group, groups in order
    of first appearance); a run without one is its own group under its label."""
    from harness.results.repeats import group_key

    groups: dict[str, list[tuple[int, Any]]] = {}
    for i, rv in enumerate(runs):
        g, seed = group_key(rv.meta)
        key = g if g is not None else f"\0{i}"
        groups.setdefault(key, []).append((seed if seed is not None else i, rv))
    out = []
    for key, members in groups.items():
        members.sort(key=lambda x: x[0])
        label = key if not key.startswith("\0") else members[0][1].label
        out.append(Group(label, [rv for _, rv in members]))
    return out


def _order(rv: RunLike) -> tuple[np.ndarray, np.ndarray]:
    """(request ids sorted, rm row -> unit index): units are requests in id order, so the
    same request has the same unit in every run of a shared trace."""
    req = rv.rm["req"].to_numpy(dtype=np.int64)
    order = np.argsort(req, kind="stable")
    unit_of_row = np.empty(req.size, dtype=np.int64)
    unit_of_row[order] = np.arange(req.size)
    return req[order], unit_of_row


MAX_GAPS = 4_000_000  # above this many token gaps, intervals use a request subsample


def subsample_fraction(groups: Sequence[Group]) -> float:
    """Share of requests the intervals use: all, unless the largest group has more than
    ``MAX_GAPS`` gaps (a 100k-request run has 30M); then a deterministic subset by request
    id (the same requests in every run, so pairing holds) keeping about ``MAX_GAPS``."""
    gaps = max((sum(r.itl_s.size for r in g.runs) for g in groups), default=0)
    return 1.0 if gaps <= MAX_GAPS else MAX_GAPS / gaps


def _in_subsample(req: np.ndarray, frac: float) -> np.ndarray:
    if frac >= 1.0:
        return np.ones(req.size, dtype=bool)
    h = (req.astype(np.uint64) * np.uint64(2654435761)) % np.uint64(2**32)  # Knuth hash
    return h < np.uint64(int(frac * 2**32))


def samples(rv: RunLike, metric: str, tier: str, frac: float = 1.0) -> Samples:
    """One run's samples of ``metric`` for ``tier`` (``all``: every request), unit = request."""
    _, unit_of_row = _order(rv)
    n = len(rv.rm)
    tiers = rv.rm["tier"].to_numpy(dtype=object)
    in_tier = np.ones(n, dtype=bool) if tier == ALL else tiers == tier
    if frac < 1.0:
        in_tier &= _in_subsample(rv.rm["req"].to_numpy(dtype=np.int64), frac)
    if metric == "p99_tbt":
        v, g = _sorted_itl(rv, frac)  # sorted once per run; a tier's subset stays sorted
        keep = in_tier[g] if g.size else np.zeros(0, dtype=bool)
        return Samples(v[keep], unit_of_row[g[keep]], n)
    if metric in ("p99_ttft", "median_ttft"):
        v = rv.rm["ttft_s"].to_numpy(dtype=float) * 1000.0
        rows = np.flatnonzero(in_tier & np.isfinite(v))
        return Samples(v[rows], unit_of_row[rows], n)
    if metric == "slo_attainment":
        if rv.attained is None or rv.has_slo is None:
            return Samples(np.zeros(0), np.zeros(0, dtype=np.int64), n)
        rows = np.flatnonzero(in_tier & rv.has_slo)
        return Samples(rv.attained[rows].astype(float), unit_of_row[rows], n)
    raise ValueError(f"unknown metric {metric!r}")


def _sorted_itl(rv: RunLike, frac: float) -> tuple[np.ndarray, np.ndarray]:
    """(ITL in ms ascending, rm row of each) of the subsampled requests, cached on the run
    (sorting 30M gaps is the expensive part: subsample first)."""
    cache = getattr(rv, "_itl_sorted", None)
    if not isinstance(cache, dict):
        cache = {}
        with contextlib.suppress(AttributeError):  # a frozen object: no cache
            rv._itl_sorted = cache  # type: ignore[attr-defined]
    if frac not in cache:
        v, g = rv.itl_s, rv.itl_grp
        if frac < 1.0 and g.size:
            keep = _in_subsample(rv.rm["req"].to_numpy(dtype=np.int64), frac)[g]
            v, g = v[keep], g[keep]
        order = np.argsort(v, kind="stable")
        cache[frac] = (v[order] * 1000.0, g[order])
    return cache[frac]


def _weights(g: Group, n_boot: int, seed: int) -> np.ndarray:
    """The group's resamples, drawn once and shared by every metric and tier."""
    from harness.results.confidence import resample_weights

    sizes = [len(rv.rm) for rv in g.runs]
    return resample_weights(sizes, n_boot, np.random.default_rng(seed))


def _paired(a: Group, b: Group) -> bool:
    """Same number of seeds, and seed i of both replayed the same trace (hash and ids)."""
    if len(a.runs) != len(b.runs):
        return False
    for ra, rb in zip(a.runs, b.runs, strict=True):
        h = ra.trace_hash
        if not h or h != rb.trace_hash:
            return False
        if not np.array_equal(_order(ra)[0], _order(rb)[0]):
            return False
    return True


def _resamples(groups: Sequence[Group]) -> int:
    """Fewer resamples for very large runs (at least 200): the weights stay under ~40 MB."""
    units = max((sum(len(r.rm) for r in g.runs) for g in groups), default=1)
    return int(min(DEFAULT_RESAMPLES, max(200, 10_000_000 // max(units, 1))))


def tiers_of(groups: Sequence[Group]) -> list[str]:
    names: list[str] = []
    for g in groups:
        for rv in g.runs:
            for t in getattr(rv, "tiers", None) or {}:  # run.json order first (paid, free)
                if str(t) not in names:
                    names.append(str(t))
            for t in pd.unique(rv.rm["tier"].astype(object)):
                if t is not None and str(t) not in names:
                    names.append(str(t))
    return names


def compare_groups(
    groups: Sequence[Group], *, level: float = DEFAULT_LEVEL, seed: int = 0
) -> dict[str, Any]:
    """Intervals of every headline metric per group and tier, and verdicts of every other
    group against the first. JSON-ready."""
    n_boot = _resamples(groups)
    frac = subsample_fraction(groups)
    tiers = [ALL] + tiers_of(groups)
    intervals: dict[str, dict[str, dict[str, Any]]] = {}
    weights = [_weights(g, n_boot, seed + i) for i, g in enumerate(groups)]
    for g, w in zip(groups, weights, strict=True):
        per: dict[str, dict[str, Any]] = {}
        for m in HEADLINE:
            for t in tiers:
                parts = [samples(rv, m.key, t, frac) for rv in g.runs]
                if sum(p.values.size for p in parts) == 0:
                    continue
                iv = interval(parts, m.stat, level=level, weights=w)
                per.setdefault(m.key, {})[t] = iv.as_dict()
        intervals[g.label] = per
    verdicts = []
    base = groups[0] if groups else None
    for j, other in enumerate(groups[1:], start=1):
        assert base is not None
        paired = _paired(base, other)
        for m in HEADLINE:
            for t in tiers:
                pa = [samples(rv, m.key, t, frac) for rv in base.runs]
                pb = [samples(rv, m.key, t, frac) for rv in other.runs]
                if not sum(p.values.size for p in pa) or not sum(p.values.size for p in pb):
                    continue
                d = difference(
                    pa,
                    pb,
                    m.stat,
                    paired=paired,
                    higher_is_better=m.higher_is_better,
                    level=level,
                    weights=(weights[0], weights[j]),
                )
                row = {"a": base.label, "b": other.label, "metric": m.key, "tier": t}
                row.update(d.as_dict())
                row["sentence"] = verdict_sentence(base.label, other.label, m, t, d, groups)
                verdicts.append(row)
    return {
        "level": level,
        "resamples": n_boot,
        "request_fraction": frac,
        "seeds": {g.label: len(g.runs) for g in groups},
        "tiers": tiers,
        "metrics": [m.__dict__ for m in HEADLINE],
        "intervals": intervals,
        "verdicts": verdicts,
    }


def _fmt(v: float, m: Metric) -> str:
    if not math.isfinite(v):
        return "–"
    if m.unit == "%":
        return f"{100 * v:.1f}%"
    return f"{v:,.0f} ms" if abs(v) >= 100 else f"{v:,.1f} ms"


def _fmt_diff(v: float, m: Metric) -> str:
    if not math.isfinite(v):
        return "–"
    if m.unit == "%":
        return f"{100 * v:+.1f} pt"
    return f"{v:+,.1f} ms"


def verdict_sentence(
    a: str, b: str, m: Metric, tier: str, d: Difference, groups: Sequence[Group]
) -> str:
    """One sentence a reader can quote: what was compared, the numbers, the confidence, and
    for an inconclusive verdict the run length that would decide it."""
    who = "all tiers" if tier == ALL else f"{tier} tier"
    conf = f"{round(100 * d.level)}%"
    how = "paired by request" if d.paired else "unpaired"
    seeds = f", {d.strata} seeds" if d.strata > 1 else ""
    head = (
        f"{m.label}, {who}: {b} {_fmt(d.b, m)} vs {a} {_fmt(d.a, m)} "
        f"(difference {_fmt_diff(d.diff, m)}, {conf} CI [{_fmt_diff(d.lo, m)}, "
        f"{_fmt_diff(d.hi, m)}], {how}{seeds})"
    )
    v = d.verdict
    if v == "better":
        return f"{head}: {b} beats {a} with {conf} confidence."
    if v == "worse":
        return f"{head}: {b} does not beat {a}; it is worse with {conf} confidence."
    need = d.runs_needed()
    if need is None:
        return f"{head}: no difference at {conf} confidence (the two agree within noise)."
    n_req = max((len(r.rm) for g in groups for r in g.runs), default=0)
    k = max((len(g.runs) for g in groups), default=1)
    factor = math.ceil(need * 10) / 10
    if factor > 50:
        return (
            f"{head}: inconclusive at {conf}; the difference is too small for any practical "
            f"run length to decide (it needs ~{factor:.0f}x the data)."
        )
    more = f"about {factor:g}x the data: ~{math.ceil(factor * n_req):,} requests per run"
    if k > 1:
        more += f" or ~{math.ceil(factor * k)} seeds"
    return f"{head}: inconclusive at {conf}; {more} would decide it if the gap holds."
