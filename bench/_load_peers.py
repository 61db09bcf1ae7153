"""Concurrent streams against a real server: swiftclient (asyncio, trio) and raw aiohttp.

Each configuration opens one client with room for ``max_connections`` connections, runs one
untimed warm-up batch (so every configuration is timed on a filled pool), then ``repeats``
timed batches of ``concurrency`` simultaneous streams. A stream counts as an error when it
raises or parses a different number of chunks than expected.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field

import aiohttp
import anyio
from _canned import MESSAGES

from swiftclient import AsyncClient, HTTPBackend

__all__ = ["LoadResult", "measure", "open_aiohttp", "open_swiftclient"]

StreamOnce = Callable[[], Awaitable[int]]
Opener = Callable[[str, int], AbstractAsyncContextManager[StreamOnce]]
API_KEY = "sk-bench-not-a-real-key"


@dataclass
class LoadResult:
    """The outcome of one (client, concurrency) configuration."""

    concurrency: int
    wall: float = float("inf")
    """Best wall-clock seconds of one batch."""
    cpu: float = 0.0
    """Client process CPU seconds during that best batch."""
    errors: Counter[str] = field(default_factory=Counter)
    """Failed streams over every batch (warm-up included), by exception type."""
    streams: int = 0
    """Streams run over every batch."""


@asynccontextmanager
async def open_swiftclient(base_url: str, max_connections: int) -> AsyncIterator[StreamOnce]:
    """swiftclient's default HTTP backend (aiohttp on asyncio, httpx's transport on trio)."""
    backend = HTTPBackend(base_url, API_KEY, max_connections=max_connections)
    client = AsyncClient(backend, model="fake-model")

    async def once() -> int:
        count = 0
        async with client.stream(MESSAGES) as stream:
            async for _ in stream:
                count += 1
        return count

    try:
        yield once
    finally:
        await client.aclose()


@asynccontextmanager
async def open_aiohttp(base_url: str, max_connections: int) -> AsyncIterator[StreamOnce]:
    """Raw ``aiohttp.ClientSession``: read SSE lines, ``json.loads`` each data line."""
    connector = aiohttp.TCPConnector(limit=max_connections)
    url = f"{base_url}/chat/completions"
    headers = {"authorization": f"Bearer {API_KEY}", "content-type": "application/json"}
    body = {
        "model": "fake-model",
        "messages": MESSAGES,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with aiohttp.ClientSession(connector=connector) as session:

        async def once() -> int:
            count = 0
            async with session.post(url, data=json.dumps(body), headers=headers) as response:
                response.raise_for_status()
                async for line in response.content:
                    if line.startswith(b"data: "):
                        data = line[6:].rstrip()
                        if data != b"[DONE]":
                            json.loads(data)
                            count += 1
            return count

        yield once


async def _batch(once: StreamOnce, concurrency: int, expected: int, errors: Counter[str]) -> None:
    async def one() -> None:
        try:
            count = await once()
        except Exception as exc:
            errors[type(exc).__name__] += 1
            return
        if count != expected:
            errors[f"got {count} chunks"] += 1

    async with anyio.create_task_group() as task_group:
        for _ in range(concurrency):
            task_group.start_soon(one)


async def measure(
    opener: Opener,
    base_url: str,
    concurrencies: Sequence[int],
    *,
    repeats: Callable[[int], int],
    expected_chunks: int,
    max_connections: int,
) -> list[LoadResult]:
    """Time ``repeats(c)`` batches of ``c`` concurrent streams for each ``c``; keep the best.

    Run it with ``anyio.run(..., backend=...)``: the event loop is the caller's choice.
    """
    results: list[LoadResult] = []
    async with opener(base_url, max_connections) as once:
        for concurrency in concurrencies:
            result = LoadResult(concurrency)
            await _batch(once, concurrency, expected_chunks, result.errors)
            result.streams += concurrency
            for _ in range(repeats(concurrency)):
                wall_start, cpu_start = time.perf_counter(), time.process_time()
                await _batch(once, concurrency, expected_chunks, result.errors)
                wall = time.perf_counter() - wall_start
                if wall < result.wall:
                    result.wall, result.cpu = wall, time.process_time() - cpu_start
                result.streams += concurrency
            results.append(result)
    return results
