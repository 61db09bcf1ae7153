"""Attention backends behind one seam; pick one by name."""

from __future__ import annotations

from swiftclient.errors import ConfigurationError

from .base import AttentionBackend, AttentionMetadata, build_attention_metadata
from .reference import ReferenceAttention

__all__ = [
    "BACKEND_NAMES",
    "AttentionBackend",
    "AttentionMetadata",
    "ReferenceAttention",
    "build_attention_metadata",
    "get_attention_backend",
]

BACKEND_NAMES = ("auto", "reference")


def get_attention_backend(name: str = "auto") -> AttentionBackend:
    """Return a new attention backend.

    ``"auto"`` picks the best backend available (today the SDPA reference everywhere);
    ``"reference"`` forces the portable SDPA implementation.

    Raises:
        ConfigurationError: ``name`` is not a known backend.
    """
    if name in ("auto", "reference"):
        return ReferenceAttention()
    raise ConfigurationError(
        f"unknown attention backend {name!r}: expected one of {', '.join(BACKEND_NAMES)}"
    )
