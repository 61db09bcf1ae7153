"""The peers of the other-wires benchmark: each wire's swiftclient backend against the
vendor's official SDK, over real loopback sockets to ``python -m swiftclient.testing``.

- Messages (``/v1/messages``): ``AnthropicBackend`` against ``anthropic.AsyncAnthropic``
  (``messages.create``, and ``messages.create(stream=True)`` iterated event by event: the
  SDK's leanest stream, without its accumulating helper).
- Responses (``/v1/responses``): ``ResponsesBackend`` against ``openai.AsyncOpenAI``'s
  ``responses.create`` (streamed: iterated event by event).
- For streams, also each SDK's accumulating helper (``messages.stream`` /
  ``responses.stream``), which, like swiftclient's stream, builds the whole message too.
- Each wire's floor: ``aiohttp`` + ``json.loads`` of the body or of every ``data:`` line.

Every peer makes the same call over a warm keep-alive connection: one non-streamed request,
or one whole stream of the fake's ``tokens`` content deltas. ``run()`` returns what it
parsed (chunks, events or lines), a sanity count: per-chunk CPU is a stream's CPU over its
content deltas, the same denominator for every peer.
"""

from __future__ import annotations

import json
from typing import Any, Literal

import aiohttp
import anthropic
import openai
from _canned import MESSAGES, MODEL
from _cpu_peers import API_KEY, Mode, Peer, SwiftPeer

from swiftclient import AnthropicBackend, ResponsesBackend

__all__ = ["WIRES", "Wire", "make_wire_peers"]

Wire = Literal["messages", "responses"]
WIRES: dict[Wire, str] = {
    "messages": "Anthropic Messages (anthropic SDK)",
    "responses": "OpenAI Responses (openai SDK responses.create)",
}
MAX_TOKENS = 4096  # AnthropicBackend's default, sent by every Messages peer
SYSTEM = str(MESSAGES[0]["content"])
TURNS: Any = MESSAGES[1:]
TURNS_ALL: Any = MESSAGES


class AnthropicSDKPeer:
    """The official ``anthropic`` SDK, default http client, ``max_retries=0``."""

    name = "anthropic SDK"

    def __init__(self, mode: Mode, root: str) -> None:
        self._client = anthropic.AsyncAnthropic(api_key=API_KEY, base_url=root, max_retries=0)
        self._mode = mode

    async def run(self) -> int:
        """One ``messages.create``, streamed or not."""
        if self._mode == "request":
            await self._client.messages.create(
                model=MODEL, max_tokens=MAX_TOKENS, system=SYSTEM, messages=TURNS
            )
            return 1
        count = 0
        stream = await self._client.messages.create(
            model=MODEL, max_tokens=MAX_TOKENS, system=SYSTEM, messages=TURNS, stream=True
        )
        async with stream:
            async for _ in stream:
                count += 1
        return count

    async def aclose(self) -> None:
        """Close the SDK client."""
        await self._client.close()


class AnthropicHelperPeer(AnthropicSDKPeer):
    """The ``anthropic`` SDK's ``messages.stream`` helper, which also accumulates the
    message as swiftclient's stream does (streams only)."""

    name = "anthropic SDK, messages.stream"

    async def run(self) -> int:
        """One ``messages.stream``, iterated event by event, then its final message."""
        count = 0
        async with self._client.messages.stream(
            model=MODEL, max_tokens=MAX_TOKENS, system=SYSTEM, messages=TURNS
        ) as stream:
            async for _ in stream:
                count += 1
            await stream.get_final_message()
        return count


class OpenAIResponsesPeer:
    """The official ``openai`` SDK's ``responses.create``, ``max_retries=0``."""

    name = "openai SDK"

    def __init__(self, mode: Mode, base_url: str) -> None:
        self._client = openai.AsyncOpenAI(api_key=API_KEY, base_url=base_url, max_retries=0)
        self._mode = mode

    async def run(self) -> int:
        """One ``responses.create``, streamed or not (``store=False``, as swiftclient sends)."""
        if self._mode == "request":
            await self._client.responses.create(model=MODEL, input=TURNS_ALL, store=False)
            return 1
        count = 0
        stream = await self._client.responses.create(
            model=MODEL, input=TURNS_ALL, store=False, stream=True
        )
        async with stream:
            async for _ in stream:
                count += 1
        return count

    async def aclose(self) -> None:
        """Close the SDK client."""
        await self._client.close()


class RawWirePeer:
    """Hand-written ``aiohttp`` + ``json.loads`` on one wire: the floor."""

    name = "raw aiohttp"

    def __init__(self, mode: Mode, url: str, body: dict[str, Any], headers: dict[str, str]):
        self._mode = mode
        self._url = url
        self._headers = {**headers, "content-type": "application/json"}
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
                    json.loads(line[6:])
                    count += 1
            return count

    async def aclose(self) -> None:
        """Close the session."""
        if self._session is not None:
            await self._session.close()


class OpenAIHelperPeer(OpenAIResponsesPeer):
    """The ``openai`` SDK's ``responses.stream`` helper, which also accumulates the
    response as swiftclient's stream does (streams only)."""

    name = "openai SDK, responses.stream"

    async def run(self) -> int:
        """One ``responses.stream``, iterated event by event, then its final response."""
        count = 0
        async with self._client.responses.stream(
            model=MODEL, input=TURNS_ALL, store=False
        ) as stream:
            async for _ in stream:
                count += 1
            await stream.get_final_response()
        return count


def make_wire_peers(wire: Wire, mode: Mode, base_url: str) -> list[Peer]:
    """swiftclient, the vendor SDK, (streams) the SDK's accumulating stream helper, and the
    raw floor last, on ``wire`` (``base_url`` ends in ``/v1``)."""
    root = base_url.removesuffix("/v1")
    streams = mode == "stream"
    if wire == "messages":
        body = {"model": MODEL, "max_tokens": MAX_TOKENS, "system": SYSTEM, "messages": TURNS}
        headers = {"x-api-key": API_KEY, "anthropic-version": "2023-06-01"}
        helper: list[Peer] = [AnthropicHelperPeer(mode, root)] if streams else []
        return [
            SwiftPeer(mode, AnthropicBackend(root, API_KEY)),
            AnthropicSDKPeer(mode, root),
            *helper,
            RawWirePeer(mode, f"{base_url}/messages", body, headers),
        ]
    body = {"model": MODEL, "input": TURNS_ALL, "store": False}
    helper = [OpenAIHelperPeer(mode, base_url)] if streams else []
    return [
        SwiftPeer(mode, ResponsesBackend(base_url, API_KEY)),
        OpenAIResponsesPeer(mode, base_url),
        *helper,
        RawWirePeer(mode, f"{base_url}/responses", body, {"authorization": f"Bearer {API_KEY}"}),
    ]
