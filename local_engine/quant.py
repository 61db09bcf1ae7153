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
-8, codes in [-8, 7]), half the bytes of int8, stored in groups of 16 rows
(:func:`quantize_int4_rows`) so that the native kernel's dot products run on 16 rows at once.
Decode steps run that kernel, which reads the packed codes; other steps (and CPUs without
the kernel) dequantize the weight into the shared scratch buffer and run a dense matmul.
In-features must be a multiple of 32.
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
    "INT4_GROUP",
    "Int4Rows",
    "Int4Weight",
    "deinterleave_int4",
    "dequantize_int4",
    "int4_blocks",
    "interleave_int4",
    "quantize_int4_rows",
    "QUANTIZATION_METHODS",
    "DequantScratch",
    "Int8Rows",
    "Int8Weight",
    "PackedWeight",
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


INT4_GROUP = 16
"""Rows per group of the int4 layout (:func:`quantize_int4_rows`)."""


def quantize_int4_rows(
    weight: torch.Tensor, scale_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``weight [N, K]`` (``K`` a multiple of 32) to packed int4 codes
    ``[N', K / 2]`` (uint8) and scales ``[N', K / 32]``, ``N'`` being ``N`` rounded up to a
    multiple of 16 (the padding rows: codes 0, scales 0).

    Each block of 32 values along a row gets the scale ``v / -8`` for its value ``v`` of
    largest magnitude (rounded to ``scale_dtype`` first), codes ``round(w / scale)`` in
    [-8, 7], stored as ``code + 8`` (:func:`int4_blocks`). The layout
    (:func:`interleave_int4`) keeps 16 rows together, as the native kernel reads them.

    Raises:
        EngineConfigError: ``K`` is not a multiple of 32.
    """
    return interleave_int4(*int4_blocks(weight, scale_dtype))


def int4_blocks(
    weight: torch.Tensor, scale_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """The stored codes ``[N, K]`` (uint8, ``code + 8`` in 0..15) and block scales
    ``[N, K / 32]`` of ``weight [N, K]``, row by row (:func:`quantize_int4_rows` before the
    layout); an all-zero block gets scale 0 and code 0.

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
    return (codes + 8).to(torch.uint8).view(n, k), scales


def interleave_int4(
    stored: torch.Tensor, scales: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Lay out stored codes ``[N, K]`` (0..15) and block scales ``[N, K / 32]`` as the int4
    weights keep them: rows padded to a multiple of 16 (codes 0, scales 0) and taken 16 at a
    time. Per group of 16 rows and block of 32 values, 256 bytes: four slices ``m`` of the
    16 rows' 4 bytes each, byte ``j`` of a row's 4 in slice ``m`` holding the block's value
    ``4m + j`` in its low nibble and value ``16 + 4m + j`` in its high nibble (a row's 16
    bytes, slice after slice, are llama.cpp's q4_0 bytes); the scales, per group and block,
    the 16 rows' in turn. Returns ``[N', K / 2]`` uint8 and ``[N', K / 32]``."""
    n, k = stored.shape
    padded = -(-n // INT4_GROUP) * INT4_GROUP
    if padded != n:
        stored = torch.cat((stored, stored.new_zeros(padded - n, k)))
        scales = torch.cat((scales, scales.new_zeros(padded - n, scales.shape[1])))
    groups, blocks = padded // INT4_GROUP, k // INT4_BLOCK
    # (group, row, block, nibble, 16 values): value 16 * nibble + 4 * slice + byte
    values = stored.reshape(groups, INT4_GROUP, blocks, 2, 16)
    rows = (values[:, :, :, 0] | (values[:, :, :, 1] << 4)).contiguous()  # q4_0's 16 bytes
    # a slice's 4 bytes as one int32: the permute moves words, not bytes
    words = rows.view(torch.int32).permute(0, 2, 3, 1).contiguous()  # (group, block, slice, row)
    grouped = scales.reshape(groups, INT4_GROUP, blocks).permute(0, 2, 1).contiguous()
    return words.view(torch.uint8).view(padded, k // 2), grouped.view(padded, blocks)


def deinterleave_int4(
    packed: torch.Tensor, scales: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The stored codes ``[N', K]`` and block scales ``[N', K / 32]`` of
    :func:`interleave_int4`'s layout, rows in order (the padding rows included)."""
    padded, half = packed.shape
    groups, blocks = padded // INT4_GROUP, half // 16
    words = packed.contiguous().view(torch.int32).reshape(groups, blocks, 4, INT4_GROUP)
    rows = words.permute(0, 3, 1, 2).contiguous().view(torch.uint8)  # (group, row, block, 16)
    stored = torch.stack((rows & 15, rows >> 4), dim=3).reshape(padded, half * 2)
    rows = scales.reshape(groups, blocks, INT4_GROUP).permute(0, 2, 1).reshape(padded, blocks)
    return stored, rows


def dequantize_int4(
    packed: torch.Tensor,
    scales: torch.Tensor,
    out: torch.Tensor | None = None,
    rows: int | None = None,
) -> torch.Tensor:
    """The weight ``[N, K]`` in ``scales``' dtype (into ``out`` when given) from
    :func:`quantize_int4_rows`' codes and scales; ``N`` is ``out``'s rows, else ``rows``,
    else every stored row (the padding included)."""
    stored, block_scales = deinterleave_int4(packed, scales)
    n = out.shape[0] if out is not None else stored.shape[0] if rows is None else rows
    k = stored.shape[1]
    values = (stored[:n].to(torch.float32) - 8).view(n, k // INT4_BLOCK, INT4_BLOCK)
    weight = (values * block_scales[:n].to(torch.float32).unsqueeze(-1)).view(n, k)
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
        # Zeros: the padding rows of the last group are never loaded.
        padded = -(-out_features // INT4_GROUP) * INT4_GROUP
        codes = torch.zeros(padded, in_features // 2, dtype=torch.uint8, device=device)
        blocks = in_features // INT4_BLOCK
        super().__init__(codes, torch.zeros(padded, blocks, dtype=dtype, device=device), scratch)
        self.out_features = out_features

    @property
    def shape(self) -> torch.Size:
        """The shape of the weight it stands for."""
        return torch.Size((self.out_features, self.qweight.shape[1] * 2))

    def rows(self, start: int, stop: int) -> Int4Rows:
        """Rows ``start:stop`` as a load target.

        Raises:
            EngineConfigError: the range is not within the weight's rows (the padding of its
                last group is no row).
        """
        if not 0 <= start <= stop <= self.out_features:
            raise EngineConfigError(
                f"rows {start}:{stop} are not within the {self.out_features} rows of this "
                "int4 weight"
            )
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
        return dequantize_int4(self.qweight, self.scales, out, self.out_features)

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

    row_multiple = INT4_GROUP

    def quantize(self, src: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Stored codes and block scales for ``src``, row by row (:func:`int4_blocks`)."""
        return int4_blocks(src, self.weight.scales.dtype)

    def write(self, stored: torch.Tensor, scales: torch.Tensor) -> None:
        """Write the rows' stored codes ``[rows, K]`` (0..15) and block scales
        ``[rows, K / 32]`` as they are (a checkpoint already in int4's blocks).

        Raises:
            EngineConfigError: ``stored`` or ``scales`` has another shape.
        """
        rows, k = self.stop - self.start, self.weight.shape[1]
        if tuple(stored.shape) != (rows, k) or tuple(scales.shape) != (rows, k // INT4_BLOCK):
            raise EngineConfigError(
                f"expected int4 codes {(rows, k)} and scales {(rows, k // INT4_BLOCK)}, got "
                f"{tuple(stored.shape)} and {tuple(scales.shape)}"
            )
        if stored.numel() and int(stored.max()) > 15:
            raise EngineConfigError(
                f"int4 stored codes are 0..15 (code + 8), got {int(stored.max())}"
            )
        with torch.no_grad():
            self._store(self.start, self.stop, stored, scales)

    def _store(self, start: int, stop: int, codes: torch.Tensor, scales: torch.Tensor) -> None:
        """Write rows ``start:stop`` into the 16-row groups that hold them (the groups are
        read back, changed and laid out again: rows of a group may come in separate
        writes)."""
        weight = self.weight
        assert isinstance(weight, Int4Weight)
        if start % INT4_GROUP == 0 and (stop % INT4_GROUP == 0 or stop == weight.out_features):
            # whole groups (the last one's padding rows zero): nothing to read back
            packed, grouped = interleave_int4(codes, scales)
            weight.qweight[start : start + packed.shape[0]].copy_(packed)
            weight.scales[start : start + packed.shape[0]].copy_(grouped)
            return
        lo = start // INT4_GROUP * INT4_GROUP
        hi = -(-stop // INT4_GROUP) * INT4_GROUP
        stored, block_scales = deinterleave_int4(weight.qweight[lo:hi], weight.scales[lo:hi])
        stored[start - lo : stop - lo] = codes
        block_scales[start - lo : stop - lo] = scales
        packed, grouped = interleave_int4(stored, block_scales)
        weight.qweight[lo:hi].copy_(packed)
        weight.scales[lo:hi].copy_(grouped)


class PackedWeight(nn.Module):
    """A bfloat16 linear weight ``[out_features, in_features]`` on CPU, kept in the native
    kernels' packed layout (16 rows a group, each pair of input columns side by side; see
    ``swift_linear_packed_bf16``) instead of row-major: the same bytes (rows padded to a
    multiple of 64), read by one kernel for every row count, from batch-1 decode to whole
    prompts. The loaders pack a bfloat16 CPU model's projections once loaded
    (:meth:`local_engine.model.DecoderModel.pack_weights`); :meth:`linear` is ``F.linear``
    against the weight."""

    packed: torch.Tensor

    def __init__(self, packed: torch.Tensor, out_features: int, in_features: int) -> None:
        """Hold ``packed`` (from :meth:`PagedDecodeKernel.pack_bf16`) for a weight of this
        shape."""
        super().__init__()
        self.register_buffer("packed", packed)
        self.out_features = out_features
        self.in_features = in_features

    @classmethod
    def pack(cls, weight: torch.Tensor) -> PackedWeight | None:
        """``weight`` packed, or None where the native kernel does not take it (no kernel
        with AVX-512 BF16 here, not a contiguous bfloat16 CPU matrix, an odd column count)."""
        kernel = load_paged_decode()
        packed = None if kernel is None else kernel.pack_bf16(weight)
        return None if packed is None else cls(packed, weight.shape[0], weight.shape[1])

    @property
    def dtype(self) -> torch.dtype:
        """bfloat16, the weight's and its outputs' dtype."""
        return self.packed.dtype

    @property
    def shape(self) -> torch.Size:
        """The shape of the weight it stands for."""
        return torch.Size((self.out_features, self.in_features))

    def dequantize(self, out: torch.Tensor | None = None) -> torch.Tensor:
        """The weight, row-major (into ``out`` when given)."""
        groups, pairs = self.packed.numel() // (16 * self.in_features), self.in_features // 2
        rows = self.packed.view(groups, pairs, 16, 2).permute(0, 2, 1, 3)
        dense = rows.reshape(groups * 16, self.in_features)[: self.out_features]
        return dense.contiguous() if out is None else out.copy_(dense)

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """``x [T, in_features] @ W.T (+ bias)`` in bfloat16, through the packed kernel (any
        ``T``), or ``F.linear`` against the unpacked weight where the kernel declines.

        Raises:
            EngineConfigError: ``x`` is not a 2-D bfloat16 tensor.
        """
        if x.dim() != 2 or x.dtype != self.dtype:
            raise EngineConfigError(
                "packed linear takes 2-D bfloat16 inputs, got "
                f"{str(x.dtype).removeprefix('torch.')} {tuple(x.shape)}"
            )
        kernel = load_paged_decode()
        if kernel is not None:
            out = kernel.linear_packed(
                x,
                self.packed,
                self.out_features,
                self.in_features,
                bias,
                None,
                torch.get_num_threads(),
            )
            if out is not None:
                return out
        return F.linear(x, self.dequantize(), bias)


QuantizedWeight = Int8Weight | Int4Weight | Fp8Weight | PackedWeight
"""The weight types other than a dense tensor that a model's projections may hold."""


def linear(
    x: torch.Tensor, weight: torch.Tensor | QuantizedWeight, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``F.linear`` for a dense, an int8, an int4 or an fp8 weight."""
    if isinstance(weight, torch.Tensor):
        return F.linear(x, weight, bias)
    return weight.linear(x, bias)
