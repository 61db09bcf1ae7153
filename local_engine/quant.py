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
dequantized into a scratch buffer shared by the model's layers and multiplied there. On CPUs
with AVX-512 VNNI and BF16 a decode step's few rows take the native kernel instead
(:mod:`local_engine.model`), which quantizes the activations too (blocks of 32, as llama.cpp's
q8_0 does).

``quantization="int4"`` stores 4-bit codes with one scale per block of 32 values along each
row (llama.cpp's q4_0 layout of the numbers: the block's value of largest magnitude maps to
-8, codes in [-8, 7]), half the bytes of int8. Decode steps run the native kernel, which
reads the packed codes; other steps (and CPUs without the kernel) dequantize the weight into
the shared scratch buffer and run a dense matmul. In-features must be a multiple of 32.
"""

from __future__ import annotations

from typing import Literal, get_args

import torch
import torch.nn.functional as F
from torch import nn

from local_engine.errors import EngineConfigError

from .attention.native import load_paged_decode
from .fp8 import Fp8Weight
from .weight_rows import QuantizedRows

__all__ = [
    "DEQUANT_ROWS",
    "INT4_BLOCK",
    "Int4Rows",
    "Int4Weight",
    "dequantize_int4",
    "quantize_int4_rows",
    "QUANTIZATION_METHODS",
    "DequantScratch",
    "Int8Rows",
    "Int8Weight",
    "Quantization",
    "QuantizedWeight",
    "check_quantization",
    "linear",
    "quantize_rows",
]

Quantization = Literal["int8", "int4", "fp8"]
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
    if value == "int4":
        return "int4"
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


INT4_BLOCK = 32
"""Values per int4 scale, along a row."""


def quantize_int4_rows(
    weight: torch.Tensor, scale_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``weight [N, K]`` (``K`` a multiple of 32) to packed int4 codes
    ``[N, K / 2]`` (uint8) and scales ``[N, K / 32]``.

    Each block of 32 values along a row gets the scale ``v / -8`` for its value ``v`` of
    largest magnitude (rounded to ``scale_dtype`` first), codes ``round(w / scale)`` in
    [-8, 7], stored as ``code + 8``. Packing, per 64 values of a row (the last 32 when ``K``
    is an odd multiple of 32): value ``i`` in the low nibble of byte ``i``, value
    ``i + 32`` (``i + 16``) in its high nibble, as the native kernel reads them. An all-zero
    block gets scale 0 and code 0.

    Raises:
        EngineConfigError: ``K`` is not a multiple of 32.
    """
    n, k = weight.shape
    if k % INT4_BLOCK:
        raise EngineConfigError(
            f"int4 weights need in_features divisible by {INT4_BLOCK}; this weight is {n}x{k}"
        )
    blocks = weight.detach().to(torch.float32).view(n, k // INT4_BLOCK, INT4_BLOCK)
    extreme = blocks.gather(-1, blocks.abs().argmax(dim=-1, keepdim=True)).squeeze(-1)
    scales = (extreme / -8.0).to(scale_dtype)
    wide = scales.to(torch.float32).unsqueeze(-1)
    safe = torch.where(wide == 0, torch.ones_like(wide), wide)
    codes = torch.where(wide == 0, 0.0, torch.round(blocks / safe)).clamp_(-8, 7)
    stored = (codes + 8).to(torch.uint8).view(n, k)
    return _pack_nibbles(stored), scales


def _pack_nibbles(stored: torch.Tensor) -> torch.Tensor:
    """Pack ``[N, K]`` values 0..15 as :func:`quantize_int4_rows` describes."""
    n, k = stored.shape
    full = k // 64 * 64
    parts = []
    if full:
        chunks = stored[:, :full].reshape(n, full // 64, 2, 32)
        parts.append((chunks[:, :, 0] | (chunks[:, :, 1] << 4)).reshape(n, full // 2))
    if k > full:
        tail = stored[:, full:].reshape(n, 2, 16)
        parts.append(tail[:, 0] | (tail[:, 1] << 4))
    return torch.cat(parts, dim=1) if len(parts) > 1 else parts[0].contiguous()


def dequantize_int4(
    packed: torch.Tensor, scales: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """The weight ``[N, K]`` in ``scales``' dtype (into ``out`` when given) from
    :func:`quantize_int4_rows`' codes and scales."""
    n, k = packed.shape[0], packed.shape[1] * 2
    full = k // 64 * 64
    parts = []
    if full:
        chunks = packed[:, : full // 2].reshape(n, full // 64, 1, 32)
        parts.append(torch.cat((chunks & 15, chunks >> 4), dim=2).reshape(n, full))
    if k > full:
        tail = packed[:, full // 2 :]
        parts.append(torch.cat((tail & 15, tail >> 4), dim=1))
    stored = torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]
    values = (stored.to(torch.float32) - 8).view(n, k // INT4_BLOCK, INT4_BLOCK)
    weight = (values * scales.to(torch.float32).unsqueeze(-1)).view(n, k)
    if out is None:
        return weight.to(scales.dtype)
    return out.copy_(weight)


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


class _CodedWeight(nn.Module):
    """What the int8 and int4 weights share: codes, scales in the activation dtype, and the
    model's dequantization scratch buffer."""

    qweight: torch.Tensor
    scales: torch.Tensor

    def __init__(self, codes: torch.Tensor, scales: torch.Tensor, scratch: DequantScratch) -> None:
        """Hold ``codes`` and ``scales`` as buffers (uninitialized until loaded)."""
        super().__init__()
        self.register_buffer("qweight", codes)
        self.register_buffer("scales", scales)
        self._scratch = scratch

    @property
    def dtype(self) -> torch.dtype:
        """The activation dtype (of its scales and outputs)."""
        return self.scales.dtype


class Int8Weight(_CodedWeight):
    """A linear layer's weight ``[out_features, in_features]`` as int8 codes and per-row
    scales; :meth:`linear` is ``F.linear`` against it."""

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
        codes = torch.empty(out_features, in_features, dtype=torch.int8, device=device)
        super().__init__(codes, torch.empty(out_features, dtype=dtype, device=device), scratch)
        self._packed_ok = in_features % _PACK_K_MULTIPLE == 0

    @property
    def shape(self) -> torch.Size:
        """The shape of the weight it stands for."""
        return self.qweight.shape

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


class Int4Weight(_CodedWeight):
    """A linear layer's weight ``[out_features, in_features]`` as packed int4 codes and one
    scale per 32 values of a row (:func:`quantize_int4_rows`); :meth:`linear` is
    ``F.linear`` against it."""

    def __init__(
        self,
        out_features: int,
        in_features: int,
        *,
        dtype: torch.dtype,
        device: torch.device,
        scratch: DequantScratch,
    ) -> None:
        """Allocate (uninitialized) codes and scales; ``dtype`` is the activation dtype.

        Raises:
            EngineConfigError: ``in_features`` is not a multiple of 32.
        """
        if in_features % INT4_BLOCK:
            raise EngineConfigError(
                f"int4 weights need in_features divisible by {INT4_BLOCK}; this model has a "
                f"{out_features}x{in_features} projection (use int8)"
            )
        codes = torch.empty(out_features, in_features // 2, dtype=torch.uint8, device=device)
        blocks = in_features // INT4_BLOCK
        super().__init__(
            codes, torch.empty(out_features, blocks, dtype=dtype, device=device), scratch
        )

    @property
    def shape(self) -> torch.Size:
        """The shape of the weight it stands for."""
        return torch.Size((self.qweight.shape[0], self.qweight.shape[1] * 2))

    def rows(self, start: int, stop: int) -> Int4Rows:
        """Rows ``start:stop`` as a load target."""
        return Int4Rows(self, start, stop)

    def dequantize(self, out: torch.Tensor | None = None) -> torch.Tensor:
        """The weight in the activation dtype (into ``out`` when given; on CPU the native
        kernel writes it where it loads)."""
        if (
            out is not None
            and out.device.type == "cpu"
            and (kernel := load_paged_decode()) is not None
            and (
                done := kernel.dequantize_int4(
                    self.qweight, self.scales, out, torch.get_num_threads()
                )
            )
            is not None
        ):
            return done
        return dequantize_int4(self.qweight, self.scales, out)

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """``x [T, in_features] @ W.T (+ bias)`` in ``x``'s dtype, the scales' dtype, through
        the dequantized weight.

        Raises:
            EngineConfigError: ``x`` is not 2-D or not in the scales' dtype.
        """
        if x.dim() != 2 or x.dtype != self.dtype:
            raise EngineConfigError(
                f"int4 linear takes 2-D {self.dtype} inputs, got {x.dtype} {tuple(x.shape)}"
            )
        weight = self._scratch.get(tuple(self.shape), x.dtype, x.device)  # type: ignore[arg-type]
        return F.linear(x, self.dequantize(weight), bias)


class Int4Rows(QuantizedRows):
    """A row range of an :class:`Int4Weight`, as the loader's copy target."""

    def quantize(self, src: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Packed codes and block scales for ``src``."""
        return quantize_int4_rows(src, self.weight.scales.dtype)


QuantizedWeight = Int8Weight | Int4Weight | Fp8Weight
"""The quantized weight types a model's projections may hold."""


def linear(
    x: torch.Tensor, weight: torch.Tensor | QuantizedWeight, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``F.linear`` for a dense, an int8, an int4 or an fp8 weight."""
    if isinstance(weight, torch.Tensor):
        return F.linear(x, weight, bias)
    return weight.linear(x, bias)
