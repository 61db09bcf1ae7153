"""Recent latency per key: a windowed, exponentially decaying quantile estimate.

The adaptive hedge waits for a quantile (p95 by default) of the time to first token recently
seen for the same (backend, model, prompt-size bucket). :class:`LatencyEstimator` keeps the
last ``max_samples`` observations of each key, forgets those older than ``window`` seconds,
and weighs the rest by age (a sample ``half_life`` seconds old counts half as much as a new
one), so the estimate follows a provider that slows down or recovers. It answers ``None``
until ``min_samples`` samples are in the window: a hedge based on three samples would fire at
random.

Answers are cached per key and quantile: a call path asks on every call, and weighing and
sorting a thousand samples each time would cost more than the rest of the call. A cached
answer is reused until ``refresh`` seconds have passed, samples have expired, or new
samples make up more than 1/32 of the key's series; an estimate that moves with minutes of
history loses nothing by lagging that little.

Memory is bounded twice: per key (``max_samples``) and in the number of keys (``max_keys``,
the least recently observed key is dropped first). Times are seconds on a monotonic clock,
passed in by the caller, so the estimator never reads a clock itself.

Pure Python, no I/O, no locks: one event loop owns an estimator.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Hashable

from ._budget import check_number
from .errors import ConfigurationError

__all__ = ["LatencyEstimator", "prompt_bucket"]

_SMALL_PROMPT_CHARS = 256
"""Prompts up to this many characters share bucket 0."""


def prompt_bucket(n_chars: int) -> int:
    """A coarse size class for a prompt of ``n_chars`` characters.

    Bucket 0 holds prompts up to 255 characters; above that each bucket doubles in size
    (256-511 is 1, 512-1023 is 2, ...), so prompts whose prefill costs about the same share
    one latency estimate.

    Raises:
        ConfigurationError: ``n_chars`` is negative.
    """
    if n_chars < 0:
        raise ConfigurationError(f"n_chars must be >= 0, got {n_chars}")
    return max(0, n_chars.bit_length() - (_SMALL_PROMPT_CHARS.bit_length() - 1))


_REFRESH_FRACTION = 32
"""A cached quantile is recomputed once new samples exceed 1/32 of the series."""


class _Series:
    """One key's samples, oldest first, and its cached quantiles."""

    __slots__ = ("cache", "cached_at", "samples", "since_cache")

    def __init__(self, max_samples: int) -> None:
        self.samples: deque[tuple[float, float]] = deque(maxlen=max_samples)
        self.cache: dict[float, float] = {}
        self.cached_at = 0.0
        self.since_cache = 0


class LatencyEstimator:
    """Windowed, decaying latency quantiles, one series per key.

    Args:
        window: samples older than this many seconds are forgotten.
        half_life: a sample this many seconds old weighs half as much as a fresh one.
        min_samples: :meth:`quantile` answers ``None`` while fewer samples are in the window.
        max_samples: the newest samples kept per key (older ones are dropped first).
        max_keys: the number of keys kept; observing a new key beyond it drops the key
            observed least recently.
        refresh: the longest a cached answer is reused, in seconds (0 disables the cache).

    Raises:
        ConfigurationError: a parameter is out of range.
    """

    def __init__(
        self,
        *,
        window: float = 300.0,
        half_life: float = 60.0,
        min_samples: int = 20,
        max_samples: int = 1024,
        max_keys: int = 1024,
        refresh: float = 1.0,
    ) -> None:
        check_number("window", window, positive=True)
        check_number("half_life", half_life, positive=True)
        if min_samples < 1:
            raise ConfigurationError(f"min_samples must be >= 1, got {min_samples}")
        if max_samples < min_samples:
            raise ConfigurationError(
                f"max_samples ({max_samples}) must be >= min_samples ({min_samples})"
            )
        if max_keys < 1:
            raise ConfigurationError(f"max_keys must be >= 1, got {max_keys}")
        check_number("refresh", refresh, positive=False)
        self.window = window
        self.half_life = half_life
        self.min_samples = min_samples
        self.max_samples = max_samples
        self.max_keys = max_keys
        self.refresh = refresh
        self._series: OrderedDict[Hashable, _Series] = OrderedDict()

    def __repr__(self) -> str:
        return (
            f"LatencyEstimator(window={self.window}, half_life={self.half_life}, "
            f"min_samples={self.min_samples}, keys={len(self._series)})"
        )

    def __len__(self) -> int:
        """The number of keys currently tracked."""
        return len(self._series)

    def observe(self, key: Hashable, value: float, now: float) -> None:
        """Record one latency ``value`` (seconds) for ``key``, observed at time ``now``.

        Negative, infinite and NaN values are refused: they are never a latency.

        Raises:
            ConfigurationError: ``value`` is not a finite number >= 0.
        """
        if not (math.isfinite(value) and value >= 0):
            raise ConfigurationError(f"a latency must be a finite number >= 0, got {value!r}")
        series = self._series.get(key)
        if series is None:
            series = _Series(self.max_samples)
            self._series[key] = series
            if len(self._series) > self.max_keys:
                self._series.popitem(last=False)
        else:
            self._series.move_to_end(key)
        series.samples.append((now, value))
        series.since_cache += 1

    def count(self, key: Hashable, now: float) -> int:
        """How many samples of ``key`` are inside the window at time ``now``."""
        series = self._series.get(key)
        if series is None:
            return 0
        self._expire(series, now)
        return len(series.samples)

    def quantile(self, key: Hashable, q: float, now: float) -> float | None:
        """The decay-weighted ``q`` quantile (0 < q <= 1) of ``key``'s samples in the window.

        The answer is the smallest sample value at which the samples' cumulative weight, in
        value order, reaches ``q`` of their total weight. ``None`` while fewer than
        ``min_samples`` samples are in the window.

        Raises:
            ConfigurationError: ``q`` is not in (0, 1].
        """
        if not (0.0 < q <= 1.0):
            raise ConfigurationError(f"q must be in (0, 1], got {q!r}")
        series = self._series.get(key)
        if series is None:
            return None
        self._expire(series, now)
        samples = series.samples
        if len(samples) < self.min_samples:
            return None
        fresh = (
            series.since_cache <= len(samples) // _REFRESH_FRACTION
            and 0 <= now - series.cached_at < self.refresh
        )
        if not fresh:
            series.cache.clear()
            series.cached_at = now
            series.since_cache = 0
        cached = series.cache.get(q)
        if cached is None:
            cached = series.cache[q] = self._compute(samples, q)
        return cached

    def forget(self, key: Hashable) -> None:
        """Drop every sample of ``key`` (nothing happens for an unknown key)."""
        self._series.pop(key, None)

    def _compute(self, samples: deque[tuple[float, float]], q: float) -> float:
        if len(samples) == 1:
            return samples[0][1]
        # Weights relative to the newest sample: scale-free, so no underflow for old clocks.
        newest = samples[-1][0]
        rate = math.log(2.0) / self.half_life
        weighted = sorted((value, math.exp((t - newest) * rate)) for t, value in samples)
        target = q * math.fsum(weight for _, weight in weighted)
        cumulative = 0.0
        for value, weight in weighted:
            cumulative += weight
            if cumulative >= target:
                return value
        return weighted[-1][0]  # rounding left the sum a hair short of the target

    def _expire(self, series: _Series, now: float) -> None:
        samples, oldest = series.samples, now - self.window
        if samples and samples[0][0] < oldest:
            while samples and samples[0][0] < oldest:
                samples.popleft()
            series.cache.clear()
