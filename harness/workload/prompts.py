"""Prompt synthesis for length-only traces (placeholder: words mode)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

WORDS = ["the", "of", "and", "to", "in", "is", "was", "for", "on", "that", "with", "as", "by", "at", "from", "his", "her", "it", "an", "were", "are", "which", "this", "be", "or", "has", "had", "not", "but", "first", "one", "their", "its", "new", "after", "who", "they", "have", "two", "been", "she", "other", "all", "time", "there", "when", "also", "into", "year", "more", "only", "would", "over", "can", "some", "these", "may", "up", "out", "most", "where", "than", "many", "then", "about", "such", "school", "city", "world", "state", "made", "used", "during", "under", "three", "later", "part", "between", "well", "each", "both", "people", "while", "work", "before", "through", "high", "known", "being", "long", "since", "year", "second", "house", "life", "team", "name", "family", "number", "water", "around", "until", "film", "game", "played", "place", "area", "group", "found", "river", "good", "light", "music", "small", "early", "great", "river", "north", "south", "east", "west", "local", "power", "million", "book", "open", "order", "point", "land", "human", "black", "white", "market", "paper", "system", "public", "church", "field", "union", "early", "story", "night"]


def synthesize_prompt(n: int, seed: int | None, index: int) -> str:
    """``n`` whitespace-separated words (the built-in engine counts one token per word)."""
    rng = np.random.default_rng(None if seed is None else [seed, 4, index])
    idx = rng.integers(0, len(WORDS), size=n)
    return " ".join(WORDS[i] for i in idx)


def fill_prompts(df: pd.DataFrame, mode: str, seed: int | None, **kw: Any) -> list[str]:
    return [
        p if isinstance(p, str) else synthesize_prompt(int(n), seed, i)
        for i, (p, n) in enumerate(zip(df["prompt"], df["prompt_len"], strict=True))
    ]
