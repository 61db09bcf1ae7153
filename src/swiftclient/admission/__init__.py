"""Admission control: keep a client under its providers' rate limits before the 429.

Per target (``"backend/model"``): a concurrency limit and requests- and tokens-per-minute
limits counted over a sliding window, configured (:class:`Limits`) or learned from the
provider's headers, with AIMD on a 429 that says nothing else. A request waits for
capacity in a fair queue (first in, first out, with an optional priority) inside its own
deadline, and fails with
:class:`~swiftclient.RateLimited` when the wait cannot fit. State lives in a
:class:`StateStore`: :class:`MemoryStore` in this process by default, or
:class:`RedisStore` shared by every process that points at one Redis server (with the
client's hedge budget, :class:`SharedHedgeBudget`).
"""

from ._headers import (
    Observed,
    RateLimitInfo,
    parse_duration,
    parse_rate_limit_headers,
    parse_retry_after,
)
from ._hedge import SharedHedgeBudget
from ._limiter import (
    CHARS_PER_TOKEN,
    Admission,
    Clock,
    Headroom,
    Limits,
    Permit,
    SystemClock,
    TargetHealth,
    estimate_tokens,
)
from ._redis import RedisStore
from ._store import Admit, BucketCost, MemoryStore, StateStore

__all__ = [
    "CHARS_PER_TOKEN",
    "Admission",
    "Admit",
    "BucketCost",
    "Clock",
    "Headroom",
    "Limits",
    "MemoryStore",
    "Observed",
    "Permit",
    "RateLimitInfo",
    "RedisStore",
    "SharedHedgeBudget",
    "StateStore",
    "SystemClock",
    "TargetHealth",
    "estimate_tokens",
    "parse_duration",
    "parse_rate_limit_headers",
    "parse_retry_after",
]
