"""The simulated provider's latency: a lognormal body with a Pareto tail, time-scaled.

Most requests take about ``median`` seconds to their first token (lognormal, spread
``sigma``); with probability ``tail_prob`` a request is a straggler instead, whose time is
Pareto-distributed from ``tail_min`` medians with shape ``tail_alpha``, capped at
``tail_cap`` medians (so one run stays bounded). With the defaults p95 is about 2.3 medians,
p97 2.7, p99 about 50 and p99.9 100 (the cap): the shape of hosted TTFT measurements such as
LLMPerf's (1.2 s p50, 24 s p95, 64 s p99 for a 70B model on one provider), with the tail
starting a little later so that a p95-p97 hedge can catch it. Two replicas both straggling
on one call happens about twice in 10,000 calls, below the p99.9.

Common random numbers: a draw is a pure function of ``(seed, call, replica, n)``, so every
strategy of the benchmark meets exactly the same straggler on the same call and replica, and
strategies differ only by what they do about it. A hedge to another replica draws anew, as a
request that lands on a healthy machine does.
"""

from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass

__all__ = ["TailModel"]


@dataclass(frozen=True)
class TailModel:
    """Latency to first token, in seconds."""

    median: float = 0.02
    sigma: float = 0.45
    tail_prob: float = 0.015
    tail_min: float = 36.0
    tail_alpha: float = 1.2
    tail_cap: float = 100.0
    busy_cap: float = 5.0
    """A request keeps its replica busy for at most this many medians; a straggler spends
    the rest of its time stalled before it queues (see :meth:`split`)."""

    def draw(self, rng: random.Random) -> float:
        """One latency from ``rng``."""
        if rng.random() < self.tail_prob:
            pareto: float = self.tail_min * (1.0 - rng.random()) ** (-1.0 / self.tail_alpha)
            return self.median * min(self.tail_cap, pareto)
        return self.median * math.exp(self.sigma * rng.gauss(0.0, 1.0))

    def draw_for(self, seed: int, call: int, replica: str, n: int) -> float:
        """The latency of the ``n``-th request of ``call`` on ``replica`` (deterministic)."""
        return self.draw(random.Random(f"{seed}:{call}:{replica}:{n}"))

    def split(self, latency: float) -> tuple[float, float]:
        """``(stall, busy)``: the part of ``latency`` spent outside a slot, and inside one.

        A straggler is slow because its path stalls (a slow node, a pause), not because it
        needs fifty times the work: it stalls first, then queues for a slot and is served
        like any request. So stragglers do not eat capacity, while every request, hedges
        included, still competes for the replica's slots.
        """
        busy = min(latency, self.busy_cap * self.median)
        return latency - busy, busy

    def mean_busy(self, samples: int = 200_000, seed: int = 12345) -> float:
        """The mean time a request keeps a slot to its first token (deterministic estimate)."""
        rng = random.Random(seed)
        return math.fsum(self.split(self.draw(rng))[1] for _ in range(samples)) / samples

    def with_median(self, median: float) -> TailModel:
        """The same shape on another time scale."""
        return dataclasses.replace(self, median=median)
