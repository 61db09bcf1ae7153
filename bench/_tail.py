"""The simulated provider's latency: a lognormal body with a Pareto tail, time-scaled.

Most requests take about ``median`` seconds to their first token (lognormal, spread
``sigma``); with probability ``tail_prob`` a request is a straggler instead, whose time is
Pareto-distributed from ``tail_min`` medians with shape ``tail_alpha``, capped at
``tail_cap`` medians (so one run stays bounded). With the defaults p95 is about 2.5 medians,
p99 about 50 and p99.9 about 100 (the cap): the shape of hosted TTFT measurements such as
LLMPerf's (1.2 s p50, 24 s p95, 64 s p99 for a 70B model on one provider), with the tail
starting a little later so that a p95 hedge can catch it.

Common random numbers: a draw is a pure function of ``(seed, call, replica, n)``, so every
strategy of the benchmark meets exactly the same straggler on the same call and replica, and
strategies differ only by what they do about it. A hedge to another replica draws anew, as a
request that lands on a healthy machine does.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

__all__ = ["TailModel"]


@dataclass(frozen=True)
class TailModel:
    """Latency to first token, in seconds."""

    median: float = 0.02
    sigma: float = 0.45
    tail_prob: float = 0.03
    tail_min: float = 20.0
    tail_alpha: float = 1.2
    tail_cap: float = 100.0

    def draw(self, rng: random.Random) -> float:
        """One latency from ``rng``."""
        if rng.random() < self.tail_prob:
            pareto: float = self.tail_min * (1.0 - rng.random()) ** (-1.0 / self.tail_alpha)
            return self.median * min(self.tail_cap, pareto)
        return self.median * math.exp(self.sigma * rng.gauss(0.0, 1.0))

    def draw_for(self, seed: int, call: int, replica: str, n: int) -> float:
        """The latency of the ``n``-th request of ``call`` on ``replica`` (deterministic)."""
        return self.draw(random.Random(f"{seed}:{call}:{replica}:{n}"))

    def mean(self, samples: int = 200_000, seed: int = 12345) -> float:
        """The mean latency, estimated from ``samples`` draws (deterministic)."""
        rng = random.Random(seed)
        return math.fsum(self.draw(rng) for _ in range(samples)) / samples

    def with_median(self, median: float) -> TailModel:
        """The same shape on another time scale."""
        return TailModel(
            median, self.sigma, self.tail_prob, self.tail_min, self.tail_alpha, self.tail_cap
        )
