"""vLLM-compatible request metrics, vectorised over a run's requests and chunks frames.

Every formula follows ``vllm bench serve`` (anchors-harness.md §6.1 / §6.2,
``serve.py:calculate_metrics`` and ``lib/endpoint_request_func.py``); extras carry our own
names (§6.4). Times in the frames are seconds on the run clock; statistics are reported in ms.

Per request i (successful ones only; §6.1):
  - ``start`` = ``send_s`` (vLLM ``start_time``: just before POST, after the concurrency gate)
  - ``ttft``  = first chunk time − start
  - ``itl``   = gaps between consecutive chunks, one per chunk after the first (§6.1: no extra
    entries for multi-token chunks)
  - ``e2el``  = last chunk time − start (vLLM ``latency``)
  - ``tpot``  = (e2el − ttft) / (output_tokens − 1), only when output_tokens > 1; counts as 0
    for goodput otherwise (§6.2)
  - ``success`` = the row's ``success`` flag AND at least one chunk (HTTP 200 and a
    ``choices`` chunk, §6.1)

Chunk rows are the ``choices``-bearing SSE messages (chunks.parquet); simulations write one
row per step that emitted tokens.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from harness.results.chunklog import ChunkArrays, dense_ids, group_order, positions

try:  # the optional C selection (setup.py); without it numpy's partition does the same
    from harness.results import _orderstats
except ImportError:  # pragma: no cover - an install without a compiler
    _orderstats = None  # type: ignore[assignment]
if os.environ.get("HARNESS_PURE_SELECT") == "1":  # numpy's partition where C is built (A/B)
    _orderstats = None  # type: ignore[assignment]

#: Percentiles emitted for every latency metric (a superset of vLLM's default ``99``; §6.2).
PERCENTILES: tuple[float, ...] = (50, 90, 95, 99, 99.9)
#: The four vLLM latency metrics, in vLLM's order.
LATENCY_METRICS: tuple[str, ...] = ("ttft", "tpot", "itl", "e2el")
#: Default send-lag p99 above which a run "did not keep its schedule" (design.md, loadgen).
DEFAULT_SEND_LAG_THRESHOLD_MS = 10.0
GOODPUT_KEYS = ("ttft", "tpot", "e2el")
_SLICE = 1 << 20  # rows per slice of the chunked passes (bounded temporaries at 30M rows)
_SELECT_MIN = 1 << 16  # samples from which the C selection beats numpy's partition
_PAIRWISE_PIECE = 1 << 15  # values a piece of mean_std's deviations (256 KB: in cache)


def percentile_key(p: float, metric: str) -> str:
    """vLLM's key spelling: ``p99_itl_ms``, ``p99.9_itl_ms`` (no ``.0`` for integers)."""
    word = str(int(p)) if int(p) == p else str(p)
    return f"p{word}_{metric}_ms"


def mean_std(v: np.ndarray) -> tuple[float, float]:
    """``(np.mean(v), np.std(v))`` of a 1-D float64 array, bit for bit: numpy 2's ``_mean``
    and ``_var`` steps (one pairwise sum for the mean, the squared deviations' pairwise sum
    over n, its square root), the mean summed once. The deviations are made and summed a
    piece at a time in one cache-sized buffer (:func:`_pairwise_sum`: numpy's own halving,
    so the same sum). Why: at 15M ITL samples an N-row temporary costs page faults and three
    trips through memory; a cache-sized piece costs one read of ``v``."""
    n = np.intp(v.size)
    total = np.add.reduce(v, keepdims=True)
    mean = total[0].dtype.type(total[0] / n)  # np.mean's scalar path
    arrmean = np.true_divide(total, n, out=total, casting="unsafe", subok=False)
    buf = np.empty(min(v.size, _PAIRWISE_PIECE))

    def squares(a: int, b: int) -> np.floating:
        x = np.subtract(v[a:b], arrmean, out=buf[: b - a])
        return np.add.reduce(np.square(x, out=x))

    ss = _pairwise_sum(squares, 0, v.size)
    var = ss.dtype.type(ss / n)
    return mean, var.dtype.type(np.sqrt(var))


def _pairwise_sum(piece_sum: Callable[[int, int], np.floating], a: int, b: int) -> np.floating:
    """``np.add.reduce`` of the values ``[a, b)`` whose pieces ``piece_sum`` reduces: numpy's
    pairwise sum of a contiguous float64 array (``pairwise_sum_DOUBLE``) halves it at a
    multiple of 8 until a block of 128, so each half down to a piece is reduced by the same
    tree as a reduce of that half alone, and the halves' sums add in the same order."""
    n = b - a
    if n <= _PAIRWISE_PIECE:
        return piece_sum(a, b)
    half = n // 2
    half -= half % 8
    return _pairwise_sum(piece_sum, a, a + half) + _pairwise_sum(piece_sum, a + half, b)


def percentiles(v: np.ndarray, pcts: Sequence[float], overwrite: bool = False) -> np.ndarray:
    """``np.percentile(v, pcts)`` (its default linear method) of a 1-D float64 array, bit for
    bit. numpy's own steps (``_quantile``: virtual index ``(n-1)q``, its floor and the next
    index, the last one past the end, ``_lerp``) over order statistics that the C radix
    selection (:mod:`harness.results._orderstats`) finds in two or three passes that only read
    ``v``, where it is built and ``v`` is large: ~3.5x quicker than numpy's partition at 15M
    ITL samples. Else, or when it declines (a NaN or a negative zero; more equal values than a
    copy of an eighth of ``v`` holds), numpy's percentile (``overwrite``: in place, as its
    ``overwrite_input``)."""
    n = v.size
    q = np.true_divide(pcts, 100)
    if (
        _orderstats is None
        or n < _SELECT_MIN
        or v.dtype != np.float64
        or v.ndim != 1
        or not v.flags.c_contiguous
        or not v.flags.aligned
        or q.ndim != 1
        or not 1 <= q.size <= 32
        or not bool(((q >= 0) & (q <= 1)).all())
    ):
        return np.percentile(v, pcts, overwrite_input=overwrite)
    vi = (n - 1) * q  # numpy's 'linear' get_virtual_index
    prev = np.floor(vi)
    nxt = np.add(prev, 1)
    above = vi >= n - 1  # numpy's _get_indexes: the last value, both sides
    prev[above] = -1
    nxt[above] = -1
    prev_i, next_i = prev.astype(np.intp), nxt.astype(np.intp)
    ranks = np.unique(np.concatenate((prev_i, next_i)) % n).astype(np.int64)
    got = _orderstats.select_ranks(v, ranks, max(n >> 3, 1024))  # the copy's bound
    if got is None:
        return np.percentile(v, pcts, overwrite_input=overwrite)
    at = np.array(got)
    a, b = at[np.searchsorted(ranks, prev_i % n)], at[np.searchsorted(ranks, next_i % n)]
    gamma = np.asanyarray(np.asanyarray(vi - prev_i), dtype=vi.dtype)  # numpy's _get_gamma
    diff_b_a = b - a  # numpy's _lerp
    out = np.add(a, diff_b_a * gamma)
    np.subtract(
        b,
        diff_b_a * (1 - gamma),
        out=out,
        where=gamma >= 0.5,
        casting="unsafe",
        dtype=type(out.dtype),
    )
    return out


def latency_stats(
    values_s: np.ndarray,
    metric: str,
    overwrite: bool = False,
    moments: tuple[float, float] | None = None,
) -> dict[str, float]:
    """mean/median/std (ddof=0)/percentiles in ms with vLLM key names; empty gives 0 (vLLM
    computes ``np.mean(x or 0)``), percentiles and median by ``np.percentile`` (linear: vLLM's
    ``np.percentile`` / ``np.median``). ``overwrite``: the caller's array may be reordered
    in place (no copy of 15M pooled ITL samples; numpy's multi-kth partition, ~8x faster
    than a sort there). ``moments``: :func:`mean_std`'s result when the caller has it (its
    deviations in a buffer of the caller's)."""
    v = np.asarray(values_s, dtype=np.float64)
    if v.size == 0:
        v = np.zeros(1)
    # mean and std first, in the caller's order (pairwise sums): the partition reorders v
    mean, std = mean_std(v) if moments is None else moments
    # vLLM's np.median(v) is np.percentile(v, 50) for finite samples (both average the middle pair)
    pcts = percentiles(v, (50, *PERCENTILES), overwrite)
    out = {
        f"mean_{metric}_ms": float(mean * 1000.0),
        f"median_{metric}_ms": float(pcts[0] * 1000.0),
        f"std_{metric}_ms": float(std * 1000.0),
    }
    pcts = pcts[1:]
    for p, q in zip(PERCENTILES, pcts, strict=True):
        out[percentile_key(p, metric)] = float(q * 1000.0)
    return out


def parse_goodput(items: Iterable[str] | str | None) -> dict[str, float] | None:
    """Parse vLLM's ``--goodput ttft:MS tpot:MS e2el:MS`` into ``{"ttft": ms, ...}``.

    Raises ValueError with a one-line message on a bad item (unknown key, not a number,
    negative)."""
    if items is None:
        return None
    if isinstance(items, str):
        items = items.replace(",", " ").split()
    out: dict[str, float] = {}
    for item in items:
        key, sep, val = item.partition(":")
        key = key.strip().lower()
        if not sep or key not in GOODPUT_KEYS:
            raise ValueError(
                f"bad goodput item {item!r}: use ttft:MS, tpot:MS or e2el:MS (milliseconds)"
            )
        try:
            ms = float(val)
        except ValueError:
            raise ValueError(f"bad goodput item {item!r}: {val!r} is not a number") from None
        if not ms >= 0:
            raise ValueError(f"bad goodput item {item!r}: the SLO must be >= 0 ms")
        out[key] = ms
    return out or None


# --------------------------------------------------------------------------------------------
@dataclass
class ChunkView:
    """Chunks of the successful requests, grouped by request and time-ordered within.

    ``grp[k]`` is the position (in the per-request frame) of chunk k's request; ``start[g]``
    / ``end[g]`` delimit request g's chunks (end exclusive; empty when it has none).
    """

    t: np.ndarray  # float64 chunk times
    tokens: np.ndarray  # int64 tokens per chunk
    grp: np.ndarray  # int64 request position
    start: np.ndarray
    end: np.ndarray
    _single: bool | None = field(default=None, init=False, repr=False)

    def single_token(self) -> bool:
        """True when every chunk carries exactly one token (then token-level extras equal
        their chunk-level counterparts and need no extra pass)."""
        if self._single is None:
            self._single = bool(self.tokens.size == 0 or (self.tokens == 1).all())
        return self._single

    @property
    def first_in_group(self) -> np.ndarray:
        """True for the first chunk of each request (where no ITL sample exists)."""
        f = np.ones(self.t.size, dtype=bool)
        if self.t.size > 1:
            f[1:] = self.grp[1:] != self.grp[:-1]
        return f

    def itl_runs(self) -> ItlRuns:
        """:meth:`itl`'s samples, with their requests as runs instead of one position a
        sample (memory: 4 bytes a sample less at the summary's peak). For views whose
        ``start``/``end`` index their own rows (:func:`group_chunks`'), where each
        request's chunks are one stretch: a sample follows every row but a stretch's first."""
        cnt = self.end - self.start
        g = np.flatnonzero(cnt >= 2)
        g = g[np.argsort(self.start[g], kind="stable")]
        lens = cnt[g] - 1
        if self.t.size < 2:
            return ItlRuns(np.zeros(0), g[:0], lens[:0])
        same = np.ones(self.t.size - 1, dtype=bool)
        heads = self.start[cnt > 0]
        same[heads[heads > 0] - 1] = False
        gaps, _ = _gaps_where(self.t, same)
        assert gaps.size == int(lens.sum())  # the stretches cover the rows (group_chunks')
        return ItlRuns(gaps, g, lens)

    def itl(self) -> tuple[np.ndarray, np.ndarray]:
        """All ITL samples (s) and the request position of each (vLLM §6.1)."""
        if self.t.size < 2:
            return np.zeros(0), np.zeros(0, dtype=np.int64)
        gaps, grp = _gaps_where(self.t, self.grp[1:] == self.grp[:-1], self.grp)
        assert grp is not None
        return gaps, grp


def masked_into(values: np.ndarray, mask: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``values[mask]`` written into the front of ``out`` (returned: that front), slice by
    slice as :func:`_gaps_where` fills (``np.compress`` with ``out`` builds an index array
    and a buffered copy: two N-row temporaries)."""
    at = 0
    for a in range(0, values.size, _SLICE):
        s = values[a : a + _SLICE][mask[a : a + _SLICE]]
        out[at : at + s.size] = s
        at += s.size
    return out[:at]


def _gaps_where(
    t: np.ndarray, same: np.ndarray, grp: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray | None]:
    """``t[i + 1] - t[i]`` where ``same[i]`` (and ``grp[i + 1]`` there, when given), filled
    slice by slice: no N-row temporaries at the summary's memory peak."""
    m = int(np.count_nonzero(same))
    gaps = np.empty(m)
    out = None if grp is None else np.empty(m, dtype=grp.dtype)
    at = 0
    for a in range(0, same.size, _SLICE):
        s = same[a : a + _SLICE]
        k = int(np.count_nonzero(s))
        b = a + s.size
        gaps[at : at + k] = (t[a + 1 : b + 1] - t[a:b])[s]
        if out is not None:
            out[at : at + k] = grp[a + 1 : b + 1][s]
        at += k
    return gaps, out


@dataclass
class ItlRuns:
    """A grouped view's ITL samples (:meth:`ChunkView.itl_runs`) in runs, one per request
    with two chunks or more: ``pos[i]`` the i-th run's request position, ``lens[i]`` its
    samples (``gaps`` holds them back to back, in the view's order)."""

    gaps: np.ndarray
    pos: np.ndarray
    lens: np.ndarray

    def sample_values(self, per_request: np.ndarray) -> np.ndarray:
        """``per_request[request of each sample]`` (e.g. a tier code a sample)."""
        return np.repeat(per_request[self.pos], self.lens)


def group_chunks(
    chunks: pd.DataFrame | ChunkArrays, req_ids: np.ndarray, keep: np.ndarray
) -> ChunkView:
    """Group chunk rows by request position, keeping only requests where ``keep`` is True.

    Rows are re-sorted (stable, by request then time) only when they are not already in
    contiguous time-ordered groups (:func:`chunklog.group_order`); a writer that adds each
    request's chunks at once (the load generator) skips the sort. ``chunks`` as
    :class:`ChunkArrays` (the summary's compact path) gives an int32 ``grp`` and, when every
    chunk carries one token, a zero-memory ``tokens`` view; a frame gives int64 arrays.
    """
    n = req_ids.size
    compact = isinstance(chunks, ChunkArrays)
    ca = chunks if compact else ChunkArrays.from_frame(chunks)
    if len(ca) == 0:
        z = np.zeros(0)
        zi = np.zeros(0, dtype=np.int64)
        return ChunkView(z, zi, zi, np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64))
    t, tok = ca.t, ca.tokens
    if compact and keep.all() and dense_ids(req_ids, ca.req):
        pos = ca.req  # ids 0..n-1, every row's among them: each id is its position
    else:
        pos = positions(ca.req, req_ids)
        sel = pos >= 0
        sel &= keep[np.where(sel, pos, 0)]
        if not sel.all():
            pos, t = pos[sel], t[sel]
            tok = None if tok is None else tok[sel]
        del sel
    start = np.zeros(n, dtype=np.int64)
    end = np.zeros(n, dtype=np.int64)
    if pos.size == 0:
        zi = np.zeros(0, dtype=np.int64)
        return ChunkView(t, zi if tok is None else tok, zi, start, end)
    # a subset of rows grouped by request is grouped too: no check when the caller's are
    order = None if compact and ca.grouped else group_order(pos, t)
    if order is not None:
        pos, t = pos[order], t[order]
        tok = None if tok is None else tok[order]
        del order
    heads = np.flatnonzero(np.r_[True, pos[1:] != pos[:-1]])
    # Groups need not ascend: every consumer works on adjacency or on ``grp``.
    lens = np.diff(np.r_[heads, pos.size])
    start[pos[heads]] = heads
    end[pos[heads]] = heads + lens
    if not compact:
        pos = pos.astype(np.int64)
    if tok is None:
        cv = ChunkView(t, np.broadcast_to(np.int64(1), t.shape), pos, start, end)
        cv._single = True
        return cv
    return ChunkView(t, tok, pos, start, end)


def _col(df: pd.DataFrame, name: str, dtype: type = np.float64, fill: float = np.nan) -> np.ndarray:
    if name not in df.columns:
        return np.full(len(df), fill, dtype=dtype)
    return pd.to_numeric(df[name], errors="coerce").to_numpy(dtype=np.float64, na_value=fill)


def success_flag(requests: pd.DataFrame) -> np.ndarray:
    """The rows' ``success`` column as bools (null: False); whose chunks the metrics read."""
    if "success" not in requests.columns:
        return np.zeros(len(requests), dtype=bool)
    return requests["success"].astype("boolean").fillna(False).to_numpy(dtype=bool)


def request_metrics(
    requests: pd.DataFrame, chunks: pd.DataFrame | ChunkArrays
) -> tuple[pd.DataFrame, ChunkView]:
    """Per-request derived fields (one row per request, in the requests frame's order).

    Columns: ``req, tier, success, start_s, ttft_s, e2el_s, tpot_s`` (NaN unless success and
    output_tokens > 1), ``tpot_good_s`` (tpot with 0 for output_tokens <= 1, goodput's
    view), ``prompt_tokens, output_tokens`` (0 for failures, like vLLM's
    ``actual_output_lens``), ``num_chunks, end_s, error_kind``. Returns the chunk view of the
    successful requests as well (ITL and token-level extras reuse it).
    """
    n = len(requests)
    req_ids = requests["req"].to_numpy(dtype=np.int64) if n else np.zeros(0, dtype=np.int64)
    flag = success_flag(requests)
    cv = group_chunks(chunks, req_ids, flag)
    counts = cv.end - cv.start
    has = counts > 0
    first = np.full(n, np.nan)
    last = np.full(n, np.nan)
    first[has] = cv.t[cv.start[has]]
    last[has] = cv.t[cv.end[has] - 1]
    # Without chunk rows (chunks not loaded / not written) fall back to the request columns.
    no_rows = ~has & flag
    if no_rows.any():
        fc = _col(requests, "first_chunk_s")
        lc = _col(requests, "last_chunk_s")
        nc = _col(requests, "num_chunks", fill=0.0)
        first[no_rows], last[no_rows] = fc[no_rows], lc[no_rows]
        counts = np.where(no_rows & (nc > 0), nc, counts).astype(np.int64)
    success = flag & np.isfinite(first)

    # vLLM's start_time is the send time; producers that have no separate send step
    # (simulations) may leave it null: fall back to the release, then the target time.
    send = _col(requests, "send_s")
    for alt in ("arrival_s", "target_s"):
        send = np.where(np.isfinite(send), send, _col(requests, alt))
    ttft = np.where(success, first - send, np.nan)
    e2el = np.where(success, last - send, np.nan)

    out_tok = _col(requests, "output_tokens")
    # vLLM: usage.completion_tokens, else re-count (here: sum of chunk tokens), else 1.
    if cv.single_token():  # one token a chunk: the sum is the count (no N-row weights copy)
        chunk_tok = (cv.end - cv.start).astype(np.float64)
    else:
        chunk_tok = np.bincount(cv.grp, weights=cv.tokens, minlength=n) if n else np.zeros(0)
    missing = ~np.isfinite(out_tok) | (out_tok <= 0)
    out_tok = np.where(missing, np.where(chunk_tok > 0, chunk_tok, 1.0), out_tok)
    out_tok = np.where(success, out_tok, 0.0).astype(np.int64)

    prompt = _col(requests, "prompt_tokens")
    prompt = np.where(np.isfinite(prompt), prompt, _col(requests, "prompt_len", fill=0.0))
    prompt = np.where(np.isfinite(prompt), prompt, 0.0).astype(np.int64)

    multi = success & (out_tok > 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(multi, (e2el - ttft) / np.maximum(out_tok - 1, 1), np.nan)
    tpot_good = np.where(success, np.where(multi, tpot, 0.0), np.nan)

    end = np.fmax(np.fmax(last, send), _col(requests, "arrival_s"))
    tier = requests["tier"].to_numpy(dtype=object) if "tier" in requests.columns else None
    frame = pd.DataFrame(
        {
            "req": req_ids,
            "tier": tier if tier is not None else np.full(n, None, dtype=object),
            "success": success,
            "start_s": send,
            "ttft_s": ttft,
            "e2el_s": e2el,
            "tpot_s": tpot,
            "tpot_good_s": tpot_good,
            "prompt_tokens": np.where(success, prompt, 0),
            "output_tokens": out_tok,
            "num_chunks": np.where(success, counts, 0),
            "end_s": end,
            "error_kind": (
                requests["error_kind"].to_numpy(dtype=object)
                if "error_kind" in requests.columns
                else np.full(n, None, dtype=object)
            ),
        }
    )
    return frame, cv


def good_mask(rm: pd.DataFrame, goodput: Mapping[str, float] | None) -> np.ndarray | None:
    """vLLM goodput: success and every configured SLO met (``metric <= slo``, ms on the CLI;
    TPOT counts 0 for output_tokens <= 1; failed requests are never good). None without SLOs."""
    if not goodput:
        return None
    good = rm["success"].to_numpy(dtype=bool).copy()
    cols = {"ttft": "ttft_s", "tpot": "tpot_good_s", "e2el": "e2el_s"}
    for key, ms in goodput.items():
        v = rm[cols[key]].to_numpy(dtype=np.float64)
        with np.errstate(invalid="ignore"):
            good &= v <= ms / 1000.0
    return good


def _first_start(cv: ChunkView, rm: pd.DataFrame) -> float:
    """Bucket origin: the earliest successful start (vLLM ``min_start_time``)."""
    start = rm["start_s"].to_numpy()[rm["success"].to_numpy(dtype=bool)]
    start = start[np.isfinite(start)]
    return float(start.min()) if start.size else float(cv.t.min())


def _buckets(t: np.ndarray, t0: float) -> np.ndarray:
    """1-s bucket index of each time from ``t0`` (vLLM ``int(t - min_start_time)``)."""
    d = t - t0
    if d.size and d.min() < 0:
        d = d[d >= 0]
    return d.astype(np.int64)  # truncation == floor for d >= 0


def kept_times(cv: ChunkView, rows: np.ndarray | None) -> Iterator[np.ndarray]:
    """``cv.t`` slice by slice, only the chunks of requests where ``rows`` is True (all when
    None): the chunk times of a subset without an N-row copy."""
    for a in range(0, cv.t.size, _SLICE):
        t = cv.t[a : a + _SLICE]
        yield t if rows is None else t[rows[cv.grp[a : a + _SLICE]]]


def stretch_times(cv: ChunkView, rows: np.ndarray) -> np.ndarray:
    """The chunk times of the requests where ``rows`` is True, for views whose ``start`` /
    ``end`` index their own rows (:func:`group_chunks`'): each request's chunks are one
    stretch, so only those rows are read (:func:`kept_times` gathers the mask through every
    row's request: ~0.09 s of a 15M-row LMSYS summary here for a tier of 5% of the rows). The
    same times, in request order (for counting)."""
    g = np.flatnonzero(rows & (cv.end > cv.start))
    lens = cv.end[g] - cv.start[g]
    if not lens.size:
        return np.zeros(0)
    # row of each kept chunk: its stretch's start, less the stretch's offset in the result
    # (_heads), plus its place in the result
    return cv.t[np.repeat(cv.start[g] - _heads(lens), lens) + np.arange(int(lens.sum()))]


def bucket_counts(
    cv: ChunkView, t0: float, rows: np.ndarray | None, times: Iterable[np.ndarray] | None = None
) -> np.ndarray:
    """Chunks per 1-s bucket (:func:`_buckets`), counted slice by slice (of ``times`` when
    given: the kept times already taken out)."""
    total = np.zeros(0, dtype=np.int64)
    for t in kept_times(cv, rows) if times is None else times:
        c = np.bincount(_buckets(t, t0))
        if c.size > total.size:
            c[: total.size] += total
            total = c
        else:
            total[: c.size] += c
    return total


def bucket_origin(cv: ChunkView, rm: pd.DataFrame, rows: np.ndarray | None = None) -> float | None:
    """:func:`max_output_tokens_per_s`'s bucket origin: the earliest successful start of
    ``rm``'s requests, else their earliest chunk (None: no chunk to count)."""
    if rows is None and cv.t.size == 0:
        return None
    start = rm["start_s"].to_numpy()[rm["success"].to_numpy(dtype=bool)]
    start = start[np.isfinite(start)]
    if start.size:
        return float(start.min())
    # vLLM's min_start_time falls back to the earliest chunk (_first_start)
    mins = [float(t.min()) for t in kept_times(cv, rows) if t.size]
    return min(mins) if mins else None


def output_buckets(
    cv: ChunkView, rm: pd.DataFrame, rows: np.ndarray | None = None
) -> tuple[float | None, np.ndarray]:
    """:func:`max_output_tokens_per_s`'s origin and chunks per 1-s bucket (origin None:
    no chunk to count)."""
    t0 = bucket_origin(cv, rm, rows)
    if t0 is None:
        return None, np.zeros(0, dtype=np.int64)
    return t0, bucket_counts(cv, t0, rows)


def max_output_tokens_per_s(
    cv: ChunkView, rm: pd.DataFrame, rows: np.ndarray | None = None
) -> float:
    """vLLM: max over 1-s buckets (from the earliest successful start) of chunk arrivals.
    It counts chunks, not tokens (§6.2). ``rows``: per request position of ``cv``, whose
    chunks count (``rm`` then holds those requests); None: every chunk."""
    c = output_buckets(cv, rm, rows)[1]
    return float(c.max()) if c.size else 0.0


def peak_tokens_per_s(cv: ChunkView, rm: pd.DataFrame) -> float:
    """Our extra: the same 1-s buckets, counting tokens (chunks can carry several)."""
    if cv.t.size == 0:
        return 0.0
    if cv.single_token():
        return max_output_tokens_per_s(cv, rm)
    d = cv.t - _first_start(cv, rm)
    ok = d >= 0
    if not ok.any():
        return 0.0
    return float(np.bincount(d[ok].astype(np.int64), weights=cv.tokens[ok]).max())


def max_concurrent_requests(rm: pd.DataFrame) -> int:
    """Peak overlap of ``[start, start + e2el)`` over successful requests; sweep line with
    departures before arrivals on ties (§6.2)."""
    s = rm["success"].to_numpy(dtype=bool)
    if not s.any():
        return 0
    a = rm["start_s"].to_numpy()[s]
    d = a + rm["e2el_s"].to_numpy()[s]
    fin = np.isfinite(d)
    if not fin.any():
        return 0
    a, d = a[fin], d[fin]
    times = np.concatenate([a, d])
    delta = np.concatenate([np.ones(a.size, dtype=np.int64), -np.ones(d.size, dtype=np.int64)])
    order = np.lexsort((delta, times))  # at equal times -1 (departure) sorts first
    return int(np.cumsum(delta[order]).max())


def max_concurrent_requests_1s(rm: pd.DataFrame) -> int:
    """vLLM 0.32.0's ``max_concurrent_requests`` (serve.py calculate_metrics, as installed in
    .venv-vllm): per 1-s bucket from the earliest start, the number of successful requests
    active in it (a request counts in every bucket from ``int(start - t0)`` to
    ``int(end - t0)`` inclusive); the max over buckets. Kept beside the exact sweep line so
    numbers compare with that vLLM version directly."""
    s = rm["success"].to_numpy(dtype=bool)
    if not s.any():
        return 0
    a = rm["start_s"].to_numpy()[s]
    e = a + rm["e2el_s"].to_numpy()[s]
    fin = np.isfinite(e)
    if not fin.any():
        return 0
    a, e = a[fin], e[fin]
    t0 = float(a.min())
    first = (a - t0).astype(np.int64)
    last = (e - t0).astype(np.int64)
    size = int(last.max()) + 2
    delta = np.bincount(first, minlength=size) - np.bincount(last + 1, minlength=size)
    return int(np.cumsum(delta).max())


def tbt_token_stats(cv: ChunkView, itl: np.ndarray | None = None) -> dict[str, float]:
    """Token-normalised TBT (§6.4, SGLang's native method): each gap between token-bearing
    chunks is spread evenly over the tokens that chunk carries. Keys
    ``tbt_token_{mean,p50,p90,p99,max}_ms``; 0 when empty. ``itl``: the view's ITL samples
    when the caller has them (reused when every chunk carries one token)."""
    keys = ("mean", "p50", "p90", "p99", "max")
    if cv.single_token():
        per = cv.itl()[0] if itl is None else itl
    else:
        tok = cv.tokens
        m = tok > 0
        t, g, k = cv.t[m], cv.grp[m], tok[m]
        if t.size < 2:
            return {f"tbt_token_{x}_ms": 0.0 for x in keys}
        same = g[1:] == g[:-1]
        gaps = np.diff(t)[same]
        n = k[1:][same]
        per = np.repeat(gaps / n, n)
    if per.size == 0:
        return {f"tbt_token_{x}_ms": 0.0 for x in keys}
    per = per * 1000.0
    p50, p90, p99 = np.percentile(per, [50, 90, 99])
    return {
        "tbt_token_mean_ms": float(per.mean()),
        "tbt_token_p50_ms": float(p50),
        "tbt_token_p90_ms": float(p90),
        "tbt_token_p99_ms": float(p99),
        "tbt_token_max_ms": float(per.max()),
    }


def itl_p99_within(
    cv: ChunkView,
    n: int,
    slo_s: np.ndarray,
    itl: tuple[np.ndarray, np.ndarray] | ItlRuns | None = None,
) -> np.ndarray:
    """Per request: is the request's own p99 ITL (``np.percentile`` linear) <= its TBT SLO?

    Exact without sorting: with n gaps ascending and h = 0.99·(n−1), the p99 interpolates
    between the order statistics at floor(h) and ceil(h). If c gaps exceed the SLO they are
    the top c, so the answer is decided by c alone except when floor(h) = n−c−1: then the p99
    is ``lo + frac·(hi − lo)`` with lo the largest gap within the SLO and hi the smallest
    above it (read in a second pass over those requests' samples only). Requests with no
    ITL sample (one chunk) pass. ``slo_s`` is per request (NaN: no SLO → True). ``itl``:
    ``cv.itl()`` or :meth:`ChunkView.itl_runs` when the caller already has it.
    """
    ok = np.ones(n, dtype=bool)
    if itl is None:
        itl = cv.itl()
    x_all = itl.gaps if isinstance(itl, ItlRuns) else itl[0]
    if x_all.size == 0:
        return ok
    pieces = _itl_pieces(itl)
    s_req = np.where(np.isfinite(slo_s), slo_s, np.inf)  # no SLO: nothing is over it
    cnt = np.zeros(n, dtype=np.int64)
    c = np.zeros(n, dtype=np.int64)
    # counts (exact in any order) reduced over each run of one request's samples and folded
    # per request: a grouped view's samples come in one run per request, so few updates
    for a, b, rg, lens in pieces:
        over = x_all[a:b] > np.repeat(s_req[rg], lens)
        np.add.at(cnt, rg, lens)
        np.add.at(c, rg, np.add.reduceat(over, _heads(lens), dtype=np.int64))
    h = 0.99 * (cnt - 1)
    f = np.floor(h).astype(np.int64)
    frac = h - f
    ceil_ = np.ceil(h).astype(np.int64)
    first_over = cnt - c  # index of the smallest gap above the SLO
    pass_clear = ceil_ < first_over
    fail_clear = f >= first_over
    edge = (cnt > 0) & (c > 0) & ~pass_clear & ~fail_clear
    lo = np.full(n, -np.inf)
    hi = np.full(n, np.inf)
    if edge.any():  # max within and min above the SLO, over the edge requests' samples
        for a, b, rg, lens in pieces:
            keep = edge[rg]
            if not keep.any():
                continue
            m = np.repeat(keep, lens)
            x, rk, lk = x_all[a:b][m], rg[keep], lens[keep]
            over = x > np.repeat(s_req[rk], lk)
            heads = _heads(lk)
            np.maximum.at(lo, rk, np.maximum.reduceat(np.where(over, -np.inf, x), heads))
            np.minimum.at(hi, rk, np.minimum.reduceat(np.where(over, x, np.inf), heads))
    with np.errstate(invalid="ignore"):
        val = lo + frac * (hi - lo)
        edge_ok = val <= s_req
    res = np.where(c == 0, True, np.where(pass_clear, True, np.where(fail_clear, False, edge_ok)))
    ok[cnt > 0] = res[cnt > 0]
    return ok


def _heads(lens: np.ndarray) -> np.ndarray:
    """Start of each run within its piece (runs of ``lens`` >= 1 samples, back to back)."""
    return np.r_[0, np.cumsum(lens[:-1])]


def _itl_pieces(
    itl: tuple[np.ndarray, np.ndarray] | ItlRuns,
) -> list[tuple[int, int, np.ndarray, np.ndarray]]:
    """The ITL samples as pieces of about ``_SLICE`` samples (bounded temporaries), each
    ``(a, b, request of each run, samples in each run)`` for the samples ``[a, b)``: from
    the runs as given, or from the per-sample request positions (a run: a stretch of one
    request's samples; a request may have several)."""
    out = []
    if isinstance(itl, ItlRuns):
        off = np.r_[0, np.cumsum(itl.lens)]
        cuts = np.unique(np.searchsorted(off, np.arange(0, off[-1], _SLICE), side="right") - 1)
        bounds = [*cuts.tolist(), itl.lens.size]
        for r0, r1 in zip(bounds[:-1], bounds[1:], strict=True):
            if r1 > r0:
                out.append((int(off[r0]), int(off[r1]), itl.pos[r0:r1], itl.lens[r0:r1]))
        return out
    gaps, grp = itl
    for a in range(0, gaps.size, _SLICE):
        g = grp[a : a + _SLICE]
        heads = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
        out.append((a, a + g.size, g[heads], np.diff(np.r_[heads, g.size])))
    return out


def send_fidelity(
    requests: pd.DataFrame, threshold_ms: float = DEFAULT_SEND_LAG_THRESHOLD_MS
) -> dict[str, float | bool | None]:
    """How well the dispatcher kept its schedule (design.md "Load generator"; §6.4 names).

    send lag = ``arrival_s − target_s`` (release by the dispatcher versus the schedule; the
    concurrency-gate wait is vLLM's client queue time, reported separately), falling back to
    ``send_s`` when ``arrival_s`` is missing. ``achieved_request_rate`` = dispatched requests /
    last release time (the run clock starts at 0; vLLM pins the last arrival at N/λ, so this
    compares with the offered rate N / last target). ``schedule_kept`` is False when the send
    lag p99 exceeds ``threshold_ms``.
    """
    target = _col(requests, "target_s")
    rel = _col(requests, "arrival_s")
    send = _col(requests, "send_s")
    rel = np.where(np.isfinite(rel), rel, send)
    lag = rel - target
    lag = lag[np.isfinite(lag)]
    out: dict[str, float | bool | None] = {}
    if lag.size:
        p50, p99 = np.percentile(lag, [50, 99]) * 1000.0
        out.update(
            send_lag_p50_ms=float(p50),
            send_lag_p99_ms=float(p99),
            send_lag_max_ms=float(lag.max() * 1000.0),
        )
    else:
        out.update(send_lag_p50_ms=None, send_lag_p99_ms=None, send_lag_max_ms=None)
    released = rel[np.isfinite(rel)]
    tg = target[np.isfinite(target)]
    out["achieved_request_rate"] = (
        float(released.size / released.max()) if released.size and released.max() > 0 else None
    )
    out["offered_request_rate"] = float(tg.size / tg.max()) if tg.size and tg.max() > 0 else None
    q = send - rel
    q = q[np.isfinite(q)]
    if q.size and q.max() > 0:
        out["client_queue_p50_ms"] = float(np.percentile(q, 50) * 1000.0)
        out["client_queue_p99_ms"] = float(np.percentile(q, 99) * 1000.0)
    out["send_lag_threshold_ms"] = float(threshold_ms)
    p99 = out["send_lag_p99_ms"]
    out["schedule_kept"] = True if p99 is None else bool(p99 <= threshold_ms)
    return out


def _held_mean(t: np.ndarray, v: np.ndarray) -> float | None:
    """Time-weighted mean of a sampled series, each value held until the next sample (rows
    come at irregular times: per engine step, fast-forwarded spans, scrape ticks)."""
    ok = np.isfinite(v) & np.isfinite(t)
    t, v = t[ok], v[ok]
    if v.size == 0:
        return None
    if v.size == 1 or t[-1] <= t[0]:
        return float(v.mean())
    w = np.diff(t)
    return float(np.sum(v[:-1] * w) / np.sum(w))


def server_stats(samples: pd.DataFrame) -> dict[str, dict[str, float | None] | None]:
    """§6.4 server and GPU extras from samples.parquet.

    ``server``: from ``engine`` rows when present (simulator / built-in engine telemetry),
    else ``prometheus`` rows: ``kv_cache_usage_perc_{mean,max}`` (0..1, like vLLM's gauge),
    ``num_requests_{waiting,running}_{mean,max}`` (time-weighted means),
    ``preemptions_delta`` (last − first counter value). ``gpu``: per ``gpu_index``,
    ``mem_used_{max,mean}_mib``, ``mem_total_mib``, ``util_mean_perc``. None when absent.
    """
    out: dict[str, dict[str, float | None] | None] = {"server": None, "gpu": None}
    if len(samples) == 0 or "source" not in samples.columns:
        return out
    src = samples["source"]  # compared as it is read (a categorical: the codes, rundir.py)
    for name in ("engine", "prometheus"):
        mine = (src == name).to_numpy(dtype=bool)
        # a simulation's rows are all the engine's, in time order: no copy of the frame
        # (two of a million rows otherwise); the same rows and order either way
        rows = samples if mine.all() else samples[mine]
        if len(rows):
            if not rows["t_s"].is_monotonic_increasing:
                rows = rows.sort_values("t_s", kind="stable")
            t = rows["t_s"].to_numpy(dtype=np.float64)
            blk: dict[str, float | None] = {"source": name}  # type: ignore[dict-item]
            for col, key in (
                ("kv_usage", "kv_cache_usage_perc"),
                ("num_waiting", "num_requests_waiting"),
                ("num_running", "num_requests_running"),
            ):
                v = _col(rows, col)
                fin = v[np.isfinite(v)]
                blk[f"{key}_mean"] = _held_mean(t, v)
                blk[f"{key}_max"] = float(fin.max()) if fin.size else None
            p = _col(rows, "preemptions_total")
            p = p[np.isfinite(p)]
            blk["preemptions_delta"] = float(p[-1] - p[0]) if p.size else None
            out["server"] = blk
            break
    g = samples[src == "gpu"]
    if len(g):
        gpus: dict[str, dict[str, float | None]] = {}
        idx = (
            g["gpu_index"].fillna(0).astype(np.int64)
            if "gpu_index" in g.columns
            else pd.Series(0, index=g.index)
        )
        for i, rows in g.groupby(idx):
            rows = rows.sort_values("t_s", kind="stable")
            t = rows["t_s"].to_numpy(dtype=np.float64)
            used = _col(rows, "gpu_mem_used_mib")
            tot = _col(rows, "gpu_mem_total_mib")
            util = _col(rows, "gpu_util_perc")
            fin = used[np.isfinite(used)]
            gpus[str(i)] = {
                "mem_used_max_mib": float(fin.max()) if fin.size else None,
                "mem_used_mean_mib": _held_mean(t, used),
                "mem_total_mib": float(np.nanmax(tot)) if np.isfinite(tot).any() else None,
                "util_mean_perc": _held_mean(t, util),
            }
        out["gpu"] = gpus  # type: ignore[assignment]
    return out
