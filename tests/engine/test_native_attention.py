"""The native CPU paged-decode kernel: built here, equal to the SDPA path, and safe to lose."""

from __future__ import annotations

import logging
import random
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from local_engine.attention import (
    CPUPagedAttention,
    ReferenceAttention,
    build_attention_metadata,
    get_attention_backend,
    native,
)
from local_engine.attention.native import (
    KernelError,
    build_library,
    load_paged_decode,
    open_library,
)
from swiftclient.errors import ConfigurationError


@pytest.fixture
def fresh_loader() -> Iterator[None]:
    """Forget the process-wide kernel before and after a test that changes how it loads."""
    load_paged_decode.cache_clear()
    yield
    load_paged_decode.cache_clear()


def _decode_step(
    lens: list[int],
    *,
    heads: int,
    kv_heads: int,
    dim: int,
    block: int,
    seed: int,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, object]:
    """A decode-only step over scattered blocks: q (a strided view, as the model passes it),
    k, v, a filled cache and the step's metadata."""
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    need = sum(-(-n // block) for n in lens)
    free = list(range(need + 3))
    rng.shuffle(free)
    tables = [[free.pop() for _ in range(-(-n // block))] for n in lens]
    cache = torch.randn(2, need + 3, block, kv_heads, dim, generator=gen).to(dtype)
    meta = build_attention_metadata(tables, lens, [1] * len(lens), block_size=block)
    qk = torch.randn(len(lens), heads + kv_heads, dim, generator=gen).to(dtype)
    v = torch.randn(len(lens), kv_heads, dim, generator=gen).to(dtype)
    return qk[:, :heads], qk[:, heads:], v, cache, meta


@pytest.mark.parametrize(
    ("heads", "kv_heads", "dim", "block"),
    [(8, 4, 64, 16), (4, 4, 20, 4), (16, 2, 128, 16), (6, 1, 24, 1), (16, 1, 64, 8)],
    ids=["gqa2-d64", "mha-d20", "gqa8-d128", "mqa-block1", "group16"],
)
@pytest.mark.parametrize("window", [None, 1, 5, 1000])
def test_kernel_matches_reference_decode(
    heads: int, kv_heads: int, dim: int, block: int, window: int | None
) -> None:
    lens = [1, 2, block, block + 1, 3 * block - 1, 37, 64, 5]
    q, k, v, cache, meta = _decode_step(
        lens, heads=heads, kv_heads=kv_heads, dim=dim, block=block, seed=heads + dim
    )
    assert not q.is_contiguous()
    want = ReferenceAttention().forward(
        q, k, v, cache.clone(), meta, scale=dim**-0.5, sliding_window=window
    )
    backend = get_attention_backend("cpu")
    assert isinstance(backend, CPUPagedAttention)
    meta.derived.clear()
    got = backend.forward(q, k, v, cache, meta, scale=dim**-0.5, sliding_window=window)
    torch.testing.assert_close(got, want, atol=2e-6, rtol=1e-5)


def test_kernel_uses_every_thread_setting_alike() -> None:
    q, k, v, cache, meta = _decode_step([40, 3, 17], heads=4, kv_heads=2, dim=32, block=4, seed=1)
    backend = get_attention_backend("cpu")
    before = torch.get_num_threads()
    outs = []
    try:
        for threads in (1, 2, 7):
            torch.set_num_threads(threads)
            meta.derived.clear()
            outs.append(backend.forward(q, k, v, cache, meta, scale=0.2, sliding_window=None))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def test_rows_the_kernel_does_not_take_use_the_reference_path() -> None:
    q, k, v, cache, meta = _decode_step(
        [9, 30, 2], heads=4, kv_heads=2, dim=16, block=4, seed=2, dtype=torch.bfloat16
    )
    want = ReferenceAttention().forward(
        q, k, v, cache.clone(), meta, scale=0.25, sliding_window=None
    )
    meta.derived.clear()
    got = get_attention_backend("cpu").forward(
        q, k, v, cache, meta, scale=0.25, sliding_window=None
    )
    assert torch.equal(got, want)


def test_kernel_refuses_shapes_it_does_not_take() -> None:
    kernel = load_paged_decode()
    assert kernel is not None
    lens = torch.tensor([3], dtype=torch.int64)
    tables = torch.zeros(1, dtype=torch.int64)
    q = torch.zeros(1, 3, 8)
    cache = torch.zeros(2, 1, 4, 2, 8)
    out = torch.empty(1, 3, 8)
    args = {
        "q": q.data_ptr(),
        "q_strides": (24, 8),
        "k": cache[0].data_ptr(),
        "v": cache[1].data_ptr(),
        "tables": tables.data_ptr(),
        "table_stride": 1,
        "lens": lens.data_ptr(),
        "out": out.data_ptr(),
        "block_size": 4,
        "window": 0,
        "max_len": 4,
        "num_blocks": 1,
        "scale": 1.0,
        "threads": 1,
    }
    with pytest.raises(KernelError, match="status 2"):
        kernel(shape=(1, 3, 2, 8), **args)  # 3 query heads over 2 KV heads
    with pytest.raises(KernelError, match="status 2"):
        kernel(shape=(1, 2, 2, 8), **{**args, "max_len": 2})  # a row longer than max_len
    tables[0] = 1
    with pytest.raises(KernelError, match="status 2"):
        kernel(shape=(1, 2, 2, 8), **args)  # block 1 of a one-block cache
    tables[0] = -1
    with pytest.raises(KernelError, match="status 2"):
        kernel(shape=(1, 2, 2, 8), **args)
    tables[0] = 0
    kernel(shape=(1, 2, 2, 8), **args)  # the same call with a valid table runs
    assert torch.equal(out[:, :2], torch.zeros(1, 2, 8))  # zero values -> zero output


def test_library_is_built_once_and_reused(tmp_path: Path) -> None:
    first = build_library(tmp_path)
    stamp = first.stat().st_mtime_ns
    assert build_library(tmp_path) == first
    assert first.stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no scratch files left


def test_no_compiler_means_reference_attention(
    fresh_loader: None,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv("SWIFTCLIENT_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", "no-such-compiler-here")
    with pytest.raises(OSError, match="no C compiler"):
        build_library(tmp_path)
    with caplog.at_level(logging.WARNING, logger="local_engine"):
        backend = get_attention_backend("auto")
    assert type(backend) is ReferenceAttention
    assert "paged-decode kernel unavailable" in caplog.text
    with pytest.raises(ConfigurationError, match="could not be built"):
        get_attention_backend("cpu")


def test_a_broken_compiler_is_reported(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    broken = tmp_path / "cc"
    broken.write_text("#!/bin/sh\necho 'cc: fatal error: out of disk' >&2\nexit 1\n")
    broken.chmod(0o755)
    with pytest.raises(OSError, match="out of disk"):
        build_library(tmp_path / "kernels", compiler=str(broken))
    assert not list((tmp_path / "kernels").iterdir())


def test_kernels_can_be_switched_off(fresh_loader: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(native.DISABLE_ENV, "0")
    assert load_paged_decode() is None
    assert type(get_attention_backend()) is ReferenceAttention


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler on this machine")
def test_kernel_builds_where_a_compiler_exists() -> None:
    assert load_paged_decode() is not None


def test_pthread_and_openmp_builds_agree(tmp_path: Path) -> None:
    """Both threading builds of the kernel (OpenMP where torch brings GNU OpenMP, pthreads
    elsewhere) against the reference, at several thread counts."""
    q, k, v, cache, meta = _decode_step(
        [70, 1, 33, 16, 5], heads=8, kv_heads=2, dim=32, block=8, seed=5
    )
    want = ReferenceAttention().forward(q, k, v, cache.clone(), meta, scale=0.3, sliding_window=7)
    plain = open_library(build_library(tmp_path, openmp=False))
    openmp = open_library(build_library(tmp_path, openmp=True))
    assert plain.path != openmp.path
    before = torch.get_num_threads()
    try:
        for kernel in (plain, openmp):
            for threads in (1, 2, 3):
                torch.set_num_threads(threads)
                meta.derived.clear()
                got = CPUPagedAttention(kernel).forward(
                    q, k, v, cache, meta, scale=0.3, sliding_window=7
                )
                torch.testing.assert_close(got, want, atol=2e-6, rtol=1e-5)
    finally:
        torch.set_num_threads(before)


def test_a_library_without_the_kernel_is_refused(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        open_library(tmp_path / "missing.so")
