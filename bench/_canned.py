"""Canned OpenAI-format wire bytes that every client in the CPU benchmark parses.

One realistic ``chat.completion`` body and one SSE stream of ``STREAM_CHUNKS`` chunk events
(role, content words, finish, usage) followed by ``data: [DONE]``. The in-process mock
transports hand out exactly these bytes, the stream one event per body piece, the way a
server that flushes every token delivers it.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = [
    "COMPLETION_BODY",
    "MESSAGES",
    "MODEL",
    "SSE_EVENTS",
    "STREAM_CHUNKS",
    "completion_headers",
    "stream_headers",
]

MODEL = "gpt-4o-mini"
STREAM_CHUNKS = 100
"""Chunk events per canned stream: 1 role + content words + 1 finish + 1 usage."""

MESSAGES: list[dict[str, Any]] = [
    {
        "role": "system",
        "content": "You are a concise assistant. Answer in plain prose without lists.",
    },
    {
        "role": "user",
        "content": "Explain in about a hundred words why connection pooling matters for "
        "clients that call a chat-completion API many times per second.",
    },
]

_ID = "chatcmpl-BENCH0123456789abcdefghijklmno"
_CREATED = 1_718_000_000
_SERVED_MODEL = "gpt-4o-mini-2024-07-18"
_FINGERPRINT = "fp_0ba0d124f1"
_VOCABULARY = (
    "Opening a TCP connection and negotiating TLS costs several round trips, so a client "
    "that reuses warm connections from a pool sends each request at once and keeps latency "
    "low and predictable under load while the server sees fewer handshakes and sockets"
).split()
_CONTENT_WORDS = STREAM_CHUNKS - 3
_WORDS = [(" " if i else "") + _VOCABULARY[i % len(_VOCABULARY)] for i in range(_CONTENT_WORDS)]
_USAGE: dict[str, Any] = {
    "prompt_tokens": 41,
    "completion_tokens": _CONTENT_WORDS,
    "total_tokens": 41 + _CONTENT_WORDS,
    "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
    "completion_tokens_details": {
        "reasoning_tokens": 0,
        "audio_tokens": 0,
        "accepted_prediction_tokens": 0,
        "rejected_prediction_tokens": 0,
    },
}


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _chunk(delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
    return {
        "id": _ID,
        "object": "chat.completion.chunk",
        "created": _CREATED,
        "model": _SERVED_MODEL,
        "service_tier": "default",
        "system_fingerprint": _FINGERPRINT,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        "usage": None,
    }


def _events() -> list[bytes]:
    chunks = [_chunk({"role": "assistant", "content": "", "refusal": None}, None)]
    chunks.extend(_chunk({"content": word}, None) for word in _WORDS)
    chunks.append(_chunk({}, "stop"))
    usage_chunk = _chunk({}, None)
    usage_chunk["choices"] = []
    usage_chunk["usage"] = _USAGE
    chunks.append(usage_chunk)
    return [b"data: " + _dumps(chunk) + b"\n\n" for chunk in chunks] + [b"data: [DONE]\n\n"]


SSE_EVENTS: list[bytes] = _events()
"""The stream, one SSE event per element (the last one is ``[DONE]``)."""

COMPLETION_BODY: bytes = _dumps(
    {
        "id": _ID,
        "object": "chat.completion",
        "created": _CREATED,
        "model": _SERVED_MODEL,
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "".join(_WORDS),
                    "refusal": None,
                    "annotations": [],
                },
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": _USAGE,
        "service_tier": "default",
        "system_fingerprint": _FINGERPRINT,
    }
)
"""A non-streamed ``chat.completion`` answer."""


def _headers(content_type: str, length: int | None) -> list[tuple[str, str]]:
    headers = [
        ("content-type", content_type),
        ("x-request-id", "req_0123456789abcdef0123456789abcdef"),
        ("openai-processing-ms", "412"),
        ("x-ratelimit-remaining-requests", "9999"),
        ("x-ratelimit-remaining-tokens", "149999"),
    ]
    if length is not None:
        headers.append(("content-length", str(length)))
    return headers


def completion_headers() -> list[tuple[str, str]]:
    """Response headers of the non-streamed answer."""
    return _headers("application/json", len(COMPLETION_BODY))


def stream_headers() -> list[tuple[str, str]]:
    """Response headers of the streamed answer."""
    return _headers("text/event-stream; charset=utf-8", None)
