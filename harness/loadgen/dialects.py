"""Engine dialects: what each engine accepts in a request body, and what its /metrics call things.

A dialect decides the request *extras*; the streaming format (OpenAI SSE chunks) is shared.

- ``openai``: plain OpenAI fields only (``max_tokens``/``max_completion_tokens``, ``stream``,
  ``stream_options.include_usage``), for any OpenAI-compatible server; no tier extras.
- ``vllm``: + ``ignore_eos``, ``stream_options.continuous_usage_stats``, the tier as
  ``priority`` (int, lower = earlier) and ``vllm_xargs: {tier, ttft_slo_ms, tbt_slo_ms}``
  (anchors-engines.md §1.9: ``vllm_xargs`` is ``dict[str, str|int|float|list]`` and lands in
  ``SamplingParams.extra_args``, so no null values are sent).
- ``sglang``: + ``ignore_eos``, continuous usage, ``priority`` and ``custom_params`` with the
  same keys (anchors-engines.md §3.4: ``sampling_params.custom_params`` survives IPC and is
  readable in the scheduler; SGLang's OpenAI ``CompletionRequest`` and
  ``ChatCompletionRequest`` declare ``custom_params``, ``priority``, ``ignore_eos`` and
  ``stream_options.continuous_usage_stats``: verified in sglang 0.5.23
  ``srt/entrypoints/openai/protocol.py``). Only ``sglang`` also speaks SGLang's native
  ``/generate`` (``Endpoint.GENERATE``, :func:`generate_body`; its stream is read by
  ``harness.loadgen.client.interpret_sglang_generate``). SGLang's *own* priority scheduling
  (``--enable-priority-scheduling``) treats higher values as more important unless started
  with ``--schedule-low-priority-values-first``; the harness sends vLLM's polarity.
- ``builtin``: the built-in engine server (``harness serve``): ``vllm`` + the exact length hint
  ``"harness": {"prompt_len": N, "output_len": M}``, which only that server reads.

``METRIC_NAMES[dialect]`` names the Prometheus series for the sampler (anchors-engines.md §2
for vLLM, §3.5 for SGLang); a missing key means the engine has no such series.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from harness.workload.tiers import Tier


class Endpoint(StrEnum):
    COMPLETIONS = "completions"
    CHAT = "chat"
    GENERATE = "generate"  # SGLang's native streaming API (sglang dialect only)


PATHS = {
    Endpoint.COMPLETIONS: "/v1/completions",
    Endpoint.CHAT: "/v1/chat/completions",
    Endpoint.GENERATE: "/generate",
}

# Keys: kv_usage (0..1 gauge), running, waiting (gauges), preemptions (counter, exported name).
METRIC_NAMES: dict[str, dict[str, str]] = {
    "vllm": {
        "kv_usage": "vllm:kv_cache_usage_perc",
        "running": "vllm:num_requests_running",
        "waiting": "vllm:num_requests_waiting",
        "preemptions": "vllm:num_preemptions_total",
    },
    "sglang": {
        "kv_usage": "sglang:token_usage",
        "running": "sglang:num_running_reqs",
        "waiting": "sglang:num_queue_reqs",
        "preemptions": "sglang:num_retracted_requests_total",
    },
    "openai": {},
}
# The built-in server exports vLLM's names so dashboards and the sampler treat it like vLLM.
METRIC_NAMES["builtin"] = dict(METRIC_NAMES["vllm"])


@dataclass(frozen=True)
class Dialect:
    """Builds request bodies for one engine family. Stateless; one instance per run."""

    name: str
    ignore_eos: bool = True
    continuous_usage: bool = True
    tier_carrier: str | None = None  # "vllm_xargs" | "custom_params" | None
    send_priority: bool = True
    length_hint: bool = False

    def path(self, endpoint: Endpoint) -> str:
        if endpoint is Endpoint.GENERATE and self.name != "sglang":
            raise ValueError("--endpoint generate is SGLang's native API: use --engine sglang")
        return PATHS[endpoint]

    def interpreter(self, endpoint: Endpoint) -> Any:
        """The client's stream interpreter for ``endpoint`` (OpenAI chunks or SGLang's
        native ``/generate`` messages)."""
        from harness.loadgen import client

        if endpoint is Endpoint.GENERATE:
            return client.interpret_sglang_generate
        return client.interpret_openai

    def body(
        self,
        endpoint: Endpoint,
        model: str,
        prompt: str,
        prompt_len: int,
        output_len: int,
        tier: Tier | None,
        extra: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The JSON body for one request (anchors-harness.md §6.1 field for field)."""
        if endpoint is Endpoint.GENERATE:
            self.path(endpoint)  # sglang only
            return generate_body(
                prompt, output_len, tier, self.ignore_eos, self.send_priority, extra
            )
        stream_options: dict[str, Any] = {"include_usage": True}
        if self.continuous_usage:
            stream_options["continuous_usage_stats"] = True
        body: dict[str, Any] = {"model": model}
        if endpoint is Endpoint.CHAT:
            body["messages"] = [{"role": "user", "content": prompt}]
            body["max_completion_tokens"] = output_len
        else:
            body["prompt"] = prompt
            body["max_tokens"] = output_len
        body["stream"] = True
        body["stream_options"] = stream_options
        if self.ignore_eos:
            body["ignore_eos"] = True
        if tier is not None and self.tier_carrier is not None:
            if self.send_priority:
                body["priority"] = int(tier.priority)
            body[self.tier_carrier] = tier_extras(tier)
        if self.length_hint:
            body["harness"] = {"prompt_len": int(prompt_len), "output_len": int(output_len)}
        if extra:
            body.update(extra)
        return body


def tier_extras(tier: Tier) -> dict[str, str | float]:
    """``{tier, ttft_slo_ms, tbt_slo_ms}``; an SLO the tier does not set is left out (vLLM's
    ``vllm_xargs`` accepts only str/int/float/list values)."""
    out: dict[str, str | float] = {"tier": tier.name}
    if tier.ttft_slo_s is not None:
        out["ttft_slo_ms"] = round(tier.ttft_slo_s * 1000.0, 6)
    if tier.tbt_slo_s is not None:
        out["tbt_slo_ms"] = round(tier.tbt_slo_s * 1000.0, 6)
    return out


def generate_body(
    prompt: str,
    output_len: int,
    tier: Tier | None,
    ignore_eos: bool = True,
    send_priority: bool = True,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """SGLang ``/generate`` body: ``{text, sampling_params: {max_new_tokens, ignore_eos,
    custom_params}, stream: true, priority}`` (sglang 0.5.23 ``GenerateReqInput`` and
    ``sglang/api/v1/api_types.py`` ``SamplingParams``, which rejects unknown keys, so only
    those three are sent). ``extra`` merges at the top level; an ``extra["sampling_params"]``
    dict merges into the sampling parameters."""
    sp: dict[str, Any] = {"max_new_tokens": int(output_len)}
    if ignore_eos:
        sp["ignore_eos"] = True
    body: dict[str, Any] = {"text": prompt, "sampling_params": sp, "stream": True}
    if tier is not None:
        sp["custom_params"] = tier_extras(tier)
        if send_priority:
            body["priority"] = int(tier.priority)
    if extra:
        extra = dict(extra)
        more_sp = extra.pop("sampling_params", None)
        if isinstance(more_sp, dict):
            sp.update(more_sp)
        body.update(extra)
    return body


DIALECTS = ("openai", "vllm", "sglang", "builtin")


def get_dialect(name: str, *, send_priority: bool = True) -> Dialect:
    """The dialect called ``name`` (one of :data:`DIALECTS`); ``ValueError`` otherwise."""
    if name == "openai":
        return Dialect("openai", ignore_eos=False, continuous_usage=False)
    if name == "vllm":
        return Dialect("vllm", tier_carrier="vllm_xargs", send_priority=send_priority)
    if name == "sglang":
        return Dialect("sglang", tier_carrier="custom_params", send_priority=send_priority)
    if name == "builtin":
        return Dialect(
            "builtin", tier_carrier="vllm_xargs", send_priority=send_priority, length_hint=True
        )
    raise ValueError(f"unknown engine dialect {name!r} (choose from {', '.join(DIALECTS)})")
