"""A pooled connection the server has already closed: the request sent on it is retried at
once on a fresh connection, without backoff and without counting as a retry, on both
transports (aiohttp on asyncio, httpx on trio)."""

from __future__ import annotations

import json

import anyio.abc
import pytest

from swiftclient import APIConnectionError, AsyncClient, HTTPBackend, RetryPolicy

from .rawserver import RawRequest, raw_server, send_all

pytestmark = pytest.mark.anyio
NO_RETRY = RetryPolicy(max_attempts=1)
COMPLETION = json.dumps(
    {
        "id": "c",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "ok"},
                "finish_reason": "stop",
            }
        ],
    }
).encode()
# A keep-alive response: no "connection: close", so the client pools the connection.
RESPONSE = (
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
    b"content-length: " + str(len(COMPLETION)).encode() + b"\r\n\r\n" + COMPLETION
)


async def test_a_server_that_closes_after_each_response_fails_no_call() -> None:
    # raw_server closes each connection right after its answer, saying nothing.
    async def answer(request: RawRequest, stream: anyio.abc.ByteStream) -> None:
        await send_all(stream, RESPONSE)

    async with raw_server(answer) as server:
        backend = HTTPBackend(server.base_url, "k", name="closer")
        async with AsyncClient(backend, model="m", retry=NO_RETRY) as client:
            for _ in range(30):
                completion = await client.chat("hi", stream=False)
                assert completion.text == "ok"
                assert len(completion.timing.attempts) == 1
    assert len(server.requests) == 30


@pytest.mark.parametrize("stream", [False, True], ids=["complete", "stream"])
async def test_a_request_on_a_connection_closed_before_answering_is_resent_at_once(
    stream: bool,
) -> None:
    # Each connection answers its first request, then takes the next one and closes without
    # a byte of response (a keep-alive timeout that fired as the request arrived).
    dropped = 0

    async def answer(request: RawRequest, stream_: anyio.abc.ByteStream) -> None:
        nonlocal dropped
        body = RESPONSE
        if request.headers.get("accept") == "text/event-stream":
            event = (
                b'data: {"id":"c","object":"chat.completion.chunk","created":0,"model":"m",'
                b'"choices":[{"index":0,"delta":{"content":"ok"},"finish_reason":"stop"}]}\n\n'
                b"data: [DONE]\n\n"
            )
            body = (
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                b"content-length: " + str(len(event)).encode() + b"\r\n\r\n" + event
            )
        if not await send_all(stream_, body):
            return
        try:
            await stream_.receive()  # the next request on this connection: left unanswered
        except (anyio.EndOfStream, anyio.BrokenResourceError):
            return
        dropped += 1

    async with raw_server(answer) as server:
        backend = HTTPBackend(server.base_url, "k", name="closer", max_connections=1)
        async with AsyncClient(backend, model="m", retry=NO_RETRY) as client:
            for _ in range(4):
                completion = await client.chat("hi", stream=stream)
                assert completion.text == "ok"
                assert len(completion.timing.attempts) == 1  # not counted as a retry
    assert dropped == 3  # calls 2-4 each met a closed connection first
    assert len(server.requests) == 4  # and were answered on a fresh one


async def test_a_fresh_connection_closed_without_an_answer_is_not_resent() -> None:
    # Only a reused connection may have died idle: on a new one the server may have acted
    # on the request, so the failure is the call's.
    async def answer(request: RawRequest, stream: anyio.abc.ByteStream) -> None:
        return

    async with raw_server(answer) as server:
        backend = HTTPBackend(server.base_url, "k", name="closer")
        async with AsyncClient(backend, model="m", retry=NO_RETRY) as client:
            with pytest.raises(APIConnectionError):
                await client.chat("hi", stream=False)
    assert len(server.requests) == 1
