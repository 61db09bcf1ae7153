"""OpenTelemetry: span names, attributes and structure, metrics, propagation, privacy.

The SDK (a test-only dependency) records into in-memory exporters handed to the client as
its providers; nothing here touches the global providers.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any
from urllib.parse import urlsplit

import anyio
import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics.export import HistogramDataPoint
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, StatusCode, TraceFlags

from swiftclient import (
    AsyncClient,
    BadRequestError,
    Hedge,
    HTTPBackend,
    RateLimited,
    RetryPolicy,
    Telemetry,
    Timeout,
)
from swiftclient._deadline import Deadline
from swiftclient.admission import Limits
from swiftclient.backends.base import RequestOptions
from swiftclient.extend import CircuitBreaker, PolicyHub
from swiftclient.telemetry import CAPTURE_CONTENT_ENV, DURATION_BUCKETS, TOKEN_BUCKETS
from swiftclient.testing import FakeProvider, Reply
from swiftclient.types import ChatCompletionChunk, ChatRequest

from ..otel import Otel, attrs, points, recording
from .mock import (
    FAST_RETRY,
    Gated,
    Script,
    backend_for,
    chunk,
    client_for,
    providers,
    scripted_client,
    sse,
)

pytestmark = pytest.mark.anyio
over_transports = pytest.mark.usefixtures("transport")
"""A test that sends requests runs over aiohttp and httpx, on a loopback socket."""
KEY = "sk-telemetry-secret-0123456789"


@pytest.fixture
def otel() -> Iterator[Otel]:
    yield from recording()


def _usage_stream(words: list[str], cached: int = 0) -> list[bytes]:
    parts = [chunk(role="assistant")] + [chunk(w) for w in words] + [chunk(finish="stop")]
    usage: dict[str, Any] = {
        "prompt_tokens": 7,
        "completion_tokens": len(words),
        "total_tokens": 7 + len(words),
    }
    if cached:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    parts.append(sse({"id": "c", "choices": [], "usage": usage}))
    parts.append(b"data: [DONE]\n\n")
    return parts


def _client(script: Script, otel: Otel, **kwargs: Any) -> AbstractAsyncContextManager[AsyncClient]:
    kwargs.setdefault("retry", RetryPolicy.none())
    return scripted_client(
        script, api_key=KEY, name="p", model="gpt-test", telemetry=otel.telemetry(), **kwargs
    )


def _served_at(client: AsyncClient) -> tuple[str, int]:
    """The host and port backend ``p`` of ``client`` was given (a loopback server's)."""
    backend = client.backends["p"]
    assert isinstance(backend, HTTPBackend)
    url = urlsplit(backend.base_url)
    assert url.hostname is not None and url.port is not None
    return url.hostname, url.port


# --------------------------------------------------------------------------- spans


@over_transports
async def test_a_plain_call_is_one_client_span_with_the_conventions_attributes(
    otel: Otel,
) -> None:
    script = Script().add(parts=_usage_stream(["Hello", " world"], cached=3))
    async with _client(script, otel) as client:
        completion = await client.chat(
            "hi", max_tokens=50, temperature=0.5, top_p=0.9, stop=["END"], seed=7
        )
        host, port = _served_at(client)
    assert completion.text == "Hello world"
    span = otel.call_span()
    assert span.name == "chat gpt-test"
    assert span.kind is SpanKind.CLIENT
    got = attrs(span)
    assert got["gen_ai.operation.name"] == "chat"
    assert got["gen_ai.provider.name"] == "openai"
    assert got["gen_ai.request.model"] == "gpt-test"
    assert got["gen_ai.request.max_tokens"] == 50
    assert got["gen_ai.request.temperature"] == 0.5
    assert got["gen_ai.request.top_p"] == 0.9
    assert got["gen_ai.request.stop_sequences"] == ("END",)
    assert got["gen_ai.request.seed"] == 7
    assert got["gen_ai.response.id"] == "c"
    assert got["gen_ai.response.model"] == "m"
    assert got["gen_ai.response.finish_reasons"] == ("stop",)
    assert got["gen_ai.usage.input_tokens"] == 7
    assert got["gen_ai.usage.output_tokens"] == 2
    assert got["gen_ai.usage.cache_read.input_tokens"] == 3
    assert (got["server.address"], got["server.port"]) == (host, port) == ("127.0.0.1", port)
    assert "error.type" not in got
    assert span.status.status_code is StatusCode.UNSET
    # One attempt, a child of the call span.
    (attempt,) = otel.attempt_spans()
    assert attempt.parent is not None
    assert attempt.parent.span_id == span.context.span_id
    assert attempt.context.trace_id == span.context.trace_id
    assert attrs(attempt)["swiftclient.outcome"] == "won"
    assert attrs(attempt)["swiftclient.trigger"] == "first"
    assert [e.name for e in attempt.events] == ["swiftclient.first_token"]


@over_transports
async def test_the_call_span_joins_the_callers_trace_and_the_request_carries_traceparent(
    otel: Otel,
) -> None:
    script = Script().add(parts=_usage_stream(["ok"]))
    tracer = otel.tracer_provider.get_tracer("app")
    async with _client(script, otel) as client:
        with tracer.start_as_current_span("agent step") as parent:
            await client.chat("hi")
    span = otel.call_span()
    assert span.parent is not None
    assert span.parent.span_id == parent.get_span_context().span_id
    (attempt,) = otel.attempt_spans()
    header = script.requests[0].headers["traceparent"]
    version, trace_id, span_id, flags = header.split("-")
    assert version == "00"
    assert int(flags, 16) & 1  # sampled
    assert int(trace_id, 16) == span.context.trace_id
    assert int(span_id, 16) == attempt.context.span_id


@over_transports
async def test_a_stream_records_time_to_first_chunk_and_the_chunk_metrics(otel: Otel) -> None:
    script = Script().add(parts=_usage_stream(["a", "b", "c", "d"]))
    async with _client(script, otel) as client:
        async with client.stream("hi") as stream:
            texts = [c.text async for c in stream if c.text]
    assert texts == ["a", "b", "c", "d"]
    got = attrs(otel.call_span())
    assert got["gen_ai.response.time_to_first_chunk"] >= 0.0
    assert got["gen_ai.usage.output_tokens"] == 4
    assert got["gen_ai.request.stream"] is True
    metrics = otel.metrics()
    (ttfc,) = points(metrics["gen_ai.client.operation.time_to_first_chunk"])
    assert ttfc.count == 1
    (tpoc,) = points(metrics["gen_ai.client.operation.time_per_output_chunk"])
    assert tpoc.count == 3  # every content chunk after the first


@over_transports
async def test_a_retried_call_has_one_span_per_attempt_and_counts_the_retry(otel: Otel) -> None:
    script = Script().add(status=500).add(parts=_usage_stream(["fine"]))
    async with _client(script, otel, retry=FAST_RETRY) as client:
        completion = await client.chat("hi")
    assert completion.text == "fine"
    call = otel.call_span()
    first, second = otel.attempt_spans()
    for attempt in (first, second):
        assert attempt.parent is not None and attempt.parent.span_id == call.context.span_id
    assert attrs(first)["swiftclient.outcome"] == "failed"
    assert attrs(first)["error.type"] == "500"
    assert first.status.status_code is StatusCode.ERROR
    assert attrs(second)["swiftclient.trigger"] == "retry"
    assert attrs(second)["swiftclient.outcome"] == "won"
    assert attrs(call)["swiftclient.attempts"] == 2
    assert call.status.status_code is StatusCode.UNSET
    assert [e.name for e in call.events] == ["swiftclient.retry"]
    (retries,) = points(otel.metrics()["swiftclient.client.retries"])
    assert retries.value == 1
    # Each attempt carried its own span's context.
    sent = [r.headers["traceparent"].split("-")[2] for r in script.requests]
    assert [int(s, 16) for s in sent] == [first.context.span_id, second.context.span_id]


@over_transports
async def test_a_failed_call_sets_error_type_on_the_span_and_the_duration(otel: Otel) -> None:
    script = Script().add(status=400)
    async with _client(script, otel) as client:
        with pytest.raises(BadRequestError):
            await client.chat("hi")
    span = otel.call_span()
    assert attrs(span)["error.type"] == "400"
    assert span.status.status_code is StatusCode.ERROR
    (point,) = points(otel.metrics()["gen_ai.client.operation.duration"])
    assert point.attributes["error.type"] == "400"


@over_transports
async def test_a_hedged_call_records_both_attempts_and_the_hedge(otel: Otel) -> None:
    async with (
        FakeProvider(Reply(stall_after=0), model="a") as slow,
        FakeProvider(Reply(text="from b"), model="b") as fast,
    ):
        backends = {
            "a": backend_for(slow.base_url, name="a"),
            "b": backend_for(fast.base_url, name="b"),
        }
        async with AsyncClient(
            backends=backends, retry=RetryPolicy.none(), telemetry=otel.telemetry()
        ) as client:
            completion = await client.chat("hi", model=["a/m", "b/m"], hedge=Hedge(delay=0.05))
    assert completion.text == "from b"
    call = otel.call_span()
    assert call.name == "chat m"
    assert attrs(call)["swiftclient.targets"] == ("a/m", "b/m")
    assert attrs(call)["swiftclient.target"] == "b/m"
    assert [e.name for e in call.events] == ["swiftclient.hedge"]
    first, second = otel.attempt_spans()
    assert first.name == "attempt a/m"
    assert attrs(first)["swiftclient.outcome"] in ("lost", "cancelled")
    assert second.name == "attempt b/m"
    assert attrs(second)["swiftclient.trigger"] == "hedge"
    assert attrs(second)["swiftclient.outcome"] == "won"
    metrics = otel.metrics()
    assert points(metrics["swiftclient.client.hedges"])[0].value == 1
    assert points(metrics["swiftclient.client.hedges_won"])[0].value == 1


@over_transports
async def test_a_fallback_admission_refused_is_not_counted_as_sent(otel: Otel) -> None:
    """The retry, hedge and fallback counters were added as each attempt started, so an
    attempt admission refused (nothing sent) counted as a fallback sent."""
    async with (
        providers("a", "b") as fakes,
        client_for(
            fakes,
            telemetry=otel.telemetry(),
            limits={"a": Limits(rpm=1, window=30.0)},
            timeout=5.0,  # a's limit frees after the deadline: refused at once
        ) as client,
    ):
        first, second = fakes["a"], fakes["b"]
        assert (await client.chat("hi", model=["a/m", "b/m"])).text == "from a"
        assert (await client.chat("hi", model=["b/m", "a/m"])).text == "from b"
        first.script(Reply(status=500))
        second.script(Reply(status=500))
        with pytest.raises(RateLimited):  # b fails, then a is refused: nothing sent
            await client.chat("hi", model=["b/m", "a/m"])
    assert len(first.requests) == 1
    assert "swiftclient.client.fallbacks" not in otel.metrics()


class _SpentBudget:
    """A hedge budget with nothing left."""

    def on_call(self, now: float) -> None:
        pass

    def try_spend(self, now: float) -> bool:
        return False


@over_transports
async def test_a_hedge_the_budget_refuses_is_an_event(otel: Otel) -> None:
    async with (
        FakeProvider(Reply(stall_after=0), model="a") as slow,
        FakeProvider(Reply(text="from b"), model="b") as fast,
    ):
        backends = {
            "a": backend_for(slow.base_url, name="a"),
            "b": backend_for(fast.base_url, name="b"),
        }
        async with AsyncClient(
            backends=backends,
            retry=RetryPolicy.none(),
            hedge=Hedge(delay=0.05),
            policies=PolicyHub(budget=_SpentBudget()),
            timeout=Timeout(total=60.0, first_token=1.0),  # a gives up, then b answers
            telemetry=otel.telemetry(),
        ) as client:
            completion = await client.chat("hi", model=["a/m", "b/m"])
    assert completion.text == "from b"
    events = [e.name for e in otel.call_span().events]
    assert events == ["swiftclient.hedge.refused", "swiftclient.fallback"]
    first, _ = otel.attempt_spans()
    assert attrs(first)["error.type"] == "FirstTokenTimeout"


@over_transports
async def test_circuit_breaker_transitions_are_counted_and_traced(otel: Otel) -> None:
    script = Script().add(status=500)
    hub = PolicyHub(breaker=lambda: CircuitBreaker(min_calls=1, failure_rate=1.0, cooldown=600.0))
    spare = Script()
    async with script.serve() as a_url, spare.serve() as b_url:
        backends = {"a": backend_for(a_url, name="a"), "b": backend_for(b_url, name="b")}
        async with AsyncClient(
            backends=backends, retry=RetryPolicy.none(), policies=hub, telemetry=otel.telemetry()
        ) as client:
            await client.chat("hi", model=["a/m", "b/m"])
            otel.spans.clear()
            await client.chat("hi", model=["a/m", "b/m"])  # a's breaker is open now
    assert client.health()["a/m"] == "open"
    (point,) = points(otel.metrics()["swiftclient.client.circuit_breaker.transitions"])
    assert point.value == 1
    assert dict(point.attributes) == {
        "swiftclient.target": "a/m",
        "swiftclient.breaker.state": "open",
    }
    skip = [e for e in otel.call_span().events if e.name == "swiftclient.breaker.skip"]
    assert [dict(e.attributes or {}) for e in skip] == [{"swiftclient.targets": ("a/m",)}]


# --------------------------------------------------------------------------- metrics


@over_transports
async def test_metric_names_units_and_bucket_boundaries(otel: Otel) -> None:
    script = Script().add(parts=_usage_stream(["x", "y"], cached=5))
    async with _client(script, otel) as client:
        await client.chat("hi")
        host, _ = _served_at(client)
    metrics = otel.metrics()
    duration = metrics["gen_ai.client.operation.duration"]
    assert duration.unit == "s"
    (point,) = points(duration)
    assert isinstance(point, HistogramDataPoint)
    assert tuple(point.explicit_bounds) == DURATION_BUCKETS
    assert point.attributes["gen_ai.operation.name"] == "chat"
    assert point.attributes["gen_ai.provider.name"] == "openai"
    assert point.attributes["gen_ai.request.model"] == "gpt-test"
    assert point.attributes["gen_ai.response.model"] == "m"
    assert point.attributes["server.address"] == host == "127.0.0.1"
    tokens = metrics["gen_ai.client.token.usage"]
    assert tokens.unit == "{token}"
    by_type = {p.attributes["gen_ai.token.type"]: p for p in points(tokens)}
    assert by_type["input"].sum == 7 and by_type["output"].sum == 2
    assert tuple(by_type["input"].explicit_bounds) == TOKEN_BUCKETS
    for name in (
        "gen_ai.client.operation.time_to_first_chunk",
        "gen_ai.client.operation.time_per_output_chunk",
    ):
        assert tuple(points(metrics[name])[0].explicit_bounds) == DURATION_BUCKETS
    assert points(metrics["swiftclient.client.cached_tokens"])[0].value == 5


async def test_a_non_streamed_call_records_no_chunk_metrics(otel: Otel) -> None:
    # On the MockTransport: it pins server.port 80 for a URL that names no port, and a
    # loopback server cannot listen there.
    body = {
        "id": "x",
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}],
        "usage": {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3},
    }
    import httpx

    transport = httpx.MockTransport(lambda request: httpx.Response(200, json=body))
    backend = HTTPBackend("http://h.invalid/v1", transport=transport)
    async with AsyncClient(backend, model="m", telemetry=otel.telemetry()) as client:
        completion = await client.chat("hi", stream=False)
    assert completion.text == "hi"
    metrics = otel.metrics()
    assert "gen_ai.client.operation.duration" in metrics
    assert "gen_ai.client.operation.time_to_first_chunk" not in metrics
    assert "gen_ai.client.operation.time_per_output_chunk" not in metrics
    got = attrs(otel.call_span())
    assert got["server.port"] == 80
    assert got["gen_ai.request.stream"] is False
    assert got["gen_ai.usage.output_tokens"] == 1
    assert "gen_ai.response.time_to_first_chunk" not in got


_WHOLE = json.dumps(
    {
        "id": "x",
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}],
    }
).encode()


@over_transports
@pytest.mark.parametrize(
    ("streamed", "fails"), [(False, True), (True, True), (False, False), (True, False)]
)
async def test_the_call_span_says_whether_the_call_was_streamed_whether_or_not_it_failed(
    otel: Otel, streamed: bool, fails: bool
) -> None:
    # The span reads the call's own record, not the type of whatever reply it got to:
    # a non-streamed call that failed before any reply is still not a stream.
    if fails:
        script = Script().add(status=400)
    elif streamed:
        script = Script().add(parts=_usage_stream(["ok"]))
    else:
        script = Script().add(parts=[_WHOLE], headers={"content-type": "application/json"})
    async with _client(script, otel) as client:
        if fails and streamed:
            with pytest.raises(BadRequestError):
                async with client.stream("hi"):
                    pass
        elif fails:
            with pytest.raises(BadRequestError):
                await client.chat("hi", stream=False)
        else:
            completion = await client.chat("hi", stream=streamed)
            assert completion.text == ("ok" if streamed else "hi")
    got = attrs(otel.call_span())
    assert got["gen_ai.request.stream"] is streamed
    assert ("error.type" in got) is fails


# --------------------------------------------------------------------------- privacy


def _all_values(spans: list[ReadableSpan]) -> str:
    values: list[str] = []
    for span in spans:
        values.append(span.name)
        values.extend(f"{k}={v}" for k, v in (span.attributes or {}).items())
        for event in span.events:
            values.extend(f"{k}={v}" for k, v in (event.attributes or {}).items())
    return "\n".join(values)


@over_transports
async def test_message_contents_are_recorded_only_on_opt_in(
    otel: Otel, monkeypatch: pytest.MonkeyPatch
) -> None:
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "the secret plan"},
    ]
    script = Script().add(parts=_usage_stream(["fine"])).add(parts=_usage_stream(["again"]))
    monkeypatch.delenv(CAPTURE_CONTENT_ENV, raising=False)
    async with _client(script, otel) as client:
        await client.chat(messages)
    assert "secret plan" not in _all_values(otel.finished())
    assert "gen_ai.input.messages" not in attrs(otel.call_span())

    otel.spans.clear()
    monkeypatch.setenv(CAPTURE_CONTENT_ENV, "true")
    async with _client(script, otel) as client:  # the variable is read as calls record
        await client.chat(messages)
    got = attrs(otel.call_span())
    assert json.loads(got["gen_ai.system_instructions"]) == [
        {"type": "text", "content": "be brief"}
    ]
    assert json.loads(got["gen_ai.input.messages"]) == [
        {"role": "user", "parts": [{"type": "text", "content": "the secret plan"}]}
    ]
    assert json.loads(got["gen_ai.output.messages"]) == [
        {
            "role": "assistant",
            "parts": [{"type": "text", "content": "again"}],
            "finish_reason": "stop",
        }
    ]


async def test_the_client_flag_overrides_the_environment(
    otel: Otel, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CAPTURE_CONTENT_ENV, "true")
    assert otel.telemetry(capture_content=False).capture_content is False
    monkeypatch.setenv(CAPTURE_CONTENT_ENV, "false")
    assert otel.telemetry().capture_content is False
    assert otel.telemetry(capture_content=True).capture_content is True


@over_transports
async def test_api_keys_never_reach_spans_even_with_content_capture(otel: Otel) -> None:
    script = Script().add(status=401).add(parts=_usage_stream(["ok"]))
    telemetry = otel.telemetry(capture_content=True)
    async with script.serve() as base_url:
        backend = backend_for(base_url, KEY, headers={"api-key": KEY})  # key in a header too
        async with AsyncClient(backend, model="m", telemetry=telemetry) as client:
            with pytest.raises(Exception, match="401"):
                await client.chat("hi")
            await client.chat("hi")
    text = _all_values(otel.finished())
    assert "gen_ai.input.messages" in text
    assert KEY not in text


# --------------------------------------------------------------------------- off and no SDK


@over_transports
async def test_without_an_sdk_a_call_has_no_trace_and_sends_no_traceparent() -> None:
    # The global providers are the API's own in this test process (no test installs any).
    script = Script().add(parts=_usage_stream(["ok"]))
    async with scripted_client(script, api_key=None, retry=None) as client:
        assert isinstance(client.telemetry, Telemetry)
        assert client.telemetry is Telemetry.default()
        stream = client.stream("hi")
        async with stream:
            assert stream._call.trace is None  # no observer joined the call
            await stream.final()
    assert "traceparent" not in script.requests[0].headers


@over_transports
async def test_without_an_sdk_an_incoming_trace_context_is_passed_on() -> None:
    remote = SpanContext(
        trace_id=0x0AF7651916CD43DD8448EB211C80319C,
        span_id=0xB7AD6B7169203331,
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
    )
    script = Script().add(parts=_usage_stream(["ok"]))
    async with scripted_client(script, api_key=None, retry=None) as client:
        with trace.use_span(NonRecordingSpan(remote)):  # as a server framework would
            await client.chat("hi")
    header = script.requests[0].headers["traceparent"]
    assert header == "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@over_transports
async def test_telemetry_none_turns_it_off_and_bad_values_are_refused(otel: Otel) -> None:
    script = Script().add(parts=_usage_stream(["ok"]))
    async with scripted_client(script, api_key=None, retry=None, telemetry=None) as client:
        await client.chat("hi")
        backend = client.backends["mock"]
    assert client.telemetry is None
    assert "traceparent" not in script.requests[0].headers
    with pytest.raises(ValueError, match="telemetry must be"):
        AsyncClient(backend, telemetry=object())  # type: ignore[arg-type]


def test_provider_names_come_from_the_host_or_the_client() -> None:
    from swiftclient.telemetry import provider_name

    def named(url: str) -> str:
        return provider_name(HTTPBackend(url))

    assert named("https://api.openai.com/v1") == "openai"
    assert named("https://api.groq.com/openai/v1") == "groq"
    assert named("https://api.mistral.ai/v1") == "mistral_ai"
    assert named("https://my-resource.openai.azure.com/openai") == "azure.ai.openai"
    assert named("http://127.0.0.1:8000/v1") == "openai"


class _Unhashable(Gated):
    __hash__ = None  # type: ignore[assignment]


async def test_a_backend_that_cannot_be_hashed_is_traced_all_the_same(otel: Otel) -> None:
    backend = _Unhashable("u")
    backend.gate.set()
    async with AsyncClient(backend, model="m", telemetry=otel.telemetry()) as client:
        completion = await client.chat("hi")
        await client.chat("hi again")
    assert completion.text == "u one two"
    spans = [s for s in otel.finished() if s.name == "chat m"]
    assert len(spans) == 2
    assert attrs(spans[0])["gen_ai.provider.name"] == "openai"


async def test_a_cancelled_call_ends_its_spans_as_cancelled(otel: Otel) -> None:
    backend = Gated("g")  # never opens its gate: the call waits for a first token
    async with AsyncClient(backend, model="m", telemetry=otel.telemetry()) as client:
        async with anyio.create_task_group() as tg:

            async def call() -> None:
                await client.chat("hi")

            tg.start_soon(call)
            with anyio.fail_after(30):
                await backend.opened.wait()
            tg.cancel_scope.cancel()
    span = otel.call_span()
    assert attrs(span)["error.type"] == "cancelled"
    (attempt,) = otel.attempt_spans()
    assert attrs(attempt)["swiftclient.outcome"] == "cancelled"
    assert "error.type" not in attrs(attempt)
    assert backend.closed == 1


class _OptionsSeen(Gated):
    """Records the options each attempt hands the backend."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.options: list[RequestOptions | None] = []

    @asynccontextmanager
    async def stream(
        self, request: ChatRequest, deadline: Deadline, options: RequestOptions | None = None
    ) -> AsyncIterator[AsyncIterator[ChatCompletionChunk]]:
        self.options.append(options)
        async with super().stream(request, deadline, options) as chunks:
            yield chunks


async def test_a_traced_attempt_keeps_the_calls_encoding_beside_the_trace_headers(
    otel: Otel,
) -> None:
    # The trace-context headers are added to the attempt's options; the call's encoding
    # (its request bytes, built once for every attempt) must stay with them.
    backend = _OptionsSeen("e")
    backend.gate.set()
    async with AsyncClient(backend, model="m", telemetry=otel.telemetry()) as client:
        await client.chat("hi")
    [options] = backend.options
    assert options is not None
    assert "traceparent" in options.headers
    assert options.encoding is not None
    assert options.idempotency_key
