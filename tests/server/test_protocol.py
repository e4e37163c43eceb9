"""Request validation, the prompt token rule and the vLLM chunk format (harness.server.protocol)."""

from __future__ import annotations

import json

import pytest

from harness.server.protocol import (
    DONE,
    RequestError,
    StreamEncoder,
    count_chat_tokens,
    count_text_tokens,
    parse_request,
)


def _events(data: bytes) -> list[str]:
    text = data.decode()
    assert text.endswith("\n\n")
    return [e.removeprefix("data: ") for e in text.split("\n\n") if e]


def test_word_rule_counts_whitespace_words_with_minimum_one():
    assert count_text_tokens("a b  c\nd\te") == 5
    assert count_text_tokens("") == 1
    assert count_text_tokens("   ") == 1


def test_chat_rule_sums_contents_plus_four_per_message():
    msgs = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "one two"}, {"type": "text"}]},
        {"role": "assistant", "content": None},
    ]
    assert count_chat_tokens(msgs) == 2 + 2 + 0 + 3 * 4


def test_completion_body_fields():
    r = parse_request(
        {
            "model": "m",
            "prompt": "hello there world",
            "max_tokens": 7,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
            "priority": 3,
            "vllm_xargs": {"tier": "paid", "ttft_slo_ms": 2000, "tbt_slo_ms": 100},
        },
        chat=False,
    )
    assert (r.prompt_len, r.max_tokens, r.stream, r.include_usage) == (3, 7, True, True)
    assert (r.priority, r.tier, r.ttft_slo_s, r.tbt_slo_s) == (3, "paid", 2.0, 0.1)
    assert r.predicted_output_len is None and not r.continuous_usage


def test_length_hint_overrides_counted_prompt_and_sets_known_output():
    r = parse_request({"prompt": "x", "harness": {"prompt_len": 500, "output_len": 40}}, chat=False)
    assert (r.prompt_len, r.max_tokens, r.predicted_output_len) == (500, 40, 40)
    r = parse_request(
        {
            "messages": [{"role": "user", "content": "hi"}],
            "max_completion_tokens": 9,
            "harness": {"output_len": 40},
        },
        chat=True,
    )
    assert (r.prompt_len, r.max_tokens, r.predicted_output_len) == (5, 9, 40)


def test_token_id_prompts_count_ids_and_default_max_tokens_is_16():
    r = parse_request({"prompt": [1, 2, 3, 4]}, chat=False)
    assert (r.prompt_len, r.max_tokens) == (4, 16)


@pytest.mark.parametrize(
    ("body", "chat", "param"),
    [
        ({}, False, "prompt"),
        ({"prompt": 5}, False, "prompt"),
        ({"prompt": ["a", "b"]}, False, "prompt"),
        ({"prompt": "a", "max_tokens": -1}, False, "max_tokens"),
        ({"prompt": "a", "max_tokens": 0}, False, "max_tokens"),
        ({"prompt": "a", "max_tokens": "5"}, False, "max_tokens"),
        ({"prompt": "a", "max_tokens": True}, False, "max_tokens"),
        ({"prompt": "a", "stream": "yes"}, False, "stream"),
        ({"prompt": "a", "priority": 1.5}, False, "priority"),
        ({"prompt": "a", "n": 2}, False, "n"),
        ({"prompt": "a", "vllm_xargs": []}, False, "vllm_xargs"),
        ({"prompt": "a", "vllm_xargs": {"tier": 1}}, False, "vllm_xargs.tier"),
        ({"prompt": "a", "vllm_xargs": {"tbt_slo_ms": -5}}, False, "vllm_xargs.tbt_slo_ms"),
        ({"prompt": "a", "harness": {"prompt_len": 0}}, False, "harness.prompt_len"),
        (
            {"prompt": "a", "stream_options": {"include_usage": 1}},
            False,
            "stream_options.include_usage",
        ),
        ({}, True, "messages"),
        ({"messages": []}, True, "messages"),
        ({"messages": [{"content": "x"}]}, True, "messages[0].role"),
        ({"messages": [{"role": "user", "content": 3}]}, True, "messages[0].content"),
        (
            {"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": -2},
            True,
            "max_completion_tokens",
        ),
    ],
)
def test_invalid_bodies_name_the_field(body, chat, param):
    with pytest.raises(RequestError) as ei:
        parse_request(body, chat=chat)
    assert ei.value.param == param
    assert ei.value.status == 400


def test_completion_chunks_parse_and_follow_vllm_format():
    enc = StreamEncoder(chat=False, rid="cmpl-1", model="m", prompt_len=3, continuous=True)
    evs = [
        json.loads(e) for e in _events(enc.token_chunk(0, 1, False) + enc.token_chunk(1, 2, True))
    ]
    first, last = evs
    assert first["object"] == "text_completion" and first["model"] == "m"
    assert first["id"] == "cmpl-1" and isinstance(first["created"], int)
    assert first["choices"][0]["finish_reason"] is None
    assert len(first["choices"][0]["text"].split()) == 1
    assert len(last["choices"][0]["text"].split()) == 2
    assert last["choices"][0]["finish_reason"] == "length"
    assert last["usage"] == {"prompt_tokens": 3, "total_tokens": 6, "completion_tokens": 3}
    usage = json.loads(_events(enc.usage_chunk(3))[0])
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 3
    assert _events(DONE) == ["[DONE]"]


def test_chat_chunks_have_role_delta_and_no_usage_unless_continuous():
    enc = StreamEncoder(chat=True, rid="chatcmpl-1", model="m", prompt_len=5, continuous=False)
    role = json.loads(_events(enc.role_chunk())[0])
    assert role["object"] == "chat.completion.chunk"
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    tok = json.loads(_events(enc.token_chunk(0, 1, True))[0])
    assert "usage" not in tok and tok["choices"][0]["delta"]["content"].strip()


def test_malformed_chunk_is_one_event_that_is_not_json():
    enc = StreamEncoder(chat=False, rid="cmpl-1", model="m", prompt_len=1, continuous=False)
    evs = _events(enc.malformed_chunk())
    assert len(evs) == 1
    with pytest.raises(json.JSONDecodeError):
        json.loads(evs[0])


def test_filler_text_recounts_to_the_token_count():
    enc = StreamEncoder(chat=False, rid="cmpl-9", model="m", prompt_len=1, continuous=False)
    body = enc.full_response(37)
    assert count_text_tokens(body["choices"][0]["text"]) == 37
    assert body["usage"]["completion_tokens"] == 37
