"""The Responses API adapter (:mod:`local_engine.responses`) on its own: requests into chat
fields, chat completions and chunks into response objects and the numbered event stream."""

from __future__ import annotations

from typing import Any

import pytest

from local_engine.responses import (
    ResponseEcho,
    ResponseEvents,
    ResponsesRequestError,
    chat_fields,
    event_bytes,
    response_body,
)
from local_engine.templates import normalize_messages
from swiftclient.types import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatRequest,
    ChoiceDelta,
    ChunkChoice,
    CompletionTokensDetails,
    FunctionCallDelta,
    ToolCallDelta,
    Usage,
)

WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    "strict": True,
}


def _chat(body: dict[str, Any]) -> tuple[ChatRequest, dict[str, Any], list[str]]:
    ignored: list[str] = []
    fields, echo = chat_fields(body, ignored)
    return ChatRequest.model_validate(fields), echo, ignored


def test_a_string_input_with_instructions_is_a_system_and_a_user_message() -> None:
    chat, echo, ignored = _chat(
        {
            "model": "m",
            "instructions": "Be brief.",
            "input": "hi",
            "max_output_tokens": 7,
            "temperature": 0.5,
            "store": True,
            "truncation": "disabled",
            "safety_identifier": "u1",
        }
    )
    assert [(m.role, m.content) for m in chat.messages] == [
        ("system", "Be brief."),
        ("user", "hi"),
    ]
    assert chat.max_completion_tokens == 7 and chat.temperature == 0.5
    assert echo["instructions"] == "Be brief." and echo["max_output_tokens"] == 7
    # store: true is served statelessly (the response says store: false) and named;
    # truncation "disabled" is what the server does anyway
    assert ignored == ["safety_identifier", "store"]


def test_items_become_messages_with_parallel_calls_kept_together() -> None:
    items = [
        {"role": "developer", "content": [{"type": "input_text", "text": "Rules."}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Go"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "T"}]},
        {
            "type": "message",
            "role": "assistant",
            "id": "msg_1",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Checking.", "annotations": []}],
        },
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"a":1}'},
        {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "one"},
        {
            "type": "function_call_output",
            "call_id": "c2",
            "output": [{"type": "input_text", "text": "two"}],
        },
    ]
    chat, _, _ = _chat({"model": "m", "input": items, "tools": [WEATHER_TOOL]})
    system, user, assistant, first, second = chat.messages
    assert (system.role, system.content, user.content) == ("developer", "Rules.", "Go")
    assert assistant.content == "Checking."
    assert assistant.model_extra == {"reasoning_content": "T"}
    assert [(c.id, c.function.name, c.function.arguments) for c in assistant.tool_calls or []] == [
        ("c1", "f", '{"a":1}'),
        ("c2", "g", "{}"),
    ]
    assert (first.role, first.tool_call_id, first.content) == ("tool", "c1", "one")
    assert (second.tool_call_id, second.content) == ("c2", "two")
    tool = (chat.tools or [])[0].function
    assert (tool.name, tool.strict, tool.parameters) == (
        "get_weather",
        True,
        WEATHER_TOOL["parameters"],
    )


def test_tool_choice_text_format_and_logprobs_map_to_chat_fields() -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    chat, echo, _ = _chat(
        {
            "model": "m",
            "input": "x",
            "tools": [WEATHER_TOOL],
            "tool_choice": {"type": "function", "name": "get_weather"},
            "text": {"format": {"type": "json_schema", "name": "c", "schema": schema}},
            "include": ["message.output_text.logprobs"],
        }
    )
    assert chat.tool_choice is not None and not isinstance(chat.tool_choice, str)
    assert chat.tool_choice.function.name == "get_weather"
    assert chat.response_format is not None and chat.response_format.json_schema is not None
    assert chat.response_format.json_schema.schema_ == schema
    assert chat.logprobs is True and chat.top_logprobs == 0
    assert echo["tool_choice"] == {"type": "function", "name": "get_weather"}
    assert echo["text"]["format"]["type"] == "json_schema"
    plain, echo, _ = _chat(
        {"model": "m", "input": "x", "text": {"format": {"type": "json_object"}}}
    )
    assert plain.response_format is not None and plain.response_format.type == "json_object"
    assert echo["tool_choice"] == "auto" and echo["tools"] == []


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id", "stateless"),
        ({"conversation": "conv_1"}, "conversation", "stateless"),
        ({"background": True}, "background", "stateless"),
        ({"n": 2}, "n", "n=2 is not supported"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0]", "stateless"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type", "only function tools"),
        ({"tool_choice": {"type": "allowed_tools"}}, "tool_choice", "tool_choice must be"),
        ({"text": {"format": {"type": "xml"}}}, "text.format.type", "json_schema"),
        ({"input": [{"type": "function_call", "name": "f"}]}, "input[0].call_id", "call_id"),
        ({"input": 3}, "input", "string or a list"),
        ({"input": [{"role": "user", "content": [{"type": "input_file"}]}]}, None, "input_file"),
        # they named internal paths or the wrong field (input.1.tool_calls..., .content)
        (
            {"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": {}}]},
            "input[0].arguments",
            "must be a string",
        ),
        (
            {"input": [{"type": "function_call_output", "call_id": "c", "output": {}}]},
            "input[0].output",
            r"input\[0\]\.output must be a string",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "f"}}]},
            "tools[0]",
            "Chat Completions form",
        ),
        ({"model": None}, "model", "model: Field required"),  # "Input should be a valid string"
        ({"reasoning": "high"}, "reasoning", "reasoning must be an object"),  # was dropped
        ({"include": [1]}, "include", "include must be a list of strings"),
    ],
)
def test_requests_the_stateless_server_cannot_serve_are_refused_by_name(
    body: dict[str, Any], param: str | None, words: str
) -> None:
    with pytest.raises(ResponsesRequestError, match=words) as caught:
        chat_fields({"model": "m", "input": "x", **body}, [])
    if param is not None:
        assert caught.value.param == param


def test_include_values_but_logprobs_are_named_as_ignored() -> None:
    ignored: list[str] = []
    include = ["message.output_text.logprobs", "reasoning.encrypted_content"]
    fields, _ = chat_fields({"model": "m", "input": "x", "include": include}, ignored)
    assert fields["logprobs"] is True
    assert ignored == ["include:reasoning.encrypted_content"]


def _echo() -> ResponseEcho:
    _, echo, _ = _chat({"model": "m", "input": "x", "tools": [WEATHER_TOOL]})
    return ResponseEcho("m", echo)


def _completion(content: str | None, finish: str, calls: list[dict[str, Any]]) -> ChatCompletion:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    return ChatCompletion.model_validate(
        {
            "id": "chatcmpl-1",
            "model": "m",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {
                "prompt_tokens": 10,
                "completion_tokens": 4,
                "total_tokens": 14,
                "prompt_tokens_details": {"cached_tokens": 8},
            },
        }
    )


def test_a_completion_becomes_a_response_with_items_and_usage() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    body = response_body(_completion("Sure.", "tool_calls", [call]), _echo())
    assert body["object"] == "response" and body["status"] == "completed"
    message, function_call = body["output"]
    assert message["type"] == "message" and message["content"][0]["text"] == "Sure."
    assert function_call["type"] == "function_call"
    assert (function_call["call_id"], function_call["name"]) == ("call_1", "f")
    assert body["usage"] == {
        "input_tokens": 10,
        "input_tokens_details": {"cached_tokens": 8, "cache_write_tokens": 0},
        "output_tokens": 4,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 14,
    }
    thought = _completion("Sure.", "stop", [])
    assert thought.usage is not None
    thought.usage.completion_tokens_details = CompletionTokensDetails(reasoning_tokens=3)
    reasoned = response_body(thought, _echo())["usage"]["output_tokens_details"]
    assert reasoned == {"reasoning_tokens": 3}  # was always 0
    only_call = response_body(_completion(None, "tool_calls", [call]), _echo())
    assert [item["type"] for item in only_call["output"]] == ["function_call"]
    cut = response_body(_completion("Sure", "length", []), _echo())
    assert cut["status"] == "incomplete"
    assert cut["incomplete_details"] == {"reason": "max_output_tokens"}


def _chunk(
    content: str | None = None,
    calls: list[ToolCallDelta] | None = None,
    finish: str | None = None,
) -> ChatCompletionChunk:
    delta = ChoiceDelta(content=content, tool_calls=calls)
    return ChatCompletionChunk(choices=[ChunkChoice(delta=delta, finish_reason=finish)])


def test_chunks_become_numbered_events_text_then_a_streamed_call() -> None:
    events = ResponseEvents(_echo())
    out = events.start()
    chunks = [
        _chunk(content=""),
        _chunk(content="Hel"),
        _chunk(content="lo"),
        _chunk(
            calls=[
                ToolCallDelta(
                    index=0, id="call_9", function=FunctionCallDelta(name="f", arguments='{"a"')
                )
            ]
        ),
        _chunk(calls=[ToolCallDelta(index=0, function=FunctionCallDelta(arguments=":1}"))]),
        _chunk(finish="tool_calls"),
        ChatCompletionChunk(choices=[], usage=Usage(prompt_tokens=3, completion_tokens=5)),
    ]
    for chunk in chunks:
        out.extend(events.feed(chunk))
    assert [e["sequence_number"] for e in out] == list(range(len(out)))
    assert [e["type"] for e in out] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    message_id = out[2]["item"]["id"]
    assert {e["item_id"] for e in out[3:8]} == {message_id}
    assert out[6]["text"] == "Hello" and out[8]["item"]["status"] == "completed"
    call = out[9]["item"]
    assert (call["type"], call["call_id"], call["name"], out[9]["output_index"]) == (
        "function_call",
        "call_9",
        "f",
        1,
    )
    assert out[12]["arguments"] == '{"a":1}' and out[12]["item_id"] == call["id"]
    final = out[-1]["response"]
    assert final["status"] == "completed" and events.closed
    assert [item["id"] for item in final["output"]] == [message_id, call["id"]]
    assert final["output"][1]["arguments"] == '{"a":1}'
    assert final["usage"]["input_tokens"] == 3 and final["usage"]["output_tokens"] == 5
    assert event_bytes(out[0]).startswith(b"event: response.created\ndata: {")


@pytest.mark.parametrize(("finish", "matched"), [("length", None), ("stop", "ris")])
def test_a_call_cut_short_is_incomplete_plain_and_streamed_alike(
    finish: str, matched: str | None
) -> None:
    """A whole call, then one cut by the token limit or a stop string: the cut one is
    ``incomplete`` and the others ``completed``, in the plain body, in the streamed items and
    in the stream's final response (that listed every item with the response's status; a
    stop string's cut was ``completed`` everywhere)."""
    whole = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    cut = {"id": "call_2", "type": "function", "function": {"name": "f", "arguments": '{"ci'}}
    extra = {} if matched is None else {"stop_reason": matched}
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": "Checking.", "tool_calls": [whole, cut]},
        "finish_reason": finish,
        **extra,
    }
    completion = ChatCompletion.model_validate(
        {"id": "c", "created": 0, "model": "m", "choices": [choice]}
    )
    plain = [item["status"] for item in response_body(completion, _echo())["output"]]
    assert plain == ["completed", "completed", "incomplete"]

    events = ResponseEvents(_echo())
    out = events.start() + events.feed(_chunk(content="Checking."))
    for i, call in enumerate((whole, cut)):
        delta = ToolCallDelta(
            index=i,
            id=call["id"],
            function=FunctionCallDelta(name="f", arguments=call["function"]["arguments"]),
        )
        out += events.feed(_chunk(calls=[delta]))
    last = _chunk(finish=finish)
    if matched is not None:
        last.choices[0].__pydantic_extra__ = {"stop_reason": matched}  # as the engine says it
    out += events.feed(last) + events.end()
    done = [e["item"]["status"] for e in out if e["type"] == "response.output_item.done"]
    final = [item["status"] for item in out[-1]["response"]["output"]]
    assert done == final == plain


def test_a_reply_cut_short_ends_incomplete_and_a_broken_one_failed() -> None:
    events = ResponseEvents(_echo())
    out = events.start() + events.feed(_chunk(content="Hi", finish="length"))
    out += events.feed(ChatCompletionChunk(choices=[], usage=Usage(completion_tokens=1)))
    assert out[-1]["type"] == "response.incomplete"
    assert out[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert out[-2]["item"]["status"] == "incomplete"

    broken = ResponseEvents(_echo())
    seen = broken.start() + broken.feed(_chunk(content="Hi"))
    failed = broken.fail("engine_error", "the engine failed")
    assert failed["type"] == "response.failed" and failed["sequence_number"] == len(seen)
    assert failed["response"]["status"] == "failed"
    assert failed["response"]["error"] == {"code": "engine_error", "message": "the engine failed"}


def test_an_empty_reply_is_one_empty_message() -> None:
    events = ResponseEvents(_echo())
    out = events.start() + events.feed(_chunk(content="", finish="stop"))
    out += events.feed(ChatCompletionChunk(choices=[], usage=Usage()))
    final = out[-1]["response"]
    assert final["status"] == "completed"
    assert [item["content"][0]["text"] for item in final["output"]] == [""]


def test_several_input_text_parts_stay_apart() -> None:
    """Two ``input_text`` parts were joined with nothing between them; a newline now."""
    parts = [
        {"type": "input_text", "text": "Read this."},
        {"type": "input_text", "text": "Then that."},
    ]
    chat, _, _ = _chat({"model": "m", "input": [{"role": "user", "content": parts}]})
    assert chat.messages[-1].content == "Read this.\nThen that."


def test_the_local_template_joins_text_parts_with_a_newline() -> None:
    """What the model sees of a chat message's text parts (they ran together before)."""
    parts = [{"type": "text", "text": "Read this."}, {"type": "text", "text": "Then that."}]
    [message] = normalize_messages([{"role": "user", "content": parts}])
    assert message["content"] == "Read this.\nThen that."


def test_settings_that_cannot_be_honoured_are_named() -> None:
    """``store: true``, a truncation, reasoning summaries and verbosity were accepted and
    dropped without a word (the docs said they were named)."""
    _, echo, ignored = _chat(
        {
            "model": "m",
            "input": "hi",
            "store": True,
            "truncation": "auto",
            "reasoning": {"effort": "low", "summary": "detailed"},
            "text": {"verbosity": "low"},
        }
    )
    assert ignored == ["store", "truncation", "reasoning.summary", "text.verbosity"]
    assert echo["reasoning"]["effort"] == "low"
    _, _, none = _chat({"model": "m", "input": "hi", "store": False, "truncation": "disabled"})
    assert none == []
