"""Per-read time limits of a stream: the loop's deadline watch (asyncio) and scopes (trio)."""

from __future__ import annotations

import asyncio
from contextlib import AbstractAsyncContextManager

import anyio
import anyio.lowlevel
import pytest

from swiftclient import AsyncClient, StreamStalled, Timeout
from swiftclient._deadline import Deadline, DeadlineWatch, Waiter, deadline_watch

from .mock import NO_RETRY, Script, chunk, scripted_client, watch_wait

pytestmark = pytest.mark.anyio


def _client(
    count: int, gap: float, timeout: Timeout, replies: int = 1
) -> AbstractAsyncContextManager[AsyncClient]:
    """A client over the ``transport`` fixture's transport, served a role chunk, then
    ``count`` content chunks ``gap`` seconds apart, then a stall (only a time limit ends
    it), for each of ``replies`` requests."""
    script = Script(pace=gap)
    parts = [chunk(role="assistant")] + [chunk(str(i)) for i in range(count)]
    for _ in range(replies):
        script.add(parts=parts, stall=True)
    return scripted_client(script, retry=NO_RETRY, timeout=timeout)


def _cancel_requests() -> int:
    """Cancel requests still pending on the current asyncio task (0 on trio)."""
    try:
        task = asyncio.current_task()
    except RuntimeError:
        return 0
    return 0 if task is None else task.cancelling()


@pytest.mark.usefixtures("transport")  # served on a socket, read over aiohttp and httpx
async def test_idle_bounds_each_gap_not_the_whole_stream() -> None:
    # Six gaps of 0.1 s add up past idle=0.5, yet no single gap reaches it.
    texts: list[str] = []
    async with _client(6, 0.1, Timeout(total=60, idle=0.5)) as client:
        async with client.stream("hi") as stream:
            with pytest.raises(StreamStalled):
                async for text in stream.text():
                    texts.append(text)
    assert texts == [str(i) for i in range(6)]
    assert _cancel_requests() == 0
    await anyio.lowlevel.checkpoint()  # the task is not left cancelled


@pytest.mark.usefixtures("transport")
async def test_outer_cancellation_is_not_reported_as_a_stall() -> None:
    async with _client(1, 0.0, Timeout(total=60, idle=30), replies=2) as client:
        with anyio.move_on_after(0.2) as scope:
            async with client.stream("hi") as stream:
                async for _ in stream:
                    pass
        assert scope.cancelled_caught
        assert _cancel_requests() == 0
        async with client.stream("hi") as stream:  # the client still works afterwards
            first = await stream.text().__anext__()
        assert first == "0"


@pytest.mark.usefixtures("transport")
async def test_stall_inside_an_outer_scope_leaves_the_scope_uncancelled() -> None:
    async with _client(1, 0.0, Timeout(total=60, idle=0.2)) as client:
        with anyio.CancelScope() as scope:
            async with client.stream("hi") as stream:
                with pytest.raises(StreamStalled):
                    async for _ in stream:
                        pass
            await anyio.lowlevel.checkpoint()
        assert not scope.cancel_called and not scope.cancelled_caught
        assert _cancel_requests() == 0


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_reused_waiter_cancels_only_a_read_past_its_due_time() -> None:
    # A stream re-arms one waiter per read: each read only records its due time.
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    timer = Waiter(DeadlineWatch(loop))
    try:
        # A read that finishes in time is left alone.
        timer.start(task, loop.time() + 5.0)
        await asyncio.sleep(0)
        timer.stop()
        assert task.cancelling() == 0
        # A read that waits past its due time is cancelled, and the timer claims it.
        timer.start(task, loop.time() + 0.05)
        with pytest.raises(asyncio.CancelledError):
            await asyncio.Event().wait()
        assert timer.expired()
        timer.stop()
        assert task.cancelling() == 0
        # A cancellation from elsewhere is not the timer's.
        timer.start(task, loop.time() + 5.0)
        loop.call_soon(task.cancel)
        with pytest.raises(asyncio.CancelledError):
            await asyncio.Event().wait()
        assert not timer.expired()
        timer.stop()
        assert task.uncancel() == 0
    finally:
        timer.stop()


async def _wait_forever() -> None:
    await asyncio.Event().wait()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_deadline_watch_cancels_each_task_at_its_own_deadline() -> None:
    # One timer for every watched task: a task added later with an earlier deadline
    # re-arms it; when it fires, only the due task is cancelled, and the watch claims it.
    loop = asyncio.get_running_loop()
    watch = DeadlineWatch(loop)
    late = asyncio.ensure_future(_wait_forever())
    early = asyncio.ensure_future(_wait_forever())
    await asyncio.sleep(0)
    late_entry = watch_wait(watch, late, loop.time() + 3600.0)
    early_entry = watch_wait(watch, early, loop.time() + 0.05)
    with anyio.fail_after(30):
        with pytest.raises(asyncio.CancelledError):
            await early
    assert early_entry.fired
    assert not late.done() and not late_entry.fired
    # The watch re-armed for the task left.
    assert watch._handle is not None and watch._armed_at == late_entry.due
    late_entry.stop()
    late.cancel()
    with pytest.raises(asyncio.CancelledError):
        await late
    assert not late_entry.expired()  # a cancellation from elsewhere is not the watch's


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_deadline_watch_leaves_a_discarded_task_alone() -> None:
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    watch = deadline_watch(loop)
    assert deadline_watch(loop) is watch  # one per loop
    done = watch_wait(watch, task, loop.time() + 0.01)
    done.stop()  # the wait ended in time
    # A second wait, due later, is cancelled: by then the first one's deadline has passed.
    entry = watch_wait(watch, task, loop.time() + 0.05)
    with anyio.fail_after(30):
        with pytest.raises(asyncio.CancelledError):
            await asyncio.Event().wait()
    assert entry.expired() and not done.fired
    entry.stop()
    assert task.cancelling() == 0


def test_a_deadline_reads_the_running_loops_own_clock() -> None:
    # Deadlines are compared with loop timers, so they read the loop's clock: the base
    # loop's is time.monotonic (read directly), a loop with its own clock is asked for it.
    class OwnClock(asyncio.SelectorEventLoop):
        def time(self) -> float:
            return 1234.5

    async def both() -> tuple[float, float]:
        deadline = Deadline(Timeout(total=10))
        return deadline.now(), deadline.at

    loop = OwnClock()
    try:
        now, at = loop.run_until_complete(both())
    finally:
        loop.close()
    assert (now, at) == (1234.5, 1244.5)
    plain = asyncio.new_event_loop()
    try:
        now, _ = plain.run_until_complete(both())
        assert abs(now - plain.time()) < 60.0  # the same clock, read a moment apart
    finally:
        plain.close()
