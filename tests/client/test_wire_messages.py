"""The Messages translation (:mod:`swiftclient.wire.messages`) on its own: request blocks
into chat fields, completions and chunks into ``message`` bodies and events."""

from __future__ import annotations

from typing import Any

import pytest

from swiftclient.types import ChatCompletion, ChatCompletionChunk, ChatRequest
from swiftclient.wire.messages import (
    MessageEvents,
    MessagesRequestError,
    chat_fields,
    message_body,
)

SIGNED = {"type": "thinking", "thinking": "hmm", "signature": "sig"}


def _chat(body: dict[str, Any]) -> tuple[ChatRequest, list[str]]:
    ignored: list[str] = []
    fields = chat_fields({"model": "m", "max_tokens": 9, **body}, ignored)
    return ChatRequest.model_validate(fields), ignored


def test_blocks_become_chat_messages() -> None:
    chat, ignored = _chat(
        {
            "system": [{"type": "text", "text": "One."}, {"type": "text", "text": "Two."}],
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "Look", "cache_control": {"type": "ephemeral"}},
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": "QQ=="},
                        },
                        {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}},
                    ],
                },
                {
                    "role": "assistant",
                    "content": [
                        SIGNED,
                        {"type": "thinking", "thinking": "unsigned", "signature": ""},
                        {"type": "text", "text": "Calling."},
                        {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "t1",
                            "content": [{"type": "text", "text": "boom"}],
                            "is_error": True,
                        }
                    ],
                },
            ],
            "container": "c1",
        }
    )
    system, user, assistant, tool = chat.model_dump(exclude_none=True)["messages"]
    assert system == {"role": "system", "content": "One.\n\nTwo."}
    urls = [p["image_url"]["url"] for p in user["content"] if p["type"] == "image_url"]
    assert urls == ["data:image/png;base64,QQ==", "https://x/y.png"]
    assert assistant["content"] == "Calling."
    assert assistant["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"a": 1}'}
    assert assistant["thinking_blocks"] == [SIGNED]  # the unsigned block is dropped
    assert tool == {"role": "tool", "tool_call_id": "t1", "content": "Error: boom"}
    assert ignored == ["container", "cache_control"]  # the mark is dropped, and named


def test_tools_choice_and_output_format() -> None:
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}}
    chat, _ = _chat(
        {
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"name": "f", "input_schema": schema}],
            "tool_choice": {"type": "tool", "name": "f", "disable_parallel_tool_use": True},
            "output_config": {"format": {"type": "json_schema", "schema": schema}},
        }
    )
    dumped = chat.model_dump(exclude_none=True, by_alias=True)
    assert dumped["tools"][0]["function"] == {"name": "f", "parameters": schema}
    assert dumped["tool_choice"] == {"type": "function", "function": {"name": "f"}}
    assert dumped["parallel_tool_calls"] is False
    assert dumped["response_format"]["json_schema"]["schema"] == schema


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"max_tokens": None}, "max_tokens"),
        ({"tools": [{"type": "bash_20250124", "name": "bash"}]}, "tools[0].type"),
        ({"tool_choice": {"type": "sometimes"}}, "tool_choice"),
        ({"messages": [{"role": "user", "content": [{"type": "document"}]}]}, None),
        # objects on Anthropic's API, which were dropped without a word
        ({"metadata": "x"}, "metadata"),
        ({"thinking": "yes"}, "thinking"),
        # what Anthropic's API refuses, which was served (OpenAI's temperature goes to 2)
        ({"temperature": 1.5}, "temperature"),
        ({"temperature": True}, "temperature"),
        ({"top_p": -0.1}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"top_k": 2.5}, "top_k"),
        ({"metadata": {"user_id": 7}}, "metadata.user_id"),
        ({"tools": [{"name": "f"}]}, "tools[0].input_schema"),
        (
            {
                "messages": [
                    {"role": "user", "content": "x"},
                    {
                        "role": "assistant",
                        "content": [{"type": "tool_use", "id": "t", "name": "f", "input": "{}"}],
                    },
                ]
            },
            "messages[1].content[0].input",
        ),
    ],
)
def test_what_cannot_be_a_chat_call_is_refused(body: dict[str, Any], param: str | None) -> None:
    request = {"model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": "x"}]}
    with pytest.raises(MessagesRequestError) as refused:
        chat_fields({**request, **body}, [])
    if param is not None:
        assert refused.value.param == param


def test_sampling_at_the_ends_of_anthropics_ranges_is_served() -> None:
    request = {"model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": "x"}]}
    body = {**request, "temperature": 1, "top_p": 0.0, "top_k": 0, "metadata": {"user_id": "u"}}
    fields = chat_fields(body, [], extra_body=True)
    assert (fields["temperature"], fields["top_p"], fields["user"]) == (1, 0.0, "u")
    assert fields["extra_body"] == {"top_k": 0}


def _completion(message: dict[str, Any], **choice: Any) -> ChatCompletion:
    """A one-choice completion of ``message``, the choice's other fields from ``choice``."""
    return ChatCompletion.model_validate(
        {
            "id": "c",
            "created": 0,
            "model": "m",
            "choices": [{"index": 0, "message": message, **choice}],
        }
    )


def test_a_body_counts_cache_reads_and_writes_apart() -> None:
    completion = ChatCompletion.model_validate(
        {
            "id": "c",
            "created": 0,
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "hi", "reasoning_content": "r"},
                    "finish_reason": "length",
                }
            ],
            "usage": {
                "prompt_tokens": 100,
                "completion_tokens": 5,
                "total_tokens": 105,
                "prompt_tokens_details": {"cached_tokens": 60},
                "cache_creation_input_tokens": 30,
            },
        }
    )
    body = message_body(completion, "claude")
    assert body["id"].startswith("msg_") and body["stop_reason"] == "max_tokens"
    assert [block["type"] for block in body["content"]] == ["thinking", "text"]
    assert body["usage"] == {
        "input_tokens": 10,
        "cache_creation_input_tokens": 30,
        "cache_read_input_tokens": 60,
        "output_tokens": 5,
    }


def test_an_empty_reply_has_no_content_block_plain_or_streamed() -> None:
    """A plain body said ``[{"type": "text", "text": ""}]`` where the stream sent no block;
    Anthropic's API refuses such an empty text block when the reply is sent back."""
    completion = _completion({"role": "assistant", "content": None}, finish_reason="length")
    body = message_body(completion, "m")
    assert body["content"] == [] and body["stop_reason"] == "max_tokens"


def test_an_empty_stream_is_still_a_whole_message() -> None:
    events = MessageEvents("m")
    usage_only = ChatCompletionChunk.model_validate(
        {
            "id": "c",
            "created": 0,
            "model": "m",
            "choices": [],
            "usage": {"prompt_tokens": 3, "completion_tokens": 0, "total_tokens": 3},
        }
    )
    kinds = [kind for kind, _ in [*events.feed(usage_only), *events.end()]]
    assert kinds == ["message_start", "message_delta", "message_stop"]


def _stop_chunk(finish: dict[str, Any], usage: dict[str, Any] | None = None) -> ChatCompletionChunk:
    choice = {"index": 0, "delta": {"content": "Hi"}, **finish}
    return ChatCompletionChunk.model_validate(
        {"id": "c", "created": 0, "model": "m", "choices": [choice], "usage": usage}
    )


def test_a_matched_stop_string_is_the_stop_sequence_plain_and_streamed() -> None:
    matched = {"finish_reason": "stop", "stop_reason": "END"}
    completion = _completion({"role": "assistant", "content": "Hi"}, **matched)
    body = message_body(completion, "m")
    assert (body["stop_reason"], body["stop_sequence"]) == ("stop_sequence", "END")
    counts = {"prompt_tokens": 4, "completion_tokens": 0, "total_tokens": 4}
    events = MessageEvents("m", ping=True)
    got = [*events.feed(_stop_chunk(matched, counts)), *events.end()]
    assert [kind for kind, _ in got][:2] == ["message_start", "ping"]
    assert got[0][1]["message"]["usage"]["input_tokens"] == 4
    assert got[-2][1]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}
    plain = MessageEvents("m")  # a token id (or nothing) is no stop string
    ended = [*plain.feed(_stop_chunk({"finish_reason": "stop", "stop_reason": 7})), *plain.end()]
    assert [kind for kind, _ in ended][1] == "content_block_start"
    assert ended[-2][1]["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}


def test_thinking_as_text_and_passed_fields() -> None:
    ignored: list[str] = []
    fields = chat_fields(
        {
            "model": "m",
            "max_tokens": 9,
            "messages": [
                {
                    "role": "assistant",
                    "content": [SIGNED, {"type": "redacted_thinking", "data": "x"}],
                }
            ],
            "top_k": 3,
            "min_p": 0.1,
            "thinking": {"type": "enabled"},
        },
        ignored,
        passed=frozenset({"top_k", "min_p"}),
        extra_body=False,
        thinking="text",
    )
    assert fields["messages"] == [
        {"role": "assistant", "content": None, "reasoning_content": "hmm"}
    ]
    assert (fields["top_k"], fields["min_p"], "extra_body" in fields) == (3, 0.1, False)
    assert ignored == ["thinking"]


def test_a_stream_that_is_no_boolean_is_refused() -> None:
    """``"stream": "yes"`` was served unstreamed, without a word."""
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    for value in ("yes", 1, "true"):
        with pytest.raises(MessagesRequestError, match="stream must be a boolean"):
            chat_fields({**body, "stream": value}, [])
    assert chat_fields({**body, "stream": True}, [])["stream"] is True
    assert "stream" not in chat_fields({**body, "stream": False}, [])


def test_a_call_a_stop_string_cut_short_is_the_stop_sequence_not_tool_use() -> None:
    """It said ``stop_reason: "tool_use"`` with ``input: {}``: an agent loop would have run
    the call the stop string cut short."""
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"ci'}}
    message = {"role": "assistant", "content": None, "tool_calls": [call]}
    completion = _completion(message, finish_reason="stop", stop_reason="ris")
    body = message_body(completion, "m")
    assert (body["stop_reason"], body["stop_sequence"]) == ("stop_sequence", "ris")


def test_a_user_turn_with_no_blocks_is_refused() -> None:
    """``"content": []`` on a user turn was accepted (Anthropic's API refuses it)."""
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": []}]}
    with pytest.raises(MessagesRequestError, match="must not be empty") as refused:
        chat_fields(body, [])
    assert refused.value.param == "messages[0].content"


def test_several_text_blocks_stay_apart() -> None:
    """Two text blocks of a turn were joined with nothing between them ("...below.Q3 ...");
    they are joined by a newline, as vLLM joins text parts, into the string every chat
    provider takes."""
    blocks = [{"type": "text", "text": "Summarise the report below."}]
    blocks.append({"type": "text", "text": "Q3 revenue rose 4%."})
    request, _ = _chat({"messages": [{"role": "user", "content": blocks}]})
    assert request.messages[0].content == "Summarise the report below.\nQ3 revenue rose 4%."
    one, _ = _chat({"messages": [{"role": "user", "content": blocks[:1]}]})
    assert one.messages[0].content == "Summarise the report below."


def test_output_config_effort_is_named_as_ignored() -> None:
    """``output_config.effort`` was dropped without a word; it is named (sent on, it would
    be a 400 from OpenAI-compatible providers), and the format is still mapped."""
    config = {"effort": "low", "format": {"type": "json_schema", "schema": {"type": "object"}}}
    body = {"messages": [{"role": "user", "content": "hi"}], "output_config": config}
    request, ignored = _chat(body)
    assert ignored == ["output_config.effort"] and request.extra_body is None
    assert request.response_format is not None


def test_dropped_cache_marks_are_named() -> None:
    """A ``cache_control`` mark anywhere (top level, tools, system, content) is dropped;
    it was dropped silently, so a caller could not tell why nothing was cached."""
    marked = {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}
    for body in (
        {"messages": [{"role": "user", "content": [marked]}]},
        {"messages": [{"role": "user", "content": "hi"}], "system": [marked]},
        {"messages": [{"role": "user", "content": "hi"}], "cache_control": {"type": "ephemeral"}},
        {"messages": [{"role": "user", "content": "hi", "cache_control": {"type": "ephemeral"}}]},
        {
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"name": "f", "input_schema": {}, "cache_control": {"type": "ephemeral"}}],
        },
    ):
        _, ignored = _chat(body)
        assert ignored == ["cache_control"], body
    result = {"type": "tool_result", "tool_use_id": "t1", "content": [marked]}
    call = {"type": "tool_use", "id": "t1", "name": "f", "input": {}}
    turns = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [call]},
        {"role": "user", "content": [result]},
    ]
    _, ignored = _chat({"messages": turns})
    assert ignored == ["cache_control"]  # inside a tool result's blocks too
    _, none = _chat({"messages": [{"role": "user", "content": "hi"}]})
    assert none == []


def test_a_streamed_refusal_is_text_as_a_whole_one_is() -> None:
    """A stream's refusal deltas were dropped (an empty message, where the whole reply
    gave the refusal as its text)."""
    chunks = [
        ChatCompletionChunk.model_validate(
            {"id": "c", "created": 0, "model": "m", "choices": [choice]}
        )
        for choice in (
            {"index": 0, "delta": {"refusal": "I can't "}},
            {"index": 0, "delta": {"refusal": "help."}, "finish_reason": "content_filter"},
        )
    ]
    events = MessageEvents("m")
    got = [data for chunk in chunks for _, data in events.feed(chunk)] + [
        data for _, data in events.end()
    ]
    texts = [e["delta"]["text"] for e in got if e["type"] == "content_block_delta"]
    assert texts == ["I can't ", "help."]
    assert got[-2]["delta"]["stop_reason"] == "refusal"
    whole = _completion({"role": "assistant", "refusal": "I can't help."})
    assert message_body(whole, "m")["content"] == [{"type": "text", "text": "I can't help."}]


def test_anthropics_own_stop_reasons_go_back_unchanged() -> None:
    """An Anthropic backend hands on ``pause_turn`` as its finish reason; it went back to
    an Anthropic client as ``end_turn``."""
    completion = _completion({"role": "assistant", "content": "Hi"}, finish_reason="pause_turn")
    assert message_body(completion, "m")["stop_reason"] == "pause_turn"
    events = MessageEvents("m")
    got = [*events.feed(_stop_chunk({"finish_reason": "pause_turn"})), *events.end()]
    assert got[-2][1]["delta"]["stop_reason"] == "pause_turn"
    odd = _completion({"role": "assistant", "content": "Hi"}, finish_reason="eos")
    assert message_body(odd, "m")["stop_reason"] == "end_turn"


def test_a_strict_tool_is_a_strict_function() -> None:
    """``strict`` on an Anthropic tool was dropped (and named nowhere)."""
    tool = {"name": "t", "input_schema": {"type": "object"}, "strict": True}
    request, ignored = _chat({"messages": [{"role": "user", "content": "q"}], "tools": [tool]})
    assert request.tools is not None and request.tools[0].function.strict is True
    assert ignored == []
