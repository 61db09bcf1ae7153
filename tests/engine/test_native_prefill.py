"""The native bfloat16 prefill attention: equal to float32 attention over the same values,
for prompts, prefix-cache hits, windows and mixed steps; deterministic across thread counts;
refusing what it does not take; and safe to lose."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import cast

import pytest
import torch

from local_engine.attention import CPUPagedAttention, ReferenceAttention, build_attention_metadata
from local_engine.attention.base import AttentionMetadata
from local_engine.attention.native import KernelError, PagedDecodeKernel

from .paged import scattered_tables

Step = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, AttentionMetadata]


def _step(
    query_lens: list[int],
    context_lens: list[int],
    *,
    heads: int,
    kv_heads: int,
    dim: int,
    block: int,
    seed: int,
) -> Step:
    """A bfloat16 step: q as a strided view (as the model passes it), the new tokens' k and
    v, a cache whose earlier positions hold random values (a prefix-cache hit's keys), over
    scattered blocks."""
    gen = torch.Generator().manual_seed(seed)
    tables, blocks = scattered_tables(context_lens, block, seed)
    cache = torch.randn(2, blocks, block, kv_heads, dim, generator=gen).to(torch.bfloat16)
    meta = build_attention_metadata(tables, context_lens, query_lens, block_size=block)
    rows = sum(query_lens)
    qk = torch.randn(rows, heads + kv_heads, dim, generator=gen).to(torch.bfloat16)
    v = torch.randn(rows, kv_heads, dim, generator=gen).to(torch.bfloat16)
    return qk[:, :heads], qk[:, heads:], v, cache, meta


def _float32_attention(step: Step, scale: float, window: int | None) -> torch.Tensor:
    q, k, v, cache, meta = step
    return ReferenceAttention().forward(
        q.float(), k.float(), v.float(), cache.float(), meta, scale=scale, sliding_window=window
    )


def _native(
    kernel: PagedDecodeKernel, step: Step, scale: float, window: int | None
) -> torch.Tensor:
    q, k, v, cache, meta = step
    meta.derived.clear()
    return CPUPagedAttention(kernel).forward(
        q, k, v, cache, meta, scale=scale, sliding_window=window
    )


@pytest.fixture
def prefill_kernel(kernel: PagedDecodeKernel) -> PagedDecodeKernel:
    """The library, where this build has the prefill loop (AVX-512 BF16)."""
    if not kernel.prefill_bf16:
        pytest.skip("this CPU has no AVX-512 BF16: prefill attention stays on SDPA")
    return kernel


@pytest.mark.parametrize("window", [None, 1, 5, 1000])
@pytest.mark.parametrize(
    ("heads", "kv_heads", "dim", "block"),
    [(14, 2, 64, 16), (8, 8, 64, 4), (16, 1, 32, 1), (16, 2, 128, 16), (6, 2, 32, 3)],
    ids=["gqa7-d64", "mha-d64", "mqa16-d32-block1", "gqa8-d128", "gqa3-d32-block3"],
)
def test_prefill_matches_float32_attention_on_the_same_values(
    prefill_kernel: PagedDecodeKernel,
    window: int | None,
    heads: int,
    kv_heads: int,
    dim: int,
    block: int,
) -> None:
    """Prompts (query = context), prefix-cache hits (query at the end of a longer context),
    lengths around the kernel's 16-key tiles, 32-position tasks and 64-key blocks, and a
    decode row, all in one step."""
    query_lens = [2, 70, 24, 33, 1, 5, 129]
    context_lens = [2, 70, 300, 97, 40, 5, 129]
    step = _step(
        query_lens, context_lens, heads=heads, kv_heads=kv_heads, dim=dim, block=block, seed=dim
    )
    scale = dim**-0.5
    want = _float32_attention(step, scale, window)
    got = _native(prefill_kernel, step, scale, window)
    assert got.dtype == torch.bfloat16 and got.is_contiguous()
    torch.testing.assert_close(got.float(), want.to(torch.bfloat16).float(), atol=2e-2, rtol=2e-2)
    # bfloat16 probabilities in the value sums: within 2^-7 of the largest output
    assert (got.float() - want).abs().max().item() <= want.abs().max().item() * 2**-7


def test_prefill_is_the_same_on_every_thread_count(prefill_kernel: PagedDecodeKernel) -> None:
    step = _step([300, 40], [300, 90], heads=14, kv_heads=2, dim=64, block=16, seed=3)
    before = torch.get_num_threads()
    outs = []
    try:
        for threads in (1, 2, 7):
            torch.set_num_threads(threads)
            outs.append(_native(prefill_kernel, step, 0.125, None))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def test_prefill_follows_a_long_context_with_large_values(
    prefill_kernel: PagedDecodeKernel,
) -> None:
    """Scores far apart (the running maximum moves block after block) stay exact softmax."""
    q, k, v, cache, meta = _step([200], [1100], heads=4, kv_heads=1, dim=64, block=16, seed=9)
    ramp = torch.linspace(1, 8, cache.shape[1] * cache.shape[2]).view(cache.shape[1], -1)
    cache[0] = (cache[0].float() * ramp[..., None, None]).to(torch.bfloat16)
    step = (q * 4, k, v, cache, meta)
    want = _float32_attention(step, 0.125, None)
    got = _native(prefill_kernel, step, 0.125, None)
    assert torch.isfinite(got).all()
    assert (got.float() - want).abs().max().item() <= want.abs().max().item() * 2**-7


def _prefill_args(q: torch.Tensor, cache: torch.Tensor, tables: torch.Tensor) -> dict[str, object]:
    seqs = torch.tensor([[0, q.shape[0], q.shape[0], 0]], dtype=torch.int64)
    out = torch.empty(q.shape, dtype=torch.bfloat16)
    return {
        "q": q.data_ptr(),
        "q_strides": (q.stride(0), q.stride(1)),
        "k": cache[0].data_ptr(),
        "v": cache[1].data_ptr(),
        "tables": tables.data_ptr(),
        "table_stride": tables.shape[-1],
        "seqs": seqs.data_ptr(),
        "num_seqs": 1,
        "out": out.data_ptr(),
        "shape": (q.shape[0], q.shape[1], cache.shape[3], q.shape[2]),
        "block_size": cache.shape[2],
        "window": 0,
        "num_blocks": cache.shape[1],
        "scale": 1.0,
        "threads": 1,
        "_keep": (seqs, out),
    }


def test_prefill_refuses_what_it_does_not_take(prefill_kernel: PagedDecodeKernel) -> None:
    q = torch.zeros(6, 4, 64, dtype=torch.bfloat16)
    cache = torch.zeros(2, 2, 4, 2, 64, dtype=torch.bfloat16)
    tables = torch.tensor([[0, 1]], dtype=torch.int64)
    args = _prefill_args(q, cache, tables)
    keep = args.pop("_keep")  # the tensors behind seqs and out stay alive
    assert prefill_kernel.prefill_attention(**args)  # type: ignore[arg-type]
    refused: list[dict[str, object]] = [
        {"shape": (6, 4, 2, 48)},  # a head size it has no loop for
        {"shape": (6, 3, 2, 64)},  # 3 query heads over 2 KV heads
        {"shape": (5, 4, 2, 64)},  # the sequence's rows run past q and out
        {"num_blocks": 1},  # block 1 of a one-block cache
        {"table_stride": 1},  # a table too short for the context
        {"window": -1},
    ]
    for change in refused:
        with pytest.raises(KernelError, match="status 2"):
            prefill_kernel.prefill_attention(**{**args, **change})  # type: ignore[arg-type]
    tables[0, 1] = -1
    with pytest.raises(KernelError, match="status 2"):
        prefill_kernel.prefill_attention(**args)  # type: ignore[arg-type]
    del keep


class _Refusing:
    """A kernel double whose prefill loop fails as out of scratch memory."""

    prefill_bf16 = True

    def __init__(self) -> None:
        self.calls = 0

    def prefill_attention(self, **kwargs: object) -> bool:
        self.calls += 1
        raise KernelError("paged decode kernel failed (out of scratch memory, status 1)")


def test_a_prefill_failure_falls_back_to_sdpa(caplog: pytest.LogCaptureFixture) -> None:
    refusing = _Refusing()
    backend = CPUPagedAttention(cast(PagedDecodeKernel, refusing))
    q, k, v, cache, meta = _step([9, 20], [9, 30], heads=4, kv_heads=2, dim=64, block=4, seed=5)
    want = ReferenceAttention().forward(
        q, k, v, cache.clone(), meta, scale=0.3, sliding_window=None
    )
    with caplog.at_level(logging.WARNING, logger="local_engine"):
        for _ in range(2):
            meta.derived.clear()
            got = backend.forward(q, k, v, cache, meta, scale=0.3, sliding_window=None)
            assert torch.equal(got, want)
    assert refusing.calls == 1  # not tried again after the first failure
    assert caplog.text.count("prefill attention takes the SDPA path") == 1


def test_float32_and_float16_prefills_stay_on_sdpa() -> None:
    refusing = _Refusing()
    backend = CPUPagedAttention(cast(PagedDecodeKernel, refusing))
    for dtype in (torch.float32, torch.float16):
        q, k, v, cache, meta = _step([9], [9], heads=4, kv_heads=2, dim=64, block=4, seed=5)
        q, k, v, cache = (t.to(dtype) for t in (q, k, v, cache))
        want = ReferenceAttention().forward(
            q, k, v, cache.clone(), meta, scale=0.3, sliding_window=None
        )
        meta.derived.clear()
        got = backend.forward(q, k, v, cache, meta, scale=0.3, sliding_window=None)
        assert torch.equal(got, want)
    assert refusing.calls == 0


def test_a_cpu_with_avx512_bf16_gets_the_bfloat16_kernels(kernel: PagedDecodeKernel) -> None:
    """The first build flags (-march=native) failing would leave a portable build without
    the AVX-512 kernels, which runs, slower: where the CPU has the instructions, the build
    must have the kernels."""
    info = Path("/proc/cpuinfo")
    flags = set(info.read_text().split()) if info.is_file() else set()
    if not {"avx512_bf16", "avx512bw", "avx512vl"} <= flags:
        pytest.skip("this CPU has no AVX-512 BF16")
    assert kernel.bf16_linear and kernel.vector_activation
    assert kernel.prefill_bf16 and kernel.packed_linear
