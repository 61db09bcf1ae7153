"""One call's execution: attempts under one deadline, retries before the first token, timing.

:class:`ChatStream` is what ``client.stream(...)`` returns; ``client.chat(...)`` is the same
stream plus accumulation, so both share every policy.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from types import TracebackType
from typing import Literal

import anyio

from . import errors
from ._accumulate import Accumulator
from ._deadline import Deadline, ReadTimer, Timeout
from ._retry import RetryPolicy, run_with_retries
from .backends.base import Backend, BufferedChunkIterator, RequestOptions
from .types import Attempt, ChatCompletion, ChatCompletionChunk, ChatRequest, Timing

__all__ = ["Call", "ChatStream", "deadline_exceeded"]

_Limit = Literal["deadline", "idle", "first_token"]
_CLOSE_GRACE = 5.0
_current_task = asyncio.current_task


def _read_timer() -> ReadTimer | None:
    """A :class:`ReadTimer` on asyncio; None elsewhere (reads use cancel scopes there)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return None
    return ReadTimer(loop)


def deadline_exceeded(backend: str, timeout: Timeout) -> errors.DeadlineExceeded:
    """The error for a call whose total deadline ran out (one wording on every path)."""
    return errors.DeadlineExceeded(
        f"{backend}: the call's total deadline of {timeout.total}s was exceeded", backend=backend
    )


class Call:
    """Everything one call needs: where it goes, what it sends, its deadline and policy."""

    __slots__ = (
        "_now",
        "backend",
        "deadline",
        "options",
        "policy",
        "request",
        "started",
        "timing",
    )

    def __init__(
        self,
        backend: Backend,
        request: ChatRequest,
        deadline: Deadline,
        policy: RetryPolicy,
        options: RequestOptions,
    ) -> None:
        self.backend = backend
        self.request = request
        self.deadline = deadline
        self.policy = policy
        self.options = options
        self._now = deadline.now
        self.started = self._now()
        self.timing = Timing()

    def new_attempt(self, number: int) -> Attempt:
        """Record and return a new attempt."""
        attempt = Attempt(
            number=number,
            backend=self.backend.name,
            model=self.request.model,
            started=self._now() - self.started,
        )
        self.timing.attempts.append(attempt)
        return attempt

    def end_attempt(self, attempt: Attempt, exc: BaseException | None) -> None:
        """Close an attempt's record with its outcome."""
        attempt.duration = self._now() - self.started - attempt.started
        if exc is None:
            attempt.outcome = "ok"
        elif isinstance(exc, anyio.get_cancelled_exc_class()):
            attempt.outcome = "cancelled"
        else:
            attempt.outcome = "error"
            attempt.error = type(exc).__name__
            if isinstance(exc, errors.APIStatusError):
                attempt.status_code = exc.status_code

    def finish(self) -> None:
        """Stamp the call's total time."""
        self.timing.total = self._now() - self.started

    def failed(self, exc: BaseException) -> None:
        """The call is raising ``exc``: attach its attempts to an :class:`APIError`."""
        if isinstance(exc, errors.APIError):
            exc._record_attempts(self.timing.attempts)

    async def complete(self) -> ChatCompletion:
        """Run a non-streamed completion with retries under the deadline."""

        async def once(number: int) -> ChatCompletion:
            attempt = self.new_attempt(number)
            try:
                result = await self._bounded_complete()
            except BaseException as exc:
                self.end_attempt(attempt, exc)
                raise
            self.end_attempt(attempt, None)
            return result

        try:
            completion = await run_with_retries(self.policy, self.deadline, once)
        except BaseException as exc:
            self.failed(exc)
            raise
        finally:
            self.finish()
        completion.timing = self.timing
        return completion

    async def _bounded_complete(self) -> ChatCompletion:
        """One ``backend.complete`` bounded by the deadline.

        A cancel scope, not the stream's loop timer: a whole non-streamed call includes the
        backend's shielded cleanup, which only a cancel scope respects.
        """
        deadline = self.deadline
        with anyio.CancelScope(deadline=deadline.at):
            return await self.backend.complete(self.request, deadline, self.options)
        raise deadline_exceeded(self.backend.name, deadline.timeout)


class ChatStream:
    """A streamed chat completion: ``async with client.stream(...) as stream``.

    Iterate it for typed chunks, use :meth:`text` for text only, and :meth:`final` for the
    assembled completion. ``timing`` fills in as chunks arrive. Leaving the block early
    releases the connection (or the local engine's request) at once.
    """

    def __init__(self, call: Call) -> None:
        self._call = call
        self._now = call.deadline.now
        self._nowait: Callable[[], ChatCompletionChunk | None] | None = None
        self._stack: AsyncExitStack | None = None
        self._iterator: AsyncIterator[ChatCompletionChunk] | None = None
        self._buffered: list[ChatCompletionChunk] = []
        self._attempt: Attempt | None = None
        self._attempt_started = 0.0
        self._chunk_seen = False
        self._first_content_at: float | None = None
        self._last_content_at: float | None = None
        self._accumulator = Accumulator()
        self._done = False
        self._completion: ChatCompletion | None = None
        self._timer: ReadTimer | None = None

    @property
    def timing(self) -> Timing:
        """What was measured so far."""
        return self._call.timing

    @property
    def request(self) -> ChatRequest:
        """The request as sent (model without its backend prefix)."""
        return self._call.request

    # ------------------------------------------------------------------ bounded waits

    def _bound(self, now: float) -> tuple[float, _Limit]:
        """When the next wait must end (on the deadline's clock) and which limit that is."""
        call = self._call
        timeout = call.deadline.timeout
        due, kind = call.deadline.at, "deadline"
        idle = timeout.idle
        if idle is not None and self._chunk_seen and now + idle < due:
            due, kind = now + idle, "idle"
        first = timeout.first_token
        if first is not None and self._first_content_at is None:
            at = self._attempt_started + first
            if at < due:
                due, kind = at, "first_token"
        return due, kind  # type: ignore[return-value]

    def _timeout_error(self, kind: _Limit) -> errors.APITimeoutError:
        name = self._call.backend.name
        timeout = self._call.deadline.timeout
        if kind == "first_token":
            return errors.FirstTokenTimeout(
                f"{name}: no content token within {timeout.first_token}s", backend=name
            )
        if kind == "idle":
            return errors.StreamStalled(
                f"{name}: no chunk for {timeout.idle}s (stream stalled)", backend=name
            )
        return deadline_exceeded(name, timeout)

    async def _next(
        self, iterator: AsyncIterator[ChatCompletionChunk]
    ) -> ChatCompletionChunk | None:
        nowait = self._nowait
        if nowait is not None:
            # A chunk that already arrived needs no wait, so no time limit either.
            ready = nowait()
            if ready is not None:
                return ready
        return await self._wait(iterator)

    async def _wait(
        self, iterator: AsyncIterator[ChatCompletionChunk]
    ) -> ChatCompletionChunk | None:
        """The iterator's next chunk (None at its end), bounded by the limit that applies."""
        now = self._now()
        due, kind = self._bound(now)
        if due <= now:
            raise self._timeout_error(kind)
        if due == math.inf:
            try:
                return await iterator.__anext__()
            except StopAsyncIteration:
                return None
        timer = self._timer
        if timer is None:
            with anyio.CancelScope(deadline=due):
                try:
                    return await iterator.__anext__()
                except StopAsyncIteration:
                    return None
            raise self._timeout_error(kind)
        # asyncio: one lazily re-armed timer per stream instead of a cancel scope per read.
        timer.start(_current_task(), due)  # type: ignore[arg-type]
        try:
            return await iterator.__anext__()
        except StopAsyncIteration:
            return None
        except asyncio.CancelledError:
            if not timer.expired():
                raise
        finally:
            timer.stop()
        raise self._timeout_error(kind)

    # ------------------------------------------------------------------ attempts

    async def _attempt_once(self, number: int) -> None:
        call = self._call
        attempt = call.new_attempt(number)
        self._attempt_started = self._now()
        self._chunk_seen = False
        stack = AsyncExitStack()
        try:
            now = self._now()
            due, kind = self._bound(now)
            if due <= now:
                raise self._timeout_error(kind)
            with anyio.CancelScope(deadline=due) as scope:
                iterator = await stack.enter_async_context(
                    call.backend.stream(call.request, call.deadline, call.options)
                )
            if scope.cancelled_caught:
                raise self._timeout_error(kind)
            self._nowait = (
                iterator.next_nowait if isinstance(iterator, BufferedChunkIterator) else None
            )
            buffered: list[ChatCompletionChunk] = []
            while True:
                chunk = await self._next(iterator)
                if chunk is None:
                    break
                self._chunk_seen = True
                buffered.append(chunk)
                if chunk.has_content():
                    now = self._now()
                    attempt.ttft = now - self._attempt_started
                    self._mark_content(now)
                    break
        except BaseException as exc:
            with anyio.move_on_after(_CLOSE_GRACE, shield=True):
                await stack.aclose()
            call.end_attempt(attempt, exc)
            raise
        self._stack = stack
        self._iterator = iterator
        self._buffered = buffered
        self._attempt = attempt
        if chunk is None:
            self._done = True

    def _mark_content(self, now: float) -> None:
        timing = self._call.timing
        if self._first_content_at is None:
            self._first_content_at = now
            timing.ttft = now - self._call.started
        elif self._last_content_at is not None:
            timing.itl.append(now - self._last_content_at)
        self._last_content_at = now

    async def __aenter__(self) -> ChatStream:
        call = self._call
        self._timer = _read_timer()
        try:
            await run_with_retries(call.policy, call.deadline, self._attempt_once)
        except BaseException as exc:
            if self._timer is not None:
                self._timer.close()
            call.finish()
            call.failed(exc)
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose(exc)

    async def aclose(self, exc: BaseException | None = None) -> None:
        """Release the stream's connection or engine request (idempotent)."""
        stack, self._stack = self._stack, None
        if stack is None:
            return
        self._done = True
        if self._timer is not None:
            self._timer.close()
        with anyio.move_on_after(_CLOSE_GRACE, shield=True):
            await stack.aclose()
        if self._attempt is not None and self._attempt.outcome == "pending":
            self._call.end_attempt(self._attempt, exc)
        self._call.finish()

    # ------------------------------------------------------------------ iteration

    def __aiter__(self) -> ChatStream:
        return self

    async def __anext__(self) -> ChatCompletionChunk:
        if self._buffered:
            chunk = self._buffered.pop(0)
            self._accumulator.add(chunk)
            return chunk
        if self._done or self._iterator is None:
            raise StopAsyncIteration
        try:
            nowait = self._nowait
            next_chunk = nowait() if nowait is not None else None
            if next_chunk is None:
                next_chunk = await self._wait(self._iterator)
        except BaseException as exc:
            self._done = True
            if self._attempt is not None and self._attempt.outcome == "pending":
                self._call.end_attempt(self._attempt, exc)
            self._call.failed(exc)
            raise
        if next_chunk is None:
            self._done = True
            if self._attempt is not None and self._attempt.outcome == "pending":
                self._call.end_attempt(self._attempt, None)
            self._call.finish()
            raise StopAsyncIteration
        if self._accumulator.add(next_chunk):
            self._mark_content(self._now())
        return next_chunk

    def text(self) -> _TextIterator:
        """Iterate over content text only (empty deltas skipped)."""
        return _TextIterator(self)

    async def final(self) -> ChatCompletion:
        """Consume what is left and return the assembled completion, with timing."""
        if self._completion is None:
            async for _ in self:
                pass
            completion = self._accumulator.build()
            completion.timing = self._call.timing
            self._completion = completion
        return self._completion


class _TextIterator:
    """Content text of a :class:`ChatStream`."""

    __slots__ = ("_stream",)

    def __init__(self, stream: ChatStream) -> None:
        self._stream = stream

    def __aiter__(self) -> _TextIterator:
        return self

    async def __anext__(self) -> str:
        while True:
            chunk = await self._stream.__anext__()
            text = chunk.text
            if text:
                return text
