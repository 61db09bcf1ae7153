"""Retry policy on tenacity, bounded by the call's one deadline.

Retried: connection failures and timeouts of one attempt, HTTP 408, 409, 429 and 5xx, and
any response with ``x-should-retry: true``; never any other 4xx, never once the deadline
is spent. Waits honour ``retry-after-ms`` and ``Retry-After`` (seconds or an HTTP date) up
to ``max_retry_after``; otherwise backoff is exponential with full jitter. A retry whose
wait would end past the deadline is not made: the last error is raised instead.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import anyio
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception

from . import errors
from ._budget import check_number
from ._deadline import Deadline
from .admission._headers import parse_retry_after

__all__ = ["RetryPolicy", "retry_after", "retry_after_seconds"]

T = TypeVar("T")

_RETRY_STATUSES = frozenset({408, 409, 429})


def retry_after_seconds(headers: dict[str, str]) -> float | None:
    """Parse ``retry-after-ms`` or ``Retry-After`` (seconds or HTTP date) into seconds."""
    # negative, NaN or infinite numbers are no wait to honour (backoff then), not "now"
    return parse_retry_after({k.lower(): v for k, v in headers.items()}, time.time())


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How a call retries. ``max_attempts`` counts the first attempt (1 disables retries)."""

    max_attempts: int = 3
    initial_backoff: float = 0.5
    max_backoff: float = 8.0
    max_retry_after: float = 60.0

    def __post_init__(self) -> None:
        attempts = self.max_attempts
        if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
            raise errors.ConfigurationError(
                f"RetryPolicy.max_attempts must be an int of at least 1, got {attempts!r}"
            )
        check_number("RetryPolicy.initial_backoff", self.initial_backoff, positive=False)
        check_number("RetryPolicy.max_backoff", self.max_backoff, positive=False)
        after = self.max_retry_after  # may be inf: always wait as long as the server asks
        if after != math.inf:
            check_number("RetryPolicy.max_retry_after", after, positive=False)

    @classmethod
    def none(cls) -> RetryPolicy:
        """A policy that never retries."""
        return cls(max_attempts=1)

    def is_retryable(self, exc: BaseException) -> bool:
        """True when ``exc`` is worth another attempt."""
        if isinstance(exc, errors.APIStatusError):
            flag = exc.headers.get("x-should-retry")
            if flag is not None:
                return flag.strip().lower() == "true"
            return exc.status_code in _RETRY_STATUSES or exc.status_code >= 500
        if isinstance(exc, errors.DeadlineExceeded):
            return False
        return isinstance(exc, errors.APIConnectionError)

    def wait_seconds(self, attempt: int, exc: BaseException | None) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        if isinstance(exc, errors.APIStatusError):
            hinted = retry_after_seconds(exc.headers)
            if hinted is not None and hinted <= self.max_retry_after:
                return hinted
        ceiling = min(self.max_backoff, self.initial_backoff * (2 ** (attempt - 1)))
        return random.uniform(0.0, ceiling)


async def retry_after(
    policy: RetryPolicy,
    deadline: Deadline,
    attempt: Callable[[int], Awaitable[T]],
    failure: Exception,
) -> T:
    """Attempts 2, 3, ... of a call whose first attempt raised ``failure`` (re-raised when
    it is not worth a retry), for a caller that ran attempt 1 itself (most calls succeed at
    once and need no retry machinery); tenacity drives them, each wait the policy's backoff
    and none that the deadline would pass."""
    if policy.max_attempts <= 1 or not policy.is_retryable(failure):
        raise failure
    delay = policy.wait_seconds(1, failure)
    if delay >= deadline.remaining():
        raise failure
    await anyio.sleep(delay)

    def wait(state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        return policy.wait_seconds(state.attempt_number + 1, exc)

    def stop(state: RetryCallState) -> bool:
        if state.attempt_number + 1 >= policy.max_attempts:
            return True
        return state.upcoming_sleep >= deadline.remaining()

    retrying = AsyncRetrying(
        sleep=anyio.sleep,
        stop=stop,
        wait=wait,
        retry=retry_if_exception(policy.is_retryable),
        reraise=True,
    )
    result: T | None = None
    async for state in retrying:
        with state:
            result = await attempt(state.retry_state.attempt_number + 1)
    return result  # type: ignore[return-value]
