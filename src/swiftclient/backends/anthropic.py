"""AnthropicBackend: Anthropic's native Messages API (``POST /v1/messages``).

It is an :class:`~swiftclient.HTTPBackend` on another wire: the same transport, connection
pool, deadline, retries, telemetry and bounds, with three things of its own — how a
:class:`~swiftclient.ChatRequest` is encoded (:func:`encode_messages_request`), which headers
carry the key (``x-api-key``, ``anthropic-version``), and how a message or its event stream
decodes into the project's :class:`~swiftclient.ChatCompletion` /
:class:`~swiftclient.ChatCompletionChunk` contract (:class:`MessageDecoder`).

What is translated and what is lost is written in docs/providers.md.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import pydantic
import pydantic_core

from .. import errors
from .._canonical import CallEncoding, canonical_schema
from .._deadline import Deadline
from ..breakpoints import (
    DEFAULT_LIMIT,
    DEFAULT_MIN_TOKENS,
    TTL,
    CacheBreakpointWarning,
    Segment,
    plan_breakpoints,
)
from ..types import (
    AssistantMessage,
    ChatCompletion,
    ChatCompletionChunk,
    ChatRequest,
    Choice,
    ChoiceDelta,
    ChunkChoice,
    FunctionCall,
    FunctionCallDelta,
    ImageContentPart,
    Message,
    TextContentPart,
    ToolCall,
    ToolCallDelta,
    ToolChoice,
    Usage,
    unreported_usage,
)
from ..wire import mark_matched_stop
from ..wire.messages import PREFILL_FIELDS
from .base import RequestOptions, header_mapping
from .http import (
    NO_IDS,
    HTTPBackend,
    TextChunks,
    _ChunkStream,
    _Response,
)

__all__ = [
    "ANTHROPIC_VERSION",
    "DEFAULT_MAX_TOKENS",
    "OUTPUT_TOOL",
    "AnthropicBackend",
    "CachePlanning",
    "MessageDecoder",
    "decode_message",
    "encode_messages_request",
    "output_names",
]

ANTHROPIC_VERSION = "2023-06-01"
"""The ``anthropic-version`` header sent unless the backend is given another."""
DEFAULT_MAX_TOKENS = 4096
"""``max_tokens`` when a request sets neither ``max_tokens`` nor ``max_completion_tokens``
(the Messages API requires one); with extended thinking the thinking budget is added."""
OUTPUT_TOOL = "json_output"
"""The forced tool that carries a ``json_object`` response format's answer (a
``json_schema`` format's tool is named after the schema)."""

_FINISH = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
    "model_context_window_exceeded": "length",
}
_THINKING = frozenset({"thinking", "redacted_thinking"})
_PREFILL_KEYS = frozenset(PREFILL_FIELDS)
"""The chat fields that ask for a final assistant turn to be continued: this API does so
with every such turn, and would refuse them."""
# A text block's delta as the API writes it, up to the text's JSON string (after the index).
_TEXT_DELTA = b'{"type":"content_block_delta","index":%d,"delta":{"type":"text_delta","text":'
_TEXT_DELTA_END = b"}}"


# --------------------------------------------------------------------------- requests


def _text_blocks(content: str | list[Any] | None) -> list[dict[str, Any]]:
    """A message's content as Anthropic content blocks (text and images)."""
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    blocks: list[dict[str, Any]] = []
    for part in content:
        if isinstance(part, TextContentPart):
            blocks.append({"type": "text", "text": part.text})
        elif isinstance(part, ImageContentPart):
            blocks.append({"type": "image", "source": _image_source(part.image_url.url)})
    return blocks


def _image_source(url: str) -> dict[str, Any]:
    if url.startswith("data:"):
        head, _, data = url.partition(",")
        media_type = head[5:].split(";", 1)[0]
        if ";base64" not in head or not media_type:
            raise errors.ConfigurationError(
                "an image data: URL must be base64-encoded with a media type "
                "(data:image/png;base64,...)"
            )
        return {"type": "base64", "media_type": media_type, "data": data}
    return {"type": "url", "url": url}


def _tool_input(arguments: str, name: str) -> Any:
    if not arguments.strip():
        return {}
    try:
        return json.loads(arguments)
    except ValueError as exc:
        raise errors.ConfigurationError(
            f"tool call {name!r} has arguments that are not JSON; the Messages API needs a "
            "JSON object as a tool_use block's input"
        ) from exc


def _assistant_blocks(message: Message, as_blocks: bool = False) -> list[dict[str, Any]] | str:
    extra = message.__pydantic_extra__ or {}
    thinking = extra.get("thinking_blocks")
    blocks: list[dict[str, Any]] = []
    if isinstance(thinking, list):
        blocks.extend(block for block in thinking if isinstance(block, dict))
    text = _text_blocks(message.content)
    content = message.content
    if not blocks and not message.tool_calls and isinstance(content, str):
        if not (as_blocks and content):
            return content
    blocks.extend(text)
    for call in message.tool_calls or ():
        blocks.append(
            {
                "type": "tool_use",
                "id": call.id,
                "name": call.function.name,
                "input": _tool_input(call.function.arguments, call.function.name),
            }
        )
    return blocks


def _tool_result(message: Message) -> dict[str, Any]:
    content = message.content
    result: dict[str, Any] = {"type": "tool_result", "tool_use_id": message.tool_call_id}
    result["content"] = content if isinstance(content, str) else _text_blocks(content)
    return result


# Where one request message landed: in ``system`` or ``messages``, and the block that a
# cache breakpoint on it would mark (None: it has no block that may carry one).
_Anchor = tuple[bool, dict[str, Any] | None]


def _last_markable(blocks: list[dict[str, Any]]) -> dict[str, Any] | None:
    if blocks and blocks[-1].get("type") not in _THINKING:
        return blocks[-1]
    return None


def _messages(
    request: ChatRequest, as_blocks: bool = False
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[_Anchor]]:
    """``(system blocks, messages, anchors)``: system and developer messages lifted to
    ``system``; tool results (and a user message right after them) kept together in one
    user turn; ``anchors`` has one entry per request message (see ``_Anchor``).
    ``as_blocks``: every content as a list of blocks (breakpoints need blocks)."""
    system: list[dict[str, Any]] = []
    out: list[dict[str, Any]] = []
    anchors: list[_Anchor] = []
    merge_user = False  # the last user turn holds tool results: later ones join it
    for message in request.messages:
        role = message.role
        if role in ("system", "developer"):
            added = _text_blocks(message.content)
            system.extend(added)
            anchors.append((True, _last_markable(added)))
            continue
        if role == "tool":
            block = _tool_result(message)
            if merge_user:
                out[-1]["content"].append(block)
            else:
                out.append({"role": "user", "content": [block]})
                merge_user = True
            anchors.append((False, block))
            continue
        if role == "user":
            content = message.content
            if merge_user or as_blocks or not isinstance(content, str):
                added = _text_blocks(content)
                if merge_user:
                    out[-1]["content"].extend(added)
                else:
                    out.append({"role": "user", "content": added})
                anchors.append((False, _last_markable(added)))
            else:
                out.append({"role": "user", "content": content})
                anchors.append((False, None))
            continue
        merge_user = False
        blocks = _assistant_blocks(message, as_blocks)
        out.append({"role": "assistant", "content": blocks})
        anchors.append((False, _last_markable(blocks) if isinstance(blocks, list) else None))
    return system, out, anchors


def _native_schema(request: ChatRequest, structured: str) -> dict[str, Any] | None:
    """The schema sent as ``output_config.format`` (the API's own structured outputs), when
    the backend uses them and the request has a ``json_schema`` response format."""
    fmt = request.response_format
    if structured != "native" or fmt is None or fmt.type != "json_schema":
        return None
    if fmt.json_schema is None or fmt.json_schema.schema_ is None:
        return None
    return fmt.json_schema.schema_


def _output_tool(request: ChatRequest, structured: str = "tool") -> dict[str, Any] | None:
    """The forced tool that stands for a JSON response format, if the request has one."""
    fmt = request.response_format
    if fmt is None or fmt.type == "text" or _native_schema(request, structured) is not None:
        return None
    if fmt.type == "json_schema" and fmt.json_schema is not None:
        spec = fmt.json_schema
        tool: dict[str, Any] = {
            "name": spec.name,
            "input_schema": spec.schema_ or {"type": "object"},
        }
        tool["description"] = spec.description or "Answer with the structured output."
        return tool
    return {
        "name": OUTPUT_TOOL,
        "description": "Answer with a JSON object.",
        "input_schema": {"type": "object"},
    }


@dataclass(frozen=True, slots=True)
class CachePlanning:
    """How :func:`encode_messages_request` places ``cache_control`` breakpoints.

    ``static``: how many leading messages the layout marks made static (None: the leading
    system / developer messages); ``static_ttl``: the TTL of the tools' and the static
    prefix's breakpoints (``"1h"`` writes cost 2x the input price, ``"5m"`` 1.25x);
    ``min_tokens``: the model's minimum cacheable prefix; ``limit``: the API's maximum.
    The conversation's last message and the one before the final user turn get ``5m``
    breakpoints, so an agent loop's next call reads the whole history from the cache.
    A breakpoint the caller set (a message's ``cache_control``) is always kept.
    """

    static: int | None = None
    static_ttl: TTL = "5m"
    min_tokens: int = DEFAULT_MIN_TOKENS
    limit: int = DEFAULT_LIMIT
    auto: bool = True
    """False: only the caller's own breakpoints are placed (kept within the limit)."""


def _tokens(block: Any) -> int:
    """A rough token count of a block: its JSON size over four."""
    return len(pydantic_core.to_json(block)) // 4


def _user_ttl(message: Message) -> TTL | None:
    extra = message.__pydantic_extra__ or {}
    marker = extra.get("cache_control")
    if not isinstance(marker, dict):
        return None
    return "1h" if marker.get("ttl") == "1h" else "5m"


def _place_breakpoints(
    request: ChatRequest,
    cache: CachePlanning,
    *,
    user_tools: int,
    tools: list[dict[str, Any]],
    anchors: list[_Anchor],
) -> None:
    """Mark the blocks the planner chooses with ``cache_control`` (in place)."""
    messages = request.messages
    static = cache.static
    if static is None:
        static = 0
        for message in messages:
            if message.role not in ("system", "developer"):
                break
            static += 1
    static = min(static, len(messages))
    last_user = max((i for i, m in enumerate(messages) if m.role == "user"), default=-1)
    ends: dict[int, TTL] = {}
    if cache.auto:
        if static:
            ends[static - 1] = cache.static_ttl
        if last_user > 0:
            ends.setdefault(last_user - 1, "5m")
        ends.setdefault(len(messages) - 1, "5m")
    # The cache order: tools, then the system blocks, then the messages.
    order = [i for i, (in_system, _) in enumerate(anchors) if in_system]
    order += [i for i, (in_system, _) in enumerate(anchors) if not in_system]
    targets: list[dict[str, Any] | None] = []
    segments: list[Segment] = []
    if user_tools:
        targets.append(tools[user_tools - 1])
        size = sum(_tokens(tool) for tool in tools[:user_tools])
        segments.append(Segment(size, end=cache.static_ttl if cache.auto else None))
    for i in order:
        block = anchors[i][1]
        targets.append(block)
        size = _tokens(messages[i].model_dump(mode="json", exclude_none=True))
        markable = block is not None
        segments.append(
            Segment(
                size,
                end=ends.get(i) if markable else None,
                user=_user_ttl(messages[i]) if markable else None,
            )
        )
    plan = plan_breakpoints(segments, limit=cache.limit, min_tokens=cache.min_tokens)
    for note in plan.warnings:
        warnings.warn(note, CacheBreakpointWarning, stacklevel=4)
    for point in plan.breakpoints:
        target = targets[point.position]
        if target is not None:
            marker: dict[str, Any] = {"type": "ephemeral"}
            if point.ttl == "1h":
                marker["ttl"] = "1h"
            target["cache_control"] = marker


def output_names(request: ChatRequest, structured: str = "tool") -> frozenset[str]:
    """The name of the tool that stands for ``request``'s JSON response format (its input
    is the answer's content), or an empty set."""
    output = _output_tool(request, structured)
    return frozenset() if output is None else frozenset((str(output["name"]),))


def _unsupported(request: ChatRequest) -> None:
    if request.n is not None and request.n > 1:
        raise errors.ConfigurationError("the Messages API returns one choice: n must be 1")
    if request.logprobs:
        raise errors.ConfigurationError("the Messages API does not return logprobs")


def encode_messages_request(
    request: ChatRequest,
    *,
    stream: bool,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    exact: bool = False,
    structured: str = "tool",
    cache: CachePlanning | None = None,
) -> bytes:
    """The ``/v1/messages`` body for ``request`` (see docs/providers.md for the mapping).

    ``max_tokens`` is used when the request sets no limit. With ``exact`` False, tools are
    sorted by name and their schemas put in canonical order, as on the OpenAI wire, so
    equal requests give equal bytes (the prompt cache keys on them). A ``json_schema``
    response format goes as a forced tool (``structured="tool"``) or as the API's own
    ``output_config.format`` (``structured="native"``). With ``cache``, ``cache_control``
    breakpoints are placed by :func:`~swiftclient.breakpoints.plan_breakpoints` (see
    :class:`CachePlanning`). ``extra_body`` (for
    ``thinking``, ``top_k``, ``cache_control`` and other Anthropic fields) is merged last.
    """
    _unsupported(request)
    if cache is None and any(_user_ttl(message) for message in request.messages):
        cache = CachePlanning(auto=False)  # the caller's own breakpoints still go out
    system, messages, anchors = _messages(request, as_blocks=cache is not None)
    body: dict[str, Any] = {"model": request.model}
    extra_body = request.extra_body or {}
    if _PREFILL_KEYS & extra_body.keys():  # the API continues a final assistant turn itself
        extra_body = {k: v for k, v in extra_body.items() if k not in _PREFILL_KEYS}
    limit = request.max_new_tokens()
    if limit is None:
        limit = max_tokens
        thinking = extra_body.get("thinking")
        if isinstance(thinking, dict) and isinstance(thinking.get("budget_tokens"), int):
            limit += thinking["budget_tokens"]
    body["max_tokens"] = limit
    body["messages"] = messages
    tools: list[dict[str, Any]] = []
    for tool in request.tools or ():
        fn = tool.function
        entry: dict[str, Any] = {"name": fn.name}
        if fn.description is not None:
            entry["description"] = fn.description
        schema = fn.parameters or {"type": "object", "properties": {}}
        entry["input_schema"] = schema if exact else canonical_schema(schema)
        tools.append(entry)
    if not exact:
        tools.sort(key=lambda entry: str(entry["name"]))
    output = _output_tool(request, structured)
    native = _native_schema(request, structured)
    if native is not None:
        body["output_config"] = {
            "format": {
                "type": "json_schema",
                "schema": native if exact else canonical_schema(native),
            }
        }
    choice = request.tool_choice
    tool_choice: dict[str, Any] | None = None
    if output is not None:
        if not exact:
            output["input_schema"] = canonical_schema(output["input_schema"])
        tools.append(output)
        thinking_on = isinstance(extra_body.get("thinking"), dict) and (
            extra_body["thinking"].get("type") == "enabled"
        )
        # A forced tool is the structured answer; with the caller's own tools offered (or
        # thinking on, which forbids forcing), the model is left to choose.
        if not request.tools and not thinking_on:
            tool_choice = {"type": "tool", "name": output["name"]}
    if cache is not None:
        _place_breakpoints(
            request, cache, user_tools=len(request.tools or ()), tools=tools, anchors=anchors
        )
    if system:
        only = len(system) == 1 and set(system[0]) == {"type", "text"}
        body["system"] = system[0]["text"] if only else system
    if tools:
        body["tools"] = tools
    if tool_choice is None and choice is not None:
        if isinstance(choice, ToolChoice):
            tool_choice = {"type": "tool", "name": choice.function.name}
        else:
            tool_choice = {"type": {"required": "any"}.get(choice, choice)}
    if request.parallel_tool_calls is False and (tools or tool_choice is not None):
        tool_choice = tool_choice or {"type": "auto"}
        if tool_choice["type"] != "none":
            tool_choice["disable_parallel_tool_use"] = True
    if tool_choice is not None:
        body["tool_choice"] = tool_choice
    stops = request.stop_list()
    if stops:
        body["stop_sequences"] = stops
    if request.temperature is not None:
        body["temperature"] = request.temperature
    if request.top_p is not None:
        body["top_p"] = request.top_p
    if request.user is not None:
        body["metadata"] = {"user_id": request.user}
    if stream:
        body["stream"] = True
    if extra_body:
        own = body.get("output_config")
        body.update(extra_body if exact else {k: extra_body[k] for k in sorted(extra_body)})
        config = extra_body.get("output_config")
        if isinstance(own, dict) and isinstance(config, dict):  # the format and (say) effort
            body["output_config"] = {**own, **config}
    return pydantic_core.to_json(body)


# --------------------------------------------------------------------------- responses


def _usage(raw: Mapping[str, Any]) -> Usage | None:
    """Anthropic usage as the project's :class:`Usage`: ``prompt_tokens`` counts every
    input token (uncached, cache reads and cache writes, which Anthropic reports apart);
    ``cached_tokens`` the reads; ``cache_write_tokens`` the writes; ``cache_creation`` (the
    writes per TTL, ``cache_write_1h_tokens``) is kept as the API sent it. None when a
    count is out of range (:func:`~swiftclient.types.unreported_usage`)."""

    def count(key: str) -> int:
        value = raw.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    read = count("cache_read_input_tokens")
    written = count("cache_creation_input_tokens")
    split = raw.get("cache_creation")
    prompt = count("input_tokens") + read + written
    completion = count("output_tokens")
    details = raw.get("output_tokens_details")  # the thinking share of the output
    thinking = details.get("thinking_tokens") if isinstance(details, dict) else None
    reasoning = {}
    if isinstance(thinking, int) and not isinstance(thinking, bool) and thinking:
        reasoning = {"completion_tokens_details": {"reasoning_tokens": thinking}}
    try:
        return Usage.model_validate(
            {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
                **reasoning,
                "prompt_tokens_details": {"cached_tokens": read},
                "cache_read_input_tokens": read,
                "cache_creation_input_tokens": written,
                **({"cache_creation": dict(split)} if isinstance(split, dict) else {}),
            }
        )
    except pydantic.ValidationError as exc:
        unreported_usage(exc)
        return None


def _finish(stop_reason: Any, output_only: bool) -> str | None:
    if not isinstance(stop_reason, str):
        return None
    if stop_reason == "tool_use" and output_only:
        return "stop"  # the forced output tool's input is the answer
    return _FINISH.get(stop_reason, stop_reason)


def _not_a_message(name: str, why: str) -> errors.APIResponseValidationError:
    return errors.APIResponseValidationError(
        f"{name}: response body is not a Messages API message: {why}", backend=name
    )


def decode_message(
    data: bytes, backend: HTTPBackend, output: frozenset[str] = frozenset()
) -> ChatCompletion:
    """A whole ``message`` body as a :class:`ChatCompletion` (one choice); ``output`` names
    the forced tool whose input is the structured answer (see :func:`output_names`)."""
    name = backend.name
    try:
        raw = pydantic_core.from_json(data)
    except ValueError:
        raise _not_a_message(name, "not JSON") from None
    if not isinstance(raw, dict):
        raise _not_a_message(name, "not a JSON object")
    if raw.get("type") == "error" or "error" in raw:
        raise _event_error(backend, data)
    content = raw.get("content")
    if raw.get("type") != "message" or not isinstance(content, list):
        raise _not_a_message(name, "no content list")
    texts: list[str] = []
    thinking_text: list[str] = []
    thinking: list[dict[str, Any]] = []
    calls: list[ToolCall] = []
    answered = False
    for block in content:
        if not isinstance(block, dict):
            raise _not_a_message(name, "a content block is not an object")
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_use":
            tool_name = str(block.get("name", ""))
            arguments = pydantic_core.to_json(block.get("input", {})).decode()
            if tool_name in output:
                texts.append(arguments)
                answered = True
            else:
                calls.append(
                    ToolCall(
                        id=str(block.get("id", "")),
                        function=FunctionCall(name=tool_name, arguments=arguments),
                    )
                )
        elif kind in _THINKING:
            thinking.append(block)
            if kind == "thinking" and isinstance(block.get("thinking"), str):
                thinking_text.append(block["thinking"])
    message = AssistantMessage(
        content="".join(texts) if texts or not calls else None,
        tool_calls=calls or None,
        reasoning_content="".join(thinking_text) or None,
        thinking_blocks=thinking or None,
    )
    usage = raw.get("usage")
    choice = Choice(
        index=0,
        message=message,
        finish_reason=_finish(raw.get("stop_reason"), answered and not calls),
    )
    matched = _matched(raw.get("stop_reason"), raw.get("stop_sequence"))
    if matched is not None:
        mark_matched_stop(choice, matched)
    return ChatCompletion(
        id=str(raw.get("id", "")),
        model=str(raw.get("model", "")),
        choices=[choice],
        usage=_usage(usage) if isinstance(usage, dict) else None,
    )


def _event_error(backend: HTTPBackend, data: bytes) -> errors.APIError:
    """The error an ``error`` event (or an error body with status 200) stands for:
    ``overloaded_error`` is a retryable :class:`~swiftclient.ProviderOverloadedError`,
    anything else a :class:`~swiftclient.StreamError`."""
    try:
        parsed = pydantic_core.from_json(data)
    except ValueError:
        parsed = None
    error = parsed.get("error") if isinstance(parsed, dict) else None
    kind = error.get("type") if isinstance(error, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    detail = errors.redact(
        message if isinstance(message, str) else "error event in stream", *backend._secrets
    )
    body = errors.redact_json(parsed, *backend._secrets) if parsed is not None else None
    if kind == "overloaded_error":
        return errors.ProviderOverloadedError(
            f"{backend.name}: {detail}", status_code=529, body=body, backend=backend.name
        )
    return errors.StreamError(f"{backend.name}: {detail}", body=body, backend=backend.name)


def _chunk(
    message_id: str,
    model: str,
    delta: ChoiceDelta | None = None,
    finish_reason: str | None = None,
    usage: Usage | None = None,
    matched: str | None = None,
) -> ChatCompletionChunk:
    choices = []
    if delta is not None:
        choice = ChunkChoice(delta=delta, finish_reason=finish_reason)
        if matched is not None:
            mark_matched_stop(choice, matched)
        choices.append(choice)
    return ChatCompletionChunk(id=message_id, model=model, choices=choices, usage=usage)


def _matched(stop_reason: Any, stop_sequence: Any) -> str | None:
    """The stop sequence that ended the message (kept as the choice's ``stop_reason``, the
    field vLLM names the matched stop string in), else None."""
    if stop_reason == "stop_sequence" and isinstance(stop_sequence, str):
        return stop_sequence
    return None


class MessageDecoder:
    """Turns Messages API stream events, one at a time, into chat-completion chunks.

    Sans-IO: :meth:`event` takes one event's type and parsed data and returns the chunk it
    stands for, or None (``ping``, block boundaries of text, unknown event types). Text
    and ``input_json_delta`` pieces become content and tool-call argument deltas,
    ``thinking_delta`` pieces ``reasoning_content``; each finished ``thinking`` /
    ``redacted_thinking`` block is handed out whole (signature included) as the delta field
    ``thinking_blocks`` (every block so far, so the latest value is the full list).
    ``message_delta`` gives the finish chunk; ``message_stop`` ends the message with a
    usage chunk (no choices), as an OpenAI stream with ``include_usage`` ends.

    :meth:`text_delta` is the per-token fast path: a text block's delta, recognised from
    its bytes, becomes its chunk without the event being parsed.
    """

    __slots__ = (
        "_answered",
        "_bare",
        "_blocks",
        "_calls",
        "_id",
        "_input",
        "_model",
        "_output",
        "_text",
        "_text_head",
        "_thinking",
        "_usage",
        "done",
    )

    def __init__(self, output_names: frozenset[str] = frozenset()) -> None:
        self._output = output_names
        self._id = ""
        self._model = ""
        self._input: dict[str, Any] = {}
        # block index -> ("text" | "tool" | "output" | "thinking" | "other", tool index, block)
        self._blocks: dict[int, tuple[str, int, dict[str, Any] | None]] = {}
        # tool and output blocks no argument piece reached yet: "{}" when they stop
        self._bare: set[int] = set()
        self._calls = 0
        self._answered = False
        self._thinking: list[dict[str, Any]] = []
        self._usage: Usage | None = None
        self._text = NO_IDS
        # the bytes that open a delta of the latest started block, when that is a text block
        self._text_head: bytes | None = None
        self.done = False
        """``message_stop`` was seen: the message is whole."""

    def text_delta(self, data: bytes) -> ChatCompletionChunk | None:
        """The chunk of a ``content_block_delta`` event's ``data`` when it is a text delta
        of the latest started block, written exactly as the API writes one (those keys, in
        that order, no spaces): only the text's JSON string is decoded. None for anything
        else (other events, key orders, extra keys, a string that is not one valid JSON
        string): the caller decodes the event with :meth:`event`, which gives the same
        chunk for every event this method takes."""
        head = self._text_head
        if head is None or not data.startswith(head) or not data.endswith(_TEXT_DELTA_END):
            return None
        return self._text.chunk(data[len(head) : -2])

    def event(self, kind: str, data: Any) -> ChatCompletionChunk | None:
        """The chunk for one event (``data`` parsed from JSON); ValueError when an event
        the decoder relies on is malformed."""
        if not isinstance(data, dict):
            raise ValueError(f"a {kind} event's data is not an object")
        if kind == "content_block_delta":
            return self._delta(data)
        if kind == "content_block_start":
            return self._start(data)
        if kind == "content_block_stop":
            return self._stop(data)
        if kind == "message_start":
            message = data.get("message")
            if not isinstance(message, dict):
                raise ValueError("message_start carries no message")
            self._id = str(message.get("id", ""))
            self._model = str(message.get("model", ""))
            usage = message.get("usage")
            self._input = dict(usage) if isinstance(usage, dict) else {}
            self._text = TextChunks(self._id, self._model)
            return _chunk(self._id, self._model, ChoiceDelta(role="assistant"))
        if kind == "message_delta":
            delta = data.get("delta")
            delta = delta if isinstance(delta, dict) else {}
            counts: dict[str, Any] = dict(self._input)
            late = data.get("usage")
            if isinstance(late, dict):  # cumulative counts: the latest win
                counts.update({k: v for k, v in late.items() if v is not None})
            self._usage = _usage(counts)
            finish = _finish(delta.get("stop_reason"), self._answered and not self._calls)
            matched = _matched(delta.get("stop_reason"), delta.get("stop_sequence"))
            return _chunk(self._id, self._model, ChoiceDelta(), finish, matched=matched)
        if kind == "message_stop":
            self.done = True
            if self._usage is not None:  # the usage chunk, last and choice-less as on OpenAI
                return _chunk(self._id, self._model, usage=self._usage)
        return None

    def _start(self, data: dict[str, Any]) -> ChatCompletionChunk | None:
        index = data.get("index")
        block = data.get("content_block")
        if not isinstance(index, int) or not isinstance(block, dict):
            raise ValueError("content_block_start needs an index and a content_block")
        kind = block.get("type")
        self._text_head = None  # a started block ends the fast path of the one before
        if kind == "text":
            self._blocks[index] = ("text", 0, None)
            self._text_head = _TEXT_DELTA % index
            text = block.get("text")
            if isinstance(text, str) and text:
                return self._text.text(text)
            return None
        if kind == "tool_use":
            name = str(block.get("name", ""))
            self._bare.add(index)
            if name in self._output:
                self._blocks[index] = ("output", 0, None)
                self._answered = True
                return None
            call = self._calls
            self._calls += 1
            self._blocks[index] = ("tool", call, None)
            tool_delta = ToolCallDelta(
                index=call,
                id=str(block.get("id", "")),
                type="function",
                function=FunctionCallDelta(name=name, arguments=""),
            )
            return _chunk(self._id, self._model, ChoiceDelta(tool_calls=[tool_delta]))
        if kind in _THINKING:
            self._blocks[index] = ("thinking", 0, dict(block))
            text = block.get("thinking")
            if isinstance(text, str) and text:
                return _chunk(self._id, self._model, ChoiceDelta(reasoning_content=text))
            return None
        self._blocks[index] = ("other", 0, None)
        return None

    def _delta(self, data: dict[str, Any]) -> ChatCompletionChunk | None:
        index = data.get("index")
        delta = data.get("delta")
        if not isinstance(delta, dict):
            raise ValueError("content_block_delta carries no delta")
        entry = self._blocks.get(index) if isinstance(index, int) else None
        if entry is None:
            raise ValueError("content_block_delta for a block that was not started")
        where, call, block = entry
        kind = delta.get("type")
        if kind == "text_delta" and where == "text":
            text = delta.get("text")
            return self._text.text(text) if isinstance(text, str) else None
        if kind == "input_json_delta":
            piece = delta.get("partial_json")
            if not isinstance(piece, str) or not piece:
                return None
            self._bare.discard(index)
            if where == "output":
                return self._text.text(piece)
            if where == "tool":
                tool_delta = ToolCallDelta(index=call, function=FunctionCallDelta(arguments=piece))
                return _chunk(self._id, self._model, ChoiceDelta(tool_calls=[tool_delta]))
            return None
        if block is not None:
            if kind == "thinking_delta":
                text = delta.get("thinking")
                if isinstance(text, str):
                    block["thinking"] = str(block.get("thinking", "")) + text
                    if text:
                        return _chunk(self._id, self._model, ChoiceDelta(reasoning_content=text))
            elif kind == "signature_delta":
                signature = delta.get("signature")
                if isinstance(signature, str):
                    block["signature"] = str(block.get("signature", "")) + signature
        return None

    def _stop(self, data: dict[str, Any]) -> ChatCompletionChunk | None:
        index = data.get("index")
        entry = self._blocks.get(index) if isinstance(index, int) else None
        if entry is not None and index in self._bare:
            # A call without arguments streams one empty piece: its arguments are the empty
            # object, as a whole reply's are, not "" (which no JSON parser takes).
            self._bare.discard(index)
            if entry[0] == "output":
                return self._text.text("{}")
            tool_delta = ToolCallDelta(index=entry[1], function=FunctionCallDelta(arguments="{}"))
            return _chunk(self._id, self._model, ChoiceDelta(tool_calls=[tool_delta]))
        if entry is None or entry[0] != "thinking" or entry[2] is None:
            return None
        self._thinking.append(entry[2])
        delta = ChoiceDelta.model_validate({"thinking_blocks": list(self._thinking)})
        return _chunk(self._id, self._model, delta)


class _MessageStream(_ChunkStream):
    """The HTTP backend's chunk stream, decoding Messages API events instead of OpenAI
    chunks: bytes, SSE framing, bounds, deadline checks and closing are the parent's."""

    __slots__ = ("_messages",)

    def __init__(
        self,
        response: _Response,
        backend: AnthropicBackend,
        deadline: Deadline,
        output: frozenset[str],
    ) -> None:
        super().__init__(response, backend, deadline, 1)
        self._messages = MessageDecoder(output)

    def next_nowait(self) -> ChatCompletionChunk | None:
        """The next chunk already received, or None when the next one needs I/O (or the end)."""
        events = self._events
        backend = self._backend
        decoder = self._messages
        while events:
            event = events.popleft()
            kind = event.event or ""
            if kind == "content_block_delta":  # the per-token path: the text, not the event
                chunk = decoder.text_delta(event.data)
                if chunk is not None:
                    return chunk
            elif kind == "ping":
                continue
            if kind == "error":
                self._done = True
                raise _event_error(backend, event.data)
            summary: str | None = None
            try:
                data = pydantic_core.from_json(event.data)
                if not kind and isinstance(data, dict):
                    kind = str(data.get("type", ""))
                chunk = decoder.event(kind, data)
            except ValueError as exc:
                summary = errors.redact(str(exc).splitlines()[0], *backend._secrets)
            if summary is not None:
                self._done = True
                raise errors.APIResponseValidationError(
                    f"{backend.name}: stream event {kind or '?'} is not valid: {summary}",
                    backend=backend.name,
                )
            if decoder.done:  # the message is whole only at message_stop
                self._finished = True
                self._done = True
                self.complete = True
                events.clear()
                return chunk
            if chunk is None:
                continue
            if chunk.choices and chunk.choices[0].finish_reason is not None:
                self.finished.add(0)
            return chunk
        return None


class AnthropicBackend(HTTPBackend):
    """A backend for Anthropic's native Messages API (``/v1/messages``).

    Everything :class:`~swiftclient.HTTPBackend` takes applies (pool, timeouts, TLS,
    proxies, bounds); the differences:

    Args:
        base_url: the API root; ``/v1`` is appended unless it already ends so
            (``https://api.anthropic.com`` and ``https://api.anthropic.com/v1`` both work).
        api_key: sent as ``x-api-key``; never logged or shown in reprs and errors.
        name: the backend's name in model strings, spans and errors.
        version: the ``anthropic-version`` header.
        max_tokens: the ``max_tokens`` sent when a request sets none (the API requires it).
        structured_output: how a ``json_schema`` response format (``response_model=``) is
            asked for: ``"tool"`` (default; every model) forces a tool whose input is the
            answer; ``"native"`` sends the API's ``output_config.format`` (models with
            structured outputs).
        cache_breakpoints: place ``cache_control`` breakpoints on every request (at most
            four: the tools, the static prefix that layout marks or leading system messages
            make, the history before the last user turn, the last message), skipping
            prefixes under ``min_cache_tokens``; see :class:`CachePlanning`. Breakpoints
            set by the caller (a message's ``cache_control``) are always sent.
        static_ttl: the TTL of the tools' and static prefix's breakpoints, ``"5m"`` or
            ``"1h"``.
        min_cache_tokens: the model's minimum cacheable prefix (1024 for most models).
        **kwargs: :class:`~swiftclient.HTTPBackend` options.

    Extended thinking: pass ``extra_body={"thinking": {"type": "enabled", "budget_tokens":
    N}}``; the reply's ``reasoning_content`` is the thinking text and ``thinking_blocks``
    the blocks as received, sent back unchanged when the message is appended to the
    conversation.
    """

    _path = "/messages"
    provider_name = "anthropic"
    """``gen_ai.provider.name`` on this backend's spans, whatever host serves the wire."""

    def __init__(
        self,
        base_url: str = "https://api.anthropic.com",
        api_key: str | None = None,
        *,
        name: str = "anthropic",
        version: str = ANTHROPIC_VERSION,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        headers: Mapping[str, str] | None = None,
        structured_output: Literal["tool", "native"] = "tool",
        cache_breakpoints: bool = False,
        static_ttl: TTL = "5m",
        min_cache_tokens: int = DEFAULT_MIN_TOKENS,
        **kwargs: Any,
    ) -> None:
        if structured_output not in ("tool", "native"):
            raise errors.ConfigurationError('structured_output must be "tool" or "native"')
        if max_tokens < 1:
            raise errors.ConfigurationError("max_tokens must be at least 1")
        if kwargs.get("prompt_cache_key"):
            raise errors.ConfigurationError("the Messages API takes no prompt_cache_key")
        kwargs["prompt_cache_key"] = False
        root = base_url.rstrip("/")
        if root and "://" in root and not root.endswith("/v1"):
            root += "/v1"
        merged = {"anthropic-version": version}
        if headers is not None:
            merged.update(header_mapping(headers, "headers"))
        super().__init__(root, api_key, name=name, headers=merged, **kwargs)
        self.max_tokens = max_tokens
        self.structured_output = structured_output
        self.cache_breakpoints = cache_breakpoints
        if static_ttl not in ("5m", "1h"):
            raise errors.ConfigurationError('static_ttl must be "5m" or "1h"')
        self._static_ttl: TTL = static_ttl
        self._min_cache_tokens = min_cache_tokens

    def __repr__(self) -> str:
        shown = self.base_url.split("?", 1)[0]
        return f"AnthropicBackend(name={self.name!r}, base_url={shown!r})"

    def _auth_headers(self, api_key: str) -> dict[str, str]:
        return {"x-api-key": api_key}

    def _encode(self, request: ChatRequest, stream: bool, encoding: CallEncoding | None) -> bytes:
        return encode_messages_request(
            request,
            stream=stream,
            max_tokens=self.max_tokens,
            exact=self._exact,
            structured=self.structured_output,
            cache=self._cache_planning(request, encoding),
        )

    def _cache_planning(
        self, request: ChatRequest, encoding: CallEncoding | None
    ) -> CachePlanning | None:
        if not self.cache_breakpoints:
            return None
        static = encoding.prefix(request).static if encoding is not None else None
        return CachePlanning(
            static=static, static_ttl=self._static_ttl, min_tokens=self._min_cache_tokens
        )

    def _chunk_stream(
        self, response: _Response, deadline: Deadline, request: ChatRequest
    ) -> _ChunkStream:
        output = output_names(request, self.structured_output)
        return _MessageStream(response, self, deadline, output)

    async def complete(
        self, request: ChatRequest, deadline: Deadline, options: RequestOptions | None = None
    ) -> ChatCompletion:
        """Run a non-streamed message."""
        body = await self._whole_body(request, deadline, options)
        completion = decode_message(body, self, output_names(request, self.structured_output))
        if deadline.now() >= deadline.at:  # parsing took the call past its deadline
            raise deadline.exceeded(self.name)
        return completion
