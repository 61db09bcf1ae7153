"""Accumulating a stream into one completion: every streamed string in linear time, and
``reasoning`` (vLLM, OpenRouter) read like ``reasoning_content`` (DeepSeek)."""

from __future__ import annotations

from typing import Any

from swiftclient._accumulate import Accumulator
from swiftclient.types import ChatCompletion, ChatCompletionChunk


class _CountedText(str):
    """A string that counts the concatenations made with it (either side of ``+``)."""

    joins = 0

    def __add__(self, other: str) -> str:
        _CountedText.joins += 1
        return str.__add__(self, other)

    def __radd__(self, other: str) -> str:
        _CountedText.joins += 1
        return str.__add__(other, self)


def _chunk(delta: dict[str, Any], finish: str | None = None) -> ChatCompletionChunk:
    return ChatCompletionChunk.model_validate(
        {"id": "c", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    )


def test_unknown_string_fields_are_joined_once_not_concatenated_per_chunk() -> None:
    # vLLM-style servers stream reasoning (and other fields) the client does not declare;
    # concatenating each piece onto the text so far is quadratic in the number of chunks.
    _CountedText.joins = 0
    accumulator = Accumulator()
    count = 2_000
    for i in range(count):
        chunk = _chunk({})
        extra = chunk.choices[0].delta.__pydantic_extra__
        assert extra is not None
        extra["thoughts"] = _CountedText(f"{i % 10}" * 10)
        extra["step"] = i  # a non-string field keeps its latest value
        accumulator.add(chunk)
    message = accumulator.build().choices[0].message
    assert _CountedText.joins == 0  # no piece was ever concatenated pairwise
    extra = message.model_extra
    assert extra is not None
    assert extra["thoughts"] == "".join(f"{i % 10}" * 10 for i in range(count))
    assert type(extra["thoughts"]) is str
    assert extra["step"] == count - 1


def test_a_string_field_that_turns_into_another_type_keeps_the_latest_value() -> None:
    accumulator = Accumulator()
    accumulator.add(_chunk({"annotation": "a"}))
    accumulator.add(_chunk({"annotation": "b"}))
    accumulator.add(_chunk({"annotation": {"kind": "url"}}))
    accumulator.add(_chunk({"note": {"x": 1}}))
    accumulator.add(_chunk({"note": "text"}))
    extra = accumulator.build().choices[0].message.model_extra
    assert extra == {"annotation": {"kind": "url"}, "note": "text"}


def test_reasoning_is_a_declared_field_of_chunks_and_messages() -> None:
    reasoning_only = _chunk({"reasoning": "think "})
    assert reasoning_only.choices[0].delta.reasoning == "think "
    assert reasoning_only.has_content()  # reasoning counts as the first token

    accumulator = Accumulator()
    assert accumulator.add(_chunk({"role": "assistant"})) is False
    assert accumulator.add(reasoning_only) is True
    accumulator.add(_chunk({"reasoning": "more", "content": "answer"}))
    accumulator.add(_chunk({"reasoning_content": "other"}, finish="stop"))
    message = accumulator.build().choices[0].message
    assert message.reasoning == "think more"
    assert message.reasoning_content == "other"
    assert message.content == "answer"
    assert not message.model_extra  # declared, so not an unknown field any more
    # Reasoning is not sent back with the reply.
    assert "reasoning" not in message.request_fields()


def test_a_whole_reply_reads_reasoning_as_a_field() -> None:
    body = (
        b'{"id":"c","choices":[{"index":0,"finish_reason":"stop",'
        b'"message":{"role":"assistant","content":"4","reasoning":"2+2"}}]}'
    )
    completion = ChatCompletion.model_validate_json(body)
    assert completion.choices[0].message.reasoning == "2+2"
