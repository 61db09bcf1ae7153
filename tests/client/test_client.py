"""AsyncClient behaviour over a mock transport: routing, streaming, retries, timeouts."""

from __future__ import annotations

import json
import os
import re
import sys
import warnings
from typing import Any

import anyio
import pydantic
import pytest

from swiftclient import (
    APIResponseValidationError,
    AsyncClient,
    AuthenticationError,
    BackendNameWarning,
    BadRequestError,
    ConfigurationError,
    DeadlineExceeded,
    FirstTokenTimeout,
    HTTPBackend,
    InternalServerError,
    RateLimitError,
    StreamError,
    StreamStalled,
    StructuredOutputError,
    Timeout,
)
from swiftclient.providers import from_env, preset
from swiftclient.types import Timing

from .mock import (
    FAST_RETRY,
    KEY,
    Script,
    backend_for,
    chunk,
    mock_client,
    scripted_client,
    serve_handler,
    sse,
    stream_body,
)

pytestmark = pytest.mark.anyio
over_transports = pytest.mark.usefixtures("transport")
"""A test that sends requests runs over aiohttp and httpx, on a loopback socket; the rest
keep the MockTransport (no request sent, or a transport-level behaviour of httpx's own)."""


@over_transports
async def test_chat_streams_and_measures() -> None:
    script = Script()
    async with scripted_client(script) as client:
        completion = await client.chat([{"role": "user", "content": "hi"}], temperature=0)
    assert completion.text == "Hello world"
    assert completion.usage is not None and completion.usage.completion_tokens == 2
    timing = completion.timing
    assert timing is not None and timing.ttft is not None and timing.total is not None
    assert len(timing.itl) == 1 and len(timing.attempts) == 1
    assert timing.attempts[0].outcome == "ok"
    body = json.loads(script.requests[0].content)
    assert body["stream"] is True and body["temperature"] == 0 and body["model"] == "m"
    assert script.requests[0].headers["authorization"] == f"Bearer {KEY}"


@over_transports
async def test_stream_text_and_final_and_early_exit_closes() -> None:
    script = Script()
    async with scripted_client(script) as client:
        async with client.stream("hi") as stream:
            texts = [t async for t in stream.text()]
            final = await stream.final()
        assert texts == ["Hello", " world"] and final.text == "Hello world"
        async with client.stream("hi") as stream:
            async for _ in stream:
                break
        await script.wait_closed(2)  # both released while the client is still open
    assert len(script.closed) == 2


@over_transports
async def test_a_stream_read_outside_its_block_says_how_to_open_it() -> None:
    """``client.stream(...)`` without ``async with`` sent nothing and iterated zero chunks
    (``final()`` gave an empty completion): a silent wrong answer. It is a clear error."""
    script = Script()
    async with scripted_client(script) as client:
        stream = client.stream("hi")
        with pytest.raises(ConfigurationError, match="async with client.stream"):
            async for _ in stream:
                pass
        with pytest.raises(ConfigurationError, match="async with client.stream"):
            await client.stream("hi").final()
        with pytest.raises(ConfigurationError, match="async with client.stream"):
            [t async for t in client.stream("hi").text()]
        async with client.stream("hi") as opened:  # the block, as documented, still works
            assert (await opened.final()).text == "Hello world"
    assert len(script.requests) == 1


@over_transports
async def test_tool_call_deltas_are_merged() -> None:
    parts = [
        chunk(role="assistant"),
        chunk(
            tool_calls=[
                {
                    "index": 0,
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": ""},
                }
            ]
        ),
        chunk(tool_calls=[{"index": 0, "function": {"arguments": '{"city": '}}]),
        chunk(tool_calls=[{"index": 0, "function": {"arguments": '"Paris"}'}}]),
        chunk(
            tool_calls=[{"index": 1, "id": "call_2", "function": {"name": "t", "arguments": "{}"}}]
        ),
        chunk(finish="tool_calls"),
        b"data: [DONE]\n\n",
    ]
    script = Script().add(parts=parts)
    async with scripted_client(script) as client:
        completion = await client.chat("weather?")
    calls = completion.tool_calls
    assert [c.function.name for c in calls] == ["get_weather", "t"]
    assert json.loads(calls[0].function.arguments) == {"city": "Paris"}
    assert calls[0].id == "call_1" and completion.finish_reason == "tool_calls"
    assert completion.choices[0].message.content is None


@over_transports
async def test_retries_5xx_then_succeeds_with_one_idempotency_key() -> None:
    script = Script().add(503).add(429, headers={"retry-after-ms": "1"}).add()
    async with scripted_client(script) as client:
        completion = await client.chat("hi")
    assert completion.text == "ok"
    attempts = completion.timing.attempts if completion.timing else []
    assert [a.outcome for a in attempts] == ["error", "error", "ok"]
    assert [a.status_code for a in attempts] == [503, 429, None]
    keys = {r.headers["idempotency-key"] for r in script.requests}
    assert len(keys) == 1


@over_transports
async def test_400_is_never_retried_and_carries_body() -> None:
    script = Script().add(400).add()
    async with scripted_client(script) as client:
        with pytest.raises(BadRequestError) as info:
            await client.chat("hi")
    assert len(script.requests) == 1
    assert info.value.status_code == 400 and info.value.body == {"error": {"message": "status 400"}}
    assert KEY not in str(info.value) and KEY not in repr(info.value)


@over_transports
async def test_x_should_retry_overrides_status() -> None:
    script = (
        Script()
        .add(400, headers={"x-should-retry": "true"})
        .add(500, headers={"x-should-retry": "false"})
    )
    async with scripted_client(script) as client:
        with pytest.raises(InternalServerError):
            await client.chat("hi")
    assert len(script.requests) == 2


@over_transports
async def test_retry_after_past_the_deadline_is_not_waited_for() -> None:
    script = Script().add(429, headers={"retry-after": "30"}).add()
    async with scripted_client(script, timeout=Timeout(total=5)) as client:
        with pytest.raises(RateLimitError):
            await client.chat("hi")
    assert len(script.requests) == 1


@over_transports
async def test_exhausted_retries_raise_last_error() -> None:
    script = Script().add(500).add(502).add(503).add()
    async with scripted_client(script) as client:
        with pytest.raises(InternalServerError) as info:
            await client.chat("hi")
    assert info.value.status_code == 503 and len(script.requests) == 3


@over_transports
async def test_idle_timeout_raises_stream_stalled_after_content() -> None:
    script = Script().add(parts=[chunk(role="assistant"), chunk("a")], stall=True)
    async with scripted_client(script, timeout=Timeout(total=60, idle=0.3)) as client:
        async with client.stream("hi") as stream:
            with pytest.raises(StreamStalled):
                async for _ in stream:
                    pass
        await script.wait_closed(1)  # the stalled reply let go while the client is open
    assert len(script.requests) == 1  # no retry once content has arrived
    assert script.closed


@over_transports
async def test_first_token_timeout_is_retried_then_raised() -> None:
    script = Script()
    for _ in range(3):
        script.add(parts=[chunk(role="assistant"), b": keep-alive\n\n"], stall=True)
    async with scripted_client(
        script, timeout=Timeout(total=60, first_token=0.3, idle=None)
    ) as client:
        with pytest.raises(FirstTokenTimeout):
            await client.chat("hi")
    assert len(script.requests) == 3


@over_transports
async def test_total_deadline_bounds_everything() -> None:
    script = Script().add(parts=[chunk(role="assistant")], stall=True)
    async with scripted_client(script, timeout=Timeout(total=0.3, idle=None)) as client:
        with pytest.raises(DeadlineExceeded):
            await client.chat("hi")


@over_transports
async def test_in_band_error_event_is_typed() -> None:
    parts = [chunk("a"), sse({"error": {"message": "overloaded", "type": "server_error"}})]
    script = Script().add(parts=parts)
    async with scripted_client(script) as client:
        with pytest.raises(StreamError, match="overloaded"):
            await client.chat("hi")


@over_transports
async def test_final_after_a_broken_stream_raises_its_error_not_the_part_that_came() -> None:
    parts = [chunk("a"), sse({"error": {"message": "overloaded", "type": "server_error"}})]
    async with scripted_client(Script().add(parts=parts)) as client:
        async with client.stream("hi") as stream:
            with pytest.raises(StreamError) as broke:
                async for _ in stream:
                    pass
            with pytest.raises(StreamError) as again:
                await stream.final()
        assert again.value is broke.value
        assert stream.partial().text == "a"  # what came before it broke
        assert stream.partial().choices[0].finish_reason is None
        async with client.stream("hi") as stream:  # closed early by its reader: what came
            async for _ in stream:
                break
        partial = await stream.final()
    assert partial.text == "Hello" and partial.choices[0].finish_reason is None


@over_transports
async def test_extra_headers_go_with_every_attempt_of_the_call() -> None:
    """A call's own headers (a provider's beta flag, say), on every attempt, plain and
    streamed; credentials belong on the backend and are refused on a call."""
    script = Script().add(status=503).add().add().add().add()
    async with scripted_client(script, retry=FAST_RETRY) as client:
        beta = {"anthropic-beta": "context-1m-2025-08-07"}
        completion = await client.chat("hi", extra_headers=beta)
        assert completion.text == "ok"
        async with client.stream("hi", extra_headers=beta) as stream:
            assert (await stream.final()).text == "ok"
        await client.chat("hi")  # another call: none
        # names that merely look like keys go (a session or routing id is no credential)
        await client.chat("hi", extra_headers={"Mcp-Session-Id": "s1", "x-routing-key": "r1"})
        for bad, why in (
            ({"authorization": "Bearer sk-other"}, "credential"),
            ({"x-api-key": "sk-other"}, "credential"),
            ({"x-beta": "a\nb"}, "control character"),
            ({"x-beta": 1}, "must be str"),
            ("x-beta: 1", "mapping"),
            ({"X-A\r\nX-Injected": "1"}, "not an HTTP header name"),
            ({"X Foo": "1"}, "not an HTTP header name"),
            ({"": "1"}, "not an HTTP header name"),
            ({"Content-Length": "3"}, "sets 'Content-Length' itself"),
            ({"host": "evil.example"}, "sets 'host' itself"),
            ({"xapikey": "sk-other"}, "credential"),
            ({"x-access-token": "abc"}, "credential"),
        ):
            with pytest.raises(ConfigurationError, match=why):
                await client.chat("hi", extra_headers=bad)
    sent = [request.headers.get("anthropic-beta") for request in script.requests]
    assert sent == ["context-1m-2025-08-07"] * 3 + [None, None]  # the retry carried it too
    assert script.requests[-1].headers["mcp-session-id"] == "s1"
    assert all(r.headers["authorization"] == f"Bearer {KEY}" for r in script.requests)


@over_transports
async def test_stream_that_ends_without_finish_is_an_error_and_retried_before_content() -> None:
    script = Script().add(parts=[chunk(role="assistant")]).add()
    async with scripted_client(script) as client:
        completion = await client.chat("hi")
    assert completion.text == "ok" and len(script.requests) == 2


class Weather(pydantic.BaseModel):
    city: str
    celsius: float


@over_transports
async def test_response_model_validates_and_reports_raw_text() -> None:
    good = stream_body(['{"city": "Paris", ', '"celsius": 21.5}'])
    script = Script().add(parts=good).add(parts=stream_body(["not json"]))
    async with scripted_client(script) as client:
        weather = await client.chat("weather", response_model=Weather)
        assert weather == Weather(city="Paris", celsius=21.5)
        body = json.loads(script.requests[0].content)
        assert body["response_format"]["type"] == "json_schema"
        assert body["response_format"]["json_schema"]["schema"]["title"] == "Weather"
        with pytest.raises(StructuredOutputError) as info:
            await client.chat("weather", response_model=Weather)
    assert info.value.raw == "not json"


@over_transports
async def test_model_routing_by_backend_prefix() -> None:
    a, b = Script(), Script()
    async with a.serve() as a_url, b.serve() as b_url:
        backend_a = backend_for(a_url, name="a")
        backend_b = backend_for(b_url, name="b")
        async with AsyncClient(
            backends={"a": backend_a, "b": backend_b}, default_backend="a"
        ) as client:
            await client.chat("x", model="b/llama")
            await client.chat("x", model="Qwen/Qwen3-0.6B")
            await client.chat("x", model="a/m")
    assert json.loads(b.requests[0].content)["model"] == "llama"
    assert [json.loads(r.content)["model"] for r in a.requests] == ["Qwen/Qwen3-0.6B", "m"]


@pytest.mark.parametrize(
    ("model", "names"),
    [
        ("deepseek-ai/DeepSeek-R1", ["together", "deepseek"]),
        ("allenai/OLMo-2", ["vllm", "openai"]),
        ("mistralai/mistral-large", ["openrouter", "mistral"]),
        ("meta-llama/Llama-3.1-8B", ["together", "ollama"]),
        ("openbmb/MiniCPM", ["vllm", "openai"]),
        ("togethercomputer/m", ["vllm", "together"]),
        ("Qwen/Qwen3-0.6B", ["vllm", "qwen"]),
    ],
)
def test_an_organisation_like_a_backend_name_is_no_typo(model: str, names: list[str]) -> None:
    backends = {name: HTTPBackend("http://127.0.0.1:9/v1", name=name) for name in names}
    client = AsyncClient(backends=backends)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert client.targets(model)[0].backend is backends[names[0]]


@over_transports
async def test_a_prefix_close_to_a_backend_name_warns_once_and_still_goes_to_the_default() -> None:
    a, b = Script(), Script()
    async with a.serve() as a_url, b.serve() as b_url:
        backends = {"openai": backend_for(a_url, name="openai"), "local": backend_for(b_url)}
        async with AsyncClient(backends=backends) as client:
            with pytest.warns(BackendNameWarning, match="did you mean 'local/qwen3'") as seen:
                await client.chat("x", model="locl/qwen3")
                await client.chat("x", model="locl/qwen3")  # resolved once: no second warning
            assert len(seen) == 1
            assert seen[0].filename == __file__  # the caller's line, not the package's
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # a prefix like no backend's name: no warning
                await client.chat("x", model="Qwen/Qwen3-0.6B")
    assert [json.loads(r.content)["model"] for r in a.requests] == [
        "locl/qwen3",
        "locl/qwen3",
        "Qwen/Qwen3-0.6B",
    ]
    assert not b.requests


async def test_bad_parameters_raise_configuration_error() -> None:
    async with mock_client(Script()) as client:
        with pytest.raises(ConfigurationError, match="max_token"):
            await client.chat("x", max_token=3)
        with pytest.raises(ConfigurationError):
            await client.chat("x", model="")
        with pytest.raises(ConfigurationError, match="stream must be True, False or None"):
            await client.chat("x", stream="yes")  # type: ignore[call-overload]
        with pytest.raises(ConfigurationError, match="max_tokens"):
            await client.chat("x", max_tokens=10**400)


_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


@over_transports
@pytest.mark.parametrize(
    ("params", "fragment"),
    [
        ({"tool_choice": "required"}, "tool_choice='required' needs tools"),
        ({"tool_choice": "required", "tools": []}, "tool_choice='required' needs tools"),
        (
            {"tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
            "names the tool 'get_weather', but no tools are given",
        ),
        (
            {"tool_choice": {"type": "function", "function": {"name": "f"}}, "tools": [_TOOL]},
            "names the tool 'f', which is not in tools ('get_weather')",
        ),
    ],
)
async def test_a_tool_choice_without_its_tool_is_refused_before_sending(
    params: dict[str, Any], fragment: str
) -> None:
    script = Script()
    async with scripted_client(script) as client:
        for stream in (False, True):
            with pytest.raises(ConfigurationError, match=re.escape(fragment)):
                await client.chat("x", stream=stream, **params)
        chosen = {"type": "function", "function": {"name": "get_weather"}}
        for choice in ("auto", "none", "required", chosen):  # with the tool: sent as asked
            await client.chat("x", tools=[_TOOL], tool_choice=choice)
    sent = [json.loads(r.content)["tool_choice"] for r in script.requests]
    assert sent == ["auto", "none", "required", chosen]


@pytest.mark.parametrize(
    ("choice", "fragment"),
    [
        ({"type": "tool", "name": "get_weather"}, "is the Anthropic Messages form"),
        ({"type": "function", "name": "get_weather"}, "is the OpenAI Responses form"),
        ({"type": "any"}, "pass the string 'required'"),
        ({"type": "auto"}, "pass the string 'auto'"),
        ({"name": "get_weather"}, "pass 'none', 'auto', 'required' or"),
    ],
)
async def test_another_wires_tool_choice_is_refused_with_this_wires_form(
    choice: dict[str, Any], fragment: str
) -> None:
    script = Script()
    async with scripted_client(script) as client:
        with pytest.raises(ConfigurationError) as raised:
            await client.chat("x", tools=[_TOOL], tool_choice=choice)
    assert fragment in str(raised.value)
    if choice.get("type") in ("tool", "function"):
        assert "{'type': 'function', 'function': {'name': 'get_weather'}}" in str(raised.value)
    assert not script.requests


@pytest.mark.parametrize("field", ["temperature", "top_p", "presence_penalty"])
async def test_a_nan_sampling_value_is_refused_as_not_finite(field: str) -> None:
    """NaN was refused as "less than or equal to 2", which sends a caller to the wrong fix."""
    script = Script()
    async with scripted_client(script) as client:
        with pytest.raises(ConfigurationError, match="finite number"):
            await client.chat("x", **{field: float("nan")})
    assert not script.requests


async def test_a_retry_that_is_no_policy_is_refused_up_front() -> None:
    """``retry=3`` was accepted and raised AttributeError only once a request failed."""
    script = Script()
    with pytest.raises(ConfigurationError, match="retry must be a RetryPolicy"):
        AsyncClient(HTTPBackend("http://127.0.0.1:9/v1"), model="m", retry=3)  # type: ignore[arg-type]
    async with scripted_client(script) as client:
        with pytest.raises(ConfigurationError, match="retry must be a RetryPolicy"):
            await client.chat("x", retry=5)  # type: ignore[arg-type]
    assert not script.requests


def test_what_is_no_backend_or_observer_is_refused_up_front() -> None:
    """``backends={"a": 1}`` was accepted (AttributeError at the first call or on close),
    and ``observers=[object()]`` raised AttributeError from inside the hook lookup."""
    backend = HTTPBackend("http://127.0.0.1:9/v1")
    with pytest.raises(ConfigurationError, match="'a' is not a Backend"):
        AsyncClient(backends={"a": 1})  # type: ignore[dict-item]
    with pytest.raises(ConfigurationError, match="has no on_start"):
        AsyncClient(backend, observers=[object()])  # type: ignore[list-item]


async def test_warmup_and_batch_refuse_what_they_cannot_take() -> None:
    """``warmup("2")`` ended in an ExceptionGroup from a task group and ``batch(5)`` in
    ``TypeError: 'int' object is not iterable``."""
    script = Script()
    async with scripted_client(script) as client:
        with pytest.raises(ConfigurationError, match="warmup"):
            await client.warmup("2")  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError, match="iterable of requests, got int"):
            await client.batch(5)  # type: ignore[arg-type]
        # it read "response_model: Extra inputs are not permitted", like a typo
        with pytest.raises(ConfigurationError, match=r"an argument of chat\(\), not stream"):
            client.stream("hi", response_model=dict)
        # the request went out streamed all the same
        with pytest.raises(ConfigurationError, match=r"stream=False\) asks stream\(\)"):
            client.stream("hi", stream=False)
    with pytest.raises(ConfigurationError, match="keepalive_expiry"):
        HTTPBackend("http://127.0.0.1:9/v1", keepalive_expiry=-1)
    assert not script.requests


@over_transports
async def test_non_streamed_path() -> None:
    import httpx

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200,
            json={
                "id": "x",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "plain"},
                        "finish_reason": "stop",
                    }
                ],
            },
        )

    async with (
        serve_handler(handler) as base_url,
        AsyncClient(backend_for(base_url), model="m") as client,
    ):
        completion = await client.chat("hi", stream=False)
    assert completion.text == "plain" and completion.timing is not None


@over_transports
@pytest.mark.parametrize("body", [{}, {"status": "queued"}, {"id": "x", "choices": []}])
async def test_a_200_body_with_no_choices_is_not_a_completion(body: dict[str, Any]) -> None:
    """Every field of a completion has a default, so ``{"status": "queued"}`` from a
    gateway came back as an empty reply (``text == ""``, no finish reason)."""
    import httpx

    calls: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        return httpx.Response(200, json=body)

    async with (
        serve_handler(handler) as base_url,
        AsyncClient(backend_for(base_url), model="m") as client,
    ):
        with pytest.raises(APIResponseValidationError, match="it has no choices"):
            await client.chat("hi", stream=False)
    assert len(calls) == 1  # not retried


@over_transports
@pytest.mark.parametrize("events", [b"data: [DONE]\n\n", b"data: {}\n\ndata: [DONE]\n\n"])
async def test_a_stream_with_no_choice_before_done_is_not_a_completion(events: bytes) -> None:
    """``data: [DONE]`` alone (or after ``{}``) came back as an empty successful reply."""
    import httpx

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=events, headers={"content-type": "text/event-stream"})

    async with (
        serve_handler(handler) as base_url,
        AsyncClient(backend_for(base_url), model="m") as client,
    ):
        with pytest.raises(APIResponseValidationError, match="no chunk that holds a choice"):
            await client.chat("hi")


@over_transports
@pytest.mark.parametrize("status", [302, 204])
async def test_a_redirect_or_no_content_is_no_answer_and_not_retried(status: int) -> None:
    """A 302 to a streamed chat was read as an event stream that ended early: "stream ended
    before the completion finished", retried three times."""
    import httpx

    calls: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        return httpx.Response(status, headers={"location": "https://example.com/login"})

    async with (
        serve_handler(handler) as base_url,
        AsyncClient(backend_for(base_url), model="m") as client,
    ):
        for stream in (True, False):
            with pytest.raises(APIResponseValidationError, match=f"HTTP {status} is no answer"):
                await client.chat("hi", stream=stream)
    assert len(calls) == 2


def test_env_configuration_and_presets() -> None:
    env = {"SWIFTCLIENT_BASE_URL": "http://h/v1", "SWIFTCLIENT_API_KEY": "k" * 20}
    backend = from_env(env)
    assert isinstance(backend, HTTPBackend) and backend.base_url == "http://h/v1"
    assert "k" * 20 not in repr(backend)
    oxlo = preset("oxlo", environ={"OXLO_API_KEY": "oxlo-key-123456789"})
    assert isinstance(oxlo, HTTPBackend) and oxlo.base_url == "https://api.oxlo.ai/v1"
    assert isinstance(from_env({"OPENAI_API_KEY": "x" * 10}), HTTPBackend)
    assert isinstance(from_env({"SWIFTCLIENT_PROVIDER": "vllm"}), HTTPBackend)
    assert from_env({"SWIFTCLIENT_PROVIDER": " VLLM "}).name == "vllm"  # as an env var is typed
    with pytest.raises(ConfigurationError, match="OXLO_API_KEY"):
        preset("oxlo", environ={})
    with pytest.raises(ConfigurationError, match="unknown provider"):
        preset("nope", environ={})
    with pytest.raises(ConfigurationError, match="no backend configured") as caught:
        from_env({})
    assert all(name in str(caught.value) for name in ("anthropic", "gemini", "azure"))


def test_a_preset_can_be_renamed() -> None:
    # Two keys for one provider need two names: preset("oxlo", name="oxlo-eu").
    renamed = preset("oxlo", name="oxlo-eu", api_key="oxlo-key-123456789")
    assert isinstance(renamed, HTTPBackend) and renamed.name == "oxlo-eu"
    assert renamed.base_url == "https://api.oxlo.ai/v1"


async def test_streams_from_a_transport_that_returns_a_read_body() -> None:
    import httpx

    body = b"".join(stream_body(["already", " read"]))

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    backend = HTTPBackend("http://x/v1", transport=httpx.MockTransport(handler))
    async with AsyncClient(backend, model="m") as client:
        completion = await client.chat("hi")
    assert completion.text == "already read"


@over_transports
async def test_streamed_calls_keep_unknown_fields_like_non_streamed_ones() -> None:
    def event(delta: dict[str, object], **extra: object) -> bytes:
        return sse(
            {
                "id": "c",
                "provider": "p1",
                "citations": ["a"],
                "choices": [{"index": 0, "delta": delta, **extra}],
            }
        )

    parts = [
        event({"role": "assistant"}),
        event({"reasoning": "think "}),
        event({"reasoning": "more", "content": "answer"}),
        event({}, finish_reason="stop", stop_reason=42),
        b"data: [DONE]\n\n",
    ]
    script = Script().add(parts=parts)
    async with scripted_client(script) as client:
        completion = await client.chat("hi")
    dumped = completion.model_dump()
    assert dumped["provider"] == "p1" and dumped["citations"] == ["a"]
    assert dumped["choices"][0]["stop_reason"] == 42
    assert dumped["choices"][0]["message"]["reasoning"] == "think more"
    assert completion.text == "answer"


@over_transports
async def test_error_body_echoing_the_key_is_redacted() -> None:
    import httpx

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(401, json={"error": {"message": f"bad key {KEY}", "echo": [KEY]}})

    async with (
        serve_handler(handler) as base_url,
        AsyncClient(backend_for(base_url, KEY), model="m", retry=FAST_RETRY) as client,
    ):
        with pytest.raises(AuthenticationError) as info:
            await client.chat("hi")
    assert KEY not in str(info.value) and KEY not in repr(info.value)
    assert KEY not in json.dumps(info.value.body)


def test_urls_with_credentials_or_queries_are_refused_without_echoing_them() -> None:
    with pytest.raises(ConfigurationError, match="credentials") as info:
        HTTPBackend("https://user:secret-key-value@api.example.com/v1")
    assert "secret-key-value" not in str(info.value)
    # a query would come before the appended paths (/v1?key=.../chat/completions)
    with pytest.raises(ConfigurationError, match="query string") as info:
        HTTPBackend("https://api.example.com/v1?key=secret-key-value")
    assert "secret-key-value" not in str(info.value)


def test_swiftclient_api_key_overrides_the_preset_variable() -> None:
    env = {"SWIFTCLIENT_PROVIDER": "openai", "SWIFTCLIENT_API_KEY": "sk-first-choice-key"}
    backend = from_env(env)
    assert isinstance(backend, HTTPBackend)
    assert backend._api_key == "sk-first-choice-key"


def test_idempotency_keys_are_unique_and_a_forked_child_starts_a_new_series() -> None:
    from swiftclient._client import _call_key

    keys = {_call_key() for _ in range(1000)}
    assert len(keys) == 1000
    parent = _call_key()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report one key and leave at once
        os.write(write, _call_key().encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    child = os.read(read, 200).decode()
    os.close(read)
    assert child.startswith("swiftclient-") and child not in keys
    assert child.rsplit("-", 1)[0] != parent.rsplit("-", 1)[0]  # another prefix


@pytest.mark.skipif(sys.platform == "win32", reason="uvloop is not on Windows")
def test_timing_on_uvloop_is_not_rounded_to_its_millisecond_clock() -> None:
    """uvloop's ``loop.time()`` is cut to whole milliseconds (and cached per loop turn); the
    times a call records on uvloop are read finer than that."""
    from swiftclient.testing import FakeProvider, Reply

    async def call(url: str) -> Timing:
        async with AsyncClient(HTTPBackend(url, name="fake"), model="m") as client:
            completion = await client.chat("hi")
        assert completion.timing is not None
        return completion.timing

    with FakeProvider(Reply(tokens=12, ttft=0.0025, token_delay=0.0015)).run_in_thread() as fake:
        timing = anyio.run(call, fake.base_url, backend_options={"use_uvloop": True})
    readings = [timing.ttft, timing.total, *timing.itl]
    assert len(timing.itl) == 11 and all(r is not None for r in readings)
    # on a millisecond clock every reading is a whole number of milliseconds
    assert any(abs(r * 1000 - round(r * 1000)) > 1e-6 for r in readings if r is not None)


@pytest.mark.parametrize("offset", [0.0, 100.0])
def test_a_uvloop_clock_is_read_through_time_monotonic_only_when_it_is_that_clock(
    offset: float,
) -> None:
    """A uvloop-like loop whose ``time()`` agrees with ``time.monotonic`` is read through
    it; one on another clock keeps its own ``time()``."""
    import asyncio
    import time

    from swiftclient import _deadline

    class Loop(asyncio.SelectorEventLoop):
        def time(self) -> float:
            return super().time() + offset

    Loop.__module__ = "uvloop.test"
    loop = Loop()
    try:

        async def clock() -> object:
            return _deadline._clock(asyncio.get_running_loop())

        got = loop.run_until_complete(clock())
    finally:
        loop.close()
        _deadline._SAME_CLOCK.pop(Loop, None)
    assert got == (time.monotonic if offset == 0.0 else loop.time)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"backend": "http://127.0.0.1:8000/v1"}, "HTTPBackend(url)"),
        ({"model": 123}, "model must be a string"),
        ({"backends": [HTTPBackend("http://127.0.0.1:8000/v1")]}, "backends must be a mapping"),
        ({"stream_chat": "no"}, "stream_chat must be True or False"),
    ],
)
def test_wrong_constructor_arguments_are_configuration_errors(
    kwargs: dict[str, Any], message: str
) -> None:
    kwargs.setdefault("backend", HTTPBackend("http://127.0.0.1:8000/v1"))
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        AsyncClient(**kwargs)


@pytest.mark.anyio
async def test_a_model_that_is_not_a_string_or_a_list_is_refused() -> None:
    async with AsyncClient(HTTPBackend("http://127.0.0.1:8000/v1"), model="m") as client:
        with pytest.raises(ConfigurationError, match="model must be a string or a list"):
            await client.chat("hi", model=123)  # type: ignore[arg-type]
