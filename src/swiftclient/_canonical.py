"""Canonical request bytes and the prompt prefix they start with.

Provider prompt caches hit only on a byte-identical prefix, so equal requests must serialize
to identical bytes in every process, whatever order the caller's dicts were built in. The
canonical form differs from the request as given in these ways only (the documented
reorderings):

- ``tools`` are sorted by function name (a stable sort: equal names keep their order);
- every JSON-schema node (tool ``parameters``, ``response_format.json_schema.schema`` and
  their subschemas) has its keywords in one fixed order (:data:`SCHEMA_KEYWORD_ORDER` first,
  the rest alphabetically); the names in ``$defs`` / ``definitions`` /
  ``patternProperties`` / ``dependentSchemas`` are sorted; set-like arrays (``required``,
  ``dependentRequired`` values, a list-valued ``type``) are sorted;
- ``extra_body``, ``metadata`` and ``logit_bias`` keys are sorted (top level);
- the separators are compact (``,`` and ``:``).

Never reordered: messages and their content, ``enum``, ``prefixItems``, ``anyOf`` /
``oneOf`` / ``allOf`` lists, data values (``const``, ``default``, ``examples``) and the order
of the names in ``properties``, which structured outputs and strict tool calls generate in
(so it carries meaning, as ``enum`` order does).

Work is skipped when there is nothing to reorder: a request without tools, schemas and
``extra_body`` encodes exactly as its plain dump. Canonical tools and schemas are cached by
their plain JSON bytes, so an application that sends the same tools call after call pays the
reordering once.

:func:`prompt_prefix` gives the canonical bytes of the prompt as segments (the tools block,
then each message) and a fingerprint of the static prefix (tools plus the leading static
messages), which prompt cache keys and replica affinity are derived from.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import pydantic_core

from .types import ChatRequest, Message, Tool

__all__ = [
    "SCHEMA_KEYWORD_ORDER",
    "CallEncoding",
    "PromptPrefix",
    "cache_key",
    "canonical_schema",
    "encode",
    "leading_static",
    "prompt_prefix",
]

SCHEMA_KEYWORD_ORDER: tuple[str, ...] = (
    "$schema",
    "$id",
    "$ref",
    "title",
    "type",
    "description",
    "format",
    "enum",
    "const",
    "default",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "prefixItems",
    "minItems",
    "maxItems",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "pattern",
    "anyOf",
    "oneOf",
    "allOf",
    "not",
    "$defs",
    "definitions",
)
"""The keywords a canonical schema node starts with, in this order; other keys follow in
alphabetical order."""

_RANK = {key: rank for rank, key in enumerate(SCHEMA_KEYWORD_ORDER)}
_LAST = len(SCHEMA_KEYWORD_ORDER)
# Keywords whose value is one subschema, a map of names to subschemas (names sorted), a map
# of names to subschemas kept in order (``properties``), or a list of subschemas (kept).
_ONE = frozenset(
    {
        "additionalProperties",
        "items",
        "not",
        "if",
        "then",
        "else",
        "contains",
        "propertyNames",
        "unevaluatedItems",
        "unevaluatedProperties",
        "additionalItems",
    }
)
_SORTED_MAPS = frozenset({"$defs", "definitions", "patternProperties", "dependentSchemas"})
_LISTS = frozenset({"anyOf", "oneOf", "allOf", "prefixItems"})
_STATIC_ROLES = frozenset({"system", "developer"})
_CACHE_SIZE = 512


def _key_rank(key: str) -> tuple[int, str]:
    return (_RANK.get(key, _LAST), key)


def _sorted_names(names: list[Any]) -> list[Any]:
    """``names`` sorted when they are all strings (a set of names), else as given."""
    if all(isinstance(name, str) for name in names):
        return sorted(names)
    return names


def canonical_schema(schema: Any) -> Any:
    """``schema`` (a JSON-schema node, or a boolean schema) in canonical form (see the
    module); a new object, the argument is left alone."""
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key in sorted(schema, key=_key_rank):
        value = schema[key]
        if key == "properties" and isinstance(value, dict):
            value = {name: canonical_schema(sub) for name, sub in value.items()}
        elif key in _SORTED_MAPS and isinstance(value, dict):
            value = {name: canonical_schema(value[name]) for name in sorted(value)}
        elif key in _ONE:
            value = (
                [canonical_schema(sub) for sub in value]
                if isinstance(value, list)  # draft-4 tuple items: ordered
                else canonical_schema(value)
            )
        elif key in _LISTS and isinstance(value, list):
            value = [canonical_schema(sub) for sub in value]
        elif key == "required" and isinstance(value, list):
            value = _sorted_names(value)
        elif key == "type" and isinstance(value, list):
            value = _sorted_names(value)
        elif key == "dependentRequired" and isinstance(value, dict):
            value = {
                name: _sorted_names(names) if isinstance(names, list) else names
                for name, names in sorted(value.items())
            }
        out[key] = value
    return out


class _Memo:
    """A small bounded map from plain JSON bytes to their canonical form (oldest out)."""

    __slots__ = ("_items", "_make")

    def __init__(self, make: Callable[[Any], Any]) -> None:
        self._items: dict[bytes, Any] = {}
        self._make = make

    def get(self, raw: bytes, value: Callable[[], Any]) -> Any:
        """The canonical form of the value whose plain bytes are ``raw``; ``value()`` gives
        the plain value on a miss."""
        items = self._items
        found = items.get(raw)
        if found is None:
            found = self._make(value())
            if len(items) >= _CACHE_SIZE:
                items.pop(next(iter(items), raw), None)  # the oldest out
            items[raw] = found
        return found


def _make_tool(dumped: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
    function = dumped.get("function")
    if isinstance(function, dict) and "parameters" in function:
        function = {**function, "parameters": canonical_schema(function["parameters"])}
        dumped = {**dumped, "function": function}
    return dumped, pydantic_core.to_json(dumped)


def _make_format(dumped: dict[str, Any]) -> dict[str, Any]:
    schema_format = dumped.get("json_schema")
    if isinstance(schema_format, dict) and "schema" in schema_format:
        schema_format = {**schema_format, "schema": canonical_schema(schema_format["schema"])}
        return {**dumped, "json_schema": schema_format}
    return dumped


_tools_memo = _Memo(_make_tool)
_format_memo = _Memo(_make_format)
_tool_json = Tool.__pydantic_serializer__.to_json


def _tool_name(tool: Tool) -> str:
    return tool.function.name


def _canonical_tools(tools: list[Tool]) -> list[tuple[dict[str, Any], bytes]]:
    """The request's tools, sorted by name, each as (canonical dict, canonical bytes).
    A tool's plain bytes (one serialization in pydantic-core) find its canonical form."""
    ordered = sorted(tools, key=_tool_name) if len(tools) > 1 else tools
    memo = _tools_memo
    out = []
    for tool in ordered:
        raw = _tool_json(tool, exclude_none=True, by_alias=True)
        out.append(
            memo.get(raw, partial(tool.model_dump, mode="json", exclude_none=True, by_alias=True))
        )
    return out


def _sorted_map(value: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value[key] for key in sorted(value)}


_EXCLUDE = {"extra_body", "stream", "stream_options"}
_EXCLUDE_TOOLS = {*_EXCLUDE, "tools"}  # canonical tools come from their own memo


_CanonicalTools = list[tuple[dict[str, Any], bytes]]


def _body(
    request: ChatRequest,
    stream: bool,
    include_usage: bool,
    exact: bool,
    prompt_cache_key: str | None,
    canonical_tools: _CanonicalTools | None = None,
) -> tuple[dict[str, Any], _CanonicalTools | None]:
    """The body without its canonical tools, and those tools (None: none, or sent as
    given in ``data``)."""
    extra = request.extra_body
    tools = None if exact or (extra and "tools" in extra) else request.tools
    data = request.model_dump(
        mode="json",
        exclude_none=True,
        by_alias=True,
        exclude=_EXCLUDE_TOOLS if tools else _EXCLUDE,
    )
    data["stream"] = stream
    if stream:
        options = request.stream_options
        usage = (
            include_usage
            if options is None or options.include_usage is None
            else options.include_usage
        )
        if usage:
            data["stream_options"] = {"include_usage": True}
    if prompt_cache_key is not None and request.prompt_cache_key is None:
        data["prompt_cache_key"] = prompt_cache_key
    if not exact:
        response_format = data.get("response_format")
        if response_format is not None and "json_schema" in response_format:
            raw = pydantic_core.to_json(response_format)
            data["response_format"] = _format_memo.get(raw, partial(dict, response_format))
        for key in ("metadata", "logit_bias"):
            if key in data and len(data[key]) > 1:
                data[key] = _sorted_map(data[key])
        if extra and len(extra) > 1:
            extra = _sorted_map(extra)
    if extra:
        data.update(extra)
    if not tools:
        return data, None
    return data, canonical_tools if canonical_tools is not None else _canonical_tools(tools)


def encode(
    request: ChatRequest,
    *,
    stream: bool,
    include_usage: bool = True,
    exact: bool = False,
    derive_cache_key: bool = False,
) -> bytes:
    """The request's body bytes (compact JSON; canonical unless ``exact``).

    ``derive_cache_key``: send :func:`cache_key` as ``prompt_cache_key`` when the request
    names none (for providers that take one)."""
    prefix = prompt_prefix(request) if derive_cache_key else None
    return _encode(request, stream, include_usage, exact, prefix)


def _plain_body(request: ChatRequest) -> bool:
    """Whether the request's body is its plain dump plus the call's own fields: nothing to
    reorder or merge (no tools, schema, ``extra_body``, ``metadata`` or ``logit_bias``)
    and no ``stream`` fields of its own."""
    fields = request.__dict__  # the fields' values, read without pydantic's attribute hook
    return (
        fields["tools"] is None
        and fields["extra_body"] is None
        and fields["response_format"] is None
        and fields["metadata"] is None
        and fields["logit_bias"] is None
        and fields["stream"] is None
        and fields["stream_options"] is None
    )


_STREAM_TAIL = {
    (False, False): b',"stream":false',
    (False, True): b',"stream":false',
    (True, False): b',"stream":true',
    (True, True): b',"stream":true,"stream_options":{"include_usage":true}',
}


def _encode(
    request: ChatRequest,
    stream: bool,
    include_usage: bool,
    exact: bool,
    prefix: PromptPrefix | None,
    canonical_tools: _CanonicalTools | None = None,
) -> bytes:
    key = None if prefix is None else cache_key(prefix)
    if _plain_body(request):
        # The same bytes as the general path below, serialized in one pass (no dict built
        # and walked again): the dump, then ``stream`` (and its options), then the key.
        raw = request.__pydantic_serializer__.to_json(request, exclude_none=True, by_alias=True)
        tail = _STREAM_TAIL[bool(stream), bool(include_usage)]
        if key is not None and request.prompt_cache_key is None:
            tail += b',"prompt_cache_key":' + pydantic_core.to_json(key)
        return b"".join((raw[:-1], tail, b"}"))
    return _encode_general(request, stream, include_usage, exact, key, canonical_tools)


def _encode_general(
    request: ChatRequest,
    stream: bool,
    include_usage: bool,
    exact: bool,
    key: str | None,
    canonical_tools: _CanonicalTools | None = None,
) -> bytes:
    data, tools = _body(request, stream, include_usage, exact, key, canonical_tools)
    raw = pydantic_core.to_json(data)
    if not tools:
        return raw
    # The canonical tools' bytes come from their memo: spliced in last, not serialized again.
    return b"".join((raw[:-1], b',"tools":[', b",".join(t for _, t in tools), b"]}"))


# --------------------------------------------------------------------------- the prefix


@dataclass(frozen=True, slots=True)
class PromptPrefix:
    """The canonical prompt of a request, as segments, and its static prefix's fingerprint.

    Attributes:
        fingerprint: hex digest of the canonical cacheable (static) prefix: the tools
            (canonical, sorted) and the leading static messages (``system`` / ``developer``
            messages before the first other one). Identical across processes and dict
            orderings; the model name and sampling parameters are not part of it.
        segments: the canonical bytes of the prompt in the order it is sent: the tools
            block (``b""`` when there are no tools), then message 0, message 1, ...;
            byte-identical for equal requests.
        static: how many messages the static prefix holds (segments ``1 .. static``).
    """

    fingerprint: str
    segments: tuple[bytes, ...]
    static: int = 0


def leading_static(messages: list[Message]) -> int:
    """How many leading messages are system / developer messages (the static prefix when
    no layout marks say otherwise)."""
    count = 0
    for message in messages:
        if message.role not in _STATIC_ROLES:
            break
        count += 1
    return count


def _message_bytes(message: Message) -> bytes:
    return pydantic_core.to_json(message.model_dump(mode="json", exclude_none=True, by_alias=True))


def prompt_prefix(
    request: ChatRequest,
    static: int | None = None,
    *,
    _tools: _CanonicalTools | None = None,
) -> PromptPrefix:
    """The canonical prompt segments of ``request`` and its static prefix's fingerprint.

    ``static``: how many leading messages are static (the layout marks said so; see
    :func:`swiftclient.prompt_cache.arrange`); by default the leading system / developer
    messages."""
    tools = request.tools
    if tools:
        canonical = _tools if _tools is not None else _canonical_tools(tools)
        tools_block = b"[" + b",".join(raw for _, raw in canonical) + b"]"
    else:
        tools_block = b""
    messages = request.messages
    segments = (tools_block, *(_message_bytes(message) for message in messages))
    if static is None:
        static = leading_static(messages)
    else:
        static = min(static, len(messages))
    digest = hashlib.blake2b(digest_size=16)
    for segment in segments[: static + 1]:
        digest.update(len(segment).to_bytes(8, "little"))
        digest.update(segment)
    return PromptPrefix(digest.hexdigest(), segments, static)


def cache_key(prefix: PromptPrefix) -> str | None:
    """The ``prompt_cache_key`` derived from a prompt's static prefix: requests that share
    their tools and leading static messages share it. None when the prompt has no static
    prefix (one key for every unrelated request would crowd them onto one cache machine)."""
    if not prefix.static and not prefix.segments[0]:
        return None
    return f"swc-{prefix.fingerprint}"


class CallEncoding:
    """One call's request bytes and prompt prefix, built once and reused by its attempts.

    ``static`` is how many leading messages the call's layout marks made static (None: the
    leading system / developer messages).

    Bodies are kept per (model, stream, usage, exact, cache key) — attempts on other models
    or backends of the same call get their own — and the prompt prefix (model-free) once.
    A request whose messages or tools are not the very lists the call started with (a
    different request) is encoded afresh, never served from this memo.
    """

    _canonical_tools: _CanonicalTools | None = None
    _messages: list[Message] | None = None
    _tools: list[Tool] | None = None
    _prefix: PromptPrefix | None = None

    def __init__(self, static: int | None = None) -> None:
        self._static = static
        self._bodies: dict[tuple[str, bool, bool, bool, bool], bytes] = {}

    def _ours(self, request: ChatRequest) -> bool:
        fields = request.__dict__  # the fields' values, read without pydantic's attribute hook
        messages = self._messages
        if messages is None:
            self._messages = fields["messages"]
            self._tools = fields["tools"]
            return True
        return messages is fields["messages"] and self._tools is fields["tools"]

    def prefix(self, request: ChatRequest) -> PromptPrefix:
        """:func:`prompt_prefix` of ``request`` (with the call's layout), computed once per
        call."""
        if not self._ours(request):
            return prompt_prefix(request, self._static)
        prefix = self._prefix
        if prefix is None:
            tools = self._tools_of(request)
            prefix = self._prefix = prompt_prefix(request, self._static, _tools=tools)
        return prefix

    def _tools_of(self, request: ChatRequest) -> _CanonicalTools | None:
        """The call's canonical tools, made once (the request is the call's own)."""
        found = self._canonical_tools
        if found is None and request.tools:
            found = self._canonical_tools = _canonical_tools(request.tools)
        return found

    def encode(
        self,
        request: ChatRequest,
        *,
        stream: bool,
        include_usage: bool = True,
        exact: bool = False,
        derive_cache_key: bool = False,
    ) -> bytes:
        """:func:`encode` of ``request``, computed once per call and body variant."""
        if not self._ours(request):
            prefix = prompt_prefix(request) if derive_cache_key else None
            return _encode(request, stream, include_usage, exact, prefix)
        key = (request.model, stream, include_usage, exact, derive_cache_key)
        found = self._bodies.get(key)
        if found is None:
            prefix = self.prefix(request) if derive_cache_key else None
            tools = None if exact or self._tools is None else self._tools_of(request)
            found = _encode(request, stream, include_usage, exact, prefix, tools)
            self._bodies[key] = found
        return found
