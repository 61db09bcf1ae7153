"""Errors name a backend as the user named it: the key it was registered under with the
client (``AsyncClient(backends={"down": ...})``), not the backend's own default name."""

from __future__ import annotations

import httpx
import pytest

from swiftclient import APIConnectionError, APIStatusError, AsyncClient, HTTPBackend, RetryPolicy

pytestmark = pytest.mark.anyio
NO_RETRY = RetryPolicy(max_attempts=1)


def _failing(status: int | None) -> HTTPBackend:
    def handler(request: httpx.Request) -> httpx.Response:
        if status is None:
            raise httpx.ConnectError("connection refused")
        return httpx.Response(status, json={"error": {"message": "overloaded"}})

    # The backend's own name is the default, "http": the user named it only in the client.
    return HTTPBackend("http://x/v1", "k", transport=httpx.MockTransport(handler))


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "complete"])
@pytest.mark.parametrize("status", [503, None], ids=["status", "connection"])
async def test_a_failure_names_the_backend_as_registered(stream: bool, status: int | None) -> None:
    client = AsyncClient(backends={"down": _failing(status)}, model="m", retry=NO_RETRY)
    expected = APIStatusError if status else APIConnectionError
    async with client:
        with pytest.raises(expected) as info:
            await client.chat("hi", stream=stream)
    assert str(info.value).startswith("down: "), str(info.value)
    assert info.value.backend == "down"
    assert [a.backend for a in info.value.attempts] == ["down"]


async def test_each_target_of_a_fallback_is_named_as_registered() -> None:
    client = AsyncClient(
        backends={"first": _failing(503), "second": _failing(None)}, model="m", retry=NO_RETRY
    )
    async with client:
        with pytest.raises(APIConnectionError) as info:
            await client.chat("hi", model=["first/m", "second/m"])
    assert str(info.value).startswith("second: ")
    assert [a.backend for a in info.value.attempts] == ["first", "second"]


async def test_a_backend_registered_under_its_own_name_reads_as_before() -> None:
    async with AsyncClient(_failing(503), model="m", retry=NO_RETRY) as client:
        with pytest.raises(APIStatusError) as info:
            await client.chat("hi")
    assert str(info.value).startswith("http: HTTP 503: overloaded")
