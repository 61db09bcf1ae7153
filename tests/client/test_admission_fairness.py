"""Fairness across processes and the deadline at admission.

Several :class:`Admission` objects on one store stand for processes sharing a limit; each
test runs on a MemoryStore and on a real Redis server (the session fixture starts it), on
asyncio and trio. Polls wake on a FakeClock the test advances, and each step waits for the
takes it caused (an event), never for the wall clock.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Sequence

import anyio
import pytest

from swiftclient import AsyncClient, HTTPBackend, RateLimited
from swiftclient.admission import (
    Admission,
    Admit,
    BucketCost,
    Limits,
    MemoryStore,
    RedisStore,
    StateStore,
)
from swiftclient.testing import FakeProvider, Reply

from .fakeclock import FakeClock
from .redisserver import redis_url
from .storewrap import Delegating

__all__ = ["redis_url"]  # the fixture, re-exported for pytest

pytestmark = pytest.mark.anyio


def key() -> str:
    return f"test/{uuid.uuid4().hex}"


class Watched(Delegating):
    """A store shared by several processes (``shared``: a release elsewhere wakes no one
    here), counting the takes that returned so that a test can wait for them."""

    shared = True

    def __init__(self, inner: StateStore) -> None:
        super().__init__(inner)
        self.takes = 0
        self._changed = anyio.Event()

    async def take(self, key: str, costs: Sequence[BucketCost], **kwargs: object) -> Admit:
        try:
            return await self.inner.take(key, costs, **kwargs)  # type: ignore[arg-type]
        finally:
            self.takes += 1
            self._changed.set()
            self._changed = anyio.Event()

    async def until_takes(self, n: int) -> None:
        """Return once ``n`` takes returned, and every task woken by them ran."""
        with anyio.fail_after(10):
            while self.takes < n:
                await self._changed.wait()
        await anyio.wait_all_tasks_blocked()


@pytest.fixture(params=["memory", "redis"])
async def clock_and_store(
    request: pytest.FixtureRequest, redis_url: str
) -> AsyncIterator[tuple[FakeClock, StateStore]]:
    clock = FakeClock()
    if request.param == "memory":
        yield clock, MemoryStore(clock.now)
        return
    async with RedisStore(redis_url, cache_ttl=0.0) as shared:
        yield clock, shared


# ---------------------------------------------------------------------- processes take turns


async def test_the_process_that_queued_first_is_served_first_not_the_first_to_poll(
    clock_and_store: tuple[FakeClock, StateStore],
) -> None:
    clock, inner = clock_and_store
    store = Watched(inner)
    limits = Limits(concurrency=1, queue_ttl=30.0)

    def process() -> Admission:
        return Admission(limits, store=store, clock=clock, poll_interval=0.01)

    holder, first, second = process(), process(), process()
    target = key()
    held = await holder.acquire(target)
    order: list[str] = []

    async def call(name: str, admission: Admission) -> None:
        permit = await admission.acquire(target, timeout=60)
        order.append(name)
        await admission.settle(permit, status=200)

    async with anyio.create_task_group() as tg:
        tg.start_soon(call, "first", first)  # refused at t=0: polls at 0.010, 0.020, ...
        await store.until_takes(2)
        await clock.advance(0.004)
        tg.start_soon(call, "second", second)  # refused at t=0.004: polls at 0.014, ...
        await store.until_takes(3)
        await clock.advance(0.008)  # t=0.012: first polls, the slot is still held
        await store.until_takes(4)
        await holder.settle(held, status=200)
        await clock.advance(0.004)  # t=0.016: second polls first once the slot is free
        await store.until_takes(5)
        assert order == []  # ... and is not served: first is ahead of it in line
        await clock.advance(0.008)  # t=0.024: first polls and is served
        await store.until_takes(6)
        assert order == ["first"]
        # second's turn once first has handed the slot back: on a store reached through a
        # thread (Redis on trio) that release may still be on its way when second polls
        # at t=0.028, and second then polls again 0.01 later
        await clock.advance(0.004)  # t=0.028
        await store.until_takes(7)
        with anyio.fail_after(10):
            while order == ["first"]:
                await clock.advance(0.01)
                await store.until_takes(store.takes + 1)
    assert order == ["first", "second"]
    assert await inner.leases(target) == 0


async def test_the_line_is_kept_by_the_store(
    clock_and_store: tuple[FakeClock, StateStore],
) -> None:
    _, store = clock_and_store
    k = key()

    async def take(queue: str) -> Admit:
        return await store.take(
            k, [], concurrency=1, holder=queue.lower(), queue=queue, queue_ttl=30.0
        )

    assert (await store.take(k, [], concurrency=1, holder="x")).granted
    assert (await take("A"))[1:] == ("concurrency", None, 0)
    assert (await take("B"))[1:] == ("queue", None, 1)
    await store.release(k, "x")
    assert (await take("B"))[1:] == ("queue", None, 1)  # free, but A's turn
    assert (await take("A")).granted  # A leaves the line
    await store.release(k, "a")
    assert (await take("C"))[1:] == ("queue", None, 1)  # C queues behind B
    assert (await take("B")).granted
    await store.release(k, "b")
    await store.leave(k, "C")  # C stopped waiting: the line is empty
    assert (await take("D")).granted


async def test_a_wait_behind_others_counts_their_turns(
    clock_and_store: tuple[FakeClock, StateStore],
) -> None:
    _, store = clock_and_store
    k = key()
    spec = BucketCost("requests", 1, 2, 1e6)
    # one request the provider counted leaves the window in 100 s, one logged now in 1e6 s
    await store.set_level(k, spec._replace(cost=1), 100.0)
    assert (await store.take(k, [spec], queue="A")).granted
    a = await store.take(k, [spec], queue="A", queue_ttl=30.0)
    b = await store.take(k, [spec], queue="B", queue_ttl=30.0)
    assert (a.limit, a.ahead, b.limit, b.ahead) == ("requests", 0, "requests", 1)
    assert a.wait is not None and b.wait is not None
    # A's turn needs the first to leave; B's, after A's turn, the second as well
    assert 90 < a.wait <= 100 and 0.9e6 < b.wait <= 1e6


async def test_a_dead_process_stops_holding_the_line(redis_url: str) -> None:
    target = key()
    async with RedisStore(redis_url) as dead, RedisStore(redis_url) as alive:
        assert (await dead.take(target, [], concurrency=1, holder="x")).granted
        # the dead process queued for the slot, and never asks again
        queued = await dead.take(target, [], concurrency=1, holder="y", queue="dead", queue_ttl=1.0)
        assert not queued.granted
        await dead.release(target, "x")
        admission = Admission(Limits(concurrency=1), store=alive, poll_interval=0.02)
        with pytest.raises(RateLimited) as caught:
            await admission.acquire(target, timeout=0)
        assert caught.value.limit == "queue"
        permit = await admission.acquire(target, timeout=30)  # once the dead place expires
        await admission.settle(permit)


async def test_a_waiter_that_gives_up_leaves_the_line(
    clock_and_store: tuple[FakeClock, StateStore],
) -> None:
    clock, store = clock_and_store
    limits = Limits(concurrency=1, queue_ttl=30.0)
    one = Admission(limits, store=store, clock=clock)
    two = Admission(limits, store=store, clock=clock)
    target = key()
    held = await one.acquire(target)
    with pytest.raises(RateLimited):
        await two.acquire(target, timeout=0)  # queued, then gave up: out of the line
    await one.settle(held)
    await one.settle(await one.acquire(target, timeout=0))  # nobody ahead of it


# ---------------------------------------------------------------------- the deadline


async def test_a_call_that_cannot_finish_in_its_deadline_is_refused_at_admission() -> None:
    clock = FakeClock()
    admission = Admission(Limits(rpm=10), clock=clock)
    permit = await admission.acquire("b/m")
    await clock.advance(2.0)
    await admission.settle(permit, status=200)  # the target took 2 s
    with pytest.raises(RateLimited) as caught:
        await admission.acquire("b/m", remaining=1.5)
    assert caught.value.limit == "deadline" and caught.value.target == "b/m"
    assert admission.headroom()["b/m"].requests == 9  # nothing taken
    await admission.settle(await admission.acquire("b/m", remaining=3.0), status=200)
    # a call that may not wait (a hedge: timeout 0) is judged by its deadline, not by 0 s
    await admission.settle(await admission.acquire("b/m", timeout=0, remaining=60.0))


async def test_a_wait_ends_when_too_little_of_the_deadline_is_left() -> None:
    clock = FakeClock()
    admission = Admission(Limits(concurrency=1), clock=clock)
    permit = await admission.acquire("b/m")
    await clock.advance(2.0)
    await admission.settle(permit, status=200)  # the target took 2 s
    held = await admission.acquire("b/m")
    failed: list[RateLimited] = []

    async def waiter() -> None:
        with pytest.raises(RateLimited) as caught:
            await admission.acquire("b/m", timeout=5.0, remaining=5.0)
        failed.append(caught.value)

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter)
        await anyio.wait_all_tasks_blocked()
        await clock.advance(2.9)
        assert failed == []
        await clock.advance(0.2)  # 3.1 s in: less than the 2 s it needs is left
        assert len(failed) == 1 and failed[0].limit == "concurrency"
    await admission.settle(held)


async def test_the_client_does_not_send_a_call_that_cannot_finish() -> None:
    clock = FakeClock()
    admission = Admission(Limits(rpm=100), clock=clock)
    permit = await admission.acquire("fake/m")
    await clock.advance(2.0)
    await admission.settle(permit, status=200)  # the target took 2 s
    async with FakeProvider(Reply(tokens=2)) as fake:
        backend = HTTPBackend(fake.base_url, name="fake")
        async with AsyncClient(backend, model="m", limits=admission, timeout=5.0) as client:
            with pytest.raises(RateLimited) as caught:
                await client.chat("hi", timeout=1.0)
            assert caught.value.limit == "deadline"
            assert len(fake.requests) == 0  # no provider slot spent on it
            assert (await client.chat("hi")).text == "tok0 tok1"
    assert len(fake.requests) == 1


# ---------------------------------------------------------------------- corrections


async def test_one_update_sets_levels_then_corrects(
    clock_and_store: tuple[FakeClock, StateStore],
) -> None:
    _, store = clock_and_store
    k = key()
    requests = BucketCost("requests", 0, 10, 1e6)
    tokens = BucketCost("tokens", 0, 100, 1e6)
    assert (await store.take(k, [tokens._replace(cost=50)])).granted
    # the provider says 4 requests and 60 tokens remain, and usage was 30 tokens under:
    # the floor (40 used) is under the log's 50 and changes nothing, then 30 go back
    levels = [(requests._replace(cost=4), None), (tokens._replace(cost=60), None)]
    await store.update(k, levels, [tokens._replace(cost=-30)])
    assert (await store.take(k, [requests._replace(cost=4)])).granted
    assert not (await store.take(k, [requests._replace(cost=1)])).granted
    assert (await store.take(k, [tokens._replace(cost=80)])).granted  # 20 logged: 80 free
    assert not (await store.take(k, [tokens._replace(cost=1)])).granted


def test_used_up_log_entries_are_dropped() -> None:
    clock = FakeClock()
    store = MemoryStore(clock.now)
    spec = BucketCost("tokens", 10, 1e9, 60.0)
    for _ in range(1000):
        assert store.take_now("k", [spec]).granted
        store.adjust_now("k", spec._replace(cost=-10))  # used nothing after all
    # a correction that frees an entry's every unit drops it (the log no longer grows with
    # every request of the window, and no scan walks the empty ones)
    assert len(store._entries["k"].logs["tokens"].entries) == 0


async def test_a_waiter_behind_another_process_reports_the_limit_that_holds_it(
    clock_and_store: tuple[FakeClock, StateStore],
) -> None:
    """A later waiter of a process that waits behind another process times out naming the
    limit that holds the line (here ``requests``); it named ``concurrency``, a limit the
    target does not have, because only the head waiter knew."""
    clock, inner = clock_and_store
    store = Watched(inner)
    limits = Limits(rpm=1, window=60.0, queue_ttl=30.0)

    def process() -> Admission:
        return Admission(limits, store=store, clock=clock, poll_interval=0.01)

    first, second = process(), process()
    target = key()
    await first.settle(await first.acquire(target), status=200)  # the window's one request
    refused: list[RateLimited] = []

    async def wait_in_line(admission: Admission, timeout: float) -> None:
        try:
            await admission.acquire(target, timeout=timeout)
        except RateLimited as exc:
            refused.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait_in_line, first, 120.0)  # first in line
        await store.until_takes(2)
        tg.start_soon(wait_in_line, second, 120.0)  # behind it: 'requests', one ahead
        await store.until_takes(3)
        tg.start_soon(wait_in_line, second, 1.0)  # this process's second waiter
        await anyio.wait_all_tasks_blocked()
        await clock.advance(1.5)  # past the second waiter's deadline
        await anyio.wait_all_tasks_blocked()
        assert [exc.limit for exc in refused] == ["requests"]
        tg.cancel_scope.cancel()
    assert "rate limit 'requests' leaves no capacity" in str(refused[0])
