"""The native RMSNorm: equal to torch's on every layout the model hands it, refused cleanly
where it does not apply, and what the model's norms use on CPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from local_engine import model as model_module
from local_engine.attention.native import (
    RMS_NORM_MAX_COLS,
    PagedDecodeKernel,
    load_paged_decode,
)

EPS = 1e-6


@pytest.fixture
def kernel() -> PagedDecodeKernel:
    """The process-wide kernel library; tests that need it skip where it cannot be built."""
    loaded = load_paged_decode()
    if loaded is None:
        pytest.skip("no native kernel here (no C compiler, or switched off)")
    return loaded


def _reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """torch's RMSNorm as the model computed it before the kernel: float32 in one call,
    bfloat16 upcast, normalized, cast back, then scaled."""
    cols = x.shape[-1]
    if x.dtype == torch.float32:
        return F.rms_norm(x, (cols,), None, EPS) * weight
    return weight * F.rms_norm(x.float(), (cols,), None, EPS).to(x.dtype)


def _layouts(dtype: torch.dtype, tokens: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(x, weight) pairs: hidden states [T, H]; the q/k heads of a fused projection's output,
    a strided [T, heads, D] view, with one weight for all heads or one per head."""
    g = torch.Generator().manual_seed(tokens)
    hidden = torch.randn(tokens, 512, generator=g).to(dtype)
    qkv = torch.randn(tokens, 12, 64, generator=g).to(dtype)
    shared = (1 + 0.3 * torch.randn(512, generator=g)).to(dtype)
    head = (1 + 0.3 * torch.randn(64, generator=g)).to(dtype)
    per_head = (1 + 0.3 * torch.randn(10, 64, generator=g)).to(dtype)
    return [(hidden, shared), (qkv[:, :10], head), (qkv[:, :10], per_head)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens", [1, 5, 300])  # 300 rows of 512: the parallel path
def test_kernel_matches_torch(kernel: PagedDecodeKernel, dtype: torch.dtype, tokens: int) -> None:
    for x, weight in _layouts(dtype, tokens):
        for threads in (1, 2):
            out = kernel.rms_norm(x, weight, EPS, threads)
            assert out is not None and out.is_contiguous()
            expected = _reference(x, weight)
            assert out.shape == expected.shape and out.dtype == dtype
            if dtype == torch.float32:  # the same sums in another order: a few ulps
                torch.testing.assert_close(out, expected, rtol=2e-6, atol=2e-6)
            else:  # the same float32 value rounded the same way, but for 1/sqrt vs rsqrt
                torch.testing.assert_close(out, expected, rtol=2**-7, atol=0)
                assert (out == expected).float().mean().item() > 0.99


def test_kernel_declines_what_it_does_not_take(kernel: PagedDecodeKernel) -> None:
    x = torch.randn(4, 64)
    w = torch.ones(64)
    assert kernel.rms_norm(x.half(), w.half(), EPS, 1) is None  # float16
    assert kernel.rms_norm(x, w.bfloat16(), EPS, 1) is None  # mixed dtypes
    assert kernel.rms_norm(x, torch.ones(32), EPS, 1) is None  # weight of another width
    assert kernel.rms_norm(x, torch.ones(4, 64), EPS, 1) is None  # per-row weight on 2-D
    assert kernel.rms_norm(x.t().contiguous().t(), w, EPS, 1) is None  # strided rows' values
    assert kernel.rms_norm(x[None], w, EPS, 1) is not None  # [1, 4, 64]: heads of one token
    wide = torch.randn(2, RMS_NORM_MAX_COLS + 1)
    assert kernel.rms_norm(wide, torch.ones(RMS_NORM_MAX_COLS + 1), EPS, 1) is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_models_norm_takes_the_kernel_and_falls_back(
    kernel: PagedDecodeKernel, monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype
) -> None:
    x, weight = _layouts(dtype, 3)[2]
    calls: list[torch.Size] = []
    original = type(kernel).rms_norm

    def counting(
        self: PagedDecodeKernel, x: torch.Tensor, w: torch.Tensor, eps: float, threads: int
    ) -> torch.Tensor | None:
        calls.append(x.shape)
        return original(self, x, w, eps, threads)

    monkeypatch.setattr(type(kernel), "rms_norm", counting)
    native = model_module._rms_norm(x, weight, EPS)
    assert calls == [x.shape]
    monkeypatch.setattr(model_module, "load_paged_decode", lambda: None)
    fallback = model_module._rms_norm(x, weight, EPS)
    assert calls == [x.shape]  # no kernel: torch's path
    torch.testing.assert_close(
        native, fallback, rtol=2**-7 if dtype != torch.float32 else 2e-6, atol=2e-6
    )
