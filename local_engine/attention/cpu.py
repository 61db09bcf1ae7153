"""CPU attention: the reference backend, with decode rows run by the native paged kernel.

Decode (one new token per sequence) dominates a busy engine's attention time, and the
reference path spends most of it copying each sequence's key/value blocks into a contiguous
buffer before SDPA reads them again. The kernel in ``csrc/paged_decode.c`` reads keys and
values where they lie in the paged cache, once. The kernel takes float32 and bfloat16
(float32 sums; for head sizes 32, 64 and 128 with bfloat16 dot products). Prefill (many
query tokens per sequence) in bfloat16 with head size 32, 64 or 128 runs in the library's
flash-attention loop over the paged cache (``swift_prefill_attention_bf16``: all prefilling
sequences of a step in one call, their causal blocks shared out over the threads), which on
the development machine's AVX-512 BF16 cores takes 0.4x of SDPA's time for a 1,044-token
prompt; other prefills stay on the reference path (SDPA), as do decode rows the kernel does
not take (float16 or non-CPU tensors, more than ``MAX_HEADS`` query heads) and every row
when the kernel is unavailable.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from .base import AttentionMetadata
from .native import (
    KERNEL_DTYPES,
    MAX_HEADS,
    PREFILL_DIMS,
    KernelError,
    PagedDecodeKernel,
    load_paged_decode,
    rotary_layout,
)
from .reference import ReferenceAttention, _Decode, _plan_for, _Prefill

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
        self._prefill_failed = False

    @property
    def kernel(self) -> PagedDecodeKernel | None:
        """The kernel, loaded on first use; ``None`` where it cannot be built."""
        if self._loader is not None:
            self._kernel, self._loader = self._loader(), None
        return self._kernel

    def _prefill_rows(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        prefills: tuple[_Prefill, ...],
        out: torch.Tensor,
        scale: float,
        window: int | None,
    ) -> None:
        """The step's prefilling sequences in one native call where the kernel takes them,
        else SDPA per sequence (the reference path)."""
        if prefills and self._native_prefill(q, kv_cache, meta, prefills, out, scale, window):
            return
        super()._prefill_rows(q, k, v, kv_cache, meta, prefills, out, scale, window)

    def _native_prefill(
        self,
        q: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        prefills: tuple[_Prefill, ...],
        out: torch.Tensor,
        scale: float,
        window: int | None,
    ) -> bool:
        rows, heads, dim = q.shape
        kv_heads = kv_cache.shape[3]
        if not (
            q.device.type == "cpu"
            and q.dtype == torch.bfloat16
            and kv_cache.dtype == torch.bfloat16
            and kv_cache.is_contiguous()
            and out.is_contiguous()
            and q.stride(2) == 1
            and dim in PREFILL_DIMS
            and dim == kv_cache.shape[4]
            and heads % kv_heads == 0
            and not self._prefill_failed
        ):
            return False
        kernel = self.kernel
        if kernel is None or getattr(kernel, "prefill_bf16", False) is not True:
            return False  # no kernel here, or one without the prefill loop (a test double)
        tables, seqs = _prefill_arguments(meta, prefills)
        try:
            return kernel.prefill_attention(
                q=q.data_ptr(),
                q_strides=(q.stride(0), q.stride(1)),
                k=kv_cache[0].data_ptr(),
                v=kv_cache[1].data_ptr(),
                tables=tables.data_ptr(),
                table_stride=tables.shape[1],
                seqs=seqs.data_ptr(),
                num_seqs=len(prefills),
                out=out.data_ptr(),
                shape=(rows, heads, kv_heads, dim),
                block_size=kv_cache.shape[2],
                window=window or 0,
                num_blocks=kv_cache.shape[1],
                scale=scale,
                threads=torch.get_num_threads(),
            )
        except KernelError as exc:
            # Out of scratch memory, or a block id outside the cache: SDPA redoes the rows
            # (and reports a bad table itself).
            if not self._prefill_failed:
                self._prefill_failed = True
                logger.warning("%s; prefill attention takes the SDPA path", exc)
            return False

    def rope_decode(
        self,
        qkv: torch.Tensor,
        heads: int,
        norm_weight: torch.Tensor | None,
        eps: float,
        rotary: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        *,
        scale: float,
        sliding_window: int | None,
    ) -> torch.Tensor | None:
        """A decode step's rotary embedding, KV write and attention in one native call.

        ``qkv`` ``[T, heads + 2 * kv_heads, head_dim]`` is the fused projection's output (a
        view is fine: each head contiguous); ``norm_weight`` the per-head q/k norm where the
        model has one (``[head_dim]``, or ``[heads + kv_heads, head_dim]``); ``rotary`` the
        ``(positions [T] int64, cos, sin)`` with the half-width ``[max_pos, head_dim / 2]``
        tables. The result is bit-identical to normalizing and rotating the query and key
        heads, then :meth:`forward` with them and the value heads, and so is what lands in
        ``kv_cache``.

        Returns:
            ``[T, heads, head_dim]``, or None where the fused kernel does not take the step,
            having written nothing: a step with a prefill, rows that read a block another
            row writes to (the kernel writes and reads row by row, where :meth:`forward`
            writes every row first), a slot the metadata puts elsewhere than the row's
            newest position, no kernel, or inputs outside its limits. Also None (logged
            once) where the kernel fails after its checks (scratch memory refused), which
            may have written some rows' keys and values already: the unfused path the
            caller then takes writes the same values there.
        """
        rows, total, dim = qkv.shape
        kv_heads = (total - heads) // 2
        positions, cos, sin = rotary
        if total != heads + 2 * kv_heads or kv_cache.shape[3] != kv_heads:
            return None
        norm_stride = rotary_layout(qkv, heads + kv_heads, norm_weight, cos, sin, positions)
        if norm_stride is None:
            return None
        kernel = self.kernel
        decode = self._fused_step(meta, qkv[:, :heads], kv_cache)
        if kernel is None or decode is None:
            return None
        out = torch.empty((rows, heads, dim), dtype=qkv.dtype, device=qkv.device)
        paged, _alive = _paged(kv_cache, decode, out, heads, sliding_window)
        try:
            kernel.rope_decode(
                scale=scale,
                x=qkv.data_ptr(),
                x_strides=(qkv.stride(0), qkv.stride(1)),
                norm=None if norm_weight is None else norm_weight.data_ptr(),
                norm_stride=norm_stride,
                eps=eps,
                cos=cos.data_ptr(),
                sin=sin.data_ptr(),
                positions=positions.data_ptr(),
                max_pos=cos.shape[0],
                **paged,
            )
        except KernelError as exc:
            # Out of scratch memory, or a position outside the tables: the unfused path
            # redoes the step (rewriting any slot written here with the same values) and
            # reports what is wrong.
            if not self._failed:
                self._failed = True
                logger.warning("%s; this step takes the unfused path", exc)
            return None
        return out

    def decode_step(
        self, meta: AttentionMetadata, kv_cache: torch.Tensor, rows: int, heads: int
    ) -> tuple[dict[str, Any], tuple[torch.Tensor, ...]] | None:
        """The cache-independent arguments of a decode step's fused kernel calls, for a
        whole-layer call (:func:`local_engine.model` runs every layer of such a step in one
        native call each), and the tensors they point into; None where :meth:`rope_decode`
        would decline the step (the same checks, on the first layer's cache: every layer's
        has the same shape). ``rows`` is the step's token count, ``heads`` the query heads."""
        probe = torch.empty((rows, heads, kv_cache.shape[4]), dtype=kv_cache.dtype)
        decode = self._fused_step(meta, probe, kv_cache)
        if self.kernel is None or decode is None:
            return None
        tables = decode.blocks.contiguous()
        lens = decode.context_lens.contiguous()
        block_size = kv_cache.shape[2]
        arguments = {
            "tables": tables.data_ptr(),
            "table_stride": decode.width,
            "lens": lens.data_ptr(),
            "block_size": block_size,
            "max_len": decode.width * block_size,
            "num_blocks": kv_cache.shape[1],
        }
        return arguments, (tables, lens)

    def _fused_step(
        self, meta: AttentionMetadata, q: torch.Tensor, kv_cache: torch.Tensor
    ) -> _Decode | None:
        """The step's decode plan where the fused kernel takes it for queries shaped like
        ``q`` ``[T, heads, dim]``: decode rows only, within the kernel's limits, no row
        reading a block another row writes; else None."""
        decode = _plan_for(meta, kv_cache.shape[2]).decode
        if (
            decode is None
            or decode.tokens is not None
            or not _kernel_takes(q, kv_cache, decode)
            or not _rows_independent(meta, decode, kv_cache.shape[2])
        ):
            return None
        return decode

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
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        paged, _alive = _paged(kv_cache, decode, out, q.shape[1], window)
        try:
            kernel(q=q.data_ptr(), q_strides=(q.stride(0), q.stride(1)), scale=scale, **paged)
        except KernelError as exc:  # e.g. scratch memory refused: this step takes SDPA
            if not self._failed:
                self._failed = True
                logger.warning("%s; this step uses SDPA attention", exc)
            return super()._decode(q, kv_cache, meta, decode, scale, window)
        return out


def _paged(
    kv_cache: torch.Tensor, decode: _Decode, out: torch.Tensor, heads: int, window: int | None
) -> tuple[dict[str, Any], tuple[torch.Tensor, ...]]:
    """The decode kernels' cache, table, output and size arguments, and the tensors their
    pointers point into (the caller keeps them alive through the call)."""
    tables = decode.blocks.contiguous()
    lens = decode.context_lens.contiguous()
    block_size = kv_cache.shape[2]
    arguments = {
        "k": kv_cache[0].data_ptr(),
        "v": kv_cache[1].data_ptr(),
        "tables": tables.data_ptr(),
        "table_stride": decode.width,
        "lens": lens.data_ptr(),
        "out": out.data_ptr(),
        "shape": (out.shape[0], heads, kv_cache.shape[3], out.shape[2]),
        "block_size": block_size,
        "window": window or 0,
        "max_len": decode.width * block_size,
        "num_blocks": kv_cache.shape[1],
        "threads": torch.get_num_threads(),
        "bf16": out.dtype == torch.bfloat16,
    }
    return arguments, (tables, lens)


def _prefill_arguments(
    meta: AttentionMetadata, prefills: tuple[_Prefill, ...]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The prefill kernel's int64 block tables and its ``[len(prefills), 4]`` sequence rows
    (first query row, query count, context length, table row), made once per step."""
    key = "cpu.prefill"
    known = meta.derived.get(key)
    if isinstance(known, tuple):
        return known
    tables = meta.block_tables.to(torch.int64).contiguous()
    rows = [[seq.start, seq.end - seq.start, seq.context_len, seq.row] for seq in prefills]
    meta.derived[key] = made = (tables, torch.tensor(rows, dtype=torch.int64))
    return made


def _rows_independent(meta: AttentionMetadata, decode: _Decode, block_size: int) -> bool:
    """Whether no row reads the block another row writes its new token to in this step (the
    fused call writes and reads row by row, where :meth:`ReferenceAttention.forward` writes
    every row first). Rows of different sequences never do: a sequence writes to its last,
    partly filled block, which is its own. One sequence's draft positions laid out as rows
    of their own (speculative verification) share blocks, and take the unfused path. Worked
    out once per step."""
    key = "cpu.rows_independent"
    known = meta.derived.get(key)
    if isinstance(known, bool):
        return known
    meta.derived[key] = independent = _independent(meta, decode, block_size)
    return independent


def _independent(meta: AttentionMetadata, decode: _Decode, block_size: int) -> bool:
    width = decode.width
    lens = decode.context_lens
    if bool((lens < 1).any()):  # padding rows (they write nothing): the unfused path
        return False
    tables = decode.blocks.view(-1, width)
    last = (lens - 1) // block_size
    written = tables.gather(1, last[:, None]).squeeze(1)
    slots = written * block_size + (lens - 1) % block_size
    if not torch.equal(slots, meta.slot_mapping.to(torch.int64)):
        return False  # the metadata puts a token elsewhere than its newest position
    used = tables[torch.arange(width, device=lens.device)[None, :] <= last[:, None]]
    if bool((used < 0).any()):  # the unfused path reports these
        return False
    counts = torch.bincount(used, minlength=int(written.max()) + 1)
    return bool((counts[written] == 1).all())


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
