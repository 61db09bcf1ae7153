"""The native elementwise kernels (RMSNorm, q/k norm + RoPE, SwiGLU's SiLU-mul): equal to
torch's on every layout the model hands them, refused cleanly where they do not apply, and
what the model uses on CPU."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from local_engine import model as model_module
from local_engine.attention.native import (
    RMS_NORM_MAX_COLS,
    KernelError,
    PagedDecodeKernel,
)

EPS = 1e-6


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
@pytest.mark.parametrize("tokens", [1, 5, 2100])  # 2,100 rows of 512: the parallel path
def test_kernel_matches_torch(kernel: PagedDecodeKernel, dtype: torch.dtype, tokens: int) -> None:
    for x, weight in _layouts(dtype, tokens):
        for threads in (1, 2):
            out = kernel.rms_norm(x, weight, EPS, threads)
            assert out is not None and out.is_contiguous()
            expected = _reference(x, weight)
            assert out.shape == expected.shape and out.dtype == dtype
            if dtype == torch.float32:  # the same sums in another order: a few ulps
                torch.testing.assert_close(out, expected, rtol=2e-6, atol=2e-6)
            else:  # the same float32 value rounded the same way, but for 1/sqrt vs rsqrt:
                # at most one bfloat16 step (2**-7 of the value, 2**-6 just below a power of 2)
                torch.testing.assert_close(out, expected, rtol=2**-6, atol=0)
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


def _tables(dtype: torch.dtype, max_pos: int = 512, dim: int = 64) -> tuple[torch.Tensor, ...]:
    """The model's rotary half tables ``[max_pos, dim // 2]`` in ``dtype``."""
    inv_freq = model_module.rope_inverse_frequencies(dim, 10000.0, None)
    freqs = torch.arange(max_pos, dtype=torch.float32)[:, None] * inv_freq[None, :]
    return freqs.cos().to(dtype), freqs.sin().to(dtype)


def _rotate_reference(
    x: torch.Tensor, cos_t: torch.Tensor, sin_t: torch.Tensor, positions: torch.Tensor
) -> torch.Tensor:
    """transformers' form: ``x * cos + rotate_half(x) * sin``, unfused, in x's dtype."""
    half = x.shape[-1] // 2
    cos = torch.cat((cos_t[positions], cos_t[positions]), dim=-1).unsqueeze(1)
    sin = torch.cat((sin_t[positions], sin_t[positions]), dim=-1).unsqueeze(1)
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens", [1, 7, 420])  # 420 rows of 10 heads: the parallel path
def test_rope_matches_the_transformers_form(
    kernel: PagedDecodeKernel, dtype: torch.dtype, tokens: int
) -> None:
    """Without a norm the rotation is transformers' bit for bit (each product rounded before
    the sum); with one it equals torch's norm followed by that rotation."""
    cos_t, sin_t = _tables(dtype)
    positions = torch.randint(0, 512, (tokens,), generator=torch.Generator().manual_seed(1))
    for x, weight in _layouts(dtype, tokens)[1:]:  # strided [T, 10, 64] views of q/k heads
        for threads in (1, 2):
            plain = kernel.rope(x, None, EPS, cos_t, sin_t, positions, threads)
            assert plain is not None and plain.is_contiguous() and plain.dtype == dtype
            assert torch.equal(plain, _rotate_reference(x, cos_t, sin_t, positions))
            normed = kernel.rope(x, weight, EPS, cos_t, sin_t, positions, threads)
            assert normed is not None
            expected = _rotate_reference(_reference(x, weight), cos_t, sin_t, positions)
            if dtype == torch.float32:
                torch.testing.assert_close(normed, expected, rtol=4e-6, atol=4e-6)
            else:
                torch.testing.assert_close(normed, expected, rtol=2**-7, atol=2**-7)
                assert (normed == expected).float().mean().item() > 0.99
    assert torch.equal(_layouts(dtype, tokens)[1][0], x)  # the input is left alone


def test_rope_declines_what_it_does_not_take(kernel: PagedDecodeKernel) -> None:
    cos_t, sin_t = _tables(torch.float32)
    x = torch.randn(3, 4, 64)
    pos = torch.arange(3)
    assert kernel.rope(x.half(), None, EPS, cos_t, sin_t, pos, 1) is None  # float16
    assert kernel.rope(x, None, EPS, cos_t.bfloat16(), sin_t, pos, 1) is None  # table dtype
    assert kernel.rope(x, None, EPS, cos_t, sin_t, pos.int(), 1) is None  # int32 positions
    assert kernel.rope(x, None, EPS, cos_t, sin_t, pos[:2], 1) is None  # a position short
    assert kernel.rope(x[..., :63], None, EPS, cos_t, sin_t, pos, 1) is None  # odd width
    assert kernel.rope(x, torch.ones(5, 64), EPS, cos_t, sin_t, pos, 1) is None  # 5 heads
    assert kernel.rope(x[0], None, EPS, cos_t, sin_t, pos, 1) is None  # 2-D
    with pytest.raises(KernelError, match=r"outside the rotary tables \[0, 512\)"):
        kernel.rope(x, None, EPS, cos_t, sin_t, torch.tensor([0, 1, 512]), 1)
    assert kernel.rope(x[:0], None, EPS, cos_t, sin_t, pos[:0], 1) is not None  # no tokens


def _silu_inputs(dtype: torch.dtype, tokens: int, cols: int = 200) -> torch.Tensor:
    """A fused gate/up output ``[T, 2 * cols]`` as a strided view (rows 16 values apart more
    than they hold); 200 columns leave an 8-wide tail after the 16-wide vectors, 1,000 split a
    row into 512-column tasks; gates out to +-110, past the exp argument's clamp at 100."""
    g = torch.Generator().manual_seed(tokens)
    wide = torch.randn(tokens, 2 * cols + 16, generator=g) * 6
    wide[:, :6] = torch.tensor([0.0, -95.0, 95.0, -20.0, 110.0, -110.0])
    return wide.to(dtype)[:, : 2 * cols]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("tokens", "cols"), [(1, 200), (3, 200), (2, 1000), (600, 1000)])
def test_silu_mul_matches_torch(
    kernel: PagedDecodeKernel, dtype: torch.dtype, tokens: int, cols: int
) -> None:
    """1,000 columns split a row into 512-column tasks; 600 rows of them take the parallel
    path."""
    if not kernel.vector_activation:
        pytest.skip("the SiLU-mul kernel is built for AVX-512 only")
    gate_up = _silu_inputs(dtype, tokens, cols)
    gate, up = gate_up.chunk(2, dim=-1)
    expected = F.silu(gate) * up
    for threads in (1, 2):
        out = kernel.silu_mul(gate_up, threads)
        assert out is not None and out.is_contiguous() and out.shape == expected.shape
        if dtype == torch.float32:  # exp within 2 ulp: a few ulps in all
            torch.testing.assert_close(out, expected, rtol=5e-7, atol=1e-30)
        else:  # silu rounded to bfloat16, then the product: as torch rounds them (one step)
            torch.testing.assert_close(out, expected, rtol=2**-6, atol=0)
            assert (out == expected).float().mean().item() > 0.99
    nan = gate_up.clone()
    nan[0, 5] = float("nan")
    out = kernel.silu_mul(nan, 1)
    assert out is not None and out[0, 5].isnan() and not out[0, 6:].isnan().any()


def test_silu_mul_declines_what_it_does_not_take(kernel: PagedDecodeKernel) -> None:
    """Every check here is made before the library is called, so it holds on any build."""
    gate_up = torch.randn(4, 64)
    vector = dataclasses.replace(kernel, vector_activation=True)
    assert vector.silu_mul(gate_up.half(), 1) is None  # float16
    assert vector.silu_mul(gate_up[:, :63], 1) is None  # odd width: no equal halves
    assert vector.silu_mul(gate_up.t(), 1) is None  # values not contiguous
    assert vector.silu_mul(gate_up[None], 1) is None  # 3-D
    overlapping = torch.randn(112).as_strided((4, 64), (16, 1))
    assert vector.silu_mul(overlapping, 1) is None  # rows overlap
    without = dataclasses.replace(kernel, vector_activation=False)
    assert without.silu_mul(gate_up, 1) is None  # a build without the vector path


def test_silu_mul_takes_a_single_row_of_any_stride(kernel: PagedDecodeKernel) -> None:
    if not kernel.vector_activation:
        pytest.skip("the SiLU-mul kernel is built for AVX-512 only")
    column = torch.randn(64, 1)
    row = column.t()  # [1, 64] with strides (1, 1)
    out = kernel.silu_mul(row, 1)
    gate, up = row.chunk(2, dim=-1)
    assert out is not None
    torch.testing.assert_close(out, F.silu(gate) * up, rtol=5e-7, atol=1e-30)
    assert kernel.silu_mul(row[:0], 1) is not None  # no rows


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_models_rope_and_activation_take_the_kernel_and_fall_back(
    kernel: PagedDecodeKernel, monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype
) -> None:
    x, weight = _layouts(dtype, 5)[2]
    cos_t, sin_t = _tables(dtype)
    rotary = model_module.Rotary(torch.tensor([0, 3, 9, 100, 511]), cos_t, sin_t)
    gate_up = _silu_inputs(dtype, 5)
    calls: list[str] = []

    def counted(name: str) -> Callable[..., torch.Tensor | None]:
        original = getattr(type(kernel), name)

        def counting(self: PagedDecodeKernel, *args: Any) -> torch.Tensor | None:
            calls.append(name)
            result: torch.Tensor | None = original(self, *args)
            return result

        return counting

    for name in ("rope", "silu_mul"):
        monkeypatch.setattr(type(kernel), name, counted(name))
    native = model_module._qk_rope(x, weight, EPS, rotary), model_module._swiglu(gate_up)
    expected_calls = ["rope", "silu_mul"] if kernel.vector_activation else ["rope"]
    assert calls == expected_calls
    monkeypatch.setattr(model_module, "load_paged_decode", lambda: None)
    fallback = model_module._qk_rope(x, weight, EPS, rotary), model_module._swiglu(gate_up)
    assert calls == expected_calls  # no kernel: torch's path
    tol = 2**-7 if dtype != torch.float32 else 4e-6
    for got, want in zip(native, fallback, strict=True):
        torch.testing.assert_close(got, want, rtol=tol, atol=tol)
