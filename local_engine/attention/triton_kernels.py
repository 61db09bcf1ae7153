"""Triton kernels for paged attention: KV store, split-KV decode, and prefill/extend.

Every kernel reads the step's layout from device tensors (slot mapping, block tables,
context lengths, query start offsets), never from host values, so a decode step can be
captured in a CUDA graph and replayed with new contents in the same buffers. Keys and
values are read where they lie in the paged cache ``[2, num_blocks, block_size, kv_heads,
head_dim]``; loads are cast to float32 before any arithmetic (which also keeps the Triton
interpreter, used on CPU in tests, exact for bfloat16 inputs).

- :func:`store_kv`: one program per (token, KV head) copies the token's key and value row
  into its slot; a negative slot (a padded row of a captured batch) writes nothing.
- :func:`paged_decode`: one new token per sequence. Programs are (sequence, KV head,
  split): the query heads of a KV group are one tile, so each key block is loaded once
  for the whole group (GQA), and the context is cut into ``num_splits`` ranges of blocks
  whose partial softmax results a second kernel merges by their log-sum-exp. The split
  count is fixed per call (not derived from this step's lengths), so a graph stays valid.
  A sliding window starts the scan at the window's first block.
- :func:`paged_prefill`: any number of new tokens per sequence (they are the last ones of
  its context). Programs are (sequence, query head, query tile); every key, cached prefix
  and this step's alike, is read through the block table after :func:`store_kv` wrote the
  new ones, under the causal and sliding-window mask.

This module imports :mod:`triton` at import time and decorates its kernels then; the
interpreter (``TRITON_INTERPRET=1``) must be chosen before the first import.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import triton
import triton.language as tl

__all__ = ["DEFAULT_NUM_SPLITS", "INTERPRETING", "paged_decode", "paged_prefill", "store_kv"]

DEFAULT_NUM_SPLITS = 8
"""Context splits of the decode kernel (enough programs to fill a GPU at small batches)."""

_MIN_DOT = 16  # tl.dot needs tiles of at least 16 along each axis on GPUs


def _interpreting() -> bool:
    knobs = getattr(triton, "knobs", None)  # triton >= 3.3 reads its settings there
    if knobs is not None:
        return bool(knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


INTERPRETING = _interpreting()
"""Whether the kernels were decorated for the interpreter (read when this module loads)."""


@triton.jit  # type: ignore[untyped-decorator]
def _store_kv_kernel(  # type: ignore[no-untyped-def]
    k_ptr,
    v_ptr,
    cache_ptr,
    slot_ptr,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    cache_half,
    head_dim,
    kv_heads,
    BLOCK_D: tl.constexpr,
) -> None:
    token = tl.program_id(0)
    head = tl.program_id(1)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    if slot >= 0:
        d = tl.arange(0, BLOCK_D)
        mask = d < head_dim
        key = tl.load(k_ptr + token * stride_kt + head * stride_kh + d, mask=mask)
        value = tl.load(v_ptr + token * stride_vt + head * stride_vh + d, mask=mask)
        dst = (slot * kv_heads + head) * head_dim + d
        tl.store(cache_ptr + dst, key, mask=mask)
        tl.store(cache_ptr + cache_half + dst, value, mask=mask)


@triton.jit  # type: ignore[untyped-decorator]
def _attend_block(  # type: ignore[no-untyped-def]
    q,
    cache_ptr,
    cache_half,
    offs,
    kv_mask,
    allowed,
    m_i,
    l_i,
    acc,
    scale,
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """One online-softmax step: fold the keys/values at ``offs`` into ``(m_i, l_i, acc)``."""
    k = tl.load(cache_ptr + offs, mask=kv_mask, other=0.0)
    v = tl.load(cache_ptr + cache_half + offs, mask=kv_mask, other=0.0)
    if UPCAST:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
    s = tl.where(allowed, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing to see yet
    alpha = tl.exp(m_i - m_safe)
    p = tl.exp(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return m_new, l_i, acc


@triton.jit  # type: ignore[untyped-decorator]
def _decode_split_kernel(  # type: ignore[no-untyped-def]
    q_ptr,
    cache_ptr,
    tables_ptr,
    lens_ptr,
    part_out_ptr,
    part_lse_ptr,
    stride_qt,
    stride_qh,
    table_stride,
    cache_half,
    scale,
    window,
    head_dim,
    kv_heads,
    group,
    num_heads,
    NUM_SPLITS: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_D: tl.constexpr,
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
) -> None:
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    n = tl.arange(0, BLOCK_SIZE)
    g_mask = g < group
    d_mask = d < head_dim
    heads = kv_head * group + g
    ctx = tl.load(lens_ptr + seq)
    first = ctx * 0  # ctx's integer type: compiled Triton keeps one type across the branch
    if window > 0:
        first = tl.maximum(ctx - window, 0)
    first_block = first // BLOCK_SIZE
    num_blocks = (ctx + BLOCK_SIZE - 1) // BLOCK_SIZE - first_block
    per_split = (num_blocks + NUM_SPLITS - 1) // NUM_SPLITS
    lo = first_block + split * per_split
    hi = tl.minimum(lo + per_split, first_block + num_blocks)
    q = tl.load(
        q_ptr + seq * stride_qt + heads[:, None] * stride_qh + d[None, :],
        mask=g_mask[:, None] & d_mask[None, :],
        other=0.0,
    )
    if UPCAST:
        q = q.to(tl.float32)
    m_i = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
    row_stride = kv_heads * head_dim
    for block in range(lo, hi):
        block_id = tl.load(tables_ptr + seq * table_stride + block).to(tl.int64)
        pos = block * BLOCK_SIZE + n
        valid = (pos < ctx) & (pos >= first)
        offs = (block_id * BLOCK_SIZE + n)[:, None] * row_stride + kv_head * head_dim + d[None, :]
        kv_mask = valid[:, None] & d_mask[None, :]
        m_i, l_i, acc = _attend_block(
            q,
            cache_ptr,
            cache_half,
            offs,
            kv_mask,
            valid[None, :],
            m_i,
            l_i,
            acc,
            scale,
            UPCAST,
            PRECISION,
        )
    has = l_i > 0
    safe_l = tl.where(has, l_i, 1.0)
    out = acc / safe_l[:, None]
    lse = tl.where(has, m_i + tl.log(safe_l), float("-inf"))
    part = (seq * num_heads + heads) * NUM_SPLITS + split
    tl.store(
        part_out_ptr + part[:, None] * head_dim + d[None, :],
        out,
        mask=g_mask[:, None] & d_mask[None, :],
    )
    tl.store(part_lse_ptr + part, lse, mask=g_mask)


@triton.jit  # type: ignore[untyped-decorator]
def _decode_merge_kernel(  # type: ignore[no-untyped-def]
    part_out_ptr,
    part_lse_ptr,
    out_ptr,
    stride_ot,
    stride_oh,
    head_dim,
    num_heads,
    NUM_SPLITS: tl.constexpr,
    BLOCK_D: tl.constexpr,
) -> None:
    seq = tl.program_id(0)
    head = tl.program_id(1)
    s = tl.arange(0, NUM_SPLITS)
    d = tl.arange(0, BLOCK_D)
    d_mask = d < head_dim
    base = (seq * num_heads + head) * NUM_SPLITS
    lse = tl.load(part_lse_ptr + base + s)
    top = tl.max(lse, axis=0)
    safe_top = tl.where(top == float("-inf"), 0.0, top)
    weight = tl.where(lse == float("-inf"), 0.0, tl.exp(lse - safe_top))
    total = tl.sum(weight, axis=0)
    parts = tl.load(
        part_out_ptr + (base + s)[:, None] * head_dim + d[None, :], mask=d_mask[None, :], other=0.0
    )
    merged = tl.sum(parts * weight[:, None], axis=0) / tl.where(total > 0, total, 1.0)
    tl.store(
        out_ptr + seq * stride_ot + head * stride_oh + d,
        merged.to(out_ptr.dtype.element_ty),
        mask=d_mask,
    )


@triton.jit  # type: ignore[untyped-decorator]
def _prefill_kernel(  # type: ignore[no-untyped-def]
    q_ptr,
    cache_ptr,
    tables_ptr,
    lens_ptr,
    starts_ptr,
    out_ptr,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    table_stride,
    cache_half,
    scale,
    window,
    head_dim,
    kv_heads,
    group,
    BLOCK_M: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_D: tl.constexpr,
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
) -> None:
    seq = tl.program_id(0)
    head = tl.program_id(1)
    tile = tl.program_id(2)
    q_start = tl.load(starts_ptr + seq)
    q_len = tl.load(starts_ptr + seq + 1) - q_start
    if tile * BLOCK_M < q_len:
        ctx = tl.load(lens_ptr + seq)
        prefix = ctx - q_len
        kv_head = head // group
        m = tl.arange(0, BLOCK_M)
        d = tl.arange(0, BLOCK_D)
        n = tl.arange(0, BLOCK_SIZE)
        d_mask = d < head_dim
        rows = tile * BLOCK_M + m
        row_mask = rows < q_len
        q_pos = prefix + rows
        q = tl.load(
            q_ptr + (q_start + rows)[:, None] * stride_qt + head * stride_qh + d[None, :],
            mask=row_mask[:, None] & d_mask[None, :],
            other=0.0,
        )
        if UPCAST:
            q = q.to(tl.float32)
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        last = tl.minimum(prefix + (tile + 1) * BLOCK_M, ctx)  # one past the tile's last key
        first = prefix * 0  # prefix's integer type, as in the branch below
        if window > 0:
            first = tl.maximum(prefix + tile * BLOCK_M - window + 1, 0)
        row_stride = kv_heads * head_dim
        for block in range(first // BLOCK_SIZE, (last + BLOCK_SIZE - 1) // BLOCK_SIZE):
            block_id = tl.load(tables_ptr + seq * table_stride + block).to(tl.int64)
            k_pos = block * BLOCK_SIZE + n
            k_valid = k_pos < ctx
            offs = (block_id * BLOCK_SIZE + n)[:, None] * row_stride + kv_head * head_dim
            offs = offs + d[None, :]
            kv_mask = k_valid[:, None] & d_mask[None, :]
            allowed = k_valid[None, :] & (k_pos[None, :] <= q_pos[:, None])
            if window > 0:
                allowed = allowed & (k_pos[None, :] > q_pos[:, None] - window)
            m_i, l_i, acc = _attend_block(
                q,
                cache_ptr,
                cache_half,
                offs,
                kv_mask,
                allowed,
                m_i,
                l_i,
                acc,
                scale,
                UPCAST,
                PRECISION,
            )
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(
            out_ptr + (q_start + rows)[:, None] * stride_ot + head * stride_oh + d[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=row_mask[:, None] & d_mask[None, :],
        )


def _pow2(n: int, floor: int = 1) -> int:
    return max(floor, int(triton.next_power_of_2(n)))


def _numerics(dtype: torch.dtype) -> dict[str, Any]:
    """float32 (and everything under the interpreter) computes in float32 with exact
    products; half types feed their own dtype to the tensor cores, accumulating in float32."""
    upcast = dtype == torch.float32 or INTERPRETING
    return {"UPCAST": upcast, "PRECISION": "ieee" if upcast else "tf32"}


def store_kv(k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, slots: torch.Tensor) -> None:
    """Write ``k``/``v`` ``[T, kv_heads, head_dim]`` into ``kv_cache`` at ``slots`` ``[T]``
    (flat ``block * block_size + offset``; negative slots are skipped)."""
    tokens, kv_heads, head_dim = k.shape
    if tokens == 0:
        return
    _store_kv_kernel[(tokens, kv_heads)](
        k,
        v,
        kv_cache,
        slots,
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        kv_cache[0].numel(),
        head_dim,
        kv_heads,
        BLOCK_D=_pow2(head_dim),
    )


def paged_decode(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    *,
    scale: float,
    window: int | None,
    num_splits: int = DEFAULT_NUM_SPLITS,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of one new token per sequence over its paged context.

    Args:
        q: ``[B, num_heads, head_dim]``; ``head_dim`` stride 1.
        kv_cache: ``[2, num_blocks, block_size, kv_heads, head_dim]``, contiguous.
        block_tables: ``[B, width]`` int32 block ids.
        context_lens: ``[B]`` int32; a row with length 0 yields zeros.
        scale: the softmax scale.
        window: sliding window, or None.
        num_splits: context ranges per sequence (a power of two).
        out: where to write ``[B, num_heads, head_dim]`` (a new tensor when None).
    """
    rows, num_heads, head_dim = q.shape
    kv_heads, block_size = kv_cache.shape[3], kv_cache.shape[2]
    group = num_heads // kv_heads
    if out is None:
        out = torch.empty_like(q)
    part_out = torch.empty(
        (rows, num_heads, num_splits, head_dim), dtype=torch.float32, device=q.device
    )
    part_lse = torch.empty((rows, num_heads, num_splits), dtype=torch.float32, device=q.device)
    block_d = _pow2(head_dim, _MIN_DOT)
    _decode_split_kernel[(rows, kv_heads, num_splits)](
        q,
        kv_cache,
        block_tables,
        context_lens,
        part_out,
        part_lse,
        q.stride(0),
        q.stride(1),
        block_tables.stride(0),
        kv_cache[0].numel(),
        scale,
        window or 0,
        head_dim,
        kv_heads,
        group,
        num_heads,
        NUM_SPLITS=num_splits,
        BLOCK_SIZE=block_size,
        BLOCK_G=_pow2(group, _MIN_DOT),
        BLOCK_D=block_d,
        **_numerics(q.dtype),
    )
    _decode_merge_kernel[(rows, num_heads)](
        part_out,
        part_lse,
        out,
        out.stride(0),
        out.stride(1),
        head_dim,
        num_heads,
        NUM_SPLITS=num_splits,
        BLOCK_D=block_d,
    )
    return out


def paged_prefill(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    max_query_len: int,
    *,
    scale: float,
    window: int | None,
    block_m: int = 32,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of each sequence's new tokens (its last ones) over its paged context.

    Args:
        q: ``[T, num_heads, head_dim]``, sequences laid out by ``query_start_loc`` ``[B + 1]``.
        kv_cache: as for :func:`paged_decode`; this step's keys must be stored already.
        block_tables: ``[B, width]`` int32.
        context_lens: ``[B]`` int32.
        query_start_loc: ``[B + 1]`` int32 offsets into ``q``.
        max_query_len: the longest query (sizes the launch grid).
        scale: the softmax scale.
        window: sliding window, or None.
        block_m: query rows per program (a power of two, at least 16).
        out: where to write ``[T, num_heads, head_dim]`` (a new tensor when None).
    """
    num_heads, head_dim = q.shape[1], q.shape[2]
    kv_heads, block_size = kv_cache.shape[3], kv_cache.shape[2]
    if out is None:
        out = torch.empty_like(q)
    rows = block_tables.shape[0]
    tiles = triton.cdiv(max_query_len, block_m)
    _prefill_kernel[(rows, num_heads, tiles)](
        q,
        kv_cache,
        block_tables,
        context_lens,
        query_start_loc,
        out,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        block_tables.stride(0),
        kv_cache[0].numel(),
        scale,
        window or 0,
        head_dim,
        kv_heads,
        num_heads // kv_heads,
        BLOCK_M=block_m,
        BLOCK_SIZE=block_size,
        BLOCK_D=_pow2(head_dim, _MIN_DOT),
        **_numerics(q.dtype),
    )
    return out
