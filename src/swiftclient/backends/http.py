"""HTTPBackend: any OpenAI-compatible ``/chat/completions`` endpoint over pooled keep-alive HTTP.

The backend owns its transport (``base.Transport``): on asyncio one pooled aiohttp session
(much less CPU per request and chunk), on trio or with HTTP/2 an httpx
``AsyncHTTPTransport``. It builds every request itself, bounds the wait for a pooled
connection with its own counter (``Timeout.pool``, :class:`~swiftclient.PoolTimeout`) apart
from opening one (``Timeout.connect``, :class:`~swiftclient.ConnectTimeout`), and bounds
every body it reads (``max_body_bytes``, ``max_event_bytes``). Leaving a stream early always
closes its response, so the connection is returned (or dropped when unread bytes make it
unusable).
"""

from __future__ import annotations

import json
import re
import socket
import warnings
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from types import TracebackType
from typing import Any, Literal
from urllib.parse import urlsplit

import anyio
import anyio.lowlevel
import httpx
import pydantic
import pydantic_core

from .. import errors
from .._budget import check_number
from .._canonical import CallEncoding
from .._canonical import encode as encode_request
from .._deadline import Deadline, running_loop
from .._sse import EventTooLarge, ServerSentEvent, SSEDecoder
from ..breakpoints import (
    DEFAULT_MIN_TOKENS,
    OPENAI_LIMIT,
    CacheBreakpointWarning,
    mark_content_breakpoints,
)
from ..types import (
    MAX_CHOICES,
    MAX_TOOL_CALLS,
    ChatCompletion,
    ChatCompletionChunk,
    ChatRequest,
    ChoiceDelta,
    ChunkChoice,
)
from ._errors import TransportError, to_public
from ._httpx import HttpxTransport
from ._network import Cert, Verify, env_proxy, keepalive_options, ssl_context
from .base import (
    LIST_HEADERS,
    RequestOptions,
    Transport,
    TransportResponse,
    check_backend_name,
    check_headers,
    header_mapping,
    with_call_headers,
)

__all__ = ["HTTPBackend"]

_MAX_ERROR_BODY = 1 << 20
DEFAULT_MAX_BODY_BYTES = 64 << 20
DEFAULT_MAX_EVENT_BYTES = 32 << 20
# The chunk validator itself: the per-chunk hot path skips model_validate_json's wrapper.
_validate_chunk = ChatCompletionChunk.__pydantic_validator__.validate_json
_validate_completion = ChatCompletion.__pydantic_validator__.validate_json
# After a complete answer, how long the stream's close waits for the body's end that is
# already on its way (a server writes it right after [DONE]), so the connection can go back
# to the pool; a body that has not ended by then is closed instead. Bytes read meanwhile are
# bounded too.
_LOOP_FREE = (httpx.MockTransport, httpx.ASGITransport)
"""Transports a caller may give that hold no connections, so serve any event loop."""
_END_GRACE = 0.02
_END_BYTES = 64 << 10
_USER_AGENT = "swiftclient/0.1"
# What one body or event may hold, checked before validation (validating costs microseconds
# per choice or tool call, so 300,000 of them in 12 MB would block the loop for seconds). A
# list of more than N items has at least N commas and 2N bytes, so a body under either
# bound is let through without a look: every ordinary stream chunk.
MAX_DEPTH = 200
"""The deepest nesting of objects and arrays a body may have (pydantic-core's JSON parser
refuses a little deeper)."""
_SCAN_FROM = 2 * min(MAX_CHOICES, MAX_TOOL_CALLS)
_SCAN_COMMAS = min(MAX_CHOICES, MAX_TOOL_CALLS)
_UNBOUNDED = 1 << 62  # an unlimited list's or object's budget: no body has that many commas
_CAPPED_BELOW = 1 << 61
# A string token runs to its closing quote or, in a malformed body, to the end: it never
# fails once started, so no quote is scanned from twice (the scan stays linear).
_STRING = rb'"[^"\\]*(?:\\.[^"\\]*)*'  # a JSON string up to its closing quote
_JSON_TOKEN = re.compile(
    rb'(?P<choices>"choices"[ \t\r\n]*:[ \t\r\n]*\[)'
    rb'|(?P<tools>"tool_calls"[ \t\r\n]*:[ \t\r\n]*\[)'
    rb"|" + _STRING + rb'(?:"|\\?\Z)'
    rb"|(?P<mark>[\[\]{},])",
    re.DOTALL,
)
# The text-delta fast path's chunks: the text decoded alone, the models assembled directly.
_from_json = pydantic_core.from_json
_new_object = object.__new__
# The four slots pydantic-core's validation sets, written through BaseModel's own slot
# descriptors (which the chunk's three models inherit): no class ``__setattr__`` and no
# ``object.__setattr__`` lookup, about a third cheaper per write.
_SLOTS = vars(pydantic.BaseModel)
_set_dict = _SLOTS["__dict__"].__set__
_set_fields_set = _SLOTS["__pydantic_fields_set__"].__set__
_set_extra = _SLOTS["__pydantic_extra__"].__set__
_set_private = _SLOTS["__pydantic_private__"].__set__
# An event this large is followed by a checkpoint before the next chunk is handed out, so a
# burst of large events cannot hold the event loop for their sum.
_YIELD_FROM = 64 << 10


class _Response:
    """One response holding one of the backend's connection slots until it is closed."""

    __slots__ = ("body", "headers", "read", "status", "_slots")

    def __init__(self, response: TransportResponse, slots: anyio.Semaphore) -> None:
        self.status = response.status
        self.headers = response.headers
        self.body = response.body
        self.read: Callable[[], Awaitable[bytes]] = response.body.read
        self._slots: anyio.Semaphore | None = slots

    def close_nowait(self) -> bool:
        """Release the connection and its slot when that needs no waiting (True), as it
        never does on the aiohttp transport; False: :meth:`aclose` must be awaited."""
        slots = self._slots
        if slots is None:
            return True
        if not self.body.close_nowait():
            return False
        self._slots = None
        slots.release()
        return True

    async def aclose(self) -> None:
        """Release the connection and its slot (idempotent; shielded)."""
        if self.close_nowait():
            return
        slots, self._slots = self._slots, None
        if slots is None:
            return
        try:
            with anyio.CancelScope(shield=True):
                await self.body.aclose()
        finally:
            slots.release()


class HTTPBackend:
    """A backend for one OpenAI-compatible HTTP API.

    Args:
        base_url: the API root, e.g. ``https://api.openai.com/v1``.
        api_key: sent as a bearer token; never logged or shown in reprs and errors.
        name: the backend's name in model strings, spans and errors.
        headers: extra headers for every request of this backend.
        max_connections: pool size; calls beyond it wait up to ``Timeout.pool`` for a free
            connection, then raise :class:`~swiftclient.PoolTimeout`.
        keepalive_expiry: seconds an idle pooled connection is kept.
        tcp_keepalive: enable TCP keep-alive probes on every socket.
        http2: use HTTP/2 (httpx's transport; needs the ``http2`` extra).
        transport: an explicit ``httpx.AsyncBaseTransport`` (tests, custom routing); it
            replaces the transport choice and the TLS and proxy options below.
        stream_usage: ask for a final usage chunk on streams (``stream_options.include_usage``).
        verify: TLS certificate checks: True (certifi's CA bundle), a CA file or directory
            path, False (off), or an ``ssl.SSLContext``.
        cert: a client certificate: a file, ``(certfile, keyfile)`` or
            ``(certfile, keyfile, password)``.
        proxy: an ``http://`` proxy URL for every request (credentials in the URL are
            allowed and never shown).
        trust_env: honour ``HTTP(S)_PROXY`` / ``ALL_PROXY`` / ``NO_PROXY`` when ``proxy`` is
            not given, and ``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` when ``verify`` is True, on
            every transport (as httpx does).
        max_body_bytes: the largest non-streamed response body read; past it the call
            raises :class:`~swiftclient.ResponseTooLarge`.
        max_event_bytes: the largest single SSE line or event of a stream, likewise.
        canonical: send canonical request bytes (tools sorted, schema keys in one order,
            ``required`` sorted; docs/prompt-caching.md), so equal requests hit the
            provider's prompt cache; False sends the request's own orders.
        prompt_cache_key: send a ``prompt_cache_key`` derived from the prompt's static
            prefix (tools and leading system messages) when a request names none; for
            providers that take the field (the ``openai`` preset turns it on).
        cache_breakpoints: place OpenAI's explicit prompt-cache breakpoints
            (``prompt_cache_breakpoint`` on content parts, ``prompt_cache_options.mode``
            ``explicit``; GPT-5.6 and later models) where the breakpoint planner says:
            the end of the static prefix, the history before the last user turn and the
            last message, none on prefixes under ``min_cache_tokens``; a message-level
            ``prompt_cache_breakpoint`` or ``cache_control`` you set is kept
            (docs/prompt-caching.md).
        cache_ttl: the static prefix's breakpoint TTL, ``"30m"`` (the API's default) or
            ``"12h"``.
        min_cache_tokens: the shortest prefix worth a breakpoint (1024 on OpenAI).
    """

    _path = "/chat/completions"
    """The endpoint under ``base_url`` that requests go to (a subclass speaking another wire
    names its own)."""
    _url_of: Callable[[str], str] | None = None
    """Where a request for a model goes, for a subclass whose URL depends on the model
    (Azure's deployment URLs); ``None``: every request goes to ``base_url + _path``."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        *,
        name: str = "http",
        headers: Mapping[str, str] | None = None,
        max_connections: int = 100,
        keepalive_expiry: float | None = 30.0,
        tcp_keepalive: bool = True,
        http2: bool = False,
        transport: httpx.AsyncBaseTransport | None = None,
        stream_usage: bool = True,
        verify: Verify = True,
        cert: Cert | None = None,
        proxy: str | None = None,
        trust_env: bool = True,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
        canonical: bool = True,
        prompt_cache_key: bool = False,
        cache_breakpoints: bool = False,
        cache_ttl: Literal["30m", "12h"] = "30m",
        min_cache_tokens: int = DEFAULT_MIN_TOKENS,
    ) -> None:
        if not isinstance(base_url, str) or base_url.split("://", 1)[0].lower() not in (
            "http",
            "https",
        ):  # ftp://... was taken, and its first call failed
            raise errors.ConfigurationError("base_url must be an absolute http(s) URL")
        if not base_url.split("://", 1)[1].split("/", 1)[0]:
            raise errors.ConfigurationError("base_url must name a host (http://HOST...)")
        if "@" in base_url.split("://", 1)[1].split("/", 1)[0]:
            raise errors.ConfigurationError(
                "base_url must not carry credentials (user:password@host): pass api_key= instead"
            )
        if "?" in base_url or "#" in base_url:
            # paths are appended to base_url: a query would swallow them
            raise errors.ConfigurationError(
                "base_url must not carry a query string or fragment (paths are appended to it):"
                " pass keys as api_key= and fixed parameters as headers="
            )
        if not isinstance(max_connections, int) or max_connections < 1:
            raise errors.ConfigurationError("max_connections must be an int of at least 1")
        if keepalive_expiry is not None:
            check_number("keepalive_expiry", keepalive_expiry, positive=False)
        if max_body_bytes < 1 or max_event_bytes < 1:
            raise errors.ConfigurationError("max_body_bytes and max_event_bytes must be positive")
        if proxy is not None and not proxy.startswith(("http://", "https://")):
            raise errors.ConfigurationError("proxy must be an http:// or https:// URL")
        check_backend_name(name)
        self.name = name
        self.base_url = base_url.rstrip("/")
        # A 404 from a base URL without a path is most often a missing ``/v1``: said with it.
        self._missing_path = (
            f" (base_url has no path; OpenAI-compatible servers usually serve under /v1: "
            f"base_url={self.base_url + '/v1'!r}?)"
            if not urlsplit(self.base_url).path
            else ""
        )
        self._api_key = api_key
        base_headers = {
            "user-agent": _USER_AGENT,
            "accept": "application/json",
            "content-type": "application/json",
        }
        if headers is not None:
            base_headers.update(header_mapping(headers, "headers"))
        if api_key is not None and not isinstance(api_key, str):
            raise errors.ConfigurationError("api_key must be a str")
        if api_key:
            base_headers.update(self._auth_headers(api_key))
        check_headers(base_headers, self._auth_headers("").keys() if api_key else ())
        # The transport is made with the headers of every request (the session's own on
        # aiohttp, merged in C); each request sends its accept (and key) on top of them.
        self._base_headers = {k: v for k, v in base_headers.items() if k != "accept"}
        self._headers = {"accept": base_headers["accept"]}
        self._stream_headers = {"accept": "text/event-stream"}
        self._max_connections = max_connections
        self._keepalive_expiry = keepalive_expiry
        self._tcp_keepalive = tcp_keepalive
        self._http2 = http2
        self._given_transport = transport
        self._stream_usage = stream_usage
        self._verify = verify
        self._cert = cert
        self._trust_env = trust_env
        self._proxy = proxy if proxy is not None or not trust_env else env_proxy(self.base_url)
        proxy_password = urlsplit(self._proxy).password if self._proxy else None
        # Keys given in credential headers (``headers={"api-key": ...}``) are known secrets
        # too: every error message and body is scrubbed of them.
        self._secrets = (api_key, proxy_password, *errors.header_secrets(base_headers))
        self.max_body_bytes = max_body_bytes
        self.max_event_bytes = max_event_bytes
        self._url = f"{self.base_url}{self._path}"
        self._models_url = f"{self.base_url}/models"
        self._exact = not canonical
        self._cache_key = prompt_cache_key
        if cache_ttl not in ("30m", "12h"):
            raise errors.ConfigurationError('cache_ttl must be "30m" or "12h"')
        self.cache_breakpoints = cache_breakpoints
        self._cache_ttl = cache_ttl
        self._min_cache_tokens = min_cache_tokens
        self._transport: Transport | None = None
        self._loop: object = None  # the asyncio loop the transport last served (None: trio)
        self._slots: anyio.Semaphore | None = None
        self._release_nowait = False
        if transport is None and not http2:
            # Pay aiohttp's import here, not inside the first call's measured time.
            from . import _aiohttp  # noqa: F401

    def __repr__(self) -> str:
        shown = self.base_url.split("?", 1)[0]  # a query string may carry a key
        return f"HTTPBackend(name={self.name!r}, base_url={shown!r})"

    @property
    def proxy(self) -> str | None:
        """The proxy requests go through (given, or from the environment), credentials
        masked; None for a direct connection."""
        if self._proxy is None:
            return None
        parts = urlsplit(self._proxy)
        if parts.password is None and parts.username is None:
            return self._proxy
        netloc = f"***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
        return parts._replace(netloc=netloc).geturl()

    # ------------------------------------------------------------------ connection pool

    def _needs_tls(self) -> bool:
        return self.base_url.startswith("https://") or (self._proxy or "").startswith("https://")

    def _make_transport(self) -> Transport:
        self._release_nowait = False
        if self._given_transport is not None:
            return HttpxTransport(self._given_transport, self._base_headers)
        socket_options = keepalive_options() if self._tcp_keepalive else None
        context = (
            ssl_context(self._verify, self._cert, self._trust_env) if self._needs_tls() else None
        )
        if not self._http2 and running_loop() is not None:
            from ._aiohttp import AiohttpTransport

            def factory(addr_info: Any) -> socket.socket:
                family, type_, proto, _, _ = addr_info
                sock = socket.socket(family=family, type=type_, proto=proto)
                for level, option, value in socket_options or ():
                    sock.setsockopt(level, option, value)
                return sock

            self._release_nowait = True
            return AiohttpTransport(
                keepalive_expiry=self._keepalive_expiry,
                socket_factory=factory if socket_options else None,
                ssl_context=context,
                proxy=self._proxy,
                headers=self._base_headers,
            )
        if self._http2:
            try:
                import h2  # noqa: F401
            except ImportError as exc:
                raise errors.ConfigurationError(
                    "http2=True needs the 'http2' extra: pip install 'swiftclient-llm[http2]'"
                ) from exc
        return HttpxTransport(
            httpx.AsyncHTTPTransport(
                # No TLS is ever made without an https URL; False skips loading CA certs.
                verify=context if context is not None else False,
                http2=self._http2,
                limits=httpx.Limits(
                    max_connections=self._max_connections,
                    max_keepalive_connections=self._max_connections,
                    keepalive_expiry=self._keepalive_expiry,
                ),
                proxy=self._proxy,
                trust_env=False,  # resolved above, once
                socket_options=socket_options,
            ),
            self._base_headers,
        )

    @property
    def complete_cancels_cleanly(self) -> bool:
        """True when :meth:`complete` awaits no shielded cleanup, so the call path may bound
        it with a plain loop timer: the aiohttp transport releases connections without
        waiting (httpx's must be awaited, shielded)."""
        if self._transport is None:  # not opened yet: it will be aiohttp's on asyncio
            return self._given_transport is None and not self._http2 and running_loop() is not None
        return self._release_nowait

    def _open(self) -> Transport:
        """The backend's transport and connection slots, made on first use in this loop."""
        transport = self._transport
        loop = running_loop()
        if transport is None:
            transport = self._transport = self._make_transport()
            self._slots = anyio.Semaphore(self._max_connections)
        elif loop is not self._loop and not isinstance(self._given_transport, _LOOP_FREE):
            # The pool's connections belong to the loop it was made on (the second of two
            # asyncio.run() calls sharing a client failed deep in aiohttp); httpx's mock and
            # ASGI transports hold no connections and serve any loop.
            raise errors.ConfigurationError(
                f"backend {self.name!r} was first used on another event loop, and its pooled "
                "connections belong to that loop (each asyncio.run() makes a new one): make "
                "one client per asyncio.run(), inside the coroutine it runs (async with "
                "AsyncClient(...) as client: ...), or use the blocking Client"
            )
        self._loop = loop
        return transport

    def pool_stats(self) -> dict[str, int]:
        """Connections checked out by calls (``in_use``) and calls waiting for one
        (``waiting``), counted by the backend itself."""
        slots = self._slots
        if slots is None:
            return {"in_use": 0, "waiting": 0}
        return {
            "in_use": self._max_connections - slots.value,
            "waiting": slots.statistics().tasks_waiting,
        }

    async def __aenter__(self) -> HTTPBackend:
        """Create the transport now (``async with AsyncClient(...)`` does this), so the first
        call pays no set-up; :meth:`warmup` also opens connections."""
        self._open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def warmup(self, connections: int = 1) -> None:
        """Open up to ``connections`` pooled connections before the first real request.

        Sends concurrent ``GET {base_url}/models`` requests; their answers are ignored.
        """
        self._open()
        slots = self._slots
        assert slots is not None
        url = self._models_url

        async def one() -> None:
            try:
                with anyio.fail_after(10.0):
                    await slots.acquire()
                response = await self._exchange("GET", url, self._headers, b"", 10.0, slots)
            except (errors.APIError, TimeoutError):
                return
            try:
                with anyio.move_on_after(10.0):
                    await self._read_body(response, _MAX_ERROR_BODY)
            except errors.APIError:
                pass
            finally:
                await response.aclose()

        async with anyio.create_task_group() as tg:
            for _ in range(max(1, min(connections, self._max_connections))):
                tg.start_soon(one)

    async def list_models(self, timeout: float = 30.0, *, aliases: bool = True) -> list[str]:
        """The model ids ``GET {base_url}/models`` lists, in the server's order.

        ``aliases=False`` leaves out an entry whose ``root`` is another listed id (another
        name for that model, such as the local server's ``default``), so that a server that
        serves one model under two names lists it once. An error status raises the
        matching :class:`~swiftclient.APIStatusError`; a body that is not an OpenAI model list
        raises :class:`~swiftclient.APIResponseValidationError`.
        """
        self._open()
        slots = self._slots
        assert slots is not None
        with anyio.move_on_after(timeout) as scope:
            await slots.acquire()
            response = await self._exchange(
                "GET", self._models_url, self._headers, b"", timeout, slots
            )
            try:
                if response.status >= 400:
                    raise await self._status_error(response)
                body = await self._read_body(response, self.max_body_bytes)
            finally:
                await response.aclose()
        if scope.cancelled_caught:
            raise errors.APITimeoutError(
                f"{self.name}: GET /models got no answer within {timeout}s", backend=self.name
            )
        try:
            items = pydantic_core.from_json(body)["data"]
            ids = [str(item["id"]) for item in items]
            if aliases:
                return ids
            return [
                str(item["id"])
                for item in items
                if item.get("root") in (None, item["id"]) or str(item.get("root")) not in ids
            ]
        except (ValueError, KeyError, TypeError, AttributeError):
            pass
        raise errors.APIResponseValidationError(
            f"{self.name}: GET /models did not answer an OpenAI model list", backend=self.name
        )

    async def aclose(self) -> None:
        """Close every pooled connection."""
        transport, self._transport = self._transport, None
        if transport is not None:
            with anyio.CancelScope(shield=True):
                await transport.aclose()

    # ------------------------------------------------------------------ requests

    async def _acquire(self, deadline: Deadline) -> None:
        """Wait for a connection slot (none was free), at most ``Timeout.pool``."""
        slots = self._slots
        assert slots is not None
        pool = deadline.timeout.pool
        if pool is None or pool >= deadline.remaining():
            await slots.acquire()  # the call's own deadline bounds this wait
            return
        with anyio.move_on_after(pool):
            await slots.acquire()
            return
        raise errors.PoolTimeout(
            f"{self.name}: no free connection within {pool}s "
            f"(all {self._max_connections} pooled connections busy)",
            backend=self.name,
        )

    def _send(
        self,
        request: ChatRequest,
        deadline: Deadline,
        options: RequestOptions | None,
        stream: bool,
    ) -> Awaitable[_Response]:
        """Send ``request`` (its body on this wire, with the call's headers); awaited, the
        response once its head arrived (``options.on_response`` hears the head; an error
        status raises its error). With a connection slot free now, this is the exchange's
        own coroutine, no coroutine of its own per request; else one that first waits for a
        slot (at most ``Timeout.pool``). Await it at once: the slot is already held."""
        if self._transport is None or self._loop is not running_loop():
            self._open()
        headers = self._stream_headers if stream else self._headers
        encoding = None
        if options is not None:
            encoding = options.encoding
            key, extra = options.idempotency_key, options.headers
            if extra and LIST_HEADERS & extra.keys():  # a call's betas join the backend's
                merged = with_call_headers(self._base_headers, extra)
                extra = {name: merged[name] for name in extra}
            if extra:
                headers = (
                    {**headers, "idempotency-key": key, **extra} if key else {**headers, **extra}
                )
            elif key:
                headers = {**headers, "idempotency-key": key}
        try:
            body = self._encode(request, stream, encoding)
        except (pydantic_core.PydanticSerializationError, UnicodeEncodeError) as exc:
            reason = errors.redact(str(exc).splitlines()[0], *self._secrets)
            raise errors.ConfigurationError(
                f"the request cannot be sent as JSON ({reason}): a lone surrogate such as "
                "\\ud800 in a text, or a value JSON has no form for (in extra_body, say)"
            ) from None
        url = self._url if self._url_of is None else self._url_of(request.model)
        slots = self._slots
        assert slots is not None
        try:
            slots.acquire_nowait()
        except anyio.WouldBlock:
            return self._send_queued(url, headers, body, deadline, options)
        connect = deadline.bound(deadline.timeout.connect)
        return self._exchange("POST", url, headers, body, connect, slots, options, checked=True)

    async def _send_queued(
        self,
        url: str,
        headers: Mapping[str, str],
        body: bytes,
        deadline: Deadline,
        options: RequestOptions | None,
    ) -> _Response:
        """:meth:`_send` once a connection slot is free."""
        await self._acquire(deadline)
        slots = self._slots
        assert slots is not None
        connect = deadline.bound(deadline.timeout.connect)
        return await self._exchange(
            "POST", url, headers, body, connect, slots, options, checked=True
        )

    def _auth_headers(self, api_key: str) -> dict[str, str]:
        """The headers that carry ``api_key`` (a bearer token on this wire)."""
        return {"authorization": f"Bearer {api_key}"}

    _breakpoint_roles = frozenset({"system", "developer", "user", "assistant", "tool"})
    """The roles whose content parts may carry a ``prompt_cache_breakpoint`` on this wire."""

    def _encode(self, request: ChatRequest, stream: bool, encoding: CallEncoding | None) -> bytes:
        """The request's body bytes on this backend's wire."""
        body = (encoding.encode if encoding is not None else encode_request)(
            request,
            stream=stream,
            include_usage=self._stream_usage,
            exact=self._exact,
            derive_cache_key=self._cache_key,
        )
        if not self.cache_breakpoints:
            return body
        return self._with_breakpoints(body, request, encoding)

    def _with_breakpoints(
        self, body: bytes, request: ChatRequest, encoding: CallEncoding | None
    ) -> bytes:
        """``body`` with the planner's explicit cache breakpoints on its messages."""
        data = json.loads(body)
        options = data.get("prompt_cache_options")
        implicit = isinstance(options, dict) and options.get("mode") == "implicit"
        tools = data.get("tools")
        plan = mark_content_breakpoints(
            data["messages"],
            static=encoding.prefix(request).static if encoding is not None else None,
            roles=self._breakpoint_roles,
            prefix_tokens=len(json.dumps(tools)) // 4 if tools else 0,
            static_ttl="1h" if self._cache_ttl == "12h" else "5m",
            min_tokens=self._min_cache_tokens,
            limit=OPENAI_LIMIT - 1 if implicit else OPENAI_LIMIT,
        )
        for note in plan.warnings:
            warnings.warn(note, CacheBreakpointWarning, stacklevel=5)
        if plan.breakpoints and not implicit:
            data["prompt_cache_options"] = {**(options or {}), "mode": "explicit"}
        return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()

    def _chunk_stream(
        self, response: _Response, deadline: Deadline, request: ChatRequest
    ) -> _ChunkStream:
        """The chunk iterator that decodes a streamed ``response`` on this backend's wire."""
        return _ChunkStream(response, self, deadline, request.n or 1)

    async def _exchange(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        body: bytes,
        connect: float | None,
        slots: anyio.Semaphore,
        options: RequestOptions | None = None,
        *,
        checked: bool = False,
    ) -> _Response:
        """Send one request holding the slot ``slots`` was just acquired for; the slot is
        released with the response, or at once when sending fails. ``checked`` (a chat
        request): ``options.on_response`` hears the response's head, and an error status
        raises its error (the response closed first)."""
        transport = self._transport or self._open()
        try:
            sent = await transport.send(method, url, headers, body, connect)
        except BaseException as exc:
            slots.release()
            if not isinstance(exc, TransportError):
                raise
            error = self._error(exc)
        else:
            response = _Response(sent, slots)
            if not checked:
                return response
            if options is not None and options.on_response is not None:
                options.on_response(response.status, response.headers)
            if response.status >= 400:
                try:
                    raise await self._status_error(response)
                finally:
                    await response.aclose()
            if not 200 <= response.status < 300 or response.status == 204:
                await response.aclose()
                raise errors.APIResponseValidationError(
                    f"{self.name}: HTTP {response.status} is no answer to a chat request "
                    "(a redirect: base_url should name the API itself, not a page that "
                    "forwards to it)"
                    if 300 <= response.status < 400
                    else f"{self.name}: HTTP {response.status} is no answer to a chat request",
                    backend=self.name,
                )
            return response
        raise error  # outside the except block: the chain keeps no transport exception

    def _error(self, exc: TransportError) -> errors.SwiftClientError:
        """The swiftclient error for a transport failure, with a scrubbed stand-in as its
        cause; raise it outside the ``except`` block, so ``exc`` stays off the chain."""
        return to_public(exc, backend=self.name, secrets=self._secrets)

    async def _read_body(self, response: _Response, limit: int) -> bytes:
        """The whole body; :class:`~swiftclient.ResponseTooLarge` past ``limit`` bytes."""
        length = response.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            raise self._too_large(f"the response body is {length} bytes", limit)
        read = response.read
        at_end = response.body.at_end
        try:
            data = await read()
            parts = [data]
            size = len(data)
            # the whole body is here once its end is: no read just to see it end
            while data and size <= limit and not at_end():
                data = await read()
                parts.append(data)
                size += len(data)
        except TransportError as exc:
            error = self._error(exc)
        else:
            if size > limit:
                raise self._too_large("the response body", limit)
            return data if len(parts) == 1 else b"".join(parts)
        raise error

    def _too_large(self, what: str, limit: int) -> errors.ResponseTooLarge:
        return errors.ResponseTooLarge(
            f"{self.name}: {what} exceeds the limit of {limit} bytes", backend=self.name
        )

    async def _status_error(self, response: _Response) -> errors.APIStatusError:
        buffer = bytearray()  # appended in place: linear in the body's size
        try:
            while len(buffer) <= _MAX_ERROR_BODY and (data := await response.read()):
                buffer += data
        except TransportError:
            pass
        body_bytes = bytes(buffer)
        text = body_bytes.decode("utf-8", "replace")[:500]
        body, detail = _error_body(body_bytes, self._secrets, text)
        status = response.status
        headers = errors.redact_headers(response.headers, *self._secrets)
        request_id = headers.get("x-request-id") or headers.get("request-id")
        message = f"{self.name}: HTTP {status}: {detail}"
        if status == 404:
            message += self._missing_path
        return errors.status_error_class(status)(
            message,
            status_code=status,
            request_id=request_id,
            body=body,
            headers=headers,
            backend=self.name,
        )

    @asynccontextmanager
    async def stream(
        self, request: ChatRequest, deadline: Deadline, options: RequestOptions | None = None
    ) -> AsyncIterator[AsyncIterator[ChatCompletionChunk]]:
        """Open a streamed completion; the connection is released when the block exits."""
        response = await self._send(request, deadline, options, stream=True)
        try:
            content_type = response.headers.get("content-type", "").lower()
            if "event-stream" not in content_type and (
                "json" in content_type or "html" in content_type
            ):
                raise await self._not_a_stream(response, content_type)
            chunks = self._chunk_stream(response, deadline, request)
            yield chunks
            if chunks.complete and chunks.open:
                await chunks.settle(min(_END_GRACE, deadline.remaining()))
        finally:
            await response.aclose()

    async def _not_a_stream(self, response: _Response, content_type: str) -> errors.APIError:
        """The error for a stream answered with a JSON or HTML body: the in-band error a
        JSON body carries, else a response-validation error (never retried)."""
        if "json" in content_type:
            data = await self._read_body(response, _MAX_ERROR_BODY)
            inband = _inband_error(self, data)
            if inband is not None:
                return inband
        return errors.APIResponseValidationError(
            f"{self.name}: expected an event stream, got {content_type!r}", backend=self.name
        )

    async def _whole_body(
        self, request: ChatRequest, deadline: Deadline, options: RequestOptions | None
    ) -> bytes:
        """Send ``request`` non-streamed and read its whole body (the connection goes back
        or is closed either way); a large body is checked for its shape before anything
        validates it. Every wire's ``complete`` starts here."""
        response = await self._send(request, deadline, options, stream=False)
        try:
            body = await self._read_body(response, self.max_body_bytes)
        finally:
            if not response.close_nowait():
                await response.aclose()
        if len(body) > _SCAN_FROM and body.count(b",") >= _SCAN_COMMAS:
            _check_shape(self, body, "the response body")
        return body

    async def complete(
        self, request: ChatRequest, deadline: Deadline, options: RequestOptions | None = None
    ) -> ChatCompletion:
        """Run a non-streamed completion."""
        body = await self._whole_body(request, deadline, options)
        error: errors.APIError | None
        try:
            completion: ChatCompletion = _validate_completion(body)
        except pydantic.ValidationError as exc:
            # pydantic's error quotes the body: it stays off the chain (raised below).
            summary = _validation_summary(exc, self._secrets)
            error = _inband_error(self, body) or errors.APIResponseValidationError(
                f"{self.name}: response body is not a chat completion: {summary}",
                backend=self.name,
            )
        else:
            error = None
            if not completion.choices:  # {} and {"status": "queued"} validate: no fields needed
                error = _inband_error(self, body) or errors.APIResponseValidationError(
                    f"{self.name}: response body is not a chat completion: it has no choices",
                    backend=self.name,
                )
        if error is not None:
            raise error
        extra = completion.__pydantic_extra__
        if extra and "error" in extra:
            raise _stream_error(self, body)
        if deadline.now() >= deadline.at:  # parsing took the call past its deadline
            raise deadline.exceeded(self.name)
        return completion


def text_chunk(completion_id: str, model: str, text: str, created: int = 0) -> ChatCompletionChunk:
    """A content chunk: the per-token path of the wires that decode their own events.
    Validated from a dict in pydantic-core, which costs less than ``model_construct``'s
    Python-level defaults for the three nested models."""
    return ChatCompletionChunk.model_validate(
        {
            "id": completion_id,
            "model": model,
            "created": created,
            "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}],
        }
    )


class TextChunks:
    """Content chunks of one message, built without validation: the per-token fast path of
    the wires that decode their own events.

    Everything in a content chunk but its text is the same for the whole message, so one
    chunk is validated per message (:func:`text_chunk` with an empty text) and each token's
    chunk is that chunk's three models (chunk, choice, delta) made anew: the template's
    field values and fields set, with the text in ``delta.content``, assembled the way
    pydantic-core's validation leaves a model (``__dict__``, ``__pydantic_fields_set__``,
    ``__pydantic_extra__``, ``__pydantic_private__``). The text is a ``str`` decoded by us,
    the only value that varies, so there is nothing left to validate: a chunk made here
    equals :func:`text_chunk`'s for the same text (values, fields set, extras, repr and
    serialization), at under half its cost.
    """

    __slots__ = ("_choice", "_chunk", "_delta")

    def __init__(self, completion_id: str, model: str, created: int = 0) -> None:
        template = text_chunk(completion_id, model, "", created)
        choice = template.choices[0]
        self._chunk = dict(template.__dict__)
        self._choice = dict(choice.__dict__)
        self._delta = dict(choice.delta.__dict__)

    def text(self, text: str) -> ChatCompletionChunk:
        """The content chunk of ``text`` (a ``str``, as decoded from JSON)."""
        # Inline rather than a helper per model: this runs once per streamed token.
        fields = self._delta.copy()
        fields["content"] = text
        delta = _new_object(ChoiceDelta)
        _set_dict(delta, fields)
        _set_fields_set(delta, {"content"})
        _set_extra(delta, {})
        _set_private(delta, None)
        fields = self._choice.copy()
        fields["delta"] = delta
        choice = _new_object(ChunkChoice)
        _set_dict(choice, fields)
        _set_fields_set(choice, {"index", "delta", "finish_reason"})
        _set_extra(choice, {})
        _set_private(choice, None)
        fields = self._chunk.copy()
        fields["choices"] = [choice]
        chunk = _new_object(ChatCompletionChunk)
        _set_dict(chunk, fields)
        _set_fields_set(chunk, {"id", "model", "created", "choices"})
        _set_extra(chunk, {})
        _set_private(chunk, None)
        return chunk

    def chunk(self, literal: bytes) -> ChatCompletionChunk | None:
        """The content chunk of the text the JSON string ``literal`` (quotes included)
        encodes; None when ``literal`` is not one valid JSON string (the caller then decodes
        the whole event the slow way)."""
        try:
            text = _from_json(literal)
        except ValueError:
            return None
        if type(text) is not str:
            return None
        return self.text(text)


NO_IDS = TextChunks("", "")
"""Text chunks for a stream's text before it names its message (no id or model yet)."""


class _ChunkStream:
    """Decodes an SSE response into chunks; an explicit iterator, so closing is deterministic.

    Events are decoded as bytes arrive but validated one at a time, when asked for, so a
    reply that arrives in one burst does not keep a hundred parsed chunks alive at once.
    It speaks :class:`~swiftclient.backends.base.BufferedChunkIterator`: :meth:`next_nowait`
    hands out an already-received chunk without awaiting. Bytes come straight from the
    transport's :class:`~swiftclient.backends.base.ResponseBody`.

    The answer is complete at ``[DONE]``, or at the usage chunk (no choices) that follows
    the last choice's finish: iteration ends there at once, without waiting for the body to
    end; :meth:`settle` then gives the body's end a moment to arrive before the response is
    closed.
    """

    __slots__ = (
        "_backend",
        "_chose",
        "_choices",
        "_deadline",
        "_decoder",
        "_done",
        "_events",
        "_finished",
        "_held",
        "_read",
        "_received",
        "_response",
        "_seen_event",
        "complete",
        "finished",
        "open",
    )

    def __init__(
        self, response: _Response, backend: HTTPBackend, deadline: Deadline, choices: int = 1
    ) -> None:
        self._response = response
        self._backend = backend
        self._deadline = deadline
        self._held: deque[ServerSentEvent] | None = None
        self._read = response.read
        self._choices = choices
        self.open = True
        """The body may still hold bytes (its end was not read)."""
        self._decoder = SSEDecoder(max_event_bytes=backend.max_event_bytes)
        self._events: deque[ServerSentEvent] = deque()
        self._done = False
        self._finished = False
        self.complete = False
        """The answer is whole: ``[DONE]``, or a usage chunk after every choice finished."""
        self.finished: set[int] = set()
        """The choices that reported a finish reason."""
        self._received = False
        self._seen_event = False
        self._chose = False  # a chunk with choices came (an answer is more than [DONE])

    def __aiter__(self) -> _ChunkStream:
        return self

    async def __anext__(self) -> ChatCompletionChunk:
        while True:
            chunk = self.next_nowait()
            if chunk is not None:
                return chunk
            held = self._held
            if held is not None:  # events after a large one: let the loop run first
                await anyio.lowlevel.checkpoint()
                self._held = None
                self._events = held
                continue
            if self._done or self.complete:
                self._done = True
                raise StopAsyncIteration
            await self._fill()

    def next_nowait(self) -> ChatCompletionChunk | None:
        """The next chunk already received, or None when the next one needs I/O (or the end)."""
        events = self._events
        while events:
            event = events.popleft()
            data = event.data
            if data == b"[DONE]":
                self._finished = True
                self._done = True
                self.complete = True
                events.clear()
                if not self._chose:  # [DONE] alone (or after {}): no answer at all
                    raise errors.APIResponseValidationError(
                        f"{self._backend.name}: the stream ended ([DONE]) with no chunk "
                        "that holds a choice: it is not a chat completion",
                        backend=self._backend.name,
                    )
                return None
            if event.event == "error":
                self._done = True
                raise _stream_error(self._backend, data)
            size = len(data)
            if size > _SCAN_FROM and data.count(b",") >= _SCAN_COMMAS:
                try:
                    _check_shape(self._backend, data, "a stream event")
                except errors.APIError:
                    self._done = True
                    raise
            summary: str | None
            try:
                chunk: ChatCompletionChunk = _validate_chunk(data)
            except pydantic.ValidationError as exc:
                self._done = True
                # the error itself quotes the event: only a summary is kept
                summary = _validation_summary(exc, self._backend._secrets)
            else:
                summary = None
            if summary is not None:
                raise errors.APIResponseValidationError(
                    f"{self._backend.name}: stream event is not a chat completion chunk: {summary}",
                    backend=self._backend.name,
                )
            extra = chunk.__pydantic_extra__
            if extra and "error" in extra:
                self._done = True
                raise _stream_error(self._backend, data)
            if size > _SCAN_FROM:
                self._parsed_large(size)
            choices = chunk.choices
            if choices:
                self._chose = True
                for choice in choices:
                    if choice.finish_reason is not None:
                        self._finished = True
                        self.finished.add(choice.index)
            elif chunk.usage is not None and len(self.finished) >= self._choices:
                self.complete = True  # the final usage chunk: nothing follows but [DONE]
            return chunk
        return None

    def _parsed_large(self, size: int) -> None:
        """After validating a large event: the deadline is checked before the chunk goes on
        to be accumulated, and the events after a very large one wait for a checkpoint."""
        deadline = self._deadline
        if deadline.now() >= deadline.at:
            self._done = True
            raise deadline.exceeded(self._backend.name)
        if size >= _YIELD_FROM and self._events:
            self._held, self._events = self._events, deque()

    async def _fill(self) -> None:
        backend = self._backend
        raw: bytes | None
        try:
            raw = await self._read()
        except TransportError as exc:
            self._done = True
            error = backend._error(exc)
            raw = None
        if raw is None:
            raise error  # outside the except block: the chain keeps no transport exception
        if not raw:
            self._done = True
            self.open = False
            if not self._finished:
                if self._received and not self._seen_event:
                    raise errors.APIResponseValidationError(
                        f"{backend.name}: the response body is not an event stream",
                        backend=backend.name,
                    ) from None
                raise errors.APIConnectionError(
                    f"{backend.name}: stream ended before the completion finished",
                    backend=backend.name,
                ) from None
            return
        self._received = True
        try:
            events = self._decoder.feed(raw)
        except EventTooLarge as exc:
            self._done = True
            raise backend._too_large("an SSE event", exc.limit) from None
        if events:
            self._seen_event = True
            self._events.extend(events)

    async def settle(self, limit: float) -> None:
        """After a complete answer: read the body's end if it arrives within ``limit``
        seconds (and ``_END_BYTES``), so that closing the response returns the connection to
        the pool; otherwise the close drops it. Never raises."""
        self.open = False
        self._events.clear()
        if limit <= 0 or self._response.body.at_end():
            return
        size = 0
        read = self._read
        with anyio.move_on_after(limit):
            try:
                while data := await read():
                    size += len(data)
                    if size > _END_BYTES:
                        return
            except TransportError:
                pass

    async def aclose(self) -> None:
        """Release the connection (back to the pool only after a whole body)."""
        self._done = True
        self.open = False
        self._events.clear()
        self._held = None
        await self._response.aclose()


def _validation_summary(exc: pydantic.ValidationError, secrets: tuple[str | None, ...]) -> str:
    """How many errors, and where the first one is, without the input it quotes (a body
    may echo a key); redacted, as a location may name a key the body chose."""
    first = exc.errors(include_url=False, include_input=False, include_context=False)[0]
    where = ".".join(str(part) for part in first["loc"]) or "the top level"
    count = exc.error_count()
    summary = f"{count} error{'s' if count != 1 else ''} ({first['type']} at {where})"
    return errors.redact(summary, *secrets)


def _overfull(data: bytes) -> str | None:
    """What makes the JSON ``data`` too big to validate: ``"choices"`` (a ``choices`` list of
    more than ``MAX_CHOICES`` items), ``"tool calls"`` (a ``tool_calls`` list of more than
    ``MAX_TOOL_CALLS``) or ``"nesting"`` (deeper than ``MAX_DEPTH``); None when nothing is.

    One pass over the structural tokens (a string, however long, is one), stopping at the
    first list past its limit: a body of a million choices is refused after reading a
    thousand. Malformed JSON is left for the parser to report.
    """
    budgets: list[int] = []  # per open list or object: how many more commas it may hold
    capped: list[str] = []  # the limited lists open, innermost last
    for match in _JSON_TOKEN.finditer(data):
        kind = match.lastgroup
        if kind == "mark":
            char = data[match.start()]
            if char == 0x2C:  # ","
                if budgets:
                    budgets[-1] -= 1
                    if budgets[-1] < 0:
                        return capped[-1]
            elif char == 0x5B or char == 0x7B:  # "[" or "{"
                budgets.append(_UNBOUNDED)
                if len(budgets) > MAX_DEPTH:
                    return "nesting"
            elif budgets:
                if budgets.pop() < _CAPPED_BELOW:  # a limited list closes
                    capped.pop()
        elif kind is not None:  # a limited list opens
            if kind == "choices":
                budgets.append(MAX_CHOICES - 1)
                capped.append("choices")
            else:
                budgets.append(MAX_TOOL_CALLS - 1)
                capped.append("tool calls")
            if len(budgets) > MAX_DEPTH:
                return "nesting"
    return None


def _check_shape(backend: HTTPBackend, data: bytes, what: str) -> None:
    """Raise when ``data`` holds more than a response may (see :func:`_overfull`)."""
    problem = _overfull(data)
    if problem is None:
        return
    name = backend.name
    if problem == "nesting":
        raise errors.APIResponseValidationError(
            f"{name}: {what} is nested more than {MAX_DEPTH} levels deep", backend=name
        )
    limit = MAX_CHOICES if problem == "choices" else MAX_TOOL_CALLS
    where = "" if problem == "choices" else " in one message"
    raise errors.ResponseTooLarge(
        f"{name}: {what} holds more than {limit} {problem}{where}", backend=name
    )


def _error_body(data: bytes, secrets: tuple[str | None, ...], default: str) -> tuple[object, str]:
    """A provider error body (parsed when it is JSON) and its message, both redacted;
    ``default`` is the message when the body names none."""
    body: object
    try:
        body = pydantic_core.from_json(data)
    except ValueError:
        body = data.decode("utf-8", "replace")
    message = default
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            message = err["message"]
        elif isinstance(err, str):
            message = err
    return errors.redact_json(body, *secrets), errors.redact(message, *secrets)


def _stream_error(backend: HTTPBackend, data: bytes) -> errors.StreamError:
    body, message = _error_body(data, backend._secrets, "error event in stream")
    return errors.StreamError(f"{backend.name}: {message}", body=body, backend=backend.name)


def _inband_error(backend: HTTPBackend, data: bytes) -> errors.StreamError | None:
    """The :class:`~swiftclient.StreamError` for a body that is a JSON ``{"error": ...}``
    object (a provider reporting a failure with status 200), else None."""
    try:
        parsed = pydantic_core.from_json(data)
    except ValueError:
        return None
    if isinstance(parsed, dict) and parsed.get("error") is not None:
        return _stream_error(backend, data)
    return None
