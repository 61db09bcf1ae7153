"""HTTPBackend: any OpenAI-compatible ``/chat/completions`` endpoint over pooled keep-alive HTTP.

One long-lived ``httpx.AsyncClient`` per backend. On asyncio its bytes travel over an
aiohttp-backed transport (much less CPU per request and chunk); on trio, or with HTTP/2,
httpx's own transport carries them. Leaving a stream early always closes its response, so
the pooled connection is returned (or discarded when unread bytes make it unusable).
"""

from __future__ import annotations

import asyncio
import functools
import socket
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import pydantic
import pydantic_core

from .. import errors
from .._deadline import Deadline
from .._sse import ServerSentEvent, SSEDecoder
from .._wire import encode_request
from ..types import ChatCompletion, ChatCompletionChunk, ChatRequest
from ._errors import map_httpx_error
from .base import RequestOptions, check_backend_name

__all__ = ["READ_EXTENSION", "HTTPBackend"]

READ_EXTENSION = "swiftclient.read"
"""Optional httpx response extension a transport may set: ``async () -> bytes`` returning the
next body bytes as received (``b""`` at the end; failures raised as httpx exceptions). It must
only be set when the body has no content-encoding. Streams then read through it instead of
httpx's iterator layers (the aiohttp transport sets it)."""

_MAX_ERROR_BODY = 1 << 20
# The chunk validator itself: the per-chunk hot path skips model_validate_json's wrapper.
_validate_chunk = ChatCompletionChunk.__pydantic_validator__.validate_json
_DRAIN_GRACE = 2.0
_USER_AGENT = "swiftclient/0.1"


def _keepalive_options() -> list[tuple[int, int, int]]:
    options = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
    for name, value in (("TCP_KEEPIDLE", 60), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 5)):
        if hasattr(socket, name):
            options.append((socket.IPPROTO_TCP, getattr(socket, name), value))
    return options


def _on_asyncio() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


@functools.lru_cache(maxsize=16)
def _fixed_timeout(connect: float, pool: float) -> httpx.Timeout:
    """One shared ``httpx.Timeout`` per (connect, pool) pair, for calls whose deadline is
    farther than both limits; a bounded cache, since callers may vary their timeouts."""
    return httpx.Timeout(connect=connect, read=None, write=connect, pool=pool)


class HTTPBackend:
    """A backend for one OpenAI-compatible HTTP API.

    Args:
        base_url: the API root, e.g. ``https://api.openai.com/v1``.
        api_key: sent as a bearer token; never logged or shown in reprs and errors.
        name: the backend's name in model strings, spans and errors.
        headers: extra headers for every request.
        max_connections: pool size (concurrent requests beyond it wait for a connection).
        keepalive_expiry: seconds an idle pooled connection is kept.
        tcp_keepalive: enable TCP keep-alive probes on every socket.
        http2: use HTTP/2 (httpx's transport; needs the ``http2`` extra).
        transport: an explicit httpx transport (tests, proxies); overrides the choice above.
        stream_usage: ask for a final usage chunk on streams (``stream_options.include_usage``).
    """

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        *,
        name: str = "http",
        headers: Mapping[str, str] | None = None,
        max_connections: int = 100,
        keepalive_expiry: float | None = 30.0,
        tcp_keepalive: bool = True,
        http2: bool = False,
        transport: httpx.AsyncBaseTransport | None = None,
        stream_usage: bool = True,
    ) -> None:
        if not base_url or "://" not in base_url:
            raise errors.ConfigurationError("base_url must be an absolute http(s) URL")
        if "@" in base_url.split("://", 1)[1].split("/", 1)[0]:
            raise errors.ConfigurationError(
                "base_url must not carry credentials (user:password@host): pass api_key= instead"
            )
        if max_connections < 1:
            raise errors.ConfigurationError("max_connections must be at least 1")
        check_backend_name(name)
        self.name = name
        self.base_url = base_url.rstrip("/")
        self._api_key = api_key
        self._headers = {
            "user-agent": _USER_AGENT,
            "accept": "application/json",
            "content-type": "application/json",
        }
        if headers:
            self._headers.update({k.lower(): v for k, v in headers.items()})
        if api_key:
            self._headers["authorization"] = f"Bearer {api_key}"
        self._max_connections = max_connections
        self._keepalive_expiry = keepalive_expiry
        self._tcp_keepalive = tcp_keepalive
        self._http2 = http2
        self._transport = transport
        self._stream_usage = stream_usage
        self._client: httpx.AsyncClient | None = None
        self._url = f"{self.base_url}/chat/completions"
        self._parsed_url: httpx.URL | None = None  # parsed once, on the first request

    def __repr__(self) -> str:
        shown = self.base_url.split("?", 1)[0]  # a query string may carry a key
        return f"HTTPBackend(name={self.name!r}, base_url={shown!r})"

    # ------------------------------------------------------------------ connection pool

    def _make_transport(self) -> httpx.AsyncBaseTransport:
        if self._transport is not None:
            return self._transport
        socket_options = _keepalive_options() if self._tcp_keepalive else None
        if not self._http2 and _on_asyncio():
            from ._aiohttp import AiohttpTransport

            def factory(addr_info: Any) -> socket.socket:
                family, type_, proto, _, _ = addr_info
                sock = socket.socket(family=family, type=type_, proto=proto)
                for level, option, value in socket_options or ():
                    sock.setsockopt(level, option, value)
                return sock

            return AiohttpTransport(
                max_connections=self._max_connections,
                keepalive_expiry=self._keepalive_expiry,
                socket_factory=factory if socket_options else None,
            )
        if self._http2:
            try:
                import h2  # noqa: F401
            except ImportError as exc:
                raise errors.ConfigurationError(
                    "http2=True needs the 'http2' extra: pip install 'swiftclient-llm[http2]'"
                ) from exc
        return httpx.AsyncHTTPTransport(
            http2=self._http2,
            limits=httpx.Limits(
                max_connections=self._max_connections,
                max_keepalive_connections=self._max_connections,
                keepalive_expiry=self._keepalive_expiry,
            ),
            socket_options=socket_options,
        )

    def _get_client(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(
                transport=self._make_transport(), headers=self._headers, timeout=None
            )
        return self._client

    def _client_transport(self) -> httpx.AsyncBaseTransport:
        """The pooled transport requests go to directly.

        Requests are built by the ``httpx.AsyncClient`` (default headers, URL, timeouts) and
        handed straight to its transport: API calls use no redirects, auth flows, cookie jar
        or event hooks, and skipping ``AsyncClient.send`` halves the per-request CPU.
        """
        return self._get_client()._transport

    def pool_stats(self) -> dict[str, int]:
        """Connections checked out (``in_use``) and idle in the pool right now."""
        if self._client is None:
            return {"in_use": 0, "idle": 0}
        transport = self._client._transport
        stats = getattr(transport, "pool_stats", None)
        if stats is not None:
            result: dict[str, int] = stats()
            return result
        pool = getattr(transport, "_pool", None)
        connections = list(getattr(pool, "connections", []))
        idle = sum(1 for c in connections if c.is_idle())
        in_use = sum(1 for c in connections if not c.is_idle() and not c.is_closed())
        return {"in_use": in_use, "idle": idle}

    async def warmup(self, connections: int = 1) -> None:
        """Open up to ``connections`` pooled connections before the first real request.

        Sends concurrent ``GET {base_url}/models`` requests; their answers are ignored.
        """
        client = self._get_client()

        async def one() -> None:
            try:
                response = await client.get(f"{self.base_url}/models", timeout=10.0)
                await response.aclose()
            except httpx.HTTPError:
                pass

        async with anyio.create_task_group() as tg:
            for _ in range(max(1, min(connections, self._max_connections))):
                tg.start_soon(one)

    async def aclose(self) -> None:
        """Close every pooled connection."""
        client, self._client = self._client, None
        if client is not None:
            with anyio.CancelScope(shield=True):
                await client.aclose()

    # ------------------------------------------------------------------ requests

    def _request(
        self, request: ChatRequest, deadline: Deadline, options: RequestOptions | None, stream: bool
    ) -> httpx.Request:
        headers: dict[str, str] = {}
        if stream:
            headers["accept"] = "text/event-stream"
        if options is not None:
            if options.idempotency_key:
                headers["idempotency-key"] = options.idempotency_key
            headers.update(options.headers)
        body = encode_request(request, stream=stream, include_usage=self._stream_usage)
        url = self._parsed_url
        if url is None:
            url = self._parsed_url = httpx.URL(self._url)
        return self._get_client().build_request(
            "POST", url, content=body, headers=headers, timeout=self._timeout(deadline)
        )

    def _timeout(self, deadline: Deadline) -> httpx.Timeout:
        """httpx limits for one attempt: connect and pool waits, never past the deadline."""
        limits = deadline.timeout
        connect, pool = limits.connect, limits.pool
        if connect is not None and pool is not None and deadline.remaining() > max(connect, pool):
            # The deadline is farther than both limits, so they apply as they are: reuse one.
            return _fixed_timeout(connect, pool)
        return httpx.Timeout(
            connect=deadline.bound(connect),
            read=None,
            write=deadline.bound(connect),
            pool=deadline.bound(pool),
        )

    def _error(self, exc: Exception) -> errors.SwiftClientError:
        return map_httpx_error(exc, backend=self.name, secrets=(self._api_key,))

    async def _send(self, request: httpx.Request) -> httpx.Response:
        try:
            response = await self._client_transport().handle_async_request(request)
        except httpx.HTTPError as exc:
            raise self._error(exc) from exc
        if response.status_code >= 400:
            try:
                raise await self._status_error(response)
            finally:
                with anyio.CancelScope(shield=True):
                    await response.aclose()
        return response

    async def _status_error(self, response: httpx.Response) -> errors.APIStatusError:
        body_bytes = b""
        try:
            async for part in response.aiter_bytes():
                body_bytes += part
                if len(body_bytes) > _MAX_ERROR_BODY:
                    break
        except httpx.HTTPError:
            pass
        text = body_bytes.decode("utf-8", "replace")[:500]
        body, detail = _error_body(body_bytes, self._api_key, text)
        status = response.status_code
        request_id = response.headers.get("x-request-id") or response.headers.get("request-id")
        message = f"{self.name}: HTTP {status}: {detail}"
        return errors.status_error_class(status)(
            message,
            status_code=status,
            request_id=request_id,
            body=body,
            headers=dict(response.headers),
            backend=self.name,
        )

    @asynccontextmanager
    async def stream(
        self, request: ChatRequest, deadline: Deadline, options: RequestOptions | None = None
    ) -> AsyncIterator[AsyncIterator[ChatCompletionChunk]]:
        """Open a streamed completion; the connection is released when the block exits."""
        response = await self._send(self._request(request, deadline, options, stream=True))
        chunks = _ChunkStream(response, self)
        try:
            content_type = response.headers.get("content-type", "")
            if "json" in content_type and "event-stream" not in content_type:
                raise errors.APIResponseValidationError(
                    f"{self.name}: expected an event stream, got {content_type!r}",
                    backend=self.name,
                )
            yield chunks
        finally:
            with anyio.CancelScope(shield=True):
                await chunks.aclose()

    async def complete(
        self, request: ChatRequest, deadline: Deadline, options: RequestOptions | None = None
    ) -> ChatCompletion:
        """Run a non-streamed completion."""
        response = await self._send(self._request(request, deadline, options, stream=False))
        try:
            try:
                body = await response.aread()
            except httpx.HTTPError as exc:
                raise self._error(exc) from exc
        finally:
            if not response.is_closed:  # aread() closes it when the body was read whole
                with anyio.CancelScope(shield=True):
                    await response.aclose()
        try:
            return ChatCompletion.model_validate_json(body)
        except pydantic.ValidationError as exc:
            raise errors.APIResponseValidationError(
                f"{self.name}: response body is not a chat completion: {exc.error_count()} errors",
                backend=self.name,
            ) from exc


class _ChunkStream:
    """Decodes an SSE response into chunks; an explicit iterator, so closing is deterministic.

    Events are decoded as bytes arrive but validated one at a time, when asked for, so a
    reply that arrives in one burst does not keep a hundred parsed chunks alive at once.
    :meth:`next_nowait` hands out an already-received chunk without awaiting.

    The body is read with the fewest layers the response allows: the transport's own reader
    when it offers one (:data:`READ_EXTENSION`, our aiohttp transport), else the transport's
    body stream itself when there is no content-encoding to undo, else ``aiter_bytes``.
    """

    __slots__ = (
        "_backend",
        "_bytes",
        "_decoder",
        "_done",
        "_events",
        "_finished",
        "_open",
        "_read",
        "_response",
    )

    def __init__(self, response: httpx.Response, backend: HTTPBackend) -> None:
        self._response = response
        self._backend = backend
        self._bytes: AsyncIterator[bytes] | None = None
        self._read: Callable[[], Awaitable[bytes]] | None = None
        self._open = False
        self._decoder = SSEDecoder()
        self._events: deque[ServerSentEvent] = deque()
        self._done = False
        self._finished = False

    def __aiter__(self) -> _ChunkStream:
        return self

    async def __anext__(self) -> ChatCompletionChunk:
        while True:
            chunk = self.next_nowait()
            if chunk is not None:
                return chunk
            if self._done:
                if self._open and self._finished:
                    await self._drain()
                raise StopAsyncIteration
            await self._fill()

    def next_nowait(self) -> ChatCompletionChunk | None:
        """The next chunk already received, or None when the next one needs I/O (or the end)."""
        events = self._events
        while events:
            event = events.popleft()
            data = event.data
            if data == b"[DONE]":
                self._finished = True
                self._done = True
                events.clear()
                return None
            if event.event == "error":
                self._done = True
                raise _stream_error(self._backend, data)
            try:
                chunk: ChatCompletionChunk = _validate_chunk(data)
            except pydantic.ValidationError as exc:
                self._done = True
                raise errors.APIResponseValidationError(
                    f"{self._backend.name}: stream event is not a chat completion chunk",
                    backend=self._backend.name,
                ) from exc
            extra = chunk.__pydantic_extra__
            if extra and "error" in extra:
                self._done = True
                raise _stream_error(self._backend, data)
            for choice in chunk.choices:
                if choice.finish_reason is not None:
                    self._finished = True
            return chunk
        return None

    def _open_body(self) -> None:
        response = self._response
        self._open = True
        if "content-encoding" in response.headers:
            self._bytes = response.aiter_bytes()  # undoes the content-encoding
            return
        read = response.extensions.get(READ_EXTENSION)
        if read is not None:
            self._read = read
        else:
            # The transport's body stream itself (one iterator we can close, and it serves
            # bodies a mock transport already read): no httpx iterator layers in between.
            body = response.stream
            if not isinstance(body, httpx.AsyncByteStream):
                raise errors.ConfigurationError("HTTPBackend needs an async httpx transport")
            self._bytes = body.__aiter__()

    async def _next_bytes(self) -> bytes:
        """The next body bytes, ``b""`` at the end."""
        read = self._read
        if read is not None:
            return await read()
        stream = self._bytes
        if stream is None:
            return b""
        try:
            return await stream.__anext__()
        except StopAsyncIteration:
            return b""

    async def _fill(self) -> None:
        if not self._open:
            self._open_body()
        try:
            raw = await self._next_bytes()
        except (httpx.HTTPError, httpx.StreamError) as exc:
            self._done = True
            raise self._backend._error(exc) from exc
        if not raw:
            self._done = True
            self._open = False
            self._bytes = self._read = None
            if not self._finished:
                raise errors.APIConnectionError(
                    f"{self._backend.name}: stream ended before the completion finished",
                    backend=self._backend.name,
                ) from None
            return
        self._events.extend(self._decoder.feed(raw))

    async def _drain(self) -> None:
        """Read to the end of the body after ``[DONE]`` so the connection can be reused."""
        with anyio.move_on_after(_DRAIN_GRACE):
            try:
                while await self._next_bytes():
                    pass
            except (httpx.HTTPError, httpx.StreamError):
                pass
        self._open = False
        self._bytes = self._read = None

    async def aclose(self) -> None:
        self._done = True
        self._open = False
        self._events.clear()
        stream, self._bytes, self._read = self._bytes, None, None
        close = getattr(stream, "aclose", None)
        if close is not None:  # our own iterator over the body stream: close it explicitly
            await close()
        await self._response.aclose()


def _error_body(data: bytes, api_key: str | None, default: str) -> tuple[object, str]:
    """A provider error body (parsed when it is JSON) and its message, both redacted;
    ``default`` is the message when the body names none."""
    body: object
    try:
        body = pydantic_core.from_json(data)
    except ValueError:
        body = data.decode("utf-8", "replace")
    message = default
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            message = err["message"]
        elif isinstance(err, str):
            message = err
    return errors.redact_json(body, api_key), errors.redact(message, api_key)


def _stream_error(backend: HTTPBackend, data: bytes) -> errors.StreamError:
    body, message = _error_body(data, backend._api_key, "error event in stream")
    return errors.StreamError(f"{backend.name}: {message}", body=body, backend=backend.name)
