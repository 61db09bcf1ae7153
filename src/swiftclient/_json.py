"""Compact JSON bytes for what the package writes (server bodies and events, wire events)."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["dumps"]


def dumps(obj: Any) -> bytes:
    """Compact JSON bytes (UTF-8; text that UTF-8 cannot carry, a lone surrogate a request
    sent escaped, goes back escaped as ``\\udXXX``, as it came)."""
    text = json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
    try:
        return text.encode()
    except UnicodeEncodeError:
        return json.dumps(obj, separators=(",", ":")).encode()
