"""The backend seam: one protocol every backend speaks.

A backend speaks one wire protocol and never retries, hedges or sleeps on its own; the
execution policies in the client compose around it.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from .._canonical import CallEncoding
from .._deadline import Deadline
from ..errors import ConfigurationError, is_credential_header
from ..types import ChatCompletion, ChatCompletionChunk, ChatRequest

__all__ = [
    "Backend",
    "BufferedChunkIterator",
    "RequestOptions",
    "ResponseBody",
    "Transport",
    "TransportResponse",
    "check_backend_name",
    "enter_backends",
]


def check_backend_name(name: str) -> str:
    """Return ``name`` if it can prefix model strings (non-empty, no ``/``), else raise."""
    if not name or "/" in name:
        raise ConfigurationError(f"backend name must be non-empty without '/': {name!r}")
    return name


async def enter_backends(backends: Iterable[object]) -> AsyncExitStack:
    """Enter every backend that is an async context manager (a local engine runs its driver
    inside one); returns the stack that exits them, last first. When one fails to enter,
    those already entered are exited before the error propagates."""
    async with AsyncExitStack() as stack:
        for backend in backends:
            if isinstance(backend, AbstractAsyncContextManager):
                await stack.enter_async_context(backend)
        entered = stack.pop_all()
    return entered


@dataclass(slots=True)
class RequestOptions:
    """Per-call settings the policy layer hands each attempt.

    ``idempotency_key`` is the same for every attempt of one call; ``headers`` are extra
    transport headers (backends that have no headers ignore them). ``encoding`` holds the
    call's request bytes and prompt prefix, built once and reused by every attempt (backends
    that send no bytes ignore it). ``on_response``, when set, is called with the status and
    headers of the HTTP response as soon as they arrive (admission learns rate limits from
    them); a backend without HTTP responses may call it with status None and headers of
    its own (the bundled engine's ``x-ignored-fields``: kept on the attempt, with no status
    for admission to learn from), or never.

    Each attempt builds its own and a backend only reads it: treat it as read-only. It is
    not frozen because a frozen dataclass's ``__init__`` sets each field through
    ``object.__setattr__``, several times the cost of a plain one, on every request.
    """

    idempotency_key: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    encoding: CallEncoding | None = None
    on_response: Callable[[int | None, Mapping[str, str]], None] | None = None


_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")
"""An HTTP header name (RFC 9110's token)."""
_CLIENT_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "content-type",
        "content-encoding",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "te",
        "upgrade",
        "idempotency-key",
    }
)
"""Headers the client sets itself for a request's framing and retries: not one call's."""
LIST_HEADERS = frozenset({"anthropic-beta"})
"""Headers whose value is a comma-separated list: one call's entries join the backend's."""


def check_headers(headers: Mapping[str, Any], from_key: Iterable[str] = ()) -> None:
    """Refuse header names and values no request could send (not strings, a name that is
    no HTTP token, control characters such as a key file's trailing newline, non-ASCII
    text), naming the header (or ``api_key`` for the headers in ``from_key``) and never
    the value: it may be a key."""
    keyed = set(from_key)
    for name, value in headers.items():
        where = "api_key" if name in keyed else f"header {name!r}"
        if not isinstance(name, str) or not isinstance(value, str):
            raise ConfigurationError(f"{where}: header names and values must be str")
        if not _HEADER_NAME.match(name):
            raise ConfigurationError(f"{where}: not an HTTP header name (letters, digits, -)")
        if not value.isascii() or any(ord(c) < 32 or ord(c) == 127 for c in value):
            raise ConfigurationError(
                f"{where} holds a control character (a trailing newline?) or non-ASCII text; "
                "an HTTP header cannot carry it"
            )


def header_mapping(headers: Any, what: str) -> dict[str, str]:
    """``headers`` (the argument called ``what``) checked as a mapping of sendable headers
    (:func:`check_headers`), with its names in lower case."""
    if not isinstance(headers, Mapping):
        raise ConfigurationError(
            f"{what} must be a mapping of header names to values, got {type(headers).__name__}"
        )
    check_headers(headers)
    return {name.lower(): value for name, value in headers.items()}


def call_headers(headers: Any) -> dict[str, str]:
    """One call's ``extra_headers``, checked: a mapping of sendable headers, no credential
    among them (a key belongs on the backend, where errors and logs are scrubbed of it)."""
    checked = header_mapping(headers, "extra_headers")
    for name in headers:
        if is_credential_header(name):
            raise ConfigurationError(
                f"extra_headers: {name!r} carries a credential; give keys to the backend "
                "(api_key=, or its headers=), where they are kept out of errors and logs"
            )
        if name.lower() in _CLIENT_HEADERS:
            raise ConfigurationError(
                f"extra_headers: the client sets {name!r} itself (the request's body, "
                "connection or retries depend on it)"
            )
    return checked


def with_call_headers(headers: Mapping[str, str], extra: Mapping[str, str]) -> dict[str, str]:
    """A backend's request ``headers`` with one call's ``extra`` ones (lower-case names) on
    top; a list header both give (:data:`LIST_HEADERS`) has the call's entries after the
    backend's, each once."""
    merged = {**headers, **extra}
    for name in LIST_HEADERS & extra.keys() & headers.keys():
        entries = [e.strip() for e in f"{headers[name]},{extra[name]}".split(",")]
        merged[name] = ",".join(dict.fromkeys(e for e in entries if e))
    return merged


@runtime_checkable
class Backend(Protocol):
    """A chat-completion backend.

    ``stream`` returns an async context manager yielding an iterator of chunks; leaving it
    early (break, cancel, error, deadline) releases everything the stream holds.
    ``request.model`` is the backend's own model name (the ``backend/`` prefix removed).
    """

    name: str

    def stream(
        self, request: ChatRequest, deadline: Deadline, options: RequestOptions | None = None
    ) -> AbstractAsyncContextManager[AsyncIterator[ChatCompletionChunk]]:
        """Open a streamed completion."""
        ...

    async def complete(
        self, request: ChatRequest, deadline: Deadline, options: RequestOptions | None = None
    ) -> ChatCompletion:
        """Run a non-streamed completion."""
        ...

    async def aclose(self) -> None:
        """Release every resource the backend holds."""
        ...


@runtime_checkable
class BufferedChunkIterator(Protocol):
    """A chunk iterator that can also hand out chunks already received, without awaiting.

    The fast-read protocol of streams: before each wait that needs a time limit, the stream
    layer calls :meth:`next_nowait`; a chunk whose bytes already arrived is returned at once,
    with no timer, cancel scope or task switch. Backends whose iterators do not offer it are
    read with ``__anext__`` alone. The check is made once per stream.
    """

    def __aiter__(self) -> AsyncIterator[ChatCompletionChunk]:
        """The iterator itself."""
        ...

    async def __anext__(self) -> ChatCompletionChunk:
        """The next chunk, waiting for bytes when needed."""
        ...

    def next_nowait(self) -> ChatCompletionChunk | None:
        """The next chunk already received, or None when the next one needs I/O (or the end)."""
        ...


class ResponseBody(Protocol):
    """The body-read protocol of an HTTP transport's response.

    :meth:`read` returns the next body bytes as they arrive (any size, ``b""`` at the end),
    with content-encoding already undone; failures are raised as the seam's transport errors
    (``backends/_errors.py``), which the backend maps to swiftclient's once. :meth:`aclose`
    releases the connection: back to the pool when the body was read to its end, else
    closed (unread bytes make it unusable).
    """

    async def read(self) -> bytes:
        """The next body bytes, ``b""`` at the end."""
        ...

    async def aclose(self) -> None:
        """Release the connection (idempotent)."""
        ...

    def close_nowait(self) -> bool:
        """Release the connection at once when that needs no waiting, and say so; False
        means :meth:`aclose` must be awaited (the backend then shields it from
        cancellation). Saves a cancel scope per request where release is synchronous."""
        ...

    def at_end(self) -> bool:
        """True once the body was read to its end, so no further :meth:`read` is needed to
        see it end (False where the transport cannot tell without that read)."""
        ...


@dataclass(slots=True)
class TransportResponse:
    """Status, headers (case-insensitive lookup) and body of one HTTP response (read-only
    by contract; not frozen, for the reason :class:`RequestOptions` is not)."""

    status: int
    headers: Mapping[str, str]
    body: ResponseBody


class Transport(Protocol):
    """The HTTP seam under :class:`~swiftclient.HTTPBackend`: one method sends one request.

    The backend builds the request itself (method, absolute URL, every header, the body
    bytes) and bounds the wait for a pooled connection itself. The headers the backend sends
    on every request come once, when it makes the transport (``headers=``); ``send`` is
    given the request's own, which go on top of them (a name in both: the request's value).
    A transport only opens or
    reuses a connection (within ``connect`` seconds when given) and returns the response
    once its head has arrived. Failures are raised as the seam's transport errors
    (``backends/_errors.py``: connect, pool, read, write, protocol, decoding, invalid URL),
    whatever library the transport runs on. Redirects, cookies and auth flows are not a
    transport's business.
    """

    async def send(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        body: bytes,
        connect: float | None,
    ) -> TransportResponse:
        """Send one request and return its response with the body still unread."""
        ...

    async def aclose(self) -> None:
        """Close every connection the transport holds."""
        ...
