"""An httpx transport that sends requests over aiohttp (asyncio only).

httpx stays the API; aiohttp's connection pool carries the bytes, which costs far less CPU
per request and per chunk under high concurrency. aiohttp failures become the matching
httpx exceptions here, so the one httpx -> swiftclient mapping covers both transports.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import httpx

from .http import READ_EXTENSION

__all__ = ["AiohttpTransport"]

SocketFactory = Callable[[Any], socket.socket]


def _map_error(exc: BaseException, request: httpx.Request) -> httpx.TransportError | None:
    """Translate an aiohttp/OS failure into the httpx exception httpx itself would raise."""
    message = str(exc) or type(exc).__name__
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return httpx.ConnectTimeout(message, request=request)
    if isinstance(exc, aiohttp.SocketTimeoutError):
        return httpx.ReadTimeout(message, request=request)
    if isinstance(exc, aiohttp.ClientConnectorError):
        return httpx.ConnectError(message, request=request)
    if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError):
        return httpx.RemoteProtocolError(message, request=request)
    if isinstance(exc, aiohttp.ClientResponseError):
        return httpx.RemoteProtocolError(message, request=request)
    if isinstance(exc, aiohttp.ClientConnectionResetError | ConnectionResetError):
        return httpx.ReadError(message, request=request)
    if isinstance(exc, aiohttp.ClientOSError | OSError):
        return httpx.ReadError(message, request=request)
    if isinstance(exc, aiohttp.ClientError):
        return httpx.NetworkError(message, request=request)
    if isinstance(exc, TimeoutError):
        return httpx.PoolTimeout(message, request=request)
    return None


class _ResponseStream(httpx.AsyncByteStream):
    """Response body bytes; closing it early closes the connection instead of reusing it."""

    def __init__(self, response: aiohttp.ClientResponse, request: httpx.Request) -> None:
        self._response = response
        self._request = request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while chunk := await self.read():
            yield chunk

    async def read(self) -> bytes:
        """The next bytes received (``b""`` at the end); errors mapped to httpx's."""
        try:
            return await self._response.content.readany()
        except Exception as exc:
            mapped = _map_error(exc, self._request)
            if mapped is None:
                raise
            raise mapped from exc

    async def aclose(self) -> None:
        response = self._response
        if response.content.at_eof() and not response.closed:
            response.release()
        else:
            response.close()


class AiohttpTransport(httpx.AsyncBaseTransport):
    """Carry httpx requests over one pooled aiohttp session, created on first use."""

    def __init__(
        self,
        *,
        max_connections: int = 100,
        keepalive_expiry: float | None = 30.0,
        socket_factory: SocketFactory | None = None,
    ) -> None:
        self._max_connections = max_connections
        self._keepalive_expiry = keepalive_expiry
        self._socket_factory = socket_factory
        self._session: aiohttp.ClientSession | None = None

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                limit=self._max_connections,
                keepalive_timeout=self._keepalive_expiry
                if self._keepalive_expiry is not None
                else 3600.0,
                socket_factory=self._socket_factory,
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                auto_decompress=False,
                skip_auto_headers=("User-Agent",),
            )
        return self._session

    def pool_stats(self) -> dict[str, int]:
        """Connections checked out (``in_use``) and idle in the pool."""
        if self._session is None or self._session.closed:
            return {"in_use": 0, "idle": 0}
        connector = self._session.connector
        acquired = getattr(connector, "_acquired", ())
        idle = sum(len(v) for v in getattr(connector, "_conns", {}).values())
        return {"in_use": len(acquired), "idle": idle}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request`` and return a streaming httpx response."""
        session = self._get_session()
        timeouts = request.extensions.get("timeout", {})
        pool = timeouts.get("pool")
        connect = timeouts.get("connect")
        timeout = aiohttp.ClientTimeout(
            total=None,
            connect=None if pool is None and connect is None else (pool or 0) + (connect or 0),
            sock_connect=connect,
            sock_read=timeouts.get("read"),
        )
        body = await request.aread()
        try:
            response = await session.request(
                request.method,
                str(request.url),
                headers=request.headers.multi_items(),
                data=body or None,
                allow_redirects=False,
                timeout=timeout,
                compress=None,
            )
        except Exception as exc:
            mapped = _map_error(exc, request)
            if mapped is None:
                raise
            raise mapped from exc
        stream = _ResponseStream(response, request)
        extensions: dict[str, Any] = {
            "http_version": b"HTTP/1.1",
            "reason_phrase": (response.reason or "").encode("ascii", "ignore"),
        }
        if "Content-Encoding" not in response.headers:
            extensions[READ_EXTENSION] = stream.read
        return httpx.Response(
            status_code=response.status,
            headers=list(response.raw_headers),
            stream=stream,
            extensions=extensions,
            request=request,
        )

    async def aclose(self) -> None:
        """Close the session and every pooled connection."""
        if self._session is not None:
            await self._session.close()
            self._session = None
