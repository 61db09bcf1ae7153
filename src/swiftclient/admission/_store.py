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

A key also keeps a line: the callers (one per :class:`~swiftclient.admission.Admission`,
named by ``queue``) that were refused and still wait, in the order they were first refused.
A take is granted only to the caller at the head of the line (or to anyone while the line is
empty); a refused caller joins its back, a granted one leaves it (and joins again at the
back when it has more waiting). So the processes sharing a limit take turns, and the one
that polls when capacity frees does not jump the line. A place in line expires when its
caller stops asking (``queue_ttl`` seconds after the wait it was last told), so a process
that died cannot hold the line.

The store also keeps hedge budgets (:meth:`StateStore.hedge`): token buckets that calls pay
into and hedges spend from, so the processes sharing a store share one budget of extra
requests (:class:`~swiftclient.admission.SharedHedgeBudget`).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol, runtime_checkable

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
    frees when some holder releases it). ``ahead``: the callers before this one in the
    key's line (their turns come first; ``wait`` then counts their takes too, and
    ``limit`` is ``"queue"`` when no limit is short)."""

    granted: bool
    limit: str | None = None
    wait: float | None = None
    ahead: int = 0


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
        queue: str | None = None,
        queue_ttl: float = 2.0,
    ) -> Admit:
        """Take every cost and, with ``concurrency``, a lease for ``holder`` that expires
        after ``ttl`` seconds unless released; all of it or nothing. With ``queue`` (the
        caller's name in the key's line), only when no other live caller is ahead of it in
        line; refused, the caller keeps (or takes) its place, which expires ``queue_ttl``
        seconds after the ``wait`` returned unless it asks again; granted, it leaves the
        line."""
        ...

    async def leave(self, key: str, queue: str) -> None:
        """Take ``queue`` out of ``key``'s line (it stopped waiting)."""
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

    async def update(
        self,
        key: str,
        levels: Sequence[tuple[BucketCost, float | None]] = (),
        corrections: Sequence[BucketCost] = (),
    ) -> None:
        """:meth:`set_level` for each ``(cost, reset)`` of ``levels``, then :meth:`adjust`
        for each of ``corrections``: what one response taught, in one operation."""
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

    async def hedge(
        self, key: str, deposit: float, *, spend: bool, floor_per_second: float, burst: float
    ) -> tuple[bool, float]:
        """The hedge budget ``key``, a token bucket that starts full (``burst``): add
        ``floor_per_second`` for each second since its last operation and ``deposit``
        (what calls paid in), never above ``burst``; then, with ``spend``, take one token
        if there is one. Returns whether a token was taken and the tokens left."""
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
        entries = self.entries
        while units > 0 and entries:
            entry = entries[0]
            taken = min(entry[1], units)
            entry[1] -= taken
            self.used -= taken
            units -= taken
            if entry[1] <= 0:
                entries.popleft()  # used up: it would only slow the next scan

    def wait(self, now: float, cost: BucketCost, turns: int = 1) -> float:
        """Seconds until ``turns`` takes of ``cost`` fit (0: they fit now; the last of them
        is the caller's own), after trimming the log to ``now``."""
        entries = self.entries
        if entries and entries[0][0] <= now - cost.window:
            self.trim(now, cost.window)
        excess = self.used + min(cost.cost, cost.capacity) * turns - cost.capacity
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
    line: dict[str, float] = field(default_factory=dict)
    """Callers waiting their turn, oldest first, each with when its place expires."""

    def ahead_of(self, queue: str, now: float) -> int:
        """Callers before ``queue`` in line (the expired ones at its head are dropped);
        all of them when ``queue`` is not in it."""
        line = self.line
        for name in list(line):
            if name == queue or line[name] > now:
                break
            del line[name]
        ahead = 0
        for name in line:
            if name == queue:
                break
            ahead += 1
        return ahead

    def log(self, kind: str) -> _Log:
        log = self.logs.get(kind)
        if log is None:
            log = self.logs[kind] = _Log()
        return log


def _try(
    entry: _Entry,
    now: float,
    costs: Sequence[BucketCost],
    concurrency: int | None,
    holder: str | None,
    ttl: float,
    ahead: int,
) -> Admit:
    """A take on ``entry`` by a caller with ``ahead`` others before it in line."""
    if now < entry.blocked_until:
        return Admit(False, "retry_after", entry.blocked_until - now, ahead)
    logs = entry.logs
    if ahead:
        # others' turns come first: how long until theirs and this one fit
        limit, longest = "queue", 0.0
        for cost in costs:
            log = logs.get(cost.kind)
            if log is not None:
                wait = log.wait(now, cost, ahead + 1)
                if wait > longest:
                    limit, longest = cost.kind, wait
        return Admit(False, limit, longest or None, ahead)
    for cost in costs:
        log = logs.get(cost.kind) or entry.log(cost.kind)
        wait = log.wait(now, cost)
        if wait > 0:
            return Admit(False, cost.kind, wait)
    if concurrency is not None:
        leases = entry.leases
        if leases:
            for name in [n for n, until in leases.items() if until <= now]:
                del leases[name]
        if len(leases) >= concurrency:
            return Admit(False, "concurrency", None)
        if holder is not None:
            leases[holder] = now + ttl
    for kind, units, capacity, _ in costs:  # _Log.add, inline: the hot path's one write
        if units > capacity:
            units = capacity
        if units > 0:
            log = logs[kind]
            log.entries.append([now, units])
            log.used += units
    return GRANTED


@dataclass(slots=True)
class _Bucket:
    """A hedge budget: its tokens, and when time last refilled them (None: never)."""

    tokens: float
    last: float | None = None


def hedge_bucket(
    bucket: _Bucket,
    now: float,
    deposit: float,
    *,
    spend: bool,
    floor_per_second: float,
    burst: float,
) -> bool:
    """One operation on a hedge budget (see :meth:`StateStore.hedge`): the arithmetic of
    :class:`~swiftclient._budget.HedgeBudget`, with ``deposit`` paid in at once (adding
    non-negative amounts and capping each time, or capping their sum once, is the same)."""
    last = bucket.last
    tokens = bucket.tokens
    if last is None or now > last:  # a clock that steps back refills nothing
        if last is not None:
            tokens += (now - last) * floor_per_second
        bucket.last = now
    tokens = min(burst, tokens + max(0.0, deposit))
    taken = spend and tokens >= 1.0
    bucket.tokens = tokens - 1.0 if taken else tokens
    return taken


class MemoryStore:
    """Admission state in this process (the default store).

    Args:
        clock: seconds on a monotonic clock (``time.monotonic`` by default: the state
            outlives an event loop, and a trio run's clock starts at a random point).
    """

    shared = False

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        self._clock = clock or time.monotonic
        self._entries: dict[str, _Entry] = {}
        self._buckets: dict[str, _Bucket] = {}

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
        queue: str | None = None,
        queue_ttl: float = 2.0,
    ) -> Admit:
        """:meth:`take` without awaiting (the fallback of a shared store uses it too)."""
        return self.take_at(key, costs, concurrency, holder, ttl, queue, queue_ttl)

    def take_at(
        self,
        key: str,
        costs: Sequence[BucketCost],
        concurrency: int | None,
        holder: str | None,
        ttl: float,
        queue: str | None,
        queue_ttl: float,
        now: float | None = None,
    ) -> Admit:
        """:meth:`take_now` with every argument by position (admission's hot path: a call
        with keywords costs more); ``now``: this store's clock, read by the caller."""
        if now is None:
            now = self._clock()
        entry = self._entries.get(key) or self._entry(key)
        line = entry.line
        ahead = entry.ahead_of(queue, now) if line and queue is not None else 0
        admit = _try(entry, now, costs, concurrency, holder, ttl, ahead)
        if queue is not None:
            if admit.granted:
                if line:
                    line.pop(queue, None)
            else:
                line[queue] = now + (admit.wait or 0.0) + queue_ttl
        return admit

    async def take(
        self,
        key: str,
        costs: Sequence[BucketCost],
        *,
        concurrency: int | None = None,
        holder: str | None = None,
        ttl: float = 300.0,
        queue: str | None = None,
        queue_ttl: float = 2.0,
    ) -> Admit:
        """See :meth:`StateStore.take`."""
        return self.take_now(
            key,
            costs,
            concurrency=concurrency,
            holder=holder,
            ttl=ttl,
            queue=queue,
            queue_ttl=queue_ttl,
        )

    def leave_now(self, key: str, queue: str) -> None:
        """:meth:`leave` without awaiting."""
        entry = self._entries.get(key)
        if entry is not None:
            entry.line.pop(queue, None)

    async def leave(self, key: str, queue: str) -> None:
        """See :meth:`StateStore.leave`."""
        self.leave_now(key, queue)

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
        entry = self._entries.get(key) or self._entry(key)
        log = entry.logs.get(cost.kind) or entry.log(cost.kind)
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

    def update_now(
        self,
        key: str,
        levels: Sequence[tuple[BucketCost, float | None]] = (),
        corrections: Sequence[BucketCost] = (),
    ) -> None:
        """:meth:`update` without awaiting."""
        for cost, reset in levels:
            self.set_level_now(key, cost, reset)
        for cost in corrections:
            self.adjust_now(key, cost)

    async def update(
        self,
        key: str,
        levels: Sequence[tuple[BucketCost, float | None]] = (),
        corrections: Sequence[BucketCost] = (),
    ) -> None:
        """See :meth:`StateStore.update`."""
        self.update_now(key, levels, corrections)

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

    def hedge_now(
        self, key: str, deposit: float, *, spend: bool, floor_per_second: float, burst: float
    ) -> tuple[bool, float]:
        """:meth:`hedge` without awaiting."""
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _Bucket(burst)
        taken = hedge_bucket(
            bucket,
            self._clock(),
            deposit,
            spend=spend,
            floor_per_second=floor_per_second,
            burst=burst,
        )
        return taken, bucket.tokens

    async def hedge(
        self, key: str, deposit: float, *, spend: bool, floor_per_second: float, burst: float
    ) -> tuple[bool, float]:
        """See :meth:`StateStore.hedge`."""
        return self.hedge_now(
            key, deposit, spend=spend, floor_per_second=floor_per_second, burst=burst
        )

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
