"""LatencyEstimator and prompt_bucket: windowed, decaying quantiles with explicit times."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from swiftclient import ConfigurationError
from swiftclient._estimator import LatencyEstimator, prompt_bucket

KEY = ("r0", "m", 0)


def fill(est: LatencyEstimator, values: list[float], now: float = 0.0, key: object = KEY) -> None:
    for value in values:
        est.observe(key, value, now)


def test_no_estimate_below_min_samples() -> None:
    est = LatencyEstimator(min_samples=5)
    assert est.quantile(KEY, 0.95, now=0.0) is None
    fill(est, [1.0] * 4)
    assert est.quantile(KEY, 0.95, now=0.0) is None
    est.observe(KEY, 1.0, 0.0)
    assert est.quantile(KEY, 0.95, now=0.0) == 1.0


def test_equal_weights_give_the_plain_quantile() -> None:
    est = LatencyEstimator(min_samples=1)
    fill(est, [float(v) for v in range(1, 101)])  # all observed at the same instant
    assert est.quantile(KEY, 0.5, now=0.0) == 50.0
    assert est.quantile(KEY, 0.95, now=0.0) == 95.0
    assert est.quantile(KEY, 1.0, now=0.0) == 100.0
    assert est.quantile(KEY, 0.001, now=0.0) == 1.0


def test_order_of_observation_does_not_matter_at_one_instant() -> None:
    a, b = LatencyEstimator(min_samples=1), LatencyEstimator(min_samples=1)
    values = [0.3, 0.1, 5.0, 0.2, 0.15, 0.4]
    fill(a, values)
    fill(b, sorted(values))
    for q in (0.1, 0.5, 0.9, 1.0):
        assert a.quantile(KEY, q, 0.0) == b.quantile(KEY, q, 0.0)


def test_samples_older_than_the_window_are_forgotten() -> None:
    est = LatencyEstimator(window=10.0, min_samples=3)
    fill(est, [9.0, 9.0, 9.0], now=0.0)
    fill(est, [1.0, 1.0, 1.0], now=5.0)
    assert est.count(KEY, now=9.0) == 6
    assert est.quantile(KEY, 1.0, now=9.0) == 9.0
    # at t=10.5 the first three are more than 10 s old
    assert est.count(KEY, now=10.5) == 3
    assert est.quantile(KEY, 1.0, now=10.5) == 1.0
    assert est.quantile(KEY, 0.5, now=20.0) is None  # everything expired


def test_recent_samples_outweigh_old_ones() -> None:
    est = LatencyEstimator(window=1000.0, half_life=10.0, min_samples=1)
    fill(est, [10.0] * 50, now=0.0)  # slow, long ago
    fill(est, [1.0] * 10, now=100.0)  # fast, now: each weighs 2**10 times more
    assert est.quantile(KEY, 0.95, now=100.0) == 1.0
    # with no decay to speak of, the 50 old samples would dominate the p95
    flat = LatencyEstimator(window=1000.0, half_life=1e9, min_samples=1)
    fill(flat, [10.0] * 50, now=0.0)
    fill(flat, [1.0] * 10, now=100.0)
    assert flat.quantile(KEY, 0.95, now=100.0) == 10.0


def test_decay_is_halved_weight_per_half_life() -> None:
    # one old slow sample vs one fresh fast sample, half_life apart: weights 1/2 and 1,
    # so the fast one holds 2/3 of the weight: q <= 2/3 -> fast, above -> slow
    est = LatencyEstimator(window=100.0, half_life=5.0, min_samples=1)
    est.observe(KEY, 7.0, 0.0)
    est.observe(KEY, 1.0, 5.0)
    assert est.quantile(KEY, 0.66, now=5.0) == 1.0
    assert est.quantile(KEY, 0.67, now=5.0) == 7.0


def test_memory_is_bounded_per_key() -> None:
    est = LatencyEstimator(min_samples=1, max_samples=8)
    fill(est, [100.0] * 8)
    fill(est, [1.0] * 8)  # pushes every slow sample out
    assert est.count(KEY, 0.0) == 8
    assert est.quantile(KEY, 1.0, 0.0) == 1.0


def test_the_number_of_keys_is_bounded_least_recent_first() -> None:
    est = LatencyEstimator(min_samples=1, max_keys=3)
    for key in ("a", "b", "c"):
        est.observe(key, 1.0, 0.0)
    est.observe("a", 2.0, 1.0)  # "a" is now the most recent
    est.observe("d", 3.0, 2.0)  # evicts "b"
    assert len(est) == 3
    assert est.quantile("b", 0.5, 2.0) is None
    assert est.quantile("a", 1.0, 2.0) == 2.0
    assert est.quantile("d", 1.0, 2.0) == 3.0


def test_keys_are_independent_and_forget_drops_one() -> None:
    est = LatencyEstimator(min_samples=1)
    est.observe(("r0", "m", 0), 1.0, 0.0)
    est.observe(("r1", "m", 0), 5.0, 0.0)
    assert est.quantile(("r0", "m", 0), 0.5, 0.0) == 1.0
    assert est.quantile(("r1", "m", 0), 0.5, 0.0) == 5.0
    est.forget(("r1", "m", 0))
    est.forget("never seen")
    assert est.quantile(("r1", "m", 0), 0.5, 0.0) is None
    assert est.quantile(("r0", "m", 0), 0.5, 0.0) == 1.0


def test_large_clock_values_do_not_underflow() -> None:
    est = LatencyEstimator(window=1e9, half_life=1.0, min_samples=2)
    est.observe(KEY, 2.0, 1e7)
    est.observe(KEY, 3.0, 1e7 + 1.0)
    assert est.quantile(KEY, 0.5, now=1e7 + 1.0) in (2.0, 3.0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"window": 0.0},
        {"window": math.inf},
        {"half_life": -1.0},
        {"half_life": math.nan},
        {"min_samples": 0},
        {"min_samples": 10, "max_samples": 5},
        {"max_keys": 0},
    ],
)
def test_bad_parameters_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigurationError):
        LatencyEstimator(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [-0.1, math.inf, math.nan])
def test_bad_latencies_are_refused(value: float) -> None:
    with pytest.raises(ConfigurationError, match="latency"):
        LatencyEstimator().observe(KEY, value, 0.0)


@pytest.mark.parametrize("q", [0.0, -0.5, 1.5, math.nan])
def test_bad_quantiles_are_refused(q: float) -> None:
    with pytest.raises(ConfigurationError, match="q must be"):
        LatencyEstimator().quantile(KEY, q, 0.0)


@given(
    values=st.lists(st.floats(0.0, 100.0), min_size=1, max_size=60),
    times=st.lists(st.floats(0.0, 50.0), min_size=60, max_size=60),
    q=st.floats(0.01, 1.0),
)
def test_the_quantile_is_one_of_the_live_samples(
    values: list[float], times: list[float], q: float
) -> None:
    est = LatencyEstimator(window=30.0, half_life=7.0, min_samples=1)
    ordered = sorted(times[: len(values)])
    for value, t in zip(values, ordered, strict=False):
        est.observe(KEY, value, t)
    now = ordered[len(values) - 1]
    live = [v for v, t in zip(values, ordered, strict=False) if t >= now - 30.0]
    got = est.quantile(KEY, q, now)
    assert got in live
    assert min(live) <= got <= max(live)
    # monotone in q
    assert est.quantile(KEY, min(1.0, q + 0.2), now) >= got  # type: ignore[operator]


@pytest.mark.parametrize(
    ("chars", "bucket"),
    [(0, 0), (1, 0), (255, 0), (256, 1), (511, 1), (512, 2), (1023, 2), (1024, 3), (10**6, 12)],
)
def test_prompt_bucket_is_a_coarse_log2_class(chars: int, bucket: int) -> None:
    assert prompt_bucket(chars) == bucket


def test_prompt_bucket_refuses_negative_sizes() -> None:
    with pytest.raises(ConfigurationError):
        prompt_bucket(-1)


def big_estimator(refresh: float = 1.0) -> LatencyEstimator:
    est = LatencyEstimator(min_samples=1, max_samples=4096, window=1e6, refresh=refresh)
    fill(est, [1.0] * 1024)
    return est


def test_a_cached_answer_lags_by_at_most_refresh_seconds() -> None:
    est = big_estimator()
    assert est.quantile(KEY, 0.99, 0.0) == 1.0
    fill(est, [100.0] * 20)  # 20 of 1044 is under 1/32 of the series: the cache holds
    assert est.quantile(KEY, 0.99, 0.5) == 1.0
    assert est.quantile(KEY, 0.99, 1.0) == 100.0  # a second later it is recomputed


def test_enough_new_samples_refresh_the_cache_at_once() -> None:
    est = big_estimator()
    assert est.quantile(KEY, 0.99, 0.0) == 1.0
    fill(est, [100.0] * 40)  # 40 > 1064 // 32
    assert est.quantile(KEY, 0.99, 0.0) == 100.0


def test_expired_samples_refresh_the_cache() -> None:
    est = LatencyEstimator(window=10.0, min_samples=1, max_samples=4096, refresh=100.0)
    fill(est, [100.0] * 1024, now=0.0)
    fill(est, [1.0] * 1024, now=5.0)
    assert est.quantile(KEY, 0.99, 5.0) == 100.0
    assert est.quantile(KEY, 0.99, 10.5) == 1.0  # the slow half expired


def test_refresh_zero_disables_the_cache() -> None:
    est = big_estimator(refresh=0.0)
    assert est.quantile(KEY, 0.99, 0.0) == 1.0
    fill(est, [100.0] * 20)
    assert est.quantile(KEY, 0.99, 0.0) == 100.0
    with pytest.raises(ConfigurationError, match="refresh"):
        LatencyEstimator(refresh=-1.0)
