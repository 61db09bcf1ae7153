"""Hedging and fallback: when a call starts its next attempt, and which attempt commits.

Nothing here knows HTTP or backends. An attempt is a callable that runs it and returns its
result (a stream opened to its first content token, or a whole non-streamed reply); the
call path supplies them, one per target, in order.

- :func:`fallback` runs targets one after another: a non-fatal failure moves to the next
  target at once, a fatal one ends the call.
- :func:`race` staggers attempts inside one task group: the next target starts when the
  hedge delay has passed (and the budget allows a hedge) or at once when an attempt fails
  non-fatally. The first attempt to succeed commits, and every other one is cancelled.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

import anyio
import anyio.abc
import anyio.lowlevel

from . import errors
from ._deadline import running_loop

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
        if self.max_attempts < 1:
            raise errors.ConfigurationError("Hedge.max_attempts must be at least 1")
        if self.min_samples < 1:
            raise errors.ConfigurationError("Hedge.min_samples must be at least 1")
        if self.budget < 0 or self.budget_floor < 0:
            raise errors.ConfigurationError("Hedge.budget and budget_floor must not be negative")
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
    may_hedge: Callable[[], bool],
    max_in_flight: int,
    commit: Callable[[T], None],
    discard: Callable[[T], Awaitable[None]],
) -> T:
    """Staggered attempts in one task group; the first to succeed commits.

    Each attempt is called with its :data:`Trigger` when it starts.
    ``delay(i)`` is how long after attempt ``i - 1`` started attempt ``i`` starts as a hedge;
    ``may_hedge()`` is asked just before a hedge (a budget may refuse it; then only a failure
    starts the next attempt). A non-fatal failure starts the next attempt at once; a fatal
    one cancels the rest and is raised. ``commit(result)`` runs for the winner before the
    others are cancelled; ``discard(result)`` releases a result that finished after the
    winner, and the winner itself when the race is cancelled from outside before it can
    return it. With every attempt failed, the last failure is raised.

    On asyncio the first attempt runs in the calling task itself and a loop timer starts
    the rest when the hedge delay passes, so a call whose first attempt answers in time
    spawns no task (most calls, with a delay at a high quantile). On trio, with one
    attempt, or with a zero delay, every attempt runs in a child task.
    """
    if not attempts:
        raise errors.ConfigurationError("a call needs at least one target")
    state = _Race(attempts, delay, may_hedge, max_in_flight, commit, discard)
    loop = running_loop() if len(attempts) > 1 and max_in_flight > 1 else None
    try:
        async with anyio.create_task_group() as tg:
            state.tg = tg
            try:
                if loop is None:
                    await state.drive(0)
                else:
                    await state.first_inline(loop)
            finally:
                state.closed = True
                await state.join_hop()
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


class _Race(Generic[T]):
    """The shared state of one :func:`race`: its attempts, who won, what failed."""

    def __init__(
        self,
        attempts: Sequence[StartAttempt[T]],
        delay: Callable[[int], float],
        may_hedge: Callable[[], bool],
        max_in_flight: int,
        commit: Callable[[T], None],
        discard: Callable[[T], Awaitable[None]],
    ) -> None:
        self.attempts = attempts
        self.delay = delay
        self.may_hedge = may_hedge
        self.max_in_flight = max_in_flight
        self.commit = commit
        self.discard = discard
        self.won: list[T] = []
        self.fatal: list[BaseException] = []
        self.failures: list[BaseException] = []
        self.in_flight = 0
        self.last_start = -math.inf
        self.wake = anyio.Event()
        self.driving = False
        """Someone runs :meth:`drive` (set by whoever starts it, before it starts)."""
        self.closed = False
        """The task group has exited: nothing may start in it any more."""
        self._hop: asyncio.Task[None] | None = None
        self.hedge_at: float | None = None
        """When the inline first attempt's hedge is due (its timer's time), once known."""
        self.tg: anyio.abc.TaskGroup | None = None

    @property
    def over(self) -> bool:
        return bool(self.won or self.fatal)

    def _start(self, index: int, trigger: Trigger) -> Awaitable[T]:
        self.in_flight += 1
        self.last_start = anyio.current_time()
        # Called here, not in a child task: attempts are numbered in start order.
        return self.attempts[index](trigger)

    def _failed(self, exc: Exception) -> None:
        self.in_flight -= 1
        if is_fatal(exc):
            if not self.over:
                self.fatal.append(exc)
                assert self.tg is not None
                self.tg.cancel_scope.cancel()
        else:
            self.failures.append(exc)
        self.wake.set()

    async def _succeeded(self, result: T) -> None:
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
            self.wake.set()  # nothing else runs: a waiting driver ends without a cancellation

    async def _run(self, attempt: Awaitable[T]) -> None:
        try:
            result = await attempt
        except Exception as exc:
            self._failed(exc)
            return
        await self._succeeded(result)

    async def drive(self, start: int) -> None:
        """Start attempts ``start``, ``start + 1``, ... as child tasks, each when the hedge
        delay since the previous start passed (and the budget allows) or at once when an
        attempt failed, until one wins, one fails fatally, or none is left."""
        tg = self.tg
        assert tg is not None
        for index in range(start, len(self.attempts)):
            trigger: Trigger = "first"
            if index:
                trigger = "fallback"
                hedge_at = self.hedge_at if index == 1 and self.hedge_at is not None else None
                if hedge_at is None:
                    hedge_at = self.last_start + self.delay(index)
                seen = len(self.failures)
                while not self.over and self.in_flight and len(self.failures) == seen:
                    if self.in_flight < self.max_in_flight and anyio.current_time() >= hedge_at:
                        # A call being cancelled spends no budget on a hedge (the timer's
                        # driver can start in the turn the caller is cancelled).
                        await anyio.lowlevel.checkpoint_if_cancelled()
                        if self.may_hedge():
                            trigger = "hedge"
                            break
                        hedge_at = math.inf
                    self.wake = anyio.Event()
                    until = hedge_at if self.in_flight < self.max_in_flight else math.inf
                    with anyio.CancelScope(deadline=until):
                        await self.wake.wait()
                if self.over:
                    break
            tg.start_soon(self._run, self._start(index, trigger))

    async def first_inline(self, loop: asyncio.AbstractEventLoop) -> None:
        """Run the first attempt in this task; a loop timer starts :meth:`drive` in a child
        task once the hedge delay passes, and a non-fatal failure before that drives the
        rest from here."""
        wait = self.delay(1)
        if wait <= 0.0:  # every target at once: each in its own task
            await self.drive(0)
            return
        first = self._start(0, "first")
        hedge_at = self.hedge_at = self.last_start + wait
        handle = loop.call_at(hedge_at, self._hedge_due)
        try:
            result = await first
        except Exception as exc:
            handle.cancel()
            self._failed(exc)
            if not self.driving and not self.over:  # no driver yet: this task drives
                self.driving = True
                await self.drive(1)
            return
        finally:
            handle.cancel()
        await self._succeeded(result)

    def _hedge_due(self) -> None:
        """The loop timer: the first attempt outlived the hedge delay.

        A loop callback runs outside any task, where the task group cannot start one; a
        one-step asyncio task hops into task context and starts :meth:`drive` in the task
        group (unless the race ended meanwhile). The race keeps a reference to it until it
        has run.
        """
        if self.driving or self.over or self._hop is not None:
            return
        self._hop = asyncio.get_running_loop().create_task(self._start_driver())

    async def join_hop(self) -> None:
        """Wait for the timer's hop task if it has not run yet, so that no task outlives
        the race (it starts nothing now: the race is closed). It is pending only when the
        timer fired in the loop turn in which the race ended."""
        hop = self._hop
        if hop is not None and not hop.done():
            with anyio.CancelScope(shield=True):
                await hop

    async def _start_driver(self) -> None:
        tg = self.tg
        if tg is not None and not (self.driving or self.over or self.closed):
            self.driving = True
            tg.start_soon(self.drive, 1)
