"""Accounting on the call path: each call's cost on its Timing, the totals on the client.

Over real sockets with :class:`FakeProvider` (one per target); hedges race a held target
(``Reply(stall_after=0)``), so which attempt wins never depends on the wall clock.
"""

from __future__ import annotations

import gc

import anyio
import pydantic
import pytest

from swiftclient import (
    AsyncClient,
    CallCost,
    ChatCompletion,
    ConfigurationError,
    DeadlineExceeded,
    Hedge,
    HedgeStats,
    HTTPBackend,
    InternalServerError,
    Price,
    Pricing,
    RetryPolicy,
    Timeout,
    Timing,
)
from swiftclient.admission import Limits
from swiftclient.extend import AttemptResult
from swiftclient.testing import Reply

from .mock import HELD, client_for, providers

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("transport")]
PER_TOKEN = Pricing({"*": Price(per_input_token=0.001, per_output_token=0.002)})
PER_REQUEST = Pricing({"a/*": Price(per_request=0.01), "b/*": Price(per_request=0.02)})
PROMPT = "hello there, how are you today?"
FIRST_TOKEN_LIMIT = 2.0  # seconds; b answers in far less even on a loaded machine


def cost_of(completion: ChatCompletion) -> CallCost:
    assert completion.timing is not None
    assert completion.timing.cost is not None
    return completion.timing.cost


async def hedged(client: AsyncClient, streamed: bool) -> ChatCompletion:
    """A call over a then b, the hedge to b sent at once (the test holds one of them)."""
    return await client.chat(PROMPT, model=["a/m", "b/m"], hedge=Hedge(delay=0.0), stream=streamed)


# --------------------------------------------------------------------------- per call


async def test_the_calls_here_run_over_the_transport_the_fixture_chose(transport: str) -> None:
    # Each test in this module runs over aiohttp (asyncio only) and over httpx.
    async with providers("a") as fakes, client_for(fakes) as client:
        await client.chat(PROMPT, model="a/m")
        backend = client.backends["a"]
        assert isinstance(backend, HTTPBackend)
        assert backend.complete_cancels_cleanly == (transport == "aiohttp")


@pytest.mark.parametrize("streamed", [True, False])
async def test_a_hedge_loser_that_streamed_nothing_is_billed_its_prompt(streamed: bool) -> None:
    async with providers("a", "b") as fakes, client_for(fakes, pricing=PER_TOKEN) as client:
        fakes["a"].script(HELD)
        completion = await hedged(client, streamed)
        assert completion.text == "from b"
        usage = completion.usage
        assert usage is not None and usage.prompt_tokens > 0 and usage.completion_tokens > 0
        cost = cost_of(completion)
        prompt, output = usage.prompt_tokens, usage.completion_tokens
        assert (cost.winner, cost.attempts, cost.hedges_sent, cost.hedges_won) == (1, 2, 1, 1)
        assert (cost.wasted_requests, cost.wasted_input_tokens) == (1, prompt)
        assert cost.wasted_output_tokens == 0
        assert cost.wasted_cost == pytest.approx(prompt * 0.001)
        assert cost.cost == pytest.approx(2 * prompt * 0.001 + output * 0.002)


@pytest.mark.parametrize("streamed", [True, False])
async def test_a_flat_price_makes_a_hedge_a_whole_extra_request(streamed: bool) -> None:
    async with providers("a", "b") as fakes, client_for(fakes, pricing=PER_REQUEST) as client:
        fakes["a"].script(HELD)
        cost = cost_of(await hedged(client, streamed))
        assert cost.cost == pytest.approx(0.03)  # b's answer plus a's cancelled request
        assert cost.wasted_cost == pytest.approx(0.01)


@pytest.mark.parametrize("streamed", [True, False])
async def test_a_hedge_that_loses_to_the_first_attempt_is_wasted(streamed: bool) -> None:
    # The hedge b is held, so a wins; b ends (cancelled) before a does.
    async with providers("a", "b") as fakes, client_for(fakes, pricing=PER_REQUEST) as client:
        fakes["b"].script(HELD)
        completion = await hedged(client, streamed)
        assert completion.text == "from a"
        cost = cost_of(completion)
        assert (cost.winner, cost.attempts, cost.hedges_sent, cost.hedges_won) == (0, 2, 1, 0)
        assert cost.cost == pytest.approx(0.03)
        assert cost.wasted_cost == pytest.approx(0.02)


async def test_a_fallback_after_a_503_wastes_a_request_billed_nothing() -> None:
    async with providers("a", "b") as fakes, client_for(fakes, pricing=PER_REQUEST) as client:
        fakes["a"].script(Reply(status=503))
        completion = await client.chat(PROMPT, model=["a/m", "b/m"])
        assert completion.text == "from b"
        cost = cost_of(completion)
        assert (cost.winner, cost.attempts, cost.hedges_sent, cost.hedges_won) == (1, 2, 0, 0)
        assert (cost.wasted_requests, cost.wasted_input_tokens, cost.wasted_output_tokens) == (
            1,
            0,
            0,
        )
        assert cost.cost == pytest.approx(0.02)
        assert cost.wasted_cost == 0.0


async def test_a_first_token_timeout_is_billed_as_a_request_given_up_on() -> None:
    # a never answers; the client gives up on it after its first-token limit (a request the
    # server had, so billed) and falls back to b.
    async with providers("a", "b") as fakes, client_for(fakes, pricing=PER_REQUEST) as client:
        fakes["a"].script(HELD)
        completion = await client.chat(
            PROMPT, model=["a/m", "b/m"], timeout=Timeout(total=60.0, first_token=FIRST_TOKEN_LIMIT)
        )
        assert completion.text == "from b"
        cost = cost_of(completion)
        assert (cost.winner, cost.wasted_requests) == (1, 1)
        assert cost.cost == pytest.approx(0.03)
        assert cost.wasted_cost == pytest.approx(0.01)


async def test_a_plain_call_and_a_stream_carry_their_cost() -> None:
    async with providers("a") as fakes, client_for(fakes, pricing=PER_TOKEN) as client:
        completion = await client.chat(PROMPT, model="a/m")
        usage = completion.usage
        assert usage is not None
        cost = cost_of(completion)
        assert (cost.winner, cost.attempts, cost.wasted_requests) == (0, 1, 0)
        assert cost.cost == pytest.approx(
            usage.prompt_tokens * 0.001 + usage.completion_tokens * 0.002
        )
        assert cost.wasted_cost == 0.0
        async with client.stream(PROMPT, model="a/m") as stream:
            assert stream.timing.cost is None  # known once the call finishes
            final = await stream.final()
        assert stream.timing.cost == cost
        assert final.timing is not None and final.timing.cost == cost


async def test_a_retry_on_one_target_wastes_a_request() -> None:
    async with (
        providers("a") as fakes,
        client_for(
            fakes, pricing=PER_REQUEST, retry=RetryPolicy(max_attempts=2, initial_backoff=0.0)
        ) as client,
    ):
        fakes["a"].script(Reply(status=500))
        cost = cost_of(await client.chat(PROMPT, model="a/m"))
        assert (cost.winner, cost.attempts, cost.wasted_requests, cost.cost) == (1, 2, 1, 0.01)


async def test_a_stream_left_early_bills_its_winner() -> None:
    async with providers("a") as fakes, client_for(fakes, pricing=PER_REQUEST) as client:
        fakes["a"].script(Reply(tokens=50))
        async with client.stream(PROMPT, model="a/m") as stream:
            async for _ in stream:
                break
        assert stream.timing.cost is not None
        assert (stream.timing.cost.winner, stream.timing.cost.cost) == (0, 0.01)


class Leaving(Exception):
    """Raised by the caller inside a stream's block."""


async def test_a_stream_the_caller_breaks_off_with_an_error_still_bills_its_winner() -> None:
    async with providers("a") as fakes, client_for(fakes, pricing=PER_REQUEST) as client:
        fakes["a"].script(Reply(tokens=50))
        with pytest.raises(Leaving):
            async with client.stream(PROMPT, model="a/m") as stream:
                async for _ in stream:
                    raise Leaving
        assert stream.timing.attempts[0].outcome == "error"  # the attempt's own record
        cost = stream.timing.cost
        assert cost is not None
        assert (cost.winner, cost.wasted_requests, cost.cost) == (0, 0, 0.01)


async def test_the_cost_serializes_with_the_timing() -> None:
    async with providers("a", "b") as fakes, client_for(fakes, pricing=PER_REQUEST) as client:
        fakes["a"].script(HELD)
        timing = (await hedged(client, streamed=True)).timing
        assert timing is not None
        adapter = pydantic.TypeAdapter(Timing)
        dumped = adapter.dump_python(timing, mode="json")
        assert dumped["cost"]["wasted_requests"] == 1
        assert adapter.validate_python(dumped) == timing


# --------------------------------------------------------------------------- pricing


async def test_without_pricing_counts_are_kept_and_costs_are_none() -> None:
    async with providers("a", "b") as fakes, client_for(fakes) as client:
        assert client.pricing is None
        fakes["a"].script(HELD)
        cost = cost_of(await hedged(client, streamed=True))
        assert (cost.hedges_sent, cost.hedges_won, cost.wasted_requests) == (1, 1, 1)
        assert cost.wasted_input_tokens > 0
        assert (cost.cost, cost.wasted_cost) == (None, None)
        stats = client.stats()
        assert (stats.calls, stats.calls_unpriced, stats.cost) == (1, 1, 0.0)


async def test_a_target_without_a_price_leaves_the_call_unpriced() -> None:
    pricing = Pricing({"a/*": Price(per_request=0.01)})
    async with providers("a", "b") as fakes, client_for(fakes, pricing=pricing) as client:
        priced = cost_of(await client.chat(PROMPT, model="a/m"))
        unpriced = cost_of(await client.chat(PROMPT, model="b/m"))
        assert (priced.cost, unpriced.cost) == (0.01, None)
        stats = client.stats()
        assert (stats.calls, stats.calls_unpriced) == (2, 1)
        assert stats.cost == pytest.approx(0.01)


async def test_mixed_prices_and_patterns_apply_per_target() -> None:
    pricing = Pricing(
        {
            "a/m": Price(per_request=0.5, per_output_token=0.01),  # exact key wins
            "a/*": Price(per_request=100.0),
            "*": Price(per_input_token=0.001),
        }
    )
    async with providers("a", "b") as fakes, client_for(fakes, pricing=pricing) as client:
        first = await client.chat(PROMPT, model="a/m")
        second = await client.chat(PROMPT, model="b/m")
        assert first.usage is not None and second.usage is not None
        assert cost_of(first).cost == pytest.approx(0.5 + first.usage.completion_tokens * 0.01)
        assert cost_of(second).cost == pytest.approx(second.usage.prompt_tokens * 0.001)


def test_pricing_must_be_a_pricing() -> None:
    with pytest.raises(ConfigurationError, match="pricing must be a Pricing"):
        AsyncClient(HTTPBackend("http://127.0.0.1:9/v1"), pricing={"*": Price()})  # type: ignore[arg-type]


# --------------------------------------------------------------------------- totals


async def test_the_client_totals_calls_and_resets() -> None:
    calls = 5
    async with providers("a", "b") as fakes, client_for(fakes, pricing=PER_REQUEST) as client:
        for _ in range(calls):
            await client.chat(PROMPT, model="a/m")
        fakes["a"].script(HELD)
        await hedged(client, streamed=True)
        fakes["a"].script(Reply(status=503))
        await client.chat(PROMPT, model=["a/m", "b/m"])
        stats = client.stats(reset=True)
        assert isinstance(stats, HedgeStats)
        assert (stats.calls, stats.attempts) == (calls + 2, calls + 4)
        assert (stats.hedges_sent, stats.hedges_won, stats.wasted_requests) == (1, 1, 2)
        assert stats.cost == pytest.approx(calls * 0.01 + 0.03 + 0.02)
        assert stats.wasted_cost == pytest.approx(0.01)
        assert stats.snapshot()["calls"] == calls + 2
        assert client.stats() == HedgeStats()
        await client.chat(PROMPT, model="a/m")
        assert (client.stats().calls, stats.calls) == (1, calls + 2)  # a copy, not a view


async def test_a_failed_call_is_counted() -> None:
    async with providers("a", "b") as fakes, client_for(fakes, pricing=PER_REQUEST) as client:
        fakes["a"].script(Reply(status=500))
        fakes["b"].script(Reply(status=503))
        with pytest.raises(InternalServerError):
            await client.chat(PROMPT, model=["a/m", "b/m"])
        stats = client.stats()
        assert (stats.calls, stats.attempts, stats.wasted_requests, stats.cost) == (1, 2, 2, 0.0)


class Started:
    """An AttemptObserver that sets ``both`` once two attempts have started."""

    def __init__(self) -> None:
        self.count = 0
        self.both = anyio.Event()

    def on_start(self, attempt: AttemptResult) -> None:
        self.count += 1
        if self.count == 2:
            self.both.set()

    def on_first_token(self, attempt: AttemptResult) -> None:
        pass

    def on_commit(self, attempt: AttemptResult) -> None:
        pass

    def on_end(self, attempt: AttemptResult) -> None:
        pass


@pytest.mark.parametrize("priced", [True, False], ids=["priced", "counted"])
@pytest.mark.parametrize("streamed", [True, False])
async def test_a_cancelled_call_bills_its_attempts_and_leaves_no_state(
    streamed: bool, priced: bool
) -> None:
    """Without ``pricing`` the counts are kept all the same (the prompt's estimate was made
    only with it: 0 wasted input tokens)."""
    started = Started()
    pricing = PER_TOKEN if priced else None
    async with (
        providers("a", "b") as fakes,
        client_for(fakes, pricing=pricing, observers=[started]) as client,
    ):
        fakes["a"].script(HELD)
        fakes["b"].script(HELD)

        async def call() -> None:
            await client.chat(PROMPT, model=["a/m", "b/m"], hedge=Hedge(delay=0.0), stream=streamed)

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            await started.both.wait()
            tg.cancel_scope.cancel()
        stats = client.stats()
        estimate = -(-len(PROMPT) // 4)  # no usage reported: about four characters a token
        assert (stats.calls, stats.attempts, stats.wasted_requests) == (1, 2, 2)
        assert stats.wasted_input_tokens == 2 * estimate
        if priced:
            assert stats.cost == pytest.approx(2 * estimate * 0.001)
            assert stats.wasted_cost == pytest.approx(stats.cost)
        else:
            assert (stats.calls_unpriced, stats.cost) == (1, 0.0)


# --------------------------------------------------------------------------- no state


def accounting_records() -> int:
    """Per-attempt accounting notes alive in this process."""
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o).__name__ == "AttemptRecord")


async def test_accounting_holds_nothing_for_a_call_that_has_not_finished() -> None:
    # The hedge's loser ended before the stream is read: its cost is arithmetic over the
    # call's own results when the call finishes, not a note kept by the client meanwhile
    # (a stream its caller never closes used to leave one behind until 10,000 more came).
    async with providers("a", "b") as fakes, client_for(fakes, pricing=PER_REQUEST) as client:
        fakes["a"].script(HELD)
        before = accounting_records()
        stream = client.stream(PROMPT, model=["a/m", "b/m"], hedge=Hedge(delay=0.0))
        async with stream:
            assert [a.outcome for a in stream.timing.attempts] == ["lost", "pending"]
            assert accounting_records() == before
            assert stream.timing.cost is None
        cost = stream.timing.cost
        assert cost is not None and (cost.winner, cost.attempts, cost.cost) == (1, 2, 0.03)


async def test_unpriced_one_target_calls_are_not_accounted_priced_ones_are() -> None:
    async with providers("a", "b") as fakes, client_for(fakes) as client:
        plain = await client.chat("hi", model="a/m")
        assert plain.timing is not None and plain.timing.cost is None
        assert client.stats().calls == 0
        several = await client.chat("hi", model=["a/m", "b/m"])
        assert several.timing is not None and several.timing.cost is not None
        assert client.stats().calls == 1
    async with providers("a") as fakes, client_for(fakes, pricing=PER_REQUEST) as client:
        priced = await client.chat("hi", model="a/m")
        assert priced.timing is not None and priced.timing.cost is not None
        assert priced.timing.cost.cost == pytest.approx(0.01)
        assert client.stats().calls == 1


async def test_an_attempt_admission_refused_is_neither_sent_nor_wasted() -> None:
    """A fallback past a target whose rate limit is spent: the refused attempt never left
    the client, but it was counted as a wasted request (19 "wasted" in 20 such calls)."""
    async with (
        providers("a", "b") as fakes,
        client_for(
            fakes, pricing=PER_REQUEST, limits={"a": Limits(rpm=1, window=30.0)}, timeout=5.0
        ) as client,
    ):
        first = await client.chat(PROMPT, model=["a/m", "b/m"])
        second = await client.chat(PROMPT, model=["a/m", "b/m"])
        assert (first.text, second.text) == ("from a", "from b")
        assert len(fakes["a"].requests) == 1
        assert cost_of(second).wasted_requests == 0
        assert cost_of(second).cost == pytest.approx(0.02)
        stats = client.stats()
        assert (stats.calls, stats.attempts, stats.wasted_requests) == (2, 3, 0)


@pytest.mark.parametrize("streamed", [True, False])
async def test_an_attempt_whose_admission_took_the_deadline_was_not_sent(
    streamed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shared store's wait may end a moment past the deadline. The stream then sent
    nothing and counted nothing; a non-streamed attempt was counted as sent and billed as
    a cancelled request (its deadline was checked only once it was waiting on the reply)."""
    from swiftclient._attempt import AttemptRun

    async def admitted_late(self: AttemptRun, admission: object) -> None:
        await anyio.sleep(self._deadline.at - self._now() + 0.05)

    monkeypatch.setattr(AttemptRun, "_admit", admitted_late)
    async with (
        providers("a") as fakes,
        client_for(fakes, pricing=PER_REQUEST, limits={"a": Limits(rpm=100)}, timeout=0.2) as c,
    ):
        with pytest.raises(DeadlineExceeded):
            await c.chat(PROMPT, model="a/m", stream=streamed)
        assert not fakes["a"].requests
        stats = c.stats()
        assert (stats.attempts, stats.wasted_requests, stats.cost) == (1, 0, 0.0)


@pytest.mark.parametrize("streamed", [True, False])
async def test_an_attempt_cancelled_while_it_waited_for_admission_was_not_sent(
    streamed: bool,
) -> None:
    """a's limit is spent, so its attempt waits for admission (the window frees within the
    deadline); the hedge to b wins meanwhile and a's wait is cancelled. Nothing left for a,
    but it was counted as a wasted request and a hedge race lost."""
    async with (
        providers("a", "b") as fakes,
        client_for(
            fakes, pricing=PER_REQUEST, limits={"a": Limits(rpm=1, window=30.0)}, timeout=120.0
        ) as client,
    ):
        assert (await client.chat(PROMPT, model="a/m")).text == "from a"
        completion = await hedged(client, streamed)
        assert completion.text == "from b"
        assert len(fakes["a"].requests) == 1
        cost = cost_of(completion)
        assert (cost.attempts, cost.hedges_sent, cost.hedges_won) == (2, 1, 1)
        assert (cost.wasted_requests, cost.wasted_input_tokens) == (0, 0)
        assert cost.cost == pytest.approx(0.02)  # b alone
        assert client.stats().wasted_requests == 0
