"""Fixtures for workload tests: a small local byte-level BPE tokenizer (no hub)."""

from __future__ import annotations

from pathlib import Path

import pytest

CORPUS = (
    "the quick brown fox jumps over the lazy dog while people in the city work and play "
    "music on the river under the light of the north star; numbers like 12345 and words "
    "such as internationalisation or tokenization split into pieces"
)


@pytest.fixture(scope="session")
def bpe_tokenizer_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tokenizer.json whose vocabulary is small, so common words split into several
    tokens and exact-length prompts need the trim/pad loop."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator([CORPUS] * 20, trainer=trainer)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return path
