"""Telemetry of the local engine: in-process call spans, the server span joined through
``traceparent``, engine metrics as OpenTelemetry instruments and at ``GET /metrics``."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import anyio
import httpx
import pytest
from opentelemetry.sdk.metrics.export import HistogramDataPoint
from opentelemetry.trace import SpanKind

from local_engine import LocalBackend
from local_engine.metrics import EngineStats
from local_engine.server import LocalServer
from swiftclient import AsyncClient, HTTPBackend, ResponsesBackend, RetryPolicy
from swiftclient.telemetry import SERVER_TPOT_BUCKETS, SERVER_TTFT_BUCKETS

from ..conformance.tiny_local import TinyModel, load_tiny_model
from ..otel import Otel, attrs, points, recording

pytestmark = pytest.mark.anyio
LIMIT = 30.0  # seconds; bounds waiting for the engine to settle, never a speed assertion
FIXED: dict[str, Any] = {"temperature": 0.0, "max_tokens": 5, "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> TinyModel:
    return load_tiny_model(tmp_path_factory.mktemp("swiftclient-cache"))


@pytest.fixture
def otel() -> Iterator[Otel]:
    yield from recording()


async def test_a_local_engine_call_is_an_internal_span(tiny: TinyModel, otel: Otel) -> None:
    backend = LocalBackend.from_engine(tiny.engine())
    async with AsyncClient(backend, model="tiny", telemetry=otel.telemetry()) as client:
        completion = await client.chat("hello there", **FIXED)
    assert completion.usage is not None
    span = otel.call_span()
    assert span.name == "chat tiny"
    assert span.kind is SpanKind.INTERNAL
    got = attrs(span)
    assert got["gen_ai.provider.name"] == "swiftclient.local_engine"
    assert got["gen_ai.usage.output_tokens"] == completion.usage.completion_tokens == 5
    assert "server.address" not in got
    (attempt,) = otel.attempt_spans()
    assert attempt.kind is SpanKind.INTERNAL
    assert attempt.parent is not None and attempt.parent.span_id == span.context.span_id


async def test_the_server_span_joins_the_callers_trace_through_traceparent(
    tiny: TinyModel, otel: Otel
) -> None:
    backend = LocalBackend.from_engine(tiny.engine())
    async with LocalServer(
        backend, port=0, model_name="tiny-test", tracer_provider=otel.tracer_provider
    ) as server:
        http = HTTPBackend(server.base_url, name="srv")
        async with AsyncClient(
            http, model="tiny-test", retry=RetryPolicy.none(), telemetry=otel.telemetry()
        ) as client:
            completion = await client.chat("hello there", stream=False, **FIXED)
            async with client.stream("hello again", **FIXED) as stream:
                await stream.final()
        with anyio.fail_after(LIMIT):
            await server.wait_idle()
    assert completion.usage is not None
    spans = otel.finished()
    servers = [s for s in spans if s.kind is SpanKind.SERVER]
    assert len(servers) == 2
    attempts = {s.context.span_id: s for s in spans if s.name.startswith("attempt ")}
    calls = {
        s.context.trace_id: s for s in spans if s.name == "chat tiny-test" and s.parent is None
    }
    for server_span in servers:
        assert server_span.name == "chat tiny-test"
        assert server_span.parent is not None and server_span.parent.is_remote
        parent = attempts[server_span.parent.span_id]  # the attempt that sent the request
        assert server_span.context.trace_id == parent.context.trace_id
        assert server_span.context.trace_id in calls
        got = attrs(server_span)
        assert got["gen_ai.provider.name"] == "swiftclient.local_engine"
        assert got["gen_ai.usage.output_tokens"] == 5
        assert got["http.response.status_code"] == 200
    assert {attrs(s)["gen_ai.request.stream"] for s in servers} == {True, False}


async def test_the_responses_route_has_the_same_server_span(tiny: TinyModel, otel: Otel) -> None:
    backend = LocalBackend.from_engine(tiny.engine())
    async with LocalServer(
        backend, port=0, model_name="tiny-test", tracer_provider=otel.tracer_provider
    ) as server:
        wire = ResponsesBackend(server.base_url, name="srv")
        async with AsyncClient(
            wire, model="tiny-test", retry=RetryPolicy.none(), telemetry=otel.telemetry()
        ) as client:
            completion = await client.chat("hello there", stream=False, **FIXED)
            async with client.stream("hello again", **FIXED) as stream:
                await stream.final()
        with anyio.fail_after(LIMIT):
            await server.wait_idle()
    servers = [s for s in otel.finished() if s.kind is SpanKind.SERVER]
    assert len(servers) == 2
    for server_span in servers:
        assert server_span.name == "chat tiny-test"
        assert server_span.parent is not None and server_span.parent.is_remote
        got = attrs(server_span)
        assert got["gen_ai.usage.output_tokens"] == 5
        assert got["http.response.status_code"] == 200
        assert str(got["gen_ai.response.id"]).startswith("resp_")
    assert {attrs(s)["gen_ai.request.stream"] for s in servers} == {True, False}
    assert completion.id in {attrs(s)["gen_ai.response.id"] for s in servers}


async def test_a_refused_request_ends_its_server_span_with_the_status(
    tiny: TinyModel, otel: Otel
) -> None:
    backend = LocalBackend.from_engine(tiny.engine())
    async with LocalServer(backend, port=0, tracer_provider=otel.tracer_provider) as server:
        async with httpx.AsyncClient() as http:
            response = await http.post(
                server.base_url + "/chat/completions", json={"model": "nope", "messages": []}
            )
    assert response.status_code == 400
    (span,) = otel.finished()
    assert span.kind is SpanKind.SERVER
    assert attrs(span)["error.type"] == "400"
    assert span.parent is None


async def test_get_metrics_serves_the_engine_in_prometheus_text(tiny: TinyModel) -> None:
    engine = tiny.engine()
    backend = LocalBackend.from_engine(engine)
    async with LocalServer(backend, port=0, model_name="tiny-test", api_key="sk-k") as server:
        http = HTTPBackend(server.base_url, "sk-k", name="srv")
        async with AsyncClient(http, model="tiny-test", telemetry=None) as client:
            prompt = "a long shared prefix " * 12
            await client.chat(prompt, **FIXED)
            await client.chat(prompt, **FIXED)  # its prefix is cached now
        with anyio.fail_after(LIMIT):
            await server.wait_idle()
        async with httpx.AsyncClient() as raw:  # no key: /metrics is public like /health
            response = await raw.get(server.base_url.removesuffix("/v1") + "/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples = _samples(response.text)
    assert samples["gen_ai_server_time_to_first_token_seconds_count"] == 2
    # A cumulative histogram on the GenAI conventions' buckets: counts never go down from one
    # bound to the next, and the last (+Inf) holds both requests.
    ttft = 'gen_ai_server_time_to_first_token_seconds_bucket{le="'
    bounds = [float(name[len(ttft) : -2]) for name in samples if name.startswith(ttft)]
    counts = [value for name, value in samples.items() if name.startswith(ttft)]
    assert bounds == [*SERVER_TTFT_BUCKETS, float("inf")]
    assert counts == sorted(counts) and counts[-1] == 2
    assert samples["gen_ai_server_time_per_output_token_seconds_count"] == 2
    assert samples["gen_ai_server_request_duration_seconds_count"] == 2
    assert samples["swiftclient_engine_generation_tokens_total"] == 10
    assert samples["swiftclient_engine_requests_waiting"] == 0
    assert samples["swiftclient_engine_requests_running"] == 0
    free = samples['swiftclient_engine_kv_cache_blocks{state="free"}']
    used = samples['swiftclient_engine_kv_cache_blocks{state="used"}']
    assert free + used == engine.num_blocks
    assert free == engine.num_free_blocks()
    assert samples["swiftclient_engine_cached_prompt_tokens_total"] > 0
    ratio = samples["swiftclient_engine_prefix_cache_hit_ratio"]
    assert ratio == pytest.approx(
        samples["swiftclient_engine_cached_prompt_tokens_total"]
        / samples["swiftclient_engine_prompt_tokens_total"]
    )
    assert 0 < ratio < 1
    assert samples["swiftclient_engine_step_duration_seconds_count"] >= 10


def _samples(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


# --------------------------------------------------------------------------- EngineStats


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _out(rid: str, generated: int, finished: bool = False, prompt: int = 8, cached: int = 0) -> Any:
    return SimpleNamespace(
        request_id=rid,
        new_token_ids=[1],
        finished=finished,
        num_prompt_tokens=prompt,
        num_cached_tokens=cached,
        num_generated_tokens=generated,
    )


def test_engine_stats_measure_ttft_tpot_and_throughput(otel: Otel) -> None:
    clock = _Clock()
    stats = EngineStats(meter_provider=otel.meter_provider, model="m", clock=clock)
    stats.engine = SimpleNamespace(  # type: ignore[assignment]
        num_waiting=2, num_running=1, num_blocks=10, num_free_blocks=lambda: 7
    )
    stats.on_add("a", 1.0)
    stats.on_add("b", 1.0)
    stats.on_step([_out("a", 1, prompt=8, cached=4)], 0.25, 1.25)  # a's first token
    stats.on_step([_out("a", 2), _out("b", 1, prompt=8)], 0.25, 1.5)
    stats.on_step([_out("a", 3, finished=True)], 0.5, 2.25)
    stats.on_release("a")
    stats.on_release("b")  # aborted: no finish recorded, and forgotten
    assert stats.hit_ratio() == 4 / 16
    clock.now = 2.25
    assert stats.throughput() == pytest.approx(4 / 10)
    clock.now = 100.0
    assert stats.throughput() == 0.0

    metrics = otel.metrics()
    (ttft,) = points(metrics["gen_ai.server.time_to_first_token"])
    assert isinstance(ttft, HistogramDataPoint)
    assert tuple(ttft.explicit_bounds) == SERVER_TTFT_BUCKETS
    assert ttft.count == 2 and ttft.sum == pytest.approx(0.25 + 0.5)
    assert ttft.attributes["gen_ai.provider.name"] == "swiftclient.local_engine"
    assert ttft.attributes["gen_ai.request.model"] == "m"
    (tpot,) = points(metrics["gen_ai.server.time_per_output_token"])
    assert tuple(tpot.explicit_bounds) == SERVER_TPOT_BUCKETS
    assert tpot.count == 1 and tpot.sum == pytest.approx((2.25 - 1.25) / 2)
    (duration,) = points(metrics["gen_ai.server.request.duration"])
    assert duration.count == 1 and duration.sum == pytest.approx(1.25)
    assert points(metrics["swiftclient.engine.step.duration"])[0].count == 3
    assert points(metrics["swiftclient.engine.generation_tokens"])[0].value == 4
    assert points(metrics["swiftclient.engine.prompt_tokens"])[0].value == 16
    assert points(metrics["swiftclient.engine.cached_prompt_tokens"])[0].value == 4
    assert points(metrics["swiftclient.engine.requests.waiting"])[0].value == 2
    assert points(metrics["swiftclient.engine.requests.running"])[0].value == 1
    blocks = {
        p.attributes["swiftclient.kv_cache.state"]: p.value
        for p in points(metrics["swiftclient.engine.kv_cache.blocks"])
    }
    assert blocks == {"free": 7, "used": 3}
    assert points(metrics["swiftclient.engine.prefix_cache.hit_ratio"])[0].value == 0.25
