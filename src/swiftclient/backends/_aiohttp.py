"""The asyncio transport: requests over one pooled ``aiohttp`` session.

aiohttp's connector does far less Python work per request and per chunk than httpx's on
asyncio. This module speaks :class:`~swiftclient.backends.base.Transport` through aiohttp's
public API only, and maps aiohttp's failures to the seam's transport errors
(``_errors.py``) in one table, :data:`AIOHTTP_ERRORS`.

A pooled connection may have been closed by the server while it sat idle, its FIN not yet
seen by the event loop when a request takes it (a server that closes after every response
without ``Connection: close``, or whose keep-alive timeout fires as the request arrives).
A request that fails on a reused connection before any part of the response arrived is sent
again at once on a fresh connection, as browsers do: the server cannot have answered it.
"""

from __future__ import annotations

import contextvars
import functools
import socket
import ssl
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp
import yarl
from aiohttp.client_exceptions import UnixClientConnectorError

from ._errors import (
    ConnectError,
    ConnectTimeout,
    InvalidURL,
    ProtocolError,
    ReadError,
    ReadTimeout,
    TransportError,
    WriteError,
    closed_under,
)
from .base import TransportResponse

__all__ = ["AIOHTTP_ERRORS", "AiohttpTransport", "map_aiohttp_error"]

SocketFactory = Callable[[Any], socket.socket]

_CUT_SHORT = "the connection closed before the response body was complete"
_DISCONNECTED = "the server closed the connection without a response"
_NOT_HTTP = "not an http(s) URL ({})"

# Every aiohttp exception class (a test walks aiohttp's tree), and the OS errors aiohttp
# lets through: the transport error it is, and the message (``{}``: the exception's own).
# Messages say what happened, not aiohttp's parser internals. Redirects are never
# followed, uploads are one piece of bytes and no websocket is opened, so the classes for
# those are mapped for completeness only.
AIOHTTP_ERRORS: dict[type[BaseException], tuple[type[TransportError], str]] = {
    aiohttp.ClientError: (ProtocolError, "{}"),
    aiohttp.ClientResponseError: (ProtocolError, "malformed response: {}"),
    aiohttp.ContentTypeError: (ProtocolError, "malformed response: {}"),
    aiohttp.WSServerHandshakeError: (ProtocolError, "malformed response: {}"),
    aiohttp.ClientHttpProxyError: (ConnectError, "the proxy refused the tunnel: {}"),
    aiohttp.TooManyRedirects: (ProtocolError, "malformed response: {}"),
    aiohttp.ClientConnectionError: (ReadError, "{}"),
    aiohttp.ClientConnectionResetError: (ReadError, "the connection was reset ({})"),
    aiohttp.ClientOSError: (ReadError, "{}"),
    aiohttp.ClientConnectorError: (ConnectError, "{}"),
    aiohttp.ClientConnectorDNSError: (ConnectError, "{}"),
    aiohttp.ClientProxyConnectionError: (ConnectError, "{}"),
    # imported by name: after an import of aiohttp that a Ctrl-C cut short, a retried one
    # leaves aiohttp.client_exceptions off the package (found by a fault run)
    UnixClientConnectorError: (ConnectError, "{}"),
    aiohttp.ClientSSLError: (ConnectError, "{}"),
    aiohttp.ClientConnectorSSLError: (ConnectError, "{}"),
    aiohttp.ClientConnectorCertificateError: (ConnectError, "{}"),
    aiohttp.ServerConnectionError: (ReadError, "{}"),
    aiohttp.ServerDisconnectedError: (ProtocolError, _DISCONNECTED),
    aiohttp.ServerTimeoutError: (ReadError, "{}"),
    aiohttp.ConnectionTimeoutError: (ConnectTimeout, "opening a connection timed out ({})"),
    aiohttp.SocketTimeoutError: (ReadTimeout, "{}"),
    aiohttp.ServerFingerprintMismatch: (ConnectError, "{}"),
    aiohttp.ClientPayloadError: (ProtocolError, _CUT_SHORT),
    aiohttp.UploadAbortedError: (WriteError, "{}"),
    aiohttp.InvalidURL: (ConnectError, "invalid URL ({})"),
    aiohttp.InvalidUrlClientError: (ConnectError, "invalid URL ({})"),
    aiohttp.InvalidUrlRedirectClientError: (ProtocolError, "malformed redirect: {}"),
    aiohttp.RedirectClientError: (ProtocolError, "malformed redirect: {}"),
    aiohttp.NonHttpUrlClientError: (InvalidURL, _NOT_HTTP),
    aiohttp.NonHttpUrlRedirectClientError: (ProtocolError, "malformed redirect: {}"),
    ConnectionResetError: (ReadError, "the connection was reset ({})"),
    OSError: (ReadError, "{}"),
}


def map_aiohttp_error(exc: BaseException) -> TransportError | None:
    """The transport error for an aiohttp or OS failure (None: not a transport failure)."""
    for cls in type(exc).__mro__:
        entry = AIOHTTP_ERRORS.get(cls)
        if entry is not None:
            error, template = entry
            detail = exc.message if isinstance(exc, aiohttp.ClientResponseError) else str(exc)
            return error(template.format(detail or type(exc).__name__))
    return None


# Per task: whether the connection the current request got was reused (set by the
# connector), and whether the request must have a fresh connection (a resend).
_REUSED: contextvars.ContextVar[bool] = contextvars.ContextVar("swiftclient_reused", default=False)
_FRESH: contextvars.ContextVar[bool] = contextvars.ContextVar("swiftclient_fresh", default=False)


class _Connector(aiohttp.TCPConnector):
    """aiohttp's connector, telling the request whether its connection was reused, and
    handing a resend a new connection only."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._served: set[int] = set()
        """The ids of the connections (protocols) handed out before, each dropped when its
        protocol is freed (so a later object with the same id is new): a set lookup per
        request, where a ``WeakSet`` made a weak reference for every lookup."""

    async def connect(self, req: Any, traces: Any, timeout: aiohttp.ClientTimeout) -> Any:
        """A pooled or new connection; :data:`_REUSED` says which (set only when it
        changes: a context variable's ``set`` copies the context)."""
        served = self._served
        try:
            while True:
                conn = await super().connect(req, traces, timeout)
                protocol = conn.protocol
                if protocol is None:
                    reused = False
                    break
                key = id(protocol)
                if key not in served:
                    served.add(key)
                    weakref.finalize(protocol, served.discard, key)
                    reused = False
                    break
                if not _FRESH.get():
                    reused = True
                    break
                conn.close()  # a resend takes no pooled connection: drop this one
        except BaseException:
            if _REUSED.get():
                _REUSED.set(False)
            raise
        if _REUSED.get() is not reused:
            _REUSED.set(reused)
        return conn


def _unanswered(exc: BaseException) -> bool:
    """Whether a failure of ``session.request`` means the connection died before any of the
    response was read: the server closed it (no part of a response parsed) or reset it."""
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return isinstance(exc.message, str)  # else: the part of a response that was parsed
    if isinstance(exc, aiohttp.ClientConnectorError):
        return False
    return isinstance(exc, aiohttp.ClientOSError | ConnectionResetError | BrokenPipeError)


@functools.lru_cache(maxsize=16)
def _client_timeout(connect: float | None) -> aiohttp.ClientTimeout:
    # The backend bounds the pool wait itself and never lets aiohttp's pool block, so
    # ``connect`` here covers opening a connection only.
    return aiohttp.ClientTimeout(total=None, connect=connect, sock_connect=connect)


class _Body:
    """One response's body: aiohttp's ``readany`` with errors mapped."""

    __slots__ = ("__weakref__", "_content", "_response", "at_end")

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response
        self._content = response.content
        self.at_end: Callable[[], bool] = response.content.at_eof
        """True once the body was read to its end (aiohttp parses the end of the body with
        its last bytes)."""

    async def read(self) -> bytes:
        """The next bytes received (``b""`` at the end)."""
        try:
            return await self._content.readany()
        except Exception as exc:
            mapped = map_aiohttp_error(exc)
            if mapped is None:
                raise
            raise mapped from exc

    async def aclose(self) -> None:
        """Back to the pool after a whole body; otherwise drop the connection."""
        self.close_nowait()

    def abort(self, exc: Exception) -> None:
        """Fail a read in progress, and the next ones, with ``exc`` (the transport is
        closing: closing the connection under a parked ``readany`` does not wake it)."""
        if not self._content.at_eof():
            self._content.set_exception(exc)

    def close_nowait(self) -> bool:
        """Release or close the connection; aiohttp does either without waiting."""
        response = self._response
        if self._content.at_eof():
            response.release()
        else:
            response.close()
        return True


class AiohttpTransport:
    """Send requests over one pooled ``aiohttp.ClientSession``, opened on first use."""

    def __init__(
        self,
        *,
        keepalive_expiry: float | None = 30.0,
        socket_factory: SocketFactory | None = None,
        ssl_context: ssl.SSLContext | None = None,
        proxy: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self._headers = dict(headers or {})
        """The headers of every request: the session's own (aiohttp merges them in C; a
        request's own headers go on top of them)."""
        self._keepalive_expiry = keepalive_expiry
        self._socket_factory = socket_factory
        self._ssl: ssl.SSLContext | bool = ssl_context if ssl_context is not None else True
        self._proxy = proxy
        self._session: aiohttp.ClientSession | None = None
        self._urls: dict[str, yarl.URL] = {}  # parsed once: a backend calls few URLs
        self._bodies: weakref.WeakSet[_Body] = weakref.WeakSet()
        """The bodies handed out and not collected: failed when the transport closes."""

    def _open(self) -> aiohttp.ClientSession:
        connector = _Connector(
            limit=0,  # the backend's own pool limit applies; aiohttp's pool never waits
            keepalive_timeout=self._keepalive_expiry
            if self._keepalive_expiry is not None
            else 3600.0,
            socket_factory=self._socket_factory,
            ssl=self._ssl,
        )
        # trust_env stays off: the backend resolves proxy settings once, itself. API calls
        # keep no cookies (a dummy jar skips the per-request cookie filtering). Every request
        # carries its backend's own user-agent, so aiohttp adds none of its own (a session
        # skip list would cost a header merge per request).
        self._session = aiohttp.ClientSession(
            connector=connector,
            headers=self._headers,
            proxy=self._proxy,
            cookie_jar=aiohttp.DummyCookieJar(),
        )
        return self._session

    async def send(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        body: bytes,
        connect: float | None,
    ) -> TransportResponse:
        """Send one request; the response's body is still unread."""
        session = self._session
        if session is None or session.closed:
            session = self._open()
        target = self._urls.get(url)
        if target is None:
            if len(self._urls) > 64:
                self._urls.clear()
            target = self._urls[url] = yarl.URL(url)
        data, timeout = body or None, _client_timeout(connect)
        fresh: contextvars.Token[bool] | None = None
        try:
            while True:
                try:
                    response = await session.request(
                        method,
                        target,
                        headers=headers,
                        data=data,
                        allow_redirects=False,
                        timeout=timeout,
                    )
                    break
                except Exception as exc:
                    if session.closed or fresh is not None:
                        raise  # closed: said below; resent once already: as it is
                    if not (_REUSED.get() and _unanswered(exc)):
                        raise
                    # The pooled connection was dead: send again, at once, on a new one.
                    fresh = _FRESH.set(True)
        except Exception as exc:
            if session.closed:  # closed by aclose() while this waited for its answer
                raise closed_under(reading=False) from None
            mapped = map_aiohttp_error(exc)
            if mapped is None:
                raise
            raise mapped from exc
        finally:
            if fresh is not None:
                _FRESH.reset(fresh)
        read = _Body(response)
        self._bodies.add(read)
        return TransportResponse(response.status, response.headers, read)

    async def aclose(self) -> None:
        """Close the session and every pooled connection; a reply still being read fails
        with :class:`~swiftclient.errors.ClientClosedError` (it waited for bytes that no
        closed connection brings, to its deadline)."""
        session, self._session = self._session, None
        bodies = list(self._bodies)
        self._bodies.clear()
        for body in bodies:
            body.abort(closed_under(reading=True))
        if session is not None:
            await session.close()
