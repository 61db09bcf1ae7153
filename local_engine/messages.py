"""Anthropic's Messages API (``POST /v1/messages``) over the chat service, stateless.

A Messages request is translated into a chat request (:func:`chat_fields`), served on the
same engine path as ``/v1/chat/completions``, and the chat reply translated back: a whole
completion into a ``message`` object (:func:`message_body`), streamed chunks into the
Messages event stream (:class:`MessageEvents`). The translation itself lives in
:mod:`swiftclient.wire.messages` (the SDK transports answer the same requests with a
swiftclient client); this module binds it to the engine: vLLM's sampling extensions pass
on to the chat request, thinking blocks go back as reasoning text, error params are
Anthropic's dotted paths (``messages.0.content.1.type``), and the stream has a ``ping`` and
ends with the engine's final usage chunk.

Request mapping:

- ``max_tokens`` is required, as on Anthropic's API (a request without it is 400);
  ``model`` must name the served model, as on the other routes;
- ``system`` (a string or ``text`` blocks) becomes the first, system message;
- ``messages``: ``user`` and ``assistant`` turns whose ``content`` is a string or blocks:
  ``text``; ``image`` (a ``base64`` or ``url`` source, passed on as an image part, which a
  text-only model refuses); an assistant's ``tool_use`` blocks become its ``tool_calls``
  (parallel calls stay in one message); a user's ``tool_result`` blocks become tool
  messages (``is_error`` results are sent as ``Error: ...``), sent before the rest of that
  turn; ``thinking`` blocks go back as the turn's reasoning text and ``redacted_thinking``
  blocks are dropped (the local model cannot read them);
- ``tools`` (``name``, ``description``, ``input_schema``) become function tools; server
  tools (web search, code execution, ...) run on Anthropic's side and are refused;
  ``tool_choice`` ``auto`` / ``any`` / ``tool`` / ``none`` map to ``auto`` / ``required`` /
  the named function / ``none``, its ``disable_parallel_tool_use`` to
  ``parallel_tool_calls=false``. A forced tool is how Anthropic clients ask for JSON: its
  ``input`` is decoded under the tool's schema, as on chat;
- ``output_config.format`` / ``output_format`` of type ``json_schema`` (Anthropic's
  structured outputs) becomes ``response_format``;
- ``stop_sequences`` → ``stop``; ``temperature``, ``top_p``, ``top_k``;
  ``metadata.user_id`` → ``user``; vLLM's sampling extensions pass as on chat; other fields
  (``thinking``, ``service_tier``, ``container``, ``mcp_servers``, ...) are ignored and named
  in the ``x-ignored-fields`` header.

Reply mapping: reasoning text (when the model gives any) becomes a ``thinking`` block with
an empty signature, text a ``text`` block, each tool call a ``tool_use`` block (its id the
engine's call id, its ``input`` the parsed arguments). ``stop_reason`` is ``end_turn``,
``stop_sequence`` (with ``stop_sequence`` the string that matched, which the engine reports
as the choice's ``stop_reason``), ``max_tokens`` or ``tool_use``. Usage counts
``input_tokens`` (prompt tokens not read from the prefix cache),
``cache_read_input_tokens`` (those read from it), ``cache_creation_input_tokens`` (0: the
local cache is automatic) and ``output_tokens``. The stream is named server-sent events:
``message_start`` (usage with the input counts, sent once the engine has run the prompt,
so its cache reads count as in ``message_delta``), one ``ping``, per content block
``content_block_start``, ``content_block_delta``... (``text_delta``, ``input_json_delta``,
``thinking_delta``), ``content_block_stop``, then ``message_delta`` (``stop_reason`` and the
final usage) and ``message_stop``; an engine failure partway ends it with an ``error``
event. Errors are Anthropic's shape, ``{"type": "error", "error": {"type", "message"}}``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from swiftclient.types import ChatCompletionChunk
from swiftclient.wire import messages as wire
from swiftclient.wire.messages import (
    MessagesRequestError,
    error_type,
    event_bytes,
    message_body,
    messages_error,
)

from .service import EXTRA_BODY_KEYS

__all__ = [
    "MessageEvents",
    "MessagesRequestError",
    "chat_fields",
    "error_type",
    "message_body",
    "messages_error",
    "named_event",
]

# vLLM's sampling extensions a client may send as extra body fields (``top_k`` is Anthropic's own)
_PASSED = EXTRA_BODY_KEYS - {"continuous_usage_stats"}
_INDEX = re.compile(r"\[(\d+)\]")


def _dotted(path: str) -> str:
    """A field path in Anthropic's dotted form: ``messages[0].role`` -> ``messages.0.role``."""
    return _INDEX.sub(r".\1", path)


def named_event(event: Mapping[str, Any]) -> bytes:
    """One named server-sent event: ``event: <type>`` then its JSON ``data``."""
    return event_bytes(str(event["type"]), event)


def chat_fields(body: Mapping[str, Any], ignored: list[str]) -> dict[str, Any]:
    """A ``/v1/messages`` body as chat-completions fields
    (:func:`swiftclient.wire.messages.chat_fields`, with the engine's extensions passed on
    and thinking blocks as reasoning text); the names of ignored fields are appended to
    ``ignored``.

    Raises :class:`MessagesRequestError` naming (in dotted form) a field the local server
    cannot serve.
    """
    try:
        fields = wire.chat_fields(
            body, ignored, extra_body=False, passed=_PASSED, thinking="text", automatic_cache=True
        )
    except MessagesRequestError as exc:
        param = None if exc.param is None else _dotted(exc.param)
        raise MessagesRequestError(_dotted(str(exc)), param) from exc
    if body.get("model") is None:  # it read "Input should be a valid string"
        raise MessagesRequestError("model: Field required", "model")
    called: set[str] = set()
    for message in fields["messages"]:
        called.update(call["id"] for call in message.get("tool_calls") or ())
        answered = message.get("tool_call_id")
        if message["role"] == "tool" and answered not in called:
            # a result of no call was accepted, and the model read it as if it were one
            raise MessagesRequestError(
                f"messages: the tool_result for tool_use_id {answered!r} answers no tool_use "
                "before it",
                "messages",
            )
    return fields


class MessageEvents:
    """Turns the engine's chat stream into the Messages event stream, as event objects
    (:class:`swiftclient.wire.messages.MessageEvents` with a ``ping``): the final usage
    chunk (no choices) closes the message, :meth:`fail` gives the ``error`` event of a
    stream the engine broke off.
    """

    def __init__(self, model: str) -> None:
        """Stream a message from ``model``."""
        self._events = wire.MessageEvents(model, ping=True)
        self.closed = False
        self._first: ChatCompletionChunk | None = None
        self._fed = False

    def feed(self, chunk: ChatCompletionChunk) -> list[dict[str, Any]]:
        """The events a chat chunk brings.

        The first chunk (the role, sent before the engine has run the prompt) is held until
        the next one, whose usage it takes: ``message_start`` then counts the prompt's
        cache reads as ``message_delta`` does.
        """
        if not self._fed:
            self._fed = True
            self._first = chunk
            return []
        events = []
        first, self._first = self._first, None
        if first is not None:
            usage = chunk.usage if chunk.usage is not None else first.usage
            events = self._events.feed(first.model_copy(update={"usage": usage}))
        events.extend(self._events.feed(chunk))
        if chunk.usage is not None and not chunk.choices and not self.closed:
            events.extend(self._events.end())
            self.closed = True
        return [data for _, data in events]

    def fail(self, status: int, message: str) -> dict[str, Any]:
        """The ``error`` event of a stream the engine broke off."""
        self.closed = True
        return self._events.fail(status, message)[1]
