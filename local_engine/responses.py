"""The OpenAI Responses API (``POST /v1/responses``) over the chat service, stateless.

The translation itself lives in :mod:`swiftclient.wire.responses` (the SDK transports
answer the same requests with a swiftclient client); this module binds it to the engine:
a Responses request's top-level vLLM sampling fields (:data:`~local_engine.service.EXTRA_BODY_KEYS`)
go on to the chat request, as on ``/v1/chat/completions``. See that module for the mapping.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from swiftclient.wire.responses import (
    ResponseEcho,
    ResponseEvents,
    ResponsesRequestError,
    event_bytes,
    response_body,
)
from swiftclient.wire.responses import chat_fields as wire_chat_fields

from .service import EXTRA_BODY_KEYS

__all__ = [
    "ResponsesRequestError",
    "ResponseEcho",
    "ResponseEvents",
    "chat_fields",
    "event_bytes",
    "response_body",
]


def chat_fields(
    body: Mapping[str, Any], ignored: list[str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split a ``/v1/responses`` body into chat-completions fields and the fields its
    response object echoes (:func:`swiftclient.wire.responses.chat_fields`, with the
    engine's extensions passed on); append the names of ignored fields to ``ignored``.

    Raises :class:`ResponsesRequestError` naming a field the local server cannot serve.
    """
    if body.get("model") is None:  # it read "Input should be a valid string"
        raise ResponsesRequestError("model: Field required", "model")
    return wire_chat_fields(body, ignored, passed=EXTRA_BODY_KEYS)
