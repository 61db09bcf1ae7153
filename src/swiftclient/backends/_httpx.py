"""The httpx transport adapter: trio, HTTP/2, and any ``httpx.AsyncBaseTransport`` a user
passes (a ``MockTransport`` in tests, a custom proxy transport).

The backend builds each ``httpx.Request`` itself and calls the transport's one public method,
``handle_async_request``; no ``httpx.AsyncClient`` sits in between (API calls need no
redirects, cookies, auth flows or event hooks).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping

import httpx

from ..errors import ConfigurationError
from .base import TransportResponse

__all__ = ["HttpxTransport"]


class _Body:
    """One response's body: the transport's byte stream itself when there is no
    content-encoding to undo (no httpx iterator layers in between), else ``aiter_bytes``."""

    __slots__ = ("_iterator", "_response")

    def __init__(self, response: httpx.Response) -> None:
        self._response = response
        self._iterator: AsyncIterator[bytes] | None = None

    def _open(self) -> AsyncIterator[bytes]:
        response = self._response
        if "content-encoding" in response.headers:
            iterator = response.aiter_bytes()
        else:
            stream = response.stream
            if not isinstance(stream, httpx.AsyncByteStream):
                raise ConfigurationError("HTTPBackend needs an async httpx transport")
            iterator = stream.__aiter__()
        self._iterator = iterator
        return iterator

    async def read(self) -> bytes:
        """The next body bytes, ``b""`` at the end."""
        iterator = self._iterator or self._open()
        try:
            while True:
                data = await iterator.__anext__()
                if data:
                    return data
        except StopAsyncIteration:
            return b""

    def close_nowait(self) -> bool:
        """httpx closes responses asynchronously: always False."""
        return False

    def at_end(self) -> bool:
        """httpx sees a body's end only on the read after its last bytes: always False."""
        return False

    async def aclose(self) -> None:
        """Close our iterator explicitly, then the response (which releases the connection)."""
        iterator, self._iterator = self._iterator, None
        close = getattr(iterator, "aclose", None)
        if close is not None:
            await close()
        await self._response.aclose()


class _RequestBody(httpx.AsyncByteStream):
    """The request body as one piece, iterated by a plain iterator: httpx's own byte stream
    is an async generator, which trio warns about when a failed send abandons it."""

    __slots__ = ("_data", "_sent")

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._sent = False

    def __aiter__(self) -> _RequestBody:
        self._sent = False
        return self

    async def __anext__(self) -> bytes:
        if self._sent or not self._data:
            raise StopAsyncIteration
        self._sent = True
        return self._data


class HttpxTransport:
    """Adapt an ``httpx.AsyncBaseTransport`` to the backend's transport seam."""

    def __init__(self, transport: httpx.AsyncBaseTransport) -> None:
        self._transport = transport
        self._urls: dict[str, tuple[httpx.URL, str]] = {}

    async def send(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        body: bytes,
        connect: float | None,
    ) -> TransportResponse:
        """Build the ``httpx.Request`` and hand it to the transport."""
        target = self._urls.get(url)
        if target is None:
            if len(self._urls) > 64:
                self._urls.clear()
            parsed = httpx.URL(url)
            target = self._urls[url] = (parsed, parsed.netloc.decode("ascii"))
        parsed, host = target
        timeout = {"connect": connect, "read": None, "write": connect, "pool": None}
        # A given body stream makes httpx add no headers: Host and Content-Length are ours.
        request = httpx.Request(
            method,
            parsed,
            headers={**headers, "host": host, "content-length": str(len(body))},
            stream=_RequestBody(body),
            extensions={"timeout": timeout},
        )
        response = await self._transport.handle_async_request(request)
        response.request = request
        return TransportResponse(response.status_code, response.headers, _Body(response))

    async def aclose(self) -> None:
        """Close the transport's connections."""
        await self._transport.aclose()
