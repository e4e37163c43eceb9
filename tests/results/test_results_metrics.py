"""Metric formulas: hand-computed small runs, and vLLM's calculate_metrics as an oracle."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pytest

from harness.results import metrics as M
from harness.results.rundir import read_run
from harness.results.summary import compute_summary

PCTS = [50, 90, 95, 99, 99.9]


# --------------------------------------------------------------------------- hand-computed
def test_hand_computed_two_requests(make_run):
    # r0: sent 1.0; chunks at 1.1 (1 tok), 1.3 (2 tok), 1.4 (1 tok); usage 4 tokens.
    #   ttft = 0.1, itl = [0.2, 0.1], e2el = 0.4, tpot = (0.4-0.1)/(4-1) = 0.1
    # r1: sent 2.0; chunks at 2.5 (1 tok), 3.0 (1 tok); usage 2 tokens.
    #   ttft = 0.5, itl = [0.5], e2el = 1.0, tpot = 0.5/1 = 0.5
    # r2: failed (HTTP 500): no chunks.
    run_dir = make_run(
        [
            {"req": 0, "send_s": 1.0, "output_tokens": 4, "prompt_tokens": 7},
            {"req": 1, "send_s": 2.0, "output_tokens": 2, "prompt_tokens": 3},
            {"req": 2, "send_s": 2.5, "success": False, "error_kind": "http_status"},
        ],
        {0: [(1.1, 1), (1.3, 2), (1.4, 1)], 1: [(2.5, 1), (3.0, 1)]},
        meta={"duration_s": 4.0},
    )
    s = compute_summary(read_run(run_dir), stability=False)
    assert s["completed"] == 2 and s["failed"] == 1
    assert s["duration"] == 4.0
    assert s["total_input_tokens"] == 10  # 7 + 3, failures excluded
    assert s["total_output_tokens"] == 6
    assert s["request_throughput"] == pytest.approx(2 / 4)
    assert s["output_throughput"] == pytest.approx(6 / 4)
    assert s["total_token_throughput"] == pytest.approx(16 / 4)
    assert s["request_goodput"] is None
    assert s["mean_ttft_ms"] == pytest.approx(300.0)  # (100 + 500) / 2
    assert s["median_ttft_ms"] == pytest.approx(300.0)
    assert s["std_ttft_ms"] == pytest.approx(200.0)  # population std of {100, 500}
    assert s["p99_ttft_ms"] == pytest.approx(100 + 0.99 * 400)
    # ITL samples [200, 100, 500] ms: one per chunk, multi-token chunk adds no sample
    assert s["mean_itl_ms"] == pytest.approx(800 / 3)
    assert s["median_itl_ms"] == pytest.approx(200.0)
    assert s["p90_itl_ms"] == pytest.approx(200 + 0.8 * 300)  # h = 0.9 * 2 = 1.8
    assert s["mean_tpot_ms"] == pytest.approx(300.0)  # (100 + 500) / 2
    assert s["mean_e2el_ms"] == pytest.approx(700.0)  # (400 + 1000) / 2
    assert s["p99.9_e2el_ms"] == pytest.approx(400 + 0.999 * 600)
    # chunk arrivals from the first start (1.0): bucket 0 has 3 chunks, 1 has 1, 2 has 1
    assert s["max_output_tokens_per_s"] == 3.0
    assert s["peak_output_tokens_per_s"] == 4.0  # bucket 0 carries 1 + 2 + 1 tokens
    # [1.0, 1.4) and [2.0, 3.0) never overlap
    assert s["max_concurrent_requests"] == 1
    assert s["errors"] == {"http_status": 1}
    # token-normalised TBT: r0 gaps 0.2 over 2 tokens -> 0.1, 0.1; 0.1 over 1 -> 0.1;
    # r1 0.5 -> samples [100, 100, 100, 500] ms
    assert s["tbt_token_mean_ms"] == pytest.approx(200.0)
    assert s["tbt_token_max_ms"] == pytest.approx(500.0)
    assert s["tbt_token_p50_ms"] == pytest.approx(100.0)


def test_single_token_answer_has_no_tpot_but_counts_zero_for_goodput(make_run):
    # r0: one chunk with one token: ttft = e2el = 0.3, tpot excluded (output_tokens = 1)
    # r1: ttft 0.1, then 0.9 s for 1 more token: tpot = 0.9
    run_dir = make_run(
        [
            {"req": 0, "send_s": 0.0, "output_tokens": 1},
            {"req": 1, "send_s": 0.0, "output_tokens": 2},
        ],
        {0: [(0.3, 1)], 1: [(0.1, 1), (1.0, 1)]},
    )
    run = read_run(run_dir)
    s = compute_summary(run, {"tpot": 100}, stability=False)
    assert s["mean_tpot_ms"] == pytest.approx(900.0)  # r0 is left out of TPOT stats
    # one token per chunk: token-normalised TBT = ITL = the single 900 ms gap
    assert s["tbt_token_mean_ms"] == pytest.approx(900.0)
    assert s["tbt_token_max_ms"] == pytest.approx(900.0)
    # chunks at 0.1, 0.3 (bucket 0) and 1.0 (bucket 1) from the first start 0.0
    assert s["peak_output_tokens_per_s"] == s["max_output_tokens_per_s"] == 2.0
    # goodput: r0 tpot counts as 0 (good), r1 tpot 900 > 100 (bad) -> 1 good / duration 1.0
    assert s["duration"] == pytest.approx(1.0)
    assert s["request_goodput"] == pytest.approx(1.0)
    s2 = compute_summary(run, {"ttft": 200, "tpot": 1000}, stability=False)
    assert s2["request_goodput"] == pytest.approx(1.0)  # r0 ttft 300 > 200
    s3 = compute_summary(run, {"e2el": 300}, stability=False)
    assert s3["request_goodput"] == pytest.approx(1.0)  # ttft=e2el 300 <= 300 is good


def test_failed_requests_are_never_good(make_run):
    run_dir = make_run(
        [{"req": 0, "send_s": 0.0, "success": False, "error_kind": "stream_cut"}],
        {0: [(0.01, 1)]},  # it got a chunk before the stream was cut
        meta={"duration_s": 1.0},
    )
    s = compute_summary(read_run(run_dir), {"ttft": 1e9}, stability=False)
    assert s["completed"] == 0 and s["failed"] == 1
    assert s["request_goodput"] == 0.0
    assert s["errors"] == {"stream_cut": 1}


def test_empty_run_gives_zeros(make_run):
    run_dir = make_run(
        [
            {"req": 0, "success": False, "error_kind": "connect"},
            {"req": 1, "success": False, "error_kind": "connect"},
        ]
    )
    s = compute_summary(read_run(run_dir), {"ttft": 10}, stability=False)
    assert s["completed"] == 0 and s["failed"] == 2
    for m in M.LATENCY_METRICS:
        for k in ("mean", "median", "std", "p99", "p99.9"):
            assert s[f"{k}_{m}_ms"] == 0.0
    assert s["max_output_tokens_per_s"] == 0.0
    assert s["max_concurrent_requests"] == 0
    assert s["request_goodput"] == 0.0
    assert s["tbt_token_p99_ms"] == 0.0


def test_no_requests_at_all(make_run):
    s = compute_summary(read_run(make_run([])), stability=False)
    assert s["completed"] == 0 and s["failed"] == 0 and s["duration"] == 0.0
    assert s["request_throughput"] == 0.0 and s["p99_ttft_ms"] == 0.0


def test_max_concurrency_departures_first_on_ties(make_run):
    # [0, 1) and [1, 2) touch at 1.0: departure first -> peak 1; [0.5, 1.5) overlaps both -> 2
    reqs = [
        {"req": 0, "send_s": 0.0, "output_tokens": 1},
        {"req": 1, "send_s": 1.0, "output_tokens": 1},
    ]
    chunks = {0: [(1.0, 1)], 1: [(2.0, 1)]}
    s = compute_summary(read_run(make_run(reqs, chunks)), stability=False)
    assert s["max_concurrent_requests"] == 1
    reqs.append({"req": 2, "send_s": 0.5, "output_tokens": 1})
    chunks[2] = [(1.5, 1)]
    s = compute_summary(read_run(make_run(reqs, chunks)), stability=False)
    assert s["max_concurrent_requests"] == 2


def test_chunks_out_of_order_are_grouped(make_run, tmp_path):
    # The same chunks written interleaved and unsorted give the same metrics.
    from harness.results.rundir import RunWriter

    reqs = [
        {"req": 0, "request_id": "a", "send_s": 0.0, "success": True, "output_tokens": 3},
        {"req": 1, "request_id": "b", "send_s": 0.0, "success": True, "output_tokens": 3},
    ]
    ordered = make_run(reqs, {0: [(0.1, 1), (0.2, 1), (0.4, 1)], 1: [(0.15, 1), (0.5, 2)]})
    shuffled = tmp_path / "shuffled"
    with RunWriter(shuffled, {}) as w:
        for r in reqs:
            w.add_request(r)
        w.add_chunks(1, [0.5], [2])
        w.add_chunks(0, [0.4, 0.1], [1, 1])
        w.add_chunks(1, [0.15], [1])
        w.add_chunks(0, [0.2], [1])
    a = compute_summary(read_run(ordered), stability=False)
    b = compute_summary(read_run(shuffled), stability=False)
    for k in ("mean_itl_ms", "p99_itl_ms", "mean_ttft_ms", "mean_e2el_ms", "tbt_token_mean_ms"):
        assert a[k] == pytest.approx(b[k]), k
    assert a["mean_itl_ms"] == pytest.approx((100 + 200 + 350) / 3)


def test_send_fidelity(make_run):
    # lags (arrival - target): 1, 2, 3, 50 ms
    reqs = [
        {"req": i, "target_s": float(i), "arrival_s": i + lag / 1000, "send_s": i + lag / 1000}
        for i, lag in enumerate([1, 2, 3, 50], start=1)
    ]
    reqs = [dict(r, success=False, error_kind="connect") for r in reqs]
    s = compute_summary(read_run(make_run(reqs)), stability=False)
    assert s["send_lag_p50_ms"] == pytest.approx(2.5)
    assert s["send_lag_max_ms"] == pytest.approx(50.0)
    assert s["send_lag_p99_ms"] == pytest.approx(3 + 0.97 * 47)  # h = 2.97
    assert s["offered_request_rate"] == pytest.approx(4 / 4.0)
    assert s["achieved_request_rate"] == pytest.approx(4 / 4.05)
    assert s["schedule_kept"] is False and s["valid"] is False
    assert "send lag p99" in s["invalid_reasons"][0]
    s = compute_summary(read_run(make_run(reqs)), send_lag_threshold_ms=60, stability=False)
    assert s["schedule_kept"] is True and s["valid"] is True


def test_parse_goodput():
    assert M.parse_goodput(["ttft:200", "tpot:50"]) == {"ttft": 200.0, "tpot": 50.0}
    assert M.parse_goodput("ttft:200 e2el:1000") == {"ttft": 200.0, "e2el": 1000.0}
    assert M.parse_goodput(None) is None
    for bad in (["itl:3"], ["ttft"], ["ttft:abc"], ["ttft:-1"]):
        with pytest.raises(ValueError, match="goodput"):
            M.parse_goodput(bad)


def test_percentile_key_names():
    assert M.percentile_key(99, "itl") == "p99_itl_ms"
    assert M.percentile_key(99.9, "itl") == "p99.9_itl_ms"
    assert M.percentile_key(50.0, "ttft") == "p50_ttft_ms"


@pytest.mark.parametrize("seed", range(5))
def test_own_p99_itl_matches_numpy(seed):
    # itl_p99_within decides "np.percentile(own gaps, 99) <= slo" without sorting.
    rng = np.random.default_rng(seed)
    n = 400
    lens = rng.integers(1, 250, n)
    grp = np.repeat(np.arange(n), lens)
    t = np.concatenate([np.cumsum(rng.exponential(0.05, k)) for k in lens])
    # make some gaps equal to the SLO exactly and some spikes
    slo = rng.choice([0.05, 0.1, np.nan], n)
    starts = np.r_[0, np.cumsum(lens)[:-1]]
    cv = M.ChunkView(t, np.ones(t.size, dtype=np.int64), grp, starts, starts + lens)
    got = M.itl_p99_within(cv, n, slo)
    for g in range(n):
        gaps = np.diff(t[starts[g] : starts[g] + lens[g]])
        want = True if gaps.size == 0 or np.isnan(slo[g]) else np.percentile(gaps, 99) <= slo[g]
        assert got[g] == want, g


# --------------------------------------------------------------------------- vLLM oracle
@dataclass
class _Out:
    """vLLM's RequestFuncOutput fields used by calculate_metrics."""

    success: bool = False
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0
    output_tokens: int | None = None
    start_time: float = 0.0
    prompt_len: int = 0
    generated_count: int = 0  # stands in for the tokenizer re-count of generated_text


def _vllm_calculate_metrics(outputs: list[_Out], dur_s: float, goodput: dict | None) -> dict:
    """A literal transcription of vLLM serve.py calculate_metrics (anchors-harness.md §6.2;
    checked against vllm 0.32.0's source). ``max_concurrent_requests`` is the §6.2 sweep line;
    0.32.0's own per-second-bucket count is ``max_concurrent_requests_1s``."""
    actual_output_lens = []
    total_input = 0
    completed = 0
    good_completed = 0
    itls, tpots, all_tpots, ttfts, e2els = [], [], [], [], []
    for i in range(len(outputs)):
        if outputs[i].success:
            output_len = outputs[i].output_tokens
            if not output_len:
                output_len = outputs[i].generated_count
            actual_output_lens.append(output_len)
            total_input += outputs[i].prompt_len
            tpot = 0
            if output_len > 1:
                latency_minus_ttft = outputs[i].latency - outputs[i].ttft
                tpot = latency_minus_ttft / (output_len - 1)
                tpots.append(tpot)
            all_tpots.append(tpot)
            itls += outputs[i].itl
            ttfts.append(outputs[i].ttft)
            e2els.append(outputs[i].latency)
            completed += 1
        else:
            actual_output_lens.append(0)
    if goodput:
        valid_metrics, slo_values = [], []
        if "ttft" in goodput:
            valid_metrics.append(ttfts)
            slo_values.append(goodput["ttft"] / 1000)
        if "tpot" in goodput:
            valid_metrics.append(all_tpots)
            slo_values.append(goodput["tpot"] / 1000)
        if "e2el" in goodput:
            valid_metrics.append(e2els)
            slo_values.append(goodput["e2el"] / 1000)
        for req_metric in zip(*valid_metrics, strict=True):
            if all(s >= r for s, r in zip(slo_values, req_metric, strict=True)):
                good_completed += 1

    max_output_tokens_per_s = 0.0
    max_concurrent_requests = 0
    max_concurrent_1s = 0
    ok = [o for o in outputs if o.success]
    if ok:
        min_start = min(o.start_time for o in ok)
        max_end = max(o.start_time + o.latency for o in ok)
        buckets = np.zeros(int(np.ceil(max_end - min_start)) + 1)
        for o in ok:
            token_times = [o.start_time + o.ttft]
            cur = token_times[0]
            for v in o.itl:
                cur += v
                token_times.append(cur)
            for tt in token_times:
                b = int(tt - min_start)
                if 0 <= b < len(buckets):
                    buckets[b] += 1
        max_output_tokens_per_s = float(np.max(buckets))
        # vLLM 0.32.0 (installed in .venv-vllm): requests active per 1-s bucket
        conc = np.zeros(len(buckets))
        for o in ok:
            for sec in range(
                int(o.start_time - min_start), int(o.start_time + o.latency - min_start) + 1
            ):
                conc[sec] += 1
        max_concurrent_1s = int(np.max(conc))
        events = [(o.start_time, 1) for o in ok] + [(o.start_time + o.latency, -1) for o in ok]
        events.sort(key=lambda e: (e[0], e[1]))  # departures (-1) first on ties
        cur = 0
        for _, d in events:
            cur += d
            max_concurrent_requests = max(max_concurrent_requests, cur)

    res = {
        "completed": completed,
        "failed": len(outputs) - completed,
        "total_input_tokens": total_input,
        "total_output_tokens": sum(actual_output_lens),
        "request_throughput": completed / dur_s,
        "request_goodput": good_completed / dur_s if goodput else None,
        "output_throughput": sum(actual_output_lens) / dur_s,
        "total_token_throughput": (total_input + sum(actual_output_lens)) / dur_s,
        "max_output_tokens_per_s": max_output_tokens_per_s,
        "max_concurrent_requests": max_concurrent_requests,
        "max_concurrent_requests_1s": max_concurrent_1s,
    }
    for name, vals in (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2el", e2els)):
        res[f"mean_{name}_ms"] = np.mean(vals or 0) * 1000
        res[f"std_{name}_ms"] = np.std(vals or 0) * 1000
        res[f"median_{name}_ms"] = np.median(vals or 0) * 1000
        for p in PCTS:
            p_word = str(int(p)) if int(p) == p else str(p)
            res[f"p{p_word}_{name}_ms"] = np.percentile(vals or 0, p) * 1000
    return res


def _outputs_like_vllm(reqs, chunks) -> list[_Out]:
    """What vLLM's request function would have recorded for the same streams."""
    outs = []
    for r in reqs:
        ch = chunks.get(r["req"], [])
        o = _Out(start_time=r["send_s"], prompt_len=r["prompt_tokens"])
        if r.get("success", True) and ch:
            o.success = True
            times = [c[0] for c in ch]
            o.ttft = times[0] - r["send_s"]
            o.itl = [b - a for a, b in zip(times, times[1:], strict=False)]
            o.latency = times[-1] - r["send_s"]
            o.output_tokens = r["output_tokens"]
            o.generated_count = sum(c[1] for c in ch)
        outs.append(o)
    return outs


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("goodput", [None, {"ttft": 150.0, "tpot": 25.0, "e2el": 900.0}])
def test_matches_vllm_calculate_metrics(make_run, replay, seed, goodput):
    reqs, chunks = replay(seed)
    run_dir = make_run(reqs, chunks, meta={"duration_s": 9.5})
    ours = compute_summary(read_run(run_dir), goodput, stability=False)
    oracle = _vllm_calculate_metrics(_outputs_like_vllm(reqs, chunks), 9.5, goodput)
    assert oracle["completed"] > 200 and oracle["failed"] > 10  # the fixture is non-trivial
    for key, want in oracle.items():
        if want is None:
            assert ours[key] is None, key
        else:
            assert ours[key] == pytest.approx(want, rel=1e-9, abs=1e-9), key


def test_per_request_frame(replay):
    reqs, chunks = replay(3, n=50)
    rq = pd.DataFrame(reqs)
    rq["success"] = rq["success"].astype("boolean").fillna(True)
    ch = pd.DataFrame(
        [(k, t, n) for k, v in chunks.items() for t, n in v], columns=["req", "t_s", "tokens"]
    )
    rm, cv = M.request_metrics(rq, ch)
    assert list(rm["req"]) == list(range(50))
    ok = rm["success"].to_numpy()
    assert np.all(rm["ttft_s"][ok] > 0) and np.all(rm["e2el_s"][ok] >= rm["ttft_s"][ok])
    assert np.all(np.isnan(rm["ttft_s"][~ok]))
    assert np.all(rm["output_tokens"][~ok] == 0)
    assert cv.t.size == sum(len(chunks[r["req"]]) for r in reqs if r.get("success", True))


def _numpy_stats(x: np.ndarray, metric: str) -> dict[str, float]:
    """vLLM's figures as numpy computes them; the median as np.percentile's 50th (np.median's
    value but with an inf sample, where the linear rule gives NaN, as it always has here)."""
    v = x if x.size else np.zeros(1)
    out = {
        f"mean_{metric}_ms": float(np.mean(v) * 1000.0),
        f"median_{metric}_ms": float(np.percentile(v, 50) * 1000.0),
        f"std_{metric}_ms": float(np.std(v) * 1000.0),
    }
    for p, q in zip(M.PERCENTILES, np.percentile(v, M.PERCENTILES), strict=True):
        out[M.percentile_key(p, metric)] = float(q * 1000.0)
    return out


def test_latency_stats_are_numpys():
    """Mean, std, median and percentiles are numpy's to the bit, with or without leave to
    reorder the caller's array (and without it the array is untouched): ties, tiny samples,
    empty, inf and NaN."""
    rng = np.random.default_rng(3)
    for it in range(400):
        n = int(rng.integers(0, 40)) if it % 2 else int(rng.integers(1, 3000))
        x = [rng.exponential(size=n), rng.integers(0, 4, n).astype(float)][it % 2]
        want = _numpy_stats(x, "itl")
        keep = x.copy()
        assert M.latency_stats(x, "itl") == want
        assert np.array_equal(x, keep)
        assert M.latency_stats(x, "itl", overwrite=True) == want
        assert np.array_equal(np.sort(x), np.sort(keep))  # reordered at most
    for x in (np.array([1.0, np.inf, 2.0]), np.array([3.0, np.nan, 1.0])):
        with np.errstate(invalid="ignore"):
            got, want = M.latency_stats(x.copy(), "ttft", True), _numpy_stats(x, "ttft")
        assert got.keys() == want.keys()
        assert all(np.array_equal(got[k], want[k], equal_nan=True) for k in got)


@pytest.mark.parametrize("spare", [None, "long", "short", "int"])
@pytest.mark.parametrize("layout", ["covered", "uncovered", "one-whole", "empty-tier", "none"])
def test_itl_stats_per_tier_and_pooled_are_numpys(layout, spare):
    """The run's and each tier's ITL figures and largest sample, whatever the tiers cover
    (every sample, some, one tier holding all, a tier with no samples, no sample at all), are
    numpy's on the samples in pooled order, however the pool is reordered and reused; with a
    spare buffer (the chunk times) as scratch, or one too short or of another type (unused)."""
    from harness.results.summary import _itl_stats

    rng = np.random.default_rng(11)
    names = ["paid", "free", "batch"]
    n = 0 if layout == "none" else 5000
    itl = rng.exponential(size=n)
    tier = {
        "covered": rng.integers(0, 3, n),
        "uncovered": rng.integers(-1, 3, n),
        "one-whole": np.full(n, 1),
        "empty-tier": rng.integers(0, 2, n),
        "none": np.zeros(0, dtype=np.int64),
    }[layout].astype(np.int8)
    pool = itl.copy()
    buf = {
        None: None,
        "long": rng.random(n + 7),
        "short": np.full(max(n - 1, 0), 3.0),
        "int": np.zeros(n + 7, np.int64),
    }[spare]
    kept = None if buf is None else buf.copy()
    got = _itl_stats(itl, tier, names, buf)
    if spare in ("short", "int"):
        assert np.array_equal(buf, kept)  # not used
    assert got[None] == (_numpy_stats(pool, "itl"), pool.max() if n else None)
    for code, name in enumerate(names):
        sub = pool[tier == code]
        assert got[name] == (_numpy_stats(sub, "itl"), sub.max() if sub.size else None)


def test_own_p99_itl_with_samples_in_any_order():
    """itl_p99_within folds per-run reductions per request: samples of one request split
    into several runs (not grouped) give the same answers as grouped ones."""
    rng = np.random.default_rng(9)
    n = 300
    lens = rng.integers(1, 120, n)
    grp = np.repeat(np.arange(n), lens)
    t = np.concatenate([np.cumsum(rng.exponential(0.05, k)) for k in lens])
    slo = rng.choice([0.05, 0.1, np.nan], n)
    starts = np.r_[0, np.cumsum(lens)[:-1]]
    cv = M.ChunkView(t, np.ones(t.size, dtype=np.int64), grp, starts, starts + lens)
    itl, ig = cv.itl()
    want = M.itl_p99_within(cv, n, slo)
    perm = rng.permutation(itl.size)
    assert np.array_equal(M.itl_p99_within(cv, n, slo, itl=(itl[perm], ig[perm])), want)


def test_itl_runs_are_the_itl_samples():
    """itl_runs gives itl()'s samples in the same order, each request's as one run (groups
    in any order, one-chunk and chunkless requests), and the p99 check reads them alike."""
    rng = np.random.default_rng(4)
    n = 200
    lens = rng.integers(0, 60, n)
    layout = rng.permutation(n)  # the groups need not ascend
    t = np.concatenate([np.cumsum(rng.exponential(0.05, lens[g])) for g in layout])
    grp = np.concatenate([np.full(lens[g], g) for g in layout])
    start = np.zeros(n, dtype=np.int64)
    at = 0
    for g in layout:
        start[g] = at
        at += lens[g]
    cv = M.ChunkView(t, np.ones(t.size, dtype=np.int64), grp, start, start + lens)
    gaps, ig = cv.itl()
    runs = cv.itl_runs()
    assert np.array_equal(runs.gaps, gaps)
    assert np.array_equal(runs.sample_values(np.arange(n)), ig)
    assert (runs.lens >= 1).all() and runs.lens.sum() == gaps.size
    slo = rng.choice([0.05, 0.1, np.nan], n)
    assert np.array_equal(
        M.itl_p99_within(cv, n, slo, itl=runs), M.itl_p99_within(cv, n, slo, itl=(gaps, ig))
    )


def test_mean_std_are_numpys():
    """mean_std (one mean sum, deviations summed a piece at a time) gives np.mean and
    np.std's bits, below one piece and over several."""
    rng = np.random.default_rng(8)
    for it in range(60):
        n = int(rng.integers(1, 200_000))
        x = [rng.exponential(size=n), rng.normal(5, 1e-3, n), rng.integers(0, 7, n) * 0.1][it % 3]
        assert M.mean_std(x) == (np.mean(x), np.std(x))


@pytest.mark.parametrize("seed", range(6))
def test_server_stats_read_the_engine_rows_in_time_order(seed):
    """server_stats on a simulation's samples (every row the engine's, in time order: read
    as they lie) and on shuffled, mixed-source ones (selected and sorted first): the same
    figures as from the engine rows sorted by time."""
    rng = np.random.default_rng(seed)
    n = 400
    t = np.sort(rng.random(n) * 100)
    t[rng.integers(0, n, 20)] = t[0]  # ties: a stable order decides
    engine = pd.DataFrame(
        {
            "t_s": np.sort(t),
            "source": "engine",
            "kv_usage": rng.random(n),
            "num_waiting": rng.integers(0, 50, n).astype(float),
            "num_running": rng.integers(0, 9, n).astype(float),
            "preemptions_total": np.cumsum(rng.integers(0, 2, n)).astype(float),
        }
    )
    want = M.server_stats(engine)["server"]
    # the slow way by hand: a time-weighted mean of the held values, the max, the delta
    dt = np.diff(engine["t_s"].to_numpy())
    held = engine["num_waiting"].to_numpy()[:-1]
    assert want["num_requests_waiting_mean"] == pytest.approx((held * dt).sum() / dt.sum())
    assert want["kv_cache_usage_perc_max"] == engine["kv_usage"].max()
    p = engine["preemptions_total"]
    assert want["preemptions_delta"] == p.iloc[-1] - p.iloc[0]
    # shuffled among other sources: the engine rows selected, then sorted (stable: rows of
    # one time keep their order, so the shuffle keeps theirs)
    other = engine.assign(source="prometheus", kv_usage=1.0)
    mixed = pd.concat([engine, other])
    at = rng.permutation(len(mixed))
    mine = np.flatnonzero(mixed["source"].to_numpy() == "engine")
    at[np.isin(at, mine)] = mine  # the engine rows' relative order kept
    assert M.server_stats(mixed.iloc[at])["server"] == want
    # one source, out of time order, distinct times: sorted
    distinct = engine.assign(t_s=np.arange(n, dtype=float))
    assert M.server_stats(distinct.iloc[::-1]) == M.server_stats(distinct)
