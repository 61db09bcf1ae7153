"""swiftclient under the real ``openai`` SDK: the httpx2 and httpx transports.

Every test drives ``openai.AsyncOpenAI`` / ``openai.OpenAI`` through a transport into a
swiftclient client whose backends are :class:`FakeProvider` instances, and checks what the
SDK sees (its own parsed types, status errors, stream events) and what the providers saw.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, ExitStack, asynccontextmanager, contextmanager
from typing import Any

import anyio
import httpx
import httpx2
import openai
import pydantic
import pytest

from swiftclient import AsyncClient, Client, ConfigurationError, Hedge, HTTPBackend, RetryPolicy
from swiftclient.routing import Router
from swiftclient.testing import FakeProvider, Reply
from swiftclient.transports import AsyncHttpxTransport, AsyncTransport, HttpxTransport, Transport

from .mock import settle

# The openai SDK leaves its own SSE async generators for the event loop to finalize when a
# stream ends; on trio that is a warning about the SDK's generators, not ours.
pytestmark = pytest.mark.filterwarnings(
    "ignore:Exception ignored in. <async_generator object "
    "(SSEDecoder|AsyncStream|AsyncChatCompletionStream)\\.\\w+ "
    ":pytest.PytestUnraisableExceptionWarning"
)
NO_RETRY = RetryPolicy.none()
RELEASE_LIMIT = 30.0  # seconds; bounds waiting for cleanup, never a speed assertion
USER: Any = [{"role": "user", "content": "hi"}]
WEATHER_TOOL: Any = {
    "type": "function",
    "function": {
        "name": "weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


class City(pydantic.BaseModel):
    city: str
    celsius: float


def sdk_async(client: AsyncClient, flavour: str = "httpx2") -> openai.AsyncOpenAI:
    http: Any = (
        httpx2.AsyncClient(transport=AsyncTransport(client))
        if flavour == "httpx2"
        else httpx.AsyncClient(transport=AsyncHttpxTransport(client))
    )
    return openai.AsyncOpenAI(
        base_url="http://swiftclient.invalid/v1", api_key="unused", http_client=http, max_retries=0
    )


def sdk_sync(client: Client, flavour: str = "httpx2") -> openai.OpenAI:
    http: Any = (
        httpx2.Client(transport=Transport(client))
        if flavour == "httpx2"
        else httpx.Client(transport=HttpxTransport(client))
    )
    return openai.OpenAI(
        base_url="http://swiftclient.invalid/v1", api_key="unused", http_client=http, max_retries=0
    )


@asynccontextmanager
async def providers(*names: str) -> AsyncIterator[dict[str, FakeProvider]]:
    async with AsyncExitStack() as stack:
        yield {
            name: await stack.enter_async_context(
                FakeProvider(Reply(text=f"from {name}"), model=name)
            )
            for name in names
        }


@contextmanager
def sync_providers(*names: str) -> Iterator[dict[str, FakeProvider]]:
    with ExitStack() as stack:
        yield {
            name: stack.enter_context(
                FakeProvider(Reply(text=f"from {name}"), model=name).run_in_thread()
            )
            for name in names
        }


def hedged_options(fakes: dict[str, FakeProvider]) -> dict[str, Any]:
    """Backends per fake, and the alias ``fast`` racing ``slow`` against ``quick``."""
    return {
        "backends": {name: HTTPBackend(f.base_url, name=name) for name, f in fakes.items()},
        "router": Router({"fast": ["slow/m", "quick/m"]}),
        "hedge": Hedge(delay=0.0),
        "retry": NO_RETRY,
    }


async def wait_idle(fake: FakeProvider) -> None:
    with anyio.fail_after(RELEASE_LIMIT):
        await fake.wait_until_idle()


# --------------------------------------------------------------------------- async SDK


@pytest.mark.anyio
@pytest.mark.parametrize("flavour", ["httpx2", "httpx"])
async def test_the_async_sdk_gets_its_own_types_plain_and_streamed(flavour: str) -> None:
    async with providers("p") as fakes:
        backend = HTTPBackend(fakes["p"].base_url, name="p")
        async with AsyncClient(backend, retry=NO_RETRY) as client:
            sdk = sdk_async(client, flavour)
            raw = await sdk.chat.completions.with_raw_response.create(model="m", messages=USER)
            reply = raw.parse()
            assert reply.choices[0].message.content == "from p"
            assert reply.usage is not None and reply.usage.completion_tokens == 2
            assert fakes["p"].requests[-1].body["model"] == "m"
            # a provider's body: no fields of swiftclient's own left null (the SDK showed
            # thinking_blocks=None and the like), the nullable ones the schema requires kept
            body = json.loads(raw.http_response.content)
            message = body["choices"][0]["message"]
            assert set(message) == {"role", "content"}
            assert body["choices"][0]["logprobs"] is None
            assert None not in body["usage"].values()
            assert message == reply.choices[0].message.model_dump(exclude_none=True)

            stream = await sdk.chat.completions.create(
                model="p/m", messages=USER, stream=True, stream_options={"include_usage": True}
            )
            pieces: list[str] = []
            usage = None
            async with stream:
                async for chunk in stream:
                    if chunk.choices and chunk.choices[0].delta.content:
                        pieces.append(chunk.choices[0].delta.content)
                    usage = chunk.usage or usage
            assert pieces == ["from", " p"]  # one SSE event per chunk, as they came
            assert usage is not None and usage.total_tokens == usage.prompt_tokens + 2
            await sdk.close()
            await wait_idle(fakes["p"])
            assert backend.pool_stats()["in_use"] == 0


@pytest.mark.anyio
@pytest.mark.parametrize("flavour", ["httpx2", "httpx"])
async def test_a_stream_carries_usage_only_when_the_sdk_asked_for_it(flavour: str) -> None:
    """OpenAI sends the usage chunk (``choices: []``) only for ``include_usage``; sent
    unasked, the usual ``chunk.choices[0]`` loop raised IndexError after the text."""
    async with providers("p") as fakes:
        async with AsyncClient(
            HTTPBackend(fakes["p"].base_url, name="p"), retry=NO_RETRY
        ) as client:
            sdk = sdk_async(client, flavour)
            for options, asked in ((None, False), (False, False), (True, True)):
                extra = {} if options is None else {"stream_options": {"include_usage": options}}
                stream = await sdk.chat.completions.create(
                    model="p/m", messages=USER, stream=True, **extra
                )
                chunks = [chunk async for chunk in stream]
                assert any(not chunk.choices for chunk in chunks) is asked, options
                assert any(chunk.usage is not None for chunk in chunks) is asked, options
                text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
                assert text == "from p"
            # unasked, or refused, the client still asks its provider for usage (its own
            # accounting needs it)
            for request in fakes["p"].requests:
                assert request.body["stream_options"] == {"include_usage": True}
            await sdk.close()


@pytest.mark.anyio
async def test_the_sdks_own_timeout_bounds_the_call() -> None:
    """``timeout=`` on the SDK (or one of its calls) was ignored: the call waited for the
    provider as long as the client's own limits allowed."""
    async with providers("p") as fakes:
        fakes["p"].script(Reply(ttft=120), Reply(ttft=120), Reply(text="a b c", stall_after=1))
        backend = HTTPBackend(fakes["p"].base_url, name="p")
        async with AsyncClient(backend, retry=NO_RETRY, timeout=120) as client:
            sdk = sdk_async(client)
            with anyio.fail_after(RELEASE_LIMIT):
                with pytest.raises(openai.APIStatusError) as plain:
                    await sdk.chat.completions.create(model="p/m", messages=USER, timeout=0.5)
                assert plain.value.status_code == 504
                with pytest.raises(openai.APIStatusError) as first_token:
                    await sdk.chat.completions.create(
                        model="p/m", messages=USER, stream=True, timeout=0.5
                    )
                assert first_token.value.status_code == 504
                stream = await sdk.chat.completions.create(
                    model="p/m", messages=USER, stream=True, timeout=0.5
                )
                with pytest.raises(openai.APIError, match="StreamStalled|stalled|idle"):
                    async for _ in stream:
                        pass
            await sdk.close()
            await wait_idle(fakes["p"])


@pytest.mark.anyio
async def test_tools_and_structured_output_through_the_async_sdk() -> None:
    async with providers("p") as fakes:
        async with AsyncClient(HTTPBackend(fakes["p"].base_url), model="m") as client:
            sdk = sdk_async(client)
            fakes["p"].script(Reply(tool_calls=[("weather", {"city": "Paris"})]))
            called = await sdk.chat.completions.create(
                model="m", messages=USER, tools=[WEATHER_TOOL]
            )
            call = called.choices[0].message.tool_calls
            assert call is not None and call[0].function.name == "weather"  # type: ignore[union-attr]
            assert json.loads(call[0].function.arguments) == {"city": "Paris"}  # type: ignore[union-attr]
            assert called.choices[0].finish_reason == "tool_calls"
            assert fakes["p"].requests[-1].body["tools"][0]["function"]["name"] == "weather"

            fakes["p"].script(Reply(json_object={"city": "Paris", "celsius": 21.5}))
            parsed = await sdk.chat.completions.parse(
                model="m", messages=USER, response_format=City
            )
            assert parsed.choices[0].message.parsed == City(city="Paris", celsius=21.5)
            sent = fakes["p"].requests[-1].body["response_format"]
            assert sent["type"] == "json_schema"

            fakes["p"].script(Reply(tool_calls=[("weather", {"city": "Oslo"})]))
            async with sdk.chat.completions.stream(
                model="m", messages=USER, tools=[WEATHER_TOOL]
            ) as events:
                final = await events.get_final_completion()
            streamed = final.choices[0].message.tool_calls
            assert streamed is not None
            assert json.loads(streamed[0].function.arguments) == {"city": "Oslo"}  # type: ignore[union-attr]
            await sdk.close()


@pytest.mark.anyio
async def test_errors_reach_the_sdk_as_the_providers_http_answers() -> None:
    async with providers("p") as fakes:
        backend = HTTPBackend(fakes["p"].base_url)
        async with AsyncClient(backend, model="m", retry=NO_RETRY) as client:
            sdk = sdk_async(client)
            fakes["p"].script(Reply(status=429, retry_after=7, error_message="slow down"))
            with pytest.raises(openai.RateLimitError) as limited:
                await sdk.chat.completions.create(model="m", messages=USER)
            assert limited.value.status_code == 429
            assert limited.value.response.headers["retry-after"] == "7"
            assert limited.value.request_id is not None
            assert limited.value.request_id.startswith("req_fake_")
            assert "slow down" in limited.value.message

            fakes["p"].script(Reply(status=400, error_message="bad field"))
            with pytest.raises(openai.BadRequestError, match="bad field"):
                await sdk.chat.completions.create(model="m", messages=USER, stream=True)

            # Bad input the client refuses before sending: a 400 too.
            with pytest.raises(openai.BadRequestError, match="messages"):
                await sdk.chat.completions.create(
                    model="m", messages=[{"role": "tool", "content": "x"}]
                )

            # A failure after the stream began: the SDK raises on the error event.
            fakes["p"].script(Reply(text="one two three", drop_after=1))
            stream = await sdk.chat.completions.create(model="m", messages=USER, stream=True)
            with pytest.raises(openai.APIError):
                async with stream:
                    async for _ in stream:
                        pass

            await sdk.close()
            await wait_idle(fakes["p"])
            assert backend.pool_stats()["in_use"] == 0


@pytest.mark.anyio
async def test_the_async_sdk_leaving_a_stream_early_releases_the_connection() -> None:
    async with providers("p") as fakes:
        backend = HTTPBackend(fakes["p"].base_url)
        async with AsyncClient(backend, model="m") as client:
            sdk = sdk_async(client)
            fakes["p"].script(Reply(text="one two three", stall_after=1))
            stream = await sdk.chat.completions.create(model="m", messages=USER, stream=True)
            async with stream:
                async for chunk in stream:
                    if chunk.choices and chunk.choices[0].delta.content:
                        break
            await wait_idle(fakes["p"])
            assert fakes["p"].cancelled == 1
            assert backend.pool_stats()["in_use"] == 0
            await sdk.close()


@pytest.mark.anyio
@pytest.mark.parametrize("streamed", [False, True])
async def test_a_hedged_sdk_call_is_won_by_the_fast_target(streamed: bool) -> None:
    async with providers("slow", "quick") as fakes:
        fakes["slow"].script(Reply(stall_after=0))  # never sends a token
        async with AsyncClient(**hedged_options(fakes)) as client:
            sdk = sdk_async(client)
            raw = await sdk.chat.completions.with_raw_response.create(
                model="fast", messages=USER, stream=streamed
            )
            assert raw.headers["x-swiftclient-target"] == "quick/m"
            if streamed:
                stream: Any = raw.parse()
                text = ""
                async with stream:
                    async for chunk in stream:
                        if chunk.choices:
                            text += chunk.choices[0].delta.content or ""
            else:
                text = raw.parse().choices[0].message.content or ""
            assert text == "from quick"
            await settle(fakes["slow"], 1, RELEASE_LIMIT)
            assert len(fakes["slow"].requests) == fakes["slow"].cancelled == 1
            assert fakes["quick"].cancelled == 0
            await sdk.close()


# --------------------------------------------------------------------------- sync SDK


@pytest.mark.parametrize("flavour", ["httpx2", "httpx"])
def test_the_sync_sdk_through_a_blocking_client(flavour: str) -> None:
    with sync_providers("slow", "quick") as fakes, Client(**hedged_options(fakes)) as client:
        sdk = sdk_sync(client, flavour)
        plain = sdk.chat.completions.create(model="quick/m", messages=USER)
        assert plain.choices[0].message.content == "from quick"
        with sdk.chat.completions.create(model="quick/m", messages=USER, stream=True) as stream:
            pieces = [c.choices[0].delta.content for c in stream if c.choices]
        assert [p for p in pieces if p] == ["from", " quick"]

        fakes["quick"].script(Reply(json_object={"city": "Oslo", "celsius": -3.0}))
        parsed = sdk.chat.completions.parse(model="quick/m", messages=USER, response_format=City)
        assert parsed.choices[0].message.parsed == City(city="Oslo", celsius=-3.0)

        fakes["slow"].script(Reply(stall_after=0))
        raw = sdk.chat.completions.with_raw_response.create(model="fast", messages=USER)
        assert raw.headers["x-swiftclient-target"] == "quick/m"
        assert raw.parse().choices[0].message.content == "from quick"
        anyio.run(settle, fakes["slow"], 1, RELEASE_LIMIT)
        assert len(fakes["slow"].requests) == fakes["slow"].cancelled == 1

        fakes["quick"].script(Reply(status=503, retry_after=2))
        with pytest.raises(openai.InternalServerError) as failed:
            sdk.chat.completions.create(model="quick/m", messages=USER)
        assert failed.value.response.headers["retry-after"] == "2"
        sdk.close()


@pytest.mark.anyio
async def test_a_closed_client_is_a_503_to_the_sdk_not_a_400() -> None:
    """The request was not at fault (frameworks read a 400 as the caller's): a call on a
    client that was closed reaches the SDK as 503."""
    async with providers("quick") as fakes:
        client = AsyncClient(HTTPBackend(fakes["quick"].base_url), model="m")
        async with client:
            sdk = sdk_async(client)
        with pytest.raises(openai.InternalServerError) as closed:
            await sdk.chat.completions.create(model="m", messages=USER)
        assert closed.value.status_code == 503 and "is closed" in str(closed.value)
        # Nor retried by an SDK left at its default retries (it tried three times, with
        # backoff, for an answer that cannot change)
        assert closed.value.response.headers["x-should-retry"] == "false"
        sent: list[object] = []

        async def count(request: object) -> None:
            sent.append(request)

        http = httpx.AsyncClient(
            transport=AsyncHttpxTransport(client), event_hooks={"request": [count]}
        )
        retrying = openai.AsyncOpenAI(
            base_url="http://swiftclient.invalid/v1",
            api_key="unused",
            http_client=http,
            max_retries=2,
        )
        with pytest.raises(openai.InternalServerError):
            await retrying.chat.completions.create(model="m", messages=USER)
        assert len(sent) == 1
        await retrying.close()
        await sdk.close()


def test_a_blocking_sdk_stream_closed_from_another_thread() -> None:
    """A "stop" button: one thread reads an SDK stream while another closes it. close()
    raised ValueError ("generator already executing"); it returns, the reader ends, and
    the provider's request is released."""
    import threading

    with FakeProvider(Reply(tokens=2000, token_delay=0.01)).run_in_thread() as fake:
        with Client(HTTPBackend(fake.base_url), model="m") as client:
            sdk = sdk_sync(client)
            stream = sdk.chat.completions.create(model="m", messages=USER, stream=True)
            started = threading.Event()

            def read() -> None:
                for _ in stream:
                    started.set()

            reader = threading.Thread(target=read)
            reader.start()
            assert started.wait(RELEASE_LIMIT)
            stream.close()
            reader.join(RELEASE_LIMIT)
            assert not reader.is_alive()
            anyio.run(settle, fake, 1, RELEASE_LIMIT)
            assert fake.cancelled == 1
            sdk.close()


def test_paths_the_transport_does_not_serve_answer_404() -> None:
    with sync_providers("p") as fakes, Client(HTTPBackend(fakes["p"].base_url)) as client:
        http = httpx2.Client(transport=Transport(client))
        response = http.post("http://x/v1/embeddings", json={"model": "m", "input": "hi"})
        assert response.status_code == 404
        assert "/chat/completions" in response.json()["error"]["message"]
        assert "/responses" in response.json()["error"]["message"]
        # an extra_body that is no object was dropped without a word
        body = {"model": "m", "messages": USER, "extra_body": 5}
        response = http.post("http://x/v1/chat/completions", json=body)
        assert response.status_code == 400
        assert response.json()["error"]["param"] == "extra_body"
        assert fakes["p"].requests == []
        http.close()


# --------------------------------------------------------------------------- local engine


@pytest.mark.anyio
async def test_the_sdk_over_the_embedded_engine_needs_no_server(anyio_backend: str) -> None:
    if anyio_backend != "asyncio":
        pytest.skip("one event loop is enough: the engine's own tests cover trio")
    from local_engine import LocalBackend

    async with AsyncClient(backends={"local": LocalBackend()}) as client:
        sdk = sdk_async(client)
        reply = await sdk.chat.completions.create(
            model="local/default", messages=USER, max_tokens=16
        )
        assert reply.choices[0].message.content
        assert reply.usage is not None and reply.usage.completion_tokens >= 1
        stream = await sdk.chat.completions.create(
            model="local/default", messages=USER, max_tokens=16, stream=True
        )
        async with stream:
            text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        assert text
        await sdk.close()


def test_a_transport_refuses_the_other_kind_of_client() -> None:
    backend = HTTPBackend("http://127.0.0.1:8000/v1")
    with Client(backend, model="m") as blocking:
        with pytest.raises(ConfigurationError, match="blocking Client goes with"):
            AsyncTransport(blocking)  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError, match="blocking Client goes with"):
            AsyncHttpxTransport(blocking)  # type: ignore[arg-type]
    asynchronous = AsyncClient(backend, model="m")
    with pytest.raises(ConfigurationError, match="AsyncClient goes with"):
        Transport(asynchronous)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="AsyncClient goes with"):
        HttpxTransport(asynchronous)  # type: ignore[arg-type]
