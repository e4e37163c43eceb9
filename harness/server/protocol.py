"""OpenAI-compatible request parsing and vLLM-format response encoding for the built-in server.

Why a module of its own: validation and byte formatting are pure functions, tested without a
socket, and the streaming hot path (one SSE event per token, >= 10k tokens/s) needs
pre-encoded byte templates rather than a ``json.dumps`` of a dict per token.

Prompt token rule (documented, engineer W synthesises prompts to match): free text counts one
token per whitespace-separated word, at least 1; a chat request counts the sum over its
messages' contents plus 4 per message. Token-id prompts count their ids. The harness length
hint ``"harness": {"prompt_len": N, "output_len": M}`` overrides the counted prompt length and
gives the policy the known output length, so a trace replays with exact lengths.

Generation: the engine always produces exactly ``max_tokens`` tokens (ignore-EOS semantics,
policies/base.py host rule 5), whatever ``ignore_eos`` says; the text is deterministic filler,
one word per token, so the word rule re-counts it exactly.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from typing import Any

DEFAULT_MAX_TOKENS = 16  # OpenAI's completions default; used when a body gives no limit
CHAT_TOKENS_PER_MESSAGE = 4

FILLER_WORDS = (
    "the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while",
    "serving", "engines", "schedule", "tokens", "under", "memory", "limits", "and",
    "every", "step", "counts", "one", "more", "word", "for", "each", "request", "in",
    "flight", "until", "it", "ends",
)  # fmt: skip


_SPACED = tuple(" " + w for w in FILLER_WORDS)


class RequestError(ValueError):
    """A client error: HTTP ``status`` with a message that names the offending ``param``."""

    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status


def error_body(message: str, *, param: str | None = None, code: int = 400) -> dict[str, Any]:
    """OpenAI-style error object (vLLM returns the same shape)."""
    kind = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError"}.get(
        code, "InternalServerError"
    )
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def count_text_tokens(text: str) -> int:
    """One token per whitespace-separated word, minimum 1 (the documented rule)."""
    return max(1, len(text.split()))


def _message_text(content: Any, idx: int) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or not isinstance(part.get("text", ""), str):
                raise RequestError(
                    "content parts must be objects with a string 'text'",
                    f"messages[{idx}].content[{j}]",
                )
            parts.append(part.get("text", ""))
        return " ".join(parts)
    raise RequestError("content must be a string or a list of parts", f"messages[{idx}].content")


def count_chat_tokens(messages: list[dict[str, Any]]) -> int:
    """Sum of the words of every message's content plus 4 per message."""
    total = 0
    for i, m in enumerate(messages):
        total += len(_message_text(m.get("content"), i).split()) + CHAT_TOKENS_PER_MESSAGE
    return total


@dataclass(slots=True)
class ParsedRequest:
    """Everything the server needs from one body, validated."""

    chat: bool
    prompt_len: int
    max_tokens: int
    predicted_output_len: int | None
    stream: bool
    include_usage: bool
    continuous_usage: bool
    priority: int | None
    tier: str | None
    ttft_slo_s: float | None
    tbt_slo_s: float | None
    model: str | None
    debug_timing: bool = False
    xargs: dict[str, Any] = field(default_factory=dict)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _opt_bool(body: dict[str, Any], key: str, prefix: str = "") -> bool:
    v = body.get(key, False)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise RequestError(f"'{prefix}{key}' must be a boolean", prefix + key)
    return v


def _opt_int(body: dict[str, Any], key: str, *, minimum: int, prefix: str = "") -> int | None:
    v = body.get(key)
    if v is None:
        return None
    if not _is_int(v):
        raise RequestError(f"'{prefix}{key}' must be an integer", prefix + key)
    if v < minimum:
        raise RequestError(f"'{prefix}{key}' must be >= {minimum}, got {v}", prefix + key)
    return v


def _obj(body: dict[str, Any], key: str) -> Any:
    v = body.get(key)
    return {} if v is None else v


def _slo_from_xargs(xargs: dict[str, Any], name: str) -> float | None:
    """SLO in seconds from ``<name>_slo_ms`` (what the vllm/builtin dialects send),
    ``<name>_ms`` or ``<name>_slo_s``."""
    keys = ((f"{name}_slo_ms", 1e-3), (f"{name}_ms", 1e-3), (f"{name}_slo_s", 1.0))
    for key, scale in keys:
        if key in xargs and xargs[key] is not None:
            v = xargs[key]
            if not _is_num(v) or v <= 0:
                raise RequestError(
                    f"'vllm_xargs.{key}' must be a positive number", f"vllm_xargs.{key}"
                )
            return float(v) * scale
    return None


def parse_request(body: Any, *, chat: bool) -> ParsedRequest:
    """Validate a /v1/completions or /v1/chat/completions body; raise :class:`RequestError`."""
    if not isinstance(body, dict):
        raise RequestError("request body must be a JSON object", None)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise RequestError("'model' must be a string", "model")

    if chat:
        messages = body.get("messages")
        if messages is None:
            raise RequestError("'messages' is required", "messages")
        if not isinstance(messages, list) or not messages:
            raise RequestError("'messages' must be a non-empty list", "messages")
        for i, m in enumerate(messages):
            if not isinstance(m, dict):
                raise RequestError("each message must be an object", f"messages[{i}]")
            if not isinstance(m.get("role"), str):
                raise RequestError("message 'role' must be a string", f"messages[{i}].role")
        counted = count_chat_tokens(messages)
        max_tokens = _opt_int(body, "max_completion_tokens", minimum=1)
        if max_tokens is None:
            max_tokens = _opt_int(body, "max_tokens", minimum=1)
    else:
        if "prompt" not in body or body["prompt"] is None:
            raise RequestError("'prompt' is required", "prompt")
        counted = _count_prompt(body["prompt"])
        max_tokens = _opt_int(body, "max_tokens", minimum=1)

    n = _opt_int(body, "n", minimum=1)
    if n is not None and n != 1:
        raise RequestError("only n=1 is supported", "n")
    stream = _opt_bool(body, "stream")
    opts = _obj(body, "stream_options")
    if not isinstance(opts, dict):
        raise RequestError("'stream_options' must be an object", "stream_options")
    include_usage = _opt_bool(opts, "include_usage", "stream_options.")
    continuous = _opt_bool(opts, "continuous_usage_stats", "stream_options.")
    _opt_bool(body, "ignore_eos")  # accepted and validated; generation is always exact

    priority = body.get("priority")
    if priority is not None and not _is_int(priority):
        raise RequestError("'priority' must be an integer", "priority")

    xargs = _obj(body, "vllm_xargs")
    if not isinstance(xargs, dict):
        raise RequestError("'vllm_xargs' must be an object", "vllm_xargs")
    tier = xargs.get("tier")
    if tier is not None and not isinstance(tier, str):
        raise RequestError("'vllm_xargs.tier' must be a string", "vllm_xargs.tier")
    ttft = _slo_from_xargs(xargs, "ttft")
    tbt = _slo_from_xargs(xargs, "tbt")

    hint = _obj(body, "harness")
    if not isinstance(hint, dict):
        raise RequestError("'harness' must be an object", "harness")
    prompt_len = _opt_int(hint, "prompt_len", minimum=1, prefix="harness.")
    output_len = _opt_int(hint, "output_len", minimum=1, prefix="harness.")
    debug_timing = _opt_bool(hint, "debug_timing", "harness.")
    if max_tokens is None:
        max_tokens = output_len if output_len is not None else DEFAULT_MAX_TOKENS
    return ParsedRequest(
        chat=chat,
        prompt_len=prompt_len if prompt_len is not None else counted,
        max_tokens=max_tokens,
        predicted_output_len=output_len,
        stream=stream,
        include_usage=include_usage or continuous,
        continuous_usage=continuous,
        priority=priority,
        tier=tier,
        ttft_slo_s=ttft,
        tbt_slo_s=tbt,
        model=model,
        debug_timing=debug_timing,
        xargs=xargs,
    )


def _count_prompt(prompt: Any) -> int:
    if isinstance(prompt, str):
        return count_text_tokens(prompt)
    if isinstance(prompt, list):
        if not prompt:
            raise RequestError("'prompt' must not be empty", "prompt")
        if all(_is_int(t) for t in prompt):
            return len(prompt)
        if len(prompt) == 1:
            return _count_prompt(prompt[0])
        raise RequestError("batched prompts are not supported; send one prompt", "prompt")
    raise RequestError("'prompt' must be a string or a list of token ids", "prompt")


def filler_text(start: int, n: int, salt: int = 0) -> str:
    """``n`` deterministic filler words, each with a leading space (one token per word)."""
    k = len(FILLER_WORDS)
    if n == 1:
        return _SPACED[(salt + start) % k]
    return "".join(_SPACED[(salt + start + i) % k] for i in range(n))


class StreamEncoder:
    """Pre-encoded SSE byte templates for one request's stream in vLLM's chunk format.

    Completions: ``{"id","object":"text_completion","created","model","choices":[{"index":0,
    "text","logprobs":null,"finish_reason","stop_reason":null}]}``; chat:
    ``"object":"chat.completion.chunk"`` with ``delta`` instead of ``text`` and a first
    role-only delta (vLLM sends it with the first output). Usage goes in a final
    ``choices: []`` chunk when ``include_usage``, and in every chunk when
    ``continuous_usage_stats`` (vLLM's serving_completion / serving_chat behaviour).
    """

    __slots__ = ("chat", "rid", "created", "model", "prompt_len", "continuous", "salt", "_head")

    def __init__(
        self, *, chat: bool, rid: str, model: str, prompt_len: int, continuous: bool
    ) -> None:
        self.chat = chat
        self.rid = rid
        self.created = int(time.time())
        self.model = model
        self.prompt_len = prompt_len
        self.continuous = continuous
        self.salt = sum(rid.encode()) % len(FILLER_WORDS)
        obj = "chat.completion.chunk" if chat else "text_completion"
        head = {"id": rid, "object": obj, "created": self.created, "model": model}
        self._head = "data: " + json.dumps(head, separators=(",", ":"))[:-1] + ',"choices":'

    def _usage(self, completion: int) -> str:
        p = self.prompt_len
        return (
            f'"usage":{{"prompt_tokens":{p},"total_tokens":{p + completion},'
            f'"completion_tokens":{completion}}}'
        )

    def role_chunk(self) -> bytes:
        """Chat only: the role delta vLLM emits together with the first token."""
        extra = "," + self._usage(0) if self.continuous else ""
        return (
            self._head + '[{"index":0,"delta":{"role":"assistant","content":""},'
            '"logprobs":null,"finish_reason":null}]' + extra + "}\n\n"
        ).encode()

    def token_chunk(
        self, start: int, n: int, finished: bool, t_sched: float | None = None
    ) -> bytes:
        """One event carrying output tokens ``start .. start+n-1`` (n > 1 only when coalesced)."""
        text = filler_text(start, n, self.salt)
        fin = '"length"' if finished else "null"
        if self.chat:
            choice = (
                f'[{{"index":0,"delta":{{"content":"{text}"}},"logprobs":null,'
                f'"finish_reason":{fin}}}]'
            )
        else:
            choice = (
                f'[{{"index":0,"text":"{text}","logprobs":null,'
                f'"finish_reason":{fin},"stop_reason":null}}]'
            )
        extra = "," + self._usage(start + n) if self.continuous else ""
        if t_sched is not None:
            extra += f',"harness_t_sched":{t_sched!r}'
        return (self._head + choice + extra + "}\n\n").encode()

    def usage_chunk(self, completion: int) -> bytes:
        """Final ``choices: []`` chunk with the totals (``stream_options.include_usage``)."""
        return (self._head + "[]," + self._usage(completion) + "}\n\n").encode()

    def malformed_chunk(self) -> bytes:
        """A deliberately broken JSON event (fault injection)."""
        return (self._head + '[{"index":0,"text":"\n\n').encode()

    def full_response(self, completion: int) -> dict[str, Any]:
        """The non-streaming body: all tokens in one choice, with usage."""
        text = filler_text(0, completion, self.salt)
        p = self.prompt_len
        usage = {
            "prompt_tokens": p,
            "total_tokens": p + completion,
            "completion_tokens": completion,
        }
        if self.chat:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": "length",
            }
            obj = "chat.completion"
        else:
            choice = {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": "length",
                "stop_reason": None,
            }
            obj = "text_completion"
        return {
            "id": self.rid,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": usage,
        }


DONE = b"data: [DONE]\n\n"
