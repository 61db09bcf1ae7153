"""A scripted httpx MockTransport that speaks the OpenAI streaming format (unit tests only)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx


def sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def chunk(content: str | None = None, finish: str | None = None, **delta: Any) -> bytes:
    d: dict[str, Any] = dict(delta)
    if content is not None:
        d["content"] = content
    return sse(
        {"id": "c", "model": "m", "choices": [{"index": 0, "delta": d, "finish_reason": finish}]}
    )


def stream_body(words: list[str], usage: bool = True) -> list[bytes]:
    parts = [chunk(role="assistant")]
    parts += [chunk(w) for w in words]
    parts.append(chunk(finish="stop"))
    if usage:
        parts.append(
            sse(
                {
                    "id": "c",
                    "choices": [],
                    "usage": {
                        "prompt_tokens": 1,
                        "completion_tokens": len(words),
                        "total_tokens": 1 + len(words),
                    },
                }
            )
        )
    parts.append(b"data: [DONE]\n\n")
    return parts


class _Body(httpx.AsyncByteStream):
    def __init__(self, parts: list[bytes], stall: bool, closed: list[bool]) -> None:
        self.parts = parts
        self.stall = stall
        self.closed = closed

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for part in self.parts:
            yield part
        if self.stall:
            await anyio.Event().wait()  # never set: the client must give up

    async def aclose(self) -> None:
        self.closed.append(True)


@dataclass
class Script:
    """Per-request replies: (status, parts, headers, stall)."""

    replies: list[tuple[int, list[bytes], dict[str, str], bool]] = field(default_factory=list)
    requests: list[httpx.Request] = field(default_factory=list)
    closed: list[bool] = field(default_factory=list)
    default: Callable[[], tuple[int, list[bytes], dict[str, str], bool]] = lambda: (
        200,
        stream_body(["Hello", " world"]),
        {},
        False,
    )

    def add(
        self,
        status: int = 200,
        parts: list[bytes] | None = None,
        headers: dict[str, str] | None = None,
        stall: bool = False,
    ) -> Script:
        self.replies.append(
            (status, parts if parts is not None else stream_body(["ok"]), headers or {}, stall)
        )
        return self

    def transport(self) -> httpx.MockTransport:
        async def handler(request: httpx.Request) -> httpx.Response:
            self.requests.append(request)
            await request.aread()
            status, parts, headers, stall = self.replies.pop(0) if self.replies else self.default()
            if status >= 400:
                return httpx.Response(
                    status, headers=headers, json={"error": {"message": f"status {status}"}}
                )
            h = {"content-type": "text/event-stream", **headers}
            return httpx.Response(status, headers=h, stream=_Body(parts, stall, self.closed))

        return httpx.MockTransport(handler)


async def settle(fake: Any, requests: int, limit: float = 30.0) -> None:
    """Wait until ``fake`` (a FakeProvider) has received ``requests`` chat requests and
    answered or dropped all of them. The fake serves on its own thread, so a request the
    client already gave up on may reach it only after the call returned: waiting for idle
    alone could look before that request arrived. ``limit`` bounds the wait (never a speed
    assertion)."""
    with anyio.fail_after(limit):
        while True:
            await fake.wait_until_idle()
            if len(fake.requests) >= requests:
                return
            await anyio.sleep(0.01)
