"""Shared client-test helpers (unit tests only): a scripted reply list that speaks the OpenAI
streaming format, served by an httpx MockTransport or on a loopback socket, and a client over
it; the zero-backoff retry policies, clients over one :class:`FakeProvider` per target, a
gated in-test backend, a recording observer and a three-turn tool loop.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

import anyio
import anyio.abc
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
from swiftclient._deadline import DeadlineWatch, Waiter
from swiftclient.extend import AttemptResult, Deadline, RequestOptions
from swiftclient.testing import FakeProvider, Reply

from .rawserver import RawRequest, raw_server, send_all

KEY = "sk-test-SECRETSECRETSECRET"
"""The API key of :func:`mock_client` (tests check that it never shows in errors)."""
FAST_RETRY = RetryPolicy(max_attempts=3, initial_backoff=0.0, max_backoff=0.0)
"""Three tries, no backoff."""
NO_RETRY = RetryPolicy.none()
HELD = Reply(stall_after=0)
"""A FakeProvider reply: headers sent, then nothing until the client leaves."""
RELEASE_LIMIT = 30.0
"""Seconds to wait for a client to let go of a scripted server's connections (a bound on
cleanup, never a speed assertion)."""


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
    def __init__(self, parts: list[bytes], stall: bool, on_close: Callable[[], None]) -> None:
        self.parts = parts
        self.stall = stall
        self.on_close = on_close

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for part in self.parts:
            yield part
        if self.stall:
            await anyio.Event().wait()  # never set: the client must give up

    async def aclose(self) -> None:
        self.on_close()


@dataclass
class Script:
    """Per-request replies: (status, parts, headers, stall); ``pace``: seconds before each
    part of a served body (:meth:`serve`) after its first."""

    replies: list[tuple[int, list[bytes], dict[str, str], bool]] = field(default_factory=list)
    requests: list[httpx.Request] = field(default_factory=list)
    closed: list[bool] = field(default_factory=list)
    default: Callable[[], tuple[int, list[bytes], dict[str, str], bool]] = lambda: (
        200,
        stream_body(["Hello", " world"]),
        {},
        False,
    )
    pace: float = 0.0

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

    _closing: anyio.Event | None = None

    def _next(self) -> tuple[int, list[bytes], dict[str, str], bool]:
        return self.replies.pop(0) if self.replies else self.default()

    def _note_closed(self) -> None:
        self.closed.append(True)
        if self._closing is not None:
            self._closing.set()

    async def wait_closed(self, count: int) -> None:
        """Wait until the client has closed ``count`` streamed replies (bounded by
        :data:`RELEASE_LIMIT`: a reply the client keeps open fails the test)."""
        with anyio.fail_after(RELEASE_LIMIT):
            while len(self.closed) < count:
                self._closing = anyio.Event()
                await self._closing.wait()

    def transport(self) -> httpx.MockTransport:
        """The replies from an httpx MockTransport (no socket, httpx only)."""

        async def handler(request: httpx.Request) -> httpx.Response:
            self.requests.append(request)
            await request.aread()
            status, parts, headers, stall = self._next()
            if status >= 400:
                return httpx.Response(
                    status, headers=headers, json={"error": {"message": f"status {status}"}}
                )
            h = {"content-type": "text/event-stream", **headers}
            return httpx.Response(status, headers=h, stream=_Body(parts, stall, self._note_closed))

        return httpx.MockTransport(handler)

    @asynccontextmanager
    async def serve(self) -> AsyncIterator[str]:
        """The same replies, byte for byte, from a loopback HTTP/1.1 server on the test's
        own event loop (one request per connection, bodies chunked as the parts are), so
        any transport can read them; yields the base URL. A streamed reply counts in
        :attr:`closed` once the client has closed its connection (after the whole body,
        or mid-body: a stalled reply holds it until then); on leaving, the block waits
        (bounded by :data:`RELEASE_LIMIT`) until the client has closed every connection
        it was answered on, so a leaked response fails the test."""
        answering = 0
        idle: anyio.Event | None = None

        async def answer(raw: RawRequest, stream: anyio.abc.ByteStream) -> None:
            nonlocal answering
            answering += 1
            try:
                await self._answer(raw, stream)
            finally:
                answering -= 1
                if answering == 0 and idle is not None:
                    idle.set()

        async with raw_server(answer) as server:
            yield server.base_url
            if answering:
                idle = anyio.Event()
                with anyio.fail_after(RELEASE_LIMIT):
                    await idle.wait()

    async def _answer(self, raw: RawRequest, stream: anyio.abc.ByteStream) -> None:
        method, target, _ = raw.line.split(" ", 2)
        url = f"http://{raw.headers.get('host', 'mock')}{target}"
        self.requests.append(httpx.Request(method, url, headers=raw.headers, content=raw.body))
        status, parts, headers, stall = self._next()
        given = {name.lower(): value for name, value in headers.items()}
        if status >= 400:
            body = json.dumps({"error": {"message": f"status {status}"}}).encode()
            head = {"content-type": "application/json", **given}
            await send_all(stream, _head(status, head, len(body)) + body)
            return
        head = {"content-type": "text/event-stream", **given}
        sent = await send_all(stream, _head(status, head, None))
        for i, part in enumerate(filter(None, parts)):  # an empty chunk would end the body
            if i and self.pace:
                await anyio.sleep(self.pace)
            sent = sent and await send_all(stream, b"%x\r\n%b\r\n" % (len(part), part))
        if sent and not stall:
            await send_all(stream, b"0\r\n\r\n")
        await _until_closed(stream)
        self._note_closed()


Handler = Callable[[httpx.Request], httpx.Response | Awaitable[httpx.Response]]
"""What an httpx MockTransport takes: a request in, a response out (or awaited)."""


@asynccontextmanager
async def serve_handler(handler: Handler) -> AsyncIterator[str]:
    """``handler``'s responses on a loopback HTTP/1.1 socket (one request per connection), so
    any transport can read what a MockTransport would have returned; yields the base URL. A
    read body goes with its length, a streamed one chunked as its parts come; the handler
    sees each request as an :class:`httpx.Request`."""

    async def answer(raw: RawRequest, stream: anyio.abc.ByteStream) -> None:
        method, target, _ = raw.line.split(" ", 2)
        url = f"http://{raw.headers.get('host', 'mock')}{target}"
        reply = handler(httpx.Request(method, url, headers=raw.headers, content=raw.body))
        response = await reply if inspect.isawaitable(reply) else reply
        framing = {"content-length", "transfer-encoding", "connection"}
        headers = {k.lower(): v for k, v in response.headers.items() if k.lower() not in framing}
        try:
            body = response.content
        except httpx.ResponseNotRead:
            sent = await send_all(stream, _head(response.status_code, headers, None))
            async for part in response.aiter_raw():
                if part:  # an empty chunk would end the body
                    sent = sent and await send_all(stream, b"%x\r\n%b\r\n" % (len(part), part))
            if sent:
                await send_all(stream, b"0\r\n\r\n")
        else:
            await send_all(stream, _head(response.status_code, headers, len(body)) + body)
        await _until_closed(stream)

    async with raw_server(answer) as server:
        yield server.base_url


def _head(status: int, headers: dict[str, str], length: int | None) -> bytes:
    framing = (
        {"transfer-encoding": "chunked"} if length is None else {"content-length": str(length)}
    )
    lines = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}"]
    lines += [
        f"{name}: {value}" for name, value in {**headers, **framing, "connection": "close"}.items()
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def _until_closed(stream: anyio.abc.ByteStream) -> None:
    """Wait until the client closes the connection (what it sends meanwhile is dropped)."""
    try:
        while True:
            await stream.receive()
    except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
        return


def mock_client(
    script: Script,
    *,
    api_key: str | None = KEY,
    retry: RetryPolicy | None = FAST_RETRY,
    backend: Mapping[str, Any] | None = None,
    name: str = "mock",
    model: str = "m",
    served_at: str | None = None,
    **options: Any,
) -> AsyncClient:
    """A client for ``model`` over ``script``'s MockTransport (backend ``name`` at
    ``http://mock/v1``; ``backend``: more :class:`HTTPBackend` options; ``retry=None``: the
    client's default; ``options``: more :class:`AsyncClient` options). With ``served_at``
    (where :meth:`Script.serve` listens) the backend goes there instead, over
    :func:`backend_for`'s transport."""
    if served_at is not None:
        http = backend_for(served_at, api_key, name=name, **(backend or {}))
    else:
        http = HTTPBackend(
            "http://mock/v1", api_key, name=name, transport=script.transport(), **(backend or {})
        )
    return AsyncClient(http, model=model, retry=retry, **options)


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
"""The transports :func:`backend_for` can put under a backend (the ``transport`` fixture
picks one per test; aiohttp runs on asyncio only)."""
transport_in_use = "default"
"""What :func:`backend_for` (so :func:`client_for` and :func:`scripted_client`) uses:
``default`` (the backend's own choice: aiohttp on asyncio, httpx on trio), or one of
:data:`TRANSPORTS`, set by the ``transport`` fixture."""


def transport_options() -> dict[str, Any]:
    """The backend options that put the transport the ``transport`` fixture chose
    (:data:`transport_in_use`) under a backend built some other way (a preset)."""
    return {"transport": httpx.AsyncHTTPTransport()} if transport_in_use == "httpx" else {}


def backend_for(base_url: str, api_key: str | None = None, **options: Any) -> HTTPBackend:
    """An :class:`HTTPBackend` for ``base_url`` over the transport the ``transport`` fixture
    chose (:data:`transport_in_use`); ``options``: more :class:`HTTPBackend` options."""
    return HTTPBackend(base_url, api_key, **options, **transport_options())


def client_for(fakes: dict[str, FakeProvider], **kwargs: Any) -> AsyncClient:
    """A client with one backend per fake, named as the fake (no retries unless given), over
    the transport the ``transport`` fixture chose (:data:`transport_in_use`)."""
    backends = {name: backend_for(fake.base_url, name=name) for name, fake in fakes.items()}
    kwargs.setdefault("retry", NO_RETRY)
    return AsyncClient(backends=backends, **kwargs)


@asynccontextmanager
async def scripted_client(script: Script, **kwargs: Any) -> AsyncIterator[AsyncClient]:
    """:func:`mock_client` (same arguments) with the script served on a loopback socket
    (:meth:`Script.serve`) and read over the transport the ``transport`` fixture chose
    (:data:`transport_in_use`)."""
    async with (
        script.serve() as base_url,
        mock_client(script, served_at=base_url, **kwargs) as client,
    ):
        yield client


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

    def _add(self, event: str, attempt: AttemptResult) -> None:
        self.events.append((event, attempt.target.backend.name, attempt.outcome))

    def on_start(self, attempt: AttemptResult) -> None:
        self._add("start", attempt)

    def on_first_token(self, attempt: AttemptResult) -> None:
        self._add("first_token", attempt)

    def on_commit(self, attempt: AttemptResult) -> None:
        self._add("commit", attempt)

    def on_end(self, attempt: AttemptResult) -> None:
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


def watch_wait(watch: DeadlineWatch, task: asyncio.Task[Any], due: float) -> Waiter:
    """A wait of ``task`` on ``watch`` that must end by ``due`` (stop it with ``.stop()``)."""
    waiter = Waiter(watch)
    waiter.start(task, due)
    return waiter
