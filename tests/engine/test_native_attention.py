"""The native CPU paged-decode kernel: built here, equal to the SDPA path, and safe to lose."""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import cast

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
    PagedDecodeKernel,
    build_library,
    load_paged_decode,
    open_library,
    torch_uses_gomp,
)
from local_engine.errors import EngineConfigError

from .paged import scattered_tables


def _have_compiler() -> bool:
    words = shlex.split(os.environ.get("CC") or "cc")
    return bool(words) and shutil.which(words[0]) is not None


needs_compiler = pytest.mark.skipif(not _have_compiler(), reason="no C compiler here")


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
    tables, blocks = scattered_tables(lens, block, seed)
    cache = torch.randn(2, blocks, block, kv_heads, dim, generator=gen).to(dtype)
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
    kernel: PagedDecodeKernel, heads: int, kv_heads: int, dim: int, block: int, window: int | None
) -> None:
    lens = [1, 2, block, block + 1, 3 * block - 1, 37, 64, 5]
    q, k, v, cache, meta = _decode_step(
        lens, heads=heads, kv_heads=kv_heads, dim=dim, block=block, seed=heads + dim
    )
    assert not q.is_contiguous()
    want = ReferenceAttention().forward(
        q, k, v, cache.clone(), meta, scale=dim**-0.5, sliding_window=window
    )
    backend = CPUPagedAttention(kernel)
    meta.derived.clear()
    got = backend.forward(q, k, v, cache, meta, scale=dim**-0.5, sliding_window=window)
    torch.testing.assert_close(got, want, atol=2e-6, rtol=1e-5)


def test_kernel_uses_every_thread_setting_alike(kernel: PagedDecodeKernel) -> None:
    q, k, v, cache, meta = _decode_step([40, 3, 17], heads=4, kv_heads=2, dim=32, block=4, seed=1)
    backend = CPUPagedAttention(kernel)
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


@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize(
    ("heads", "kv_heads", "dim"),
    [(8, 2, 64), (14, 2, 64), (16, 1, 32), (16, 2, 128), (13, 1, 128), (4, 4, 20)],
    ids=["gqa4-d64", "gqa7-d64", "mqa16-d32", "gqa8-d128", "mqa13-d128", "mha-d20"],
)
def test_bf16_kernel_matches_float32_attention_on_the_same_values(
    kernel: PagedDecodeKernel, window: int | None, heads: int, kv_heads: int, dim: int
) -> None:
    """bfloat16 rows: float32 sums over the bfloat16 values (dims 32, 64 and 128 through the
    kernel's bfloat16 path: bfloat16 dot products, a polynomial exp, values summed for
    several heads at once; others converted on load), so the result is the float32 attention
    over the same values, rounded once, up to float32 rounding."""
    lens = [1, 4, 5, 37, 64, 11, 130]
    q, k, v, cache, meta = _decode_step(
        lens,
        heads=heads,
        kv_heads=kv_heads,
        dim=dim,
        block=4,
        seed=7 + dim + heads,
        dtype=torch.bfloat16,
    )
    scale = dim**-0.5
    want = ReferenceAttention().forward(
        q.float(), k.float(), v.float(), cache.float(), meta, scale=scale, sliding_window=window
    )
    meta.derived.clear()
    got = CPUPagedAttention(kernel).forward(
        q, k, v, cache, meta, scale=scale, sliding_window=window
    )
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want.to(torch.bfloat16).float(), atol=1e-2, rtol=1e-2)
    assert (got.float() - want).abs().max().item() <= want.abs().max().item() * 2**-8


def test_rows_the_kernel_does_not_take_use_the_reference_path(kernel: PagedDecodeKernel) -> None:
    q, k, v, cache, meta = _decode_step(
        [9, 30, 2], heads=4, kv_heads=2, dim=16, block=4, seed=2, dtype=torch.float16
    )
    want = ReferenceAttention().forward(
        q, k, v, cache.clone(), meta, scale=0.25, sliding_window=None
    )
    meta.derived.clear()
    got = get_attention_backend("cpu").forward(
        q, k, v, cache, meta, scale=0.25, sliding_window=None
    )
    assert torch.equal(got, want)


def test_kernel_refuses_shapes_it_does_not_take(kernel: PagedDecodeKernel) -> None:
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


@needs_compiler
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
    monkeypatch.delenv(native.DISABLE_ENV, raising=False)
    monkeypatch.setenv("SWIFTCLIENT_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", "no-such-compiler-here")
    with pytest.raises(OSError, match="no C compiler"):
        build_library(tmp_path)
    backend = get_attention_backend("auto")  # builds nothing yet
    assert isinstance(backend, CPUPagedAttention)
    q, k, v, cache, meta = _decode_step([6, 19], heads=4, kv_heads=2, dim=8, block=4, seed=3)
    want = ReferenceAttention().forward(
        q, k, v, cache.clone(), meta, scale=0.3, sliding_window=None
    )
    meta.derived.clear()
    with caplog.at_level(logging.WARNING, logger="local_engine"):
        got = backend.forward(q, k, v, cache, meta, scale=0.3, sliding_window=None)
    assert torch.equal(got, want)
    assert backend.kernel is None
    assert "paged-decode kernel unavailable" in caplog.text
    assert not list(tmp_path.glob("kernels/*"))
    with pytest.raises(EngineConfigError, match="could not be built"):
        get_attention_backend("cpu")


def test_no_home_directory_means_reference_attention(
    fresh_loader: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_home() -> Path:
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(native, "default_cache_root", no_home)
    assert load_paged_decode() is None


def test_a_kernel_failure_falls_back_to_sdpa_for_that_step(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls: list[dict[str, object]] = []

    def refuse(**kwargs: object) -> None:
        calls.append(kwargs)
        raise KernelError("paged decode kernel failed (out of scratch memory, status 1)")

    backend = CPUPagedAttention(cast(PagedDecodeKernel, refuse))
    q, k, v, cache, meta = _decode_step([5, 40, 2], heads=4, kv_heads=1, dim=8, block=4, seed=4)
    want = ReferenceAttention().forward(q, k, v, cache.clone(), meta, scale=0.3, sliding_window=2)
    with caplog.at_level(logging.WARNING, logger="local_engine"):
        for _ in range(2):
            meta.derived.clear()
            got = backend.forward(q, k, v, cache, meta, scale=0.3, sliding_window=2)
            assert torch.equal(got, want)
    assert len(calls) == 2
    assert caplog.text.count("out of scratch memory") == 1  # logged once


def test_a_head_size_mismatch_never_reaches_the_kernel() -> None:
    calls: list[object] = []
    backend = CPUPagedAttention(cast(PagedDecodeKernel, lambda **kw: calls.append(kw)))
    q, k, v, cache, meta = _decode_step([5, 9], heads=2, kv_heads=1, dim=8, block=4, seed=6)
    wide_q = torch.randn(2, 2, 16)
    with pytest.raises(RuntimeError):  # SDPA's own shape error, not an out-of-bounds read
        backend.forward(wide_q, k, v, cache, meta, scale=0.3, sliding_window=None)
    assert not calls


@pytest.mark.parametrize(
    ("dtype", "taken"), [(torch.float32, True), (torch.bfloat16, True), (torch.float16, False)]
)
def test_which_dtypes_reach_the_kernel(dtype: torch.dtype, taken: bool) -> None:
    calls: list[dict[str, object]] = []
    backend = CPUPagedAttention(cast(PagedDecodeKernel, lambda **kw: calls.append(kw)))
    q, k, v, cache, meta = _decode_step(
        [5, 9], heads=2, kv_heads=1, dim=8, block=4, seed=6, dtype=dtype
    )
    backend.forward(q, k, v, cache, meta, scale=0.3, sliding_window=None)
    assert [c["bf16"] for c in calls] == ([dtype == torch.bfloat16] if taken else [])


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
    backend = get_attention_backend()
    assert isinstance(backend, CPUPagedAttention) and backend.kernel is None


@needs_compiler
def test_cc_may_carry_arguments(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    words = shlex.split(os.environ.get("CC") or "cc")
    monkeypatch.setenv("CC", shlex.join(["env", *words]))
    assert open_library(build_library(tmp_path, openmp=False)).path.exists()


def test_a_hanging_compiler_is_killed_with_its_children(tmp_path: Path) -> None:
    """One attempt, then give up: the compiler and whatever it started are killed."""
    log = tmp_path / "calls"
    hang = tmp_path / "cc"
    hang.write_text(
        "#!/bin/sh\n"
        'case "$1" in --version) echo fake-cc; exit 0;; esac\n'
        f"echo compile >> {log}\n"
        f"sleep 600 & echo $! > {tmp_path / 'child'}\n"
        "wait\n"
    )
    hang.chmod(0o755)
    with pytest.raises(OSError, match="longer than 1 s"):
        build_library(tmp_path / "kernels", compiler=str(hang), timeout=1)
    assert log.read_text().splitlines() == ["compile"]  # no second flag set tried
    child = int((tmp_path / "child").read_text())
    status = Path(f"/proc/{child}/status")
    for _ in range(1000):  # the kill is asynchronous: wait (up to ~10 s) for it to land
        if not status.exists() or "State:\tZ" in status.read_text():
            break
        time.sleep(0.01)
    assert not status.exists() or "State:\tZ" in status.read_text()
    assert not list((tmp_path / "kernels").iterdir())


@needs_compiler
def test_kernel_builds_where_a_compiler_exists(
    fresh_loader: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(native.DISABLE_ENV, raising=False)
    assert load_paged_decode() is not None


@needs_compiler
def test_pthread_and_openmp_builds_agree(tmp_path: Path) -> None:
    """Both threading builds of the kernel (OpenMP where torch brings GNU OpenMP, pthreads
    elsewhere) against the reference, at several thread counts."""
    q, k, v, cache, meta = _decode_step(
        [70, 1, 33, 16, 5], heads=8, kv_heads=2, dim=32, block=8, seed=5
    )
    want = ReferenceAttention().forward(q, k, v, cache.clone(), meta, scale=0.3, sliding_window=7)
    plain = open_library(build_library(tmp_path, openmp=False))
    openmp = open_library(build_library(tmp_path, openmp=True))
    assert not plain.path.stem.endswith("-omp")
    if torch_uses_gomp():
        assert openmp.path.stem.endswith("-omp")
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
