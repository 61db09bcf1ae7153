"""Shared client-test helpers (unit tests only): a scripted httpx MockTransport that speaks
the OpenAI streaming format and a client over it, the zero-backoff retry policies, clients
over one :class:`FakeProvider` per target, a gated in-test backend, a recording observer
and a three-turn tool loop.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx

from swiftclient import (
    AssistantMessage,
    AsyncClient,
    ChatCompletion,
    ChatCompletionChunk,
    ChatRequest,
    HTTPBackend,
    RetryPolicy,
)
from swiftclient.extend import AttemptRun, Deadline, RequestOptions
from swiftclient.testing import FakeProvider, Reply

KEY = "sk-test-SECRETSECRETSECRET"
"""The API key of :func:`mock_client` (tests check that it never shows in errors)."""
FAST_RETRY = RetryPolicy(max_attempts=3, initial_backoff=0.0, max_backoff=0.0)
"""Three tries, no backoff."""
NO_RETRY = RetryPolicy.none()
HELD = Reply(stall_after=0)
"""A FakeProvider reply: headers sent, then nothing until the client leaves."""


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


def mock_client(
    script: Script,
    *,
    api_key: str | None = KEY,
    retry: RetryPolicy | None = FAST_RETRY,
    backend: Mapping[str, Any] | None = None,
    **options: Any,
) -> AsyncClient:
    """A client for model ``m`` over ``script`` (backend ``mock`` at ``http://mock/v1``;
    ``backend``: more :class:`HTTPBackend` options; ``retry=None``: the client's default;
    ``options``: more :class:`AsyncClient` options)."""
    http = HTTPBackend(
        "http://mock/v1", api_key, name="mock", transport=script.transport(), **(backend or {})
    )
    return AsyncClient(http, model="m", retry=retry, **options)


@asynccontextmanager
async def providers(*names: str) -> AsyncIterator[dict[str, FakeProvider]]:
    """One FakeProvider per target name, each answering its own name as text by default."""
    fakes: dict[str, FakeProvider] = {}
    async with AsyncExitStack() as stack:
        for name in names:
            fakes[name] = await stack.enter_async_context(
                FakeProvider(Reply(text=f"from {name}"), model=name)
            )
        yield fakes


TRANSPORTS = ("aiohttp", "httpx")
"""The transports :func:`client_for` can put under its backends (the ``transport`` fixture
picks one per test; aiohttp runs on asyncio only)."""
transport_in_use = "default"
"""What :func:`client_for` uses: ``default`` (the backend's own choice: aiohttp on asyncio,
httpx on trio), or one of :data:`TRANSPORTS`, set by the ``transport`` fixture."""


def client_for(fakes: dict[str, FakeProvider], **kwargs: Any) -> AsyncClient:
    """A client with one backend per fake, named as the fake (no retries unless given), over
    the transport the ``transport`` fixture chose (:data:`transport_in_use`)."""
    forced = transport_in_use == "httpx"
    backends = {
        name: HTTPBackend(
            fake.base_url, name=name, transport=httpx.AsyncHTTPTransport() if forced else None
        )
        for name, fake in fakes.items()
    }
    kwargs.setdefault("retry", NO_RETRY)
    return AsyncClient(backends=backends, **kwargs)


def _text_chunk(text: str, model: str) -> ChatCompletionChunk:
    return ChatCompletionChunk.model_validate(
        {
            "id": "c",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": model,
            "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}],
        }
    )


class Gated:
    """A backend whose replies wait for ``gate``; counts streams opened and closed."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.gate = anyio.Event()
        self.opened = anyio.Event()
        self.open = 0
        self.closed = 0

    @asynccontextmanager
    async def stream(
        self, request: ChatRequest, deadline: Deadline, options: RequestOptions | None = None
    ) -> AsyncIterator[AsyncIterator[ChatCompletionChunk]]:
        self.open += 1
        self.opened.set()
        try:
            yield self._chunks(request.model)
        finally:
            self.closed += 1

    async def _chunks(self, model: str) -> AsyncIterator[ChatCompletionChunk]:
        await self.gate.wait()
        yield _text_chunk(f"{self.name} one", model)
        yield _text_chunk(" two", model)

    async def complete(
        self, request: ChatRequest, deadline: Deadline, options: RequestOptions | None = None
    ) -> ChatCompletion:
        raise NotImplementedError

    async def aclose(self) -> None:
        pass


class Recorder:
    """An AttemptObserver that writes down every event."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []

    def _add(self, event: str, attempt: AttemptRun) -> None:
        self.events.append((event, attempt.target.backend.name, attempt.outcome))

    def on_start(self, attempt: AttemptRun) -> None:
        self._add("start", attempt)

    def on_first_token(self, attempt: AttemptRun) -> None:
        self._add("first_token", attempt)

    def on_commit(self, attempt: AttemptRun) -> None:
        self._add("commit", attempt)

    def on_end(self, attempt: AttemptRun) -> None:
        self._add("end", attempt)


def _weather(city: str) -> dict[str, Any]:
    return {"city": city, "celsius": 21.5}


def _add(a: int, b: int) -> dict[str, Any]:
    return {"sum": a + b}


_TOOLS: dict[str, Callable[..., dict[str, Any]]] = {"get_weather": _weather, "add": _add}
_TOOL_SCHEMAS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": list(properties),
            },
        },
    }
    for name, properties in [
        ("get_weather", {"city": {"type": "string"}}),
        ("add", {"a": {"type": "number"}, "b": {"type": "number"}}),
    ]
]


TOOL_LOOP_ANSWER = "It is 21.5 degrees in Paris."


async def tool_loop(client: AsyncClient, *, stream: bool, **params: Any) -> list[ChatCompletion]:
    """Three turns of the usual agent loop (a weather call, an add call, an answer), each
    reply appended to the conversation as it came out; returns the three completions."""
    messages: list[AssistantMessage | dict[str, Any]] = [
        {"role": "user", "content": "How warm is Paris, plus 1.5?"}
    ]
    completions = []
    for _ in range(3):
        completion = await client.chat(messages, tools=_TOOL_SCHEMAS, stream=stream, **params)
        completions.append(completion)
        messages.append(completion.choices[0].message)
        for call in completion.tool_calls:
            result = _TOOLS[call.function.name](**json.loads(call.function.arguments))
            messages.append(
                {"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)}
            )
    names = [[c.function.name for c in completion.tool_calls] for completion in completions]
    assert names == [["get_weather"], ["add"], []]
    assert completions[-1].text == TOOL_LOOP_ANSWER
    return completions


async def settle(fake: Any, requests: int, limit: float = 30.0) -> None:
    """Wait until ``fake`` (a FakeProvider) has received ``requests`` requests and answered
    or dropped all of them. The fake serves on its own thread, so a request the client
    already gave up on may reach it only after the call returned: the fake checks both
    together on its own loop (checked apart, a request could arrive between the two looks
    and be counted while its answer was still being cancelled). ``limit`` bounds the wait
    (never a speed assertion)."""
    with anyio.fail_after(limit):
        await fake.wait_until_idle(after=requests)
