"""Prompt synthesis: exact word counts for the built-in engine, exact token counts for a
real tokenizer, determinism by seed."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.workload import build_trace
from harness.workload.prompts import (
    exact_prompt,
    load_tokenizer,
    synthesize_prompt,
    synthetic_prompt,
)
from harness.workload.trace import TraceError


@pytest.mark.parametrize("n", [1, 2, 7, 100, 3000])
def test_words_prompt_has_exactly_n_words(n: int) -> None:
    assert len(synthesize_prompt(n, 0, 0).split()) == n


def test_words_prompt_deterministic_and_distinct() -> None:
    assert synthesize_prompt(50, 3, 7) == synthesize_prompt(50, 3, 7)
    assert synthesize_prompt(50, 3, 7) != synthesize_prompt(50, 3, 8)
    assert synthesize_prompt(50, 3, 7) != synthesize_prompt(50, 4, 7)
    assert synthetic_prompt(12) == synthesize_prompt(12, 0, 0)


@pytest.mark.parametrize("n", [1, 5, 64, 513])
def test_exact_token_prompt(n: int, bpe_tokenizer_path: Path) -> None:
    tok = load_tokenizer(str(bpe_tokenizer_path))
    # the tiny vocabulary splits words: n words is not n tokens, so the loop has work to do
    assert len(tok.encode(synthesize_prompt(64, 0, 0))) != 64
    text = exact_prompt(n, tok, 0, 1)
    assert len(tok.encode(text)) == n
    assert text == exact_prompt(n, tok, 0, 1)


def test_build_with_tokenizer_prompts(bpe_tokenizer_path: Path) -> None:
    t = build_trace(
        "synthetic",
        num_requests=20,
        rate=5.0,
        input_len=40,
        output_len=8,
        range_ratio=0.5,
        prompts=f"tokenizer:{bpe_tokenizer_path}",
        quiet=True,
    )
    tok = load_tokenizer(str(bpe_tokenizer_path))
    for p, n in zip(t.df["prompt"], t.df["prompt_len"], strict=True):
        assert len(tok.encode(p)) == n


def test_bad_tokenizer_and_mode(tmp_path: Path) -> None:
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{}")
    with pytest.raises(TraceError, match="not a tokenizer.json"):
        load_tokenizer(str(bad))
    with pytest.raises(TraceError, match="prompts must be"):
        build_trace("synthetic", num_requests=2, rate=1.0, prompts="letters", quiet=True)
