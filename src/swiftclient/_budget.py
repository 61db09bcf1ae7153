"""How many extra requests hedging may send, and when it must stop sending them.

- :class:`HedgeBudget` caps hedges at a fraction of traffic: every call deposits ``ratio``
  tokens, time deposits ``floor_per_second`` more (so a quiet client can still hedge now and
  then), one hedge spends one token, and the bucket never holds more than ``burst``. Over a
  long run, hedges <= ``ratio`` x calls + ``floor_per_second`` x seconds + ``burst``.
- :class:`RetryThrottle` is the throttle of gRPC's retry and hedging design (gRFC A6): a
  failure takes a token, a success gives back ``token_ratio``, and hedging is allowed only
  while more than half of ``max_tokens`` remain, so hedging switches itself off while the
  targets are failing instead of multiplying the load on them.
- :func:`pushback` turns a ``Retry-After`` delay into the time until which a target rests.

Times are seconds on a monotonic clock passed in as ``now``; nothing here reads a clock,
sleeps or does I/O.
"""

from __future__ import annotations

import math

from .errors import ConfigurationError

__all__ = ["DEFAULT_MAX_PUSHBACK", "HedgeBudget", "RetryThrottle", "check_number", "pushback"]

DEFAULT_MAX_PUSHBACK = 60.0
"""The longest rest :func:`pushback` grants a target, whatever the server asks for."""


def check_number(name: str, value: object, *, positive: bool) -> None:
    """Refuse a parameter that is not a finite number > 0 (``positive``) or >= 0.

    Raises:
        ConfigurationError: naming the parameter and the bound.
    """
    ok = (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and (value > 0 if positive else value >= 0)
    )
    if not ok:
        bound = "> 0" if positive else ">= 0"
        raise ConfigurationError(f"{name} must be a finite number {bound}, got {value!r}")


class HedgeBudget:
    """A token bucket that limits hedges to a fraction of calls plus a small floor.

    The bucket starts full (``burst`` tokens) and refills lazily from the times passed in.

    Args:
        ratio: tokens each call deposits (0.05: at most 5% extra requests in the long run).
        floor_per_second: tokens deposited per second whatever the traffic.
        burst: the most tokens the bucket holds, so idle time cannot bank a storm of hedges.

    Raises:
        ConfigurationError: ``ratio`` or ``floor_per_second`` is negative or not finite,
            or ``burst`` is below 1 (a bucket that can never pay for one hedge).
    """

    def __init__(
        self, ratio: float = 0.05, floor_per_second: float = 1.0, burst: float = 10.0
    ) -> None:
        check_number("ratio", ratio, positive=False)
        check_number("floor_per_second", floor_per_second, positive=False)
        check_number("burst", burst, positive=True)
        if burst < 1.0:
            raise ConfigurationError(f"burst must be >= 1 (one hedge costs one token), got {burst}")
        self.ratio = ratio
        self.floor_per_second = floor_per_second
        self.burst = burst
        self._tokens = burst
        self._last: float | None = None

    def __repr__(self) -> str:
        return (
            f"HedgeBudget(ratio={self.ratio}, floor_per_second={self.floor_per_second}, "
            f"burst={self.burst}, tokens={self._tokens:.2f})"
        )

    def tokens(self, now: float) -> float:
        """The tokens available at time ``now`` (after the time-based refill)."""
        self._refill(now)
        return self._tokens

    def on_call(self, now: float) -> None:
        """Deposit ``ratio`` tokens for one call made at time ``now``."""
        self._refill(now)
        self._tokens = min(self.burst, self._tokens + self.ratio)

    def try_spend(self, now: float) -> bool:
        """Take one token for a hedge at time ``now``; ``False`` (nothing taken) if short."""
        self._refill(now)
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True

    def _refill(self, now: float) -> None:
        last = self._last
        if last is None or now > last:  # a clock that steps back refills nothing
            if last is not None:
                elapsed = now - last
                self._tokens = min(self.burst, self._tokens + elapsed * self.floor_per_second)
            self._last = now


class RetryThrottle:
    """gRPC-style throttling of retries and hedges (gRFC A6).

    Starts with ``max_tokens`` tokens. Each failed attempt takes one token (never below 0),
    each success adds ``token_ratio`` (never above ``max_tokens``); extra attempts are allowed
    only while the count is above ``max_tokens / 2``. With the defaults, about five failures
    in a row switch hedging off, and it takes successes (ten per token) to switch it back on.

    Args:
        max_tokens: the size of the bucket (> 0).
        token_ratio: tokens a success gives back (> 0).

    Raises:
        ConfigurationError: a parameter is not a positive finite number.
    """

    def __init__(self, max_tokens: float = 10.0, token_ratio: float = 0.1) -> None:
        check_number("max_tokens", max_tokens, positive=True)
        check_number("token_ratio", token_ratio, positive=True)
        self.max_tokens = max_tokens
        self.token_ratio = token_ratio
        self._tokens = max_tokens

    def __repr__(self) -> str:
        return (
            f"RetryThrottle(max_tokens={self.max_tokens}, token_ratio={self.token_ratio}, "
            f"tokens={self._tokens:.2f})"
        )

    @property
    def tokens(self) -> float:
        """The tokens left."""
        return self._tokens

    def on_failure(self) -> None:
        """Record a failed attempt (a non-fatal error: connect error, 5xx, 429, timeout)."""
        self._tokens = max(0.0, self._tokens - 1.0)

    def on_success(self) -> None:
        """Record a successful attempt."""
        self._tokens = min(self.max_tokens, self._tokens + self.token_ratio)

    def allowed(self) -> bool:
        """Whether a retry or hedge may be sent now."""
        return self._tokens > self.max_tokens / 2


def pushback(
    retry_after: float | None, now: float, *, max_delay: float = DEFAULT_MAX_PUSHBACK
) -> float | None:
    """The time until which a target should get no request, from a ``Retry-After`` delay.

    ``retry_after`` is the server's delay in seconds (a 429 or 503 answer); ``None``, zero,
    negative and NaN delays give ``None`` (no pushback). The delay is capped at ``max_delay``
    so that a bogus header cannot take a target out for hours.

    Raises:
        ConfigurationError: ``max_delay`` is negative or not finite.
    """
    check_number("max_delay", max_delay, positive=False)
    if retry_after is None or not retry_after > 0:  # `not >` also catches NaN
        return None
    return now + min(retry_after, max_delay)
