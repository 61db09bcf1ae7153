"""Clocks for admission tests: time moves only when the test says so."""

from __future__ import annotations

import anyio


class FakeClock:
    """``now()`` reads a number the test advances; ``wait`` ends on its event or when
    :meth:`advance` moves time past its timeout, never on the wall clock."""

    def __init__(self, start: float = 1000.0) -> None:
        self.t = start
        self._timers: list[tuple[float, anyio.Event]] = []

    def now(self) -> float:
        return self.t

    async def wait(self, event: anyio.Event, timeout: float | None) -> bool:
        if event.is_set():
            return True
        if timeout is not None and timeout <= 0:
            return False
        timer = anyio.Event()
        if timeout is not None:
            self._timers.append((self.t + timeout, timer))
        async with anyio.create_task_group() as tg:

            async def until(e: anyio.Event) -> None:
                await e.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(until, event)
            tg.start_soon(until, timer)
        return event.is_set()

    async def advance(self, seconds: float) -> None:
        """Move time on, fire the timers now due, and let every woken task run."""
        self.t += seconds
        due = [t for t in self._timers if t[0] <= self.t]
        self._timers = [t for t in self._timers if t[0] > self.t]
        for _, timer in due:
            timer.set()
        await anyio.wait_all_tasks_blocked()


class Ticker:
    """A bare clock function: calling it reads ``t``, which the test sets."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t
