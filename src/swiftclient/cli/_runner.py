"""The load generator of ``swiftclient bench``: load levels, variants, one sample a request.

A level is either a concurrency (a closed loop: that many workers, each sending its next
request when the last one ends) or a rate (an open loop: Poisson arrivals, every request in
its own task). With two variants (``--compare``) requests alternate between them, so both
see the same load at the same moments. The first ``warmup`` requests of a level are sent and
recorded but marked, and left out of the figures.

Times are the SDK's own (:class:`~swiftclient.types.Timing`): TTFT from the call's start to
its first content chunk, ITL between content chunks, end-to-end to the call's end.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio

from .._client import AsyncClient
from ..errors import SwiftClientError
from ..hedging import Hedge
from ._workload import BenchRequest, Workload

__all__ = ["Level", "Sample", "Variant", "run_level"]


@dataclass(frozen=True, slots=True)
class Level:
    """One load level: ``concurrency`` workers, or Poisson arrivals at ``rate`` per second."""

    concurrency: int | None = None
    rate: float | None = None

    @property
    def label(self) -> str:
        """``c=8`` or ``rate=4/s``."""
        if self.rate is not None:
            return f"rate={self.rate:g}/s"
        return f"c={self.concurrency}"

    @property
    def load(self) -> float:
        """The level as one number (workers, or requests per second)."""
        return float(self.rate if self.rate is not None else self.concurrency or 0)

    def default_warmup(self) -> int:
        """One request per worker (one second of arrivals at a rate)."""
        if self.rate is not None:
            return max(1, round(self.rate))
        return self.concurrency or 1


@dataclass(slots=True)
class Variant:
    """A client configuration requests are sent through (one, or two with ``--compare``)."""

    name: str
    description: str
    client: AsyncClient
    model: str | list[str]
    hedge: Hedge | None = None


@dataclass(slots=True)
class Sample:
    """What one request measured (times in seconds; ``start`` from the run's start)."""

    variant: str
    level: str
    index: int
    warmup: bool
    start: float
    ttft: float | None = None
    itl: list[float] = field(default_factory=list)
    e2e: float | None = None
    output_tokens: int = 0
    prompt_tokens: int = 0
    error: str | None = None
    message: str | None = None

    @property
    def ok(self) -> bool:
        """True when the request completed."""
        return self.error is None

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready record."""
        return dataclasses.asdict(self)


async def _one(
    variant: Variant,
    request: BenchRequest,
    params: dict[str, Any],
    sample: Sample,
) -> None:
    started = anyio.current_time()
    try:
        completion = await variant.client.chat(
            list(request.messages),
            model=variant.model,
            hedge=variant.hedge,
            max_tokens=request.max_tokens,
            **params,
        )
    except SwiftClientError as exc:
        sample.error = type(exc).__name__
        sample.message = " ".join(str(exc).split())[:300]
        sample.e2e = anyio.current_time() - started
        return
    timing = completion.timing
    if timing is not None:
        sample.ttft = timing.ttft
        sample.itl = timing.itl
        sample.e2e = timing.total
    usage = completion.usage
    sample.output_tokens = usage.completion_tokens if usage else len(sample.itl) + 1
    sample.prompt_tokens = usage.prompt_tokens if usage else request.prompt_tokens


async def run_level(
    level: Level,
    variants: Sequence[Variant],
    workload: Workload,
    *,
    requests: int | None,
    duration: float | None,
    warmup: int,
    params: dict[str, Any],
    clock_zero: float,
    on_sample: Callable[[Sample], None],
    seed: int = 0,
    ramp_up: float = 0.0,
    first: int = 0,
    pair_prompts: bool = True,
) -> list[Sample]:
    """Run one level: ``warmup`` requests per variant, then ``requests`` per variant, or
    as many as start within ``duration`` seconds. Requests that are in flight when the
    duration ends are waited for and counted.

    Which request each sends: with ``pair_prompts``, both variants of a round send the same
    one, so a comparison is like for like (pass False when both go to the same server, as
    in a hedging comparison: the second would find the first's prompt in its prefix cache;
    then every request sends its own). A fresh workload (synthetic prompts) is numbered
    from ``first``: pass the requests of the earlier levels, so that no level resends
    another's prompts into a warm cache. A list (a dataset) is sent from its start.

    Workers start evenly spread over ``ramp_up`` seconds: started together, identical
    requests stay in lockstep and every wave arrives as one burst, which the client and
    the server both queue (the figures would then measure the burst, not the server)."""
    per_round = len(variants)
    warm_total = warmup * per_round
    total = None if requests is None else warm_total + requests * per_round
    samples: list[Sample] = []
    issued = 0
    measure_from: float | None = None

    def take() -> Sample | None:
        """The next request to send, or None when the level is done."""
        nonlocal issued, measure_from
        now = anyio.current_time()
        if total is not None and issued >= total:
            return None
        if issued >= warm_total and measure_from is None:
            measure_from = now
        if duration is not None and measure_from is not None and now - measure_from >= duration:
            return None
        index = issued
        issued += 1
        variant = variants[index % per_round]
        sample = Sample(variant.name, level.label, index, index < warm_total, now - clock_zero)
        samples.append(sample)
        return sample

    async def send(sample: Sample) -> None:
        number = sample.index // per_round if pair_prompts else sample.index
        request = workload.at(first + number if workload.fresh else number)
        await _one(variants[sample.index % per_round], request, params, sample)
        if sample.prompt_tokens == 0:
            sample.prompt_tokens = request.prompt_tokens
        on_sample(sample)

    async with anyio.create_task_group() as tg:
        if level.rate is None:
            workers = level.concurrency or 1

            async def worker(number: int) -> None:
                if ramp_up:
                    await anyio.sleep(ramp_up * number / workers)
                while (sample := take()) is not None:
                    await send(sample)

            for number in range(workers):
                tg.start_soon(worker, number)
        else:
            rng = random.Random(seed)
            next_at = anyio.current_time()
            while (sample := take()) is not None:
                tg.start_soon(send, sample)
                next_at += rng.expovariate(level.rate)
                await anyio.sleep(max(0.0, next_at - anyio.current_time()))
    return samples
