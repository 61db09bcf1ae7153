"""The server side of Anthropic's Messages API (``POST /v1/messages``) over the chat contract.

A Messages request is translated into a chat request (:func:`chat_fields`), served as a
chat call, and the chat reply translated back: a whole completion into a ``message`` body
(:func:`message_body`), streamed chunks into the Messages event stream
(:class:`MessageEvents`). The SDK transports (:mod:`swiftclient.transports`) use it to
answer the ``anthropic`` SDK with a swiftclient client, so any backend (an OpenAI-compatible
provider, ``local/...``, an :class:`~swiftclient.AnthropicBackend`) answers it. It is the
reverse of :class:`~swiftclient.AnthropicBackend`'s translation (chat to Messages and back).

Request mapping:

- ``system`` (a string or text blocks): one system message first; ``messages``: user and
  assistant turns whose ``content`` is a string or blocks: ``text``; ``image`` (a base64
  source becomes a ``data:`` URL, a ``url`` source its URL); on assistant turns ``tool_use``
  blocks become ``tool_calls`` (their ``input`` the JSON arguments) and signed ``thinking``
  and ``redacted_thinking`` blocks the message's ``thinking_blocks`` (sent back unchanged by
  an Anthropic backend; an unsigned block, reasoning text of another provider, is
  dropped), or, for a server whose model reads its own reasoning (``thinking="text"``),
  the thinking text its ``reasoning_content``; on user turns each ``tool_result`` block
  becomes a tool message (its text; ``is_error`` prefixes ``Error:``), placed before the
  turn's other content;
- ``tools`` (``name``, ``description``, ``input_schema``): function tools; server tools
  (web search, code execution, ...) are refused; ``tool_choice`` ``auto`` / ``any`` /
  ``tool`` / ``none`` becomes ``auto`` / ``required`` / the named function / ``none``, and
  ``disable_parallel_tool_use`` ``parallel_tool_calls: false``;
- ``max_tokens`` (required, as by the API), ``stop_sequences`` (``stop``), ``temperature``
  and ``top_p`` (from 0 to 1, as the API takes them), ``metadata.user_id`` (``user``);
  ``output_format`` / ``output_config.format`` (``json_schema``) becomes a ``json_schema``
  ``response_format``; ``top_k`` (an integer >= 0) and ``thinking`` travel in
  ``extra_body`` (an Anthropic backend sends them on);
- ``cache_control`` marks are dropped and named in ``x-ignored-fields`` (an
  ``AnthropicBackend`` with ``cache_breakpoints=True`` places its own); other
  fields are ignored and named to the caller.

Reply mapping: the message's ``thinking_blocks`` first (or its reasoning text as a
``thinking`` block with an empty signature), then a ``text`` block, then one
``tool_use`` block per tool call; ``stop_reason`` from the finish reason (``stop``
``end_turn``, ``tool_calls`` ``tool_use``, ``length`` ``max_tokens``; ``stop_sequence``,
with the string, where the choice's ``stop_reason`` names the stop string that matched, as
vLLM's does); usage as Anthropic counts it (``input_tokens`` without the cache reads and
writes, which are ``cache_read_input_tokens`` and ``cache_creation_input_tokens``). The
stream is ``message_start`` (its usage the input counts of the first chunk; then a
``ping`` where asked), per block ``content_block_start`` / ``content_block_delta``... /
``content_block_stop``, then ``message_delta`` (stop reason and usage) and
``message_stop``; a failure partway is an ``error`` event. Errors use Anthropic's shape,
``{"type": "error", "error": {"type", "message"}}``.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Literal

from ..types import ChatCompletion, ChatCompletionChunk, ToolCallDelta, Usage
from . import joined_content, matched_stop, named_event

__all__ = [
    "STOP_REASONS",
    "MessageEvents",
    "PREFILL_FIELDS",
    "MessagesRequestError",
    "chat_fields",
    "error_type",
    "event_bytes",
    "message_body",
    "message_id",
    "messages_error",
]

STOP_REASONS = {
    "stop": "end_turn",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "length": "max_tokens",
    "content_filter": "refusal",
}
"""Anthropic's ``stop_reason`` for a chat finish reason."""
_NATIVE_STOPS = frozenset(
    {"end_turn", "max_tokens", "stop_sequence", "tool_use", "pause_turn", "refusal"}
    | {"model_context_window_exceeded"}
)
"""Anthropic's own stop reasons: one an Anthropic backend handed on as its finish reason
(``pause_turn``) goes back unchanged."""
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}
ERROR_TYPES = frozenset({*_ERROR_TYPES.values(), "api_error"})
"""Anthropic's error ``type`` values (an answer in its shape names one of them)."""
_THINKING = frozenset({"thinking", "redacted_thinking"})
_SAME = ("temperature", "top_p")
_EXTRA = ("top_k", "thinking")
_HANDLED = frozenset(
    {
        *_SAME,
        "model",
        "messages",
        "system",
        "max_tokens",
        "stop_sequences",
        "tools",
        "tool_choice",
        "metadata",
        "stream",
        "output_format",
        "output_config",
        "cache_control",
    }
)


def error_type(status: int) -> str:
    """Anthropic's error ``type`` for an HTTP status."""
    return _ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")


def messages_error(status: int, message: str, kind: str | None = None) -> dict[str, Any]:
    """An Anthropic error body: its ``type`` the one Anthropic gives the status, or, for a
    status without one of its own, ``kind`` (the provider's) when that is one of Anthropic's
    (:data:`ERROR_TYPES`), else ``api_error`` (5xx) or ``invalid_request_error``."""
    if status in _ERROR_TYPES or kind not in ERROR_TYPES:
        kind = error_type(status)
    return {"type": "error", "error": {"type": kind, "message": message}}


def event_bytes(kind: str, data: Mapping[str, Any]) -> bytes:
    """One named server-sent event: ``event: <kind>`` then its JSON ``data``."""
    return named_event(kind, data)


class MessagesRequestError(ValueError):
    """A Messages request that cannot be served as a chat call; ``param`` names the field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


# ---------------------------------------------------------------------- request


def chat_fields(
    body: Mapping[str, Any],
    ignored: list[str],
    *,
    passed: frozenset[str] = frozenset(),
    extra_body: bool = True,
    thinking: Literal["blocks", "text"] = "blocks",
    automatic_cache: bool = False,
) -> dict[str, Any]:
    """A ``/v1/messages`` body as chat-completions fields (``model``, ``messages``,
    ``stream`` and :class:`~swiftclient.types.ChatRequest` fields); append the names of
    ignored fields to ``ignored``.

    ``passed`` names fields (a server's own extensions) that go on to the chat request as
    they are; with ``extra_body`` the Anthropic-only ``top_k`` and ``thinking`` travel in
    ``extra_body`` (else they are ignored, unless passed). ``thinking`` says what an
    assistant turn's thinking blocks become: ``"blocks"``, the signed ones as the message's
    ``thinking_blocks`` (for a provider that takes them back); ``"text"``, all their text
    as its ``reasoning_content`` (for a model that reads its own reasoning).
    ``automatic_cache``: the server caches prefixes itself, so ``cache_control`` marks ask
    nothing of it and are not named as ignored.

    Raises :class:`MessagesRequestError` naming a field that cannot be served.
    """
    limit = body.get("max_tokens")
    if limit is None:
        raise MessagesRequestError("max_tokens: Field required", "max_tokens")
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise MessagesRequestError("max_tokens: must be an integer >= 1", "max_tokens")
    fields: dict[str, Any] = {"model": body.get("model"), "max_tokens": limit}
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if system is not None:
        text = _system(system)
        if text:
            messages.append({"role": "system", "content": text})
    turns = body.get("messages")
    if not isinstance(turns, list) or not turns:
        raise MessagesRequestError("messages must be a non-empty list of messages", "messages")
    for index, turn in enumerate(turns):
        messages.extend(_turn(turn, f"messages[{index}]", thinking))
    fields["messages"] = messages
    _prefill(messages[-1], fields)
    stops = body.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise MessagesRequestError("stop_sequences must be a list of strings", "stop_sequences")
        if stops:
            fields["stop"] = stops
    for name in _SAME:  # Anthropic's API takes both from 0 to 1 (OpenAI's temperature to 2)
        value = body.get(name)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
                raise MessagesRequestError(f"{name}: must be a number from 0 to 1", name)
            fields[name] = value
    top_k = body.get("top_k")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0):
        raise MessagesRequestError("top_k: must be an integer >= 0", "top_k")
    for name in ("metadata", "thinking"):  # objects on Anthropic's API: else dropped unsaid
        if body.get(name) is not None and not isinstance(body[name], Mapping):
            raise MessagesRequestError(f"{name} must be an object", name)
    metadata = body.get("metadata")
    if isinstance(metadata, Mapping):
        user = metadata.get("user_id")
        if user is not None and not isinstance(user, str):
            raise MessagesRequestError("metadata.user_id must be a string", "metadata.user_id")
        if user is not None:
            fields["user"] = user
    tools = body.get("tools")
    if tools:
        fields["tools"] = _tools(tools)
    choice = body.get("tool_choice")
    if choice is not None:
        _tool_choice(choice, fields)
    _output_format(body, fields)
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise MessagesRequestError("stream must be a boolean", "stream")  # "yes" was false
    if stream:
        fields["stream"] = True
    extra: dict[str, Any] = {}
    config = body.get("output_config")
    if isinstance(config, Mapping) and "output_config" not in passed:
        # its format is mapped; the rest (effort) has no chat field that every provider
        # takes (sent on, it is a 400 from OpenAI's API), so it is named
        ignored.extend(
            f"output_config.{k}" for k, v in config.items() if k != "format" and v is not None
        )
    for name, value in body.items():
        if name in passed:
            fields[name] = value
        elif extra_body and name in _EXTRA:
            if value is not None:
                extra[name] = value
        elif name not in _HANDLED:
            ignored.append(str(name))
    if not automatic_cache and "cache_control" not in passed and _cache_marks(body):
        ignored.append("cache_control")
    if extra:
        fields["extra_body"] = extra
    return fields


PREFILL_FIELDS: Mapping[str, bool] = MappingProxyType(
    {"continue_final_message": True, "add_generation_prompt": False}
)
"""The chat fields that ask for a final assistant turn to be continued (vLLM's chat
template extensions, which the local engine also reads)."""


def _prefill(last: dict[str, Any], fields: dict[str, Any]) -> None:
    """A final assistant turn of text is a prefill: the reply continues it, and says only
    what comes after it, as Anthropic's API answers. On chat completions that is
    :data:`PREFILL_FIELDS` (sent in ``extra_body``: a backend of Anthropic's API drops
    them, since it continues such a turn itself; a provider that cannot continue one
    refuses them). Content ending in whitespace is refused, as there."""
    if last["role"] != "assistant" or last.get("tool_calls"):
        return
    content = last.get("content")
    if not isinstance(content, str) or not content:
        return
    if content != content.rstrip():
        raise MessagesRequestError(
            "messages: final assistant content cannot end with trailing whitespace", "messages"
        )
    fields.update(PREFILL_FIELDS)


def _cache_marks(body: Mapping[str, Any]) -> bool:
    """Whether the request marks a cache breakpoint anywhere (the top level, tools, system
    blocks, a message, its content blocks, a tool result's blocks): dropped, so named as
    ignored."""
    if body.get("cache_control") is not None:
        return True
    blocks: list[Any] = []
    for key in ("tools", "system"):
        if isinstance(body.get(key), list):
            blocks.extend(body[key])
    for turn in body.get("messages") or ():
        if isinstance(turn, Mapping) and turn.get("cache_control") is not None:
            return True  # on the message itself, as some clients put it
        content = turn.get("content") if isinstance(turn, Mapping) else None
        if isinstance(content, list):
            blocks.extend(content)
            for block in content:  # a tool result's own blocks
                inner = block.get("content") if isinstance(block, Mapping) else None
                if isinstance(inner, list):
                    blocks.extend(inner)
    return any(isinstance(b, Mapping) and b.get("cache_control") is not None for b in blocks)


def _text(block: Any, where: str) -> str:
    if isinstance(block, Mapping) and block.get("type") == "text":
        text = block.get("text")
        if isinstance(text, str):
            return text
    raise MessagesRequestError(f"{where} must be a text block", where)


def _system(system: Any) -> str:
    if isinstance(system, str):
        return system
    if not isinstance(system, list):
        raise MessagesRequestError("system must be a string or a list of text blocks", "system")
    return "\n\n".join(_text(block, f"system[{i}]") for i, block in enumerate(system))


def _image(block: Mapping[str, Any], where: str) -> dict[str, Any]:
    source = block.get("source")
    if isinstance(source, Mapping):
        kind = source.get("type")
        if kind == "base64" and isinstance(source.get("data"), str):
            url = f"data:{source.get('media_type')};base64,{source['data']}"
            return {"type": "image_url", "image_url": {"url": url}}
        if kind == "url" and isinstance(source.get("url"), str):
            return {"type": "image_url", "image_url": {"url": source["url"]}}
    raise MessagesRequestError(f"{where}: an image needs a base64 or url source", where)


def _parts(content: Any, where: str) -> list[dict[str, Any]]:
    """Text and image blocks as chat content parts."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise MessagesRequestError(f"{where} must be a string or a list of blocks", where)
    parts: list[dict[str, Any]] = []
    for index, block in enumerate(content):
        at = f"{where}[{index}]"
        kind = block.get("type") if isinstance(block, Mapping) else None
        if kind == "text":
            parts.append({"type": "text", "text": _text(block, at)})
        elif kind == "image":
            parts.append(_image(block, at))
        else:
            raise MessagesRequestError(
                f"{at}: content blocks of type {kind!r} are not supported here", f"{at}.type"
            )
    return parts


def _turn(turn: Any, where: str, thinking: str) -> list[dict[str, Any]]:
    """One Messages turn as chat messages."""
    if not isinstance(turn, Mapping):
        raise MessagesRequestError(f"{where} must be an object", where)
    role = turn.get("role")
    content = turn.get("content")
    if role not in ("user", "assistant"):
        raise MessagesRequestError(f"{where}.role must be user or assistant", f"{where}.role")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise MessagesRequestError(
            f"{where}.content must be a string or a list of blocks", f"{where}.content"
        )
    if role == "assistant":
        return [_assistant(content, f"{where}.content", thinking)]
    if not content:  # as Anthropic's API answers: only a final assistant turn may be empty
        raise MessagesRequestError(
            f"{where}.content must not be empty (a user turn needs at least one block)",
            f"{where}.content",
        )
    tools: list[dict[str, Any]] = []
    rest: list[Any] = []
    for index, block in enumerate(content):
        if isinstance(block, Mapping) and block.get("type") == "tool_result":
            tools.append(_tool_result(block, f"{where}.content[{index}]"))
        else:
            rest.append(block)
    out = list(tools)
    if rest or not tools:
        out.append({"role": "user", "content": joined_content(_parts(rest, f"{where}.content"))})
    return out


def _assistant(content: list[Any], where: str, as_: str) -> dict[str, Any]:
    texts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    thinking: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for index, block in enumerate(content):
        at = f"{where}[{index}]"
        kind = block.get("type") if isinstance(block, Mapping) else None
        if kind == "tool_use":
            name = block.get("name")
            call_id = block.get("id")
            if not isinstance(name, str) or not isinstance(call_id, str):
                raise MessagesRequestError(f"{at}: a tool_use block needs an id and a name", at)
            given = block.get("input")
            if given is not None and not isinstance(given, Mapping):  # sent on as a string
                raise MessagesRequestError(f"{at}.input must be an object", f"{at}.input")
            arguments = json.dumps(given or {}, ensure_ascii=False)
            calls.append(
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": arguments},
                }
            )
        elif isinstance(kind, str) and kind in _THINKING:
            if as_ == "text":  # redacted blocks are dropped: a model cannot read them
                if kind == "thinking" and isinstance(block.get("thinking"), str):
                    reasoning.append(block["thinking"])
            elif block.get("signature") or kind == "redacted_thinking":
                thinking.append(dict(block))
        else:
            texts.extend(_parts([block], where))
    message: dict[str, Any] = {"role": "assistant"}
    message["content"] = joined_content(texts) if texts else None
    if calls:
        message["tool_calls"] = calls
    if thinking:
        message["thinking_blocks"] = thinking
    if reasoning:
        message["reasoning_content"] = "".join(reasoning)
    return message


def _tool_result(block: Mapping[str, Any], where: str) -> dict[str, Any]:
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str) or not call_id:
        raise MessagesRequestError(f"{where}.tool_use_id must be a non-empty string", where)
    content = block.get("content")
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    else:
        parts = _parts(content, f"{where}.content")
        if any(part["type"] != "text" for part in parts):
            raise MessagesRequestError(
                f"{where}.content: a tool result carries text only here", f"{where}.content"
            )
        text = "\n".join(part["text"] for part in parts)
    if block.get("is_error") is True:
        text = f"Error: {text}"
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def _tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise MessagesRequestError("tools must be a list", "tools")
    converted = []
    for index, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, Mapping) else None
        if not isinstance(tool, Mapping) or kind not in (None, "custom"):
            raise MessagesRequestError(
                f"tools[{index}]: only client tools (name, input_schema) are supported here "
                f"(got type {kind!r}); server tools run on Anthropic's side",
                f"tools[{index}].type",
            )
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise MessagesRequestError(f"tools[{index}].name is required", f"tools[{index}].name")
        function: dict[str, Any] = {"name": name}
        if isinstance(tool.get("description"), str):
            function["description"] = tool["description"]
        schema = tool.get("input_schema")
        if schema is None:  # required by Anthropic's API, as here (a wrong type: below)
            raise MessagesRequestError(
                f"tools[{index}].input_schema: Field required", f"tools[{index}].input_schema"
            )
        function["parameters"] = schema or {"type": "object"}
        if isinstance(tool.get("strict"), bool):  # the inputs must match the schema
            function["strict"] = tool["strict"]
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
    elif kind == "tool" and isinstance(choice.get("name"), str):
        fields["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    else:
        raise MessagesRequestError(
            "tool_choice must be {'type': 'auto' | 'any' | 'none'} or "
            "{'type': 'tool', 'name': ...}",
            "tool_choice",
        )
    if choice.get("disable_parallel_tool_use") is True and "tools" in fields:
        fields["parallel_tool_calls"] = False


def _output_format(body: Mapping[str, Any], fields: dict[str, Any]) -> None:
    """``output_format`` (or ``output_config.format``) as a ``json_schema`` response format."""
    fmt = body.get("output_format")
    named = "output_format"
    config = body.get("output_config")
    if fmt is None and isinstance(config, Mapping):
        fmt = config.get("format")
        named = "output_config.format"
    if fmt is None:
        return
    if not isinstance(fmt, Mapping) or fmt.get("type") != "json_schema":
        raise MessagesRequestError(
            f"{named} must be {{'type': 'json_schema', 'schema': ...}}", named
        )
    schema = {"name": "output", "schema": fmt.get("schema") or {"type": "object"}}
    fields["response_format"] = {"type": "json_schema", "json_schema": schema}


# ---------------------------------------------------------------------- reply


def _usage(usage: Usage | None) -> dict[str, int]:
    if usage is None:
        return {"input_tokens": 0, "output_tokens": 0}
    read = usage.cached_tokens
    written = usage.cache_write_tokens
    return {
        "input_tokens": max(0, usage.prompt_tokens - read - written),
        "cache_creation_input_tokens": written,
        "cache_read_input_tokens": read,
        "output_tokens": usage.completion_tokens,
    }


def _stop_reason(finish_reason: str | None) -> str | None:
    if finish_reason is None:
        return None
    native = finish_reason if finish_reason in _NATIVE_STOPS else "end_turn"
    return STOP_REASONS.get(finish_reason, native)


def _stop_fields(finish_reason: str | None, calls: bool, matched: str | None) -> dict[str, Any]:
    """A message's ``stop_reason`` and ``stop_sequence`` (``calls``: it made tool calls). A
    matched stop string wins over the calls: a call it cut short is no finished call."""
    if finish_reason == "stop" and matched is not None:
        return {"stop_reason": "stop_sequence", "stop_sequence": matched}
    if finish_reason == "stop" and calls:
        finish_reason = "tool_calls"
    return {"stop_reason": _stop_reason(finish_reason) or "end_turn", "stop_sequence": None}


def _tool_input(arguments: str) -> Any:
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return {}  # a model's broken JSON: the SDK needs an object
    return value if isinstance(value, dict) else {}


def message_id(completion_id: str = "") -> str:
    """A Messages id: the completion's when it is one (``msg_...``), else a new one."""
    return completion_id if completion_id.startswith("msg_") else f"msg_{secrets.token_hex(12)}"


def message_body(completion: ChatCompletion, model: str) -> dict[str, Any]:
    """A whole chat completion as a ``message`` body; ``model`` the model it echoes."""
    choice = completion.choices[0]
    message = choice.message
    content: list[dict[str, Any]] = [dict(block) for block in message.thinking_blocks or ()]
    reasoning = message.reasoning_content or message.reasoning
    if not content and reasoning:  # unsigned: not sent back to a provider (see _assistant)
        content.append({"type": "thinking", "thinking": reasoning, "signature": ""})
    text = message.content or message.refusal
    if text:  # an empty reply is no block, as the stream sends it (the API refuses "" blocks)
        content.append({"type": "text", "text": text})
    for call in message.tool_calls or ():
        content.append(
            {
                "type": "tool_use",
                "id": call.id,
                "name": call.function.name,
                "input": _tool_input(call.function.arguments),
            }
        )
    return {
        "id": message_id(completion.id),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        **_stop_fields(choice.finish_reason, bool(message.tool_calls), matched_stop(choice)),
        "usage": _usage(completion.usage),
    }


class MessageEvents:
    """Turns a chat stream's chunks into the Messages event stream, as ``(type, data)``.

    :meth:`feed` gives the events of each chunk (``message_start`` with the first, its usage
    the input counts that chunk carries), :meth:`end` the closing ones (the open block's
    stop, ``message_delta``, ``message_stop``), :meth:`fail` the ``error`` event of a stream
    that broke off.
    """

    __slots__ = (
        "_blocks",
        "_calls",
        "_finish",
        "_id",
        "_matched",
        "_model",
        "_open",
        "_ping",
        "_started",
        "_usage",
    )

    def __init__(self, model: str, *, ping: bool = False) -> None:
        """Stream a message for a request of ``model``; the first chunk's model, when it
        names one, is the one reported (the model that answered, as a whole reply says).
        ``ping``: a ``ping`` event follows ``message_start``, as Anthropic's API sends."""
        self._model = model
        self._ping = ping
        self._matched: str | None = None
        self._id = ""
        self._started = False
        self._blocks = 0  # content blocks started so far
        self._open: tuple[str, int] | None = None  # (kind, index) of the open block
        self._calls: dict[int, int] = {}  # tool-call index -> block index
        self._finish: str | None = None
        self._usage: Usage | None = None

    def _start(
        self, chunk_id: str, usage: Usage | None, model: str = ""
    ) -> list[tuple[str, dict[str, Any]]]:
        self._model = model or self._model
        self._started = True
        self._id = message_id(chunk_id)
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
        events = [("message_start", {"type": "message_start", "message": message})]
        if self._ping:
            events.append(("ping", {"type": "ping"}))
        return events

    def _close(self) -> list[tuple[str, dict[str, Any]]]:
        if self._open is None:
            return []
        _, index = self._open
        self._open = None
        return [("content_block_stop", {"type": "content_block_stop", "index": index})]

    def _begin(self, kind: str, block: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        events = self._close()
        index = self._blocks
        self._blocks += 1
        self._open = (kind, index)
        start = {"type": "content_block_start", "index": index, "content_block": block}
        events.append(("content_block_start", start))
        return events

    def _delta(self, index: int, delta: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        data = {"type": "content_block_delta", "index": index, "delta": delta}
        return ("content_block_delta", data)

    def feed(self, chunk: ChatCompletionChunk) -> list[tuple[str, dict[str, Any]]]:
        """The events a chat chunk brings."""
        events = [] if self._started else self._start(chunk.id, chunk.usage, chunk.model)
        for choice in chunk.choices[:1]:
            delta = choice.delta
            extra = delta.__pydantic_extra__ or {}
            reasoning = delta.reasoning_content or delta.reasoning
            if reasoning:
                events.extend(self._thinking(reasoning))
            signed = extra.get("thinking_blocks")
            if isinstance(signed, list) and signed:
                events.extend(self._signed_block(signed[-1]))
            said = delta.content or delta.refusal  # a refusal is text here, as when whole
            if said:
                if self._open is None or self._open[0] != "text":
                    events.extend(self._begin("text", {"type": "text", "text": ""}))
                assert self._open is not None
                text = {"type": "text_delta", "text": said}
                events.append(self._delta(self._open[1], text))
            for call in delta.tool_calls or ():
                events.extend(self._call(call))
            if choice.finish_reason is not None:
                self._finish = choice.finish_reason
                self._matched = matched_stop(choice)
        if chunk.usage is not None:
            self._usage = chunk.usage
        return events

    def _signed(self) -> bool:
        """Whether a thinking block is open."""
        return self._open is not None and self._open[0] == "thinking"

    def _thinking(self, text: str) -> list[tuple[str, dict[str, Any]]]:
        events: list[tuple[str, dict[str, Any]]] = []
        if not self._signed():
            block = {"type": "thinking", "thinking": "", "signature": ""}
            events.extend(self._begin("thinking", block))
        assert self._open is not None
        events.append(self._delta(self._open[1], {"type": "thinking_delta", "thinking": text}))
        return events

    def _signed_block(self, block: Any) -> list[tuple[str, dict[str, Any]]]:
        """A finished thinking block (as an Anthropic backend hands it on): its signature
        closes the open thinking block; a redacted block is sent whole."""
        if not isinstance(block, Mapping):
            return []
        if block.get("type") == "thinking" and self._signed():
            assert self._open is not None
            signature = {"type": "signature_delta", "signature": str(block.get("signature", ""))}
            return [self._delta(self._open[1], signature), *self._close()]
        if block.get("type") == "redacted_thinking":
            return [*self._begin("redacted_thinking", dict(block)), *self._close()]
        return []

    def _call(self, call: ToolCallDelta) -> list[tuple[str, dict[str, Any]]]:
        events: list[tuple[str, dict[str, Any]]] = []
        index = self._calls.get(call.index)
        function = call.function
        if index is None:
            block = {
                "type": "tool_use",
                "id": call.id or f"toolu_{secrets.token_hex(12)}",
                "name": (function.name or "") if function is not None else "",
                "input": {},
            }
            events.extend(self._begin("tool_use", block))
            index = self._blocks - 1
            self._calls[call.index] = index
        if function is not None and function.arguments:
            piece = {"type": "input_json_delta", "partial_json": function.arguments}
            events.append(self._delta(index, piece))
        return events

    def end(self) -> list[tuple[str, dict[str, Any]]]:
        """The events that end the message (``message_start`` too, for an empty stream)."""
        events = [] if self._started else self._start("", None)
        events.extend(self._close())
        delta = _stop_fields(self._finish, bool(self._calls), self._matched)
        events.append(
            (
                "message_delta",
                {"type": "message_delta", "delta": delta, "usage": _usage(self._usage)},
            )
        )
        events.append(("message_stop", {"type": "message_stop"}))
        return events

    def fail(self, status: int, message: str) -> tuple[str, dict[str, Any]]:
        """The ``error`` event for a stream that broke off (the SDK raises on it)."""
        return ("error", messages_error(status, message))
