"""``ProviderLimits``: the fake provider's own rate limits, enforced like a hosted API's.

Sliding windows of ``window`` seconds (60: per minute; shorter to time-scale a test or a
bench): at most ``rpm`` requests and ``tpm`` tokens in any window. A request that would go
over is answered 429 with ``Retry-After`` (whole seconds, rounded up) and ``retry-after-ms``;
every chat response carries OpenAI's ``x-ratelimit-*`` headers. Sans-IO: the clock is passed
in, so tests move time themselves.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from .._budget import check_number
from ..errors import ConfigurationError

__all__ = ["LimitDecision", "ProviderLimits", "format_duration"]


def format_duration(seconds: float) -> str:
    """Seconds in OpenAI's reset format: ``"20ms"``, ``"1.5s"``, ``"6m0s"``, ``"1h0m0s"``."""
    if seconds < 1.0:
        return f"{math.ceil(seconds * 1000)}ms"
    hours, rest = divmod(seconds, 3600.0)
    minutes, secs = divmod(rest, 60.0)
    text = f"{secs:.3f}".rstrip("0").rstrip(".") + "s"
    if hours:
        return f"{int(hours)}h{int(minutes)}m{text}"
    if minutes:
        return f"{int(minutes)}m{text}"
    return text


@dataclass(frozen=True, slots=True)
class LimitDecision:
    """Whether a request got in, the headers to send, and (refused) seconds to wait."""

    allowed: bool
    headers: dict[str, str]
    retry_after: float | None = None


@dataclass
class ProviderLimits:
    """Rate limits the fake provider enforces (see the module).

    Args:
        rpm: requests per window (``None``: no request limit).
        tpm: tokens per window, counted as the reply's ``usage.total_tokens`` (``None``:
            no token limit).
        window: the window in seconds.
        clock: seconds on a monotonic clock (``time.monotonic``; a test passes its own).

    Raises:
        ConfigurationError: a limit is not a positive number.
    """

    rpm: int | None = None
    tpm: int | None = None
    window: float = 60.0
    clock: Callable[[], float] = time.monotonic
    _events: deque[tuple[float, int]] = field(default_factory=deque, init=False, repr=False)
    _tokens: int = field(default=0, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("rpm", "tpm"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise ConfigurationError(f"{name} must be an int >= 1 or None, got {value!r}")
        check_number("window", self.window, positive=True)

    def _expire(self, now: float) -> None:
        events = self._events
        while events and events[0][0] <= now - self.window:
            self._tokens -= events.popleft()[1]

    def _free_after(self, now: float, tokens: int) -> float:
        """Seconds until one more request of ``tokens`` tokens fits (it does not now)."""
        count, used = len(self._events), self._tokens
        for at, spent in self._events:  # oldest first: the next to leave the window
            count, used = count - 1, used - spent
            if (self.rpm is None or count + 1 <= self.rpm) and (
                self.tpm is None or used + tokens <= self.tpm
            ):
                return max(0.0, at + self.window - now)
        return self.window

    def admit(self, tokens: int) -> LimitDecision:
        """Count one request of ``tokens`` tokens if it fits the window, else refuse it."""
        with self._lock:
            now = self.clock()
            self._expire(now)
            fits = (self.rpm is None or len(self._events) + 1 <= self.rpm) and (
                self.tpm is None or self._tokens + min(tokens, self.tpm) <= self.tpm
            )
            retry = None
            if fits:
                self._events.append((now, tokens))
                self._tokens += tokens
            else:
                retry = self._free_after(now, min(tokens, self.tpm or tokens))
            headers = self._headers(now)
        if retry is not None:
            headers["retry-after"] = str(max(1, math.ceil(retry)))
            headers["retry-after-ms"] = str(max(1, math.ceil(retry * 1000)))
        return LimitDecision(fits, headers, retry)

    def _headers(self, now: float) -> dict[str, str]:
        headers: dict[str, str] = {}
        oldest = self._events[0][0] if self._events else now
        reset = format_duration(max(0.0, oldest + self.window - now) if self._events else 0.0)
        if self.rpm is not None:
            headers["x-ratelimit-limit-requests"] = str(self.rpm)
            headers["x-ratelimit-remaining-requests"] = str(max(0, self.rpm - len(self._events)))
            headers["x-ratelimit-reset-requests"] = reset
        if self.tpm is not None:
            headers["x-ratelimit-limit-tokens"] = str(self.tpm)
            headers["x-ratelimit-remaining-tokens"] = str(max(0, self.tpm - self._tokens))
            headers["x-ratelimit-reset-tokens"] = reset
        return headers
