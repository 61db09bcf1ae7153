"""ASGI building blocks for OpenAI-compatible servers, served by uvicorn.

The one home of what the loopback fake provider (:mod:`swiftclient.testing`) and the local
engine's server (:mod:`local_engine.server`) share:

- wire pieces: :func:`error_body` (OpenAI-style error bodies), :func:`sse_event` and
  :data:`SSE_DONE` (server-sent-event framing), :func:`bearer_key_matches` (the bearer scheme
  case-insensitively, the key in constant time);
- :class:`App`, an ASGI application around one handler: it reads the body (413 past
  ``max_body_bytes``, 408 when it trickles in past ``body_timeout``), hands a :class:`Request`
  and a :class:`ResponseWriter` to the handler, cancels the handler as soon as the client
  goes away, answers 500 (logged with secrets redacted) when the handler fails, drops the
  connection when it fails mid-stream, and drops a client that stops reading a stream for
  ``write_timeout`` seconds;
- :class:`Router`: paths to ``(method, handler)``, 404 / 405 / 401 answered in one order;
- running on uvicorn: :class:`ServerSettings` (host, port, connection cap, keep-alive and
  request-head deadlines, root path, loop), :func:`serve` (this thread, until a signal) and
  :class:`ThreadedServer` (a background thread with its own asyncio loop, so code on any
  event loop, or none, can start and stop it).

uvicorn is imported only when a server starts; building an :class:`App` needs only anyio.
uvloop and httptools are used when installed (uvicorn's ``auto``). Connections are served by
a subclass of uvicorn's HTTP protocol that adds what uvicorn leaves out: a deadline for each
request head (a client that opens a connection, or starts a request on a kept-alive one,
and sends no complete head within ``head_timeout`` seconds is disconnected: slowloris), a
cap on head
bytes (431), and the transport handle that :meth:`ResponseWriter.abort` needs for fault
injection.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import traceback
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from contextlib import AbstractAsyncContextManager, ExitStack
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import anyio.abc
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread

from .errors import ConfigurationError, redact

if TYPE_CHECKING:
    import asyncio

__all__ = [
    "SSE_DONE",
    "App",
    "ConnectionTracker",
    "Handler",
    "Request",
    "ResponseWriter",
    "Router",
    "ServerSettings",
    "ThreadedServer",
    "bearer_key_matches",
    "error_body",
    "serve",
    "sse_event",
]

logger = logging.getLogger("swiftclient.asgi")

_T = TypeVar("_T")
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

SSE_DONE = b"data: [DONE]\n\n"
"""The event that ends an OpenAI chat-completions stream."""

_ERROR_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    429: "rate_limit_error",
}


def error_body(
    status: int,
    message: str,
    *,
    type: str | None = None,
    code: str | None = None,
    param: str | None = None,
) -> dict[str, Any]:
    """Return an OpenAI-style error body: ``{"error": {"message", "type", "code"}}``, with
    ``param`` when given.

    ``type`` defaults from the status: ``server_error`` for 5xx, ``rate_limit_error`` for 429,
    ``invalid_request_error`` for most other 4xx.
    """
    if type is None:
        type = (
            "server_error" if status >= 500 else _ERROR_TYPES.get(status, "invalid_request_error")
        )
    error: dict[str, Any] = {"message": message, "type": type, "code": code}
    if param is not None:
        error["param"] = param
    return {"error": error}


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def sse_event(data: Mapping[str, Any] | str | bytes) -> bytes:
    """One server-sent event carrying ``data`` (a mapping is sent as compact JSON).

    ``data`` must be a single line (JSON is).
    """
    if isinstance(data, Mapping):
        payload = _dumps(data)
    elif isinstance(data, str):
        payload = data.encode()
    else:
        payload = data
    return b"data: " + payload + b"\n\n"


def bearer_key_matches(authorization: str | None, key: str) -> bool:
    """True when an ``Authorization`` header carries ``Bearer <key>``.

    The scheme is matched case-insensitively (RFC 9110); the key is compared in constant time.
    """
    if not authorization:
        return False
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return False
    return _constant_time_equal(token.strip(), key)


def _constant_time_equal(given: str, expected: str) -> bool:
    import hmac

    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), expected.encode())


# --------------------------------------------------------------------------- requests


@dataclass(frozen=True, slots=True)
class Request:
    """One request, its body read whole. ``path`` is relative to the app's root path."""

    method: str
    path: str
    query: str
    headers: dict[str, str] = field(repr=False)
    body: bytes = field(repr=False)
    client: tuple[str, int] | None = None

    def json(self) -> Any:
        """Parse the body as JSON; raises ``ValueError`` when it is not JSON (including a
        nesting too deep to parse)."""
        try:
            return json.loads(self.body)
        except RecursionError as exc:
            raise ValueError("the JSON nests too deeply") from exc


Handler = Callable[[Request, "ResponseWriter"], Awaitable[None]]
"""Serves one request: read the :class:`Request`, answer through the :class:`ResponseWriter`."""


class ConnectionTracker:
    """The connections a server holds, keyed by the client address (as in ``scope["client"]``).

    Filled by the uvicorn protocol that :func:`serve` and :class:`ThreadedServer` install; an
    app served by another ASGI server sees it empty.
    """

    def __init__(self) -> None:
        self._transports: dict[tuple[str, int], asyncio.Transport] = {}
        self._paused: set[tuple[str, int]] = set()
        self.opened = 0
        """Connections accepted so far."""

    @property
    def open(self) -> int:
        """Connections open right now."""
        return len(self._transports)

    def add(self, client: tuple[str, int], transport: asyncio.Transport) -> None:
        """Record a new connection."""
        self.opened += 1
        self._transports[client] = transport

    def discard(self, client: tuple[str, int]) -> None:
        """Forget a closed connection."""
        self._transports.pop(client, None)
        self._paused.discard(client)

    def set_paused(self, client: tuple[str, int], paused: bool) -> None:
        """Record that the connection's send buffer is full (the client is not reading)."""
        if paused:
            self._paused.add(client)
        else:
            self._paused.discard(client)

    def is_paused(self, client: tuple[str, int] | None) -> bool:
        """Whether a write to ``client`` would wait for it to read."""
        return client in self._paused

    def abort(self, client: tuple[str, int] | None) -> bool:
        """Drop the connection from ``client`` at once; False when it is not known."""
        transport = self._transports.get(client) if client is not None else None
        if transport is None:
            return False
        transport.abort()
        return True

    def abort_all(self) -> None:
        """Drop every connection."""
        for transport in list(self._transports.values()):
            transport.abort()


class _HeadTooLarge(Exception):
    """A request head went past ``max_head_bytes`` (answered 431, the connection closed)."""


class _Aborted(Exception):
    """The handler asked to drop a connection the server cannot reach."""


_IDLE, _STREAMING, _DONE, _ABORTED = range(4)


class ResponseWriter:
    """Writes one response: whole (:meth:`send`) or streamed (:meth:`start_stream`).

    ``headers`` are added to every response this writer sends (a request id, say).
    """

    __slots__ = (
        "_client",
        "_gone",
        "_send",
        "_state",
        "_tracker",
        "_write_timeout",
        "headers",
        "status",
    )

    def __init__(
        self,
        send: Send,
        *,
        client: tuple[str, int] | None = None,
        tracker: ConnectionTracker | None = None,
        write_timeout: float = 60.0,
    ) -> None:
        self._send = send
        self._client = client
        self._tracker = tracker
        self._write_timeout = write_timeout
        self._state = _IDLE
        self._gone = anyio.Event()
        self.headers: dict[str, str] = {}
        self.status: int | None = None

    @property
    def started(self) -> bool:
        """True once the status line has been sent (or the connection was aborted)."""
        return self._state != _IDLE

    @property
    def streaming(self) -> bool:
        """True between :meth:`start_stream` and :meth:`end`."""
        return self._state == _STREAMING

    @property
    def finished(self) -> bool:
        """True once the whole response has been handed to the server."""
        return self._state == _DONE

    @property
    def aborted(self) -> bool:
        """True after :meth:`abort`."""
        return self._state == _ABORTED

    def _head(self, status: int, headers: Mapping[str, str] | None, length: int | None) -> Message:
        if self._state != _IDLE:
            raise RuntimeError("the response has already been started")
        if not 100 <= status <= 999:
            raise ValueError(f"invalid HTTP status {status!r}")
        merged = {**self.headers, **(headers or {})}
        raw: list[tuple[bytes, bytes]] = []
        for name, value in merged.items():
            if "\r" in name or "\n" in name or "\r" in value or "\n" in value or ":" in name:
                raise ValueError(f"invalid response header {name!r}")
            lname = name.lower()
            if lname in ("content-length", "transfer-encoding"):
                raise ValueError(f"the server sets {name!r} itself")
            raw.append((lname.encode("latin-1"), value.encode("latin-1")))
        if length is not None:
            raw.append((b"content-length", str(length).encode()))
        self.status = status
        return {"type": "http.response.start", "status": status, "headers": raw}

    async def send(
        self, status: int, body: bytes, headers: Mapping[str, str] | None = None
    ) -> None:
        """Send a whole response with ``Content-Length``."""
        head = self._head(status, headers, len(body))
        self._state = _DONE
        await self._send(head)
        await self._send({"type": "http.response.body", "body": body, "more_body": False})

    async def send_json(
        self, status: int, obj: Any, headers: Mapping[str, str] | None = None
    ) -> None:
        """Send ``obj`` as a compact JSON body (``content-type: application/json``)."""
        await self.send(
            status, _dumps(obj), {"content-type": "application/json", **(headers or {})}
        )

    async def send_error(
        self,
        status: int,
        message: str,
        *,
        type: str | None = None,
        code: str | None = None,
        param: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """Send an OpenAI-style JSON error (see :func:`error_body`)."""
        await self.send_json(
            status, error_body(status, message, type=type, code=code, param=param), headers
        )

    async def start_stream(self, status: int, headers: Mapping[str, str] | None = None) -> None:
        """Send the status line and headers of a streamed response.

        ``content-type`` defaults to ``text/event-stream``.
        """
        head = self._head(status, {"content-type": "text/event-stream", **(headers or {})}, None)
        self._state = _STREAMING
        await self._send(head)

    async def write(self, data: bytes) -> None:
        """Send ``data`` as part of a streamed response (empty data sends nothing).

        When the client has stopped reading (the server's send buffer is full), the write
        waits at most ``write_timeout`` seconds; then the connection is dropped and the
        handler cancelled.
        """
        if self._state != _STREAMING:
            raise RuntimeError("write() needs start_stream() first and no end() or abort()")
        if self._gone.is_set():
            # uvicorn drops writes to a departed client without suspending; let the pending
            # cancellation in, or a writing loop would never yield.
            await anyio.lowlevel.checkpoint()
        if not data:
            return
        message = {"type": "http.response.body", "body": data, "more_body": True}
        tracker = self._tracker
        if tracker is None or not tracker.is_paused(self._client):
            await self._send(message)
            return
        # The client stopped reading: wait for it at most write_timeout, then drop it.
        with anyio.move_on_after(self._write_timeout):
            await self._send(message)
            return
        tracker.abort(self._client)
        await self._gone.wait()  # the disconnect cancels the handler

    async def end(self) -> None:
        """Finish a streamed response."""
        if self._state != _STREAMING:
            raise RuntimeError("end() needs a started, unfinished stream")
        self._state = _DONE
        await self._send({"type": "http.response.body", "body": b"", "more_body": False})

    async def abort(self) -> None:
        """Drop the connection now, mid-response or before it (fault injection).

        Returns once the server has seen the connection close, which also cancels the
        running handler.
        """
        if self._state == _ABORTED:
            return
        self._state = _ABORTED
        if self._tracker is None or not self._tracker.abort(self._client):
            raise _Aborted
        await self._gone.wait()


# --------------------------------------------------------------------------- the app


class App:
    """An ASGI application serving every HTTP request with one :data:`Handler`.

    Args:
        handler: serves a :class:`Request` through a :class:`ResponseWriter`.
        max_body_bytes: a larger body (declared or sent) gets 413 and the connection closes.
        body_timeout: seconds for the whole body to arrive once the head has; 408 past it.
        write_timeout: seconds a streamed write may wait for a client that stopped reading;
            past it the connection is dropped and the handler cancelled.
    """

    def __init__(
        self,
        handler: Handler,
        *,
        max_body_bytes: int = 32 * 1024 * 1024,
        body_timeout: float = 30.0,
        write_timeout: float = 60.0,
    ) -> None:
        for name, value in (
            ("max_body_bytes", max_body_bytes),
            ("body_timeout", body_timeout),
            ("write_timeout", write_timeout),
        ):
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ConfigurationError(f"{name} must be a positive number, got {value!r}")
        self.handler = handler
        self.max_body_bytes = max_body_bytes
        self.body_timeout = body_timeout
        self.write_timeout = write_timeout
        self.connections = ConnectionTracker()
        """The connections of the uvicorn server running this app."""
        self._scopes: set[anyio.CancelScope] = set()
        self._stopped: set[anyio.CancelScope] = set()

    def cancel_requests(self) -> None:
        """Cancel every running handler (on shutdown); their connections are dropped."""
        for scope in list(self._scopes):
            self._stopped.add(scope)
            scope.cancel()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            await _lifespan(receive, send)
            return
        if kind != "http":
            raise RuntimeError(f"unsupported ASGI scope type {kind!r}")
        peer = scope.get("client")
        client = (str(peer[0]), int(peer[1])) if peer else None
        writer = ResponseWriter(
            send, client=client, tracker=self.connections, write_timeout=self.write_timeout
        )
        headers = _headers(scope)
        body = await self._read_body(headers, receive, writer)
        if body is None:
            return
        path = scope["path"]
        root = scope.get("root_path") or ""
        if root and path.startswith(root):
            path = path[len(root) :] or "/"
        request = Request(
            scope["method"],
            path,
            scope.get("query_string", b"").decode("latin-1"),
            headers,
            body,
            client,
        )
        await self._dispatch(request, receive, writer)

    async def _read_body(
        self, headers: dict[str, str], receive: Receive, writer: ResponseWriter
    ) -> bytes | None:
        declared = headers.get("content-length", "")
        limit = self.max_body_bytes
        if declared.isdigit() and int(declared) > limit:
            await _refuse(writer, 413, f"Request body too large (limit {limit} bytes).")
            return None
        chunks: list[bytes] = []
        size = 0
        with anyio.move_on_after(self.body_timeout):
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return None
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > limit:
                    await _refuse(writer, 413, f"Request body too large (limit {limit} bytes).")
                    return None
                chunks.append(chunk)
                if not message.get("more_body", False):
                    return b"".join(chunks)
        await _refuse(writer, 408, "The request body did not arrive in time.", "request_timeout")
        return None

    async def _dispatch(self, request: Request, receive: Receive, writer: ResponseWriter) -> None:
        failure: Exception | None = None
        aborted = False
        async with anyio.create_task_group() as task_group:
            scope = task_group.cancel_scope
            self._scopes.add(scope)
            task_group.start_soon(_watch, receive, writer, scope)
            try:
                await self.handler(request, writer)
            except _Aborted:
                aborted = True
            except Exception as exc:
                failure = exc
            finally:
                self._scopes.discard(scope)
                scope.cancel()
        stopped = scope in self._stopped
        self._stopped.discard(scope)
        if writer._gone.is_set():
            return
        if aborted:
            raise RuntimeError("the connection was dropped on purpose (fault injection)")
        if stopped and not writer.finished:
            # Cancelled by a shutdown: drop the connection, as an unfinished response would.
            if not self.connections.abort(request.client) and writer.streaming:
                raise RuntimeError("the server is shutting down")
            return
        if failure is not None:
            logger.error(
                "handler failed for %s %s:\n%s",
                request.method,
                request.path,
                redact("".join(traceback.format_exception(failure))),
            )
        elif not writer.started:
            logger.error("handler sent no response for %s %s", request.method, request.path)
        if not writer.started:
            await writer.send_error(
                500, "The server had an error while processing your request.", code="internal_error"
            )
        elif writer.streaming:
            if failure is None:
                await writer.end()
            elif not self.connections.abort(request.client):
                raise RuntimeError("the handler failed mid-stream") from failure


async def _watch(receive: Receive, writer: ResponseWriter, scope: anyio.CancelScope) -> None:
    """Wait for the client to go away; then cancel the handler."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
    if not writer.finished:
        writer._gone.set()
        if not writer.aborted:
            scope.cancel()


async def _refuse(
    writer: ResponseWriter, status: int, message: str, code: str = "request_too_large"
) -> None:
    await writer.send_error(status, message, code=code, headers={"connection": "close"})


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


def _headers(scope: Scope) -> dict[str, str]:
    headers: dict[str, str] = {}
    for raw_name, raw_value in scope.get("headers", ()):
        name = raw_name.decode("latin-1").lower()
        value = raw_value.decode("latin-1")
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return headers


class Router:
    """Routes a :class:`Request` by path, then method, then key (a :data:`Handler` itself).

    Unknown paths get 404, a wrong method 405 (with ``Allow``), a missing or wrong key 401
    (with ``WWW-Authenticate``), each an OpenAI-style error. Paths in ``public`` need no key.
    A trailing slash is ignored.
    """

    def __init__(
        self,
        routes: Mapping[str, tuple[str, Handler]],
        *,
        api_key: str | None = None,
        public: frozenset[str] = frozenset(),
    ) -> None:
        self.routes = dict(routes)
        self.public = public
        self._api_key = api_key or None

    def __repr__(self) -> str:
        return f"Router(paths={sorted(self.routes)}, auth={self._api_key is not None})"

    def authorized(self, request: Request) -> bool:
        """Whether ``request`` carries the key (always, when no key is set)."""
        if self._api_key is None:
            return True
        return bearer_key_matches(request.headers.get("authorization"), self._api_key)

    async def __call__(self, request: Request, writer: ResponseWriter) -> None:
        path = request.path.rstrip("/") or "/"
        route = self.routes.get(path)
        if route is None:
            await writer.send_error(
                404, f"Unknown request URL: {request.method} {request.path}.", code="not_found"
            )
            return
        method, handler = route
        if request.method != method:
            await writer.send_error(
                405,
                f"Use {method} for {path}.",
                code="method_not_allowed",
                headers={"allow": method},
            )
        elif path not in self.public and not self.authorized(request):
            await writer.send_error(
                401,
                "Incorrect or missing API key.",
                code="invalid_api_key",
                headers={"www-authenticate": "Bearer"},
            )
        else:
            await handler(request, writer)


# --------------------------------------------------------------------------- uvicorn


@dataclass(frozen=True)
class ServerSettings:
    """Where and how uvicorn serves an :class:`App`.

    Args:
        host: interface to bind (loopback by default).
        port: TCP port (0 picks a free one).
        limit_concurrency: past this many open connections or running requests, requests
            get 503 (uvicorn's ``limit_concurrency``); None: no cap.
        keepalive_timeout: seconds an idle kept-alive connection stays open.
        head_timeout: seconds a client has to send a complete request head, counted from
            the connection's start, or on a kept-alive connection from the head's first byte
            (an idle kept-alive connection is closed after ``keepalive_timeout``).
        max_head_bytes: a request head larger than this gets 431 and the connection closes.
        graceful_timeout: seconds a shutdown waits for running requests.
        root_path: the path prefix a proxy strips (ASGI ``root_path``).
        loop: ``auto`` (uvloop when installed), ``asyncio`` or ``uvloop``.
        backlog: the listening socket's backlog.
        access_log: log every request on ``uvicorn.access``.
    """

    host: str = "127.0.0.1"
    port: int = 0
    limit_concurrency: int | None = None
    keepalive_timeout: float = 5.0
    head_timeout: float = 10.0
    max_head_bytes: int = 64 * 1024
    graceful_timeout: float = 5.0
    root_path: str = ""
    loop: str = "auto"
    backlog: int = 2048
    access_log: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.port, bool) or not isinstance(self.port, int):
            raise ConfigurationError(f"port must be an integer, got {self.port!r}")
        if not 0 <= self.port <= 65535:
            raise ConfigurationError(f"port must be in 0..65535, got {self.port!r}")
        positive: list[tuple[str, object]] = [
            ("keepalive_timeout", self.keepalive_timeout),
            ("head_timeout", self.head_timeout),
            ("max_head_bytes", self.max_head_bytes),
            ("graceful_timeout", self.graceful_timeout),
            ("backlog", self.backlog),
        ]
        if self.limit_concurrency is not None:
            positive.append(("limit_concurrency", self.limit_concurrency))
        for name, value in positive:
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ConfigurationError(f"{name} must be a positive number, got {value!r}")
        if self.loop not in ("auto", "asyncio", "uvloop"):
            raise ConfigurationError(f"loop must be auto, asyncio or uvloop, got {self.loop!r}")
        if self.root_path and (not self.root_path.startswith("/") or self.root_path.endswith("/")):
            raise ConfigurationError(
                f"root_path must start with '/' and not end with one, got {self.root_path!r}"
            )

    def bind(self) -> socket.socket:
        """Open the listening socket (raises OSError when the address is taken)."""
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        return socket.create_server((self.host, self.port), family=family, backlog=self.backlog)

    def use_uvloop(self) -> bool:
        """Whether the loop setting asks for uvloop and it is installed."""
        if self.loop == "asyncio":
            return False
        try:
            import uvloop  # noqa: F401
        except ImportError:
            if self.loop == "uvloop":
                raise ConfigurationError("loop='uvloop' needs uvloop installed") from None
            return False
        return True


def _uvicorn() -> Any:
    try:
        import uvicorn
    except ImportError as exc:  # pragma: no cover - uvicorn is in the extras that serve
        raise ConfigurationError(
            "serving needs uvicorn: pip install 'swiftclient-llm[testing]' (or [local])"
        ) from exc
    return uvicorn


def _protocol_class(app: App, settings: ServerSettings) -> type[Any]:
    """uvicorn's httptools protocol (else h11), plus head deadlines and connection tracking."""
    base: type[Any]
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

        base = HttpToolsProtocol
    except ImportError:  # httptools missing: h11 has its own head size limit
        from uvicorn.protocols.http.h11_impl import H11Protocol

        base = H11Protocol

    tracker = app.connections
    head_timeout = settings.head_timeout
    max_head = settings.max_head_bytes
    overflow = (
        b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
        b"connection: close\r\ncontent-length: %d\r\n\r\n%b"
    )
    overflow_body = _dumps(error_body(431, "Request headers too large.", code="headers_too_large"))
    overflow = overflow % (len(overflow_body), overflow_body)

    class GuardedProtocol(base):  # type: ignore[misc]
        """Tracks the connection; closes it when no complete head arrives in time."""

        def connection_made(self, transport: asyncio.Transport) -> None:
            super().connection_made(transport)
            peer = transport.get_extra_info("peername")
            self.guard_key = (str(peer[0]), int(peer[1])) if peer else None
            self.guard_bytes = 0
            self.guard_timer: asyncio.TimerHandle | None = None
            if self.guard_key is not None:
                tracker.add(self.guard_key, transport)
            self.guard_arm()

        def guard_arm(self) -> None:
            self.guard_disarm()
            self.guard_timer = self.loop.call_later(head_timeout, self.guard_expired)

        def guard_disarm(self) -> None:
            if self.guard_timer is not None:
                self.guard_timer.cancel()
                self.guard_timer = None

        def guard_expired(self) -> None:
            self.guard_timer = None
            cycle = self.cycle
            if cycle is None or cycle.response_complete:
                self.transport.abort()

        def connection_lost(self, exc: Exception | None) -> None:
            self.guard_disarm()
            if self.guard_key is not None:
                tracker.discard(self.guard_key)
            super().connection_lost(exc)

        def guard_count(self, size: int) -> None:
            self.guard_bytes += size
            if self.guard_bytes > max_head:
                if not self.transport.is_closing():
                    self.transport.write(overflow)
                    self.transport.close()
                raise _HeadTooLarge  # stops the parser (uvicorn's own 400 goes nowhere)

        def on_message_begin(self) -> None:
            self.guard_bytes = 0
            if self.guard_timer is None:  # a new request on a kept-alive connection
                self.guard_arm()
            super().on_message_begin()

        def on_url(self, url: bytes) -> None:
            self.guard_count(len(url))
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self.guard_count(len(name) + len(value) + 4)
            super().on_header(name, value)

        def pause_writing(self) -> None:
            super().pause_writing()
            if self.guard_key is not None:
                tracker.set_paused(self.guard_key, True)

        def resume_writing(self) -> None:
            super().resume_writing()
            if self.guard_key is not None:
                tracker.set_paused(self.guard_key, False)

        def on_headers_complete(self) -> None:
            self.guard_disarm()
            super().on_headers_complete()

    return GuardedProtocol


def _config(app: App, settings: ServerSettings, *, log: bool) -> Any:
    uvicorn = _uvicorn()
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        http=_protocol_class(app, settings),
        loop="none",
        lifespan="off",
        interface="asgi3",
        limit_concurrency=settings.limit_concurrency,
        timeout_keep_alive=settings.keepalive_timeout,
        timeout_graceful_shutdown=settings.graceful_timeout,
        root_path=settings.root_path,
        backlog=settings.backlog,
        access_log=settings.access_log,
        server_header=False,
        log_config=uvicorn.config.LOGGING_CONFIG if log else None,
    )


def serve(
    app: App,
    settings: ServerSettings,
    *,
    resources: AbstractAsyncContextManager[object] | None = None,
    on_ready: Callable[[str], None] | None = None,
    log_level: str = "info",
) -> None:
    """Serve ``app`` on uvicorn in this thread until SIGINT or SIGTERM.

    The socket is bound first (an ``OSError`` if the address is taken), then ``resources``
    is entered (loading a model, say), then ``on_ready(base_url)`` is called (the direct
    address, without the root path a proxy adds) and requests are
    served; on a signal, uvicorn stops gracefully and ``resources`` is exited. uvicorn logs
    to stderr at ``log_level``.
    """
    uvicorn = _uvicorn()
    sock = settings.bind()
    config = _config(app, settings, log=True)
    logging.getLogger("uvicorn.error").setLevel(log_level.upper())

    async def main() -> None:
        server = uvicorn.Server(config)
        with sock:
            if resources is not None:
                async with resources:
                    _ready(on_ready, settings, sock)
                    await server.serve(sockets=[sock])
            else:
                _ready(on_ready, settings, sock)
                await server.serve(sockets=[sock])

    anyio.run(main, backend="asyncio", backend_options={"use_uvloop": settings.use_uvloop()})


def _base_url(settings: ServerSettings, sock: socket.socket) -> str:
    port = sock.getsockname()[1]
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    return f"http://{host}:{port}"


def _ready(
    on_ready: Callable[[str], None] | None, settings: ServerSettings, sock: socket.socket
) -> None:
    if on_ready is not None:
        on_ready(_base_url(settings, sock))


class ThreadedServer:
    """Serves an :class:`App` on uvicorn from a background thread with its own event loop.

    ``start()`` binds the socket, enters ``resources`` on the server's loop and starts
    serving; ``stop()`` cancels every running handler, stops uvicorn and exits
    ``resources``. Both block; :meth:`astart` / :meth:`astop` run them from async code on
    any event loop (asyncio or trio). :meth:`call` / :meth:`acall` run a coroutine function
    on the server's loop (to reach state that lives there).
    """

    def __init__(
        self,
        app: App,
        settings: ServerSettings | None = None,
        *,
        resources: AbstractAsyncContextManager[object] | None = None,
    ) -> None:
        self.app = app
        self.settings = settings or ServerSettings()
        self._resources = resources
        self._stack: ExitStack | None = None
        self._portal: anyio.from_thread.BlockingPortal | None = None
        self._port: int | None = None
        self._stop: Callable[[], None] | None = None
        self._lock = threading.Lock()

    @property
    def port(self) -> int:
        """The bound port (known once started)."""
        if self._port is None:
            raise RuntimeError("the server has not started")
        return self._port

    @property
    def base_url(self) -> str:
        """``http://HOST:PORT``: the direct address (a proxy adds the root path)."""
        host = self.settings.host
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}"

    @property
    def running(self) -> bool:
        """True between start and stop."""
        return self._portal is not None

    def start(self) -> None:
        """Bind, enter the resources and start serving (blocks until requests are accepted)."""
        with self._lock:
            if self._stack is not None:
                raise RuntimeError("the server is already running")
            config = _config(self.app, self.settings, log=False)
            sock = self.settings.bind()
            with ExitStack() as stack:
                stack.callback(sock.close)
                portal = stack.enter_context(
                    anyio.from_thread.start_blocking_portal(
                        "asyncio", backend_options={"use_uvloop": self.settings.use_uvloop()}
                    )
                )
                future, _ = portal.start_task(self._run, _wakeable_server(), config, sock)
                stack.callback(future.result)
                stack.callback(portal.call, self._shutdown)
                self._port = sock.getsockname()[1]
                self._portal = portal
                self._stack = stack.pop_all()

    def stop(self) -> None:
        """Stop serving: cancel running handlers, close connections, exit the resources."""
        with self._lock:
            stack, self._stack = self._stack, None
            self._portal = None
            if stack is not None:
                stack.close()

    async def astart(self) -> None:
        """:meth:`start` from async code (in a worker thread)."""
        await anyio.to_thread.run_sync(self.start)

    async def astop(self) -> None:
        """:meth:`stop` from async code (in a worker thread, shielded from cancellation)."""
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(self.stop)

    def call(self, func: Callable[[], Awaitable[_T]]) -> _T:
        """Run ``func()`` on the server's loop and return its result (blocks)."""
        portal = self._portal
        if portal is None:
            raise RuntimeError("the server is not running")
        return portal.call(func)

    async def acall(self, func: Callable[[], Awaitable[_T]]) -> _T:
        """:meth:`call` from async code on any loop; cancelling abandons the wait."""
        return await anyio.to_thread.run_sync(self.call, func, abandon_on_cancel=True)

    async def _run(
        self,
        server_class: type[Any],
        config: Any,
        sock: socket.socket,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        server = server_class(config)
        self._stop = server.wake
        if self._resources is not None:
            async with self._resources:
                task_status.started()
                await server.serve(sockets=[sock])
        else:
            task_status.started()
            await server.serve(sockets=[sock])

    async def _shutdown(self) -> None:
        self.app.cancel_requests()
        if self._stop is not None:
            self._stop()


def _wakeable_server() -> type[Any]:
    """uvicorn's Server, its main loop woken at once by :meth:`wake` (not a 0.1 s poll)."""
    uvicorn = _uvicorn()

    class WakeableServer(uvicorn.Server):  # type: ignore[misc, name-defined]
        def __init__(self, config: Any) -> None:
            super().__init__(config)
            self.woken: anyio.Event | None = None

        def wake(self) -> None:
            """Ask the server to stop (call on its loop)."""
            self.should_exit = True
            if self.woken is not None:
                self.woken.set()

        async def main_loop(self) -> None:
            self.woken = anyio.Event()
            counter = 0
            while not await self.on_tick(counter):
                with anyio.move_on_after(1.0):
                    await self.woken.wait()
                counter += 10

    return WakeableServer
