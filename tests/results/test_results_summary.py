"""summary.json: per-tier SLO blocks (hand-computed), write_summary, console tables."""

from __future__ import annotations

import dataclasses
import json

import pandas as pd
import pytest
from rich.console import Console

from harness.results import schema
from harness.results.console import print_summary
from harness.results.rundir import read_run
from harness.results.summary import compute_summary, write_summary

TIERS = [
    {"name": "paid", "share": 0.5, "ttft_slo_s": 0.2, "tbt_slo_s": 0.05, "priority": 0},
    {"name": "free", "share": 0.5, "ttft_slo_s": 1.0, "tbt_slo_s": 0.2, "priority": 1},
]


@pytest.fixture
def tier_run(make_run):
    # paid r0: ttft 0.10, gaps 0.04 0.04           -> attains
    # paid r1: ttft 0.30 (> 0.2), gap 0.02          -> misses TTFT
    # paid r2: ttft 0.05, gaps 0.01 0.14: own p99 = 0.01 + 0.99*0.13 = 0.1387 > 0.05 -> misses TBT
    # free r3: ttft 0.50, gap 0.10                  -> attains
    # free r4: failed                               -> never attains
    reqs = [
        {"req": 0, "tier": "paid", "send_s": 0.0, "output_tokens": 3},
        {"req": 1, "tier": "paid", "send_s": 0.0, "output_tokens": 2},
        {"req": 2, "tier": "paid", "send_s": 1.0, "output_tokens": 3},
        {"req": 3, "tier": "free", "send_s": 0.0, "output_tokens": 2},
        {"req": 4, "tier": "free", "send_s": 0.0, "success": False, "error_kind": "timeout"},
    ]
    chunks = {
        0: [(0.10, 1), (0.14, 1), (0.18, 1)],
        1: [(0.30, 1), (0.32, 1)],
        2: [(1.05, 1), (1.06, 1), (1.20, 1)],
        3: [(0.50, 1), (0.60, 1)],
    }
    return make_run(reqs, chunks, meta={"tiers": TIERS, "duration_s": 2.0})


def test_per_tier_blocks(tier_run):
    s = compute_summary(read_run(tier_run), stability=False)
    paid, free = s["tiers"]["paid"], s["tiers"]["free"]
    assert list(s["tiers"]) == ["paid", "free"]
    assert paid["num_requests"] == 3 and paid["completed"] == 3 and paid["failed"] == 0
    assert paid["ttft_slo_ms"] == 200.0 and paid["tbt_slo_ms"] == 50.0
    assert paid["slo_attainment"] == pytest.approx(1 / 3)
    assert paid["ttft_slo_attainment"] == pytest.approx(2 / 3)
    assert paid["tbt_slo_attainment"] == pytest.approx(2 / 3)
    assert paid["goodput"] == pytest.approx(1 / 2.0)  # 1 attaining request / global duration
    assert paid["request_throughput"] == pytest.approx(3 / 2.0)
    # pooled p99 TTFT over [50, 100, 300] ms: h = 1.98 -> 100 + 0.98*200 = 296 > 200
    assert paid["p99_ttft_ms"] == pytest.approx(296.0)
    assert paid["ttft_slo_met"] is False
    # pooled ITL [10, 20, 40, 40, 140] ms: h = 3.96 -> 40 + 0.96*100 = 136 > 50
    assert paid["p99_itl_ms"] == pytest.approx(136.0)
    assert paid["p99_itl_slo_met"] is False
    assert free["num_requests"] == 2 and free["completed"] == 1 and free["failed"] == 1
    assert free["slo_attainment"] == pytest.approx(0.5)
    assert free["goodput"] == pytest.approx(0.5)
    assert free["request_throughput"] == pytest.approx(0.5)  # same global denominator
    assert free["p99_ttft_ms"] == pytest.approx(500.0) and free["ttft_slo_met"] is True
    assert free["p99_itl_ms"] == pytest.approx(100.0) and free["p99_itl_slo_met"] is True
    assert s["slo_attainment"] == pytest.approx(2 / 5)
    assert s["completed"] == 4 and s["failed"] == 1


def test_tier_goodput_uses_cli_slos(tier_run):
    s = compute_summary(read_run(tier_run), {"ttft": 150}, stability=False)
    assert s["request_goodput"] == pytest.approx(2 / 2.0)  # r0 (100 ms), r2 (50 ms)
    assert s["tiers"]["paid"]["request_goodput"] == pytest.approx(2 / 2.0)
    assert s["tiers"]["free"]["request_goodput"] == 0.0


def test_goodput_from_run_json(make_run):
    rd = make_run(
        [{"req": 0, "send_s": 0.0, "output_tokens": 1}],
        {0: [(0.1, 1)]},
        meta={"goodput": {"ttft": 50.0}, "duration_s": 1.0},
    )
    s = compute_summary(read_run(rd), stability=False)
    assert s["goodput_slos_ms"] == {"ttft": 50.0} and s["request_goodput"] == 0.0
    with pytest.raises(ValueError, match="unknown goodput"):
        compute_summary(read_run(rd), {"itl": 5}, stability=False)


def test_tiers_from_spec_unknown_and_empty(make_run):
    rd = make_run(
        [
            {"req": 0, "tier": "free", "send_s": 0.0, "output_tokens": 1},
            {"req": 1, "tier": "gold", "send_s": 0.0, "output_tokens": 1},
        ],
        {0: [(0.1, 1)], 1: [(0.2, 1)]},
        meta={"tiers": "paid:0.05:ttft=2s:tbt=100ms,free:0.95:ttft=10s:tbt=500ms"},
    )
    s = compute_summary(read_run(rd), stability=False)
    assert list(s["tiers"]) == ["paid", "free", "gold"]
    paid = s["tiers"]["paid"]  # in the spec but no requests
    assert paid["num_requests"] == 0 and paid["completed"] == 0
    assert paid["slo_attainment"] is None and paid["ttft_slo_met"] is None
    assert paid["p99_ttft_ms"] == 0.0
    gold = s["tiers"]["gold"]  # in the data but not in run.json: no SLOs
    assert gold["ttft_slo_ms"] is None and gold["slo_attainment"] is None
    assert gold["completed"] == 1
    assert s["tiers"]["free"]["slo_attainment"] == 1.0
    assert s["slo_attainment"] == 1.0  # only requests of tiers with SLOs count


def test_config_echo(make_run):
    meta = {
        "engine": "vllm",
        "endpoint": "completions",
        "model": "m1",
        "rate": 4.0,
        "burstiness": 1.0,
        "max_concurrency": None,
        "num_requests": 10,
        "policy": "slai",
        "run_id": "abc",
    }
    s = compute_summary(read_run(make_run([], meta=meta)), stability=False)
    assert s["backend"] == "vllm" and s["endpoint_type"] == "completions"
    assert s["model_id"] == "m1" and s["tokenizer_id"] == "m1"
    assert s["request_rate"] == 4.0 and s["burstiness"] == 1.0
    assert s["num_prompts"] == 10 and s["policy"] == "slai" and s["run_id"] == "abc"
    assert s["date"] and s["status"] == "complete"
    s = compute_summary(read_run(make_run([], meta={"rate": None, "arrival": "trace"})))
    assert s["request_rate"] == "trace"


def test_write_summary_and_read_back(tier_run):
    s = write_summary(tier_run, {"ttft": 150})
    text = (tier_run / schema.SUMMARY_JSON).read_text()
    assert "NaN" not in text and "Infinity" not in text
    on_disk = json.loads(text)
    assert on_disk == s
    assert read_run(tier_run).summary == s
    assert "stability" in s  # engineer G's verdict (or None when absent)


def test_console_tables(tier_run, make_run):
    s = compute_summary(read_run(tier_run), stability=False)
    con = Console(record=True, width=120)
    print_summary(s, con)
    out = con.export_text()
    assert "requests ok / failed" in out and "4 / 1" in out
    assert "paid" in out and "free" in out and "200ms/50ms" in out and "33.3%" in out
    assert "timeout=1" in out
    assert "warning" not in out
    con = Console(record=True, width=120)
    print_summary(dict(s, stability={"verdict": "unstable"}), con)
    assert "unstable" in con.export_text()
    bad = dict(s, schedule_kept=False, valid=False, invalid_reasons=["send lag p99 50 ms"])
    bad["status"] = "partial"
    con = Console(record=True, width=120)
    print_summary(bad, con)
    out = con.export_text()
    assert "invalid run: send lag p99 50 ms" in out and "partial run" in out
    # an empty run prints without crashing
    con = Console(record=True, width=120)
    print_summary(compute_summary(read_run(make_run([])), stability=False), con)
    assert "0 / 0" in con.export_text()


def test_server_and_gpu_blocks_from_samples(tmp_path):
    from harness.results.rundir import RunWriter

    rd = tmp_path / "r"
    with RunWriter(rd, {}) as w:
        for t, kv, wt, rn, pre in ((0, 0.1, 0, 1, 0), (1, 0.5, 4, 2, 2), (3, 0.2, 2, 3, 5)):
            w.add_sample(
                {
                    "t_s": float(t),
                    "source": "engine",
                    "kv_usage": kv,
                    "num_waiting": wt,
                    "num_running": rn,
                    "preemptions_total": pre,
                }
            )
        w.add_sample({"t_s": 0.5, "source": "prometheus", "kv_usage": 0.9})  # engine wins
        for t, used, util in ((0, 100.0, 10.0), (2, 300.0, 50.0)):
            w.add_sample(
                {
                    "t_s": float(t),
                    "source": "gpu",
                    "gpu_index": 0,
                    "gpu_mem_used_mib": used,
                    "gpu_mem_total_mib": 1000.0,
                    "gpu_util_perc": util,
                }
            )
    run = read_run(rd)
    # the source is read as a categorical (its filters compare codes, rundir._CATEGORIES);
    # a frame with plain strings (one built in memory) gives the same blocks
    assert isinstance(run.samples["source"].dtype, pd.CategoricalDtype)
    plain = dataclasses.replace(run, samples=run.samples.astype({"source": object}))
    s, ref = compute_summary(run, stability=False), compute_summary(plain, stability=False)
    assert (s["server"], s["gpu"]) == (ref["server"], ref["gpu"])
    srv = s["server"]
    assert srv["source"] == "engine"
    # each value holds until the next sample: (0.1*1 + 0.5*2) / 3
    assert srv["kv_cache_usage_perc_mean"] == pytest.approx(1.1 / 3)
    assert srv["kv_cache_usage_perc_max"] == 0.5
    assert srv["num_requests_waiting_mean"] == pytest.approx(8 / 3)
    assert srv["num_requests_waiting_max"] == 4
    assert srv["num_requests_running_mean"] == pytest.approx((1 * 1 + 2 * 2) / 3)
    assert srv["preemptions_delta"] == 5
    con = Console(record=True, width=120)
    print_summary(s, con)
    assert "36.7% / 50.0%" in con.export_text()  # KV use mean / max
    gpu = s["gpu"]["0"]
    assert gpu["mem_used_max_mib"] == 300.0 and gpu["mem_used_mean_mib"] == 100.0
    assert gpu["mem_total_mib"] == 1000.0 and gpu["util_mean_perc"] == 10.0
    # write_summary reads only the samples' columns these blocks read (the GPU ones only
    # when there are NVML rows, as here): the same blocks
    written = write_summary(rd)
    assert (written["server"], written["gpu"]) == (s["server"], s["gpu"])


def test_no_samples_no_server_block(make_run):
    s = compute_summary(read_run(make_run([])), stability=False)
    assert s["server"] is None and s["gpu"] is None


@pytest.mark.parametrize("case", ["partition", "untiered", "other_origin", "one_tier"])
def test_chunk_peaks_shortcut_is_per_tier_counting(case):
    """The largest tier's chunk peak from the run's buckets minus the other tiers' (same
    origin, whole counts) equals counting its own chunks; untiered requests with chunks or
    another origin take the plain path."""
    import numpy as np
    import pandas as pd

    from harness.results import metrics as M
    from harness.results.summary import _chunk_peak, _chunk_peaks

    rng = np.random.default_rng(2)
    n = 300
    lens = rng.integers(0, 40, n)
    start_s = np.sort(rng.random(n) * 20)
    t = np.concatenate(
        [s + np.cumsum(rng.exponential(0.05, k)) for s, k in zip(start_s, lens, strict=True)]
    )
    grp = np.repeat(np.arange(n), lens)
    starts = np.r_[0, np.cumsum(lens)[:-1]]
    cv = M.ChunkView(t, np.ones(t.size, dtype=np.int64), grp, starts, starts + lens)
    cv._single = True
    tier = np.where(rng.random(n) < 0.2, "paid", "free").astype(object)
    if case == "untiered":
        tier[int(np.flatnonzero(lens > 0)[3])] = None  # a request with chunks and no tier
    if case == "one_tier":
        tier[:] = "free"
    success = lens > 0
    if case == "other_origin":
        tier[0], tier[1] = "paid", "paid"  # the run's first start is a small tier's
    rm = pd.DataFrame({"start_s": start_s, "success": success, "tier": tier})
    masks = {x: tier == x for x in ("paid", "free") if (tier == x).any()}
    got = _chunk_peaks(rm, cv, masks)
    want = {None: _chunk_peak(rm, cv, np.ones(n, dtype=bool))}
    want.update({x: _chunk_peak(rm, cv, m) for x, m in masks.items()})
    assert got == want
