"""AnthropicBackend: the chat contract on Anthropic's native Messages wire (/v1/messages).

Requests are checked as the fake provider received them, answers as the client decodes
them; a replay of a hand-written event stream in the documented shape goes through the
whole HTTP path; the official ``anthropic`` SDK parses every answer of the fake's route.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pydantic
import pytest

from swiftclient import (
    AnthropicBackend,
    APIConnectionError,
    AsyncClient,
    AuthenticationError,
    ConfigurationError,
    HTTPBackend,
    InternalServerError,
    OverloadedError,
    Price,
    Pricing,
    ProviderOverloadedError,
    RateLimitError,
    RetryPolicy,
    StreamError,
)
from swiftclient.backends.anthropic import (
    DEFAULT_MAX_TOKENS,
    CachePlanning,
    MessageDecoder,
    decode_message,
    encode_messages_request,
)
from swiftclient.breakpoints import CacheBreakpointWarning
from swiftclient.prompt_cache import static, turn
from swiftclient.providers import from_env, preset
from swiftclient.testing import CacheSimulation, FakeProvider, Reply, ReplyUsage
from swiftclient.testing._prompt_cache import prompt_blocks
from swiftclient.types import ChatCompletionChunk, ChatRequest
from swiftclient.wire import matched_stop

from .mock import serve_handler, transport_options

pytestmark = pytest.mark.anyio
over_transports = pytest.mark.usefixtures("transport")
"""A test that reads a replayed stream runs over aiohttp and httpx, on a loopback socket."""

KEY = "sk-ant-api03-secret-key-0123456789"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "weather",
            "description": "Weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    },
    {"type": "function", "function": {"name": "clock"}},
]


def encode(**fields: Any) -> dict[str, Any]:
    fields.setdefault("model", "claude-test")
    fields.setdefault("messages", [{"role": "user", "content": "hi"}])
    request = ChatRequest.model_validate(fields)
    body: dict[str, Any] = json.loads(encode_messages_request(request, stream=False))
    return body


def client_for(fake: FakeProvider, **kwargs: Any) -> AsyncClient:
    backend = AnthropicBackend(fake.base_url, api_key=KEY, **kwargs)
    return AsyncClient(backends={"anthropic": backend}, model="anthropic/claude-test")


# --------------------------------------------------------------------------- requests


def test_system_messages_become_system_and_max_tokens_has_a_default() -> None:
    body = encode(
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "hi"},
        ]
    )
    assert body["system"] == "Be brief."
    assert body["messages"] == [{"role": "user", "content": "hi"}]
    assert body["max_tokens"] == DEFAULT_MAX_TOKENS
    two = encode(
        messages=[
            {"role": "system", "content": "One."},
            {"role": "developer", "content": "Two."},
            {"role": "user", "content": "hi"},
        ],
        max_completion_tokens=7,
    )
    assert two["system"] == [{"type": "text", "text": "One."}, {"type": "text", "text": "Two."}]
    assert two["max_tokens"] == 7


def test_thinking_passes_through_and_its_budget_is_added_to_the_default_limit() -> None:
    thinking = {"type": "enabled", "budget_tokens": 2048}
    body = encode(extra_body={"thinking": thinking})
    assert body["thinking"] == thinking
    assert body["max_tokens"] == DEFAULT_MAX_TOKENS + 2048


def test_tools_tool_choice_stops_and_sampling_are_translated() -> None:
    body = encode(
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        stop=["END"],
        temperature=0.5,
        top_p=0.9,
        user="user-7",
    )
    assert body["tools"] == [
        {"name": "clock", "input_schema": {"type": "object", "properties": {}}},
        {
            "name": "weather",
            "description": "Weather in a city.",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    ]
    assert body["tool_choice"] == {"type": "any", "disable_parallel_tool_use": True}
    assert body["stop_sequences"] == ["END"]
    assert (body["temperature"], body["top_p"]) == (0.5, 0.9)
    assert body["metadata"] == {"user_id": "user-7"}
    assert encode(tools=TOOLS, tool_choice="auto")["tool_choice"] == {"type": "auto"}
    assert encode(tools=TOOLS, tool_choice="none")["tool_choice"] == {"type": "none"}
    named = {"type": "function", "function": {"name": "weather"}}
    assert encode(tools=TOOLS, tool_choice=named)["tool_choice"] == {
        "type": "tool",
        "name": "weather",
    }


def test_parallel_tool_calls_and_their_results_stay_together() -> None:
    calls = [
        {"id": "toolu_1", "type": "function", "function": {"name": "weather", "arguments": "{}"}},
        {
            "id": "toolu_2",
            "type": "function",
            "function": {"name": "weather", "arguments": '{"city": "Oslo"}'},
        },
    ]
    body = encode(
        tools=TOOLS,
        messages=[
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": "Looking.", "tool_calls": calls},
            {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"},
            {"role": "tool", "tool_call_id": "toolu_2", "content": "rain"},
            {"role": "user", "content": "and?"},
        ],
    )
    assert body["messages"][1] == {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Looking."},
            {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {}},
            {"type": "tool_use", "id": "toolu_2", "name": "weather", "input": {"city": "Oslo"}},
        ],
    }
    assert body["messages"][2] == {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
            {"type": "tool_result", "tool_use_id": "toolu_2", "content": "rain"},
            {"type": "text", "text": "and?"},
        ],
    }
    assert len(body["messages"]) == 3


def test_images_become_image_blocks() -> None:
    parts = [
        {"type": "text", "text": "what is it?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
    ]
    body = encode(messages=[{"role": "user", "content": parts}])
    assert body["messages"][0]["content"] == [
        {"type": "text", "text": "what is it?"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}},
        {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}},
    ]


def test_what_the_wire_cannot_carry_is_refused_clearly() -> None:
    with pytest.raises(ConfigurationError, match="one choice"):
        encode(n=2)
    with pytest.raises(ConfigurationError, match="logprobs"):
        encode(logprobs=True)
    bad_call = {"id": "t", "type": "function", "function": {"name": "f", "arguments": "{oops"}}
    with pytest.raises(ConfigurationError, match="not JSON"):
        encode(
            messages=[
                {"role": "user", "content": "x"},
                {"role": "assistant", "content": None, "tool_calls": [bad_call]},
            ]
        )


def test_json_schema_output_is_a_forced_tool_or_the_native_format() -> None:
    fmt = {
        "type": "json_schema",
        "json_schema": {"name": "Answer", "schema": {"type": "object", "properties": {}}},
    }
    body = encode(response_format=fmt)
    assert body["tool_choice"] == {"type": "tool", "name": "Answer"}
    assert body["tools"][-1]["name"] == "Answer"
    request = ChatRequest(
        model="m", messages=[{"role": "user", "content": "x"}], response_format=fmt
    )
    native = json.loads(encode_messages_request(request, stream=False, structured="native"))
    assert native["output_config"] == {
        "format": {"type": "json_schema", "schema": {"type": "object", "properties": {}}}
    }
    assert "tools" not in native and "tool_choice" not in native
    # an effort in extra_body joins the native format rather than replacing it
    request.extra_body = {"output_config": {"effort": "low"}}
    both = json.loads(encode_messages_request(request, stream=False, structured="native"))
    assert both["output_config"] == {**native["output_config"], "effort": "low"}
    # thinking forbids a forced tool: the model is left to choose it
    thinking = encode(response_format=fmt, extra_body={"thinking": {"type": "enabled"}})
    assert "tool_choice" not in thinking


# --------------------------------------------------------------------------- over the fake


async def test_plain_and_streamed_text_with_the_native_headers() -> None:
    async with FakeProvider(api_key=KEY) as fake, client_for(fake) as client:
        fake.script(Reply(text="Hello there friend"), Reply(text="Hello there friend"))
        plain = await client.chat(messages="hi", stream=False)
        chunks = []
        async with client.stream(messages="hi") as stream:
            async for chunk in stream:
                chunks.append(chunk)
            streamed = await stream.final()
    for completion in (plain, streamed):
        assert completion.text == "Hello there friend"
        assert completion.finish_reason == "stop"
        assert completion.usage is not None and completion.usage.completion_tokens == 3
    assert "".join(c.text for c in chunks) == "Hello there friend"
    assert streamed.timing is not None and streamed.timing.ttft is not None
    assert len(streamed.timing.itl) == 2  # three content chunks, two gaps
    for request in fake.requests:
        assert request.path == "/v1/messages"
        assert request.headers["x-api-key"] == KEY
        assert request.headers["anthropic-version"] == "2023-06-01"
        assert "authorization" not in request.headers


async def test_tool_calls_come_back_as_tool_calls_streamed_or_not() -> None:
    reply = Reply(tool_calls=[("weather", {"city": "Oslo"}), ("clock", {})])
    async with FakeProvider() as fake, client_for(fake) as client:
        for stream in (False, True):
            fake.script(reply)
            completion = await client.chat(messages="weather?", tools=TOOLS, stream=stream)
            assert completion.finish_reason == "tool_calls"
            calls = completion.tool_calls
            assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
                ("weather", {"city": "Oslo"}),
                ("clock", {}),
            ]
            assert calls[0].id.startswith("toolu_") and calls[0].id != calls[1].id
            assert completion.text == ""


def test_a_strict_tool_is_sent_without_strict() -> None:
    """openai-agents marks every function tool ``strict``; Anthropic takes ``strict`` only on
    the models with strict tool use, so sending it would break calls that work without."""
    strict = {"name": "f", "parameters": {"type": "object"}, "strict": True}
    body = encode(tools=[{"type": "function", "function": strict}, *TOOLS])
    assert all("strict" not in tool for tool in body["tools"])


def test_thinking_tokens_are_the_reasoning_tokens() -> None:
    """Anthropic's ``output_tokens_details.thinking_tokens`` was not read."""
    message = {"id": "m", "model": "claude-x", "usage": {"input_tokens": 3}}
    late = {"output_tokens": 9, "output_tokens_details": {"thinking_tokens": 6}}
    events = [
        ("message_start", {"message": message}),
        ("message_delta", {"delta": {"stop_reason": "end_turn"}, "usage": late}),
        ("message_stop", {}),
    ]
    usage = decoded(MessageDecoder(), events)[-1].usage
    assert usage.completion_tokens == 9 and usage.completion_tokens_details.reasoning_tokens == 6


async def test_cache_usage_is_normalized() -> None:
    usage = ReplyUsage(prompt_tokens=100, cached_tokens=60, cache_write_tokens=30)
    async with FakeProvider() as fake, client_for(fake) as client:
        for stream in (False, True):
            fake.script(Reply(text="ok", usage=usage))
            completion = await client.chat(messages="hi", stream=stream)
            counted = completion.usage
            assert counted is not None
            # Anthropic's input_tokens (10) leaves cache reads and writes out; prompt_tokens
            # counts them all, as OpenAI's does.
            assert counted.prompt_tokens == 100
            assert counted.cached_tokens == 60
            assert counted.cache_write_tokens == 30
            assert counted.total_tokens == 100 + counted.completion_tokens


async def test_cache_writes_per_ttl_and_reads_are_priced_on_the_call_and_in_stats() -> None:
    usage = ReplyUsage(
        prompt_tokens=10_000,
        cached_tokens=6_000,
        cache_write_tokens=3_000,
        cache_write_1h_tokens=1_000,
    )
    claude = Price.anthropic(per_input_token=3e-6, per_output_token=15e-6)
    async with FakeProvider() as fake:
        async with AsyncClient(
            backends={"anthropic": AnthropicBackend(fake.base_url, api_key=KEY)},
            model="anthropic/claude-test",
            pricing=Pricing({"anthropic/*": claude}),
        ) as client:
            for stream in (False, True):
                fake.script(Reply(text="ok", usage=usage))
                completion = await client.chat(messages="hi", stream=stream)
                counted = completion.usage
                assert counted is not None and counted.cache_write_1h_tokens == 1_000
                assert completion.timing is not None and completion.timing.cost is not None
                cost = completion.timing.cost
                assert (cost.cache_read_tokens, cost.cache_write_tokens) == (6_000, 3_000)
                assert cost.cache_savings == pytest.approx(6_000 * 2.7e-6)
                assert cost.cache_write_cost == pytest.approx(2_000 * 3.75e-6 + 1_000 * 6e-6)
                assert cost.cost == pytest.approx(
                    1_000 * 3e-6
                    + 6_000 * 0.3e-6
                    + 2_000 * 3.75e-6
                    + 1_000 * 6e-6
                    + counted.completion_tokens * 15e-6
                )
            stats = client.stats()
    assert (stats.cache_read_tokens, stats.cache_write_tokens) == (12_000, 6_000)
    assert stats.cache_savings == pytest.approx(2 * 6_000 * 2.7e-6)
    assert stats.cache_write_cost == pytest.approx(2 * (2_000 * 3.75e-6 + 1_000 * 6e-6))


@pytest.mark.parametrize("thinking", ["Let me think about it.", ""])
async def test_thinking_blocks_are_surfaced_and_sent_back_unchanged(thinking: str) -> None:
    async with FakeProvider() as fake, client_for(fake) as client:
        for stream in (False, True):
            fake.script(Reply(text="Answer.", thinking=thinking), Reply(text="Next."))
            params = {"thinking": {"type": "enabled", "budget_tokens": 1024}}
            completion = await client.chat(messages="q", stream=stream, extra_body=params)
            message = completion.choices[0].message
            assert message.reasoning_content == (thinking or None)
            blocks = message.thinking_blocks
            assert blocks is not None and len(blocks) == 1
            assert blocks[0]["type"] == "thinking" and blocks[0]["thinking"] == thinking
            assert blocks[0]["signature"].startswith("fake-sig-")
            follow_up = [
                {"role": "user", "content": "q"},
                message,
                {"role": "user", "content": "more"},
            ]
            await client.chat(messages=follow_up, stream=stream)
            sent = fake.requests[-1].body["messages"][1]
            assert sent == {
                "role": "assistant",
                "content": [blocks[0], {"type": "text", "text": "Answer."}],
            }


async def test_529_is_an_overloaded_error_and_is_retried() -> None:
    overloaded = Reply(status=529, error_message="Overloaded")
    async with FakeProvider() as fake, client_for(fake) as client:
        fake.script(overloaded, Reply(text="fine"))
        completion = await client.chat(
            messages="hi", retry=RetryPolicy(max_attempts=2, initial_backoff=0.0)
        )
        assert completion.text == "fine"
        fake.script(overloaded)
        with pytest.raises(ProviderOverloadedError) as caught:
            await client.chat(messages="hi", retry=RetryPolicy.none())
    error = caught.value
    assert isinstance(error, OverloadedError) and isinstance(error, InternalServerError)
    assert error.status_code == 529
    assert "Overloaded" in str(error)
    assert error.body == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "Overloaded"},
    }
    assert RetryPolicy().is_retryable(error)


async def test_a_wrong_key_is_an_authentication_error_that_never_shows_the_key() -> None:
    async with FakeProvider(api_key="sk-ant-the-right-one-000000") as fake:
        backend = AnthropicBackend(fake.base_url, api_key=KEY)
        async with AsyncClient(backends={"a": backend}, model="a/claude") as client:
            with pytest.raises(AuthenticationError) as caught:
                await client.chat(messages="hi", retry=RetryPolicy.none())
    error = caught.value
    assert KEY not in str(error) and KEY not in repr(error) and KEY not in repr(backend)
    assert KEY not in json.dumps(error.headers) and "invalid x-api-key" in str(error)


async def test_response_model_works_through_the_forced_tool() -> None:
    class City(pydantic.BaseModel):
        name: str
        population: int

    reply = Reply(tool_calls=[("City", {"name": "Oslo", "population": 700000})])
    async with FakeProvider() as fake, client_for(fake) as client:
        for stream in (False, True):
            fake.script(reply)
            city = await client.chat(messages="biggest?", response_model=City, stream=stream)
            assert city == City(name="Oslo", population=700000)
            body = fake.requests[-1].body
            assert body["tool_choice"] == {"type": "tool", "name": "City"}
            assert body["tools"][0]["input_schema"]["required"] == ["name", "population"]


async def test_in_stream_errors_fail_the_call() -> None:
    async with FakeProvider() as fake, client_for(fake) as client:
        fake.script(Reply(tokens=4, error_event_after=2, error_message="boom"))
        with pytest.raises(StreamError, match="boom"):
            await client.chat(messages="hi", retry=RetryPolicy.none())


# --------------------------------------------------------------------------- replay

# A stream in the shape the Messages API reference documents: a ping, a text block, a
# thinking block with its signature, a tool_use block whose input arrives as partial JSON,
# then message_delta (stop reason, cumulative usage) and message_stop. Written for this
# test, in that shape.
EXAMPLE_STREAM = b"""event: message_start
data: {"type":"message_start","message":{"id":"msg_replay_1","type":"message","role":"assistant","content":[],"model":"claude-replay","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":25,"cache_creation_input_tokens":100,"cache_read_input_tokens":400,"output_tokens":1}}}

event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":"","signature":""}}

event: ping
data: {"type": "ping"}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"The user wants"}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":" the weather."}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds"}}

event: content_block_stop
data: {"type":"content_block_stop","index":0}

event: content_block_start
data: {"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}

event: content_block_delta
data: {"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"Let me"}}

event: content_block_delta
data: {"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":" check."}}

event: content_block_stop
data: {"type":"content_block_stop","index":1}

event: content_block_start
data: {"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"toolu_01T1x1fJ34qAmk2tNTrN7Up6","name":"weather","input":{}}}

event: content_block_delta
data: {"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":""}}

event: content_block_delta
data: {"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{\\"city\\": \\"San"}}

event: content_block_delta
data: {"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":" Francisco\\"}"}}

event: content_block_stop
data: {"type":"content_block_stop","index":2}

event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":89}}

event: message_stop
data: {"type":"message_stop"}

"""  # noqa: E501
EXPECTED_DELTAS: list[dict[str, Any]] = [
    {"role": "assistant"},
    {"reasoning_content": "The user wants"},
    {"reasoning_content": " the weather."},
    {
        "thinking_blocks": [
            {
                "type": "thinking",
                "thinking": "The user wants the weather.",
                "signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds",
            }
        ]
    },
    {"content": "Let me"},
    {"content": " check."},
    {
        "tool_calls": [
            {
                "index": 0,
                "id": "toolu_01T1x1fJ34qAmk2tNTrN7Up6",
                "type": "function",
                "function": {"name": "weather", "arguments": ""},
            }
        ]
    },
    {"tool_calls": [{"index": 0, "function": {"arguments": '{"city": "San'}}]},
    {"tool_calls": [{"index": 0, "function": {"arguments": ' Francisco"}'}}]},
    {},  # the finish chunk; the usage chunk (no choices) follows
]


@asynccontextmanager
async def replay_backend(body: bytes, status: int = 200) -> AsyncIterator[AnthropicBackend]:
    """An Anthropic backend answered ``body`` from a loopback socket, over the ``transport``
    fixture's transport."""

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, content=body, headers={"content-type": "text/event-stream"})

    async with serve_handler(handler) as base_url:
        yield AnthropicBackend(base_url, api_key=KEY, **transport_options())


def deltas(chunks: list[ChatCompletionChunk]) -> list[dict[str, Any]]:
    """Each chunk's delta, the final usage chunk (no choices) left off."""
    assert chunks[-1].usage is not None and not chunks[-1].choices
    return [delta_of(chunk) for chunk in chunks[:-1]]


def delta_of(chunk: ChatCompletionChunk) -> dict[str, Any]:
    assert len(chunk.choices) == 1
    dumped: dict[str, Any] = chunk.choices[0].delta.model_dump(exclude_none=True)
    return dumped


@over_transports
async def test_a_documented_example_stream_decodes_to_the_expected_chunks() -> None:
    chunks: list[ChatCompletionChunk] = []
    async with (
        replay_backend(EXAMPLE_STREAM) as backend,
        AsyncClient(backends={"a": backend}, model="a/claude-replay") as client,
    ):
        async with client.stream(messages="weather in SF?") as stream:
            async for chunk in stream:
                chunks.append(chunk)
            completion = await stream.final()
    assert deltas(chunks) == EXPECTED_DELTAS
    assert all(c.id == "msg_replay_1" and c.model == "claude-replay" for c in chunks)
    assert chunks[-2].choices[0].finish_reason == "tool_calls"
    last = chunks[-1]
    assert last.usage is not None
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (525, 89)
    assert (last.usage.cached_tokens, last.usage.cache_write_tokens) == (400, 100)
    message = completion.choices[0].message
    assert message.content == "Let me check."
    assert message.reasoning_content == "The user wants the weather."
    assert message.tool_calls is not None
    assert message.tool_calls[0].function.arguments == '{"city": "San Francisco"}'
    assert message.thinking_blocks == EXPECTED_DELTAS[3]["thinking_blocks"]


def test_the_decoder_is_sans_io() -> None:
    decoder = MessageDecoder()
    chunks = []
    for block in EXAMPLE_STREAM.decode().strip().split("\n\n"):
        kind, data = (line.split(": ", 1)[1] for line in block.split("\n"))
        chunk = decoder.event(kind, json.loads(data))
        if chunk is not None:
            chunks.append(chunk)
    assert decoder.done
    assert deltas(chunks) == EXPECTED_DELTAS


def block_events(index: int, name: str, pieces: list[str]) -> list[tuple[str, dict[str, Any]]]:
    """A ``tool_use`` block's events: its start, an ``input_json_delta`` a piece, its stop."""
    block = {"type": "tool_use", "id": f"toolu_{index}", "name": name, "input": {}}
    return [
        ("content_block_start", {"index": index, "content_block": block}),
        *(
            ("content_block_delta", {"index": index, "delta": json_delta(piece)})
            for piece in pieces
        ),
        ("content_block_stop", {"index": index}),
    ]


def json_delta(piece: str) -> dict[str, Any]:
    return {"type": "input_json_delta", "partial_json": piece}


@pytest.mark.parametrize("pieces", [[""], [], ["", ""]])
def test_a_streamed_call_without_arguments_has_the_empty_object(pieces: list[str]) -> None:
    """Anthropic streams a call without arguments as one empty ``partial_json``: its
    arguments were "", which no JSON parser takes (a whole reply gave "{}")."""
    start = ("message_start", {"message": {"id": "m", "model": "claude-x", "usage": {}}})
    events = [
        start,
        *block_events(0, "get_time", pieces),
        *block_events(1, "weather", ["", '{"city": ', '"Paris"}']),
        ("message_delta", {"delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 9}}),
        ("message_stop", {}),
    ]
    calls: dict[int, str] = {}
    for chunk in decoded(MessageDecoder(), events):
        for call in chunk.choices[0].delta.tool_calls or [] if chunk.choices else []:
            if call.function is not None and call.function.arguments is not None:
                calls[call.index] = calls.get(call.index, "") + call.function.arguments
    assert calls == {0: "{}", 1: '{"city": "Paris"}'}
    # the forced tool of a structured reply is its text: "{}" too
    output = decoded(
        MessageDecoder(frozenset({"get_time"})), [start, *block_events(0, "get_time", pieces)]
    )
    assert [chunk.choices[0].delta.content for chunk in output if chunk.choices] == [None, "{}"]


def decoded(decoder: MessageDecoder, events: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    """The chunks ``decoder`` makes of ``events``."""
    chunks = [decoder.event(kind, data) for kind, data in events]
    return [chunk for chunk in chunks if chunk is not None]


@over_transports
async def test_an_overloaded_error_event_mid_stream_is_retryable() -> None:
    body = (
        EXAMPLE_STREAM.split(b"event: content_block_start")[0]
        + b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error",'
        + b'"message":"Overloaded"}}\n\n'
    )
    async with (
        replay_backend(body) as backend,
        AsyncClient(backends={"a": backend}, model="a/claude") as client,
    ):
        with pytest.raises(ProviderOverloadedError, match="Overloaded") as caught:
            await client.chat(messages="hi", retry=RetryPolicy.none())
    assert RetryPolicy().is_retryable(caught.value)


@over_transports
async def test_a_stream_cut_before_message_stop_is_a_connection_error() -> None:
    body = EXAMPLE_STREAM.split(b"event: message_delta")[0]
    async with (
        replay_backend(body) as backend,
        AsyncClient(backends={"a": backend}, model="a/claude") as client,
    ):
        with pytest.raises(APIConnectionError, match="ended before"):
            await client.chat(messages="hi", retry=RetryPolicy.none())


@over_transports
@pytest.mark.parametrize("count", [b"-3", b"1" + b"0" * 400], ids=["negative", "huge"])
async def test_an_output_count_out_of_range_drops_the_usage_and_keeps_the_reply(
    count: bytes,
) -> None:
    old = b'"usage":{"output_tokens":89}'
    body = EXAMPLE_STREAM.replace(old, b'"usage":{"output_tokens":' + count + b"}")
    async with (
        replay_backend(body) as backend,
        AsyncClient(
            backends={"a": backend},
            model="a/claude",
            pricing=Pricing({"*": Price(per_input_token=1e-6, per_output_token=2e-6)}),
        ) as client,
    ):
        completion = await client.chat(messages="hi", retry=RetryPolicy.none())
    assert completion.text == "Let me check." and completion.usage is None


def test_headers_that_are_no_mapping_are_refused() -> None:
    with pytest.raises(ConfigurationError, match="headers must be a mapping"):
        AnthropicBackend("http://127.0.0.1:9", api_key=KEY, headers=5)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- presets


def test_the_anthropic_preset() -> None:
    backend = preset("anthropic", environ={"ANTHROPIC_API_KEY": KEY})
    assert isinstance(backend, AnthropicBackend)
    assert backend.base_url == "https://api.anthropic.com/v1" and backend.name == "anthropic"
    assert KEY not in repr(backend)
    env = {"SWIFTCLIENT_PROVIDER": "anthropic", "ANTHROPIC_API_KEY": KEY}
    assert isinstance(from_env(env), AnthropicBackend)
    with pytest.raises(ConfigurationError, match="ANTHROPIC_API_KEY"):
        preset("anthropic", environ={})
    # the SDK's convention (a root without /v1) works too
    assert AnthropicBackend("https://api.anthropic.com").base_url.endswith(".com/v1")


# --------------------------------------------------------------------------- SDK fidelity


async def test_the_official_sdk_parses_every_answer_of_the_fake() -> None:
    anthropic = pytest.importorskip("anthropic")
    async with FakeProvider(api_key=KEY) as fake:
        sdk = anthropic.AsyncAnthropic(
            base_url=fake.base_url.removesuffix("/v1"), api_key=KEY, max_retries=0
        )
        try:
            fake.script(Reply(text="Hello there"))
            message = await sdk.messages.create(
                model="claude-test",
                max_tokens=64,
                messages=[{"role": "user", "content": "hi"}],
            )
            assert message.content[0].text == "Hello there"
            assert message.stop_reason == "end_turn"

            fake.script(Reply(text="Streamed reply", thinking="hmm"))
            async with sdk.messages.stream(
                model="claude-test",
                max_tokens=2048,
                thinking={"type": "enabled", "budget_tokens": 1024},
                messages=[{"role": "user", "content": "hi"}],
            ) as stream:
                text = "".join([piece async for piece in stream.text_stream])
                final = await stream.get_final_message()
            assert text == "Streamed reply"
            assert final.content[0].type == "thinking" and final.content[0].thinking == "hmm"
            assert final.content[0].signature.startswith("fake-sig-")

            tools = [{"name": "weather", "input_schema": {"type": "object"}}]
            for streamed in (False, True):
                fake.script(Reply(tool_calls=[("weather", {"city": "Oslo"})]))
                if streamed:
                    async with sdk.messages.stream(
                        model="claude-test",
                        max_tokens=64,
                        tools=tools,
                        messages=[{"role": "user", "content": "weather?"}],
                    ) as stream:
                        final = await stream.get_final_message()
                else:
                    final = await sdk.messages.create(
                        model="claude-test",
                        max_tokens=64,
                        tools=tools,
                        messages=[{"role": "user", "content": "weather?"}],
                    )
                assert final.stop_reason == "tool_use"
                (block,) = final.content
                assert block.type == "tool_use" and block.input == {"city": "Oslo"}

            fake.script(Reply(text="ok", usage=ReplyUsage(cached_tokens=3, cache_write_tokens=2)))
            cached = await sdk.messages.create(
                model="claude-test",
                max_tokens=64,
                messages=[{"role": "user", "content": "a b c d e f"}],
            )
            assert cached.usage.cache_read_input_tokens == 3
            assert cached.usage.cache_creation_input_tokens == 2

            fake.script(Reply(status=529, error_message="Overloaded"))
            with pytest.raises(anthropic.APIStatusError) as caught:
                await sdk.messages.create(
                    model="claude-test", max_tokens=8, messages=[{"role": "user", "content": "x"}]
                )
            assert caught.value.status_code == 529
            assert caught.value.body["error"]["type"] == "overloaded_error"
        finally:
            await sdk.close()


# --------------------------------------------------------------------------- cache breakpoints

LONG = "word " * 2000  # about 2,500 tokens by the planner's estimate


def marked(body: dict[str, Any]) -> list[Any]:
    """Every block of a Messages body that carries ``cache_control``, with its marker."""
    found: list[Any] = []
    for tool in body.get("tools", []):
        if "cache_control" in tool:
            found.append(("tool", tool["name"], tool["cache_control"]))
    system = body.get("system")
    for block in system if isinstance(system, list) else []:
        if "cache_control" in block:
            found.append(("system", block["text"][:5], block["cache_control"]))
    for index, message in enumerate(body["messages"]):
        content = message["content"]
        for block in content if isinstance(content, list) else []:
            if "cache_control" in block:
                found.append((index, block.get("text", block["type"])[:5], block["cache_control"]))
    return found


def test_breakpoints_go_on_the_tools_the_static_prefix_the_history_and_the_last_turn() -> None:
    tools = [{"type": "function", "function": {"name": "big", "parameters": {"description": LONG}}}]
    request = ChatRequest.model_validate(
        {
            "model": "claude-test",
            "tools": tools,
            "messages": [
                {"role": "system", "content": LONG},
                {"role": "user", "content": "first question"},
                {"role": "assistant", "content": "first answer"},
                {"role": "user", "content": "second question"},
            ],
        }
    )
    planning = CachePlanning(static_ttl="1h")
    body = json.loads(encode_messages_request(request, stream=False, cache=planning))
    ephemeral = {"type": "ephemeral"}
    hour = {"type": "ephemeral", "ttl": "1h"}
    assert marked(body) == [
        ("tool", "big", hour),
        ("system", "word ", hour),
        (1, "first", ephemeral),  # the history before the final user turn
        (2, "secon", ephemeral),  # the last message
    ]
    # without planning the body carries no breakpoint and keeps plain strings
    plain = json.loads(encode_messages_request(request, stream=False))
    assert marked(plain) == [] and plain["system"] == LONG


def test_short_prompts_get_no_planned_breakpoint() -> None:
    request = ChatRequest(
        model="m", messages=[{"role": "system", "content": "hi"}, {"role": "user", "content": "x"}]
    )
    body = json.loads(encode_messages_request(request, stream=False, cache=CachePlanning()))
    assert marked(body) == []


def test_the_callers_breakpoints_are_always_sent_and_merged_past_four() -> None:
    marker = {"type": "ephemeral"}
    messages: list[dict[str, Any]] = []
    for i in range(6):
        messages += [
            {"role": "user", "content": f"q{i} " + LONG, "cache_control": marker},
            {"role": "assistant", "content": f"a{i}"},
        ]
    messages.append({"role": "user", "content": "last"})
    request = ChatRequest.model_validate({"model": "m", "messages": messages})
    with pytest.warns(CacheBreakpointWarning, match="merged"):
        body = json.loads(encode_messages_request(request, stream=False))
    found = marked(body)
    assert len(found) == 4
    assert all(index % 2 == 0 and marker == {"type": "ephemeral"} for index, _, marker in found)
    assert found[-1][0] == 10  # the last one the caller set is kept where it was


async def test_a_backend_with_cache_breakpoints_sends_them_and_counts_cache_usage() -> None:
    usage = ReplyUsage(prompt_tokens=3000, cached_tokens=2500, cache_write_tokens=400)
    async with FakeProvider(Reply(text="ok", usage=usage)) as fake:
        backend = AnthropicBackend(fake.base_url, api_key=KEY, cache_breakpoints=True)
        async with AsyncClient(backends={"a": backend}, model="a/claude") as client:
            completion = await client.chat(
                [
                    turn({"role": "user", "content": "now?"}),
                    static({"role": "user", "content": LONG}),
                ]
            )
            stats = client.cache_stats()
    body = fake.requests[-1].body
    # the static document goes first (layout marks) and is the cached prefix
    assert body["messages"][0]["content"][0]["cache_control"] == {"type": "ephemeral"}
    assert completion.usage is not None and completion.usage.cached_tokens == 2500
    assert stats["a"].cached_tokens == 2500


# --------------------------------------------------------------------------- more of the wire


def test_redacted_and_empty_signed_thinking_blocks_are_kept_byte_for_byte() -> None:
    redacted = {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4a"}
    empty = {"type": "thinking", "thinking": "", "signature": "EuYBCkQYAiJA"}
    body = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-test",
        "content": [empty, redacted, {"type": "text", "text": "Done."}],
        "stop_reason": "max_tokens",
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 5},
    }
    backend = AnthropicBackend("http://unused.test", api_key=KEY)
    completion = decode_message(json.dumps(body).encode(), backend)
    message = completion.choices[0].message
    assert message.thinking_blocks == [empty, redacted]
    assert message.reasoning_content is None and message.content == "Done."
    assert completion.finish_reason == "length"
    request = ChatRequest(
        model="m",
        messages=[
            {"role": "user", "content": "q"},
            message.to_message(),
            {"role": "user", "content": "r"},
        ],
    )
    sent = json.loads(encode_messages_request(request, stream=False))["messages"][1]["content"]
    assert sent == [empty, redacted, {"type": "text", "text": "Done."}]


async def test_rate_limit_headers_reach_the_error_that_policies_see() -> None:
    limited = Reply(
        status=429,
        retry_after=7,
        headers={"anthropic-ratelimit-requests-remaining": "0"},
        error_message="Number of requests has exceeded your rate limit",
    )
    async with FakeProvider() as fake, client_for(fake) as client:
        fake.script(limited)
        with pytest.raises(RateLimitError) as caught:
            await client.chat(messages="hi", retry=RetryPolicy.none())
    error = caught.value
    assert error.headers["anthropic-ratelimit-requests-remaining"] == "0"
    assert RetryPolicy().wait_seconds(1, error) == 7.0
    assert error.body["error"]["type"] == "rate_limit_error"


async def test_a_call_falls_back_across_wires() -> None:
    async with FakeProvider() as claude, FakeProvider(Reply(text="from openai")) as gpt:
        claude.script(Reply(status=529, error_message="Overloaded"))
        backends = {
            "anthropic": AnthropicBackend(claude.base_url, api_key=KEY),
            "openai": HTTPBackend(gpt.base_url, api_key="sk-openai-test-key"),
        }
        async with AsyncClient(backends=backends) as client:
            completion = await client.chat(
                messages="hi",
                model=["anthropic/claude-test", "openai/gpt-test"],
                retry=RetryPolicy.none(),
            )
    assert completion.text == "from openai"
    assert completion.timing is not None
    assert [(a.backend, a.outcome) for a in completion.timing.attempts] == [
        ("anthropic", "error"),
        ("openai", "ok"),
    ]
    assert claude.requests[0].path == "/v1/messages"
    assert gpt.requests[0].path == "/v1/chat/completions"


# --------------------------------------------------------------------------- cache simulation


def oracle_and_total(bodies: list[dict[str, Any]], min_tokens: int) -> tuple[int, int]:
    """The most prompt tokens any cache could have served over these calls (each call's
    longest block prefix shared with an earlier call, when long enough), and all of them."""
    seen: list[list[tuple[str, int]]] = []
    best_total = total = 0
    for body in bodies:
        blocks = [(identity, tokens) for identity, tokens, _ in prompt_blocks(body)]
        total += sum(tokens for _, tokens in blocks)
        best = 0
        for earlier in seen:
            shared = 0
            for (a, tokens), (b, _) in zip(blocks, earlier, strict=False):
                if a != b:
                    break
                shared += tokens
            best = max(best, shared)
        best_total += best if best >= min_tokens else 0
        seen.append(blocks)
    return best_total, total


@pytest.mark.parametrize("planned", [True, False], ids=["planner", "no-breakpoints"])
async def test_multi_turn_calls_reach_the_oracles_cached_share(planned: bool) -> None:
    async with FakeProvider() as fake:
        fake.prompt_cache = CacheSimulation(min_tokens=1024)
        backend = AnthropicBackend(fake.base_url, api_key=KEY, cache_breakpoints=planned)
        async with AsyncClient(backends={"a": backend}, model="a/claude") as client:
            messages: list[Any] = [{"role": "system", "content": LONG}]
            read = prompt = 0
            for turn_number in range(8):
                messages.append({"role": "user", "content": f"question number {turn_number}"})
                completion = await client.chat(messages, stream=turn_number % 2 == 0)
                assert completion.usage is not None
                read += completion.usage.cached_tokens
                prompt += completion.usage.prompt_tokens
                messages.append(completion.choices[0].message)
    oracle, total = oracle_and_total([r.body for r in fake.requests], 1024)
    assert prompt == total  # usage counts every input token, cached or not
    if planned:
        assert read >= 0.9 * oracle > 0
    else:
        assert read == 0


def test_the_cache_simulation_honours_ttls_and_prefixes() -> None:
    now = [0.0]
    cache = CacheSimulation(min_tokens=3, clock=lambda: now[0])

    def body(ttl: str | None, question: str) -> dict[str, Any]:
        marker: dict[str, Any] = {"type": "ephemeral"}
        if ttl:
            marker["ttl"] = ttl
        system = [{"type": "text", "text": "one two three four", "cache_control": marker}]
        return {"system": system, "messages": [{"role": "user", "content": question}]}

    assert cache.usage(body(None, "a b")) == {
        "input_tokens": 2,
        "cache_creation_input_tokens": 4,
        "cache_read_input_tokens": 0,
        "cache_creation": {"ephemeral_5m_input_tokens": 4, "ephemeral_1h_input_tokens": 0},
    }
    assert cache.usage(body(None, "c"))["cache_read_input_tokens"] == 4  # same prefix
    now[0] += 301  # five minutes passed since the last read
    written_1h = cache.usage(body("1h", "c"))
    assert written_1h["cache_read_input_tokens"] == 0
    assert written_1h["cache_creation"] == {
        "ephemeral_5m_input_tokens": 0,
        "ephemeral_1h_input_tokens": 4,
    }
    now[0] += 3000  # the 1h entry is still there
    assert cache.usage(body(None, "c"))["cache_read_input_tokens"] == 4


def test_the_matched_stop_sequence_is_kept_plain_and_streamed() -> None:
    """``stop_sequence`` named the string that matched; it became a bare ``"stop"`` (an
    Anthropic SDK served through the transport saw ``end_turn``). It is kept as the
    choice's ``stop_reason``, where vLLM names the matched stop string."""
    body = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-test",
        "content": [{"type": "text", "text": "one two"}],
        "stop_reason": "stop_sequence",
        "stop_sequence": "END",
        "usage": {"input_tokens": 10, "output_tokens": 5},
    }
    backend = AnthropicBackend("http://unused.test", api_key=KEY)
    completion = decode_message(json.dumps(body).encode(), backend)
    assert completion.finish_reason == "stop"
    assert matched_stop(completion.choices[0]) == "END"
    decoder = MessageDecoder()
    decoder.event("message_start", {"type": "message_start", "message": {**body, "content": []}})
    delta = {"stop_reason": "stop_sequence", "stop_sequence": "END"}
    chunk = decoder.event("message_delta", {"type": "message_delta", "delta": delta})
    assert chunk is not None and chunk.choices[0].finish_reason == "stop"
    assert matched_stop(chunk.choices[0]) == "END"
    body["stop_reason"], body["stop_sequence"] = "end_turn", None
    assert matched_stop(decode_message(json.dumps(body).encode(), backend).choices[0]) is None
