"""Admission state on a Redis server, shared by every process that points at it.

Each operation is one Lua script (``register_script``: EVALSHA, reloaded when the server
lost it), so a take checks and updates every bucket and the lease set atomically on the
server, on the server's clock (``TIME``): processes never compare their own clocks.

A target's state is one hash (bucket levels and update times, the end of a rest) and one
sorted set of leases scored by their expiry; both expire when unused. Reads
(:meth:`RedisStore.blocked_for`, :meth:`RedisStore.leases`) go through a short local cache.

When the server cannot be reached, every operation falls back to a per-process
:class:`~swiftclient.admission.MemoryStore` (one warning is logged per outage), and the
server is tried again after ``retry_after_down`` seconds: a store outage never fails a call.

redis-py's asyncio client runs on asyncio only. On trio the store runs it on a private
asyncio loop in one helper thread (an anyio blocking portal), one thread hop per operation.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import anyio.from_thread
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
local function level_of(key, kind, cap, rate)
  local level = tonumber(redis.call('HGET', key, 'l:' .. kind))
  if level == nil then return cap end
  local at = tonumber(redis.call('HGET', key, 't:' .. kind)) or now
  return math.min(cap, level + math.max(0, now - at) * rate)
end
"""

_TAKE = (
    _NOW
    + """
local blocked = tonumber(redis.call('HGET', KEYS[1], 'blocked'))
if blocked ~= nil and now < blocked then
  return {0, 'retry_after', tostring(blocked - now)}
end
local n = tonumber(ARGV[1])
local levels = {}
for i = 0, n - 1 do
  local kind = ARGV[2 + 4 * i]
  local cost = tonumber(ARGV[3 + 4 * i])
  local cap = tonumber(ARGV[4 + 4 * i])
  local rate = tonumber(ARGV[5 + 4 * i])
  local level = level_of(KEYS[1], kind, cap, rate)
  local need = math.min(cost, cap) - level
  if need > 0 then
    if rate <= 0 then return {0, kind, 'inf'} end
    return {0, kind, tostring(need / rate)}
  end
  levels[i + 1] = level
end
local base = 2 + 4 * n
local limit = tonumber(ARGV[base])
if limit >= 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  if redis.call('ZCARD', KEYS[2]) >= limit then return {0, 'concurrency', ''} end
  local ttl = tonumber(ARGV[base + 2])
  if ARGV[base + 1] ~= '' then
    redis.call('ZADD', KEYS[2], now + ttl, ARGV[base + 1])
    redis.call('PEXPIRE', KEYS[2], math.ceil(ttl * 1000) + 1000)
  end
end
local left = {1}
for i = 0, n - 1 do
  local kind = ARGV[2 + 4 * i]
  local spent = math.min(tonumber(ARGV[3 + 4 * i]), tonumber(ARGV[4 + 4 * i]))
  left[i + 2] = tostring(levels[i + 1] - spent)
  redis.call('HSET', KEYS[1], 'l:' .. kind, left[i + 2], 't:' .. kind, tostring(now))
end
if n > 0 then redis.call('PEXPIRE', KEYS[1], 3600000) end
return left
"""
)

_ADJUST = (
    _NOW
    + """
local kind = ARGV[1]
local cost = tonumber(ARGV[2])
local cap = tonumber(ARGV[3])
local level
if ARGV[5] == 'set' then
  level = math.max(-cap, math.min(cap, cost))
else
  level = math.max(-cap, level_of(KEYS[1], kind, cap, tonumber(ARGV[4])) - cost)
end
redis.call('HSET', KEYS[1], 'l:' .. kind, tostring(level), 't:' .. kind, tostring(now))
redis.call('PEXPIRE', KEYS[1], 3600000)
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
    """Admission state on Redis (see the module): buckets, leases and rests shared by a fleet.

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
        self._owns_client = client is None
        self._scripts: dict[str, Any] = {}
        self._fallback = MemoryStore()
        self._down_until = -math.inf
        self._warned = False
        self._cache: dict[str, tuple[float, float, int]] = {}
        self._levels: dict[str, tuple[float, dict[str, float]]] = {}
        self._portal_cm: AbstractContextManager[anyio.from_thread.BlockingPortal] | None = None
        self._portal: anyio.from_thread.BlockingPortal | None = None
        self._portal_lock = threading.Lock()

    def __repr__(self) -> str:
        where = "client" if self._url is None else _safe_url(self._url)
        return f"RedisStore({where!r}, prefix={self._prefix!r})"

    @property
    def degraded(self) -> bool:
        """True while the store runs on its per-process fallback."""
        return anyio.current_time() < self._down_until

    # ------------------------------------------------------------------ plumbing

    def _redis(self) -> Redis:
        client = self._client
        if client is None:
            module = _redis_module()
            client = self._client = module.asyncio.Redis.from_url(
                self._url, socket_timeout=self._timeout, socket_connect_timeout=self._timeout
            )
        return client

    def _script(self, name: str, source: str) -> Any:
        script = self._scripts.get(name)
        if script is None:
            script = self._scripts[name] = self._redis().register_script(source)
        return script

    async def _eval(self, name: str, source: str, keys: list[str], args: list[Any]) -> Any:
        return await self._script(name, source)(keys=keys, args=args)

    def _start_portal(self) -> anyio.from_thread.BlockingPortal:
        with self._portal_lock:
            if self._portal is None:
                cm = anyio.from_thread.start_blocking_portal("asyncio")
                self._portal = cm.__enter__()
                self._portal_cm = cm
            return self._portal

    async def _on_asyncio(self, fn: Callable[..., Awaitable[_T]], *args: Any) -> _T:
        """Run ``fn`` on asyncio: here, or on the helper loop when this loop is trio's."""
        if running_loop() is not None:
            return await fn(*args)
        portal = self._portal
        if portal is None:
            portal = await anyio.to_thread.run_sync(self._start_portal)
        return await anyio.to_thread.run_sync(portal.call, fn, *args)

    async def _run(
        self, fn: Callable[..., Awaitable[_T]], args: Sequence[Any], local: Callable[[], _T]
    ) -> _T:
        now = anyio.current_time()
        if now < self._down_until:
            return local()
        try:
            result = await self._on_asyncio(fn, *args)
        except self._errors as exc:
            self._down_until = anyio.current_time() + self._retry_after_down
            if not self._warned:
                self._warned = True
                logger.warning(
                    "admission: the Redis store failed (%s); using per-process limits until "
                    "it answers again",
                    type(exc).__name__,
                )
            return local()
        if self._warned:
            self._warned = False
            logger.info("admission: the Redis store answers again; limits are shared again")
        return result

    def _keys(self, key: str) -> list[str]:
        base = self._prefix + key
        return [base, base + ":leases"]

    # ------------------------------------------------------------------ StateStore

    async def take(
        self,
        key: str,
        costs: Sequence[BucketCost],
        *,
        concurrency: int | None = None,
        holder: str | None = None,
        ttl: float = 300.0,
    ) -> Admit:
        """See :meth:`~swiftclient.admission.StateStore.take`."""
        args: list[Any] = [len(costs)]
        for cost in costs:
            args.extend((cost.kind, repr(cost.cost), repr(cost.capacity), repr(cost.rate)))
        args.extend((-1 if concurrency is None else concurrency, holder or "", repr(ttl)))

        seen: dict[str, float] = {}

        async def remote() -> Admit:
            # may run on the helper loop (trio): its clock is not the caller's
            reply = await self._eval("take", _TAKE, self._keys(key), args)
            if int(reply[0]) == 1:
                for cost, value in zip(costs, reply[1:], strict=False):
                    seen[cost.kind] = float(_text(value))
                return Admit(True)
            limit = _text(reply[1])
            wait = _text(reply[2])
            if wait and limit != "retry_after":
                for cost in costs:
                    if cost.kind == limit and math.isfinite(float(wait)):
                        seen[limit] = min(cost.cost, cost.capacity) - float(wait) * cost.rate
            return Admit(False, limit, float(wait) if wait else None)

        def local() -> Admit:
            return self._fallback.take_now(
                key, costs, concurrency=concurrency, holder=holder, ttl=ttl
            )

        admit = await self._run(remote, (), local)
        if seen:
            self._levels[key] = (anyio.current_time(), seen)
        return admit

    async def release(self, key: str, holder: str) -> None:
        """See :meth:`~swiftclient.admission.StateStore.release`."""
        leases = self._keys(key)[1]

        async def remote() -> None:
            await self._redis().zrem(leases, holder)

        self._fallback.release_now(key, holder)
        await self._run(remote, (), lambda: None)

    async def _adjust(self, key: str, cost: BucketCost, mode: str) -> None:
        args = [cost.kind, repr(cost.cost), repr(cost.capacity), repr(cost.rate), mode]

        async def remote() -> None:
            await self._eval("adjust", _ADJUST, self._keys(key)[:1], args)

        def local() -> None:
            if mode == "set":
                self._fallback.set_level_now(key, cost)
            else:
                self._fallback.adjust_now(key, cost)

        await self._run(remote, (), local)

    async def adjust(self, key: str, cost: BucketCost) -> None:
        """See :meth:`~swiftclient.admission.StateStore.adjust`."""
        await self._adjust(key, cost, "adjust")

    async def set_level(self, key: str, cost: BucketCost) -> None:
        """See :meth:`~swiftclient.admission.StateStore.set_level`."""
        await self._adjust(key, cost, "set")

    async def block(self, key: str, seconds: float) -> None:
        """See :meth:`~swiftclient.admission.StateStore.block`."""

        async def remote() -> None:
            await self._eval("block", _BLOCK, self._keys(key)[:1], [repr(float(seconds))])

        self._cache.pop(key, None)
        await self._run(remote, (), lambda: self._fallback.block_now(key, seconds))

    async def _read(self, key: str) -> tuple[float, int]:
        now = anyio.current_time()
        cached = self._cache.get(key)
        if cached is not None and now - cached[0] < self._cache_ttl:
            return cached[1], cached[2]

        async def remote() -> tuple[float, int]:
            reply = await self._eval("read", _READ, self._keys(key), [])
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

    def peek_now(self, key: str, costs: Sequence[BucketCost]) -> tuple[dict[str, float], float]:
        """What this process last saw of ``key`` (the levels a take left, refilled since;
        the rest from the read cache), without asking the server: other processes' takes
        since then are not in it. The fallback's own state while degraded."""
        now = anyio.current_time()
        if now < self._down_until:
            return self._fallback.peek_now(key, costs)
        seen_at, seen = self._levels.get(key, (now, {}))
        levels: dict[str, float] = {}
        for cost in costs:
            level = seen.get(cost.kind)
            levels[cost.kind] = (
                cost.capacity
                if level is None
                else min(cost.capacity, level + max(0.0, now - seen_at) * cost.rate)
            )
        cached = self._cache.get(key)
        rest = 0.0 if cached is None else max(0.0, cached[1] - (now - cached[0]))
        return levels, rest

    async def aclose(self) -> None:
        """Close the connections the store opened, and its helper loop on trio."""
        client, self._client = self._client, None
        self._scripts.clear()
        with anyio.CancelScope(shield=True):
            if client is not None and self._owns_client:
                try:
                    await self._on_asyncio(client.aclose)
                except self._errors:
                    pass
            cm, self._portal_cm, self._portal = self._portal_cm, None, None
            if cm is not None:
                await anyio.to_thread.run_sync(cm.__exit__, None, None, None)

    async def __aenter__(self) -> RedisStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _safe_url(url: str) -> str:
    """The URL without credentials (``redis://user:password@host`` shows the host only)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    return scheme + "://" + rest.rpartition("@")[2]
