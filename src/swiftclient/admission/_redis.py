"""Admission state on a Redis server, shared by every process that points at it.

Each operation is one Lua script (``register_script``: EVALSHA, reloaded when the server
lost it), so a take checks and updates every limit's log and the lease set atomically on the
server, on the server's clock (``TIME``): processes never compare their own clocks.

A target's state is one hash (what each limit used within its window, the end of a rest),
one sorted set per limit logging its uses (scored by time, trimmed to the window), and one
sorted set of leases scored by their expiry; all expire when unused. A hedge budget is one
hash (its tokens, and the server time they were last refilled to). (The log keys are named
from the hash's key inside the scripts: one Redis server, not a cluster.) Reads
(:meth:`RedisStore.blocked_for`, :meth:`RedisStore.leases`) go through a short local cache.

When the server cannot be reached, every operation falls back to a per-process
:class:`~swiftclient.admission.MemoryStore` (one warning is logged per outage), and the
server is tried again after ``retry_after_down`` seconds: a store outage never fails a call.
An operation runs to its end (the socket timeout) even when its caller stops waiting for it
(a call's deadline came first), so a server that stalls is still found out.

redis-py's asyncio client runs on asyncio only. On trio the store runs it on a private
asyncio loop in one helper thread (a daemon: a store never closed does not keep the
interpreter from exiting), one thread hop per operation.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import anyio.to_thread

from .._budget import check_number
from .._deadline import running_loop
from ..errors import ConfigurationError
from ._store import Admit, BucketCost, MemoryStore

if TYPE_CHECKING:
    from redis.asyncio import Redis

__all__ = ["RedisStore"]

logger = logging.getLogger("swiftclient.admission")

_T = TypeVar("_T")

_NOW = """
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
-- A limit's log: a sorted set of 'seq:units' members scored by when they were used, and
-- the sum of what is in it ('u:' .. kind in the target's hash).
local function log_of(kind) return KEYS[1] .. ':log:' .. kind end
local function units_of(member) return tonumber(string.match(member, ':([^:]+)$')) end
local function trim(kind, window)
  local log = log_of(kind)
  local used = tonumber(redis.call('HGET', KEYS[1], 'u:' .. kind)) or 0
  local cutoff = now - window
  local gone = redis.call('ZRANGEBYSCORE', log, '-inf', cutoff)
  local changed = #gone > 0
  if changed then
    for _, member in ipairs(gone) do used = used - units_of(member) end
    redis.call('ZREMRANGEBYSCORE', log, '-inf', cutoff)
  end
  -- The sum is the log's: a log that expired whole (nothing used for longer than its
  -- window) leaves nothing used, though no entry was trimmed here.
  if used ~= 0 and (used < 0 or redis.call('ZCARD', log) == 0) then
    used = 0
    changed = true
  end
  if changed then redis.call('HSET', KEYS[1], 'u:' .. kind, tostring(used)) end
  return used
end
local function add(kind, window, used, units, at)
  if units <= 0 then return used end
  local seq = redis.call('HINCRBY', KEYS[1], 'seq', 1)
  local log = log_of(kind)
  redis.call('ZADD', log, at or now, seq .. ':' .. tostring(units))
  redis.call('PEXPIRE', log, math.ceil(window * 1000) + 1000)
  used = used + units
  redis.call('HSET', KEYS[1], 'u:' .. kind, tostring(used))
  return used
end
"""

_TAKE = (
    _NOW
    + """
-- The line (KEYS[3]: callers scored by ticket; KEYS[4]: when each one's place expires).
local queue = ARGV[3 + 4 * tonumber(ARGV[1]) + 2]
local ahead = 0
if queue ~= '' then
  while true do
    local head = redis.call('ZRANGE', KEYS[3], 0, 0)
    if #head == 0 or head[1] == queue then break end
    local expires = tonumber(redis.call('ZSCORE', KEYS[4], head[1]))
    if expires ~= nil and expires > now then break end
    redis.call('ZREM', KEYS[3], head[1])
    redis.call('ZREM', KEYS[4], head[1])
  end
  local rank = redis.call('ZRANK', KEYS[3], queue)
  if rank then ahead = rank else ahead = redis.call('ZCARD', KEYS[3]) end
end
local function refuse(limit, wait, free)
  if queue ~= '' then
    if redis.call('ZSCORE', KEYS[3], queue) == false then
      redis.call('ZADD', KEYS[3], redis.call('HINCRBY', KEYS[1], 'ticket', 1), queue)
    end
    local ttl = tonumber(ARGV[3 + 4 * tonumber(ARGV[1]) + 3])
    redis.call('ZADD', KEYS[4], now + (tonumber(wait) or 0) + ttl, queue)
    redis.call('PEXPIRE', KEYS[3], 3600000)
    redis.call('PEXPIRE', KEYS[4], 3600000)
    if redis.call('PTTL', KEYS[1]) < 0 then redis.call('PEXPIRE', KEYS[1], 3600000) end
  end
  return {0, limit, wait, free, ahead}
end
-- Seconds until 'turns' takes of 'cost' fit in the log of 'kind' (0: now).
local function wait_for(kind, cost, cap, window, u, turns)
  local excess = u + math.min(cost, cap) * turns - cap
  if excess <= 1e-9 then return 0 end
  local entries = redis.call('ZRANGE', log_of(kind), 0, -1, 'WITHSCORES')
  for j = 1, #entries, 2 do
    excess = excess - units_of(entries[j])
    if excess <= 1e-9 then return math.max(0, tonumber(entries[j + 1]) + window - now) end
  end
  return window
end
local blocked = tonumber(redis.call('HGET', KEYS[1], 'blocked'))
if blocked ~= nil and now < blocked then
  return refuse('retry_after', tostring(blocked - now), '')
end
local n = tonumber(ARGV[1])
local used = {}
local longest = 0
local slowest, slowest_wait = 'queue', 0
for i = 0, n - 1 do
  local kind = ARGV[2 + 4 * i]
  local cost = tonumber(ARGV[3 + 4 * i])
  local cap = tonumber(ARGV[4 + 4 * i])
  local window = tonumber(ARGV[5 + 4 * i])
  if window > longest then longest = window end
  local u = trim(kind, window)
  local wait = wait_for(kind, cost, cap, window, u, ahead + 1)
  if ahead == 0 and wait > 0 then
    return refuse(kind, tostring(wait), tostring(cap - u))
  end
  if wait > slowest_wait then slowest, slowest_wait = kind, wait end
  used[i + 1] = u
end
if ahead > 0 then
  -- others' turns come first: how long until theirs and this one fit
  if slowest_wait > 0 then return refuse(slowest, tostring(slowest_wait), '') end
  return refuse('queue', '', '')
end
local base = 2 + 4 * n
local limit = tonumber(ARGV[base])
if limit >= 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  if redis.call('ZCARD', KEYS[2]) >= limit then return refuse('concurrency', '', '') end
  local ttl = tonumber(ARGV[base + 2])
  if ARGV[base + 1] ~= '' then
    redis.call('ZADD', KEYS[2], now + ttl, ARGV[base + 1])
    redis.call('PEXPIRE', KEYS[2], math.ceil(ttl * 1000) + 1000)
  end
end
if queue ~= '' then
  redis.call('ZREM', KEYS[3], queue)
  redis.call('ZREM', KEYS[4], queue)
end
local left = {1}
for i = 0, n - 1 do
  local kind = ARGV[2 + 4 * i]
  local cap = tonumber(ARGV[4 + 4 * i])
  local spent = math.min(tonumber(ARGV[3 + 4 * i]), cap)
  local u = add(kind, tonumber(ARGV[5 + 4 * i]), used[i + 1], spent)
  left[i + 2] = tostring(cap - u)
end
if n > 0 then
  redis.call('PEXPIRE', KEYS[1], math.max(3600000, math.ceil(longest * 1000) + 1000))
end
return left
"""
)

_LEAVE = """
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return 1
"""

_ADJUST = (
    _NOW
    + """
-- ARGV: the number of changes, then six per change: kind, cost, capacity, window, mode
-- ('set': the provider's remaining level, with its reset in seconds or ''; else a
-- correction), reset.
local longest = 0
for i = 0, tonumber(ARGV[1]) - 1 do
  local kind = ARGV[2 + 6 * i]
  local cost = tonumber(ARGV[3 + 6 * i])
  local cap = tonumber(ARGV[4 + 6 * i])
  local window = tonumber(ARGV[5 + 6 * i])
  if window > longest then longest = window end
  local used = trim(kind, window)
  if ARGV[6 + 6 * i] == 'set' then
    local at = now
    local reset = ARGV[7 + 6 * i]
    if reset ~= '' then at = math.min(now, now + tonumber(reset) - window) end
    add(kind, window, used, cap - math.max(0, cost) - used, at)
  elseif cost > 0 then
    add(kind, window, used, math.min(cost, 2 * cap - used))
  else
    -- give back from the oldest entries (they leave the window first), a page at a time:
    -- an entry used up is removed, so the next page starts where this one stopped
    local back = -cost
    local log = log_of(kind)
    while back > 0 do
      local entries = redis.call('ZRANGE', log, 0, 15, 'WITHSCORES')
      if #entries == 0 then break end
      for j = 1, #entries, 2 do
        if back <= 0 then break end
        local member = entries[j]
        local units = units_of(member)
        local taken = math.min(units, back)
        back = back - taken
        used = used - taken
        redis.call('ZREM', log, member)
        if units - taken > 0 then
          local seq = string.match(member, '^([^:]+):')
          redis.call('ZADD', log, entries[j + 1], seq .. ':' .. tostring(units - taken))
        end
      end
    end
    if used < 0 then used = 0 end
    redis.call('HSET', KEYS[1], 'u:' .. kind, tostring(used))
  end
end
redis.call('PEXPIRE', KEYS[1], math.max(3600000, math.ceil(longest * 1000) + 1000))
return 1
"""
)

_BLOCK = (
    _NOW
    + """
local untl = now + tonumber(ARGV[1])
local current = tonumber(redis.call('HGET', KEYS[1], 'blocked'))
if current == nil or untl > current then
  redis.call('HSET', KEYS[1], 'blocked', tostring(untl))
end
local left = math.ceil((untl - now) * 1000) + 1000
if redis.call('PTTL', KEYS[1]) < left then redis.call('PEXPIRE', KEYS[1], left) end
return 1
"""
)

_READ = (
    _NOW
    + """
local blocked = tonumber(redis.call('HGET', KEYS[1], 'blocked'))
local left = 0
if blocked ~= nil and blocked > now then left = blocked - now end
return {tostring(left), redis.call('ZCOUNT', KEYS[2], '(' .. tostring(now), '+inf')}
"""
)


_HEDGE = """
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
-- ARGV: deposit, floor per second, burst, spend ('1' or '0'). The arithmetic of
-- HedgeBudget: refill from the time since the last operation, add the deposit, cap at the
-- burst, then take one token if asked and there is one.
local deposit = tonumber(ARGV[1])
local floor = tonumber(ARGV[2])
local burst = tonumber(ARGV[3])
local tokens = tonumber(redis.call('HGET', KEYS[1], 'tokens'))
local last = tonumber(redis.call('HGET', KEYS[1], 'last'))
if tokens == nil then tokens = burst end
if last == nil or now > last then
  if last ~= nil then tokens = tokens + (now - last) * floor end
  last = now
end
if deposit > 0 then tokens = tokens + deposit end
tokens = math.min(burst, tokens)
local taken = 0
if ARGV[4] == '1' and tokens >= 1 then
  tokens = tokens - 1
  taken = 1
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'last', tostring(last))
if floor > 0 then
  -- idle this long, the bucket would be full again anyway: forgetting it changes nothing
  redis.call('PEXPIRE', KEYS[1], math.max(3600000, math.ceil(burst / floor * 1000) + 1000))
else
  redis.call('PERSIST', KEYS[1])
end
return {taken, tostring(tokens)}
"""


def _redis_module() -> Any:
    try:
        import redis.asyncio
        import redis.exceptions
    except ImportError as exc:
        raise ConfigurationError(
            "RedisStore needs the redis client: pip install 'swiftclient-llm[redis]'"
        ) from exc
    return redis


class RedisStore:
    """Admission state on Redis (see the module): usage logs, leases and rests shared by a
    fleet.

    Args:
        url: the server, ``redis://host:6379/0`` or ``unix:///path/to/redis.sock``.
        prefix: put before every key (one namespace per application).
        cache_ttl: seconds a read (rest left, live leases) is served from the local cache.
        retry_after_down: seconds the store stays on its per-process fallback after the
            server failed, before it tries the server again.
        timeout: the socket timeout of each operation (and of connecting).
        client: a ``redis.asyncio.Redis`` to use instead of ``url`` (asyncio only; the
            store does not close it).

    Raises:
        ConfigurationError: the ``redis`` extra is not installed, neither or both of
            ``url`` and ``client`` are given, or a number is out of range.
    """

    shared = True

    def __init__(
        self,
        url: str | None = None,
        *,
        prefix: str = "swiftclient:admission:",
        cache_ttl: float = 0.05,
        retry_after_down: float = 5.0,
        timeout: float = 0.5,
        client: Redis | None = None,
    ) -> None:
        module = _redis_module()
        if (url is None) == (client is None):
            raise ConfigurationError("RedisStore needs exactly one of url= and client=")
        check_number("cache_ttl", cache_ttl, positive=False)
        check_number("retry_after_down", retry_after_down, positive=False)
        check_number("timeout", timeout, positive=True)
        self._errors: tuple[type[BaseException], ...] = (
            module.exceptions.RedisError,
            OSError,
            TimeoutError,
        )
        self._url = url
        self._timeout = timeout
        self._prefix = prefix
        self._cache_ttl = cache_ttl
        self._retry_after_down = retry_after_down
        self._client: Redis | None = client
        # With url=: one client (and its loaded scripts) per event loop, since redis-py's
        # connections belong to the loop that opened them: two blocking Clients (each runs
        # its own loop) may share the store, and it outlives an ``anyio.run``.
        self._per_loop: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, tuple[Redis, dict[str, Any]]
        ] = weakref.WeakKeyDictionary()
        self._fallback = MemoryStore()
        # Leases a take may have left on Redis though the call saw it fail (Redis ran the
        # script after the client's timeout), and those of them released since: removed on
        # Redis once it answers again, or each would hold a slot for its whole ttl.
        self._uncertain: set[tuple[str, str]] = set()
        self._to_release: set[tuple[str, str]] = set()
        # Leases taken on Redis and not released yet: one whose release cannot reach Redis
        # (the store is down, or the removal failed) goes to _to_release, not lost.
        self._held: set[tuple[str, str]] = set()
        self._down_until = -math.inf
        self._warned = False
        self._cache: dict[str, tuple[float, float, int]] = {}
        self._levels: dict[str, tuple[float, dict[str, float]]] = {}
        self._helper: _HelperLoop | None = None
        self._helper_lock = threading.Lock()
        # Operations on this process's asyncio loops, each run to its own end (its socket
        # timeout) even when its caller stopped waiting (a call's deadline came first).
        self._pending: set[asyncio.Future[Any]] = set()

    def __repr__(self) -> str:
        where = "client" if self._url is None else _safe_url(self._url)
        return f"RedisStore({where!r}, prefix={self._prefix!r})"

    @property
    def degraded(self) -> bool:
        """True while the store runs on its per-process fallback (readable anywhere: the
        store times its own pauses on the monotonic clock, not an event loop's)."""
        return time.monotonic() < self._down_until

    # ------------------------------------------------------------------ plumbing

    def _connection(self) -> tuple[Redis, dict[str, Any]]:
        """The running loop's client and its scripts (called on an asyncio loop)."""
        loop = asyncio.get_running_loop()
        found = self._per_loop.get(loop)
        if found is None:
            client = self._client
            if client is None:
                client = _redis_module().asyncio.Redis.from_url(
                    self._url, socket_timeout=self._timeout, socket_connect_timeout=self._timeout
                )
            found = self._per_loop[loop] = (client, {})
        return found

    def _redis(self) -> Redis:
        return self._connection()[0]

    def _script(self, name: str, source: str) -> Any:
        client, scripts = self._connection()
        script = scripts.get(name)
        if script is None:
            script = scripts[name] = client.register_script(source)
        return script

    async def _eval(self, name: str, source: str, keys: list[str], args: list[Any]) -> Any:
        return await self._script(name, source)(keys=keys, args=args)

    def _start_helper(self) -> _HelperLoop:
        with self._helper_lock:
            if self._helper is None:
                self._helper = _HelperLoop()
            return self._helper

    async def _on_asyncio(self, fn: Callable[..., Awaitable[_T]], *args: Any) -> _T:
        """Run ``fn`` on asyncio: here, or on the helper loop when this loop is trio's.

        The operation runs to its own end while the caller may stop waiting (cancelled: a
        call's deadline shorter than the socket timeout), so a stalled server still times
        out and puts the store on its fallback for the calls after it (each of them was
        cut off by its deadline before, and none learnt that the server was down)."""
        operation = self._guarded(fn, args)
        if running_loop() is not None:
            task = asyncio.ensure_future(operation)
            self._pending.add(task)
            task.add_done_callback(self._ended)
            try:
                return await asyncio.shield(task)
            except asyncio.CancelledError:
                if task.cancelled() and not _being_cancelled():
                    raise _closed() from None  # the store's closing ended it, not the caller
                raise
        helper = self._helper
        if helper is None:
            try:
                helper = await anyio.to_thread.run_sync(self._start_helper)
            except BaseException:
                operation.close()
                raise
        future = asyncio.run_coroutine_threadsafe(operation, helper.loop)
        try:
            return await anyio.to_thread.run_sync(future.result, abandon_on_cancel=True)
        except concurrent.futures.CancelledError:  # the store's closing ended it
            raise _closed() from None

    def _ended(self, task: asyncio.Future[Any]) -> None:
        self._pending.discard(task)
        if not task.cancelled():
            task.exception()  # seen here: a caller that stopped waiting never reads it

    async def _guarded(self, fn: Callable[..., Awaitable[_T]], args: Sequence[Any]) -> _T:
        """``fn(*args)``; a failure of the server puts the store on its fallback."""
        try:
            return await fn(*args)
        except self._errors as exc:
            self._down_until = time.monotonic() + self._retry_after_down
            if not self._warned:
                self._warned = True
                logger.warning(
                    "admission: the Redis store failed (%s); using per-process limits until "
                    "it answers again",
                    type(exc).__name__,
                )
            raise

    async def _cancel_pending(self) -> None:
        """Cancel the operations still running on this loop and wait for them (closing
        their connections under them would read as the server failing)."""
        if running_loop() is None:
            return
        loop = asyncio.get_running_loop()
        # (a copy first: other loops' threads add and remove theirs meanwhile)
        ours = [task for task in tuple(self._pending) if task.get_loop() is loop]
        for task in ours:
            task.cancel()
        if ours:
            await asyncio.wait(ours)

    async def _run(
        self, fn: Callable[..., Awaitable[_T]], args: Sequence[Any], local: Callable[[], _T]
    ) -> _T:
        now = time.monotonic()
        if now < self._down_until:
            return local()
        try:
            if self._to_release:  # first: the leases failed takes left hold slots
                await self._release_orphans()
            result = await self._on_asyncio(fn, *args)
        except self._errors:  # the store is on its fallback now (_guarded)
            return local()
        if self._warned:
            self._warned = False
            logger.info("admission: the Redis store answers again; limits are shared again")
        return result

    async def _release_orphans(self) -> None:
        """Remove from Redis the released leases a failed take may have left there (the
        store's errors propagate, to :meth:`_run`)."""
        pending = list(self._to_release)

        async def remove() -> None:
            client = self._redis()
            for key, holder in pending:
                await client.zrem(self._keys(key)[1], holder)

        await self._on_asyncio(remove)
        self._to_release.difference_update(pending)

    def _keys(self, key: str) -> list[str]:
        base = self._prefix + key
        return [base, base + ":leases", base + ":line", base + ":line:expires"]

    # ------------------------------------------------------------------ StateStore

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
        """See :meth:`~swiftclient.admission.StateStore.take`."""
        args: list[Any] = [len(costs)]
        for cost in costs:
            args.extend(_cost_args(cost))
        args.extend((-1 if concurrency is None else concurrency, holder or "", repr(ttl)))
        args.extend((queue or "", repr(queue_ttl)))

        seen: dict[str, float] = {}
        tried = abandoned = False

        async def remote() -> Admit:
            # may run on the helper loop (trio): its clock is not the caller's
            nonlocal tried
            tried = True
            reply = await self._eval("take", _TAKE, self._keys(key), args)
            if int(reply[0]) == 1:
                for cost, value in zip(costs, reply[1:], strict=False):
                    seen[cost.kind] = float(_text(value))
                if holder and concurrency is not None:
                    # a caller that stopped waiting gets no permit: nothing would release it
                    (self._to_release if abandoned else self._held).add((key, holder))
                return Admit(True)
            limit = _text(reply[1])
            wait = _text(reply[2])
            free = _text(reply[3])
            if free:
                seen[limit] = float(free)
            return Admit(False, limit, float(wait) if wait else None, int(reply[4]))

        def local() -> Admit:
            if tried and holder:  # the script may still run: its lease would outlive the call
                self._uncertain.add((key, holder))
            return self._fallback.take_now(
                key,
                costs,
                concurrency=concurrency,
                holder=holder,
                ttl=ttl,
                queue=queue,
                queue_ttl=queue_ttl,
            )

        try:
            admit = await self._run(remote, (), local)
        except BaseException:
            abandoned = True
            if holder:
                # Cancelled: no permit comes back, so nothing releases the lease the script
                # may leave; it runs to its end even when it has not begun yet (and then
                # queues it itself): the next operation removes it.
                self._held.discard((key, holder))
                self._to_release.add((key, holder))
            raise
        if seen:
            self._levels[key] = (time.monotonic(), seen)
        return admit

    async def leave(self, key: str, queue: str) -> None:
        """See :meth:`~swiftclient.admission.StateStore.leave`."""

        async def remote() -> None:
            await self._eval("leave", _LEAVE, self._keys(key)[2:], [queue])

        self._fallback.leave_now(key, queue)
        await self._run(remote, (), lambda: None)

    async def release(self, key: str, holder: str) -> None:
        """See :meth:`~swiftclient.admission.StateStore.release`."""
        leases = self._keys(key)[1]

        async def remote() -> None:
            await self._redis().zrem(leases, holder)

        def local() -> None:
            if on_redis:  # down, or the removal failed: removed once Redis answers
                self._to_release.add((key, holder))

        self._fallback.release_now(key, holder)
        on_redis = (key, holder) in self._held
        self._held.discard((key, holder))
        if (key, holder) in self._uncertain:
            self._uncertain.discard((key, holder))
            self._to_release.add((key, holder))  # until Redis confirms it is gone
            await self._run(_nothing, (), lambda: None)  # removes it, when Redis answers
            return
        await self._run(remote, (), local)

    async def update(
        self,
        key: str,
        levels: Sequence[tuple[BucketCost, float | None]] = (),
        corrections: Sequence[BucketCost] = (),
    ) -> None:
        """See :meth:`~swiftclient.admission.StateStore.update` (one script: one round
        trip for all of them)."""
        if not levels and not corrections:
            return
        args: list[Any] = [len(levels) + len(corrections)]
        for cost, reset in levels:
            args.extend(_cost_args(cost))
            args.extend(("set", "" if reset is None else repr(float(reset))))
        for cost in corrections:
            args.extend(_cost_args(cost))
            args.extend(("adjust", ""))

        async def remote() -> None:
            await self._eval("adjust", _ADJUST, self._keys(key)[:1], args)

        await self._run(remote, (), lambda: self._fallback.update_now(key, levels, corrections))

    async def adjust(self, key: str, cost: BucketCost) -> None:
        """See :meth:`~swiftclient.admission.StateStore.adjust`."""
        await self.update(key, (), (cost,))

    async def set_level(self, key: str, cost: BucketCost, reset: float | None = None) -> None:
        """See :meth:`~swiftclient.admission.StateStore.set_level`."""
        await self.update(key, ((cost, reset),))

    async def block(self, key: str, seconds: float) -> None:
        """See :meth:`~swiftclient.admission.StateStore.block`."""

        async def remote() -> None:
            await self._eval("block", _BLOCK, self._keys(key)[:1], [repr(float(seconds))])

        self._cache.pop(key, None)
        await self._run(remote, (), lambda: self._fallback.block_now(key, seconds))

    async def _read(self, key: str) -> tuple[float, int]:
        now = time.monotonic()
        cached = self._cache.get(key)
        if cached is not None and now - cached[0] < self._cache_ttl:
            return cached[1], cached[2]

        async def remote() -> tuple[float, int]:
            reply = await self._eval("read", _READ, self._keys(key)[:2], [])
            return float(_text(reply[0])), int(reply[1])

        def local() -> tuple[float, int]:
            return self._fallback.blocked_for_now(key), self._fallback.leases_now(key)

        left, leases = await self._run(remote, (), local)
        self._cache[key] = (now, left, leases)
        return left, leases

    async def blocked_for(self, key: str) -> float:
        """See :meth:`~swiftclient.admission.StateStore.blocked_for` (cached briefly)."""
        return (await self._read(key))[0]

    async def leases(self, key: str) -> int:
        """See :meth:`~swiftclient.admission.StateStore.leases` (cached briefly)."""
        return (await self._read(key))[1]

    async def hedge(
        self, key: str, deposit: float, *, spend: bool, floor_per_second: float, burst: float
    ) -> tuple[bool, float]:
        """See :meth:`~swiftclient.admission.StateStore.hedge`: one script run on the
        server's clock. While the server is down, the per-process fallback's budget (the
        deposits go there)."""
        args = [repr(float(deposit)), repr(float(floor_per_second)), repr(float(burst))]
        args.append("1" if spend else "0")

        async def remote() -> tuple[bool, float]:
            reply = await self._eval("hedge", _HEDGE, [self._prefix + key], args)
            return int(reply[0]) == 1, float(_text(reply[1]))

        def local() -> tuple[bool, float]:
            return self._fallback.hedge_now(
                key, deposit, spend=spend, floor_per_second=floor_per_second, burst=burst
            )

        return await self._run(remote, (), local)

    def peek_now(self, key: str, costs: Sequence[BucketCost]) -> tuple[dict[str, float], float]:
        """What this process last saw of ``key`` (the units free after its last take; the
        rest from the read cache), without asking the server: other processes' takes since
        then, and what left the window since, are not in it. The fallback's own state while
        degraded."""
        now = time.monotonic()
        if now < self._down_until:
            return self._fallback.peek_now(key, costs)
        seen = self._levels.get(key, (now, {}))[1]
        levels = {
            cost.kind: min(cost.capacity, seen.get(cost.kind, cost.capacity)) for cost in costs
        }
        cached = self._cache.get(key)
        rest = 0.0 if cached is None else max(0.0, cached[1] - (now - cached[0]))
        return levels, rest

    async def aclose(self) -> None:
        """Close the connections the store opened, and its helper loop on trio."""
        # the clients this store opened: this loop's (or the helper loop's) is closed;
        # another loop's connections can only be dropped (its loop may be gone)
        owned = self._client is None
        clients, self._per_loop = self._per_loop, weakref.WeakKeyDictionary()
        with anyio.CancelScope(shield=True):
            await self._cancel_pending()
            helper = self._helper
            if helper is not None:
                await anyio.to_thread.run_sync(helper.cancel_all)
            if owned and clients:

                async def close_ours() -> None:
                    ours = clients.get(asyncio.get_running_loop())
                    if ours is not None:
                        await ours[0].aclose()

                try:
                    await self._on_asyncio(close_ours)
                except self._errors:
                    pass
            helper, self._helper = self._helper, None
            if helper is not None:
                await anyio.to_thread.run_sync(helper.close)

    async def aclose_loop(self) -> None:
        """Close the connections the store opened for the running event loop, which is
        about to end (the blocking :class:`~swiftclient.Client` calls this as it closes its
        own loop); the store stays open, and a later operation on a loop opens new ones.
        On trio, nothing: its operations run on the store's helper loop, which
        :meth:`aclose` closes."""
        if running_loop() is None:
            return
        with anyio.CancelScope(shield=True):
            await self._cancel_pending()
        found = self._per_loop.pop(asyncio.get_running_loop(), None)
        if found is None or self._client is not None:  # a client= given is the caller's
            return
        with anyio.CancelScope(shield=True):
            try:
                await found[0].aclose()
            except self._errors:
                pass

    async def __aenter__(self) -> RedisStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


class _HelperLoop:
    """A private asyncio loop in a daemon thread, for redis-py's asyncio client on trio. A
    daemon thread: a store never closed does not keep the interpreter from exiting (the
    thread of anyio's blocking portal did)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        started = threading.Event()
        self._thread = threading.Thread(
            target=self._main, args=(started,), name="swiftclient-redis", daemon=True
        )
        self._thread.start()
        started.wait()

    def _main(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(started.set)
        self.loop.run_forever()

    def cancel_all(self) -> None:
        """Cancel the operations still running on the loop and wait for them (from a
        worker thread)."""

        async def cancel() -> None:
            current = asyncio.current_task()
            others = [task for task in asyncio.all_tasks() if task is not current]
            for task in others:
                task.cancel()
            if others:
                await asyncio.wait(others)

        asyncio.run_coroutine_threadsafe(cancel(), self.loop).result()

    def close(self) -> None:
        """Stop the loop and its thread (from a worker thread)."""
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


def _being_cancelled() -> bool:
    """Whether the running asyncio task has a cancellation pending (its own, not one of an
    operation it waits for)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _closed() -> ConnectionError:
    """The error an operation the store's closing cancelled gives its caller: a store
    failure, so the call carries on under the per-process fallback."""
    return ConnectionError("the admission store was closed while this operation ran")


async def _nothing() -> None:
    """No store operation (:meth:`RedisStore._run` does its pending removals first)."""


def _cost_args(cost: BucketCost) -> tuple[str, str, str, str]:
    """A cost as its scripts read it: kind, cost, capacity, window."""
    return cost.kind, repr(cost.cost), repr(cost.capacity), repr(cost.window)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _safe_url(url: str) -> str:
    """The URL without credentials (``redis://user:password@host`` shows the host only)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    return scheme + "://" + rest.rpartition("@")[2]
