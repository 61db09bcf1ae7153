"""Fault injection on the hedged call path: cancellations and failures that land while a
race is ending, checked for leaked streams, stray tasks and honest attempt records.

Order is forced with events (a gated in-test backend), never with the wall clock.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import anyio
import pytest

from swiftclient import AsyncClient, ChatCompletionChunk, ChatRequest, Hedge
from swiftclient._deadline import DeadlineWatch, deadline_watch
from swiftclient.extend import Deadline, RequestOptions

from .mock import Gated, Recorder, watch_wait

pytestmark = pytest.mark.anyio


class Scripted(Gated):
    """A :class:`Gated` backend that may answer at once, and whose close may wait for
    ``close_gate`` (a slow connection teardown)."""

    def __init__(self, name: str, *, answer: bool = True, slow_close: bool = False) -> None:
        super().__init__(name)
        if answer:
            self.gate.set()
        self.close_gate = anyio.Event()
        if not slow_close:
            self.close_gate.set()
        self.closing = anyio.Event()

    @asynccontextmanager
    async def stream(
        self, request: ChatRequest, deadline: Deadline, options: RequestOptions | None = None
    ) -> AsyncIterator[AsyncIterator[ChatCompletionChunk]]:
        async with super().stream(request, deadline, options) as chunks:
            try:
                yield chunks
            finally:
                self.closing.set()
                await self.close_gate.wait()


@pytest.mark.parametrize("delay", [0.0, 0.01])
async def test_a_call_cancelled_while_its_loser_closes_releases_the_winner(delay: float) -> None:
    # b wins; a (the loser) takes its time to close. The caller is cancelled meanwhile: the
    # call raises the cancellation, and the winner's stream, which nobody will read, must
    # be closed too, its attempt recorded as cancelled.
    a = Scripted("a", answer=False, slow_close=True)
    b = Scripted("b")
    recorder = Recorder()
    client = AsyncClient(backends={"a": a, "b": b}, observers=[recorder])
    finished = False

    async def call() -> None:
        nonlocal finished
        await client.chat("hi", model=["a/m", "b/m"], hedge=Hedge(delay=delay))
        finished = True

    async with anyio.create_task_group() as tg:
        tg.start_soon(call)
        await a.closing.wait()  # b won; a's stream is being closed
        tg.cancel_scope.cancel()
        a.close_gate.set()
    assert not finished
    assert (a.open, a.closed) == (1, 1)
    assert (b.open, b.closed) == (1, 1)
    ends = sorted(event for event in recorder.events if event[0] == "end")
    assert ends == [("end", "a", "lost"), ("end", "b", "cancelled")]


# --------------------------------------------------------------------------- DeadlineWatch


async def _watched(
    watch: DeadlineWatch, due: float, wait: Callable[[], Awaitable[object]], results: list[str]
) -> None:
    """Wait under ``watch`` until ``due``; note how it ended; then prove no cancel request
    was left behind (the next checkpoint passes)."""
    task = asyncio.current_task()
    assert task is not None
    watched = watch_wait(watch, task, due)
    try:
        await wait()
        outcome = "done"
    except asyncio.CancelledError:
        if not watched.expired():
            results.append("cancelled")
            raise
        outcome = "expired"
    finally:
        watched.stop()
    assert task.cancelling() == 0
    await asyncio.sleep(0)
    results.append(outcome)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_deadline_watch_serves_shorter_deadlines_added_later_and_outer_cancels() -> None:
    loop = asyncio.get_running_loop()
    watch = DeadlineWatch(loop)
    now = loop.time()
    held = asyncio.Event()
    long: list[str] = []
    short: list[str] = []
    other: list[str] = []
    cancelled: list[str] = []
    long_task = loop.create_task(_watched(watch, now + 3600.0, held.wait, long))
    other_task = loop.create_task(_watched(watch, now + 3600.0, held.wait, other))
    await asyncio.sleep(0)
    # Started later, due first (already due): the one timer is re-armed for it.
    await loop.create_task(_watched(watch, now, held.wait, short))
    assert short == ["expired"] and long == [] and other == []
    # An outer cancellation of a watched wait is the caller's, never the watch's.
    outer = loop.create_task(_watched(watch, now + 3600.0, held.wait, cancelled))
    await asyncio.sleep(0)
    outer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await outer
    assert cancelled == ["cancelled"]
    held.set()
    await long_task
    await other_task
    assert long == ["done"] and other == ["done"]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_wait_ending_exactly_at_its_deadline_leaves_no_cancel_request() -> None:
    # The awaited result arrives in the same loop turn as the watch's timer: the wait ends
    # one way or the other, and the task carries no stray cancellation either way.
    loop = asyncio.get_running_loop()
    for _ in range(20):
        watch = DeadlineWatch(loop)
        due = loop.time() + 0.001
        future: asyncio.Future[int] = loop.create_future()
        loop.call_at(due, future.set_result, 1)
        results: list[str] = []

        async def wait(future: asyncio.Future[int] = future) -> object:
            return await future

        await loop.create_task(_watched(watch, due, wait, results))
        assert results in (["done"], ["expired"])


def test_event_loops_in_two_threads_each_get_their_own_deadline_watch() -> None:
    # Both loops run at once (a barrier holds each until the other has its watch): each
    # thread's watch belongs to its own loop and cancels only its own task.
    barrier = threading.Barrier(2, timeout=30)
    results: list[tuple[bool, bool]] = []

    async def body() -> None:
        loop = asyncio.get_running_loop()
        watch = deadline_watch(loop)
        await asyncio.to_thread(barrier.wait)
        task = asyncio.current_task()
        assert task is not None
        watched = watch_wait(watch, task, loop.time())
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            results.append((watch.loop is loop, watched.expired()))
        finally:
            watched.stop()

    threads = [threading.Thread(target=asyncio.run, args=(body(),)) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert results == [(True, True), (True, True)]


async def test_a_cancellation_wrapped_in_an_exception_group_is_a_cancellation() -> None:
    """trio's connect raises the cancellation of a hedge's loser out of its own nursery, in
    an exception group: the attempt was recorded as an error (``BaseExceptionGroup``), not
    ``lost``, on trio only."""
    from swiftclient._attempt import _is_cancellation

    with anyio.CancelScope() as scope:
        scope.cancel()
        try:
            await anyio.sleep(1)
        except anyio.get_cancelled_exc_class() as exc:
            assert _is_cancellation(exc)
            assert _is_cancellation(BaseExceptionGroup("connect", [exc]))
            nested = BaseExceptionGroup("outer", [BaseExceptionGroup("inner", [exc])])
            assert _is_cancellation(nested)
            assert not _is_cancellation(BaseExceptionGroup("mixed", [exc, ValueError("x")]))
            raise
    assert not _is_cancellation(ValueError("x"))


async def test_a_hedge_loser_cancelled_while_connecting_is_lost() -> None:
    """The slow target's attempts lose to the fast one's: every one is ``lost`` (on trio
    most were ``error``, ``BaseExceptionGroup``)."""
    from swiftclient import HTTPBackend
    from swiftclient.testing import FakeProvider, Reply

    async with FakeProvider(Reply(ttft=5)) as slow, FakeProvider(Reply(text="fast")) as fast:
        backends = {"a": HTTPBackend(slow.base_url), "b": HTTPBackend(fast.base_url)}
        hedge = Hedge(delay=0.0, budget=1.0, budget_burst=1000)
        async with AsyncClient(backends=backends, hedge=hedge, timeout=10) as client:
            for _ in range(8):
                reply = await client.chat("hi", model=["a/m", "b/m"])
                outcomes = [(a.backend, a.outcome) for a in reply.timing.attempts]
                assert outcomes == [("a", "lost"), ("b", "ok")], outcomes
