"""build_trace: independent RNG streams, sampling rule, tiers and tier mixes over time."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from harness.workload import build_trace
from harness.workload.tiers import (
    TierSpecError,
    assign_tiers,
    assign_tiers_at,
    default_tiers,
    parse_tier_mix,
    parse_tiers,
)
from harness.workload.trace import TraceError

SYN = {"input_len": 300, "output_len": 100, "range_ratio": 0.9}


def cols(t, *names):  # noqa: ANN001, ANN202
    return [t.df[n].tolist() for n in names]


def test_changing_rate_keeps_tiers_and_lengths() -> None:
    a = build_trace("synthetic", num_requests=500, rate=5.0, seed=3, **SYN)
    b = build_trace("synthetic", num_requests=500, rate=50.0, seed=3, **SYN)
    assert cols(a, "prompt_len", "output_len", "tier") == cols(
        b, "prompt_len", "output_len", "tier"
    )
    assert np.allclose(a.df["arrival_s"] / 10, b.df["arrival_s"])  # same unit gaps, rescaled


def test_changing_process_or_tiers_keeps_the_rest() -> None:
    a = build_trace("synthetic", num_requests=300, rate=5.0, seed=3, **SYN)
    g = build_trace("synthetic", num_requests=300, rate=5.0, seed=3, burstiness=0.3, **SYN)
    assert cols(a, "prompt_len", "output_len", "tier") == cols(
        g, "prompt_len", "output_len", "tier"
    )
    assert g.meta["arrival"]["process"] == "gamma"  # burstiness != 1 means gamma (vLLM)
    t = build_trace("synthetic", num_requests=300, rate=5.0, seed=3, tiers="x:0.5,y:0.5", **SYN)
    assert cols(a, "arrival_s", "prompt_len", "output_len") == cols(
        t, "arrival_s", "prompt_len", "output_len"
    )


def test_seed_changes_everything_and_zero_is_a_seed() -> None:
    a = build_trace("synthetic", num_requests=100, rate=5.0, seed=0, **SYN)
    b = build_trace("synthetic", num_requests=100, rate=5.0, seed=1, **SYN)
    assert a.df["arrival_s"].tolist() != b.df["arrival_s"].tolist()
    assert a.df["prompt_len"].tolist() != b.df["prompt_len"].tolist()
    a2 = build_trace("synthetic", num_requests=100, rate=5.0, seed=0, **SYN)
    assert a.content_hash() == a2.content_hash()


def test_tier_shares_follow_spec() -> None:
    t = build_trace("synthetic", num_requests=20_000, rate=100.0, seed=2)
    paid = (t.df["tier"] == "paid").mean()
    assert abs(paid - 0.05) < 4 * np.sqrt(0.05 * 0.95 / 20_000)
    assert [x.name for x in t.tiers] == ["paid", "free"]
    assert t.tier("paid").tbt_slo_s == pytest.approx(0.1)


def test_constant_mix_equals_assign_tiers() -> None:
    tiers = default_tiers()
    mix = parse_tier_mix("0:paid=0.05", tiers)
    arr = np.linspace(0, 100, 5000)
    assert assign_tiers_at(arr, tiers, mix, 9).tolist() == assign_tiers(5000, tiers, 9).tolist()


def test_paid_burst_over_free_base() -> None:
    t = build_trace(
        "synthetic",
        duration_s=120.0,
        rate=50.0,
        seed=4,
        tier_mix="0:paid=0.05,60:paid=0.5,90:paid=0.05",
    )
    a, paid = t.df["arrival_s"], t.df["tier"] == "paid"
    burst = (a > 60) & (a <= 90)
    assert abs(paid[burst].mean() - 0.5) < 0.05
    assert abs(paid[~burst].mean() - 0.05) < 0.02
    assert t.meta["tier_mix"].startswith("0:paid")


@pytest.mark.parametrize(
    "spec, msg",
    [
        ("0:gold=0.5", "not name=share"),
        ("10:paid=0.5,5:paid=0.1", "increase"),
        ("0:paid=1.5", "outside"),
        ("0:paid=0.7/free=0.7", "above 1"),
        ("x:paid=0.1", "not a number"),
        ("0", "expected TIME"),
    ],
)
def test_bad_tier_mix(spec: str, msg: str) -> None:
    with pytest.raises(TierSpecError, match=msg):
        parse_tier_mix(spec, default_tiers())


@pytest.mark.parametrize(
    "spec, msg",
    [
        ("paid:0.5", "sum to 0.5"),
        ("paid", "expected name:share"),
        ("paid:x", "not a number"),
        ("paid:0.5:tbt=fast,free:0.5", "bad duration"),
        ("paid:0.5:color=red,free:0.5", "unknown key"),
        ("a:0.5,a:0.5", "duplicate"),
    ],
)
def test_bad_tier_specs(spec: str, msg: str) -> None:
    with pytest.raises(TierSpecError, match=msg):
        parse_tiers(spec)
    with pytest.raises(TierSpecError, match=msg):
        build_trace("synthetic", num_requests=3, rate=1.0, tiers=spec)


def test_shuffle_head_and_oversampling(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "l.csv"
    f.write_text(
        "num_prefill_tokens,num_decode_tokens\n" + "".join(f"{i},{i}\n" for i in range(1, 11))
    )
    head = build_trace(str(f), num_requests=4, rate=1.0, sample="head", quiet=True)
    assert head.df["prompt_len"].tolist() == [1, 2, 3, 4]
    shuf = build_trace(str(f), num_requests=10, rate=1.0, quiet=True)
    assert sorted(shuf.df["prompt_len"]) == list(range(1, 11))
    assert shuf.df["prompt_len"].tolist() != list(range(1, 11))
    over = build_trace(str(f), num_requests=25, rate=1.0)
    assert "oversampling" in capsys.readouterr().err
    assert set(range(1, 11)) <= set(over.df["prompt_len"]) and len(over) == 25
    assert over.df["request_id"].is_unique


def test_duration_bound_and_all_rows(tmp_path: Path) -> None:
    t = build_trace("synthetic", duration_s=20.0, rate=10.0, seed=1)
    assert t.df["arrival_s"].max() <= 20.0 and abs(len(t) - 200) < 60
    t2 = build_trace("synthetic", duration_s=20.0, num_requests=5, rate=10.0)
    assert len(t2) == 5
    t3 = build_trace("synthetic", num_requests=7, rate=float("inf"))
    assert t3.df["arrival_s"].tolist() == [0.0] * 7


def test_rate_schedule_in_build() -> None:
    t = build_trace("synthetic", duration_s=100.0, rate_schedule="0:5,50:20", seed=2)
    a = t.df["arrival_s"]
    assert abs((a <= 50).sum() - 250) < 4 * np.sqrt(250)
    assert abs((a > 50).sum() - 1000) < 4 * np.sqrt(1000)
    assert t.meta["arrival"]["rate_schedule"] == "0:5,50:20"


@pytest.mark.parametrize(
    "kw, msg",
    [
        ({"num_requests": 3}, "give a rate"),
        ({"num_requests": 0, "rate": 1.0}, "num_requests must be >= 1"),
        ({"num_requests": 3, "rate": -1.0}, "rate must be > 0"),
        ({"num_requests": 3, "rate": 1.0, "rate_schedule": "0:1"}, "either a rate"),
        ({"num_requests": 3, "rate": 1.0, "time_scale": 2.0}, "time_scale applies"),
        ({"num_requests": 3, "rate": 1.0, "arrival": "weibull"}, "unknown arrival"),
        ({"num_requests": 3, "rate": 1.0, "sample": "random"}, "sample must be"),
        ({"num_requests": 3, "arrival": "trace"}, "no timestamps"),
        ({"num_requests": 3, "rate": 1.0, "input_len": 0}, "must be >= 1"),
    ],
)
def test_bad_build_arguments(kw: dict, msg: str) -> None:
    with pytest.raises(TraceError, match=msg):
        build_trace("synthetic", quiet=True, **kw)


def test_generated_source_defaults_to_vllm_num_prompts() -> None:
    from harness.workload.build import DEFAULT_NUM_REQUESTS

    t = build_trace("synthetic", rate=50.0, quiet=True)
    assert len(t) == DEFAULT_NUM_REQUESTS == 1000
    assert any("1000 requests (the default" in n for n in t.meta["notes"])


def test_profile_with_own_timing() -> None:
    t = build_trace("synthetic", profile="azure-conv", num_requests=2000, quiet=True)
    assert t.meta["arrival"]["process"] == "trace"
    rate = (len(t) - 1) / t.df["arrival_s"].iloc[-1]
    assert 3.0 < rate < 8.0  # the Azure conversation trace runs at ~5.5 req/s


def test_rescale_rules() -> None:
    t = build_trace("synthetic", num_requests=50, rate=5.0, rescale=True)
    assert t.df["arrival_s"].iloc[-1] == pytest.approx(10.0)
    with pytest.raises(TraceError, match="rescale applies"):
        build_trace("synthetic", duration_s=10.0, rate=5.0, rescale=True)
    with pytest.raises(TraceError, match="rescale applies"):
        build_trace("synthetic", num_requests=5, rate_schedule="0:1,5:2", rescale=True)


def test_trace_arrival_with_rate_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "a.csv"
    f.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,1,1\n")
    with pytest.raises(TraceError, match="drop the rate"):
        build_trace(str(f), arrival="trace", rate=2.0)


def test_content_hash_is_the_string_hash_of_every_column() -> None:
    """The hash frozen traces were saved with: sha256 over pandas' hash of each column's
    ``astype(str)`` (the float column takes a faster route to the same strings)."""
    import hashlib

    import pandas as pd

    from harness.workload.trace import Trace

    t = build_trace("synthetic", num_requests=50, rate=5.0, seed=3, quiet=True)
    df = t.df.copy()
    df.loc[0:6, "arrival_s"] = [np.nan, -0.0, 1e-5, 1e20, 123456789.123456789, np.inf, 0.1 + 0.2]
    assert df["prompt"].isna().all() and df["prompt_len"].dtype == np.int64  # the quick routes
    texts = df.assign(prompt=["hi", None, np.nan, "None", "nan", *[None] * 45])
    ints = df.assign(prompt_len=[2**62, 10, 10, 1, *range(46)])
    # Arrow's route (non-integer magnitudes 1e-4 .. 1e10) and Python's either side of it
    rng = np.random.default_rng(5)
    mags = 10.0 ** rng.uniform(-6, 17, 20_000) * rng.choice([-1.0, 1.0], 20_000)
    mags[::3] = np.round(mags[::3], 3)
    mags[::7] = np.round(mags[::7])
    edges = [1e-4, np.nextafter(1e-4, 0), 1e10, np.nextafter(1e10, 0), 9999999999.5, 5e-5]
    wide = pd.concat([df] * 401, ignore_index=True).iloc[: len(mags) + len(edges)].copy()
    wide["arrival_s"] = np.concatenate([mags, edges])
    for frame in (df, texts, ints, wide):
        h = hashlib.sha256()
        for col in ("request_id", "arrival_s", "prompt_len", "output_len", "tier", "prompt"):
            h.update(col.encode())
            h.update(pd.util.hash_pandas_object(frame[col].astype(str), index=False).values)
        assert Trace(frame, t.tiers, {}).content_hash() == h.hexdigest()


def test_float_strings_fall_back_to_python_when_arrow_writes_otherwise(monkeypatch) -> None:
    """The hash's float texts are Python's even if an Arrow release formats floats another way
    (its texts are checked on a sample first)."""
    import pyarrow as pa

    from harness.workload import trace as trace_mod

    v = np.cumsum(np.random.default_rng(0).exponential(0.02, 5000))
    v[:3] = [0.0, 5.0, 1e-7]
    want = list(map(str, v.tolist()))
    assert trace_mod._float_strs(v).tolist() == want
    monkeypatch.setattr(trace_mod.pc, "cast", lambda a, t: pa.array(["x"] * len(a)))
    assert trace_mod._float_strs(v).tolist() == want


def test_generated_request_ids_are_the_zero_padded_row_numbers() -> None:
    """Ids a trace gets when its source has none: ``req-%06d`` of the row, wider past 999,999."""
    from harness.workload.build import _sequential_ids

    t = build_trace("synthetic", num_requests=50, rate=10.0, seed=0)
    assert t.df["request_id"].tolist() == ["req-%06d" % i for i in range(50)]  # noqa: UP031
    ids = _sequential_ids(1_000_002)
    assert ids[[0, 7, 999_999, 1_000_000, 1_000_001]].tolist() == [
        "req-000000",
        "req-000007",
        "req-999999",
        "req-1000000",
        "req-1000001",
    ]
    assert all(type(x) is str for x in ids[:3]) and len(_sequential_ids(0)) == 0
