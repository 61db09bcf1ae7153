"""The one place that turns a :class:`ChatRequest` into request bytes.

Serialization is canonical: compact JSON, fields in the contract's order, ``None`` fields
left out, ``extra_body`` merged last. The same request always gives the same bytes, which is
what provider prompt caches key on.
"""

from __future__ import annotations

from typing import Any

import pydantic_core

from .types import ChatRequest

__all__ = ["encode_request", "request_body"]

_EXCLUDE = {"extra_body", "stream", "stream_options"}


def request_body(
    request: ChatRequest, *, stream: bool, include_usage: bool = True
) -> dict[str, Any]:
    """Return the JSON-ready body for ``request``."""
    body = request.model_dump(mode="json", exclude_none=True, by_alias=True, exclude=_EXCLUDE)
    body["stream"] = stream
    if stream:
        options = request.stream_options
        usage = (
            include_usage
            if options is None or options.include_usage is None
            else (options.include_usage)
        )
        if usage:
            body["stream_options"] = {"include_usage": True}
    if request.extra_body:
        body.update(request.extra_body)
    return body


def encode_request(request: ChatRequest, *, stream: bool, include_usage: bool = True) -> bytes:
    """Return the canonical JSON bytes for ``request``."""
    return pydantic_core.to_json(request_body(request, stream=stream, include_usage=include_usage))
