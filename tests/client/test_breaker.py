"""CircuitBreaker: failure rate over a sliding window, cooldown, probes, Retry-After rests."""

from __future__ import annotations

import math

import pytest

from swiftclient import ConfigurationError
from swiftclient._breaker import CircuitBreaker


def breaker(**kwargs: float) -> CircuitBreaker:
    options: dict[str, float] = {
        "failure_rate": 0.5,
        "window": 10.0,
        "min_calls": 4,
        "cooldown": 5.0,
        "half_open_probes": 1,
    }
    options.update(kwargs)
    return CircuitBreaker(**options)  # type: ignore[arg-type]


def record(b: CircuitBreaker, outcomes: str, now: float) -> None:
    """Record a run of outcomes at one instant: 'o' ok, 'x' failure."""
    for mark in outcomes:
        b.record(mark == "o", now)


def open_it(b: CircuitBreaker, now: float) -> None:
    record(b, "xxxx", now)
    assert b.state(now) == "open"


def test_a_new_breaker_is_closed_and_allows() -> None:
    b = breaker()
    assert b.state(0.0) == "closed"
    assert b.allow(0.0)


def test_no_decision_before_min_calls() -> None:
    b = breaker(min_calls=4)
    record(b, "xxx", 0.0)  # 100% failures, but only 3 calls
    assert b.state(0.0) == "closed" and b.allow(0.0)
    record(b, "x", 0.0)
    assert b.state(0.0) == "open" and not b.allow(0.0)


def test_opens_at_the_failure_rate_not_below() -> None:
    b = breaker(failure_rate=0.5, min_calls=4)
    record(b, "ooox", 0.0)  # 25%
    record(b, "o", 0.0)  # 20%
    assert b.state(0.0) == "closed"
    record(b, "xxx", 0.0)  # 4 of 8 = 50%
    assert b.state(0.0) == "open"


def test_old_outcomes_leave_the_window() -> None:
    b = breaker(window=10.0, min_calls=4)
    record(b, "xxx", 0.0)
    assert b.failure_counts(5.0) == (3, 3)
    # 11 s later the three failures have left the window
    record(b, "oooo", 11.0)
    assert b.failure_counts(11.0) == (4, 0)
    record(b, "x", 11.0)
    assert b.state(11.0) == "closed"  # 1 of 5, not 4 of 8


def test_window_memory_is_bounded_by_buckets() -> None:
    b = breaker(window=10.0, min_calls=10**9)
    for i in range(100_000):
        b.record(True, i * 0.001)  # 100 s of calls
    calls, failures = b.failure_counts(100.0)
    # only about one window's worth is counted (10 s, give or take one bucket)
    assert 9_000 <= calls <= 10_001 and failures == 0


def test_open_refuses_until_cooldown_then_half_opens_with_one_probe() -> None:
    b = breaker(cooldown=5.0, half_open_probes=1)
    open_it(b, 0.0)
    assert not b.allow(4.9)
    assert b.state(5.0) == "half_open"
    assert b.allow(5.0)  # the probe
    assert not b.allow(5.1)  # only one probe at a time


def test_a_successful_probe_closes() -> None:
    b = breaker()
    open_it(b, 0.0)
    assert b.allow(5.0)
    b.record(True, 5.5)
    assert b.state(5.5) == "closed"
    assert b.failure_counts(5.5) == (0, 0)  # a fresh window
    assert b.allow(5.5)


def test_a_failed_probe_reopens_for_a_new_cooldown() -> None:
    b = breaker(cooldown=5.0)
    open_it(b, 0.0)
    assert b.allow(5.0)
    b.record(False, 6.0)
    assert b.state(6.0) == "open"
    assert not b.allow(10.9)  # cooldown counts from the reopening
    assert b.state(11.0) == "half_open"


def test_several_probes_must_all_succeed() -> None:
    b = breaker(half_open_probes=3)
    open_it(b, 0.0)
    assert [b.allow(5.0) for _ in range(4)] == [True, True, True, False]
    b.record(True, 5.1)
    b.record(True, 5.2)
    assert b.state(5.2) == "half_open"
    assert not b.allow(5.2)  # two succeeded, one in flight: no room
    b.record(True, 5.3)
    assert b.state(5.3) == "closed"


def test_a_probe_that_never_reports_frees_its_slot_after_cooldown() -> None:
    b = breaker(cooldown=5.0)
    open_it(b, 0.0)
    assert b.allow(5.0)
    assert not b.allow(9.9)
    assert b.allow(10.0)  # the first probe is presumed lost


def test_release_frees_a_cancelled_probe_at_once() -> None:
    b = breaker()
    open_it(b, 0.0)
    assert b.allow(5.0)
    b.release(5.1)
    assert b.allow(5.2)
    b.release(5.3)
    closed = breaker()
    closed.release(0.0)  # nothing to release: no effect
    assert closed.state(0.0) == "closed"


def test_late_answers_while_open_are_ignored() -> None:
    b = breaker()
    open_it(b, 0.0)
    record(b, "oooooooo", 1.0)  # answers to requests sent before it opened
    assert b.state(1.0) == "open"
    assert b.failure_counts(1.0) == (0, 0)


def test_block_until_rests_the_target_whatever_the_state() -> None:
    b = breaker()
    b.block_until(30.0)
    assert b.state(10.0) == "open" and not b.allow(10.0)
    b.block_until(20.0)  # cannot shorten a rest
    assert not b.allow(25.0)
    assert b.state(30.0) == "closed" and b.allow(30.0)


def test_block_until_holds_back_a_half_open_probe() -> None:
    b = breaker(cooldown=5.0)
    open_it(b, 0.0)
    b.block_until(8.0)
    assert not b.allow(6.0)
    assert b.allow(8.0)
    assert b.state(8.0) == "half_open"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"failure_rate": 0.0},
        {"failure_rate": 1.5},
        {"failure_rate": math.nan},
        {"window": 0.0},
        {"window": math.inf},
        {"cooldown": -1.0},
        {"min_calls": 0},
        {"half_open_probes": 0},
    ],
)
def test_bad_parameters_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigurationError):
        CircuitBreaker(**kwargs)  # type: ignore[arg-type]
