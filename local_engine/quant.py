"""Int8 weight-only quantization: int8 weights with one scale per output channel.

A projection's weight ``W [N, K]`` is stored as int8 codes ``Q`` and scales ``s [N]`` (in the
activation dtype) with ``W ≈ Q * s[:, None]``; ``s`` is the row's largest magnitude over 127,
so every row uses the whole int8 range. Weights are quantized while the checkpoint is read,
from its own precision, a block of rows at a time (:class:`Int8Rows`): no float32 copy of a
whole matrix is made. Activations stay in bfloat16 (or float16) and accumulate in float32.

The matmul is chosen by the number of rows, by measurement on AVX-512 CPUs (the table is in
docs/architecture.md): up to :data:`DEQUANT_ROWS` rows, torch's fused int8 weight-only
kernel (``torch._weight_int8pack_mm``: it reads the int8 codes once, which at decode sizes,
where reading the weights is the cost, is 2.5-5x faster than a float32 or bfloat16 matmul);
above that, the kernel's per-row cost grows past a dense bfloat16 matmul's, so the weight is
dequantized into a scratch buffer shared by the model's layers and multiplied there.
"""

from __future__ import annotations

from typing import Literal, get_args

import torch
import torch.nn.functional as F
from torch import nn

from local_engine.errors import EngineConfigError

from .fp8 import Fp8Weight
from .weight_rows import QuantizedRows

__all__ = [
    "DEQUANT_ROWS",
    "QUANTIZATION_METHODS",
    "DequantScratch",
    "Int8Rows",
    "Int8Weight",
    "Quantization",
    "check_quantization",
    "linear",
    "quantize_rows",
]

Quantization = Literal["int8", "fp8"]
"""The weight quantization methods; ``None`` means weights in the model dtype."""

QUANTIZATION_METHODS: tuple[str, ...] = get_args(Quantization)

DEQUANT_ROWS = 64
"""Above this many rows a quantized matmul dequantizes the weight and runs a dense matmul."""

_PACK_K_MULTIPLE = 16  # the fused kernel's inner dimension must be a multiple of this


def check_quantization(value: object) -> Quantization | None:
    """Return ``value`` as a quantization method, or None for none.

    Raises:
        EngineConfigError: anything but None or one of :data:`QUANTIZATION_METHODS`.
    """
    if value is None:
        return None
    if value == "int8":
        return "int8"
    if value == "fp8":  # GPU only: see local_engine.fp8
        return "fp8"
    raise EngineConfigError(
        f"unknown quantization {value!r}: expected None or one of {', '.join(QUANTIZATION_METHODS)}"
    )


def quantize_rows(
    weight: torch.Tensor, scale_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``weight [N, K]`` per row: int8 codes ``[N, K]`` and scales ``[N]``.

    The scale is rounded to ``scale_dtype`` before the codes are computed, so the codes
    fit the scale the matmul will use. An all-zero row gets scale 1 and zero codes.
    """
    w = weight.detach().to(torch.float32)
    amax = w.abs().amax(dim=1)
    scales = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax)).to(scale_dtype)
    codes = torch.round(w / scales.to(torch.float32).unsqueeze(1)).clamp_(-127, 127)
    return codes.to(torch.int8), scales


class DequantScratch:
    """One growable buffer that the quantized weights of a model dequantize into in turn
    (one forward runs at a time, and each matmul is done before the next begins)."""

    def __init__(self) -> None:
        """Start empty; the buffer grows to the largest weight dequantized."""
        self._buffers: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}

    def get(self, shape: tuple[int, int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A ``shape`` view of the buffer for ``dtype`` on ``device`` (contents undefined)."""
        numel = shape[0] * shape[1]
        buf = self._buffers.get((dtype, device))
        if buf is None or buf.numel() < numel:
            buf = torch.empty(numel, dtype=dtype, device=device)
            self._buffers[(dtype, device)] = buf
        return buf[:numel].view(shape)


class Int8Weight(nn.Module):
    """A linear layer's weight ``[out_features, in_features]`` as int8 codes and per-row
    scales; :meth:`linear` is ``F.linear`` against it."""

    qweight: torch.Tensor
    scales: torch.Tensor

    def __init__(
        self,
        out_features: int,
        in_features: int,
        *,
        dtype: torch.dtype,
        device: torch.device,
        scratch: DequantScratch,
    ) -> None:
        """Allocate (uninitialized) codes and scales; ``dtype`` is the activation dtype."""
        super().__init__()
        self.register_buffer(
            "qweight", torch.empty(out_features, in_features, dtype=torch.int8, device=device)
        )
        self.register_buffer("scales", torch.empty(out_features, dtype=dtype, device=device))
        self._scratch = scratch
        self._packed_ok = in_features % _PACK_K_MULTIPLE == 0

    @property
    def shape(self) -> torch.Size:
        """The shape of the weight it stands for."""
        return self.qweight.shape

    @property
    def dtype(self) -> torch.dtype:
        """The activation dtype (of its scales and outputs)."""
        return self.scales.dtype

    def rows(self, start: int, stop: int) -> Int8Rows:
        """Rows ``start:stop`` as a load target."""
        return Int8Rows(self, start, stop)

    def dequantize(self, out: torch.Tensor | None = None) -> torch.Tensor:
        """The weight in the activation dtype (into ``out`` when given)."""
        if out is None:
            out = torch.empty(self.qweight.shape, dtype=self.dtype, device=self.qweight.device)
        return torch.mul(self.qweight, self.scales.unsqueeze(1), out=out)

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """``x [T, in_features] @ W.T (+ bias)`` in ``x``'s dtype, the scales' dtype.

        Raises:
            EngineConfigError: ``x`` is not 2-D or not in the scales' dtype.
        """
        if x.dim() != 2 or x.dtype != self.dtype:
            raise EngineConfigError(
                f"int8 linear takes 2-D {self.dtype} inputs, got {x.dtype} {tuple(x.shape)}"
            )
        if self._packed_ok and x.shape[0] <= DEQUANT_ROWS and x.stride(1) == 1:
            out = torch._weight_int8pack_mm(x, self.qweight, self.scales)
            return out if bias is None else out.add_(bias)
        rows, cols = self.qweight.shape
        weight = self.dequantize(self._scratch.get((rows, cols), x.dtype, x.device))
        return F.linear(x, weight, bias)


class Int8Rows(QuantizedRows):
    """A row range of an :class:`Int8Weight`, as the loader's copy target: ``copy_(src)``
    quantizes ``src`` (any float dtype) into those rows."""

    def quantize(self, src: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Codes and per-row scales for ``src``."""
        return quantize_rows(src, self.weight.scales.dtype)


def linear(
    x: torch.Tensor, weight: torch.Tensor | Int8Weight | Fp8Weight, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``F.linear`` for a dense, an int8 or an fp8 weight."""
    if isinstance(weight, Int8Weight | Fp8Weight):
        return weight.linear(x, bias)
    return F.linear(x, weight, bias)
