"""Transports for plain ``httpx``, for SDKs and frameworks that still take an
``httpx.AsyncClient`` / ``httpx.Client`` (openai-python before 3.x, LangChain's
``http_async_client``, LiteLLM)."""

from __future__ import annotations

import httpx

from .._client import AsyncClient
from .._sync import Client
from ._bridge import async_client, body_classes, handle, handle_async, sync_client

__all__ = ["AsyncHttpxTransport", "HttpxTransport"]

_ASYNC_BODY, _SYNC_BODY = body_classes(httpx)


class AsyncHttpxTransport(httpx.AsyncBaseTransport):
    """:class:`~swiftclient.transports.AsyncTransport` for ``httpx``:
    ``httpx.AsyncClient(transport=AsyncHttpxTransport(client))``."""

    def __init__(self, client: AsyncClient) -> None:
        self.client = async_client(client, "AsyncHttpxTransport")

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Answer one request through the client."""
        response: httpx.Response = await handle_async(self.client, request, httpx, _ASYNC_BODY)
        return response


class HttpxTransport(httpx.BaseTransport):
    """:class:`~swiftclient.transports.Transport` for ``httpx``:
    ``httpx.Client(transport=HttpxTransport(client))`` over a blocking
    :class:`~swiftclient.Client`."""

    def __init__(self, client: Client) -> None:
        self.client = sync_client(client, "HttpxTransport")

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        """Answer one request through the client (safe from many threads at once)."""
        response: httpx.Response = handle(self.client, request, httpx, _SYNC_BODY)
        return response
