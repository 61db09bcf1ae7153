"""The state admission keeps, behind one small interface: sliding-window usage logs,
concurrency leases and rests (``Retry-After``, an open breaker) per key.

:class:`MemoryStore` keeps them in this process (the default); :class:`~swiftclient.admission.
RedisStore` keeps them on a Redis server, so a fleet of processes shares one provider's
limits. Every operation is atomic on the store: a take checks every limit and the lease
count, and takes from all of them or from none.

A limit is ``capacity`` units (requests, tokens) in any window of ``window`` seconds: the
store logs what each take used and when, and a take fits while the units logged within the
last ``window`` seconds plus its own stay within the capacity. That is what "N requests per
minute" means to a provider that counts a sliding window, and it never exceeds a provider's
token bucket of the same capacity refilled over the same window either; a token bucket on
the client side does (a full bucket's burst plus a window's refill is twice the limit in one
window). Capacity and window travel with each operation (the caller knows the limits); the
store keeps only the log. A correction (usage larger or smaller than reserved) adds to the
log, or takes from its oldest entries, which keeps the log on the safe side.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol, runtime_checkable

import anyio

__all__ = ["Admit", "BucketCost", "MemoryStore", "StateStore"]


class BucketCost(NamedTuple):
    """``cost`` units of the limit ``kind``: at most ``capacity`` units in any window of
    ``window`` seconds. A negative cost (in a correction) gives units back."""

    kind: str
    cost: float
    capacity: float
    window: float


class Admit(NamedTuple):
    """The answer to a take: ``granted``, or the ``limit`` that was short and the seconds
    until it can give what was asked (``wait``; ``None`` when unknown: a concurrency slot
    frees when some holder releases it)."""

    granted: bool
    limit: str | None = None
    wait: float | None = None


GRANTED = Admit(True)


@runtime_checkable
class StateStore(Protocol):
    """Where admission state lives. Keys are opaque strings (one per target, or per shared
    counter); every method is atomic with respect to every other caller of the store."""

    shared: bool
    """Whether other processes see the same state (a release there wakes no one here, so a
    waiter for a concurrency slot re-asks now and then)."""

    async def take(
        self,
        key: str,
        costs: Sequence[BucketCost],
        *,
        concurrency: int | None = None,
        holder: str | None = None,
        ttl: float = 300.0,
    ) -> Admit:
        """Take every cost and, with ``concurrency``, a lease for ``holder`` that expires
        after ``ttl`` seconds unless released; all of it or nothing."""
        ...

    async def release(self, key: str, holder: str) -> None:
        """Give back ``holder``'s lease (nothing when it has none or it expired)."""
        ...

    async def adjust(self, key: str, cost: BucketCost) -> None:
        """Take ``cost.cost`` (give back when negative) whatever the level: a correction."""
        ...

    async def set_level(self, key: str, cost: BucketCost, reset: float | None = None) -> None:
        """The provider says ``cost.cost`` units remain, and (``reset``) that all it counts
        as used is free again within that many seconds: when the log holds less than the
        capacity less the remaining, log the difference so that it leaves the window at the
        reset (now, without one). Never frees anything."""
        ...

    async def block(self, key: str, seconds: float) -> None:
        """Refuse every take on ``key`` for ``seconds`` (extends a rest, never shortens)."""
        ...

    async def blocked_for(self, key: str) -> float:
        """Seconds left of ``key``'s rest (0 when none)."""
        ...

    async def leases(self, key: str) -> int:
        """Live leases on ``key``."""
        ...

    async def aclose(self) -> None:
        """Release the store's connections."""
        ...


class _Log:
    """What one limit used within its window: ``[at, units]`` oldest first, and their sum."""

    __slots__ = ("entries", "used")

    def __init__(self) -> None:
        self.entries: deque[list[float]] = deque()
        self.used = 0.0

    def trim(self, now: float, window: float) -> float:
        """Forget what left the window; the units still in it."""
        entries = self.entries
        cutoff = now - window
        while entries and entries[0][0] <= cutoff:
            self.used -= entries.popleft()[1]
        if not entries:
            self.used = 0.0
        return self.used

    def add(self, now: float, units: float) -> None:
        """Log ``units`` used at ``now``."""
        if units > 0:
            self.entries.append([now, units])
            self.used += units

    def add_at(self, at: float, units: float) -> None:
        """Log ``units`` as used at ``at`` (at or before the newest entry: kept in order)."""
        if units <= 0:
            return
        entries = self.entries
        index = len(entries)
        while index and entries[index - 1][0] > at:
            index -= 1
        entries.insert(index, [at, units])
        self.used += units

    def give_back(self, units: float) -> None:
        """Take ``units`` from the oldest entries (they leave the window first, so the log
        never reads less than what the provider counts)."""
        for entry in self.entries:
            if units <= 0:
                break
            taken = min(entry[1], units)
            entry[1] -= taken
            self.used -= taken
            units -= taken

    def wait(self, now: float, cost: BucketCost) -> float:
        """Seconds until ``cost`` fits (0: it fits now); the log is trimmed to ``now``."""
        excess = self.used + min(cost.cost, cost.capacity) - cost.capacity
        if excess <= 1e-9:
            return 0.0
        for at, units in self.entries:
            excess -= units
            if excess <= 1e-9:
                return max(0.0, at + cost.window - now)
        return cost.window


@dataclass(slots=True)
class _Entry:
    logs: dict[str, _Log] = field(default_factory=dict)
    leases: dict[str, float] = field(default_factory=dict)
    blocked_until: float = -math.inf

    def log(self, kind: str) -> _Log:
        log = self.logs.get(kind)
        if log is None:
            log = self.logs[kind] = _Log()
        return log


class MemoryStore:
    """Admission state in this process (the default store).

    Args:
        clock: seconds on a monotonic clock (``anyio.current_time`` by default, the loop's).
    """

    shared = False

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        self._clock = clock or anyio.current_time
        self._entries: dict[str, _Entry] = {}

    def __repr__(self) -> str:
        return f"MemoryStore(keys={len(self._entries)})"

    def _entry(self, key: str) -> _Entry:
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = _Entry()
        return entry

    def take_now(
        self,
        key: str,
        costs: Sequence[BucketCost],
        *,
        concurrency: int | None = None,
        holder: str | None = None,
        ttl: float = 300.0,
    ) -> Admit:
        """:meth:`take` without awaiting (the fallback of a shared store uses it too)."""
        now = self._clock()
        entry = self._entry(key)
        if now < entry.blocked_until:
            return Admit(False, "retry_after", entry.blocked_until - now)
        logs: list[_Log] = []
        for cost in costs:
            log = entry.log(cost.kind)
            log.trim(now, cost.window)
            wait = log.wait(now, cost)
            if wait > 0:
                return Admit(False, cost.kind, wait)
            logs.append(log)
        if concurrency is not None:
            leases = entry.leases
            for name in [n for n, until in leases.items() if until <= now]:
                del leases[name]
            if len(leases) >= concurrency:
                return Admit(False, "concurrency", None)
            if holder is not None:
                leases[holder] = now + ttl
        for cost, log in zip(costs, logs, strict=True):
            log.add(now, min(cost.cost, cost.capacity))
        return GRANTED

    async def take(
        self,
        key: str,
        costs: Sequence[BucketCost],
        *,
        concurrency: int | None = None,
        holder: str | None = None,
        ttl: float = 300.0,
    ) -> Admit:
        """See :meth:`StateStore.take`."""
        return self.take_now(key, costs, concurrency=concurrency, holder=holder, ttl=ttl)

    def release_now(self, key: str, holder: str) -> None:
        """:meth:`release` without awaiting."""
        entry = self._entries.get(key)
        if entry is not None:
            entry.leases.pop(holder, None)

    async def release(self, key: str, holder: str) -> None:
        """See :meth:`StateStore.release`."""
        self.release_now(key, holder)

    def adjust_now(self, key: str, cost: BucketCost) -> None:
        """:meth:`adjust` without awaiting."""
        now = self._clock()
        log = self._entry(key).log(cost.kind)
        log.trim(now, cost.window)
        if cost.cost > 0:
            log.add(
                now, min(cost.cost, 2 * cost.capacity - log.used)
            )  # a debt of one window at most
        else:
            log.give_back(-cost.cost)

    async def adjust(self, key: str, cost: BucketCost) -> None:
        """See :meth:`StateStore.adjust`."""
        self.adjust_now(key, cost)

    def set_level_now(self, key: str, cost: BucketCost, reset: float | None = None) -> None:
        """:meth:`set_level` without awaiting."""
        now = self._clock()
        log = self._entry(key).log(cost.kind)
        used = log.trim(now, cost.window)
        at = now if reset is None else min(now, now + reset - cost.window)
        log.add_at(at, cost.capacity - max(0.0, cost.cost) - used)

    async def set_level(self, key: str, cost: BucketCost, reset: float | None = None) -> None:
        """See :meth:`StateStore.set_level`."""
        self.set_level_now(key, cost, reset)

    def block_now(self, key: str, seconds: float) -> None:
        """:meth:`block` without awaiting."""
        entry = self._entry(key)
        entry.blocked_until = max(entry.blocked_until, self._clock() + seconds)

    async def block(self, key: str, seconds: float) -> None:
        """See :meth:`StateStore.block`."""
        self.block_now(key, seconds)

    def blocked_for_now(self, key: str) -> float:
        """:meth:`blocked_for` without awaiting."""
        entry = self._entries.get(key)
        if entry is None:
            return 0.0
        return max(0.0, entry.blocked_until - self._clock())

    async def blocked_for(self, key: str) -> float:
        """See :meth:`StateStore.blocked_for`."""
        return self.blocked_for_now(key)

    def leases_now(self, key: str) -> int:
        """:meth:`leases` without awaiting."""
        entry = self._entries.get(key)
        if entry is None:
            return 0
        now = self._clock()
        return sum(1 for until in entry.leases.values() if until > now)

    async def leases(self, key: str) -> int:
        """See :meth:`StateStore.leases`."""
        return self.leases_now(key)

    def peek_now(self, key: str, costs: Sequence[BucketCost]) -> tuple[dict[str, float], float]:
        """The units of each limit in ``costs`` free now (what a take could have), and the
        seconds left of ``key``'s rest."""
        entry = self._entries.get(key)
        now = self._clock()
        if entry is None:
            return {cost.kind: cost.capacity for cost in costs}, 0.0
        levels = {
            cost.kind: cost.capacity - entry.log(cost.kind).trim(now, cost.window) for cost in costs
        }
        return levels, max(0.0, entry.blocked_until - now)

    async def aclose(self) -> None:
        """Nothing to release."""
