"""LMSYS / ShareGPT loaders on local data in HF format (never the hub), and the fallback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.workload import build_trace
from harness.workload.prompts import approx_tokens, load_tokenizer
from harness.workload.trace import TraceError

LMSYS_ROWS = {
    "conversation_id": ["c1", "c2", "c3"],
    "language": ["English", "English", "German"],
    "conversation": [
        [
            {"role": "user", "content": "Hello there, how are you today?"},
            {"role": "assistant", "content": "I am fine, thank you for asking me that."},
            {"role": "user", "content": "Tell me a joke."},
            {"role": "assistant", "content": "Why did the chicken cross the road? " * 5},
        ],
        [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "Hello! How can I help you today?"},
        ],
        [
            {"role": "user", "content": "Wie geht es dir heute, mein Freund?"},
            {"role": "assistant", "content": "Mir geht es gut, danke der Nachfrage."},
        ],
    ],
}


@pytest.fixture
def lmsys_dir(tmp_path: Path) -> Path:
    from datasets import Dataset

    path = tmp_path / "lmsys_local"
    Dataset.from_dict(LMSYS_ROWS).save_to_disk(str(path))
    return path


def test_lmsys_each_user_turn_is_a_request(lmsys_dir: Path) -> None:
    t = build_trace("lmsys", path=str(lmsys_dir), rate=1.0, sample="head", tiers="x:1", quiet=True)
    assert t.meta["fallback"] is False
    assert t.meta["prompt_mode"] == "turn" and t.meta["filter"] == "none"
    assert len(t) == 4  # 2 + 1 + 1 user turns followed by an assistant reply
    c1 = LMSYS_ROWS["conversation"][0]
    assert t.df["prompt"].tolist()[:2] == [c1[0]["content"], c1[2]["content"]]
    assert t.df["prompt_len"].iloc[1] == approx_tokens("Tell me a joke.")
    assert t.df["output_len"].iloc[1] == approx_tokens(c1[3]["content"])
    assert "approx" in t.meta["tokenizer"]


def test_lmsys_conversation_mode_and_first_turn(lmsys_dir: Path) -> None:
    t = build_trace(
        "lmsys",
        path=str(lmsys_dir),
        rate=1.0,
        sample="head",
        prompt_mode="conversation",
        quiet=True,
    )
    c1 = LMSYS_ROWS["conversation"][0]
    expect = "\n".join([c1[0]["content"], c1[1]["content"], c1[2]["content"]])
    assert t.df["prompt"].iloc[1] == expect
    first = build_trace("lmsys", path=str(lmsys_dir), rate=1.0, turns="first", quiet=True)
    assert len(first) == 3


def test_lmsys_language_and_vllm_filter(lmsys_dir: Path) -> None:
    en = build_trace("lmsys", path=str(lmsys_dir), rate=1.0, language="English", quiet=True)
    assert len(en) == 3
    # vLLM is_valid_sequence: prompt >= 4 tokens drops "hi" (1 token) and "Tell me a joke." (4
    # approx tokens stays); output >= 4 everywhere here.
    f = build_trace("lmsys", path=str(lmsys_dir), rate=1.0, filter="vllm", quiet=True)
    assert "hi" not in f.df["prompt"].tolist()
    assert f.meta["turns_filtered_out"] >= 1
    assert all(4 <= p <= 1024 for p in f.df["prompt_len"])


def test_lengths_in_tokens_of_a_chosen_tokenizer(lmsys_dir: Path, bpe_tokenizer_path: Path) -> None:
    t = build_trace(
        "lmsys",
        path=str(lmsys_dir),
        rate=1.0,
        sample="head",
        tokenizer=str(bpe_tokenizer_path),
        quiet=True,
    )
    tok = load_tokenizer(str(bpe_tokenizer_path))
    for prompt, n in zip(t.df["prompt"], t.df["prompt_len"], strict=True):
        assert n == len(tok.encode(prompt))
    assert t.meta["tokenizer"] == str(bpe_tokenizer_path)


def test_sharegpt_json_file(tmp_path: Path) -> None:
    data = [
        {
            "id": "a",
            "conversations": [
                {"from": "human", "value": "What is the capital of France?"},
                {"from": "gpt", "value": "Paris is the capital of France."},
            ],
        },
        {"id": "b", "conversations": [{"from": "human", "value": "unanswered"}]},
        {
            "id": "c",
            "conversations": [
                {"from": "system", "value": "be brief"},
                {"from": "human", "value": "Name a colour please."},
                {"from": "gpt", "value": "Blue, the colour of the sky."},
            ],
        },
    ]
    f = tmp_path / "ShareGPT_V3_unfiltered_cleaned_split.json"
    f.write_text(json.dumps(data))
    t = build_trace("sharegpt", path=str(f), rate=2.0, sample="head", quiet=True)
    assert t.df["prompt"].tolist() == ["What is the capital of France?", "Name a colour please."]
    assert t.meta["fallback"] is False


def test_sharegpt_jsonl_openchat_items(tmp_path: Path) -> None:
    f = tmp_path / "sharegpt_gpt4.jsonl"
    f.write_text(
        json.dumps(
            {
                "items": [
                    {"from": "human", "value": "one two three four"},
                    {"from": "gpt", "value": "five six seven eight"},
                ]
            }
        )
        + "\n"
    )
    t = build_trace("sharegpt", path=str(f), rate=2.0, quiet=True)
    assert len(t) == 1


def test_malformed_records_named(tmp_path: Path) -> None:
    f = tmp_path / "s.json"
    f.write_text(json.dumps([{"id": "x", "text": "no conversation"}]))
    with pytest.raises(TraceError, match=r"s\.json: record 0: no 'conversation'"):
        build_trace("sharegpt", path=str(f), rate=1.0, quiet=True)
    g = tmp_path / "g.json"
    g.write_text("[{")
    with pytest.raises(TraceError, match=r"g\.json: line 1: not valid JSON"):
        build_trace("sharegpt", path=str(g), rate=1.0, quiet=True)
    e = tmp_path / "e.json"
    e.write_text("[]")
    with pytest.raises(TraceError, match="no usable user/assistant turns"):
        build_trace("sharegpt", path=str(e), rate=1.0, quiet=True)


def test_offline_fallback_is_announced_and_recorded(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    t = build_trace("lmsys", num_requests=50, rate=5.0)
    err = capsys.readouterr().err
    assert "warning:" in err and "bundled length profile 'lmsys'" in err
    assert t.meta["fallback"] is True and t.meta["profile"] == "lmsys"
    assert "HF_HUB_OFFLINE" in t.meta["reason"]
    with pytest.raises(TraceError, match="real dataset not available"):
        build_trace("sharegpt", num_requests=5, rate=1.0, fallback="never", quiet=True)


def test_bad_loader_options(lmsys_dir: Path) -> None:
    with pytest.raises(TraceError, match="prompt_mode"):
        build_trace("lmsys", path=str(lmsys_dir), rate=1.0, prompt_mode="all", quiet=True)
    with pytest.raises(TraceError, match="filter"):
        build_trace("lmsys", path=str(lmsys_dir), rate=1.0, filter="sglang", quiet=True)
    with pytest.raises(TraceError, match="no such dataset"):
        build_trace("lmsys", path="/nonexistent/ds", rate=1.0, quiet=True)


def test_datasetdict_split_and_parquet(tmp_path: Path) -> None:
    import pandas as pd
    from datasets import Dataset, DatasetDict

    dd = DatasetDict({"train": Dataset.from_dict(LMSYS_ROWS)})
    dd.save_to_disk(str(tmp_path / "dd"))
    t = build_trace("lmsys", path=str(tmp_path / "dd"), rate=1.0, quiet=True)
    assert len(t) == 4
    with pytest.raises(TraceError, match="no split 'test'"):
        build_trace("lmsys", path=str(tmp_path / "dd"), split="test", rate=1.0, quiet=True)
    pq = tmp_path / "lmsys.parquet"
    pd.DataFrame(LMSYS_ROWS).to_parquet(pq)
    assert len(build_trace("lmsys", path=str(pq), rate=1.0, quiet=True)) == 4


def test_max_rows_bounds_the_scan(lmsys_dir: Path) -> None:
    t = build_trace("lmsys", path=str(lmsys_dir), rate=1.0, max_rows=2, quiet=True)
    assert len(t) == 2 and t.meta["conversations_scanned"] == 1
