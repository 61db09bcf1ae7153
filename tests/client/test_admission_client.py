"""Admission on the client's call path: attempts wait for capacity (or fail with
RateLimited) before sending, learn from response headers, halve concurrency on a bare 429,
and fall back to a target with capacity. The fake provider's window clock is a counter the
test owns; no assertion depends on the wall clock."""

from __future__ import annotations

import anyio
import httpx
import pytest

from swiftclient import AsyncClient, Hedge, HTTPBackend, RateLimited, RateLimitError, RetryPolicy
from swiftclient.admission import Admission, Limits
from swiftclient.extend import AttemptResult, CircuitBreaker, PolicyHub
from swiftclient.testing import FakeProvider, ProviderLimits, Reply

from .fakeclock import Ticker
from .mock import Script, backend_for, scripted_client, serve_handler, stream_body

pytestmark = pytest.mark.anyio


@pytest.mark.usefixtures("transport")
@pytest.mark.parametrize("stream_chat", [True, False])
async def test_limits_learned_from_headers_keep_calls_from_the_429(stream_chat: bool) -> None:
    limits = ProviderLimits(rpm=2, window=60.0, clock=Ticker())
    async with FakeProvider(Reply(tokens=2), rate_limits=limits) as fake:
        backend = backend_for(fake.base_url, name="fake")
        async with AsyncClient(
            backend, model="m", limits=Limits(), stream_chat=stream_chat, timeout=5.0
        ) as client:
            assert (await client.chat("hi")).text == "tok0 tok1"
            assert (await client.chat("hi")).text == "tok0 tok1"
            # the provider said: 2 a minute, none left; the next would wait ~30 s > 5 s
            with pytest.raises(RateLimited) as caught:
                await client.chat("hi")
    err = caught.value
    assert err.limit == "requests" and err.target == "fake/m"
    assert err.reset_after is not None and err.reset_after > 5.0
    assert len(err.attempts) == 1 and err.attempts[0].error == "RateLimited"
    assert fake.rate_limited == 0  # no request went out to be refused
    assert len(fake.requests) == 2
    assert client.admission is not None and client.admission.in_flight("fake/m") == 0


@pytest.mark.usefixtures("transport")
async def test_a_learned_limit_equal_to_the_configured_one_keeps_the_providers_refill() -> None:
    # Configured 2 a second, learned 2 a minute with none left: the provider's slower refill
    # wins (the learned spec used to lose a tie in capacity, and the 3rd call met a 429).
    limits = ProviderLimits(rpm=2, window=60.0, clock=Ticker())
    async with FakeProvider(Reply(tokens=2), rate_limits=limits) as fake:
        backend = backend_for(fake.base_url, name="fake")
        async with AsyncClient(
            backend, model="m", limits=Limits(rpm=2, window=1.0), timeout=5.0
        ) as client:
            await client.chat("hi")
            await client.chat("hi")
            with pytest.raises(RateLimited):
                await client.chat("hi")
    assert fake.rate_limited == 0
    assert len(fake.requests) == 2


@pytest.mark.usefixtures("transport")
async def test_without_limits_the_same_calls_meet_the_429() -> None:
    limits = ProviderLimits(rpm=2, window=60.0, clock=Ticker())
    async with FakeProvider(Reply(tokens=2), rate_limits=limits) as fake:
        backend = backend_for(fake.base_url, name="fake")
        async with AsyncClient(backend, model="m", retry=RetryPolicy.none()) as client:
            await client.chat("hi")
            await client.chat("hi")
            with pytest.raises(RateLimitError):
                await client.chat("hi")
    assert fake.rate_limited == 1


@pytest.mark.usefixtures("transport")  # served on a socket, read over aiohttp and httpx
async def test_a_bare_429_halves_the_targets_concurrency() -> None:
    script = Script().add(429)
    admission = Admission(Limits(concurrency=8))
    async with scripted_client(script, limits=admission, retry=RetryPolicy.none()) as client:
        with pytest.raises(RateLimitError):
            await client.chat("hi")
        assert admission.concurrency("mock/m") == 4
        assert admission.in_flight("mock/m") == 0  # the slot was handed back
        await client.chat("hi")  # still admitted
    assert client.admission is admission


@pytest.mark.usefixtures("transport")
async def test_retry_after_on_a_429_rests_the_target_for_later_calls() -> None:
    script = Script().add(429, headers={"retry-after": "30"})
    async with scripted_client(
        script, limits=Limits(), retry=RetryPolicy.none(), timeout=5.0
    ) as client:
        with pytest.raises(RateLimitError):
            await client.chat("hi")
        with pytest.raises(RateLimited) as caught:
            await client.chat("hi")
    assert caught.value.limit == "retry_after"
    assert len(script.requests) == 1


@pytest.mark.usefixtures("transport")
async def test_a_target_without_capacity_falls_back_to_one_with_it() -> None:
    a, b = Script(), Script()
    # a breaker that opens on one failure: the refusal must not count as one
    hub = PolicyHub(breaker=lambda: CircuitBreaker(min_calls=1))
    async with a.serve() as a_url, b.serve() as b_url:
        backends = {"a": backend_for(a_url, name="a"), "b": backend_for(b_url, name="b")}
        async with AsyncClient(
            backends=backends, limits={"a": Limits(rpm=1)}, timeout=5.0, policies=hub
        ) as client:
            await client.chat("x", model="a/m")
            completion = await client.chat("x", model=["a/m", "b/m"])
            health = client.health()
    assert completion.text == "Hello world"
    attempts = completion.timing.attempts if completion.timing else []
    assert [(t.backend, t.error) for t in attempts] == [("a", "RateLimited"), ("b", None)]
    assert len(a.requests) == 1 and len(b.requests) == 1
    assert health == {"a/m": "closed", "b/m": "closed"}  # a refusal is not the target's fault


async def test_limits_must_be_limits() -> None:
    from swiftclient import ConfigurationError

    with pytest.raises(ConfigurationError):
        AsyncClient(HTTPBackend("http://x/v1"), limits={"x": 5})  # type: ignore[dict-item]


@pytest.mark.usefixtures("transport")
async def test_a_hedge_is_not_sent_into_a_target_without_capacity_now() -> None:
    # b frees its one request slot a minute after its first call: a first attempt would
    # wait for it (the deadline allows), a hedge does not wait.
    gate = anyio.Event()

    class OpenGateOnRefusal:
        attempt_hooks = ("on_end",)

        def on_end(self, attempt: AttemptResult) -> None:
            if isinstance(attempt.error, RateLimited):
                gate.set()

    async def slow_a(request: httpx.Request) -> httpx.Response:
        await gate.wait()  # a answers only once the hedge on b was refused
        return httpx.Response(
            200, headers={"content-type": "text/event-stream"}, content=b"".join(stream_body(["A"]))
        )

    b = Script()
    async with serve_handler(slow_a) as a_url, b.serve() as b_url:
        backends = {"a": backend_for(a_url, name="a"), "b": backend_for(b_url, name="b")}
        async with AsyncClient(
            backends=backends,
            limits={"b": Limits(rpm=1)},
            hedge=Hedge(delay=0.01),
            observers=[OpenGateOnRefusal()],
            timeout=120.0,
        ) as client:
            await client.chat("x", model="b/m")
            completion = await client.chat("x", model=["a/m", "b/m"])
    attempts = completion.timing.attempts if completion.timing else []
    assert [(t.backend, t.trigger, t.error) for t in attempts] == [
        ("a", "first", None),
        ("b", "hedge", "RateLimited"),
    ]
    assert completion.text == "A" and len(b.requests) == 1


def test_an_admission_serves_one_event_loop_at_a_time() -> None:
    """Two blocking Clients (each runs its own event loop) given one Admission: a waiter
    on one loop was never woken by the other's release, so calls hung past their
    deadlines. While one loop's requests are in flight, the other is told so; once they
    are done, the admission serves whichever loop asks."""
    from swiftclient import Client, ConfigurationError

    admission = Admission(Limits(concurrency=1))
    with FakeProvider(Reply(text="ok")).run_in_thread() as fake:
        with (
            Client(HTTPBackend(fake.base_url), model="m", limits=admission, timeout=30) as first,
            Client(HTTPBackend(fake.base_url), model="m", limits=admission, timeout=30) as second,
        ):
            fake.script(Reply(text="one two three", stall_after=1))
            with first.stream("hi") as held:  # holds the admission's one slot
                assert next(iter(held.text())) == "one"
                with pytest.raises(ConfigurationError, match="one event loop at a time"):
                    second.chat("hi")
            assert second.chat("hi").text == "ok"  # the first loop's call is over
            assert first.chat("hi").text == "ok"
    # and across runs of one thread: each run's calls are over before the next starts
    for _ in range(2):
        assert anyio.run(_one_call, admission, fake_text := "ok") == fake_text


async def _one_call(admission: Admission, text: str) -> str:
    async with FakeProvider(Reply(text=text)) as fake:
        backend = HTTPBackend(fake.base_url, name="fake")
        async with AsyncClient(backend, model="m", limits=admission, retry=RetryPolicy.none()) as c:
            return (await c.chat("hi")).text


async def test_a_wait_for_a_slot_that_the_deadline_ends_says_which_limit() -> None:
    """The wait for admission is bounded by the call's deadline too (a stalled store must
    not hold the call); a wait for capacity that the deadline ends is still the
    RateLimited that names the limit, not a DeadlineExceeded (a second review's find)."""
    admission = Admission(Limits(concurrency=1))
    async with FakeProvider() as fake:
        backend = HTTPBackend(fake.base_url, name="p")
        async with AsyncClient(
            backend, model="m", limits=admission, retry=RetryPolicy.none()
        ) as client:
            held = await admission.acquire("p/m", timeout=0)
            for _ in range(3):
                with pytest.raises(RateLimited) as refused:
                    await client.chat("hi", timeout=0.2)
                assert refused.value.limit == "concurrency"
            await admission.settle(held)
            assert (await client.chat("hi")).text
