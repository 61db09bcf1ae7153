"""Hedging and fallback: when a call starts its next attempt, and which attempt commits.

Nothing here knows HTTP or backends. An attempt is a callable that runs it and returns its
result (a stream opened to its first content token, or a whole non-streamed reply); the
call path supplies them, one per target, in order.

- :func:`fallback` runs targets one after another: a non-fatal failure moves to the next
  target at once, a fatal one ends the call.
- :func:`race` staggers attempts inside one task group, like a happy-eyeballs connect: the
  next target starts when the hedge delay has passed (and the budget allows a hedge) or at
  once when an attempt fails non-fatally. The first attempt to succeed commits, and every
  other one is cancelled.
"""

from __future__ import annotations

import asyncio
import inspect
import math
from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Generic, Literal, TypeVar

import anyio
import anyio.abc
import anyio.lowlevel

from . import errors
from ._budget import check_number
from ._deadline import running_loop


def _sniffio_library() -> ContextVar[str | None] | None:
    """sniffio's variable naming the running async library, where sniffio is installed
    (anyio finds its backend through it then; without it, by the running loop)."""
    try:
        from sniffio import current_async_library_cvar
    except ImportError:  # pragma: no cover - not installed
        return None
    return current_async_library_cvar


_ASYNC_LIBRARY = _sniffio_library()

__all__ = ["FATAL_STATUSES", "Hedge", "Trigger", "fallback", "is_fatal", "race"]

T = TypeVar("T")
Trigger = Literal["first", "hedge", "fallback"]
"""Why an attempt started: first of its round, a hedge (the delay passed), or a fallback
(an earlier attempt failed)."""
StartAttempt = Callable[[Trigger], Awaitable[T]]

FATAL_STATUSES = frozenset({400, 401, 403, 404, 422})
"""HTTP statuses that end a call: the request itself is wrong, so no other target helps."""


@dataclass(frozen=True, slots=True)
class Hedge:
    """How a call with several targets hedges.

    - ``delay``: seconds after an attempt starts before the next target is tried as well;
      ``None`` (the default) adapts it: the ``quantile`` of recently observed time to first
      token for the target, clamped to ``[min_delay, max_delay]``; ``max_delay`` until
      ``min_samples`` observations exist. ``0.0`` starts every target at once.
    - ``max_attempts``: attempts in flight at once, the first included.
    - ``budget``: extra requests as a fraction of calls, with ``budget_floor`` hedges per
      second always allowed and at most ``budget_burst`` hedges banked (over any stretch of
      calls, hedges <= ``budget`` x calls + ``budget_floor`` x seconds + ``budget_burst``).
    """

    delay: float | None = None
    quantile: float = 0.95
    min_delay: float = 0.01
    max_delay: float = 10.0
    max_attempts: int = 2
    min_samples: int = 20
    budget: float = 0.05
    budget_floor: float = 1.0
    budget_burst: float = 10.0

    def __post_init__(self) -> None:
        if self.delay is not None and not self.delay >= 0:
            raise errors.ConfigurationError(f"Hedge.delay must be >= 0 or None, got {self.delay}")
        if not 0.0 < self.quantile < 1.0:
            raise errors.ConfigurationError("Hedge.quantile must be between 0 and 1")
        if not 0.0 <= self.min_delay <= self.max_delay:
            raise errors.ConfigurationError("Hedge needs 0 <= min_delay <= max_delay")
        for name in ("max_attempts", "min_samples"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise errors.ConfigurationError(
                    f"Hedge.{name} must be an int of at least 1, got {value!r}"
                )
        check_number("Hedge.budget", self.budget, positive=False)
        check_number("Hedge.budget_floor", self.budget_floor, positive=False)
        if not self.budget_burst >= 1.0:
            raise errors.ConfigurationError(
                f"Hedge.budget_burst must be >= 1 (one hedge costs one token), got "
                f"{self.budget_burst}"
            )

    def delay_for(self, estimate: float | None) -> float:
        """The hedge delay, given the estimated quantile (None: not enough samples yet)."""
        if self.delay is not None:
            return self.delay
        if estimate is None:
            return self.max_delay
        return min(self.max_delay, max(self.min_delay, estimate))


def is_fatal(exc: BaseException) -> bool:
    """True when ``exc`` ends the call rather than moving on to the next target.

    Fatal: a 400, 401, 403, 404 or 422 answer, the call's deadline running out, a bad
    argument, and any error that is not one of swiftclient's (a bug is not a target's fault).
    Every other API or engine error (connect errors, timeouts, 429, 5xx, an overloaded
    engine, a malformed reply) lets the next target try.
    """
    if isinstance(exc, errors.APIStatusError):
        return exc.status_code in FATAL_STATUSES
    if isinstance(exc, errors.DeadlineExceeded):
        return True
    return not isinstance(exc, errors.APIError | errors.EngineError)


async def fallback(attempts: Sequence[StartAttempt[T]]) -> T:
    """Run ``attempts`` one after another until one succeeds (each is called with its
    :data:`Trigger`).

    The last attempt's error, or the first fatal one, is raised.
    """
    last = len(attempts) - 1
    for index, attempt in enumerate(attempts):
        try:
            return await attempt("fallback" if index else "first")
        except Exception as exc:
            if index == last or is_fatal(exc):
                raise
    raise errors.ConfigurationError("a call needs at least one target")


async def race(
    attempts: Sequence[StartAttempt[T]],
    *,
    delay: Callable[[int], float],
    may_hedge: Callable[[], bool | Awaitable[bool]],
    max_in_flight: int,
    commit: Callable[[T], None],
    discard: Callable[[T], Awaitable[None]],
) -> T:
    """Staggered attempts in one task group; the first to succeed commits.

    Shaped like a happy-eyeballs connect: start an attempt, then wait for a failure or for
    the hedge delay, whichever comes first, and start the next. ``delay(i)`` is how long
    after attempt ``i - 1`` started attempt ``i`` starts as a hedge; ``may_hedge()`` is
    asked just before a hedge (a budget may refuse it; then only a failure starts the next
    attempt; it may return an awaitable, for a budget on a shared store: it is awaited
    shielded, so a hedge it granted is not lost to a cancellation halfway); at most
    ``max_in_flight`` run at once. Each attempt is called with its
    :data:`Trigger` when it starts. A non-fatal failure starts the next attempt at once; a
    fatal one cancels the rest and is raised. ``commit(result)`` runs for the winner before
    the others are cancelled; ``discard(result)`` releases a result that finished after the
    winner, and the winner itself when the race is cancelled from outside before it can
    return it. With every attempt failed, the last failure is raised.

    One branch, on asyncio with a positive delay: the first attempt runs in the calling
    task, and a loop timer starts the staggering of the others in a child task only if it
    outlives the delay (a failure before that staggers them from the calling task). A call
    whose first attempt answers in time, most calls with the delay at a high quantile, so
    spawns no task. On trio, or with a zero delay, every attempt runs in a child task.
    """
    if not attempts:
        raise errors.ConfigurationError("a call needs at least one target")
    state = _Race(attempts, delay, may_hedge, max_in_flight, commit, discard)
    loop = running_loop() if len(attempts) > 1 else None
    try:
        async with anyio.create_task_group() as tg:
            state.tg = tg
            if loop is not None and state.first_wait > 0.0:
                await state.first_inline(loop)
            else:
                await state.stagger(0)
    except BaseException:
        if state.won:  # committed, then cancelled from outside while the losers closed
            with anyio.CancelScope(shield=True):
                await discard(state.won[0])
        raise
    if state.won:
        return state.won[0]
    if state.fatal:
        raise state.fatal[0]
    raise state.failures[-1]


@dataclass(eq=False)
class _Race(Generic[T]):
    """The shared state of one :func:`race`: its attempts, who won, what failed."""

    attempts: Sequence[StartAttempt[T]]
    delay: Callable[[int], float]
    may_hedge: Callable[[], bool | Awaitable[bool]]
    max_in_flight: int
    commit: Callable[[T], None]
    discard: Callable[[T], Awaitable[None]]
    won: list[T] = field(default_factory=list)
    fatal: list[BaseException] = field(default_factory=list)
    failures: list[BaseException] = field(default_factory=list)
    in_flight: int = 0
    last_start: float = -math.inf
    wake: anyio.Event = field(default_factory=anyio.Event)
    """Set when an attempt ends (a failure, or a win with nothing else in flight)."""
    staggering: bool = False
    """The hedge timer started :meth:`stagger` (the calling task must not as well)."""
    tg: anyio.abc.TaskGroup | None = None

    def __post_init__(self) -> None:
        self.first_wait = self.delay(1) if len(self.attempts) > 1 else 0.0  # asked once

    @property
    def over(self) -> bool:
        return bool(self.won or self.fatal)

    def start(self, index: int, trigger: Trigger) -> Awaitable[T]:
        """Start attempt ``index`` now (it is numbered now, in start order)."""
        self.in_flight += 1
        self.last_start = anyio.current_time()
        return self.attempts[index](trigger)

    async def run(self, attempt: Awaitable[T]) -> None:
        """Run one started attempt to its end: a win commits and cancels the others, a fatal
        failure cancels them all, a result after the race was decided is discarded."""
        try:
            result = await attempt
        except Exception as exc:
            self.in_flight -= 1
            if not is_fatal(exc):
                self.failures.append(exc)
            elif not self.over:
                self.fatal.append(exc)
                assert self.tg is not None
                self.tg.cancel_scope.cancel()
            self.wake.set()
            return
        self.in_flight -= 1
        if self.over:
            with anyio.CancelScope(shield=True):
                await self.discard(result)
            return
        self.won.append(result)
        self.commit(result)
        if self.in_flight:
            assert self.tg is not None
            self.tg.cancel_scope.cancel()  # the other attempts lose
        else:
            self.wake.set()  # nothing else runs: a waiting loop ends without a cancellation

    async def stagger(self, start: int) -> None:
        """Start attempts ``start``, ``start + 1``, ... as child tasks: each once an attempt
        failed, or once the hedge delay since the previous start passed (if the budget
        allows and fewer than ``max_in_flight`` run), until one wins, one fails fatally, or
        none is left."""
        tg = self.tg
        assert tg is not None
        for index in range(start, len(self.attempts)):
            trigger: Trigger = "first"
            if index:
                trigger = "fallback"
                wait = self.first_wait if index == 1 else self.delay(index)
                hedge_at = self.last_start + wait
                seen = len(self.failures)
                while not self.over and self.in_flight and len(self.failures) == seen:
                    room = self.in_flight < self.max_in_flight
                    if room and anyio.current_time() >= hedge_at:
                        # A call being cancelled spends no budget on a hedge.
                        await anyio.lowlevel.checkpoint_if_cancelled()
                        if await self._may_hedge():
                            trigger = "hedge"
                            break
                        hedge_at = math.inf
                    self.wake = anyio.Event()
                    with anyio.CancelScope(deadline=hedge_at if room else math.inf):
                        await self.wake.wait()
                if self.over:
                    return
            tg.start_soon(self.run, self.start(index, trigger))

    async def _may_hedge(self) -> bool:
        """Ask ``may_hedge`` (awaiting its answer, shielded, when it is awaitable)."""
        allowed = self.may_hedge()
        if not inspect.isawaitable(allowed):
            return bool(allowed)
        with anyio.CancelScope(shield=True):
            granted = bool(await allowed)
        return granted

    async def first_inline(self, loop: asyncio.AbstractEventLoop) -> None:
        """The asyncio branch of :func:`race`: run the first attempt in this task; a loop
        timer at the hedge time starts :meth:`stagger` in a child task, and a non-fatal
        failure before that staggers the rest from here."""
        first = self.start(0, "first")
        timer = loop.call_at(self.last_start + self.first_wait, self._hedge_due)
        try:
            await self.run(first)
        finally:
            timer.cancel()
        if not (self.staggering or self.over):
            await self.stagger(1)

    def _hedge_due(self) -> None:
        """The hedge timer (a loop callback: it fires only while :meth:`first_inline` awaits
        the first attempt, so the task group is open).

        anyio finds its backend through sniffio, which sees asyncio only inside a task or
        where the runner named it (``anyio.run`` does, ``asyncio.run`` does not); a loop
        callback is neither, so it names asyncio for the spawn (in the callback's own copy of
        the context)."""
        if not self.over:
            self.staggering = True
            assert self.tg is not None
            if _ASYNC_LIBRARY is not None:
                _ASYNC_LIBRARY.set("asyncio")
            self.tg.start_soon(self.stagger, 1)
