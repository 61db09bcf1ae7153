"""Several targets per call: hedged races, sequential fallback, fatal errors, one deadline.

Over real sockets with :class:`FakeProvider` (one per target) and, where the order of events
matters, a gated in-test backend; no test waits on the wall clock for its verdict.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence

import anyio
import anyio._backends._asyncio
import anyio.lowlevel
import pytest

from swiftclient import (
    AsyncClient,
    BadRequestError,
    ChatCompletion,
    ConfigurationError,
    DeadlineExceeded,
    FirstTokenTimeout,
    Hedge,
    HTTPBackend,
    InternalServerError,
    RetryPolicy,
    Timeout,
)
from swiftclient.extend import AttemptResult
from swiftclient.hedging import fallback, is_fatal, race
from swiftclient.testing import FakeProvider, Reply

from .mock import HELD, NO_RETRY, Gated, Recorder, client_for, providers

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("transport")]
RELEASE_LIMIT = 30.0  # seconds; bounds waiting for cleanup, never a speed assertion


def outcomes(completion: ChatCompletion) -> list[tuple[str, str]]:
    assert completion.timing is not None
    return [(a.backend, a.outcome) for a in completion.timing.attempts]


async def released(client: AsyncClient, fake: FakeProvider) -> None:
    """The fake finished answering and the client holds no connection to it."""
    with anyio.fail_after(RELEASE_LIMIT):
        await fake.wait_until_idle()
    backend = client.backends[fake.model]
    assert isinstance(backend, HTTPBackend)
    assert backend.pool_stats()["in_use"] == 0


# --------------------------------------------------------------------------- hedging


@pytest.mark.parametrize("streamed", [True, False])
async def test_a_hedge_to_the_second_target_wins_when_the_first_is_held(streamed: bool) -> None:
    async with providers("a", "b") as fakes, client_for(fakes) as client:
        fakes["a"].script(HELD)
        completion = await client.chat(
            "hi", model=["a/m", "b/m"], hedge=Hedge(delay=0.05), stream=streamed
        )
        assert completion.text == "from b"
        assert outcomes(completion) == [("a", "lost"), ("b", "ok")]
        assert completion.timing is not None
        assert [a.trigger for a in completion.timing.attempts] == ["first", "hedge"]
        await released(client, fakes["a"])
        # On a loaded machine the hedge can win before the fake even read a's request; every
        # request it did read was cancelled, never answered.
        assert fakes["a"].cancelled == len(fakes["a"].requests)
        await released(client, fakes["b"])


async def test_the_stream_of_a_hedged_call_carries_only_the_winners_chunks() -> None:
    async with providers("a", "b") as fakes, client_for(fakes) as client:
        fakes["a"].script(Reply(text="from a", ttft=60.0))
        async with client.stream("hi", model=["a/m", "b/m"], hedge=Hedge(delay=0.0)) as stream:
            pieces = [text async for text in stream.text()]
            assert stream.request.model == "m"
        assert "".join(pieces) == "from b"
        assert [a.outcome for a in stream.timing.attempts] == ["lost", "ok"]
        await released(client, fakes["a"])


async def test_the_client_wide_hedge_applies_and_a_call_can_turn_it_off() -> None:
    async with providers("a", "b") as fakes, client_for(fakes, hedge=Hedge(delay=0.0)) as client:
        fakes["a"].script(HELD)
        hedged = await client.chat("hi", model=["a/m", "b/m"])
        assert outcomes(hedged) == [("a", "lost"), ("b", "ok")]
        fakes["a"].script(Reply(text="from a"))
        plain = await client.chat("hi", model=["a/m", "b/m"], hedge=None)
        assert outcomes(plain) == [("a", "ok")]
        assert len(fakes["b"].requests) == 1


async def test_a_non_fatal_failure_starts_the_next_target_at_once() -> None:
    # The hedge delay is far beyond the call's deadline: only the 429 can start target b.
    async with providers("a", "b") as fakes, client_for(fakes) as client:
        fakes["a"].script(Reply(status=429))
        completion = await client.chat(
            "hi", model=["a/m", "b/m"], hedge=Hedge(delay=3600.0), timeout=60.0
        )
        assert completion.text == "from b"
        assert completion.timing is not None
        first = completion.timing.attempts[0]
        assert (first.outcome, first.status_code, first.error) == ("error", 429, "RateLimitError")
        assert [a.trigger for a in completion.timing.attempts] == ["first", "fallback"]


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
async def test_a_fatal_answer_ends_a_hedged_call(status: int) -> None:
    async with providers("a", "b") as fakes, client_for(fakes) as client:
        fakes["a"].script(Reply(status=status))
        fakes["b"].script(HELD)
        with pytest.raises(Exception) as caught:
            await client.chat("hi", model=["a/m", "b/m"], hedge=Hedge(delay=0.0))
        assert getattr(caught.value, "status_code", None) == status
        attempts = caught.value.attempts  # type: ignore[attr-defined]
        assert [(a.backend, a.outcome) for a in attempts] == [("a", "error"), ("b", "cancelled")]
        await released(client, fakes["b"])


async def test_every_target_failing_raises_the_last_failure_with_every_attempt() -> None:
    async with providers("a", "b") as fakes, client_for(fakes) as client:
        fakes["a"].script(Reply(status=500))
        fakes["b"].script(Reply(status=503))
        with pytest.raises(InternalServerError) as caught:  # b starts once a has failed
            await client.chat("hi", model=["a/m", "b/m"], hedge=Hedge(delay=3600.0))
        assert caught.value.status_code == 503
        assert [a.status_code for a in caught.value.attempts] == [500, 503]
        assert "after 2 attempts" in str(caught.value)


async def test_retries_go_round_the_targets_again() -> None:
    retry = RetryPolicy(max_attempts=2, initial_backoff=0.0, max_backoff=0.0)
    async with providers("a", "b") as fakes, client_for(fakes, retry=retry) as client:
        fakes["a"].script(Reply(status=500), Reply(status=500))
        fakes["b"].script(Reply(status=502))
        hedge = Hedge(delay=3600.0)  # the order is fixed: b starts once a has failed
        completion = await client.chat("hi", model=["a/m", "b/m"], hedge=hedge)
        assert completion.text == "from b"
        assert completion.timing is not None
        assert [
            (a.number, a.backend, a.outcome, a.trigger) for a in completion.timing.attempts
        ] == [
            (1, "a", "error", "first"),
            (2, "b", "error", "fallback"),
            (3, "a", "error", "retry"),
            (4, "b", "ok", "fallback"),
        ]


# --------------------------------------------------------------------------- fallback


@pytest.mark.parametrize("streamed", [True, False])
async def test_fallback_tries_targets_in_order_until_one_answers(streamed: bool) -> None:
    async with providers("a", "b", "c") as fakes, client_for(fakes) as client:
        fakes["a"].script(Reply(status=503))
        fakes["b"].script(Reply(drop_after=0))
        completion = await client.chat("hi", model=["a/m", "b/m", "c/m"], stream=streamed)
        assert completion.text == "from c"
        assert outcomes(completion) == [("a", "error"), ("b", "error"), ("c", "ok")]


async def test_fallback_stops_at_a_fatal_error() -> None:
    async with providers("a", "b") as fakes, client_for(fakes) as client:
        fakes["a"].script(Reply(status=400))
        with pytest.raises(BadRequestError):
            await client.chat("hi", model=["a/m", "b/m"])
        assert fakes["b"].requests == []


async def test_a_first_token_timeout_falls_back_and_the_deadline_is_shared() -> None:
    limits = Timeout(total=120.0, first_token=0.2)
    async with providers("a", "b") as fakes, client_for(fakes, timeout=limits) as client:
        fakes["a"].script(HELD)
        completion = await client.chat("hi", model=["a/m", "b/m"])
        assert completion.text == "from b"
        assert completion.timing is not None
        assert [a.error for a in completion.timing.attempts] == ["FirstTokenTimeout", None]
        # every target held: the one total deadline ends the whole call
        fakes["a"].script(HELD)
        fakes["b"].script(HELD)
        with pytest.raises(DeadlineExceeded) as caught:
            await client.chat(
                "hi", model=["a/m", "b/m"], hedge=Hedge(delay=0.0), timeout=Timeout(total=0.3)
            )
        # both attempts reach the deadline together: each one ends by it or is cancelled
        ended = [a.outcome for a in caught.value.attempts]
        assert len(ended) == 2 and set(ended) <= {"error", "cancelled"} and "error" in ended
        await released(client, fakes["a"])
        await released(client, fakes["b"])


async def test_model_lists_are_checked() -> None:
    async with providers("a") as fakes, client_for(fakes) as client:
        with pytest.raises(ConfigurationError, match="no target"):
            await client.chat("hi", model=[])
        with pytest.raises(ConfigurationError, match="strings"):
            await client.chat("hi", model=["a/m", 3])  # type: ignore[list-item]
        with pytest.raises(ConfigurationError, match="Hedge"):
            await client.chat("hi", model=["a/m"], hedge=0.1)  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError, match="Hedge"):
            AsyncClient(backends=client.backends, hedge=0.1)  # type: ignore[arg-type]
        assert [t.name for t in client.targets(["a/m", "a/m", "a/n"])] == ["a/m", "a/n"]


def test_hedge_settings_are_checked() -> None:
    with pytest.raises(ConfigurationError):
        Hedge(delay=-1.0)
    with pytest.raises(ConfigurationError):
        Hedge(quantile=1.0)
    with pytest.raises(ConfigurationError):
        Hedge(min_delay=2.0, max_delay=1.0)
    with pytest.raises(ConfigurationError):
        Hedge(max_attempts=0)
    adaptive = Hedge(min_delay=0.1, max_delay=2.0)
    assert adaptive.delay_for(None) == 2.0
    assert adaptive.delay_for(0.01) == 0.1
    assert adaptive.delay_for(0.5) == 0.5
    assert adaptive.delay_for(9.0) == 2.0
    assert Hedge(delay=0.3).delay_for(9.0) == 0.3


def test_fatal_errors() -> None:
    assert is_fatal(BadRequestError("x", status_code=400))
    assert not is_fatal(InternalServerError("x", status_code=500))
    assert is_fatal(DeadlineExceeded("x"))
    assert not is_fatal(FirstTokenTimeout("x"))
    assert is_fatal(ConfigurationError("x"))
    assert is_fatal(RuntimeError("a bug"))


# --------------------------------------------------------------------------- gated backend


async def test_the_first_target_wins_when_it_answers_before_the_hedge_delay() -> None:
    a, b = Gated("a"), Gated("b")
    a.gate.set()
    recorder = Recorder()
    client = AsyncClient(backends={"a": a, "b": b}, observers=[recorder])
    completion = await client.chat("hi", model=["a/m", "b/m"], hedge=Hedge(delay=3600.0))
    assert completion.text == "a one two"
    assert b.open == 0
    assert recorder.events == [
        ("start", "a", "pending"),
        ("first_token", "a", "pending"),
        ("commit", "a", "pending"),
        ("end", "a", "won"),
    ]


async def test_observers_see_the_loser_end_before_the_winner() -> None:
    a, b = Gated("a"), Gated("b")
    b.gate.set()
    recorder = Recorder()
    client = AsyncClient(backends={"a": a, "b": b}, observers=[recorder])
    async with client.stream("hi", model=["a/m", "b/m"], hedge=Hedge(delay=0.0)) as stream:
        assert (a.open, a.closed) == (1, 1)  # the loser's stream is closed before we read
        assert "".join([t async for t in stream.text()]) == "b one two"
    assert recorder.events == [
        ("start", "a", "pending"),
        ("start", "b", "pending"),
        ("first_token", "b", "pending"),
        ("commit", "b", "pending"),
        ("end", "a", "lost"),
        ("end", "b", "won"),
    ]
    assert b.closed == 1


# --------------------------------------------------------------------------- race() itself


async def test_race_hedges_only_when_the_budget_allows() -> None:
    started: list[int] = []
    triggers: list[str] = []
    release = anyio.Event()
    first_failed = anyio.Event()

    def attempt(index: int, fail: bool) -> object:
        async def run(trigger: str) -> int:
            started.append(index)
            triggers.append(trigger)
            if fail:
                first_failed.set()
                raise InternalServerError("x", status_code=500)
            await release.wait()
            return index

        return run

    async def release_after_refusal() -> None:
        await first_failed.wait()
        release.set()

    refused: list[bool] = []

    def may_hedge() -> bool:
        refused.append(True)
        return False

    async def discard(result: int) -> None:
        raise AssertionError("nothing to discard")

    # Attempt 1 fails at once, so attempt 2 starts without asking the budget; attempt 3 is
    # a hedge the budget refuses, so it never starts while attempt 2 is pending.
    async with anyio.create_task_group() as tg:
        tg.start_soon(release_after_refusal)
        won = await race(
            [attempt(1, True), attempt(2, False), attempt(3, False)],  # type: ignore[list-item]
            delay=lambda index: 0.0,
            may_hedge=may_hedge,
            max_in_flight=2,
            commit=lambda result: None,
            discard=discard,
        )
    assert won == 2
    assert started == [1, 2]
    assert triggers == ["first", "fallback"]
    assert refused


def _scripted(
    started: list[tuple[int, str]], outcomes: dict[int, Exception | None]
) -> list[Callable[[str], Awaitable[int]]]:
    """Attempts that record their start and then fail at once or answer after a
    checkpoint."""

    def attempt(index: int) -> Callable[[str], Awaitable[int]]:
        async def run(trigger: str) -> int:
            started.append((index, trigger))
            failure = outcomes[index]
            if failure is not None:
                raise failure  # at once, before any other task runs
            await anyio.lowlevel.checkpoint()
            return index

        return run

    return [attempt(i) for i in sorted(outcomes)]


async def _two(
    first: Callable[[str], Awaitable[int]],
    second: Callable[[str], Awaitable[int]],
    *,
    delay: float,
    may_hedge: Callable[[], bool] = lambda: True,
) -> int:
    """:func:`race` over two attempts, the second a hedge ``delay`` seconds after the first."""
    return await race(
        [first, second],
        delay=lambda index: delay,
        may_hedge=may_hedge,
        max_in_flight=2,
        commit=lambda result: None,
        discard=_never,
    )


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_first_attempt_failing_as_its_hedge_timer_fires_is_followed_exactly_once() -> None:
    # On asyncio the first attempt runs in the calling task and the hedge timer starts the
    # staggering of the rest in a child task. When the timer has fired and the first
    # attempt then fails, exactly one of them must start the next target: never none (the
    # call would fail with a target left) and never both (the target would start twice).
    started: list[tuple[int, str]] = []

    async def first(trigger: str) -> int:
        started.append((1, trigger))
        time.sleep(0.05)  # noqa: ASYNC251 (blocks the loop: the hedge timer comes due)
        await anyio.lowlevel.checkpoint()  # queued ahead of the due timer
        await anyio.lowlevel.checkpoint()  # queued behind it: the timer has fired
        raise InternalServerError("x", status_code=500)

    async def second(trigger: str) -> int:
        started.append((2, trigger))
        await anyio.sleep(0.1)  # past a hedge delay: a second driver would start it again
        return 2

    assert await _two(first, second, delay=0.01) == 2
    assert started == [(1, "first"), (2, "fallback")]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_no_task_outlives_a_race_whose_hedge_timer_fired_as_the_first_attempt_won(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The first attempt's answer and the hedge timer come due in one loop turn, the answer
    # first: the timer still starts its staggering task before the race ends. The race must
    # not return while that task is pending (it would start nothing, but it would run after
    # the call). anyio's task group happens to yield once on exit; the race must not depend
    # on that.
    async def no_checkpoint() -> None:
        pass

    monkeypatch.setattr(
        anyio._backends._asyncio.AsyncIOBackend, "cancel_shielded_checkpoint", no_checkpoint
    )
    loop = asyncio.get_running_loop()

    async def first(trigger: str) -> int:
        answer: asyncio.Future[int] = loop.create_future()
        loop.call_later(0.001, answer.set_result, 1)  # due before the hedge timer (50 ms)
        time.sleep(0.2)  # noqa: ASYNC251 (blocks the loop: both timers fire in one turn)
        return await answer

    async def second(trigger: str) -> int:
        raise AssertionError("the first attempt answered: no hedge may start")

    before = asyncio.all_tasks()
    assert await _two(first, second, delay=0.05) == 1
    assert asyncio.all_tasks() <= before


async def test_race_runs_the_first_attempt_alone_when_it_answers_before_the_delay() -> None:
    started: list[tuple[int, str]] = []
    attempts = _scripted(started, {1: None, 2: None})
    won = await race(
        attempts,
        delay=lambda index: 3600.0,
        may_hedge=lambda: True,
        max_in_flight=2,
        commit=lambda result: None,
        discard=_never,
    )
    assert won == 1
    assert started == [(1, "first")]


async def _never(result: int) -> None:
    raise AssertionError("nothing to discard")


async def test_fallback_needs_a_target() -> None:
    with pytest.raises(ConfigurationError):
        await fallback([])


async def test_cancelling_a_hedged_call_closes_every_attempt() -> None:
    a, b = Gated("a"), Gated("b")  # neither ever answers
    recorder = Recorder()
    client = AsyncClient(backends={"a": a, "b": b}, observers=[recorder])

    async def call() -> None:
        await client.chat("hi", model=["a/m", "b/m"], hedge=Hedge(delay=0.0))

    async with anyio.create_task_group() as tg:
        tg.start_soon(call)
        await b.opened.wait()
        tg.cancel_scope.cancel()
    assert (a.open, a.closed, b.open, b.closed) == (1, 1, 1, 1)
    ends = sorted(event for event in recorder.events if event[0] == "end")
    assert ends == [("end", "a", "cancelled"), ("end", "b", "cancelled")]


# --------------------------------------------------------------------------- routing


class Aliases:
    """A stand-in router: ``fast`` is both targets for short prompts, only b otherwise;
    the task ``summarize`` always goes to b."""

    def __init__(self) -> None:
        self.seen: list[tuple[object, int, str | None]] = []

    def expand(
        self, model: str | Sequence[str], *, prompt_chars: int, task: str | None
    ) -> list[str]:
        self.seen.append((model, prompt_chars, task))
        if model != "fast":
            return [model] if isinstance(model, str) else list(model)
        if task == "summarize" or prompt_chars > 10:
            return ["b/m"]
        return ["a/m", "b/m"]


async def test_a_router_expands_aliases_by_prompt_size_and_task() -> None:
    router = Aliases()
    async with providers("a", "b") as fakes, client_for(fakes, router=router) as client:
        fakes["a"].script(Reply(status=503))
        short = await client.chat("hi", model="fast")
        assert outcomes(short) == [("a", "error"), ("b", "ok")]
        long = await client.chat("x" * 11, model="fast")
        assert outcomes(long) == [("b", "ok")]
        labelled = await client.chat("hi", model="fast", task="summarize")
        assert outcomes(labelled) == [("b", "ok")]
        plain = await client.chat("hi", model="a/m")
        assert outcomes(plain) == [("a", "ok")]
        assert router.seen == [
            ("fast", 2, None),
            ("fast", 11, None),
            ("fast", 2, "summarize"),
            ("a/m", 2, None),
        ]
        assert all("task" not in request.body for request in fakes["b"].requests)


class Ends:
    """An observer keeping (call id, backend, outcome, usage) of every ended attempt."""

    def __init__(self) -> None:
        self.ended: list[tuple[str | None, str, str, int | None]] = []

    def on_start(self, attempt: AttemptResult) -> None:
        pass

    def on_first_token(self, attempt: AttemptResult) -> None:
        pass

    def on_commit(self, attempt: AttemptResult) -> None:
        pass

    def on_end(self, attempt: AttemptResult) -> None:
        usage = attempt.usage
        tokens = usage.completion_tokens if usage is not None else None
        self.ended.append((attempt.call_id, attempt.target.backend.name, attempt.outcome, tokens))


@pytest.mark.parametrize("streamed", [True, False])
async def test_observers_can_group_attempts_by_call_and_see_the_winners_usage(
    streamed: bool,
) -> None:
    ends = Ends()
    async with providers("a", "b") as fakes, client_for(fakes, observers=[ends]) as client:
        fakes["a"].script(HELD)
        await client.chat(
            "hi",
            model=["a/m", "b/m"],
            hedge=Hedge(delay=0.0),
            stream=streamed,
            stream_options={"include_usage": True} if streamed else None,
        )
        await client.chat("hi", model="b/m", stream=streamed)
    first, second = ends.ended[:2], ends.ended[2:]
    assert [(backend, outcome) for _, backend, outcome, _ in first] == [
        ("a", "lost"),
        ("b", "won"),
    ]
    assert first[1][3] == 2  # "from b": two tokens
    assert first[0][0] == first[1][0] != second[0][0]


class Events:
    """An observer keeping every (event, attempt) it is handed."""

    def __init__(self) -> None:
        self.events: list[tuple[str, AttemptResult]] = []

    def on_start(self, attempt: AttemptResult) -> None:
        self.events.append(("start", attempt))

    def on_first_token(self, attempt: AttemptResult) -> None:
        self.events.append(("first_token", attempt))

    def on_commit(self, attempt: AttemptResult) -> None:
        self.events.append(("commit", attempt))

    def on_end(self, attempt: AttemptResult) -> None:
        self.events.append(("end", attempt))


@pytest.mark.parametrize("streamed", [True, False])
async def test_observers_are_handed_frozen_attempts_as_they_stood(streamed: bool) -> None:
    events = Events()
    async with providers("a") as fakes, client_for(fakes, observers=[events]) as client:
        await client.chat("hi", model="a/m", stream=streamed)
    assert [name for name, _ in events.events] == ["start", "first_token", "commit", "end"]
    start, first, commit, end = (attempt for _, attempt in events.events)
    assert all(type(a) is AttemptResult for a in (start, first, commit, end))
    outcomes = [a.outcome for a in (start, first, commit, end)]
    assert outcomes == ["pending", "pending", "pending", "won"]
    assert start.ttft is None and first.ttft is not None and end.ttft == first.ttft
    assert start.duration is None and end.duration is not None and end.streamed is streamed
    assert end.target.name == "a/m" and end.number == 1 and end.call_id
    with pytest.raises(AttributeError):
        end.outcome = "lost"  # type: ignore[misc]


# --------------------------------------------------------------------------- default policies


async def test_the_default_breaker_opens_on_a_failing_target_and_calls_skip_it() -> None:
    # CircuitBreaker's defaults: open at a 50% failure rate once 10 calls were seen.
    async with providers("a", "b") as fakes, client_for(fakes) as client:
        fakes["a"].script(*[Reply(status=503)] * 10)
        for _ in range(10):
            completion = await client.chat("hi", model=["a/m", "b/m"])
            assert completion.text == "from b"
        assert client.health()["a/m"] == "open"
        assert client.health()["b/m"] == "closed"
        seen_by_a = len(fakes["a"].requests)
        completion = await client.chat("hi", model=["a/m", "b/m"])
        assert outcomes(completion) == [("b", "ok")]
        assert len(fakes["a"].requests) == seen_by_a


async def test_one_target_calls_leave_the_policy_objects_alone() -> None:
    async with providers("a") as fakes, client_for(fakes) as client:
        fakes["a"].script(*[Reply(status=503)] * 10)
        for _ in range(10):
            with pytest.raises(InternalServerError):
                await client.chat("hi", model="a/m")
        assert client.health() == {}


async def test_the_adaptive_delay_comes_from_observed_first_tokens() -> None:
    # Before min_samples observations the adaptive hedge waits max_delay (an hour here, so
    # the held target a would keep the call waiting); after them it hedges at the quantile.
    hedge = Hedge(min_samples=3, max_delay=3600.0, min_delay=0.0)
    async with providers("a", "b") as fakes, client_for(fakes, hedge=hedge) as client:
        for _ in range(3):
            completion = await client.chat("hi", model=["a/m", "b/m"])
            assert outcomes(completion) == [("a", "ok")]
        fakes["a"].script(HELD)
        completion = await client.chat("hi", model=["a/m", "b/m"], timeout=120.0)
        assert outcomes(completion) == [("a", "lost"), ("b", "ok")]
        await released(client, fakes["a"])


async def test_backends_are_known_by_the_names_the_client_registered_them_under() -> None:
    # Two HTTPBackends that keep their default name ("http") are two targets, each labelled,
    # broken and priced by its key in backends={...}.
    async with providers("a", "b") as fakes:
        backends = {name: HTTPBackend(fake.base_url) for name, fake in fakes.items()}
        async with AsyncClient(backends=backends, retry=NO_RETRY) as client:
            fakes["a"].script(*[Reply(status=503)] * 10)
            for _ in range(10):
                completion = await client.chat("hi", model=["a/m", "b/m"])
                assert outcomes(completion) == [("a", "error"), ("b", "ok")]
            assert client.health() == {"a/m": "open", "b/m": "closed"}


async def test_a_stream_names_the_winners_request_after_it_closes() -> None:
    async with providers("a", "b") as fakes, client_for(fakes) as client:
        fakes["a"].script(HELD)
        async with client.stream("hi", model=["a/m1", "b/m2"], hedge=Hedge(delay=0.0)) as stream:
            assert stream.request.model == "m2"
            await stream.final()
        assert stream.request.model == "m2"
        await released(client, fakes["a"])


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_hedge_due_as_the_call_is_cancelled_spends_no_budget() -> None:
    # The hedge timer can start the staggering task in the same loop turn as an outer
    # cancellation, before the calling task has seen it: it must not ask the budget for a
    # hedge (and so spend it) for a call that is already being cancelled.
    asked: list[bool] = []

    def may_hedge() -> bool:
        asked.append(True)
        return True

    held = anyio.Event()
    loop = asyncio.get_running_loop()

    async def first(trigger: str) -> int:
        time.sleep(0.05)  # noqa: ASYNC251 (blocks the loop: both timers come due together)
        await held.wait()  # never set: only the cancellation ends it
        return 1

    async def second(trigger: str) -> int:
        raise AssertionError("the call was cancelled: no hedge may start")

    with anyio.CancelScope() as outer:
        loop.call_later(0.01, outer.cancel)  # the caller cancels as the hedge comes due
        await _two(first, second, delay=0.01, may_hedge=may_hedge)
    assert outer.cancelled_caught
    assert asked == []


class EndsOnly:
    """An observer that names the one hook it uses; the others would fail the test."""

    attempt_hooks = ("on_end",)

    def __init__(self) -> None:
        self.outcomes: list[str] = []

    def on_start(self, attempt: AttemptResult) -> None:
        raise AssertionError("on_start is not among attempt_hooks")

    def on_first_token(self, attempt: AttemptResult) -> None:
        raise AssertionError("on_first_token is not among attempt_hooks")

    def on_commit(self, attempt: AttemptResult) -> None:
        raise AssertionError("on_commit is not among attempt_hooks")

    def on_end(self, attempt: AttemptResult) -> None:
        self.outcomes.append(attempt.outcome)


@pytest.mark.parametrize("streamed", [True, False])
async def test_an_observer_gets_only_the_hooks_it_names(streamed: bool) -> None:
    only, every = EndsOnly(), Ends()
    async with (
        providers("a", "b") as fakes,
        client_for(fakes, observers=[only, every]) as client,
    ):
        fakes["a"].script(HELD)
        await client.chat("hi", model=["a/m", "b/m"], hedge=Hedge(delay=0.0), stream=streamed)
        await client.chat("hi", model="b/m", stream=streamed)
    assert only.outcomes == ["lost", "won", "won"]
    assert [outcome for _, _, outcome, _ in every.ended] == only.outcomes


def test_mock_observers_hear_every_event_and_overridden_noop_hooks_are_heard() -> None:
    from unittest.mock import MagicMock

    from swiftclient._attempt import Hooks
    from swiftclient._policies import PolicyHub

    mock = MagicMock()
    assert [len(h) for h in Hooks.of([mock])] == [1, 1, 1, 1]

    class Started(PolicyHub):
        def on_start(self, attempt: AttemptResult) -> None:
            pass

    hub = PolicyHub.standard(None)
    # The hub's own on_start and on_commit do nothing and are skipped; a subclass's
    # override of on_start is heard.
    assert [len(h) for h in Hooks.of([hub])] == [0, 1, 0, 1]
    assert [len(h) for h in Hooks.of([Started()])] == [1, 1, 0, 1]
