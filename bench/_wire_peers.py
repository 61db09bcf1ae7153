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

from typing import Any, Literal

import anthropic
import openai
from _canned import MESSAGES, MODEL
from _cpu_peers import API_KEY, Mode, Peer, SwiftPeer
from _socket_peers import RawAiohttpPeer

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


class _SDKPeer:
    """A vendor SDK: one create call, streamed (``stream=True``, iterated event by event)
    or not; with ``helper``, streams go through the SDK's accumulating stream helper."""

    name = ""

    def __init__(self, mode: Mode, client: Any, helper: bool = False) -> None:
        self._client = client
        self._mode = mode
        self._helper = helper

    async def _create(self, **options: Any) -> Any:
        raise NotImplementedError

    def _stream_helper(self) -> Any:
        raise NotImplementedError

    async def run(self) -> int:
        """One call; a stream's events are counted."""
        if self._mode == "request":
            await self._create()
            return 1
        count = 0
        if self._helper:
            async with self._stream_helper() as stream:
                async for _ in stream:
                    count += 1
            return count
        stream = await self._create(stream=True)
        async with stream:
            async for _ in stream:
                count += 1
        return count

    async def aclose(self) -> None:
        """Close the SDK client."""
        await self._client.close()


class AnthropicSDKPeer(_SDKPeer):
    """The official ``anthropic`` SDK, default http client, ``max_retries=0``:
    ``messages.create``, or (``helper``) the ``messages.stream`` helper, which also
    accumulates the message as swiftclient's stream does."""

    def __init__(self, mode: Mode, root: str, helper: bool = False) -> None:
        client = anthropic.AsyncAnthropic(api_key=API_KEY, base_url=root, max_retries=0)
        super().__init__(mode, client, helper)
        self.name = "anthropic SDK, messages.stream" if helper else "anthropic SDK"

    async def _create(self, **options: Any) -> Any:
        return await self._client.messages.create(
            model=MODEL, max_tokens=MAX_TOKENS, system=SYSTEM, messages=TURNS, **options
        )

    def _stream_helper(self) -> Any:
        return self._client.messages.stream(
            model=MODEL, max_tokens=MAX_TOKENS, system=SYSTEM, messages=TURNS
        )


class OpenAIResponsesPeer(_SDKPeer):
    """The official ``openai`` SDK, ``max_retries=0``: ``responses.create`` (``store=False``,
    as swiftclient sends), or (``helper``) the ``responses.stream`` helper, which also
    accumulates the response."""

    def __init__(self, mode: Mode, base_url: str, helper: bool = False) -> None:
        client = openai.AsyncOpenAI(api_key=API_KEY, base_url=base_url, max_retries=0)
        super().__init__(mode, client, helper)
        self.name = "openai SDK, responses.stream" if helper else "openai SDK"

    async def _create(self, **options: Any) -> Any:
        return await self._client.responses.create(
            model=MODEL, input=TURNS_ALL, store=False, **options
        )

    def _stream_helper(self) -> Any:
        return self._client.responses.stream(model=MODEL, input=TURNS_ALL, store=False)


def make_wire_peers(wire: Wire, mode: Mode, base_url: str) -> list[Peer]:
    """swiftclient, the vendor SDK, (streams) the SDK's accumulating stream helper, and the
    raw floor last, on ``wire`` (``base_url`` ends in ``/v1``)."""
    root = base_url.removesuffix("/v1")
    streams = mode == "stream"
    if wire == "messages":
        body = {"model": MODEL, "max_tokens": MAX_TOKENS, "system": SYSTEM, "messages": TURNS}
        headers = {"x-api-key": API_KEY, "anthropic-version": "2023-06-01"}
        helper: list[Peer] = [AnthropicSDKPeer(mode, root, helper=True)] if streams else []
        return [
            SwiftPeer(mode, AnthropicBackend(root, API_KEY)),
            AnthropicSDKPeer(mode, root),
            *helper,
            RawAiohttpPeer(mode, base_url, url=f"{base_url}/messages", body=body, headers=headers),
        ]
    body = {"model": MODEL, "input": TURNS_ALL, "store": False}
    helper = [OpenAIResponsesPeer(mode, base_url, helper=True)] if streams else []
    return [
        SwiftPeer(mode, ResponsesBackend(base_url, API_KEY)),
        OpenAIResponsesPeer(mode, base_url),
        *helper,
        RawAiohttpPeer(mode, base_url, url=f"{base_url}/responses", body=body),
    ]
