"""Calls made from a program started with plain ``asyncio.run`` (no anyio runner).

The rest of the suite runs under anyio's pytest runner, which names its backend for sniffio
in a context variable; most programs start with ``asyncio.run``, which does not. Code that
runs outside a task there (loop callbacks) cannot rely on anyio finding the backend.
"""

from __future__ import annotations

import asyncio
from typing import Any

from swiftclient import AsyncClient, Client, Hedge, HTTPBackend
from swiftclient.testing import FakeProvider

from .mock import HELD, NO_RETRY

LIMIT = 60.0  # seconds: a bound on a hung call, never a speed assertion


def test_a_hedge_fires_on_time_under_plain_asyncio_run() -> None:
    # The first target never answers: only the hedge timer (a loop callback on asyncio)
    # can start the second. Before the fix it raised in the loop's exception handler and
    # the call waited on the first target.
    loop_errors: list[dict[str, Any]] = []

    async def main() -> list[tuple[str, str, str]]:
        asyncio.get_running_loop().set_exception_handler(lambda _, ctx: loop_errors.append(ctx))
        async with FakeProvider(model="a") as slow, FakeProvider(model="b") as fast:
            slow.script(HELD)
            backends = {
                "a": HTTPBackend(slow.base_url, "sk-test", name="a"),
                "b": HTTPBackend(fast.base_url, "sk-test", name="b"),
            }
            async with AsyncClient(backends=backends, retry=NO_RETRY) as client:
                completion = await asyncio.wait_for(
                    client.chat("hi", model=["a/m", "b/m"], hedge=Hedge(delay=0.05)), LIMIT
                )
        assert completion.timing is not None
        return [(a.backend, a.outcome, a.trigger) for a in completion.timing.attempts]

    attempts = asyncio.run(main())
    assert attempts == [("a", "lost", "first"), ("b", "ok", "hedge")]
    assert loop_errors == []


def test_a_hedge_fires_on_time_in_the_blocking_client() -> None:
    # The blocking Client runs its calls on a plain asyncio loop in its own thread: the
    # same loop callback, the same fix.
    with (
        FakeProvider(HELD, model="a").run_in_thread() as slow,
        FakeProvider(model="b").run_in_thread() as fast,
    ):
        backends = {
            "a": HTTPBackend(slow.base_url, "sk-test", name="a"),
            "b": HTTPBackend(fast.base_url, "sk-test", name="b"),
        }
        with Client(backends=backends, retry=NO_RETRY, timeout=LIMIT) as client:
            completion = client.chat("hi", model=["a/m", "b/m"], hedge=Hedge(delay=0.05))
    assert completion.timing is not None
    attempts = [(a.backend, a.outcome, a.trigger) for a in completion.timing.attempts]
    assert attempts == [("a", "lost", "first"), ("b", "ok", "hedge")]
