"""Build the tiny random Llama that the CPU vLLM tier serves (weights cannot be downloaded here).

Recipe from /work/shared/notes/vllm-cpu.md: a byte-level BPE tokenizer trained on local text,
wrapped in PreTrainedTokenizerFast with bos/eos and a trivial chat template, and a 2-layer
LlamaForCausalLM with head_dim 64 (the CPU attention backend rejects 16), fixed seed.

Usage: python build_tiny_model.py OUT_DIR
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def _corpus() -> list[str]:
    """Local text to train the tokenizer on: the Python sources of a few installed packages."""
    import json as _json  # stdlib modules are plain, always-present text

    root = Path(_json.__file__).resolve().parent.parent
    texts: list[str] = []
    for p in sorted(root.glob("*.py"))[:200]:
        try:
            texts.append(p.read_text(errors="ignore"))
        except OSError:
            continue
    # Plain English too, so chat-style prompts tokenize to a realistic number of tokens.
    texts.append(("the quick brown fox jumps over the lazy dog. " * 50).strip())
    # The load generator's filler prompt is "hi hi hi ..." (harness.loadgen.dispatcher
    # .synthetic_prompt): make " hi" one token so prompt lengths come out exact.
    texts.extend(["hi" + " hi" * 400] * 20)
    return texts


def build(out: Path, seed: int = 0) -> None:
    """Write tokenizer and random-weight model into ``out``."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=2048,
        special_tokens=["<s>", "</s>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    fast.chat_template = CHAT_TEMPLATE

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        hidden_size=128,
        num_attention_heads=2,  # head_dim 64
        num_key_value_heads=1,
        intermediate_size=256,
        num_hidden_layers=2,
        vocab_size=len(fast),
        max_position_embeddings=4096,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(cfg)
    # Written beside ``out`` and renamed into place, so two setups building it at once (CI
    # installs the vLLM and SGLang tiers concurrently) never leave a half-written model: the
    # first rename wins and the other build is dropped (same seed, same files).
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        model.save_pretrained(tmp)
        fast.save_pretrained(tmp)
        if (out / "config.json").exists() and (out / "tokenizer.json").exists():
            return
        if out.exists():
            # an incomplete model from an interrupted older build
            shutil.rmtree(out, ignore_errors=True)
        try:
            tmp.rename(out)
        except OSError:
            if not (out / "config.json").exists():  # not a concurrent build that won
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: build_tiny_model.py OUT_DIR")
    build(Path(sys.argv[1]))
    print(f"[setup] tiny model written to {sys.argv[1]}")
