"""FP8 weights: scales, dequantization and the rowwise ``_scaled_mm`` path, checked on CPU
(torch implements ``_scaled_mm`` there too); the engine takes fp8 only on a capable GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from local_engine import LocalBackend
from local_engine.engine import EngineConfig
from local_engine.errors import EngineConfigError
from local_engine.fp8 import (
    FP8_DTYPE,
    FP8_MAX,
    Fp8Weight,
    check_fp8_device,
    dequantize_fp8_rows,
    quantize_fp8_rows,
)
from local_engine.loader import load_model
from local_engine.quant import check_quantization, linear
from swiftclient.errors import ConfigurationError

from .tiny import make_tiny_model


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(F.cosine_similarity(a.float().flatten(), b.float().flatten(), dim=0))


def test_scales_use_the_whole_fp8_range() -> None:
    torch.manual_seed(0)
    w = torch.randn(32, 48) * torch.logspace(-3, 2, 32).unsqueeze(1)
    w[5] = 0.0
    codes, scales = quantize_fp8_rows(w)
    assert codes.dtype == FP8_DTYPE and scales.dtype == torch.float32
    peak = codes.to(torch.float32).abs().amax(dim=1)
    nonzero = torch.arange(32) != 5
    assert torch.equal(peak[nonzero], torch.full_like(peak[nonzero], FP8_MAX))
    torch.testing.assert_close(scales[nonzero], w.abs().amax(dim=1)[nonzero] / FP8_MAX)
    assert not codes[5].to(torch.float32).any() and scales[5] > 0
    back = dequantize_fp8_rows(codes, scales)
    # e4m3 keeps 3 mantissa bits: each element within 1/16 of its magnitude, rows close.
    assert ((back - w).abs() <= w.abs() / 16 + scales.unsqueeze(1) * 2**-9).all()
    assert min(_cosine(back[i], w[i]) for i in range(32) if i != 5) > 0.999


@pytest.mark.parametrize("rows", [1, 7, 64])
def test_fp8_linear_matches_its_reference_and_the_dense_matmul(rows: int) -> None:
    torch.manual_seed(rows)
    dense = torch.randn(48, 64)
    weight = Fp8Weight(48, 64, device=torch.device("cpu"))
    weight.rows(0, 32).copy_(dense[:32])
    weight.rows(32, 48).copy_(dense[32:].to(torch.bfloat16))  # any float source dtype
    x = torch.randn(rows, 64).to(torch.bfloat16)
    out = linear(x, weight)
    assert out.dtype == torch.bfloat16 and out.shape == (rows, 48)
    torch.testing.assert_close(out.float(), weight.reference_linear(x), atol=2e-2, rtol=1e-2)
    assert _cosine(out, F.linear(x.float(), dense)) > 0.99
    bias = torch.randn(48).to(torch.bfloat16)
    torch.testing.assert_close(
        linear(x, weight, bias).float(), out.float() + bias.float(), atol=5e-2, rtol=1e-2
    )


def test_fp8_rejects_bad_shapes_and_inputs() -> None:
    with pytest.raises(EngineConfigError, match="multiples of 16"):
        Fp8Weight(48, 40, device=torch.device("cpu"))
    weight = Fp8Weight(16, 16, device=torch.device("cpu"))
    with pytest.raises(EngineConfigError, match="bfloat16"):
        weight.linear(torch.zeros(2, 16))
    with pytest.raises(EngineConfigError, match="expected"):
        weight.rows(0, 8).copy_(torch.zeros(4, 16))


def test_fp8_needs_a_capable_gpu(tmp_path: Path) -> None:
    assert check_quantization("fp8") == "fp8"
    with pytest.raises(EngineConfigError, match="CUDA GPU with fp8 tensor cores"):
        check_fp8_device(torch.device("cpu"))
    path = make_tiny_model(tmp_path, "qwen3")
    with pytest.raises(EngineConfigError, match="fp8"):
        load_model(path, quantization="fp8")
    with pytest.raises(ConfigurationError, match="expected None, 'int8', 'int4' or 'fp8'"):
        LocalBackend(path, quantization="fp4")  # type: ignore[arg-type]
    EngineConfig(quantization="fp8")  # a valid setting; the device decides at load time
