"""Per-decode passes of the column policies' plans: each defined here in numpy, and run by
the optional C extension :mod:`harness.policies._planops` (``_planops.c``) where the install
built it.

Why (issue 13): WAIT, Nested WAIT, SLAI and MC-SF plan every step from the running columns.
Near capacity (100-250 decoding) each of these passes was 2-12 numpy calls of 1-5 µs each,
about half of WAIT's, Nested WAIT's and SLAI's planning time; in C each is one loop. The
numpy functions (``_py``) are the definition: the C ones give the same answers and write the
same values (``tests/policies/test_planops.py`` compares them on random columns, and whole
simulations under both). ``HARNESS_PURE_PLANS=1`` selects the numpy ones where the C ones
are built (A/B runs). The arrays are int64 / float64 and C-contiguous (the running columns of
every host); ``positions`` is an int64 array of running positions, or None for every running
request.
"""

from __future__ import annotations

import os

import numpy as np

try:
    from harness.policies import _planops
except ImportError:  # built without a compiler: the numpy versions below
    _planops = None  # type: ignore[assignment]

HAVE_C = _planops is not None
USE_C = HAVE_C and os.environ.get("HARNESS_PURE_PLANS") != "1"


def _at(column: np.ndarray, positions: np.ndarray | None) -> np.ndarray:
    return column if positions is None else column[positions]


def deadlines_py(
    key: np.ndarray,
    last: np.ndarray,
    tbt: np.ndarray,
    positions: np.ndarray | None,
    cache_e: np.ndarray,
    cache_v: np.ndarray,
    default_tbt: float,
    shift: float,
    now: float,
    out: np.ndarray,
) -> int:
    """SLAI's Eq. 8, ``(e + TBT_j) - shift`` (seed-rad-slai.md §5.2), of the requests at
    ``positions`` into ``out``, through the per-key cache of (token time it was computed for,
    value) (#3: computed once per produced token; NaN time: never): when no request has a
    new token time, every value is the cached one and nothing is written; else each new one
    is computed (``TBT_j`` NaN: ``default_tbt``) and every request's pair is stored. Returns
    how many values are ``<= now`` (critical)."""
    k = _at(key, positions)
    e = _at(last, positions)
    miss = cache_e[k] != e  # NaN (never computed) misses
    n, n_miss = len(k), int(np.count_nonzero(miss))
    if not n_miss:  # every decode deferred since its deadline was set
        value = cache_v[k]
    else:
        t = _at(tbt, positions)
        fresh = e + np.where(t == t, t, default_tbt) - shift
        value = fresh if n_miss == n else np.where(miss, fresh, cache_v[k])
        cache_e[k] = e
        cache_v[k] = value
    out[:n] = value
    return int(np.count_nonzero(value <= now))


def type_stages_py(
    output: np.ndarray,
    key: np.ndarray,
    positions: np.ndarray | None,
    type_of_key: np.ndarray,
    quota: np.ndarray,
) -> int:
    """1 when every group of the requests at ``positions`` with the same (stage = outputs so
    far, type = ``type_of_key[key]``) has at most ``quota[type]`` members (WAIT's per-stage
    quota n_j, seed-wait.md §3.3), 0 when some group has more, -1 when a type is not known
    yet (``type_of_key`` < 0: the caller records it and asks again)."""
    types = type_of_key[_at(key, positions)]
    if len(types) and types.min() < 0:
        return -1
    m = len(quota)
    counts = np.bincount(_at(output, positions) * m + types)
    limit = np.resize(quota, len(counts))  # group g = stage * m + type: quota[g % m]
    return int(not (counts > limit).any())


def stage_groups_py(
    output: np.ndarray,
    max_tokens: np.ndarray,
    positions: np.ndarray | None,
    limit: np.ndarray,
    segment: np.ndarray,
    min_n: np.ndarray,
    ahead: bool,
) -> int:
    """Nested WAIT's stage groups (seed-wait.md §4.3): 1 when every group of the requests at
    ``positions`` at the same stage k has at most ``limit[min(k, len(limit) - 1)]`` members
    (its segment's n_i), else 0; with ``ahead``, 3 when moreover each group also fits
    ``min_n[s(k), s(k + h - 1)]`` (the smallest n of the segments it reaches in the next h
    steps), s(x) = ``segment[min(x, len(segment) - 1)]``, h the fewest tokens any of them has
    left (at least 1: a ValueError otherwise): the quotas hold until the next finish."""
    stages = _at(output, positions)
    if not len(stages):
        return 3 if ahead else 1
    counts = np.bincount(stages)
    lim = limit[np.minimum(np.arange(len(counts)), len(limit) - 1)]
    if (counts > lim).any():
        return 0
    if not ahead:
        return 1
    h = int((_at(max_tokens, positions) - stages).min())
    if h < 1:
        raise ValueError("stage_groups(): a request has no token left")
    return 3 if counts_fit_ahead(counts, h, segment, min_n) else 1


def counts_fit_ahead(counts: np.ndarray, h: int, segment: np.ndarray, min_n: np.ndarray) -> bool:
    """Whether every stage group (``counts[k]`` requests at stage k), advancing together, fits
    ``min_n[s(k), s(k + h - 1)]`` over the next ``h`` steps, s(x) =
    ``segment[min(x, len(segment) - 1)]`` (Nested WAIT's steady check, seed-wait.md §4.3)."""
    ks = np.flatnonzero(counts)
    last = len(segment) - 1
    lo, hi = segment[np.minimum(ks, last)], segment[np.minimum(ks + h - 1, last)]
    return bool((counts[ks] <= min_n[lo, hi]).all())


def segment_blocks_py(
    prompt: np.ndarray, output: np.ndarray, segment: np.ndarray, edge: np.ndarray, block: int
) -> int:
    """KV blocks of every running request at the end of its current segment:
    ``ceil((prompt + edge[s(output)]) / block)`` summed (Nested WAIT's memory guard,
    seed-wait.md §9 #12)."""
    s = segment[np.minimum(output, len(segment) - 1)]
    return int((-(-(prompt + edge[s]) // block)).sum())


def keyed_reached_py(values: np.ndarray, key: np.ndarray, table: np.ndarray) -> int:
    """How many running requests have ``values >= table[key]`` (MC-SF: outputs that reached
    their estimates, seed-mcsf.md §7 REC a)."""
    return int(np.count_nonzero(values >= table[key]))


def keyed_sum_py(key: np.ndarray, table: np.ndarray) -> int:
    """The sum of ``table[key]`` over the running requests (MC-SF: their KV peaks)."""
    return int(table[key].sum())


if USE_C:
    deadlines = _planops.deadlines  # type: ignore[union-attr]
    type_stages = _planops.type_stages  # type: ignore[union-attr]
    stage_groups = _planops.stage_groups  # type: ignore[union-attr]
    segment_blocks = _planops.segment_blocks  # type: ignore[union-attr]
    keyed_reached = _planops.keyed_reached  # type: ignore[union-attr]
    keyed_sum = _planops.keyed_sum  # type: ignore[union-attr]
else:
    deadlines = deadlines_py
    type_stages = type_stages_py
    stage_groups = stage_groups_py
    segment_blocks = segment_blocks_py
    keyed_reached = keyed_reached_py
    keyed_sum = keyed_sum_py
