"""Per-decode passes of the column policies' plans: each defined here in numpy, and run by
the optional C extension :mod:`harness.policies._planops` (``_planops.c``) where the install
built it.

Why (issue 13): WAIT, Nested WAIT, SLAI, MC-SF and RAD plan every step from the running
columns.
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

from harness.policies.columns import decoding_mask

try:
    from harness.policies import _planops
except ImportError:  # built without a compiler: the numpy versions below
    _planops = None  # type: ignore[assignment]

# every pass below; an extension built before one was added (an install not rebuilt since)
# is not used: the numpy set runs instead of a failing import
_PASSES = (
    "deadlines",
    "type_stages",
    "stage_groups",
    "stage_groups_hold",
    "segment_blocks",
    "keyed_reached",
    "keyed_sum",
    "ranked_order",
    "ascending",
    "oldest_decoding",
)
HAVE_C = _planops is not None and all(hasattr(_planops, name) for name in _PASSES)
USE_C = HAVE_C and os.environ.get("HARNESS_PURE_PLANS") != "1"


NOBODY = np.zeros(0, dtype=np.int64)  # stage_groups_hold: nobody entering (shared, never written)


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
    ahead: int,
) -> int:
    """Nested WAIT's stage groups (seed-wait.md §4.3), as bits: 1 when every group of the
    requests at ``positions`` at the same stage k has at most ``limit[min(k, len(limit) - 1)]``
    members (its segment's n_i), else 0 and nothing more. ``ahead`` asks for more (its
    bits): 1, bit 2 when each group also fits ``min_n[s(k), s(k + h - 1)]`` (the smallest n of
    the segments it reaches in the next h steps), s(x) = ``segment[min(x, len(segment) -
    1)]``, h the fewest tokens any of them has left: the quotas hold until the next finish
    (the steady check); 2, bit 4 when the groups hold until they empty
    (:func:`stage_groups_hold_py` with nobody entering: the promise's check). A request with
    no token left, among groups within their limits, is a ValueError when ``ahead`` asks."""
    stages = _at(output, positions)
    if not len(stages):
        return 1 | (2 if ahead & 1 else 0) | (4 if ahead & 2 else 0)
    counts = np.bincount(stages)
    lim = limit[np.minimum(np.arange(len(counts)), len(limit) - 1)]
    if (counts > lim).any():
        return 0
    if not ahead:
        return 1
    h = int((_at(max_tokens, positions) - stages).min())
    if h < 1:
        raise ValueError("stage_groups(): a request has no token left")
    bits = 1
    if ahead & 1 and counts_fit_ahead(counts, h, segment, min_n):
        bits |= 2
    if ahead & 2 and stage_groups_hold_py(output, max_tokens, positions, NOBODY, segment, min_n):
        bits |= 4
    return bits


def counts_fit_ahead(counts: np.ndarray, h: int, segment: np.ndarray, min_n: np.ndarray) -> bool:
    """Whether every stage group (``counts[k]`` requests at stage k), advancing together, fits
    ``min_n[s(k), s(k + h - 1)]`` over the next ``h`` steps, s(x) =
    ``segment[min(x, len(segment) - 1)]`` (Nested WAIT's steady check, seed-wait.md §4.3)."""
    ks = np.flatnonzero(counts)
    last = len(segment) - 1
    lo, hi = segment[np.minimum(ks, last)], segment[np.minimum(ks + h - 1, last)]
    return bool((counts[ks] <= min_n[lo, hi]).all())


def stage_groups_hold_py(
    output: np.ndarray,
    max_tokens: np.ndarray,
    positions: np.ndarray | None,
    entering: np.ndarray,
    segment: np.ndarray,
    min_n: np.ndarray,
) -> bool:
    """Whether Nested WAIT's stage groups keep within their segments' quotas at every later
    step while every request decodes one token a step and none joins (seed-wait.md §4.3; its
    ``then_steady`` promise). The requests at ``positions`` run this step at stage k =
    ``output`` with r = ``max_tokens - output`` tokens left (this step's included; at least 1:
    a ValueError otherwise); ``entering`` holds the ``max_tokens`` of those admitted this step
    (stage 0, their prefill emits the first token). Groups advance together and only shrink,
    so a group's j-th longest member (r_j tokens left) is in it at stages k+1 .. k+r_j-1 and
    needs ``min_n[s(k+1), s(k+r_j-1)] >= j``, s(x) = ``segment[min(x, len(segment) - 1)]``."""
    k = np.concatenate((_at(output, positions), np.zeros(len(entering), dtype=np.int64)))
    r = np.concatenate((_at(max_tokens, positions) - _at(output, positions), entering))
    if len(r) and r.min() < 1:
        raise ValueError("stage_groups_hold(): a request has no token left")
    order = np.lexsort((-r, k))  # by stage, the longest left first
    k, r = k[order], r[order]
    idx = np.arange(len(k))
    new = np.ones(len(k), dtype=bool)
    new[1:] = k[1:] != k[:-1]
    j = idx - np.maximum.accumulate(idx * new) + 1  # rank in its group, from 1
    later = r >= 2  # still running at the next step
    last = len(segment) - 1
    lo = segment[np.minimum(k[later] + 1, last)]
    hi = segment[np.minimum(k[later] + r[later] - 1, last)]
    return bool((j[later] <= min_n[lo, hi]).all())


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


def rank_decodes(decodes: np.ndarray, lst: np.ndarray, arrival: np.ndarray) -> np.ndarray:
    """SLAI's rank (seed-rad-slai.md §7 #6): the running positions ``decodes`` by ``(lst,
    arrival)``, stable (ties keep their order in ``decodes``); ``lst`` beside ``decodes``,
    ``arrival`` a running column."""
    if len(decodes) <= 1:
        return decodes
    return decodes[np.lexsort((arrival[decodes], lst))]


def ranked_order_py(
    decodes: np.ndarray,
    lst: np.ndarray,
    arrival: np.ndarray,
    part: np.ndarray,
    got: np.ndarray | int,
    nc: int,
    ncrit: int,
    nn: int,
    order: np.ndarray,
    tok: np.ndarray,
) -> None:
    """SLAI's run order (seed-rad-slai.md §5.5) into ``order``: the decodes ranked by
    ``(lst, arrival)``, stable (#6), their first ``nc`` (the critical ones that run), the
    partial prefills ``part``, then ``ranked[ncrit:ncrit + nn]`` (the non-critical ones that
    fit); ``tok``: 1 a decode, ``got`` a partial prefill (one int for each, or an array
    beside ``part``). ``order`` and ``tok`` hold exactly ``nc + len(part) + nn`` items."""
    ranked = rank_decodes(decodes, lst, arrival)
    order[:] = np.concatenate([ranked[:nc], part, ranked[ncrit : ncrit + nn]])
    tok[:] = 1
    tok[nc : nc + len(part)] = got


def ascending_py(values: np.ndarray) -> bool:
    """Whether the 1-D column ``values`` never decreases (a NaN: False): RAD's decode batch
    (seed-rad-slai.md §3.2, Algorithm 1 lines 6-8) is already in rad.py's oldest-first order
    when the running set's arrivals ascend."""
    return bool((values[:-1] <= values[1:]).all())


def oldest_decoding_py(
    prompt: np.ndarray,
    output: np.ndarray,
    computed: np.ndarray,
    arrival: np.ndarray,
    out: np.ndarray,
) -> int:
    """The decoding running requests (columns.decoding_mask) oldest first into ``out[:m]``,
    returning ``m``: RAD's decode batch (seed-rad-slai.md §3.2, Algorithm 1 lines 6-8) when
    the arrivals do not ascend; a stable sort, so equal arrivals keep the running order."""
    decoding = np.flatnonzero(decoding_mask(prompt, output, computed))
    m = len(decoding)
    out[:m] = decoding[np.argsort(arrival[decoding], kind="stable")]
    return m


if USE_C:
    deadlines = _planops.deadlines  # type: ignore[union-attr]
    type_stages = _planops.type_stages  # type: ignore[union-attr]
    stage_groups = _planops.stage_groups  # type: ignore[union-attr]
    stage_groups_hold = _planops.stage_groups_hold  # type: ignore[union-attr]
    segment_blocks = _planops.segment_blocks  # type: ignore[union-attr]
    keyed_reached = _planops.keyed_reached  # type: ignore[union-attr]
    keyed_sum = _planops.keyed_sum  # type: ignore[union-attr]
    ranked_order = _planops.ranked_order  # type: ignore[union-attr]
    ascending = _planops.ascending  # type: ignore[union-attr]
    oldest_decoding = _planops.oldest_decoding  # type: ignore[union-attr]
else:
    deadlines = deadlines_py
    type_stages = type_stages_py
    stage_groups = stage_groups_py
    stage_groups_hold = stage_groups_hold_py
    segment_blocks = segment_blocks_py
    keyed_reached = keyed_reached_py
    keyed_sum = keyed_sum_py
    ranked_order = ranked_order_py
    ascending = ascending_py
    oldest_decoding = oldest_decoding_py
