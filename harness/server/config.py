"""What ``harness serve`` and the embedded server take: one validated config, and the
engine keywords it resolves to (same flags, same engine as ``harness simulate``)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from harness.engine.costmodel import DEFAULT_COST_MODEL
from harness.server.faults import (
    parse_faults,
)
from harness.workload.tiers import parse_tiers

log = logging.getLogger("harness.serve")

DEFAULT_MODEL = "harness-builtin"


class ServerConfig(BaseModel):
    """Everything ``harness serve`` / :func:`embedded` take; validated, never mutated."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    policy: str = Field("vllm", description="registered policy name (harness policies)")
    policy_params: dict[str, Any] = Field(default_factory=dict, description="policy kwargs")
    cost_model: str = Field(DEFAULT_COST_MODEL, description="cost-model preset or JSON path")
    kv_tokens: int | None = Field(None, ge=1, description="KV capacity in tokens; None=preset")
    engine: dict[str, Any] = Field(
        default_factory=dict, description="extra EngineConfig fields (block_size, ...)"
    )
    speed: float = Field(1.0, gt=0, description="wall seconds = model seconds / speed")
    model: str = Field(DEFAULT_MODEL, description="model name served and echoed")
    api_key: str | None = Field(None, description="required Bearer token; None = open")
    faults: str | None = Field(None, description="fault spec, see harness.server.faults")
    fault_log: Path | None = Field(None, description="JSONL file recording injected faults")
    tiers: str | None = Field(None, description="tier spec to resolve SLOs from a tier name")
    record_requests: bool = Field(
        False, description="keep per-request model times for GET /harness/requests"
    )
    spin_s: float = Field(
        1e-3,
        ge=0,
        description="end each step's sleep this early and yield-spin to the exact target "
        "(epoll rounds timeouts up to whole ms)",
    )
    max_catchup_s: float = Field(
        0.25, gt=0, description="wall lateness (s) beyond which the loop resynchronises"
    )
    prefix_caching: bool = Field(
        True,
        description="the engine core's prefix cache (on, as in vLLM); off for comparisons "
        "with a simulation whose requests carry no prompt identity",
    )
    replicas: int = Field(1, ge=1, le=256, description="engine cores behind the endpoint")
    router: str = Field("round-robin", description="router over replicas (harness policies)")
    router_params: dict[str, Any] = Field(default_factory=dict, description="router kwargs")

    @field_validator("faults")
    @classmethod
    def _check_faults(cls, v: str | None) -> str | None:
        parse_faults(v)
        return v

    @field_validator("tiers")
    @classmethod
    def _check_tiers(cls, v: str | None) -> str | None:
        if v is not None:
            parse_tiers(v)
        return v


HIGH_WATER = 1 << 18  # bytes queued in a socket before direct writes hand over to the handler


def engine_kwargs(cfg: ServerConfig) -> dict[str, Any]:
    """EngineConfig keywords, with KV capacity resolved exactly as ``harness simulate`` does
    (SimulateConfig.engine_config): ``kv_tokens`` if given, else the cost-model preset's GPU
    memory / weights / KV bytes per token, else unbounded. Same flags, same engine."""
    from harness.engine.costmodel import HARDWARE
    from harness.engine.simulate import UNBOUNDED_KV_TOKENS

    kw = dict(cfg.engine)
    if not cfg.prefix_caching:
        kw["prefix_caching"] = False
    if cfg.kv_tokens is not None:
        kw["kv_tokens"] = cfg.kv_tokens
    elif not {"num_blocks", "kv_tokens", "gpu_mem_gib"} & set(kw):
        hw = HARDWARE.get(cfg.cost_model.partition(":")[0], {})
        if hw.get("gpu_mem_gib") and hw.get("kv_bytes_per_token"):
            kw.update(hw)
        else:
            kw["kv_tokens"] = UNBOUNDED_KV_TOKENS
    return kw
