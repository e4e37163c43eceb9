"""Engine configuration: KV capacity, batch caps and what the scheduler may know.

KV capacity can be given three ways (first one set wins): ``num_blocks``, ``kv_tokens`` (rounded
down to whole blocks), or a GPU memory size with a model's KV bytes per token and weights size
(the way vLLM and Vidur's memory planner size the cache, anchors-engines.md §1.6 and §5.1).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

GIB = 1024**3


class EngineConfig(BaseModel):
    """Knobs of the engine core. Defaults follow vLLM's ``SchedulerConfig`` class defaults for
    A100-class cards (``max_num_batched_tokens=2048``, ``max_num_seqs=256``;
    anchors-engines.md §1.6).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    block_size: int = Field(16, ge=1, description="KV block size in tokens (vLLM CUDA default 16)")
    num_blocks: int | None = Field(None, ge=1, description="KV capacity in blocks")
    kv_tokens: int | None = Field(None, ge=1, description="KV capacity in tokens (whole blocks)")
    gpu_mem_gib: float | None = Field(None, gt=0, description="GPU memory, GiB")
    gpu_memory_utilization: float = Field(
        0.9, gt=0, le=1, description="share of GPU memory the engine may use (vLLM default 0.9)"
    )
    model_weights_gib: float = Field(0.0, ge=0, description="model weights, GiB")
    kv_bytes_per_token: int | None = Field(
        None, ge=1, description="KV bytes per token (Llama-2-7B fp16: 524288)"
    )
    token_budget: int = Field(
        2048, ge=1, description="max tokens per step (max_num_batched_tokens)"
    )
    max_num_seqs: int = Field(256, ge=1, description="max requests holding KV at once")
    prefix_caching: bool = Field(
        True,
        description=(
            "vLLM v1 automatic prefix caching (on by default, as in vLLM); only requests "
            "added with a PromptIdentity can hit"
        ),
    )
    known_output_lengths: bool = Field(
        False,
        description="expose max_tokens as predicted_output_len to the policy (oracle lengths)",
    )

    @model_validator(mode="after")
    def _capacity_given(self) -> EngineConfig:
        no_size = self.num_blocks is None and self.kv_tokens is None
        if no_size and (self.gpu_mem_gib is None or self.kv_bytes_per_token is None):
            raise ValueError(
                "KV capacity unknown: set num_blocks, kv_tokens, or gpu_mem_gib together "
                "with kv_bytes_per_token"
            )
        if self.kv_tokens is not None and self.kv_tokens < self.block_size:
            raise ValueError(f"kv_tokens={self.kv_tokens} is less than one block")
        if self.total_blocks < 1:
            raise ValueError("the GPU memory left after the weights holds no KV block")
        return self

    @property
    def total_blocks(self) -> int:
        """KV capacity in blocks."""
        if self.num_blocks is not None:
            return self.num_blocks
        if self.kv_tokens is not None:
            return self.kv_tokens // self.block_size
        assert self.gpu_mem_gib is not None and self.kv_bytes_per_token is not None
        free = self.gpu_mem_gib * self.gpu_memory_utilization - self.model_weights_gib
        return int(free * GIB // (self.kv_bytes_per_token * self.block_size))

    @property
    def capacity_tokens(self) -> int:
        return self.total_blocks * self.block_size

    def describe(self) -> dict[str, Any]:
        """Config plus the resolved capacity, for run.json."""
        d = self.model_dump()
        d["total_blocks"] = self.total_blocks
        d["capacity_tokens"] = self.capacity_tokens
        return d
