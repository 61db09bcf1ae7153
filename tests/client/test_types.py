"""The pydantic contract: strict requests, lenient responses, bytes parsing, canonical bytes."""

from __future__ import annotations

import json
import re
from typing import Any, get_args

import pytest
from pydantic import TypeAdapter, ValidationError

from swiftclient._canonical import encode as encode_request
from swiftclient._outcome import OUTCOME_OF, AttemptOutcome, Outcome
from swiftclient.types import (
    Attempt,
    ChatCompletion,
    ChatCompletionChunk,
    ChatRequest,
    Message,
    Timing,
)


def test_request_accepts_openai_style_dicts() -> None:
    request = ChatRequest.model_validate(
        {
            "model": "m",
            "messages": [
                {"role": "system", "content": "be brief"},
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "hi"},
                        {"type": "image_url", "image_url": {"url": "data:x"}},
                    ],
                },
                {
                    "role": "assistant",
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "f", "arguments": "{}"},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "42"},
            ],
            "tools": [
                {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
            ],
            "tool_choice": "auto",
            "response_format": {"type": "json_schema", "json_schema": {"name": "X", "schema": {}}},
            "stream_options": {"include_usage": True},
            "prompt_cache_key": "k",
            "extra_body": {"top_k": 5},
        }
    )
    assert request.messages[1].text() == "hi"
    assert request.response_format is not None
    body = json.loads(encode_request(request, stream=True))
    assert body["top_k"] == 5 and "extra_body" not in body
    assert body["response_format"]["json_schema"]["schema"] == {}
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize(
    "bad",
    [
        {"model": "m", "messages": []},
        {"model": "", "messages": [{"role": "user", "content": "x"}]},
        {"model": "m", "messages": [{"role": "robot", "content": "x"}]},
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_token": 5},
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": 3},
    ],
)
def test_bad_requests_are_rejected(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        ChatRequest.model_validate(bad)


@pytest.mark.parametrize(
    ("extra", "where"),
    [
        ({"top_k": float("nan")}, "top_k is nan"),
        ({"x": {"y": [1, float("inf")]}}, "x.y[1] is inf"),
        ({"logit_bias": {"5": float("-inf")}}, "logit_bias.5 is -inf"),
    ],
)
def test_extra_body_numbers_json_cannot_carry_are_refused(
    extra: dict[str, object], where: str
) -> None:
    """NaN and the infinities went out as bare ``NaN`` / ``Infinity``, not JSON, which a
    strict provider refuses naming nothing of the caller's."""
    user = [{"role": "user", "content": "x"}]
    with pytest.raises(ValidationError, match=re.escape(f"{where}: JSON has no form for it")):
        ChatRequest.model_validate({"model": "m", "messages": user, "extra_body": extra})
    assert ChatRequest.model_validate({"model": "m", "messages": user, "extra_body": {"a": 1.5}})


def test_canonical_bytes_are_stable_and_compact() -> None:
    a = ChatRequest(model="m", messages=[Message(role="user", content="x")], temperature=0.5)
    b = ChatRequest.model_validate(
        {"temperature": 0.5, "messages": [{"content": "x", "role": "user"}], "model": "m"}
    )
    assert encode_request(a, stream=False) == encode_request(b, stream=False)
    assert b" " not in encode_request(a, stream=False)
    assert b"stream_options" not in encode_request(a, stream=False)
    assert b"stream_options" not in encode_request(a, stream=True, include_usage=False)


def test_responses_keep_unknown_fields() -> None:
    raw = (
        b'{"id":"x","object":"chat.completion","created":1,"model":"m","provider_field":7,'
        b'"choices":[{"index":0,"message":{"role":"assistant","content":"hi","extra":1},'
        b'"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,'
        b'"total_tokens":4,"prompt_tokens_details":{"cached_tokens":2}}}'
    )
    completion = ChatCompletion.model_validate_json(raw)
    assert completion.text == "hi"
    assert completion.usage is not None and completion.usage.cached_tokens == 2
    dumped = completion.model_dump()
    assert dumped["provider_field"] == 7
    assert dumped["choices"][0]["message"]["extra"] == 1
    assert "timing" not in dumped


def test_chunk_content_detection() -> None:
    role_only = ChatCompletionChunk.model_validate_json(
        b'{"choices":[{"index":0,"delta":{"role":"assistant"}}]}'
    )
    assert not role_only.has_content()
    tool = ChatCompletionChunk.model_validate_json(
        b'{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{"}}]}}]}'
    )
    assert tool.has_content()


def test_timing_percentiles() -> None:
    timing = Timing(itl=[0.01 * i for i in range(1, 101)])
    assert timing.itl_p50 == pytest.approx(0.505)
    assert timing.itl_p95 is not None and 0.94 < timing.itl_p95 < 0.96
    assert Timing().itl_p50 is None
    assert "ttft=-" in Timing().summary()


def test_an_attempts_end_has_one_spelling_per_vocabulary_and_one_map_between_them() -> None:
    assert set(OUTCOME_OF) == set(get_args(AttemptOutcome))
    assert sorted(OUTCOME_OF.values()) == sorted(get_args(Outcome))  # one to one
    # The two public spellings differ only here; the others are spelled alike.
    assert {k: v for k, v in OUTCOME_OF.items() if k != v} == {"ok": "won", "error": "failed"}
    schema = TypeAdapter(Attempt).json_schema()["properties"]["outcome"]
    assert schema["enum"] == list(get_args(AttemptOutcome))


@pytest.mark.parametrize(
    ("parts", "says"),
    [
        ([{"type": "weird"}], "content parts of type 'weird' are not supported"),
        ([{"type": "input_audio", "input_audio": {}}], "type 'input_audio'"),
        ([None], "part 0 is NoneType, not an object"),
        ([{"type": "text", "text": "a"}, {"type": "text"}], "part 1 is a text part without"),
    ],
)
def test_bad_content_parts_are_one_error_in_words(parts: list[Any], says: str) -> None:
    """It was two of pydantic's union errors, the first "Input should be a valid string"
    (param ``messages.0.content.str`` on the local server)."""
    with pytest.raises(ValidationError) as raised:
        ChatRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": parts}]})
    errors = raised.value.errors()
    assert len(errors) == 1 and errors[0]["loc"] == ("messages", 0, "content")
    assert says in errors[0]["msg"]


def test_an_unknown_tool_choice_string_is_one_error_naming_the_choices() -> None:
    """It was param ``tool_choice.literal['none','auto','required']`` and a second error."""
    with pytest.raises(ValidationError) as raised:
        ChatRequest.model_validate(
            {"model": "m", "messages": [{"role": "user", "content": "x"}], "tool_choice": "any"}
        )
    errors = raised.value.errors()
    assert len(errors) == 1 and errors[0]["loc"] == ("tool_choice",)
    assert "'any' is none of 'none', 'auto', 'required'" in errors[0]["msg"]


@pytest.mark.parametrize(
    "field",
    [{"max_tokens": True}, {"n": True}, {"temperature": False}, {"stream": "yes"}, {"stream": 0}],
)
def test_a_boolean_for_a_number_or_a_string_for_stream_is_refused(field: dict[str, Any]) -> None:
    """``max_tokens: true`` was read as 1 and ``stream: "yes"`` as true (the local server
    served both)."""
    with pytest.raises(ValidationError) as raised:
        ChatRequest.model_validate(
            {"model": "m", "messages": [{"role": "user", "content": "x"}], **field}
        )
    assert raised.value.errors()[0]["loc"] == (next(iter(field)),)
