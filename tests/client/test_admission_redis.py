"""The admission state stores: the same contract on MemoryStore and on a real Redis server
(started by the session fixture), sharing across processes, lease expiry, and the fallback
to per-process limits when Redis is down. Every test runs on asyncio and trio."""

from __future__ import annotations

import functools
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator

import anyio
import pytest

from swiftclient import ConfigurationError, RateLimited
from swiftclient.admission import (
    Admission,
    BucketCost,
    Limits,
    MemoryStore,
    Permit,
    RedisStore,
    StateStore,
)

from .redisserver import redis_process, redis_url

__all__ = ["redis_url"]  # the fixture, re-exported for pytest


def key() -> str:
    return f"test/{uuid.uuid4().hex}"


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest, redis_url: str) -> AsyncIterator[StateStore]:
    if request.param == "memory":
        yield MemoryStore()
        return
    async with RedisStore(redis_url, cache_ttl=0.0) as shared:
        yield shared


# ---------------------------------------------------------------------- the contract


@pytest.mark.anyio
async def test_take_is_all_or_nothing(store: StateStore) -> None:
    k = key()
    requests = BucketCost("requests", 1, 10, 1e6)
    tokens = BucketCost("tokens", 80, 100, 1e6)
    assert (await store.take(k, [requests, tokens])).granted
    admit = await store.take(k, [requests, tokens])
    assert not admit.granted and admit.limit == "tokens" and admit.wait is not None
    assert admit.wait > 1e5  # 60 tokens short until the first take leaves the window
    granted = [(await store.take(k, [requests])).granted for _ in range(10)]
    assert granted == [True] * 9 + [False]  # the refused take left requests alone


@pytest.mark.anyio
async def test_leases_count_toward_concurrency_and_release(store: StateStore) -> None:
    k = key()
    assert (await store.take(k, [], concurrency=2, holder="a")).granted
    assert (await store.take(k, [], concurrency=2, holder="b")).granted
    admit = await store.take(k, [], concurrency=2, holder="c")
    assert admit == (False, "concurrency", None, 0)
    assert await store.leases(k) == 2
    await store.release(k, "a")
    assert (await store.take(k, [], concurrency=2, holder="c")).granted


@pytest.mark.anyio
async def test_adjust_set_level_and_block(store: StateStore) -> None:
    k = key()
    spec = BucketCost("tokens", 0, 100, 1e6)
    await store.set_level(k, spec._replace(cost=5))  # the provider says 5 remain: 95 used
    assert not (await store.take(k, [spec._replace(cost=10)])).granted
    await store.adjust(k, spec._replace(cost=-20))  # give back 20: 25 free now
    assert (await store.take(k, [spec._replace(cost=10)])).granted
    await store.set_level(k, spec._replace(cost=90))  # says more remain than we log: no-op
    assert not (await store.take(k, [spec._replace(cost=16)])).granted
    await store.adjust(k, spec._replace(cost=500))  # a debt of one window's capacity at most
    admit = await store.take(k, [spec._replace(cost=1)])
    # 200 logged, 101 over: only the debt's own entry leaving the window frees enough
    assert admit.limit == "tokens" and admit.wait == pytest.approx(1e6, rel=0.01)
    k2 = key()  # a reported usage leaves the window at the provider's reset
    await store.set_level(k2, spec._replace(cost=0), 30.0)
    admit = await store.take(k2, [spec._replace(cost=1)])
    assert admit.limit == "tokens" and admit.wait is not None and 25 < admit.wait <= 30
    assert await store.blocked_for(k) == 0
    await store.block(k, 30)
    await store.block(k, 5)  # never shortens a rest
    left = await store.blocked_for(k)
    assert 25 < left <= 30
    admit = await store.take(k, [])
    assert admit.limit == "retry_after" and admit.wait is not None and 25 < admit.wait <= 30


# ---------------------------------------------------------------------- sharing


@pytest.mark.anyio
async def test_two_processes_sharing_a_limit_never_exceed_it(redis_url: str) -> None:
    # Two stores with their own connection pools stand for two processes.
    async with RedisStore(redis_url) as one, RedisStore(redis_url) as two:
        limits = Limits(rpm=4, concurrency=3)
        fleet = [Admission(limits, store=one), Admission(limits, store=two)]
        target = key()
        held: list[tuple[Admission, Permit]] = []
        refused: list[str] = []
        started = time.monotonic()

        async def offer(admission: Admission) -> None:
            for _ in range(10):
                try:
                    held.append((admission, await admission.acquire(target, timeout=0)))
                except RateLimited as exc:
                    refused.append(exc.limit)

        async with anyio.create_task_group() as tg:
            for admission in fleet:
                tg.start_soon(offer, admission)
        assert len(held) == 3  # the concurrency limit, across both
        assert set(refused) <= {"concurrency", "requests"}
        # settling frees the 3 slots, not the 3 requests
        for owner, permit in held:
            await owner.settle(permit)
        assert await one.leases(target) == 0
        more = 0
        for admission in fleet:
            for _ in range(5):
                try:
                    await admission.settle(await admission.acquire(target, timeout=0))
                    more += 1
                except RateLimited as exc:
                    assert exc.limit == "requests"
        elapsed = time.monotonic() - started
        # 4 requests a minute between them, plus whatever refilled while the test ran
        assert 4 <= len(held) + more <= 4 + math.floor(elapsed * 4 / 60)


@pytest.mark.anyio
async def test_a_crashed_holders_lease_expires(redis_url: str) -> None:
    target = key()
    async with RedisStore(redis_url) as crashed, RedisStore(redis_url) as alive:
        # the holder takes the only slot with a short lease and never releases it
        assert (await crashed.take(target, [], concurrency=1, holder="gone", ttl=0.3)).granted
        admission = Admission(Limits(concurrency=1), store=alive, poll_interval=0.02)
        with pytest.raises(RateLimited) as caught:
            await admission.acquire(target, timeout=0)
        assert caught.value.limit == "concurrency"
        permit = await admission.acquire(target, timeout=30)  # admitted once the lease expires
        await admission.settle(permit)
        assert await alive.leases(target) == 0


@pytest.mark.anyio
async def test_redis_down_falls_back_to_per_process_limits_with_one_warning(
    tmp_path: object, caplog: pytest.LogCaptureFixture
) -> None:
    nowhere = f"unix://{tmp_path}/no-such.sock"
    caplog.set_level(logging.INFO, logger="swiftclient.admission")
    async with RedisStore(nowhere, retry_after_down=0.0) as down:
        assert "no-such" in repr(down)
        admission = Admission(Limits(concurrency=2), store=down)
        first = await admission.acquire("b/m", timeout=0)
        await admission.acquire("b/m", timeout=0)
        with pytest.raises(RateLimited):
            await admission.acquire("b/m", timeout=0)  # the fallback still limits
        await admission.settle(first, status=200, headers={"retry-after": "0"})
        await admission.acquire("b/m", timeout=0)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "per-process" in warnings[0].getMessage()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_lease_a_timed_out_take_left_on_redis_is_released(anyio_backend: str) -> None:
    """Redis ran a take after the client had timed out on it (the server stalled): the
    call went on under the per-process fallback, released its lease there only, and the
    lease held the target's one concurrency slot on Redis for its whole ttl (300 s)."""
    import os
    import signal

    import redis.asyncio

    target = key()
    with redis_process() as (url, process):
        raw = redis.asyncio.Redis.from_url(url)
        leases = f"swiftclient:admission:{target}:leases"
        async with raw, RedisStore(url, timeout=0.2, retry_after_down=1.0) as store:
            # connected, and the script loaded, before the server stalls
            assert (await store.take(target, [], concurrency=1, holder="h0", ttl=300)).granted
            await store.release(target, "h0")
            os.kill(process.pid, signal.SIGSTOP)
            try:
                admit = await store.take(target, [], concurrency=1, holder="h1", ttl=300)
            finally:
                os.kill(process.pid, signal.SIGCONT)
            assert admit.granted  # by the per-process fallback
            with anyio.fail_after(30):
                # Redis runs the take it was sent (another process: polled)
                while await raw.zcard(leases) == 0:  # noqa: ASYNC110
                    await anyio.sleep(0.01)
            await store.release(target, "h1")  # still degraded: released locally
            await anyio.sleep(1.0)  # the store's down window (retry_after_down) passes
            # the next call that reaches Redis clears the lease the failed take left
            other = await store.take(target, [], concurrency=1, holder="h2", ttl=300)
            assert other.granted
            await store.release(target, "h2")
            assert await raw.zcard(leases) == 0


@pytest.mark.anyio
async def test_a_window_whose_log_expired_is_free_again(redis_url: str) -> None:
    """Unused for longer than its window, a limit's log expires on Redis with what it
    held: the sum kept beside it stayed, and every take was refused for an hour (the sum's
    own lifetime), or lost part of the limit for each pause."""
    import redis

    target = key()
    window = [BucketCost("requests", 1, 3, 60.0)]
    async with RedisStore(redis_url, cache_ttl=0.0) as store:
        for _ in range(3):
            assert (await store.take(target, window)).granted
        assert not (await store.take(target, window)).granted  # the window is full
        with redis.Redis.from_url(redis_url) as raw:  # a blocking client: trio too
            # what the log's expiry (its window and a second after its last use) does
            log = f"swiftclient:admission:{target}:log:requests"
            assert await anyio.to_thread.run_sync(raw.delete, log) == 1
        assert [(await store.take(target, window)).granted for _ in range(4)] == [
            True,
            True,
            True,
            False,
        ]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_lease_released_while_redis_is_down_is_removed_when_it_answers(
    anyio_backend: str,
) -> None:
    """A call that ended while the store ran on its fallback released its lease there
    only: the lease held its concurrency slot on Redis for its whole ttl (300 s)."""
    import os
    import signal

    import redis.asyncio

    target = key()
    with redis_process() as (url, process):
        raw = redis.asyncio.Redis.from_url(url)
        leases = f"swiftclient:admission:{target}:leases"
        async with raw, RedisStore(url, timeout=0.2, retry_after_down=0.5) as store:
            assert (await store.take(target, [], concurrency=1, holder="h0", ttl=300)).granted
            os.kill(process.pid, signal.SIGSTOP)
            try:
                await store.leases("elsewhere")  # times out: the store falls back
            finally:
                os.kill(process.pid, signal.SIGCONT)
            assert store.degraded
            await store.release(target, "h0")  # on the fallback: Redis is not asked
            assert await raw.zcard(leases) == 1
            with anyio.fail_after(30):
                while store.degraded:  # noqa: ASYNC110 (the store's own clock)
                    await anyio.sleep(0.01)
            # the next operation that reaches Redis removes it first: the slot is free
            assert (await store.take(target, [], concurrency=1, holder="h1", ttl=300)).granted
            assert [m.decode() for m in await raw.zrange(leases, 0, -1)] == ["h1"]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_take_cancelled_while_redis_runs_it_leaves_no_lease(anyio_backend: str) -> None:
    """A call cancelled (a timeout, a lost hedge) while its take was on its way to Redis
    gets no permit, so nothing released the lease the script left: it held the slot for
    its whole ttl."""
    import os
    import signal

    import redis.asyncio

    target = key()
    with redis_process() as (url, process):
        raw = redis.asyncio.Redis.from_url(url)
        leases = f"swiftclient:admission:{target}:leases"
        async with raw, RedisStore(url, timeout=5.0) as store:
            assert (await store.take(target, [], concurrency=1, holder="h0", ttl=300)).granted
            await store.release(target, "h0")  # connected, and the script loaded
            os.kill(process.pid, signal.SIGSTOP)
            try:
                with anyio.move_on_after(0.2) as scope:
                    await store.take(target, [], concurrency=1, holder="h1", ttl=300)
            finally:
                os.kill(process.pid, signal.SIGCONT)
            assert scope.cancelled_caught
            with anyio.fail_after(30):
                while await raw.zcard(leases) == 0:  # noqa: ASYNC110 (Redis runs it)
                    await anyio.sleep(0.01)
            assert (await store.take(target, [], concurrency=1, holder="h2", ttl=300)).granted
            assert [m.decode() for m in await raw.zrange(leases, 0, -1)] == ["h2"]


@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_one_store_serves_one_run_after_another(redis_url: str) -> None:
    """redis-py's connections belong to the loop that opened them: a store used by a
    second ``anyio.run`` (or a second blocking Client) failed its first operation there
    with ``Event loop is closed``; each loop now gets its own connections."""
    import gc

    store = RedisStore(redis_url, cache_ttl=0.0)
    target = key()

    async def take(holder: str) -> bool:
        admit = await store.take(target, [], concurrency=5, holder=holder, ttl=60)
        return admit.granted and await store.leases(target) == int(holder)

    assert anyio.run(take, "1", backend="asyncio")  # the first run's connection stays open
    assert anyio.run(take, "2", backend="asyncio")
    anyio.run(store.aclose, backend="asyncio")
    gc.collect()  # the first loop's connection, dropped (its loop is gone): here, not later


def test_a_store_never_closed_does_not_keep_a_trio_script_from_exiting(redis_url: str) -> None:
    """On trio the store runs redis-py on a helper loop in its own thread; a script that
    never closed its store (a module-level one) did not exit after its last line, because
    that thread was not a daemon."""
    import subprocess
    import sys

    script = (
        "import anyio\n"
        "from swiftclient.admission import Admission, Limits, RedisStore\n"
        f"store = RedisStore({redis_url!r})\n"
        "async def main():\n"
        "    admission = Admission(Limits(rpm=100), store=store)\n"
        "    await admission.settle(await admission.acquire('fake/m', timeout=5))\n"
        "anyio.run(main, backend='trio')\n"
        "print('done', flush=True)\n"
    )
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", script],
        capture_output=True,
        text=True,
        timeout=120,  # a bound on a script that never exits, not a speed check
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "done\n"


def test_redis_store_needs_exactly_one_of_url_and_client() -> None:
    with pytest.raises(ConfigurationError):
        RedisStore()
    with pytest.raises(ConfigurationError):
        RedisStore("redis://localhost", cache_ttl=-1)


def test_the_repr_shows_no_password() -> None:
    store = RedisStore("redis://user:hunter2@cache.internal:6379/0")
    assert "hunter2" not in repr(store) and "cache.internal" in repr(store)


def test_the_store_times_its_fallback_on_its_own_clock() -> None:
    """``degraded`` reads outside an event loop (it raised: the store timed its pause on the
    running loop's clock), and a pause begun in one trio run still holds in the next,
    whose clock starts somewhere else."""
    import socket

    import trio

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    store = RedisStore(f"redis://127.0.0.1:{port}", timeout=0.2, retry_after_down=600)
    assert not store.degraded

    async def fall_back() -> None:
        assert await store.leases(key()) == 0  # refused: answered by the fallback

    async def still_degraded() -> None:
        try:
            assert store.degraded
        finally:
            await store.aclose()

    trio.run(fall_back)
    assert store.degraded
    trio.run(still_degraded)


def test_a_blocking_client_closes_the_store_connections_of_its_loop() -> None:
    """The blocking ``Client`` runs its own event loop; the store's connections on it
    were left open when the client closed (a ``ResourceWarning`` at exit) and could not be
    closed by the caller, whose code has no event loop. They close with the client; the
    store stays usable."""
    import redis

    from swiftclient import Client, HTTPBackend
    from swiftclient.testing import FakeProvider

    def connected(raw: redis.Redis) -> int:
        return len(raw.client_list()) - 1  # besides this one

    with redis_process() as (url, _), FakeProvider().run_in_thread() as fake:
        store = RedisStore(url)
        with redis.Redis.from_url(url) as raw:
            for _ in range(2):  # and again, over the same store
                limits = Admission({"p": Limits(concurrency=2, rpm=100)}, store=store)
                backend = HTTPBackend(fake.base_url, name="p")
                with Client(backend, model="m", limits=limits) as client:
                    assert client.chat("hi").text
                    assert connected(raw) >= 1
                deadline = time.monotonic() + 30  # bounds the server's noticing the close
                while connected(raw) and time.monotonic() < deadline:
                    time.sleep(0.01)
                assert connected(raw) == 0


@pytest.mark.anyio
async def test_a_stalled_store_holds_a_call_no_longer_than_its_deadline(
    anyio_backend: str,
) -> None:
    """A Redis server that stops answering held every call until the store's socket
    timeout, past a shorter total deadline (here 60 s against 0.3 s). The call ends at its
    deadline; the store's operation runs on to its own timeout, which puts the store on
    its per-process fallback, so the calls after it are served."""
    import os
    import signal

    from swiftclient import AsyncClient, DeadlineExceeded, HTTPBackend, RetryPolicy, Timeout
    from swiftclient.testing import FakeProvider

    limits = {"p": Limits(concurrency=4, rpm=1000)}
    with redis_process() as (url, process):
        async with FakeProvider() as fake:
            for socket_timeout in (60.0, 0.5):
                async with RedisStore(url, timeout=socket_timeout) as store:
                    backend = HTTPBackend(fake.base_url, name="p")
                    admission = Admission(limits, store=store)
                    async with AsyncClient(
                        backend, model="m", limits=admission, retry=RetryPolicy.none()
                    ) as client:
                        assert (await client.chat("hi")).text  # connected, scripts loaded
                        os.kill(process.pid, signal.SIGSTOP)
                        try:
                            with anyio.fail_after(30):  # a bound, not a speed check
                                began = time.monotonic()
                                with pytest.raises(DeadlineExceeded):
                                    await client.chat("hi", timeout=Timeout(total=0.3))
                                # read off the clock as well: a scope that could not stop
                                # the wait would end it late, not raise (half the socket
                                # timeout; the deadline is 0.3 s)
                                assert time.monotonic() - began < 30
                                if socket_timeout < 30:
                                    while not store.degraded:  # noqa: ASYNC110
                                        await anyio.sleep(0.01)
                                    assert (await client.chat("hi")).text  # the fallback
                        finally:
                            os.kill(process.pid, signal.SIGCONT)


@pytest.mark.anyio
async def test_acquires_cancelled_before_their_first_checkpoint_leave_no_lease(
    redis_url: str,
) -> None:
    """A take runs to its end once handed to the store, even for a caller cancelled before
    it began waiting (on trio it is handed on before the first checkpoint): the lease it
    leaves is released like that of a take cancelled while Redis ran it. It held a slot of
    every process sharing the store for the lease's ttl (a second review's find)."""
    import redis

    async with RedisStore(redis_url, cache_ttl=0.0) as store:
        raw = redis.Redis.from_url(redis_url)  # blocking: it reads on trio too
        admission = Admission(Limits(concurrency=1), store=store)
        await admission.settle(await admission.acquire(key(), timeout=0))  # connected
        targets = [key() for _ in range(10)]
        for target in targets:
            async with anyio.create_task_group() as group:
                group.start_soon(functools.partial(admission.acquire, target))
                group.cancel_scope.cancel()  # before the acquire's first checkpoint
        with anyio.fail_after(30):
            while True:
                await store.leases("another")  # an operation: known orphans go first
                leases = [raw.zcard(f"swiftclient:admission:{t}:leases") for t in targets]
                if sum(leases) == 0:
                    break
                await anyio.sleep(0.05)
        raw.close()


@pytest.mark.anyio
async def test_closing_the_store_under_a_take_falls_back_not_cancels_the_caller(
    anyio_backend: str,
) -> None:
    """Closing the store cancels the operations it still runs; their callers, whom nobody
    cancelled, carry on under the per-process fallback (on asyncio the call vanished in
    its task group, on trio it raised concurrent.futures' CancelledError)."""
    import os
    import signal

    with redis_process() as (url, process):
        store = RedisStore(url, cache_ttl=0.0, timeout=30.0)
        assert (await store.take(key(), [], concurrency=1, holder="h0", ttl=300)).granted
        got: list[bool] = []

        async def take() -> None:
            admit = await store.take(key(), [], concurrency=1, holder="h1", ttl=300)
            got.append(admit.granted)

        os.kill(process.pid, signal.SIGSTOP)
        try:
            with anyio.fail_after(20):
                async with anyio.create_task_group() as group:
                    group.start_soon(take)
                    await anyio.sleep(0.3)  # the take waits on the stalled server
                    await store.aclose()
        finally:
            os.kill(process.pid, signal.SIGCONT)
        assert got == [True]
