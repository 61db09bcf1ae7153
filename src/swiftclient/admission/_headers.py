"""Rate-limit headers, parsed: OpenAI's ``x-ratelimit-*``, Anthropic's
``anthropic-ratelimit-*``, ``Retry-After`` and ``retry-after-ms``.

Pure functions over a header mapping; the wall clock (for HTTP dates and RFC 3339 reset
times) is passed in, so nothing here reads a clock.
"""

from __future__ import annotations

import email.utils
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

__all__ = [
    "KINDS",
    "Observed",
    "RateLimitInfo",
    "parse_duration",
    "parse_rate_limit_headers",
    "parse_retry_after",
]

KINDS = ("requests", "tokens", "input_tokens", "output_tokens")
"""The limits a provider reports, in the order they are checked."""

_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|h|m|s)")
_OPENAI = {"requests": "requests", "tokens": "tokens"}
_ANTHROPIC = {
    "requests": "requests",
    "tokens": "tokens",
    "input-tokens": "input_tokens",
    "output-tokens": "output_tokens",
}
_UNIT = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


@dataclass(frozen=True, slots=True)
class Observed:
    """One limit as a response reported it: the limit, what remains of it, and the seconds
    until it is whole again (any of them ``None`` when the response did not say)."""

    limit: float | None = None
    remaining: float | None = None
    reset_after: float | None = None


@dataclass(frozen=True, slots=True)
class RateLimitInfo:
    """What one response said about rate limits: ``limits`` by kind (``requests``,
    ``tokens``, ``input_tokens``, ``output_tokens``) and ``retry_after`` in seconds."""

    limits: dict[str, Observed] = field(default_factory=dict)
    retry_after: float | None = None


def _number(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        number = float(value.strip())
    except ValueError:
        return None
    return number if math.isfinite(number) and number >= 0 else None


def parse_duration(value: str) -> float | None:
    """OpenAI's reset durations (``"6m0s"``, ``"1s"``, ``"20ms"``, ``"1h2m3.5s"``) or a
    plain number of seconds, in seconds; ``None`` when the text is neither."""
    text = value.strip()
    plain = _number(text)
    if plain is not None:
        return plain
    total = 0.0
    end = 0
    for match in _DURATION.finditer(text):
        if match.start() != end:
            return None
        total += float(match.group(1)) * _UNIT[match.group(2)]
        end = match.end()
    return total if end and end == len(text) else None


def _rfc3339_after(value: str, wall_now: float) -> float | None:
    try:
        when = datetime.fromisoformat(value.strip())
    except ValueError:
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - wall_now)


def parse_retry_after(headers: Mapping[str, str], wall_now: float) -> float | None:
    """``retry-after-ms`` (milliseconds) or ``Retry-After`` (seconds, or an HTTP date
    compared with ``wall_now``, Unix seconds), in seconds; ``None`` when absent or garbled.

    ``headers`` must have lower-case names.
    """
    millis = _number(headers.get("retry-after-ms"))
    if millis is not None:
        return millis / 1000.0
    value = headers.get("retry-after")
    if value is None:
        return None
    seconds = _number(value)
    if seconds is not None:
        return seconds
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - wall_now)


LEARNED_HEADERS = ("x-ratelimit-", "anthropic-ratelimit-", "retry-after")
"""Prefixes of the response headers admission learns from (``retry-after-ms`` too): the
others are not parsed."""


def parse_rate_limit_headers(headers: Mapping[str, str], wall_now: float) -> RateLimitInfo:
    """Everything ``headers`` (lower-case names) say about rate limits.

    OpenAI's ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}`` (resets are durations)
    and Anthropic's ``anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-
    {limit,remaining,reset}`` (resets are RFC 3339 times, compared with ``wall_now``).
    Values that do not parse are left out, never guessed.
    """
    limits: dict[str, Observed] = {}
    if any(name.startswith("x-ratelimit-") for name in headers):
        for suffix, kind in _OPENAI.items():
            reset = headers.get(f"x-ratelimit-reset-{suffix}")
            observed = Observed(
                _number(headers.get(f"x-ratelimit-limit-{suffix}")),
                _number(headers.get(f"x-ratelimit-remaining-{suffix}")),
                None if reset is None else parse_duration(reset),
            )
            if observed != Observed():
                limits[kind] = observed
    if any(name.startswith("anthropic-ratelimit-") for name in headers):
        for suffix, kind in _ANTHROPIC.items():
            prefix = f"anthropic-ratelimit-{suffix}-"
            reset = headers.get(prefix + "reset")
            observed = Observed(
                _number(headers.get(prefix + "limit")),
                _number(headers.get(prefix + "remaining")),
                None if reset is None else _rfc3339_after(reset, wall_now),
            )
            if observed != Observed():
                limits[kind] = observed
    return RateLimitInfo(limits, parse_retry_after(headers, wall_now))
