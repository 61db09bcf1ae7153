"""Regression tests over real loopback sockets: bounded bodies, pool vs connect timeouts,
in-band errors on 200, non-SSE stream bodies, interrupted bodies, echoed secrets."""

from __future__ import annotations

from collections.abc import Callable

import anyio
import anyio.abc
import pytest

from swiftclient import (
    APIConnectionError,
    APIResponseValidationError,
    APIStatusError,
    AsyncClient,
    HTTPBackend,
    PoolTimeout,
    ResponseTooLarge,
    RetryPolicy,
    StreamError,
    Timeout,
)
from swiftclient.testing import FakeProvider, Reply

from .mock import FAST_RETRY
from .rawserver import RawRequest, raw_server, send_all

pytestmark = pytest.mark.anyio
KEY = "sk-test-key-1234567890"
LIMIT = 256 * 1024
SENT_AT_MOST = 64 * 1024 * 1024  # the server gives up after this much, client or not


def _client(base_url: str, **backend: object) -> tuple[AsyncClient, HTTPBackend]:
    http = HTTPBackend(base_url, KEY, name="raw", **backend)  # type: ignore[arg-type]
    return AsyncClient(http, model="m", retry=FAST_RETRY), http


async def _endless(stream: anyio.abc.ByteStream, head: bytes, first: bytes) -> None:
    """Send ``head`` and ``first``, then ``x`` bytes with no newline until the client leaves."""
    if not await send_all(stream, head + first):
        return
    block = b"x" * 65536
    sent = 0
    while sent < SENT_AT_MOST and await send_all(stream, block):
        sent += len(block)


async def test_an_sse_line_without_end_is_cut_off_at_the_event_limit() -> None:
    async def answer(request: RawRequest, stream: anyio.abc.ByteStream) -> None:
        head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"
        await _endless(stream, head, b"data: ")

    async with raw_server(answer) as server:
        client, backend = _client(server.base_url, max_event_bytes=LIMIT)
        async with client:
            with pytest.raises(ResponseTooLarge, match="exceeds the limit of 262144 bytes"):
                await client.chat("hi")
            assert backend.pool_stats()["in_use"] == 0
        assert len(server.requests) == 1  # a response-validation error: not retried


async def test_an_endless_non_streamed_body_is_cut_off_at_the_body_limit() -> None:
    async def answer(request: RawRequest, stream: anyio.abc.ByteStream) -> None:
        head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n"
        await _endless(stream, head, b'{"id": "')

    async with raw_server(answer) as server:
        client, backend = _client(server.base_url, max_body_bytes=LIMIT)
        async with client:
            with pytest.raises(ResponseTooLarge):
                await client.chat("hi", stream=False)
            assert backend.pool_stats()["in_use"] == 0


async def test_a_declared_length_over_the_limit_is_refused_before_reading() -> None:
    async def answer(request: RawRequest, stream: anyio.abc.ByteStream) -> None:
        head = (
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            b"content-length: 1000000000\r\n\r\n"
        )
        await _endless(stream, head, b"{")

    async with raw_server(answer) as server:
        client, backend = _client(server.base_url, max_body_bytes=LIMIT)
        async with client:
            with pytest.raises(ResponseTooLarge, match="1000000000 bytes"):
                await client.chat("hi", stream=False)
            assert backend.pool_stats()["in_use"] == 0


async def test_defaults_bound_bodies_generously() -> None:
    backend = HTTPBackend("http://127.0.0.1:1/v1")
    assert backend.max_event_bytes == 32 * 1024 * 1024
    assert backend.max_body_bytes == 64 * 1024 * 1024


async def _until(condition: Callable[[], bool]) -> None:
    """Yield to the event loop until ``condition()`` holds (at most a generous while)."""
    for _ in range(6000):
        if condition():
            return
        await anyio.sleep(0.01)
    raise AssertionError("the condition never held")


async def test_pool_wait_has_its_own_bound_and_error() -> None:
    # One connection, held by an open stream; the next call waits for the pool, not for a
    # connect, and must give up after Timeout.pool with PoolTimeout (connect is 60 s).
    async with FakeProvider() as fake:
        fake.script(Reply(tokens=3, stall_after=1), Reply(text="afterwards"))
        backend = HTTPBackend(fake.base_url, KEY, name="fake", max_connections=1)
        limits = Timeout(total=120, connect=60, pool=0.2)
        client = AsyncClient(backend, model="m", retry=RetryPolicy.none(), timeout=limits)
        async with client:
            async with client.stream("hold the only connection") as held:
                await held.__anext__()
                with pytest.raises(PoolTimeout, match="no free connection within 0.2s"):
                    await client.chat("hi")
                assert backend.pool_stats() == {"in_use": 1, "waiting": 0}
            assert backend.pool_stats()["in_use"] == 0
            assert (await client.chat("again")).text == "afterwards"


async def test_a_waiting_call_gets_the_connection_when_it_is_freed() -> None:
    async with FakeProvider() as fake:
        fake.script(Reply(tokens=3, stall_after=1), Reply(text="second"))
        backend = HTTPBackend(fake.base_url, KEY, name="fake", max_connections=1)
        client = AsyncClient(backend, model="m", retry=RetryPolicy.none())
        async with client:
            async with client.stream("first") as first:
                await first.__anext__()
                async with anyio.create_task_group() as tg:
                    result: list[str] = []

                    async def second() -> None:
                        result.append((await client.chat("second")).text)

                    tg.start_soon(second)
                    await _until(lambda: backend.pool_stats()["waiting"] == 1)
                    await first.aclose()
            assert result == ["second"]


async def test_a_200_error_body_on_a_non_streamed_call_raises_the_in_band_error() -> None:
    async with FakeProvider() as fake:
        fake.script(Reply(error_event_after=0, error_message="the model crashed"))
        client = AsyncClient(HTTPBackend(fake.base_url, KEY, name="fake"), model="m")
        async with client:
            with pytest.raises(StreamError, match="the model crashed") as info:
                await client.chat("hi", stream=False)
        assert isinstance(info.value.body, dict) and "error" in info.value.body
        assert len(fake.requests) == 1


async def test_an_html_page_on_a_stream_is_a_validation_error_not_retried() -> None:
    async def answer(request: RawRequest, stream: anyio.abc.ByteStream) -> None:
        page = b"<html><body>Service temporarily in maintenance</body></html>"
        head = (
            b"HTTP/1.1 200 OK\r\ncontent-type: text/html\r\n"
            b"content-length: " + str(len(page)).encode() + b"\r\n\r\n"
        )
        await send_all(stream, head + page)

    async with raw_server(answer) as server:
        client, _ = _client(server.base_url)
        async with client:
            with pytest.raises(APIResponseValidationError, match="text/html"):
                await client.chat("hi")
        assert len(server.requests) == 1


async def test_a_stream_body_that_is_not_sse_is_a_validation_error() -> None:
    # No content type to go by: the body itself shows it is not an event stream.
    async def answer(request: RawRequest, stream: anyio.abc.ByteStream) -> None:
        body = b"upstream connect error or disconnect/reset before headers\n"
        head = b"HTTP/1.1 200 OK\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n"
        await send_all(stream, head + body)

    async with raw_server(answer) as server:
        client, _ = _client(server.base_url)
        async with client:
            with pytest.raises(APIResponseValidationError, match="not an event stream"):
                await client.chat("hi")
        assert len(server.requests) == 1


async def test_a_json_error_answer_to_a_stream_raises_the_in_band_error() -> None:
    async def answer(request: RawRequest, stream: anyio.abc.ByteStream) -> None:
        body = b'{"error": {"message": "quota exhausted", "type": "insufficient_quota"}}'
        head = (
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\n\r\n"
        )
        await send_all(stream, head + body)

    async with raw_server(answer) as server:
        client, _ = _client(server.base_url)
        async with client:
            with pytest.raises(StreamError, match="quota exhausted"):
                await client.chat("hi")


async def test_an_interrupted_body_says_what_happened() -> None:
    async with FakeProvider() as fake:
        fake.script(Reply(tokens=10, drop_after=3))
        client = AsyncClient(
            HTTPBackend(fake.base_url, KEY, name="fake"), model="m", retry=RetryPolicy.none()
        )
        async with client:
            with pytest.raises(APIConnectionError) as info:
                await client.chat("hi")
        message = str(info.value)
        assert "400" not in message and "transfer" not in message.lower()
        assert "closed" in message or "reset" in message


async def test_a_key_echoed_in_a_response_header_is_scrubbed_from_exc_headers() -> None:
    async with FakeProvider() as fake:
        fake.script(
            Reply(
                status=401,
                headers={"x-echo": f"got key {KEY}", "www-authenticate": f"Bearer {KEY}"},
            )
        )
        client = AsyncClient(
            HTTPBackend(fake.base_url, KEY, name="fake"), model="m", retry=RetryPolicy.none()
        )
        async with client:
            with pytest.raises(APIStatusError) as info:
                await client.chat("hi")
        exc = info.value
        assert KEY not in repr(exc.headers) and KEY not in str(exc) and KEY not in repr(exc)
        assert exc.headers["x-echo"] == "got key ***"
        assert exc.request_id is not None and exc.request_id.startswith("req_fake_")
