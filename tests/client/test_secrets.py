"""No API key reaches an error: its message, body and headers, and every exception and
object reachable from it through ``__cause__`` / ``__context__`` (the transport's own
exceptions hold the request, ``Authorization`` header included). Over real loopback sockets,
on both transports: aiohttp on asyncio, httpx on trio."""

from __future__ import annotations

import json
import traceback
from collections.abc import Iterator, Mapping
from types import FunctionType, ModuleType
from typing import Any

import anyio.abc
import pytest

from swiftclient import APIError, AsyncClient, HTTPBackend, RetryPolicy

from .rawserver import RawRequest, raw_server, send_all

pytestmark = pytest.mark.anyio
NO_RETRY = RetryPolicy(max_attempts=1)
KEYS = [
    "ab",  # two characters
    "0123456789abcdef0123456789abcdef",  # hex
    "123e4567-e89b-12d3-a456-426614174000",  # UUID
]


def _reachable(obj: object, seen: set[int], depth: int = 0) -> Iterator[str]:
    """Every string and bytes value reachable from ``obj`` through exception links, the
    attributes of the objects found, and containers (tracebacks and their frames aside)."""
    if id(obj) in seen or depth > 12:
        return
    seen.add(id(obj))
    if isinstance(obj, str):
        yield obj
        return
    if isinstance(obj, bytes | bytearray | memoryview):
        yield bytes(obj).decode("latin-1")
        return
    if obj is None or isinstance(obj, int | float | type | ModuleType | FunctionType):
        return
    yield repr(obj)
    if isinstance(obj, BaseException):
        yield str(obj)
        for linked in (obj.__cause__, obj.__context__, obj.args):
            yield from _reachable(linked, seen, depth + 1)
    if isinstance(obj, Mapping):
        for key, value in obj.items():
            yield from _reachable(key, seen, depth + 1)
            yield from _reachable(value, seen, depth + 1)
        return
    if isinstance(obj, list | tuple | set | frozenset):
        for item in obj:
            yield from _reachable(item, seen, depth + 1)
        return
    names: list[str] = list(getattr(obj, "__dict__", {}))
    for cls in type(obj).__mro__:
        names.extend(getattr(cls, "__slots__", ()))
    for name in names:
        if name in ("__traceback__", "__weakref__", "__dict__"):
            continue
        try:
            value = object.__getattribute__(obj, name)
        except AttributeError:
            continue
        yield from _reachable(value, seen, depth + 1)
    # Properties that expose what a transport exception kept (httpx's ``request``,
    # aiohttp's ``request_info``).
    for name in ("request", "request_info", "headers", "response", "body"):
        try:
            value = getattr(obj, name)
        except Exception:
            continue
        yield from _reachable(value, seen, depth + 1)


def assert_nowhere(key: str, exc: BaseException) -> None:
    """``key`` is in no text the exception shows or leads to."""
    shown = "".join(traceback.format_exception(exc))
    assert key not in shown, shown
    for text in _reachable(exc, set()):
        assert key not in text, text[:2000]


async def _fail(base_url: str, key: str, *, stream: bool, **backend: Any) -> APIError:
    http = HTTPBackend(base_url, key, name="raw", **backend)
    async with AsyncClient(http, model="m", retry=NO_RETRY) as client:
        with pytest.raises(APIError) as info:
            await client.chat("hi", stream=stream)
    return info.value


@pytest.mark.parametrize("key", KEYS)
async def test_a_401_echoing_the_key_before_a_full_stop_is_masked(key: str) -> None:
    message = f"Incorrect API key provided: {key}. You can find your API key at https://x."
    body = json.dumps({"error": {"message": message, "echo": {key: key}}}).encode()

    async def answer(request: RawRequest, stream: anyio.abc.ByteStream) -> None:
        head = (
            f"HTTP/1.1 401 Unauthorized\r\ncontent-type: application/json\r\n"
            f"x-echo: {key}.\r\ncontent-length: {len(body)}\r\nconnection: close\r\n\r\n"
        )
        await send_all(stream, head.encode() + body)

    async with raw_server(answer) as server:
        error = await _fail(server.base_url, key, stream=False)
    assert "Incorrect API key provided: ***. You can find your API key" in str(error)
    assert_nowhere(key, error)


async def test_a_key_given_in_a_custom_credential_header_is_masked() -> None:
    key = "0123456789abcdef0123456789abcdef"

    async def answer(request: RawRequest, stream: anyio.abc.ByteStream) -> None:
        assert request.headers["api-key"] == key
        assert "authorization" not in request.headers
        body = json.dumps({"error": {"message": f"key {key}. is not valid"}}).encode()
        head = (
            f"HTTP/1.1 403 Forbidden\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
        )
        await send_all(stream, head.encode() + body)

    async with raw_server(answer) as server:
        http = HTTPBackend(server.base_url, headers={"api-key": key}, name="azure")
        async with AsyncClient(http, model="m", retry=NO_RETRY) as client:
            with pytest.raises(APIError) as info:
                await client.chat("hi")
    assert "key ***. is not valid" in str(info.value)
    assert_nowhere(key, info.value)


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "complete"])
@pytest.mark.parametrize("key", KEYS[1:])
async def test_a_hostile_status_line_leaves_no_key_in_the_chain(key: str, stream: bool) -> None:
    # The status line is not HTTP: the transport's parser fails, and its exception holds the
    # request (Authorization: Bearer <key>) and the line itself.
    async def answer(request: RawRequest, stream_: anyio.abc.ByteStream) -> None:
        await send_all(stream_, f"HTTP/1.1 2x0 Bearer {key}\r\ncontent-length: 0\r\n\r\n".encode())

    async with raw_server(answer) as server:
        error = await _fail(server.base_url, key, stream=stream)
    assert error.__cause__ is not None  # the transport's failure, scrubbed, is kept
    assert_nowhere(key, error)


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "complete"])
async def test_a_body_that_is_no_completion_leaves_no_key_in_the_chain(stream: bool) -> None:
    # pydantic's validation error quotes the input: it must not be on the chain.
    key = KEYS[1]
    payload = json.dumps({"id": key, "choices": key, "created": key}).encode()
    body = b"data: " + payload + b"\n\n" if stream else payload
    kind = "text/event-stream" if stream else "application/json"

    async def answer(request: RawRequest, stream_: anyio.abc.ByteStream) -> None:
        head = (
            f"HTTP/1.1 200 OK\r\ncontent-type: {kind}\r\ncontent-length: {len(body)}\r\n"
            "connection: close\r\n\r\n"
        )
        await send_all(stream_, head.encode() + body)

    async with raw_server(answer) as server:
        error = await _fail(server.base_url, key, stream=stream)
    assert "not a chat completion" in str(error)
    assert_nowhere(key, error)
