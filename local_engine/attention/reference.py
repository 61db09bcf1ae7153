"""CPU reference attention: SDPA over key/value blocks gathered from the paged cache.

Decode sequences (one new token each) are batched into one SDPA call over their blocks,
padded to the longest context with a mask; the query heads of each KV group ride along as
the query axis, so GQA needs no key/value repetition. Prefill sequences run one SDPA each
(the CPU backend runs bfloat16 ones in a native kernel instead).
Everything derived from the step's metadata is computed once, on the first layer, and
reused by the rest; gathers land in reusable scratch buffers rather than fresh allocations.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .base import AttentionMetadata

__all__ = ["ReferenceAttention"]

_PLAN_KEY = "reference.plan"


@dataclass(frozen=True)
class _Prefill:
    row: int
    start: int
    end: int
    context_len: int


@dataclass(frozen=True)
class _Decode:
    """The step's single-token sequences, attended together in one SDPA call."""

    tokens: torch.Tensor | None  # token indices of the rows; None when every row decodes
    blocks: torch.Tensor  # [rows * width] int64 block ids, padded rows included
    context_lens: torch.Tensor  # [rows] int64
    width: int  # blocks gathered per row
    uniform_len: int | None  # the shared context length when all rows agree


@dataclass(frozen=True)
class _Plan:
    decode: _Decode | None
    prefills: tuple[_Prefill, ...]


class ReferenceAttention:
    """Portable attention backend built on ``torch.nn.functional.scaled_dot_product_attention``."""

    name = "reference"

    def __init__(self) -> None:
        """Create a backend with empty scratch buffers (they grow on first use)."""
        self._scratch: dict[tuple[int, torch.dtype, torch.device], torch.Tensor] = {}

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        *,
        scale: float,
        sliding_window: int | None,
    ) -> torch.Tensor:
        """Write ``k``/``v`` into ``kv_cache`` and attend; see :class:`AttentionBackend`."""
        num_kv_heads, head_dim = kv_cache.shape[-2], kv_cache.shape[-1]
        flat = kv_cache.view(2, -1, num_kv_heads, head_dim)
        flat[0].index_copy_(0, meta.slot_mapping, k)
        flat[1].index_copy_(0, meta.slot_mapping, v)
        plan = _plan_for(meta, kv_cache.shape[2])
        decode = plan.decode
        if decode is not None and decode.tokens is None:
            return self._decode(q, kv_cache, meta, decode, scale, sliding_window)
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        if decode is not None and decode.tokens is not None:
            out[decode.tokens] = self._decode(
                q[decode.tokens], kv_cache, meta, decode, scale, sliding_window
            )
        self._prefill_rows(q, k, v, kv_cache, meta, plan.prefills, out, scale, sliding_window)
        return out

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
        """Write the attention output of every prefilling sequence's rows into ``out``
        (contiguous, shaped as ``q``), one SDPA call per sequence."""
        for seq in prefills:
            out[seq.start : seq.end] = self._prefill(q, k, v, kv_cache, meta, seq, scale, window)

    def _decode(
        self,
        q: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        decode: _Decode,
        scale: float,
        window: int | None,
    ) -> torch.Tensor:
        rows, num_heads, head_dim = q.shape
        num_kv_heads = kv_cache.shape[-2]
        block_size = kv_cache.shape[2]
        keys, values = self._gather(kv_cache, decode.blocks)
        span = decode.width * block_size
        keys = keys.view(rows, span, num_kv_heads, head_dim).transpose(1, 2)
        values = values.view(rows, span, num_kv_heads, head_dim).transpose(1, 2)
        mask: torch.Tensor | None = None
        uniform = decode.uniform_len
        if uniform is not None:
            # Every row sees the same span: slice it out instead of masking.
            first = 0 if window is None else max(0, uniform - window)
            keys, values = keys[:, :, first:uniform], values[:, :, first:uniform]
        else:
            mask = _memo(meta, ("decode_mask", window), lambda: _decode_mask(decode, span, window))
        grouped = q.view(rows, num_kv_heads, num_heads // num_kv_heads, head_dim)
        out = F.scaled_dot_product_attention(grouped, keys, values, attn_mask=mask, scale=scale)
        return out.reshape(rows, num_heads, head_dim)

    def _prefill(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        seq: _Prefill,
        scale: float,
        window: int | None,
    ) -> torch.Tensor:
        query = q[seq.start : seq.end].transpose(0, 1).unsqueeze(0)
        query_len = seq.end - seq.start
        if query_len == seq.context_len:
            keys = k[seq.start : seq.end].transpose(0, 1).unsqueeze(0)
            values = v[seq.start : seq.end].transpose(0, 1).unsqueeze(0)
        else:
            block_size = kv_cache.shape[2]
            num_blocks = -(-seq.context_len // block_size)
            ids = meta.block_tables[seq.row, :num_blocks].to(torch.int64)
            gathered_k, gathered_v = self._gather(kv_cache, ids)
            shape = (num_blocks * block_size, kv_cache.shape[-2], kv_cache.shape[-1])
            keys = gathered_k.view(shape)[: seq.context_len].transpose(0, 1).unsqueeze(0)
            values = gathered_v.view(shape)[: seq.context_len].transpose(0, 1).unsqueeze(0)
        if query_len == seq.context_len and (window is None or window >= query_len):
            out = F.scaled_dot_product_attention(
                query, keys, values, is_causal=True, scale=scale, enable_gqa=True
            )
        else:
            mask = _memo(
                meta,
                ("prefill_mask", seq.row, window),
                lambda: _prefill_mask(query_len, seq.context_len, window, q.device),
            )
            out = F.scaled_dot_product_attention(
                query, keys, values, attn_mask=mask, scale=scale, enable_gqa=True
            )
        return out[0].transpose(0, 1)

    def _gather(
        self, kv_cache: torch.Tensor, ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Copy whole blocks ``ids`` of keys and values into reusable scratch buffers."""
        shape = (ids.numel(), *kv_cache.shape[2:])
        keys = self._buffer(0, shape, kv_cache)
        values = self._buffer(1, shape, kv_cache)
        torch.index_select(kv_cache[0], 0, ids, out=keys)
        torch.index_select(kv_cache[1], 0, ids, out=values)
        return keys, values

    def _buffer(self, slot: int, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        key = (slot, like.dtype, like.device)
        numel = 1
        for size in shape:
            numel *= size
        buf = self._scratch.get(key)
        if buf is None or buf.numel() < numel:
            buf = torch.empty(numel, dtype=like.dtype, device=like.device)
            self._scratch[key] = buf
        return buf[:numel].view(shape)


def _memo(meta: AttentionMetadata, key: object, build: Callable[[], torch.Tensor]) -> torch.Tensor:
    """Build a per-step tensor on the first layer that asks, reuse it on the others."""
    cached = meta.derived.get(key)
    if isinstance(cached, torch.Tensor):
        return cached
    tensor = build()
    meta.derived[key] = tensor
    return tensor


def _plan_for(meta: AttentionMetadata, block_size: int) -> _Plan:
    cached = meta.derived.get(_PLAN_KEY)
    if isinstance(cached, _Plan):
        return cached
    plan = _make_plan(meta, block_size)
    meta.derived[_PLAN_KEY] = plan
    return plan


def _make_plan(meta: AttentionMetadata, block_size: int) -> _Plan:
    device = meta.block_tables.device
    decode_rows: list[int] = []
    decode_starts: list[int] = []
    prefills: list[_Prefill] = []
    start = 0
    for row, (query_len, context_len) in enumerate(
        zip(meta.query_lens_host, meta.context_lens_host, strict=True)
    ):
        if query_len == 1:
            decode_rows.append(row)
            decode_starts.append(start)
        else:
            prefills.append(_Prefill(row, start, start + query_len, context_len))
        start += query_len
    if not decode_rows:
        return _Plan(None, tuple(prefills))
    lens = [meta.context_lens_host[r] for r in decode_rows]
    width = -(-max(lens) // block_size)
    if not prefills:
        tables = meta.block_tables[:, :width]
        context_lens = meta.context_lens
        tokens = None
    else:
        rows = torch.tensor(decode_rows, dtype=torch.int64, device=device)
        tables = meta.block_tables.index_select(0, rows)[:, :width]
        context_lens = meta.context_lens.index_select(0, rows)
        tokens = torch.tensor(decode_starts, dtype=torch.int64, device=device)
    decode = _Decode(
        tokens=tokens,
        blocks=tables.reshape(-1).to(torch.int64),
        context_lens=context_lens.to(torch.int64),
        width=width,
        uniform_len=lens[0] if min(lens) == max(lens) else None,
    )
    return _Plan(decode, tuple(prefills))


def _decode_mask(decode: _Decode, span: int, window: int | None) -> torch.Tensor:
    """``[rows, 1, 1, span]`` True where a decode token may attend."""
    lens = decode.context_lens[:, None]
    positions = torch.arange(span, device=lens.device)[None, :]
    mask = positions < lens
    if window is not None:
        mask &= positions >= lens - window
    return mask[:, None, None, :]


def _prefill_mask(
    query_len: int, context_len: int, window: int | None, device: torch.device
) -> torch.Tensor:
    """``[query_len, context_len]`` True where query ``i`` (the last ones) may attend."""
    query_pos = torch.arange(context_len - query_len, context_len, device=device)[:, None]
    key_pos = torch.arange(context_len, device=device)[None, :]
    mask = key_pos <= query_pos
    if window is not None:
        mask &= key_pos > query_pos - window
    return mask
