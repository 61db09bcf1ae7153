"""The OpenAI Responses API through swiftclient's transports, driven by the real ``openai``
SDK (``responses.create`` / ``responses.parse`` / ``responses.stream``) and by openai-agents'
default ``OpenAIResponsesModel``: the request is translated into the client's chat call,
the answer back into a ``response`` object or its event stream.

The backends are :class:`FakeProvider` instances on the Chat Completions wire, and the
embedded local engine (``local/...``) in-process. Each SDK path also makes one hedged call
between a slow and a fast target: the fast one wins and the slow one's request is cancelled.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import httpx2
import openai
import pydantic
import pytest

from swiftclient import AsyncClient, Client, Hedge, HTTPBackend, RetryPolicy
from swiftclient.routing import Router
from swiftclient.testing import FakeProvider, Reply
from swiftclient.transports import AsyncTransport, Transport

from .mock import providers, settle

# The openai SDK leaves its own SSE async generators for the event loop to finalize when a
# stream ends; on trio that is a warning about the SDK's generators, not ours.
pytestmark = pytest.mark.filterwarnings(
    "ignore:Exception ignored in. <async_generator object "
    "(SSEDecoder|AsyncStream|AsyncResponseStream)\\.\\w+ "
    ":pytest.PytestUnraisableExceptionWarning"
)
RELEASE_LIMIT = 30.0  # seconds; bounds waiting for cleanup, never a speed assertion
TOOL: Any = {
    "type": "function",
    "name": "weather",
    "description": "The weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


USER_CHAT: Any = [{"role": "user", "content": "hi"}]


class City(pydantic.BaseModel):
    city: str
    celsius: float


def weather(city: str) -> str:
    """The weather in a city."""
    return f"21.5 degrees in {city}"


@asynccontextmanager
async def setup() -> AsyncIterator[tuple[dict[str, FakeProvider], openai.AsyncOpenAI]]:
    """Fakes ``slow`` and ``quick`` behind one client (``quick`` the default backend, the
    alias ``fast`` racing both, hedged) and an openai SDK client over the transport."""
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
        sdk = openai.AsyncOpenAI(
            base_url="http://swiftclient.invalid/v1",
            api_key="unused",
            http_client=httpx2.AsyncClient(transport=AsyncTransport(client)),
            max_retries=0,
        )
        stack.push_async_callback(sdk.close)
        yield fakes, sdk


async def slow_was_cancelled(fakes: dict[str, FakeProvider]) -> None:
    await settle(fakes["slow"], 1, RELEASE_LIMIT)
    assert len(fakes["slow"].requests) == fakes["slow"].cancelled == 1
    assert fakes["quick"].cancelled == 0


# --------------------------------------------------------------------------- openai SDK


@pytest.mark.anyio
async def test_responses_create_plain_and_streamed_is_a_chat_call() -> None:
    async with setup() as (fakes, sdk):
        reply = await sdk.responses.create(
            model="m", instructions="Be brief.", input="hi", max_output_tokens=9, store=False
        )
        assert reply.output_text == "from quick" and reply.status == "completed"
        assert reply.usage is not None and reply.usage.output_tokens == 2
        assert reply.usage.total_tokens == reply.usage.input_tokens + 2
        sent = fakes["quick"].requests[-1].body
        assert sent["model"] == "m" and sent["max_completion_tokens"] == 9
        assert sent["messages"] == [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "hi"},
        ]
        assert "store" not in sent  # a Responses-only field is not sent to a chat provider

        stream = await sdk.responses.create(model="m", input="hi", stream=True)
        kinds: list[str] = []
        deltas: list[str] = []
        final: Any = None
        async with stream:
            async for event in stream:
                kinds.append(event.type)
                if event.type == "response.output_text.delta":
                    deltas.append(event.delta)
                elif event.type == "response.completed":
                    final = event.response
        assert kinds[:2] == ["response.created", "response.in_progress"]
        assert kinds[-1] == "response.completed"
        assert deltas == ["from", " quick"]  # one event per chunk, as the chunks came
        assert final.output_text == "from quick"
        assert final.usage is not None and final.usage.output_tokens == 2
        assert fakes["quick"].requests[-1].body["stream_options"] == {"include_usage": True}

        # The SDK's stream helper checks the events' order and ids as it accumulates.
        async with sdk.responses.stream(model="m", input="hi") as events:
            accumulated = await events.get_final_response()
        assert accumulated.output_text == "from quick"


@pytest.mark.anyio
async def test_a_function_tool_round_trip_and_structured_output() -> None:
    async with setup() as (fakes, sdk):
        fakes["quick"].script(Reply(tool_calls=[("weather", {"city": "Paris"})]))
        called = await sdk.responses.create(model="m", input="Weather in Paris?", tools=[TOOL])
        [call] = called.output
        assert call.type == "function_call" and call.name == "weather"
        assert json.loads(call.arguments) == {"city": "Paris"}
        sent = fakes["quick"].requests[-1].body
        assert sent["tools"][0]["function"]["name"] == "weather"

        fakes["quick"].script(Reply(text="Mild in Paris"))
        history: Any = [
            {"role": "user", "content": "Weather in Paris?"},
            call.model_dump(exclude_none=True),
            {"type": "function_call_output", "call_id": call.call_id, "output": "21.5 C"},
        ]
        answered = await sdk.responses.create(model="m", input=history, tools=[TOOL])
        assert answered.output_text == "Mild in Paris"
        assistant, result = fakes["quick"].requests[-1].body["messages"][-2:]
        assert assistant["tool_calls"][0]["id"] == call.call_id
        assert result == {"role": "tool", "tool_call_id": call.call_id, "content": "21.5 C"}

        fakes["quick"].script(Reply(tool_calls=[("weather", {"city": "Oslo"})]))
        async with sdk.responses.stream(model="m", input="Oslo?", tools=[TOOL]) as events:
            kinds = [event.type async for event in events]
            final = await events.get_final_response()
        assert "response.function_call_arguments.delta" in kinds
        [streamed] = final.output
        assert streamed.type == "function_call"
        assert json.loads(streamed.arguments) == {"city": "Oslo"}

        fakes["quick"].script(Reply(json_object={"city": "Oslo", "celsius": -3.0}))
        parsed = await sdk.responses.parse(model="m", input="Oslo?", text_format=City)
        assert parsed.output_parsed == City(city="Oslo", celsius=-3.0)
        sent_format = fakes["quick"].requests[-1].body["response_format"]
        assert sent_format["type"] == "json_schema" and sent_format["json_schema"]["name"]


@pytest.mark.anyio
async def test_stateful_fields_and_provider_errors_are_openai_errors() -> None:
    async with setup() as (fakes, sdk):
        with pytest.raises(openai.BadRequestError, match="stateless") as refused:
            await sdk.responses.create(model="m", input="hi", previous_response_id="resp_1")
        assert refused.value.param == "previous_response_id"
        with pytest.raises(openai.BadRequestError, match="stateless") as refused:
            await sdk.responses.create(model="m", input="hi", conversation="conv_1")
        assert refused.value.param == "conversation"
        assert fakes["quick"].requests == []  # refused before any call

        fakes["quick"].script(Reply(status=429, retry_after=7, error_message="slow down"))
        with pytest.raises(openai.RateLimitError, match="slow down") as limited:
            await sdk.responses.create(model="m", input="hi", stream=True)
        assert limited.value.response.headers["retry-after"] == "7"

        fakes["quick"].script(Reply(text="one two three", drop_after=1))
        broken = await sdk.responses.create(model="m", input="hi", stream=True)
        async with broken:
            events = [event async for event in broken]
        assert events[-1].type == "response.failed"
        failed = events[-1].response
        assert failed.status == "failed" and failed.error is not None
        assert failed.error.code == "server_error"  # the API's own code, not a class name


@pytest.mark.anyio
@pytest.mark.parametrize("streamed", [False, True])
async def test_a_hedged_responses_call_is_won_by_the_fast_target(streamed: bool) -> None:
    async with setup() as (fakes, sdk):
        fakes["slow"].script(Reply(stall_after=0))  # never sends a token
        raw = await sdk.responses.with_raw_response.create(
            model="fast", input="hi", stream=streamed
        )
        assert raw.headers["x-swiftclient-target"] == "quick/m"
        if streamed:
            stream: Any = raw.parse()
            async with stream:
                text = "".join(
                    [e.delta async for e in stream if e.type == "response.output_text.delta"]
                )
        else:
            text = raw.parse().output_text
        assert text == "from quick"
        await slow_was_cancelled(fakes)


@pytest.mark.anyio
async def test_the_response_names_the_model_that_answered_as_chat_does() -> None:
    """Called by a route (``quick/m``), every wire reports the model the provider answered
    with (``m``), as a Chat Completions answer does, not the name the SDK sent (the target
    is in ``x-swiftclient-target``)."""
    async with setup() as (_, sdk):
        chat = await sdk.chat.completions.create(model="quick/m", messages=USER_CHAT)
        raw = await sdk.responses.with_raw_response.create(model="quick/m", input="hi")
        assert chat.model == raw.parse().model == "m"
        assert raw.headers["x-swiftclient-target"] == "quick/m"
        stream = await sdk.responses.create(model="quick/m", input="hi", stream=True)
        async with stream:
            models = [e.response.model async for e in stream if hasattr(e, "response")]
        assert len(models) == 3 and set(models) == {"m"}  # created, in_progress, completed


@pytest.mark.anyio
async def test_a_refusal_names_the_fields_the_sdk_sent() -> None:
    """The request the wire makes is a chat request; a refusal of it named its fields
    (``max_completion_tokens``, ``tools.0.function.parameters``), which the caller never
    sent."""
    async with setup() as (_, sdk):
        with pytest.raises(openai.BadRequestError, match=r"max_output_tokens: Input should"):
            await sdk.responses.create(model="m", input="hi", max_output_tokens=0)
        bad: Any = [{"type": "function", "name": "f", "parameters": 5}]
        with pytest.raises(openai.BadRequestError, match=r"tools\[0\]\.parameters: Input"):
            await sdk.responses.create(model="m", input="hi", tools=bad)


def test_the_blocking_transport_serves_responses() -> None:
    with FakeProvider(Reply(text="from p"), model="p").run_in_thread() as fake:
        with Client(HTTPBackend(fake.base_url), model="m") as client:
            sdk = openai.OpenAI(
                base_url="http://swiftclient.invalid/v1",
                api_key="unused",
                http_client=httpx2.Client(transport=Transport(client)),
                max_retries=0,
            )
            assert sdk.responses.create(model="m", input="hi").output_text == "from p"
            with sdk.responses.stream(model="m", input="hi") as events:
                assert events.get_final_response().output_text == "from p"
            sdk.close()


# --------------------------------------------------------------------------- openai-agents


@pytest.mark.anyio
async def test_openai_agents_responses_model_runs_a_tool_streamed_and_not(
    anyio_backend: str,
) -> None:
    if anyio_backend != "asyncio":
        pytest.skip("openai-agents calls asyncio directly")
    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)  # it would export traces to OpenAI

    async with setup() as (fakes, sdk):
        model = agents.OpenAIResponsesModel(model="m", openai_client=sdk)
        agent = agents.Agent(name="forecaster", model=model, tools=[agents.function_tool(weather)])
        fakes["quick"].script(
            Reply(tool_calls=[("weather", {"city": "Paris"})]), Reply(text="Mild in Paris")
        )
        result = await agents.Runner.run(agent, "How warm is Paris?")
        assert result.final_output == "Mild in Paris"
        tool_turn = fakes["quick"].requests[-1].body["messages"][-1]
        assert tool_turn["role"] == "tool" and "21.5 degrees in Paris" in tool_turn["content"]

        fakes["quick"].script(
            Reply(tool_calls=[("weather", {"city": "Oslo"})]), Reply(text="Cold in Oslo")
        )
        run = agents.Runner.run_streamed(agent, "How warm is Oslo?")
        deltas: list[str] = []
        async for event in run.stream_events():
            data = getattr(event, "data", None)
            if getattr(data, "type", None) == "response.output_text.delta":
                deltas.append(data.delta)  # type: ignore[union-attr]
        assert run.final_output == "Cold in Oslo" and "".join(deltas) == "Cold in Oslo"
        assert all(r.body.get("stream") is True for r in fakes["quick"].requests[-2:])

        hedged = agents.Agent(
            name="h", model=agents.OpenAIResponsesModel(model="fast", openai_client=sdk)
        )
        fakes["slow"].script(Reply(stall_after=0))
        assert (await agents.Runner.run(hedged, "Say hi")).final_output == "from quick"
        await slow_was_cancelled(fakes)


# --------------------------------------------------------------------------- local engine


@pytest.mark.anyio
async def test_responses_over_the_embedded_engine_with_a_tool(anyio_backend: str) -> None:
    if anyio_backend != "asyncio":
        pytest.skip("one event loop is enough: the engine's own tests cover trio")
    from local_engine import LocalBackend

    async with AsyncClient(backends={"local": LocalBackend()}) as client:
        sdk = openai.AsyncOpenAI(
            base_url="http://swiftclient.invalid/v1",
            api_key="unused",
            http_client=httpx2.AsyncClient(transport=AsyncTransport(client)),
            max_retries=0,
        )
        # "Hello! How can I help you today?" is 16 tokens with its end (the space is a token
        # of its own in swift-tiny's tokenizer): 24 lets the stream complete.
        reply = await sdk.responses.create(model="local/default", input="hi", max_output_tokens=24)
        assert reply.output_text and reply.usage is not None and reply.usage.output_tokens >= 1
        async with sdk.responses.stream(
            model="local/default", input="hi", max_output_tokens=24
        ) as events:
            streamed = await events.get_final_response()
        assert streamed.output_text

        # The embedded default model is trained to call its get_weather tool.
        question = "What's the weather in Paris?"
        tool = {**TOOL, "name": "get_weather"}
        called = await sdk.responses.create(model="local/default", input=question, tools=[tool])
        calls = [item for item in called.output if item.type == "function_call"]
        assert calls and calls[0].name == "get_weather"
        history: Any = [
            {"role": "user", "content": question},
            *[item.model_dump(exclude_none=True) for item in calls],
            *[
                {"type": "function_call_output", "call_id": c.call_id, "output": "21 C, sunny"}
                for c in calls
            ],
        ]
        answered = await sdk.responses.create(
            model="local/default", input=history, tools=[tool], max_output_tokens=24
        )
        assert answered.status in ("completed", "incomplete") and answered.output
        await sdk.close()


# --------------------------------------------------------------------------- the encoder


def test_a_stream_without_a_usage_chunk_still_completes() -> None:
    """A backend that sends no usage chunk: the stream's end closes the response (with the
    usage of the last chunk that had some), and nothing is closed twice."""
    from swiftclient.types import ChatCompletionChunk, Usage
    from swiftclient.wire.responses import ResponseEcho, ResponseEvents

    events = ResponseEvents(ResponseEcho("m", {}))
    opening = [e["type"] for e in events.start()]
    usage = Usage(prompt_tokens=3, completion_tokens=1, total_tokens=4)
    chunk = ChatCompletionChunk.model_validate(
        {
            "id": "c",
            "created": 0,
            "model": "m",
            "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}],
            "usage": usage.model_dump(),
        }
    )
    fed = [e["type"] for e in events.feed(chunk)]
    closing = events.end()
    assert opening == ["response.created", "response.in_progress"]
    assert fed[-1] == "response.output_text.delta"
    assert closing[-1]["type"] == "response.completed"
    assert closing[-1]["response"]["usage"]["total_tokens"] == 4
    assert closing[-1]["response"]["output"][0]["content"][0]["text"] == "hi"
    assert events.end() == []


def _streamed(deltas: list[dict[str, Any]], finish: str) -> list[dict[str, Any]]:
    """The Responses events of a chat stream of ``deltas`` that ends with ``finish``, each
    checked against the ``openai`` SDK's event types."""
    from swiftclient.types import ChatCompletionChunk
    from swiftclient.wire.responses import ResponseEcho, ResponseEvents, chat_fields

    _, echoed = chat_fields({"model": "m", "input": "hi", "stream": True}, [])
    events = ResponseEvents(ResponseEcho("m", echoed))
    got = events.start()
    for at, delta in enumerate(deltas):
        choice = {"index": 0, "delta": delta, "finish_reason": None}
        if at == len(deltas) - 1:
            choice["finish_reason"] = finish
        chunk = {"id": "c", "created": 0, "model": "m", "choices": [choice]}
        got.extend(events.feed(ChatCompletionChunk.model_validate(chunk)))
    got.extend(events.end())
    adapter = pydantic.TypeAdapter(openai.types.responses.ResponseStreamEvent)
    for event in got:
        adapter.validate_python(event)
    return got


def test_a_streamed_refusal_is_a_refusal_part() -> None:
    """A stream's refusal deltas were dropped: the response ended with empty output text
    (a whole reply had its refusal part); a content filter's finish said ``completed``."""
    got = _streamed(
        [{"content": "Well."}, {"refusal": "I can't "}, {"refusal": "help."}], "content_filter"
    )
    kinds = [event["type"] for event in got]
    assert kinds.count("response.refusal.delta") == 2
    assert "response.refusal.done" in kinds
    done = [e for e in got if e["type"] == "response.refusal.done"]
    assert done[0]["refusal"] == "I can't help."
    final = got[-1]
    assert final["type"] == "response.incomplete"
    response = final["response"]
    assert response["incomplete_details"] == {"reason": "content_filter"}
    text, refusal = response["output"]
    assert text["content"][0]["text"] == "Well."
    assert refusal["content"] == [{"type": "refusal", "refusal": "I can't help."}]
    parsed = openai.types.responses.Response.model_validate(response)
    assert parsed.output_text == "Well."
    # the whole reply has the same output (it left the refusal out beside text)
    from swiftclient.types import ChatCompletion
    from swiftclient.wire.responses import ResponseEcho, chat_fields, response_body

    message = {"role": "assistant", "content": "Well.", "refusal": "I can't help."}
    choice = {"index": 0, "message": message, "finish_reason": "content_filter"}
    whole = ChatCompletion.model_validate(
        {"id": "c", "created": 0, "model": "m", "choices": [choice]}
    )
    _, echoed = chat_fields({"model": "m", "input": "hi"}, [])
    body = response_body(whole, ResponseEcho("m", echoed))
    assert [(item["content"], item["status"]) for item in body["output"]] == [
        (item["content"], item["status"]) for item in response["output"]
    ]  # the text completed, the refusal cut
    assert body["status"] == "incomplete"


def test_a_cut_reply_is_incomplete_for_its_token_limit() -> None:
    got = _streamed([{"content": "Hello"}], "length")
    assert got[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert "completed_at" not in got[-1]["response"]  # OpenAI's: only once completed
    completed = _streamed([{"content": "Hello"}], "stop")[-1]
    assert completed["type"] == "response.completed"
    assert isinstance(completed["response"]["completed_at"], int)


@pytest.mark.anyio
async def test_leaving_a_responses_stream_early_releases_the_connection() -> None:
    async with FakeProvider(Reply(text="one two three", stall_after=1)) as fake:
        backend = HTTPBackend(fake.base_url)
        async with AsyncClient(backend, model="m") as client:
            sdk = openai.AsyncOpenAI(
                base_url="http://swiftclient.invalid/v1",
                api_key="unused",
                http_client=httpx2.AsyncClient(transport=AsyncTransport(client)),
                max_retries=0,
            )
            stream = await sdk.responses.create(model="m", input="hi", stream=True)
            async with stream:
                async for event in stream:
                    if event.type == "response.output_text.delta":
                        break
            await settle(fake, 1, RELEASE_LIMIT)
            assert fake.cancelled == 1
            assert backend.pool_stats()["in_use"] == 0
            await sdk.close()
