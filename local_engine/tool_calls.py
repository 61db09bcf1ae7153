"""Tool calls in model output: the Hermes/Qwen and the Llama 3.1 JSON conventions.

* ``"hermes"``: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, one or several,
  possibly after some text (Qwen 2.5/3, Hermes, and the embedded default model).
* ``"llama3"``: the whole reply is ``{"name": ..., "parameters": {...}}``, optionally after
  ``<|python_tag|>``; several calls may be separated by ``;`` or given as a JSON list.
* ``"none"``: no parsing; all text is content.

Malformed calls are never an error: their text stays in the content. :class:`ToolCallStream`
does the same parsing on a stream of text deltas, passing content through as it comes and
holding back only what may be the start of a tool call.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass, field
from typing import Any, Literal

from swiftclient.errors import ConfigurationError
from swiftclient.types import FunctionCall, ToolCall

from .stop import _held_suffix

__all__ = [
    "TOOL_CALL_FORMATS",
    "ParsedOutput",
    "ToolCallFormat",
    "ToolCallStream",
    "check_tool_format",
    "detect_tool_format",
    "new_tool_call_id",
    "parse_tool_calls",
    "strip_tool_markup",
    "tool_call_marker",
]

ToolCallFormat = Literal["hermes", "llama3", "none"]
TOOL_CALL_FORMATS: tuple[ToolCallFormat, ...] = ("hermes", "llama3", "none")

_HERMES_OPEN = "<tool_call>"
_HERMES_CLOSE = "</tool_call>"
_PYTHON_TAG = "<|python_tag|>"
_HERMES_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)


def tool_call_marker(fmt: ToolCallFormat) -> str | None:
    """The text that opens a tool call in ``fmt`` (``<tool_call>``, ``<|python_tag|>``)."""
    return {"hermes": _HERMES_OPEN, "llama3": _PYTHON_TAG}.get(fmt)


def strip_tool_markup(text: str, fmt: ToolCallFormat) -> str:
    """``text`` without tool-call markup of ``fmt`` (whole blocks, even unclosed ones, and
    stray tags): what a reply shows when no tools were offered."""
    if fmt == "hermes":
        text = _HERMES_BLOCK.sub("", text).replace(_HERMES_CLOSE, "")
    elif fmt == "llama3":
        text = text.replace(_PYTHON_TAG, "")
    return text if text.strip() else ""


def new_tool_call_id() -> str:
    """A fresh OpenAI-style tool call id: ``call_`` and 24 random hex digits."""
    return f"call_{secrets.token_hex(12)}"


def detect_tool_format(template: str | None) -> ToolCallFormat:
    """Guess the tool-call convention from the markers a chat template uses."""
    if not template:
        return "none"
    if _HERMES_OPEN in template:
        return "hermes"
    if _PYTHON_TAG in template or ("<|eot_id|>" in template and "parameters" in template):
        return "llama3"
    return "none"


def check_tool_format(value: str) -> ToolCallFormat:
    """Validate a tool-call format name given by a user."""
    for known in TOOL_CALL_FORMATS:
        if value == known:
            return known
    raise ConfigurationError(f"unknown tool call format {value!r}; use one of {TOOL_CALL_FORMATS}")


@dataclass
class ParsedOutput:
    """Model output split into content and tool calls."""

    content: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)


def _make_call(obj: Any, argument_keys: tuple[str, ...]) -> ToolCall | None:
    """A ToolCall from a decoded JSON object, or None when it is not shaped like one."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    arguments: Any = {}
    for key in argument_keys:
        if key in obj:
            arguments = obj[key]
            break
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    text = json.dumps(arguments, ensure_ascii=False)
    return ToolCall(id=new_tool_call_id(), function=FunctionCall(name=obj["name"], arguments=text))


def _parse_hermes(captured: str) -> ParsedOutput:
    """Parse text that starts at the first ``<tool_call>``."""
    calls: list[ToolCall] = []
    kept: list[str] = []
    pos = 0
    for match in _HERMES_BLOCK.finditer(captured):
        try:
            call = _make_call(json.loads(match.group(1)), ("arguments", "parameters"))
        except ValueError:
            call = None
        if call is None:
            continue  # malformed: its text stays in the content
        kept.append(captured[pos : match.start()])
        pos = match.end()
        calls.append(call)
    if not calls:
        return ParsedOutput(content=captured or None)
    kept.append(captured[pos:])
    return ParsedOutput(content="".join(kept).strip() or None, tool_calls=calls)


def _parse_llama3(captured: str) -> ParsedOutput:
    """Parse a reply that starts (after whitespace) with ``{``, ``[`` or ``<|python_tag|>``."""
    body = captured.strip()
    if body.startswith(_PYTHON_TAG):
        body = body[len(_PYTHON_TAG) :].lstrip()
    decoder = json.JSONDecoder()
    objects: list[Any] = []
    pos = 0
    try:
        while pos < len(body):
            value, pos = decoder.raw_decode(body, pos)
            objects.extend(value if isinstance(value, list) else [value])
            while pos < len(body) and (body[pos].isspace() or body[pos] == ";"):
                pos += 1
    except ValueError:
        return ParsedOutput(content=captured or None)
    calls = [_make_call(obj, ("parameters", "arguments")) for obj in objects]
    if not calls or any(call is None for call in calls):
        return ParsedOutput(content=captured or None)
    return ParsedOutput(content=None, tool_calls=[c for c in calls if c is not None])


def parse_tool_calls(text: str, fmt: ToolCallFormat) -> ParsedOutput:
    """Split a complete model reply into content and tool calls (never raises on bad JSON).

    The result is what :class:`ToolCallStream` yields for the same text fed in one piece.
    """
    stream = ToolCallStream(fmt)
    shown = stream.feed(text)
    end = stream.finish()
    content = shown + (end.content or "")
    if end.tool_calls and not content.strip():
        return ParsedOutput(content=None, tool_calls=end.tool_calls)
    return ParsedOutput(content=content or None, tool_calls=end.tool_calls)


class ToolCallStream:
    """Incremental tool-call parsing for streamed text.

    :meth:`feed` returns the content that is safe to show now; text that may belong to a tool
    call is held back. :meth:`finish` parses what was held and returns the rest of the content
    and the tool calls. Together they give the same result as :func:`parse_tool_calls`.
    """

    def __init__(self, fmt: ToolCallFormat) -> None:
        """Start parsing a stream in the given format."""
        self.format: ToolCallFormat = fmt
        self._pending = ""  # held text that may still turn out to be content
        self._captured = ""  # text from the start of a tool call on
        self._capturing = False
        self._shown = False  # has any non-blank content been returned?
        self._decided = fmt != "llama3"  # llama3: is the reply a call? decided on its start

    def feed(self, delta: str) -> str:
        """Add a text delta; return the content that can be shown now."""
        if self._capturing:
            self._captured += delta
            return ""
        text = self._pending + delta
        self._pending = ""
        if self.format == "hermes":
            return self._feed_hermes(text)
        if self.format == "llama3" and not self._decided:
            return self._feed_llama3(text)
        return text

    def _show(self, text: str, held: str) -> str:
        """Return ``text`` as content, except leading blank text, which is held with ``held``."""
        if not self._shown and not text.strip():
            self._pending = text + held
            return ""
        self._shown = True
        self._pending = held
        return text

    def _feed_hermes(self, text: str) -> str:
        start = text.find(_HERMES_OPEN)
        if start >= 0:
            self._capturing = True
            self._captured = text[start:]
            prefix = text[:start]
            if self._shown or prefix.strip():
                return prefix
            self._captured = text  # blank lead-in: shown only if no call parses
            return ""
        hold = _held_suffix(text, (_HERMES_OPEN,))
        cut = len(text) - hold
        return self._show(text[:cut], text[cut:])

    def _feed_llama3(self, text: str) -> str:
        body = text.lstrip()
        if not body or _PYTHON_TAG.startswith(body):
            self._pending = text
            return ""
        self._decided = True
        if body.startswith(("{", "[", _PYTHON_TAG)):
            self._capturing = True
            self._captured = text
            return ""
        return text

    def finish(self) -> ParsedOutput:
        """End the stream: the content not yet returned by :meth:`feed`, and the tool calls."""
        if not self._capturing:
            rest, self._pending = self._pending, ""
            return ParsedOutput(content=rest or None)
        self._capturing = False
        captured, self._captured = self._captured, ""
        if self.format == "hermes":
            start = captured.find(_HERMES_OPEN)
            parsed = _parse_hermes(captured[start:])
            return parsed if parsed.tool_calls else ParsedOutput(content=captured or None)
        return _parse_llama3(captured)
