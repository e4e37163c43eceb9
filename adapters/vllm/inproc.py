"""Drive :class:`HarnessScheduler` in-process with vLLM's real classes and a fake model runner.

vLLM's scheduler needs no model to run: a ``VllmConfig`` (the model folder supplies only its
``config.json``), a synthetic ``KVCacheConfig`` (as vLLM's own tests build one,
anchors-engines.md §1.10), and a ``ModelRunnerOutput`` per step. The fake runner samples one
token for every scheduled request whose computed tokens caught up (partial prefill chunks
sample nothing), exactly the contract vLLM's runner follows.

This is the vLLM adapter's host driver for :mod:`harness.engine.conformance`::

    .venv-vllm/bin/python -m adapters.vllm.inproc          # runs every scenario, JSON result

Rejection mirrors vLLM's OpenAI front end: a request whose prompt + max_tokens exceeds
``max_model_len`` is refused (400); the driver sets ``max_model_len`` to the KV capacity, as
``adapters.vllm.launch`` does for small caches.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from adapters.vllm import SCHEDULER_CLS
from adapters.vllm.scheduler import HarnessScheduler
from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.sampling_params import SamplingParams
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MODEL = Path(os.environ.get("TINY_MODEL_DIR") or ROOT / ".cache" / "tiny-llama")
SAMPLED_TOKEN = 7


def make_scheduler(
    policy: Any,
    *,
    block_size: int,
    num_blocks: int,
    token_budget: int,
    max_num_seqs: int,
    model: Path = DEFAULT_MODEL,
    prefix_caching: bool = False,
) -> HarnessScheduler:
    """A real HarnessScheduler hosting ``policy`` with ``num_blocks`` usable KV blocks.

    With ``prefix_caching``, requests need block hashes: build them with :func:`make_request`.
    """
    # prompt + max_tokens may reach capacity + 1: the last sampled token is never computed,
    # so it needs no KV slot (vLLM's own front-end rule is prompt + max_tokens <= max_model_len).
    max_len = num_blocks * block_size + 1
    mc = ModelConfig(
        model=str(model), dtype="float32", max_model_len=max_len, skip_tokenizer_init=True
    )
    sc = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max(token_budget, max_num_seqs),  # vLLM requires >= max_num_seqs
        max_model_len=max_len,
        is_encoder_decoder=False,
        async_scheduling=False,
        enable_chunked_prefill=True,
        scheduler_cls=SCHEDULER_CLS,
    )
    cc = CacheConfig(block_size=block_size, enable_prefix_caching=prefix_caching)
    cfg = VllmConfig(model_config=mc, scheduler_config=sc, cache_config=cc)
    cfg.cache_config.num_gpu_blocks = num_blocks + 1  # + vLLM's null block
    kvc = KVCacheConfig(
        num_blocks=num_blocks + 1,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(
                ["layer"],
                FullAttentionSpec(
                    block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32
                ),
            )
        ],
    )
    sched = HarnessScheduler(
        vllm_config=cfg,
        kv_cache_config=kvc,
        structured_output_manager=StructuredOutputManager(cfg),
        block_size=block_size,
    )
    sched.max_num_scheduled_tokens = token_budget  # the step budget schedule() reads
    sched.harness_policy = policy
    return sched


def make_request(
    sched: HarnessScheduler, request_id: str, tokens: list[int], max_tokens: int
) -> Request:
    """A vLLM ``Request`` for ``sched``, with block hashes when prefix caching is on (what
    ``EngineCore`` does with ``get_request_block_hasher``)."""
    hasher = None
    cc = sched.cache_config
    if cc.enable_prefix_caching:
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

        fn = get_hash_fn_by_name(cc.prefix_caching_hash_algo)
        init_none_hash(fn)
        hasher = get_request_block_hasher(sched.block_size, fn)
    sp = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    return Request(request_id, tokens, sp, None, arrival_time=time.time(), block_hasher=hasher)


class VllmDriver:
    """conformance.HostDriver over a real vLLM scheduler (one step = schedule + fake forward)."""

    def __init__(self, sched: HarnessScheduler) -> None:
        self.sched = sched
        self.rejections: dict[str, str] = {}

    def add_request(self, request_id: str, prompt_len: int, max_tokens: int) -> bool:
        limit = self.sched.max_model_len
        if prompt_len + max_tokens > limit:
            self.rejections[request_id] = (
                f"prompt {prompt_len} + max_tokens {max_tokens} exceeds max_model_len {limit} "
                "(the KV capacity + 1)"
            )
            return False
        sp = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        req = Request(request_id, [1] * prompt_len, sp, None, arrival_time=time.time())
        self.sched.add_request(req)
        return True

    def step(self) -> None:
        so = self.sched.schedule()
        ids = list(so.num_scheduled_tokens)
        sampled = []
        for rid in ids:
            r = self.sched.requests[rid]
            sampled.append([SAMPLED_TOKEN] if r.num_computed_tokens >= r.num_tokens else [])
        index = {rid: i for i, rid in enumerate(ids)}
        mro = ModelRunnerOutput(req_ids=ids, req_id_to_index=index, sampled_token_ids=sampled)
        self.sched.update_from_output(so, mro)

    def rejection(self, request_id: str) -> str | None:
        return self.rejections.get(request_id)

    def num_rejected(self) -> int:
        return len(self.rejections)

    def has_work(self) -> bool:
        return self.sched.has_unfinished_requests()


def vllm_factory(policy: Any, spec: Any) -> VllmDriver:
    """conformance host factory for the vLLM adapter."""
    return VllmDriver(
        make_scheduler(
            policy,
            block_size=spec.block_size,
            num_blocks=spec.num_blocks,
            token_budget=spec.token_budget,
            max_num_seqs=spec.max_num_seqs,
        )
    )


def run_conformance() -> dict[str, Any]:
    """Run every conformance scenario against the adapter; {name: "ok" | traceback}."""
    from harness.engine.conformance import SCENARIOS

    results: dict[str, Any] = {}
    for scenario in SCENARIOS:
        try:
            scenario(vllm_factory)
            results[scenario.__name__] = "ok"
        except Exception:  # noqa: BLE001 - reported per scenario
            results[scenario.__name__] = traceback.format_exc()
    return results


if __name__ == "__main__":
    res = run_conformance()
    print("CONFORMANCE-JSON " + json.dumps(res))
    sys.exit(0 if all(v == "ok" for v in res.values()) else 1)
