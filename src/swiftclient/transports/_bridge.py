"""One request through the client, for any httpx-shaped library (httpx, httpx2).

The two libraries have the same request and response objects under different module
names; the functions here take the module and the body classes made for it, so the
transports of both are the same code.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterator
from typing import TYPE_CHECKING, Any

from .. import errors
from ._core import (
    SSE,
    Exchange,
    Reply,
    forwarded_headers,
    parse,
    sdk_timeout,
    sse_sync,
    stream_headers,
)

if TYPE_CHECKING:
    from .._client import AsyncClient
    from .._deadline import Timeout
    from .._sync import Client

__all__ = ["async_client", "body_classes", "handle", "handle_async", "sync_client"]


def async_client(client: object, transport: str) -> AsyncClient:
    """``client`` if it is an :class:`~swiftclient.AsyncClient`, else a clear error (an
    async transport over a blocking client would fail only at the first request)."""
    from .._client import AsyncClient

    if not isinstance(client, AsyncClient):
        hint = " (a blocking Client goes with the blocking transport)" if _is_sync(client) else ""
        raise errors.ConfigurationError(
            f"{transport} takes an AsyncClient, got {type(client).__name__}{hint}"
        )
    return client


def sync_client(client: object, transport: str) -> Client:
    """``client`` if it is a blocking :class:`~swiftclient.Client`, else a clear error."""
    if not _is_sync(client):
        hint = " (an AsyncClient goes with the async transport)" if client is not None else ""
        raise errors.ConfigurationError(
            f"{transport} takes a blocking Client, got {type(client).__name__}{hint}"
        )
    return client  # type: ignore[return-value]


def _is_sync(client: object) -> bool:
    from .._sync import Client

    return isinstance(client, Client)


def _response(module: Any, reply: Reply, request: Any) -> Any:
    return module.Response(
        reply.status, headers=reply.headers, content=reply.content, request=request
    )


def body_classes(module: Any) -> tuple[type[Any], type[Any]]:
    """The (async, sync) response body classes for ``module``: SSE bytes handed on one
    event at a time, as the client yields the chunks (nothing buffered), and the call's
    stream closed when the SDK closes the response."""

    class AsyncBody(module.AsyncByteStream):  # type: ignore[misc]
        def __init__(self, events: SSE, close: Callable[[], Awaitable[None]]) -> None:
            self._events = events
            self._close = close

        def __aiter__(self) -> AsyncIterator[bytes]:
            return self._events

        async def aclose(self) -> None:
            await self._close()

    class SyncBody(module.SyncByteStream):  # type: ignore[misc]
        def __init__(self, events: Generator[bytes], close: Callable[[], None]) -> None:
            self._events = events
            self._close = close

        def __iter__(self) -> Iterator[bytes]:
            yield from self._events

        def close(self) -> None:
            try:
                # another thread may be reading it (a "stop" button): a running generator
                # cannot be closed, and closing the stream below ends that thread's reading
                if inspect.getgeneratorstate(self._events) != inspect.GEN_RUNNING:
                    self._events.close()
            finally:
                self._close()

    return AsyncBody, SyncBody


def _call_options(base: Timeout, request: Any, wanted: Exchange) -> dict[str, Any]:
    """The call's arguments besides the messages and model: the SDK's request fields, its
    timeout (tightening the client's ``base``) and the headers that go on to the provider."""
    return {
        **wanted.params,
        "timeout": sdk_timeout(base, request.extensions, wanted.stream),
        "extra_headers": forwarded_headers(request.headers),
    }


async def handle_async(client: AsyncClient, request: Any, module: Any, body: type[Any]) -> Any:
    """Run the SDK's ``request`` through ``client``; the response the SDK reads."""
    wanted = parse(request.method, request.url.path, await request.aread())
    if isinstance(wanted, Reply):
        return _response(module, wanted, request)
    wire = wanted.wire
    options = _call_options(client.timeout, request, wanted)
    try:
        if not wanted.stream:
            completion = await client.chat(
                wanted.messages, model=wanted.model, response_model=None, **options
            )
            return _response(module, wire.completion(completion), request)
        stream = client.stream(wanted.messages, model=wanted.model, **options)
        await stream.__aenter__()  # up to the first token: a failure is still a status
    except errors.SwiftClientError as exc:
        return _response(module, wire.error(exc), request)
    return module.Response(
        200,
        headers=stream_headers(stream.timing, wire.headers),
        stream=body(SSE(stream, wire.encoder()), stream.aclose),
        request=request,
    )


def handle(client: Client, request: Any, module: Any, body: type[Any]) -> Any:
    """:func:`handle_async` for the blocking :class:`~swiftclient.Client`."""
    wanted = parse(request.method, request.url.path, request.read())
    if isinstance(wanted, Reply):
        return _response(module, wanted, request)
    wire = wanted.wire
    options = _call_options(client.aclient.timeout, request, wanted)
    try:
        if not wanted.stream:
            completion = client.chat(
                wanted.messages, model=wanted.model, response_model=None, **options
            )
            return _response(module, wire.completion(completion), request)
        stream = client.stream(wanted.messages, model=wanted.model, **options)
        stream.__enter__()
    except errors.SwiftClientError as exc:
        return _response(module, wire.error(exc), request)
    return module.Response(
        200,
        headers=stream_headers(stream.timing, wire.headers),
        stream=body(sse_sync(stream, wire.encoder()), stream.close),
        request=request,
    )
