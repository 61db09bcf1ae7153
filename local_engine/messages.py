"""Anthropic's Messages API (``POST /v1/messages``) over the chat service, stateless.

A Messages request is translated into a chat request (:func:`chat_fields`), served on the
same engine path as ``/v1/chat/completions``, and the chat reply translated back: a whole
completion into a ``message`` object (:func:`message_body`), streamed chunks into the
Messages event stream (:class:`MessageEvents`).

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
``message_start`` (usage with the input counts), one ``ping``, per content block
``content_block_start``, ``content_block_delta``... (``text_delta``, ``input_json_delta``,
``thinking_delta``), ``content_block_stop``, then ``message_delta`` (``stop_reason`` and the
final usage) and ``message_stop``; an engine failure partway ends it with an ``error``
event. Errors are Anthropic's shape, ``{"type": "error", "error": {"type", "message"}}``.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from swiftclient.types import ChatCompletion, ChatCompletionChunk, ToolCallDelta, Usage

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

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}
_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
# vLLM's sampling extensions a client may send as extra body fields (``top_k`` is Anthropic's own)
_PASSED = EXTRA_BODY_KEYS - {"continuous_usage_stats"}
_HANDLED = frozenset(
    {
        "model",
        "max_tokens",
        "messages",
        "system",
        "tools",
        "tool_choice",
        "stop_sequences",
        "temperature",
        "top_p",
        "metadata",
        "stream",
        "output_config",
        "output_format",
    }
)


class MessagesRequestError(ValueError):
    """A Messages request the local server cannot serve; ``param`` names the field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def error_type(status: int) -> str:
    """Anthropic's error ``type`` for an HTTP status."""
    return _ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")


def messages_error(status: int, message: str) -> dict[str, Any]:
    """An error body in Anthropic's shape."""
    return {"type": "error", "error": {"type": error_type(status), "message": message}}


def named_event(event: Mapping[str, Any]) -> bytes:
    """One named server-sent event: ``event: <type>`` then its JSON ``data``."""
    data = json.dumps(event, ensure_ascii=False, separators=(",", ":"))
    return f"event: {event['type']}\ndata: {data}\n\n".encode()


# ---------------------------------------------------------------------- request


def chat_fields(body: Mapping[str, Any], ignored: list[str]) -> dict[str, Any]:
    """A ``/v1/messages`` body as chat-completions fields; the names of ignored fields are
    appended to ``ignored``.

    Raises :class:`MessagesRequestError` naming a field the local server cannot serve.
    """
    limit = body.get("max_tokens")
    if limit is None:
        raise MessagesRequestError("max_tokens: Field required", "max_tokens")
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise MessagesRequestError("max_tokens: must be an integer >= 1", "max_tokens")
    fields: dict[str, Any] = {"model": body.get("model"), "max_tokens": limit}
    messages = _system(body.get("system"))
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise MessagesRequestError("messages: must be a non-empty list", "messages")
    for index, message in enumerate(raw):
        messages.extend(_turn(message, f"messages.{index}"))
    fields["messages"] = messages
    tools = body.get("tools")
    if tools is not None:
        fields["tools"] = _tools(tools)
    choice = body.get("tool_choice")
    if choice is not None:
        _tool_choice(choice, fields)
    stops = body.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise MessagesRequestError(
                "stop_sequences: must be a list of strings", "stop_sequences"
            )
        if stops:
            fields["stop"] = stops
    for name in ("temperature", "top_p", "stream"):
        if body.get(name) is not None:
            fields[name] = body[name]
    metadata = body.get("metadata")
    if isinstance(metadata, Mapping) and isinstance(metadata.get("user_id"), str):
        fields["user"] = metadata["user_id"]
    _output_format(body, fields)
    for name, value in body.items():
        if name in _PASSED:
            fields[name] = value
        elif name not in _HANDLED:
            ignored.append(str(name))
    return fields


def _text_of(blocks: Any, where: str) -> str:
    """The text of a string or a list of ``text`` blocks."""
    if isinstance(blocks, str):
        return blocks
    if not isinstance(blocks, list):
        raise MessagesRequestError(f"{where}: must be a string or a list of blocks", where)
    parts = []
    for index, block in enumerate(blocks):
        if not isinstance(block, Mapping) or block.get("type") != "text":
            raise MessagesRequestError(
                f"{where}.{index}: only text blocks are supported here", f"{where}.{index}"
            )
        text = block.get("text")
        if not isinstance(text, str):
            raise MessagesRequestError(f"{where}.{index}.text: must be a string", where)
        parts.append(text)
    return "".join(parts)


def _system(system: Any) -> list[dict[str, Any]]:
    if system is None:
        return []
    text = _text_of(system, "system")
    return [{"role": "system", "content": text}] if text else []


def _image(block: Mapping[str, Any], where: str) -> dict[str, Any]:
    source = block.get("source")
    if isinstance(source, Mapping) and source.get("type") == "base64":
        url = f"data:{source.get('media_type')};base64,{source.get('data')}"
    elif isinstance(source, Mapping) and source.get("type") == "url":
        url = str(source.get("url"))
    else:
        raise MessagesRequestError(
            f"{where}.source: only base64 and url image sources are supported", where
        )
    return {"type": "image_url", "image_url": {"url": url}}


def _turn(message: Any, where: str) -> list[dict[str, Any]]:
    """One Messages turn as chat messages (tool results become tool messages first)."""
    if not isinstance(message, Mapping):
        raise MessagesRequestError(f"{where}: must be an object", where)
    role = message.get("role")
    if role not in ("user", "assistant"):
        raise MessagesRequestError(f"{where}.role: must be user or assistant", f"{where}.role")
    content = message.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise MessagesRequestError(
            f"{where}.content: must be a string or a list of blocks", f"{where}.content"
        )
    results: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    thinking: list[str] = []
    for index, block in enumerate(content):
        at = f"{where}.content.{index}"
        kind = block.get("type") if isinstance(block, Mapping) else None
        if kind == "text" and isinstance(block.get("text"), str):
            parts.append({"type": "text", "text": block["text"]})
        elif kind == "image" and role == "user":
            parts.append(_image(block, at))
        elif kind == "tool_use" and role == "assistant":
            arguments = block.get("input", {})
            calls.append(
                {
                    "id": _string(block, "id", at),
                    "type": "function",
                    "function": {
                        "name": _string(block, "name", at),
                        "arguments": json.dumps(arguments, ensure_ascii=False),
                    },
                }
            )
        elif kind == "tool_result" and role == "user":
            text = _result_text(block.get("content"), at)
            if block.get("is_error"):
                text = f"Error: {text}"
            results.append(
                {"role": "tool", "tool_call_id": _string(block, "tool_use_id", at), "content": text}
            )
        elif kind == "thinking" and role == "assistant":
            if isinstance(block.get("thinking"), str):
                thinking.append(block["thinking"])
        elif kind == "redacted_thinking" and role == "assistant":
            continue
        else:
            raise MessagesRequestError(
                f"{at}: {role} content blocks of type {kind!r} are not supported by the local "
                "server",
                f"{at}.type",
            )
    turn: list[dict[str, Any]] = list(results)
    if role == "assistant":
        reply: dict[str, Any] = {"role": "assistant", "content": _joined(parts)}
        if calls:
            reply["tool_calls"] = calls
        if thinking:
            reply["reasoning_content"] = "".join(thinking)
        if reply["content"] is not None or calls:
            turn.append(reply)
    elif parts:
        turn.append({"role": "user", "content": _joined(parts)})
    return turn


def _joined(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]] | None:
    if not parts:
        return None
    if all(part["type"] == "text" for part in parts):
        return "".join(part["text"] for part in parts)
    return parts


def _result_text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [
            block["text"]
            for block in content
            if isinstance(block, Mapping)
            and block.get("type") == "text"
            and isinstance(block.get("text"), str)
        ]
        if len(texts) == len(content):
            return "".join(texts)
    raise MessagesRequestError(
        f"{where}.content: a tool result must be a string or text blocks on the local server",
        f"{where}.content",
    )


def _string(block: Mapping[str, Any], key: str, where: str) -> str:
    value = block.get(key)
    if not isinstance(value, str) or not value:
        raise MessagesRequestError(f"{where}.{key}: must be a non-empty string", f"{where}.{key}")
    return value


def _tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise MessagesRequestError("tools: must be a list", "tools")
    converted = []
    for index, tool in enumerate(tools):
        kind = tool.get("type", "custom") if isinstance(tool, Mapping) else None
        if not isinstance(tool, Mapping) or kind not in ("custom", None):
            raise MessagesRequestError(
                f"tools.{index}: only custom tools (name, input_schema) are supported by the "
                f"local server (got type {kind!r}); server tools run on Anthropic's side",
                f"tools.{index}.type",
            )
        function: dict[str, Any] = {"name": _string(tool, "name", f"tools.{index}")}
        if tool.get("description") is not None:
            function["description"] = tool["description"]
        schema = tool.get("input_schema")
        if not isinstance(schema, Mapping):
            raise MessagesRequestError(
                f"tools.{index}.input_schema: must be an object", f"tools.{index}.input_schema"
            )
        function["parameters"] = dict(schema)
        converted.append({"type": "function", "function": function})
    return converted


def _tool_choice(choice: Any, fields: dict[str, Any]) -> None:
    kind = choice.get("type") if isinstance(choice, Mapping) else None
    if kind == "auto":
        fields["tool_choice"] = "auto"
    elif kind == "any":
        fields["tool_choice"] = "required"
    elif kind == "none":
        fields["tool_choice"] = "none"
    elif kind == "tool":
        name = _string(choice, "name", "tool_choice")
        fields["tool_choice"] = {"type": "function", "function": {"name": name}}
    else:
        raise MessagesRequestError(
            "tool_choice: must be {'type': 'auto' | 'any' | 'none'} or "
            "{'type': 'tool', 'name': ...}",
            "tool_choice",
        )
    if isinstance(choice, Mapping) and choice.get("disable_parallel_tool_use") is True:
        fields["parallel_tool_calls"] = False


def _output_format(body: Mapping[str, Any], fields: dict[str, Any]) -> None:
    """Anthropic's structured outputs (``output_config.format`` or the older
    ``output_format``) as ``response_format``."""
    config = body.get("output_config")
    fmt = config.get("format") if isinstance(config, Mapping) else None
    if fmt is None:
        fmt = body.get("output_format")
    if fmt is None:
        return
    if not isinstance(fmt, Mapping) or fmt.get("type") != "json_schema":
        raise MessagesRequestError(
            "output_config.format: only {'type': 'json_schema', 'schema': ...} is supported",
            "output_config.format",
        )
    schema = fmt.get("schema")
    if not isinstance(schema, Mapping):
        raise MessagesRequestError(
            "output_config.format.schema: must be an object", "output_config.format.schema"
        )
    fields["response_format"] = {
        "type": "json_schema",
        "json_schema": {"name": "output", "schema": dict(schema)},
    }


# ---------------------------------------------------------------------- reply


def message_id() -> str:
    """A fresh ``msg_...`` id."""
    return f"msg_{secrets.token_hex(12)}"


def _usage(usage: Usage | None) -> dict[str, Any]:
    if usage is None:
        return {"input_tokens": 0, "output_tokens": 0}
    cached = usage.cached_tokens
    return {
        "input_tokens": max(0, usage.prompt_tokens - cached),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "output_tokens": usage.completion_tokens,
    }


def _input(arguments: str) -> dict[str, Any]:
    """A tool call's arguments as a ``tool_use`` block's ``input`` (an object; arguments
    that are not a JSON object are kept whole under ``"arguments"``)."""
    try:
        parsed = json.loads(arguments) if arguments else {}
    except ValueError:
        return {"arguments": arguments}
    return parsed if isinstance(parsed, dict) else {"arguments": parsed}


def _stop_reason(finish_reason: str | None) -> str:
    return _STOP_REASONS.get(finish_reason or "stop", "end_turn")


def _stop_string(choice: BaseModel) -> str | None:
    """The stop sequence that ended a choice (the engine's ``stop_reason``), else None."""
    matched = (choice.model_extra or {}).get("stop_reason")
    return matched if isinstance(matched, str) else None


def _stop_fields(finish_reason: str | None, matched: str | None) -> dict[str, Any]:
    """``stop_reason`` and ``stop_sequence`` of a message."""
    if finish_reason == "stop" and matched is not None:
        return {"stop_reason": "stop_sequence", "stop_sequence": matched}
    return {"stop_reason": _stop_reason(finish_reason), "stop_sequence": None}


def message_body(completion: ChatCompletion, model: str) -> dict[str, Any]:
    """A whole chat completion as a Messages ``message`` object."""
    choice = completion.choices[0]
    message = choice.message
    content: list[dict[str, Any]] = []
    reasoning = message.reasoning_content or message.reasoning
    if reasoning:
        content.append({"type": "thinking", "thinking": reasoning, "signature": ""})
    text = message.content or message.refusal
    if text or not message.tool_calls:
        content.append({"type": "text", "text": text or ""})
    for call in message.tool_calls or ():
        content.append(
            {
                "type": "tool_use",
                "id": call.id,
                "name": call.function.name,
                "input": _input(call.function.arguments),
            }
        )
    finish = choice.finish_reason
    if message.tool_calls and finish == "stop":
        finish = "tool_calls"
    return {
        "id": message_id(),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        **_stop_fields(finish, _stop_string(choice)),
        "usage": _usage(completion.usage),
    }


class MessageEvents:
    """Turns a chat stream's chunks into the Messages event stream.

    :meth:`start` gives ``message_start`` and a ``ping`` (from the first chunk, whose usage
    carries the prompt's size), :meth:`feed` the events of each chunk (the final usage chunk
    closes the message: the last block's stop, ``message_delta`` and ``message_stop``),
    :meth:`fail` the ``error`` event of a stream the engine broke off.
    """

    def __init__(self, model: str) -> None:
        """Stream a message from ``model``."""
        self._model = model
        self._id = message_id()
        self._index = -1
        self._open: str | None = None  # the kind of the block being streamed
        self._calls: dict[int, int] = {}  # tool call index -> block index
        self._finish: str | None = None
        self._matched: str | None = None
        self.started = False
        self.closed = False

    def start(self, usage: Usage | None) -> list[dict[str, Any]]:
        """``message_start`` (with the input counts known so far) and one ``ping``."""
        self.started = True
        counts = _usage(usage)
        counts["output_tokens"] = 0
        message: dict[str, Any] = {
            "id": self._id,
            "type": "message",
            "role": "assistant",
            "model": self._model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": counts,
        }
        return [{"type": "message_start", "message": message}, {"type": "ping"}]

    def feed(self, chunk: ChatCompletionChunk) -> list[dict[str, Any]]:
        """The events a chat chunk brings."""
        events: list[dict[str, Any]] = []
        if not self.started:
            events.extend(self.start(chunk.usage))
        for choice in chunk.choices:
            delta = choice.delta
            reasoning = delta.reasoning_content or delta.reasoning
            if reasoning:
                events.extend(
                    self._delta("thinking", {"type": "thinking_delta", "thinking": reasoning})
                )
            if delta.content:
                events.extend(self._delta("text", {"type": "text_delta", "text": delta.content}))
            for call in delta.tool_calls or ():
                events.extend(self._call(call))
            if choice.finish_reason is not None:
                self._finish = choice.finish_reason
                self._matched = _stop_string(choice)
        if chunk.usage is not None and not chunk.choices:
            events.extend(self._close(chunk.usage))
        return events

    def _begin(self, kind: str, block: dict[str, Any]) -> list[dict[str, Any]]:
        events = self._end()
        self._index += 1
        self._open = kind
        events.append({"type": "content_block_start", "index": self._index, "content_block": block})
        return events

    def _end(self) -> list[dict[str, Any]]:
        if self._open is None:
            return []
        self._open = None
        return [{"type": "content_block_stop", "index": self._index}]

    def _delta(self, kind: str, delta: dict[str, Any]) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if self._open != kind:
            block: dict[str, Any] = (
                {"type": "text", "text": ""}
                if kind == "text"
                else {"type": "thinking", "thinking": "", "signature": ""}
            )
            events = self._begin(kind, block)
        events.append({"type": "content_block_delta", "index": self._index, "delta": delta})
        return events

    def _call(self, delta: ToolCallDelta) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        function = delta.function
        block = self._calls.get(delta.index)
        if block is None:
            name = (function.name or "") if function is not None else ""
            call_id = delta.id or f"toolu_{secrets.token_hex(12)}"
            events = self._begin(
                "tool_use", {"type": "tool_use", "id": call_id, "name": name, "input": {}}
            )
            block = self._calls[delta.index] = self._index
        if function is not None and function.arguments:
            events.append(
                {
                    "type": "content_block_delta",
                    "index": block,
                    "delta": {"type": "input_json_delta", "partial_json": function.arguments},
                }
            )
        return events

    def _close(self, usage: Usage) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if self._index < 0:  # an empty reply is still one (empty) text block
            events.extend(self._begin("text", {"type": "text", "text": ""}))
        events.extend(self._end())
        finish = self._finish
        if self._calls and finish == "stop":
            finish = "tool_calls"
        self.closed = True
        events.append(
            {
                "type": "message_delta",
                "delta": _stop_fields(finish, self._matched),
                "usage": _usage(usage),
            }
        )
        events.append({"type": "message_stop"})
        return events

    def fail(self, status: int, message: str) -> dict[str, Any]:
        """The ``error`` event of a stream the engine broke off."""
        self.closed = True
        return messages_error(status, message)
