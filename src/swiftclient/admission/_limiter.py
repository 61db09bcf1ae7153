"""Admission per target: wait for capacity (concurrency, requests and tokens per minute)
before a request is sent, never past the call's deadline; learn the limits from the
provider's headers; halve a target's concurrency on a 429 that says nothing else (AIMD).

HTTP-free: a caller hands in a target name, an estimate of the request's tokens and the time
it may wait, and afterwards the status, headers and usage it saw.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import anyio

from .._budget import DEFAULT_MAX_PUSHBACK, check_number
from .._deadline import running_loop
from ..errors import ConfigurationError, RateLimited
from ._headers import LEARNED_HEADERS, Observed, parse_rate_limit_headers
from ._hedge import SharedHedgeBudget
from ._store import Admit, BucketCost, MemoryStore, StateStore

__all__ = [
    "CHARS_PER_TOKEN",
    "Admission",
    "Clock",
    "Headroom",
    "Limits",
    "Permit",
    "SystemClock",
    "TargetHealth",
    "estimate_tokens",
]

logger = logging.getLogger("swiftclient.admission")

CHARS_PER_TOKEN = 4.0
"""The default estimate of characters per token (English text and JSON on BPE tokenizers
average 3.5 to 4.5); the estimate is corrected from ``usage`` once the reply is in."""

_TURN = 0.01
"""Seconds to allow each process ahead in line for its turn when capacity is already free
(a take and its round trip), before asking again."""

_AIMD_CEILING = 1024
"""A learned concurrency limit that grows back past this is dropped (no limit)."""


def estimate_tokens(body: bytes | str, chars_per_token: float = CHARS_PER_TOKEN) -> int:
    """Tokens a request body is estimated to count for: its length over ``chars_per_token``
    (bytes count as characters), rounded up."""
    check_number("chars_per_token", chars_per_token, positive=True)
    return math.ceil(len(body) / chars_per_token)


def _current_loop() -> object:
    """The running event loop: asyncio's loop, or trio's run (its token)."""
    loop = running_loop()
    if loop is not None:
        return loop
    import trio  # reached only inside a trio run

    return trio.lowlevel.current_trio_token()


class Clock(Protocol):
    """Time as admission sees it: a monotonic reading, and a wait for an event that gives
    up after a timeout. Tests pass a fake one; nothing in admission reads time otherwise."""

    def now(self) -> float:
        """Seconds on a monotonic clock."""
        ...

    async def wait(self, event: anyio.Event, timeout: float | None) -> bool:
        """Wait until ``event`` is set (True) or ``timeout`` seconds pass (False)."""
        ...


class SystemClock:
    """The process's monotonic clock (``time.monotonic``) and cancel-scope timeouts.

    Not the running loop's: an admission outlives a loop (one ``anyio.run`` after another)
    and the times it keeps must stay comparable, while each ``trio.run`` has a clock of its
    own that starts at a random point (a window filled in one run held the next one off
    for hours, or was forgotten at once). asyncio's own loop reads this same clock. Its
    waits time out on the loop's clock: under a virtual clock (trio's ``MockClock``) pass
    an admission a ``clock=`` of that clock instead."""

    def now(self) -> float:
        """Seconds on the monotonic clock."""
        return time.monotonic()

    async def wait(self, event: anyio.Event, timeout: float | None) -> bool:
        """Wait for ``event`` for at most ``timeout`` seconds (``None``: no limit)."""
        if timeout is None:
            await event.wait()
            return True
        with anyio.move_on_after(timeout):
            await event.wait()
        return event.is_set()


@dataclass(frozen=True, slots=True)
class Limits:
    """Admission limits of one backend (each of its models is a target with its own).

    Args:
        concurrency: requests in flight at once (``None``: no limit but what AIMD learns).
        rpm: requests per minute (per ``window``).
        tpm: tokens per minute (per ``window``; input estimate plus ``max_tokens`` when the
            call sets it).
        learn: take limits from the provider's rate-limit headers and halve concurrency on
            a bare 429. A learned limit never raises a configured one.
        chars_per_token: the estimate of input tokens before sending.
        lease_ttl: seconds after which a concurrency slot whose holder never released it
            (a crashed process) is free again.
        max_retry_after: the longest rest a ``Retry-After`` may impose on a target.
        window: the seconds ``rpm`` and ``tpm`` count over, a sliding window: at most
            ``rpm`` requests start in any ``window`` seconds (60: per minute; 1 for a
            provider that limits per second, or shorter to time-scale a test or a bench).
            Limits learned from the provider's headers count over it too.
        margin: the window is counted this fraction longer than ``window`` (2%: 1.2 s a
            minute), so that a request the provider logs a little after this client admitted
            it still falls in the window the client counted it in.
        queue_ttl: seconds a process's place in a shared store's line outlives the wait it
            was last told (a process that died stops holding the line after that).

    Raises:
        ConfigurationError: a limit is not a positive number.
    """

    concurrency: int | None = None
    rpm: float | None = None
    tpm: float | None = None
    learn: bool = True
    chars_per_token: float = CHARS_PER_TOKEN
    lease_ttl: float = 300.0
    max_retry_after: float = DEFAULT_MAX_PUSHBACK
    window: float = 60.0
    margin: float = 0.02
    queue_ttl: float = 2.0

    def __post_init__(self) -> None:
        if self.concurrency is not None and (
            isinstance(self.concurrency, bool)
            or not isinstance(self.concurrency, int)
            or self.concurrency < 1
        ):
            raise ConfigurationError(
                f"Limits.concurrency must be an int >= 1 or None, got {self.concurrency!r}"
            )
        for name in ("rpm", "tpm"):
            value = getattr(self, name)
            if value is not None:
                check_number(f"Limits.{name}", value, positive=True)
        check_number("Limits.chars_per_token", self.chars_per_token, positive=True)
        check_number("Limits.lease_ttl", self.lease_ttl, positive=True)
        check_number("Limits.max_retry_after", self.max_retry_after, positive=False)
        check_number("Limits.window", self.window, positive=True)
        check_number("Limits.margin", self.margin, positive=False)
        check_number("Limits.queue_ttl", self.queue_ttl, positive=True)


@dataclass(slots=True)
class _Spec:
    capacity: float
    window: float  # seconds, margin included


@dataclass(eq=False, slots=True)
class _Waiter:
    until: float
    event: anyio.Event = field(default_factory=anyio.Event)
    dead: bool = False
    failure: RateLimited | None = None


@dataclass(slots=True)
class _Gate:
    """One target's queue and what this process learned about it."""

    limits: Limits
    queue: list[tuple[int, int, _Waiter]] = field(default_factory=list)
    changed: anyio.Event = field(default_factory=anyio.Event)
    learned: dict[str, _Spec] = field(default_factory=dict)
    aimd: float | None = None
    decreased_at: float = -math.inf
    in_flight: int = 0
    blocked_limit: str | None = None
    blocked_until: float = -math.inf
    throttled: int = 0
    input_scale: float = 1.0
    """Input tokens the provider counted per estimated one (learned from usage)."""
    latency: float | None = None
    """Seconds from admission to the end of a request the target answered (a moving
    average; ``None`` until one was answered)."""
    in_line: bool = False
    """Whether this process holds a place in the store's line for the target."""
    specs: list[tuple[str, float, float]] | None = None
    """The limits in force (kind, capacity, window), built when they change."""
    costs: tuple[object, tuple[int, int], tuple[BucketCost, ...]] | None = None
    """The last costs built: for which specs and sizes (tokens, input tokens)."""

    def head(self) -> _Waiter | None:
        queue = self.queue
        while queue and queue[0][2].dead:
            heapq.heappop(queue)
        return queue[0][2] if queue else None

    def wake(self) -> None:
        """Capacity may have freed: the head re-checks, stale rests are forgotten."""
        self.blocked_limit = None
        self.blocked_until = -math.inf
        self.changed.set()
        self.changed = anyio.Event()

    def concurrency(self) -> int | None:
        configured = self.limits.concurrency
        if self.aimd is None:
            return configured
        learned = max(1, math.floor(self.aimd))
        return learned if configured is None else min(configured, learned)


class Headroom(NamedTuple):
    """A target's capacity as this process sees it now (:meth:`Admission.headroom`).

    ``requests`` and ``tokens`` are what their limits have free in the current window
    (``None``: no such limit is configured or learned); with a
    :class:`~swiftclient.admission.RedisStore` they are what this process's last take left
    (other processes' takes since, and what left the window since, are not in it).
    """

    concurrency: int | None
    """The concurrency limit in force (configured or learned; ``None``: none)."""
    in_flight: int
    """Requests this process has admitted and not settled."""
    waiting: int
    """Requests of this process queued for capacity."""
    requests: float | None
    """Requests free in the requests-per-minute window."""
    tokens: float | None
    """Tokens free in the tokens-per-minute window."""
    rest: float
    """Seconds left of a ``Retry-After`` rest (0: none)."""
    throttled: int
    """Responses answered 429 that this process has seen on the target."""


class TargetHealth(NamedTuple):
    """One target's state in ``client.health(detail=True)``."""

    breaker: str | None
    """Its circuit breaker's state (``"closed"``, ``"open"``, ``"half_open"``; ``None``:
    the client has no breaker on it yet)."""
    headroom: Headroom | None
    """Its capacity (``None``: the client has no admission, or never asked for it)."""


@dataclass(slots=True)
class Permit:
    """Capacity held by one request: hand it back with :meth:`Admission.settle` (read
    it, do not change it: a plain dataclass because a frozen one's construction costs
    several times more on the call path)."""

    target: str
    holder: str | None
    tokens: int
    input_tokens: int
    acquired_at: float
    waited: float
    """Seconds the request waited for admission."""
    estimated_input: int = 0
    """The caller's input estimate before this target's learned scale (0: none)."""


class Admission:
    """Rate limits per target, over a :class:`~swiftclient.admission.StateStore`.

    Args:
        limits: one :class:`Limits` for every backend, or a mapping from backend name (or
            ``"backend/model"``) to its limits; backends not named get ``Limits()`` (learning
            only). ``None``: learning only, everywhere.
        store: where the usage logs and leases live (a :class:`MemoryStore` by default).
        clock: the clock (the monotonic clock by default, as :class:`SystemClock`).
        wall: Unix time, for HTTP-date and RFC 3339 reset headers (``time.time``).
    """

    def __init__(
        self,
        limits: Limits | Mapping[str, Limits] | None = None,
        *,
        store: StateStore | None = None,
        clock: Clock | None = None,
        wall: Callable[[], float] = time.time,
        poll_interval: float = 0.05,
    ) -> None:
        if limits is not None and not isinstance(limits, Limits | Mapping):
            raise ConfigurationError(
                f"limits must be a Limits, a mapping of them or None, got {limits!r}"
            )
        if isinstance(limits, Mapping):
            for name, value in limits.items():
                if not isinstance(value, Limits):
                    raise ConfigurationError(f"limits[{name!r}] must be a Limits, got {value!r}")
        check_number("poll_interval", poll_interval, positive=True)
        self._limits = limits
        self._clock: Clock = clock or SystemClock()
        self._store: StateStore = store or MemoryStore(self._clock.now)
        # a MemoryStore's operations never suspend (its ``*_now`` methods are called
        # directly): nothing can cancel them halfway, and no coroutine is made for them
        self._local: MemoryStore | None = (
            self._store if isinstance(self._store, MemoryStore) else None
        )
        # the store made here reads this clock: a reading taken here serves it too
        self._same_clock = store is None
        self._wall = wall
        self._poll = poll_interval
        self._gates: dict[str, _Gate] = {}
        self._seq = itertools.count()
        self._prefix = uuid.uuid4().hex[:12]
        self._opened: list[tuple[str, float]] = []
        self._budgets: dict[tuple[str, float, float, float], SharedHedgeBudget] = {}
        self._loop: object = None  # the event loop it serves (see _bind)

    def __repr__(self) -> str:
        return f"Admission(targets={len(self._gates)}, store={self._store!r})"

    @property
    def store(self) -> StateStore:
        """Where the state lives."""
        return self._store

    def limits_for(self, target: str) -> Limits:
        """The limits of ``target`` (``"backend/model"``)."""
        limits = self._limits
        if isinstance(limits, Limits):
            return limits
        if limits is not None:
            found = limits.get(target) or limits.get(target.partition("/")[0])
            if found is not None:
                return found
        return _DEFAULT_LIMITS

    def _gate(self, target: str) -> _Gate:
        gate = self._gates.get(target)
        if gate is None:
            gate = self._gates[target] = _Gate(self.limits_for(target))
        return gate

    @staticmethod
    def _specs(gate: _Gate) -> list[tuple[str, float, float]]:
        """The limits in force on ``gate``: (kind, capacity, window), built once until
        they change."""
        specs = gate.specs
        if specs is not None:
            return specs
        found: dict[str, _Spec] = {}
        limits = gate.limits
        window = limits.window * (1.0 + limits.margin)
        if limits.rpm is not None:
            found["requests"] = _Spec(limits.rpm, window)
        if limits.tpm is not None:
            found["tokens"] = _Spec(limits.tpm, window)
        for kind, learned in gate.learned.items():
            mine = found.get(kind)
            # a learned limit never raises a configured one
            found[kind] = (
                learned
                if mine is None
                else _Spec(min(learned.capacity, mine.capacity), max(learned.window, window))
            )
        specs = gate.specs = [(kind, spec.capacity, spec.window) for kind, spec in found.items()]
        return specs

    def _costs(self, gate: _Gate, tokens: int, input_tokens: int) -> tuple[BucketCost, ...]:
        specs = self._specs(gate)
        cached = gate.costs
        if cached is not None and cached[0] is specs and cached[1] == (tokens, input_tokens):
            return cached[2]  # the same limits and sizes as the last request's
        costs = []
        for kind, capacity, window in specs:
            if kind == "requests":
                amount = 1.0
            elif kind == "tokens":
                amount = float(tokens)
            elif kind == "input_tokens":
                amount = float(input_tokens)
            else:
                amount = 0.0
            costs.append(BucketCost(kind, amount, capacity, window))
        made = tuple(costs)
        gate.costs = (specs, (tokens, input_tokens), made)
        return made

    # ------------------------------------------------------------------ acquiring

    async def acquire(
        self,
        target: str,
        *,
        tokens: int = 0,
        input_tokens: int | None = None,
        timeout: float | None = None,
        priority: int = 0,
        remaining: float | None = None,
    ) -> Permit:
        """Wait for capacity on ``target`` for one request of ``tokens`` tokens (its input
        estimate plus any output it reserves; ``input_tokens`` defaults to ``tokens``).

        Waiters on a target are served first in, first out; a higher ``priority`` goes
        ahead of lower ones. Processes sharing a store take turns (see
        :class:`~swiftclient.admission.StateStore`). The wait never runs past ``timeout``
        seconds (``None``: no limit): a wait known not to fit fails at once.
        ``remaining``: the seconds left to the call's deadline (``None``: not known). Once
        the target's typical attempt time is known (from the requests it answered), a
        request is admitted only while that much of the deadline is left: one that could
        not finish fails at once, and a wait ends that much before the deadline.

        Raises:
            RateLimited: no capacity within ``timeout`` (says which limit and when it
                frees), or (limit ``"deadline"``) too little of the deadline left.
        """
        if _current_loop() is not self._loop:
            self._bind()
        clock = self._clock
        start = clock.now()
        gate = self._gates.get(target) or self._gate(target)
        until = math.inf if timeout is None else start + max(0.0, timeout)
        need = gate.latency
        if remaining is not None and need is not None:
            if remaining < need:
                raise self._too_late(target, remaining, need)
            until = min(until, start + remaining - need)
        estimate = tokens if input_tokens is None else input_tokens
        # the caller's estimate (characters over chars_per_token) scaled by what this
        # target's usage has shown: JSON framing counts as characters, not as tokens
        scale = gate.input_scale
        inputs = estimate if scale == 1.0 else math.ceil(estimate * scale)
        tokens = max(0, tokens - estimate) + inputs
        store = self._store
        admit: Admit | None = None
        if not gate.queue:
            # nobody of this process waits here: ask at once, queue only when refused
            holder = self._holder(gate)
            local = self._local
            if local is not None:  # no coroutine: this process's store answers at once
                now = start if self._same_clock else None
                admit = self._take_local(local, gate, target, tokens, inputs, holder, now)
            else:
                admit = await self._take(gate, target, tokens, inputs, holder)
            if admit.granted:
                gate.in_flight += 1
                now = clock.now() if store.shared else start
                return Permit(target, holder, tokens, inputs, now, now - start, estimate)
        waiter = _Waiter(until)
        heapq.heappush(gate.queue, (-priority, next(self._seq), waiter))
        try:
            while True:
                if waiter.failure is not None:
                    raise waiter.failure
                now = clock.now()
                if admit is None:
                    if gate.head() is not waiter:
                        if gate.blocked_until > until:
                            raise self._refused(
                                target, gate.blocked_limit, gate.blocked_until - now
                            )
                        if now >= until:
                            raise self._refused(target, gate.blocked_limit, None)
                        if not await clock.wait(waiter.event, _left(until, now)):
                            continue  # timed out: the checks above raise
                        waiter.event = anyio.Event()
                        continue
                    holder = self._holder(gate)
                    admit = await self._take(gate, target, tokens, inputs, holder)
                    now = clock.now()
                    if admit.granted:
                        heapq.heappop(gate.queue)
                        gate.in_flight += 1
                        nxt = gate.head()
                        if nxt is not None:
                            nxt.event.set()
                        return Permit(target, holder, tokens, inputs, now, now - start, estimate)
                gate.in_line = True
                wait, limit, ahead = admit.wait, admit.limit or "concurrency", admit.ahead
                admit = None
                if ahead:
                    # other processes' turns come first: a guess of when this one's comes
                    if now >= until:
                        raise self._refused(target, limit, wait)
                    timeout_s = _left(until, now)
                    if wait is not None:
                        poll = max(wait, 0.001)
                    elif limit == "queue":  # capacity is free: theirs are quick turns
                        poll = min(self._poll, _TURN * ahead)
                    else:
                        poll = self._poll
                    timeout_s = poll if timeout_s is None else min(timeout_s, poll)
                    gate.blocked_limit = limit  # what this process's other waiters report
                elif wait is not None:
                    if now + wait > until:
                        raise self._refused(target, limit, wait)
                    gate.blocked_limit, gate.blocked_until = limit, now + wait
                    self._fail_queued(gate, target, limit, now)
                    timeout_s = wait
                else:
                    if now >= until:
                        raise self._refused(target, limit, None)
                    gate.blocked_limit = limit
                    timeout_s = _left(until, now)
                    if store.shared:
                        timeout_s = self._poll if timeout_s is None else min(timeout_s, self._poll)
                await clock.wait(gate.changed, timeout_s)
        except BaseException:
            was_head = gate.head() is waiter
            waiter.dead = True
            nxt = gate.head()
            if was_head and nxt is not None:
                nxt.event.set()
            if nxt is None and gate.in_line:
                # the last of this process's waiters: give up the place in line
                gate.in_line = False
                with anyio.CancelScope(shield=True):
                    await store.leave(target, self._prefix)
            raise

    def _holder(self, gate: _Gate) -> str | None:
        """A lease name, when the target has a concurrency limit to hold a lease of."""
        if gate.limits.concurrency is None and gate.aimd is None:
            return None
        return f"{self._prefix}:{next(self._seq)}"

    def _take_local(
        self,
        local: MemoryStore,
        gate: _Gate,
        target: str,
        tokens: int,
        inputs: int,
        holder: str | None,
        now: float | None = None,
    ) -> Admit:
        """:meth:`_take` on this process's own store, without awaiting (``now``: the
        store's clock reading, when the caller has one)."""
        limits = gate.limits
        admit = local.take_at(
            target,
            self._costs(gate, tokens, inputs),
            gate.concurrency(),
            holder,
            limits.lease_ttl,
            self._prefix,
            limits.queue_ttl,
            now,
        )
        if admit.granted:
            gate.in_line = False
        return admit

    async def _take(
        self, gate: _Gate, target: str, tokens: int, inputs: int, holder: str | None
    ) -> Admit:
        local = self._local
        if local is not None:
            return self._take_local(local, gate, target, tokens, inputs, holder)
        limits = gate.limits
        admit = await self._store.take(
            target,
            self._costs(gate, tokens, inputs),
            concurrency=gate.concurrency(),
            holder=holder,
            ttl=limits.lease_ttl,
            queue=self._prefix,
            queue_ttl=limits.queue_ttl,
        )
        if admit.granted:
            gate.in_line = False
        return admit

    def _too_late(self, target: str, remaining: float, need: float) -> RateLimited:
        return RateLimited(
            f"{target}: the call has {remaining:.3g}s of its deadline left and the target's "
            f"requests take {need:.3g}s; not sent",
            limit="deadline",
            reset_after=None,
            target=target,
            backend=target.partition("/")[0],
        )

    def _fail_queued(self, gate: _Gate, target: str, limit: str, now: float) -> None:
        """Waiters whose deadline comes before the head's rest ends cannot be served."""
        for _, _, waiter in gate.queue:
            if not waiter.dead and waiter.failure is None and waiter.until < gate.blocked_until:
                waiter.failure = self._refused(target, limit, gate.blocked_until - now)
                waiter.event.set()

    def _refused(self, target: str, limit: str | None, reset_after: float | None) -> RateLimited:
        limit = limit or "concurrency"
        if limit == "queue":
            message = (
                f"{target}: other processes sharing this target's limits were ahead in line "
                "until the call's deadline; not sent"
            )
        else:
            when = (
                f"it frees in {reset_after:.3g}s"
                if reset_after is not None and math.isfinite(reset_after)
                else "no slot freed in time"
            )
            message = (
                f"{target}: rate limit '{limit}' leaves no capacity within the call's deadline "
                f"({when})"
            )
        return RateLimited(
            message,
            limit=limit,
            reset_after=reset_after if reset_after is None or math.isfinite(reset_after) else None,
            target=target,
            backend=target.partition("/")[0],
        )

    def breaker_opened(self, target: str, seconds: float) -> None:
        """A circuit breaker of this process opened on ``target`` for ``seconds``. With a
        shared store, the next :meth:`settle` rests the target there for that long, so
        every process's admission refuses it (``RateLimited``, limit ``retry_after``) and
        its fallback moves on; with a store of this process only, nothing happens."""
        if self._store.shared and seconds > 0:
            self._opened.append((target, seconds))

    def hedge_budget(
        self,
        ratio: float = 0.05,
        floor_per_second: float = 1.0,
        burst: float = 10.0,
        *,
        key: str = "hedge",
    ) -> SharedHedgeBudget | None:
        """The hedge budget shared through this admission's store, or ``None`` when the
        store is this process's own (then a per-process budget is the same thing) or
        predates hedge budgets (it has no ``hedge``). The client asks for one when its
        admission has a shared store, so the fleet spends one budget (docs/rate-limits.md).

        Deposits the budget holds back are delivered by :meth:`settle` once they reach one
        token. The same arguments give the same budget (the clients of one process that
        share an admission pool their deposits)."""
        store = self._store
        if not store.shared or not callable(getattr(store, "hedge", None)):
            return None
        params = (key, ratio, floor_per_second, burst)
        budget = self._budgets.get(params)
        if budget is None:
            budget = self._budgets[params] = SharedHedgeBudget(
                store, ratio=ratio, floor_per_second=floor_per_second, burst=burst, key=key
            )
        return budget

    # ------------------------------------------------------------------ settling

    async def settle(
        self,
        permit: Permit,
        *,
        status: int | None = None,
        headers: Mapping[str, str] | None = None,
        total_tokens: int | None = None,
        input_tokens: int | None = None,
        output_tokens: int | None = None,
    ) -> None:
        """The request ended: give back its concurrency slot, learn from the response's
        ``status`` and ``headers`` (names in any case), correct the token estimate from
        usage. Runs shielded from cancellation, so call it from ``finally``."""
        gate = self._gates.get(permit.target) or self._gate(permit.target)
        target = permit.target
        local = self._local
        if local is not None:  # this process's store: every write at once, no coroutine
            try:
                if permit.holder is not None:
                    local.release_now(target, permit.holder)
                rest, levels, corrections = self._learned(
                    gate, permit, status, headers, total_tokens, input_tokens, output_tokens
                )
                if rest:
                    local.block_now(target, rest)
                if levels or corrections:
                    local.update_now(target, levels, corrections)
            finally:
                self._settled(gate)
            return
        store = self._store
        with anyio.CancelScope(shield=True):
            try:
                if permit.holder is not None:
                    await store.release(target, permit.holder)
                rest, levels, corrections = self._learned(
                    gate, permit, status, headers, total_tokens, input_tokens, output_tokens
                )
                if rest:
                    await store.block(target, rest)
                if levels or corrections:
                    # what the response taught, in one store operation (one round trip)
                    await store.update(target, levels, corrections)
                if self._opened:
                    opened, self._opened = self._opened, []
                    for name, seconds in opened:
                        await store.block(name, seconds)
                for budget in self._budgets.values():
                    if budget.due:  # a token's worth of deposits: deliver them
                        await budget.flush()
            finally:
                self._settled(gate)

    def _bind(self) -> None:
        """Serve the running event loop. Its waiters sleep on the loop's events, which
        another loop's thread cannot set (the wake-up was lost, and two blocking
        clients sharing one admission hung past their deadlines): while requests of
        another loop are in flight or waiting, ConfigurationError; once that loop's are
        done (a later ``anyio.run``, say), the admission moves to this one."""
        busy = any(
            gate.in_flight or any(not w.dead for *_, w in gate.queue)
            for gate in self._gates.values()
        )
        if busy:
            raise ConfigurationError(
                "this Admission is in use on another event loop (another thread's, or "
                "another blocking Client's): an Admission serves one event loop at a time. "
                "Give each Client its own Admission, with a RedisStore each to share limits "
                "between them"
            )
        for gate in self._gates.values():
            gate.queue.clear()
            gate.changed = anyio.Event()
        self._loop = _current_loop()

    @staticmethod
    def _settled(gate: _Gate) -> None:
        """A request of ``gate``'s is no longer in flight: the head of its queue re-checks."""
        gate.in_flight -= 1
        if gate.queue:
            gate.wake()
        else:  # nobody waits to re-check: forget a stale rest only
            gate.blocked_limit = None
            gate.blocked_until = -math.inf

    def _learned(
        self,
        gate: _Gate,
        permit: Permit,
        status: int | None,
        headers: Mapping[str, str] | None,
        total: int | None,
        inputs: int | None,
        outputs: int | None,
    ) -> tuple[float, list[tuple[BucketCost, float | None]], list[BucketCost]]:
        """What a response taught ``gate`` (its own state is updated here), and what the
        store must be told: seconds to rest the target (0: none), the levels the headers
        reported and the corrections usage makes to the reservation."""
        rest = 0.0
        learned = False
        levels: list[tuple[BucketCost, float | None]] = []
        if headers and gate.limits.learn:
            # only the names learned from: most responses carry none (no parse then)
            lowered = {}
            for name, value in headers.items():
                name = name.lower()
                if name.startswith(LEARNED_HEADERS):
                    lowered[name] = value
            if lowered:
                learned, rest = self._learn(gate, lowered, levels)
        if status == 429:
            gate.throttled += 1
            if not learned and gate.limits.learn:
                self._decrease(gate, permit)
        elif status is not None and 200 <= status < 300:
            if gate.aimd is not None:
                self._increase(gate)
            # the target's typical attempt time moves a fifth of the way to this one's
            took = self._clock.now() - permit.acquired_at
            seen = gate.latency
            gate.latency = took if seen is None else 0.8 * seen + 0.2 * took
        self._learn_scale(gate, permit, inputs)
        return rest, levels, self._corrections(gate, permit, total, inputs, outputs)

    def _learn(
        self,
        gate: _Gate,
        headers: dict[str, str],
        levels: list[tuple[BucketCost, float | None]],
    ) -> tuple[bool, float]:
        """Learn limits from ``headers``; append the levels they report to ``levels``.
        Returns whether they said anything, and the seconds of a ``Retry-After`` rest (0:
        none)."""
        info = parse_rate_limit_headers(headers, self._wall())
        limits = gate.limits
        window = limits.window * (1.0 + limits.margin)
        for kind, observed in info.limits.items():
            spec = _learned_spec(observed, gate.learned.get(kind), window, limits.margin)
            if spec is None:
                continue
            if gate.learned.get(kind) != spec:
                gate.learned[kind] = spec
                gate.specs = None
            if observed.remaining is not None:
                # what the provider counts as used is a floor under the log, never a ceiling
                level = BucketCost(kind, observed.remaining, spec.capacity, spec.window)
                levels.append((level, observed.reset_after))
        rest = 0.0
        if info.retry_after is not None and info.retry_after > 0:
            rest = min(info.retry_after, limits.max_retry_after)
        return bool(info.limits) or info.retry_after is not None, rest

    @staticmethod
    def _learn_scale(gate: _Gate, permit: Permit, counted: int | None) -> None:
        """Move the target's input scale a fifth of the way to what this request showed
        (the provider's input count over the caller's estimate), within [0.1, 10]."""
        if counted is None or counted <= 0 or permit.estimated_input <= 0:
            return
        seen = counted / permit.estimated_input
        gate.input_scale = min(10.0, max(0.1, 0.8 * gate.input_scale + 0.2 * seen))

    def _decrease(self, gate: _Gate, permit: Permit) -> None:
        """Multiplicative decrease, once per round: only a request sent after the last
        decrease can cause another one."""
        if permit.acquired_at <= gate.decreased_at:
            return
        current = gate.concurrency()
        base = gate.in_flight if current is None else current
        gate.aimd = max(1.0, math.floor(base / 2))
        gate.decreased_at = self._clock.now()
        logger.info("admission: %s answered 429; concurrency now %d", permit.target, gate.aimd)

    def _increase(self, gate: _Gate) -> None:
        """Additive increase: one slot more per limit's worth of successes."""
        if gate.aimd is None:
            return
        gate.aimd += 1.0 / gate.aimd
        configured = gate.limits.concurrency
        if (configured is not None and gate.aimd >= configured) or gate.aimd > _AIMD_CEILING:
            gate.aimd = None

    def _corrections(
        self,
        gate: _Gate,
        permit: Permit,
        total: int | None,
        inputs: int | None,
        outputs: int | None,
    ) -> list[BucketCost]:
        """What usage says the reservation missed by, per token limit."""
        corrections: list[BucketCost] = []
        if total is None and inputs is not None and outputs is not None:
            total = inputs + outputs
        for kind, capacity, window in gate.specs or self._specs(gate):
            if kind == "requests":  # the usual first: nothing to correct
                continue
            if kind == "tokens":
                used, reserved = total, permit.tokens
            elif kind == "input_tokens":
                used, reserved = inputs, permit.input_tokens
            elif kind == "output_tokens":
                used, reserved = outputs, 0
            else:
                continue
            if used is not None and used != reserved:
                corrections.append(BucketCost(kind, float(used - reserved), capacity, window))
        return corrections

    # ------------------------------------------------------------------ reading

    def concurrency(self, target: str) -> int | None:
        """The concurrency limit in force on ``target`` (configured or learned)."""
        gate = self._gates.get(target)
        return self.limits_for(target).concurrency if gate is None else gate.concurrency()

    def waiting(self, target: str) -> int:
        """Requests queued for ``target`` right now."""
        gate = self._gates.get(target)
        return 0 if gate is None else sum(1 for *_, w in gate.queue if not w.dead)

    def in_flight(self, target: str) -> int:
        """Requests admitted by this process and not settled yet."""
        gate = self._gates.get(target)
        return 0 if gate is None else gate.in_flight

    def headroom(self) -> dict[str, Headroom]:
        """The capacity of every target this process has asked for, by ``"backend/model"``
        (read without waiting: from this process's view of the store)."""
        peek = getattr(self._store, "peek_now", None)
        out: dict[str, Headroom] = {}
        for target, gate in self._gates.items():
            costs = self._costs(gate, 0, 0)
            levels: dict[str, float] = {}
            rest = 0.0
            if peek is not None:
                try:
                    levels, rest = peek(target, costs)
                except RuntimeError:  # no event loop running: no clock to read
                    pass
            out[target] = Headroom(
                concurrency=gate.concurrency(),
                in_flight=gate.in_flight,
                waiting=sum(1 for *_, w in gate.queue if not w.dead),
                requests=levels.get("requests"),
                tokens=levels.get("tokens"),
                rest=rest,
                throttled=gate.throttled,
            )
        return out


_DEFAULT_LIMITS = Limits()


def _left(until: float, now: float) -> float | None:
    return None if until == math.inf else max(0.0, until - now)


def _learned_spec(
    observed: Observed, previous: _Spec | None, window: float, margin: float
) -> _Spec | None:
    """A limit from a reported one: its capacity, over the configured window or, when the
    provider's reset says its window is longer, that (the margin added)."""
    limit = observed.limit if observed.limit is not None else None
    if limit is None:
        if previous is None:
            return None
        limit = previous.capacity
    if limit <= 0:
        return None
    if observed.reset_after:
        window = max(window, observed.reset_after * (1.0 + margin))
    if previous is not None:
        window = max(window, previous.window)
    return _Spec(limit, window)
