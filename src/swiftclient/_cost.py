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


@dataclass(frozen=True)
class Price:
    """The price of one request to a target, in any currency unit.

    Attributes:
        per_request: charged once per billed request, whatever its size.
        per_input_token: per prompt token.
        per_output_token: per completion token.

    Raises:
        ConfigurationError: a price is negative or not a finite number.
    """

    per_request: float = 0.0
    per_input_token: float = 0.0
    per_output_token: float = 0.0

    def __post_init__(self) -> None:
        for name in ("per_request", "per_input_token", "per_output_token"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or value < 0
            ):
                raise ConfigurationError(f"Price.{name} must be a finite number >= 0: {value!r}")

    def cost(self, input_tokens: int, output_tokens: int) -> float:
        """The price of one request with these token counts."""
        return (
            self.per_request
            + input_tokens * self.per_input_token
            + output_tokens * self.per_output_token
        )


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

    def cost(self, target: str, input_tokens: int, output_tokens: int) -> float | None:
        """The price of one request to ``target``, or ``None`` when ``target`` has no price."""
        price = self.price(target)
        return None if price is None else price.cost(input_tokens, output_tokens)


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
    """

    target: str
    outcome: Outcome
    hedge: bool = False
    sent: bool = True
    input_tokens: int | None = None
    output_tokens: int = 0


@dataclass(frozen=True)
class CallCost:
    """One call's accounting.

    Attributes:
        winner: the index of the attempt that committed, ``None`` if none did.
        attempts: attempts started.
        hedges_sent: attempts started while an earlier one was still running.
        hedges_won: 1 when a hedge committed, else 0.
        wasted_requests: attempts sent that did not commit (lost, cancelled, failed).
        wasted_input_tokens: prompt tokens billed for attempts that did not commit.
        wasted_output_tokens: completion tokens billed for attempts that did not commit.
        cost: the whole call's price including waste; ``None`` without pricing or when a
            billed target has no price.
        wasted_cost: the part of ``cost`` spent on attempts that did not commit.
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
            if (attempt.input_tokens or 0) < 0 or attempt.output_tokens < 0:
                raise ConfigurationError(f"negative token count in {attempt!r}")
        won_input = attempts[winner].input_tokens if winner is not None else None
        estimate = (
            won_input
            if won_input is not None
            else math.ceil(max(0, prompt_chars) / _CHARS_PER_TOKEN)
        )

        total: float | None = 0.0 if pricing is not None else None
        wasted: float | None = total
        wasted_requests = wasted_in = wasted_out = 0
        for index, attempt in enumerate(attempts):
            if not attempt.sent:
                continue
            is_winner = index == winner
            billed = attempt.outcome != "failed"
            input_tokens = attempt.input_tokens if attempt.input_tokens is not None else estimate
            if not is_winner:
                wasted_requests += 1
                if billed:
                    wasted_in += input_tokens
                    wasted_out += attempt.output_tokens
            if not billed or pricing is None:
                continue
            price = pricing.cost(attempt.target, input_tokens, attempt.output_tokens)
            total = None if total is None or price is None else total + price
            if not is_winner:
                wasted = None if wasted is None or price is None else wasted + price
        hedges = sum(1 for attempt in attempts if attempt.hedge)
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
        )


@dataclass
class HedgeStats:
    """Totals over many calls (one event loop adds to it; no locking).

    ``cost`` and ``wasted_cost`` sum the calls whose cost is known; ``calls_unpriced``
    counts the others.
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

    def add(self, call: CallCost) -> None:
        """Add one call's figures."""
        self.calls += 1
        self.attempts += call.attempts
        self.hedges_sent += call.hedges_sent
        self.hedges_won += call.hedges_won
        self.wasted_requests += call.wasted_requests
        self.wasted_input_tokens += call.wasted_input_tokens
        self.wasted_output_tokens += call.wasted_output_tokens
        if call.cost is None:
            self.calls_unpriced += 1
        else:
            self.cost += call.cost
            self.wasted_cost += call.wasted_cost or 0.0

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
            "extra_request_ratio": self.extra_request_ratio,
            "hedge_win_ratio": self.hedge_win_ratio,
        }

    def reset(self) -> None:
        """Start counting from zero again."""
        for item in fields(self):
            setattr(self, item.name, item.default)
