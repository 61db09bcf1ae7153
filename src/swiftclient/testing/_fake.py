"""``FakeProvider``: a real loopback OpenAI-compatible provider, scripted per request.

It is an :class:`~swiftclient.asgi.App` served by uvicorn on its own event loop in a
background thread (:class:`~swiftclient.asgi.ThreadedServer`), so tests on asyncio, on trio
or in plain synchronous code drive the very same server.
"""

from __future__ import annotations

import hmac
import json
import re
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import partial
from types import TracebackType
from typing import Any

import anyio
import anyio.abc

from ..asgi import App, Request, ResponseWriter, Router, ServerSettings, ThreadedServer, error_body
from ._events import (
    MALFORMED,
    SSE_DONE,
    ChunkRenderer,
    Plan,
    _prompt_tokens,
    completion_body,
    error_event,
    plan_reply,
)
from ._limits import ProviderLimits
from ._messages import messages_body, messages_error, messages_events, messages_prompt_tokens
from ._prompt_cache import CacheSimulation
from ._reply import Reply
from ._responses import (
    ResponsesRequestError,
    ResponsesTurn,
    check_reasoning_items,
    responses_error,
)

__all__ = ["FakeProvider", "RecordedRequest"]

_CREATED = 1_700_000_000  # a fixed timestamp keeps every reply deterministic
_KEEPALIVE_COMMENT = b": keep-alive\n\n"
_STREAM_ERROR = "The server had an error while generating."
_ERROR_CODES = {401: "invalid_api_key", 404: "not_found", 429: "rate_limit_exceeded"}
_BODY: ContextVar[Any] = ContextVar("fake_provider_body")  # the request's body, parsed once
_AZURE_CHAT = re.compile(r"/openai/deployments/[^/]+/chat/completions/?")
_AZURE_401 = (
    "Access denied due to invalid subscription key or wrong API endpoint. Make sure to "
    "provide a valid key for an active subscription and use a correct regional API "
    "endpoint for your resource."
)


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    """A request the fake provider received. ``body`` is the parsed JSON (``None`` if none)."""

    method: str
    path: str
    query: str
    headers: dict[str, str] = field(repr=False)
    body: Any
    raw_body: bytes = field(repr=False)


class FakeProvider:
    """An OpenAI-compatible provider on a loopback port, for tests.

    ``async with FakeProvider() as fake:`` serves ``fake.base_url`` (ending in ``/v1``):
    ``POST /v1/chat/completions`` (streamed or not), Anthropic's ``POST /v1/messages``
    (streamed or not, its own event and error shapes, the key in ``x-api-key``) and
    ``GET /v1/models`` (``model``, or every id in ``models``). Chat Completions are also
    served where the ``gemini`` and ``azure`` presets send them: Google's
    ``POST /v1beta/openai/chat/completions`` and Azure OpenAI's
    ``POST /openai/deployments/{deployment}/chat/completions?api-version=...`` (the key in
    ``api-key``; Azure's 401 and 404 bodies). Each chat request
    consumes the next :class:`Reply` queued with :meth:`script`, or ``fake.default`` once the
    queue is empty. Every request is recorded in ``fake.requests`` and every response carries
    an ``x-request-id``. With ``api_key`` set, requests need ``Authorization: Bearer <key>``.
    Replies are deterministic: fixed ids, timestamp and token text.

    With ``rate_limits`` (a :class:`ProviderLimits`), chat requests are held to requests-
    and tokens-per-window limits like a hosted API's: every chat response carries
    ``x-ratelimit-*`` headers, and a request past a limit is answered 429 with
    ``Retry-After`` (it consumes no scripted reply; ``fake.rate_limited`` counts them).

    The server runs on its own event loop in a background thread, whatever loop the caller
    runs (asyncio, trio, or none: :meth:`run_in_thread`).
    """

    def __init__(
        self,
        default: Reply | None = None,
        *,
        api_key: str | None = None,
        model: str = "fake-model",
        models: Sequence[str] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        rate_limits: ProviderLimits | None = None,
    ) -> None:
        self.rate_limits = rate_limits
        """The limits enforced on chat requests (``None``: none)."""
        self.rate_limited = 0
        """Chat requests refused with 429 because ``rate_limits`` was reached."""
        self.default: Reply = default if default is not None else Reply()
        """The reply used once the scripted queue is empty."""
        self.requests: list[RecordedRequest] = []
        """Every request received, in arrival order."""
        self.in_flight = 0
        """Chat requests being answered right now."""
        self.cancelled = 0
        """Chat requests whose answer was cancelled (the client left, or the server stopped)."""
        self.model = model
        """The model a reply names when the request names none."""
        self.models: list[str] = list(models) if models is not None else [model]
        """The model ids ``GET /v1/models`` lists (default: ``model`` alone)."""
        self._api_key = api_key
        self.prompt_cache: CacheSimulation | None = None
        """Set to a :class:`~swiftclient.testing.CacheSimulation` to simulate Anthropic's
        prompt cache on ``/v1/messages`` (usage from it unless a reply sets ``usage``)."""
        self._queue: deque[Reply] = deque()
        router = Router(
            {
                "/v1/chat/completions": ("POST", self._chat),
                "/v1/models": ("GET", self._models),
                "/v1/messages": ("POST", self._messages),
                "/v1/responses": ("POST", self._responses),
                "/v1beta/openai/chat/completions": ("POST", self._chat),  # Google's
            },
            api_key=api_key,
            public=frozenset({"/v1/messages"}),  # keyed by x-api-key: checked by the handler
        )
        self._router = router
        self._app = App(self._handle)
        # Kept-alive connections outlive any client pool's idle expiry, so a test never
        # races the server closing a pooled connection.
        self.settings = ServerSettings(host=host, port=port, keepalive_timeout=75.0)
        """Where and how the fake is served."""
        self._server = ThreadedServer(self._app, self.settings)
        self._seq = 0
        self._idle: anyio.Event | None = None

    def __repr__(self) -> str:
        return f"FakeProvider(model={self.model!r}, auth={self._api_key is not None})"

    def script(self, *replies: Reply) -> None:
        """Queue replies; each chat request consumes the next one, in order."""
        for reply in replies:
            if not isinstance(reply, Reply):
                raise TypeError(f"script() takes Reply objects, got {type(reply).__name__}")
        self._queue.extend(replies)

    @property
    def pending(self) -> int:
        """Scripted replies not consumed yet."""
        return len(self._queue)

    @property
    def app(self) -> App:
        """The ASGI application (to serve it some other way)."""
        return self._app

    @property
    def base_url(self) -> str:
        """The OpenAI-style base URL, ``http://127.0.0.1:PORT/v1``."""
        return self._server.base_url + "/v1"

    @property
    def port(self) -> int:
        """The bound port."""
        return self._server.port

    @property
    def connections_opened(self) -> int:
        """TCP connections accepted so far (for connection-pooling tests)."""
        return self._app.connections.opened

    @property
    def open_connections(self) -> int:
        """TCP connections open right now."""
        return self._app.connections.open

    async def wait_until_idle(self, *, after: int = 0) -> None:
        """Wait until no chat request is being answered and, with ``after``, until at least
        that many requests have arrived (:attr:`requests`). Both are checked together on the
        server's own loop, so a request that arrives late (the client gave up on it, and it
        is still on its way) is waited for rather than missed."""
        await self._server.acall(partial(self._wait_idle, after))

    @contextmanager
    def _answering(self) -> Iterator[None]:
        """Count one request being answered (and one cancelled, when it is); wake
        :meth:`wait_until_idle` when the last one ends."""
        self.in_flight += 1
        try:
            yield
        except anyio.get_cancelled_exc_class():
            self.cancelled += 1
            raise
        finally:
            self.in_flight -= 1
            if not self.in_flight:
                self._wake_waiters()

    async def _wait_idle(self, after: int) -> None:
        while self.in_flight or len(self.requests) < after:
            if self._idle is None:
                self._idle = anyio.Event()
            await self._idle.wait()

    def _wake_waiters(self) -> None:
        if self._idle is not None:
            self._idle.set()
            self._idle = None

    async def __aenter__(self) -> FakeProvider:
        await self._server.astart()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._server.astop()

    async def serve_forever(
        self, *, task_status: anyio.abc.TaskStatus[str] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Serve until cancelled; ``await task_group.start(fake.serve_forever)`` gives base_url."""
        async with self:
            task_status.started(self.base_url)
            await anyio.sleep_forever()

    @contextmanager
    def run_in_thread(self) -> Iterator[FakeProvider]:
        """Serve from synchronous code: ``with FakeProvider().run_in_thread() as fake:``."""
        self._server.start()
        try:
            yield self
        finally:
            self._server.stop()

    # ------------------------------------------------------------------ request handling

    async def _handle(self, request: Request, writer: ResponseWriter) -> None:
        self._seq += 1
        try:
            body = request.json() if request.body else None
        except ValueError:
            body = None
        self.requests.append(
            RecordedRequest(
                request.method, request.path, request.query, request.headers, body, request.body
            )
        )
        self._wake_waiters()  # a wait_until_idle(after=...) may be waiting for this one
        writer.headers["x-request-id"] = f"req_fake_{self._seq:06d}"
        token = _BODY.set(body)  # each request is served in its own task (its own context)
        try:
            if _AZURE_CHAT.fullmatch(request.path):
                await self._azure(request, writer)
            else:
                await self._router(request, writer)
        finally:
            _BODY.reset(token)

    async def _azure(self, request: Request, writer: ResponseWriter) -> None:
        """Azure OpenAI's deployment route: the key in ``api-key``, an ``api-version``
        required, errors in Azure's shape; then the chat handler."""
        if request.method != "POST":
            await writer.send_error(405, "Use POST.", headers={"allow": "POST"})
            return
        key = self._api_key
        if key is not None and not hmac.compare_digest(
            request.headers.get("api-key", "").encode(), key.encode()
        ):
            await writer.send_json(401, {"error": {"code": "401", "message": _AZURE_401}})
            return
        if not any(
            part.startswith("api-version=") and part[12:] for part in request.query.split("&")
        ):
            await writer.send_json(404, {"error": {"code": "404", "message": "Resource not found"}})
            return
        await self._chat(request, writer)

    async def _models(self, request: Request, writer: ResponseWriter) -> None:
        listed = [
            {"id": name, "object": "model", "created": _CREATED, "owned_by": "fake"}
            for name in self.models
        ]
        await writer.send_json(200, {"object": "list", "data": listed})

    async def _chat(self, request: Request, writer: ResponseWriter) -> None:
        body = _BODY.get()
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            await writer.send_error(400, "The body must be a JSON object with messages.")
            return
        if body.get("n") not in (None, 1):  # null is absent, as on OpenAI's API
            # One choice is what every scripted reply describes: say so rather than answer
            # one choice to a request for several.
            await writer.send_error(
                400, "The fake provider answers one choice per request: n must be 1.", param="n"
            )
            return
        seq = self._seq
        reply = self._queue[0] if self._queue else self.default
        limit_headers: dict[str, str] = {}
        if self.rate_limits is not None:
            tokens = (
                _prompt_tokens(body)
                if reply.is_error
                else plan_reply(reply, body, f"call_{seq}").usage["total_tokens"]
            )
            decision = self.rate_limits.admit(tokens)
            if not decision.allowed:
                self.rate_limited += 1
                message = "Rate limit reached for requests or tokens; try again later."
                await writer.send_error(
                    429, message, code="rate_limit_exceeded", headers=decision.headers
                )
                return
            limit_headers = decision.headers
        if self._queue:
            self._queue.popleft()
        headers = {**limit_headers, **reply.response_headers()}
        with self._answering():
            if reply.is_error:
                await _sleep(reply.ttft)
                message = reply.error_message or f"Scripted error {reply.status}."
                code = _ERROR_CODES.get(reply.status)
                await writer.send_error(reply.status, message, code=code, headers=headers)
                return
            model = body["model"] if isinstance(body.get("model"), str) else self.model
            plan = plan_reply(reply, body, f"call_{seq}")
            completion_id = f"chatcmpl-fake-{seq}"
            if body.get("stream") is True:
                options = body.get("stream_options")
                renderer = ChunkRenderer(
                    completion_id=completion_id,
                    model=model,
                    created=_CREATED,
                    include_usage=isinstance(options, dict)
                    and options.get("include_usage") is True,
                )
                await _stream(reply, plan, renderer, writer, headers)
            else:
                result = completion_body(
                    plan, completion_id=completion_id, model=model, created=_CREATED
                )
                await _complete(reply, plan, result, writer, headers)

    async def _messages(self, request: Request, writer: ResponseWriter) -> None:
        """Anthropic's Messages API: the key in ``x-api-key`` (or as a bearer token, as
        newer SDKs send it), errors in its shape."""
        key = self._api_key
        if (
            key is not None
            and not hmac.compare_digest(request.headers.get("x-api-key", "").encode(), key.encode())
            and not self._router.authorized(request)
        ):
            body = messages_error(401, "invalid x-api-key")
            await writer.send_json(401, body)
            return
        body = _BODY.get()
        if (
            not isinstance(body, dict)
            or not isinstance(body.get("messages"), list)
            or not isinstance(body.get("max_tokens"), int)
        ):
            message = "The body must be a JSON object with messages and max_tokens."
            await writer.send_json(400, messages_error(400, message))
            return
        seq = self._seq
        reply = self._queue.popleft() if self._queue else self.default
        headers = reply.response_headers()
        with self._answering():
            if reply.is_error:
                await _scripted_error(reply, writer, headers, messages_error)
                return
            model = body["model"] if isinstance(body.get("model"), str) else self.model
            plan = plan_reply(reply, body, f"call_{seq}")
            prompt = messages_prompt_tokens(body)
            cache = self.prompt_cache
            cached = cache.usage(body) if cache is not None else None
            message_id = f"msg_fake_{seq}"
            if body.get("stream") is True:
                head, steps, tail = messages_events(
                    plan, reply, message_id=message_id, model=model, prompt=prompt, cached=cached
                )
                await _stream_named(reply, head, steps, tail, writer, headers)
            else:
                result = messages_body(
                    plan, reply, message_id=message_id, model=model, prompt=prompt, cached=cached
                )
                await _complete(reply, plan, result, writer, headers)

    async def _responses(self, request: Request, writer: ResponseWriter) -> None:
        """OpenAI's Responses API: the request read as the local server reads it (plus
        ``previous_response_id`` and ``store``, recorded, nothing kept), reasoning items in
        ``input`` checked, the reply rendered as a response object or its event stream."""
        body = _BODY.get()
        if not isinstance(body, dict):
            await writer.send_json(400, responses_error(400, "The body must be a JSON object."))
            return
        refused = check_reasoning_items(body)
        if refused is not None:
            await writer.send_json(*refused)
            return
        model = body["model"] if isinstance(body.get("model"), str) else self.model
        try:
            turn = ResponsesTurn(body, model, self._seq)
        except ResponsesRequestError as exc:
            await writer.send_json(400, responses_error(400, str(exc), param=exc.param))
            return
        reply = self._queue.popleft() if self._queue else self.default
        headers = reply.response_headers()
        with self._answering():
            if reply.is_error:
                await _scripted_error(reply, writer, headers, _responses_error)
                return
            plan = plan_reply(reply, turn.chat, f"call_{self._seq}")
            if turn.stream:
                head, steps, tail = turn.events(plan, reply)
                await _stream_named(
                    reply,
                    head,
                    steps,
                    tail,
                    writer,
                    headers,
                    _RESPONSES_MALFORMED,
                    turn.error_event,
                )
            else:
                await _complete(reply, plan, turn.body(plan, reply), writer, headers)


_MESSAGES_MALFORMED = b'event: content_block_delta\ndata: {"type": "content_block\n\n'
_RESPONSES_MALFORMED = b'event: response.output_text.delta\ndata: {"type": "response.out\n\n'


def _messages_error_event(message: str) -> bytes:
    return b"event: error\ndata: " + json.dumps(messages_error(500, message)).encode() + b"\n\n"


async def _stream_named(
    reply: Reply,
    head: bytes,
    steps: list[bytes],
    tail: bytes,
    writer: ResponseWriter,
    headers: dict[str, str],
    malformed: bytes = _MESSAGES_MALFORMED,
    error: Callable[[str], bytes] = _messages_error_event,
) -> None:
    """Send a named-event stream (Messages, Responses) with the reply's timing and faults
    (counted in steps); ``malformed`` and ``error`` are the wire's broken and error events."""
    await writer.start_stream(200, {**headers, "cache-control": "no-cache"})
    await _sleep(reply.ttft)
    pending: list[bytes] = [head]
    for i in range(len(steps) + 1):
        if i == reply.drop_after:
            await _flush(writer, pending)
            await writer.abort()
            return
        if i == reply.stall_after:
            await _flush(writer, pending)
            await _stall(writer, reply.keepalive_comments)
        if i == reply.malformed_after:
            pending.append(malformed)
        if i == reply.error_event_after:
            pending.append(error(reply.error_message or _STREAM_ERROR))
            await _flush(writer, pending)
            await writer.end()
            return
        if i == len(steps):
            break
        if i and reply.token_delay:
            await _flush(writer, pending)
            await anyio.sleep(reply.token_delay)
        pending.append(steps[i])
    pending.append(tail)
    await _flush(writer, pending)
    await writer.end()


def _responses_error(status: int, message: str) -> dict[str, Any]:
    return responses_error(status, message, code=_ERROR_CODES.get(status))


async def _scripted_error(
    reply: Reply,
    writer: ResponseWriter,
    headers: dict[str, str],
    body: Callable[[int, str], dict[str, Any]],
) -> None:
    """Answer a reply's scripted error status after its ``ttft``, in a wire's error shape."""
    await _sleep(reply.ttft)
    message = reply.error_message or f"Scripted error {reply.status}."
    await writer.send_json(reply.status, body(reply.status, message), headers)


async def _sleep(seconds: float) -> None:
    if seconds > 0:
        await anyio.sleep(seconds)


async def _stall(writer: ResponseWriter, interval: float | None) -> None:
    """Send nothing more until the client goes away (keep-alive comments aside)."""
    if interval is None:
        await anyio.sleep_forever()
        return
    while True:
        await anyio.sleep(interval)
        await writer.write(_KEEPALIVE_COMMENT)


async def _flush(writer: ResponseWriter, pending: list[bytes]) -> None:
    if pending:
        await writer.write(b"".join(pending))
        pending.clear()


async def _stream(
    reply: Reply,
    plan: Plan,
    renderer: ChunkRenderer,
    writer: ResponseWriter,
    headers: dict[str, str],
) -> None:
    """Send ``plan`` as SSE; events due at the same moment go out in one write."""
    steps = [renderer.content(text) for text in plan.content_chunks]
    for index, call in enumerate(plan.tool_calls):
        steps.extend(renderer.tool_call(index, call))
    role = renderer.role(with_content=bool(plan.content_chunks))
    await writer.start_stream(200, {**headers, "cache-control": "no-cache"})
    await _sleep(reply.ttft)
    pending: list[bytes] = []
    for i in range(len(steps) + 1):
        if i == reply.drop_after:
            await _flush(writer, pending)
            await writer.abort()
            return
        if i == reply.stall_after:
            await _flush(writer, pending)
            await _stall(writer, reply.keepalive_comments)
        if i == reply.malformed_after:
            pending.append(MALFORMED)
        if i == reply.error_event_after:
            message = reply.error_message or "The server had an error while generating."
            pending.append(error_event(message, code="fake_stream_error"))
            await _flush(writer, pending)
            await writer.end()
            return
        if i == len(steps):
            break
        if i and reply.token_delay:
            await _flush(writer, pending)
            await anyio.sleep(reply.token_delay)
        if role:
            pending.append(role)
            role = b""
        pending.append(steps[i])
    if role:
        pending.append(role)
    pending.append(renderer.finish(plan.finish_reason))
    if renderer.include_usage:
        pending.append(renderer.usage(plan.usage))
    pending.append(SSE_DONE)
    await _flush(writer, pending)
    await writer.end()


async def _complete(
    reply: Reply,
    plan: Plan,
    result: dict[str, Any],
    writer: ResponseWriter,
    headers: dict[str, str],
) -> None:
    """Send a whole ``chat.completion`` after the time the stream would have taken."""
    if reply.drop_after is not None:
        await _sleep(reply.ttft)
        await writer.abort()
        return
    if reply.stall_after is not None:
        await anyio.sleep_forever()
    steps = len(plan.content_chunks) + sum(len(c.argument_pieces()) + 1 for c in plan.tool_calls)
    await _sleep(reply.ttft + reply.token_delay * max(0, steps - 1))
    if reply.malformed_after is not None:
        broken = b'{"id": "chatcmpl-broken", "choices": ['
        await writer.send(200, broken, {**headers, "content-type": "application/json"})
    elif reply.error_event_after is not None:
        message = reply.error_message or "The server had an error while generating."
        await writer.send_json(200, error_body(500, message, code="fake_stream_error"), headers)
    else:
        await writer.send_json(200, result, headers)
