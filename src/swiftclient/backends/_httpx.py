"""The httpx transport adapter: trio, HTTP/2, and any ``httpx.AsyncBaseTransport`` a user
passes (a ``MockTransport`` in tests, a custom proxy transport).

The backend builds each ``httpx.Request`` itself and calls the transport's one public method,
``handle_async_request``; no ``httpx.AsyncClient`` sits in between (API calls need no
redirects, cookies, auth flows or event hooks).

httpcore drops a pooled connection whose socket shows the server's close before using it;
one the server closes while the request is on its way (its keep-alive timeout firing as the
request arrives) fails the request before any of the response. Such a request, on a reused
connection, is sent again at once (httpcore's ``trace`` extension says whether the request
opened its connection), as the aiohttp transport does.

httpx's exceptions become the seam's transport errors (``_errors.py``) in one table,
:data:`HTTPX_ERRORS`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping

import httpx

from ..errors import ConfigurationError
from ._errors import (
    ConnectError,
    ConnectTimeout,
    DecodingError,
    InvalidURL,
    PoolTimeout,
    ProtocolError,
    ReadError,
    ReadTimeout,
    TransportError,
    WriteError,
    WriteTimeout,
    closed_under,
)
from .base import TransportResponse

__all__ = ["HTTPX_ERRORS", "HttpxTransport", "map_httpx_error"]

# Every httpx exception a request can raise (a test walks httpx's tree): ``HTTPError`` and
# its subclasses, and ``InvalidURL``. httpx's ``StreamError`` family and ``CookieConflict``
# mean misuse of httpx's own objects, not a failed request: they are not mapped. Statuses
# are returned, never raised, and redirects never followed: those classes are mapped for
# completeness only.
HTTPX_ERRORS: dict[type[Exception], type[TransportError]] = {
    httpx.HTTPError: ProtocolError,
    httpx.HTTPStatusError: ProtocolError,
    httpx.RequestError: ProtocolError,
    httpx.TooManyRedirects: ProtocolError,
    httpx.DecodingError: DecodingError,
    httpx.TransportError: ProtocolError,
    httpx.UnsupportedProtocol: InvalidURL,
    httpx.ProxyError: ConnectError,
    httpx.TimeoutException: ReadTimeout,
    httpx.ConnectTimeout: ConnectTimeout,
    httpx.ReadTimeout: ReadTimeout,
    httpx.WriteTimeout: WriteTimeout,
    httpx.PoolTimeout: PoolTimeout,
    httpx.NetworkError: ReadError,
    httpx.ConnectError: ConnectError,
    httpx.ReadError: ReadError,
    httpx.WriteError: WriteError,
    httpx.CloseError: ReadError,
    httpx.ProtocolError: ProtocolError,
    httpx.LocalProtocolError: ProtocolError,
    httpx.RemoteProtocolError: ProtocolError,
    httpx.InvalidURL: InvalidURL,
}
_CAUGHT = (httpx.HTTPError, httpx.InvalidURL)


def _detail(exc: BaseException) -> str:
    """The first non-empty message along the exception's cause chain (httpx often re-raises
    with an empty message, the reason being in the lower layer's exception); a group (trio's
    happy-eyeballs nursery) is read through its first exception, not its own "Exceptions
    from Trio nursery" text."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            break
        if isinstance(seen, BaseExceptionGroup) and seen.exceptions:
            seen = seen.exceptions[0]
            continue
        if str(seen):
            return str(seen)
        seen = seen.__cause__ or seen.__context__
    return type(exc).__name__


def map_httpx_error(exc: Exception) -> TransportError:
    """The transport error for an httpx exception (one of :data:`_CAUGHT`)."""
    if isinstance(exc, httpx.ConnectTimeout):  # worded as the aiohttp transport words it
        return ConnectTimeout(f"opening a connection timed out ({_detail(exc)})")
    for cls in type(exc).__mro__:
        error = HTTPX_ERRORS.get(cls)
        if error is not None:
            return error(_detail(exc))
    return ProtocolError(_detail(exc))


class _Body:
    """One response's body: the transport's byte stream itself when there is no
    content-encoding to undo (no httpx iterator layers in between), else ``aiter_bytes``."""

    __slots__ = ("_iterator", "_owner", "_response")

    def __init__(self, response: httpx.Response, owner: HttpxTransport) -> None:
        self._response = response
        self._owner = owner
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
        except _CAUGHT as exc:
            if self._owner.closed:  # its connection was closed under it (trio words it
                # "another task closed this fd")
                raise closed_under(reading=True) from None
            raise map_httpx_error(exc) from exc

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


# Resends of a request whose reused connection turned out dead, before the failure stands
# (each one takes another pooled connection or opens one).
_MAX_RESENDS = 3


class _Probe:
    """httpcore's ``trace`` callback for one request: whether it opened its connection and
    whether it was sent on one."""

    __slots__ = ("opened", "sent")

    def __init__(self) -> None:
        self.opened = False
        self.sent = False

    async def __call__(self, name: str, info: object) -> None:
        if ".connect_tcp." in name:
            self.opened = True
        elif name.endswith(".send_request_headers.started"):
            self.sent = True

    def died_unanswered(self, exc: BaseException) -> bool:
        """Whether ``exc`` says a reused connection died before any of the response."""
        if not self.sent or self.opened:
            return False
        if isinstance(exc, httpx.RemoteProtocolError):
            return "without sending a response" in str(exc)
        return isinstance(exc, httpx.ReadError | httpx.WriteError)


class HttpxTransport:
    """Adapt an ``httpx.AsyncBaseTransport`` to the backend's transport seam."""

    def __init__(
        self, transport: httpx.AsyncBaseTransport, headers: Mapping[str, str] | None = None
    ) -> None:
        self._transport = transport
        self._headers = dict(headers or {})
        """The headers of every request (a request's own go on top of them)."""
        self._urls: dict[str, tuple[httpx.URL, str]] = {}
        self.closed = False
        """Whether :meth:`aclose` ran (a read its closing broke says so)."""

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
            try:
                parsed = httpx.URL(url)
            except _CAUGHT as exc:
                raise map_httpx_error(exc) from exc
            target = self._urls[url] = (parsed, parsed.netloc.decode("ascii"))
        parsed, host = target
        timeout = {"connect": connect, "read": None, "write": connect, "pool": None}
        # A given body stream makes httpx add no headers: Host and Content-Length are ours.
        sent_headers = {
            **self._headers,
            **headers,
            "host": host,
            "content-length": str(len(body)),
        }
        resends = 0
        while True:
            probe = _Probe()
            request = httpx.Request(
                method,
                parsed,
                headers=sent_headers,
                stream=_RequestBody(body),
                extensions={"timeout": timeout, "trace": probe},
            )
            try:
                response = await self._transport.handle_async_request(request)
            except _CAUGHT as exc:
                if self.closed:  # closed while this waited for its answer
                    raise closed_under(reading=False) from None
                if resends == _MAX_RESENDS or not probe.died_unanswered(exc):
                    raise map_httpx_error(exc) from exc
                resends += 1
                continue
            break
        response.request = request
        return TransportResponse(response.status_code, response.headers, _Body(response, self))

    async def aclose(self) -> None:
        """Close the transport's connections; a reply still being read fails with
        :class:`~swiftclient.errors.ClientClosedError` (one already on its way may end
        first)."""
        self.closed = True
        await self._transport.aclose()
