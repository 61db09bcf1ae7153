"""The state admission keeps, behind one small interface: token buckets, concurrency leases
and rests (``Retry-After``, an open breaker) per key.

:class:`MemoryStore` keeps them in this process (the default); :class:`~swiftclient.admission.
RedisStore` keeps them on a Redis server, so a fleet of processes shares one provider's
limits. Every operation is atomic on the store: a take checks every bucket and the lease
count, and takes from all of them or from none.

A bucket holds ``level`` tokens (at most its capacity) and refills at ``rate`` tokens per
second; its capacity and rate travel with each operation (the caller knows the limits), the
store keeps only the level and when it was last updated. A level may go below zero (usage
turned out larger than estimated): the debt is paid by refill before anything more is taken.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol, runtime_checkable

import anyio

__all__ = ["Admit", "BucketCost", "MemoryStore", "StateStore"]


class BucketCost(NamedTuple):
    """``cost`` tokens from the bucket ``kind`` whose limit is ``capacity`` tokens refilled
    at ``rate`` tokens per second. A negative cost gives tokens back."""

    kind: str
    cost: float
    capacity: float
    rate: float


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

    async def set_level(self, key: str, cost: BucketCost) -> None:
        """Set the bucket's level to ``cost.cost`` (what the provider says remains)."""
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


@dataclass(slots=True)
class _Bucket:
    level: float
    at: float


@dataclass(slots=True)
class _Entry:
    buckets: dict[str, _Bucket] = field(default_factory=dict)
    leases: dict[str, float] = field(default_factory=dict)
    blocked_until: float = -math.inf


def refill(bucket: _Bucket | None, cost: BucketCost, now: float) -> float:
    """The level of ``bucket`` at ``now``: full when new, refilled since its last update."""
    if bucket is None:
        return cost.capacity
    elapsed = max(0.0, now - bucket.at)
    return min(cost.capacity, bucket.level + elapsed * cost.rate)


def shortfall_wait(level: float, cost: BucketCost) -> float:
    """Seconds until a bucket at ``level`` holds ``cost`` (capped at its capacity)."""
    need = min(cost.cost, cost.capacity) - level
    if need <= 0:
        return 0.0
    return math.inf if cost.rate <= 0 else need / cost.rate


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
        levels: list[float] = []
        for cost in costs:
            level = refill(entry.buckets.get(cost.kind), cost, now)
            wait = shortfall_wait(level, cost)
            if wait > 0:
                return Admit(False, cost.kind, wait)
            levels.append(level)
        if concurrency is not None:
            leases = entry.leases
            for name in [n for n, until in leases.items() if until <= now]:
                del leases[name]
            if len(leases) >= concurrency:
                return Admit(False, "concurrency", None)
            if holder is not None:
                leases[holder] = now + ttl
        for cost, level in zip(costs, levels, strict=True):
            entry.buckets[cost.kind] = _Bucket(level - min(cost.cost, cost.capacity), now)
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
        entry = self._entry(key)
        level = refill(entry.buckets.get(cost.kind), cost, now)
        entry.buckets[cost.kind] = _Bucket(max(-cost.capacity, level - cost.cost), now)

    async def adjust(self, key: str, cost: BucketCost) -> None:
        """See :meth:`StateStore.adjust`."""
        self.adjust_now(key, cost)

    def set_level_now(self, key: str, cost: BucketCost) -> None:
        """:meth:`set_level` without awaiting."""
        level = max(-cost.capacity, min(cost.capacity, cost.cost))
        self._entry(key).buckets[cost.kind] = _Bucket(level, self._clock())

    async def set_level(self, key: str, cost: BucketCost) -> None:
        """See :meth:`StateStore.set_level`."""
        self.set_level_now(key, cost)

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
        """The level of each bucket in ``costs`` now (what a take could have), and the
        seconds left of ``key``'s rest; changes nothing."""
        entry = self._entries.get(key)
        now = self._clock()
        if entry is None:
            return {cost.kind: cost.capacity for cost in costs}, 0.0
        levels = {cost.kind: refill(entry.buckets.get(cost.kind), cost, now) for cost in costs}
        return levels, max(0.0, entry.blocked_until - now)

    async def aclose(self) -> None:
        """Nothing to release."""
