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
        cache_savings=0.0,
        cache_write_cost=0.0,
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
    # a hedge that never left the client (admission refused it) is no hedge sent either:
    # counted, it read as hedges that lost (hedge_win_ratio 0.25 with one hedge sent in 4)
    assert call.wasted_requests == 0 and call.hedges_sent == 0
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


# --------------------------------------------------------------------------- prompt caching

CLAUDE = Price.anthropic(per_input_token=3e-6, per_output_token=15e-6)


def test_the_anthropic_price_carries_the_documented_cache_multipliers() -> None:
    assert CLAUDE.per_cache_read_token == pytest.approx(0.3e-6)
    assert CLAUDE.per_cache_write_5m_token == pytest.approx(3.75e-6)
    assert CLAUDE.per_cache_write_1h_token == pytest.approx(6e-6)
    custom = Price.anthropic(1.0, 2.0, cache_write_5m=1.5, cache_write_1h=3.0, cache_read=0.2)
    assert (custom.per_cache_read_token, custom.per_cache_write_5m_token) == (0.2, 1.5)
    assert custom.per_cache_write_1h_token == 3.0
    with pytest.raises(ConfigurationError, match="cache_read"):
        Price.anthropic(1.0, 2.0, cache_read=-0.1)
    with pytest.raises(ConfigurationError, match="per_cache_read_token"):
        Price(per_cache_read_token=math.nan)


def test_cache_reads_and_writes_per_ttl_are_priced_apart() -> None:
    # 10,000 prompt tokens: 6,000 read, 3,000 written (1,000 of them for an hour), 1,000 plain
    cost = CLAUDE.cost(10_000, 500, 6_000, 3_000, 1_000)
    expected = (
        1_000 * 3e-6  # plain input
        + 6_000 * 0.3e-6  # reads at 0.1x
        + 2_000 * 3.75e-6  # 5-minute writes at 1.25x
        + 1_000 * 6e-6  # 1-hour writes at 2x
        + 500 * 15e-6
    )
    assert cost == pytest.approx(expected)
    saved, written = CLAUDE.cache_figures(10_000, 6_000, 3_000, 1_000)
    assert saved == pytest.approx(6_000 * 2.7e-6)
    assert written == pytest.approx(2_000 * 3.75e-6 + 1_000 * 6e-6)


def test_a_price_without_cache_prices_bills_cached_tokens_as_input() -> None:
    # Not every provider discounts cached input the same way: nothing is assumed.
    assert PER_TOKEN.cost(100, 50, cache_read_tokens=80, cache_write_tokens=20) == (
        PER_TOKEN.cost(100, 50)
    )
    assert PER_TOKEN.cache_figures(100, 80, 20) == (0.0, pytest.approx(20 * 0.001))
    # OpenAI-style: cached input at its own price, no write premium
    openai = Price(per_input_token=2.5e-6, per_cache_read_token=1.25e-6)
    assert openai.cost(1_000, 0, cache_read_tokens=800) == pytest.approx(
        200 * 2.5e-6 + 800 * 1.25e-6
    )


def test_counts_beyond_the_prompt_are_never_billed_twice() -> None:
    # reads and writes past the prompt's size are clamped to it
    assert CLAUDE.cost(100, 0, 80, 80, 500) == pytest.approx(80 * 0.3e-6 + 20 * 6e-6)


def test_a_call_counts_what_caching_saved_and_what_writes_cost() -> None:
    pricing = Pricing({"claude/*": CLAUDE, "open/*": PER_TOKEN})
    attempts = [
        AttemptRecord("claude/sonnet", "lost", output_tokens=2),  # estimated: no cache info
        AttemptRecord(
            "claude/sonnet",
            "won",
            hedge=True,
            input_tokens=10_000,
            output_tokens=500,
            cache_read_tokens=6_000,
            cache_write_tokens=3_000,
            cache_write_1h_tokens=1_000,
        ),
    ]
    call = CallCost.from_attempts(attempts, pricing=pricing)
    assert (call.cache_read_tokens, call.cache_write_tokens) == (6_000, 3_000)
    assert call.cache_savings == pytest.approx(6_000 * 2.7e-6)
    assert call.cache_write_cost == pytest.approx(2_000 * 3.75e-6 + 1_000 * 6e-6)
    winner = CLAUDE.cost(10_000, 500, 6_000, 3_000, 1_000)
    loser = CLAUDE.cost(10_000, 2)  # the winner's prompt, all of it at the input price
    assert call.cost == pytest.approx(winner + loser)
    assert call.wasted_cost == pytest.approx(loser)
    unpriced = CallCost.from_attempts(attempts)
    assert unpriced.cache_read_tokens == 6_000
    assert unpriced.cache_savings is None and unpriced.cache_write_cost is None


def test_stats_add_up_cache_savings_and_write_costs() -> None:
    pricing = Pricing({"claude/*": CLAUDE})
    first = AttemptRecord(
        "claude/x", "won", input_tokens=5_000, cache_write_tokens=4_000, output_tokens=10
    )
    second = AttemptRecord(
        "claude/x", "won", input_tokens=5_100, cache_read_tokens=4_000, output_tokens=10
    )
    stats = HedgeStats()
    stats.extend(CallCost.from_attempts([a], pricing=pricing) for a in (first, second))
    stats.add(CallCost.from_attempts([second]))  # unpriced: tokens counted, no money
    assert (stats.cache_read_tokens, stats.cache_write_tokens) == (8_000, 4_000)
    assert stats.cache_savings == pytest.approx(4_000 * 2.7e-6)
    assert stats.cache_write_cost == pytest.approx(4_000 * 3.75e-6)
    snap = stats.snapshot()
    assert snap["cache_savings"] == stats.cache_savings
    assert snap["cache_write_tokens"] == 4_000
    stats.reset()
    assert stats.cache_savings == 0.0 and stats.cache_read_tokens == 0
