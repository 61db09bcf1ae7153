"""The ASGI application: requests, the response writer, disconnect cancellation, routing."""

from __future__ import annotations

import json
import logging
import traceback
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel

from ..errors import ConfigurationError, redact
from ._wire import bearer_key_matches, dumps, error_body

if TYPE_CHECKING:
    import asyncio

__all__ = [
    "App",
    "ConnectionTracker",
    "Handler",
    "Receive",
    "Request",
    "ResponseWriter",
    "Router",
    "Scope",
    "Send",
]

logger = logging.getLogger("swiftclient.asgi")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


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
        "error_shape",
        "headers",
        "head_only",
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
        self.head_only = False
        """Answering ``HEAD``: whole responses keep their headers (``Content-Length``
        included) and send no body."""
        self.error_shape: Callable[[int, str], Any] | None = None
        """The error body of this route's API for a status and a message (None: OpenAI's,
        :func:`error_body`); the 500 of a handler that failed is written with it too."""

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
        content = b"" if self.head_only else body
        await self._send({"type": "http.response.body", "body": content, "more_body": False})

    async def send_json(
        self, status: int, obj: Any, headers: Mapping[str, str] | None = None
    ) -> None:
        """Send ``obj`` as a compact JSON body (``content-type: application/json``)."""
        await self.send(status, dumps(obj), {"content-type": "application/json", **(headers or {})})

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
        """Send a JSON error: OpenAI's shape (see :func:`error_body`), or the route's own
        (:attr:`error_shape`)."""
        shape = self.error_shape
        if shape is not None:
            await self.send_json(status, shape(status, message), headers)
            return
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
    A trailing slash is ignored. ``HEAD`` on a ``GET`` route runs the ``GET`` handler and
    sends its headers without the body.
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
        head = request.method == "HEAD" and method == "GET"
        if request.method != method and not head:
            allow = "GET, HEAD" if method == "GET" else method
            await writer.send_error(
                405,
                f"Use {method} for {path}.",
                code="method_not_allowed",
                headers={"allow": allow},
            )
        elif path not in self.public and not self.authorized(request):
            await writer.send_error(
                401,
                "Incorrect or missing API key.",
                code="invalid_api_key",
                headers={"www-authenticate": "Bearer"},
            )
        else:
            writer.head_only = head
            await handler(request, writer)
