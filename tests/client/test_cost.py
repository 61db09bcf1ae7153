"""Prices, one call's cost including its hedges' waste, and the totals over calls."""

from __future__ import annotations

import math
from typing import Any

import pytest

from swiftclient import ConfigurationError
from swiftclient._cost import AttemptRecord, CallCost, HedgeStats, Price, Pricing

OXLO_FLAT = Price(per_request=0.01)
PER_TOKEN = Price(per_input_token=0.001, per_output_token=0.002)
PRICING = Pricing(
    {
        "oxlo/deepseek": OXLO_FLAT,
        "oxlo/*": Price(per_request=0.02),
        "open/*": PER_TOKEN,
        "local/*": Price(),
    }
)


def test_price_mixes_per_request_and_per_token() -> None:
    assert Price().cost(100, 100) == 0.0
    assert OXLO_FLAT.cost(10_000, 5_000) == 0.01
    assert PER_TOKEN.cost(100, 50) == pytest.approx(0.2)
    assert Price(1.0, 0.5, 0.25).cost(2, 4) == pytest.approx(3.0)


@pytest.mark.parametrize("value", [-1.0, math.inf, math.nan, "1", True])
def test_bad_prices_are_refused(value: Any) -> None:
    with pytest.raises(ConfigurationError, match="Price.per_request"):
        Price(per_request=value)


def test_exact_keys_win_over_patterns_and_patterns_go_in_order() -> None:
    assert PRICING.price("oxlo/deepseek") is OXLO_FLAT
    assert PRICING.price("oxlo/qwen") == Price(per_request=0.02)
    assert PRICING.price("local/default") == Price()
    assert PRICING.price("elsewhere/x") is None
    assert PRICING.cost("elsewhere/x", 1, 1) is None
    assert PRICING.cost("open/llama", 10, 5) == pytest.approx(0.02)
    ordered = Pricing({"a/*": Price(per_request=1.0), "*": Price(per_request=2.0)})
    assert ordered.cost("a/x", 0, 0) == 1.0
    assert ordered.cost("b/x", 0, 0) == 2.0
    assert Pricing({"A/x": Price(1.0)}).price("a/x") is None  # case-sensitive


@pytest.mark.parametrize(
    ("prices", "message"),
    [
        ({"": Price()}, "non-empty"),
        ({"a/x": 0.01}, "must be a Price"),
        ([("a/x", Price())], "mapping"),
    ],
)
def test_bad_pricing_is_refused(prices: Any, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        Pricing(prices)


def test_a_plain_call_wastes_nothing() -> None:
    call = CallCost.from_attempts(
        [AttemptRecord("open/llama", "won", input_tokens=100, output_tokens=50)],
        pricing=PRICING,
    )
    assert call == CallCost(
        winner=0,
        attempts=1,
        hedges_sent=0,
        hedges_won=0,
        wasted_requests=0,
        wasted_input_tokens=0,
        wasted_output_tokens=0,
        cost=call.cost,
        wasted_cost=0.0,
    )
    assert call.cost == pytest.approx(0.2)


def test_a_hedge_that_wins_bills_the_cancelled_loser_too() -> None:
    attempts = [
        # sent, then cancelled after streaming nothing: its prompt was prefetched
        AttemptRecord("open/llama", "lost", output_tokens=0),
        AttemptRecord("open/llama", "won", hedge=True, input_tokens=100, output_tokens=50),
    ]
    call = CallCost.from_attempts(attempts, pricing=PRICING, prompt_chars=10_000)
    assert call.winner == 1
    assert (call.hedges_sent, call.hedges_won) == (1, 1)
    assert call.wasted_requests == 1
    # the loser's prompt tokens come from the winner's usage, not the chars estimate
    assert (call.wasted_input_tokens, call.wasted_output_tokens) == (100, 0)
    assert call.cost == pytest.approx(0.2 + 0.1)
    assert call.wasted_cost == pytest.approx(0.1)


def test_a_lost_hedge_counts_its_streamed_tokens_and_flat_price() -> None:
    attempts = [
        AttemptRecord("oxlo/deepseek", "won", input_tokens=40, output_tokens=30),
        AttemptRecord("oxlo/qwen", "lost", hedge=True, output_tokens=3),
    ]
    call = CallCost.from_attempts(attempts, pricing=PRICING)
    assert (call.winner, call.hedges_sent, call.hedges_won) == (0, 1, 0)
    assert (call.wasted_input_tokens, call.wasted_output_tokens) == (40, 3)
    assert call.cost == pytest.approx(0.01 + 0.02)  # every hedge is a whole request
    assert call.wasted_cost == pytest.approx(0.02)


def test_without_usage_the_prompt_is_estimated_from_chars() -> None:
    attempts = [
        AttemptRecord("open/a", "cancelled", output_tokens=2),
        AttemptRecord("open/b", "cancelled", hedge=True),
    ]
    call = CallCost.from_attempts(attempts, pricing=PRICING, prompt_chars=401)
    assert call.winner is None and call.hedges_won == 0
    assert call.wasted_requests == 2
    assert (call.wasted_input_tokens, call.wasted_output_tokens) == (2 * 101, 2)
    assert call.cost == call.wasted_cost == pytest.approx(2 * 101 * 0.001 + 2 * 0.002)


def test_failed_attempts_are_wasted_requests_but_not_billed() -> None:
    attempts = [
        AttemptRecord("oxlo/qwen", "failed"),
        AttemptRecord("local/default", "won", input_tokens=10, output_tokens=10),
    ]
    call = CallCost.from_attempts(attempts, pricing=PRICING)
    assert call.wasted_requests == 1
    assert (call.wasted_input_tokens, call.wasted_output_tokens) == (0, 0)
    assert call.cost == 0.0 and call.wasted_cost == 0.0


def test_attempts_never_sent_cost_nothing() -> None:
    attempts = [
        AttemptRecord("oxlo/qwen", "won", input_tokens=10, output_tokens=1),
        AttemptRecord("oxlo/deepseek", "cancelled", hedge=True, sent=False),
    ]
    call = CallCost.from_attempts(attempts, pricing=PRICING)
    assert call.wasted_requests == 0 and call.hedges_sent == 1
    assert call.cost == pytest.approx(0.02)


def test_cost_is_unknown_without_pricing_or_for_an_unpriced_target() -> None:
    attempts = [AttemptRecord("open/x", "won", input_tokens=1, output_tokens=1)]
    assert CallCost.from_attempts(attempts).cost is None
    unpriced = [
        AttemptRecord("open/x", "won", input_tokens=1, output_tokens=1),
        AttemptRecord("elsewhere/x", "lost", hedge=True),
    ]
    call = CallCost.from_attempts(unpriced, pricing=PRICING)
    assert call.cost is None and call.wasted_cost is None
    assert call.wasted_input_tokens == 1  # tokens are still counted


def test_inconsistent_attempts_are_refused() -> None:
    with pytest.raises(ConfigurationError, match="one winner"):
        CallCost.from_attempts([AttemptRecord("a/x", "won"), AttemptRecord("a/y", "won")])
    with pytest.raises(ConfigurationError, match="negative"):
        CallCost.from_attempts([AttemptRecord("a/x", "won", output_tokens=-1)])


def test_stats_add_up_calls() -> None:
    stats = HedgeStats()
    plain = CallCost.from_attempts(
        [AttemptRecord("oxlo/qwen", "won", input_tokens=10, output_tokens=5)], pricing=PRICING
    )
    hedged = CallCost.from_attempts(
        [
            AttemptRecord("oxlo/qwen", "lost", output_tokens=1),
            AttemptRecord("oxlo/deepseek", "won", hedge=True, input_tokens=10, output_tokens=5),
        ],
        pricing=PRICING,
    )
    unpriced = CallCost.from_attempts([AttemptRecord("x/y", "won")], pricing=PRICING)
    stats.extend([plain, plain, hedged, unpriced])
    assert stats.calls == 4 and stats.attempts == 5
    assert stats.hedges_sent == stats.hedges_won == 1
    assert stats.wasted_requests == 1
    assert (stats.wasted_input_tokens, stats.wasted_output_tokens) == (10, 1)
    assert stats.cost == pytest.approx(0.02 * 3 + 0.01)
    assert stats.wasted_cost == pytest.approx(0.02)
    assert stats.calls_unpriced == 1
    assert stats.extra_request_ratio == pytest.approx(0.25)
    assert stats.hedge_win_ratio == 1.0
    snap = stats.snapshot()
    assert snap["calls"] == 4 and snap["extra_request_ratio"] == pytest.approx(0.25)
    stats.reset()
    assert stats == HedgeStats()
    assert stats.extra_request_ratio == 0.0 and stats.hedge_win_ratio == 0.0
