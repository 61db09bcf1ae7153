"""Transports for ``httpx2``, the HTTP library of openai-python 3.x and
anthropic-sdk-python 1.x: ``http_client=httpx2.AsyncClient(transport=AsyncTransport(client))``."""

from __future__ import annotations

import httpx2

from .._client import AsyncClient
from .._sync import Client
from ._bridge import async_client, body_classes, handle, handle_async, sync_client

__all__ = ["AsyncTransport", "Transport"]

_ASYNC_BODY, _SYNC_BODY = body_classes(httpx2)


class AsyncTransport(httpx2.AsyncBaseTransport):
    """An ``httpx2`` transport that answers Chat Completions, Responses and Anthropic
    Messages requests with ``client``.

    The SDK's ``model`` is resolved by the client (backends, aliases, routes); the call runs
    with everything the client does (one deadline, retries, hedging and fallback,
    telemetry, ``local/...`` targets in-process); the answer is the JSON, the SSE stream
    (one event per chunk, as it arrives) or the error response the provider would send,
    with the answering attempt's rate-limit and request-id headers
    (:attr:`~swiftclient.types.Attempt.headers`).
    Turn the SDK's own retries off (``max_retries=0``): the client retries.
    """

    def __init__(self, client: AsyncClient) -> None:
        self.client = async_client(client, "AsyncTransport")

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        """Answer one request through the client."""
        response: httpx2.Response = await handle_async(self.client, request, httpx2, _ASYNC_BODY)
        return response


class Transport(httpx2.BaseTransport):
    """:class:`AsyncTransport` for blocking SDK clients, over a blocking
    :class:`~swiftclient.Client`: ``http_client=httpx2.Client(transport=Transport(client))``."""

    def __init__(self, client: Client) -> None:
        self.client = sync_client(client, "Transport")

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        """Answer one request through the client (safe from many threads at once)."""
        response: httpx2.Response = handle(self.client, request, httpx2, _SYNC_BODY)
        return response
