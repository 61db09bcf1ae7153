"""The four clients of the real-socket CPU benchmark, each against one loopback server.

The server (``python -m swiftclient.testing``) runs in another process, so
``time.process_time`` in this process counts the client's CPU alone: building the request,
the socket reads and writes, HTTP parsing and JSON decoding. Every peer makes the same call
(one non-streamed request, or one whole stream of ``STREAM_CHUNKS`` chunks) over a warm,
pooled keep-alive connection and returns how many chunks it parsed.

- ``swiftclient``: the default ``HTTPBackend`` (aiohttp-backed on asyncio).
- ``openai``: the official SDK with its default http client, ``max_retries=0``.
- ``raw httpx``: ``httpx.AsyncClient`` + ``json.loads`` (``aiter_lines`` for streams).
- ``raw aiohttp``: ``aiohttp.ClientSession`` + ``json.loads``, the floor on asyncio.

The first three are the in-process benchmark's peers (``_cpu_peers``) pointed at the server.
"""

from __future__ import annotations

import json

import aiohttp
from _canned import MESSAGES
from _cpu_peers import API_KEY, MODEL, Mode, OpenAIPeer, Peer, RawHttpxPeer, SwiftPeer

from swiftclient import HTTPBackend

__all__ = ["RawAiohttpPeer", "make_socket_peers"]


class RawAiohttpPeer:
    """Hand-written ``aiohttp`` + ``json.loads``: chat completions at ``base_url`` by
    default, or ``body`` (``"stream": true`` added for streams) POSTed to ``url`` with
    ``headers`` (the other wires' floors, ``_wire_peers``)."""

    name = "raw aiohttp"

    def __init__(
        self,
        mode: Mode,
        base_url: str,
        *,
        url: str | None = None,
        body: dict[str, object] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        self._mode = mode
        self._url = url or f"{base_url}/chat/completions"
        given = {"authorization": f"Bearer {API_KEY}"} if headers is None else headers
        self._headers = {**given, "content-type": "application/json"}
        if body is None:
            body = {"model": MODEL, "messages": MESSAGES}
            if mode == "stream":
                body["stream_options"] = {"include_usage": True}
        self._body = {**body, "stream": True} if mode == "stream" else body
        self._session: aiohttp.ClientSession | None = None

    async def run(self) -> int:
        """One POST; the body, or every ``data:`` line of the stream, goes to ``json.loads``."""
        if self._session is None:
            self._session = aiohttp.ClientSession()
        data = json.dumps(self._body)
        async with self._session.post(self._url, data=data, headers=self._headers) as response:
            response.raise_for_status()
            if self._mode == "request":
                json.loads(await response.read())
                return 1
            count = 0
            async for line in response.content:
                if line.startswith(b"data: "):
                    payload = line[6:].rstrip()
                    if payload != b"[DONE]":
                        json.loads(payload)
                        count += 1
            return count

    async def aclose(self) -> None:
        """Close the session."""
        if self._session is not None:
            await self._session.close()


def make_socket_peers(mode: Mode, base_url: str) -> list[Peer]:
    """swiftclient, openai, raw httpx and raw aiohttp, in that order, each for ``mode``."""
    return [
        SwiftPeer(mode, HTTPBackend(base_url, API_KEY)),
        OpenAIPeer(mode, base_url),
        RawHttpxPeer(mode, base_url),
        RawAiohttpPeer(mode, base_url),
    ]
