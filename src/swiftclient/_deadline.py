"""Time limits: the user's :class:`Timeout` and the one :class:`Deadline` each call carries.

``Timeout.total`` bounds the whole call, every attempt and backoff included; every wait
underneath asks the deadline how long it may take (:meth:`Deadline.bound`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio

from .errors import ConfigurationError, DeadlineExceeded

__all__ = [
    "Deadline",
    "DeadlineWatch",
    "Timeout",
    "Waiter",
    "deadline_watch",
    "loop_clock",
    "loop_waiter",
]


_BASE_TIME = asyncio.BaseEventLoop.time


def running_loop() -> asyncio.AbstractEventLoop | None:
    """The running asyncio loop; None elsewhere (on trio, waits use cancel scopes)."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def loop_time() -> float:
    """The running loop's time, read the cheapest way (:func:`loop_clock`'s clock)."""
    return loop_clock()()


def loop_clock() -> Callable[[], float]:
    """The running loop's clock (:func:`_clock`'s choice; anyio's outside a loop of
    asyncio). The choice is kept for the loop it was made on (weakly: a closed loop is not
    kept alive), so finding it again is two C calls."""
    global _CHOSEN
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return anyio.current_time
    ref, clock = _CHOSEN  # one tuple: a thread reading on another loop sees a whole pair
    if ref() is not loop:
        clock = _clock(loop)
        if getattr(clock, "__self__", None) is not loop:  # loop.time would keep it alive
            _CHOSEN = (weakref.ref(loop), clock)
    return clock


def _no_loop() -> None:
    return None


_CHOSEN: tuple[Callable[[], object], Callable[[], float]] = (_no_loop, time.monotonic)
"""A weak reference to the loop :func:`loop_time` last read on, and the clock chosen
for it."""


_SAME_CLOCK: dict[type, bool] = {}
"""Per uvloop loop type: whether its ``time()`` reads ``time.monotonic``'s clock."""


def _clock(loop: asyncio.AbstractEventLoop) -> Callable[[], float]:
    """The clock of ``loop``'s calls: ``time.monotonic`` on asyncio's own loops (their
    clock; one call less per reading than ``loop.time``) and on uvloop; else ``loop.time``.

    uvloop's ``time()`` reads the monotonic clock cut to whole milliseconds, which would round
    every TTFT and inter-token gap that :class:`~swiftclient.types.Timing` records. Its timers
    take ``time.monotonic`` deadlines as they are: a timeout takes effect once its cut clock
    reaches one (the timer callbacks check the loop's time), never before and at most about a
    millisecond after. That it is the same clock is checked once per loop type (the readings
    agree within 10 ms); where not, ``loop.time`` is used.
    """
    loop_type = type(loop)
    if loop_type.time is _BASE_TIME:
        return time.monotonic
    if loop_type.__module__.partition(".")[0] == "uvloop":
        same = _SAME_CLOCK.get(loop_type)
        if same is None:
            same = _SAME_CLOCK[loop_type] = abs(loop.time() - time.monotonic()) < 0.01
        if same:
            return time.monotonic
    return loop.time


def _check(name: str, value: float | None) -> None:
    if value is not None and (not isinstance(value, int | float) or not value > 0):
        raise ConfigurationError(f"Timeout.{name} must be a positive number or None, got {value!r}")


@dataclass(frozen=True, slots=True)
class Timeout:
    """Time limits for one call, in seconds; ``None`` means no limit.

    - ``total``: the whole call, every retry and backoff included.
    - ``connect``: opening one connection.
    - ``pool``: waiting for a free pooled connection.
    - ``first_token``: from an attempt's start to its first content token.
    - ``idle``: the longest gap between two stream chunks once the first chunk has arrived
      (SSE comments and keep-alives do not count as chunks).
    """

    total: float | None = 600.0
    connect: float | None = 10.0
    pool: float | None = 30.0
    first_token: float | None = None
    idle: float | None = 120.0

    def __post_init__(self) -> None:
        for name in ("total", "connect", "pool", "first_token", "idle"):
            _check(name, getattr(self, name))

    @classmethod
    def coerce(cls, value: Timeout | float | None, base: Timeout | None = None) -> Timeout:
        """Accept a Timeout, a number (taken as ``total``) or None (no total limit).

        A number or None overrides ``total`` only: every other limit comes from ``base``
        (the defaults when ``base`` is None). A :class:`Timeout` replaces ``base`` whole.
        """
        if isinstance(value, Timeout):
            return value
        if value is None:
            total = None
        elif isinstance(value, int | float) and not isinstance(value, bool):
            total = float(value)
        else:
            raise ConfigurationError(f"timeout must be a Timeout, a number or None, got {value!r}")
        return dataclasses.replace(base or cls(), total=total)


class Deadline:
    """The absolute end of one call, on the clock of :attr:`now` (the loop's, or
    ``time.monotonic`` on asyncio and uvloop).

    Create it inside the running event loop, once per call; every attempt shares it.
    """

    __slots__ = ("_at", "now", "started", "timeout")

    def __init__(self, timeout: Timeout | None = None) -> None:
        self.timeout = timeout = timeout or Timeout()
        self.now: Callable[[], float] = loop_clock()
        """The event loop's clock (resolved once; reading it is on every hot path)."""
        self.started = started = self.now()
        """When the deadline was created (the call's start), on :attr:`now`'s clock."""
        total = timeout.total
        self._at = math.inf if total is None else started + total

    @classmethod
    def after(cls, seconds: float | None) -> Deadline:
        """A deadline ``seconds`` from now (``None``: never)."""
        return cls(Timeout.coerce(seconds))

    @property
    def at(self) -> float:
        """The absolute end on :attr:`now`'s clock (``inf`` when unbounded)."""
        return self._at

    def remaining(self) -> float:
        """Seconds left (``inf`` when unbounded, never negative)."""
        if self._at == math.inf:
            return math.inf
        return max(0.0, self._at - self.now())

    @property
    def expired(self) -> bool:
        """True once no time is left."""
        return self.remaining() <= 0.0

    def bound(self, limit: float | None) -> float | None:
        """The smaller of ``limit`` and the time left; ``None`` when both are unbounded."""
        left = self.remaining()
        if limit is not None and limit < left:
            left = limit
        return None if left == math.inf else left

    def exceeded(self, backend: str) -> DeadlineExceeded:
        """The error for a call whose total deadline ran out (one wording on every path)."""
        return DeadlineExceeded(
            f"{backend}: the call's total deadline of {self.timeout.total}s was exceeded",
            backend=backend,
        )


class Waiter:
    """One wait's registration with a :class:`DeadlineWatch`, reusable for the next wait (a
    stream's reads re-arm one waiter each: no allocation per read).

    :meth:`start` a wait, await, ask :meth:`expired` on ``CancelledError`` to tell the watch's
    cancellation from any other (which then propagates untouched), and :meth:`stop` when the
    wait ended, any way."""

    task: asyncio.Task[Any] | None = None
    """The task waiting (None between waits)."""
    due = math.inf
    """When the wait must end, on the loop's clock."""
    baseline = 0
    """The task's cancel requests when the wait began."""
    fired = False
    """Whether the watch cancelled the wait."""

    def __init__(self, watch: DeadlineWatch) -> None:
        self.watch = watch

    def start(self, task: asyncio.Task[Any], due: float) -> None:
        """``task`` begins a wait that must end by ``due`` (on the loop's clock)."""
        self.task = task
        self.due = due
        self.baseline = task.cancelling()
        watch = self.watch
        watch._waiting.add(self)
        if due < watch._armed_at:
            watch._arm(due)

    def expired(self) -> bool:
        """Call on ``CancelledError``: True when the watch alone caused it (its cancel
        request is withdrawn then, so the task is not left cancelling)."""
        task = self.task
        if not self.fired or task is None:
            return False
        self.fired = False
        return task.uncancel() <= self.baseline

    def stop(self) -> None:
        """The wait ended (any way): never cancel its task, and withdraw a cancel request
        the wait did not consume."""
        self.watch._waiting.discard(self)
        task, self.task = self.task, None
        if self.fired:
            self.fired = False
            if task is not None:
                task.uncancel()


class DeadlineWatch:
    """Bounds waits on one asyncio loop: cancels a waiting task once its due time passed,
    with one loop timer for all of the loop's waits (a stream's reads and a non-streamed
    call's whole wait alike; trio uses cancel scopes).

    A cancel scope per wait costs a timer handle plus task bookkeeping. Here a wait is a set
    insert and removal (:class:`Waiter`); the one timer is armed for the earliest due time
    known when it was armed and, when it fires, cancels the waits that are due and re-arms
    lazily for the earliest one left, so a wait due no earlier than the timer (a read whose
    idle limit moved on, every call with the same ``Timeout.total``) never touches it.
    """

    __slots__ = ("_armed_at", "_handle", "_waiting", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._waiting: set[Waiter] = set()
        self._handle: asyncio.TimerHandle | None = None
        self._armed_at = math.inf

    def _arm(self, due: float) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._handle = self.loop.call_at(due, self._fire)
        self._armed_at = due

    def _fire(self) -> None:
        self._handle = None
        self._armed_at = math.inf
        now = self.loop.time()
        earliest = math.inf
        for waiter in list(self._waiting):
            if waiter.due <= now:
                self._waiting.discard(waiter)
                waiter.fired = True
                waiter.task.cancel()  # type: ignore[union-attr]
            elif waiter.due < earliest:
                earliest = waiter.due
        if earliest < math.inf:
            self._arm(earliest)


_local = threading.local()


def deadline_watch(loop: asyncio.AbstractEventLoop) -> DeadlineWatch:
    """The :class:`DeadlineWatch` of ``loop``, the running loop (one per thread's loop)."""
    watch: DeadlineWatch | None = getattr(_local, "watch", None)
    if watch is None or watch.loop is not loop:
        watch = _local.watch = DeadlineWatch(loop)
    return watch


def loop_waiter() -> Waiter | None:
    """A new :class:`Waiter` on the running asyncio loop's watch; None elsewhere (on trio,
    waits are bounded by cancel scopes)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return None
    return Waiter(deadline_watch(loop))
