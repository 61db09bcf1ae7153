"""A simulation of Anthropic's explicit prompt cache, for the fake provider's ``/v1/messages``.

The prompt is read as blocks in cache order (tools, system blocks, then each message's
content blocks), each counted in whitespace-separated words (the fake's stand-in for
tokens). A ``cache_control`` breakpoint writes the prefix up to its block (when at least
``min_tokens`` long) for its TTL; a request reads the longest cached prefix that ends at
one of its breakpoints or at one of the 20 blocks before each (the API's lookback). Reads
refresh an entry's TTL. Usage is reported the Messages way: ``cache_read_input_tokens``,
``cache_creation_input_tokens`` (from the read point to the last breakpoint written, split
per TTL in ``cache_creation``: a prefix up to a 1-hour breakpoint is a 1-hour write) and
``input_tokens`` (the rest).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CacheSimulation", "prompt_blocks"]

_LOOKBACK = 20
_TTL_SECONDS = {"5m": 300.0, "1h": 3600.0}


def _words(value: Any) -> int:
    return len(json.dumps(value, sort_keys=True).split()) if value is not None else 0


def _plain(block: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in block.items() if k != "cache_control"}


def prompt_blocks(body: dict[str, Any]) -> Iterator[tuple[str, int, dict[str, Any] | None]]:
    """``(identity, tokens, cache_control)`` for each block of a Messages body, in cache
    order; the identity is the block's canonical JSON with its role and turn."""
    for tool in body.get("tools") or ():
        if isinstance(tool, dict):
            yield (
                "tool:" + json.dumps(_plain(tool), sort_keys=True),
                _words(_plain(tool)),
                tool.get("cache_control"),
            )
    system = body.get("system")
    if isinstance(system, str):
        yield "system:" + system, len(system.split()), None
    elif isinstance(system, list):
        for block in system:
            if isinstance(block, dict):
                text = block.get("text")
                yield (
                    "system:" + json.dumps(_plain(block), sort_keys=True),
                    len(str(text).split()),
                    block.get("cache_control"),
                )
    for turn, message in enumerate(body.get("messages") or ()):
        if not isinstance(message, dict):
            continue
        role = f"{turn}:{message.get('role')}:"
        content = message.get("content")
        if isinstance(content, str):
            yield role + content, len(content.split()), None
        elif isinstance(content, list):
            for block in content:
                if isinstance(block, dict):
                    plain = _plain(block)
                    tokens = len(str(plain.get("text", "")).split()) if "text" in plain else 1
                    yield (
                        role + json.dumps(plain, sort_keys=True),
                        tokens,
                        block.get("cache_control"),
                    )


@dataclass
class CacheSimulation:
    """The cache of one fake provider: prefix digests and when each expires."""

    min_tokens: int = 1024
    clock: Callable[[], float] = time.monotonic
    entries: dict[str, float] = field(default_factory=dict)

    def usage(self, body: dict[str, Any]) -> dict[str, Any]:
        """Serve ``body``'s prompt from the cache and write its breakpoints; the Messages
        usage counts of its input (``output_tokens`` left to the caller)."""
        now = self.clock()
        digest = hashlib.sha256()
        prefixes: list[tuple[str, int]] = []  # (digest, prefix tokens) after each block
        breakpoints: list[tuple[int, str]] = []  # (block index, ttl)
        total = 0
        for identity, tokens, marker in prompt_blocks(body):
            digest.update(identity.encode())
            digest.update(b"\x00")
            total += tokens
            prefixes.append((digest.hexdigest(), total))
            if isinstance(marker, dict):
                ttl = "1h" if marker.get("ttl") == "1h" else "5m"
                breakpoints.append((len(prefixes) - 1, ttl))
        read = 0
        read_at = -1
        for index, _ in breakpoints:
            for back in range(index, max(-1, index - _LOOKBACK), -1):
                key, length = prefixes[back]
                expires = self.entries.get(key)
                if expires is not None and expires > now and length > read:
                    read, read_at = length, back
        if read_at >= 0:
            key = prefixes[read_at][0]
            self.entries[key] = max(self.entries[key], now + _TTL_SECONDS["5m"])
        written_to = written_1h_to = read
        for index, ttl in breakpoints:
            key, length = prefixes[index]
            if length < self.min_tokens:
                continue
            self.entries[key] = max(self.entries.get(key, 0.0), now + _TTL_SECONDS[ttl])
            written_to = max(written_to, length)
            if ttl == "1h":
                written_1h_to = max(written_1h_to, length)
        return {
            "input_tokens": total - written_to,
            "cache_creation_input_tokens": written_to - read,
            "cache_read_input_tokens": read,
            "cache_creation": {
                "ephemeral_5m_input_tokens": written_to - written_1h_to,
                "ephemeral_1h_input_tokens": written_1h_to - read,
            },
        }
