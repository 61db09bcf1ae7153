"""Admission in telemetry and health: the wait for capacity as an event on the attempt's
span and a histogram, 429s counted, headroom per target in ``client.health(detail=True)``
(in memory and on a real Redis server). The fake provider's window clock is a counter the
test owns; no assertion depends on the wall clock."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from swiftclient import (
    AsyncClient,
    Client,
    HTTPBackend,
    RateLimited,
    RateLimitError,
    RetryPolicy,
)
from swiftclient.admission import Admission, Headroom, Limits, RedisStore, TargetHealth
from swiftclient.testing import FakeProvider, ProviderLimits, Reply

from ..otel import Otel, attrs, points, recording
from .fakeclock import Ticker
from .redisserver import redis_url

__all__ = ["redis_url"]  # the fixture, re-exported for pytest
pytestmark = pytest.mark.anyio


@pytest.fixture
def otel() -> Iterator[Otel]:
    yield from recording()


def _events(otel: Otel, name: str) -> list[dict[str, object]]:
    return [
        dict(event.attributes or {})
        for span in otel.attempt_spans()
        for event in span.events
        if event.name == name
    ]


async def test_the_wait_for_admission_is_an_attempt_event_and_a_histogram(otel: Otel) -> None:
    async with FakeProvider(Reply(tokens=2)) as fake:
        backend = HTTPBackend(fake.base_url, name="fake")
        async with AsyncClient(
            backend, model="m", limits=Limits(rpm=1), telemetry=otel.telemetry(), timeout=5.0
        ) as client:
            await client.chat("hi")
            # one request a minute: the second cannot fit in its 5 s and is refused at once
            with pytest.raises(RateLimited):
                await client.chat("hi")
    events = _events(otel, "swiftclient.admission")
    assert [e["swiftclient.admission.outcome"] for e in events] == ["admitted", "refused"]
    assert all(isinstance(e["swiftclient.admission.wait"], float) for e in events)
    metric = otel.metrics()["swiftclient.client.admission.wait"]
    assert metric.unit == "s"
    by_outcome = {attrs(p)["swiftclient.admission.outcome"]: p for p in points(metric)}
    assert set(by_outcome) == {"admitted", "refused"}
    assert all(p.count == 1 for p in by_outcome.values())
    assert attrs(by_outcome["admitted"])["swiftclient.target"] == "fake/m"
    assert fake.rate_limited == 0


async def test_no_admission_no_admission_event(otel: Otel) -> None:
    async with FakeProvider(Reply(tokens=2)) as fake:
        backend = HTTPBackend(fake.base_url, name="fake")
        async with AsyncClient(backend, model="m", telemetry=otel.telemetry()) as client:
            await client.chat("hi")
    assert _events(otel, "swiftclient.admission") == []
    assert "swiftclient.client.admission.wait" not in otel.metrics()


async def test_429s_are_counted_per_target_without_admission_too(otel: Otel) -> None:
    limits = ProviderLimits(rpm=1, window=60.0, clock=Ticker())
    async with FakeProvider(Reply(tokens=2), rate_limits=limits) as fake:
        backend = HTTPBackend(fake.base_url, name="fake")
        async with AsyncClient(
            backend, model="m", retry=RetryPolicy.none(), telemetry=otel.telemetry()
        ) as client:
            await client.chat("hi")
            for _ in range(2):
                with pytest.raises(RateLimitError):
                    await client.chat("hi")
    (point,) = points(otel.metrics()["swiftclient.client.throttled"])
    assert point.value == 2 and attrs(point) == {"swiftclient.target": "fake/m"}
    assert fake.rate_limited == 2


async def test_health_detail_reports_headroom_per_target() -> None:
    limits = ProviderLimits(rpm=1, window=60.0, clock=Ticker())
    async with FakeProvider(Reply(tokens=2), rate_limits=limits) as fake:
        backend = HTTPBackend(fake.base_url, name="fake")
        async with AsyncClient(
            backend,
            model="m",
            limits=Limits(rpm=10, concurrency=4, learn=False),
            retry=RetryPolicy.none(),
        ) as client:
            assert client.health(detail=True) == {}
            await client.chat("hi")
            with pytest.raises(RateLimitError):
                await client.chat("hi")  # the provider's own limit is lower: a 429
            health = client.health(detail=True)
            assert client.health() == {}  # no breakers: the plain form is unchanged
    (entry,) = health.values()
    assert isinstance(entry, TargetHealth) and entry.breaker is None
    room = entry.headroom
    assert isinstance(room, Headroom)
    assert room.concurrency == 4 and room.in_flight == 0 and room.waiting == 0
    assert room.requests is not None and 8 <= room.requests < 10  # two of ten taken
    assert room.tokens is None  # no token limit configured or learned
    assert room.throttled == 1 and room.rest == 0.0
    assert list(health) == ["fake/m"]


async def test_health_detail_without_admission_has_breakers_only() -> None:
    async with FakeProvider(Reply(tokens=2)) as fake:
        backend = HTTPBackend(fake.base_url, name="fake")
        async with AsyncClient(backend, model="m") as client:
            await client.chat("hi")
            health = client.health(detail=True)
    assert all(h.headroom is None for h in health.values())
    assert {name: h.breaker for name, h in health.items()} == client.health()


async def test_headroom_on_redis_is_what_this_process_last_saw(redis_url: str) -> None:
    async with FakeProvider(Reply(tokens=2)) as fake:
        backend = HTTPBackend(fake.base_url, name="fake")
        async with RedisStore(redis_url, prefix=f"headroom-{uuid.uuid4().hex}:") as store:
            admission = Admission(Limits(rpm=10, tpm=1000), store=store)
            async with AsyncClient(backend, model="m", limits=admission) as client:
                for _ in range(3):
                    await client.chat("hi", max_tokens=50)
                room = client.health(detail=True)["fake/m"].headroom
    assert room is not None and not store.degraded
    assert room.requests is not None and 7 <= room.requests < 10
    # each call reserved its input estimate plus 50, corrected to usage afterwards: the
    # level the last take left is below the full bucket
    assert room.tokens is not None and room.tokens < 1000


def test_the_sync_client_reports_the_same_health() -> None:
    with FakeProvider(Reply(tokens=2)).run_in_thread() as fake:
        backend = HTTPBackend(fake.base_url, name="fake")
        with Client(backend, model="m", limits=Limits(rpm=10)) as client:
            client.chat("hi")
            plain = client.health()
            detail = client.health(detail=True)
    assert plain == {}
    room = detail["fake/m"].headroom
    assert room is not None and room.requests is not None and 9 <= room.requests < 10
