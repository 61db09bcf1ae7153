"""Attention backends behind one seam; pick one by name."""

from __future__ import annotations

import torch

from local_engine.errors import EngineConfigError

from .base import AttentionBackend, AttentionMetadata, build_attention_metadata
from .cpu import CPUPagedAttention
from .native import DISABLE_ENV, load_paged_decode
from .reference import ReferenceAttention
from .triton_backend import TritonPagedAttention, triton_available

__all__ = [
    "BACKEND_NAMES",
    "AttentionBackend",
    "AttentionMetadata",
    "CPUPagedAttention",
    "ReferenceAttention",
    "TritonPagedAttention",
    "build_attention_metadata",
    "get_attention_backend",
]

BACKEND_NAMES = ("auto", "cpu", "reference", "triton")


def get_attention_backend(
    name: str = "auto", *, device: str | torch.device | None = None
) -> AttentionBackend:
    """Return a new attention backend for a model on ``device`` (CPU when None).

    - ``"reference"``: the portable SDPA implementation, on any device and dtype.
    - ``"cpu"``: the reference backend with float32 and bfloat16 CPU decode rows run by the
      native paged kernel, built now (see :mod:`local_engine.attention.native`).
    - ``"triton"``: the Triton paged kernels (:mod:`.triton_backend`), for CUDA devices
      (and CPU under ``TRITON_INTERPRET=1``, for tests).
    - ``"auto"``: on a CUDA device, ``"triton"`` where triton is installed (else
      ``"reference"``); elsewhere the ``"cpu"`` backend, building its kernel only when the
      first decode row it can take arrives, and running every row on the reference path
      where the kernel cannot be built. Rows the kernel does not take (float16) run on the
      reference path either way.

    Raises:
        EngineConfigError: ``name`` is not a known backend, ``"cpu"`` was asked for and
            the kernel cannot be built here, or ``"triton"`` without triton installed.
    """
    if name == "reference":
        return ReferenceAttention()
    if name == "triton":
        return TritonPagedAttention()
    if name == "auto":
        if device is not None and torch.device(device).type == "cuda":
            return TritonPagedAttention() if triton_available() else ReferenceAttention()
        return CPUPagedAttention()
    if name == "cpu":
        kernel = load_paged_decode()
        if kernel is None:
            raise EngineConfigError(
                "the 'cpu' attention backend needs its native kernel, which could not be "
                f"built here (no working C compiler, or {DISABLE_ENV}=0); use 'auto' or "
                "'reference'"
            )
        return CPUPagedAttention(kernel)
    raise EngineConfigError(
        f"unknown attention backend {name!r}: expected one of {', '.join(BACKEND_NAMES)}"
    )
