"""One call: its targets, one deadline shared by every attempt, and the policies that decide
when the next attempt starts and which one commits.

:class:`ChatStream` is what ``client.stream(...)`` returns; ``client.chat(...)`` is the same
stream plus accumulation, so both share every policy. Each attempt is an
:class:`~swiftclient._attempt.AttemptRun`; retries (``_retry``) wrap rounds over the targets,
and a round is one attempt (one target), a sequential fallback, or a hedged race
(``hedging``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from functools import partial
from operator import attrgetter
from types import TracebackType
from typing import TYPE_CHECKING, NamedTuple, TypeVar

from . import errors
from ._accumulate import Accumulator
from ._attempt import NO_HOOKS, AttemptResult, AttemptRun, Hook, Hooks, Target
from ._deadline import Deadline
from ._retry import RetryPolicy, retry_after
from .hedging import Hedge, Trigger, fallback, race
from .types import ChatCompletion, ChatCompletionChunk, ChatRequest, Timing, set_timing

if TYPE_CHECKING:
    from ._accounting import Accounting
    from ._canonical import CallEncoding
    from ._policies import PolicyHub
    from .admission import Admission
    from .telemetry import CallTrace, Telemetry

__all__ = ["Call", "CallRecord", "ChatStream"]

_R = TypeVar("_R")
_Run = Callable[[AttemptRun], Awaitable[_R]]
_Won = tuple[AttemptRun, _R]
_Opened = _Won[list[ChatCompletionChunk]]
_Completed = _Won[ChatCompletion]


class CallRecord(NamedTuple):
    """A finished call, frozen when it finished: what its ledger and its telemetry read
    (built once, by :meth:`Call.finish`, and only when one of them is there to read it)."""

    request: ChatRequest
    targets: Sequence[Target]
    streamed: bool
    results: tuple[AttemptResult, ...]
    """How each attempt ended, in the order they started."""
    winner: AttemptResult | None
    """The attempt the call committed to (None: none did)."""
    reply: object
    """The reply (a completion, or the stream's accumulator); None when there was none."""
    error: BaseException | None
    timing: Timing
    """The call's timing as measured (its ``cost`` is set after the ledger settles)."""


class Call:
    """Everything one call needs: its targets, request, deadline, policies and record."""

    numbered = 0
    """How many attempts it started."""
    winner = 0
    """The number of the committed attempt (0: none yet); a number, not the attempt, so
    that a call and its attempts form no reference cycle."""
    error: BaseException | None = None
    """What the call raised (set by :meth:`failed`)."""
    reply: object = None
    """The reply so far (a completion, or the stream's accumulator), for telemetry."""
    trace: CallTrace | None = None
    """The call's telemetry observer, once :meth:`begin` started one."""

    def __init__(
        self,
        targets: Sequence[Target],
        request: ChatRequest,
        deadline: Deadline,
        policy: RetryPolicy,
        *,
        call_id: str | None = None,
        encoding: CallEncoding | None = None,
        streamed: bool,
        hedge: Hedge | None = None,
        hooks: Hooks = NO_HOOKS,
        policies: PolicyHub | None = None,
        ledger: Accounting | None = None,
        tracer: Telemetry | None = None,
        admission: Admission | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        if not targets:
            raise errors.ConfigurationError("a call needs at least one target")
        self.targets = targets if isinstance(targets, list) else list(targets)
        self.request = request
        self.deadline = deadline
        self.policy = policy
        self.call_id = call_id
        """The call's idempotency key, the same on every attempt (None: none)."""
        self.encoding = encoding
        """The call's request bytes, built once and reused by every attempt."""
        self.streamed = streamed
        """Whether the caller asked for a stream (``client.stream``, or ``chat`` streaming
        under the hood): fixed when the call is made, whatever reply it ends with."""
        self.hedge = hedge
        self.hooks = hooks
        """The attempt observers' handlers (:meth:`Hooks.of`, made once by the client)."""
        self.policies = policies
        self.admission = admission
        """Rate limits each attempt waits for before it sends (None: no admission)."""
        self.ledger = ledger
        self.now = deadline.now
        self.started = deadline.started
        self.timing = Timing()
        self.results: list[AttemptResult] = []
        """How each ended attempt ended, in the order they ended (frozen)."""
        self.tracer = tracer
        self.headers = headers
        """Headers every attempt sends (the caller's ``extra_headers``; None: none)."""

    def begin(self) -> None:
        """The call starts running: its telemetry (if any) starts following it, in the
        caller's current trace context."""
        tracer, self.tracer = self.tracer, None
        if tracer is not None:
            trace = tracer.start(self)
            if trace is not None:
                self.trace = trace
                self.hooks = self.hooks.plus(trace)

    def attempt(self, target: Target, trigger: Trigger = "first") -> AttemptRun:
        """Start a new attempt on ``target``: number it, keep its record, tell observers."""
        self.numbered = number = self.numbered + 1
        request = self.request
        if request.model != target.model:
            request = request.model_copy(update={"model": target.model})
        attempt = AttemptRun(
            self,
            target,
            request,
            number,
            "retry" if trigger == "first" and number > 1 else trigger,  # a later round's first
            deadline=self.deadline,
            call_id=self.call_id,
            encoding=self.encoding,
            streamed=self.streamed,
            admission=self.admission,
            trace=self.trace,
        )
        self.timing.attempts.append(attempt.record)
        if self.headers is not None:
            attempt.options = replace(attempt.options, headers=self.headers)
        hooks, trace = self.hooks.on_start, self.trace
        if not hooks and trace is None:
            return attempt
        started = attempt.snapshot()
        for hook in hooks:
            hook(started)
        if trace is not None:
            headers = trace.headers_for(started)
            if headers:  # the call's encoding stays: every attempt reuses the bytes built once
                options = attempt.options
                attempt.options = replace(options, headers={**options.headers, **headers})
        return attempt

    def first_token(self, attempt: AttemptRun) -> None:
        """An attempt delivered its first content token (non-streamed: its whole reply):
        observers of ``on_first_token``, if any, hear of it frozen."""
        _tell(self.hooks.on_first_token, attempt)

    def commit(self, attempt: AttemptRun) -> None:
        """The call takes ``attempt``'s output; every other attempt is being cancelled."""
        self.winner = attempt.record.number
        _tell(self.hooks.on_commit, attempt)

    def ended(self, result: AttemptResult) -> None:
        """An attempt ended (it calls this once, from ``finish``): keep its frozen
        ``result`` and tell observers."""
        self.results.append(result)
        for hook in self.hooks.on_end:
            hook(result)

    def finish(self, exc: BaseException | None = None, *, now: float | None = None) -> None:
        """Stamp the call's total time and, the first time, hand its frozen
        :class:`CallRecord` to its ledger (which prices it into ``timing.cost``) and to its
        trace (with ``exc``, or the error :meth:`failed` saw). ``now``: the end, if the
        caller has just read the clock."""
        timing = self.timing
        timing.total = (self.now() if now is None else now) - self.started
        ledger, trace = self.ledger, self.trace
        if ledger is None and trace is None:
            return
        self.ledger = self.trace = None
        results = self.results
        if len(results) > 1:
            results = sorted(results, key=attrgetter("number"))  # the order they started
        won = next((r for r in results if r.number == self.winner), None)
        error = exc if exc is not None else self.error
        record = CallRecord(
            self.request,
            self.targets,
            self.streamed,
            tuple(results),
            won,
            self.reply,
            error,
            timing,
        )
        if ledger is not None:
            timing.cost = ledger.settle(record)
        if trace is not None:
            trace.end(record)

    def failed(self, exc: BaseException) -> None:
        """The call is raising ``exc``: attach its attempts to an :class:`APIError`."""
        if self.error is None:
            self.error = exc
        if isinstance(exc, errors.APIError):
            exc._record_attempts(self.timing.attempts)

    def _commit(self, result: tuple[AttemptRun, object]) -> None:
        self.commit(result[0])

    async def _discard(self, result: tuple[AttemptRun, object]) -> None:
        """Release an attempt whose output the call does not take: one that succeeded after
        another one committed (lost), or the committed one of a call cancelled before it
        returned (cancelled)."""
        attempt = result[0]
        won = self.winner == attempt.record.number
        await attempt.close(lost=not won, cancelled=won)

    # ------------------------------------------------------------------ rounds

    def open_round(self, _number: int) -> Awaitable[_Opened]:
        """Open a stream on the first target to deliver a content token."""
        return self._round(AttemptRun.open)

    def complete_round(self, _number: int) -> Awaitable[_Completed]:
        """Run a non-streamed completion on the first target to answer whole."""
        return self._round(AttemptRun.complete)

    async def _round(self, run: _Run[_R]) -> _Won[_R]:
        """One pass over the targets (open breakers skipped): one attempt, a fallback chain,
        or a hedged race; each attempt is ``run`` on an :class:`AttemptRun`."""
        targets = self.targets
        policies = self.policies
        if len(targets) > 1 and policies is not None:
            usable = policies.usable(targets)
            if self.trace is not None and len(usable) < len(targets):
                self.trace.skipped([t for t in targets if t not in usable])
            targets = usable or targets
        if len(targets) == 1:
            attempt = self.attempt(targets[0])
            return attempt, await run(attempt)
        attempts = [partial(self._start, run, t) for t in targets]
        hedge = self.hedge
        if hedge is None or hedge.max_attempts <= 1:
            return await fallback(attempts)
        if policies is not None and not self.numbered:  # the call's first round only
            policies.on_call()

        def delay(index: int) -> float:
            previous = targets[index - 1]
            if policies is None:
                return hedge.delay_for(None)
            return policies.hedge_delay(hedge, previous, self.request, streamed=self.streamed)

        trace = self.trace

        async def may_hedge() -> bool:
            if policies is None or await policies.may_hedge_async():
                return True
            if trace is not None:
                trace.hedge_refused()
            return False

        return await race(
            attempts,
            delay=delay,
            may_hedge=may_hedge,
            max_in_flight=hedge.max_attempts,
            commit=self._commit,
            discard=self._discard,
        )

    def _start(self, run: _Run[_R], target: Target, trigger: Trigger) -> Awaitable[_Won[_R]]:
        """Start an attempt on ``target`` now (numbered now); the awaitable runs it."""
        return _paired(self.attempt(target, trigger), run)

    async def run(self, round_: Callable[[int], Awaitable[_Won[_R]]]) -> _Won[_R]:
        """Begin, run ``round_`` with retries under the deadline and commit to the attempt
        that won (a non-streamed one ends then); a failure finishes the call."""
        self.begin()
        try:
            try:  # attempt 1 in this frame (one coroutine less per call); retry_after the rest
                attempt, result = await round_(1)
            except Exception as exc:
                attempt, result = await retry_after(self.policy, self.deadline, round_, exc)
            if not self.winner:
                self.commit(attempt)
            if not self.streamed:  # the reply's arrival: the attempt's end
                attempt.finish(None, now=attempt.first_token_at)
        except BaseException as exc:
            self.failed(exc)
            self.finish(exc)
            raise
        return attempt, result

    async def complete(self) -> ChatCompletion:
        """Run a non-streamed completion with retries under the deadline."""
        attempt, completion = await self.run(self.complete_round)
        self.reply = completion
        self.finish(now=attempt.first_token_at)
        set_timing(completion, self.timing)
        return completion


async def _paired(attempt: AttemptRun, run: _Run[_R]) -> _Won[_R]:
    return attempt, await run(attempt)


def _tell(hooks: tuple[Hook, ...], attempt: AttemptRun) -> None:
    """Hand ``attempt``, frozen, to ``hooks`` (frozen only when there is one)."""
    if hooks:
        frozen = attempt.snapshot()
        for hook in hooks:
            hook(frozen)


class ChatStream:
    """A streamed chat completion: ``async with client.stream(...) as stream``.

    Iterate it for typed chunks, use :meth:`text` for text only, and :meth:`final` for the
    assembled completion. ``timing`` fills in as chunks arrive. Leaving the block early
    releases the connection (or the local engine's request) at once.
    """

    def __init__(self, call: Call) -> None:
        self._call = call
        self._now = call.now
        self._attempt: AttemptRun | None = None  # the committed attempt, until closed
        self._request: ChatRequest | None = None
        self._buffered: list[ChatCompletionChunk] = []
        self._last_content_at: float | None = None
        self._accumulator = Accumulator()
        call.reply = self._accumulator
        self._done = False
        self._completion: ChatCompletion | None = None
        self._failed: Exception | None = None  # what ended the stream, when it broke
        self._failed_at: TracebackType | None = None  # its traceback where it broke

    @property
    def timing(self) -> Timing:
        """What was measured so far."""
        return self._call.timing

    @property
    def request(self) -> ChatRequest:
        """The request as sent by the committed attempt (model without its backend prefix)."""
        return self._request or self._call.request

    def _mark_content(self, now: float) -> None:
        timing = self._call.timing
        if self._last_content_at is None:
            timing.ttft = now - self._call.started
        else:
            timing.itl.append(now - self._last_content_at)
        self._last_content_at = now

    async def __aenter__(self) -> ChatStream:
        attempt, buffered = await self._call.run(self._call.open_round)
        self._attempt = attempt
        self._request = attempt.request
        self._buffered = buffered
        if attempt.first_token_at is None:
            self._done = True  # the stream ended without content
        else:
            self._mark_content(attempt.first_token_at)
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
        attempt, self._attempt = self._attempt, None
        if attempt is None:
            return
        self._done = True
        await attempt.close(exc)
        self._call.finish(exc)

    # ------------------------------------------------------------------ iteration

    def __aiter__(self) -> ChatStream:
        return self

    async def __anext__(self) -> ChatCompletionChunk:
        if self._buffered:
            chunk = self._buffered.pop(0)
            self._accumulator.add(chunk)
            return chunk
        if self._done:
            raise StopAsyncIteration
        attempt = self._attempt
        if attempt is None:
            raise errors.ConfigurationError(
                "a stream is read inside its block: "
                "`async with client.stream(...) as stream: async for chunk in stream: ...`"
            )
        try:
            # a chunk already received is taken without a coroutine; else the read waits
            next_chunk = attempt.ready()
            if next_chunk is None:
                next_chunk = await attempt.read()
        except BaseException as exc:
            self._done = True
            if isinstance(exc, Exception):
                self._failed, self._failed_at = exc, exc.__traceback__
            attempt.finish(exc)
            self._call.failed(exc)
            raise
        if next_chunk is None:
            self._done = True
            attempt.finish(None)
            self._call.finish()
            raise StopAsyncIteration
        if self._accumulator.add(next_chunk):
            self._mark_content(self._now())
        return next_chunk

    def text(self) -> _TextIterator:
        """Iterate over content text only (empty deltas skipped)."""
        return _TextIterator(self)

    async def final(self) -> ChatCompletion:
        """Consume what is left and return the assembled completion, with timing.

        A stream that broke (the error its iteration raised) raises that error again here
        rather than return the part that came (:meth:`partial` gives that); a stream closed
        early by its reader returns what was read (``finish_reason`` None).
        """
        if self._completion is None:
            async for _ in self:
                pass
        completion = self._assembled()
        assert completion is not None  # read to the end: done
        return completion

    def partial(self) -> ChatCompletion:
        """The completion assembled from the chunks read so far, with timing: what came
        before a stream broke, or a stream's progress while it is read (``finish_reason``
        None until its finish arrived). No I/O."""
        completion = self._accumulator.build()
        set_timing(completion, self._call.timing)
        return completion

    def _assembled(self) -> ChatCompletion | None:
        """The completion once the stream is over (read to its end, or closed), assembled
        here without I/O; None while chunks may still come. The blocking client's
        ``final()`` calls it from its own thread once the loop is done with the stream, so
        that a finished stream needs no loop (it may be closed by then). Raises the error
        that broke the stream, if one did."""
        if self._failed is not None:  # its traceback as it broke, not one more each time
            raise self._failed.with_traceback(self._failed_at)
        if self._completion is None:
            if not self._done:
                return None
            for chunk in self._buffered:  # left unread by a reader that closed early
                self._accumulator.add(chunk)
            self._buffered = []
            completion = self._accumulator.build()
            set_timing(completion, self._call.timing)
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
