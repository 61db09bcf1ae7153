"""What the fake provider sends, without I/O: a plan for one reply and its wire forms.

Stream events follow OpenAI's chunk format: a first delta with the role, content (or
tool-call) deltas, a chunk with ``finish_reason``, a usage chunk when the request asked for
``stream_options.include_usage``, then ``data: [DONE]``. Content chunks are rendered from a
pre-built template, so a chunk costs one ``json.dumps`` of its text.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from ..asgi import SSE_DONE, error_body, sse_event
from ._reply import Reply

__all__ = [
    "MALFORMED",
    "SSE_DONE",
    "ChunkRenderer",
    "Plan",
    "PlannedToolCall",
    "completion_body",
    "error_event",
    "plan_reply",
    "split_words",
]

MALFORMED = b'data: {"id": "chatcmpl-broken", "choices": [{"delta": \n\n'
_WORD = re.compile(r"\s*\S+")
_ARGUMENT_PIECE = 8  # characters of tool-call arguments per delta


@dataclass(frozen=True, slots=True)
class PlannedToolCall:
    """A tool call to send: its id, function name and JSON-encoded arguments."""

    id: str
    name: str
    arguments: str

    def argument_pieces(self) -> list[str]:
        """The arguments split over several deltas."""
        text = self.arguments
        return [text[i : i + _ARGUMENT_PIECE] for i in range(0, len(text), _ARGUMENT_PIECE)]


@dataclass(frozen=True, slots=True)
class Plan:
    """Everything one reply says, decided before the first byte is sent."""

    content_chunks: list[str]
    tool_calls: list[PlannedToolCall]
    finish_reason: str
    usage: dict[str, Any]

    @property
    def content(self) -> str:
        """The whole content text."""
        return "".join(self.content_chunks)


def split_words(text: str) -> list[str]:
    """Split ``text`` into word tokens that join back to exactly ``text``."""
    pieces = _WORD.findall(text)
    rest = text[sum(map(len, pieces)) :]
    if rest:
        if pieces:
            pieces[-1] += rest
        else:
            pieces.append(rest)
    return pieces


def _max_tokens(body: dict[str, Any]) -> int | None:
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _prompt_tokens(body: dict[str, Any]) -> int:
    """A deterministic stand-in for a tokenizer: whitespace-separated words."""
    count = 0
    for message in body.get("messages") or ():
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            count += len(content.split())
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    count += len(part["text"].split())
    return count


def plan_reply(reply: Reply, body: dict[str, Any], call_prefix: str) -> Plan:
    """Decide the content, tool calls, finish reason and usage of ``reply`` to ``body``."""
    if reply.text is not None:
        pieces = split_words(reply.text)
    elif reply.json_object is not None:
        pieces = split_words(json.dumps(reply.json_object))
    elif reply.tokens is not None or not reply.tool_calls:
        count = 5 if reply.tokens is None else reply.tokens
        pieces = [f" tok{i}" if i else "tok0" for i in range(count)]
    else:
        pieces = []
    finish = "tool_calls" if reply.tool_calls else "stop"
    limit = _max_tokens(body)
    if limit is not None and len(pieces) > limit:
        pieces, finish = pieces[:limit], "length"
    size = reply.chunk_size
    chunks = ["".join(pieces[i : i + size]) for i in range(0, len(pieces), size)]
    calls = [
        PlannedToolCall(f"{call_prefix}_{i}", name, json.dumps(arguments))
        for i, (name, arguments) in enumerate(reply.tool_calls)
    ]
    completion = len(pieces) + sum(len(c.argument_pieces()) + 1 for c in calls)
    spec = reply.usage
    prompt = _prompt_tokens(body)
    if spec is not None:
        prompt = prompt if spec.prompt_tokens is None else spec.prompt_tokens
        completion = completion if spec.completion_tokens is None else spec.completion_tokens
    cached = spec.cached_tokens if spec is not None and spec.cached_tokens is not None else 0
    details = {"cached_tokens": cached}
    if spec is not None and spec.cache_write_tokens is not None:  # as GPT-5.6 reports them
        details["cache_write_tokens"] = spec.cache_write_tokens
    usage = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": details,
    }
    return Plan(chunks, calls, reply.finish_reason or finish, usage)


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))


def completion_body(plan: Plan, *, completion_id: str, model: str, created: int) -> dict[str, Any]:
    """The ``chat.completion`` JSON body of a non-streamed reply."""
    message: dict[str, Any] = {
        "role": "assistant",
        "content": plan.content if plan.content_chunks or not plan.tool_calls else None,
        "refusal": None,
    }
    if plan.tool_calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in plan.tool_calls
        ]
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {"index": 0, "message": message, "logprobs": None, "finish_reason": plan.finish_reason}
        ],
        "usage": plan.usage,
    }


class ChunkRenderer:
    """Renders the SSE events of one streamed completion as bytes."""

    __slots__ = ("_choice_head", "_choice_tail", "_head", "_tail", "include_usage")

    def __init__(
        self, *, completion_id: str, model: str, created: int, include_usage: bool
    ) -> None:
        self.include_usage = include_usage
        header = _dumps(
            {
                "id": completion_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
            }
        )
        self._head = "data: " + header[:-1]
        self._tail = (',"usage":null' if include_usage else "") + "}\n\n"
        self._choice_head = self._head + ',"choices":[{"index":0,"delta":'
        self._choice_tail = ',"logprobs":null,"finish_reason":null}]' + self._tail

    def delta(self, delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        """One chunk carrying ``delta`` (and ``finish_reason``, for the last one)."""
        if finish_reason is None:
            return (self._choice_head + _dumps(delta) + self._choice_tail).encode()
        tail = ',"logprobs":null,"finish_reason":' + _dumps(finish_reason) + "}]" + self._tail
        return (self._choice_head + _dumps(delta) + tail).encode()

    def role(self, *, with_content: bool) -> bytes:
        """The first chunk: the assistant role (content ``""``, or ``null`` before tool calls)."""
        return self.delta({"role": "assistant", "content": "" if with_content else None})

    def content(self, text: str) -> bytes:
        """A content chunk."""
        return (
            self._choice_head + '{"content":' + json.dumps(text) + "}" + self._choice_tail
        ).encode()

    def tool_call(self, index: int, call: PlannedToolCall) -> list[bytes]:
        """The chunks of one tool call: id and name first, then the arguments in pieces."""
        first = {
            "index": index,
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": ""},
        }
        events = [self.delta({"tool_calls": [first]})]
        for piece in call.argument_pieces():
            events.append(
                self.delta({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
            )
        return events

    def finish(self, reason: str) -> bytes:
        """The chunk carrying ``finish_reason``."""
        return self.delta({}, reason)

    def usage(self, usage: dict[str, Any]) -> bytes:
        """The final usage chunk (empty ``choices``), sent on ``include_usage``."""
        return (self._head + ',"choices":[],"usage":' + _dumps(usage) + "}\n\n").encode()


def error_event(message: str, *, type: str = "server_error", code: str | None = None) -> bytes:
    """An in-band error event: ``data: {"error": {...}}``."""
    return sse_event(error_body(500, message, type=type, code=code))
