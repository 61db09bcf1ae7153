"""One attempt of a call: exactly one backend stream (or one non-streamed request).

An :class:`AttemptRun` is given what it needs when it is made (its target and request, the
call's deadline, options, admission and trace) and holds no reference to its call. It opens
its backend stream, waits for the first content token, hands out chunks (keeping the usage
they report) and closes; every wait is bounded one way (:meth:`AttemptRun._bounded`). It
ends once, in :meth:`AttemptRun.finish`, which fills in its public record and freezes its
:class:`AttemptResult`. It reports to whoever started it through one narrow channel, an
:class:`AttemptOwner` (the call): its first token and its end (with the frozen result); the
owner keeps the result and tells every :class:`AttemptObserver` (breakers, the latency
estimator, telemetry, your own).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import AsyncExitStack
from types import MappingProxyType
from typing import TYPE_CHECKING, Literal, NamedTuple, Protocol, TypeVar

import anyio

from . import errors
from ._deadline import Deadline, Waiter, loop_waiter
from ._outcome import OUTCOME_OF, AttemptOutcome, Outcome
from ._retry import retry_after_seconds
from .admission._headers import LEARNED_HEADERS
from .backends.base import Backend, RequestOptions
from .types import Attempt, ChatCompletion, ChatCompletionChunk, ChatRequest, Message, Usage

if TYPE_CHECKING:
    from ._canonical import CallEncoding
    from .admission import Admission, Permit
    from .telemetry import CallTrace

__all__ = [
    "AttemptObserver",
    "AttemptOwner",
    "AttemptResult",
    "AttemptRun",
    "Target",
    "prompt_chars",
]

_Limit = Literal["deadline", "idle", "first_token"]
_CLOSE_GRACE = 5.0
_current_task = asyncio.current_task
_cancelled = anyio.get_cancelled_exc_class


def _is_cancellation(exc: BaseException) -> bool:
    """True for the event loop's cancellation, also when it comes wrapped in an exception
    group made of nothing else (trio's connect raises one out of its own nursery)."""
    if isinstance(exc, _cancelled()):
        return True
    if isinstance(exc, BaseExceptionGroup):
        _, rest = exc.split(_cancelled())
        return rest is None
    return False


class Target(NamedTuple):
    """Where one attempt goes: a backend, the backend's own model name, and the name the
    client registered the backend under (``AsyncClient(backends={"r0": ...})``; None: the
    backend's own ``name``)."""

    backend: Backend
    model: str
    alias: str | None = None

    @property
    def backend_name(self) -> str:
        """The backend's name as the client knows it: the first part of :attr:`name`."""
        alias = self.alias
        return self.backend.name if alias is None else alias

    @property
    def name(self) -> str:
        """``"backend/model"``, the key breakers, estimates and prices use."""
        return f"{self.backend_name}/{self.model}"


class AttemptResult(NamedTuple):
    """One attempt, frozen: what every attempt event carries (as the attempt stood then;
    ``outcome`` is ``pending`` until ``on_end``) and, once it ended, what its call keeps and
    the call's cost and telemetry are computed from. ``number``, ``started`` and ``duration``
    (seconds) are its record's (:class:`~swiftclient.types.Attempt`)."""

    number: int
    """1-based position among the call's attempts."""
    target: Target
    """Where it went (its :attr:`~Target.name` is ``"backend/model"``)."""
    trigger: Literal["first", "hedge", "fallback", "retry"]
    outcome: Outcome
    """``won`` (the call took its output), ``lost`` (another attempt committed),
    ``cancelled``, ``failed`` or ``pending`` (it has not ended)."""
    usage: Usage | None
    """Token counts the attempt reported, when it got that far (known once it ended)."""
    error: BaseException | None
    """What it failed with (``failed`` only)."""
    duration: float | None
    """Seconds from its start to its end (None while it runs)."""
    started: float
    """Seconds from the call's start to this attempt's start."""
    ttft: float | None
    """Seconds from its start to its first content token (non-streamed: to its whole
    reply); None before that."""
    streamed: bool
    """Whether it reads a stream (else it sends one non-streamed request)."""
    request: ChatRequest
    """The request it sends (addressed to its target's model)."""
    call_id: str | None
    """The same for every attempt of one call (its idempotency key): group by it."""
    call_trace: object
    """The call's telemetry observer (None without one)."""
    sent: bool = True
    """Whether its request was handed to its backend (False: it ended before that, refused
    admission or cancelled while it waited for it); a request handed over may still have
    failed before it left the client (see :func:`~swiftclient._accounting.was_sent`)."""

    @property
    def status_code(self) -> int | None:
        """The HTTP status of a failed attempt, when it had one."""
        error = self.error
        return error.status_code if isinstance(error, errors.APIStatusError) else None

    @property
    def retry_after(self) -> float | None:
        """Seconds the target asked to be left alone (``Retry-After``), when it did."""
        error = self.error
        return (
            retry_after_seconds(error.headers) if isinstance(error, errors.APIStatusError) else None
        )


class AttemptObserver(Protocol):
    """Subscribes to attempt events, each with the attempt as it stood then, frozen (an
    :class:`AttemptResult`). Handlers run inline on the call path: keep them cheap, and never
    raise (an exception from a handler propagates into the call).

    An observer that uses only some of the events may name them in a class attribute
    ``attempt_hooks`` (for example ``("on_end",)``); the others are then never called. The
    handlers are looked up when the client is built: to change them, pass another observer.
    """

    def on_start(self, attempt: AttemptResult) -> None:
        """The attempt is about to open its backend stream (or send its request)."""

    def on_first_token(self, attempt: AttemptResult) -> None:
        """The attempt delivered its first content token (non-streamed: its whole reply)."""

    def on_commit(self, attempt: AttemptResult) -> None:
        """The call committed to this attempt; every other attempt is being cancelled."""

    def on_end(self, attempt: AttemptResult) -> None:
        """The attempt ended; ``attempt.outcome`` says how (the result its call keeps)."""


class AttemptOwner(Protocol):
    """Whoever started an attempt (its call): the one channel an attempt reports through."""

    @property
    def winner(self) -> int:
        """The number of the attempt the owner committed to (0: none yet); a cancelled
        attempt ends ``lost`` when another one is it."""
        ...

    def first_token(self, attempt: AttemptRun) -> None:
        """The attempt delivered its first content token (non-streamed: its whole reply);
        the owner freezes it (:meth:`AttemptRun.snapshot`) only if someone listens."""
        ...

    def ended(self, result: AttemptResult) -> None:
        """The attempt ended (once) with ``result``; its record is filled in."""
        ...


HOOK_NAMES = ("on_start", "on_first_token", "on_commit", "on_end")

Hook = Callable[[AttemptResult], None]


class Hooks(NamedTuple):
    """The observers' handlers by event, in observer order: only those an observer uses
    (its ``attempt_hooks``, when it names them), so an event with nothing to do costs a
    loop over an empty tuple."""

    on_start: tuple[Hook, ...]
    on_first_token: tuple[Hook, ...]
    on_commit: tuple[Hook, ...]
    on_end: tuple[Hook, ...]

    @classmethod
    def of(cls, observers: Iterable[AttemptObserver]) -> Hooks:
        """The handlers of ``observers``, looked up now: an observer's ``attempt_hooks``
        (a tuple, list or set of hook names; anything else is ignored, so a mock observer
        still hears every event) leaves the others out, and so does a hook method marked
        :func:`noop_hook` on the observer's class (a subclass that overrides it is heard)."""
        found: dict[str, list[Hook]] = {name: [] for name in HOOK_NAMES}
        for observer in observers:
            declared = getattr(observer, "attempt_hooks", None)
            used = declared if isinstance(declared, tuple | list | set | frozenset) else HOOK_NAMES
            kind = type(observer)
            for name in HOOK_NAMES:
                if name not in used or getattr(getattr(kind, name, None), _NOOP, False):
                    continue
                hook = getattr(observer, name, None)
                if not callable(hook):
                    raise errors.ConfigurationError(
                        f"observer {type(observer).__name__} has no {name}() method (an "
                        "AttemptObserver needs one per hook it hears, or attempt_hooks naming "
                        "those it has)"
                    )
                found[name].append(hook)
        return cls(*(tuple(found[name]) for name in HOOK_NAMES))

    def plus(self, observer: AttemptObserver) -> Hooks:
        """These handlers, then ``observer``'s."""
        return Hooks(*(mine + its for mine, its in zip(self, Hooks.of((observer,)), strict=True)))


NO_HOOKS = Hooks((), (), (), ())


_NOOP = "__swiftclient_noop_hook__"
_F = TypeVar("_F", bound=Callable[..., None])
_R = TypeVar("_R")


def noop_hook(method: _F) -> _F:
    """Mark an observer's hook method as doing nothing: calls skip it (see :class:`Hooks`)."""
    setattr(method, _NOOP, True)
    return method


_NO_HEADERS: Mapping[str, str] = MappingProxyType({})
"""The extra headers of an attempt that has none (one shared, read-only mapping)."""


class AttemptRun:
    """One attempt against one target. Its public record is ``record``
    (:class:`~swiftclient.types.Attempt`, which the call keeps in ``Timing.attempts``); how
    it ended is ``result`` (:class:`AttemptResult`, None while it runs).

    What an attempt sets on some paths only (its error, result, first token and usage, and
    what a stream holds) starts as a class default: a plain call's attempt stores only what
    it uses.
    """

    error: BaseException | None = None
    """What it failed with (set when it ends with an error)."""
    result: AttemptResult | None = None
    """How it ended, frozen (None while it runs)."""
    first_token_at: float | None = None
    """When its first content token arrived (non-streamed: its whole reply)."""
    next_nowait: Callable[[], ChatCompletionChunk | None] | None = None
    """How its stream hands out a chunk already received (None: it cannot)."""
    usage: Usage | None = None
    """Token counts from the last chunk (or the completion) it handed out that had them."""
    _stack: AsyncExitStack | None = None
    _permit: Permit | None = None
    _iterator: AsyncIterator[ChatCompletionChunk] | None = None
    _waiter: Waiter | None = None
    _chunk_seen = False
    _sent = False
    """Whether the request was handed to the backend (after admission)."""

    def __init__(
        self,
        owner: AttemptOwner,
        target: Target,
        request: ChatRequest,
        number: int,
        trigger: Literal["first", "hedge", "fallback", "retry"] = "first",
        *,
        deadline: Deadline,
        call_id: str | None = None,
        encoding: CallEncoding | None = None,
        streamed: bool = False,
        admission: Admission | None = None,
        trace: CallTrace | None = None,
    ) -> None:
        """An attempt numbered ``number`` that ``owner`` started on ``target`` with
        ``request``, bounded by the call's ``deadline`` (whose clock and start are the
        call's), sending the call's idempotency key ``call_id`` and its request bytes
        ``encoding``, reading a stream when ``streamed`` (else sending one request),
        waiting for ``admission`` when given, and telling ``trace`` how long that took."""
        self._owner = owner
        self.target = target
        self.request = request
        self._deadline = deadline
        self._now = now = deadline.now
        self._admission = admission
        self.call_trace = trace
        """The call's telemetry observer (None without one)."""
        self.call_id = call_id
        """The same for every attempt of one call (its idempotency key): group by it."""
        self.streamed = streamed
        """Whether the attempt opens a stream (its first token is a content chunk), rather
        than sending one non-streamed request."""
        self.started_at = started = now()
        alias = target.alias
        self.record = record = Attempt(
            number,
            target.backend.name if alias is None else alias,
            target.model,
            started - deadline.started,
            trigger=trigger,
        )
        self._answer = answer = _Answer(record)
        self.options = RequestOptions(call_id, _NO_HEADERS, encoding, answer)
        """What the attempt sends besides the request, with the hook that keeps its
        response's status and headers; the call adds its trace's headers once observers
        heard ``on_start``."""

    # ------------------------------------------------------------------ frozen view

    def snapshot(self) -> AttemptResult:
        """The attempt as it stands now, frozen: its ``result`` once it ended, else
        ``pending``."""
        result = self.result
        return self._frozen("pending", None) if result is None else result

    def _frozen(self, outcome: Outcome, duration: float | None) -> AttemptResult:
        record = self.record
        at = self.first_token_at
        return AttemptResult(
            record.number,
            self.target,
            record.trigger,
            outcome,
            None if duration is None else self.usage,
            self.error,
            duration,
            record.started,
            None if at is None else at - self.started_at,
            self.streamed,
            self.request,
            self.call_id,
            self.call_trace,
            self._sent,
        )

    # ------------------------------------------------------------------ outcome

    def finish(
        self,
        exc: BaseException | None,
        *,
        lost: bool = False,
        cancelled: bool = False,
        now: float | None = None,
    ) -> None:
        """End the attempt (once): fill in its record, freeze its result and report it to
        its owner, which keeps it.

        ``lost``: it succeeded, but after another attempt had committed. ``cancelled``: it
        succeeded, but the call was cancelled before taking its output (an attempt cancelled
        after the owner committed to another one is ``lost``). ``now``: when it ended, if the
        caller has just read the clock.
        """
        if self.result is not None:
            return
        duration = (self._now() if now is None else now) - self.started_at
        record = self.record
        outcome: AttemptOutcome
        if lost:
            outcome = "lost"
        elif cancelled or (exc is not None and _is_cancellation(exc)):
            outcome = "cancelled" if self._owner.winner in (0, record.number) else "lost"
        elif exc is None:
            outcome = "ok"
        else:
            target = self.target
            if isinstance(exc, errors.APIError) and target.alias is not None:
                exc._rename_backend(target.backend.name, target.alias)
            self.error = exc
            outcome = "error"
            record.error = type(exc).__name__
            if isinstance(exc, errors.APIStatusError):
                record.status_code = exc.status_code
        record.duration = duration
        record.outcome = outcome
        self.result = result = self._frozen(OUTCOME_OF[outcome], duration)
        self._owner.ended(result)

    def _first_token(self, now: float) -> None:
        self.first_token_at = now
        if self.streamed:  # a whole reply's time is the record's ``duration``
            self.record.ttft = now - self.started_at
        self._owner.first_token(self)

    # ------------------------------------------------------------------ bounded waits

    def _due(self) -> tuple[float, _Limit]:
        """When the next wait must end (on the deadline's clock) and which limit that is;
        raises that limit's error when it has already passed."""
        now = self._now()
        deadline = self._deadline
        timeout = deadline.timeout
        due = deadline.at
        kind: _Limit = "deadline"
        idle = timeout.idle
        if idle is not None and self._chunk_seen and now + idle < due:
            due, kind = now + idle, "idle"
        first = timeout.first_token
        if first is not None and self.first_token_at is None:
            at = self.started_at + first
            if at < due:
                due, kind = at, "first_token"
        if due <= now:
            raise self._timeout_error(kind)
        return due, kind

    def _timeout_error(self, kind: _Limit) -> errors.APITimeoutError:
        name = self.target.backend_name
        timeout = self._deadline.timeout
        if kind == "first_token":
            return errors.FirstTokenTimeout(
                f"{name}: no content token within {timeout.first_token}s", backend=name
            )
        if kind == "idle":
            return errors.StreamStalled(
                f"{name}: no chunk for {timeout.idle}s (stream stalled)", backend=name
            )
        return self._deadline.exceeded(name)

    def ready(self) -> ChatCompletionChunk | None:
        """The next chunk when it was already received (taken without waiting, so without
        a time limit), else None; the stream's loop awaits :meth:`read` only when this gives
        None."""
        nowait = self.next_nowait
        if nowait is None:
            return None
        chunk = nowait()
        if chunk is not None and chunk.usage is not None:
            self.usage = chunk.usage
        return chunk

    async def read(self) -> ChatCompletionChunk | None:
        """The next chunk (None at the end) after :meth:`ready` gave None: the read
        waits, bounded by the attempt's time limits."""
        iterator = self._iterator
        assert iterator is not None, "read before open()"
        due, kind = self._due()
        try:
            chunk = await self._bounded(iterator.__anext__(), due, kind, self._waiter)
        except StopAsyncIteration:
            return None
        if chunk.usage is not None:
            self.usage = chunk.usage
        return chunk

    async def _bounded(
        self, waiting: Awaitable[_R], due: float, kind: _Limit, waiter: Waiter | None
    ) -> _R:
        """Await ``waiting`` until ``due``, then raise ``kind``'s timeout error: every wait
        of an attempt is bounded here. On asyncio, with a ``waiter`` (a
        reusable entry on the loop's one :class:`~swiftclient._deadline.DeadlineWatch`),
        the wait costs a set insert and removal; without one (trio, or a wait whose cleanup
        is shielded, which a plain task cancellation would not respect) a cancel scope
        bounds it."""
        if due == math.inf:
            return await waiting
        if waiter is None:
            with anyio.CancelScope(deadline=due):
                return await waiting
            raise self._timeout_error(kind)
        waiter.start(_current_task(), due)  # type: ignore[arg-type]
        try:
            return await waiting
        except asyncio.CancelledError:
            if not waiter.expired():
                raise
        finally:
            waiter.stop()
        raise self._timeout_error(kind)

    # ------------------------------------------------------------------ lifecycle

    async def open(self) -> list[ChatCompletionChunk]:
        """Open the stream and read up to its first content token.

        Returns the chunks read so far (the last one carries the first content, unless the
        stream ended without any). On failure the stream is closed and the outcome recorded
        before the error propagates.
        """
        stack = AsyncExitStack()
        self._stack = stack
        self._waiter = loop_waiter()
        buffered: list[ChatCompletionChunk] = []
        try:
            admission = self._admission
            if admission is not None:
                await self._admit(admission)
            due, kind = self._due()
            self._sent = True
            opening = self.target.backend.stream(self.request, self._deadline, self.options)
            # A cancel scope: the backend's stream may shield its cleanup.
            iterator = await self._bounded(stack.enter_async_context(opening), due, kind, None)
            self._iterator = iterator
            # How this attempt takes a chunk that already arrived (BufferedChunkIterator).
            self.next_nowait = getattr(iterator, "next_nowait", None)
            while True:
                chunk = self.ready() or await self.read()
                if chunk is None:
                    break
                self._chunk_seen = True
                buffered.append(chunk)
                if chunk.has_content():
                    self._first_token(self._now())
                    break
        except BaseException as exc:
            await self.close(exc)
            raise
        return buffered

    async def close(
        self,
        exc: BaseException | None = None,
        *,
        lost: bool = False,
        cancelled: bool = False,
    ) -> None:
        """Release the stream (shielded, bounded) and end the attempt (idempotent)."""
        stack, self._stack = self._stack, None
        if stack is not None:
            with anyio.move_on_after(_CLOSE_GRACE, shield=True):
                await stack.aclose()
        self.finish(exc, lost=lost, cancelled=cancelled)
        if self._permit is not None:
            await self._settle()

    async def complete(self) -> ChatCompletion:
        """Run the attempt as one non-streamed request, bounded by the deadline.

        A cancel scope, which respects the backend's shielded cleanup; a backend whose
        ``complete`` has none (``complete_cancels_cleanly``, as the aiohttp-backed
        :class:`~swiftclient.HTTPBackend`) is bounded on asyncio by the loop's deadline
        watch instead, a few microseconds less per call: a plain task cancellation at any of
        its awaits leaves nothing behind.
        """
        admission = self._admission
        deadline = self._deadline
        backend = self.target.backend
        due = deadline.at
        try:
            if admission is not None:
                await self._admit(admission)
            if due <= self._now():  # the wait for admission took the deadline: nothing sent
                raise self._timeout_error("deadline")
            self._sent = True
            waiting = backend.complete(self.request, deadline, self.options)
            waiter = None
            if due != math.inf and getattr(backend, "complete_cancels_cleanly", False):
                waiter = loop_waiter()
            result = await self._bounded(waiting, due, "deadline", waiter)
            self.usage = result.usage
            self._first_token(self._now())
            return result
        except BaseException as exc:
            self.finish(exc)
            raise
        finally:
            if admission is not None:  # the capacity it held goes back, with what it learned
                await self._settle()

    # ------------------------------------------------------------------ admission

    async def _admit(self, admission: Admission) -> None:
        """Wait for capacity on the target within the call's deadline (a hedge does not
        wait: a target with no capacity now gets no hedge)."""
        name = self.target.name
        limits = admission.limits_for(name)
        body = _body_size(self.request, self.options, self.streamed)
        inputs = math.ceil(body / limits.chars_per_token)
        tokens = inputs + (self.request.max_new_tokens() or 0)
        remaining = self._deadline.bound(None)
        timeout = 0.0 if self.record.trigger == "hedge" else remaining
        trace = self.call_trace
        start = self._now()
        try:
            acquiring = admission.acquire(
                name, tokens=tokens, input_tokens=inputs, timeout=timeout, remaining=remaining
            )
            # A shared store's wait is bounded by the deadline as well: one that stalls (a
            # Redis server that stopped answering) holds the call no longer than that. A
            # moment later than the wait's own end, so that a wait for capacity the
            # deadline cuts short still says which limit it waited on (RateLimited). An
            # in-process store answers at once: its waits end on their own.
            due = self._deadline.at + _ADMISSION_GRACE if admission.store.shared else math.inf
            self._permit = permit = await self._bounded(acquiring, due, "deadline", None)
        except errors.RateLimited:
            if trace is not None:
                trace.admitted(self.snapshot(), self._now() - start, True)
            raise
        if trace is not None:
            trace.admitted(self.snapshot(), permit.waited, False)

    async def _settle(self) -> None:
        """Hand the admission permit back with what the response said (once)."""
        usage = self.usage
        permit, self._permit = self._permit, None
        admission = self._admission
        if permit is None or admission is None:
            return
        answer = self._answer
        status = answer.status
        # the request id alone teaches nothing: no headers to parse then
        headers = self.record.headers if answer.limited else None
        error = self.error
        if isinstance(error, errors.APIStatusError):
            status = error.status_code
            headers = {**(self.record.headers or {}), **error.headers}
        await admission.settle(
            permit,
            status=status,
            headers=headers,
            total_tokens=usage.total_tokens if usage is not None else None,
            input_tokens=usage.prompt_tokens if usage is not None else None,
            output_tokens=usage.completion_tokens if usage is not None else None,
        )


_ADMISSION_GRACE = 0.05
"""Seconds past the deadline the wait for admission may take to end on its own."""


class _Answer:
    """The hook an attempt's backend calls with its HTTP response's status and headers
    (``RequestOptions.on_response``): it keeps the status (for admission) and puts the
    rate-limit and request-id headers, values redacted, on the attempt's record. A separate
    object, not a bound method of the attempt, so the attempt's options hold no reference
    back to it (no reference cycle: an attempt is freed as soon as its call is done)."""

    status: int | None = None
    """The response's status (None until it arrived)."""
    limited = False
    """Whether the head carried a header admission learns from (rate limits, a
    ``Retry-After``): without one, settling parses nothing."""

    def __init__(self, record: Attempt) -> None:
        self.record = record

    def __call__(self, status: int | None, headers: Mapping[str, str]) -> None:
        """Take in the response's head (status None: a backend's headers without one)."""
        names = tuple(headers)
        wanted, limited = _HEAD_PLANS.get(names) or _head_plan(names)
        kept: dict[str, str] = {}
        if wanted:
            values = tuple(headers.values())
            for index, lowered in wanted:
                kept[lowered] = errors.redact(values[index])
        self.status = status
        self.limited = limited
        self.record.headers = kept


_KEPT_HEADERS = frozenset({"x-request-id", "request-id", "x-ignored-fields"})

_HeadPlan = tuple[tuple[tuple[int, str], ...], bool]
_HEAD_PLANS: dict[tuple[str, ...], _HeadPlan] = {}
"""Per sequence of response header names (a provider answers with the same ones each time):
where the headers an attempt keeps stand, their lower-case names, and whether one of them
is a rate-limit header; at most ``_MAX_HEAD_PLANS`` kept."""
_MAX_HEAD_PLANS = 256


def _head_plan(names: tuple[str, ...]) -> _HeadPlan:
    """Which of ``names`` an attempt keeps (position, lower-case name; a later duplicate
    overwrites an earlier one) and whether one is a header admission learns from."""
    wanted: list[tuple[int, str]] = []
    limited = False
    for index, name in enumerate(names):
        lowered = name.lower()
        if lowered.startswith(LEARNED_HEADERS):
            limited = True
            wanted.append((index, lowered))
        elif lowered in _KEPT_HEADERS:
            wanted.append((index, lowered))
    if len(_HEAD_PLANS) >= _MAX_HEAD_PLANS:
        _HEAD_PLANS.clear()
    plan = _HEAD_PLANS[names] = (tuple(wanted), limited)
    return plan


def _body_size(request: ChatRequest, options: RequestOptions, streamed: bool) -> int:
    """Characters of the request's canonical body (built once per call, and reused by the
    backend that sends it); the message text alone without the call's encoding."""
    encoding = options.encoding
    if encoding is not None:
        return len(encoding.encode(request, stream=streamed))
    return prompt_chars(request.messages)


def prompt_chars(messages: Sequence[Message]) -> int:
    """Characters of text in ``messages`` (the prompt-size signal)."""
    total = 0
    for message in messages:
        content = message.content
        if isinstance(content, str):
            total += len(content)
        elif content is not None:
            for part in content:
                text = getattr(part, "text", None)
                if isinstance(text, str):
                    total += len(text)
    return total
