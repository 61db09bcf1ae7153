"""The Responses wire (:class:`~swiftclient.ResponsesBackend`): the chat contract encoded as a
Responses request, and replies and event streams in the documented shapes decoded into the
same completions and chunks (a scripted HTTP transport stands in for the provider)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from swiftclient import (
    APIResponseValidationError,
    AsyncClient,
    BadRequestError,
    ConfigurationError,
    HTTPBackend,
    ResponsesBackend,
    RetryPolicy,
    StreamError,
    Timeout,
)
from swiftclient._deadline import Deadline
from swiftclient.backends.http import text_chunk
from swiftclient.backends.responses import chat_completion, responses_body
from swiftclient.providers import preset
from swiftclient.types import ChatRequest

from .mock import serve_handler, transport_options

pytestmark = pytest.mark.anyio
over_transports = pytest.mark.usefixtures("transport")
"""A test that sends a request runs over aiohttp and httpx, answered from a loopback socket."""

TOOLS: Any = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


def test_the_chat_contract_becomes_input_items_and_responses_fields() -> None:
    chat = {
        "model": "m",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Look:"},
                    {"type": "image_url", "image_url": {"url": "https://x/a.png", "detail": "low"}},
                ],
            },
            {
                "role": "assistant",
                "content": "Checking.",
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                    {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "1"}},
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "one"},
            {"role": "tool", "tool_call_id": "c2", "content": [{"type": "text", "text": "two"}]},
        ],
        "tools": TOOLS,
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": {}}},
        "max_completion_tokens": 9,
        "reasoning_effort": "low",
        "temperature": 0.2,
        "stream": True,
        "stream_options": {"include_usage": True},
        "prompt_cache_key": "k",
    }
    body = responses_body(chat)
    assert body["input"] == [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "Look:"},
                {"type": "input_image", "image_url": "https://x/a.png", "detail": "low"},
            ],
        },
        {"role": "assistant", "content": "Checking."},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "1"},
        {"type": "function_call_output", "call_id": "c1", "output": "one"},
        {"type": "function_call_output", "call_id": "c2", "output": "two"},
    ]
    assert body["tools"] == [{"type": "function", **TOOLS[0]["function"]}]
    assert body["tool_choice"] == {"type": "function", "name": "get_weather"}
    assert body["text"] == {"format": {"type": "json_schema", "name": "c", "schema": {}}}
    assert body["max_output_tokens"] == 9 and body["reasoning"] == {"effort": "low"}
    assert body["store"] is False and body["stream"] is True
    assert body["temperature"] == 0.2 and body["prompt_cache_key"] == "k"
    assert not {"messages", "stream_options", "max_completion_tokens", "response_format"} & set(
        body
    )


def test_a_response_object_becomes_a_chat_completion() -> None:
    completion = chat_completion(
        {
            "id": "resp_1",
            "created_at": 1741476542,
            "model": "gpt-4.1",
            "status": "completed",
            "output": [
                {
                    "type": "reasoning",
                    "id": "rs_1",
                    "summary": [{"type": "summary_text", "text": "T"}],
                },
                {
                    "type": "message",
                    "id": "msg_1",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": "On it.", "annotations": []}],
                },
                {
                    "type": "function_call",
                    "id": "fc_1",
                    "call_id": "call_1",
                    "name": "get_weather",
                    "arguments": '{"city":"Paris"}',
                    "status": "completed",
                },
            ],
            "usage": {
                "input_tokens": 36,
                "input_tokens_details": {"cached_tokens": 32},
                "output_tokens": 87,
                "output_tokens_details": {"reasoning_tokens": 10},
                "total_tokens": 123,
            },
        }
    )
    choice = completion.choices[0]
    assert (completion.id, completion.model, completion.created) == (
        "resp_1",
        "gpt-4.1",
        1741476542,
    )
    assert choice.message.content == "On it." and choice.message.reasoning_content == "T"
    [call] = choice.message.tool_calls or []
    assert (call.id, call.function.name, call.function.arguments) == (
        "call_1",
        "get_weather",
        '{"city":"Paris"}',
    )
    assert choice.finish_reason == "tool_calls"
    usage = completion.usage
    assert usage is not None and (usage.prompt_tokens, usage.completion_tokens) == (36, 87)
    assert usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == 32
    assert usage.completion_tokens_details is not None
    assert usage.completion_tokens_details.reasoning_tokens == 10
    cut = chat_completion(
        {
            "status": "incomplete",
            "incomplete_details": {"reason": "max_output_tokens"},
            "output": [],
        }
    )
    assert cut.choices[0].finish_reason == "length"


def _sse(*events: dict[str, Any]) -> bytes:
    return b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)


def _response(status: str, output: list[Any], usage: Any = None, **more: Any) -> dict[str, Any]:
    return {
        "id": "resp_7",
        "object": "response",
        "created_at": 1741290958,
        "model": "gpt-4.1-2025-04-14",
        "status": status,
        "output": output,
        "usage": usage,
        **more,
    }


CALL = {
    "type": "function_call",
    "id": "fc_1",
    "call_id": "call_9",
    "name": "get_weather",
    "arguments": "",
    "status": "in_progress",
}
USAGE = {
    "input_tokens": 37,
    "input_tokens_details": {"cached_tokens": 0},
    "output_tokens": 11,
    "output_tokens_details": {"reasoning_tokens": 0},
    "total_tokens": 48,
}
TEXT_THEN_CALL = _sse(
    {"type": "response.created", "sequence_number": 0, "response": _response("in_progress", [])},
    {
        "type": "response.in_progress",
        "sequence_number": 1,
        "response": _response("in_progress", []),
    },
    {
        "type": "response.output_item.added",
        "sequence_number": 2,
        "output_index": 0,
        "item": {"type": "message", "id": "msg_1", "role": "assistant", "content": []},
    },
    {
        "type": "response.output_text.delta",
        "sequence_number": 3,
        "item_id": "msg_1",
        "output_index": 0,
        "content_index": 0,
        "delta": "Hi",
    },
    {
        "type": "response.output_text.delta",
        "sequence_number": 4,
        "item_id": "msg_1",
        "output_index": 0,
        "content_index": 0,
        "delta": " there",
    },
    {"type": "response.output_item.added", "sequence_number": 5, "output_index": 1, "item": CALL},
    {
        "type": "response.function_call_arguments.delta",
        "sequence_number": 6,
        "item_id": "fc_1",
        "output_index": 1,
        "delta": '{"city":',
    },
    {
        "type": "response.function_call_arguments.delta",
        "sequence_number": 7,
        "item_id": "fc_1",
        "output_index": 1,
        "delta": '"Paris"}',
    },
    {
        "type": "response.function_call_arguments.done",
        "sequence_number": 8,
        "item_id": "fc_1",
        "output_index": 1,
        "arguments": '{"city":"Paris"}',
    },
    {
        "type": "response.output_item.done",
        "sequence_number": 9,
        "output_index": 1,
        "item": {**CALL, "arguments": '{"city":"Paris"}', "status": "completed"},
    },
    {
        "type": "response.completed",
        "sequence_number": 10,
        "response": _response(
            "completed", [], {**USAGE, "input_tokens_details": {"cached_tokens": 32}}
        ),
    },
)


@asynccontextmanager
async def _backend(
    body: bytes, seen: list[dict[str, Any]], status: int = 200
) -> AsyncIterator[ResponsesBackend]:
    """A Responses backend answered ``body`` from a loopback socket, over the ``transport``
    fixture's transport; ``seen`` gets each request's path and JSON body."""

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append({"path": request.url.path, "body": json.loads(request.content)})
        kind = "text/event-stream" if body.startswith(b"event:") else "application/json"
        return httpx.Response(status, content=body, headers={"content-type": kind})

    async with (
        serve_handler(handler) as base_url,
        ResponsesBackend(base_url, api_key="sk-test", name="r", **transport_options()) as backend,
    ):
        yield backend


@asynccontextmanager
async def _client(
    body: bytes, seen: list[dict[str, Any]], status: int = 200
) -> AsyncIterator[AsyncClient]:
    async with (
        _backend(body, seen, status) as backend,
        AsyncClient(
            backends={"r": backend}, default_backend="r", retry=RetryPolicy.none()
        ) as client,
    ):
        yield client


@over_transports
async def test_a_documented_event_stream_decodes_into_chat_chunks() -> None:
    seen: list[dict[str, Any]] = []
    async with _client(TEXT_THEN_CALL, seen) as client:
        async with client.stream("Weather in Paris?", model="r/gpt-4.1", tools=TOOLS) as stream:
            chunks = [chunk async for chunk in stream]
            completion = await stream.final()
    assert seen[0]["path"] == "/v1/responses"  # the base URL's path, then /responses
    assert seen[0]["body"]["stream"] is True and seen[0]["body"]["store"] is False
    assert seen[0]["body"]["input"] == [{"role": "user", "content": "Weather in Paris?"}]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Hi there"
    texts = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(texts) == 2
    for chunk in texts:  # assembled per token without validation: the validated chunk
        validated = text_chunk("resp_7", "gpt-4.1-2025-04-14", chunk.text, 1741290958)
        assert chunk == validated
        assert (repr(chunk), chunk.model_dump_json()) == (
            repr(validated),
            validated.model_dump_json(),
        )
        for got, want in [
            (chunk, validated),
            (chunk.choices[0], validated.choices[0]),
            (chunk.choices[0].delta, validated.choices[0].delta),
        ]:
            assert (got.model_fields_set, got.model_extra) == (
                want.model_fields_set,
                want.model_extra,
            )
    message = completion.choices[0].message
    assert message.content == "Hi there"
    [call] = message.tool_calls or []
    assert (call.id, call.function.name, call.function.arguments) == (
        "call_9",
        "get_weather",
        '{"city":"Paris"}',
    )
    assert completion.choices[0].finish_reason == "tool_calls"
    assert completion.usage is not None and completion.usage.prompt_tokens_details is not None
    assert completion.usage.prompt_tokens_details.cached_tokens == 32
    assert completion.id == "resp_7"


@over_transports
async def test_arguments_sent_whole_and_failed_streams() -> None:
    whole = _sse(
        {
            "type": "response.created",
            "sequence_number": 0,
            "response": _response("in_progress", []),
        },
        {
            "type": "response.output_item.added",
            "sequence_number": 1,
            "output_index": 0,
            "item": CALL,
        },
        {
            "type": "response.output_item.done",
            "sequence_number": 2,
            "output_index": 0,
            "item": {**CALL, "arguments": "{}", "status": "completed"},
        },
        {
            "type": "response.completed",
            "sequence_number": 3,
            "response": _response("completed", [], USAGE),
        },
    )
    async with _client(whole, []) as client:
        async with client.stream("hi", model="r/m", tools=TOOLS) as stream:
            final = await stream.final()
        [call] = final.choices[0].message.tool_calls or []
        assert call.function.arguments == "{}"

    failed = _sse(
        {
            "type": "response.created",
            "sequence_number": 0,
            "response": _response("in_progress", []),
        },
        {
            "type": "response.failed",
            "sequence_number": 1,
            "response": _response(
                "failed", [], error={"code": "server_error", "message": "The model failed."}
            ),
        },
    )
    async with _client(failed, []) as client:
        with pytest.raises(StreamError, match="The model failed"):
            async with client.stream("hi", model="r/m") as stream:
                _ = [chunk async for chunk in stream]


@over_transports
async def test_a_streamed_refusal_is_the_messages_refusal() -> None:
    """``response.refusal.delta`` events were dropped: an empty reply, with no refusal."""
    part = {"item_id": "msg_1", "output_index": 0, "content_index": 0}
    item = {"type": "message", "id": "msg_1", "role": "assistant", "status": "in_progress"}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": _response("in_progress", [])},
        {"type": "response.output_item.added", "output_index": 0, "item": {**item, "content": []}},
        {"type": "response.content_part.added", **part, "part": {"type": "refusal", "refusal": ""}},
        {"type": "response.refusal.delta", **part, "delta": "I can't "},
        {"type": "response.refusal.delta", **part, "delta": "help."},
        {"type": "response.refusal.done", **part, "refusal": "I can't help."},
        {"type": "response.completed", "response": _response("completed", [], USAGE)},
    ]
    body = _sse(*({**event, "sequence_number": at} for at, event in enumerate(events)))
    async with _client(body, []) as client:
        async with client.stream("hi", model="r/m") as stream:
            final = await stream.final()
    message = final.choices[0].message
    assert message.refusal == "I can't help." and not message.content


@over_transports
async def test_a_plain_call_and_an_error_status() -> None:
    output = [
        {
            "type": "message",
            "id": "msg_1",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Hello!", "annotations": []}],
        }
    ]
    seen: list[dict[str, Any]] = []
    body = json.dumps(_response("completed", output, USAGE)).encode()
    request = ChatRequest.model_validate(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 5,
            "response_format": {"type": "json_object"},
        }
    )
    async with _backend(body, seen) as backend:
        reply = await backend.complete(request, Deadline(Timeout(total=60)))
    assert reply.choices[0].message.content == "Hello!" and reply.choices[0].finish_reason == "stop"
    assert seen[0]["body"]["max_output_tokens"] == 5 and seen[0]["body"]["stream"] is False
    assert seen[0]["body"]["text"] == {"format": {"type": "json_object"}}

    failed = _response("failed", [], error={"code": "server_error", "message": "It broke."})
    async with _backend(json.dumps(failed).encode(), []) as backend:
        with pytest.raises(StreamError, match="It broke"):
            await backend.complete(request, Deadline(Timeout(total=60)))

    refused = {"error": {"message": "previous_response_id is not supported", "type": "x"}}
    async with _client(json.dumps(refused).encode(), [], status=400) as client:
        with pytest.raises(BadRequestError, match="previous_response_id"):
            await client.chat("hi", model="r/m")


@over_transports
async def test_a_malformed_event_is_a_validation_error_that_quotes_nothing() -> None:
    secret = "sk-leaked-in-an-event"
    bad = _sse(
        {
            "type": "response.created",
            "sequence_number": 0,
            "response": _response("in_progress", []),
        },
        {
            "type": "response.output_item.added",
            "output_index": 0,
            "item": {"type": "function_call"},
        },
        {
            "type": "response.function_call_arguments.delta",
            "output_index": 0,
            "delta": {"k": secret},
        },
    )
    async with _client(bad, []) as client:
        with pytest.raises(APIResponseValidationError, match="not a Responses API event") as caught:
            async with client.stream("hi", model="r/m") as stream:
                _ = [chunk async for chunk in stream]
    error: BaseException | None = caught.value
    while error is not None:
        assert secret not in str(error)
        error = error.__cause__ or error.__context__
    backend = ResponsesBackend("https://api.example/v1", api_key="sk-test", name="r")
    assert repr(backend) == "ResponsesBackend(name='r', base_url='https://api.example/v1')"


def test_an_openai_compatible_preset_speaks_responses_on_request() -> None:
    backend = preset("openai", wire="responses", api_key="sk-preset-0123456789")
    assert isinstance(backend, ResponsesBackend) and backend.name == "openai"
    assert backend.base_url == "https://api.openai.com/v1"
    chat = preset("openai", wire="chat", api_key="sk-preset-0123456789")
    assert type(chat) is HTTPBackend
    with pytest.raises(ConfigurationError, match="'messages' wire"):
        preset("anthropic", wire="responses", api_key="sk-ant-0123456789")
    with pytest.raises(ConfigurationError, match="wire='messages'"):
        preset("vllm", wire="messages")


@over_transports
async def test_the_preset_derives_prompt_cache_key_on_the_responses_wire() -> None:
    seen: list[dict[str, Any]] = []
    output = [{"type": "message", "content": [{"type": "output_text", "text": "ok"}]}]
    body = json.dumps(_response("completed", output, USAGE)).encode()

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(200, content=body, headers={"content-type": "application/json"})

    system = {"role": "system", "content": "You are terse. " * 20}
    async with serve_handler(handler) as base_url:
        backend = preset(
            "openai",
            wire="responses",
            api_key="sk-preset-0123456789",
            base_url=base_url,  # the preset's own choice of prompt_cache_key is kept
            **transport_options(),
        )
        async with AsyncClient(backend, model="gpt-4.1", retry=RetryPolicy.none()) as client:
            await client.chat([system, {"role": "user", "content": "hi"}], stream=False)
    assert seen[0]["prompt_cache_key"] and seen[0]["store"] is False
    assert seen[0]["input"][0] == system


@over_transports
async def test_server_side_state_is_opt_in_through_extra_body() -> None:
    seen: list[dict[str, Any]] = []
    output = [{"type": "message", "content": [{"type": "output_text", "text": "ok"}]}]
    body = json.dumps(_response("completed", output, USAGE)).encode()
    request = ChatRequest.model_validate(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "and then?"}],
            "extra_body": {"store": True, "previous_response_id": "resp_7"},
        }
    )
    async with _backend(body, seen) as backend:
        reply = await backend.complete(request, Deadline(Timeout(total=60)))
    assert reply.id == "resp_7"  # the id to chain the next call to
    assert seen[0]["body"]["store"] is True
    assert seen[0]["body"]["previous_response_id"] == "resp_7"
    assert seen[0]["body"]["input"] == [{"role": "user", "content": "and then?"}]
