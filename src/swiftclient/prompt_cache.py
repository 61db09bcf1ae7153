"""Prompt-cache engineering the caller takes part in: layout marks, the volatile-content lint,
cache accounting and the prefix-break diagnosis.

A provider serves a prompt's prefix from its cache only when the bytes are identical to an
earlier request's, up to where they first differ. The SDK keeps what it controls stable
(canonical bytes, :mod:`swiftclient._canonical`); what only the caller knows is which
content never changes and which changes every call. This module lets the caller say so:

- **Layout marks.** Wrap messages in :func:`static` (system prompt, reference documents),
  :func:`session` (the conversation so far) or :func:`turn` (this call only: the current
  time, the question) and pass them to ``client.chat(...)``: the SDK emits static first,
  then session, then turn, each layer in the order given. Unmarked messages are session
  content, except system / developer messages before any other message, which are static.
  Without marks nothing moves.
- **The lint.** When the static prefix holds volatile content (a time of day, a UUID, a
  Unix timestamp, a counter, a random id), the client warns once per place, with
  :class:`VolatilePrefixWarning` naming the message, the character and what to do.
- **Accounting.** :class:`CacheAccounting` counts prompt tokens and cached prompt tokens per
  backend (``client.cache_stats()``), from the usage every provider reports
  (:attr:`~swiftclient.types.Usage.cached_tokens` normalizes OpenAI, DeepSeek and
  Anthropic-style fields).
- **Diagnosis.** :func:`diagnose` compares two consecutive prompts and says where the later
  one stops extending the earlier: the segment (tools or message index), the field, and the
  first differing byte. :func:`prompt_prefix` gives a prompt's canonical segments and its
  static prefix's fingerprint.
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ._attempt import noop_hook
from ._canonical import PromptPrefix, prompt_prefix
from .types import ChatRequest, Message, Tool

if TYPE_CHECKING:
    from ._attempt import AttemptResult

__all__ = [
    "CacheAccounting",
    "CacheUsage",
    "Layer",
    "Marked",
    "PrefixBreak",
    "PrefixLint",
    "VolatilePrefixWarning",
    "PromptPrefix",
    "arrange",
    "diagnose",
    "prompt_prefix",
    "session",
    "static",
    "turn",
]

Layer = Literal["static", "session", "turn"]
_RANK: dict[str, int] = {"static": 0, "session": 1, "turn": 2}
_STATIC_ROLES = frozenset({"system", "developer"})


# --------------------------------------------------------------------------- layout


@dataclass(frozen=True, slots=True)
class Marked:
    """A message marked with its layer (made by :func:`static`, :func:`session`, :func:`turn`).

    ``message`` is anything ``client.chat`` takes as a message (a :class:`Message`, an
    assistant reply, or a dict); the mark itself is never sent.
    """

    message: Any
    layer: Layer


def static(message: Any) -> Marked:
    """Mark ``message`` as static: the same in every call (system prompt, reference
    documents). Static content is sent first and forms the prompt's cacheable prefix."""
    return Marked(message, "static")


def session(message: Any) -> Marked:
    """Mark ``message`` as session content: stable within one conversation (its history)."""
    return Marked(message, "session")


def turn(message: Any) -> Marked:
    """Mark ``message`` as turn content: new in this call (the current time, the question).
    Turn content is sent last, so it never breaks the cached prefix before it."""
    return Marked(message, "turn")


def _role(message: Any) -> Any:
    if isinstance(message, Mapping):
        return message.get("role")
    return getattr(message, "role", None)


def arrange(messages: Sequence[Any]) -> tuple[list[Any], int]:
    """``messages`` in layout order (static, session, turn; stable within a layer), marks
    removed, and how many lead as static. Unmarked messages are session content, except
    system / developer messages before any other message (static)."""
    layered: list[tuple[int, Any]] = []
    leading = True
    for item in messages:
        if isinstance(item, Marked):
            layered.append((_RANK[item.layer], item.message))
            if item.layer != "static":
                leading = False
            continue
        if leading and _role(item) in _STATIC_ROLES:
            layered.append((0, item))
            continue
        leading = False
        layered.append((1, item))
    layered.sort(key=_layer_rank)  # stable: each layer keeps the order given
    static_count = sum(1 for rank, _ in layered if rank == 0)
    return [message for _, message in layered], static_count


def _layer_rank(item: tuple[int, Any]) -> int:
    return item[0]


# --------------------------------------------------------------------------- the lint


class VolatilePrefixWarning(UserWarning):
    """Content that changes from call to call sits in the prompt's cacheable prefix."""


_VOLATILE: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "a timestamp",
        re.compile(r"\b\d{4}-\d{2}-\d{2}[T ]\d{1,2}:\d{2}(?::\d{2})?|\b\d{1,2}:\d{2}:\d{2}\b"),
    ),
    (
        "a UUID",
        re.compile(
            r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"
        ),
    ),
    ("a Unix timestamp", re.compile(r"\b1[6-9]\d{8}(?:\d{3})?\b")),
    (
        "a counter",
        re.compile(
            r"\b(?:turn|request|iteration|attempt)\s*(?:#|no\.?|number)?\s*:?\s*\d+\b",
            re.IGNORECASE,
        ),
    ),
    (
        "a random id",
        re.compile(
            r"\b(?:req|msg|run|session|trace|call|chatcmpl)[-_][A-Za-z0-9]{8,}\b"
            r"|\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{16,}\b"
        ),
    ),
)
_MAX_CLEAN = 256


class PrefixLint:
    """Warns once per place (message or tool, and kind of content) when a prompt's static
    prefix holds volatile content. Texts found clean are remembered (a bounded set), so a
    static prefix sent call after call is scanned once."""

    __slots__ = ("_clean", "_warned")

    def __init__(self) -> None:
        self._clean: dict[str, None] = {}
        self._warned: set[tuple[str, str]] = set()

    def check(self, messages: Sequence[Message], static: int) -> None:
        """Scan the first ``static`` messages; warn (:class:`VolatilePrefixWarning`) once for
        each message index and kind of volatile content found."""
        clean = self._clean
        for index in range(min(static, len(messages))):
            message = messages[index]
            content = message.content
            text = content if isinstance(content, str) else message.text()
            if text and text not in clean:
                self._scan(text, f"messages[{index}] ({message.role})")

    def check_tools(self, tools: Sequence[Tool]) -> None:
        """Scan the tools' descriptions (part of every prompt's static prefix)."""
        clean = self._clean
        for tool in tools:
            text = tool.function.description
            if text and text not in clean:
                self._scan(text, f"the description of tool {tool.function.name!r}")

    def _scan(self, text: str, where: str) -> None:
        found = False
        for kind, pattern in _VOLATILE:
            match = pattern.search(text)
            if match is None:
                continue
            found = True
            place = (where, kind)
            if place in self._warned:
                continue
            self._warned.add(place)
            warnings.warn(
                f"volatile content in the cacheable prefix: {kind} {match.group(0)!r} in "
                f"{where} at character {match.start()}. It changes from call to call, so the "
                "provider's prompt cache misses from there on. Move it out of the static "
                "prefix: send it in a message marked swiftclient.prompt_cache.turn(...) (sent "
                "last), or leave it out. (If it is the same in every call, it does no harm.)",
                VolatilePrefixWarning,
                stacklevel=5,
            )
        if not found:
            clean = self._clean
            if len(clean) >= _MAX_CLEAN:
                clean.pop(next(iter(clean), text), None)  # the oldest out
            clean[text] = None


# --------------------------------------------------------------------------- accounting


@dataclass(slots=True)
class CacheUsage:
    """Prompt-cache counts of one backend: replies with usage, their prompt tokens and the
    prompt tokens served from the provider's cache."""

    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0

    @property
    def hit_ratio(self) -> float | None:
        """Cached prompt tokens over prompt tokens (None before any prompt token)."""
        if not self.prompt_tokens:
            return None
        return self.cached_tokens / self.prompt_tokens


class CacheAccounting:
    """An attempt observer that adds each attempt's reported usage to its backend's
    :class:`CacheUsage` (the name the client registered the backend under)."""

    __slots__ = ("backends",)

    def __init__(self) -> None:
        self.backends: dict[str, CacheUsage] = {}

    @noop_hook
    def on_start(self, attempt: AttemptResult) -> None:
        """Nothing to count before the attempt ends."""

    @noop_hook
    def on_first_token(self, attempt: AttemptResult) -> None:
        """Nothing to count before the attempt ends."""

    @noop_hook
    def on_commit(self, attempt: AttemptResult) -> None:
        """Nothing to count before the attempt ends."""

    def on_end(self, attempt: AttemptResult) -> None:
        """Count the usage the attempt reported, if any."""
        usage = attempt.usage
        if usage is None:
            return
        target = attempt.target
        alias = target.alias  # the target's backend_name, without the property's call
        name = target.backend.name if alias is None else alias
        counts = self.backends.get(name)
        if counts is None:
            counts = self.backends[name] = CacheUsage()
        counts.requests += 1
        fields = usage.__dict__  # read without pydantic's attribute hook: once per call
        counts.prompt_tokens += fields["prompt_tokens"]
        details = fields["prompt_tokens_details"]  # as Usage.cached_tokens reads it
        if details:
            counts.cached_tokens += details.cached_tokens or 0

    def snapshot(self, *, reset: bool = False) -> dict[str, CacheUsage]:
        """A copy of the counts per backend; ``reset`` starts them from zero again."""
        copy = {
            name: CacheUsage(c.requests, c.prompt_tokens, c.cached_tokens)
            for name, c in self.backends.items()
        }
        if reset:
            self.backends.clear()
        return copy


# --------------------------------------------------------------------------- diagnosis


@dataclass(frozen=True, slots=True)
class PrefixBreak:
    """Where a prompt stops extending the one before it.

    Attributes:
        segment: the canonical segment that differs: 0 for the tools block, ``i + 1`` for
            message ``i``.
        message_index: the message's index, or None for the tools block.
        field: the path of the first differing value inside the segment (``content``,
            ``tool_calls[0].function.arguments``, ``[2].function.parameters``, ...);
            ``(removed)`` when the later prompt has fewer messages.
        offset: the first differing byte within the segment's canonical bytes.
        prompt_offset: the same byte counted from the start of the prompt's canonical bytes
            (its segments in order); everything before it can still hit the cache.
        before: the earlier prompt's bytes around that byte.
        after: the later prompt's bytes around that byte.
    """

    segment: int
    message_index: int | None
    field: str
    offset: int
    prompt_offset: int
    before: bytes
    after: bytes

    def __str__(self) -> str:
        where = "tools" if self.message_index is None else f"messages[{self.message_index}]"
        return (
            f"the prompt prefix breaks at {where}.{self.field} (byte {self.offset} of the "
            f"segment, {self.prompt_offset} of the prompt): {self.before!r} -> {self.after!r}"
        )


def _as_prefix(prompt: PromptPrefix | ChatRequest) -> PromptPrefix:
    return prompt if isinstance(prompt, PromptPrefix) else prompt_prefix(prompt)


def _first_difference(a: bytes, b: bytes) -> int:
    limit = min(len(a), len(b))
    for index in range(limit):
        if a[index] != b[index]:
            return index
    return limit


def _path(a: Any, b: Any) -> str:
    """The path of the first value that differs between two parsed JSON values ("" when
    they differ at the top)."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in [*a, *(k for k in b if k not in a)]:
            key = str(key)
            if key not in a or key not in b or a[key] != b[key]:
                inner = _path(a.get(key), b.get(key))
                return key + (inner if inner.startswith("[") else f".{inner}" if inner else "")
        return ""
    if isinstance(a, list) and isinstance(b, list):
        for index in range(max(len(a), len(b))):
            if index >= len(a) or index >= len(b) or a[index] != b[index]:
                inner = _path(
                    a[index] if index < len(a) else None, b[index] if index < len(b) else None
                )
                return f"[{index}]" + (
                    inner if inner.startswith("[") else f".{inner}" if inner else ""
                )
    return ""


def _field(a: bytes, b: bytes) -> str:
    if not a or not b:
        return "(added)" if not a else "(removed)"
    try:
        path = _path(json.loads(a), json.loads(b))
    except ValueError:
        return "(bytes)"
    return path or "(value)"


def diagnose(
    previous: PromptPrefix | ChatRequest, current: PromptPrefix | ChatRequest
) -> PrefixBreak | None:
    """Where ``current`` stops extending ``previous`` (two consecutive turns); None when
    every segment of ``previous`` is sent again unchanged, so the whole earlier prompt can
    be served from the cache."""
    before, after = _as_prefix(previous).segments, _as_prefix(current).segments
    position = 0
    for segment, old in enumerate(before):
        new = after[segment] if segment < len(after) else None
        if new == old:
            position += len(old)
            continue
        message_index = None if segment == 0 else segment - 1
        if new is None:
            return PrefixBreak(segment, message_index, "(removed)", 0, position, old[:40], b"")
        offset = _first_difference(old, new)
        field = "tools" + _tools_field(old, new) if segment == 0 else _field(old, new)
        low = max(0, offset - 16)
        return PrefixBreak(
            segment,
            message_index,
            field,
            offset,
            position + offset,
            old[low : offset + 24],
            new[low : offset + 24],
        )
    return None


def _tools_field(old: bytes, new: bytes) -> str:
    field = _field(old, new)
    return "" if field.startswith("(") else field if field.startswith("[") else f".{field}"
