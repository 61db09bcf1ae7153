"""Anthropic's Messages API through swiftclient's transports, driven by the real
``anthropic`` SDK (``messages.create``, ``messages.stream``): the request is translated into
the client's chat call, the answer back into a ``message`` or its event stream, errors into
Anthropic's error shape.

The backends are :class:`FakeProvider` instances on the Chat Completions wire (and once on
its Messages route, through an :class:`AnthropicBackend`), and the embedded local engine
(``local/...``) in-process. One hedged call between a slow and a fast target: the fast one
wins and the slow one's request is cancelled.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import anthropic
import httpx2
import pytest

from swiftclient import AnthropicBackend, AsyncClient, Client, Hedge, HTTPBackend, RetryPolicy
from swiftclient.routing import Router
from swiftclient.testing import FakeProvider, Reply
from swiftclient.transports import AsyncTransport, Transport

from .mock import providers, settle

# The anthropic SDK leaves its SSE async generators for the event loop to finalize (trio
# warns about the SDK's generators, not ours).
pytestmark = pytest.mark.filterwarnings(
    "ignore:Exception ignored in. <async_generator object "
    "(SSEDecoder|AsyncStream|AsyncMessageStream)\\.\\w+ "
    ":pytest.PytestUnraisableExceptionWarning"
)
RELEASE_LIMIT = 30.0  # seconds; bounds waiting for cleanup, never a speed assertion
USER: Any = [{"role": "user", "content": "hi"}]
TOOL: Any = {
    "name": "weather",
    "description": "The weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


def sdk_for(client: AsyncClient) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(
        base_url="http://swiftclient.invalid",  # never contacted
        api_key="unused",
        http_client=httpx2.AsyncClient(transport=AsyncTransport(client)),
        max_retries=0,
    )


@asynccontextmanager
async def setup() -> AsyncIterator[tuple[dict[str, FakeProvider], anthropic.AsyncAnthropic]]:
    """Fakes ``slow`` and ``quick`` behind one client (``quick`` the default backend, the
    alias ``fast`` racing both, hedged) and an anthropic SDK client over the transport."""
    async with AsyncExitStack() as stack:
        fakes = await stack.enter_async_context(providers("slow", "quick"))
        client = await stack.enter_async_context(
            AsyncClient(
                backends={n: HTTPBackend(f.base_url, name=n) for n, f in fakes.items()},
                default_backend="quick",
                router=Router({"fast": ["slow/m", "quick/m"]}),
                hedge=Hedge(delay=0.0),
                retry=RetryPolicy.none(),
            )
        )
        sdk = sdk_for(client)
        stack.push_async_callback(sdk.close)
        yield fakes, sdk


@pytest.mark.anyio
async def test_messages_create_plain_and_streamed_is_a_chat_call() -> None:
    async with setup() as (fakes, sdk):
        reply = await sdk.messages.create(
            model="m",
            max_tokens=20,
            system="Be brief.",
            messages=USER,
            stop_sequences=["END"],
            metadata={"user_id": "u1"},
            extra_body={"top_k": 5},
        )
        assert [block.type for block in reply.content] == ["text"]
        assert reply.content[0].text == "from quick"  # type: ignore[union-attr]
        assert reply.stop_reason == "end_turn" and reply.model == "m"
        assert reply.usage.output_tokens == 2 and reply.usage.input_tokens > 0
        sent = fakes["quick"].requests[-1].body
        assert sent["max_tokens"] == 20 and sent["stop"] == ["END"] and sent["user"] == "u1"
        assert sent["top_k"] == 5  # an Anthropic field with no chat equivalent: extra_body
        assert sent["messages"] == [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "hi"},
        ]

        raw = await sdk.messages.create(model="m", max_tokens=20, messages=USER, stream=True)
        kinds: list[str] = []
        async for event in raw:
            kinds.append(event.type)
        assert kinds == [
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",  # one event per chunk, as the chunks came
            "content_block_stop",
            "message_delta",
            "message_stop",
        ]

        async with sdk.messages.stream(model="m", max_tokens=20, messages=USER) as stream:
            pieces = [text async for text in stream.text_stream]
            final = await stream.get_final_message()
        assert pieces == ["from", " quick"]
        assert final.content[0].text == "from quick"  # type: ignore[union-attr]
        assert final.usage.output_tokens == 2 and final.usage.input_tokens > 0
        assert final.stop_reason == "end_turn"


@pytest.mark.anyio
async def test_the_message_names_the_model_that_answered() -> None:
    """Called by a route (``quick/m``), a message reports the model the provider answered
    with (``m``), as a Chat Completions answer does, streamed or not."""
    async with setup() as (_, sdk):
        reply = await sdk.messages.create(model="quick/m", max_tokens=20, messages=USER)
        assert reply.model == "m"
        async with sdk.messages.stream(model="quick/m", max_tokens=20, messages=USER) as stream:
            final = await stream.get_final_message()
        assert final.model == "m" and final.content[0].text == "from quick"  # type: ignore[union-attr]


@pytest.mark.anyio
async def test_tool_use_round_trip_plain_and_streamed() -> None:
    async with setup() as (fakes, sdk):
        fakes["quick"].script(Reply(tool_calls=[("weather", {"city": "Paris"})]))
        asked: Any = [{"role": "user", "content": "Weather in Paris?"}]
        called = await sdk.messages.create(model="m", max_tokens=50, messages=asked, tools=[TOOL])
        [use] = called.content
        assert use.type == "tool_use" and use.name == "weather"
        assert use.input == {"city": "Paris"} and called.stop_reason == "tool_use"
        sent = fakes["quick"].requests[-1].body
        assert sent["tools"][0]["function"]["parameters"] == TOOL["input_schema"]

        fakes["quick"].script(Reply(text="Mild in Paris"))
        history: Any = [
            *asked,
            {"role": "assistant", "content": [use.model_dump(exclude_none=True)]},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": use.id, "content": "21.5 C"},
                    {"type": "text", "text": "Thanks"},
                ],
            },
        ]
        answered = await sdk.messages.create(
            model="m", max_tokens=50, messages=history, tools=[TOOL]
        )
        assert answered.content[0].text == "Mild in Paris"  # type: ignore[union-attr]
        assistant, result, thanks = fakes["quick"].requests[-1].body["messages"][-3:]
        assert assistant["tool_calls"][0]["id"] == use.id
        assert json.loads(assistant["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris"}
        assert result == {"role": "tool", "tool_call_id": use.id, "content": "21.5 C"}
        assert thanks == {"role": "user", "content": "Thanks"}

        fakes["quick"].script(Reply(tool_calls=[("weather", {"city": "Oslo"})]))
        async with sdk.messages.stream(
            model="m", max_tokens=50, messages=asked, tools=[TOOL], tool_choice={"type": "any"}
        ) as stream:
            final = await stream.get_final_message()
        [streamed] = final.content
        assert streamed.type == "tool_use" and streamed.input == {"city": "Oslo"}
        assert final.stop_reason == "tool_use"
        assert fakes["quick"].requests[-1].body["tool_choice"] == "required"


@pytest.mark.anyio
async def test_errors_reach_the_sdk_in_anthropics_shape() -> None:
    async with setup() as (fakes, sdk):
        fakes["quick"].script(Reply(status=429, retry_after=7, error_message="slow down"))
        with pytest.raises(anthropic.RateLimitError, match="slow down") as limited:
            await sdk.messages.create(model="m", max_tokens=5, messages=USER)
        assert limited.value.response.headers["retry-after"] == "7"
        assert limited.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]

        server_tool: Any = {"type": "web_search_20250305", "name": "web_search"}
        with pytest.raises(anthropic.BadRequestError, match="server tools") as refused:
            await sdk.messages.create(model="m", max_tokens=5, messages=USER, tools=[server_tool])
        assert refused.value.body["type"] == "error"  # type: ignore[index]
        assert len(fakes["quick"].requests) == 1  # refused before any call

        fakes["quick"].script(Reply(text="one two three", drop_after=1))
        with pytest.raises(anthropic.APIStatusError):
            async with sdk.messages.stream(model="m", max_tokens=5, messages=USER) as stream:
                async for _ in stream:
                    pass
        for status, kind in ((402, "billing_error"), (504, "timeout_error")):  # Anthropic's
            fakes["quick"].script(Reply(status=status, error_message="no"))
            with pytest.raises(anthropic.APIStatusError) as failed:
                await sdk.messages.create(model="m", max_tokens=5, messages=USER)
            assert failed.value.body["error"]["type"] == kind  # type: ignore[index]
        fakes["quick"].script(Reply(status=500, error_message="busy"))  # type: "server_error"
        with pytest.raises(anthropic.InternalServerError) as failed:
            await sdk.messages.create(model="m", max_tokens=5, messages=USER)
        assert failed.value.body["error"]["type"] == "api_error"  # type: ignore[index]


@pytest.mark.anyio
@pytest.mark.parametrize("streamed", [False, True])
async def test_a_hedged_messages_call_is_won_by_the_fast_target(streamed: bool) -> None:
    async with setup() as (fakes, sdk):
        fakes["slow"].script(Reply(stall_after=0))  # never sends a token
        raw = await sdk.messages.with_raw_response.create(
            model="fast", max_tokens=5, messages=USER, stream=streamed
        )
        assert raw.headers["x-swiftclient-target"] == "quick/m"
        if streamed:
            events: Any = await raw.parse()
            text = "".join(
                [
                    e.delta.text
                    async for e in events
                    if e.type == "content_block_delta" and e.delta.type == "text_delta"
                ]
            )
        else:
            text = (await raw.parse()).content[0].text  # type: ignore[union-attr]
        assert text == "from quick"
        await settle(fakes["slow"], 1, RELEASE_LIMIT)
        assert len(fakes["slow"].requests) == fakes["slow"].cancelled == 1
        assert fakes["quick"].cancelled == 0


@pytest.mark.anyio
async def test_signed_thinking_goes_through_an_anthropic_backend_and_back() -> None:
    """Through an AnthropicBackend, the model's signed thinking reaches the SDK as its
    thinking block and goes back to the provider unchanged on the next turn."""
    fake = FakeProvider(Reply(text="Done", thinking="Let me think"), model="claude")
    async with fake, AsyncClient(AnthropicBackend(fake.base_url, api_key="k"), model="c") as client:
        sdk = sdk_for(client)
        thinking: Any = {"type": "enabled", "budget_tokens": 1024}
        reply = await sdk.messages.create(
            model="c", max_tokens=2000, messages=USER, thinking=thinking
        )
        block, text = reply.content
        assert block.type == "thinking" and block.thinking == "Let me think"
        assert block.signature.startswith("fake-sig-") and text.type == "text"
        assert fake.requests[-1].body["thinking"] == thinking

        async with sdk.messages.stream(model="c", max_tokens=2000, messages=USER) as stream:
            streamed = await stream.get_final_message()
        assert streamed.content[0].model_dump() == block.model_dump()

        history: Any = [
            *USER,
            {"role": "assistant", "content": [b.model_dump() for b in reply.content]},
            {"role": "user", "content": "more"},
        ]
        await sdk.messages.create(model="c", max_tokens=2000, messages=history)
        sent = fake.requests[-1].body["messages"][1]["content"]
        assert sent[0] == block.model_dump()
        await sdk.close()


@pytest.mark.anyio
async def test_a_refusal_names_the_fields_the_sdk_sent() -> None:
    """A refusal of the chat request the wire makes named its fields
    (``tools.0.function.parameters``), which the caller never sent."""
    async with setup() as (_, sdk):
        bad: Any = [{"name": "f", "input_schema": 5}]
        with pytest.raises(anthropic.BadRequestError, match=r"tools\[0\]\.input_schema: Input"):
            await sdk.messages.create(model="m", max_tokens=5, messages=USER, tools=bad)


def test_the_blocking_transport_serves_messages() -> None:
    with FakeProvider(Reply(text="from p"), model="p").run_in_thread() as fake:
        with Client(HTTPBackend(fake.base_url), model="m") as client:
            sdk = anthropic.Anthropic(
                base_url="http://swiftclient.invalid",
                api_key="unused",
                http_client=httpx2.Client(transport=Transport(client)),
                max_retries=0,
            )
            reply = sdk.messages.create(model="m", max_tokens=5, messages=USER)
            assert reply.content[0].text == "from p"  # type: ignore[union-attr]
            with sdk.messages.stream(model="m", max_tokens=5, messages=USER) as stream:
                assert stream.get_final_text() == "from p"
            sdk.close()


@pytest.mark.anyio
async def test_messages_over_the_embedded_engine_with_a_tool(anyio_backend: str) -> None:
    if anyio_backend != "asyncio":
        pytest.skip("one event loop is enough: the engine's own tests cover trio")
    from local_engine import LocalBackend

    async with AsyncClient(backends={"local": LocalBackend()}) as client:
        sdk = sdk_for(client)
        reply = await sdk.messages.create(model="local/default", max_tokens=12, messages=USER)
        assert reply.content[0].text and reply.usage.output_tokens >= 1  # type: ignore[union-attr]
        # Thinking the engine cannot do is named, as `swiftclient serve` names it (it was
        # only logged in-process).
        thinking: Any = {"type": "enabled", "budget_tokens": 1024}
        raw = await sdk.messages.with_raw_response.create(
            model="local/default", max_tokens=4, messages=USER, thinking=thinking
        )
        assert raw.headers["x-ignored-fields"] == "thinking"
        async with sdk.messages.stream(
            model="local/default", max_tokens=12, messages=USER
        ) as stream:
            assert await stream.get_final_text()

        # The embedded default model is trained to call its get_weather tool.
        tool = {**TOOL, "name": "get_weather"}
        asked: Any = [{"role": "user", "content": "What's the weather in Paris?"}]
        called = await sdk.messages.create(
            model="local/default", max_tokens=64, messages=asked, tools=[tool]
        )
        uses = [block for block in called.content if block.type == "tool_use"]
        assert uses and uses[0].name == "get_weather" and called.stop_reason == "tool_use"
        history: Any = [
            *asked,
            {"role": "assistant", "content": [b.model_dump() for b in called.content]},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": u.id, "content": "21 C, sunny"}
                    for u in uses
                ],
            },
        ]
        answered = await sdk.messages.create(
            model="local/default", max_tokens=24, messages=history, tools=[tool]
        )
        assert answered.content
        await sdk.close()


PREFILLED: Any = [*USER, {"role": "assistant", "content": "The answer is"}]


@pytest.mark.anyio
async def test_a_prefill_asks_the_backend_to_continue_the_final_turn() -> None:
    """A final assistant turn of text is a prefill: an OpenAI-compatible backend is asked
    to continue it with vLLM's chat-template fields (it was sent as a finished turn, and
    the model wrote a new one); an Anthropic backend gets the turn as it is (its API
    continues it), without those fields, which it would refuse. Content ending in
    whitespace is refused, as Anthropic's API does."""
    async with setup() as (fakes, sdk):
        await sdk.messages.create(model="m", max_tokens=20, messages=PREFILLED)
        sent = fakes["quick"].requests[-1].body
        assert sent["continue_final_message"] is True and sent["add_generation_prompt"] is False
        assert sent["messages"][-1] == {"role": "assistant", "content": "The answer is"}
        with pytest.raises(anthropic.BadRequestError, match="trailing whitespace"):
            trailing: Any = [*USER, {"role": "assistant", "content": "The answer is "}]
            await sdk.messages.create(model="m", max_tokens=20, messages=trailing)
        assert len(fakes["quick"].requests) == 1  # refused before anything was sent

    fake = FakeProvider(Reply(text=" 42"), model="claude")
    async with fake, AsyncClient(AnthropicBackend(fake.base_url, api_key="k"), model="c") as client:
        sdk = sdk_for(client)
        await sdk.messages.create(model="c", max_tokens=20, messages=PREFILLED)
        sent = fake.requests[-1].body
        assert "continue_final_message" not in sent and "add_generation_prompt" not in sent
        assert sent["messages"][-1]["role"] == "assistant"
        await sdk.close()


@pytest.mark.anyio
async def test_a_prefill_through_the_embedded_engine_is_continued(anyio_backend: str) -> None:
    """Offline, the same SDK call gets the rest of the turn (what the engine gives for a
    chat call that continues the final message), not a new turn."""
    if anyio_backend != "asyncio":
        pytest.skip("one event loop is enough: the engine's own tests cover trio")
    from local_engine import LocalBackend

    async with AsyncClient(backends={"local": LocalBackend()}) as client:
        sdk = sdk_for(client)
        reply = await sdk.messages.create(model="local/default", max_tokens=8, messages=PREFILLED)
        continued = await client.chat(
            PREFILLED,
            model="local/default",
            max_tokens=8,
            extra_body={"continue_final_message": True},
        )
        fresh = await client.chat(PREFILLED, model="local/default", max_tokens=8)
        assert reply.content[0].text == continued.text  # type: ignore[union-attr]
        assert continued.text != fresh.text  # the two prompts differ, and so do the replies
        await sdk.close()


@pytest.mark.anyio
async def test_leaving_a_messages_stream_early_releases_the_connection() -> None:
    async with FakeProvider(Reply(text="one two three", stall_after=1)) as fake:
        backend = HTTPBackend(fake.base_url)
        async with AsyncClient(backend, model="m") as client:
            sdk = sdk_for(client)
            async with sdk.messages.stream(model="m", max_tokens=9, messages=USER) as stream:
                async for _ in stream.text_stream:
                    break
            await settle(fake, 1, RELEASE_LIMIT)
            assert fake.cancelled == 1
            assert backend.pool_stats()["in_use"] == 0
            await sdk.close()


@pytest.mark.anyio
async def test_a_closed_client_is_not_retried_by_the_anthropic_sdk() -> None:
    """A closed client's 503 says ``x-should-retry: false``: the SDK at its default retries
    sent it three times, with backoff, for an answer that cannot change."""
    async with providers("quick") as fakes:
        client = AsyncClient(HTTPBackend(fakes["quick"].base_url), model="m")
        async with client:
            pass
        sent: list[object] = []

        async def count(request: object) -> None:
            sent.append(request)

        http = httpx2.AsyncClient(
            transport=AsyncTransport(client), event_hooks={"request": [count]}
        )
        sdk = anthropic.AsyncAnthropic(
            base_url="http://swiftclient.invalid", api_key="unused", http_client=http, max_retries=2
        )
        with pytest.raises(anthropic.InternalServerError) as closed:
            await sdk.messages.create(
                model="m", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
            )
        assert closed.value.status_code == 503 and "is closed" in str(closed.value)
        assert closed.value.response.headers["x-should-retry"] == "false"
        assert len(sent) == 1
        await sdk.close()
