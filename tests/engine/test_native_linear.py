"""The native decode linear kernels (bfloat16 weights on AVX-512 BF16, int8 weights on VNNI):
equal to torch's matmul up to the last bfloat16 rounding, refused cleanly where they do not
apply, and what the model's projections and LM head use for a decode step's few rows."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from local_engine import model as model_module
from local_engine.attention.native import LINEAR_MAX_ROWS, PagedDecodeKernel
from local_engine.quant import (
    DequantScratch,
    Int4Weight,
    Int8Weight,
    dequantize_int4,
    quantize_int4_rows,
    quantize_rows,
)

# (N, K): the model's shapes at small scale, a K that is no multiple of the vector width
# (tails), and one weight large enough for the threads to split it.
SHAPES = [(96, 64), (50, 33), (130, 100), (2304, 1024)]


@pytest.fixture
def bf16_kernel(kernel: PagedDecodeKernel) -> PagedDecodeKernel:
    """The library where it holds the bfloat16 linear kernel."""
    if not kernel.bf16_linear:
        pytest.skip("this CPU (or compiler) has no AVX-512 BF16")
    return kernel


@pytest.fixture
def int8_kernel(kernel: PagedDecodeKernel) -> PagedDecodeKernel:
    """The library where it holds the int8 linear kernel."""
    if not kernel.int8_linear:
        pytest.skip("this CPU (or compiler) has no AVX-512 VNNI with BF16")
    return kernel


def _inputs(rows: int, n: int, k: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g).to(torch.bfloat16)
    weight = (0.1 * torch.randn(n, k, generator=g)).to(torch.bfloat16)
    bias = torch.randn(n, generator=g).to(torch.bfloat16)
    residual = torch.randn(rows, n, generator=g).to(torch.bfloat16)
    return x, weight, bias, residual


def _one_step_apart(got: torch.Tensor, exact: torch.Tensor) -> None:
    """``got`` is the float32 value ``exact`` rounded to bfloat16, give or take one bfloat16
    step (the kernel's sums run in another order than the reference's)."""
    step = torch.where(exact == 0, torch.tensor(2.0**-133), exact.abs() * 2.0**-7)
    assert ((got.float() - exact).abs() <= step + 1e-6).all()


@pytest.mark.parametrize(("n", "k"), SHAPES)
@pytest.mark.parametrize("rows", [1, 3, LINEAR_MAX_ROWS])
@pytest.mark.parametrize("threads", [1, 2])
def test_bf16_linear_matches_torch(
    bf16_kernel: PagedDecodeKernel, n: int, k: int, rows: int, threads: int
) -> None:
    x, weight, bias, residual = _inputs(rows, n, k, seed=n + k + rows)
    exact = x.float() @ weight.float().t()
    plain = bf16_kernel.linear(x, weight, None, None, threads)
    assert plain is not None and plain.dtype == torch.bfloat16 and plain.shape == (rows, n)
    _one_step_apart(plain, exact)
    # torch's own bfloat16 matmul rounds the same float32 sums: nearly always the same value
    assert (plain == F.linear(x, weight)).float().mean().item() > 0.97
    with_bias = bf16_kernel.linear(x, weight, bias, None, threads)
    assert with_bias is not None
    _one_step_apart(with_bias, exact + bias.float())
    # the residual rides in the one rounding, as torch.addmm(residual, x, weight.T) does
    with_residual = bf16_kernel.linear(x, weight, None, residual, threads)
    assert with_residual is not None
    _one_step_apart(with_residual, exact + residual.float())
    assert (with_residual == torch.addmm(residual, x, weight.t())).float().mean().item() > 0.97


def test_bf16_linear_takes_strided_rows(bf16_kernel: PagedDecodeKernel) -> None:
    x, weight, _, residual = _inputs(4, 96, 64, seed=1)
    wide = torch.zeros(4, 200, dtype=torch.bfloat16)
    wide[:, 10:74] = x
    wide_residual = torch.zeros(4, 300, dtype=torch.bfloat16)
    wide_residual[:, 5:101] = residual
    strided = bf16_kernel.linear(wide[:, 10:74], weight, None, wide_residual[:, 5:101], 1)
    packed = bf16_kernel.linear(x, weight, None, residual, 1)
    assert strided is not None and packed is not None
    assert torch.equal(strided, packed)


def test_bf16_linear_declines_what_it_does_not_take(bf16_kernel: PagedDecodeKernel) -> None:
    x, weight, bias, residual = _inputs(2, 96, 64, seed=2)
    too_many = torch.randn(LINEAR_MAX_ROWS + 1, 64).to(torch.bfloat16)
    declined: list[tuple[Any, ...]] = [
        (too_many, weight, None, None),  # a prefill's rows: torch's GEMM
        (x.float(), weight, None, None),
        (x, weight.float(), None, None),
        (x, weight.t().contiguous().t(), None, None),  # a transposed weight
        (x, weight[:, :32], None, None),  # K disagrees
        (x.t().contiguous().t(), weight, None, None),  # values not contiguous
        (x, weight, bias.float(), None),
        (x, weight, bias[:10], None),
        (x, weight, None, residual.float()),
        (x, weight, None, residual[:1]),
        (x[:0], weight, None, None),
    ]
    for args in declined:
        assert bf16_kernel.linear(*args, 1) is None


def _q8_reference(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """What the int8 kernel computes, the quantization in float32 as it does it and the
    products in float64: each x row in blocks of 32 values, scale max |x| / 127, codes
    round(x * 127 / max |x|) (half to even); the integer dot products with the weight codes,
    times the block scales and the row scales."""
    rows, k = x.shape
    blocks = F.pad(x.float(), (0, -k % 32)).view(rows, -1, 32)
    amax = blocks.abs().amax(dim=-1, keepdim=True)
    # tensor / tensor divides exactly (a scalar over a tensor would multiply by a reciprocal)
    inverse = torch.where(amax > 0, torch.full_like(amax, 127.0) / amax, torch.zeros_like(amax))
    q = torch.round(blocks * inverse)
    deq = (q.double() * (amax / 127.0).double()).view(rows, -1)[:, :k]
    return (deq @ codes.double().t()) * scales.double()


@pytest.mark.parametrize(("n", "k"), SHAPES)
@pytest.mark.parametrize("rows", [1, 3, LINEAR_MAX_ROWS])
@pytest.mark.parametrize("threads", [1, 2])
def test_int8_linear_is_the_q8_product(
    int8_kernel: PagedDecodeKernel, n: int, k: int, rows: int, threads: int
) -> None:
    x, weight, bias, residual = _inputs(rows, n, k, seed=3 * n + k + rows)
    codes, scales = quantize_rows(weight, torch.bfloat16)
    expected = _q8_reference(x, codes, scales)
    out = int8_kernel.linear_int8(x, codes, scales, None, None, threads)
    assert out is not None and out.dtype == torch.bfloat16 and out.shape == (rows, n)
    # float32 sums in another order than float64's, then one bfloat16 rounding
    torch.testing.assert_close(out.double(), expected, rtol=2**-7, atol=1e-3)
    fused = int8_kernel.linear_int8(x, codes, scales, bias, residual, threads)
    assert fused is not None
    want = expected + bias.double() + residual.double()
    torch.testing.assert_close(fused.double(), want, rtol=2**-7, atol=1e-2)
    # against the weight-only product (bfloat16 activations): activation quantization costs
    # a little, as llama.cpp's q8_0 does
    weight_only = x.float() @ (codes.float() * scales.float()[:, None]).t()
    cosine = F.cosine_similarity(out.float(), weight_only, dim=-1)
    assert cosine.min().item() > 0.9995


@pytest.mark.parametrize(("n", "k"), [(96, 64), (50, 96), (130, 160), (2304, 1024)])
@pytest.mark.parametrize("rows", [1, 3, LINEAR_MAX_ROWS])
@pytest.mark.parametrize("threads", [1, 2])
def test_int4_linear_is_the_q8_product(
    int8_kernel: PagedDecodeKernel, n: int, k: int, rows: int, threads: int
) -> None:
    x, weight, bias, residual = _inputs(rows, n, k, seed=5 * n + k + rows)
    packed, block_scales = quantize_int4_rows(weight, torch.bfloat16)
    dequantized = dequantize_int4(packed, block_scales.float(), rows=n)  # exact in float32
    expected = _q8_reference(x, dequantized, torch.ones(n))
    out = int8_kernel.linear_int4(x, packed, block_scales, None, None, threads, n)
    assert out is not None and out.dtype == torch.bfloat16 and out.shape == (rows, n)
    torch.testing.assert_close(out.double(), expected, rtol=2**-7, atol=1e-3)
    fused = int8_kernel.linear_int4(x, packed, block_scales, bias, residual, threads, n)
    assert fused is not None
    want = expected + bias.double() + residual.double()
    torch.testing.assert_close(fused.double(), want, rtol=2**-7, atol=1e-2)


@pytest.mark.parametrize(("n", "k"), [(96, 64), (50, 96), (2304, 1024)])
def test_int4_dequantize_kernel_is_torchs(int8_kernel: PagedDecodeKernel, n: int, k: int) -> None:
    packed, scales = quantize_int4_rows(torch.randn(n, k), torch.bfloat16)
    for threads in (1, 2):
        out = torch.empty(n, k, dtype=torch.bfloat16)
        assert int8_kernel.dequantize_int4(packed, scales, out, threads) is out
        assert torch.equal(out, dequantize_int4(packed, scales, rows=n))
    wrong = torch.empty(n, k, dtype=torch.float16)
    assert int8_kernel.dequantize_int4(packed, scales, wrong, 1) is None
    assert int8_kernel.dequantize_int4(packed, scales.float(), out, 1) is None


def test_int4_linear_declines_what_it_does_not_take(int8_kernel: PagedDecodeKernel) -> None:
    x, weight, _, _ = _inputs(2, 96, 64, seed=6)
    packed, scales = quantize_int4_rows(weight, torch.bfloat16)
    assert int8_kernel.linear_int4(x, packed, scales.float(), None, None, 1) is None
    assert int8_kernel.linear_int4(x, packed.view(torch.int8), scales, None, None, 1) is None
    assert int8_kernel.linear_int4(x, packed, scales[:, :1], None, None, 1) is None
    assert int8_kernel.linear_int4(x[:, :32], packed, scales, None, None, 1) is None
    # rows: the weight's 96 rows are six whole groups; 80 or fewer leave a group unused
    assert int8_kernel.linear_int4(x, packed, scales, None, None, 1, 80) is None
    assert int8_kernel.linear_int4(x, packed, scales, None, None, 1, 97) is None
    assert int8_kernel.linear_int4(x, packed[:95], scales[:95], None, None, 1) is None


def test_int8_linear_declines_what_it_does_not_take(int8_kernel: PagedDecodeKernel) -> None:
    x, weight, _, _ = _inputs(2, 96, 64, seed=4)
    codes, scales = quantize_rows(weight, torch.bfloat16)
    assert int8_kernel.linear_int8(x, codes, scales.float(), None, None, 1) is None
    assert int8_kernel.linear_int8(x, codes.to(torch.uint8), scales, None, None, 1) is None
    assert int8_kernel.linear_int8(x, codes, scales[:10], None, None, 1) is None
    too_many = torch.randn(LINEAR_MAX_ROWS + 1, 64).to(torch.bfloat16)
    assert int8_kernel.linear_int8(too_many, codes, scales, None, None, 1) is None


def _int8_weight(weight: torch.Tensor) -> Int8Weight:
    n, k = weight.shape
    w = Int8Weight(n, k, dtype=torch.bfloat16, device=torch.device("cpu"), scratch=DequantScratch())
    w.qweight, w.scales = quantize_rows(weight, torch.bfloat16)
    return w


def test_the_models_projections_take_the_kernels_for_decode_rows(
    bf16_kernel: PagedDecodeKernel, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []

    def counted(name: str) -> Callable[..., torch.Tensor | None]:
        original = getattr(type(bf16_kernel), name)

        def counting(self: PagedDecodeKernel, *args: Any) -> torch.Tensor | None:
            calls.append(name)
            result: torch.Tensor | None = original(self, *args)
            return result

        return counting

    for name in ("linear", "linear_int8", "linear_int4"):
        monkeypatch.setattr(type(bf16_kernel), name, counted(name))
    x, weight, bias, residual = _inputs(3, 96, 64, seed=5)
    decode = (
        model_module._linear(x, weight, bias),
        model_module._residual_linear(residual, x, weight),
    )
    assert calls == ["linear", "linear"]
    prefill_x = torch.randn(LINEAR_MAX_ROWS + 1, 64).to(torch.bfloat16)
    model_module._linear(prefill_x, weight)  # a prefill's rows: torch's GEMM, no call
    assert calls == ["linear", "linear"]
    int8 = _int8_weight(weight)
    int4 = Int4Weight(
        96, 64, dtype=torch.bfloat16, device=torch.device("cpu"), scratch=DequantScratch()
    )
    int4.rows(0, 96).copy_(weight)
    quantized = model_module._residual_linear(residual, x, int8)
    quantized4 = model_module._linear(x, int4, bias)
    expected_calls = ["linear", "linear", "linear_int8", "linear_int4"]
    assert calls == (expected_calls if bf16_kernel.int8_linear else expected_calls[:2])
    monkeypatch.setattr(model_module, "load_paged_decode", lambda: None)
    fallback = (
        model_module._linear(x, weight, bias),
        model_module._residual_linear(residual, x, weight),
    )
    for got, want in zip(decode, fallback, strict=True):
        torch.testing.assert_close(got, want, rtol=2**-7, atol=2**-7)
    torch.testing.assert_close(
        quantized, model_module._residual_linear(residual, x, int8), rtol=0.02, atol=0.05
    )
    torch.testing.assert_close(
        quantized4, model_module._linear(x, int4, bias), rtol=0.02, atol=0.05
    )
