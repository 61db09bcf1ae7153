"""The fused decode call: rotary embedding, KV write and attention in one native pass."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from local_engine import model as model_module
from local_engine.attention import (
    AttentionMetadata,
    CPUPagedAttention,
    build_attention_metadata,
)
from local_engine.attention.native import PagedDecodeKernel
from local_engine.loader import load_model

from .paged import PagedRunner, scattered_tables
from .tiny import make_tiny_model

EPS = 1e-6


def _tables(dtype: torch.dtype, max_pos: int, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = model_module.rope_inverse_frequencies(dim, 10000.0, None)
    freqs = torch.arange(max_pos, dtype=torch.float32)[:, None] * inv_freq[None, :]
    return freqs.cos().to(dtype), freqs.sin().to(dtype)


def _step(
    lens: list[int],
    query_lens: list[int],
    *,
    heads: int,
    kv_heads: int,
    dim: int,
    block: int,
    dtype: torch.dtype,
    seed: int,
) -> tuple[torch.Tensor, torch.Tensor, object, torch.Tensor]:
    """A step over scattered blocks: the fused projection's output as the model views it
    (a strided ``[T, heads + 2 * kv_heads, dim]`` view), a filled cache, the metadata and
    the positions."""
    gen = torch.Generator().manual_seed(seed)
    tables, blocks = scattered_tables(lens, block, seed)
    cache = torch.randn(2, blocks, block, kv_heads, dim, generator=gen).to(dtype)
    meta = build_attention_metadata(tables, lens, query_lens, block_size=block)
    tokens = sum(query_lens)
    wide = torch.randn(tokens, heads + 2 * kv_heads + 3, dim, generator=gen).to(dtype)
    positions = torch.tensor(
        [p for n, q in zip(lens, query_lens, strict=True) for p in range(n - q, n)]
    )
    return wide[:, 1 : heads + 2 * kv_heads + 1], cache, meta, positions


def _unfused(
    backend: CPUPagedAttention,
    qkv: torch.Tensor,
    heads: int,
    norm: torch.Tensor | None,
    rotary: model_module.Rotary,
    cache: torch.Tensor,
    meta: object,
    window: int | None,
) -> torch.Tensor:
    kv_heads = (qkv.shape[1] - heads) // 2
    qk = model_module._qk_rope(qkv[:, : heads + kv_heads], norm, EPS, rotary)
    meta.derived.clear()  # type: ignore[attr-defined]
    return backend.forward(
        qk[:, :heads],
        qk[:, heads:],
        qkv[:, heads + kv_heads :],
        cache,
        meta,  # type: ignore[arg-type]
        scale=qkv.shape[-1] ** -0.5,
        sliding_window=window,
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("heads", "kv_heads", "dim", "block"),
    [(8, 4, 64, 16), (4, 4, 20, 4), (6, 1, 24, 1), (16, 2, 128, 8)],
    ids=["gqa2-d64", "mha-d20", "mqa-block1", "gqa8-d128"],
)
@pytest.mark.parametrize("norm", ["none", "shared", "per-head"])
@pytest.mark.parametrize("window", [None, 5])
def test_fused_decode_is_bit_identical_to_rotate_store_attend(
    kernel: PagedDecodeKernel,
    dtype: torch.dtype,
    heads: int,
    kv_heads: int,
    dim: int,
    block: int,
    norm: str,
    window: int | None,
) -> None:
    """Output and cache equal (``torch.equal``) the unfused path's: the same rotation, the
    same slots, the same attention; with one row per thread task (8 rows on 1 thread) and
    with rows split by KV head (fewer than two rows per thread)."""
    cases = [([1, 2, block, block + 1, 3 * block - 1, 37, 64, 5], 1), ([9, 3 * block], 4)]
    for lens, threads in cases:
        qkv, cache, meta, positions = _step(
            lens,
            [1] * len(lens),
            heads=heads,
            kv_heads=kv_heads,
            dim=dim,
            block=block,
            dtype=dtype,
            seed=heads + dim + len(lens),
        )
        gen = torch.Generator().manual_seed(7)
        weight = {
            "none": None,
            "shared": torch.rand(dim, generator=gen).to(dtype) + 0.5,
            "per-head": torch.rand(heads + kv_heads, dim, generator=gen).to(dtype) + 0.5,
        }[norm]
        cos_t, sin_t = _tables(dtype, 128, dim)
        rotary = model_module.Rotary(positions, cos_t, sin_t)
        backend = CPUPagedAttention(kernel)
        want_cache = cache.clone()
        want = _unfused(backend, qkv, heads, weight, rotary, want_cache, meta, window)
        meta.derived.clear()  # type: ignore[attr-defined]
        before = torch.get_num_threads()
        torch.set_num_threads(threads)  # the kernel's team: torch's thread count
        try:
            got = backend.rope_decode(
                qkv,
                heads,
                weight,
                EPS,
                (positions, cos_t, sin_t),
                cache,
                meta,  # type: ignore[arg-type]
                scale=dim**-0.5,
                sliding_window=window,
            )
        finally:
            torch.set_num_threads(before)
        assert got is not None
        assert torch.equal(got, want)
        assert torch.equal(cache, want_cache)


def test_fused_decode_declines_what_it_does_not_take(kernel: PagedDecodeKernel) -> None:
    """A step with a prefill, float16, a position outside the tables, a mismatched table,
    rows that read what another row writes, or a slot mapping other than the rows' newest
    positions returns None and writes nothing; the unfused path
    then runs (and reports a bad position)."""
    heads, kv_heads, dim, block = 4, 2, 16, 4
    backend = CPUPagedAttention(kernel)
    cos_t, sin_t = _tables(torch.float32, 64, dim)

    def attempt(
        lens: list[int],
        query_lens: list[int],
        *,
        dtype: torch.dtype = torch.float32,
        positions: torch.Tensor | None = None,
        tables: tuple[torch.Tensor, torch.Tensor] = (cos_t, sin_t),
        meta: AttentionMetadata | None = None,
    ) -> torch.Tensor | None:
        qkv, cache, step_meta, pos = _step(
            lens,
            query_lens,
            heads=heads,
            kv_heads=kv_heads,
            dim=dim,
            block=block,
            dtype=dtype,
            seed=3,
        )
        before = cache.clone()
        out = backend.rope_decode(
            qkv,
            heads,
            None,
            EPS,
            (pos if positions is None else positions, *tables),
            cache,
            step_meta if meta is None else meta,  # type: ignore[arg-type]
            scale=dim**-0.5,
            sliding_window=None,
        )
        assert torch.equal(cache, before) == (out is None)  # written only when it ran
        return out

    assert attempt([5, 9], [1, 4]) is None  # a prefill in the step
    assert attempt([5, 9], [1, 1], dtype=torch.float16) is None
    assert attempt([5, 9], [1, 1], positions=torch.tensor([4, 64])) is None  # outside tables
    assert attempt([5, 9], [1, 1], tables=(cos_t[:, :4], sin_t[:, :4])) is None
    assert attempt([5, 9], [1, 1], positions=torch.tensor([4, 8], dtype=torch.int32)) is None
    assert attempt([5, 9], [1, 1]) is not None

    # One sequence's positions 5 and 6 as rows of their own (speculative verification lays
    # drafts out so): the second row reads the slot the first writes in the same step.
    shared = build_attention_metadata([[0, 1], [0, 1]], [6, 7], [1, 1], block_size=block)
    assert attempt([6, 6], [1, 1], positions=torch.tensor([5, 6]), meta=shared) is None
    # Metadata whose slot mapping puts the tokens elsewhere than their newest positions.
    moved = build_attention_metadata([[0, 1], [2, 3]], [5, 6], [1, 1], block_size=block)
    assert attempt([5, 6], [1, 1], meta=moved) is not None
    moved.derived.clear()
    moved.slot_mapping = moved.slot_mapping.flip(0)
    assert attempt([5, 6], [1, 1], meta=moved) is None


def test_the_model_decodes_through_the_fused_call(
    kernel: PagedDecodeKernel, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A decode step takes the fused call in every layer, a prefill step in none, and the
    logits equal those of the unfused path bit for bit (qwen3: per-head q/k norm)."""
    model = load_model(make_tiny_model(tmp_path, "qwen3"))
    model.set_attention_backend(CPUPagedAttention(kernel))
    layers = len(model.layers)
    ids = torch.randint(3, 256, (12,), generator=torch.Generator().manual_seed(5)).tolist()
    taken: list[bool] = []
    original = CPUPagedAttention.rope_decode

    def counting(self: CPUPagedAttention, *args: Any, **kwargs: Any) -> torch.Tensor | None:
        out = original(self, *args, **kwargs)
        taken.append(out is not None)
        return out

    def declining(self: CPUPagedAttention, *args: Any, **kwargs: Any) -> None:
        return None

    def decode(fused: Callable[..., torch.Tensor | None]) -> list[torch.Tensor]:
        monkeypatch.setattr(CPUPagedAttention, "rope_decode", fused)
        runner = PagedRunner(model, block_size=4)
        steps = [runner.step({"a": ids[:6], "b": ids[:3]})["a"]]
        steps += [runner.step({"a": [tok], "b": [tok]})["a"] for tok in ids[6:]]
        return steps

    fused = decode(counting)
    assert taken == [False] * layers + [True] * layers * (len(ids) - 6)
    unfused = decode(declining)
    assert all(torch.equal(a, b) for a, b in zip(fused, unfused, strict=True))
