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

import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar

import anyio

from . import errors

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
    winner. With every attempt failed, the last failure is raised.
    """
    if not attempts:
        raise errors.ConfigurationError("a call needs at least one target")
    won: list[T] = []
    fatal: list[BaseException] = []
    failures: list[BaseException] = []
    in_flight = 0
    wake = anyio.Event()

    async def run(attempt: Awaitable[T]) -> None:
        nonlocal in_flight
        try:
            result = await attempt
        except Exception as exc:
            in_flight -= 1
            if is_fatal(exc):
                if not fatal and not won:
                    fatal.append(exc)
                    scope.cancel()
            else:
                failures.append(exc)
            wake.set()
            return
        in_flight -= 1
        if won or fatal:
            with anyio.CancelScope(shield=True):
                await discard(result)
            return
        won.append(result)
        commit(result)
        if in_flight:
            scope.cancel()  # the other attempts lose
        else:
            wake.set()  # nothing else runs: the waiting loop ends without a cancellation

    async with anyio.create_task_group() as tg:
        scope = tg.cancel_scope
        last_start = -math.inf
        for index, attempt in enumerate(attempts):
            trigger: Trigger = "first"
            if index:
                trigger = "fallback"
                hedge_at = last_start + delay(index)
                seen = len(failures)
                while not (won or fatal) and in_flight and len(failures) == seen:
                    if in_flight < max_in_flight and anyio.current_time() >= hedge_at:
                        if may_hedge():
                            trigger = "hedge"
                            break
                        hedge_at = math.inf
                    wake = anyio.Event()
                    until = hedge_at if in_flight < max_in_flight else math.inf
                    with anyio.CancelScope(deadline=until):
                        await wake.wait()
                if won or fatal:
                    break
            in_flight += 1
            last_start = anyio.current_time()
            # Called here, not in the child task: attempts are numbered in start order.
            tg.start_soon(run, attempt(trigger))
    if won:
        return won[0]
    if fatal:
        raise fatal[0]
    raise failures[-1]
