"""What the fake provider sends on Anthropic's Messages wire (``/v1/messages``), without I/O.

A reply is planned as on the OpenAI route (:func:`~._events.plan_reply`); here it is
rendered the Messages way: a ``message`` body, or the event stream ``message_start``,
``content_block_start`` / ``content_block_delta`` / ``content_block_stop`` per block (a
``ping`` after the first), ``message_delta`` (stop reason, usage) and ``message_stop``.
Errors use Anthropic's shape, ``{"type": "error", "error": {"type", "message"}}``.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ..wire.messages import STOP_REASONS, error_type, messages_error
from ._events import Plan, split_words
from ._reply import Reply

__all__ = [
    "error_type",
    "messages_body",
    "messages_error",
    "messages_events",
    "messages_prompt_tokens",
]


def _event(kind: str, data: dict[str, Any]) -> bytes:
    return f"event: {kind}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def _words(value: Any) -> int:
    if isinstance(value, str):
        return len(value.split())
    if isinstance(value, list):
        return sum(
            _words(part.get("text")) + _words(part.get("content"))
            for part in value
            if isinstance(part, dict)
        )
    return 0


def messages_prompt_tokens(body: dict[str, Any]) -> int:
    """A deterministic stand-in for a tokenizer: the words of ``system`` and the messages."""
    count = _words(body.get("system"))
    for message in body.get("messages") or ():
        if isinstance(message, dict):
            count += _words(message.get("content"))
    return count


def _stop_reason(plan: Plan) -> str:
    return STOP_REASONS.get(plan.finish_reason, plan.finish_reason)


def _usage(
    plan: Plan, reply: Reply, prompt: int, simulated: dict[str, int] | None = None
) -> dict[str, Any]:
    if simulated is not None and reply.usage is None:  # the cache simulation's counts
        return {**simulated, "output_tokens": plan.usage["completion_tokens"]}
    spec = reply.usage
    cached = spec.cached_tokens if spec is not None and spec.cached_tokens is not None else 0
    written = (
        spec.cache_write_tokens if spec is not None and spec.cache_write_tokens is not None else 0
    )
    if spec is not None and spec.prompt_tokens is not None:
        prompt = spec.prompt_tokens
    return {
        "input_tokens": max(0, prompt - cached - written),
        "cache_creation_input_tokens": written,
        "cache_read_input_tokens": cached,
        "output_tokens": plan.usage["completion_tokens"],
    }


def _thinking_block(reply: Reply) -> dict[str, Any] | None:
    if reply.thinking is None:
        return None
    signature = hashlib.sha256(reply.thinking.encode()).hexdigest()
    return {"type": "thinking", "thinking": reply.thinking, "signature": f"fake-sig-{signature}"}


def _tool_id(call_id: str) -> str:
    return "toolu_" + call_id


def messages_body(
    plan: Plan,
    reply: Reply,
    *,
    message_id: str,
    model: str,
    prompt: int,
    cached: dict[str, int] | None = None,
) -> dict[str, Any]:
    """The ``message`` body of a non-streamed reply."""
    content: list[dict[str, Any]] = []
    thinking = _thinking_block(reply)
    if thinking is not None:
        content.append(thinking)
    if plan.content_chunks or not plan.tool_calls:
        content.append({"type": "text", "text": plan.content})
    for call in plan.tool_calls:
        content.append(
            {
                "type": "tool_use",
                "id": _tool_id(call.id),
                "name": call.name,
                "input": json.loads(call.arguments),
            }
        )
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": _stop_reason(plan),
        "stop_sequence": None,
        "usage": _usage(plan, reply, prompt, cached),
    }


def messages_events(
    plan: Plan,
    reply: Reply,
    *,
    message_id: str,
    model: str,
    prompt: int,
    cached: dict[str, int] | None = None,
) -> tuple[bytes, list[bytes], bytes]:
    """``(head, steps, tail)`` of a streamed reply: ``message_start`` (and the first
    block's start), one step per content or argument delta (block starts and stops ride
    along), then the last block's stop, ``message_delta`` and ``message_stop``."""
    usage = _usage(plan, reply, prompt, cached)
    start_usage = {**usage, "output_tokens": 1}
    head = _event(
        "message_start",
        {
            "type": "message_start",
            "message": {
                "id": message_id,
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": start_usage,
            },
        },
    )
    steps: list[bytes] = []
    index = 0
    thinking = _thinking_block(reply)
    if thinking is not None:
        start = {"type": "thinking", "thinking": "", "signature": ""}
        first = _event(
            "content_block_start",
            {"type": "content_block_start", "index": index, "content_block": start},
        )
        for i, piece in enumerate(split_words(thinking["thinking"]) or [""]):
            delta = {"type": "thinking_delta", "thinking": piece}
            event = _event(
                "content_block_delta",
                {"type": "content_block_delta", "index": index, "delta": delta},
            )
            steps.append((first if i == 0 else b"") + event)
        signature = {"type": "signature_delta", "signature": thinking["signature"]}
        steps[-1] += _event(
            "content_block_delta",
            {"type": "content_block_delta", "index": index, "delta": signature},
        ) + _event("content_block_stop", {"type": "content_block_stop", "index": index})
        index += 1
    if plan.content_chunks or not plan.tool_calls:
        first = _event(
            "content_block_start",
            {
                "type": "content_block_start",
                "index": index,
                "content_block": {"type": "text", "text": ""},
            },
        ) + _event("ping", {"type": "ping"})
        pieces = plan.content_chunks or [""]
        for i, text in enumerate(pieces):
            event = _event(
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {"type": "text_delta", "text": text},
                },
            )
            steps.append((first if i == 0 else b"") + event)
        steps[-1] += _event("content_block_stop", {"type": "content_block_stop", "index": index})
        index += 1
    for call in plan.tool_calls:
        block = {"type": "tool_use", "id": _tool_id(call.id), "name": call.name, "input": {}}
        steps.append(
            _event(
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": block},
            )
        )
        for piece in call.argument_pieces():
            delta = {"type": "input_json_delta", "partial_json": piece}
            steps.append(
                _event(
                    "content_block_delta",
                    {"type": "content_block_delta", "index": index, "delta": delta},
                )
            )
        steps[-1] += _event("content_block_stop", {"type": "content_block_stop", "index": index})
        index += 1
    tail = _event(
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": _stop_reason(plan), "stop_sequence": None},
            "usage": {"output_tokens": usage["output_tokens"]},
        },
    ) + _event("message_stop", {"type": "message_stop"})
    return head, steps, tail
