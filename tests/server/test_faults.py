"""Fault spec parsing and the deterministic per-request fault draw (harness.server.faults)."""

from __future__ import annotations

import pytest

from harness.server.faults import (
    FaultLog,
    FaultSpecError,
    choose_fault,
    parse_faults,
    read_fault_log,
)


def test_parse_full_spec():
    s = parse_faults(
        "error=0.01,drop=0.02,stall=0.03:2s,malformed=0.04,slow_first=0.05:250ms,seed=7"
    )
    assert s.rates == {
        "error": 0.01,
        "drop": 0.02,
        "stall": 0.03,
        "malformed": 0.04,
        "slow_first": 0.05,
    }
    assert s.durations == {"stall": 2.0, "slow_first": 0.25}
    assert s.seed == 7 and s.active
    assert not parse_faults(None).active and not parse_faults("").active


@pytest.mark.parametrize(
    "spec",
    [
        "boom=0.1",
        "drop",
        "drop=x",
        "drop=1.5",
        "error=0.6,drop=0.6",
        "drop=0.1:2s",
        "stall=0.1:fast",
        "seed=abc",
        "drop=0.1,drop=0.2",
    ],
)
def test_bad_specs_raise_one_clear_error(spec):
    with pytest.raises(FaultSpecError):
        parse_faults(spec)


def test_draw_is_deterministic_and_matches_rates():
    spec = parse_faults("error=0.1,drop=0.2,stall=0.1:1s,seed=3")
    ids = [f"req-{i}" for i in range(20000)]
    a = [choose_fault(spec, r, 10) for r in ids]
    b = [choose_fault(spec, r, 10) for r in ids]
    assert a == b
    kinds = [p.kind for p in a if p is not None]
    n = len(ids)
    assert abs(kinds.count("error") / n - 0.1) < 0.01
    assert abs(kinds.count("drop") / n - 0.2) < 0.015
    assert abs(kinds.count("stall") / n - 0.1) < 0.01
    other = parse_faults("error=0.1,drop=0.2,stall=0.1:1s,seed=4")
    assert [choose_fault(other, r, 10) for r in ids[:200]] != a[:200]


def test_mid_stream_position_is_before_the_final_token():
    spec = parse_faults("drop=1.0")
    for i in range(2000):
        p = choose_fault(spec, f"r{i}", 5)
        assert p is not None and 1 <= p.at_token <= 4
    assert choose_fault(spec, "x", 1).at_token == 0
    assert {choose_fault(spec, f"r{i}", 2).at_token for i in range(50)} == {1}


def test_log_writes_jsonl_and_counts(tmp_path):
    spec = parse_faults("stall=1.0:3s")
    log = FaultLog(tmp_path / "f" / "faults.jsonl")
    plan = choose_fault(spec, "a", 4)
    log.record("a", plan)
    log.record("b", choose_fault(spec, "b", 4))
    log.close()
    evs = read_fault_log(tmp_path / "f" / "faults.jsonl")
    assert [e["request_id"] for e in evs] == ["a", "b"]
    assert evs[0]["kind"] == "stall" and evs[0]["param_s"] == 3.0
    assert evs[0]["at_token"] == plan.at_token
    assert log.counts() == {"stall": 2}
