"""An OpenAI-compatible HTTP server for the local engine: an ASGI app served by uvicorn.

Endpoints: ``POST /v1/chat/completions`` (streamed as server-sent events or not; usage with
``prompt_tokens_details.cached_tokens``; ``stream_options.include_usage`` honoured),
``POST /v1/completions`` (the legacy text API, :mod:`local_engine.completions`),
``POST /v1/responses`` (the Responses API, stateless: :mod:`local_engine.responses`),
``POST /v1/messages`` (Anthropic's Messages API, stateless: :mod:`local_engine.messages`;
the key in ``x-api-key`` or as a bearer token, errors in Anthropic's shape) and
``POST /v1/messages/count_tokens``,
``GET /v1/models`` and ``GET /v1/models/{id}``, ``GET /health`` and ``GET /metrics`` (the
engine's metrics in Prometheus text format, see :mod:`local_engine.metrics`). Requests are
mapped exactly as :class:`~local_engine.backend.LocalBackend` maps them (the server runs
one), and ``extra_body`` fields such as ``top_k``, ``min_tokens``, ``repetition_penalty``,
``ignore_eos`` or ``cache_salt`` arrive as top-level JSON fields, as OpenAI clients send
them. Other unknown fields are ignored, as vLLM ignores them: the ``x-ignored-fields``
response header names them and each name is logged once. One access line per request goes
to the ``local_engine.server.access`` logger (``access_log=False`` turns it off), with the
tokens generated even when a stream is cut short.

Models: a request must name the served model (``model_name``, by default the model
directory's name) or the alias ``default``; any other name gets 404 ``model_not_found``, as
vLLM answers. ``/v1/models`` lists both, with the model's sampling defaults.

Errors are OpenAI-style JSON bodies: 400 for invalid JSON (also JSON nested too deeply to
parse), an invalid request or parameters (including ``max_tokens`` over the server's limit, a
prompt too long for the model, or text that is not valid Unicode), 401 for a missing or wrong
bearer key, 404 for an unknown model or route, 405 for a wrong method, 408 for a body that
trickles in too slowly, 413 for a body over the limit, 431 for an oversized head, 503 with
``Retry-After`` when the engine's queue is full (or past ``limit_concurrency``), 500 when the
engine fails. A client that disconnects has its engine request aborted at once (its KV blocks
are freed). Prompts are rendered and tokenized in a worker thread, so a huge request never
stalls the event loop (``/health`` included).

Run it with ``python -m local_engine.server [MODEL_DIR] [options]`` (no directory: the
embedded default model) or ``swiftclient serve`` with the same options; ``--help`` lists them.
"""

from __future__ import annotations

import argparse
import contextvars
import functools
import hmac
import logging
import re
import secrets
import socket
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import anyio.to_thread
import click
import pydantic

from swiftclient.asgi import (
    SSE_DONE,
    App,
    Request,
    ResponseWriter,
    Router,
    ServerSettings,
    ThreadedServer,
    error_body,
    serve,
    sse_event,
)
from swiftclient.cli import run_command
from swiftclient.errors import (
    ConfigurationError,
    redact,
)
from swiftclient.types import (
    ChatCompletionChunk,
    ChatRequest,
    StreamOptions,
)
from swiftclient.wire import (
    chat_completion_body,
    listed_names,
    printable_name,
    request_problem,
)

from .backend import LocalBackend
from .errors import (
    EngineConfigError,
    EngineError,
    GrammarFailedError,
    OverloadedError,
)
from .messages import MessageEvents, MessagesRequestError, message_body, messages_error, named_event
from .messages import chat_fields as messages_chat_fields
from .responses import (
    ResponseEcho,
    ResponseEvents,
    ResponsesRequestError,
    chat_fields,
    event_bytes,
    response_body,
)
from .service import EXTRA_BODY_KEYS, NamesSeen
from .tracing import ServerTracer

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import Span, TracerProvider

    from .completions import TextRequest
    from .engine import EngineConfig, RequestOutput
    from .service import ChatService, OutputSource, PreparedRequest

__all__ = ["LocalServer", "RequestError", "command", "main", "parse_chat_body"]

_REQUEST_FIELDS = frozenset(ChatRequest.model_fields) - {"extra_body"}
_STREAM_OPTIONS = frozenset(StreamOptions.model_fields)
IGNORED_FIELDS_HEADER = "x-ignored-fields"
"""The response header naming the request fields the server ignored (comma-separated)."""


def _status_of(writer: ResponseWriter, raised: BaseException | None) -> int:
    """The status a request ended with: the one sent; else 500 when an error escaped (the
    app answers it so), 499 when the client went away (a cancellation) or nothing was sent."""
    if writer.status is not None:
        return writer.status
    return 500 if isinstance(raised, Exception) else 499


_log = logging.getLogger("local_engine.server")
access_log = logging.getLogger("local_engine.server.access")
"""One INFO line per request: client, method, path, status, tokens, TTFT and duration."""
_ACCESS: contextvars.ContextVar[dict[str, Any]] = contextvars.ContextVar("local_engine_access")
_RETRY_AFTER = "1"
_THREAD_PARSE_BYTES = 64 * 1024  # bodies larger than this are parsed in a worker thread
_MODEL_PREFIX = "/v1/models/"
DEFAULT_ALIAS = "default"
"""A model name every local server answers to, besides its served name."""


class RequestError(ValueError):
    """A request the server refuses: HTTP status, message, error code, offending parameter."""

    def __init__(self, status: int, message: str, code: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param


def parse_chat_body(body: Any, ignored: list[str] | None = None) -> ChatRequest:
    """Turn a decoded ``/v1/chat/completions`` JSON body into a :class:`ChatRequest`.

    OpenAI fields become request fields; the local engine's extra fields
    (:data:`~local_engine.service.EXTRA_BODY_KEYS`, vLLM's extensions among them) go to
    ``extra_body``, as does ``stream_options.continuous_usage_stats``. Any other field (at the
    top level, in ``stream_options`` or in an ``extra_body`` object) is ignored, as vLLM
    ignores it, and its name (``stream_options.include_obfuscation``, say) appended to
    ``ignored``. Raises :class:`RequestError` (a ``ValueError``) naming the first problem in
    the fields that are known (a value out of range, ``n`` too large...).
    """
    if not isinstance(body, dict):
        raise RequestError(400, "the request body must be a JSON object", "invalid_request")
    skipped: list[str] = [] if ignored is None else ignored
    fields: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for key, value in body.items():
        if key == "stream_options" and isinstance(value, dict):
            fields[key] = _stream_options(value, extra, skipped)
        elif key in _REQUEST_FIELDS:
            fields[key] = value
        elif key in EXTRA_BODY_KEYS:
            extra[key] = value
        elif key == "extra_body" and isinstance(value, dict):
            for name, item in value.items():
                if name in EXTRA_BODY_KEYS:
                    extra[name] = item
                else:
                    skipped.append(f"extra_body.{name}")
        else:
            skipped.append(str(key))
    if extra:
        fields["extra_body"] = extra
    try:
        return ChatRequest.model_validate(fields)
    except pydantic.ValidationError as exc:
        message, param = request_problem(exc)  # each field at fault once, union branches as one
        raise RequestError(400, f"invalid request: {message}", "invalid_request", param) from exc


def _stream_options(
    options: dict[str, Any], extra: dict[str, Any], skipped: list[str]
) -> dict[str, Any]:
    """``stream_options`` with what the local engine reads; the rest named in ``skipped``."""
    kept: dict[str, Any] = {}
    for name, value in options.items():
        if name in _STREAM_OPTIONS:
            kept[name] = value
        elif name == "continuous_usage_stats":
            extra[name] = value
        else:
            skipped.append(f"stream_options.{name}")
    return kept


def _chunk_bytes(chunk: ChatCompletionChunk) -> bytes:
    data = chunk.model_dump(mode="json", exclude_none=True)
    for choice in data["choices"]:
        choice.setdefault("logprobs", None)
        choice.setdefault("finish_reason", None)
    return sse_event(data)


_RESPONSES_NAMES = (
    ("response_format.json_schema", "text.format"),
    ("response_format", "text.format"),
    ("max_completion_tokens", "max_output_tokens"),
    ("max_tokens", "max_output_tokens"),
    ("messages", "input"),
)
"""The chat request's field names (which the engine and the chat validation use) and what a
``/v1/responses`` caller sent instead, longest first."""
_CHAT_NAME = re.compile(r"\b(" + "|".join(re.escape(c) for c, _ in _RESPONSES_NAMES) + r")\b")


def _in_responses_names(error: RequestError) -> RequestError:
    """``error`` with the chat fields in its ``param`` and message named as the Responses
    request named them."""
    names = dict(_RESPONSES_NAMES)

    def rename(text: str) -> str:
        return _CHAT_NAME.sub(lambda m: names[m.group(1)], text)

    error.message = rename(error.message)
    error.args = (error.message,)
    if error.param is not None:
        error.param = rename(error.param)
    return error


def _responses_error(exc: Exception) -> RequestError:
    """:func:`_engine_error`, with the fields named as the Responses request named them."""
    return _in_responses_names(_engine_error(exc))


def _engine_error(exc: Exception) -> RequestError:
    """Map an error of the engine onto a status, the one place that does: a refused request
    (:class:`~local_engine.errors.InvalidRequestError`, a ``ValueError``) 400, overload 503,
    a grammar that failed mid-reply 400 with its reason (the request's schema met a limit of
    the grammar library, as one that fails at once does), any other failure 500."""
    if isinstance(exc, OverloadedError):
        return RequestError(503, f"the server is overloaded: {exc}", "server_overloaded")
    if isinstance(exc, ValueError):
        return RequestError(400, str(exc), "invalid_request", getattr(exc, "param", None))
    if isinstance(exc, GrammarFailedError):
        return RequestError(400, str(exc), "grammar_failed")
    return RequestError(500, "the engine failed while serving the request", "engine_error")


class LocalServer:
    """Serves a :class:`LocalBackend` over the OpenAI chat-completions API.

    ``async with LocalServer(backend) as server:`` starts uvicorn on its own event loop in a
    background thread (so it works from asyncio, trio or :meth:`run_in_thread` alike), loads
    the model and starts the engine there, and listens on ``host:port`` (port 0 picks a free
    one; ``server.base_url`` ends in ``/v1``). :meth:`run` serves in this thread instead,
    until SIGINT or SIGTERM (the command line). :attr:`app` is the ASGI application.

    Args:
        backend: the local backend to serve (entered and exited by the server).
        host: interface to bind; loopback by default.
        port: TCP port.
        api_key: when set, every route but ``/health`` needs ``Authorization: Bearer <key>``
            (the scheme in any case; the key compared in constant time).
        max_body_bytes: larger request bodies get 413.
        max_tokens_limit: requests asking for more completion tokens get 400.
        model_name: the served model id (default: the model directory's name); requests
            must name it or ``"default"``.
        limit_concurrency: past this many connections or running requests, 503.
        keepalive_timeout: seconds an idle kept-alive connection stays open.
        head_timeout: seconds a client has to send a complete request head.
        write_timeout: seconds a stream waits for a client that stopped reading before the
            connection is dropped (and its engine request aborted).
        root_path: the path prefix a reverse proxy strips (``/api``, say).
        loop: ``auto`` (uvloop when installed), ``asyncio`` or ``uvloop``.
        tracer_provider: where request spans go (``None``: the global provider); a request
            carrying a ``traceparent`` joins the caller's trace.
        meter_provider: where the engine's OpenTelemetry metrics go (``None``: the global
            provider); ``GET /metrics`` serves them in Prometheus text format either way.
        access_log: log one line per request (client, method, path, status, prompt and
            completion tokens, time to first token, duration) at INFO on the
            ``local_engine.server.access`` logger; ``swiftclient serve`` prints them.
    """

    def __init__(
        self,
        backend: LocalBackend,
        *,
        host: str = "127.0.0.1",
        port: int = 8000,
        api_key: str | None = None,
        max_body_bytes: int = 8 * 1024 * 1024,
        max_tokens_limit: int | None = None,
        model_name: str | None = None,
        limit_concurrency: int | None = None,
        keepalive_timeout: float = 5.0,
        head_timeout: float = 10.0,
        write_timeout: float = 60.0,
        root_path: str = "",
        loop: str = "auto",
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
        access_log: bool = True,
    ) -> None:
        if max_tokens_limit is not None and max_tokens_limit < 1:
            raise ConfigurationError(f"max_tokens_limit must be positive, got {max_tokens_limit}")
        self.backend = backend
        self._api_key = api_key or None
        self._max_tokens_limit = max_tokens_limit
        self._model_name = model_name
        self._created = int(time.time())
        self._access_log = access_log
        self._ignored_seen = NamesSeen()
        if meter_provider is not None:
            backend.meter_provider = meter_provider
        self._tracer = ServerTracer(tracer_provider)
        self.settings = ServerSettings(
            host=host,
            port=port,
            limit_concurrency=limit_concurrency,
            keepalive_timeout=keepalive_timeout,
            head_timeout=head_timeout,
            root_path=root_path,
            loop=loop,
        )
        router = Router(
            {
                "/v1/chat/completions": ("POST", self._chat),
                "/v1/completions": ("POST", self._text),
                "/v1/responses": ("POST", self._responses),
                "/v1/messages": ("POST", self._messages),
                "/v1/messages/count_tokens": ("POST", self._count_tokens),
                "/v1/models": ("GET", self._models),
                "/health": ("GET", self._health),
                "/metrics": ("GET", self._metrics),
            },
            api_key=self._api_key,
            # /v1/messages takes Anthropic's x-api-key too: its handler checks the key
            public=frozenset({"/health", "/metrics", "/v1/messages", "/v1/messages/count_tokens"}),
        )
        self._router = router
        self.app = App(self._route, max_body_bytes=max_body_bytes, write_timeout=write_timeout)
        """The ASGI application (it needs the backend entered to answer chat requests)."""
        self._server = ThreadedServer(self.app, self.settings, resources=backend)

    def __repr__(self) -> str:
        return f"LocalServer(backend={self.backend!r}, auth={self._api_key is not None})"

    @property
    def base_url(self) -> str:
        """``http://HOST:PORT/v1`` (after the root path) of the running server."""
        return self._server.base_url + "/v1"

    @property
    def port(self) -> int:
        """The bound port."""
        return self._server.port

    @property
    def model_name(self) -> str:
        """The model id this server reports."""
        if self._model_name:
            return self._model_name
        model_dir = self.backend.model_dir
        return model_dir.name if model_dir is not None else "local"

    @property
    def served_model_names(self) -> tuple[str, ...]:
        """The model names requests may use: the served name and ``"default"``."""
        return (self.model_name, DEFAULT_ALIAS)

    async def __aenter__(self) -> LocalServer:
        """Start the server thread: load the model, start the engine, then listen."""
        await self._server.astart()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop listening (every in-flight request is aborted), then stop the engine."""
        await self._server.astop()

    async def serve_forever(
        self, *, task_status: anyio.abc.TaskStatus[str] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Serve until cancelled; ``await task_group.start(server.serve_forever)`` gives
        the base URL."""
        async with self:
            task_status.started(self.base_url)
            await anyio.sleep_forever()

    async def wait_idle(self) -> None:
        """Wait until the engine has no live request (from any event loop)."""
        async_engine = self.backend.async_engine
        if async_engine is not None:
            await self._server.acall(async_engine.wait_idle)

    def run(self) -> None:
        """Serve in this thread until SIGINT or SIGTERM, printing the URL once ready."""

        def ready(url: str) -> None:
            print(f"serving {self.model_name} at {url}/v1", flush=True)

        serve(self.app, self.settings, resources=self.backend, on_ready=ready)

    # ------------------------------------------------------------------ routes

    async def _health(self, request: Request, writer: ResponseWriter) -> None:
        engine = self.backend.async_engine
        if engine is not None and engine.failure is not None:
            await writer.send_json(503, {"status": "failed"})  # it answers nothing but 500s
        elif self.backend.running:
            await writer.send_json(200, {"status": "ok"})
        else:
            await writer.send_json(503, {"status": "stopped"})

    async def _metrics(self, request: Request, writer: ResponseWriter) -> None:
        from .metrics import PROMETHEUS_CONTENT_TYPE

        body = self.backend.stats.render()
        await writer.send(200, body, {"content-type": PROMETHEUS_CONTENT_TYPE})

    async def _route(self, request: Request, writer: ResponseWriter) -> None:
        """Route the request (``/v1/models/{id}`` by prefix), then log its access line."""
        started = time.perf_counter()
        access: dict[str, Any] = {}
        token = _ACCESS.set(access)
        try:
            path = request.path.rstrip("/")
            if path.startswith(_MODEL_PREFIX):
                if request.method not in ("GET", "HEAD"):  # as the router answers
                    await writer.send_error(
                        405,
                        f"Use GET for {path}.",
                        code="method_not_allowed",
                        headers={"allow": "GET, HEAD"},
                    )
                elif self._router.authorized(request):
                    writer.head_only = request.method == "HEAD"
                    await self._model(request, writer, path[len(_MODEL_PREFIX) :])
                else:  # as the router answers
                    await writer.send_error(
                        401,
                        "Incorrect or missing API key.",
                        code="invalid_api_key",
                        headers={"www-authenticate": "Bearer"},
                    )
            else:
                await self._router(request, writer)
        finally:
            _ACCESS.reset(token)
            if self._access_log:
                _log_access(request, _status_of(writer, sys.exc_info()[1]), started, access)

    def _model_card(self, model_id: str) -> dict[str, Any]:
        """``/v1/models`` entry for one served name (the alias names its root)."""
        card: dict[str, Any] = {
            "id": model_id,
            "object": "model",
            "created": self._created,
            "owned_by": "swiftclient",
            "root": self.model_name,
        }
        if self.backend.loaded:
            card["max_model_len"] = self.backend.engine.max_model_len
        card["sampling_defaults"] = self.backend.sampling_defaults
        return card

    async def _models(self, request: Request, writer: ResponseWriter) -> None:
        data = [self._model_card(name) for name in self.served_model_names]
        await writer.send_json(200, {"object": "list", "data": data})

    async def _model(self, request: Request, writer: ResponseWriter, model_id: str) -> None:
        if model_id not in self.served_model_names:
            await _send_error(writer, self._unknown_model(model_id))
            return
        await writer.send_json(200, self._model_card(model_id))

    def _unknown_model(self, model_id: str) -> RequestError:
        return RequestError(
            404,
            f"The model {model_id!r} does not exist: this server serves "
            f"{self.model_name!r} (alias {DEFAULT_ALIAS!r}).",
            "model_not_found",
            "model",
        )

    def _note_ignored(self, writer: ResponseWriter, ignored: list[str]) -> None:
        """Name the ignored fields in a header; log each field name the first time (the
        names escaped to printable ASCII and cut short, at most ``NAMED_AT_MOST`` of
        them, and at most 1,000 remembered: a client chooses them, :class:`NamesSeen`)."""
        if not ignored:
            return
        names = {printable_name(name) for name in ignored}
        writer.headers[IGNORED_FIELDS_HEADER] = listed_names(sorted(names))
        new = self._ignored_seen.new(names)
        if new:
            _log.warning("ignoring request fields this server does not use: %s", listed_names(new))

    async def _traced(
        self,
        answer: Callable[[Request, ResponseWriter, Span, dict[str, Any]], Awaitable[None]],
        request: Request,
        writer: ResponseWriter,
    ) -> None:
        """Run ``answer`` under a SERVER span in the caller's trace; ``answer`` notes what
        the reply was in the dict it is given, for the span's attributes."""
        span = self._tracer.start(request.headers)
        reply: dict[str, Any] = {}
        try:
            await answer(request, writer, span, reply)
        finally:
            self._tracer.end(span, status=_status_of(writer, sys.exc_info()[1]), **reply)

    async def _chat(self, request: Request, writer: ResponseWriter) -> None:
        await self._traced(self._answer, request, writer)

    async def _answer(
        self, request: Request, writer: ResponseWriter, span: Span, reply: dict[str, Any]
    ) -> None:
        writer.headers["x-request-id"] = f"req_{secrets.token_hex(12)}"
        ignored: list[str] = []
        try:
            if len(request.body) > _THREAD_PARSE_BYTES:
                chat, stream, usage = await anyio.to_thread.run_sync(self._parse, request, ignored)
            else:
                chat, stream, usage = self._parse(request, ignored)
        except RequestError as error:
            self._note_ignored(writer, ignored)
            await _send_error(writer, error)
            return
        self._note_ignored(writer, ignored)
        engine, service = self.backend.serving()
        recording = span.is_recording()
        if recording:
            self._tracer.request(span, chat, self.model_name)
        if not stream:
            try:
                completion = await service.complete(engine, chat)
            except (ValueError, EngineError) as exc:
                await _send_error(writer, _engine_error(exc))
                return
            if recording:
                reply.update(
                    response_id=completion.id,
                    model=completion.model,
                    usage=completion.usage,
                    finish_reason=completion.finish_reason,
                )
            _access_usage(completion.usage)
            await writer.send_json(200, chat_completion_body(completion))
            return
        try:
            # always with usage, for the access line; dropped below unless the client asked
            async with service.stream(engine, chat, include_usage=True) as chunks:
                await writer.start_stream(200, {"cache-control": "no-cache"})
                try:
                    async for chunk in chunks:
                        _access_chunk(chunk)
                        if chunk.usage is not None and not usage:
                            if not chunk.choices:
                                continue  # the usage chunk the client did not ask for
                            chunk.usage = None
                        await writer.write(_chunk_bytes(chunk))
                        if recording:
                            _note(reply, chunk)
                finally:  # also when cut short (the client left): the tokens until then
                    _access_usage(chunks.usage_so_far())
        except (ValueError, EngineError) as exc:
            failure = _engine_error(exc)
            if not writer.started:
                await _send_error(writer, failure)
                return
            await writer.write(
                sse_event(error_body(500, redact(failure.message), code=failure.code))
            )
            return
        await writer.write(SSE_DONE)

    async def _text(self, request: Request, writer: ResponseWriter) -> None:
        """``POST /v1/completions``: the legacy text API (see :mod:`local_engine.completions`)."""
        from .completions import TextRequest, complete_text, text_chunks, text_request_fields

        writer.headers["x-request-id"] = f"req_{secrets.token_hex(12)}"
        ignored: list[str] = []
        try:
            try:
                body = request.json()
            except ValueError as exc:
                raise RequestError(
                    400, f"the body is not valid JSON: {exc}", "invalid_json"
                ) from exc
            if not isinstance(body, dict):
                raise RequestError(400, "the request body must be a JSON object", "invalid_request")
            try:
                fields, shape = text_request_fields(body)
            except ValueError as exc:
                param = getattr(exc, "param", None)
                raise RequestError(400, str(exc), "invalid_request", param) from exc
            chat = parse_chat_body(fields, ignored)
            if chat.model not in self.served_model_names:
                raise self._unknown_model(chat.model)
            self._check_limit(chat)
            if shape.more and chat.stream:
                raise RequestError(
                    400,
                    "several prompts in one request are served without streaming: send "
                    "stream: false, or one prompt per request",
                    "invalid_request",
                    "prompt",
                )
        except RequestError as error:
            self._note_ignored(writer, ignored)
            await _send_error(writer, error)
            return
        self._note_ignored(writer, ignored)
        parsed = TextRequest(chat, shape)
        try:
            engine, service = self.backend.running_service()
            prepare = functools.partial(
                service.prepare_text,
                prompt_logprobs=shape.prompt_logprobs,
                score_only=shape.score_only,
            )
            if shape.more:  # several prompts: a choice each, run side by side
                body = await self._several_texts(service, engine, parsed, prepare)
                _access_usage(_UsageView(body["usage"]))
                await writer.send_json(200, body)
                return
            prepared = await anyio.to_thread.run_sync(prepare, chat, shape.prompt)
            if not chat.stream:
                body = await complete_text(service, engine, parsed, prepared)
                _access_usage(_UsageView(body["usage"]))
                await writer.send_json(200, body)
                return
            options = chat.stream_options
            usage = options is not None and options.include_usage is True
            continuous = usage and bool((chat.extra_body or {}).get("continuous_usage_stats"))
            async with service.generate(engine, prepared) as outputs:
                await writer.start_stream(200, {"cache-control": "no-cache"})
                chunks = text_chunks(
                    service,
                    _CountedOutputs(outputs),
                    parsed,
                    prepared,
                    include_usage=usage,
                    continuous_usage=continuous,
                )
                async for chunk in chunks:
                    _access_text_chunk(chunk)
                    await writer.write(sse_event(chunk))
        except (ValueError, EngineError) as exc:
            failure = _engine_error(exc)
            if not writer.started:
                await _send_error(writer, failure)
                return
            await writer.write(
                sse_event(error_body(500, redact(failure.message), code=failure.code))
            )
            return
        await writer.write(SSE_DONE)

    async def _several_texts(
        self,
        service: ChatService,
        engine: OutputSource,
        parsed: TextRequest,
        prepare: Callable[[ChatRequest, str | list[int]], PreparedRequest],
    ) -> dict[str, Any]:
        """The one body of a legacy completion with several prompts: each prompt prepared
        and run as its own engine request, side by side, its reply a choice in order."""
        from .async_engine import check_waiting_room
        from .completions import complete_text, merge_texts

        prompts = parsed.shape.prompts
        check_waiting_room(service.engine, len(prompts), "prompts", "prompt")
        prepared = await anyio.to_thread.run_sync(  # one trip to a worker thread for all
            lambda: [prepare(parsed.request, prompt) for prompt in prompts]
        )
        bodies: list[dict[str, Any]] = [{} for _ in prompts]
        failures: list[ValueError | EngineError] = []

        async def run(index: int, scope: anyio.CancelScope) -> None:
            try:
                bodies[index] = await complete_text(service, engine, parsed, prepared[index])
            except (ValueError, EngineError) as exc:  # the request's answer, as for one prompt
                failures.append(exc)
                scope.cancel()  # the others too

        async with anyio.create_task_group() as tg:
            for index in range(len(prompts)):
                tg.start_soon(run, index, tg.cancel_scope)
        if failures:
            raise failures[0]
        return merge_texts(bodies)

    async def _responses(self, request: Request, writer: ResponseWriter) -> None:
        """``POST /v1/responses``: the Responses API, stateless (:mod:`local_engine.responses`)."""
        await self._traced(self._respond, request, writer)

    async def _respond(
        self, request: Request, writer: ResponseWriter, span: Span, reply: dict[str, Any]
    ) -> None:
        writer.headers["x-request-id"] = f"req_{secrets.token_hex(12)}"
        ignored: list[str] = []
        try:
            if len(request.body) > _THREAD_PARSE_BYTES:
                chat, echo = await anyio.to_thread.run_sync(self._parse_responses, request, ignored)
            else:
                chat, echo = self._parse_responses(request, ignored)
        except RequestError as error:
            self._note_ignored(writer, ignored)
            await _send_error(writer, error)
            return
        self._note_ignored(writer, ignored)
        engine, service = self.backend.serving()
        recording = span.is_recording()
        if recording:
            self._tracer.request(span, chat, self.model_name)
        if not chat.stream:
            try:
                completion = await service.complete(engine, chat)
            except (ValueError, EngineError) as exc:
                await _send_error(writer, _responses_error(exc))
                return
            if recording:
                reply.update(
                    response_id=echo.id,
                    model=completion.model,
                    usage=completion.usage,
                    finish_reason=completion.finish_reason,
                )
            _access_usage(completion.usage)
            await writer.send_json(200, response_body(completion, echo))
            return
        events = ResponseEvents(echo)
        try:
            async with service.stream(engine, chat, include_usage=True) as chunks:
                await writer.start_stream(200, {"cache-control": "no-cache"})
                try:
                    for event in events.start():
                        await writer.write(event_bytes(event))
                    async for chunk in chunks:
                        _access_chunk(chunk)
                        for event in events.feed(chunk):
                            await writer.write(event_bytes(event))
                        if recording:
                            _note(reply, chunk)
                            reply["response_id"] = echo.id
                finally:  # also when cut short (the client left): the tokens until then
                    _access_usage(chunks.usage_so_far())
        except (ValueError, EngineError) as exc:
            failure = _responses_error(exc)
            if not writer.started:
                await _send_error(writer, failure)
                return
            await writer.write(event_bytes(events.fail(failure.code, redact(failure.message))))

    def _parse_responses(
        self, request: Request, ignored: list[str]
    ) -> tuple[ChatRequest, ResponseEcho]:
        """A ``/v1/responses`` body as a chat request and what its response echoes."""
        try:
            body = request.json()
        except ValueError as exc:
            raise RequestError(400, f"the body is not valid JSON: {exc}", "invalid_json") from exc
        if not isinstance(body, dict):
            raise RequestError(400, "the request body must be a JSON object", "invalid_request")
        try:
            fields, echoed = chat_fields(body, ignored)
        except ResponsesRequestError as exc:
            raise RequestError(400, str(exc), "invalid_request", exc.param) from exc
        try:
            chat = parse_chat_body(fields, ignored)
        except RequestError as exc:
            raise _in_responses_names(exc) from exc.__cause__
        if chat.model not in self.served_model_names:
            raise self._unknown_model(chat.model)
        try:
            self._check_limit(chat)
        except RequestError as exc:
            asked = chat.max_new_tokens()
            message = f"max_output_tokens={asked} is over this server's limit"
            raise RequestError(
                400, f"{message} of {self._max_tokens_limit}", exc.code, "max_output_tokens"
            ) from exc
        return chat, ResponseEcho(chat.model, echoed)

    async def _messages(self, request: Request, writer: ResponseWriter) -> None:
        """``POST /v1/messages``: Anthropic's Messages API, stateless
        (:mod:`local_engine.messages`)."""
        await self._traced(self._message, request, writer)

    async def _message(
        self, request: Request, writer: ResponseWriter, span: Span, reply: dict[str, Any]
    ) -> None:
        request_id = f"req_{secrets.token_hex(12)}"
        writer.headers["x-request-id"] = writer.headers["request-id"] = request_id
        writer.error_shape = messages_error  # a handler's failure too, in Anthropic's shape
        if not self._messages_authorized(request):
            await writer.send_json(401, messages_error(401, "invalid x-api-key"))
            return
        ignored: list[str] = []
        try:
            if len(request.body) > _THREAD_PARSE_BYTES:
                chat = await anyio.to_thread.run_sync(self._parse_messages, request, ignored)
            else:
                chat = self._parse_messages(request, ignored)
        except RequestError as error:
            self._note_ignored(writer, ignored)
            await _send_messages_error(writer, error)
            return
        self._note_ignored(writer, ignored)
        engine, service = self.backend.serving()
        recording = span.is_recording()
        if recording:
            self._tracer.request(span, chat, self.model_name)
        if not chat.stream:
            try:
                completion = await service.complete(engine, chat)
            except (ValueError, EngineError) as exc:
                await _send_messages_error(writer, _engine_error(exc))
                return
            body = message_body(completion, chat.model)
            if recording:
                reply.update(
                    response_id=body["id"],
                    model=completion.model,
                    usage=completion.usage,
                    finish_reason=completion.finish_reason,
                )
            _access_usage(completion.usage)
            await writer.send_json(200, body)
            return
        events = MessageEvents(chat.model)
        try:
            async with service.stream(engine, chat, include_usage=True) as chunks:
                await writer.start_stream(200, {"cache-control": "no-cache"})
                async for chunk in chunks:
                    _access_chunk(chunk)
                    for event in events.feed(chunk):
                        await writer.write(named_event(event))
                    if recording:
                        _note(reply, chunk)
        except (ValueError, EngineError) as exc:
            failure = _engine_error(exc)
            if not writer.started:
                await _send_messages_error(writer, failure)
                return
            await writer.write(named_event(events.fail(failure.status, redact(failure.message))))

    async def _count_tokens(self, request: Request, writer: ResponseWriter) -> None:
        """``POST /v1/messages/count_tokens``: the prompt tokens a Messages request would
        take (its body without ``max_tokens``), ``{"input_tokens": N}``."""
        request_id = f"req_{secrets.token_hex(12)}"
        writer.headers["x-request-id"] = writer.headers["request-id"] = request_id
        writer.error_shape = messages_error  # a handler's failure too, in Anthropic's shape
        if not self._messages_authorized(request):
            await writer.send_json(401, messages_error(401, "invalid x-api-key"))
            return
        ignored: list[str] = []
        try:
            chat = self._parse_messages(request, ignored, counting=True)
            _, service = self.backend.serving()
            count = await anyio.to_thread.run_sync(service.count_prompt, chat)
        except RequestError as error:
            await _send_messages_error(writer, error)
            return
        except (ValueError, EngineError) as exc:
            await _send_messages_error(writer, _engine_error(exc))
            return
        self._note_ignored(writer, ignored)
        await writer.send_json(200, {"input_tokens": count})

    def _messages_authorized(self, request: Request) -> bool:
        """The key in Anthropic's ``x-api-key`` header or as a bearer token."""
        key = self._api_key
        if key is None or self._router.authorized(request):
            return True
        given = request.headers.get("x-api-key", "")
        return hmac.compare_digest(given.encode(), key.encode())

    def _parse_messages(
        self, request: Request, ignored: list[str], *, counting: bool = False
    ) -> ChatRequest:
        """A ``/v1/messages`` body as a streaming-aware chat request (``counting``: a
        ``count_tokens`` body, which has no ``max_tokens``)."""
        try:
            body = request.json()
        except ValueError as exc:
            raise RequestError(400, f"the body is not valid JSON: {exc}", "invalid_json") from exc
        if not isinstance(body, dict):
            raise RequestError(400, "the request body must be a JSON object", "invalid_request")
        if counting:
            body = {**body, "max_tokens": 1, "stream": False}
        try:
            fields = messages_chat_fields(body, ignored)
        except MessagesRequestError as exc:
            raise RequestError(400, str(exc), "invalid_request", exc.param) from exc
        if fields.get("stream"):
            # usage on every chunk: message_start reports the prompt's size up front
            fields["stream_options"] = {"include_usage": True}
            fields["continuous_usage_stats"] = True
        chat = parse_chat_body(fields, ignored)
        if chat.model not in self.served_model_names:
            raise self._unknown_model(chat.model)
        self._check_limit(chat)
        return chat

    def _check_limit(self, chat: ChatRequest) -> None:
        """400 when the request asks for more tokens than ``max_tokens_limit``."""
        limit = self._max_tokens_limit
        asked = chat.max_new_tokens()
        if limit is not None and asked is not None and asked > limit:
            param = "max_completion_tokens" if chat.max_completion_tokens else "max_tokens"
            raise RequestError(
                400,
                f"{param}={asked} is over this server's limit of {limit}",
                "max_tokens_too_large",
                param,
            )

    def _parse(self, request: Request, ignored: list[str]) -> tuple[ChatRequest, bool, bool]:
        """The request, whether it streams, and whether the client asked for usage chunks
        (the backend always sends them, for the access log; the server drops them when not
        asked). ``continuous_usage_stats`` applies only with ``include_usage``, as in vLLM."""
        try:
            body = request.json()
        except ValueError as exc:
            raise RequestError(400, f"the body is not valid JSON: {exc}", "invalid_json") from exc
        chat = parse_chat_body(body, ignored)
        if chat.model not in self.served_model_names:
            raise self._unknown_model(chat.model)
        self._check_limit(chat)
        stream = bool(chat.stream)
        usage = False
        if stream:
            options = chat.stream_options
            usage = options is not None and options.include_usage is True
            update: dict[str, Any] = {"stream_options": StreamOptions(include_usage=True)}
            if not usage and chat.extra_body and "continuous_usage_stats" in chat.extra_body:
                extra = dict(chat.extra_body)
                del extra["continuous_usage_stats"]
                update["extra_body"] = extra or None
            chat = chat.model_copy(update=update)
        return chat, stream, usage


def _access_usage(usage: Any) -> None:
    """Keep a reply's token counts for the request's access line."""
    access = _ACCESS.get(None)
    if access is not None and usage is not None:
        access["prompt_tokens"] = usage.prompt_tokens
        access["completion_tokens"] = usage.completion_tokens


@dataclass(frozen=True)
class _UsageView:
    """A usage JSON object read as the access line reads usage."""

    data: dict[str, Any]

    @property
    def prompt_tokens(self) -> int:
        return int(self.data["prompt_tokens"])

    @property
    def completion_tokens(self) -> int:
        return int(self.data["completion_tokens"])


class _CountedOutputs:
    """A request's engine outputs, each noting its token counts for the access line (a
    streamed legacy completion carries usage only when asked, and not when cut short)."""

    __slots__ = ("_outputs",)

    def __init__(self, outputs: AsyncIterator[RequestOutput]) -> None:
        self._outputs = outputs

    def __aiter__(self) -> _CountedOutputs:
        return self

    async def __anext__(self) -> RequestOutput:
        out = await self._outputs.__anext__()
        access = _ACCESS.get(None)
        if access is not None:
            access["prompt_tokens"] = out.num_prompt_tokens
            access["completion_tokens"] = out.num_generated_tokens
        return out


def _access_text_chunk(chunk: dict[str, Any]) -> None:
    """:func:`_access_chunk` for a legacy completion chunk."""
    access = _ACCESS.get(None)
    if access is None:
        return
    if "first_token" not in access and any(c["text"] for c in chunk["choices"]):
        access["first_token"] = time.perf_counter()
    if "usage" in chunk:
        _access_usage(_UsageView(chunk["usage"]))


def _access_chunk(chunk: ChatCompletionChunk) -> None:
    """Note the first token's time and the usage of a streamed chunk for the access line."""
    access = _ACCESS.get(None)
    if access is None:
        return
    if "first_token" not in access and any(
        choice.delta.content or choice.delta.tool_calls for choice in chunk.choices
    ):
        access["first_token"] = time.perf_counter()
    _access_usage(chunk.usage)


def _log_access(request: Request, status: int, started: float, access: dict[str, Any]) -> None:
    """One line per request: client, method, path, status, tokens, TTFT, duration."""
    if not access_log.isEnabledFor(logging.INFO):
        return
    client = f"{request.client[0]}:{request.client[1]}" if request.client else "-"
    parts = [f'{client} "{request.method} {request.path}" {status}']
    if "prompt_tokens" in access:
        parts.append(f"prompt_tokens={access['prompt_tokens']}")
        parts.append(f"completion_tokens={access['completion_tokens']}")
    if "first_token" in access:
        parts.append(f"ttft_ms={(access['first_token'] - started) * 1000:.1f}")
    parts.append(f"duration_ms={(time.perf_counter() - started) * 1000:.1f}")
    access_log.info(" ".join(parts))


def _note(reply: dict[str, Any], chunk: ChatCompletionChunk) -> None:
    """Keep what the server span reports of a streamed reply."""
    if "response_id" not in reply:
        reply["response_id"] = chunk.id
        reply["model"] = chunk.model
    if chunk.usage is not None:
        reply["usage"] = chunk.usage
    for choice in chunk.choices:
        if choice.finish_reason is not None:
            reply["finish_reason"] = choice.finish_reason


async def _send_error(writer: ResponseWriter, error: RequestError) -> None:
    extra = {"retry-after": _RETRY_AFTER} if error.status == 503 else None
    kind = "invalid_request_error" if error.status == 404 else None
    await writer.send_error(
        error.status,
        redact(error.message),
        type=kind,
        code=error.code,
        param=error.param,
        headers=extra,
    )


async def _send_messages_error(writer: ResponseWriter, error: RequestError) -> None:
    """:func:`_send_error` in Anthropic's error shape (the ``/v1/messages`` route)."""
    extra = {"retry-after": _RETRY_AFTER} if error.status == 503 else None
    await writer.send_json(error.status, messages_error(error.status, redact(error.message)), extra)


# ---------------------------------------------------------------------- command line


_EXAMPLES = """\b
Examples:
  {prog}                                  (the embedded default model on :8000)
  {prog} ./Qwen3-0.6B --port 8080 --kv-cache-mib 1024 --dtype bfloat16
  {prog} --max-num-seqs 32 --api-key "$KEY" --limit-concurrency 256
"""


class _ServeCommand(click.Command):
    """The server's options; the examples name whatever program runs them."""

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """Examples under the name the command runs as (``swiftclient serve`` or ``python -m
        local_engine.server``)."""
        formatter.write_paragraph()
        formatter.write_text(_EXAMPLES.format(prog=ctx.command_path))


@click.command(cls=_ServeCommand, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("model_dir", required=False, default="")
@click.option(
    "--model",
    "-m",
    "model",
    metavar="DIR",
    help="The model directory, .gguf file or embedded model (as MODEL_DIR, and `chat -m`).",
)
@click.option(
    "--generation-config",
    type=click.Choice(["auto", "none"]),
    default="auto",
    show_default=True,
    help="auto: the model's generation_config.json sets the default sampling parameters "
    "(do_sample: false means greedy), as in vLLM; none: ignore it (temperature 1).",
)
@click.option(
    "--access-log/--no-access-log",
    default=True,
    show_default=True,
    help="Print one line per request (status, tokens, time to first token, duration).",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to bind.")
@click.option(
    "--port", type=int, default=8000, show_default=True, help="Port (0 picks a free one)."
)
@click.option(
    "--api-key",
    envvar="SWIFTCLIENT_SERVER_API_KEY",
    help="Require this bearer key (default: $SWIFTCLIENT_SERVER_API_KEY; none: open).",
)
@click.option("--model-name", help="The model id to report (default: the directory's name).")
@click.option(
    "--max-tokens-limit",
    type=click.IntRange(min=1),
    default=4096,
    show_default=True,
    help="Largest max_tokens a request may ask for.",
)
@click.option(
    "--default-max-tokens",
    type=click.IntRange(min=1),
    default=1024,
    show_default=True,
    help="max_tokens of requests that set none.",
)
@click.option(
    "--max-body-bytes",
    type=click.IntRange(min=1),
    default=8 * 1024 * 1024,
    show_default=True,
    help="Largest request body.",
)
@click.option(
    "--max-model-len", type=click.IntRange(min=1), help="Context length (default: the model's)."
)
@click.option(
    "--max-num-seqs",
    type=click.IntRange(min=1),
    default=64,
    show_default=True,
    help="Requests decoded together at most.",
)
@click.option(
    "--max-num-batched-tokens",
    type=click.IntRange(min=1),
    default=2048,
    show_default=True,
    help="Tokens one engine step computes at most (prefill chunks and decodes together).",
)
@click.option(
    "--max-waiting",
    type=click.IntRange(min=0),
    default=1024,
    show_default=True,
    help="Queued requests before 503.",
)
@click.option(
    "--kv-cache-mib",
    type=click.IntRange(min=1),
    default=256,
    show_default=True,
    help="KV cache size in MiB.",
)
@click.option("--dtype", help="float32, bfloat16 or float16 (default: the model's).")
@click.option(
    "--device", default="cpu", show_default=True, help="torch device (cpu, cuda, cuda:1...)."
)
@click.option(
    "--loop",
    type=click.Choice(["auto", "asyncio", "uvloop"]),
    default="auto",
    show_default=True,
    help="Event loop: auto uses uvloop when installed (uvicorn's choice).",
)
@click.option(
    "--limit-concurrency",
    type=click.IntRange(min=1),
    help="Answer 503 past this many open connections or running requests (default: none).",
)
@click.option(
    "--timeout-keep-alive",
    type=click.FloatRange(min=0, min_open=True),
    default=5.0,
    show_default=True,
    help="Seconds an idle kept-alive connection stays open.",
)
@click.option(
    "--timeout-request-head",
    type=click.FloatRange(min=0, min_open=True),
    default=10.0,
    show_default=True,
    help="Seconds a client has to send a complete request head.",
)
@click.option(
    "--timeout-write",
    type=click.FloatRange(min=0, min_open=True),
    default=60.0,
    show_default=True,
    help="Seconds a stream waits for a client that stopped reading, then drops it.",
)
@click.option(
    "--root-path", default="", help="Path prefix stripped by a reverse proxy (e.g. /api)."
)
@click.option(
    "--threads", type=click.IntRange(min=1), help="torch CPU threads (default: torch's count)."
)
@click.option(
    "--tune-malloc/--no-tune-malloc",
    default=None,
    help=(
        "Keep freed CPU tensor memory for the next step (glibc mallopt, process-wide). "
        "Default: off here (the server steps in worker threads, whose heaps keep it anyway)."
    ),
)
@click.option(
    "--quantization",
    type=click.Choice(["int8", "int4", "fp8"]),
    help=(
        "int8: int8 weights; int4: 4-bit weights with a scale per 32 values; "
        "fp8: fp8 weights (CUDA GPUs with compute capability 8.9+)."
    ),
)
@click.option(
    "--speculative",
    type=click.Choice(["ngram", "draft"]),
    help="Speculative decoding: ngram (prompt lookup) or draft (needs --draft-model).",
)
@click.option("--draft-model", help="Directory of the draft model (--speculative draft).")
@click.option(
    "--num-speculative-tokens",
    type=int,
    default=12,
    show_default=True,
    help="Draft tokens per step at most.",
)
def command(**options: Any) -> int:
    """Serve a local model over an OpenAI-compatible chat-completions API.

    MODEL_DIR is a Hugging Face model directory, a llama.cpp .gguf file, or the name of an
    embedded model; with none, the embedded default model. Runs until SIGINT or SIGTERM.
    """
    args = argparse.Namespace(**options)
    handler = _print_access_lines() if args.access_log else None
    try:
        _build(args).run()
    except OSError as exc:
        if exc.errno in _UNRESOLVED:  # a name no resolver knows: the flag is what to fix
            raise click.BadParameter(
                f"{args.host!r} is no address this machine can bind (the name is unknown)",
                param_hint="'--host'",
            ) from exc
        raise click.ClickException(f"cannot serve on {args.host}:{args.port}: {exc}") from exc
    except KeyboardInterrupt:
        pass
    finally:
        if handler is not None:  # the stream it writes to may not outlive this command
            access_log.removeHandler(handler)
    print("stopped", flush=True)
    return 0


_UNRESOLVED = frozenset(
    getattr(socket, name) for name in ("EAI_NONAME", "EAI_NODATA") if hasattr(socket, name)
)
"""getaddrinfo's errors for a host name nothing resolves (asyncio and uvloop pass them on as
the ``errno`` of the bind's ``OSError``)."""


def _print_access_lines() -> logging.Handler:
    """Send the access lines to this command's stderr while it serves; the handler, for
    the command to remove when it ends."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    access_log.addHandler(handler)
    access_log.setLevel(logging.INFO)
    return handler


def _engine_config(args: argparse.Namespace) -> EngineConfig:
    """The engine settings the command line asks for (ConfigurationError when they clash)."""
    from .engine import EngineConfig, SpeculativeConfig

    if args.speculative is None and args.draft_model is not None:
        raise ConfigurationError("--draft-model needs --speculative draft")
    try:
        speculative = None
        if args.speculative is not None:
            speculative = SpeculativeConfig(
                method=args.speculative,
                draft_model=args.draft_model,
                num_speculative_tokens=args.num_speculative_tokens,
            )
        return EngineConfig(
            kv_cache_memory=args.kv_cache_mib * 2**20,
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            max_model_len=args.max_model_len,
            max_waiting=args.max_waiting,
            dtype=args.dtype,
            device=args.device,
            num_threads=args.threads,
            tune_malloc=args.tune_malloc,
            quantization=args.quantization,
            speculative=speculative,
        )
    except EngineConfigError as exc:
        raise ConfigurationError(str(exc)) from exc


def _build(args: argparse.Namespace) -> LocalServer:
    if args.model:
        if args.model_dir and args.model_dir != args.model:
            raise click.UsageError(
                f"two models given: MODEL_DIR {args.model_dir!r} and -m {args.model!r}"
            )
        args.model_dir = args.model
    config = _engine_config(args)
    backend = LocalBackend(
        args.model_dir or None,
        engine_config=config,
        default_max_tokens=min(args.default_max_tokens, args.max_tokens_limit),
        generation_config=args.generation_config,
    )
    return LocalServer(
        backend,
        host=args.host,
        port=args.port,
        api_key=args.api_key,
        max_body_bytes=args.max_body_bytes,
        max_tokens_limit=args.max_tokens_limit,
        model_name=args.model_name,
        limit_concurrency=args.limit_concurrency,
        keepalive_timeout=args.timeout_keep_alive,
        head_timeout=args.timeout_request_head,
        write_timeout=args.timeout_write,
        root_path=args.root_path,
        loop=args.loop,
        access_log=args.access_log,
    )


def main(
    argv: Sequence[str] | None = None,
    *,
    prog_name: str = "python -m local_engine.server",
    debug: bool | None = None,
) -> int:
    """Run the server until SIGINT or SIGTERM; returns the exit status.

    This is ``swiftclient serve`` (found through the ``swiftclient.servers`` entry point)
    and ``python -m local_engine.server``: one command, one set of options; errors are one
    line, as everywhere in the command line.
    """
    return run_command(command, argv, prog_name, debug=debug)


if __name__ == "__main__":
    raise SystemExit(main())
