"""The cache-breakpoint planner: where a wire with explicit prompt caching (Anthropic's
``cache_control``, OpenAI's ``prompt_cache_breakpoint`` on GPT-5.6 and later) should place
its breakpoints.

A pure function over the canonical prompt, seen as a list of :class:`Segment` blocks in the
API's cache order (tools, then system, then messages). A breakpoint on a block caches the
whole prefix up to and including it. The rules of the Messages API:

- at most ``limit`` breakpoints (4);
- breakpoints with a longer TTL come before shorter ones (``1h`` before ``5m``);
- a prefix shorter than the model's minimum cacheable length is not cached (a breakpoint
  there only spends one of the four).

:func:`plan_breakpoints` keeps every breakpoint the caller set (past the limit, adjacent
ones are merged into the later one, which caches both prefixes, and a warning says so),
lengthens a TTL only where the order requires it (never shortens one), then spends the
remaining slots on segment ends that the layout marks (``static`` / ``session`` / ``turn``)
or the canonical prefix (the tools, the system prompt) name, skipping prefixes below the
minimum length and preferring the ends that cover the most.

:func:`mark_content_breakpoints` applies a plan to OpenAI's wires (Chat Completions and
Responses), where a breakpoint is a content part's ``prompt_cache_breakpoint``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "DEFAULT_LIMIT",
    "DEFAULT_MIN_TOKENS",
    "OPENAI_LIMIT",
    "TTL",
    "Breakpoint",
    "BreakpointPlan",
    "CacheBreakpointWarning",
    "Segment",
    "mark_content_breakpoints",
    "plan_breakpoints",
]

TTL = Literal["5m", "1h"]
DEFAULT_LIMIT = 4
"""Breakpoints one Messages API request may carry."""
DEFAULT_MIN_TOKENS = 1024
"""The shortest cacheable prefix of most Claude models (some need 2048 or 4096)."""
_RANK: dict[str, int] = {"5m": 0, "1h": 1}


class CacheBreakpointWarning(UserWarning):
    """The caller's cache breakpoints had to be changed: merged past the limit, or a TTL
    lengthened to keep longer TTLs first."""


@dataclass(frozen=True, slots=True)
class Segment:
    """One block of the canonical prompt, in cache order.

    ``tokens`` is the block's own length (an estimate is fine); ``end`` the TTL wanted
    when a layout segment (tools, static, session, turn) ends at this block; ``user`` the
    TTL of a breakpoint the caller set on it.
    """

    tokens: int
    end: TTL | None = None
    user: TTL | None = None


@dataclass(frozen=True, slots=True)
class Breakpoint:
    """A planned breakpoint: on block ``position``, with ``ttl``. ``user``: it carries a
    caller's breakpoint; ``merged``: the positions of the caller's breakpoints folded
    into it (its own included) when there were more than the limit."""

    position: int
    ttl: TTL
    user: bool = False
    merged: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class BreakpointPlan:
    """The breakpoints, in position order, and what the planner had to change."""

    breakpoints: tuple[Breakpoint, ...]
    warnings: tuple[str, ...] = field(default=())

    @property
    def positions(self) -> list[int]:
        """The blocks that get a breakpoint."""
        return [point.position for point in self.breakpoints]


def _longer(a: TTL, b: TTL) -> TTL:
    return a if _RANK[a] >= _RANK[b] else b


def plan_breakpoints(
    segments: Sequence[Segment],
    *,
    limit: int = DEFAULT_LIMIT,
    min_tokens: int = DEFAULT_MIN_TOKENS,
) -> BreakpointPlan:
    """Place at most ``limit`` breakpoints over ``segments`` (see the module).

    Raises ValueError for a ``limit`` below 1 or a negative token count.
    """
    if limit < 1:
        raise ValueError("limit must be at least 1")
    prefix: list[int] = []
    total = 0
    for segment in segments:
        if segment.tokens < 0:
            raise ValueError("a segment's tokens must not be negative")
        total += segment.tokens
        prefix.append(total)
    notes: list[str] = []

    # The caller's breakpoints, merged pairwise (the pair whose prefixes differ least)
    # until they fit.
    groups: list[tuple[list[int], TTL]] = [
        ([i], segment.user) for i, segment in enumerate(segments) if segment.user is not None
    ]
    while len(groups) > limit:
        k = min(
            range(len(groups) - 1),
            key=lambda j: prefix[groups[j + 1][0][-1]] - prefix[groups[j][0][-1]],
        )
        (first, ttl_a), (second, ttl_b) = groups[k], groups[k + 1]
        groups[k : k + 2] = [(first + second, _longer(ttl_a, ttl_b))]
        notes.append(
            f"more than {limit} cache breakpoints set: the one on block {first[-1]} is merged "
            f"into the one on block {second[-1]}, which caches both prefixes"
        )
    chosen: dict[int, Breakpoint] = {
        positions[-1]: Breakpoint(positions[-1], ttl, True, tuple(positions))
        for positions, ttl in groups
    }

    # Segment ends, most useful first: the last one (it covers the most), the last of each
    # TTL, then the rest from the end.
    candidates = [
        i
        for i, segment in enumerate(segments)
        if segment.end is not None and i not in chosen and prefix[i] >= min_tokens
    ]
    ordered: list[int] = []
    if candidates:
        ordered.append(candidates[-1])
        for ttl in ("1h", "5m"):
            last = [i for i in candidates if segments[i].end == ttl]
            if last and last[-1] not in ordered:
                ordered.append(last[-1])
        ordered.extend(i for i in reversed(candidates) if i not in ordered)
    for i in ordered[: max(0, limit - len(chosen))]:
        end = segments[i].end
        if end is not None:  # always, for a candidate
            chosen[i] = Breakpoint(i, end)

    # Longer TTLs first: a breakpoint before a longer-lived one is lengthened to match.
    points = sorted(chosen.values(), key=lambda point: point.position)
    running: TTL = "5m"
    for index in range(len(points) - 1, -1, -1):
        point = points[index]
        running = _longer(running, point.ttl)
        if point.ttl != running:
            if point.user:
                notes.append(
                    f"the cache breakpoint on block {point.position} is lengthened to "
                    f"{running}: a longer-lived one follows it"
                )
            points[index] = Breakpoint(point.position, running, point.user, point.merged)
    return BreakpointPlan(tuple(points), tuple(notes))


# --------------------------------------------------------------------- content-block wires

OPENAI_LIMIT = 4
"""Explicit breakpoints one OpenAI request writes (with ``prompt_cache_options.mode``
``explicit``; ``implicit`` adds one of its own and writes the latest three)."""
_OPENAI_LONG_TTL = "12h"
_USER_MARKS = ("prompt_cache_breakpoint", "cache_control")


def _user_mark(message: dict[str, Any]) -> TTL | None:
    """The TTL class of a breakpoint the caller set on a message (a message-level
    ``prompt_cache_breakpoint``, or Anthropic's ``cache_control``, so one marker means
    "cache up to here" on every wire), else None."""
    for key in _USER_MARKS:
        mark = message.get(key)
        if isinstance(mark, dict):
            return "1h" if mark.get("ttl") in ("1h", "12h") else "5m"
    return None


def _message_tokens(message: dict[str, Any]) -> int:
    return len(json.dumps(message, separators=(",", ":"))) // 4


def mark_content_breakpoints(
    messages: list[dict[str, Any]],
    *,
    static: int | None,
    roles: frozenset[str],
    prefix_tokens: int = 0,
    static_ttl: TTL = "5m",
    min_tokens: int = DEFAULT_MIN_TOKENS,
    limit: int = OPENAI_LIMIT,
) -> BreakpointPlan:
    """Place OpenAI's explicit cache breakpoints on chat-form ``messages`` (in place).

    The same plan as on the Messages API, from the same planner: the end of the static
    prefix (``static`` leading messages, else the leading system / developer ones) with
    ``static_ttl``, the history before the last user turn and the last message. A
    breakpoint marks the last content part of a message whose role is in ``roles`` (a
    string content becomes one text part) with ``prompt_cache_breakpoint``:
    ``{"mode": "explicit"}``, plus ``"ttl": "12h"`` for the long TTL class (``"1h"`` in
    the planner's terms; the short one inherits the request's TTL, 30 minutes by default).
    A message-level ``prompt_cache_breakpoint`` or ``cache_control`` the caller set is a
    breakpoint of theirs: kept (merged past the limit, as the planner does) and moved
    onto the content part. ``prefix_tokens``: what comes before the messages (the tools).
    """
    if static is None:
        static = 0
        for message in messages:
            if message.get("role") not in ("system", "developer"):
                break
            static += 1
    static = min(static, len(messages))
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    ends: dict[int, TTL] = {}
    if static:
        ends[static - 1] = static_ttl
    if last_user > 0:
        ends.setdefault(last_user - 1, "5m")
    if messages:
        ends.setdefault(len(messages) - 1, "5m")
    segments: list[Segment] = []
    for i, message in enumerate(messages):
        content = message.get("content")
        markable = message.get("role") in roles and bool(content)
        user = _user_mark(message)
        for key in _USER_MARKS:
            message.pop(key, None)
        size = _message_tokens(message) + (prefix_tokens if i == 0 else 0)
        segments.append(
            Segment(size, end=ends.get(i) if markable else None, user=user if markable else None)
        )
    plan = plan_breakpoints(segments, limit=limit, min_tokens=min_tokens)
    for point in plan.breakpoints:
        message = messages[point.position]
        content = message["content"]
        parts = [{"type": "text", "text": content}] if isinstance(content, str) else content
        mark: dict[str, str] = {"mode": "explicit"}
        if point.ttl == "1h":
            mark["ttl"] = _OPENAI_LONG_TTL
        parts[-1] = {**parts[-1], "prompt_cache_breakpoint": mark}
        message["content"] = parts
    if plan.warnings:  # in OpenAI's terms: the long TTL class is 12 hours there
        notes = tuple(note.replace("to 1h:", f"to {_OPENAI_LONG_TTL}:") for note in plan.warnings)
        plan = BreakpointPlan(plan.breakpoints, notes)
    return plan
