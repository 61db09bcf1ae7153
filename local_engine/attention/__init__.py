"""Attention backends behind one seam; pick one by name."""

from __future__ import annotations

from swiftclient.errors import ConfigurationError

from .base import AttentionBackend, AttentionMetadata, build_attention_metadata
from .cpu import CPUPagedAttention
from .native import DISABLE_ENV, load_paged_decode
from .reference import ReferenceAttention

__all__ = [
    "BACKEND_NAMES",
    "AttentionBackend",
    "AttentionMetadata",
    "CPUPagedAttention",
    "ReferenceAttention",
    "build_attention_metadata",
    "get_attention_backend",
]

BACKEND_NAMES = ("auto", "cpu", "reference")


def get_attention_backend(name: str = "auto") -> AttentionBackend:
    """Return a new attention backend.

    - ``"reference"``: the portable SDPA implementation, on any device and dtype.
    - ``"cpu"``: the reference backend with float32 and bfloat16 CPU decode rows run by the
      native paged kernel, built now (see :mod:`local_engine.attention.native`).
    - ``"auto"``: the ``"cpu"`` backend, building its kernel only when the first decode row
      it can take arrives, and running every row on the reference path where the kernel
      cannot be built. Rows the kernel does not take (GPU tensors, float16) run on the
      reference path either way.

    Raises:
        ConfigurationError: ``name`` is not a known backend, or ``"cpu"`` was asked for and
            the kernel cannot be built here.
    """
    if name == "reference":
        return ReferenceAttention()
    if name == "auto":
        return CPUPagedAttention()
    if name == "cpu":
        kernel = load_paged_decode()
        if kernel is None:
            raise ConfigurationError(
                "the 'cpu' attention backend needs its native kernel, which could not be "
                f"built here (no working C compiler, or {DISABLE_ENV}=0); use 'auto' or "
                "'reference'"
            )
        return CPUPagedAttention(kernel)
    raise ConfigurationError(
        f"unknown attention backend {name!r}: expected one of {', '.join(BACKEND_NAMES)}"
    )
