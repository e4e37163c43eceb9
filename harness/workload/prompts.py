"""Prompt synthesis for length-only traces, and the token counter used by dataset loaders.

Two modes (``build_trace(..., prompts=...)``):

- ``"words"``: ``N`` whitespace-separated English words. The built-in engine's documented
  rule is one token per whitespace-separated word, so the prompt is exactly ``N`` tokens
  there; on a real tokenizer it is roughly ``N`` to ``1.3 N`` tokens.
- ``"tokenizer:SPEC"``: exactly ``N`` tokens for that tokenizer (``SPEC`` = a
  ``tokenizer.json`` file, a folder holding one, or a HF name when ``transformers`` can load
  it locally). Counted without special tokens: a server that adds a BOS token reports
  ``N + 1`` prompt tokens.

Prompts are deterministic: request ``i`` is a slice of a fixed random word text (the
stream ``[seed, 4]``) at an offset hashed from ``(seed, i)``, independent of every other
request, so the load generator can synthesise one at send time with
:func:`synthesize_prompt`. Mooncake rows with ``hash_ids`` share prefixes: block ``h`` is
always the same words (offset hashed from ``(seed, h)``), so requests with a common hash
prefix have a common text prefix, like the original trace's KV-cache reuse.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from harness.workload.trace import TraceError

_WORDS_TEXT = """
the of and to in is was for on that with as by at from his her it an were are which this be
or has had not but first one their its new after who they have two been she other all time
there when also into year more only would over can some these may up out most where than
many then about such school city world state made used during under three later part
between well each both people while work before through high known being long since second
house life team name family number water around until film game played place area group
found river good light music small early great north south east west local power million
book open order point land human black white market paper system public church field union
story night
"""
WORDS: tuple[str, ...] = tuple(_WORDS_TEXT.split())


TAPE_WORDS = 1 << 20


@functools.lru_cache(maxsize=8)
def _tape(seed: int | None) -> tuple[str, np.ndarray]:
    """A fixed text of ``TAPE_WORDS`` random words for ``seed`` (stream ``[seed, 4]``) and the
    character offset of each word; prompts are slices of it, so building one is a C-level
    string slice instead of a per-request RNG (100k prompts in well under a second)."""
    rng = np.random.default_rng(None if seed is None else [seed, 4])
    idx = rng.integers(0, len(WORDS), size=TAPE_WORDS)
    lens = np.array([len(w) + 1 for w in WORDS])[idx]
    starts = np.concatenate([[0], np.cumsum(lens)])
    return " ".join(WORDS[i] for i in idx) + " ", starts


def _mix(*keys: int) -> int:
    """splitmix64 over the keys: a cheap deterministic per-request offset."""
    x = 0x9E3779B97F4A7C15
    for k in keys:
        x = (x ^ (k & 0xFFFFFFFFFFFFFFFF)) & 0xFFFFFFFFFFFFFFFF
        x = (x + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
        x ^= x >> 31
    return x


def _slice(n: int, seed: int | None, key: tuple[int, ...]) -> str:
    """``n`` words starting at a key-determined offset of the seed's tape (wrapping)."""
    text, starts = _tape(seed)
    if seed is None:
        off = int(np.random.default_rng().integers(0, TAPE_WORDS))
    else:
        off = _mix(seed, *key) % TAPE_WORDS
    parts: list[str] = []
    while n > 0:
        take = min(n, TAPE_WORDS - off)
        parts.append(text[starts[off] : starts[off + take] - 1])
        n -= take
        off = 0
    return " ".join(parts)


def synthesize_prompt(n: int, seed: int | None, index: int) -> str:
    """``n`` whitespace-separated words for request ``index`` (built-in engine: ``n`` tokens).

    Deterministic in ``(seed, index)``, independent of every other request."""
    if n < 1:
        raise TraceError(f"prompt length must be >= 1, got {n}")
    return _slice(n, seed, (4, index))


def prefix_prompt(
    n: int, hash_ids: list[int], block_tokens: int, seed: int | None, index: int
) -> str:
    """``n`` words whose ``block_tokens``-word blocks are fixed per hash id (shared prefixes)."""
    out: list[str] = []
    have = 0
    for h in hash_ids:
        if have >= n:
            break
        k = min(block_tokens, n - have)
        out.append(_slice(k, seed, (5, int(h))))
        have += k
    if have < n:
        out.append(_slice(n - have, seed, (4, index)))
    return " ".join(out)


# ---------------------------------------------------------------------------- tokenizers


@dataclass
class TokenCounter:
    """A tokenizer seen through two calls; ``name`` goes into trace meta."""

    name: str
    impl: Any
    kind: str  # "tokenizers" | "transformers"

    def encode(self, text: str) -> list[int]:
        if self.kind == "tokenizers":
            return list(self.impl.encode(text, add_special_tokens=False).ids)
        return list(self.impl.encode(text, add_special_tokens=False))

    def encode_prompt(self, text: str) -> list[int]:
        """``text`` as a server encodes a completions prompt: special tokens (BOS) included,
        so the ids are those its prefix cache hashes."""
        if self.kind == "tokenizers":
            return list(self.impl.encode(text, add_special_tokens=True).ids)
        return list(self.impl.encode(text, add_special_tokens=True))

    def decode(self, ids: list[int]) -> str:
        return self.impl.decode(ids)

    def count(self, text: str) -> int:
        return len(self.encode(text))


def load_tokenizer(spec: str) -> TokenCounter:
    """A local ``tokenizer.json`` (file or folder), else ``transformers`` if installed."""
    path = Path(spec).expanduser()
    if path.is_dir() and (path / "tokenizer.json").exists():
        path = path / "tokenizer.json"
    if path.is_file():
        from tokenizers import Tokenizer

        try:
            return TokenCounter(
                name=str(spec), impl=Tokenizer.from_file(str(path)), kind="tokenizers"
            )
        except Exception as e:  # the tokenizers library raises a bare Exception
            raise TraceError(f"{path}: not a tokenizer.json file ({e})") from None
    try:
        from transformers import AutoTokenizer  # type: ignore[import-not-found]
    except ImportError:
        raise TraceError(
            f"tokenizer {spec!r}: not a local tokenizer.json and transformers is not installed"
        ) from None
    try:
        return TokenCounter(
            name=spec, impl=AutoTokenizer.from_pretrained(spec), kind="transformers"
        )
    except Exception as e:  # network / missing files: many exception types
        raise TraceError(
            f"tokenizer {spec!r} could not be loaded ({str(e).splitlines()[0]})"
        ) from None


def words(text: str) -> int:
    """Token hint for a piece of text: its words (exact for synthesised prompts on the built-in
    engine, which counts one token per word; a hint for real engines, which report usage)."""
    return max(1, len(text.split()))


def approx_tokens(text: str) -> int:
    """Token count without a tokenizer: UTF-8 bytes / 4, rounded up (OpenAI's rule of thumb
    of ~4 characters per token for English; CJK text counts ~0.75 token per character)."""
    return max(1, math.ceil(len(text.encode("utf-8")) / 4))


def exact_prompt(n: int, tok: TokenCounter, seed: int | None, index: int) -> str:
    """A prompt of exactly ``n`` tokens for ``tok`` (without special tokens).

    Start from ``n`` words, then trim through the token ids (decode the first ``n``) or pad
    with more words, re-encoding to check; decode/encode round trips are not always stable,
    so a few rounds are allowed before giving up with a clear error.
    """
    text = _slice(n, seed, (4, index))
    extra = 0
    for _ in range(12):
        ids = tok.encode(text)
        if len(ids) == n:
            return text
        if len(ids) > n:
            text = tok.decode(ids[:n])
        else:
            extra += 1
            text = text + " " + _slice(n - len(ids), seed, (6, index, extra))
    raise TraceError(f"could not build a prompt of exactly {n} tokens for {tok.name!r}")


def fill_prompts(
    df: pd.DataFrame, mode: str, seed: int | None, block_tokens: int | None = None
) -> list[str]:
    """Prompts for rows without text (rows that have text keep it)."""
    tok: TokenCounter | None = None
    if mode.startswith("tokenizer:"):
        tok = load_tokenizer(mode.split(":", 1)[1])
    elif mode != "words":
        raise TraceError(f"prompts must be 'words' or 'tokenizer:PATH', got {mode!r}")
    hashes = df["hash_ids"] if "hash_ids" in df.columns else None
    out: list[str] = []
    for i, (p, n) in enumerate(zip(df["prompt"], df["prompt_len"], strict=True)):
        if isinstance(p, str):
            out.append(p)
        elif tok is not None:
            out.append(exact_prompt(int(n), tok, seed, i))
        elif hashes is not None and len(hashes.iloc[i]) and block_tokens:
            out.append(prefix_prompt(int(n), list(hashes.iloc[i]), int(block_tokens), seed, i))
        else:
            out.append(synthesize_prompt(int(n), seed, i))
    return out


def synthetic_prompt(n: int, seed: int | None = 0, index: int = 0) -> str:
    """Alias used by the load generator: :func:`synthesize_prompt` (``n`` words)."""
    return synthesize_prompt(n, seed, index)
