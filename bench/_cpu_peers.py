"""The three clients of the CPU benchmark, each over an in-process mock transport.

Every peer answers one question per call: run one non-streamed request (``mode="request"``)
or one whole stream (``mode="stream"``) and return how many chunks it parsed. The mock
transports hand every peer the same bytes (see ``_canned``); only the client differs.

- ``swiftclient``: ``AsyncClient.chat(..., stream=False)`` / ``AsyncClient.stream`` over
  ``HTTPBackend(transport=httpx.MockTransport(...))``.
- ``openai``: the official SDK (3.x, built on ``httpx2``) with
  ``http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(...))``, ``max_retries=0``.
- ``raw httpx``: ``httpx.AsyncClient`` + ``json.loads`` (``aiter_lines`` for streams), the
  floor a hand-written client would reach on the same transport.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any, Literal, Protocol

import httpx
import httpx2
import openai
from _canned import (
    COMPLETION_BODY,
    MESSAGES,
    MODEL,
    SSE_EVENTS,
    completion_headers,
    stream_headers,
)

from swiftclient import AsyncClient, HTTPBackend

__all__ = ["Mode", "Peer", "make_peers"]

Mode = Literal["request", "stream"]
BASE_URL = "http://bench.invalid/v1"
API_KEY = "sk-bench-not-a-real-key"


class Peer(Protocol):
    """One client under test."""

    name: str

    async def run(self) -> int:
        """Make one call and return the number of chunks parsed (1 for a request)."""
        ...

    async def aclose(self) -> None:
        """Release the client."""
        ...


# --------------------------------------------------------------------- mock transports


class _Events(httpx.AsyncByteStream):
    async def __aiter__(self) -> AsyncIterator[bytes]:
        for event in SSE_EVENTS:
            yield event


class _Events2(httpx2.AsyncByteStream):
    async def __aiter__(self) -> AsyncIterator[bytes]:
        for event in SSE_EVENTS:
            yield event


def _httpx_transport(mode: Mode) -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        if mode == "request":
            return httpx.Response(200, headers=completion_headers(), content=COMPLETION_BODY)
        return httpx.Response(200, headers=stream_headers(), stream=_Events())

    return httpx.MockTransport(handler)


def _httpx2_transport(mode: Mode) -> httpx2.MockTransport:
    def handler(request: httpx2.Request) -> httpx2.Response:
        if mode == "request":
            return httpx2.Response(200, headers=completion_headers(), content=COMPLETION_BODY)
        return httpx2.Response(200, headers=stream_headers(), stream=_Events2())

    return httpx2.MockTransport(handler)


# --------------------------------------------------------------------- peers


class SwiftPeer:
    """swiftclient over ``HTTPBackend(transport=httpx.MockTransport(...))``, or over the
    ``backend`` given (the real-socket benchmark passes a default ``HTTPBackend``)."""

    name = "swiftclient"

    def __init__(self, mode: Mode, backend: HTTPBackend | None = None) -> None:
        if backend is None:
            backend = HTTPBackend(BASE_URL, API_KEY, transport=_httpx_transport(mode))
        self._client = AsyncClient(backend, model=MODEL)
        self._mode = mode

    async def run(self) -> int:
        """One ``chat(stream=False)`` or one fully iterated ``stream()``."""
        if self._mode == "request":
            await self._client.chat(MESSAGES, stream=False)
            return 1
        count = 0
        async with self._client.stream(MESSAGES) as stream:
            async for _ in stream:
                count += 1
        return count

    async def aclose(self) -> None:
        """Close the client."""
        await self._client.aclose()


class OpenAIPeer:
    """The official ``openai`` SDK over ``httpx2.MockTransport``, or with its default http
    client against ``base_url`` when one is given."""

    name = "openai"

    def __init__(self, mode: Mode, base_url: str | None = None) -> None:
        if base_url is None:
            self._http: httpx2.AsyncClient | None = httpx2.AsyncClient(
                transport=_httpx2_transport(mode)
            )
            self._client = openai.AsyncOpenAI(
                api_key=API_KEY, base_url=BASE_URL, http_client=self._http, max_retries=0
            )
        else:
            self._http = None
            self._client = openai.AsyncOpenAI(api_key=API_KEY, base_url=base_url, max_retries=0)
        self._mode = mode

    async def run(self) -> int:
        """One ``chat.completions.create`` call, streamed or not."""
        messages: Any = MESSAGES
        if self._mode == "request":
            await self._client.chat.completions.create(model=MODEL, messages=messages)
            return 1
        count = 0
        stream = await self._client.chat.completions.create(
            model=MODEL, messages=messages, stream=True, stream_options={"include_usage": True}
        )
        async with stream:
            async for _ in stream:
                count += 1
        return count

    async def aclose(self) -> None:
        """Close the SDK client and its http client."""
        await self._client.close()
        if self._http is not None:
            await self._http.aclose()


class RawHttpxPeer:
    """Hand-written ``httpx`` + ``json.loads``: the floor for this transport (a real
    ``httpx.AsyncClient`` against ``base_url`` when one is given)."""

    name = "raw httpx"

    def __init__(self, mode: Mode, base_url: str | None = None) -> None:
        self._http = httpx.AsyncClient(
            transport=_httpx_transport(mode) if base_url is None else None,
            headers={"authorization": f"Bearer {API_KEY}"},
        )
        self._mode = mode
        self._url = f"{base_url or BASE_URL}/chat/completions"

    async def run(self) -> int:
        """One POST; the body, or every ``data:`` line of the stream, goes to ``json.loads``."""
        if self._mode == "request":
            response = await self._http.post(self._url, json={"model": MODEL, "messages": MESSAGES})
            response.raise_for_status()
            json.loads(response.content)
            return 1
        body = {
            "model": MODEL,
            "messages": MESSAGES,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        count = 0
        async with self._http.stream("POST", self._url, json=body) as response:
            response.raise_for_status()
            async for line in response.aiter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    json.loads(line[6:])
                    count += 1
        return count

    async def aclose(self) -> None:
        """Close the http client."""
        await self._http.aclose()


def make_peers(mode: Mode) -> list[Peer]:
    """swiftclient, openai and raw httpx, in that order, each for ``mode``."""
    return [SwiftPeer(mode), OpenAIPeer(mode), RawHttpxPeer(mode)]
