"""HedgeBudget, RetryThrottle and pushback, driven with explicit times."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from swiftclient import ConfigurationError
from swiftclient._budget import DEFAULT_MAX_PUSHBACK, HedgeBudget, RetryThrottle, pushback


def drain(budget: HedgeBudget, now: float) -> int:
    spent = 0
    while budget.try_spend(now):
        spent += 1
    return spent


def test_the_bucket_starts_full_and_a_hedge_costs_one_token() -> None:
    budget = HedgeBudget(ratio=0.05, floor_per_second=0.0, burst=3.0)
    assert budget.tokens(0.0) == 3.0
    assert drain(budget, 0.0) == 3
    assert not budget.try_spend(0.0)
    assert budget.tokens(0.0) == 0.0  # a refused hedge takes nothing


def test_calls_deposit_ratio_tokens() -> None:
    budget = HedgeBudget(ratio=0.05, floor_per_second=0.0, burst=10.0)
    drain(budget, 0.0)
    for _ in range(19):
        budget.on_call(0.0)
    assert not budget.try_spend(0.0)  # 0.95 tokens
    budget.on_call(0.0)
    assert budget.try_spend(0.0)  # the 20th call pays for one hedge
    assert not budget.try_spend(0.0)


def test_the_floor_refills_with_time_only() -> None:
    budget = HedgeBudget(ratio=0.0, floor_per_second=0.5, burst=10.0)
    drain(budget, 100.0)
    assert not budget.try_spend(101.0)  # half a token
    assert budget.try_spend(102.0)
    assert not budget.try_spend(102.0)


def test_idle_time_cannot_bank_more_than_burst() -> None:
    budget = HedgeBudget(ratio=0.05, floor_per_second=1.0, burst=4.0)
    drain(budget, 0.0)
    for _ in range(1000):
        budget.on_call(1.0)
    assert budget.tokens(10_000.0) == 4.0
    assert drain(budget, 10_000.0) == 4


def test_a_clock_that_steps_back_refills_nothing() -> None:
    budget = HedgeBudget(ratio=0.0, floor_per_second=1.0, burst=5.0)
    drain(budget, 10.0)
    assert budget.tokens(5.0) == 0.0
    assert budget.tokens(10.0) == 0.0  # going back to 10 s is not 5 s of new time
    assert budget.tokens(11.0) == 1.0


@given(
    ratio=st.floats(0.0, 0.5),
    floor=st.floats(0.0, 2.0),
    gaps=st.lists(st.floats(0.0, 0.5), min_size=1, max_size=300),
)
def test_hedges_never_exceed_ratio_calls_plus_floor_time_plus_burst(
    ratio: float, floor: float, gaps: list[float]
) -> None:
    burst = 3.0
    budget = HedgeBudget(ratio=ratio, floor_per_second=floor, burst=burst)
    now, hedges = 0.0, 0
    for gap in gaps:
        now += gap
        budget.on_call(now)
        hedges += int(budget.try_spend(now))  # every call wants a hedge
    assert hedges <= ratio * len(gaps) + floor * now + burst + 1e-9


@pytest.mark.parametrize(
    "kwargs",
    [
        {"ratio": -0.1},
        {"ratio": math.nan},
        {"floor_per_second": -1.0},
        {"floor_per_second": math.inf},
        {"burst": 0.5},
        {"burst": math.inf},
    ],
)
def test_bad_budgets_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigurationError):
        HedgeBudget(**kwargs)


def test_the_throttle_follows_grpc_a6() -> None:
    throttle = RetryThrottle(max_tokens=10.0, token_ratio=0.5)
    assert throttle.allowed() and throttle.tokens == 10.0
    for _ in range(4):
        throttle.on_failure()
    assert throttle.allowed()  # 6 > 5
    throttle.on_failure()
    assert not throttle.allowed()  # 5 is not > 5
    for _ in range(3):
        throttle.on_failure()  # 2 tokens
    for _ in range(6):
        throttle.on_success()
    assert throttle.tokens == 5.0 and not throttle.allowed()  # successes earn back slowly
    throttle.on_success()
    assert throttle.allowed()


def test_the_throttle_stays_within_zero_and_max_tokens() -> None:
    throttle = RetryThrottle(max_tokens=4.0, token_ratio=1.0)
    for _ in range(10):
        throttle.on_failure()
    assert throttle.tokens == 0.0
    for _ in range(10):
        throttle.on_success()
    assert throttle.tokens == 4.0


@pytest.mark.parametrize(
    "kwargs",
    [{"max_tokens": 0.0}, {"max_tokens": -1.0}, {"token_ratio": 0.0}, {"token_ratio": math.nan}],
)
def test_bad_throttles_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigurationError):
        RetryThrottle(**kwargs)


def test_pushback_turns_retry_after_into_a_time() -> None:
    assert pushback(2.5, now=100.0) == 102.5
    assert pushback(None, now=100.0) is None
    assert pushback(0.0, now=100.0) is None
    assert pushback(-3.0, now=100.0) is None
    assert pushback(math.nan, now=100.0) is None


def test_pushback_is_capped() -> None:
    assert pushback(86_400.0, now=0.0) == DEFAULT_MAX_PUSHBACK
    assert pushback(math.inf, now=0.0) == DEFAULT_MAX_PUSHBACK
    assert pushback(30.0, now=0.0, max_delay=5.0) == 5.0
    with pytest.raises(ConfigurationError):
        pushback(1.0, now=0.0, max_delay=-1.0)


def test_the_standard_hub_takes_its_budget_from_the_clients_hedge() -> None:
    from swiftclient import Hedge
    from swiftclient.extend import PolicyHub

    hub = PolicyHub.standard(Hedge(budget=0.0, budget_floor=0.0, budget_burst=2.0))
    allowed = [hub.may_hedge() for _ in range(5)]
    assert allowed == [True, True, False, False, False]  # the burst, and nothing refills


@pytest.mark.parametrize("burst", [0.5, 0.0, math.nan])
def test_a_hedge_budget_burst_below_one_token_is_refused(burst: float) -> None:
    from swiftclient import Hedge

    with pytest.raises(ConfigurationError, match="budget_burst"):
        Hedge(budget_burst=burst)
