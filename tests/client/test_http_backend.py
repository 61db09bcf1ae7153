"""HTTPBackend over real loopback sockets against the fake provider: pooling and faults."""

from __future__ import annotations

import asyncio
import gc
import warnings

import anyio
import httpx
import pytest
import trio

from swiftclient import (
    APIConnectionError,
    APIResponseValidationError,
    AsyncClient,
    ClientClosedError,
    ConfigurationError,
    DeadlineExceeded,
    HTTPBackend,
    NotFoundError,
    RateLimitError,
    RetryPolicy,
    StreamError,
    StreamStalled,
    Timeout,
)
from swiftclient.backends._httpx import map_httpx_error
from swiftclient.testing import FakeProvider, Reply

from .mock import FAST_RETRY

pytestmark = pytest.mark.anyio


def client_for(fake: FakeProvider, **kwargs: object) -> tuple[AsyncClient, HTTPBackend]:
    backend = HTTPBackend(fake.base_url, "sk-test-key-1234567890", name="fake", max_connections=32)
    client = AsyncClient(backend, model="fake-model", retry=FAST_RETRY, **kwargs)  # type: ignore[arg-type]
    return client, backend


async def test_sequential_streams_reuse_one_connection() -> None:
    async with FakeProvider(Reply(tokens=5)) as fake:
        client, backend = client_for(fake)
        async with client:
            for _ in range(20):
                completion = await client.chat("hi")
                assert completion.text.split() == [f"tok{i}" for i in range(5)]
            assert backend.pool_stats()["in_use"] == 0
        assert fake.connections_opened == 1


async def test_sequential_whole_replies_reuse_one_connection() -> None:
    """A non-streamed reply is read to its end (on asyncio without a read just to see the
    end), so its connection goes back to the pool every time: one connection for all."""
    async with FakeProvider(Reply(tokens=5)) as fake:
        client, backend = client_for(fake)
        async with client:
            for _ in range(20):
                completion = await client.chat("hi", stream=False)
                assert completion.text.split() == [f"tok{i}" for i in range(5)]
            assert backend.pool_stats()["in_use"] == 0
        assert fake.connections_opened == 1


async def test_warmup_opens_connections() -> None:
    async with FakeProvider() as fake:
        client, backend = client_for(fake)
        async with client:
            await client.warmup(4)
            assert fake.connections_opened >= 1
            opened = fake.connections_opened
            await client.chat("hi")
            assert fake.connections_opened == opened  # the request used a warm connection


async def _abandon(client: AsyncClient, kind: int) -> None:
    if kind == 0:  # leave early with break
        async with client.stream("hi") as stream:
            async for _ in stream:
                break
    elif kind == 1:  # cancelled while reading
        with anyio.CancelScope() as scope:
            async with client.stream("hi") as stream:
                async for _ in stream:
                    scope.cancel()
                    await anyio.sleep_forever()
    elif kind == 2:  # broken by the server mid-stream
        with pytest.raises(APIConnectionError):
            async with client.stream("hi") as stream:
                async for _ in stream:
                    pass
    else:  # timed out (stall after content, idle limit)
        with pytest.raises(StreamStalled):
            async with client.stream("hi", timeout=Timeout(total=60, idle=1.0)) as stream:
                async for _ in stream:
                    pass


async def test_a_thousand_abandoned_streams_leave_no_connection_checked_out() -> None:
    replies = {
        0: Reply(tokens=50),
        1: Reply(tokens=50, token_delay=0.01),
        2: Reply(tokens=50, drop_after=2),
        3: Reply(tokens=50, stall_after=2),
    }
    async with FakeProvider() as fake:
        client, backend = client_for(fake)
        client.retry = RetryPolicy.none()  # one request per stream, so replies pair with kinds
        async with client:
            for batch in range(25):  # 25 batches of 40 concurrent streams of one kind
                kind = batch % 4
                fake.script(*[replies[kind]] * 40)
                async with anyio.create_task_group() as tg:
                    for _ in range(40):
                        tg.start_soon(_abandon, client, kind)
                assert backend.pool_stats()["in_use"] == 0
            await fake.wait_until_idle()
            # The pool still works afterwards, and nothing is left checked out.
            fake.script(Reply(text="still fine"))
            assert (await client.chat("hi")).text == "still fine"
            assert backend.pool_stats()["in_use"] == 0
        assert len(fake.requests) == 1001


async def test_closing_the_client_ends_the_calls_still_reading_their_replies() -> None:
    """Closing an AsyncClient (an application shutting down) while calls wait on a provider
    that has gone quiet ended them only at their deadline (600 s by default): on asyncio,
    closing aiohttp's connections does not wake a read parked on them. They end at once,
    with ConfigurationError, on both event loops."""
    async with FakeProvider(Reply(tokens=5, stall_after=1)) as fake:
        client, _ = client_for(fake)
        ended: list[BaseException] = []

        async def chat() -> None:
            with pytest.raises(ConfigurationError) as caught:
                await client.chat("hi")
            ended.append(caught.value)

        async def stream() -> None:
            with pytest.raises(ConfigurationError) as caught:
                async with client.stream("hi") as replies:
                    async for _ in replies.text():
                        pass
            ended.append(caught.value)

        with anyio.fail_after(30):  # bounds the hang this test is about; not a speed assertion
            async with client, anyio.create_task_group() as tg:
                tg.start_soon(chat)
                tg.start_soon(stream)
                while fake.in_flight < 2:  # noqa: ASYNC110 (the fake's own count)
                    await anyio.sleep(0.01)
                await client.aclose()
        assert [str(e) for e in ended] == ["the client was closed while this reply was read"] * 2
        assert all(isinstance(e, ClientClosedError) for e in ended)


async def test_closing_the_client_ends_a_call_still_waiting_for_its_answer() -> None:
    """A call whose request is out and whose answer has not begun when the client closes
    got a connection error, which was retried on a transport opened anew: the closed
    client went on sending. It ends with ClientClosedError."""
    arrived = anyio.Event()

    async def never_answer(conn: anyio.abc.SocketStream) -> None:
        async with conn:
            await conn.receive()
            arrived.set()
            await anyio.sleep_forever()

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    backend = HTTPBackend(f"http://127.0.0.1:{port}/v1", name="quiet")
    client = AsyncClient(backend, model="m", retry=FAST_RETRY)
    with anyio.fail_after(30):  # bounds the hang this test is about; not a speed assertion
        async with listener, anyio.create_task_group() as tg:
            tg.start_soon(listener.serve, never_answer)
            ended: list[BaseException] = []

            async def chat() -> None:
                with pytest.raises(ClientClosedError, match="before this reply began") as caught:
                    await client.chat("hi")
                ended.append(caught.value)

            async with client, anyio.create_task_group() as calls:
                calls.start_soon(chat)
                await arrived.wait()
                await client.aclose()
            assert len(ended) == 1
            tg.cancel_scope.cancel()


async def test_drop_before_content_is_retried() -> None:
    async with FakeProvider() as fake:
        fake.script(Reply(drop_after=0), Reply(text="second try"))
        client, _ = client_for(fake)
        async with client:
            completion = await client.chat("hi")
        assert completion.text == "second try"
        assert completion.timing is not None and len(completion.timing.attempts) == 2


async def test_drop_after_content_is_not_retried() -> None:
    async with FakeProvider() as fake:
        fake.script(Reply(tokens=10, drop_after=3), Reply(text="never"))
        client, _ = client_for(fake)
        async with client:
            with pytest.raises(APIConnectionError):
                await client.chat("hi")
        assert len(fake.requests) == 1


async def test_rate_limit_with_retry_after_is_retried() -> None:
    async with FakeProvider() as fake:
        fake.script(Reply(status=429, retry_after_ms=10), Reply(text="ok now"))
        client, _ = client_for(fake)
        async with client:
            assert (await client.chat("hi")).text == "ok now"
        fake.script(*[Reply(status=429, retry_after=0)] * 3)
        client, _ = client_for(fake)
        async with client:
            with pytest.raises(RateLimitError) as info:
                await client.chat("hi")
        assert info.value.request_id


async def test_malformed_event_and_error_event() -> None:
    async with FakeProvider() as fake:
        fake.script(Reply(tokens=5, malformed_after=2), Reply(tokens=5, error_event_after=2))
        client, _ = client_for(fake)
        async with client:
            with pytest.raises(APIResponseValidationError):
                await client.chat("hi")
            with pytest.raises(StreamError):
                await client.chat("hi")


async def test_keepalive_comments_do_not_reset_idle() -> None:
    async with FakeProvider() as fake:
        fake.script(Reply(tokens=5, stall_after=1, keepalive_comments=0.02))
        client, backend = client_for(fake, timeout=Timeout(total=30, idle=0.5))
        async with client:
            with pytest.raises(StreamStalled):
                await client.chat("hi")
            assert backend.pool_stats()["in_use"] == 0


async def test_usage_and_cached_tokens_come_through() -> None:
    from swiftclient.testing import ReplyUsage

    async with FakeProvider() as fake:
        fake.script(Reply(tokens=3, usage=ReplyUsage(prompt_tokens=100, cached_tokens=64)))
        client, _ = client_for(fake)
        async with client:
            completion = await client.chat("hi")
        assert completion.usage is not None
        assert completion.usage.prompt_tokens == 100 and completion.usage.cached_tokens == 64
        assert fake.requests[0].body["stream_options"] == {"include_usage": True}


def _cancelling() -> int:
    """The current asyncio task's pending cancel requests (0 on trio, which has none)."""
    try:
        import asyncio

        task = asyncio.current_task()
    except RuntimeError:
        return 0
    return 0 if task is None else task.cancelling()


async def test_the_deadline_bounds_a_non_streamed_call_on_a_warm_connection() -> None:
    # On asyncio the aiohttp transport releases connections without waiting, so the call
    # path bounds a non-streamed call with a loop timer instead of a cancel scope.
    async with FakeProvider() as fake:
        fake.script(Reply(text="warm"), Reply(stall_after=0), Reply(text="after"))
        client, backend = client_for(fake, timeout=Timeout(total=0.5))
        async with client:
            assert (await client.chat("hi", stream=False)).text == "warm"
            with pytest.raises(DeadlineExceeded, match="total deadline of 0.5s"):
                await client.chat("hi", stream=False)
            assert _cancelling() == 0  # the timer withdrew its own cancel request
            assert backend.pool_stats()["in_use"] == 0
            assert (await client.chat("hi", stream=False)).text == "after"


async def test_an_outer_cancel_of_a_non_streamed_call_propagates_and_frees_the_slot() -> None:
    async with FakeProvider() as fake:
        fake.script(Reply(text="warm"), Reply(stall_after=0), Reply(text="after"))
        client, backend = client_for(fake, timeout=Timeout(total=30))
        async with client:
            await client.chat("hi", stream=False)
            with anyio.move_on_after(0.3) as scope:
                await client.chat("hi", stream=False)
            assert scope.cancelled_caught  # not turned into a deadline error
            assert backend.pool_stats()["in_use"] == 0
            assert (await client.chat("hi", stream=False)).text == "after"


async def test_non_streamed_call_is_bounded_by_the_deadline() -> None:
    async with FakeProvider() as fake:
        fake.script(Reply(stall_after=0), Reply(text="after"))
        client, backend = client_for(fake, timeout=Timeout(total=0.5))
        async with client:
            with pytest.raises(DeadlineExceeded):
                await client.chat("hi", stream=False)
            assert backend.pool_stats()["in_use"] == 0
            completion = await client.chat("hi", stream=False, timeout=30)
            assert completion.text == "after"


@pytest.mark.parametrize("suffix", ["?key=sk-test-SECRET123", "#frag", "/v1?api=1"])
def test_a_base_url_with_a_query_or_fragment_is_refused(suffix: str) -> None:
    """Paths are appended to ``base_url``: ``http://host/v1?key=k`` sent
    ``/v1?key=k/chat/completions`` (a 404 from the provider, and the key in a query). The
    constructor refuses it, naming neither the URL nor the key."""
    with pytest.raises(ConfigurationError, match="query string or fragment") as info:
        HTTPBackend("https://api.example.com" + suffix)
    assert "SECRET" not in str(info.value) and "example.com" not in str(info.value)


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"api_key": "sk-secret-123\n"}, "api_key holds a control character"),
        ({"api_key": "sk-sécret-123"}, "api_key holds a control character"),
        ({"api_key": 123}, "api_key must be a str"),
        ({"headers": {"x-team": 1}}, "header 'x-team': header names and values must be str"),
        ({"headers": {"x-team": "a\r\nx-evil: 1"}}, "header 'x-team' holds a control"),
        ({"headers": 5}, "headers must be a mapping of header names to values, got int"),
        ({"headers": {1: "a"}}, "header 1: header names and values must be str"),
        ({"max_connections": 2.5}, "max_connections must be an int"),
    ],
)
def test_header_values_no_request_could_send_are_refused_up_front(
    kwargs: dict[str, object], says: str
) -> None:
    """A key read from a file kept its newline: asyncio raised a bare ValueError at call
    time, trio retried it as a connection error, and a non-ASCII key's UnicodeEncodeError
    carried the whole key in its ``object``."""
    with pytest.raises(ConfigurationError) as raised:
        HTTPBackend("http://127.0.0.1:9/v1", **kwargs)  # type: ignore[arg-type]
    assert says in str(raised.value)
    assert "secret" not in str(raised.value) and raised.value.__cause__ is None


@pytest.mark.parametrize("url", [123, "http://", "https:///v1", "ftp://127.0.0.1/v1"])
def test_a_base_url_without_a_host_is_refused_up_front(url: object) -> None:
    """``"http://"`` was accepted and every call retried "invalid URL" three times."""
    with pytest.raises(ConfigurationError, match="base_url must"):
        HTTPBackend(url)  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_a_request_json_cannot_carry_is_a_configuration_error() -> None:
    """A lone surrogate or an object in extra_body raised pydantic's serialization error
    from inside the backend."""
    async with FakeProvider() as fake, AsyncClient(HTTPBackend(fake.base_url), model="m") as client:
        for call in (
            client.chat("\ud800"),
            client.chat("hi", extra_body={"x": object()}),
        ):
            with pytest.raises(ConfigurationError, match="cannot be sent as JSON"):
                await call
        assert not fake.requests


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
async def test_a_404_from_a_base_url_without_a_path_suggests_v1(stream: bool) -> None:
    async with FakeProvider(Reply(tokens=2)) as fake:
        root = fake.base_url.removesuffix("/v1")
        async with AsyncClient(HTTPBackend(root), model="m", stream_chat=stream) as client:
            with pytest.raises(NotFoundError) as missed:
                await client.chat("hi")
            assert f"base_url={root + '/v1'!r}?" in str(missed.value)
        # With a path, a 404 is the server's own word (a wrong path is not guessed at).
        async with AsyncClient(HTTPBackend(root + "/api"), model="m") as client:
            with pytest.raises(NotFoundError) as missed:
                await client.chat("hi")
            assert "base_url" not in str(missed.value)


def test_a_second_asyncio_run_on_one_client_is_refused_before_sending() -> None:
    """Each ``asyncio.run`` makes a new loop; the pool belongs to the first. The second call
    failed deep in aiohttp (``RuntimeError: Event loop is closed``) after retrying."""
    with FakeProvider(Reply(tokens=2)).run_in_thread() as fake:
        backend = HTTPBackend(fake.base_url, name="fake")
        client = AsyncClient(backend, model="m")
        assert asyncio.run(client.chat("hi")).text
        with pytest.raises(ConfigurationError, match="first used on another event loop"):
            asyncio.run(client.chat("hi"))
        with pytest.raises(ConfigurationError, match="first used on another event loop"):
            asyncio.run(backend.warmup())  # every way into the pool, not only a chat
        assert len(fake.requests) == 1
        with warnings.catch_warnings():  # the first loop's connection cannot be closed now
            warnings.simplefilter("ignore", ResourceWarning)
            del client, backend
            gc.collect()


def test_a_transport_the_caller_gave_serves_each_loop_it_is_used_on() -> None:
    """A given transport (``httpx.MockTransport`` in a test suite's module-scoped fixture)
    belongs to no loop: one client is used by test after test, each on a new loop."""
    answer = {
        "id": "c",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
        ],
    }
    transport = httpx.MockTransport(lambda request: httpx.Response(200, json=answer))
    client = AsyncClient(
        HTTPBackend("http://x.test/v1", transport=transport), model="m", stream_chat=False
    )
    assert asyncio.run(client.chat("hi")).text == "ok"
    assert asyncio.run(client.chat("hi")).text == "ok"
    assert trio.run(client.chat, "hi").text == "ok"


def test_a_connect_timeout_says_what_timed_out_through_an_exception_group() -> None:
    """On trio, httpx's ``ConnectTimeout`` wraps the nursery of connection attempts: the
    message read "Exceptions from Trio nursery (1 sub-exception)"."""
    inner = OSError("connecting to 10.0.0.1:443 took too long")
    exc = httpx.ConnectTimeout("")
    exc.__cause__ = BaseExceptionGroup("Exceptions from Trio nursery", [inner])
    error = map_httpx_error(exc)
    assert type(error).__name__ == "ConnectTimeout"
    assert str(error) == "opening a connection timed out (connecting to 10.0.0.1:443 took too long)"


def test_a_pool_the_caller_gave_is_refused_on_another_loop_too() -> None:
    """Only transports that hold no connections serve any loop: a given httpx pool failed
    on the second ``asyncio.run`` with "Event loop is closed", after sending."""
    with FakeProvider(Reply(tokens=2)).run_in_thread() as fake:
        backend = HTTPBackend(fake.base_url, transport=httpx.AsyncHTTPTransport())
        client = AsyncClient(backend, model="m")
        assert asyncio.run(client.chat("hi")).text
        with pytest.raises(ConfigurationError, match="first used on another event loop"):
            asyncio.run(client.chat("hi"))
        assert len(fake.requests) == 1
        with warnings.catch_warnings():  # the first loop's connection cannot be closed now
            warnings.simplefilter("ignore", ResourceWarning)
            del client, backend
            gc.collect()
