"""A circuit breaker that opens in one process rests its target for every process that
shares the admission store on Redis (each client here has its own RedisStore connection,
as a separate process would); with a per-process store nothing is shared."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from swiftclient import AsyncClient, HTTPBackend, RetryPolicy
from swiftclient.admission import Admission, Limits, MemoryStore, RedisStore, StateStore
from swiftclient.extend import CircuitBreaker, PolicyHub

from .mock import Script, backend_for
from .redisserver import redis_url

__all__ = ["redis_url"]  # the fixture, re-exported for pytest
pytestmark = pytest.mark.anyio
over_transports = pytest.mark.usefixtures("transport")
"""The calls go over aiohttp and httpx, to targets served on loopback sockets."""


def _hub() -> PolicyHub:
    return PolicyHub(breaker=lambda: CircuitBreaker(min_calls=2, cooldown=30.0))


@asynccontextmanager
async def _backends(a: Script, b: Script) -> AsyncIterator[dict[str, HTTPBackend]]:
    """Targets a and b, each served on its own loopback socket, over the ``transport``
    fixture's transport."""
    async with a.serve() as a_url, b.serve() as b_url:
        yield {"a": backend_for(a_url, name="a"), "b": backend_for(b_url, name="b")}


async def _trip_and_ask(first: StateStore, second: StateStore) -> tuple[Script, Script, object]:
    """Process 1 opens a's breaker with two 500s (breakers watch calls with several
    targets); process 2 then calls [a, b]."""
    a1 = Script().add(500).add(500)
    async with (
        _backends(a1, Script()) as backends,
        AsyncClient(
            backends=backends,
            limits=Admission(Limits(), store=first),
            policies=_hub(),
            retry=RetryPolicy.none(),
            timeout=5.0,
        ) as one,
    ):
        for _ in range(2):  # a answers 500, the fallback b answers
            await one.chat("x", model=["a/m", "b/m"])
        assert one.health()["a/m"] == "open"
    a2, b2 = Script(), Script()
    async with (
        _backends(a2, b2) as backends,
        AsyncClient(
            backends=backends,
            limits=Admission(Limits(), store=second),
            policies=_hub(),
            timeout=5.0,
        ) as two,
    ):
        completion = await two.chat("x", model=["a/m", "b/m"])
        health = two.health()
    return a2, b2, (completion, health)


@over_transports
async def test_an_open_breaker_rests_the_target_for_every_process_on_redis(
    redis_url: str,
) -> None:
    prefix = f"breakers-{uuid.uuid4().hex}:"
    async with RedisStore(redis_url, prefix=prefix) as first:
        async with RedisStore(redis_url, prefix=prefix) as second:
            a2, b2, (completion, health) = await _trip_and_ask(first, second)
            rest = await second.blocked_for("a/m")
    assert a2.requests == [] and len(b2.requests) == 1  # a was not even tried
    timing = completion.timing  # type: ignore[attr-defined]
    assert [(t.backend, t.error) for t in timing.attempts] == [("a", "RateLimited"), ("b", None)]
    assert 25.0 < rest <= 30.0  # the first process's breaker cooldown
    assert health == {"a/m": "closed", "b/m": "closed"}  # its own breaker saw no failure


@over_transports
async def test_a_per_process_store_shares_nothing() -> None:
    a2, b2, (completion, _) = await _trip_and_ask(MemoryStore(), MemoryStore())
    assert len(a2.requests) == 1 and b2.requests == []
    assert completion.text == "Hello world"  # type: ignore[attr-defined]


def test_open_left_counts_a_tripped_breakers_cooldown_only() -> None:
    breaker = CircuitBreaker(min_calls=1, cooldown=30.0)
    rested = CircuitBreaker(cooldown=30.0)
    rested.block_until(100.0)  # a Retry-After rest is shared by admission itself
    assert rested.state(0.0) == "open" and rested.open_left(0.0) == 0.0
    breaker.record(False, 10.0)
    assert breaker.open_left(15.0) == 25.0
    assert breaker.open_left(40.0) == 0.0 and breaker.state(40.0) == "half_open"
