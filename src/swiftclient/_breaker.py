"""A circuit breaker per target: stop sending requests to a target that keeps failing.

States:

- ``closed``: requests flow; outcomes are counted over a sliding window of ``window``
  seconds. Once at least ``min_calls`` outcomes are in the window and the share of failures
  reaches ``failure_rate``, the breaker opens.
- ``open``: :meth:`CircuitBreaker.allow` says no until ``cooldown`` seconds have passed
  since it opened; then the breaker is ``half_open``.
- ``half_open``: up to ``half_open_probes`` requests are let through as probes. When that
  many probes have succeeded the breaker closes (with an empty window); one failed probe
  opens it again for another cooldown. A probe that never reports (its attempt was
  cancelled) frees its slot after ``cooldown`` seconds, or at once with
  :meth:`CircuitBreaker.release`.

Independently of the state, :meth:`CircuitBreaker.block_until` rests the target until a
given time (a 429 with ``Retry-After``): no request is allowed before it, and :meth:`state`
reports ``open`` meanwhile.

The window keeps counts in ``_BUCKETS`` time buckets, so memory stays bounded however many
calls arrive. Times are seconds on a monotonic clock passed in as ``now``; nothing here reads
a clock, sleeps or does I/O.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Literal

from ._budget import check_number
from .errors import ConfigurationError

__all__ = ["BreakerState", "CircuitBreaker"]

BreakerState = Literal["closed", "open", "half_open"]

_BUCKETS = 10
"""Time buckets per window: outcomes expire in steps of ``window / _BUCKETS``."""


class CircuitBreaker:
    """Opens on a failure rate over a sliding window, half-opens with probes, cools down.

    Args:
        failure_rate: the share of failed calls (0 < rate <= 1) that opens the breaker.
        window: seconds of outcomes that count toward the rate.
        min_calls: no decision before this many outcomes are in the window.
        cooldown: seconds the breaker stays open before it lets probes through.
        half_open_probes: probes let through in ``half_open``; that many successes close it.

    Raises:
        ConfigurationError: a parameter is out of range.
    """

    def __init__(
        self,
        *,
        failure_rate: float = 0.5,
        window: float = 30.0,
        min_calls: int = 10,
        cooldown: float = 15.0,
        half_open_probes: int = 1,
    ) -> None:
        if not (0.0 < failure_rate <= 1.0):
            raise ConfigurationError(f"failure_rate must be in (0, 1], got {failure_rate!r}")
        check_number("window", window, positive=True)
        check_number("cooldown", cooldown, positive=True)
        if min_calls < 1:
            raise ConfigurationError(f"min_calls must be >= 1, got {min_calls}")
        if half_open_probes < 1:
            raise ConfigurationError(f"half_open_probes must be >= 1, got {half_open_probes}")
        self.failure_rate = failure_rate
        self.window = window
        self.min_calls = min_calls
        self.cooldown = cooldown
        self.half_open_probes = half_open_probes
        self._state: BreakerState = "closed"
        self._bucket_width = window / _BUCKETS
        # [bucket index, calls, failures], oldest first; the index is floor(time / width).
        self._buckets: deque[list[int]] = deque()
        self._calls = 0
        self._failures = 0
        self._opened_at = 0.0
        self._probes: list[float] = []  # start times of the probes in flight
        self._probe_successes = 0
        self._blocked_until = -math.inf

    def __repr__(self) -> str:
        return (
            f"CircuitBreaker(state={self._state!r}, calls={self._calls}, failures={self._failures})"
        )

    # ------------------------------------------------------------------ queries

    def state(self, now: float) -> BreakerState:
        """The state at time ``now``; ``open`` also while a :meth:`block_until` rest lasts."""
        self._advance(now)
        if now < self._blocked_until:
            return "open"
        return self._state

    def open_left(self, now: float) -> float:
        """Seconds until the breaker, open because requests failed, lets probes through
        (0 when it is not open that way; a :meth:`block_until` rest does not count)."""
        self._advance(now)
        if self._state != "open":
            return 0.0
        return max(0.0, self._opened_at + self.cooldown - now)

    def failure_counts(self, now: float) -> tuple[int, int]:
        """``(calls, failures)`` in the window at time ``now`` (the closed state's tally)."""
        self._expire(now)
        return self._calls, self._failures

    # ------------------------------------------------------------------ decisions

    def allow(self, now: float) -> bool:
        """Whether a request may go to this target at time ``now``.

        Closed: yes. Open: no, until the cooldown has passed, which turns the breaker
        ``half_open``. Half-open: yes while fewer than ``half_open_probes`` probes are in
        flight (this call then counts as a probe), else no. Never during a
        :meth:`block_until` rest.
        """
        self._advance(now)
        if now < self._blocked_until:
            return False
        if self._state == "closed":
            return True
        if self._state == "open":
            return False
        self._probes = [t for t in self._probes if now - t < self.cooldown]
        if len(self._probes) + self._probe_successes >= self.half_open_probes:
            return False
        self._probes.append(now)
        return True

    def record(self, ok: bool, now: float) -> None:
        """Record the outcome of one request to this target, finished at time ``now``.

        In ``half_open`` the outcome is a probe's: a success counts toward closing, a failure
        opens the breaker again. In ``open`` it is a late answer to a request sent before
        the breaker opened, and is ignored.
        """
        self._advance(now)
        if self._state == "open":
            return
        if self._state == "half_open":
            if self._probes:
                self._probes.pop(0)
            if not ok:
                self._open(now)
                return
            self._probe_successes += 1
            if self._probe_successes >= self.half_open_probes:
                self._close()
            return
        self._count(ok, now)
        if self._calls >= self.min_calls and self._failures >= self.failure_rate * self._calls:
            self._open(now)

    def release(self, now: float) -> None:
        """A request let through by :meth:`allow` ended without an outcome (cancelled).

        In ``half_open`` its probe slot is freed at once; otherwise nothing changes.
        """
        self._advance(now)
        if self._state == "half_open" and self._probes:
            self._probes.pop(0)

    def block_until(self, until: float) -> None:
        """Allow no request before time ``until`` (a 429 or 503 with ``Retry-After``).

        A later call can extend the rest, never shorten it.
        """
        self._blocked_until = max(self._blocked_until, until)

    # ------------------------------------------------------------------ internals

    def _advance(self, now: float) -> None:
        if self._state == "open" and now >= self._opened_at + self.cooldown:
            self._state = "half_open"
            self._probes = []
            self._probe_successes = 0

    def _open(self, now: float) -> None:
        self._state = "open"
        self._opened_at = now
        self._reset_window()

    def _close(self) -> None:
        self._state = "closed"
        self._reset_window()

    def _reset_window(self) -> None:
        self._buckets.clear()
        self._calls = self._failures = 0
        self._probes = []
        self._probe_successes = 0

    def _count(self, ok: bool, now: float) -> None:
        self._expire(now)
        index = math.floor(now / self._bucket_width)
        if self._buckets and self._buckets[-1][0] >= index:
            bucket = self._buckets[-1]  # same bucket, or a clock that stepped back
        else:
            bucket = [index, 0, 0]
            self._buckets.append(bucket)
        bucket[1] += 1
        self._calls += 1
        if not ok:
            bucket[2] += 1
            self._failures += 1

    def _expire(self, now: float) -> None:
        # A bucket counts while any part of it lies within the last `window` seconds.
        oldest = math.floor(now / self._bucket_width) - _BUCKETS
        while self._buckets and self._buckets[0][0] <= oldest:
            _, calls, failures = self._buckets.popleft()
            self._calls -= calls
            self._failures -= failures
