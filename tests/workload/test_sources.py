"""Loaders for each local file format, written by the tests; malformed rows name file,
line and field; empty traces are refused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from harness.workload import build_trace, load_trace, save_trace
from harness.workload.sources import load_source
from harness.workload.trace import TraceError


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_vidur_csv_with_arrivals_honoured(tmp_path: Path) -> None:
    f = write(
        tmp_path / "az.csv",
        "arrived_at,num_prefill_tokens,num_decode_tokens\n10.0,100,20\n10.5,200,30\n12.0,300,40\n",
    )
    t = build_trace(str(f), tiers="a:1", quiet=True)
    assert t.df["arrival_s"].tolist() == [0.0, 0.5, 2.0]
    assert t.df["prompt_len"].tolist() == [100, 200, 300]
    assert t.df["output_len"].tolist() == [20, 30, 40]
    assert t.meta["arrival"]["process"] == "trace"
    t2 = build_trace(str(f), tiers="a:1", time_scale=2.0, quiet=True)
    assert t2.df["arrival_s"].tolist() == [0.0, 1.0, 4.0]


def test_vidur_csv_without_arrivals_needs_rate(tmp_path: Path) -> None:
    f = write(tmp_path / "l.csv", "num_prefill_tokens,num_decode_tokens\n5,6\n7,8\n")
    with pytest.raises(TraceError, match="no timestamps; give a rate"):
        build_trace(str(f), quiet=True)
    t = build_trace(str(f), rate=1.0, sample="head", quiet=True)
    assert t.df["prompt_len"].tolist() == [5, 7]


def test_csv_malformed_row_names_file_line_field(tmp_path: Path) -> None:
    f = write(
        tmp_path / "bad.csv",
        "num_prefill_tokens,num_decode_tokens\n5,6\n7,eight\n",
    )
    with pytest.raises(TraceError) as e:
        build_trace(str(f), rate=1.0, quiet=True)
    msg = str(e.value)
    assert "bad.csv" in msg and "line 3" in msg and "num_decode_tokens" in msg and "eight" in msg


def test_csv_missing_column_and_empty(tmp_path: Path) -> None:
    f = write(tmp_path / "m.csv", "num_prefill_tokens,foo\n1,2\n")
    with pytest.raises(TraceError, match="missing column.*num_decode_tokens"):
        load_source(str(f), {})
    e = write(tmp_path / "e.csv", "")
    with pytest.raises(TraceError, match="empty"):
        load_source(str(e), {})
    h = write(tmp_path / "h.csv", "num_prefill_tokens,num_decode_tokens\n")
    with pytest.raises(TraceError, match="empty"):
        load_source(str(h), {})


def test_zero_lengths_dropped_and_announced_or_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = write(tmp_path / "z.csv", "num_prefill_tokens,num_decode_tokens\n5,0\n7,8\n")
    t = build_trace(str(f), rate=1.0)
    assert len(t) == 1 and t.meta["dropped_zero_length_rows"] == 1
    assert "dropped 1 row" in capsys.readouterr().err
    with pytest.raises(TraceError, match="line 2: field 'num_decode_tokens' is 0"):
        load_source(str(f), {"zero_lengths": "error"})
    only_zero = write(tmp_path / "oz.csv", "num_prefill_tokens,num_decode_tokens\n0,1\n")
    with pytest.raises(TraceError, match="empty"):
        load_source(str(only_zero), {})


def test_unknown_option_is_an_error(tmp_path: Path) -> None:
    f = write(tmp_path / "l.csv", "num_prefill_tokens,num_decode_tokens\n5,6\n")
    with pytest.raises(TraceError, match="unknown option.*colour"):
        build_trace(str(f), rate=1.0, colour="red")


BURST = """Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
5,ChatGPT,100,50,150,Conversation log
7,GPT-4,200,0,200,Conversation log
8,GPT-4,300,60,360,API log
12,ChatGPT,400,70,470,Conversation log
"""


def test_burstgpt_timestamps_honoured_and_failures_dropped(tmp_path: Path) -> None:
    f = write(tmp_path / "burst.csv", BURST)
    t = build_trace(str(f), quiet=True)
    assert t.meta["format"] == "burstgpt"
    assert t.df["arrival_s"].tolist() == [0.0, 3.0, 7.0]  # 5, 8, 12 shifted; row at 7 failed
    assert t.df["prompt_len"].tolist() == [100, 300, 400]
    g = build_trace(str(f), model="GPT-4", quiet=True)
    assert g.df["prompt_len"].tolist() == [300]
    c = build_trace(str(f), log_type="Conversation log", quiet=True)
    assert c.df["prompt_len"].tolist() == [100, 400]


def test_burstgpt_bad_timestamp(tmp_path: Path) -> None:
    f = write(tmp_path / "b.csv", BURST.replace("\n12,", "\nnoon,"))
    with pytest.raises(TraceError, match=r"b\.csv: line 5: field 'Timestamp'='noon'"):
        build_trace(str(f), quiet=True)


def test_mooncake_jsonl(tmp_path: Path) -> None:
    rows = [
        {"timestamp": 0, "input_length": 1024, "output_length": 10, "hash_ids": [1, 2]},
        {"timestamp": 1500, "input_length": 700, "output_length": 5, "hash_ids": [1, 3]},
        {"timestamp": 2500, "input_length": 30, "output_length": 7, "hash_ids": [9]},
    ]
    f = write(tmp_path / "mc.jsonl", "\n".join(json.dumps(r) for r in rows) + "\n")
    t = build_trace(str(f), prompts="words", quiet=True)
    assert t.meta["format"] == "mooncake"
    assert t.df["arrival_s"].tolist() == [0.0, 1.5, 2.5]  # ms -> s
    assert t.df["prompt_len"].tolist() == [1024, 700, 30]
    p0, p1 = t.df["prompt"].iloc[0].split(), t.df["prompt"].iloc[1].split()
    assert len(p0) == 1024 and len(p1) == 700
    # shared hash id 1 -> shared first 512-token block; different second block
    assert p0[:512] == p1[:512] and p0[512:700] != p1[512:700]


def test_mooncake_malformed(tmp_path: Path) -> None:
    f = write(
        tmp_path / "mc.jsonl",
        '{"timestamp": 0, "input_length": 5, "output_length": 1}\n{"timestamp": 1, "input_le',
    )
    with pytest.raises(TraceError, match=r"mc\.jsonl: line 2: not valid JSON"):
        build_trace(str(f), quiet=True)
    g = write(tmp_path / "mc2.jsonl", '{"timestamp": 0, "input_length": 5}\n')
    with pytest.raises(TraceError, match="line 1: missing field 'output_length'"):
        build_trace(str(g), quiet=True)


def test_azure_raw_csv(tmp_path: Path) -> None:
    f = write(
        tmp_path / "AzureLLMInferenceTrace_conv.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,109\n",
    )
    t = build_trace(str(f), quiet=True)
    assert t.df["arrival_s"].iloc[1] == pytest.approx(4.314579, abs=1e-6)
    named = build_trace("azure-conv", path=str(f), quiet=True)
    assert named.meta["fallback"] is False
    assert named.df["prompt_len"].tolist() == [374, 396]


def test_project_jsonl(tmp_path: Path) -> None:
    rows = [
        {
            "request_id": "a",
            "arrival_s": 0.5,
            "prompt_len": 3,
            "output_len": 4,
            "tier": "free",
            "prompt": "x y z",
        },
        {"request_id": "b", "arrival_s": 1.0, "prompt_len": 2, "output_len": 1, "tier": "paid"},
    ]
    f = write(tmp_path / "p.jsonl", "\n".join(json.dumps(r) for r in rows))
    t = build_trace(str(f), quiet=True)
    assert t.df["request_id"].tolist() == ["a", "b"]
    assert t.df["arrival_s"].tolist() == [0.5, 1.0]  # offsets kept, not shifted
    assert t.df["tier"].tolist() == ["free", "paid"]
    assert t.df["prompt"].iloc[0] == "x y z" and t.df["prompt"].iloc[1] is None
    bad = write(tmp_path / "q.jsonl", json.dumps({**rows[0], "output_len": 0}))
    with pytest.raises(TraceError, match=r"q\.jsonl: line 1: field 'output_len'=0"):
        build_trace(str(bad), quiet=True)


def test_frozen_parquet_replays_identically(tmp_path: Path) -> None:
    t = build_trace(
        "lmsys",
        num_requests=300,
        rate=7.0,
        arrival="gamma",
        burstiness=0.5,
        tiers="gold:0.2:ttft=1s:tbt=50ms,bronze:0.8:ttft=5s",
        seed=11,
        prompts="words",
        quiet=True,
    )
    path = save_trace(t, tmp_path / "frozen.parquet")
    again = build_trace(str(path), quiet=True)  # what a replay of the file does
    for col in ("request_id", "arrival_s", "prompt_len", "output_len", "tier", "prompt"):
        assert again.df[col].tolist() == t.df[col].tolist(), col
    assert again.tiers == t.tiers
    assert again.content_hash() == t.content_hash()
    assert again.meta["fallback"] is True  # the fallback mark survives freezing
    loaded = load_trace(path)
    assert loaded.content_hash() == t.content_hash() and loaded.tiers == t.tiers


def test_frozen_parquet_tamper_detected(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    t = build_trace("synthetic", num_requests=5, rate=1.0, quiet=True)
    path = save_trace(t, tmp_path / "f.parquet")
    tbl = pq.read_table(path)
    df = tbl.to_pandas()
    df.loc[0, "output_len"] = 999
    import pyarrow as pa

    pq.write_table(pa.Table.from_pandas(df).replace_schema_metadata(tbl.schema.metadata), path)
    with pytest.raises(TraceError, match="content hash mismatch"):
        load_trace(path)


def test_unknown_name_and_missing_file() -> None:
    with pytest.raises(TraceError, match="unknown trace 'lmsys2'"):
        build_trace("lmsys2")
    with pytest.raises(TraceError, match="no such trace file"):
        build_trace("/nonexistent/x.csv")


def test_unknown_suffix(tmp_path: Path) -> None:
    f = write(tmp_path / "t.xml", "<x/>")
    with pytest.raises(TraceError, match="unknown trace format"):
        build_trace(str(f), rate=1.0)


def test_timestamped_oversampling_tiles_and_announces(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = write(
        tmp_path / "a.csv",
        "arrived_at,num_prefill_tokens,num_decode_tokens\n0,1,1\n1,2,2\n2,3,3\n",
    )
    t = build_trace(str(f), num_requests=7)
    assert "repeated 3 time(s)" in capsys.readouterr().err
    assert t.df["arrival_s"].tolist() == [0, 1, 2, 3, 4, 5, 6]
    assert t.df["prompt_len"].tolist() == [1, 2, 3, 1, 2, 3, 1]
    assert np.all(np.diff(t.df["arrival_s"]) > 0)
