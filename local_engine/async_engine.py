"""The concurrent front end: one driver task steps the engine; each request streams.

``async with AsyncEngine(engine) as ae`` starts ONE driver task. It sleeps on an event
while there is no work; otherwise it runs the engine's steps in worker threads so the
event loop stays responsive, and hands each output to its request's mailbox. Engine
state is only touched under one lock (held by the driver for the whole step), so adds
and aborts land between steps, never during one.

With ``Engine.overlap_output`` (``EngineConfig.overlap_output``; by default on for a CUDA
model) each round runs two threads at once:
:meth:`Engine.run_step` for step n+1 (scheduling, the model, the sampled tokens) and
:meth:`Engine.process_step` for step n (detokenization, stop strings, the outputs), whose
outputs reach the mailboxes while step n+1 still runs; so this host work overlaps the
model instead of adding to each step. Without it a round is one :meth:`Engine.step`.

Backpressure policy: the driver never blocks on a consumer and never drops tokens. Each
request has a one-slot mailbox; an output that arrives while the previous one is still
unread is *merged* into it (token ids, text and logprobs concatenated). A slow consumer
therefore receives fewer, larger outputs, and the memory it can pin is bounded by its
own request's ``max_tokens``, however slow it is.

Two ways to consume a request: ``async with ae.stream(...) as outputs`` adds it on entry
(errors such as OverloadedError surface there) and aborts it on exit; ``ae.generate(...)``
wraps that in one async iterator. ``ae.stream_choices(...)`` adds the choices of one prompt
at once, sharing the prompt's KV blocks, and merges their outputs without a task. Leaving
early (break, cancellation, an error) aborts the request and frees its KV blocks right away,
or right after the step in flight.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, TypeVar

import anyio
import anyio.to_thread
from anyio.abc import TaskGroup

from local_engine.engine import Engine, RequestOutput, StepTokens
from local_engine.errors import EngineError, InvalidRequestError
from local_engine.sampler import SamplingParams

if TYPE_CHECKING:
    from local_engine.metrics import StepObserver

__all__ = ["AsyncEngine", "check_waiting_room", "run_in_worker"]

T = TypeVar("T")

logger = logging.getLogger(__name__)


class _Bell:
    """Wakes the one reader of several mailboxes (the choices of an ``n > 1`` request) when
    any of them gets an output: the reader arms it, looks at every mailbox, then waits."""

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = anyio.Event()

    def ring(self) -> None:
        self._event.set()

    def arm(self) -> None:
        """Forget rings already heard (call before looking at the mailboxes)."""
        if self._event.is_set():
            self._event = anyio.Event()

    async def wait(self) -> None:
        await self._event.wait()


class _Mailbox:
    """One request's pending output: a single slot that merges what the reader missed."""

    __slots__ = ("_bell", "_error", "_event", "_pending", "generated")

    def __init__(self, bell: _Bell | None = None) -> None:
        self._pending: RequestOutput | None = None
        self._error: BaseException | None = None
        self._event = anyio.Event()
        self._bell = bell
        self.generated = 0
        """Tokens handed to this mailbox so far (the newest output's count)."""

    def put(self, out: RequestOutput) -> None:
        self.generated = out.num_generated_tokens
        prev = self._pending
        if prev is None:
            self._pending = out
        else:
            prev.new_token_ids.extend(out.new_token_ids)
            prev.new_text += out.new_text
            if prev.logprobs is not None and out.logprobs is not None:
                prev.logprobs.extend(out.logprobs)
            prev.finished = out.finished
            prev.finish_reason = out.finish_reason
            prev.num_cached_tokens = out.num_cached_tokens
            prev.num_generated_tokens = out.num_generated_tokens
            if out.spec is not None:
                prev.spec = out.spec
        self._event.set()
        if self._bell is not None:
            self._bell.ring()

    def fail(self, error: BaseException) -> None:
        self._error = error
        self._event.set()
        if self._bell is not None:
            self._bell.ring()

    def take(self) -> RequestOutput | None:
        """The pending output, or None when there is none yet (raises a failure)."""
        out = self._pending
        if out is None:
            if self._error is not None:
                raise self._error
            return None
        self._pending = None
        return out

    async def get(self) -> RequestOutput:
        while self._pending is None:
            if self._error is not None:
                raise self._error
            await self._event.wait()
            self._event = anyio.Event()
        out, self._pending = self._pending, None
        return out


class _Choices:
    """The outputs of several requests (the choices of an ``n > 1`` request) as
    ``(index, output)`` pairs in the order they come, read by one task with no helper tasks
    (so the block that yields it needs no task group); ends when every choice finished."""

    __slots__ = ("_bell", "_live", "_mailboxes", "_next")

    def __init__(self, mailboxes: list[_Mailbox], bell: _Bell) -> None:
        self._mailboxes = mailboxes
        self._bell = bell
        self._live = [True] * len(mailboxes)
        self._next = 0

    def __aiter__(self) -> _Choices:
        return self

    async def __anext__(self) -> tuple[int, RequestOutput]:
        count = len(self._mailboxes)
        while True:
            self._bell.arm()
            for step in range(count):  # round robin, from the choice after the last one read
                index = (self._next + step) % count
                if not self._live[index]:
                    continue
                out = self._mailboxes[index].take()
                if out is not None:
                    self._next = index + 1
                    self._live[index] = not out.finished
                    return index, out
            if not any(self._live):
                raise StopAsyncIteration
            await self._bell.wait()


class _Outputs:
    """Iterates one request's outputs until the finished one."""

    __slots__ = ("_done", "_mailbox")

    def __init__(self, mailbox: _Mailbox) -> None:
        self._mailbox = mailbox
        self._done = False

    def __aiter__(self) -> _Outputs:
        return self

    async def __anext__(self) -> RequestOutput:
        if self._done:
            raise StopAsyncIteration
        out = await self._mailbox.get()
        self._done = out.finished
        return out


class _Job:
    """One call for a worker thread that keeps no reference to its function, arguments,
    result or error once the caller has taken them.

    A worker thread lets go of a call's last pieces after it has handed the result over:
    trio's thread cache of the result (until the job's frame returns), anyio's asyncio
    workers of the function and its arguments too (until their next job). If the process is
    exiting by then and those references were the last to the engine's tensors, the tensors
    are freed in that thread during interpreter finalization: torch releases the GIL to free
    them, cannot take it back, and the thread's forced exit aborts the process ("terminate
    called without an active exception", seen after a LocalBackend was entered twice on
    trio)."""

    __slots__ = ("args", "error", "fn", "value")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.fn: Callable[..., Any] | None = fn
        self.args: tuple[Any, ...] | None = args
        self.value: Any = None
        self.error: BaseException | None = None

    def __call__(self) -> None:
        fn, args = self.fn, self.args
        self.fn = self.args = None
        assert fn is not None and args is not None
        try:
            self.value = fn(*args)
        except BaseException as exc:  # handed to the caller, who raises it
            self.error = exc
        del fn, args  # freed here, in this thread, while the interpreter runs

    def take(self) -> Any:
        """The result (or raise the error), leaving the job empty."""
        value, error = self.value, self.error
        self.value = self.error = None
        if error is not None:
            raise error
        return value


def check_waiting_room(engine: Engine, count: int, what: str, param: str | None = None) -> None:
    """Refuse ``count`` requests that are added together (the choices of one request, or
    its prompts) when they are more than ``engine`` queues at once: they would never fit,
    however idle it is, and "busy" (503) would have a client retry forever."""
    limit = engine.config.max_waiting
    if count > limit:
        raise InvalidRequestError(
            f"{count} {what} are more than this engine queues at once (max_waiting={limit}); "
            f"ask for at most {limit} in one request",
            param,
        )


async def run_in_worker(fn: Callable[..., T], *args: Any) -> T:
    """``anyio.to_thread.run_sync(fn, *args)``, with nothing of the call left in the worker
    thread afterwards (see :class:`_Job`)."""
    job = _Job(fn, args)
    await anyio.to_thread.run_sync(job)
    value: T = job.take()
    return value


class AsyncEngine:
    """Serve an :class:`Engine` to many concurrent tasks (asyncio or trio)."""

    def __init__(self, engine: Engine, stats: StepObserver | None = None) -> None:
        """Wrap ``engine``; nothing runs until ``async with``. ``stats`` hears of every
        request added and released and of every step (engine metrics)."""
        self.engine = engine
        self.stats = stats
        self._mailboxes: dict[str, _Mailbox] = {}
        self._pending_aborts: set[str] = set()
        self._task_group: TaskGroup | None = None
        self._driver_scope: anyio.CancelScope | None = None
        self._accepting = False
        self._failure: BaseException | None = None

    async def __aenter__(self) -> Self:
        """Start the driver task."""
        if self._task_group is not None:
            raise EngineError("AsyncEngine is already running")
        if self.engine.driver is not None:
            raise EngineError(
                "this Engine is already served by another AsyncEngine (another LocalBackend "
                "made with from_engine, say): one serves an engine at a time; share that one"
            )
        self._lock = anyio.Lock()
        self._wakeup = anyio.Event()
        self._tick = anyio.Event()
        self._stopped = anyio.Event()
        self._driver_scope = scope = anyio.CancelScope()
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self.engine.driver = self  # released when the driver has stopped (aclose)
        self._task_group = tg
        self._accepting = True
        tg.start_soon(self._drive, scope)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        """Abort every request, stop the driver and wait for it."""
        await self.aclose()
        tg, self._task_group = self._task_group, None
        if tg is None:
            return None
        if exc is not None and not isinstance(exc, anyio.get_cancelled_exc_class()):
            # The driver has stopped; close the group cleanly so the body's own exception
            # propagates unchanged instead of wrapped in an ExceptionGroup.
            await tg.__aexit__(None, None, None)
            return None
        return await tg.__aexit__(exc_type, exc, tb)

    async def aclose(self) -> None:
        """Abort every request (their streams end with ``finish_reason="abort"``) and
        stop the driver. Idempotent: once it has run, a later call (``__aexit__`` after an
        explicit close) does nothing, so it never touches the engine again: another
        AsyncEngine may be serving it by then."""
        scope = self._driver_scope
        if scope is None:
            return
        self._accepting = False
        for request_id in list(self._mailboxes):
            self.abort(request_id)
        scope.cancel()
        with anyio.CancelScope(shield=True):
            await self._stopped.wait()
        if self._driver_scope is not scope:  # a close running beside this one finished it
            return
        self._driver_scope = None
        self._pending_aborts.clear()
        self.engine.abort_all()
        # Backstop: no stream may wait on a driver that is gone.
        for mailbox in self._mailboxes.values():
            mailbox.fail(EngineError("AsyncEngine was closed"))
        self._mailboxes.clear()
        if self.engine.driver is self:  # last: the engine is free for another AsyncEngine
            self.engine.driver = None
        self._notify()

    @asynccontextmanager
    async def stream(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        *,
        request_id: str | None = None,
        cache_salt: str | None = None,
    ) -> AsyncIterator[AsyncIterator[RequestOutput]]:
        """Add a request on entry and yield an iterator over its outputs; leaving the
        block aborts the request if it is still live (its blocks are freed at once).

        Raises (on entry):
            ValueError: bad prompt or parameters (see :meth:`Engine.add_request`).
            OverloadedError: the engine's waiting queue is full.
            EngineError: the AsyncEngine is not running or has failed.
        """
        async with self._streams(
            prompt_ids, [params], request_id=request_id, cache_salt=cache_salt
        ) as (outputs,):
            yield outputs

    @asynccontextmanager
    async def stream_choices(
        self,
        prompt_ids: Sequence[int],
        params: Sequence[SamplingParams],
        *,
        cache_salt: str | None = None,
    ) -> AsyncIterator[AsyncIterator[tuple[int, RequestOutput]]]:
        """Add one request per entry of ``params`` for the same prompt (the choices of an
        ``n > 1`` request), all between the same two steps, and yield one iterator over
        their outputs as ``(index, output)`` pairs in the order they come (read in the
        caller's task: no task is started, so the block may span any cancel scope);
        leaving the block aborts those still live.

        The first computes the prompt; the others share it (:meth:`Engine.add_request`'s
        ``shares_prompt_with``): they start once its full KV blocks are computed and take
        them from the prefix cache. Raises as :meth:`stream` does; a request refused
        leaves none of them added.
        """
        bell = _Bell()
        async with self._streams(prompt_ids, params, cache_salt=cache_salt, bell=bell) as outputs:
            yield _Choices([each._mailbox for each in outputs], bell)

    @asynccontextmanager
    async def _streams(
        self,
        prompt_ids: Sequence[int],
        params: Sequence[SamplingParams],
        *,
        request_id: str | None = None,
        cache_salt: str | None = None,
        bell: _Bell | None = None,
    ) -> AsyncIterator[list[_Outputs]]:
        if not self._accepting:
            raise EngineError("AsyncEngine is not running (use `async with AsyncEngine(...)`)")
        check_waiting_room(self.engine, len(params), "choices (n)")
        added: list[tuple[str, _Mailbox]] = []
        async with self._lock:
            if self._failure is not None:
                raise EngineError("the engine failed") from self._failure
            if not self._accepting:  # closed while this call waited for the lock
                raise EngineError("AsyncEngine is shutting down")
            try:
                for each in params:
                    rid = self.engine.add_request(
                        prompt_ids,
                        each,
                        request_id=None if added else request_id,
                        cache_salt=cache_salt,
                        shares_prompt_with=added[0][0] if added else None,
                    )
                    added.append((rid, _Mailbox(bell)))
            except BaseException:
                for rid, _ in added:
                    self.engine.abort(rid)
                raise
            self._mailboxes.update(added)
        stats = self.stats
        if stats is not None:
            for rid, _ in added:
                stats.on_add(rid, anyio.current_time())
        self._wakeup.set()
        try:
            yield [_Outputs(mailbox) for _, mailbox in added]
        finally:
            for rid, _ in added:
                if self._mailboxes.pop(rid, None) is not None:
                    self._request_abort(rid)
                if stats is not None:
                    stats.on_release(rid)

    async def generate(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        *,
        request_id: str | None = None,
        cache_salt: str | None = None,
    ) -> AsyncGenerator[RequestOutput, None]:
        """Stream a request's outputs until it finishes (:meth:`stream` as one iterator).

        The request is added when iteration starts, so errors surface from the first
        ``__anext__``. Cancelling or closing the iterator aborts the request; when
        breaking out early, close it (``contextlib.aclosing``) or use :meth:`stream`, so
        the abort does not wait for garbage collection.
        """
        async with self.stream(
            prompt_ids, params, request_id=request_id, cache_salt=cache_salt
        ) as outputs:
            async for out in outputs:
                yield out

    def abort(self, request_id: str) -> None:
        """Abort a request; its stream gets a final output with ``finish_reason="abort"``.

        Its ``num_generated_tokens`` counts the tokens the stream was handed, not a token
        the step in flight (or, with ``overlap_output``, a step not yet processed) made.
        """
        mailbox = self._mailboxes.pop(request_id, None)
        if mailbox is not None:
            seq = self.engine.scheduler.get(request_id)
            mailbox.put(
                RequestOutput(
                    request_id=request_id,
                    new_token_ids=[],
                    new_text="",
                    finished=True,
                    finish_reason="abort",
                    num_prompt_tokens=seq.num_prompt_tokens if seq else 0,
                    num_cached_tokens=(seq.num_cached_tokens or 0) if seq else 0,
                    num_generated_tokens=mailbox.generated,
                    logprobs=None,
                )
            )
        self._request_abort(request_id)

    async def wait_idle(self) -> None:
        """Wait until no request is live and every abort has been applied."""
        if self._driver_scope is None:
            return
        while self._mailboxes or self._pending_aborts or self.engine.has_unfinished():
            if self._stopped.is_set():
                return
            await self._tick.wait()

    @property
    def num_active(self) -> int:
        """Requests with an open stream."""
        return len(self._mailboxes)

    def _request_abort(self, request_id: str) -> None:
        """Abort now if no step is in flight, else right after it (synchronous: safe to
        call from ``finally`` blocks and generator finalizers)."""
        if self._lock.locked():
            self._pending_aborts.add(request_id)
            self._wakeup.set()
        else:
            self.engine.abort(request_id)
            self._notify()

    def _notify(self) -> None:
        self._tick.set()
        self._tick = anyio.Event()

    def _apply_aborts(self) -> None:
        while self._pending_aborts:
            self.engine.abort(self._pending_aborts.pop())

    async def _drive(self, scope: anyio.CancelScope) -> None:
        try:
            with scope:
                await self._loop()
        finally:
            self._stopped.set()
            self._notify()

    async def _loop(self) -> None:
        engine = self.engine
        pending: StepTokens | None = None  # run, not yet processed (overlap_output)
        pending_seconds = 0.0
        while True:
            async with self._lock:
                self._apply_aborts()
                busy = engine.has_unfinished()
                idle = not busy and pending is None
                if not idle:
                    try:
                        if engine.overlap_output:
                            pending, pending_seconds = await self._overlapped_round(
                                pending, pending_seconds, busy=busy
                            )
                        else:
                            started = anyio.current_time()
                            outputs = await run_in_worker(engine.step)
                            self._emit(outputs, anyio.current_time() - started)
                    except Exception as exc:
                        self._fail(exc)
                        return
                    finally:
                        self._apply_aborts()
            if idle:
                self._notify()
                await self._wakeup.wait()
                self._wakeup = anyio.Event()
                continue
            self._notify()

    async def _overlapped_round(
        self, pending: StepTokens | None, pending_seconds: float, *, busy: bool
    ) -> tuple[StepTokens | None, float]:
        """Run the next step (when ``busy``) and process ``pending`` at the same time, in
        two threads; return the new step's tokens and how long it ran."""
        engine = self.engine
        ran: StepTokens | None = None
        seconds = 0.0
        errors: list[Exception] = []

        async def run() -> None:
            nonlocal ran, seconds
            started = anyio.current_time()
            try:
                ran = await run_in_worker(engine.run_step)
            except Exception as exc:
                errors.append(exc)
            seconds = anyio.current_time() - started

        async with anyio.create_task_group() as tg:
            if busy:
                tg.start_soon(run)
            if pending is not None:
                try:
                    outputs = await run_in_worker(engine.process_step, pending)
                except Exception as exc:
                    errors.append(exc)
                else:
                    self._emit(outputs, pending_seconds)
        if errors:
            raise errors[0]
        return ran, seconds

    def _emit(self, outputs: list[RequestOutput], seconds: float) -> None:
        """Hand a step's outputs (it ran for ``seconds``) to their mailboxes."""
        if self.stats is not None:
            self.stats.on_step(outputs, seconds, anyio.current_time())
        for out in outputs:
            mailbox = self._mailboxes.get(out.request_id)
            if mailbox is not None:
                mailbox.put(out)
                if out.finished:
                    del self._mailboxes[out.request_id]

    @property
    def failure(self) -> BaseException | None:
        """Why a step failed (the engine then refuses every request), else None."""
        return self._failure

    def _fail(self, exc: Exception) -> None:
        """A step raised: fail every stream, drop every request, refuse new ones."""
        logger.error("the engine failed; it refuses every request from now on", exc_info=exc)
        self._failure = exc
        self._accepting = False
        for mailbox in self._mailboxes.values():
            error = EngineError(f"engine step failed: {exc!r}")
            error.__cause__ = exc
            mailbox.fail(error)
        self._mailboxes.clear()
        self.engine.abort_all()
