"""Fault injection on the hedged call path: cancellations and failures that land while a
race is ending, checked for leaked streams, stray tasks and honest attempt records.

Order is forced with events (a gated in-test backend), never with the wall clock.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest

from swiftclient import (
    AsyncClient,
    ChatCompletionChunk,
    ChatRequest,
    Deadline,
    Hedge,
    RequestOptions,
)

from .test_hedging import Gated, Recorder

pytestmark = pytest.mark.anyio


class Scripted(Gated):
    """A :class:`Gated` backend that may answer at once, and whose close may wait for
    ``close_gate`` (a slow connection teardown)."""

    def __init__(self, name: str, *, answer: bool = True, slow_close: bool = False) -> None:
        super().__init__(name)
        if answer:
            self.gate.set()
        self.close_gate = anyio.Event()
        if not slow_close:
            self.close_gate.set()
        self.closing = anyio.Event()

    @asynccontextmanager
    async def stream(
        self, request: ChatRequest, deadline: Deadline, options: RequestOptions | None = None
    ) -> AsyncIterator[AsyncIterator[ChatCompletionChunk]]:
        async with super().stream(request, deadline, options) as chunks:
            try:
                yield chunks
            finally:
                self.closing.set()
                await self.close_gate.wait()


@pytest.mark.parametrize("delay", [0.0, 0.01])
async def test_a_call_cancelled_while_its_loser_closes_releases_the_winner(delay: float) -> None:
    # b wins; a (the loser) takes its time to close. The caller is cancelled meanwhile: the
    # call raises the cancellation, and the winner's stream, which nobody will read, must
    # be closed too, its attempt recorded as cancelled.
    a = Scripted("a", answer=False, slow_close=True)
    b = Scripted("b")
    recorder = Recorder()
    client = AsyncClient(backends={"a": a, "b": b}, observers=[recorder])
    finished = False

    async def call() -> None:
        nonlocal finished
        await client.chat("hi", model=["a/m", "b/m"], hedge=Hedge(delay=delay))
        finished = True

    async with anyio.create_task_group() as tg:
        tg.start_soon(call)
        await a.closing.wait()  # b won; a's stream is being closed
        tg.cancel_scope.cancel()
        a.close_gate.set()
    assert not finished
    assert (a.open, a.closed) == (1, 1)
    assert (b.open, b.closed) == (1, 1)
    ends = sorted(event for event in recorder.events if event[0] == "end")
    assert ends == [("end", "a", "lost"), ("end", "b", "cancelled")]
