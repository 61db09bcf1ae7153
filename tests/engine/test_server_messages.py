"""``POST /v1/messages`` on the local server, driven by the official ``anthropic`` client
(plain, streamed, a tool round trip, a forced tool, errors) and by swiftclient's own
:class:`~swiftclient.AnthropicBackend`.

The translation itself is checked as pure functions; the wire checks run on the tiny
random-weight model (asyncio and trio); the tool round trips run on ``swiftclient serve``
with the embedded default model, which is trained to call its tools.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from local_engine.messages import MessageEvents, MessagesRequestError, chat_fields
from local_engine.server import IGNORED_FIELDS_HEADER
from swiftclient import AnthropicBackend, AsyncClient, HTTPBackend, RetryPolicy
from swiftclient.types import ChatCompletionChunk, ChoiceDelta, ChunkChoice, Usage

from ..conformance.tiny_local import TinyModel, load_tiny_model
from .test_server import KEY as KEY_TINY
from .test_server import Served, serve

anthropic = pytest.importorskip("anthropic")

KEY = "sk-messages-test-0123456789"
LIMIT = 60.0  # seconds; a bound on a hung server, not a speed assertion
WEATHER = "What's the weather in Paris?"
TOOL: Any = {
    "name": "get_weather",
    "description": "Current weather for a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}},
        "required": ["city"],
    },
}
GREEDY: dict[str, Any] = {"temperature": 0.0}
SDK_GREEDY: dict[str, Any] = {"extra_body": GREEDY}  # anthropic 2.x takes no sampling arguments


# ---------------------------------------------------------------------- the translation


def test_a_messages_body_becomes_chat_fields() -> None:
    ignored: list[str] = []
    fields = chat_fields(
        {
            "model": "m",
            "max_tokens": 64,
            "system": [
                {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}
            ],
            "messages": [
                {"role": "user", "content": "weather?"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "Two cities.", "signature": "sig"},
                        {"type": "redacted_thinking", "data": "xyz"},
                        {"type": "text", "text": "Checking."},
                        {"type": "tool_use", "id": "t1", "name": "w", "input": {"city": "Oslo"}},
                        {"type": "tool_use", "id": "t2", "name": "w", "input": {"city": "Rome"}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "t1", "content": "5 C"},
                        {
                            "type": "tool_result",
                            "tool_use_id": "t2",
                            "content": [{"type": "text", "text": "down"}],
                            "is_error": True,
                        },
                        {"type": "text", "text": "Compare them."},
                    ],
                },
            ],
            "tools": [TOOL],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
            "stop_sequences": ["END"],
            "top_k": 5,
            "metadata": {"user_id": "u1"},
            "thinking": {"type": "disabled"},
            "service_tier": "auto",
        },
        ignored,
    )
    assert fields["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "reasoning_content": "Two cities.",
            "tool_calls": [
                {
                    "id": "t1",
                    "type": "function",
                    "function": {"name": "w", "arguments": '{"city": "Oslo"}'},
                },
                {
                    "id": "t2",
                    "type": "function",
                    "function": {"name": "w", "arguments": '{"city": "Rome"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "t1", "content": "5 C"},
        {"role": "tool", "tool_call_id": "t2", "content": "Error: down"},
        {"role": "user", "content": "Compare them."},
    ]
    assert fields["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Current weather for a city",
                "parameters": TOOL["input_schema"],
            },
        }
    ]
    assert fields["tool_choice"] == "required" and fields["parallel_tool_calls"] is False
    assert (fields["max_tokens"], fields["stop"], fields["top_k"]) == (64, ["END"], 5)
    assert fields["user"] == "u1"
    assert sorted(ignored) == ["service_tier", "thinking"]
    named = chat_fields(
        {
            "model": "m",
            "max_tokens": 8,
            "messages": [{"role": "user", "content": "hi"}],
            "tool_choice": {"type": "tool", "name": "get_weather"},
            "tools": [TOOL],
            "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}},
        },
        [],
    )
    assert named["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert named["response_format"]["json_schema"]["schema"] == {"type": "object"}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": [{"role": "user", "content": "hi"}]}, "max_tokens"),
        ({"max_tokens": 0, "messages": [{"role": "user", "content": "hi"}]}, "max_tokens"),
        ({"max_tokens": 8, "messages": []}, "messages"),
        ({"model": None, "max_tokens": 8, "messages": [{"role": "user", "content": "x"}]}, "model"),
        (  # a result of no call
            {
                "max_tokens": 8,
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": "t9", "content": "5"}],
                    }
                ],
            },
            "messages",
        ),
        ({"max_tokens": 8, "messages": [{"role": "system", "content": "x"}]}, "messages.0.role"),
        (
            {
                "max_tokens": 8,
                "messages": [{"role": "user", "content": "x"}],
                "tools": [{"type": "web_search_20250305", "name": "web_search"}],
            },
            "tools.0.type",
        ),
        (
            {
                "max_tokens": 8,
                "messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}],
            },
            "messages.0.content.0.type",
        ),
    ],
)
def test_what_the_local_server_cannot_serve_is_refused_with_its_param(
    body: dict[str, Any], param: str
) -> None:
    with pytest.raises(MessagesRequestError) as caught:
        chat_fields({"model": "m", **body}, [])
    assert caught.value.param == param


def _chunk(
    delta: ChoiceDelta | None = None, finish: str | None = None, usage: Usage | None = None
) -> ChatCompletionChunk:
    choices = [] if delta is None else [ChunkChoice(index=0, delta=delta, finish_reason=finish)]
    return ChatCompletionChunk(id="c", created=0, model="m", choices=choices, usage=usage)


def test_chunks_become_the_messages_event_stream() -> None:
    events = MessageEvents("m")
    usage = Usage(prompt_tokens=10, completion_tokens=0, total_tokens=10)
    got = events.feed(_chunk(ChoiceDelta(role="assistant", content=""), usage=usage))
    got += events.feed(_chunk(ChoiceDelta(content="Let me")))
    got += events.feed(_chunk(ChoiceDelta(content=" check.")))
    call: Any = {"index": 0, "id": "call_1", "function": {"name": "w", "arguments": ""}}
    got += events.feed(_chunk(ChoiceDelta.model_validate({"tool_calls": [call]})))
    more: Any = {"index": 0, "function": {"arguments": '{"city":"Oslo"}'}}
    got += events.feed(_chunk(ChoiceDelta.model_validate({"tool_calls": [more]}), "tool_calls"))
    final = Usage(prompt_tokens=10, completion_tokens=7, total_tokens=17)
    got += events.feed(_chunk(usage=final))
    assert [(e["type"], e.get("index")) for e in got] == [
        ("message_start", None),
        ("ping", None),
        ("content_block_start", 0),
        ("content_block_delta", 0),
        ("content_block_delta", 0),
        ("content_block_stop", 0),
        ("content_block_start", 1),
        ("content_block_delta", 1),
        ("content_block_stop", 1),
        ("message_delta", None),
        ("message_stop", None),
    ]
    assert got[0]["message"]["usage"]["input_tokens"] == 10
    assert got[6]["content_block"] == {"type": "tool_use", "id": "call_1", "name": "w", "input": {}}
    assert got[7]["delta"] == {"type": "input_json_delta", "partial_json": '{"city":"Oslo"}'}
    assert got[9]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert got[9]["usage"]["output_tokens"] == 7 and events.closed
    broken = MessageEvents("m")
    broken.feed(_chunk(ChoiceDelta(content="par")))
    assert broken.fail(500, "the engine failed") == {
        "type": "error",
        "error": {"type": "api_error", "message": "the engine failed"},
    }


# ---------------------------------------------------------------------- the tiny model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> TinyModel:
    return load_tiny_model(tmp_path_factory.mktemp("swiftclient-cache"))


@pytest.fixture
async def served(tiny: TinyModel, anyio_backend: str) -> AsyncIterator[Served]:
    async with serve(tiny.engine()) as running:
        yield running


def _sdk(served: Served) -> Any:
    root = served.server.base_url.removesuffix("/v1")
    return anthropic.AsyncAnthropic(base_url=root, api_key=KEY_TINY, max_retries=0, timeout=LIMIT)


@pytest.mark.anyio
async def test_plain_and_streamed_messages_parse_with_the_same_text_and_usage(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    sdk = _sdk(served)
    ask: Any = {
        "model": "tiny-test",
        "max_tokens": 5,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": "Hi there"}],
        "extra_body": {**GREEDY, "ignore_eos": True},
    }
    try:
        with caplog.at_level(logging.INFO, logger="local_engine.server.access"):
            plain = await sdk.messages.create(**ask)
            assert plain.type == "message" and plain.role == "assistant"
            assert plain.id.startswith("msg_") and plain.model == "tiny-test"
            assert plain.stop_reason == "max_tokens" and plain.stop_sequence is None
            [block] = plain.content
            assert block.type == "text" and block.text
            assert plain.usage.output_tokens == 5 and plain.usage.input_tokens > 0

            stream = await sdk.messages.create(**ask, stream=True)
            kinds = [event.type async for event in stream]
            async with sdk.messages.stream(**ask) as helper:
                async for _ in helper:
                    pass
                streamed = await helper.get_final_message()
        assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
        assert kinds[1:3] == ["content_block_start", "content_block_delta"]
        assert streamed.content[0].text == block.text  # greedy: the same reply
        assert streamed.stop_reason == "max_tokens"
        assert streamed.usage.output_tokens == 5
        assert streamed.usage.input_tokens + (
            streamed.usage.cache_read_input_tokens or 0
        ) == plain.usage.input_tokens + (plain.usage.cache_read_input_tokens or 0)
    finally:
        await sdk.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "local_engine.server.access"]
    assert len(lines) == 3 and all('"POST /v1/messages" 200 ' in line for line in lines)
    assert "completion_tokens=5" in lines[0] and "ttft_ms=" in lines[1]
    await served.settle()


@pytest.mark.anyio
async def test_errors_are_anthropics_shape(served: Served) -> None:
    sdk = _sdk(served)
    hi: Any = [{"role": "user", "content": "Hi"}]
    try:
        with pytest.raises(anthropic.BadRequestError) as caught:
            await sdk.messages.create(model="tiny-test", max_tokens=5000, messages=hi)
        assert caught.value.body["error"]["type"] == "invalid_request_error"
        assert "max_tokens=5000" in caught.value.body["error"]["message"]
        with pytest.raises(anthropic.NotFoundError):
            await sdk.messages.create(model="claude-opus-4-1", max_tokens=5, messages=hi)
        wrong = anthropic.AsyncAnthropic(
            base_url=served.server.base_url.removesuffix("/v1"), api_key="nope", max_retries=0
        )
        with pytest.raises(anthropic.AuthenticationError):
            await wrong.messages.create(model="tiny-test", max_tokens=5, messages=hi)
        await wrong.close()
    finally:
        await sdk.close()
    missing = await served.http.post(
        "/v1/messages", json={"model": "tiny-test", "messages": hi, "service_tier": "auto"}
    )
    assert missing.status_code == 400
    assert missing.json() == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "max_tokens: Field required"},
    }
    raw = await served.http.post(
        "/v1/messages",
        json={"model": "tiny-test", "messages": hi, "max_tokens": 1, "service_tier": "auto"},
    )
    assert raw.status_code == 200 and raw.headers[IGNORED_FIELDS_HEADER] == "service_tier"
    assert raw.headers["request-id"].startswith("req_")
    bad = await served.http.post("/v1/messages", content=b"{not json")
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
    await served.settle()


@pytest.mark.anyio
async def test_count_tokens_counts_the_prompt_a_message_would_take(served: Served) -> None:
    sdk = _sdk(served)
    hi: Any = [{"role": "user", "content": "Hi there"}]
    try:
        counted = await sdk.messages.count_tokens(model="tiny-test", messages=hi)
        longer = await sdk.messages.count_tokens(model="tiny-test", system="Be brief.", messages=hi)
        reply = await sdk.messages.create(model="tiny-test", max_tokens=1, messages=hi)
    finally:
        await sdk.close()
    usage = reply.usage
    assert counted.input_tokens == usage.input_tokens + (usage.cache_read_input_tokens or 0)
    assert longer.input_tokens > counted.input_tokens
    # a prompt over the model's context is counted too (it was a 400 "leaving no room")
    limit = served.engine.max_model_len
    long_text = " ".join(["word"] * (2 * limit))
    body = {"model": "tiny-test", "messages": [{"role": "user", "content": long_text}]}
    over = await served.http.post("/v1/messages/count_tokens", json=body)
    assert over.status_code == 200, over.text
    assert over.json()["input_tokens"] > limit
    await served.settle()


@pytest.mark.anyio
async def test_the_stream_is_named_events_with_a_ping(served: Served) -> None:
    body = {"model": "tiny-test", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    async with served.http.stream(
        "POST", "/v1/messages", json={**body, "stream": True}
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        raw = (await response.aread()).decode()
    blocks = [block for block in raw.split("\n\n") if block]
    names = []
    for block in blocks:
        name, data = block.split("\n")
        names.append(name.removeprefix("event: "))
        assert names[-1] == json.loads(data.removeprefix("data: "))["type"]
    assert names[:2] == ["message_start", "ping"] and names[-1] == "message_stop"
    assert "[DONE]" not in raw
    await served.settle()


@pytest.mark.anyio
async def test_message_start_counts_the_prompt_cache_as_message_delta_does(served: Served) -> None:
    """``message_start`` was sent before the engine ran the prompt: a prompt read from the
    prefix cache was all ``input_tokens`` there and mostly ``cache_read_input_tokens`` in
    ``message_delta`` (an SDK that keeps the first counts billed it as uncached)."""
    text = "the same long question again " * 20
    body = {"model": "tiny-test", "messages": [{"role": "user", "content": text}]}
    body |= {"max_tokens": 2, "stream": True}
    for attempt in range(2):  # the second time the prompt's blocks are cached
        usages: dict[str, dict[str, int]] = {}
        async with served.http.stream("POST", "/v1/messages", json=body) as response:
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    event = json.loads(line.removeprefix("data: "))
                    if event["type"] == "message_start":
                        usages["start"] = event["message"]["usage"]
                    elif event["type"] == "message_delta":
                        usages["delta"] = event["usage"]
        start, delta = usages["start"], usages["delta"]
        for key in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"):
            assert start[key] == delta[key], (attempt, key)
    assert delta["cache_read_input_tokens"] > 0
    await served.settle()


@pytest.mark.anyio
async def test_the_anthropic_backend_gets_what_the_chat_backend_gets(served: Served) -> None:
    """swiftclient's own Messages wire against the server: the same greedy reply, finish
    reason and usage as over chat completions, plain and streamed."""
    url = served.server.base_url
    backends = {
        "chat": HTTPBackend(url, api_key=KEY_TINY, name="chat"),
        "msg": AnthropicBackend(url, api_key=KEY_TINY, name="msg"),
    }
    settings: Any = {"max_tokens": 6, **GREEDY, "extra_body": {"ignore_eos": True}}
    async with AsyncClient(backends=backends, retry=RetryPolicy.none()) as client:
        chat = await client.chat("Hi there", model="chat/tiny-test", **settings)
        plain = await client.chat("Hi there", model="msg/tiny-test", **settings)
        async with client.stream("Hi there", model="msg/tiny-test", **settings) as stream:
            streamed = await stream.final()
    for reply in (plain, streamed):
        assert reply.choices[0].message.content == chat.choices[0].message.content
        assert reply.choices[0].finish_reason == chat.choices[0].finish_reason == "length"
        assert reply.usage is not None and chat.usage is not None
        assert reply.usage.completion_tokens == chat.usage.completion_tokens == 6
        assert reply.usage.prompt_tokens == chat.usage.prompt_tokens
    await served.settle()


@pytest.mark.anyio
async def test_a_tool_result_of_no_call_is_refused_on_every_wire(served: Served) -> None:
    """A tool result that answers no earlier call is a 400 on all three wires, as on
    OpenAI's and Anthropic's APIs (chat completions and Responses accepted it, and the
    model read it as a call's result); one that answers a call is served."""
    user = {"role": "user", "content": "weather in Paris?"}
    orphans: list[tuple[str, Any]] = [
        (
            "/v1/chat/completions",
            {"messages": [user, {"role": "tool", "tool_call_id": "x", "content": "1"}]},
        ),
        (
            "/v1/responses",
            {"input": [{"type": "function_call_output", "call_id": "x", "output": "1"}]},
        ),
        (
            "/v1/messages",
            {
                "max_tokens": 5,
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": "x", "content": "1"}],
                    }
                ],
            },
        ),
    ]
    for path, body in orphans:
        response = await served.http.post(path, json={"model": "tiny-test", **body})
        assert response.status_code == 400, (path, response.text)
        assert "'x'" in response.text and "answers no" in response.text, response.text
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
    answered: Any = [
        user,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "12 C"},
    ]
    body = {"model": "tiny-test", "max_tokens": 2, "messages": answered, **GREEDY}
    ok = await served.http.post("/v1/chat/completions", json=body)
    assert ok.status_code == 200, ok.text
    await served.settle()


@pytest.mark.anyio
async def test_a_final_assistant_turn_is_a_prefill_the_reply_continues(
    served: Served, tiny: TinyModel
) -> None:
    """Anthropic's prefill: a conversation that ends with an assistant turn asks for the
    rest of that turn (it started a new turn, and nothing said so). The prompt ends with
    the prefill's text; the reply is what comes after it, the same as chat completions
    give with vLLM's ``continue_final_message``."""
    from local_engine.chat import ChatFormatter
    from local_engine.tokenizer import Tokenizer
    from swiftclient.types import ChatRequest

    turns: Any = [
        {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": [{"type": "text", "text": "The answer is"}]},
    ]
    formatter = ChatFormatter(Tokenizer.from_dir(tiny.path))
    request = ChatRequest(model="m", messages=turns, extra_body={"continue_final_message": True})
    prompt = formatter.prepare(request).text
    assert prompt.endswith("assistant\nThe answer is"), prompt[-60:]
    assert prompt.count("The answer is") == 1
    # vLLM's pair (add_generation_prompt false with it, as vLLM requires) is the same
    vllm = {"continue_final_message": True, "add_generation_prompt": False}
    both = ChatRequest(model="m", messages=turns, extra_body=vllm)
    assert formatter.prepare(both).text == prompt
    new_turn = formatter.prepare(ChatRequest(model="m", messages=turns)).text
    assert new_turn.endswith("assistant\n"), new_turn[-60:]
    no_header = ChatRequest(model="m", messages=turns, extra_body={"add_generation_prompt": False})
    assert formatter.prepare(no_header).text == new_turn.removesuffix("<|im_start|>assistant\n")

    body: Any = {"model": "tiny-test", "max_tokens": 5, "messages": turns, **GREEDY}
    body["ignore_eos"] = True
    message = await served.http.post("/v1/messages", json=body)
    assert message.status_code == 200, message.text
    assert IGNORED_FIELDS_HEADER not in message.headers
    continued = "".join(block["text"] for block in message.json()["content"])
    chat: Any = {"model": "tiny-test", "max_tokens": 5, "messages": turns, **GREEDY}
    chat |= {"ignore_eos": True, "continue_final_message": True}
    reply = await served.http.post("/v1/chat/completions", json=chat)
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["message"]["content"] == continued
    assert IGNORED_FIELDS_HEADER not in reply.headers

    trailing = {**body, "messages": [turns[0], {"role": "assistant", "content": "So "}]}
    refused = await served.http.post("/v1/messages", json=trailing)
    assert refused.status_code == 400
    assert "trailing whitespace" in refused.json()["error"]["message"]
    for bad, why in (
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"continue_final_message": "yes"}, "must be a boolean"),
        ({"add_generation_prompt": True}, "cannot be combined with add_generation_prompt"),
        ({"add_generation_prompt": 0}, "must be a boolean"),
        ({"messages": [turns[0]]}, "final message to be an assistant message"),
    ):
        response = await served.http.post("/v1/chat/completions", json={**chat, **bad})
        assert response.status_code == 400 and why in response.text, response.text
    await served.settle()


# ---------------------------------------------------------------------- swiftclient serve


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    argv = [sys.executable, "-c", "from swiftclient.cli import main; raise SystemExit(main())"]
    argv += ["serve", "--port", "0", "--api-key", KEY, "--no-access-log"]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("serving swift-tiny at http://"), line
        yield line.split(" at ")[1].strip()
    finally:
        process.terminate()
        process.wait(timeout=LIMIT)
        assert process.stdout is not None
        process.stdout.close()


@pytest.fixture(scope="module")
def sdk(base_url: str) -> Iterator[Any]:
    client = anthropic.Anthropic(
        base_url=base_url.removesuffix("/v1"), api_key=KEY, max_retries=0, timeout=LIMIT
    )
    yield client
    client.close()


def test_a_tool_round_trip_plain_and_streamed(sdk: Any) -> None:
    ask: Any = {"model": "default", "max_tokens": 100, "tools": [TOOL], **SDK_GREEDY}
    called = sdk.messages.create(**ask, messages=[{"role": "user", "content": WEATHER}])
    assert called.stop_reason == "tool_use"
    [call] = [block for block in called.content if block.type == "tool_use"]
    assert call.name == "get_weather" and call.id and "city" in call.input

    with sdk.messages.stream(**ask, messages=[{"role": "user", "content": WEATHER}]) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "input_json" in kinds  # the SDK's event for each arguments delta
    [streamed] = [block for block in final.content if block.type == "tool_use"]
    assert streamed.input == call.input and final.stop_reason == "tool_use"

    # the call and its result go back as blocks; the model answers in text
    answer = sdk.messages.create(
        **ask,
        messages=[
            {"role": "user", "content": WEATHER},
            {
                "role": "assistant",
                "content": [b.model_dump(exclude_none=True) for b in called.content],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": call.id, "content": "21 C, sunny"}
                ],
            },
        ],
    )
    assert answer.stop_reason in ("end_turn", "max_tokens")
    assert [block.type for block in answer.content] == ["text"] and answer.content[0].text


def test_a_forced_tool_is_json_under_its_schema(sdk: Any) -> None:
    forced = sdk.messages.create(
        model="default",
        max_tokens=100,
        tools=[TOOL],
        tool_choice={"type": "tool", "name": "get_weather"},
        messages=[{"role": "user", "content": "Hello!"}],
    )
    [block] = forced.content
    assert block.type == "tool_use" and list(block.input) == ["city"]
    assert len(block.input["city"]) <= 12


def test_a_stop_sequence_is_reported_with_the_string_that_matched(sdk: Any, base_url: str) -> None:
    ask: Any = {
        "model": "default",
        "max_tokens": 40,
        "messages": [{"role": "user", "content": "Hello!"}],
        **SDK_GREEDY,
    }
    free = sdk.messages.create(**ask)
    assert free.stop_reason == "end_turn" and free.stop_sequence is None
    text = free.content[0].text
    word = text.split()[2]  # a word of the greedy reply, past its start
    stopped = sdk.messages.create(**ask, stop_sequences=["never-said", word])
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == word
    assert stopped.content[0].text == text[: text.index(word)]
    with sdk.messages.stream(**ask, stop_sequences=[word]) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "stop_sequence" and final.stop_sequence == word
    # the chat route says which string matched as vLLM does: the choice's stop_reason
    chat = httpx.post(
        f"{base_url}/chat/completions",
        json={"model": "default", "messages": ask["messages"], "stop": [word], **GREEDY},
        headers={"authorization": f"Bearer {KEY}"},
        timeout=LIMIT,
    )
    assert chat.json()["choices"][0]["stop_reason"] == word


@pytest.mark.anyio
async def test_a_cache_mark_is_not_named_as_ignored_by_the_local_server(served: Served) -> None:
    """The local prefix cache is automatic: a ``cache_control`` mark asks nothing more of
    it, so it is not listed in ``x-ignored-fields`` (the transports name it: they drop it)."""
    block = {"type": "text", "text": "Hi", "cache_control": {"type": "ephemeral"}}
    body = {
        "model": "tiny-test",
        "max_tokens": 2,
        "messages": [{"role": "user", "content": [block]}],
    }
    response = await served.http.post("/v1/messages", json=body)
    assert response.status_code == 200
    assert "x-ignored-fields" not in response.headers
    await served.settle()
