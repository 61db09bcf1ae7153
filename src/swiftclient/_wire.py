"""The one place that turns a :class:`ChatRequest` into request bytes.

Serialization is canonical (:mod:`swiftclient._canonical`): compact JSON, fields in the
contract's order, ``None`` fields left out, tools sorted, schemas in one key order,
``extra_body`` merged last. Equal requests give identical bytes in every process, which is
what provider prompt caches key on. ``exact=True`` keeps the caller's own orders.
"""

from __future__ import annotations

from typing import Any

from ._canonical import body, encode
from .types import ChatRequest

__all__ = ["encode_request", "request_body"]


def request_body(
    request: ChatRequest, *, stream: bool, include_usage: bool = True, exact: bool = False
) -> dict[str, Any]:
    """Return the JSON-ready body for ``request``."""
    return body(request, stream=stream, include_usage=include_usage, exact=exact)


def encode_request(
    request: ChatRequest, *, stream: bool, include_usage: bool = True, exact: bool = False
) -> bytes:
    """Return the JSON bytes for ``request`` (canonical unless ``exact``)."""
    return encode(request, stream=stream, include_usage=include_usage, exact=exact)
