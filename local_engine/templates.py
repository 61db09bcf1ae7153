"""Chat templates rendered with Jinja the way transformers renders them.

The environment matches ``PreTrainedTokenizerBase.apply_chat_template``: an immutable sandbox
with ``trim_blocks`` and ``lstrip_blocks``, the loop-controls extension, a ``tojson`` filter
that keeps non-ASCII text as is, ``raise_exception`` and ``strftime_now``, and the named special
tokens (``bos_token``, ``eos_token``, ...) as variables. Messages are normalized the way
transformers normalizes them (pydantic models dumped, ``None`` fields dropped), plus what an
OpenAI-shaped request needs for a Hugging Face template: tool-call arguments given as a JSON
string become a dict, text parts are joined, and the ``developer`` role becomes ``system``.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
import jinja2.sandbox
import jinja2.utils
from pydantic import BaseModel

from swiftclient.errors import ConfigurationError
from swiftclient.types import Message, Tool

__all__ = [
    "CHATML_TOOLS_TEMPLATE",
    "ChatTemplateError",
    "compile_template",
    "normalize_messages",
    "normalize_tools",
    "render_chat_template",
    "render_normalized",
    "select_template",
]

_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class ChatTemplateError(ConfigurationError):
    """A chat template failed to compile, or refused the conversation while rendering."""


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _Namespace(jinja2.utils.Namespace):
    """``namespace()`` that refuses underscore-prefixed attribute names."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: B902 - same trick as Namespace
        self, rest = args[0], args[1:]
        for name in dict(*rest, **kwargs):
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, *rest, **kwargs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: object) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"chat templates cannot set underscore-prefixed namespace attributes ({name!r})"
            )


def _make_dict(*args: Any, **kwargs: Any) -> dict[Any, Any]:
    return dict(*args, **kwargs)


class _GenerationTag(jinja2.ext.Extension):
    """Accepts ``{% generation %}...{% endgeneration %}`` and renders its body unchanged."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        """Parse the block; it renders as its body."""
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body).set_lineno(lineno)


@functools.lru_cache(maxsize=32)
def compile_template(source: str) -> jinja2.Template:
    """Compile a chat template in the sandboxed, transformers-compatible environment."""
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationTag, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["namespace"] = _Namespace
    env.globals["dict"] = _make_dict
    try:
        return env.from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as exc:
        raise ChatTemplateError(f"chat template does not compile: {exc}") from exc


def select_template(
    template: str | Mapping[str, str] | None, *, name: str | None = None, has_tools: bool = False
) -> str:
    """Pick the template source to render, as transformers' ``get_chat_template`` does.

    ``template`` is what the tokenizer holds: a source string, or named sources. ``name`` picks
    a named template; otherwise ``tool_use`` is chosen when tools are offered, then ``default``.
    """
    if template is None:
        raise ConfigurationError("this model has no chat template")
    if isinstance(template, str):
        return template
    if name is not None:
        if name not in template:
            raise ConfigurationError(
                f"no chat template named {name!r}; available: {sorted(template)}"
            )
        return template[name]
    if has_tools and "tool_use" in template:
        return template["tool_use"]
    if "default" in template:
        return template["default"]
    raise ConfigurationError(
        "this model has several chat templates and none is 'default'; "
        f"pick one of {sorted(template)}"
    )


_MEDIA = {
    "image_url": "an image",
    "image": "an image",
    "input_image": "an image",
    "input_audio": "audio",
    "audio": "audio",
    "video": "a video",
}


def _text_content(parts: Sequence[Any]) -> str:
    texts: list[str] = []
    for part in parts:
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind in _MEDIA:
            # in words every wire's caller reads (a Messages `image` block arrives here as
            # a chat `image_url` part: naming that confused the caller)
            raise ConfigurationError(
                f"this local model is text-only; a message holds {_MEDIA[kind]}"
            )
        else:
            raise ConfigurationError(f"unsupported message content part: {part!r}")
    return "\n".join(texts)  # as vLLM joins text parts (joined with nothing, they ran together)


def _plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return _plain(value.model_dump(by_alias=True))
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _normalize_tool_call(call: Any) -> Any:
    if not isinstance(call, dict):
        return call
    function = call.get("function")
    if isinstance(function, dict) and isinstance(function.get("arguments"), str):
        try:
            parsed = json.loads(function["arguments"])
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            call = {**call, "function": {**function, "arguments": parsed}}
    return call


def normalize_messages(messages: Sequence[Message | Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Turn messages into the plain dicts a Hugging Face chat template expects.

    Raises :class:`~swiftclient.errors.ConfigurationError` for image (or other non-text)
    content, which a text-only local model cannot take.
    """
    result: list[dict[str, Any]] = []
    for message in messages:
        if not isinstance(message, BaseModel | Mapping):
            raise ConfigurationError(f"a message must be a Message or a dict, got {message!r}")
        raw = _plain(message)
        item: dict[str, Any] = {k: v for k, v in raw.items() if v is not None}
        if "role" not in item:
            raise ConfigurationError(f"message without a role: {item!r}")
        if item["role"] == "developer":
            item["role"] = "system"
        if isinstance(item.get("content"), list):
            item["content"] = _text_content(item["content"])
        if isinstance(item.get("tool_calls"), list):
            item["tool_calls"] = [_normalize_tool_call(c) for c in item["tool_calls"]]
        reasoning = next((item[k] for k in _REASONING_FIELDS if item.get(k) is not None), None)
        if reasoning is not None:
            item = {"thinking": reasoning, **item, "reasoning_content": reasoning}
        result.append(item)
    return result


def normalize_tools(
    tools: Sequence[Tool | Mapping[str, Any]] | None,
) -> list[dict[str, Any]] | None:
    """Tools as JSON-schema dicts (``{"type": "function", "function": {...}}``)."""
    if tools is None:
        return None
    result: list[dict[str, Any]] = []
    for tool in tools:
        if isinstance(tool, Tool):
            result.append(tool.model_dump(exclude_none=True, by_alias=True))
        elif isinstance(tool, Mapping):
            result.append(_plain(tool))
        else:
            raise ConfigurationError(f"a tool must be a Tool or a dict, got {tool!r}")
    return result


def render_chat_template(
    source: str,
    messages: Sequence[Message | Mapping[str, Any]],
    /,
    *,
    tools: Sequence[Tool | Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = False,
    special_tokens: Mapping[str, str] | None = None,
    **kwargs: Any,
) -> str:
    """Render a conversation with a chat template, as transformers would (``tokenize=False``).

    ``special_tokens`` (e.g. ``{"bos_token": "<s>"}``) become template variables; ``kwargs``
    are passed on too and win over them (e.g. ``enable_thinking=False``).
    """
    return render_normalized(
        source,
        normalize_messages(messages),
        tools=tools,
        add_generation_prompt=add_generation_prompt,
        special_tokens=special_tokens,
        **kwargs,
    )


def render_normalized(
    source: str,
    messages: list[dict[str, Any]],
    /,
    *,
    tools: Sequence[Tool | Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = False,
    special_tokens: Mapping[str, str] | None = None,
    **kwargs: Any,
) -> str:
    """:func:`render_chat_template` for messages already through :func:`normalize_messages`."""
    template = compile_template(source)
    variables: dict[str, Any] = {**(special_tokens or {}), **_plain(kwargs)}
    try:
        return template.render(
            messages=messages,
            tools=normalize_tools(tools),
            documents=None,
            add_generation_prompt=add_generation_prompt,
            **variables,
        )
    except jinja2.exceptions.TemplateError as exc:
        raise ChatTemplateError(f"chat template error: {exc}") from exc


#: A ChatML template with Hermes-style tool calls, written for the embedded default model.
#: Tools are listed as JSON inside ``<tools></tools>`` in the system turn; the assistant calls
#: them with ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``; tool results come
#: back in a user turn inside ``<tool_response></tool_response>``.
CHATML_TOOLS_TEMPLATE = """\
{%- set ns = namespace(system=none, start=0) -%}
{%- if messages and messages[0].role == 'system' -%}
  {%- set ns.system = messages[0].content or '' -%}
  {%- set ns.start = 1 -%}
{%- endif -%}
{%- if tools -%}
  {{- '<|im_start|>system\\n' -}}
  {%- if ns.system -%}
    {{- ns.system + '\\n\\n' -}}
  {%- endif -%}
  {{- 'You may call the tools below. Their JSON schemas are inside <tools></tools>:\\n<tools>' -}}
  {%- for tool in tools -%}
    {{- '\\n' + (tool.function if tool.function is defined else tool) | tojson -}}
  {%- endfor -%}
  {{- '\\n</tools>\\n\\nTo call a tool, answer with one JSON object per call, each inside '
      '<tool_call></tool_call> tags:\\n<tool_call>\\n{"name": <tool name>, "arguments": '
      '<arguments object>}\\n</tool_call><|im_end|>\\n' -}}
{%- elif ns.system is not none -%}
  {{- '<|im_start|>system\\n' + ns.system + '<|im_end|>\\n' -}}
{%- endif -%}
{%- for message in messages[ns.start:] -%}
  {%- if message.role == 'user' or message.role == 'system' -%}
    {{- '<|im_start|>' + message.role + '\\n' + (message.content or '') + '<|im_end|>\\n' -}}
  {%- elif message.role == 'assistant' -%}
    {{- '<|im_start|>assistant' -}}
    {%- if message.content -%}
      {{- '\\n' + message.content -}}
    {%- endif -%}
    {%- for call in message.tool_calls or [] -%}
      {%- set fn = call.function if call.function is defined else call -%}
      {{- '\\n<tool_call>\\n{"name": ' + fn.name | tojson + ', "arguments": ' -}}
      {%- if fn.arguments is string -%}
        {{- fn.arguments -}}
      {%- else -%}
        {{- fn.arguments | tojson -}}
      {%- endif -%}
      {{- '}\\n</tool_call>' -}}
    {%- endfor -%}
    {{- '<|im_end|>\\n' -}}
  {%- elif message.role == 'tool' -%}
    {%- if loop.first or loop.previtem.role != 'tool' -%}
      {{- '<|im_start|>user' -}}
    {%- endif -%}
    {{- '\\n<tool_response>\\n' + (message.content or '') + '\\n</tool_response>' -}}
    {%- if loop.last or loop.nextitem.role != 'tool' -%}
      {{- '<|im_end|>\\n' -}}
    {%- endif -%}
  {%- else -%}
    {{- raise_exception('unsupported message role: ' + message.role) -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- '<|im_start|>assistant\\n' -}}
{%- endif -%}
"""
