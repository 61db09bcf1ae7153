"""The Backend contract, checked on every backend (the ``target`` fixture: fake provider over
HTTP, the local engine over HTTP, the local engine in process)."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from swiftclient.errors import BadRequestError, ConfigurationError
from swiftclient.types import AssistantMessage, ChatCompletion, FunctionCall, ToolCall

from .conftest import Target

pytestmark = pytest.mark.anyio

# Greedy and past end-of-sequence tokens, so every backend produces exactly max_tokens tokens
# (the fake provider ignores the extra field and always has enough tokens).
FIXED: dict[str, Any] = {"temperature": 0.0, "seed": 1, "extra_body": {"ignore_eos": True}}


def _assert_usage(completion: ChatCompletion, completion_tokens: int) -> None:
    usage = completion.usage
    assert usage is not None
    assert usage.prompt_tokens > 0
    assert usage.completion_tokens == completion_tokens
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.cached_tokens >= 0


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "plain"])
async def test_chat_returns_a_completion_with_usage_and_timing(
    target: Target, stream: bool
) -> None:
    completion = await target.client.chat("Say something.", max_tokens=4, stream=stream, **FIXED)

    assert isinstance(completion, ChatCompletion)
    assert completion.text
    assert completion.finish_reason == "length"
    assert completion.choices[0].message.role == "assistant"
    _assert_usage(completion, 4)
    timing = completion.timing
    assert timing is not None and timing.total is not None
    assert [(a.backend, a.outcome) for a in timing.attempts] == [(target.backend.name, "ok")]
    if stream:
        assert timing.ttft is not None and 0 < timing.ttft <= timing.total


async def test_stream_yields_openai_chunks_and_final_equals_them(target: Target) -> None:
    async with target.client.stream("Tell me a story.", max_tokens=4, **FIXED) as stream:
        chunks = [chunk async for chunk in stream]
        final = await stream.final()

    assert chunks[0].choices[0].delta.role == "assistant"
    assert len({chunk.id for chunk in chunks}) == 1
    assert final.text and final.text == "".join(chunk.text for chunk in chunks)
    reasons = [c.finish_reason for chunk in chunks for c in chunk.choices if c.finish_reason]
    assert reasons == ["length"]
    assert chunks[-1].usage is not None and not chunks[-1].choices
    _assert_usage(final, 4)
    assert stream.timing.ttft is not None
    assert stream.timing.attempts[0].ttft is not None


@pytest.mark.parametrize("key", ["max_tokens", "max_completion_tokens"])
async def test_token_limit_is_honoured(target: Target, key: str) -> None:
    limit: dict[str, Any] = {key: 3}
    completion = await target.client.chat("Count.", **limit, **FIXED)

    assert completion.finish_reason == "length"
    _assert_usage(completion, 3)


async def test_breaking_out_of_a_stream_releases_everything(target: Target) -> None:
    params = target.expect_long_reply()
    async with target.client.stream("Go on and on.", **params) as stream:
        async for chunk in stream:
            if chunk.text:
                break

    await target.assert_released()
    if target.fake is not None:
        assert target.fake.cancelled == 1
    again = await target.client.chat("Still there?", max_tokens=2, **FIXED)
    assert again.finish_reason == "length"


async def test_cancelling_a_stream_releases_everything(target: Target) -> None:
    params = target.expect_long_reply()
    streaming = anyio.Event()

    async def consume() -> None:
        async with target.client.stream("Go on and on.", **params) as stream:
            async for chunk in stream:
                if chunk.text:
                    streaming.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(consume)
        await streaming.wait()
        tg.cancel_scope.cancel()

    await target.assert_released()
    if target.fake is not None:
        assert target.fake.cancelled == 1


async def test_invalid_parameters_raise_configuration_error(target: Target) -> None:
    client = target.client
    with pytest.raises(ConfigurationError, match="temperature"):
        await client.chat("Hi", temperature=3.0)
    with pytest.raises(ConfigurationError, match="not_a_parameter"):
        await client.chat("Hi", not_a_parameter=1)
    with pytest.raises(ConfigurationError):
        client.stream("Hi", top_p=1.5)
    if target.fake is None:
        # What only the engine can judge is a 400 in process and over HTTP alike, so one
        # rule (hedging.is_fatal) judges both.
        if target.kind == "local_messages":  # the wire itself carries one choice
            with pytest.raises(ConfigurationError, match="n must be 1"):
                await client.chat("Hi", n=17)
        else:
            with pytest.raises(BadRequestError, match="n=17") as caught:
                await client.chat("Hi", n=17)
            assert caught.value.status_code == 400
        # an unknown field is ignored in process and over HTTP alike, as vLLM ignores it
        ignored = await client.chat("Hi", max_tokens=2, extra_body={"no_such_knob": 1})
        assert ignored.usage is not None
        with pytest.raises(BadRequestError, match="max_model_len"):
            await client.chat("word " * 6000, max_tokens=2)
        with pytest.raises(BadRequestError, match="top_k"):
            # (max_tokens given: the Messages wire's default, 4096, is over the tiny model's room)
            await client.chat("Hi", max_tokens=2, extra_body={"top_k": -2}, stream=False)
    await target.assert_released()


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "plain"])
async def test_replies_appended_to_the_conversation_continue_it(
    target: Target, stream: bool
) -> None:
    # The first line of every agent loop: the reply goes back in as it came out.
    messages: list[AssistantMessage | dict[str, Any]] = [
        {"role": "user", "content": "Say something."}
    ]
    first = await target.client.chat(messages, max_tokens=4, stream=stream, **FIXED)
    messages += [first.choices[0].message, {"role": "user", "content": "Say more."}]
    second = await target.client.chat(messages, max_tokens=4, stream=stream, **FIXED)
    assert second.text and second.usage is not None and first.usage is not None
    assert second.usage.prompt_tokens > first.usage.prompt_tokens

    call = ToolCall(
        id="call_1", function=FunctionCall(name="get_weather", arguments='{"city": "Paris"}')
    )
    messages += [
        AssistantMessage(content=None, tool_calls=[call]),
        {"role": "tool", "tool_call_id": "call_1", "content": '{"celsius": 21}'},
    ]
    third = await target.client.chat(
        messages, tools=[WEATHER_TOOL], max_tokens=4, stream=stream, **FIXED
    )
    assert third.usage is not None and third.usage.prompt_tokens > second.usage.prompt_tokens
    if target.kind == "fake":
        sent = target.fake.requests[-1].body["messages"]
        assert sent[1] == {"role": "assistant", "content": first.text}
        assert sent[3] == {"role": "assistant", "tool_calls": [call.model_dump()]}
    elif target.kind == "fake_messages":  # the same turns on Anthropic's wire
        sent = target.fake.requests[-1].body["messages"]
        assert sent[1] == {"role": "assistant", "content": first.text}
        tool_use = {"type": "tool_use", "id": "call_1", "name": "get_weather"}
        assert sent[3] == {
            "role": "assistant",
            "content": [{**tool_use, "input": {"city": "Paris"}}],
        }
        result = {"type": "tool_result", "tool_use_id": "call_1", "content": '{"celsius": 21}'}
        assert sent[4] == {"role": "user", "content": [result]}
    elif target.kind == "fake_responses":  # the same turns as Responses input items
        assert target.fake is not None
        sent = target.fake.requests[-1].body["input"]
        assert sent[1] == {"role": "assistant", "content": first.text}
        assert sent[3] == {
            "type": "function_call",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": '{"city": "Paris"}',
        }
        assert sent[4] == {
            "type": "function_call_output",
            "call_id": "call_1",
            "output": '{"celsius": 21}',
        }
    await target.assert_released()


async def test_concurrent_calls_each_get_their_own_completion(target: Target) -> None:
    results: dict[int, ChatCompletion] = {}

    async def one(i: int) -> None:
        results[i] = await target.client.chat(f"Question number {i}?", max_tokens=3, **FIXED)

    async with anyio.create_task_group() as tg:
        for i in range(6):
            tg.start_soon(one, i)

    assert sorted(results) == list(range(6))
    assert len({c.id for c in results.values()}) == 6
    for completion in results.values():
        assert completion.finish_reason == "length" and completion.text
        _assert_usage(completion, 3)
    await target.assert_released()
