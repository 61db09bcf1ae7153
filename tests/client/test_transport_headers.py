"""A provider's rate-limit and request-id headers: kept on each attempt's record, and handed
to the openai and anthropic SDKs on the answers of swiftclient's transports.

The providers are :class:`FakeProvider` instances scripted to send rate-limit headers; the
backends' HTTP goes over aiohttp on asyncio and httpx on trio (each test runs on both), and
the SDK side over the httpx2 and httpx transports. Hedged calls hand on the winner's headers
only.
"""

from __future__ import annotations

import gc
from contextlib import asynccontextmanager
from typing import Any

import httpx
import httpx2
import openai
import pytest

from swiftclient import (
    AnthropicBackend,
    APIConnectionError,
    AsyncClient,
    Client,
    HTTPBackend,
    RateLimitError,
    RetryPolicy,
)
from swiftclient._attempt import AttemptRun
from swiftclient.admission import Limits
from swiftclient.routing import Router
from swiftclient.testing import FakeProvider, Reply
from swiftclient.transports import HttpxTransport, Transport

from .mock import providers, settle
from .test_transport_messages import sdk_for as anthropic_sdk
from .test_transports import hedged_options
from .test_transports import sdk_async as openai_sdk

# The SDKs leave their SSE async generators for the event loop to finalize (trio warns
# about the SDKs' generators, not ours).
pytestmark = pytest.mark.filterwarnings(
    "ignore:Exception ignored in. <async_generator object "
    "(SSEDecoder|AsyncStream|AsyncChatCompletionStream|AsyncResponseStream|AsyncMessageStream)"
    "\\.\\w+ :pytest.PytestUnraisableExceptionWarning"
)
RELEASE_LIMIT = 30.0  # seconds; bounds waiting for cleanup, never a speed assertion
USER: Any = [{"role": "user", "content": "hi"}]
NO_RETRY = RetryPolicy.none()
QUICK = "quick/m"
ANTHROPIC_LIMITS = {
    "anthropic-ratelimit-requests-limit": "50",
    "anthropic-ratelimit-requests-remaining": "49",
    "anthropic-ratelimit-tokens-reset": "2026-01-01T00:00:00Z",
}


def limits(name: str) -> dict[str, str]:
    """OpenAI-style rate-limit headers that say which provider sent them."""
    return {
        "x-ratelimit-limit-requests": "500",
        "x-ratelimit-remaining-requests": "499",
        "x-ratelimit-reset-tokens": "6ms",
        "x-request-id": f"req_{name}",
        "openai-processing-ms": "12",  # not a rate limit: not kept
    }


def kept(sent: dict[str, str]) -> dict[str, str]:
    return {name: value for name, value in sent.items() if name != "openai-processing-ms"}


@asynccontextmanager
async def hedged(**options: Any) -> Any:
    """Fakes ``slow`` and ``quick``, and a client over them whose alias ``fast`` races
    both, hedged at once."""
    async with providers("slow", "quick") as fakes:
        async with AsyncClient(**{**hedged_options(fakes), **options}) as client:
            yield fakes, client


def assert_carries(headers: Any, sent: dict[str, str]) -> None:
    for name, value in kept(sent).items():
        assert headers.get(name) == value, name
    assert "openai-processing-ms" not in headers


# --------------------------------------------------------------------------- the record


@pytest.mark.anyio
@pytest.mark.parametrize("admission", [False, True])
async def test_every_answered_attempt_records_its_providers_headers(admission: bool) -> None:
    options: dict[str, Any] = {"limits": Limits()} if admission else {}
    async with hedged(**options) as (fakes, client):
        fakes["quick"].script(Reply(text="ok", headers=limits("quick")))
        reply = await client.chat(USER, model=QUICK)
        assert reply.timing.attempts[0].headers == kept(limits("quick"))

        fakes["quick"].script(Reply(text="ok", headers=limits("streamed")))
        async with client.stream(USER, model=QUICK) as stream:
            assert stream.timing.attempts[0].headers == kept(limits("streamed"))
            await stream.final()

        fakes["quick"].script(Reply(status=429, retry_after=3, headers=limits("limited")))
        with pytest.raises(RateLimitError) as failed:
            await client.chat(USER, model=QUICK)
        assert failed.value.attempts[0].headers == {"retry-after": "3", **kept(limits("limited"))}


@pytest.mark.anyio
async def test_headers_are_kept_by_name_and_redacted() -> None:
    async with hedged() as (fakes, client):
        echoed = {
            "x-api-key": "sk-live-0123456789abcdef",  # a credential: never kept
            "set-cookie": "session=abc",
            "x-ratelimit-note": "Bearer sk-live-0123456789abcdef",  # a key's shape: masked
            "request-id": "req_anthropic_1",
        }
        fakes["quick"].script(Reply(text="ok", headers=echoed))
        reply = await client.chat(USER, model=QUICK)
        headers = reply.timing.attempts[0].headers
        assert headers is not None
        assert headers["request-id"] == "req_anthropic_1"
        assert "sk-live" not in headers["x-ratelimit-note"]
        assert "x-api-key" not in headers and "set-cookie" not in headers


@pytest.mark.anyio
async def test_an_attempt_without_an_answer_records_none() -> None:
    async with AsyncClient(HTTPBackend("http://127.0.0.1:9/v1"), model="m", retry=NO_RETRY) as down:
        with pytest.raises(APIConnectionError) as failed:
            await down.chat(USER)
    assert failed.value.attempts[0].headers is None


def attempt_runs() -> int:
    # type(), not isinstance(): isinstance reads __class__, which lazy module attributes of
    # other libraries (torch's deprecated aliases) answer with a warning.
    return sum(type(item) is AttemptRun for item in gc.get_objects())


@pytest.mark.anyio
async def test_the_header_hook_keeps_no_attempt_alive() -> None:
    """The hook on the attempt's options holds no reference back to the attempt: once a
    call is done, its attempts are freed without waiting for the garbage collector."""
    async with hedged() as (fakes, client):
        fakes["quick"].script(*[Reply(text="ok", headers=limits("quick"))] * 2)
        gc.collect()
        gc.disable()
        try:
            before = attempt_runs()
            for streamed in (False, True):
                reply = await client.chat(USER, model=QUICK, stream=streamed)
                assert reply.timing.attempts[-1].headers == kept(limits("quick"))
                del reply
            assert attempt_runs() == before
        finally:
            gc.enable()


# --------------------------------------------------------------------------- openai SDK


@pytest.mark.anyio
@pytest.mark.parametrize("flavour", ["httpx2", "httpx"])
async def test_chat_completions_hand_the_sdk_the_providers_headers(flavour: str) -> None:
    async with hedged() as (fakes, client):
        sdk = openai_sdk(client, flavour)
        fakes["quick"].script(Reply(text="ok", headers=limits("plain")))
        raw = await sdk.chat.completions.with_raw_response.create(model=QUICK, messages=USER)
        assert_carries(raw.headers, limits("plain"))
        assert raw.parse()._request_id == "req_plain"

        fakes["quick"].script(Reply(text="ok", headers=limits("streamed")))
        async with sdk.chat.completions.with_streaming_response.create(
            model=QUICK, messages=USER, stream=True
        ) as streamed:
            assert_carries(streamed.headers, limits("streamed"))
            assert streamed.headers["x-swiftclient-target"] == "quick/m"
            chunks = [chunk async for chunk in await streamed.parse()]
        assert chunks
        await sdk.close()


@pytest.mark.anyio
@pytest.mark.parametrize("streamed", [False, True])
async def test_a_hedged_call_hands_on_the_winners_headers_only(streamed: bool) -> None:
    async with hedged() as (fakes, client):
        # The slow target never sends a token (streamed, its answer's head may arrive first).
        fakes["slow"].script(Reply(stall_after=0, headers=limits("slow")))
        fakes["quick"].script(Reply(text="ok", headers=limits("quick")))
        sdk = openai_sdk(client, "httpx2")
        raw = await sdk.chat.completions.with_raw_response.create(
            model="fast", messages=USER, stream=streamed
        )
        assert raw.headers["x-swiftclient-target"] == "quick/m"
        assert_carries(raw.headers, limits("quick"))
        if streamed:
            stream: Any = raw.parse()
            async with stream:
                async for _ in stream:
                    pass
        await settle(fakes["slow"], 1, RELEASE_LIMIT)  # the loser's request is over
        await sdk.close()


@pytest.mark.anyio
async def test_after_a_fallback_the_sdk_gets_the_answering_targets_headers() -> None:
    async with providers("down", "up") as fakes:
        fakes["down"].script(Reply(status=503, headers=limits("down")))
        fakes["up"].script(Reply(text="ok", headers=limits("up")))
        backends = {n: HTTPBackend(f.base_url, name=n) for n, f in fakes.items()}
        router = Router({"either": ["down/m", "up/m"]})
        async with AsyncClient(backends=backends, router=router, retry=NO_RETRY) as client:
            sdk = openai_sdk(client, "httpx2")
            raw = await sdk.chat.completions.with_raw_response.create(model="either", messages=USER)
            assert raw.headers["x-swiftclient-attempts"] == "2"
            assert_carries(raw.headers, limits("up"))
            await sdk.close()


@pytest.mark.anyio
async def test_responses_hand_the_sdk_the_providers_headers() -> None:
    async with hedged() as (fakes, client):
        sdk = openai_sdk(client, "httpx2")
        fakes["quick"].script(Reply(text="ok", headers=limits("plain")))
        raw = await sdk.responses.with_raw_response.create(model=QUICK, input="hi")
        assert_carries(raw.headers, limits("plain"))
        assert raw.parse().output_text == "ok"

        fakes["quick"].script(Reply(text="ok", headers=limits("streamed")))
        async with sdk.responses.with_streaming_response.create(
            model=QUICK, input="hi", stream=True
        ) as streamed:
            assert_carries(streamed.headers, limits("streamed"))
            events = [event.type async for event in await streamed.parse()]
        assert events[-1] == "response.completed"
        await sdk.close()


@pytest.mark.anyio
async def test_the_fields_a_provider_ignored_reach_the_sdk() -> None:
    """A server that names the fields it ignored (``x-ignored-fields``: the local server,
    say) is heard through the transports: a misspelt field sent through the SDK was
    dropped without a word, though ``client.chat`` refuses it. A wire that ignores fields
    of its own names them in the same header."""
    async with hedged() as (fakes, client):
        sdk = openai_sdk(client, "httpx2")
        said = {"x-ignored-fields": "max_tokenz"}
        fakes["quick"].script(Reply(text="ok", headers=said))
        body: Any = {"max_tokenz": 3}
        raw = await sdk.chat.completions.with_raw_response.create(
            model=QUICK, messages=USER, extra_body=body
        )
        assert raw.headers["x-ignored-fields"] == "max_tokenz"
        assert raw.parse().choices[0].message.content == "ok"
        fakes["quick"].script(Reply(text="ok", headers=said))
        async with sdk.chat.completions.with_streaming_response.create(
            model=QUICK, messages=USER, stream=True, extra_body=body
        ) as streamed:
            assert streamed.headers.get_list("x-ignored-fields") == ["max_tokenz"]
            assert [chunk async for chunk in await streamed.parse()]
        fakes["quick"].script(Reply(text="ok", headers={"x-ignored-fields": "max_tokenz, store"}))
        raw_response = await sdk.responses.with_raw_response.create(
            model=QUICK, input="hi", store=True, extra_body=body
        )
        # the provider's and the wire's own (store), each once, in one header
        assert raw_response.headers.get_list("x-ignored-fields") == ["max_tokenz, store"]
        await sdk.close()


@pytest.mark.anyio
async def test_ignored_field_names_a_caller_chose_are_escaped_in_the_header() -> None:
    """A Responses or Messages field the wire ignores is named in ``x-ignored-fields`` as
    sent: a non-ASCII name raised ``UnicodeEncodeError`` at the SDK, and a CR-LF in one
    wrote a header line of its own into the SDK's answer."""
    body: Any = {
        "ключ": 1,
        "a\r\nx-evil: 1": 2,
        "b,c": 3,
        "include": ["reasoning.encrypted_content"],
    }
    async with hedged() as (fakes, client):
        sdk = openai_sdk(client, "httpx2")
        fakes["quick"].script(Reply(text="ok"))
        raw = await sdk.responses.with_raw_response.create(model=QUICK, input="hi", extra_body=body)
        assert raw.headers.get_list("x-ignored-fields") == [
            "\\u043a\\u043b\\u044e\\u0447, a\\r\\nx-evil: 1, b\\x2cc, "
            "include:reasoning.encrypted_content"
        ]
        assert "x-evil" not in raw.headers
        assert raw.parse().output_text == "ok"
        await sdk.close()
        anthropic = anthropic_sdk(client)
        fakes["quick"].script(Reply(text="ok"))
        answer = await anthropic.messages.with_raw_response.create(
            model=QUICK, max_tokens=9, messages=USER, extra_body={"ключ": 1}
        )
        assert answer.headers["x-ignored-fields"] == "\\u043a\\u043b\\u044e\\u0447"
        await anthropic.close()


# --------------------------------------------------------------------------- anthropic SDK


@pytest.mark.anyio
async def test_messages_hand_the_anthropic_sdk_the_providers_headers() -> None:
    fake = FakeProvider(Reply(text="ok"), model="claude")
    async with fake, AsyncClient(AnthropicBackend(fake.base_url, api_key="k"), model="c") as client:
        sdk = anthropic_sdk(client)
        plain = {**ANTHROPIC_LIMITS, "request-id": "req_plain"}
        fake.script(Reply(text="ok", headers=plain))
        raw = await sdk.messages.with_raw_response.create(model="c", max_tokens=20, messages=USER)
        assert {name: raw.headers.get(name) for name in plain} == plain
        assert (await raw.parse())._request_id == "req_plain"

        streamed_limits = {**ANTHROPIC_LIMITS, "request-id": "req_streamed"}
        fake.script(Reply(text="ok", headers=streamed_limits))
        async with sdk.messages.with_streaming_response.create(
            model="c", max_tokens=20, messages=USER, stream=True
        ) as streamed:
            assert {n: streamed.headers.get(n) for n in streamed_limits} == streamed_limits
            events = [event.type async for event in await streamed.parse()]
        assert events[-1] == "message_stop"
        await sdk.close()


# --------------------------------------------------------------------------- blocking


@pytest.mark.parametrize("flavour", ["httpx2", "httpx"])
def test_the_blocking_transports_hand_on_the_providers_headers(flavour: str) -> None:
    with FakeProvider(Reply(text="ok")).run_in_thread() as fake:
        with Client(HTTPBackend(fake.base_url), model="m", retry=NO_RETRY) as client:
            http: Any = (
                httpx2.Client(transport=Transport(client))
                if flavour == "httpx2"
                else httpx.Client(transport=HttpxTransport(client))
            )
            sdk = openai.OpenAI(
                base_url="http://x/v1", api_key="unused", http_client=http, max_retries=0
            )
            fake.script(Reply(text="ok", headers=limits("plain")))
            raw = sdk.chat.completions.with_raw_response.create(model="m", messages=USER)
            assert_carries(raw.headers, limits("plain"))

            fake.script(Reply(text="ok", headers=limits("streamed")))
            with sdk.chat.completions.with_streaming_response.create(
                model="m", messages=USER, stream=True
            ) as streamed:
                assert_carries(streamed.headers, limits("streamed"))
                pieces = [c.choices[0].delta.content for c in streamed.parse() if c.choices]
            assert "".join(p or "" for p in pieces) == "ok"
            sdk.close()


@pytest.mark.anyio
async def test_the_anthropic_sdks_beta_flags_reach_the_provider() -> None:
    """``betas=[...]`` (the ``anthropic-beta`` header) was left at the transport: beta
    features turned off without a word. It goes on with the call; the SDK's own key and
    version headers do not (the backend sends its own)."""
    fake = FakeProvider(Reply(text="ok"), model="claude", api_key="sk-ant-real")
    async with fake, AsyncClient(AnthropicBackend(fake.base_url, api_key="sk-ant-real")) as client:
        sdk = anthropic_sdk(client)
        beta = "context-1m-2025-08-07"
        await sdk.beta.messages.create(
            model="anthropic/c", max_tokens=20, messages=USER, betas=[beta]
        )
        sent = fake.requests[-1].headers
        assert sent["anthropic-beta"] == beta and sent["x-api-key"] == "sk-ant-real"
        await sdk.messages.create(model="anthropic/c", max_tokens=20, messages=USER)
        assert "anthropic-beta" not in fake.requests[-1].headers
        await sdk.close()
    # a beta the backend sends on every request is kept beside the call's (it was replaced)
    fake = FakeProvider(Reply(text="ok"), model="claude", api_key="sk-ant-real")
    async with fake:
        backend = AnthropicBackend(
            fake.base_url, api_key="sk-ant-real", headers={"Anthropic-Beta": "backend-beta"}
        )
        async with AsyncClient(backend) as client:
            sdk = anthropic_sdk(client)
            await sdk.beta.messages.create(
                model="anthropic/c", max_tokens=20, messages=USER, betas=["b1", "backend-beta"]
            )
            assert fake.requests[-1].headers["anthropic-beta"] == "backend-beta,b1"
            await sdk.messages.create(model="anthropic/c", max_tokens=20, messages=USER)
            assert fake.requests[-1].headers["anthropic-beta"] == "backend-beta"
            await sdk.close()
