"""CPU attention: the reference backend, with decode rows run by the native paged kernel.

Decode (one new token per sequence) dominates a busy engine's attention time, and the
reference path spends most of it copying each sequence's key/value blocks into a contiguous
buffer before SDPA reads them again. The kernel in ``csrc/paged_decode.c`` reads keys and
values where they lie in the paged cache, once. Prefill (many query tokens per sequence) is
matrix-shaped work that SDPA already does well, so it stays on the reference path, as do
decode rows the kernel does not take (float16 or non-CPU tensors, more than ``MAX_HEADS``
query heads) and every row when the kernel is unavailable. The kernel takes float32 and
bfloat16 (converted as it loads, computed in float32).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from .base import AttentionMetadata
from .native import KERNEL_DTYPES, MAX_HEADS, KernelError, PagedDecodeKernel, load_paged_decode
from .reference import ReferenceAttention, _Decode

__all__ = ["CPUPagedAttention"]

logger = logging.getLogger("local_engine")


class CPUPagedAttention(ReferenceAttention):
    """:class:`ReferenceAttention` with float32 and bfloat16 CPU decode rows run by the native
    kernel."""

    name = "cpu"

    def __init__(
        self,
        kernel: PagedDecodeKernel | None = None,
        *,
        loader: Callable[[], PagedDecodeKernel | None] = load_paged_decode,
    ) -> None:
        """Use ``kernel``, or load one with ``loader`` when the first decode row it can take
        arrives (so a GPU or float16 model never builds it)."""
        super().__init__()
        self._kernel = kernel
        self._loader: Callable[[], PagedDecodeKernel | None] | None = (
            None if kernel is not None else loader
        )
        self._failed = False

    @property
    def kernel(self) -> PagedDecodeKernel | None:
        """The kernel, loaded on first use; ``None`` where it cannot be built."""
        if self._loader is not None:
            self._kernel, self._loader = self._loader(), None
        return self._kernel

    def _decode(
        self,
        q: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        decode: _Decode,
        scale: float,
        window: int | None,
    ) -> torch.Tensor:
        kernel = self.kernel if _kernel_takes(q, kv_cache, decode) else None
        if kernel is None:
            return super()._decode(q, kv_cache, meta, decode, scale, window)
        rows, heads, dim = q.shape
        block_size, kv_heads = kv_cache.shape[2], kv_cache.shape[3]
        tables = decode.blocks.contiguous()
        lens = decode.context_lens.contiguous()
        out = torch.empty((rows, heads, dim), dtype=q.dtype, device=q.device)
        try:
            kernel(
                q=q.data_ptr(),
                q_strides=(q.stride(0), q.stride(1)),
                k=kv_cache[0].data_ptr(),
                v=kv_cache[1].data_ptr(),
                tables=tables.data_ptr(),
                table_stride=decode.width,
                lens=lens.data_ptr(),
                out=out.data_ptr(),
                shape=(rows, heads, kv_heads, dim),
                block_size=block_size,
                window=window or 0,
                max_len=decode.width * block_size,
                num_blocks=kv_cache.shape[1],
                scale=scale,
                threads=torch.get_num_threads(),
                bf16=q.dtype == torch.bfloat16,
            )
        except KernelError as exc:  # e.g. scratch memory refused: this step takes SDPA
            if not self._failed:
                self._failed = True
                logger.warning("%s; this step uses SDPA attention", exc)
            return super()._decode(q, kv_cache, meta, decode, scale, window)
        return out


def _kernel_takes(q: torch.Tensor, kv_cache: torch.Tensor, decode: _Decode) -> bool:
    rows, heads, dim = q.shape
    kv_heads = kv_cache.shape[3]
    return (
        q.device.type == "cpu"
        and kv_cache.device.type == "cpu"
        and q.dtype in KERNEL_DTYPES
        and kv_cache.dtype == q.dtype
        and kv_cache.is_contiguous()
        and q.stride(2) == 1
        and dim == kv_cache.shape[4]
        and heads % kv_heads == 0
        and heads <= MAX_HEADS
        and decode.context_lens.numel() == rows
        and decode.blocks.numel() == rows * decode.width
    )
