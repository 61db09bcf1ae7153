"""Hedging on the real engine: two in-process local engines, one held after prefill.

The held engine admits and prefills each request (its KV blocks are taken) and then sends
nothing, as a backend stuck in its queue would. Hedged calls must finish on the other engine,
and the requests cancelled on the held one must give every KV block back.
"""

from __future__ import annotations

import time

import anyio
import pytest

from local_engine import LocalBackend
from local_engine.engine import StepTokens
from swiftclient import AsyncClient, Hedge, RetryPolicy

from .conftest import RELEASE_LIMIT
from .tiny_local import CountingEngine, TinyModel

pytestmark = pytest.mark.anyio
CALLS = 3


class HeldEngine(CountingEngine):
    """Prefills new requests, then holds them: no output ever leaves the engine."""

    blocks_taken = 0
    """The most KV blocks its held requests had taken at once."""

    def run_step(self) -> StepTokens:
        """Admit and prefill waiting requests (their tokens withheld); else hold."""
        if self.num_waiting:
            super().run_step()
            used = self.num_blocks - self.num_free_blocks()
            self.blocks_taken = max(self.blocks_taken, used)
        else:
            time.sleep(0.001)  # held: keep the driver thread from spinning
        return StepTokens()


@pytest.mark.parametrize("streamed", [True, False])
async def test_hedged_calls_finish_on_the_fast_engine_and_free_the_held_ones_blocks(
    tiny_model: TinyModel, streamed: bool
) -> None:
    held = tiny_model.build(HeldEngine)
    fast = tiny_model.engine()
    backends = {
        "slow": LocalBackend.from_engine(held, name="slow"),
        "fast": LocalBackend.from_engine(fast, name="fast"),
    }
    client = AsyncClient(backends=backends, retry=RetryPolicy.none())
    async with client:
        for _ in range(CALLS):
            completion = await client.chat(
                "Hello there",
                model=["slow/tiny", "fast/tiny"],
                hedge=Hedge(delay=0.01),
                max_tokens=4,
                extra_body={"ignore_eos": True},
                stream=streamed,
            )
            assert completion.timing is not None
            attempts = [(a.backend, a.outcome) for a in completion.timing.attempts]
            assert attempts == [("slow", "lost"), ("fast", "ok")]
            assert completion.usage is not None and completion.usage.completion_tokens == 4
            slow_engine = backends["slow"].async_engine
            assert slow_engine is not None
            assert slow_engine.num_active == 0  # the losing request was aborted on exit
            with anyio.fail_after(RELEASE_LIMIT):
                await slow_engine.wait_idle()
            assert held.num_free_blocks() == held.num_blocks
            assert not held.has_unfinished()
        assert held.blocks_taken > 0  # the held requests really had KV blocks
        assert fast.num_free_blocks() == fast.num_blocks
