"""The swiftclient exception tree.

::

    SwiftClientError
    ├── ConfigurationError                 bad arguments, unknown backend, missing extra
    │   └── ClientClosedError               the client was closed, before or during the call
    ├── APIError
    │   ├── APIConnectionError
    │   │   └── APITimeoutError
    │   │       ├── PoolTimeout             no free pooled connection within Timeout.pool
    │   │       ├── ConnectTimeout          opening a connection took over Timeout.connect
    │   │       ├── FirstTokenTimeout       no content token within Timeout.first_token
    │   │       ├── StreamStalled           gap between chunks over Timeout.idle
    │   │       └── DeadlineExceeded        the call's total deadline ran out
    │   ├── APIStatusError (status_code, request_id, body)
    │   │   ├── BadRequestError 400
    │   │   ├── AuthenticationError 401
    │   │   ├── PermissionDeniedError 403
    │   │   ├── NotFoundError 404
    │   │   ├── ConflictError 409
    │   │   ├── UnprocessableEntityError 422
    │   │   ├── RateLimitError 429
    │   │   └── InternalServerError >= 500
    │   ├── APIResponseValidationError      a body or SSE event that does not parse
    │   │   └── ResponseTooLarge            a body or SSE event over the backend's size limit
    │   ├── StreamError                     an in-band error: an error event in a stream, or
    │   │                                   a 200 body that is {"error": ...}
    │   └── RateLimited                     admission: no capacity within the call's deadline
    │                                       (limit, reset_after); nothing was sent
    ├── StructuredOutputError               response_model validation failed (raw text kept)
    └── EngineError                         local engine failures
        └── OverloadedError                 the engine's queue is full

Errors never carry secrets: messages are built from status codes, request ids and
provider error bodies, and :func:`redact` scrubs anything that looks like a bearer
token or API key before it reaches a message; :func:`redact_headers` does the same for the
response headers an error keeps.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .types import Attempt

__all__ = [
    "APIConnectionError",
    "APIError",
    "APIResponseValidationError",
    "APIStatusError",
    "APITimeoutError",
    "AuthenticationError",
    "BadRequestError",
    "ClientClosedError",
    "ConfigurationError",
    "ConflictError",
    "ConnectTimeout",
    "DeadlineExceeded",
    "EngineError",
    "FirstTokenTimeout",
    "InternalServerError",
    "NotFoundError",
    "OverloadedError",
    "PermissionDeniedError",
    "PoolTimeout",
    "RateLimitError",
    "RateLimited",
    "ResponseTooLarge",
    "StreamError",
    "StreamStalled",
    "StructuredOutputError",
    "SwiftClientError",
    "UnprocessableEntityError",
    "header_secrets",
    "is_secret_header",
    "redact",
    "redact_headers",
    "redact_json",
    "status_error_class",
]

_MASK = "***"
# Unknown secrets are recognised by shape: a bearer token, a provider-prefixed key
# (``sk-...``, ``rk_...``, ``pk_...``, ``oxlo-...``), or the value of an ``api_key=`` field.
_BEARER = re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]{4,}")
_PREFIXED_KEY = re.compile(r"\b(?:sk|rk|pk|oxlo)[-_][A-Za-z0-9_-]{8,}")
_KEY_FIELD = re.compile(r"(?i)(api[_-]?key[\"']?\s*[:=]\s*[\"']?)([^\"'\s,}]{4,})")
# What any of the three shapes above needs (a cheap scan before the three substitutions).
_ANY_SHAPE = re.compile(r"(?i)bearer\s|\b(?:sk|rk|pk|oxlo)[-_]|api[_-]?key")


def _may_be_shaped(text: str) -> bool:
    """False when ``text`` cannot match ``_ANY_SHAPE``: ASCII text holding, in any case,
    none of what every match holds one of (``bearer``; ``sk``, ``rk``, ``pk`` or ``oxlo``
    and a ``-`` or ``_``; ``key``), found by substring tests in a fraction of the regex's
    scan. Other text (beyond ASCII, where case folding has more forms) goes to the regex."""
    if not text.isascii():
        return True
    low = text.lower()
    return (
        "key" in low or "k-" in low or "k_" in low or "o-" in low or "o_" in low or "bearer" in low
    )


# Header names whose values are credentials: these words as a part of the name
# (``x-api-key``, ``x-goog-api-key``, ``x-amz-security-token``, ``set-cookie``), besides
# the exact names below.
_SECRET_HEADER_WORDS = frozenset(
    {
        "authorization",
        "auth",
        "key",
        "apikey",
        "token",
        "secret",
        "password",
        "passwd",
        "cookie",
        "credential",
        "credentials",
    }
)
# Name parts that end in these are credentials too (``xapikey``, ``accesstoken``).
_SECRET_HEADER_ENDINGS = ("apikey", "token", "secret", "password")
_SECRET_HEADERS = frozenset(
    {"authorization", "proxy-authorization", "api-key", "x-api-key", "cookie", "set-cookie"}
)
_NOT_SECRET_HEADERS = frozenset({"idempotency-key"})
_HEADER_WORD_SPLIT = re.compile(r"[-_.]")


def _secret_shaped(token: str) -> bool:
    """Whether an unknown token looks like a generated key rather than a word: it holds a
    digit or a capital letter, or is one run of 16 or more letters. ``key_separator``,
    ``pk_users`` or ``api_key: required`` are words, not keys."""
    if any(char.isdigit() or char.isupper() for char in token):
        return True
    return len(token) >= 16 and token.isalpha()


def _mask_prefixed(match: re.Match[str]) -> str:
    return _MASK if _secret_shaped(match.group()) else match.group()


def _mask_field(match: re.Match[str]) -> str:
    value = match.group(2)
    return match.group(1) + _MASK if _secret_shaped(value) else match.group()


#: Known secrets shorter than this are masked only where they stand alone: such a "key" is
#: a placeholder (``"EMPTY"``, ``"none"``, ``"k"``), and masking every word that contains
#: it (``model *** not found`` for a key ``"k"``) ruined messages for nothing.
_SHORT_SECRET = 6


def _known_spans(text: str, secrets: Sequence[str]) -> list[tuple[int, int]]:
    """Where the known secrets stand in ``text``, each span widened over the letters and
    digits glued to it, overlapping spans merged; a secret shorter than
    :data:`_SHORT_SECRET` only where no letter or digit is glued to it."""
    spans: list[tuple[int, int]] = []
    for secret in secrets:
        at = text.find(secret)
        while at != -1:
            start, end = at, at + len(secret)
            while start > 0 and text[start - 1].isalnum():
                start -= 1
            while end < len(text) and text[end].isalnum():
                end += 1
            if len(secret) >= _SHORT_SECRET or end - start == len(secret):
                spans.append((start, end))
            at = text.find(secret, at + 1)
    spans.sort()
    merged: list[tuple[int, int]] = []
    for start, end in spans:
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def redact(text: str, *secrets: str | None) -> str:
    """Return ``text`` with known secrets and anything shaped like an API key masked.

    Every occurrence of a known secret is masked wherever it stands (inside a URL, before
    a full stop, glued to other text), with no rule about what may surround it. The mask
    ``***`` takes the letters and digits glued to the secret with it, so what is left
    never reads as a word that was not there (a key ``hunter2`` masks ``xhunter2y`` whole).
    A secret of fewer than six characters, a placeholder such as ``"EMPTY"`` or ``"k"``,
    is masked only where it stands alone (``key k`` but not ``model``). Unknown keys are
    masked by shape (``Bearer ...``, ``sk-...``-style prefixes, ``api_key=...``); ordinary
    words, ``key_separator`` among them, are left alone.
    """
    known = [secret for secret in secrets if secret and secret in text] if secrets else None
    if known:
        pieces: list[str] = []
        done = 0
        for start, end in _known_spans(text, known):
            pieces.append(text[done:start])
            pieces.append(_MASK)
            done = end
        pieces.append(text[done:])
        text = "".join(pieces)
    if not _may_be_shaped(text) or _ANY_SHAPE.search(text) is None:  # most text has none
        return text
    text = _BEARER.sub(r"\1***", text)
    text = _PREFIXED_KEY.sub(_mask_prefixed, text)
    return _KEY_FIELD.sub(_mask_field, text)


def is_secret_header(name: str) -> bool:
    """Whether a header's value is a credential, judged by its name: ``authorization``,
    cookies, and any name with ``key``, ``token``, ``secret``, ``auth``, ``password`` or
    ``credential(s)`` as one of its parts, or a part ending in ``apikey``,
    ``token``, ``secret`` or ``password`` (``x-api-key``, ``x-goog-api-key``,
    ``x-auth-token``, ``xapikey``), except ``idempotency-key``."""
    name = name.lower()
    if name in _SECRET_HEADERS:
        return True
    if name in _NOT_SECRET_HEADERS:
        return False
    return any(
        part in _SECRET_HEADER_WORDS or part.endswith(_SECRET_HEADER_ENDINGS)
        for part in _HEADER_WORD_SPLIT.split(name)
    )


_CREDENTIAL_ENDINGS = ("apikey", "api-key", "api_key", "token", "secret", "password")


def is_credential_header(name: str) -> bool:
    """Whether a header certainly carries a credential, judged by its name (a narrower test
    than :func:`is_secret_header`, which redacts any name that may): ``authorization``,
    cookies, ``api-key`` and names ending in ``apikey``, ``api-key``, ``token``, ``secret``
    or ``password`` (``x-goog-api-key``, ``x-access-token``). ``x-routing-key`` or
    ``mcp-session-id`` are not."""
    name = name.lower()
    return name in _SECRET_HEADERS or name.endswith(_CREDENTIAL_ENDINGS)


def header_secrets(headers: Mapping[str, str]) -> tuple[str, ...]:
    """The credentials among ``headers`` (see :func:`is_secret_header`), as known secrets
    for :func:`redact`: each whole value and, for ``Bearer xyz``-style values, the token
    after the scheme."""
    found: list[str] = []
    for name, value in headers.items():
        if not value or not is_secret_header(name):
            continue
        found.append(value)
        scheme, _, token = value.strip().partition(" ")
        if token.strip() and scheme.isalpha():
            found.append(token.strip())
    return tuple(found)


def redact_headers(headers: Mapping[str, str], *secrets: str | None) -> dict[str, str]:
    """Return a copy of ``headers`` (names lower-cased) safe to keep on an exception.

    Credential headers (``authorization``, ``x-api-key``, cookies, ...) are masked whole;
    every other value goes through :func:`redact`, so a key a server echoes back is scrubbed.
    """
    return {
        name.lower(): _MASK if is_secret_header(name) else redact(value, *secrets)
        for name, value in headers.items()
    }


def redact_json(value: Any, *secrets: str | None) -> Any:
    """Return a copy of a parsed JSON value with :func:`redact` applied to every string
    (object keys included)."""
    if isinstance(value, str):
        return redact(value, *secrets)
    if isinstance(value, dict):
        return {
            redact(key, *secrets) if isinstance(key, str) else key: redact_json(item, *secrets)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [redact_json(item, *secrets) for item in value]
    return value


class SwiftClientError(Exception):
    """Root of every exception swiftclient raises on purpose."""


class ConfigurationError(SwiftClientError, ValueError):
    """Bad arguments, an unknown backend, or a missing optional extra."""


class ClientClosedError(ConfigurationError):
    """The client was closed: before the call was made, or while it ran (an application
    shutting down ends the calls still waiting for their replies). The transports answer
    an SDK 503, not a 400: the request was not at fault."""


def _restore_error(cls: type[APIError], args: tuple[Any, ...], state: dict[str, Any]) -> APIError:
    """An :class:`APIError` of ``cls`` with ``args`` and the attributes in ``state``."""
    error = cls.__new__(cls, *args)
    error.args = args
    error.__dict__.update(state)
    return error


class APIError(SwiftClientError):
    """A call to a model backend failed.

    Raised by a call, it carries the call's ``attempts`` (:class:`~swiftclient.types.Attempt`
    records, the failed one last); after more than one, the message ends with
    ``(after N attempts)``.
    """

    attempts: tuple[Attempt, ...] = ()

    def __init__(self, message: str, *, backend: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.backend = backend

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuilt from its fields, not by calling __init__ again (whose keyword-only fields
        # pickle's default leaves out): errors cross process pools and copy.copy whole.
        return (_restore_error, (type(self), self.args, dict(self.__dict__)))

    def _rename_backend(self, old: str, new: str) -> None:
        """Name the backend ``new`` (the name the client registered it under) where the
        error names it ``old`` (the backend's own name): ``backend`` and the message's
        ``old: `` prefix."""
        if self.backend not in (None, old):
            return
        self.backend = new
        prefix = f"{old}: "
        if self.message.startswith(prefix):
            self.message = f"{new}: {self.message[len(prefix) :]}"
            self.args = (self.message, *self.args[1:])

    def _record_attempts(self, attempts: Sequence[Attempt]) -> None:
        """Attach the attempts of the call that raised this error (once)."""
        if self.attempts:
            return
        self.attempts = tuple(attempts)
        if len(attempts) > 1:
            self.message = f"{self.message} (after {len(attempts)} attempts)"
            self.args = (self.message, *self.args[1:])


class APIConnectionError(APIError):
    """The backend could not be reached, or the connection broke."""


class APITimeoutError(APIConnectionError):
    """A time limit ran out."""


class PoolTimeout(APITimeoutError):
    """No pooled connection became free within ``Timeout.pool`` (all ``max_connections``
    were busy)."""


class ConnectTimeout(APITimeoutError):
    """Opening a connection (DNS, TCP, TLS) took longer than ``Timeout.connect``."""


class FirstTokenTimeout(APITimeoutError):
    """No content token arrived within ``Timeout.first_token``."""


class StreamStalled(APITimeoutError):
    """The gap between two stream chunks exceeded ``Timeout.idle``."""


class DeadlineExceeded(APITimeoutError):
    """The call's total deadline (``Timeout.total``) ran out."""


class APIResponseValidationError(APIError):
    """A response body or SSE event did not parse as the expected type."""


class ResponseTooLarge(APIResponseValidationError):
    """A response body or one SSE event exceeded the backend's size limit
    (``HTTPBackend(max_body_bytes=..., max_event_bytes=...)``; the connection is dropped), or
    listed more choices or tool calls than a response may (``types.MAX_CHOICES``,
    ``types.MAX_TOOL_CALLS``: 1,024 each), refused before validation."""


class StreamError(APIError):
    """The provider reported a failure in-band: an error event inside a stream, or a
    status-200 body that is ``{"error": ...}``; ``body`` keeps the (redacted) error."""

    def __init__(
        self, message: str, *, body: object | None = None, backend: str | None = None
    ) -> None:
        super().__init__(message, backend=backend)
        self.body = body


class RateLimited(APIError):
    """Admission control found no capacity for the call within its deadline; no request
    was sent. ``limit`` names the limit that was short (``"requests"``, ``"tokens"``,
    ``"input_tokens"``, ``"output_tokens"``, ``"concurrency"`` or ``"retry_after"``;
    ``"queue"`` when other processes sharing the limit were ahead of it in line;
    ``"deadline"`` when too little of the call's deadline was left for the target's usual
    time to answer), ``reset_after`` the seconds until it frees up (``None`` when unknown:
    a concurrency slot), ``target`` the ``"backend/model"`` it was for."""

    def __init__(
        self,
        message: str,
        *,
        limit: str,
        reset_after: float | None,
        target: str | None = None,
        backend: str | None = None,
    ) -> None:
        super().__init__(message, backend=backend)
        self.limit = limit
        self.reset_after = reset_after
        self.target = target


class APIStatusError(APIError):
    """The backend answered with an HTTP error status."""

    status_code: int

    def __init__(
        self,
        message: str,
        *,
        status_code: int,
        request_id: str | None = None,
        body: object | None = None,
        headers: dict[str, str] | None = None,
        backend: str | None = None,
    ) -> None:
        super().__init__(message, backend=backend)
        self.status_code = status_code
        self.request_id = request_id
        self.body = body
        self.headers = headers or {}

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(status_code={self.status_code}, "
            f"request_id={self.request_id!r}, message={self.message!r})"
        )


class BadRequestError(APIStatusError):
    """HTTP 400."""


class AuthenticationError(APIStatusError):
    """HTTP 401."""


class PermissionDeniedError(APIStatusError):
    """HTTP 403."""


class NotFoundError(APIStatusError):
    """HTTP 404."""


class ConflictError(APIStatusError):
    """HTTP 409."""


class UnprocessableEntityError(APIStatusError):
    """HTTP 422."""


class RateLimitError(APIStatusError):
    """HTTP 429."""


class InternalServerError(APIStatusError):
    """HTTP 500 and above."""


_STATUS_CLASSES: dict[int, type[APIStatusError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    422: UnprocessableEntityError,
    429: RateLimitError,
}


def status_error_class(status_code: int) -> type[APIStatusError]:
    """Return the exception class for an HTTP error status."""
    if status_code == 529:
        return ProviderOverloadedError
    if status_code >= 500:
        return InternalServerError
    return _STATUS_CLASSES.get(status_code, APIStatusError)


class StructuredOutputError(SwiftClientError):
    """The model's answer did not validate against ``response_model``.

    ``raw`` keeps the text the model produced; ``__cause__`` is the validation error.
    """

    def __init__(self, message: str, *, raw: str, completion: Any = None) -> None:
        super().__init__(message)
        self.raw = raw
        self.completion = completion


class EngineError(SwiftClientError):
    """The local inference engine failed."""


class OverloadedError(EngineError):
    """The engine's waiting queue is full; try again later."""


class ProviderOverloadedError(InternalServerError, OverloadedError):
    """A provider says it is overloaded: HTTP 529, or Anthropic's ``overloaded_error`` in a
    stream. Retried like a 503; ``except OverloadedError`` catches it with the engine's."""
