"""A complete stream is returned at once, even when the server never ends the body.

The answer is whole at ``[DONE]`` (or at the usage chunk after the last finish); the body's
end is not waited for on the caller's time. The connection is closed (not left open, not
returned to the pool half-read), on both transports.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import anyio.abc
import httpx
import pytest

from swiftclient import AsyncClient, HTTPBackend, RetryPolicy, Timeout

from .rawserver import RawRequest, raw_server, send_all

pytestmark = pytest.mark.anyio

# Well under the 2 s the stream used to wait for the body's end after [DONE], and far over
# what a loopback call takes, even on a loaded machine.
TOTAL = 1.5
HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def _frame(data: bytes) -> bytes:
    """One chunk of a chunked body."""
    return b"%x\r\n%s\r\n" % (len(data), data)


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _choice(delta: dict[str, Any], finish: str | None = None) -> bytes:
    return _event({"id": "c", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


USAGE = _event(
    {
        "id": "c",
        "choices": [],
        "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3},
    }
)
ANSWER = [_choice({"role": "assistant", "content": "Hel"}), _choice({"content": "lo"})]


def _endless(events: list[bytes], closed: anyio.Event) -> Any:
    """A server that sends ``events`` (a chunked body) and never ends the body; ``closed``
    is set once the client closes the connection."""

    async def answer(request: RawRequest, stream: anyio.abc.ByteStream) -> None:
        await send_all(stream, HEAD + b"".join(_frame(e) for e in events))
        try:
            while await stream.receive():
                pass
        except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
            pass
        closed.set()

    return answer


def _backend(url: str, transport: str) -> HTTPBackend:
    if transport == "httpx":  # httpx's transport on either event loop
        return HTTPBackend(url, name="raw", transport=httpx.AsyncHTTPTransport())
    return HTTPBackend(url, name="raw")  # aiohttp's on asyncio, httpx's on trio


@pytest.mark.parametrize("transport", ["default", "httpx"])
@pytest.mark.parametrize(
    "events",
    [
        pytest.param([*ANSWER, _choice({}, "stop"), USAGE, b"data: [DONE]\n\n"], id="done"),
        pytest.param([*ANSWER, _choice({}, "stop"), b"data: [DONE]\n\n"], id="done-no-usage"),
        pytest.param([*ANSWER, _choice({}, "stop"), USAGE], id="finish-and-usage"),
    ],
)
async def test_a_complete_answer_returns_without_waiting_for_the_body_end(
    transport: str, events: list[bytes]
) -> None:
    closed = anyio.Event()
    async with raw_server(_endless(events, closed)) as server:
        backend = _backend(server.base_url, transport)
        async with AsyncClient(backend, model="m", retry=RetryPolicy.none()) as client:
            completion = await client.chat("hi", stream=True, timeout=Timeout(total=TOTAL))
            assert completion.text == "Hello"
            assert completion.finish_reason == "stop"
            assert backend.pool_stats()["in_use"] == 0
            # The half-read connection was closed, not kept (nor handed back to the pool).
            with anyio.fail_after(30):
                await closed.wait()


@pytest.mark.parametrize("transport", ["default", "httpx"])
async def test_a_stream_iterated_to_done_ends_there(transport: str) -> None:
    closed = anyio.Event()
    events = [*ANSWER, _choice({}, "stop"), USAGE, b"data: [DONE]\n\n"]
    async with raw_server(_endless(events, closed)) as server:
        backend = _backend(server.base_url, transport)
        async with AsyncClient(backend, model="m", retry=RetryPolicy.none()) as client:
            async with client.stream("hi", timeout=Timeout(total=TOTAL)) as stream:
                texts = [text async for text in stream.text()]
                completion = await stream.final()
            assert texts == ["Hel", "lo"]
            assert completion.usage is not None and completion.usage.total_tokens == 3
            assert backend.pool_stats()["in_use"] == 0
            with anyio.fail_after(30):
                await closed.wait()


async def test_usage_before_every_choice_finished_does_not_end_the_stream() -> None:
    # n=2: a usage chunk after only choice 0 finished is not the end; choice 1 still streams.
    def two(index: int, delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": index, "delta": delta, "finish_reason": finish}
        return _event({"id": "c", "choices": [choice]})

    events = [
        two(0, {"content": "a"}),
        two(1, {"content": "b"}),
        two(0, {}, "stop"),
        USAGE,
        two(1, {"content": "c"}),
        two(1, {}, "length"),
        b"data: [DONE]\n\n",
    ]
    closed = anyio.Event()
    async with raw_server(_endless(events, closed)) as server:
        async with AsyncClient(HTTPBackend(server.base_url, name="raw"), model="m") as client:
            completion = await client.chat("hi", n=2, timeout=Timeout(total=TOTAL))
    texts = [choice.message.content for choice in completion.choices]
    assert texts == ["a", "bc"]
    assert [choice.finish_reason for choice in completion.choices] == ["stop", "length"]
