"""Admission: rate-limit headers, buckets, the fair queue, deadlines, learning and AIMD.

Time is a FakeClock the tests advance; order is forced with events and
``wait_all_tasks_blocked``, never with the wall clock.
"""

from __future__ import annotations

import email.utils
import math

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from swiftclient import ConfigurationError, RateLimited
from swiftclient.admission import (
    Admission,
    BucketCost,
    Limits,
    MemoryStore,
    Observed,
    estimate_tokens,
    parse_duration,
    parse_rate_limit_headers,
    parse_retry_after,
)

from .fakeclock import FakeClock

T = "openai/gpt"
WALL = 1_760_000_000.0


def admission(limits: Limits | None = None, **kwargs: object) -> tuple[Admission, FakeClock]:
    clock = FakeClock()
    return Admission(limits, clock=clock, wall=lambda: WALL, **kwargs), clock  # type: ignore[arg-type]


# ---------------------------------------------------------------------- headers


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("6m0s", 360.0),
        ("1s", 1.0),
        ("20ms", 0.02),
        ("1h2m3.5s", 3723.5),
        ("0.5", 0.5),
        ("17ms", 0.017),
        ("2m", 120.0),
    ],
)
def test_openai_reset_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "soon", "5x", "1s garbage", "-1s", "s"])
def test_garbled_durations_are_none(text: str) -> None:
    assert parse_duration(text) is None


def test_openai_headers() -> None:
    info = parse_rate_limit_headers(
        {
            "x-ratelimit-limit-requests": "60",
            "x-ratelimit-remaining-requests": "59",
            "x-ratelimit-reset-requests": "1s",
            "x-ratelimit-limit-tokens": "150000",
            "x-ratelimit-remaining-tokens": "149984",
            "x-ratelimit-reset-tokens": "6m0s",
        },
        WALL,
    )
    assert info.limits == {
        "requests": Observed(60, 59, 1.0),
        "tokens": Observed(150000, 149984, 360.0),
    }
    assert info.retry_after is None


def test_anthropic_headers_reset_at_rfc3339_times() -> None:
    reset = "2025-10-09T08:53:40Z"
    wall = parse_wall(reset) - 12.5
    info = parse_rate_limit_headers(
        {
            "anthropic-ratelimit-requests-limit": "50",
            "anthropic-ratelimit-requests-remaining": "49",
            "anthropic-ratelimit-requests-reset": reset,
            "anthropic-ratelimit-input-tokens-limit": "40000",
            "anthropic-ratelimit-input-tokens-remaining": "39000",
            "anthropic-ratelimit-input-tokens-reset": "2025-10-09T08:53:40+00:00",
            "anthropic-ratelimit-output-tokens-limit": "8000",
            "anthropic-ratelimit-output-tokens-remaining": "8000",
            "anthropic-ratelimit-tokens-limit": "48000",
            "anthropic-ratelimit-tokens-remaining": "bogus",
        },
        wall,
    )
    assert info.limits["requests"] == Observed(50, 49, 12.5)
    assert info.limits["input_tokens"] == Observed(40000, 39000, 12.5)
    assert info.limits["output_tokens"] == Observed(8000, 8000, None)
    assert info.limits["tokens"] == Observed(48000, None, None)  # garbled values left out


def parse_wall(rfc3339: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(rfc3339).timestamp()


def test_retry_after_seconds_date_and_milliseconds() -> None:
    assert parse_retry_after({"retry-after": "7"}, WALL) == 7.0
    assert parse_retry_after({"retry-after-ms": "250", "retry-after": "7"}, WALL) == 0.25
    date = email.utils.formatdate(WALL + 30, usegmt=True)
    assert parse_retry_after({"retry-after": date}, WALL) == pytest.approx(30.0)
    assert parse_retry_after({"retry-after": "whenever"}, WALL) is None
    assert parse_retry_after({}, WALL) is None


@pytest.mark.parametrize("value", ["-5", "nan", "inf", "-1e9"])
def test_a_retry_after_that_is_no_wait_means_backoff_not_now(value: str) -> None:
    """The retry path's own parser read a negative or NaN ``Retry-After`` as 0 (retry at
    once); both parsers are one now, which ignores such a value, as admission did."""
    from swiftclient._retry import retry_after_seconds

    for name in ("retry-after", "Retry-After-Ms"):
        assert retry_after_seconds({name: value}) is None
    assert retry_after_seconds({"retry-after-ms": value, "retry-after": "3"}) == 3.0
    assert retry_after_seconds({"Retry-After": "2"}) == 2.0


def test_estimate_tokens_rounds_up() -> None:
    assert estimate_tokens("x" * 9) == 3
    assert estimate_tokens(b"x" * 8) == 2
    assert estimate_tokens("x" * 9, chars_per_token=3) == 3
    with pytest.raises(ConfigurationError):
        estimate_tokens("x", chars_per_token=0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"concurrency": 0},
        {"concurrency": 1.5},
        {"rpm": 0},
        {"tpm": -1},
        {"rpm": math.inf},
        {"chars_per_token": 0},
        {"lease_ttl": 0},
        {"window": 0},
    ],
)
def test_bad_limits_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigurationError):
        Limits(**kwargs)  # type: ignore[arg-type]


def test_bad_limits_mapping_is_refused() -> None:
    with pytest.raises(ConfigurationError):
        Admission({"openai": 5})  # type: ignore[dict-item]


def test_limits_resolve_by_target_then_backend() -> None:
    a = Admission({"openai": Limits(rpm=10, concurrency=3), "openai/big": Limits(rpm=1)})
    assert a.concurrency("openai/x") == 3 and a.waiting("openai/x") == 0  # no loop needed
    assert a.limits_for("openai/small").rpm == 10
    assert a.limits_for("openai/big").rpm == 1
    assert a.limits_for("other/x") == Limits()


# ---------------------------------------------------------------------- windows (pure)


@given(
    steps=st.lists(st.tuples(st.floats(0, 5), st.floats(0, 30)), min_size=1, max_size=60),
    capacity=st.floats(1, 100),
    window=st.floats(0.1, 20),
)
def test_no_window_ever_holds_more_than_the_capacity(
    steps: list[tuple[float, float]], capacity: float, window: float
) -> None:
    clock = FakeClock(start=0.0)
    store = MemoryStore(clock.now)
    grants: list[tuple[float, float]] = []
    for dt, cost in steps:
        clock.t += dt
        spec = BucketCost("tokens", cost, capacity, window)
        admit = store.take_now("k", [spec])
        if admit.granted:
            grants.append((clock.t, min(cost, capacity)))
            in_window = sum(units for at, units in grants if at > clock.t - window + 1e-9)
            assert in_window <= capacity + 1e-6
        else:
            assert admit.limit == "tokens" and admit.wait is not None and admit.wait > 0


@given(
    costs=st.lists(st.floats(0.5, 30), min_size=1, max_size=20),
    gaps=st.lists(st.floats(0, 3), min_size=20, max_size=20),
    window=st.floats(0.5, 10),
)
def test_a_refused_take_fits_when_it_was_told_and_not_before(
    costs: list[float], gaps: list[float], window: float
) -> None:
    capacity = 40.0
    clock = FakeClock(start=0.0)
    store = MemoryStore(clock.now)
    for cost, gap in zip(costs, gaps, strict=False):
        clock.t += gap
        spec = BucketCost("tokens", cost, capacity, window)
        admit = store.take_now("k", [spec])
        if not admit.granted:
            assert admit.wait is not None and 0 < admit.wait <= window + 1e-9
            before = clock.t
            clock.t = before + admit.wait * 0.999
            assert store.peek_now("k", [spec])[0]["tokens"] < cost
            clock.t = before + admit.wait + 1e-9
            assert store.take_now("k", [spec]).granted


def test_a_burst_of_the_whole_capacity_is_granted_at_once() -> None:
    clock = FakeClock()
    store = MemoryStore(clock.now)
    spec = BucketCost("requests", 1, 10, 60)
    assert all(store.take_now("k", [spec]).granted for _ in range(10))
    assert store.take_now("k", [spec]) == (False, "requests", pytest.approx(60.0), 0)
    clock.t += 30  # a token bucket would have refilled five by now; the window frees none
    assert not store.take_now("k", [spec]).granted
    clock.t += 30
    assert all(store.take_now("k", [spec]).granted for _ in range(10))


def test_corrections_give_back_from_the_oldest_and_never_free_below_the_provider() -> None:
    clock = FakeClock()
    store = MemoryStore(clock.now)
    spec = BucketCost("tokens", 60, 100, 10)
    assert store.take_now("k", [spec]).granted  # 60 at t=0
    clock.t += 5
    assert store.take_now("k", [spec._replace(cost=30)]).granted  # 30 at t=5
    store.adjust_now("k", spec._replace(cost=-20))  # the first used 40, not 60
    assert store.peek_now("k", [spec])[0]["tokens"] == pytest.approx(30)
    clock.t += 5  # the first entry (40 left of it) leaves the window
    assert store.peek_now("k", [spec])[0]["tokens"] == pytest.approx(70)
    # the provider says 20 remain: 80 used by its count, 30 by ours: the log takes 50 more
    store.set_level_now("k", spec._replace(cost=20))
    assert store.peek_now("k", [spec])[0]["tokens"] == pytest.approx(20)
    # the provider says 90 remain: less used than we logged, and nothing is freed
    store.set_level_now("k", spec._replace(cost=90))
    assert store.peek_now("k", [spec])[0]["tokens"] == pytest.approx(20)


def test_a_take_is_all_or_nothing() -> None:
    clock = FakeClock()
    store = MemoryStore(clock.now)
    requests = BucketCost("requests", 1, 10, 100)
    tokens = BucketCost("tokens", 80, 100, 100)
    assert store.take_now("k", [requests, tokens]).granted
    admit = store.take_now("k", [requests, tokens])
    assert admit == (False, "tokens", pytest.approx(100.0), 0)
    # the refused take left the requests limit alone: 9 requests remain
    for _ in range(9):
        assert store.take_now("k", [requests]).granted
    assert not store.take_now("k", [requests]).granted


# ---------------------------------------------------------------------- waiting


@pytest.mark.anyio
async def test_concurrency_limit_queues_first_in_first_out() -> None:
    a, clock = admission(Limits(concurrency=2))
    first = await a.acquire(T)
    second = await a.acquire(T)
    order: list[int] = []

    async def call(n: int) -> None:
        permit = await a.acquire(T)
        order.append(n)
        await a.settle(permit, status=200)

    async with anyio.create_task_group() as tg:
        for n in range(4):
            tg.start_soon(call, n)
            await anyio.wait_all_tasks_blocked()
        assert a.waiting(T) == 4 and order == []
        await a.settle(first, status=200)
        await anyio.wait_all_tasks_blocked()
        await a.settle(second, status=200)
    assert order == [0, 1, 2, 3]
    assert a.in_flight(T) == 0 and await a.store.leases(T) == 0


@pytest.mark.anyio
async def test_priority_goes_ahead_of_earlier_waiters() -> None:
    a, _ = admission(Limits(concurrency=1))
    held = await a.acquire(T)
    order: list[str] = []

    async def call(name: str, priority: int) -> None:
        permit = await a.acquire(T, priority=priority)
        order.append(name)
        await a.settle(permit)

    async with anyio.create_task_group() as tg:
        for name, priority in [("low", 0), ("low2", 0), ("high", 5)]:
            tg.start_soon(call, name, priority)
            await anyio.wait_all_tasks_blocked()
        await a.settle(held)
    assert order == ["high", "low", "low2"]


@pytest.mark.anyio
async def test_a_wait_that_cannot_fit_the_deadline_fails_at_once() -> None:
    a, clock = admission(Limits(rpm=2))  # 2 at once, then none until they leave the window
    await a.acquire(T)
    await a.acquire(T)
    start = clock.now()
    with pytest.raises(RateLimited) as caught:
        await a.acquire(T, timeout=10)
    assert clock.now() == start  # no waiting at all
    err = caught.value
    assert err.limit == "requests" and err.reset_after == pytest.approx(60 * 1.02)
    assert err.target == T and "requests" in str(err)
    assert a.waiting(T) == 0


@pytest.mark.anyio
async def test_a_wait_that_fits_is_admitted_when_the_window_frees() -> None:
    a, clock = admission(Limits(rpm=2, margin=0))
    await a.acquire(T)
    await clock.advance(10)
    await a.acquire(T)
    got: list[float] = []

    async def call() -> None:
        permit = await a.acquire(T, timeout=60)
        got.append(permit.waited)

    async with anyio.create_task_group() as tg:
        tg.start_soon(call)
        await anyio.wait_all_tasks_blocked()
        await clock.advance(49)
        assert got == []
        await clock.advance(1)  # the first request leaves the window
    assert got == [pytest.approx(50.0)]


@pytest.mark.anyio
async def test_a_shorter_window_frees_in_that_window() -> None:
    a, clock = admission(Limits(rpm=2, window=1.0))  # 2 in any second (and 2% margin)
    await a.acquire(T)
    await a.acquire(T)
    with pytest.raises(RateLimited) as caught:
        await a.acquire(T, timeout=0.1)
    assert caught.value.reset_after == pytest.approx(1.02)
    await clock.advance(1.02)
    permit = await a.acquire(T, timeout=0)
    assert permit.waited == 0


@pytest.mark.anyio
async def test_concurrency_wait_gives_up_at_the_deadline() -> None:
    a, clock = admission(Limits(concurrency=1))
    await a.acquire(T)

    async def call() -> None:
        with pytest.raises(RateLimited) as caught:
            await a.acquire(T, timeout=5)
        assert caught.value.limit == "concurrency" and caught.value.reset_after is None

    async with anyio.create_task_group() as tg:
        tg.start_soon(call)
        await anyio.wait_all_tasks_blocked()
        await clock.advance(5)
    assert a.waiting(T) == 0


@pytest.mark.anyio
async def test_queued_waiters_whose_deadline_ends_before_the_reset_fail_at_once() -> None:
    a, clock = admission(Limits(rpm=1, margin=0))  # one now, the next after 60 s
    await a.acquire(T)
    results: dict[str, object] = {}

    async def call(name: str, timeout: float) -> None:
        try:
            await a.acquire(T, timeout=timeout)
            results[name] = "ok"
        except RateLimited as exc:
            results[name] = exc.limit

    async with anyio.create_task_group() as tg:
        tg.start_soon(call, "patient", 100)
        await anyio.wait_all_tasks_blocked()
        tg.start_soon(call, "hurried", 10)  # queued behind a head that waits 60 s
        await anyio.wait_all_tasks_blocked()
        assert results == {"hurried": "requests"}
        await clock.advance(60)
    assert results == {"hurried": "requests", "patient": "ok"}


@pytest.mark.anyio
async def test_a_cancelled_waiter_leaves_the_queue_moving() -> None:
    a, _ = admission(Limits(concurrency=1))
    held = await a.acquire(T)
    done: list[str] = []

    async def call(name: str) -> None:
        permit = await a.acquire(T)
        done.append(name)
        await a.settle(permit)

    async with anyio.create_task_group() as tg:
        tg.start_soon(call, "first")
        await anyio.wait_all_tasks_blocked()
        async with anyio.create_task_group() as inner:
            inner.start_soon(call, "cancelled")
            await anyio.wait_all_tasks_blocked()
            inner.cancel_scope.cancel()
        tg.start_soon(call, "second")
        await anyio.wait_all_tasks_blocked()
        await a.settle(held)
    assert done == ["first", "second"]
    assert a.waiting(T) == 0


# ---------------------------------------------------------------------- learning


@pytest.mark.anyio
async def test_tokens_are_corrected_from_usage() -> None:
    a, _ = admission(Limits(tpm=100))
    permit = await a.acquire(T, tokens=80)
    with pytest.raises(RateLimited):
        await a.acquire(T, tokens=70, timeout=1)
    await a.settle(permit, status=200, total_tokens=20)  # 60 given back
    await a.acquire(T, tokens=70, timeout=0)


@pytest.mark.anyio
async def test_usage_over_the_estimate_is_charged() -> None:
    a, clock = admission(Limits(tpm=600, margin=0))  # 600 tokens in any minute
    permit = await a.acquire(T, tokens=100)
    await clock.advance(10)
    await a.settle(permit, status=200, input_tokens=300, output_tokens=200)  # 400 more
    with pytest.raises(RateLimited) as caught:
        await a.acquire(T, tokens=200, input_tokens=0, timeout=1)  # 200 of output
    assert caught.value.limit == "tokens"
    # 500 used, 100 short: the first 100 leave the window 60 s after they were taken
    assert caught.value.reset_after == pytest.approx(50.0)


@pytest.mark.anyio
async def test_input_estimates_are_scaled_by_what_the_provider_counted() -> None:
    a, _ = admission(Limits(tpm=10_000))
    reserved = []
    for _ in range(30):  # the provider counts 40 input tokens where we estimate 100
        permit = await a.acquire(T, tokens=110, input_tokens=100)
        reserved.append(permit.input_tokens)
        await a.settle(permit, status=200, input_tokens=40, output_tokens=10)
    assert reserved[0] == 100  # nothing learned yet: the estimate as given
    assert 40 <= reserved[-1] <= 42  # converged on the provider's count
    permit = await a.acquire(T, tokens=110, input_tokens=100)
    assert permit.tokens == permit.input_tokens + 10  # the output allowance is not scaled


@pytest.mark.anyio
async def test_openai_headers_are_learned() -> None:
    a, _ = admission()  # no configured limits: learning only
    permit = await a.acquire(T)
    headers = {
        "X-RateLimit-Limit-Requests": "10",
        "X-RateLimit-Remaining-Requests": "0",
        "X-RateLimit-Reset-Requests": "6s",
    }
    await a.settle(permit, status=200, headers=headers)
    with pytest.raises(RateLimited) as caught:
        await a.acquire(T, timeout=0.1)
    assert caught.value.limit == "requests"
    assert caught.value.reset_after == pytest.approx(6.0)  # 10 used, all back by the reset


@pytest.mark.anyio
async def test_learning_off_ignores_headers() -> None:
    a, _ = admission(Limits(learn=False))
    permit = await a.acquire(T)
    await a.settle(
        permit,
        status=429,
        headers={
            "x-ratelimit-remaining-requests": "0",
            "x-ratelimit-limit-requests": "1",
            "retry-after": "30",
        },
    )
    await a.acquire(T, timeout=0)
    assert a.concurrency(T) is None


@pytest.mark.anyio
async def test_a_learned_limit_never_raises_a_configured_one() -> None:
    a, _ = admission(Limits(rpm=2))
    permit = await a.acquire(T)
    await a.settle(permit, headers={"x-ratelimit-limit-requests": "1000"})
    await a.acquire(T)
    with pytest.raises(RateLimited):
        await a.acquire(T, timeout=1)


@pytest.mark.anyio
async def test_retry_after_rests_the_target() -> None:
    a, clock = admission()
    permit = await a.acquire(T)
    await a.settle(permit, status=429, headers={"retry-after-ms": "2000"})
    with pytest.raises(RateLimited) as caught:
        await a.acquire(T, timeout=1)
    assert caught.value.limit == "retry_after"
    assert caught.value.reset_after == pytest.approx(2.0)
    admitted: list[bool] = []

    async def call() -> None:
        await a.acquire(T, timeout=5)
        admitted.append(True)

    async with anyio.create_task_group() as tg:
        tg.start_soon(call)
        await anyio.wait_all_tasks_blocked()
        await clock.advance(1.5)
        assert admitted == []
        await clock.advance(0.5)
    assert admitted == [True]
    assert a.concurrency(T) is None  # a 429 with Retry-After is not a bare 429


@pytest.mark.anyio
async def test_a_bare_429_halves_concurrency_once_per_round_and_successes_grow_it() -> None:
    a, clock = admission()
    permits = [await a.acquire(T) for _ in range(8)]
    await a.settle(permits[0], status=429)
    assert a.concurrency(T) == 4
    # the others were sent before the decrease: their 429s are the same congestion
    await a.settle(permits[1], status=429)
    assert a.concurrency(T) == 4
    for permit in permits[2:]:
        await a.settle(permit, status=200)
    await clock.advance(1)
    late = await a.acquire(T)
    await a.settle(late, status=429)  # sent after the decrease: halves again
    assert a.concurrency(T) == 2
    for _ in range(8):
        await a.settle(await a.acquire(T), status=200)
    assert a.concurrency(T) is not None and a.concurrency(T) >= 4  # type: ignore[operator]


@pytest.mark.anyio
async def test_aimd_recovers_to_the_configured_limit() -> None:
    a, _ = admission(Limits(concurrency=4))
    permits = [await a.acquire(T) for _ in range(4)]
    await a.settle(permits[0], status=429)
    assert a.concurrency(T) == 2
    for p in permits[1:]:
        await a.settle(p)
    for _ in range(20):
        await a.settle(await a.acquire(T), status=200)
    assert a.concurrency(T) == 4


def test_a_window_filled_in_one_trio_run_holds_in_the_next() -> None:
    """An admission outlives an event loop (one ``anyio.run`` after another). Each trio
    run's clock starts at a random point, and the admission kept its times on the running
    loop's clock: the next run either admitted past the limit or refused for hours. It
    keeps them on the monotonic clock."""
    admission = Admission({"p": Limits(rpm=2, window=60.0)})

    async def fill() -> None:
        for _ in range(2):
            await admission.settle(await admission.acquire("p/m", timeout=0), status=200)

    async def next_run() -> float | None:
        with pytest.raises(RateLimited) as refused:
            await admission.acquire("p/m", timeout=0)
        return refused.value.reset_after

    anyio.run(fill, backend="trio")
    reset_after = anyio.run(next_run, backend="trio")
    assert reset_after is not None and 0 < reset_after <= 60.0 * 1.02
