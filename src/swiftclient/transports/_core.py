"""What every transport shares: reading an SDK's Chat Completions request, running it
through the client, and writing the answer (JSON, SSE or an error) as the wire would.

No HTTP library is imported here; the adapters (``_httpx``, ``_httpx2``) build their own
request and response objects around these pieces.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pydantic
import pydantic_core

from .. import errors
from ..asgi._wire import error_body
from ..types import Attempt, ChatCompletion, ChatCompletionChunk, ChatRequest, Timing

__all__ = [
    "DONE",
    "SSE",
    "Exchange",
    "Reply",
    "chunk_event",
    "completion_reply",
    "error_event",
    "error_reply",
    "parse",
    "sse_sync",
    "stream_headers",
]

DONE = b"data: [DONE]\n\n"
_JSON = "application/json"
_FIELDS = frozenset(ChatRequest.model_fields) - {"model", "messages", "stream", "extra_body"}
_CHUNK = pydantic.TypeAdapter(ChatCompletionChunk)
_COMPLETION = pydantic.TypeAdapter(ChatCompletion)
# Headers a provider's error answer keeps that describe the connection, not the answer.
_HOP_BY_HOP = frozenset(
    {"connection", "content-length", "content-encoding", "keep-alive", "transfer-encoding"}
)


@dataclass(frozen=True, slots=True)
class Exchange:
    """A Chat Completions request as the client runs it: ``client.chat`` / ``client.stream``
    arguments (``params`` are :class:`ChatRequest` fields; fields the contract does not know
    travel in ``extra_body``)."""

    model: str | None
    messages: list[Any]
    stream: bool
    params: dict[str, Any]


@dataclass(slots=True)
class Reply:
    """An answer that is not a stream: status, headers and body."""

    status: int
    headers: list[tuple[str, str]] = field(default_factory=list)
    content: bytes = b""


def parse(method: str, path: str, body: bytes) -> Exchange | Reply:
    """The exchange a request asks for, or the error :class:`Reply` when it asks for
    something the transport does not serve (a path other than ``.../chat/completions``, a
    body that is not a Chat Completions request)."""
    if not path.rstrip("/").endswith("/chat/completions"):
        return _error(404, f"swiftclient's transport serves POST /chat/completions, not {path}")
    if method != "POST":
        return _error(405, f"{method} {path}: only POST is served")
    try:
        data = pydantic_core.from_json(body) if body else None
    except ValueError:
        return _error(400, "the request body is not JSON")
    if not isinstance(data, dict) or not isinstance(data.get("messages"), list):
        return _error(400, "the request body must be a JSON object with messages")
    model = data.get("model")
    if model is not None and not isinstance(model, str):
        return _error(400, "model must be a string")
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
    return Exchange(model or None, data["messages"], data.get("stream") is True, params)


def _error(status: int, message: str, headers: Mapping[str, str] | None = None) -> Reply:
    out = [("content-type", _JSON)]
    if headers:
        out.extend(
            (k, v) for k, v in headers.items() if k not in _HOP_BY_HOP and k != "content-type"
        )
    return Reply(status, out, pydantic_core.to_json(error_body(status, message)))


def _status_of(exc: BaseException) -> int:
    if isinstance(exc, errors.APIStatusError):
        return exc.status_code
    if isinstance(exc, errors.ConfigurationError):
        return 400
    if isinstance(exc, errors.APITimeoutError):
        return 504
    if isinstance(exc, errors.OverloadedError):
        return 503
    if isinstance(exc, errors.EngineError):
        return 500
    return 502  # a connection failure, a malformed or in-band provider error


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
    return _error(status, str(exc))


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


def _call_headers(timing: Timing | None) -> list[tuple[str, str]]:
    """Which target answered (``x-swiftclient-target``) and how many attempts it took."""
    if timing is None:
        return []
    out = [("x-swiftclient-attempts", str(len(timing.attempts)))]
    winner = _winner(timing)
    if winner is not None:
        out.append(("x-swiftclient-target", f"{winner.backend}/{winner.model}"))
    return out


def completion_reply(completion: ChatCompletion) -> Reply:
    """A finished completion as the provider's 200 JSON answer."""
    headers = [("content-type", _JSON), *_call_headers(completion.timing)]
    return Reply(200, headers, _COMPLETION.dump_json(completion))


def stream_headers(timing: Timing) -> list[tuple[str, str]]:
    """The headers of a stream's 200 answer (sent once the first token committed)."""
    return [
        ("content-type", "text/event-stream"),
        ("cache-control", "no-cache"),
        *_call_headers(timing),
    ]


class SSE:
    """The stream's events, one per chunk as it arrives, then ``[DONE]``; a failure after
    the stream began becomes an error event. An iterator object, not an async generator,
    so that leaving it early leaves nothing for the event loop to finalize."""

    __slots__ = ("_chunks", "_ended")

    def __init__(self, chunks: AsyncIterator[ChatCompletionChunk]) -> None:
        self._chunks = chunks
        self._ended = False

    def __aiter__(self) -> SSE:
        return self

    async def __anext__(self) -> bytes:
        if self._ended:
            raise StopAsyncIteration
        try:
            chunk = await self._chunks.__anext__()
        except StopAsyncIteration:
            self._ended = True
            return DONE
        except errors.SwiftClientError as exc:
            self._ended = True
            return error_event(exc)
        return chunk_event(chunk)


def sse_sync(chunks: Iterator[ChatCompletionChunk]) -> Iterator[bytes]:
    """:func:`sse` for a blocking stream."""
    try:
        for chunk in chunks:
            yield chunk_event(chunk)
    except errors.SwiftClientError as exc:
        yield error_event(exc)
        return
    yield DONE
