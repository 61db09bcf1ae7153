"""Tool calls in model output: the Hermes/Qwen and the Llama 3.1 JSON conventions.

* ``"hermes"``: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, one or several,
  possibly after some text (Qwen 2.5/3, Hermes, and the embedded default model).
* ``"llama3"``: the whole reply is ``{"name": ..., "parameters": {...}}``, optionally after
  ``<|python_tag|>``; several calls may be separated by ``;`` or given as a JSON list.
* ``"none"``: no parsing; all text is content.

Malformed calls are never an error: their text stays in the content. A call cut short (the
reply ended at ``max_tokens`` or a stop string inside it) is returned as a call whose
``arguments`` are the text generated so far, as OpenAI returns one (the finish reason says it
was cut), once its name is whole; before that, its markup is dropped. :class:`ToolCallStream`
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
    "tool_call_closer",
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


def tool_call_closer(fmt: ToolCallFormat) -> str | None:
    """The text that closes a tool call in ``fmt`` (``</tool_call>``), if it has one."""
    return _HERMES_CLOSE if fmt == "hermes" else None


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
    """Model output split into content and tool calls (``partial``: the last call was cut
    short, so its ``arguments`` are incomplete JSON)."""

    content: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)
    partial: bool = False


# The start of a call cut short: its name whole, then what followed it.
_CUT_CALL = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*(?:,\s*(.*))?', re.DOTALL)
_ARGUMENT_KEYS = ('"arguments"', '"parameters"')


def _cut_call(text: str, *, named_arguments: bool = False) -> ToolCall | None:
    """The call whose JSON ``text`` was cut short, when its name is whole (and, with
    ``named_arguments``, its arguments key too): its ``arguments`` are the text generated so
    far (the model's own, not re-encoded; empty when the cut came before them)."""
    match = _CUT_CALL.fullmatch(text)
    if match is None:
        return None
    rest = match.group(2) or ""
    key = next((k for k in _ARGUMENT_KEYS if rest.startswith(k)), None)
    if key is not None:
        colon = rest[len(key) :].lstrip()
        if colon and not colon.startswith(":"):
            return None
        arguments = colon[1:].strip()
    elif named_arguments or not any(k.startswith(rest) for k in _ARGUMENT_KEYS):
        return None  # something else follows the name (or nothing names the arguments)
    else:
        arguments = ""
    try:
        name = json.loads(match.group(1))
    except ValueError:
        return None
    if not name:
        return None
    return ToolCall(id=new_tool_call_id(), function=FunctionCall(name=name, arguments=arguments))


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


def _parse_hermes(captured: str, cut: bool = False) -> ParsedOutput:
    """Parse text that starts at the first ``<tool_call>`` (``cut``: the reply was cut short,
    so an unclosed last block is a call cut short, or markup to drop)."""
    calls: list[ToolCall] = []
    kept: list[str] = []
    pos = 0
    partial = False
    for match in _HERMES_BLOCK.finditer(captured):
        try:
            call = _make_call(json.loads(match.group(1)), ("arguments", "parameters"))
        except ValueError:
            call = None
        unclosed = match.end() == len(captured) and not match.group(0).endswith(_HERMES_CLOSE)
        if call is None and cut and unclosed:
            call = _cut_call(match.group(1))
            partial = call is not None
            if call is None:  # cut before its name was whole: the markup is dropped
                kept.append(captured[pos : match.start()])
                pos = match.end()
                continue
        if call is None:
            continue  # malformed: its text stays in the content
        kept.append(captured[pos : match.start()])
        pos = match.end()
        calls.append(call)
    kept.append(captured[pos:])
    content = "".join(kept)
    if not calls:
        return ParsedOutput(content=content or None)
    return ParsedOutput(content=content.strip() or None, tool_calls=calls, partial=partial)


def _parse_llama3(captured: str, cut: bool = False) -> ParsedOutput:
    """Parse a reply that starts (after whitespace) with ``{``, ``[`` or ``<|python_tag|>``
    (``cut``: the reply was cut short, so a last object that names a call and its parameters
    is a call cut short; a reply in this format may also be plain JSON, so nothing is
    dropped)."""
    body = captured.strip()
    if body.startswith(_PYTHON_TAG):
        body = body[len(_PYTHON_TAG) :].lstrip()
    decoder = json.JSONDecoder()
    objects: list[Any] = []
    pos = 0
    last: ToolCall | None = None
    try:
        while pos < len(body):
            value, pos = decoder.raw_decode(body, pos)
            objects.extend(value if isinstance(value, list) else [value])
            while pos < len(body) and (body[pos].isspace() or body[pos] == ";"):
                pos += 1
    except ValueError:
        last = _cut_call(body[pos:], named_arguments=True) if cut else None
        if last is None:
            return ParsedOutput(content=captured or None)
    calls = [_make_call(obj, ("parameters", "arguments")) for obj in objects]
    if not (calls or last) or any(call is None for call in calls):
        return ParsedOutput(content=captured or None)
    found = [c for c in calls if c is not None] + ([last] if last else [])
    return ParsedOutput(content=None, tool_calls=found, partial=last is not None)


def parse_tool_calls(text: str, fmt: ToolCallFormat, *, cut: bool = False) -> ParsedOutput:
    """Split a complete model reply into content and tool calls (never raises on bad JSON;
    ``cut``: the reply ended at its token limit or a stop string, see the module's notes).

    The result is what :class:`ToolCallStream` yields for the same text fed in one piece.
    """
    stream = ToolCallStream(fmt)
    shown = stream.feed(text)
    end = stream.finish(cut=cut)
    content = shown + (end.content or "")
    if end.tool_calls and not content.strip():
        content = ""
    return ParsedOutput(content=content or None, tool_calls=end.tool_calls, partial=end.partial)


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

    def finish(self, *, cut: bool = False) -> ParsedOutput:
        """End the stream: the content not yet returned by :meth:`feed`, and the tool calls
        (``cut``: the reply ended at its token limit or a stop string)."""
        if not self._capturing:
            rest, self._pending = self._pending, ""
            return ParsedOutput(content=rest or None)
        self._capturing = False
        captured, self._captured = self._captured, ""
        if self.format == "hermes":
            start = captured.find(_HERMES_OPEN)
            parsed = _parse_hermes(captured[start:], cut)
            if parsed.tool_calls:
                return parsed
            content = captured[:start] + (parsed.content or "")
            return ParsedOutput(content=content if content.strip() else None)
        return _parse_llama3(captured, cut)
