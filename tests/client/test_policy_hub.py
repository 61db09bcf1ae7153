"""PolicyHub on the call path: estimates set the adaptive delay, the budget and throttle gate
hedges, breakers skip targets and hear outcomes. The policy objects here are minimal
stand-ins with the agreed interfaces (the real ones live in their own modules)."""

from __future__ import annotations

from collections.abc import Hashable

import pytest

from swiftclient import AsyncClient, BadRequestError, Hedge, HTTPBackend, RetryPolicy
from swiftclient._policies import prompt_chars
from swiftclient.extend import PolicyHub, Target
from swiftclient.testing import Reply
from swiftclient.types import ChatRequest

from .mock import FAST_RETRY, HELD, Gated, providers

pytestmark = pytest.mark.anyio


class Estimates:
    def __init__(self, answer: float | None = None) -> None:
        self.answer = answer
        self.seen: list[tuple[Hashable, float]] = []
        self.asked: list[tuple[Hashable, float]] = []

    def observe(self, key: Hashable, value: float, now: float) -> None:
        self.seen.append((key, value))

    def quantile(self, key: Hashable, q: float, now: float) -> float | None:
        self.asked.append((key, q))
        return self.answer


class Budget:
    def __init__(self, allow: bool) -> None:
        self.allow = allow
        self.calls = 0

    def on_call(self, now: float) -> None:
        self.calls += 1

    def try_spend(self, now: float) -> bool:
        return self.allow


class Switch:
    def __init__(self) -> None:
        self.failures = 0
        self.successes = 0

    def on_failure(self) -> None:
        self.failures += 1

    def on_success(self) -> None:
        self.successes += 1

    def allowed(self) -> bool:
        return self.failures == 0


class Breaker:
    def __init__(self) -> None:
        self.records: list[bool] = []
        self.blocked_until: float | None = None
        self.is_open = False

    def allow(self, now: float) -> bool:
        return not self.is_open

    def record(self, ok: bool, now: float) -> None:
        self.records.append(ok)

    def state(self, now: float) -> str:
        return "open" if self.is_open else "closed"

    def block_until(self, until: float) -> None:
        self.blocked_until = until


def gated_client(hub: PolicyHub, *, a_answers: bool = True) -> tuple[AsyncClient, Gated, Gated]:
    a, b = Gated("a"), Gated("b")
    if a_answers:
        a.gate.set()
    b.gate.set()
    return AsyncClient(backends={"a": a, "b": b}, policies=hub), a, b


async def test_the_budget_decides_whether_a_hedge_is_sent() -> None:
    # a answers at once; a zero delay still starts b first, unless the budget refuses it.
    for allow, b_opened in ((True, 1), (False, 0)):
        budget = Budget(allow)
        client, _, b = gated_client(PolicyHub(budget=budget))
        await client.chat("hi", model=["a/m", "b/m"], hedge=Hedge(delay=0.0))
        assert b.open == b_opened
        assert budget.calls == 1


async def test_the_adaptive_delay_asks_the_estimator_and_the_estimator_learns() -> None:
    estimates = Estimates(answer=0.0)  # clamped up to min_delay, then b is sent
    hub = PolicyHub(estimator=estimates, bucket=lambda chars: chars // 10)
    client, a, b = gated_client(hub, a_answers=False)
    completion = await client.chat("x" * 25, model=["a/m", "b/m"], hedge=Hedge(quantile=0.9))
    assert completion.text == "b one two"
    assert estimates.asked == [(("a", "m", 2, True), 0.9)]
    # b's time to first token, then a's censored sample: a waited at least the hedge delay
    # (min_delay, the estimate of 0 clamped up) without a first token before it lost.
    assert [key for key, _ in estimates.seen] == [("b", "m", 2, True), ("a", "m", 2, True)]
    assert estimates.seen[1][1] >= Hedge().min_delay
    assert (a.open, a.closed) == (1, 1)


async def test_breakers_skip_open_targets_and_hear_outcomes() -> None:
    breakers: dict[int, Breaker] = {}

    def new_breaker() -> Breaker:
        breakers[len(breakers)] = breaker = Breaker()
        return breaker

    hub = PolicyHub(breaker=new_breaker)
    async with providers("a", "b") as fakes:
        backends = {name: HTTPBackend(fake.base_url, name=name) for name, fake in fakes.items()}
        client = AsyncClient(backends=backends, retry=RetryPolicy.none(), policies=hub)
        async with client:
            fakes["a"].script(Reply(status=503, retry_after=7))
            completion = await client.chat("hi", model=["a/m", "b/m"])
            assert completion.text == "from b"
            a_breaker, b_breaker = breakers[0], breakers[1]
            assert a_breaker.records == [False] and b_breaker.records == [True]
            assert a_breaker.blocked_until is not None
            assert client.health() == {"a/m": "closed", "b/m": "closed"}
            # an open breaker is skipped
            a_breaker.is_open = True
            completion = await client.chat("hi", model=["a/m", "b/m"])
            assert completion.timing is not None
            assert [x.backend for x in completion.timing.attempts] == ["b"]
            assert client.health()["a/m"] == "open"
            # a request error says nothing about the target
            fakes["b"].script(Reply(status=400))
            with pytest.raises(BadRequestError):
                await client.chat("hi", model=["a/m", "b/m"])
            assert b_breaker.records == [True, True]
        assert len(fakes["a"].requests) == 1


async def test_the_throttle_turns_hedging_off_after_failures() -> None:
    switch = Switch()
    hub = PolicyHub(throttle=switch)
    async with providers("a", "b") as fakes:
        backends = {name: HTTPBackend(fake.base_url, name=name) for name, fake in fakes.items()}
        async with AsyncClient(backends=backends, retry=RetryPolicy.none(), policies=hub) as c:
            fakes["a"].script(Reply(status=500))
            await c.chat("hi", model=["a/m", "b/m"], hedge=Hedge(delay=3600.0))
            assert (switch.failures, switch.successes) == (1, 1)
            # now no hedge: a answers after a while, b is never asked
            fakes["a"].script(Reply(text="late a", ttft=0.2))
            completion = await c.chat("hi", model=["a/m", "b/m"], hedge=Hedge(delay=0.0))
            assert completion.text == "late a"
            assert len(fakes["b"].requests) == 1


def test_prompt_chars_counts_text() -> None:
    request = ChatRequest.model_validate(
        {
            "model": "m",
            "messages": [
                {"role": "system", "content": "abc"},
                {"role": "user", "content": [{"type": "text", "text": "de"}]},
            ],
        }
    )
    assert prompt_chars(request.messages) == 5
    assert Target(HTTPBackend("http://x/v1", name="n"), "m").name == "n/m"


async def test_non_streamed_calls_keep_their_own_estimates() -> None:
    # A non-streamed attempt's time is its whole reply: it must not feed first-token delays.
    estimates = Estimates(answer=0.0)
    hub = PolicyHub(estimator=estimates, bucket=lambda chars: chars // 10)
    async with providers("a", "b") as fakes:
        backends = {name: HTTPBackend(fake.base_url, name=name) for name, fake in fakes.items()}
        async with AsyncClient(backends=backends, policies=hub) as client:
            fakes["a"].script(HELD)
            completion = await client.chat(
                "x" * 25, model=["a/m", "b/m"], hedge=Hedge(quantile=0.9), stream=False
            )
    assert completion.text == "from b"
    assert estimates.asked == [(("a", "m", 2, False), 0.9)]
    # b's whole reply, then a's censored wait: both under the non-streamed key only.
    assert [key for key, _ in estimates.seen] == [("b", "m", 2, False), ("a", "m", 2, False)]


async def test_the_budget_hears_a_call_once_however_many_rounds_it_takes() -> None:
    budget = Budget(True)
    async with providers("a", "b") as fakes:
        backends = {name: HTTPBackend(fake.base_url, name=name) for name, fake in fakes.items()}
        retry = FAST_RETRY
        async with AsyncClient(
            backends=backends, retry=retry, policies=PolicyHub(budget=budget)
        ) as client:
            fakes["a"].script(Reply(status=503), Reply(status=503))
            fakes["b"].script(Reply(status=503), Reply(status=503))
            completion = await client.chat("hi", model=["a/m", "b/m"], hedge=Hedge(delay=3600))
            assert completion.timing is not None
            assert len(completion.timing.attempts) == 5
    assert budget.calls == 1
