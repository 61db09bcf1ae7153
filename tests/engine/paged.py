"""A minimal paged-cache driver for model tests: what an engine runner does, in a few lines.

Blocks are handed out from a shuffled free list, so a sequence's blocks are scattered
through the cache and attention must follow its block table.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F

from local_engine.attention import build_attention_metadata
from local_engine.model import DecoderModel
from local_engine.quant import DEQUANT_ROWS

__all__ = ["PagedRunner", "logit_agreement", "random_tokens", "stepped_logits"]


class PagedRunner:
    """Feed tokens of several sequences through one model forward per :meth:`step`."""

    def __init__(
        self, model: DecoderModel, *, block_size: int = 4, num_blocks: int = 64, seed: int = 0
    ) -> None:
        """Allocate the model's paged KV cache and a shuffled block free list."""
        self.model = model
        self.block_size = block_size
        self.kv_caches = model.make_kv_cache(num_blocks, block_size)
        self._free = list(range(num_blocks))
        random.Random(seed).shuffle(self._free)
        self.tables: dict[str, list[int]] = {}
        self.lengths: dict[str, int] = {}

    def step(self, chunks: Mapping[str, Sequence[int]]) -> dict[str, torch.Tensor]:
        """Run every sequence's new tokens in ONE forward; return float32 logits per sequence."""
        ids: list[int] = []
        positions: list[int] = []
        tables, context_lens, query_lens = [], [], []
        for seq_id, tokens in chunks.items():
            start = self.lengths.get(seq_id, 0)
            end = start + len(tokens)
            table = self.tables.setdefault(seq_id, [])
            while len(table) * self.block_size < end:
                table.append(self._free.pop())
            self.lengths[seq_id] = end
            ids.extend(tokens)
            positions.extend(range(start, end))
            tables.append(table)
            context_lens.append(end)
            query_lens.append(len(tokens))
        device = self.model.device
        meta = build_attention_metadata(
            tables, context_lens, query_lens, block_size=self.block_size, device=device
        )
        hidden = self.model(
            torch.tensor(ids, dtype=torch.int64, device=device),
            torch.tensor(positions, dtype=torch.int64, device=device),
            self.kv_caches,
            meta,
        )
        logits = self.model.compute_logits(hidden)
        return dict(zip(chunks, torch.split(logits, query_lens), strict=True))


def scattered_tables(lens: Sequence[int], block: int, seed: int) -> tuple[list[list[int]], int]:
    """Block tables for sequences of ``lens`` tokens, their blocks shuffled over a cache of
    three blocks more than they need; returns the tables and the cache's block count."""
    rng = random.Random(seed)
    need = sum(-(-n // block) for n in lens)
    free = list(range(need + 3))
    rng.shuffle(free)
    return [[free.pop() for _ in range(-(-n // block))] for n in lens], need + 3


def random_tokens(n: int, seed: int) -> list[int]:
    """``n`` token ids in [3, 256), reproducible from ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, 256, (n,), generator=gen).tolist()


def stepped_logits(model: DecoderModel, ids: list[int]) -> torch.Tensor:
    """Float32 logits of every position of ``ids``: one prefill longer than DEQUANT_ROWS (the
    dequantize-then-matmul path of quantized weights), then one decode step per token (the
    native decode kernels where the CPU has them)."""
    runner = PagedRunner(model, block_size=4, num_blocks=64)
    split = DEQUANT_ROWS + 8
    steps = [runner.step({"a": ids[:split]})["a"]]
    steps += [runner.step({"a": [tok]})["a"] for tok in ids[split:]]
    return torch.cat(steps)


def logit_agreement(ours: torch.Tensor, reference: torch.Tensor) -> tuple[float, float]:
    """The minimum cosine over positions and the top-1 agreement of two logit tensors."""
    cosine = F.cosine_similarity(ours, reference, dim=-1).min().item()
    top1 = (ours.argmax(-1) == reference.argmax(-1)).float().mean().item()
    return cosine, top1
