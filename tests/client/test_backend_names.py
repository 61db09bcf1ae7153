"""Errors name a backend as the user named it: the key it was registered under with the
client (``AsyncClient(backends={"down": ...})``), not the backend's own default name."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest

from swiftclient import APIConnectionError, APIStatusError, AsyncClient, HTTPBackend, RetryPolicy

from .mock import backend_for, serve_handler

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("transport")]
"""Every test calls over aiohttp and httpx: a status from a loopback socket, a refused
connection from a loopback port nothing listens on."""
NO_RETRY = RetryPolicy(max_attempts=1)


def _closed_port() -> int:
    """A loopback port nothing listens on (taken, then given back)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@asynccontextmanager
async def _failing(status: int | None) -> AsyncIterator[HTTPBackend]:
    # The backend's own name is the default, "http": the user named it only in the client.
    if status is None:  # connection refused
        yield backend_for(f"http://127.0.0.1:{_closed_port()}/v1", "k")
        return

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, json={"error": {"message": "overloaded"}})

    async with serve_handler(handler) as base_url:
        yield backend_for(base_url, "k")


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "complete"])
@pytest.mark.parametrize("status", [503, None], ids=["status", "connection"])
async def test_a_failure_names_the_backend_as_registered(stream: bool, status: int | None) -> None:
    expected = APIStatusError if status else APIConnectionError
    async with (
        _failing(status) as down,
        AsyncClient(backends={"down": down}, model="m", retry=NO_RETRY) as client,
    ):
        with pytest.raises(expected) as info:
            await client.chat("hi", stream=stream)
    assert str(info.value).startswith("down: "), str(info.value)
    assert info.value.backend == "down"
    assert [a.backend for a in info.value.attempts] == ["down"]


async def test_each_target_of_a_fallback_is_named_as_registered() -> None:
    async with (
        _failing(503) as first,
        _failing(None) as second,
        AsyncClient(
            backends={"first": first, "second": second}, model="m", retry=NO_RETRY
        ) as client,
    ):
        with pytest.raises(APIConnectionError) as info:
            await client.chat("hi", model=["first/m", "second/m"])
    assert str(info.value).startswith("second: ")
    assert [a.backend for a in info.value.attempts] == ["first", "second"]


async def test_a_backend_registered_under_its_own_name_reads_as_before() -> None:
    async with (
        _failing(503) as backend,
        AsyncClient(backend, model="m", retry=NO_RETRY) as client,
    ):
        with pytest.raises(APIStatusError) as info:
            await client.chat("hi")
    assert str(info.value).startswith("http: HTTP 503: overloaded")
