"""Wire pieces shared by the servers: OpenAI error bodies, SSE framing, bearer keys."""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from typing import Any

from .._json import dumps

__all__ = ["SSE_DONE", "bearer_key_matches", "dumps", "error_body", "sse_event"]

SSE_DONE = b"data: [DONE]\n\n"
"""The event that ends an OpenAI chat-completions stream."""

_ERROR_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    429: "rate_limit_error",
}


def error_body(
    status: int,
    message: str,
    *,
    type: str | None = None,
    code: str | None = None,
    param: str | None = None,
) -> dict[str, Any]:
    """Return an OpenAI-style error body: ``{"error": {"message", "type", "code"}}``, with
    ``param`` when given.

    ``type`` defaults from the status: ``server_error`` for 5xx, ``rate_limit_error`` for 429,
    ``invalid_request_error`` for most other 4xx.
    """
    if type is None:
        type = (
            "server_error" if status >= 500 else _ERROR_TYPES.get(status, "invalid_request_error")
        )
    error: dict[str, Any] = {"message": message, "type": type, "code": code}
    if param is not None:
        error["param"] = param
    return {"error": error}


def sse_event(data: Mapping[str, Any] | str | bytes) -> bytes:
    """One server-sent event carrying ``data`` (a mapping is sent as compact JSON).

    ``data`` must be a single line (JSON is).
    """
    if isinstance(data, Mapping):
        payload = dumps(data)
    elif isinstance(data, str):
        payload = data.encode()
    else:
        payload = data
    return b"data: " + payload + b"\n\n"


def bearer_key_matches(authorization: str | None, key: str) -> bool:
    """True when an ``Authorization`` header carries ``Bearer <key>``.

    The scheme is matched case-insensitively (RFC 9110); the key is compared in constant time.
    """
    if not authorization:
        return False
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return False
    return _constant_time_equal(token.strip(), key)


def _constant_time_equal(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), expected.encode())
