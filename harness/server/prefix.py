"""The built-in server's prefix cache: prompt tokens for the core, vLLM's counters (issue 16).

The server counts one token per whitespace-separated word (protocol.count_text_tokens), so its
token ids are the words themselves: two prompts that start with the same words share cached
blocks, as two token-identical prompts do in vLLM. Chat messages add their role as the
``CHAT_TOKENS_PER_MESSAGE`` tokens the count charges per message. A ``harness.prompt_len``
hint that disagrees with the words keeps the identity aligned with the engine's length: the
words are cut to the hint, or padded with tokens no other request has.

``/metrics`` exports the engine's hit counters under vLLM's names
(``vllm:prefix_cache_queries_total``, ``vllm:prefix_cache_hits_total``), so
:class:`harness.loadgen.prefix_poller.MetricsPoller` reads the built-in server as it reads vLLM.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from harness.engine.prefix_cache import PromptIdentity
from harness.server.protocol import CHAT_TOKENS_PER_MESSAGE, ParsedRequest


def _words(body: dict[str, Any], chat: bool) -> list[Any]:
    if chat:
        out: list[Any] = []
        for m in body.get("messages") or []:
            role = m.get("role") if isinstance(m, dict) else None
            out += [f"<|{role}|>"] * CHAT_TOKENS_PER_MESSAGE
            content = m.get("content") if isinstance(m, dict) else None
            if isinstance(content, list):
                content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
            if isinstance(content, str):
                out += content.split()
        return out
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt.split()
    if isinstance(prompt, list):
        return list(prompt)  # token ids
    return []


def prompt_identity(body: dict[str, Any], req: ParsedRequest, rid: str) -> PromptIdentity:
    """The request's prompt as tokens (words), exactly ``req.prompt_len`` of them."""
    words = _words(body, req.chat)
    n = req.prompt_len
    ids = [hash(w) for w in words[:n]]
    if len(ids) < n:  # a hint longer than the text: unique filler tokens
        ids += [hash((rid, i)) for i in range(len(ids), n)]
    return PromptIdentity.from_token_ids(ids)


def prefix_totals(host: Any) -> tuple[int, int]:
    """(queries, hits) summed over the host's engine cores (one, or a cluster's replicas)."""
    hosts = getattr(host, "hosts", None) or [host]
    q = sum(h.core.prefix_cache_queries for h in hosts)
    return q, sum(h.core.prefix_cache_hits for h in hosts)


class PrefixCounters(Collector):
    """vLLM's prefix-cache counters, read from the cores at scrape time."""

    def __init__(self, host: Any, labels: dict[str, str]) -> None:
        self.host = host
        self.labels = labels

    def collect(self) -> Iterator[CounterMetricFamily]:  # noqa: D102
        q, h = prefix_totals(self.host)
        names, vals = list(self.labels), list(self.labels.values())
        for name, doc, v in (
            ("vllm:prefix_cache_queries", "Prefix cache queries, in terms of tokens.", q),
            ("vllm:prefix_cache_hits", "Prefix cache hits, in terms of tokens.", h),
        ):
            f = CounterMetricFamily(name, doc, labels=names)
            f.add_metric(vals, float(v))
            yield f


__all__ = ["PrefixCounters", "prefix_totals", "prompt_identity"]
