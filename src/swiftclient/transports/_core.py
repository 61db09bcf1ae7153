"""What every transport shares: reading an SDK's request (Chat Completions, or a Responses
or Messages request translated by :mod:`swiftclient.wire`), running it through the client,
and writing the answer (JSON, SSE or an error) as the request's wire would.

No HTTP library is imported here; the adapters (``_httpx``, ``_httpx2``) build their own
request and response objects around these pieces. A wire is a :class:`Wire`: how a whole
completion, a failed call and a stream (an :class:`Encoder`) are written on it.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import pydantic
import pydantic_core

from .. import errors
from .._deadline import Timeout
from ..asgi._wire import error_body
from ..types import Attempt, ChatCompletion, ChatCompletionChunk, ChatRequest, Timing
from ..wire import chat_completion_body, listed_names, messages, printable_name, responses

__all__ = [
    "CHAT",
    "DONE",
    "SSE",
    "Encoder",
    "Exchange",
    "MessagesWire",
    "Reply",
    "ResponsesWire",
    "Wire",
    "chunk_event",
    "completion_reply",
    "error_event",
    "error_reply",
    "parse",
    "forwarded_headers",
    "sdk_timeout",
    "sse_sync",
    "stream_headers",
]

DONE = b"data: [DONE]\n\n"
_IGNORED = "x-ignored-fields"
_JSON = "application/json"
_FIELDS = frozenset(ChatRequest.model_fields) - {"model", "messages", "stream", "extra_body"}
_CHUNK = pydantic.TypeAdapter(ChatCompletionChunk)
# Headers a provider's error answer keeps that describe the connection, not the answer.
_HOP_BY_HOP = frozenset(
    {"connection", "content-length", "content-encoding", "keep-alive", "transfer-encoding"}
)


class Encoder(Protocol):
    """Writes one stream on a wire: the bytes each chunk brings (possibly none), the end,
    or a failure after the stream began."""

    def chunk(self, chunk: ChatCompletionChunk) -> bytes:
        """The SSE bytes of one chunk (empty when the chunk brings nothing to send)."""
        ...

    def end(self) -> bytes:
        """The bytes that end the stream."""
        ...

    def fail(self, exc: errors.SwiftClientError) -> bytes:
        """The in-band error that ends a stream which broke off."""
        ...


class Wire(Protocol):
    """How a call's answer is written on one wire."""

    headers: list[tuple[str, str]]
    """Headers every answer carries (``x-ignored-fields``)."""

    def completion(self, completion: ChatCompletion) -> Reply:
        """A finished completion as the wire's 200 answer."""
        ...

    def error(self, exc: errors.SwiftClientError) -> Reply:
        """A failed call as the wire's error answer."""
        ...

    def encoder(self) -> Encoder:
        """A new stream's encoder."""
        ...


@dataclass(frozen=True, slots=True)
class Exchange:
    """A request as the client runs it: ``client.chat`` / ``client.stream`` arguments
    (``params`` are :class:`ChatRequest` fields; fields the contract does not know travel
    in ``extra_body``), and the :class:`Wire` its answer is written on."""

    model: str | None
    messages: list[Any]
    stream: bool
    params: dict[str, Any]
    wire: Wire


@dataclass(slots=True)
class Reply:
    """An answer that is not a stream: status, headers and body."""

    status: int
    headers: list[tuple[str, str]] = field(default_factory=list)
    content: bytes = b""


def parse(method: str, path: str, body: bytes) -> Exchange | Reply:
    """The exchange a request asks for, or the error :class:`Reply` when it asks for
    something the transport does not serve (a path other than ``.../chat/completions``,
    ``.../responses`` or ``.../messages``, a body that is not a request of that wire), in
    the error shape of the path's wire."""
    route = path.rstrip("/")
    fail = _error
    if route.endswith("/chat/completions"):
        reader = _chat_exchange
    elif route.endswith("/responses"):
        reader = _responses_exchange
    elif route.endswith("/messages"):
        reader, fail = _messages_exchange, _messages_error
    else:
        return _error(
            404,
            "swiftclient's transport serves POST /chat/completions, POST /responses and "
            f"POST /messages, not {path}",
        )
    if method != "POST":
        return fail(405, f"{method} {path}: only POST is served")
    try:
        data = pydantic_core.from_json(body) if body else None
    except ValueError:
        return fail(400, "the request body is not JSON")
    if not isinstance(data, dict):
        return fail(400, "the request body must be a JSON object")
    model = data.get("model")
    if model is not None and not isinstance(model, str):
        return fail(400, "model must be a string", param="model")
    return reader(data)


FORWARDED_HEADERS = ("anthropic-beta",)
"""Headers of an SDK's request that go on to the provider with the call (an Anthropic
backend's beta features; another provider ignores an unknown header). The rest are the
SDK's own (its key, its version, its client's name) and stay here."""


def forwarded_headers(headers: Mapping[str, str]) -> dict[str, str] | None:
    """The headers of an SDK's request that go on to the provider (None: none)."""
    found = {name: headers[name] for name in FORWARDED_HEADERS if name in headers}
    return found or None


def sdk_timeout(base: Timeout, extensions: Mapping[str, Any], stream: bool) -> Timeout:
    """The call's limits: the client's ``base``, tightened by the SDK's own timeout (httpx's
    ``extensions["timeout"]``, what ``timeout=`` on the SDK or on one of its calls sets),
    whose ``read`` limit is how long the SDK waits for bytes. A whole answer comes in one
    read, so it bounds the call's ``total``; a stream's headers come with its first token,
    then its events, so it bounds ``first_token`` and ``idle``. The SDK's ``connect`` and
    ``pool`` limits are about connections the transport does not make."""
    limits = extensions.get("timeout")
    read = limits.get("read") if isinstance(limits, Mapping) else None
    if isinstance(read, bool) or not isinstance(read, int | float) or not read > 0:
        return base

    def tighter(limit: float | None) -> float:
        return float(read) if limit is None else min(limit, float(read))

    if stream:
        return replace(base, first_token=tighter(base.first_token), idle=tighter(base.idle))
    return replace(base, total=tighter(base.total))


def _split(data: Mapping[str, Any]) -> dict[str, Any]:
    """A chat body's fields other than model, messages and stream, as ``client.chat``
    parameters: :class:`ChatRequest` fields as they are, the others in ``extra_body``."""
    params: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for name, value in data.items():
        if name in _FIELDS:
            params[name] = value
        elif name not in ("model", "messages", "stream", "extra_body"):
            extra[name] = value
    if isinstance(data.get("extra_body"), dict):
        extra.update(data["extra_body"])
    if extra:
        params["extra_body"] = extra
    return params


def _chat_exchange(data: dict[str, Any]) -> Exchange | Reply:
    if not isinstance(data.get("messages"), list):
        return _error(400, "the request body must be a JSON object with messages")
    if data.get("extra_body") is not None and not isinstance(data["extra_body"], dict):
        return _error(400, "extra_body must be an object", param="extra_body")  # was dropped
    stream = data.get("stream") is True
    options = data.get("stream_options")
    usage = not stream or (isinstance(options, dict) and options.get("include_usage") is True)
    wire = CHAT if usage else _CHAT_WITHOUT_USAGE
    params = _split(data)
    if isinstance(options, dict) and "include_usage" in options:
        # the client asks its provider for usage whatever the SDK wants (its own accounting
        # needs it); the SDK gets it only when it asked (the wire's encoder sees to that)
        rest = {k: v for k, v in options.items() if k != "include_usage"}
        if rest:
            params["stream_options"] = rest
        else:
            params.pop("stream_options", None)
    return Exchange(data.get("model") or None, data["messages"], stream, params, wire)


def _responses_exchange(data: dict[str, Any]) -> Exchange | Reply:
    """A Responses request as a chat call (:func:`swiftclient.wire.responses.chat_fields`);
    a stateful or unknown feature is a 400 naming its ``param``."""
    ignored: list[str] = []
    try:
        fields, echoed = responses.chat_fields(data, ignored)
    except responses.ResponsesRequestError as exc:
        return _error(400, str(exc), param=exc.param)
    stream = fields.get("stream") is True
    params = _split(fields)
    if "tools" not in params:
        params.pop("parallel_tool_calls", None)  # chat providers refuse it without tools
    if stream:
        params["stream_options"] = {"include_usage": True}  # response.completed has usage
    model = data.get("model") or None
    wire = ResponsesWire(responses.ResponseEcho(model or "", echoed), ignored)
    return Exchange(model, fields["messages"], stream, params, wire)


def _messages_exchange(data: dict[str, Any]) -> Exchange | Reply:
    """A Messages request as a chat call (:func:`swiftclient.wire.messages.chat_fields`)."""
    ignored: list[str] = []
    try:
        fields = messages.chat_fields(data, ignored)
    except messages.MessagesRequestError as exc:
        return _messages_error(400, str(exc))
    stream = fields.get("stream") is True
    params = _split(fields)
    if stream:
        params["stream_options"] = {"include_usage": True}  # message_delta has usage
    model = data.get("model") or None
    return Exchange(model, fields["messages"], stream, params, MessagesWire(model, ignored))


def _error(status: int, message: str, *, param: str | None = None) -> Reply:
    body = error_body(status, message, param=param)
    return Reply(status, [("content-type", _JSON)], pydantic_core.to_json(body))


def _messages_error(status: int, message: str, *, param: str | None = None) -> Reply:
    body = messages.messages_error(status, message)
    return Reply(status, [("content-type", _JSON)], pydantic_core.to_json(body))


def _status_of(exc: BaseException) -> int:
    if isinstance(exc, errors.APIStatusError):
        return exc.status_code
    if isinstance(exc, errors.ClientClosedError):
        return 503  # shutting down: not the request's fault
    if isinstance(exc, errors.ConfigurationError):
        return 400
    if isinstance(exc, errors.APITimeoutError):
        return 504
    if isinstance(exc, errors.OverloadedError):
        return 503
    if isinstance(exc, errors.EngineError):
        return 500
    return 502  # a connection failure, a malformed or in-band provider error


_RESPONSES_NAMES = (
    (re.compile(r"\bmax_completion_tokens\b"), "max_output_tokens"),
    (re.compile(r"\btools\.(\d+)\.function\.(\w+)"), r"tools[\1].\2"),
    (re.compile(r"\bresponse_format\b"), "text.format"),
)
"""A chat request's field paths as the Responses API names what the caller sent."""
_MESSAGES_NAMES = (
    (re.compile(r"\bmax_completion_tokens\b"), "max_tokens"),
    (re.compile(r"\btools\.(\d+)\.function\.parameters"), r"tools[\1].input_schema"),
    (re.compile(r"\btools\.(\d+)\.function\.(\w+)"), r"tools[\1].\2"),
    (re.compile(r"\bresponse_format\b"), "output_config.format"),
)
"""A chat request's field paths as the Messages API names what the caller sent."""
_INVALID = "invalid chat request: "


def _as_sent(
    exc: errors.SwiftClientError, names: Sequence[tuple[re.Pattern[str], str]]
) -> errors.SwiftClientError:
    """A refusal of the chat request the wire made, naming the fields the caller sent (a
    Responses ``max_output_tokens`` read ``max_completion_tokens``)."""
    message = str(exc)
    if not isinstance(exc, errors.ConfigurationError) or not message.startswith(_INVALID):
        return exc
    for pattern, name in names:
        message = pattern.sub(name, message)
    return errors.ConfigurationError(message)


def error_reply(exc: errors.SwiftClientError) -> Reply:
    """The HTTP answer the SDK expects for a failed call: the provider's status, body and
    headers (``retry-after``, ``x-request-id``, rate limits) when it answered with an error,
    else a status for what went wrong (400 bad arguments, 504 timeouts, 503 an overloaded
    engine, 502 connection failures) and an OpenAI-style error body."""
    status = _status_of(exc)
    if isinstance(exc, errors.APIStatusError):
        headers = [("content-type", _JSON)]
        headers.extend(
            (name, value)
            for name, value in exc.headers.items()
            if name not in _HOP_BY_HOP and name != "content-type"
        )
        body = exc.body
        if isinstance(body, dict) and isinstance(body.get("error"), dict | str):
            return Reply(status, headers, pydantic_core.to_json(body))
        return Reply(status, headers, pydantic_core.to_json(error_body(status, str(exc))))
    reply = _error(status, str(exc))
    reply.headers.extend(_retry_headers(exc))
    return reply


def _retry_headers(exc: errors.SwiftClientError) -> list[tuple[str, str]]:
    """``x-should-retry: false`` for a failure no retry can mend (the client was closed):
    the ``openai`` and ``anthropic`` SDKs retry a 503 twice, with backoff, unless told."""
    return [("x-should-retry", "false")] if isinstance(exc, errors.ClientClosedError) else []


def error_event(exc: errors.SwiftClientError) -> bytes:
    """An SSE error event for a failure after the stream began (the SDK raises on it)."""
    body = error_body(_status_of(exc), str(exc), code=type(exc).__name__)
    return b"data: " + pydantic_core.to_json(body) + b"\n\n"


def chunk_event(chunk: ChatCompletionChunk) -> bytes:
    """One chunk as the SSE event a provider sends: fields without a value are left out,
    as providers do (an SDK that merges deltas would take a ``null`` for a new value)."""
    return b"data: " + _CHUNK.dump_json(chunk, exclude_none=True) + b"\n\n"


def _winner(timing: Timing) -> Attempt | None:
    for attempt in timing.attempts:
        if attempt.outcome in ("ok", "pending"):
            return attempt
    return None


def _named(ignored: list[str]) -> str:
    """The ``x-ignored-fields`` value naming a wire's ``ignored`` fields, in order: names a
    caller chose, so escaped to printable ASCII (a non-ASCII name raised
    ``UnicodeEncodeError`` at the SDK, a CR-LF in one wrote a header of its own)."""
    return listed_names(list(dict.fromkeys(printable_name(name) for name in ignored)))


def _call_headers(
    timing: Timing | None, own: Sequence[tuple[str, str]] = ()
) -> list[tuple[str, str]]:
    """Which target answered (``x-swiftclient-target``), how many attempts it took, the
    answering provider's rate-limit, request-id and ``x-ignored-fields`` headers (the
    winner's :attr:`~swiftclient.types.Attempt.headers`, none of a hedge that lost), and
    the wire's ``own`` headers; the fields the wire and the provider ignored are named in
    one ``x-ignored-fields``."""
    out: list[tuple[str, str]] = []
    if timing is not None:
        out.append(("x-swiftclient-attempts", str(len(timing.attempts))))
        winner = _winner(timing)
        if winner is not None:
            out.append(("x-swiftclient-target", f"{winner.backend}/{winner.model}"))
            if winner.headers:
                out.extend(winner.headers.items())
    out.extend(own)
    ignored = [value for name, value in out if name == _IGNORED]
    if len(ignored) < 2:
        return out
    names = dict.fromkeys(n.strip() for value in ignored for n in value.split(",") if n.strip())
    return [(name, value) for name, value in out if name != _IGNORED] + [
        (_IGNORED, ", ".join(names))
    ]


def completion_reply(completion: ChatCompletion) -> Reply:
    """A finished completion as the provider's 200 JSON answer."""
    headers = [("content-type", _JSON), *_call_headers(completion.timing)]
    return Reply(200, headers, pydantic_core.to_json(chat_completion_body(completion)))


def stream_headers(timing: Timing, own: Sequence[tuple[str, str]] = ()) -> list[tuple[str, str]]:
    """The headers of a stream's 200 answer (sent once the first token committed), with
    the wire's ``own``."""
    return [
        ("content-type", "text/event-stream"),
        ("cache-control", "no-cache"),
        *_call_headers(timing, own),
    ]


class _ChatEncoder:
    """Chunks as they come; without ``usage`` (the SDK did not ask for
    ``stream_options.include_usage``): the usage-only chunk is left out and no chunk carries
    usage, as OpenAI sends it (a loop reading ``chunk.choices[0]`` would fail on it). The
    client itself still asks its provider for usage, for its own accounting."""

    __slots__ = ("_usage",)

    def __init__(self, usage: bool) -> None:
        self._usage = usage

    def chunk(self, chunk: ChatCompletionChunk) -> bytes:
        if not self._usage:
            if not chunk.choices:  # the usage chunk, also when its usage was dropped
                return b""
            if chunk.usage is not None:
                chunk = chunk.model_copy(update={"usage": None})
        return chunk_event(chunk)

    def end(self) -> bytes:
        return DONE

    def fail(self, exc: errors.SwiftClientError) -> bytes:
        return error_event(exc)


class _ChatWire:
    """Chat Completions: the client's own types, written as the provider would (a stream's
    usage only when the SDK asked for it)."""

    __slots__ = ("_usage", "headers")

    def __init__(self, usage: bool = True) -> None:
        self._usage = usage
        self.headers: list[tuple[str, str]] = []

    def completion(self, completion: ChatCompletion) -> Reply:
        return completion_reply(completion)

    def error(self, exc: errors.SwiftClientError) -> Reply:
        return error_reply(exc)

    def encoder(self) -> Encoder:
        return _ChatEncoder(self._usage)


CHAT: Wire = _ChatWire()
"""The Chat Completions wire (stateless, so one for every exchange that may carry usage)."""
_CHAT_WITHOUT_USAGE: Wire = _ChatWire(usage=False)
"""The Chat Completions wire of a stream whose request did not ask for usage."""


class _ResponsesEncoder:
    """A chat stream as the Responses event stream (``response.created`` first)."""

    __slots__ = ("_echo", "_events", "_started")

    def __init__(self, echo: responses.ResponseEcho) -> None:
        self._echo = echo
        self._events = responses.ResponseEvents(echo)
        self._started = False

    def _bytes(self, events: list[dict[str, Any]]) -> bytes:
        if not self._started:
            self._started = True
            events = [*self._events.start(), *events]
        return b"".join(responses.event_bytes(event) for event in events)

    def chunk(self, chunk: ChatCompletionChunk) -> bytes:
        if not self._started and chunk.model:
            self._echo.model = chunk.model  # the model that answers, as on chat
        return self._bytes(self._events.feed(chunk))

    def end(self) -> bytes:
        return self._bytes(self._events.end())

    def fail(self, exc: errors.SwiftClientError) -> bytes:
        return self._bytes([self._events.fail(_responses_code(exc), str(exc))])


def _responses_code(exc: errors.SwiftClientError) -> str:
    """The ``response.failed`` error code: a value of the Responses API's own list
    (``rate_limit_exceeded`` for a 429, else ``server_error``), not a class name."""
    if isinstance(exc, errors.RateLimitError):
        return "rate_limit_exceeded"
    return "server_error"


class ResponsesWire:
    """OpenAI's Responses API: a ``response`` object, or its named event stream
    (:mod:`swiftclient.wire.responses`); errors in OpenAI's shape, as on chat."""

    __slots__ = ("_echo", "headers")

    def __init__(self, echo: responses.ResponseEcho, ignored: list[str]) -> None:
        """Answer for the request ``echo`` describes; name the ``ignored`` fields."""
        self._echo = echo
        self.headers: list[tuple[str, str]] = [(_IGNORED, _named(ignored))] if ignored else []

    def completion(self, completion: ChatCompletion) -> Reply:
        """The completion as a ``response`` object."""
        self._echo.model = completion.model or self._echo.model
        body = pydantic_core.to_json(responses.response_body(completion, self._echo))
        headers = [("content-type", _JSON), *_call_headers(completion.timing, self.headers)]
        return Reply(200, headers, body)

    def error(self, exc: errors.SwiftClientError) -> Reply:
        """The failure as on chat (the same error shape), naming the Responses fields."""
        reply = error_reply(_as_sent(exc, _RESPONSES_NAMES))
        reply.headers.extend(self.headers)
        return reply

    def encoder(self) -> Encoder:
        """The stream's Responses events."""
        return _ResponsesEncoder(self._echo)


class _MessagesEncoder:
    """A chat stream as the Messages event stream (``message_start`` first)."""

    __slots__ = ("_events",)

    def __init__(self, model: str) -> None:
        self._events = messages.MessageEvents(model)

    @staticmethod
    def _bytes(events: list[tuple[str, dict[str, Any]]]) -> bytes:
        return b"".join(messages.event_bytes(kind, data) for kind, data in events)

    def chunk(self, chunk: ChatCompletionChunk) -> bytes:
        return self._bytes(self._events.feed(chunk))

    def end(self) -> bytes:
        return self._bytes(self._events.end())

    def fail(self, exc: errors.SwiftClientError) -> bytes:
        return self._bytes([self._events.fail(_messages_status(exc), str(exc))])


def _messages_status(exc: errors.SwiftClientError) -> int:
    """The status of a failure on the Messages wire: as on chat, but an overloaded engine
    is Anthropic's 529 ``overloaded_error``."""
    if isinstance(exc, errors.OverloadedError) and not isinstance(exc, errors.APIStatusError):
        return 529
    return _status_of(exc)


def _provider_error(body: Any) -> tuple[str | None, str | None]:
    """The message and ``type`` of a provider's error body, in OpenAI's or Anthropic's
    shape (None for what it lacks)."""
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, str):
        return error, None
    if not isinstance(error, dict):
        return None, None
    message, kind = error.get("message"), error.get("type")
    return (
        message if isinstance(message, str) else None,
        kind if isinstance(kind, str) else None,
    )


class MessagesWire:
    """Anthropic's Messages API: a ``message`` body, or its event stream
    (:mod:`swiftclient.wire.messages`); errors in Anthropic's shape."""

    __slots__ = ("_model", "headers")

    def __init__(self, model: str | None, ignored: list[str]) -> None:
        """Answer a request for ``model``; name the ``ignored`` fields."""
        self._model = model or ""
        self.headers: list[tuple[str, str]] = [(_IGNORED, _named(ignored))] if ignored else []

    def completion(self, completion: ChatCompletion) -> Reply:
        """The completion as a ``message`` body."""
        model = completion.model or self._model
        body = pydantic_core.to_json(messages.message_body(completion, model))
        headers = [("content-type", _JSON), *_call_headers(completion.timing, self.headers)]
        return Reply(200, headers, body)

    def error(self, exc: errors.SwiftClientError) -> Reply:
        """The failure in Anthropic's error shape: the provider's status, headers, message
        and (one of Anthropic's) error type when it answered with an error, else a status
        for what went wrong."""
        exc = _as_sent(exc, _MESSAGES_NAMES)
        status = _messages_status(exc)
        headers = [("content-type", _JSON), *self.headers]
        message, kind = str(exc), None
        if isinstance(exc, errors.APIStatusError):
            headers.extend(
                (name, value)
                for name, value in exc.headers.items()
                if name not in _HOP_BY_HOP and name != "content-type"
            )
            provided, kind = _provider_error(exc.body)
            message = provided or message
        headers.extend(_retry_headers(exc))
        body = pydantic_core.to_json(messages.messages_error(status, message, kind))
        return Reply(status, headers, body)

    def encoder(self) -> Encoder:
        """The stream's Messages events."""
        return _MessagesEncoder(self._model)


class SSE:
    """The stream's events as its wire writes them, one write per chunk as it arrives (a
    chunk that brings nothing to send is skipped), then the wire's end; a failure after the
    stream began becomes the wire's in-band error. An iterator object, not an async
    generator, so that leaving it early leaves nothing for the event loop to finalize."""

    __slots__ = ("_chunks", "_encoder", "_ended")

    def __init__(self, chunks: AsyncIterator[ChatCompletionChunk], encoder: Encoder) -> None:
        self._chunks = chunks
        self._encoder = encoder
        self._ended = False

    def __aiter__(self) -> SSE:
        return self

    async def __anext__(self) -> bytes:
        while not self._ended:
            try:
                chunk = await self._chunks.__anext__()
            except StopAsyncIteration:
                self._ended = True
                return self._encoder.end()
            except errors.SwiftClientError as exc:
                self._ended = True
                return self._encoder.fail(exc)
            data = self._encoder.chunk(chunk)
            if data:
                return data
        raise StopAsyncIteration


def sse_sync(chunks: Iterator[ChatCompletionChunk], encoder: Encoder) -> Generator[bytes]:
    """:class:`SSE` for a blocking stream."""
    try:
        for chunk in chunks:
            data = encoder.chunk(chunk)
            if data:
                yield data
    except errors.SwiftClientError as exc:
        yield encoder.fail(exc)
        return
    yield encoder.end()
