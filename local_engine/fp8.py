"""FP8 weights with rowwise scales, multiplied by ``torch._scaled_mm`` (GPU path).

A projection's weight ``W [N, K]`` is stored as float8 e4m3 codes ``Q`` and float32 scales
``s [N]`` with ``W ≈ Q * s[:, None]``; ``s`` is the row's largest magnitude over the format's
largest finite value (448), so each row uses the whole fp8 range. Activations are quantized
the same way per token at each matmul, and ``torch._scaled_mm`` multiplies the two fp8
operands on the tensor cores, applies both scales and writes bfloat16. Weights are quantized
while the checkpoint is read (:class:`Fp8Rows`), from the checkpoint's own precision.

The engine takes fp8 only on a CUDA GPU with fp8 tensor cores (compute capability 8.9 or
newer: Ada, Hopper such as the H200, Blackwell); :func:`check_fp8_device` says why not
elsewhere. The arithmetic itself is device-neutral, so its tests run on CPU (where torch
also implements ``_scaled_mm``) against :meth:`Fp8Weight.reference_linear`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from local_engine.errors import EngineConfigError

from .weight_rows import QuantizedRows

__all__ = [
    "FP8_DTYPE",
    "FP8_MAX",
    "Fp8Rows",
    "Fp8Weight",
    "check_fp8_device",
    "dequantize_fp8_rows",
    "quantize_fp8_rows",
]

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)
_MIN_CAPABILITY = (8, 9)
_MULTIPLE = 16  # _scaled_mm needs both matrix dimensions of the weight to be multiples of 16


def quantize_fp8_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``x [N, K]`` per row: float8 e4m3 codes ``[N, K]`` and float32 scales ``[N]``.

    An all-zero row gets the smallest positive scale and zero codes.
    """
    w = x.detach().to(torch.float32)
    amax = w.abs().amax(dim=1)
    scales = (amax / FP8_MAX).clamp_(min=torch.finfo(torch.float32).tiny)
    codes = (w / scales.unsqueeze(1)).clamp_(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return codes, scales


def dequantize_fp8_rows(
    codes: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """``codes * scales[:, None]`` in ``dtype``: the weight the codes stand for."""
    return (codes.to(torch.float32) * scales.unsqueeze(1)).to(dtype)


def check_fp8_device(device: torch.device) -> None:
    """Raise unless ``device`` is a CUDA GPU that runs fp8 matmuls.

    Raises:
        EngineConfigError: a CPU (or other) device, or a GPU older than compute
            capability 8.9, or a torch without ``_scaled_mm``.
    """
    if device.type != "cuda":
        raise EngineConfigError(
            f"fp8 weights need a CUDA GPU with fp8 tensor cores (compute capability 8.9+, "
            f"e.g. an H100 or H200), not {device.type}; on CPU use quantization='int8'"
        )
    capability = torch.cuda.get_device_capability(device)
    if capability < _MIN_CAPABILITY or not hasattr(torch, "_scaled_mm"):
        raise EngineConfigError(
            f"fp8 weights need compute capability 8.9 or newer and torch._scaled_mm; "
            f"this GPU has {capability[0]}.{capability[1]}: use dtype='bfloat16' instead"
        )


class Fp8Weight(nn.Module):
    """A linear layer's weight ``[out_features, in_features]`` as fp8 codes and per-row
    float32 scales; :meth:`linear` is ``F.linear`` against it, in bfloat16."""

    qweight: torch.Tensor
    scales: torch.Tensor

    def __init__(self, out_features: int, in_features: int, *, device: torch.device) -> None:
        """Allocate (uninitialized) codes and scales.

        Raises:
            EngineConfigError: a dimension that is not a multiple of 16.
        """
        super().__init__()
        if out_features % _MULTIPLE or in_features % _MULTIPLE:
            raise EngineConfigError(
                f"fp8 weights need dimensions that are multiples of {_MULTIPLE}, "
                f"got {out_features}x{in_features}"
            )
        self.register_buffer(
            "qweight", torch.empty(out_features, in_features, dtype=FP8_DTYPE, device=device)
        )
        self.register_buffer(
            "scales", torch.empty(out_features, dtype=torch.float32, device=device)
        )

    @property
    def shape(self) -> torch.Size:
        """The shape of the weight it stands for."""
        return self.qweight.shape

    def rows(self, start: int, stop: int) -> Fp8Rows:
        """Rows ``start:stop`` as a load target."""
        return Fp8Rows(self, start, stop)

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """``x [T, in_features] @ W.T (+ bias)``: ``x`` quantized per token, bfloat16 out.

        Raises:
            EngineConfigError: ``x`` is not a 2-D bfloat16 tensor.
        """
        if x.dim() != 2 or x.dtype != torch.bfloat16:
            raise EngineConfigError(
                f"fp8 linear takes 2-D bfloat16 inputs, got {x.dtype} {tuple(x.shape)}"
            )
        codes, scales = quantize_fp8_rows(x)
        return torch._scaled_mm(
            codes,
            self.qweight.t(),
            scale_a=scales.unsqueeze(1),
            scale_b=self.scales.unsqueeze(0),
            bias=bias,
            out_dtype=torch.bfloat16,
        )

    def reference_linear(self, x: torch.Tensor) -> torch.Tensor:
        """What :meth:`linear` computes, in float32 from dequantized operands (for tests)."""
        codes, scales = quantize_fp8_rows(x)
        weight = dequantize_fp8_rows(self.qweight, self.scales)
        return F.linear(dequantize_fp8_rows(codes, scales), weight)


class Fp8Rows(QuantizedRows):
    """A row range of an :class:`Fp8Weight`, as the loader's copy target: ``copy_(src)``
    quantizes ``src`` (any float dtype) into those rows."""

    def quantize(self, src: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Codes and per-row scales for ``src``."""
        return quantize_fp8_rows(src)
