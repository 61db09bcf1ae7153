"""Client: the blocking twin of :class:`~swiftclient.AsyncClient`, for scripts, notebooks
and threads.

A :class:`Client` owns one event loop, run by anyio's blocking portal in one background
thread for the client's whole life. Every method hands its work to that loop and waits for
the result, so the connection pools stay bound to one loop, any number of threads may call
at once, and every policy of the async client (deadline, retries, hedging, telemetry)
applies unchanged. A stream runs in one task on the loop that feeds its chunks to the
calling thread as they arrive.

The methods that only wait on their async twins are generated (:func:`_blocking` and
:func:`_on_loop`), keeping the twins' parameters, types and docstrings.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import os
import queue
import threading
import time
import weakref
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Coroutine,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from types import TracebackType
from typing import Any, Concatenate, Generic, Literal, ParamSpec, TypeVar, overload

import anyio
import anyio.from_thread
from anyio.from_thread import BlockingPortal

from . import errors
from ._attempt import AttemptObserver
from ._batch import BatchProgress, BatchRequest, BatchResult
from ._client import NOT_GIVEN, AsyncClient, ModelInput, NotGiven, RouterLike
from ._cost import Pricing
from ._deadline import Timeout
from ._messages import MessagesInput
from ._policies import PolicyHub
from ._retry import RetryPolicy
from ._stream import ChatStream
from .admission import Admission, Limits, RedisStore, TargetHealth
from .backends.base import Backend
from .hedging import Hedge
from .telemetry import Telemetry
from .types import ChatCompletion, ChatCompletionChunk, ChatRequest, Timing

__all__ = ["Client", "SyncChatStream"]

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")
Item = TypeVar("Item")

_THREAD_NAME = "swiftclient-loop"

#: The longest the main thread blocks at a time while it waits on the loop. CPython runs a
#: signal's Python handler (Ctrl-C's ``KeyboardInterrupt``) in the main thread only, and
#: only once that thread runs again: a SIGINT whose C handler ran on another thread, or
#: that landed just as the main thread let go of the GIL to block, leaves it asleep in an
#: untimed wait for as long as the call runs (seen as a rare hang of the Ctrl-C test). A
#: timed wait wakes it, and taking the GIL back makes it see the pending signal.
_SIGNAL_SLICE_S = 0.1
#: How long close() waits, in all, for the loop's worker threads to end (work abandoned on
#: cancellation may still be running there).
_WORKER_JOIN_S = 30.0


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _result(future: concurrent.futures.Future[R]) -> R:
    """``future.result()``; in the main thread the wait is cut into slices of
    :data:`_SIGNAL_SLICE_S` so that a Ctrl-C is seen while it waits."""
    if _in_main_thread():
        while not _settled(future, _SIGNAL_SLICE_S):
            pass
    return future.result()


def _settled(future: concurrent.futures.Future[Any], timeout: float) -> bool:
    """Whether ``future`` finished (or was cancelled) within ``timeout`` seconds."""
    try:
        future.exception(timeout)  # returns (not raises) the call's own exceptions
    except concurrent.futures.TimeoutError:
        return False
    except concurrent.futures.CancelledError:
        pass
    return True


def _next_item(items: queue.SimpleQueue[Item]) -> Item:
    """``items.get()``; in slices in the main thread, as :func:`_result`."""
    if not _in_main_thread():
        return items.get()
    while True:
        try:
            return items.get(timeout=_SIGNAL_SLICE_S)
        except queue.Empty:
            pass


def _wait(event: threading.Event) -> None:
    """``event.wait()``; in slices in the main thread, as :func:`_result`."""
    timeout = _SIGNAL_SLICE_S if _in_main_thread() else None
    while not event.wait(timeout):
        pass


class _Loop:
    """The client's event loop: a blocking portal in its own thread, with the
    :class:`AsyncClient` entered on it. Holds no reference to the :class:`Client`, so a
    finalizer can close it once the client is gone."""

    def __init__(self, make: Callable[[], AsyncClient]) -> None:
        self.closed = False
        self.forked = False
        self._closing = threading.Lock()  # one close at a time
        self._shut = False  # the client exited and the thread stopped: close is done
        self._client_exited = False
        self._inflight: set[concurrent.futures.Future[Any]] = set()
        ready: concurrent.futures.Future[BlockingPortal] = concurrent.futures.Future()
        abandoned = threading.Event()
        self._thread = threading.Thread(
            target=self._serve, args=(ready, abandoned), name=_THREAD_NAME, daemon=True
        )
        entered = False
        try:
            self._thread.start()
            portal = self.portal = _result(ready)
            self.aclient = portal.call(make)
            self._client_cm = portal.wrap_async_context_manager(self.aclient)
            self._client_cm.__enter__()
            entered = True
            self.aloop, self.thread_id = portal.call(_loop_and_thread)
        except BaseException as exc:
            # Failed, or interrupted (a Ctrl-C) anywhere in here: leave no loop thread and no
            # entered client behind (they ran on for ever: fault run).
            abandoned.set()
            if ready.done() and ready.exception() is None:
                self.portal = ready.result()
                try:
                    if entered:
                        self._client_exited = True
                        self._client_cm.__exit__(None, None, None)
                except Exception as cleanup:  # the first error stays the one raised
                    exc.add_note(f"closing the client after this also failed: {cleanup!r}")
                finally:  # a backend whose close fails must not keep the thread alive
                    self._stop()
            raise  # else the thread sees `abandoned` once it has a portal, and ends

    @staticmethod
    def _serve(
        ready: concurrent.futures.Future[BlockingPortal], abandoned: threading.Event
    ) -> None:
        """The loop thread: run a blocking portal until it is stopped (at once when the
        constructor gave up before the portal was there)."""

        async def main() -> None:
            async with BlockingPortal() as portal:
                ready.set_result(portal)
                if not abandoned.is_set():
                    await portal.sleep_until_stopped()

        try:
            anyio.run(main, backend="asyncio")
        except BaseException as exc:  # pragma: no cover - the loop failed to start
            if not ready.done():
                ready.set_exception(exc)

    @property
    def shut(self) -> bool:
        """Whether the close is done: the client exited and the loop thread stopped."""
        return self._shut

    def on_loop_thread(self) -> bool:
        """Whether the caller is the loop's own thread (which must never wait on the loop)."""
        return threading.get_ident() == self.thread_id

    def unusable(self) -> errors.ConfigurationError:
        """The error for a call the loop cannot take (closed, forked, or its own thread)."""
        if self.forked:
            return errors.ConfigurationError(
                "this Client was created in the parent process before a fork; create a new "
                "Client in the child"
            )
        if self.closed:
            return errors.ClientClosedError("this Client is closed")
        return errors.ConfigurationError(
            "a Client cannot be called from its own event loop (an observer or a callback "
            "of a call): use its AsyncClient there, or another thread"
        )

    def submit(self, func: Callable[[], Awaitable[R]]) -> concurrent.futures.Future[R]:
        """Start ``func()`` as a task on the loop; its future."""
        if self.closed or self.forked:
            raise self.unusable()
        try:
            return self.portal.start_task_soon(func)
        except RuntimeError as exc:  # stopped by a close in another thread, or our own thread
            raise self.unusable() from exc

    def run(self, func: Callable[[], Coroutine[Any, Any, R]]) -> R:
        """Run ``func()`` on the loop and wait for its result. Interrupted while waiting (a
        ``KeyboardInterrupt``), the task is cancelled: it releases what it holds and the
        loop carries on serving other calls.

        The hot path: one wake-up of the loop and one of the caller (the portal's
        ``start_task_soon`` waits for the task to be spawned first, a second round trip).
        The task is a plain asyncio task, tracked so that :meth:`close` cancels it.
        """
        if self.closed or self.forked or self.on_loop_thread():
            raise self.unusable()
        future: concurrent.futures.Future[R] = concurrent.futures.Future()
        aloop = self.aloop

        def start() -> None:  # on the loop
            if future.cancelled():
                return
            try:
                coroutine = func()  # wrong arguments raise here, on the loop
            except BaseException as exc:
                future.set_exception(exc)
                return
            task = aloop.create_task(coroutine)
            task.add_done_callback(functools.partial(_settle, future))
            future.add_done_callback(functools.partial(_cancel_task, aloop, task))

        inflight = self._inflight
        inflight.add(future)
        try:
            aloop.call_soon_threadsafe(start)
            if self.closed:  # closed in between: the sweep may have missed this call
                future.cancel()
            return _result(future)
        except concurrent.futures.CancelledError:
            if self.closed:
                raise errors.ClientClosedError(
                    "the Client was closed while this call was running"
                ) from None
            raise
        except RuntimeError as exc:  # the loop closed under call_soon_threadsafe
            if self.closed and not future.done():
                raise self.unusable() from exc
            raise
        except BaseException:
            future.cancel()  # a no-op when the task itself raised
            raise
        finally:
            inflight.discard(future)

    def call_soon(self, func: Callable[[], object]) -> None:
        """Schedule ``func()`` on the loop without waiting (from any thread, the loop's too);
        nothing happens once the loop is closed."""
        if self.closed or self.forked:
            return
        try:
            self.aloop.call_soon_threadsafe(func)
        except RuntimeError:  # the loop stopped in between
            pass

    def close(self) -> None:
        """Close the async client (its pools, engines), cancel what still runs and stop the
        loop thread (idempotent; after an interrupted close, a second one finishes it)."""
        self.closed = True  # from here on, new calls are refused
        if self.forked:  # the loop thread exists in the parent only
            return
        if self.on_loop_thread():  # collected on the loop itself: it cannot wait for itself
            threading.Thread(target=self._shutdown, name=f"{_THREAD_NAME}-close").start()
            return
        self._shutdown()

    def _shutdown(self) -> None:
        with self._closing:
            if self._shut:
                return
            try:
                if not self._client_exited:
                    self._client_exited = True  # an interrupted exit goes on on the loop
                    self._client_cm.__exit__(None, None, None)
            finally:
                for future in list(self._inflight):
                    future.cancel()  # their tasks are cancelled on the loop
                try:  # after the calls: none is then halfway through a round trip to it
                    self._close_store_connections()
                finally:
                    self._stop()
            self._shut = True

    def _close_store_connections(self) -> None:
        """A shared admission store's connections on this loop, which ends here: closed
        (the store is the caller's, and stays open; left, they warned at exit)."""
        admission = self.aclient.admission
        if admission is not None and isinstance(admission.store, RedisStore):
            self.portal.call(admission.store.aclose_loop)

    def _stop(self) -> None:
        """Stop the portal, cancelling the calls still running, and join the thread and the
        loop's worker threads."""
        try:
            self.portal.call(self.portal.stop, True)
        except RuntimeError:  # pragma: no cover - already stopped
            pass
        self._thread.join()
        # The loop's worker threads (anyio.to_thread: the local engine's steps) were told to
        # end when the loop did, but may still be freeing their last work item (a step's
        # tensors) after its result came back. A caller that goes on to exit the interpreter
        # must not race them: a daemon thread inside torch's deallocator when the interpreter
        # finalizes aborts the process ("terminate called without an active exception").
        loop = getattr(self, "aloop", None)
        me = threading.current_thread()
        deadline = time.monotonic() + _WORKER_JOIN_S
        for thread in threading.enumerate():
            if loop is not None and thread is not me and getattr(thread, "loop", None) is loop:
                thread.join(max(0.0, deadline - time.monotonic()))


def _settle(future: concurrent.futures.Future[Any], task: asyncio.Task[Any]) -> None:
    """Hand a finished task's outcome to the waiting caller (on the loop)."""
    if future.cancelled():
        return
    try:
        if task.cancelled():
            future.cancel()
        elif (exc := task.exception()) is not None:
            future.set_exception(exc)
        else:
            future.set_result(task.result())
    except concurrent.futures.InvalidStateError:  # cancelled by the caller meanwhile
        pass


def _cancel_task(
    aloop: asyncio.AbstractEventLoop,
    task: asyncio.Task[Any],
    future: concurrent.futures.Future[Any],
) -> None:
    """The caller cancelled (an interrupt, or the client closing): cancel the task."""
    if future.cancelled() and not task.done():
        try:
            aloop.call_soon_threadsafe(task.cancel)
        except RuntimeError:  # the loop is closed: nothing left to cancel
            pass


def _loop_and_thread() -> tuple[asyncio.AbstractEventLoop, int]:
    return asyncio.get_running_loop(), threading.get_ident()


_LOOPS: weakref.WeakSet[_Loop] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """A forked child has the parent's clients but not their loop threads: mark them so that
    calls raise a clear error instead of waiting forever, and so that nothing tries to
    stop a thread that is not there."""
    for loop in list(_LOOPS):
        loop.forked = True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


# ---------------------------------------------------------------------- generated wrappers


def _blocking(
    method: Callable[Concatenate[AsyncClient, P], Coroutine[Any, Any, R]],
) -> Callable[Concatenate[Client, P], R]:
    """The blocking twin of an ``async`` method of :class:`AsyncClient`: it runs the method
    on the client's loop and waits for its result."""

    def wrapper(self: Client, /, *args: P.args, **kwargs: P.kwargs) -> R:
        loop = self._loop
        return loop.run(functools.partial(method, loop.aclient, *args, **kwargs))

    functools.update_wrapper(wrapper, method)
    wrapper.__qualname__ = f"Client.{method.__name__}"
    return wrapper


def _on_loop(
    method: Callable[Concatenate[AsyncClient, P], R], *, after_close: bool = False
) -> Callable[Concatenate[Client, P], R]:
    """A plain method of :class:`AsyncClient`, run on the client's loop thread (where the
    state it reads lives) and waited for. ``after_close``: once the client's close is done
    (its loop thread gone, so nothing else touches that state) it runs on the caller's
    thread; counters stay readable after ``close()``."""

    async def run(aclient: AsyncClient, *args: Any, **kwargs: Any) -> R:
        return method(aclient, *args, **kwargs)

    def wrapper(self: Client, /, *args: P.args, **kwargs: P.kwargs) -> R:
        loop = self._loop
        if after_close and loop.shut:
            return method(loop.aclient, *args, **kwargs)
        return loop.run(functools.partial(run, loop.aclient, *args, **kwargs))

    functools.update_wrapper(wrapper, method)
    wrapper.__qualname__ = f"Client.{method.__name__}"
    return wrapper


# ---------------------------------------------------------------------- iteration in one task

_OPENED = object()
_END = object()


class _Failed:
    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class _Pump(Generic[Item]):
    """Enters an async context manager and iterates it in ONE task on the client's loop
    (so every backend's cancel scopes open and close in the task that made them), putting
    each item on a queue the calling thread reads as it arrives.

    :meth:`stop` (any thread) ends it early: before the source is entered it cancels the
    opening; after, it cancels the iteration only, so the source exits as after a
    ``break`` (no error), releasing its connection. :attr:`done` is set once the source has
    exited.
    """

    def __init__(
        self,
        loop: _Loop,
        source: Callable[[], AbstractAsyncContextManager[AsyncIterator[Item]]],
    ) -> None:
        self._loop = loop
        self._source = source
        self.items: queue.SimpleQueue[object] = queue.SimpleQueue()
        self.done = threading.Event()
        self._stopped = False
        self._scope: anyio.CancelScope | None = None

    def start(self) -> None:
        """Start the task on the loop (returns once the portal has spawned it). Interrupted
        while the portal spawns it (a ``KeyboardInterrupt``), the task is stopped: a stop
        scheduled after the spawn runs after it on the loop, and one scheduled before it
        marks the pump stopped before the task's first step."""
        try:
            self._loop.submit(self._run)
        except BaseException:
            self.stop()
            raise

    def open(self) -> None:
        """Wait until the source is entered (raises what entering it raised); interrupted
        while waiting, or anywhere in here, the task is stopped."""
        try:
            self.opened()
        except BaseException:
            self.stop()
            raise

    async def _run(self) -> None:
        put = self.items.put
        try:
            with anyio.CancelScope() as opening:
                self._scope = opening
                if self._stopped:
                    opening.cancel()
                async with self._source() as iterator:
                    put(_OPENED)
                    with anyio.CancelScope() as reading:
                        self._scope = reading
                        if self._stopped:
                            reading.cancel()
                        async for item in iterator:
                            put(item)
            put(_END)
        except anyio.get_cancelled_exc_class():  # the client closing
            put(_Failed(errors.ClientClosedError("the Client was closed while this ran")))
            raise
        except BaseException as exc:
            put(_Failed(exc))
        finally:
            self._scope = None
            self.done.set()

    def _cancel(self) -> None:  # on the loop
        self._stopped = True
        if self._scope is not None:
            self._scope.cancel()

    def stop(self) -> None:
        """End the iteration (and the opening, if still running) soon; returns at once."""
        self._loop.call_soon(self._cancel)

    def opened(self) -> None:
        """Wait until the source is entered; raises what entering it raised."""
        item = self._get()
        if item is _END:  # stopped before it opened
            raise errors.ConfigurationError("the stream was closed before it opened")

    def next(self) -> Item | None:
        """The next item, or None at the end (waits for it; raises what the source raised)."""
        item = self._get()
        if item is _END:
            self.items.put(_END)  # the end stays the end
            return None
        return item  # type: ignore[return-value]

    def _take(self) -> object:
        if self._loop.forked:  # the loop stayed in the parent: only what came before the fork
            try:
                return self.items.get_nowait()
            except queue.Empty:
                raise self._loop.unusable() from None
        return _next_item(self.items)

    def _get(self) -> object:
        try:
            item = self._take()
        except BaseException:
            self.stop()  # interrupted while waiting: the task should not run on for nobody
            raise
        if type(item) is _Failed:
            self.items.put(item)  # later reads see the same error
            raise item.exc
        return item

    def close(self) -> None:
        """Stop and wait until the source has exited (its connection released)."""
        if not self.done.is_set():
            self.stop()
            if not self._loop.on_loop_thread() and not self._loop.forked:
                _wait(self.done)


class SyncChatStream:
    """A streamed chat completion from :meth:`Client.stream`:
    ``with client.stream(...) as stream: for chunk in stream: ...``.

    The chunks are read in one task on the client's loop and handed over as they arrive.
    Iterate it for typed chunks, :meth:`text` for text only, and :meth:`final` for the
    assembled completion; ``timing`` fills in as chunks arrive. Leaving the block early,
    or dropping an unfinished stream, releases the connection (or the local engine's
    request). Iterating without a ``with`` block opens the stream on the first read.
    A stream is for one thread at a time.
    """

    def __init__(self, loop: _Loop, stream: ChatStream) -> None:
        self._loop = loop
        self._stream = stream
        self._pump: _Pump[ChatCompletionChunk] | None = None
        self._finalizer: weakref.finalize[[], SyncChatStream] | None = None
        self._completion: ChatCompletion | None = None

    def _open(self) -> _Pump[ChatCompletionChunk]:
        pump = self._pump
        if pump is None:
            stream = self._stream
            pump = _Pump(self._loop, lambda: stream)
            # Dropped unfinished, the stream still gives its connection back (registered
            # before the task starts, so no interrupt can leave a task nobody stops).
            self._finalizer = weakref.finalize(self, pump.stop)
            pump.start()
            self._pump = pump
            pump.open()
        return pump

    def __enter__(self) -> SyncChatStream:
        self._open()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Release the stream's connection or engine request and wait until it is released
        (idempotent)."""
        pump = self._pump
        if pump is not None:
            pump.close()
            if self._finalizer is not None:
                self._finalizer.detach()

    @property
    def timing(self) -> Timing:
        """What was measured so far."""
        return self._stream.timing

    @property
    def request(self) -> ChatRequest:
        """The request as sent by the committed attempt (model without its backend prefix)."""
        return self._stream.request

    def __iter__(self) -> Iterator[ChatCompletionChunk]:
        return self

    def __next__(self) -> ChatCompletionChunk:
        chunk = self._open().next()
        if chunk is None:
            raise StopIteration
        return chunk

    def text(self) -> Iterator[str]:
        """Iterate over content text only (empty deltas skipped)."""
        for chunk in self:
            text = chunk.text
            if text:
                yield text

    def partial(self) -> ChatCompletion:
        """The completion assembled from the chunks read so far (what came before a stream
        broke; ``finish_reason`` None until its finish arrived). No I/O."""
        return self._stream.partial()

    def final(self) -> ChatCompletion:
        """Consume what is left and return the assembled completion, with timing (the
        error that broke the stream, raised again, if one did: :meth:`partial` gives what
        came)."""
        if self._completion is None:
            for _ in self:
                pass
            self.close()  # the task is done with the stream: it is over, nothing is left to read
            # Assembled in this thread: no round trip to the loop, which may be closed by now.
            completion = self._stream._assembled()
            self._completion = (
                completion if completion is not None else self._loop.run(self._stream.final)
            )
        return self._completion


class _BatchResults(AbstractContextManager[Iterator[BatchResult]]):
    """``with client.batch_iter(...) as results: for result in results``."""

    def __init__(
        self,
        loop: _Loop,
        source: Callable[[], AbstractAsyncContextManager[AsyncIterator[BatchResult]]],
    ) -> None:
        self._loop = loop
        self._source = source
        self._pump: _Pump[BatchResult] | None = None

    def __enter__(self) -> Iterator[BatchResult]:
        pump = _Pump(self._loop, self._source)
        pump.start()
        self._pump = pump
        pump.open()
        return self._results(pump)

    @staticmethod
    def _results(pump: _Pump[BatchResult]) -> Iterator[BatchResult]:
        while (result := pump.next()) is not None:
            yield result

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._pump is not None:
            self._pump.close()


# ---------------------------------------------------------------------- the client


class Client:
    """The blocking client, for scripts, notebooks and threads: ``client.chat(...)``.

    It takes the same arguments as :class:`AsyncClient` and offers the same calls, each
    blocking until done: :meth:`chat`, :meth:`stream` (``with ... as stream: for chunk in
    stream``), :meth:`batch`, :meth:`batch_iter`, :meth:`warmup`, :meth:`stats`,
    :meth:`cache_stats`, :meth:`health`, :meth:`close`. It runs an :class:`AsyncClient` on
    one event loop in one background thread that it owns for its whole life, so its
    connection pools stay bound to that loop and any number of threads may call it at once;
    errors are the same typed errors.

    Close it (``with Client(...) as client:`` or :meth:`close`); a client dropped unclosed
    is closed when it is garbage-collected or at interpreter exit, without warnings or a
    leftover thread. A client does not cross a ``fork``: in the child, calls raise
    :class:`ConfigurationError`; create the client in the child.
    """

    def __init__(
        self,
        backend: Backend | None = None,
        *,
        backends: Mapping[str, Backend] | None = None,
        default_backend: str | None = None,
        model: str | None = None,
        timeout: Timeout | float | None | NotGiven = NOT_GIVEN,
        retry: RetryPolicy | None = None,
        stream_chat: bool = True,
        hedge: Hedge | None = None,
        observers: Sequence[AttemptObserver] = (),
        policies: PolicyHub | None = None,
        router: RouterLike | None = None,
        pricing: Pricing | None = None,
        telemetry: Telemetry | None | NotGiven = NOT_GIVEN,
        limits: Limits | Mapping[str, Limits] | Admission | None = None,
    ) -> None:
        make = functools.partial(
            AsyncClient,
            backend,
            backends=backends,
            default_backend=default_backend,
            model=model,
            timeout=timeout,
            retry=retry,
            stream_chat=stream_chat,
            hedge=hedge,
            observers=observers,
            policies=policies,
            router=router,
            pricing=pricing,
            telemetry=telemetry,
            limits=limits,
        )
        loop = _Loop(make)
        try:
            self._loop = loop
            _LOOPS.add(loop)
            self._finalizer = weakref.finalize(self, loop.close)
        except BaseException:  # a Ctrl-C before the finalizer holds the loop: nothing would
            loop.close()  # ever close it
            raise

    def __repr__(self) -> str:
        aclient = self._loop.aclient
        return f"Client(backends={sorted(aclient.backends)}, default={aclient._default!r})"

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close every backend (pools, engines, connections), cancel calls still running
        (they raise :class:`ConfigurationError`) and stop the loop thread. Idempotent; a close
        that a Ctrl-C cut short can be called again to finish."""
        self._loop.close()
        self._finalizer.detach()

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran (or the client was closed at exit)."""
        return self._loop.closed

    @property
    def aclient(self) -> AsyncClient:
        """The :class:`AsyncClient` underneath; it lives on the client's loop thread, so use
        it only from code that runs there (an observer, say)."""
        return self._loop.aclient

    @property
    def backends(self) -> dict[str, Backend]:
        """The configured backends by name."""
        return self._loop.aclient.backends

    @property
    def pricing(self) -> Pricing | None:
        """The prices calls are costed with (``None``: counts only)."""
        return self._loop.aclient.pricing

    warmup = _blocking(AsyncClient.warmup)

    @overload
    def health(self, *, detail: Literal[False] = False) -> dict[str, str]: ...

    @overload
    def health(self, *, detail: Literal[True]) -> dict[str, TargetHealth]: ...

    def health(self, *, detail: bool = False) -> dict[str, str] | dict[str, TargetHealth]:
        """See :meth:`AsyncClient.health`."""
        return self._health(detail)

    _health = _on_loop(AsyncClient._health_any)
    stats = _on_loop(AsyncClient.stats, after_close=True)
    cache_stats = _on_loop(AsyncClient.cache_stats, after_close=True)
    targets = _on_loop(AsyncClient.targets)

    # ------------------------------------------------------------------ calls

    @overload
    def chat(
        self,
        messages: MessagesInput,
        *,
        model: ModelInput = ...,
        response_model: None = ...,
        timeout: Timeout | float | None | NotGiven = ...,
        retry: RetryPolicy | None = ...,
        hedge: Hedge | None | NotGiven = ...,
        task: str | None = ...,
        stream: bool | None = ...,
        extra_headers: Mapping[str, str] | None = ...,
        **params: Any,
    ) -> ChatCompletion: ...

    @overload
    def chat(
        self,
        messages: MessagesInput,
        *,
        model: ModelInput = ...,
        response_model: type[T],
        timeout: Timeout | float | None | NotGiven = ...,
        retry: RetryPolicy | None = ...,
        hedge: Hedge | None | NotGiven = ...,
        task: str | None = ...,
        stream: bool | None = ...,
        extra_headers: Mapping[str, str] | None = ...,
        **params: Any,
    ) -> T: ...

    def chat(
        self,
        messages: MessagesInput,
        *,
        model: ModelInput = None,
        response_model: type[T] | None = None,
        timeout: Timeout | float | None | NotGiven = NOT_GIVEN,
        retry: RetryPolicy | None = None,
        hedge: Hedge | None | NotGiven = NOT_GIVEN,
        task: str | None = None,
        stream: bool | None = None,
        extra_headers: Mapping[str, str] | None = None,
        **params: Any,
    ) -> ChatCompletion | T:
        """Run one chat completion and return it (as :meth:`AsyncClient.chat`, blocking).

        With ``response_model``, the validated value is returned instead (see
        :meth:`AsyncClient.chat`). A ``Conversation`` is sent like any message list;
        ``conversation.send(client)`` also appends the reply.
        """
        loop = self._loop
        return loop.run(
            functools.partial(
                loop.aclient.chat,
                messages,
                model=model,
                response_model=response_model,
                timeout=timeout,
                retry=retry,
                hedge=hedge,
                task=task,
                stream=stream,
                extra_headers=extra_headers,
                **params,
            )
        )

    def stream(
        self,
        messages: MessagesInput,
        *,
        model: ModelInput = None,
        timeout: Timeout | float | None | NotGiven = NOT_GIVEN,
        retry: RetryPolicy | None = None,
        hedge: Hedge | None | NotGiven = NOT_GIVEN,
        task: str | None = None,
        extra_headers: Mapping[str, str] | None = None,
        **params: Any,
    ) -> SyncChatStream:
        """Open a streamed chat: ``with client.stream(messages, model=...) as stream``
        (arguments as :meth:`AsyncClient.stream`; bad ones raise here)."""
        loop = self._loop

        async def make() -> ChatStream:
            return loop.aclient.stream(
                messages,
                model=model,
                timeout=timeout,
                retry=retry,
                hedge=hedge,
                task=task,
                extra_headers=extra_headers,
                **params,
            )

        return SyncChatStream(loop, loop.run(make))

    def batch(
        self,
        requests: Iterable[BatchRequest],
        *,
        concurrency: int = 8,
        on_progress: Callable[[BatchProgress], object] | None = None,
        min_shared_bytes: int = 1024,
        **defaults: Any,
    ) -> list[BatchResult]:
        """Run many chats grouped by shared prompt prefix and return one
        :class:`BatchResult` per entry, in input order (as :meth:`AsyncClient.batch`;
        ``on_progress`` runs on the client's loop thread)."""
        loop = self._loop
        return loop.run(
            functools.partial(
                loop.aclient.batch,
                requests,
                concurrency=concurrency,
                on_progress=on_progress,
                min_shared_bytes=min_shared_bytes,
                **defaults,
            )
        )

    def batch_iter(
        self,
        requests: Iterable[BatchRequest],
        *,
        concurrency: int = 8,
        on_progress: Callable[[BatchProgress], object] | None = None,
        min_shared_bytes: int = 1024,
        **defaults: Any,
    ) -> AbstractContextManager[Iterator[BatchResult]]:
        """Run many chats grouped by shared prompt prefix; results as they finish:
        ``with client.batch_iter(requests) as results: for result in results``
        (arguments as :meth:`AsyncClient.batch_iter`; ``on_progress`` runs on the client's
        loop thread). Leaving the block early cancels what is still running."""
        loop = self._loop
        return _BatchResults(
            loop,
            lambda: loop.aclient.batch_iter(
                requests,
                concurrency=concurrency,
                on_progress=on_progress,
                min_shared_bytes=min_shared_bytes,
                **defaults,
            ),
        )
