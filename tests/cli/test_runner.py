"""The load generator on both event loops (the command line itself runs on asyncio)."""

from __future__ import annotations

import anyio
import pytest

from swiftclient import AsyncClient, HTTPBackend
from swiftclient.cli._runner import Level, Sample, Variant, run_level
from swiftclient.cli._workload import synthetic
from swiftclient.testing import FakeProvider, Reply

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("level", [Level(concurrency=3), Level(rate=50.0)], ids=["c=3", "rate"])
async def test_run_level_sends_warm_up_then_measured_requests(level: Level) -> None:
    seen: list[Sample] = []
    async with (
        FakeProvider(Reply(tokens=3, ttft=0.01)) as fake,
        AsyncClient(HTTPBackend(fake.base_url), model="m") as client,
    ):
        variants = [Variant("A", "a", client, "m"), Variant("B", "b", client, "m")]
        samples = await run_level(
            level,
            variants,
            synthetic(4, 3),
            requests=4,
            duration=None,
            warmup=1,
            params={},
            clock_zero=anyio.current_time(),
            on_sample=seen.append,
        )
        assert len(fake.requests) == 10
    assert sorted(s.index for s in seen) == list(range(10))
    assert [s.variant for s in samples] == ["A", "B"] * 5
    assert [s.warmup for s in samples] == [True] * 2 + [False] * 8
    for sample in samples:
        assert sample.ok and sample.output_tokens == 3 and len(sample.itl) == 2
        # never below the script, give or take the event loop's timer granularity
        assert sample.ttft is not None and sample.ttft >= 0.01 - 0.001


async def test_a_duration_stops_new_requests_and_waits_for_those_in_flight() -> None:
    async with (
        FakeProvider(Reply(tokens=2, ttft=0.05)) as fake,
        AsyncClient(HTTPBackend(fake.base_url), model="m") as client,
    ):
        samples = await run_level(
            Level(concurrency=2),
            [Variant("A", "a", client, "m")],
            synthetic(4, 2),
            requests=None,
            duration=0.3,
            warmup=0,
            params={},
            clock_zero=anyio.current_time(),
            on_sample=lambda sample: None,
        )
        assert fake.in_flight == 0
    assert len(samples) >= 2 and all(s.ok for s in samples)
    assert max(s.start for s in samples) < 0.3 + 0.2  # none started after the duration ended
