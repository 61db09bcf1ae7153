"""The attention seam: per-step metadata and the protocol every backend implements.

A step's new tokens are laid out flat (``T`` tokens for ``B`` sequences). Sequence ``b`` owns
tokens ``query_start_loc[b]:query_start_loc[b + 1]``; they are always the LAST ``query_len``
positions of its context. Cache position ``p`` of sequence ``b`` lives in block
``block_tables[b, p // block_size]`` at offset ``p % block_size``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from local_engine.errors import EngineConfigError

__all__ = ["AttentionBackend", "AttentionMetadata", "build_attention_metadata", "slot_mapping"]


@dataclass
class AttentionMetadata:
    """Where each new token goes in the paged KV cache and what it may attend to.

    ``derived`` is scratch space for backends to memoize tensors computed from this step's
    metadata (gather indices, masks) once for all layers; :class:`DecoderModel` clears it at
    the start of every forward, so reusing one metadata object across steps is safe.
    """

    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    context_lens: torch.Tensor
    query_start_loc: torch.Tensor
    query_lens_host: list[int]
    context_lens_host: list[int]
    max_query_len: int
    max_context_len: int
    derived: dict[object, object] = field(default_factory=dict, repr=False, compare=False)


class AttentionBackend(Protocol):
    """Paged attention: store this step's keys/values, then attend causally over the cache."""

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
        """Write ``k``/``v`` at ``meta.slot_mapping`` and return attention output.

        Args:
            q: ``[T, num_heads, head_dim]``.
            k: ``[T, num_kv_heads, head_dim]``.
            v: ``[T, num_kv_heads, head_dim]``.
            kv_cache: ``[2, num_blocks, block_size, num_kv_heads, head_dim]``.
            meta: the step's layout.
            scale: softmax scale (``head_dim ** -0.5`` for the supported families).
            sliding_window: when set, a token at position ``p`` sees only positions
                ``> p - sliding_window``.

        Returns:
            ``[T, num_heads, head_dim]``.
        """
        ...


def slot_mapping(
    block_tables: Sequence[Sequence[int]],
    context_lens: Sequence[int],
    query_lens: Sequence[int],
    *,
    block_size: int,
) -> list[int]:
    """The cache slot (``block * block_size + offset``) of every new token, in step order;
    the caller has checked that each table covers its context."""
    slots: list[int] = []
    for table, ctx, qlen in zip(block_tables, context_lens, query_lens, strict=True):
        pos = ctx - qlen
        while pos < ctx:  # one range per block touched
            offset = pos % block_size
            take = min(block_size - offset, ctx - pos)
            base = table[pos // block_size] * block_size + offset
            slots.extend(range(base, base + take))
            pos += take
    return slots


def build_attention_metadata(
    block_tables: Sequence[Sequence[int]],
    context_lens: Sequence[int],
    query_lens: Sequence[int],
    *,
    block_size: int,
    device: str | torch.device = "cpu",
) -> AttentionMetadata:
    """Build step metadata from host lists (one entry per sequence in the batch).

    Raises:
        EngineConfigError: lengths disagree, a query is longer than its context, or a
            block table is too short for its context.
    """
    if not (len(block_tables) == len(context_lens) == len(query_lens)) or not block_tables:
        raise EngineConfigError(
            "block_tables, context_lens and query_lens must be non-empty and equal in length"
        )
    if block_size <= 0:
        raise EngineConfigError(f"block_size must be positive, got {block_size}")
    starts = [0]
    for table, ctx, qlen in zip(block_tables, context_lens, query_lens, strict=True):
        if not 0 < qlen <= ctx:
            raise EngineConfigError(f"query_len {qlen} must be in 1..context_len ({ctx})")
        if len(table) * block_size < ctx:
            raise EngineConfigError(f"{len(table)} blocks cannot hold {ctx} tokens")
        starts.append(starts[-1] + qlen)
    slots = slot_mapping(block_tables, context_lens, query_lens, block_size=block_size)
    width = max(len(t) for t in block_tables)
    padded = [list(t) + [0] * (width - len(t)) for t in block_tables]
    return AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        block_tables=torch.tensor(padded, dtype=torch.int32, device=device),
        context_lens=torch.tensor(list(context_lens), dtype=torch.int32, device=device),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        query_lens_host=list(query_lens),
        context_lens_host=list(context_lens),
        max_query_len=max(query_lens),
        max_context_len=max(context_lens),
    )
