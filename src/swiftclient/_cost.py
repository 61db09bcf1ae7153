"""What a call cost, what its hedges wasted, and the totals over many calls.

Prices are per target (``"backend/model"``, shell-style patterns allowed): a flat price per
request (Oxlo-style), per input token and per output token, or any mix. A call's cost counts
every attempt the provider bills, the winner's and the losers':

- the winning attempt: its prompt and completion tokens (from the response's usage);
- a losing attempt that was sent (it lost a hedge race, or the call was cancelled): billed
  as if the provider charged it, since a hosted request cancelled after it reached the
  server may still be billed. Its prompt tokens are its own usage when known, else the
  winner's prompt tokens, else ``ceil(prompt_chars / 4)``; its completion tokens are the
  ones it streamed before it was cancelled. A flat per-request price makes every hedge a
  whole extra request;
- a failed attempt (connect error, 5xx, 429, timeout): counted as a wasted request, billed
  nothing;
- an attempt that was never sent: nothing.

Prompt caching: a price may set what a token read from the provider's prompt cache costs
and what a token written to it costs (per TTL: 5 minutes or 1 hour), each defaulting to the
plain input price. :meth:`Price.anthropic` fills in Anthropic's documented multipliers
(writes 1.25x or 2x the input price, reads 0.1x), :meth:`Price.openai` OpenAI's (writes
1.25x on GPT-5.6 and later, whatever the TTL; reads 0.1x). A call's :class:`CallCost` then says how
many prompt tokens its billed attempts read from and wrote to the cache, what the reads
saved against the full input price and what the writes cost.

Everything here is plain arithmetic over records the call path hands in; no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from fnmatch import fnmatchcase

from ._outcome import Outcome
from .errors import ConfigurationError

__all__ = ["AttemptRecord", "CallCost", "HedgeStats", "Price", "Pricing"]


_CHARS_PER_TOKEN = 4
"""Prompt-size estimate when no usage is known: about four characters per token."""


_ANTHROPIC_WRITE_5M = 1.25
_ANTHROPIC_WRITE_1H = 2.0
_ANTHROPIC_READ = 0.1
_OPENAI_READ = 0.1
_OPENAI_WRITE = 1.25


def _check_multipliers(**multipliers: float) -> None:
    for name, value in multipliers.items():
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or value < 0
        ):
            raise ConfigurationError(f"{name} must be a finite number >= 0: {value!r}")


@dataclass(frozen=True)
class Price:
    """The price of one request to a target, in any currency unit.

    Attributes:
        per_request: charged once per billed request, whatever its size.
        per_input_token: per prompt token not read from or written to a prompt cache.
        per_output_token: per completion token.
        per_cache_read_token: per prompt token read from the provider's prompt cache
            (OpenAI's "cached input", Anthropic's cache reads); ``None``: the input price.
        per_cache_write_5m_token: per prompt token written to the cache with a 5-minute TTL
            (Anthropic's default cache writes); ``None``: the input price.
        per_cache_write_1h_token: per prompt token written with a 1-hour TTL; ``None``: the
            input price.

    Raises:
        ConfigurationError: a price is negative or not a finite number.
    """

    per_request: float = 0.0
    per_input_token: float = 0.0
    per_output_token: float = 0.0
    per_cache_read_token: float | None = None
    per_cache_write_5m_token: float | None = None
    per_cache_write_1h_token: float | None = None

    def __post_init__(self) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            if value is None and item.name.startswith("per_cache_"):
                continue
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or value < 0
            ):
                raise ConfigurationError(
                    f"Price.{item.name} must be a finite number >= 0: {value!r}"
                )

    @classmethod
    def anthropic(
        cls,
        per_input_token: float,
        per_output_token: float,
        *,
        per_request: float = 0.0,
        cache_write_5m: float = _ANTHROPIC_WRITE_5M,
        cache_write_1h: float = _ANTHROPIC_WRITE_1H,
        cache_read: float = _ANTHROPIC_READ,
    ) -> Price:
        """A price with Anthropic's prompt-caching multipliers of the input price.

        Args:
            per_input_token: the model's base input price per token.
            per_output_token: its output price per token.
            per_request: a flat price per request, if any.
            cache_write_5m: a 5-minute cache write costs this times the input price
                (Anthropic documents 1.25).
            cache_write_1h: a 1-hour cache write costs this times the input price (2.0).
            cache_read: a cache read costs this times the input price (0.1).

        Raises:
            ConfigurationError: a price or multiplier is negative or not finite.
        """
        _check_multipliers(
            cache_write_5m=cache_write_5m, cache_write_1h=cache_write_1h, cache_read=cache_read
        )
        base = cls(per_request, per_input_token, per_output_token)  # validates the prices
        return cls(
            per_request=base.per_request,
            per_input_token=base.per_input_token,
            per_output_token=base.per_output_token,
            per_cache_read_token=base.per_input_token * cache_read,
            per_cache_write_5m_token=base.per_input_token * cache_write_5m,
            per_cache_write_1h_token=base.per_input_token * cache_write_1h,
        )

    @classmethod
    def openai(
        cls,
        per_input_token: float,
        per_output_token: float,
        *,
        per_request: float = 0.0,
        cache_read: float = _OPENAI_READ,
        cache_write: float = _OPENAI_WRITE,
    ) -> Price:
        """A price with OpenAI's prompt-caching multipliers of the input price.

        Args:
            per_input_token: the model's base input price per token.
            per_output_token: its output price per token.
            per_request: a flat price per request, if any.
            cache_read: a cached input token costs this times the input price (0.1 on the
                GPT-5 families; older models list their own cached-input price).
            cache_write: a token written to the cache costs this times the input price,
                whatever its TTL: 1.25 on GPT-5.6 and later; 1.0 (no premium) before.

        Raises:
            ConfigurationError: a price or multiplier is negative or not finite.
        """
        _check_multipliers(cache_read=cache_read, cache_write=cache_write)
        return cls.anthropic(
            per_input_token,
            per_output_token,
            per_request=per_request,
            cache_write_5m=cache_write,
            cache_write_1h=cache_write,
            cache_read=cache_read,
        )

    def _cache_prices(self) -> tuple[float, float, float]:
        """The read, 5-minute write and 1-hour write prices, unset ones at the input price."""
        base = self.per_input_token
        read, write_5m, write_1h = (
            self.per_cache_read_token,
            self.per_cache_write_5m_token,
            self.per_cache_write_1h_token,
        )
        return (
            base if read is None else read,
            base if write_5m is None else write_5m,
            base if write_1h is None else write_1h,
        )

    def cost(
        self,
        input_tokens: int,
        output_tokens: int,
        cache_read_tokens: int = 0,
        cache_write_tokens: int = 0,
        cache_write_1h_tokens: int = 0,
    ) -> float:
        """The price of one request with these token counts.

        Args:
            input_tokens: every prompt token, the cache's reads and writes included (as
                ``Usage.prompt_tokens`` counts them).
            output_tokens: completion tokens.
            cache_read_tokens: of the prompt tokens, those read from the cache.
            cache_write_tokens: of the prompt tokens, those written to the cache (both TTLs).
            cache_write_1h_tokens: of the writes, those with a 1-hour TTL.
        """
        read_price, write_5m_price, write_1h_price = self._cache_prices()
        cached, write_5m, write_1h = _cache_split(
            input_tokens, cache_read_tokens, cache_write_tokens, cache_write_1h_tokens
        )
        plain = input_tokens - cached - write_5m - write_1h
        return (
            self.per_request
            + plain * self.per_input_token
            + cached * read_price
            + write_5m * write_5m_price
            + write_1h * write_1h_price
            + output_tokens * self.per_output_token
        )

    def cache_figures(
        self,
        input_tokens: int,
        cache_read_tokens: int,
        cache_write_tokens: int = 0,
        cache_write_1h_tokens: int = 0,
    ) -> tuple[float, float]:
        """``(saved, write_cost)`` for one request: what its cache reads saved against the
        full input price, and what its cache writes cost (the whole price of the written
        tokens, at their TTL's price). Arguments as for :meth:`cost`."""
        read_price, write_5m_price, write_1h_price = self._cache_prices()
        cached, write_5m, write_1h = _cache_split(
            input_tokens, cache_read_tokens, cache_write_tokens, cache_write_1h_tokens
        )
        saved = cached * (self.per_input_token - read_price)
        return saved, write_5m * write_5m_price + write_1h * write_1h_price


def _cache_split(
    input_tokens: int, read: int, written: int, written_1h: int
) -> tuple[int, int, int]:
    """``(read, 5-minute writes, 1-hour writes)`` clamped so that no count is negative and
    together they never exceed the prompt's tokens (a provider's counts are taken as they
    come, but never billed twice)."""
    read = min(max(0, read), max(0, input_tokens))
    written = min(max(0, written), input_tokens - read)
    written_1h = min(max(0, written_1h), written)
    return read, written - written_1h, written_1h


class Pricing:
    """Prices per target: ``"backend/model"`` keys, shell-style patterns allowed.

    An exact key wins; otherwise the first pattern (in the mapping's order) that matches,
    case-sensitively (``"oxlo/*"``, ``"local/*"``, ``"*"``).

    Args:
        prices: target or pattern -> :class:`Price`.

    Raises:
        ConfigurationError: a key is not a non-empty string or a value is not a ``Price``.
    """

    def __init__(self, prices: Mapping[str, Price]) -> None:
        if not isinstance(prices, Mapping):
            raise ConfigurationError(
                f"prices must be a mapping of target -> Price, got {type(prices).__name__}"
            )
        for key, price in prices.items():
            if not isinstance(key, str) or not key:
                raise ConfigurationError(f"a price key must be a non-empty string: {key!r}")
            if not isinstance(price, Price):
                raise ConfigurationError(f"the price of {key!r} must be a Price, got {price!r}")
        self._prices = dict(prices)
        self._patterns = [
            (key, price) for key, price in self._prices.items() if any(c in key for c in "*?[")
        ]

    def __repr__(self) -> str:
        return f"Pricing({sorted(self._prices)})"

    def price(self, target: str) -> Price | None:
        """The price that applies to ``target``, or ``None`` if none does."""
        exact = self._prices.get(target)
        if exact is not None:
            return exact
        for pattern, price in self._patterns:
            if fnmatchcase(target, pattern):
                return price
        return None

    def cost(
        self,
        target: str,
        input_tokens: int,
        output_tokens: int,
        cache_read_tokens: int = 0,
        cache_write_tokens: int = 0,
        cache_write_1h_tokens: int = 0,
    ) -> float | None:
        """The price of one request to ``target``, or ``None`` when ``target`` has no price
        (the token counts as for :meth:`Price.cost`)."""
        price = self.price(target)
        if price is None:
            return None
        return price.cost(
            input_tokens,
            output_tokens,
            cache_read_tokens,
            cache_write_tokens,
            cache_write_1h_tokens,
        )


@dataclass(frozen=True)
class AttemptRecord:
    """What accounting needs to know about one attempt of a call.

    Attributes:
        target: ``"backend/model"``.
        outcome: ``won`` (it committed), ``lost`` (cancelled because another attempt won),
            ``cancelled`` (the whole call was cancelled), ``failed``, or ``pending``.
        hedge: it was started while an earlier attempt was still running (not a retry or
            fallback after a failure).
        sent: the request reached the server (it may be billed).
        input_tokens: prompt tokens from the attempt's own usage, when it reported any.
        output_tokens: completion tokens it received (its usage, or the chunks it streamed
            before it was cancelled).
        cache_read_tokens: of ``input_tokens``, those read from the prompt cache.
        cache_write_tokens: of ``input_tokens``, those written to the prompt cache.
        cache_write_1h_tokens: of the writes, those with a 1-hour TTL.
    """

    target: str
    outcome: Outcome
    hedge: bool = False
    sent: bool = True
    input_tokens: int | None = None
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cache_write_1h_tokens: int = 0


@dataclass(frozen=True)
class CallCost:
    """One call's accounting.

    Attributes:
        winner: the index of the attempt that committed, ``None`` if none did.
        attempts: attempts started.
        hedges_sent: attempts started while an earlier one was still running, and sent (a
            hedge admission refused, or that got no connection, never left the client).
        hedges_won: 1 when a hedge committed, else 0.
        wasted_requests: attempts sent that did not commit (lost, cancelled, failed).
        wasted_input_tokens: prompt tokens billed for attempts that did not commit.
        wasted_output_tokens: completion tokens billed for attempts that did not commit.
        cost: the whole call's price including waste; ``None`` without pricing or when a
            billed target has no price.
        wasted_cost: the part of ``cost`` spent on attempts that did not commit.
        cache_read_tokens: prompt tokens the billed attempts read from the prompt cache.
        cache_write_tokens: prompt tokens the billed attempts wrote to it.
        cache_savings: what the cache reads saved against the full input price (``None``
            when ``cost`` is).
        cache_write_cost: what the cache writes cost, at their TTL's price (``None`` when
            ``cost`` is). Caching paid off when ``cache_savings`` exceeds the writes'
            premium, ``cache_write_cost`` minus the written tokens at the input price.
    """

    winner: int | None
    hedges_sent: int
    hedges_won: int
    wasted_requests: int
    wasted_input_tokens: int
    wasted_output_tokens: int
    cost: float | None
    wasted_cost: float | None
    attempts: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cache_savings: float | None = None
    cache_write_cost: float | None = None

    @classmethod
    def from_attempts(
        cls,
        attempts: Sequence[AttemptRecord],
        *,
        pricing: Pricing | None = None,
        prompt_chars: int = 0,
    ) -> CallCost:
        """Account for one call from its attempts (in the order they started).

        Args:
            attempts: every attempt of the call.
            pricing: prices; without it ``cost`` and ``wasted_cost`` are ``None``.
            prompt_chars: the prompt's length, to estimate the prompt tokens of a cancelled
                attempt when neither it nor the winner reported usage.

        Raises:
            ConfigurationError: more than one attempt won, or a token count is negative.
        """
        winners = [i for i, attempt in enumerate(attempts) if attempt.outcome == "won"]
        if len(winners) > 1:
            raise ConfigurationError(f"a call has one winner at most, got attempts {winners}")
        winner = winners[0] if winners else None
        for attempt in attempts:
            if (
                (attempt.input_tokens or 0) < 0
                or attempt.output_tokens < 0
                or min(
                    attempt.cache_read_tokens,
                    attempt.cache_write_tokens,
                    attempt.cache_write_1h_tokens,
                )
                < 0
            ):
                raise ConfigurationError(f"negative token count in {attempt!r}")
        won_input = attempts[winner].input_tokens if winner is not None else None
        estimate = (
            won_input
            if won_input is not None
            else math.ceil(max(0, prompt_chars) / _CHARS_PER_TOKEN)
        )

        total: float | None = 0.0 if pricing is not None else None
        wasted: float | None = total
        saved: float | None = total
        write_cost: float | None = total
        wasted_requests = wasted_in = wasted_out = cache_read = cache_write = 0
        for index, attempt in enumerate(attempts):
            if not attempt.sent:
                continue
            is_winner = index == winner
            billed = attempt.outcome != "failed"
            own = attempt.input_tokens is not None
            input_tokens = attempt.input_tokens if attempt.input_tokens is not None else estimate
            # An estimated prompt knows nothing of the cache: billed as plain input.
            read, written, written_1h = (
                _cache_split(
                    input_tokens,
                    attempt.cache_read_tokens,
                    attempt.cache_write_tokens,
                    attempt.cache_write_1h_tokens,
                )
                if own
                else (0, 0, 0)
            )
            if billed:
                cache_read += read
                cache_write += written + written_1h
            if not is_winner:
                wasted_requests += 1
                if billed:
                    wasted_in += input_tokens
                    wasted_out += attempt.output_tokens
            if not billed or pricing is None:
                continue
            rate = pricing.price(attempt.target)
            if rate is None:
                total = wasted = saved = write_cost = None
                continue
            price = rate.cost(
                input_tokens, attempt.output_tokens, read, written + written_1h, written_1h
            )
            cache_saved, cache_written = rate.cache_figures(
                input_tokens, read, written + written_1h, written_1h
            )
            total = None if total is None else total + price
            saved = None if saved is None else saved + cache_saved
            write_cost = None if write_cost is None else write_cost + cache_written
            if not is_winner:
                wasted = None if wasted is None else wasted + price
        hedges = sum(1 for attempt in attempts if attempt.hedge and attempt.sent)
        hedge_won = winner is not None and attempts[winner].hedge
        return cls(
            winner=winner,
            attempts=len(attempts),
            hedges_sent=hedges,
            hedges_won=1 if hedge_won else 0,
            wasted_requests=wasted_requests,
            wasted_input_tokens=wasted_in,
            wasted_output_tokens=wasted_out,
            cost=total,
            wasted_cost=None if total is None else wasted,
            cache_read_tokens=cache_read,
            cache_write_tokens=cache_write,
            cache_savings=None if total is None else saved,
            cache_write_cost=None if total is None else write_cost,
        )


@dataclass
class HedgeStats:
    """Totals over many calls (one event loop adds to it; no locking).

    ``cost``, ``wasted_cost``, ``cache_savings`` and ``cache_write_cost`` sum the calls
    whose cost is known; ``calls_unpriced`` counts the others. ``cache_read_tokens`` and
    ``cache_write_tokens`` count every call's prompt-cache reads and writes.
    """

    calls: int = 0
    attempts: int = 0
    hedges_sent: int = 0
    hedges_won: int = 0
    wasted_requests: int = 0
    wasted_input_tokens: int = 0
    wasted_output_tokens: int = 0
    cost: float = 0.0
    wasted_cost: float = 0.0
    calls_unpriced: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cache_savings: float = 0.0
    cache_write_cost: float = 0.0

    def add(self, call: CallCost) -> None:
        """Add one call's figures."""
        self.calls += 1
        self.attempts += call.attempts
        self.hedges_sent += call.hedges_sent
        self.hedges_won += call.hedges_won
        self.wasted_requests += call.wasted_requests
        self.wasted_input_tokens += call.wasted_input_tokens
        self.wasted_output_tokens += call.wasted_output_tokens
        self.cache_read_tokens += call.cache_read_tokens
        self.cache_write_tokens += call.cache_write_tokens
        if call.cost is None:
            self.calls_unpriced += 1
        else:
            self.cost += call.cost
            self.wasted_cost += call.wasted_cost or 0.0
            self.cache_savings += call.cache_savings or 0.0
            self.cache_write_cost += call.cache_write_cost or 0.0

    def extend(self, calls: Iterable[CallCost]) -> None:
        """Add several calls."""
        for call in calls:
            self.add(call)

    @property
    def extra_request_ratio(self) -> float:
        """Attempts beyond one per call, as a fraction of calls (0.05 = 5% extra)."""
        return (self.attempts - self.calls) / self.calls if self.calls else 0.0

    @property
    def hedge_win_ratio(self) -> float:
        """The share of hedges that committed."""
        return self.hedges_won / self.hedges_sent if self.hedges_sent else 0.0

    def snapshot(self) -> dict[str, float | int]:
        """Every figure as a plain dict (for logs, metrics and ``client.stats()``)."""
        return {
            "calls": self.calls,
            "attempts": self.attempts,
            "hedges_sent": self.hedges_sent,
            "hedges_won": self.hedges_won,
            "wasted_requests": self.wasted_requests,
            "wasted_input_tokens": self.wasted_input_tokens,
            "wasted_output_tokens": self.wasted_output_tokens,
            "cost": self.cost,
            "wasted_cost": self.wasted_cost,
            "calls_unpriced": self.calls_unpriced,
            "cache_read_tokens": self.cache_read_tokens,
            "cache_write_tokens": self.cache_write_tokens,
            "cache_savings": self.cache_savings,
            "cache_write_cost": self.cache_write_cost,
            "extra_request_ratio": self.extra_request_ratio,
            "hedge_win_ratio": self.hedge_win_ratio,
        }

    def reset(self) -> None:
        """Start counting from zero again."""
        for item in fields(self):
            setattr(self, item.name, item.default)
