"""A small HTTP/1.1 server on anyio TCP listeners, so it runs on asyncio and on trio.

It serves the loopback fake provider (:mod:`swiftclient.testing`) and the local engine's
OpenAI-compatible endpoint. What it does:

- persistent connections: many requests per connection until either side says
  ``Connection: close`` (HTTP/1.0 clients keep a connection only with ``keep-alive``);
- request bodies framed by ``Content-Length``. A ``Transfer-Encoding`` request body is
  refused with 411 (send ``Content-Length``); limits answer 413 (body) and 431 (head),
  a malformed request 400, each with an OpenAI-style JSON error body;
- responses with ``Content-Length`` (:meth:`ResponseWriter.send`) or streamed with chunked
  transfer encoding (:meth:`ResponseWriter.start_stream`), one socket write per call;
- a handler that raises gets a 500 JSON error (or, mid-stream, a dropped connection) and the
  server keeps serving; the failure is logged with secrets redacted;
- while a handler runs, a watcher reads the socket: when the client goes away the handler is
  cancelled, so its cleanup (aborting an engine request, say) runs at once. A write to a
  client that went away cancels the handler the same way. (A client that half-closes its
  side after sending a request counts as gone.)

Leaving ``async with HTTPServer(...)`` cancels every handler and closes every connection.
:func:`run_in_thread` serves from a background event loop for synchronous code.
"""

from __future__ import annotations

import json
import logging
import re
import traceback
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import AbstractAsyncContextManager, AbstractContextManager, contextmanager
from dataclasses import dataclass
from http import HTTPStatus
from types import TracebackType
from typing import Any, TypeVar

import anyio
import anyio.abc
import anyio.lowlevel
from anyio.from_thread import start_blocking_portal

from .errors import ConfigurationError, redact

__all__ = [
    "HTTPRequest",
    "HTTPServer",
    "Handler",
    "ResponseWriter",
    "error_body",
    "run_in_thread",
    "serve_in_thread",
]

logger = logging.getLogger("swiftclient.httpserver")

_T = TypeVar("_T")
_READ_SIZE = 65536
_LINGER_SECONDS = 2.0
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_BAD_TARGET = re.compile(rb"[\x00-\x20\x7f]")
_DIGITS = re.compile(r"[0-9]{1,19}")
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_SERVER_SET = frozenset({"content-length", "transfer-encoding", "connection"})
_GONE = (
    anyio.EndOfStream,
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
    OSError,
)
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


@dataclass(frozen=True, slots=True)
class HTTPRequest:
    """One parsed request. ``path`` is as sent (still percent-encoded), without the query."""

    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        """Parse the body as JSON; raises ``ValueError`` when it is not JSON."""
        return json.loads(self.body)


class _ProtocolError(Exception):
    """The request cannot be served; answer ``status`` and close the connection."""

    def __init__(self, status: int, message: str, code: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code


class _IdleTimeout(Exception):
    """The client sent nothing for ``keepalive_timeout`` seconds."""


class _Connection:
    """One accepted socket and the bytes read from it but not yet parsed."""

    __slots__ = ("buffer", "gone", "stream")

    def __init__(self, stream: anyio.abc.SocketStream) -> None:
        self.stream = stream
        self.buffer = bytearray()
        self.gone = False


_IDLE, _STREAMING, _DONE, _ABORTED = range(4)


class ResponseWriter:
    """Writes one response: whole (:meth:`send`) or streamed (:meth:`start_stream`).

    A write to a client that went away cancels the running handler (it sees a cancellation,
    like when the watcher notices the disconnect first).
    """

    __slots__ = ("_chunked", "_conn", "_keep_alive", "_scope", "_state", "status")

    def __init__(self, conn: _Connection, *, keep_alive: bool, http10: bool) -> None:
        self._conn = conn
        self._keep_alive = keep_alive
        self._chunked = not http10
        self._scope: anyio.CancelScope | None = None
        self._state = _IDLE
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
    def aborted(self) -> bool:
        """True after :meth:`abort`."""
        return self._state == _ABORTED

    @property
    def keep_alive(self) -> bool:
        """Whether the connection stays open for another request after this response."""
        return self._keep_alive

    async def send(
        self, status: int, body: bytes, headers: Mapping[str, str] | None = None
    ) -> None:
        """Send a whole response with ``Content-Length``."""
        head = self._head(status, headers, len(body))
        self._state = _DONE
        if len(body) > _READ_SIZE:
            await self._send(head)
            await self._send(body)
        else:
            await self._send(head + body)

    async def send_json(
        self, status: int, obj: Any, headers: Mapping[str, str] | None = None
    ) -> None:
        """Send ``obj`` as a compact JSON body (``content-type: application/json``)."""
        body = json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()
        await self.send(status, body, _with_default(headers, "content-type", "application/json"))

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
        body = error_body(status, message, type=type, code=code, param=param)
        await self.send_json(status, body, headers)

    async def start_stream(self, status: int, headers: Mapping[str, str] | None = None) -> None:
        """Send the status line and headers of a streamed (chunked) response.

        ``content-type`` defaults to ``text/event-stream``.
        """
        if not self._chunked:  # an HTTP/1.0 client: the body ends when the connection does
            self._keep_alive = False
        head = self._head(status, _with_default(headers, "content-type", "text/event-stream"), None)
        self._state = _STREAMING
        await self._send(head)

    async def write(self, data: bytes) -> None:
        """Send ``data`` as one chunk of a streamed response (empty data sends nothing)."""
        if self._state != _STREAMING:
            raise RuntimeError("write() needs start_stream() first and no end() or abort()")
        if data:
            await self._send(b"%x\r\n%b\r\n" % (len(data), data) if self._chunked else data)

    async def end(self) -> None:
        """Finish a streamed response."""
        if self._state != _STREAMING:
            raise RuntimeError("end() needs a started, unfinished stream")
        self._state = _DONE
        if self._chunked:
            await self._send(b"0\r\n\r\n")

    async def abort(self) -> None:
        """Drop the connection now, mid-response or before it (for fault injection)."""
        if self._state == _ABORTED:
            return
        self._state = _ABORTED
        self._keep_alive = False
        await anyio.aclose_forcefully(self._conn.stream)

    def _head(self, status: int, headers: Mapping[str, str] | None, length: int | None) -> bytes:
        if self._state != _IDLE:
            raise RuntimeError("the response has already been started")
        if not 100 <= status <= 999:
            raise ValueError(f"invalid HTTP status {status!r}")
        self.status = status
        try:
            reason = HTTPStatus(status).phrase
        except ValueError:
            reason = ""
        lines = [f"HTTP/1.1 {status} {reason}\r\n"]
        for name, value in (headers or {}).items():
            if "\r" in name or "\n" in name or "\r" in value or "\n" in value or ":" in name:
                raise ValueError(f"invalid response header {name!r}")
            lname = name.lower()
            if lname == "connection":
                if "close" in value.lower():
                    self._keep_alive = False
            elif lname in _SERVER_SET:
                raise ValueError(f"the server sets {name!r} itself")
            else:
                lines.append(f"{name}: {value}\r\n")
        if length is not None:
            lines.append(f"content-length: {length}\r\n")
        elif self._chunked:
            lines.append("transfer-encoding: chunked\r\n")
        if not self._keep_alive:
            lines.append("connection: close\r\n")
        elif not self._chunked:
            lines.append("connection: keep-alive\r\n")
        lines.append("\r\n")
        return "".join(lines).encode("latin-1")

    async def _send(self, data: bytes) -> None:
        if self._state == _ABORTED:
            raise RuntimeError("the response was aborted")
        try:
            await self._conn.stream.send(data)
        except _GONE:
            self._conn.gone = True
            self._keep_alive = False
            if self._scope is not None:
                self._scope.cancel()
                await anyio.lowlevel.checkpoint()
            raise


def _with_default(headers: Mapping[str, str] | None, name: str, value: str) -> dict[str, str]:
    merged = dict(headers or {})
    if not any(key.lower() == name for key in merged):
        merged[name] = value
    return merged


Handler = Callable[[HTTPRequest, ResponseWriter], Awaitable[None]]
"""Serves one request: read the :class:`HTTPRequest`, answer through the :class:`ResponseWriter`."""


def _parse_head(head: bytes) -> tuple[str, str, str, bool, dict[str, str]]:
    """Parse a request head into (method, path, query, is_http10, headers)."""
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not _TOKEN.fullmatch(parts[0]):
        raise _ProtocolError(400, "Malformed request line.", "bad_request")
    method, target, version = parts
    if version not in (b"HTTP/1.1", b"HTTP/1.0"):
        if version.startswith(b"HTTP/"):
            raise _ProtocolError(505, "HTTP version not supported.", "http_version_not_supported")
        raise _ProtocolError(400, "Malformed request line.", "bad_request")
    if not target.startswith(b"/") or _BAD_TARGET.search(target):
        raise _ProtocolError(400, "Malformed request target.", "bad_request")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, raw = line.partition(b":")
        if not sep or not _TOKEN.fullmatch(name) or b"\r" in raw or b"\n" in raw:
            raise _ProtocolError(400, "Malformed header line.", "bad_request")
        key = name.decode("ascii").lower()
        value = raw.strip(b" \t").decode("latin-1")
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    path, _, query = target.decode("latin-1").partition("?")
    return method.decode("ascii"), path, query, version == b"HTTP/1.0", headers


def _keeps_alive(headers: Mapping[str, str], http10: bool) -> bool:
    tokens = {t.strip().lower() for t in headers.get("connection", "").split(",")}
    if http10:
        return "keep-alive" in tokens
    return "close" not in tokens


class HTTPServer:
    """An HTTP/1.1 server calling ``handler`` for each request.

    ``async with HTTPServer(handler) as server:`` binds ``host:port`` (port 0 picks a free
    one), serves in a task group it owns, and on exit cancels every handler and closes every
    connection. ``keepalive_timeout`` bounds how long a connection may sit idle (or how long
    a client may pause mid-request) before it is closed.
    """

    def __init__(
        self,
        handler: Handler,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        max_body_bytes: int = 32 * 1024 * 1024,
        max_header_bytes: int = 64 * 1024,
        keepalive_timeout: float = 75.0,
    ) -> None:
        for name, value in (
            ("max_body_bytes", max_body_bytes),
            ("max_header_bytes", max_header_bytes),
            ("keepalive_timeout", keepalive_timeout),
        ):
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ConfigurationError(f"{name} must be a positive number, got {value!r}")
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ConfigurationError(f"port must be an integer in 0..65535, got {port!r}")
        self._handler = handler
        self._host = host
        self._requested_port = port
        self._max_body = max_body_bytes
        self._max_header = max_header_bytes
        self._keepalive = keepalive_timeout
        self._port: int | None = None
        self._task_group: anyio.abc.TaskGroup | None = None
        self._listener: anyio.abc.Listener[anyio.abc.SocketStream] | None = None
        self._connections: set[_Connection] = set()
        self.connections_opened = 0
        """How many TCP connections this server has accepted."""

    @property
    def port(self) -> int:
        """The bound port (known once the server has started)."""
        if self._port is None:
            raise RuntimeError("the server has not started; use `async with server:`")
        return self._port

    @property
    def base_url(self) -> str:
        """``http://HOST:PORT`` of the running server."""
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"http://{host}:{self.port}"

    @property
    def open_connections(self) -> int:
        """How many connections are open right now."""
        return len(self._connections)

    async def __aenter__(self) -> HTTPServer:
        if self._task_group is not None:
            raise RuntimeError("the server is already running")
        listener = await anyio.create_tcp_listener(
            local_host=self._host, local_port=self._requested_port
        )
        self._port = int(listener.extra(anyio.abc.SocketAttribute.local_port))
        task_group = anyio.create_task_group()
        await task_group.__aenter__()
        self._listener, self._task_group = listener, task_group
        for sub in listener.listeners:
            if not isinstance(sub, anyio.abc.SocketListener):
                raise TypeError(f"unexpected listener {sub!r}")  # pragma: no cover
            task_group.start_soon(self._accept_loop, sub, task_group)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        task_group, listener = self._task_group, self._listener
        if task_group is None or listener is None:
            return None
        self._task_group = self._listener = None
        task_group.cancel_scope.cancel()
        try:
            if isinstance(exc, anyio.get_cancelled_exc_class()):
                return await task_group.__aexit__(exc_type, exc, tb)
            await task_group.__aexit__(None, None, None)
            return None
        finally:
            with anyio.CancelScope(shield=True):
                await listener.aclose()

    async def serve_forever(
        self, *, task_status: anyio.abc.TaskStatus[str] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Serve until cancelled; ``await task_group.start(server.serve_forever)`` gives the URL."""
        async with self:
            task_status.started(self.base_url)
            await anyio.sleep_forever()

    async def _accept_loop(
        self, listener: anyio.abc.SocketListener, task_group: anyio.abc.TaskGroup
    ) -> None:
        while True:
            try:
                stream = await listener.accept()
            except anyio.ClosedResourceError:
                return
            except (anyio.BrokenResourceError, OSError) as exc:  # e.g. out of file descriptors
                logger.warning("accept failed: %r", exc)
                await anyio.sleep(0.05)
                continue
            task_group.start_soon(self._serve_connection, stream)

    async def _serve_connection(self, stream: anyio.abc.SocketStream) -> None:
        conn = _Connection(stream)
        self.connections_opened += 1
        self._connections.add(conn)
        try:
            while await self._serve_request(conn):
                pass
        except (*_GONE, _IdleTimeout):
            pass
        except Exception as exc:  # a bug here must not take the whole server down
            logger.error("connection failed:\n%s", _describe(exc))
        finally:
            self._connections.discard(conn)
            await anyio.aclose_forcefully(stream)

    async def _serve_request(self, conn: _Connection) -> bool:
        """Serve one request; return whether the connection stays open."""
        try:
            head = await self._read_head(conn)
            if head is None:
                return False
            method, path, query, http10, headers = _parse_head(head)
            body = await self._read_body(conn, headers)
        except _ProtocolError as err:
            await self._refuse(conn, err)
            return False
        request = HTTPRequest(method, path, query, headers, body)
        writer = ResponseWriter(conn, keep_alive=_keeps_alive(headers, http10), http10=http10)
        await self._dispatch(conn, request, writer)
        return writer.keep_alive and not conn.gone and not writer.aborted

    async def _receive(self, conn: _Connection) -> bytes:
        with anyio.move_on_after(self._keepalive):
            return await conn.stream.receive(_READ_SIZE)
        raise _IdleTimeout

    async def _read_head(self, conn: _Connection) -> bytes | None:
        buf = conn.buffer
        scanned = 0
        while True:
            if buf.startswith(b"\r\n"):  # stray empty lines before a request are allowed
                del buf[:2]
                scanned = 0
                continue
            end = buf.find(b"\r\n\r\n", max(0, scanned - 3))
            if end >= 0 or len(buf) > self._max_header:
                if end < 0 or end > self._max_header:
                    raise _ProtocolError(431, "Request headers too large.", "headers_too_large")
                head = bytes(buf[:end])
                del buf[: end + 4]
                return head
            scanned = len(buf)
            try:
                buf += await self._receive(conn)
            except (anyio.EndOfStream, _IdleTimeout):
                return None

    async def _read_body(self, conn: _Connection, headers: dict[str, str]) -> bytes:
        if "transfer-encoding" in headers:
            raise _ProtocolError(
                411, "Request bodies must be sent with Content-Length.", "length_required"
            )
        declared = headers.get("content-length")
        if declared is None:
            return b""
        if not _DIGITS.fullmatch(declared):
            raise _ProtocolError(400, "Invalid Content-Length.", "bad_request")
        length = int(declared)
        if length > self._max_body:
            raise _ProtocolError(
                413, f"Request body too large (limit {self._max_body} bytes).", "request_too_large"
            )
        buf = conn.buffer
        if len(buf) < length and headers.get("expect", "").lower() == "100-continue":
            await conn.stream.send(_CONTINUE)
        while len(buf) < length:
            buf += await self._receive(conn)
        body = bytes(buf[:length])
        del buf[:length]
        return body

    async def _refuse(self, conn: _Connection, err: _ProtocolError) -> None:
        """Answer an unservable request, then close gently so the client reads the answer."""
        writer = ResponseWriter(conn, keep_alive=False, http10=False)
        await writer.send_error(err.status, err.message, code=err.code)
        with anyio.move_on_after(_LINGER_SECONDS):
            try:
                await conn.stream.send_eof()
                while True:
                    await conn.stream.receive(_READ_SIZE)
            except _GONE:
                pass

    async def _dispatch(
        self, conn: _Connection, request: HTTPRequest, writer: ResponseWriter
    ) -> None:
        failure: Exception | None = None
        async with anyio.create_task_group() as task_group:
            writer._scope = task_group.cancel_scope
            task_group.start_soon(self._watch, conn, writer, task_group.cancel_scope)
            try:
                await self._handler(request, writer)
            except Exception as exc:
                failure = exc
            finally:
                task_group.cancel_scope.cancel()
        writer._scope = None
        if conn.gone or writer.aborted:
            return
        if failure is not None:
            logger.error(
                "handler failed for %s %s:\n%s", request.method, request.path, _describe(failure)
            )
        elif not writer.started:
            logger.error("handler sent no response for %s %s", request.method, request.path)
        if not writer.started:
            await writer.send_error(
                500, "The server had an error while processing your request.", code="internal_error"
            )
        elif writer.streaming:
            if failure is not None:
                await writer.abort()  # an unfinished body tells the client the stream broke
            else:
                await writer.end()

    async def _watch(
        self, conn: _Connection, writer: ResponseWriter, scope: anyio.CancelScope
    ) -> None:
        """Read ahead while a handler runs; cancel the handler when the client goes away."""
        limit = self._max_header + self._max_body
        try:
            while len(conn.buffer) < limit:
                conn.buffer += await conn.stream.receive(_READ_SIZE)
        except _GONE:
            conn.gone = True
            if not writer.aborted:
                scope.cancel()
            return
        await anyio.sleep_forever()  # a pipelining client filled the buffer: stop reading


def _describe(exc: BaseException) -> str:
    return redact("".join(traceback.format_exception(exc)))


@contextmanager
def serve_in_thread(
    server: AbstractAsyncContextManager[_T], *, backend: str = "asyncio"
) -> Iterator[_T]:
    """Run an async context manager (a server) on an event loop in a background thread.

    Yields what ``server.__aenter__`` returns; leaving the block stops it and the loop.
    """
    with (
        start_blocking_portal(backend) as portal,
        portal.wrap_async_context_manager(server) as value,
    ):
        yield value


def run_in_thread(
    handler: Handler,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    max_body_bytes: int = 32 * 1024 * 1024,
    max_header_bytes: int = 64 * 1024,
    keepalive_timeout: float = 75.0,
    backend: str = "asyncio",
) -> AbstractContextManager[HTTPServer]:
    """Serve ``handler`` from a background thread: ``with run_in_thread(h) as server:``.

    The handler runs on the background event loop (``backend``: asyncio or trio).
    """
    server = HTTPServer(
        handler,
        host=host,
        port=port,
        max_body_bytes=max_body_bytes,
        max_header_bytes=max_header_bytes,
        keepalive_timeout=keepalive_timeout,
    )
    return serve_in_thread(server, backend=backend)
