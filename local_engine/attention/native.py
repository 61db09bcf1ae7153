"""The CPU paged-decode kernel: C source shipped with the package, compiled on first use.

The kernel (``csrc/paged_decode.c``) is plain C (C11 atomics for its thread pool) with no
Python or torch headers, so building it takes well under a second with the system C compiler.
Its parallel parts run on the library's own worker pool (Linux): ``nthreads - 1`` threads,
started on first use, that spin for a bounded time after each part
(``$SWIFTCLIENT_NATIVE_POOL_SPIN_US``, default 100 microseconds) and then sleep, so that a
decode step's kernels find them awake while a busy neighbour gets the core back soon.
``SWIFTCLIENT_NATIVE_POOL=0`` (read once per process) runs them as before: an OpenMP team on
torch's own runtime where torch uses GNU OpenMP (Linux wheels), else threads started per call.
The shared library is cached under ``<cache root>/kernels/`` (the root is
``$SWIFTCLIENT_CACHE_DIR`` or ``~/.cache/swiftclient``), named by a hash of the source, the
command line, the compiler's version and the CPU's features, and written to a temporary file
that is renamed into place, so concurrent first uses are safe. It is loaded with
:mod:`ctypes`.

Where no compiler works (``$CC``, else ``cc``), or ``SWIFTCLIENT_NATIVE_KERNELS=0`` is set,
:func:`load_paged_decode` returns ``None`` and the engine keeps the portable SDPA path; the
reason is logged once on the ``local_engine`` logger.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import logging
import os
import platform
import secrets
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# torch first: its OpenMP runtime must be loaded before the kernel library, which then
# shares it (see torch_uses_gomp).
import torch  # isort: skip

from local_engine.cpu_threads import gomp_libraries
from local_engine.default_model import default_cache_root

__all__ = [
    "DISABLE_ENV",
    "POOL_ENV",
    "POOL_SPIN_ENV",
    "KERNEL_DTYPES",
    "LINEAR_MAX_ROWS",
    "PACK_ROWS",
    "PREFILL_DIMS",
    "WEIGHT_KINDS",
    "LayerArgs",
    "StepArgs",
    "KernelError",
    "PagedDecodeKernel",
    "build_library",
    "gomp_libraries",
    "load_paged_decode",
    "open_library",
    "rotary_layout",
    "torch_uses_gomp",
]

logger = logging.getLogger("local_engine")

DISABLE_ENV = "SWIFTCLIENT_NATIVE_KERNELS"
POOL_ENV = "SWIFTCLIENT_NATIVE_POOL"
"""``0`` runs the kernels' parallel parts on OpenMP (or threads started per call) instead of
the library's worker pool; read by the library once per process."""
POOL_SPIN_ENV = "SWIFTCLIENT_NATIVE_POOL_SPIN_US"
"""How long (microseconds, default 100) a pool thread spins for its next part before it
sleeps; read by the library once per process."""
SOURCE = Path(__file__).with_name("csrc") / "paged_decode.c"
SYMBOL = "swift_paged_decode_f32"
SYMBOL_BF16 = "swift_paged_decode_bf16"
SYMBOL_RMS_NORM = "swift_rms_norm_f32"
SYMBOL_RMS_NORM_BF16 = "swift_rms_norm_bf16"
SYMBOL_ROPE = "swift_rope_f32"
SYMBOL_ROPE_BF16 = "swift_rope_bf16"
SYMBOL_ROPE_DECODE = "swift_rope_decode_f32"
SYMBOL_ROPE_DECODE_BF16 = "swift_rope_decode_bf16"
SYMBOL_SILU_MUL = "swift_silu_mul_f32"
SYMBOL_SILU_MUL_BF16 = "swift_silu_mul_bf16"
SYMBOL_LINEAR_BF16 = "swift_linear_bf16"
SYMBOL_LINEAR_INT8 = "swift_linear_int8"
SYMBOL_LINEAR_INT4 = "swift_linear_int4"
SYMBOL_DEQUANTIZE_INT4 = "swift_dequantize_int4"
SYMBOL_DECODE_LAYER = "swift_decode_layer_bf16"
SYMBOL_PREFILL_BF16 = "swift_prefill_attention_bf16"
SYMBOL_LINEAR_PACKED = "swift_linear_packed_bf16"
SYMBOL_PACK_BF16 = "swift_pack_bf16"
SYMBOL_FEATURES = "swift_kernel_features"
SYMBOL_POOL_WORKERS = "swift_pool_workers"
_FEATURE_VECTOR_ACTIVATION = 1
_FEATURE_BF16_LINEAR = 2
_FEATURE_INT8_LINEAR = 4
LINEAR_MAX_ROWS = 8
"""Most input rows the linear kernel takes (``LINEAR_MAX_ROWS`` in the C source): decode
steps of up to this many sequences; larger batches use torch's GEMM."""
RMS_NORM_MAX_COLS = 16384
"""Widest row the RMSNorm kernel takes (``RMS_MAX_COLS`` in the C source)."""
MAX_HEADS = 256
"""Query heads the kernel takes (``MAX_HEADS`` in the C source)."""

# Tried in order: the first set that compiles wins. ``-march=native`` lets the compiler use
# the machine's vector units (AVX-512 paths are written out in the source).
_FLAG_SETS = (
    ("-O3", "-march=native", "-fno-math-errno"),
    ("-O3", "-fno-math-errno"),
)
_OPENMP = "-fopenmp"
KERNEL_DTYPES = (torch.float32, torch.bfloat16)
"""The dtypes the kernels take."""
_COMPILE_TIMEOUT_S = 120

_I64 = ctypes.c_int64
_PTR = ctypes.c_void_p
_ARGTYPES = [_PTR, _I64, _I64, _PTR, _PTR, _PTR, _I64, _PTR, _PTR]
_ARGTYPES += [_I64] * 8 + [ctypes.c_float, ctypes.c_int]
_RMS_ARGTYPES = [_PTR, _I64, _I64, _I64, _I64, _PTR, _I64, _PTR, _I64, ctypes.c_float, ctypes.c_int]
_ROPE_ARGTYPES = [_PTR, _I64, _I64, _I64, _I64, _PTR, _I64, ctypes.c_float, _PTR, _PTR, _PTR]
_ROPE_ARGTYPES += [_I64, _PTR, _I64, ctypes.c_int]
_SILU_ARGTYPES = [_PTR, _I64, _I64, _PTR, _I64, ctypes.c_int]
_ROPE_DECODE_ARGTYPES = [_PTR, _I64, _I64, _PTR, _I64, ctypes.c_float, _PTR, _PTR, _PTR, _I64]
_ROPE_DECODE_ARGTYPES += [_PTR, _PTR, _PTR, _I64, _PTR, _PTR] + [_I64] * 8
_ROPE_DECODE_ARGTYPES += [ctypes.c_float, ctypes.c_int]
_LINEAR_ARGTYPES = [_PTR, _I64, _I64, _PTR, _I64, _I64, _PTR, _PTR, _I64, _PTR, _I64, ctypes.c_int]
_LINEAR_INT8_ARGTYPES = [_PTR, _I64, _I64, _PTR, *_LINEAR_ARGTYPES[3:]]
_DEQUANTIZE_ARGTYPES = [_PTR, _PTR, _I64, _I64, _PTR, ctypes.c_int]
_PREFILL_ARGTYPES = [_PTR, _I64, _I64, _PTR, _PTR, _PTR, _I64, _PTR, _I64, _PTR] + [_I64] * 7
_PREFILL_ARGTYPES += [ctypes.c_float, ctypes.c_int]
_PACK_ARGTYPES = [_PTR, _I64, _I64, _PTR]
PACK_ROWS = 64
"""The packed bfloat16 layout's row multiple (``swift_pack_bf16``): 4 groups of 16 rows."""
PREFILL_DIMS = (32, 64, 128)
"""Head sizes :meth:`PagedDecodeKernel.prefill_attention` takes."""


class KernelError(RuntimeError):
    """The kernel refused its arguments or ran out of scratch memory."""


class LayerArgs(ctypes.Structure):
    """One decoder layer's constant arguments of :meth:`PagedDecodeKernel.decode_layer`
    (``swift_layer_t`` in the C source)."""

    _fields_ = [
        ("input_norm", _PTR),
        ("post_norm", _PTR),
        ("weights", _PTR * 4),
        ("scales", _PTR * 4),
        ("kinds", _I64 * 4),
        ("qkv_bias", _PTR),
        ("qk_norm", _PTR),
        ("qk_norm_stride", _I64),
        ("hidden", _I64),
        ("heads", _I64),
        ("kv_heads", _I64),
        ("head_dim", _I64),
        ("intermediate", _I64),
        ("window", _I64),
        ("eps", ctypes.c_double),
        ("scale", ctypes.c_double),
    ]


class StepArgs(ctypes.Structure):
    """A decode step's arguments shared by its layers (``swift_step_t`` in the C source)."""

    _fields_ = [
        ("cos", _PTR),
        ("sin", _PTR),
        ("positions", _PTR),
        ("tables", _PTR),
        ("lens", _PTR),
        ("max_pos", _I64),
        ("table_stride", _I64),
        ("rows", _I64),
        ("block_size", _I64),
        ("max_len", _I64),
        ("num_blocks", _I64),
        ("nthreads", _I64),
    ]


WEIGHT_KINDS = {"bf16": 0, "int8": 1, "int4": 2, "packed": 3}
"""The decode-layer call's weight kinds (``kinds`` in :class:`LayerArgs`)."""


@dataclass(frozen=True)
class PagedDecodeKernel:
    """The loaded kernel; :meth:`__call__` takes raw pointers (see the C source)."""

    path: Path
    _fn: Callable[..., int]
    _fn_bf16: Callable[..., int]
    _rms: Callable[..., int]
    _rms_bf16: Callable[..., int]
    _rope: Callable[..., int]
    _rope_bf16: Callable[..., int]
    _rope_decode: Callable[..., int]
    _rope_decode_bf16: Callable[..., int]
    _silu_mul: Callable[..., int]
    _silu_mul_bf16: Callable[..., int]
    _linear_bf16: Callable[..., int]
    _linear_int8: Callable[..., int]
    _linear_int4: Callable[..., int]
    _dequantize_int4: Callable[..., int]
    _decode_layer: Callable[..., int]
    vector_activation: bool = False
    """Whether :meth:`silu_mul` runs here (a build with AVX-512 F, BW and VL); where not, it
    declines."""
    bf16_linear: bool = False
    """Whether :meth:`linear` runs here (a build with AVX-512 BF16, F and BW); where not, it
    declines."""
    int8_linear: bool = False
    """Whether :meth:`linear_int8`, :meth:`linear_int4` and :meth:`dequantize_int4` run here
    (a build that also has AVX-512 VNNI and VL); where not, they decline."""
    _pool_workers: Callable[[], int] | None = None
    _prefill_bf16: Callable[..., int] | None = None
    _linear_packed: Callable[..., int] | None = None
    _pack_bf16: Callable[..., int] | None = None

    @property
    def prefill_bf16(self) -> bool:
        """Whether :meth:`prefill_attention` runs here (a build with AVX-512 BF16, F, BW and
        VL); where not, it declines."""
        return self._prefill_bf16 is not None and self.bf16_linear and self.vector_activation

    def prefill_attention(
        self,
        *,
        q: int,
        q_strides: tuple[int, int],
        k: int,
        v: int,
        tables: int,
        table_stride: int,
        seqs: int,
        num_seqs: int,
        out: int,
        shape: tuple[int, int, int, int],
        block_size: int,
        window: int,
        num_blocks: int,
        scale: float,
        threads: int,
    ) -> bool:
        """Causal attention for the query rows of prefilling sequences over their keys and
        values in the paged cache (raw pointers to bfloat16 data; see
        ``swift_prefill_attention_bf16`` in the C source): ``seqs`` holds ``num_seqs`` int64
        rows ``(first query row, query count, context length, row of tables)``, ``shape`` is
        ``(rows, heads, kv_heads, dim)`` of ``q`` (at ``q_strides`` for a row and a head) and
        of the contiguous ``out``. Every block id a sequence uses is checked against
        ``num_blocks`` first.

        Returns:
            False where this build has no such kernel (nothing was read or written).

        Raises:
            KernelError: the kernel refused its arguments or ran out of scratch memory.
        """
        if not self.prefill_bf16 or self._prefill_bf16 is None:
            return False
        status = self._prefill_bf16(
            q,
            *q_strides,
            k,
            v,
            tables,
            table_stride,
            seqs,
            num_seqs,
            out,
            *shape,
            block_size,
            window,
            num_blocks,
            scale,
            threads,
        )
        if status == 3:
            return False
        _check_decode(status)
        return True

    def pool_workers(self) -> int | None:
        """How many worker threads the library's pool has started in this process (the
        calling thread runs a share too, so a part on ``n`` threads needs ``n - 1``), or None
        where the kernels run without the pool (``SWIFTCLIENT_NATIVE_POOL=0``, or a build
        without Linux futexes)."""
        if self._pool_workers is None:
            return None
        workers = int(self._pool_workers())
        return None if workers < 0 else workers

    def rms_norm(
        self, x: torch.Tensor, weight: torch.Tensor, eps: float, threads: int
    ) -> torch.Tensor | None:
        """``x / sqrt(mean(x**2) + eps) * weight`` over the last axis in a new contiguous
        tensor, or None where the kernel does not take the arguments (the caller then uses
        torch).

        ``x`` is ``[T, H]`` or ``[T, heads, H]`` (rows contiguous, any row strides: the q/k
        heads of a fused projection's output are a view), float32 or bfloat16 on CPU;
        ``weight`` has ``x``'s dtype and is ``[H]``, or ``[heads, H]`` (one weight per head).
        bfloat16 rounds the normalized value before the weight multiply, as the upcast
        reference does.

        Raises:
            KernelError: the kernel refused the sizes it was given.
        """
        if (
            x.device.type != "cpu"
            or x.dtype not in KERNEL_DTYPES
            or weight.dtype != x.dtype
            or x.dim() not in (2, 3)
            or x.stride(-1) != 1
            or not weight.is_contiguous()
            or not 0 < x.shape[-1] <= RMS_NORM_MAX_COLS
        ):
            return None
        cols = x.shape[-1]
        if x.dim() == 2:
            inner, x_inner = 1, 0
        else:
            inner, x_inner = x.shape[1], x.stride(1)
        if weight.shape == (cols,):
            w_inner = 0
        elif x.dim() == 3 and weight.shape == (inner, cols):
            w_inner = cols
        else:
            return None
        out = torch.empty(x.shape, dtype=x.dtype)
        fn = self._rms_bf16 if x.dtype == torch.bfloat16 else self._rms
        status = fn(
            x.data_ptr(),
            x.shape[0],
            inner,
            x.stride(0),
            x_inner,
            weight.data_ptr(),
            w_inner,
            out.data_ptr(),
            cols,
            eps,
            threads,
        )
        if status:
            raise KernelError(f"RMSNorm kernel refused its arguments (status {status})")
        return out

    def rope(
        self,
        x: torch.Tensor,
        weight: torch.Tensor | None,
        eps: float,
        cos: torch.Tensor,
        sin: torch.Tensor,
        positions: torch.Tensor,
        threads: int,
    ) -> torch.Tensor | None:
        """Rotary embedding of the heads ``x`` ``[T, heads, D]``, each first RMS-normalized
        with ``weight`` where it is given, in a new contiguous tensor; or None where the kernel
        does not take the arguments (the caller then uses torch).

        ``x`` may be a strided view (the query and key heads of a fused projection's output;
        each head's ``D`` values contiguous), float32 or bfloat16 on CPU. ``weight`` is
        ``[D]`` or ``[heads, D]``; ``cos`` and ``sin`` are the contiguous ``[max_pos, D / 2]``
        tables; ``positions`` is ``[T]`` int64, row ``t`` rotating by the angles at
        ``positions[t]``. Each product rounds before the sum, as transformers'
        ``q * cos + rotate_half(q) * sin`` does (in bfloat16, each also to bfloat16).

        Raises:
            KernelError: the kernel refused the sizes it was given (a position outside the
                tables).
        """
        if (
            x.dtype not in KERNEL_DTYPES
            or x.dim() != 3
            or x.stride(-1) != 1
            or (w_head := rotary_layout(x, x.shape[1], weight, cos, sin, positions)) is None
        ):
            return None
        rows, heads, dim = x.shape
        w_ptr = None if weight is None else weight.data_ptr()
        out = torch.empty(x.shape, dtype=x.dtype)
        fn = self._rope_bf16 if x.dtype == torch.bfloat16 else self._rope
        status = fn(
            x.data_ptr(),
            rows,
            heads,
            x.stride(0),
            x.stride(1),
            w_ptr,
            w_head,
            eps,
            cos.data_ptr(),
            sin.data_ptr(),
            positions.data_ptr(),
            cos.shape[0],
            out.data_ptr(),
            dim,
            threads,
        )
        if status:
            raise KernelError(
                f"RoPE kernel refused its arguments (status {status}): a position outside "
                f"the rotary tables [0, {cos.shape[0]}), or a head it does not take"
            )
        return out

    def silu_mul(self, gate_up: torch.Tensor, threads: int) -> torch.Tensor | None:
        """SwiGLU's ``silu(gate) * up`` for ``gate_up`` ``[T, 2 * I]`` (the gate half first,
        as the fused projection writes it; rows may be strided, their values contiguous) in a
        new contiguous ``[T, I]`` tensor, or None where the kernel does not take it (also
        where the build has no AVX-512 with BW and VL: :attr:`vector_activation`). Without
        the pool, the pthread build (no OpenMP) runs it on threads started per call. exp is a
        polynomial within 2 ulp of float32's; in bfloat16 ``silu(gate)`` rounds to bfloat16
        before the product, as the unfused form does.

        Raises:
            KernelError: the kernel refused the sizes it was given.
        """
        if (
            not self.vector_activation
            or gate_up.device.type != "cpu"
            or gate_up.dtype not in KERNEL_DTYPES
            or gate_up.dim() != 2
            or gate_up.stride(-1) != 1
            or gate_up.shape[1] < 2
            or gate_up.shape[1] % 2
        ):
            return None
        rows, cols = gate_up.shape[0], gate_up.shape[1] // 2
        # A single row's stride is arbitrary (any value describes it); more rows must not overlap.
        row_stride = gate_up.stride(0) if rows > 1 else 2 * cols
        if row_stride < 2 * cols:
            return None
        out = torch.empty((rows, cols), dtype=gate_up.dtype)
        fn = self._silu_mul_bf16 if gate_up.dtype == torch.bfloat16 else self._silu_mul
        status = fn(gate_up.data_ptr(), rows, row_stride, out.data_ptr(), cols, threads)
        if status:
            raise KernelError(f"SiLU-mul kernel refused its arguments (status {status})")
        return out

    def linear(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        residual: torch.Tensor | None,
        threads: int,
    ) -> torch.Tensor | None:
        """``x @ weight.T (+ bias) (+ residual)`` in a new contiguous bfloat16 tensor, each
        value's float32 sum rounded once, as ``torch.addmm`` rounds; or None where the kernel
        does not take the arguments (the caller then uses torch).

        For decode steps: ``x`` is ``[T, K]`` with ``1 <= T <= LINEAR_MAX_ROWS`` (rows may be
        strided, their values contiguous), ``weight`` a contiguous ``[N, K]``, ``bias`` a
        contiguous ``[N]`` and ``residual`` ``[T, N]`` (values contiguous), all bfloat16 on
        CPU; the build must have AVX-512 BF16 (:attr:`bf16_linear`). The kernel reads the
        weight once, front to back, whatever ``T`` is.

        Raises:
            KernelError: the kernel refused the sizes it was given.
        """
        if not self.bf16_linear or weight.dtype != torch.bfloat16 or weight.dim() != 2:
            return None
        n, k = weight.shape
        return self._linear(self._linear_bf16, x, (weight,), n, k, bias, residual, threads)

    def pack_bf16(self, weight: torch.Tensor) -> torch.Tensor | None:
        """A contiguous bfloat16 ``[N, K]`` CPU weight (even ``K``) in the packed layout of
        :meth:`linear_packed`: a new flat tensor of ``ceil(N / PACK_ROWS) * PACK_ROWS * K``
        bfloat16 values (the padding rows zero); None where this build has no packed kernel
        or the weight is not such a tensor."""
        if (
            not self.packed_linear
            or self._pack_bf16 is None
            or weight.dtype != torch.bfloat16
            or weight.dim() != 2
            or weight.device.type != "cpu"
            or not weight.is_contiguous()
            or weight.shape[1] % 2
            or 0 in weight.shape
        ):
            return None
        n, k = weight.shape
        packed = torch.zeros(-(-n // PACK_ROWS) * PACK_ROWS * k, dtype=torch.bfloat16)
        if self._pack_bf16(weight.data_ptr(), n, k, packed.data_ptr()):
            raise KernelError(f"packing refused a {n}x{k} weight")
        return packed

    def linear_packed(
        self,
        x: torch.Tensor,
        packed: torch.Tensor,
        n: int,
        k: int,
        bias: torch.Tensor | None,
        residual: torch.Tensor | None,
        threads: int,
    ) -> torch.Tensor | None:
        """:meth:`linear` against a weight ``[n, k]`` packed by :meth:`pack_bf16`, for any
        number of rows ``T >= 1`` (decode steps, batches and prompts alike); None where the
        kernel does not take the arguments.

        Raises:
            KernelError: the kernel refused the sizes it was given.
        """
        if (
            not self.packed_linear
            or self._linear_packed is None
            or packed.dtype != torch.bfloat16
            or packed.numel() != -(-n // PACK_ROWS) * PACK_ROWS * k
        ):
            return None
        return self._linear(
            self._linear_packed, x, (packed,), n, k, bias, residual, threads, max_rows=None
        )

    @property
    def packed_linear(self) -> bool:
        """Whether :meth:`linear_packed` and :meth:`pack_bf16` run here (a build with AVX-512
        BF16, F, BW and VL); where not, they decline."""
        return self._linear_packed is not None and self.bf16_linear and self.vector_activation

    def linear_int8(
        self,
        x: torch.Tensor,
        codes: torch.Tensor,
        scales: torch.Tensor,
        bias: torch.Tensor | None,
        residual: torch.Tensor | None,
        threads: int,
    ) -> torch.Tensor | None:
        """:meth:`linear` for an int8 weight, ``codes`` ``[N, K]`` (contiguous int8) times
        its per-row ``scales`` ``[N]`` (bfloat16): ``x``'s rows are quantized to int8 in
        blocks of 32 values, each with its own float32 scale (the activation layout of
        llama.cpp's q8_0), and multiplied with AVX-512 VNNI (:attr:`int8_linear`); sums are
        float32, rounded once. None where the kernel does not take the arguments.

        Raises:
            KernelError: the kernel refused the sizes it was given, or ran out of memory.
        """
        if not self._takes_codes(codes, torch.int8, scales, codes.shape[:1]):
            return None
        n, k = codes.shape
        return self._linear(self._linear_int8, x, (codes, scales), n, k, bias, residual, threads)

    def linear_int4(
        self,
        x: torch.Tensor,
        codes: torch.Tensor,
        scales: torch.Tensor,
        bias: torch.Tensor | None,
        residual: torch.Tensor | None,
        threads: int,
        rows: int | None = None,
    ) -> torch.Tensor | None:
        """:meth:`linear_int8` for an int4 weight of ``rows`` rows (None: all of ``codes``'):
        ``codes`` ``[N', K / 2]`` (contiguous uint8, ``N'`` a multiple of 16, in 16-row
        groups as :func:`local_engine.quant.quantize_int4_rows` lays them out) and
        ``scales`` ``[N', K / 32]`` (bfloat16, one per block of 32 values, grouped alike);
        ``x``'s rows are quantized in blocks of 32 as for int8, and each block's 16 rows
        multiply with AVX-512 VNNI at once. None where the kernel does not take the
        arguments.

        Raises:
            KernelError: the kernel refused the sizes it was given, or ran out of memory.
        """
        n = codes.shape[0] if rows is None else rows
        if not self._takes_int4(codes, scales, n):
            return None
        k = codes.shape[1] * 2
        return self._linear(self._linear_int4, x, (codes, scales), n, k, bias, residual, threads)

    def dequantize_int4(
        self, codes: torch.Tensor, scales: torch.Tensor, out: torch.Tensor, threads: int
    ) -> torch.Tensor | None:
        """Write the bfloat16 weight ``[N, K]`` of :meth:`linear_int4`'s ``codes`` and
        ``scales`` (its first ``N`` rows: ``out``'s) into ``out`` (``(code - 8) * scale``,
        rounded once) and return it; None where the kernel does not take the arguments.

        Raises:
            KernelError: the kernel refused the sizes it was given.
        """
        if (
            out.dim() != 2
            or not self._takes_int4(codes, scales, out.shape[0])
            or out.dtype != torch.bfloat16
            or out.shape[1] != codes.shape[1] * 2
            or not out.is_contiguous()
        ):
            return None
        status = self._dequantize_int4(
            codes.data_ptr(), scales.data_ptr(), out.shape[0], out.shape[1], out.data_ptr(), threads
        )
        if status:
            raise KernelError(f"int4 dequantize kernel refused its arguments (status {status})")
        return out

    def _takes_int4(self, codes: torch.Tensor, scales: torch.Tensor, rows: int) -> bool:
        """Whether ``codes`` and ``scales`` are an int4 weight of ``rows`` rows (in 16-row
        groups) the kernels take."""
        padded, packed = codes.shape if codes.dim() == 2 else (0, 1)
        return (
            not packed % 16
            and not padded % 16
            and padded - 16 < rows <= padded
            and self._takes_codes(codes, torch.uint8, scales, (padded, packed // 16))
        )

    def _takes_codes(
        self, codes: torch.Tensor, dtype: torch.dtype, scales: torch.Tensor, shape: tuple[int, ...]
    ) -> bool:
        """Whether ``codes`` (2-D ``dtype``) and ``scales`` (bfloat16 of ``shape``), both
        contiguous, are what the quantized kernels take, on a build that holds them."""
        return (
            self.int8_linear
            and codes.dtype == dtype
            and codes.dim() == 2
            and codes.is_contiguous()
            and scales.dtype == torch.bfloat16
            and tuple(scales.shape) == tuple(shape)
            and scales.is_contiguous()
        )

    def _linear(
        self,
        fn: Callable[..., int],
        x: torch.Tensor,
        weights: tuple[torch.Tensor, ...],
        n: int,
        k: int,
        bias: torch.Tensor | None,
        residual: torch.Tensor | None,
        threads: int,
        *,
        max_rows: int | None = LINEAR_MAX_ROWS,
    ) -> torch.Tensor | None:
        """Check the shared arguments of the linear kernels and run ``fn`` (``weights`` are
        its weight pointers, contiguous, for an ``[N, K]`` weight; ``max_rows`` None: any
        number of rows)."""
        if (
            x.dtype != torch.bfloat16
            or x.device.type != "cpu"
            or x.dim() != 2
            or x.shape[0] < 1
            or (max_rows is not None and x.shape[0] > max_rows)
            or x.stride(1) != 1
            or x.shape[1] != k
            or not all(w.is_contiguous() and w.device.type == "cpu" for w in weights)
        ):
            return None
        rows = x.shape[0]
        if bias is not None and (
            bias.dtype != torch.bfloat16 or bias.shape != (n,) or not bias.is_contiguous()
        ):
            return None
        if residual is not None and (
            residual.dtype != torch.bfloat16
            or residual.shape != (rows, n)
            or residual.stride(1) != 1
        ):
            return None
        out = torch.empty((rows, n), dtype=torch.bfloat16)
        status = fn(
            x.data_ptr(),
            rows,
            x.stride(0) if rows > 1 else k,  # one row's stride is arbitrary
            *(w.data_ptr() for w in weights),
            n,
            k,
            None if bias is None else bias.data_ptr(),
            None if residual is None else residual.data_ptr(),
            0 if residual is None else (residual.stride(0) if rows > 1 else n),
            out.data_ptr(),
            n,
            threads,
        )
        if status:
            what = "out of scratch memory" if status == 1 else f"status {status}"
            raise KernelError(f"linear kernel refused its arguments ({what})")
        return out

    def decode_layer(
        self, layer: LayerArgs, step: StepArgs, k: int, v: int, x: int, scratch: int
    ) -> None:
        """Run one decoder layer of a decode step in place on ``x`` (raw pointers; see
        ``swift_decode_layer_bf16`` in the C source): bit-identical to the model's layer
        through the single-operation kernels.

        Raises:
            KernelError: a part of the layer returned a non-zero status.
        """
        status = self._decode_layer(ctypes.byref(layer), ctypes.byref(step), k, v, x, scratch)
        if status:
            raise KernelError(f"decode layer kernel failed (status {status})")

    def __call__(
        self,
        *,
        q: int,
        q_strides: tuple[int, int],
        k: int,
        v: int,
        tables: int,
        table_stride: int,
        lens: int,
        out: int,
        shape: tuple[int, int, int, int],
        block_size: int,
        window: int,
        max_len: int,
        num_blocks: int,
        scale: float,
        threads: int,
        bf16: bool = False,
    ) -> None:
        """Run the kernel; ``shape`` is ``(rows, heads, kv_heads, dim)``.

        Every block id a row uses is checked against ``num_blocks`` first. With ``bf16``
        the query, cache and output are bfloat16 (computed in float32), else float32.

        Raises:
            KernelError: the kernel returned a non-zero status.
        """
        tail = (k, v, tables, table_stride, lens, out, *shape, block_size, window, max_len)
        fn = self._fn_bf16 if bf16 else self._fn
        _check_decode(fn(q, *q_strides, *tail, num_blocks, scale, threads))

    def rope_decode(
        self,
        *,
        x: int,
        x_strides: tuple[int, int],
        norm: int | None,
        norm_stride: int,
        eps: float,
        cos: int,
        sin: int,
        positions: int,
        max_pos: int,
        k: int,
        v: int,
        tables: int,
        table_stride: int,
        lens: int,
        out: int,
        shape: tuple[int, int, int, int],
        block_size: int,
        window: int,
        max_len: int,
        num_blocks: int,
        scale: float,
        threads: int,
        bf16: bool = False,
    ) -> None:
        """Rotate, store and attend in one call (raw pointers; see ``swift_rope_decode_*`` in
        the C source): ``x`` is the fused projection's output (each row's query heads, then
        its key heads, then its value heads, at strides ``x_strides`` for a row and a head);
        ``norm`` the per-head norm weights or None (``norm_stride`` apart, 0 for one weight);
        ``cos``/``sin`` the ``[max_pos, dim / 2]`` tables; ``positions`` one int64 per row.
        Each row's rotated key and its value are written to the cache slot of its newest
        position; the rest is as :meth:`__call__`, whose arguments share these names.

        Raises:
            KernelError: the kernel returned a non-zero status.
        """
        rotary = (x, *x_strides, norm, norm_stride, eps, cos, sin, positions, max_pos)
        tail = (k, v, tables, table_stride, lens, out, *shape, block_size, window, max_len)
        fn = self._rope_decode_bf16 if bf16 else self._rope_decode
        _check_decode(fn(*rotary, *tail, num_blocks, scale, threads))


def rotary_layout(
    x: torch.Tensor,
    heads: int,
    weight: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor,
) -> int | None:
    """The norm weight's stride between heads (0 for one weight, or none) where the rotary
    kernels take these inputs for the first ``heads`` heads of ``x`` ``[T, *, D]`` on CPU,
    else None: an even ``D`` up to ``RMS_NORM_MAX_COLS``; contiguous ``cos``/``sin``
    ``[max_pos, D / 2]`` and ``weight`` (``[D]`` or ``[heads, D]``) in ``x``'s dtype;
    contiguous int64 ``positions`` ``[T]``."""
    rows, dim = x.shape[0], x.shape[-1]
    if (
        x.device.type != "cpu"
        or not 0 < dim <= RMS_NORM_MAX_COLS
        or dim % 2
        or any(
            t.dtype != x.dtype or t.dim() != 2 or t.shape[1] != dim // 2 or not t.is_contiguous()
            for t in (cos, sin)
        )
        or cos.shape != sin.shape
        or positions.dtype != torch.int64
        or positions.shape != (rows,)
        or not positions.is_contiguous()
    ):
        return None
    if weight is None:
        return 0
    if weight.dtype != x.dtype or not weight.is_contiguous():
        return None
    if weight.shape == (dim,):
        return 0
    return dim if weight.shape == (heads, dim) else None


def _check_decode(status: int) -> None:
    """Raise :class:`KernelError` for a decode kernel's non-zero ``status``."""
    if status:
        what = "out of scratch memory" if status == 1 else "arguments out of its limits"
        raise KernelError(f"paged decode kernel failed ({what}, status {status})")


def torch_uses_gomp() -> bool:
    """True when exactly one GNU OpenMP runtime is loaded and it answers to ``libgomp.so.1``.

    torch's Linux wheels bring such a copy. Only then is the kernel built with ``-fopenmp``:
    the dynamic loader resolves the kernel's ``libgomp.so.1`` to that copy, so the kernel runs
    on torch's own worker threads, which wait between parallel regions as
    :mod:`local_engine.cpu_threads` sets them to; a second pool of threads would only fight
    them for the cores.
    """
    libraries = gomp_libraries()
    return len(libraries) == 1 and Path(next(iter(libraries))).name == "libgomp.so.1"


def _compiler(name: str | None) -> list[str]:
    """The compiler command (``$CC`` may carry arguments, e.g. ``ccache gcc``)."""
    words = shlex.split(name or os.environ.get("CC") or "cc")
    exe = shutil.which(words[0]) if words else None
    if exe is None:
        raise OSError(f"no C compiler {name or os.environ.get('CC') or 'cc'!r} on PATH")
    return [exe, *words[1:]]


def _fingerprint(cc: list[str], timeout: float) -> bytes:
    """What else decides the binary: the compiler's version and the CPU's features
    (``-march=native`` code must never be loaded on a CPU without them)."""
    try:
        version = subprocess.run(
            [*cc, "--version"], capture_output=True, timeout=timeout, check=False
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        version = b""
    cpu = {"machine": platform.machine() + platform.processor()}
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key = line.split(":", 1)[0].strip()
            if key in ("flags", "Features", "model name"):
                cpu.setdefault(key, line)  # the first core's; every core repeats them
    return version + b"\0" + "\n".join(sorted(cpu.values())).encode()


def _first_error(stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower()]
    return (errors or lines or ["unknown error"])[0]


def build_library(
    directory: Path,
    *,
    compiler: str | None = None,
    openmp: bool | None = None,
    timeout: float = _COMPILE_TIMEOUT_S,
) -> Path:
    """Compile the kernel into ``directory`` (or find it there) and return the library path.

    ``compiler`` defaults to ``$CC``, else ``cc``. ``openmp`` (default:
    :func:`torch_uses_gomp`) puts flag sets with ``-fopenmp`` first, with the plain ones as
    the fallback; an OpenMP build's file name ends in ``-omp.so``. The library's name hashes
    the source, the whole command line, the compiler's version and the CPU's features.
    ``timeout`` bounds all attempts together; a compiler that overruns it is killed with
    its whole process group, and no further attempt is made.

    Raises:
        OSError: the compiler is missing, timed out, or no flag set compiled (its first
            error line is in the message).
    """
    deadline = time.monotonic() + timeout
    cc = _compiler(compiler)
    source = SOURCE.read_bytes()
    fingerprint = _fingerprint(cc, timeout)
    directory.mkdir(parents=True, exist_ok=True)
    flag_sets = list(_FLAG_SETS)
    if torch_uses_gomp() if openmp is None else openmp:
        flag_sets = [(*flags, _OPENMP) for flags in _FLAG_SETS] + flag_sets
    error = "no flag set to try"
    for flags in flag_sets:
        command = [*cc, *flags, "-shared", "-fPIC", "-pthread", "-o", "OUT", "SRC", "-lm"]
        digest = hashlib.sha256(  # the source's bytes, not its path, go into the name
            b"\0".join([source, fingerprint, "\0".join(command).encode()])
        ).hexdigest()[:16]
        command[command.index("SRC")] = str(SOURCE)
        suffix = "-omp" if _OPENMP in flags else ""
        target = directory / f"paged_decode-{digest}{suffix}.so"
        if target.exists():
            return target
        scratch = directory / f".paged_decode-{digest}.{os.getpid()}-{secrets.token_hex(4)}.tmp"
        command[command.index("OUT")] = str(scratch)
        try:
            ok, error = _compile(command, deadline - time.monotonic(), timeout)
            if ok and scratch.exists():
                os.replace(scratch, target)  # atomic; a concurrent builder's copy is identical
                return target
        finally:
            with contextlib.suppress(OSError):
                scratch.unlink()
    raise OSError(f"could not compile {SOURCE.name} with {cc[0]}: {error}")


def _compile(command: list[str], remaining: float, timeout: float) -> tuple[bool, str]:
    """Run one compile; True on success, else the first error line.

    Raises:
        OSError: the compiler could not start, or overran the time left (it is killed with
            its process group first).
    """
    if remaining <= 0:
        raise OSError(f"compiling the kernel took longer than {timeout:g} s")
    with subprocess.Popen(
        command,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, so a timeout kills the linker too
    ) as proc:  # leaving the block closes the pipe and reaps the compiler
        try:
            _, stderr = proc.communicate(timeout=remaining)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)
            raise OSError(f"compiling the kernel took longer than {timeout:g} s") from None
    return proc.returncode == 0, _first_error(stderr)


@functools.cache
def load_paged_decode() -> PagedDecodeKernel | None:
    """The kernel, built and loaded once per process; ``None`` where it cannot be (the
    reason is logged)."""
    if os.environ.get(DISABLE_ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        logger.info("native CPU kernels disabled by %s", DISABLE_ENV)
        return None
    try:
        directory = default_cache_root() / "kernels"
        kernel = open_library(build_library(directory))
        if kernel.path.stem.endswith("-omp") and len(gomp_libraries()) > 1:
            # Loading it brought in a second OpenMP runtime: use the pthread build instead
            # (the extra runtime starts no threads unless it is called).
            logger.info("kernel would use a second OpenMP runtime; using its pthread build")
            kernel = open_library(build_library(directory, openmp=False))
    except (OSError, RuntimeError) as exc:  # RuntimeError: no home directory for the cache
        logger.warning("CPU paged-decode kernel unavailable, using SDPA attention: %s", exc)
        return None
    return kernel


def open_library(path: Path) -> PagedDecodeKernel:
    """Load a library built by :func:`build_library`.

    Raises:
        OSError: it cannot be loaded or lacks the kernel's symbol.
    """
    library = ctypes.CDLL(str(path))
    functions = []
    for symbol, argtypes in (
        (SYMBOL, _ARGTYPES),
        (SYMBOL_BF16, _ARGTYPES),
        (SYMBOL_RMS_NORM, _RMS_ARGTYPES),
        (SYMBOL_RMS_NORM_BF16, _RMS_ARGTYPES),
        (SYMBOL_ROPE, _ROPE_ARGTYPES),
        (SYMBOL_ROPE_BF16, _ROPE_ARGTYPES),
        (SYMBOL_ROPE_DECODE, _ROPE_DECODE_ARGTYPES),
        (SYMBOL_ROPE_DECODE_BF16, _ROPE_DECODE_ARGTYPES),
        (SYMBOL_SILU_MUL, _SILU_ARGTYPES),
        (SYMBOL_SILU_MUL_BF16, _SILU_ARGTYPES),
        (SYMBOL_LINEAR_BF16, _LINEAR_ARGTYPES),
        (SYMBOL_LINEAR_INT8, _LINEAR_INT8_ARGTYPES),
        (SYMBOL_LINEAR_INT4, _LINEAR_INT8_ARGTYPES),
        (SYMBOL_DEQUANTIZE_INT4, _DEQUANTIZE_ARGTYPES),
        (SYMBOL_DECODE_LAYER, [_PTR] * 6),
        (SYMBOL_PREFILL_BF16, _PREFILL_ARGTYPES),
        (SYMBOL_LINEAR_PACKED, _LINEAR_ARGTYPES),
        (SYMBOL_PACK_BF16, _PACK_ARGTYPES),
    ):
        try:
            fn = getattr(library, symbol)
        except AttributeError as exc:
            raise OSError(f"{path} has no {symbol}") from exc
        fn.argtypes = argtypes
        fn.restype = ctypes.c_int
        functions.append(fn)
    try:
        features_fn = getattr(library, SYMBOL_FEATURES)
    except AttributeError as exc:
        raise OSError(f"{path} has no {SYMBOL_FEATURES}") from exc
    features_fn.argtypes = []
    features_fn.restype = ctypes.c_int
    features = int(features_fn())
    try:
        pool_fn = getattr(library, SYMBOL_POOL_WORKERS)
    except AttributeError as exc:
        raise OSError(f"{path} has no {SYMBOL_POOL_WORKERS}") from exc
    pool_fn.argtypes = []
    pool_fn.restype = ctypes.c_int
    fn, fn_bf16, rms, rms_bf16, rope, rope_bf16, rope_decode, rope_decode_bf16 = functions[:8]
    silu, silu_bf16, linear_bf16, linear_int8, linear_int4, dequantize_int4 = functions[8:14]
    decode_layer, prefill_bf16, linear_packed, pack_bf16 = functions[14:18]
    return PagedDecodeKernel(
        path,
        fn,
        fn_bf16,
        rms,
        rms_bf16,
        rope,
        rope_bf16,
        rope_decode,
        rope_decode_bf16,
        silu,
        silu_bf16,
        linear_bf16,
        linear_int8,
        linear_int4,
        dequantize_int4,
        decode_layer,
        vector_activation=bool(features & _FEATURE_VECTOR_ACTIVATION),
        bf16_linear=bool(features & _FEATURE_BF16_LINEAR),
        int8_linear=bool(features & _FEATURE_INT8_LINEAR),
        _pool_workers=pool_fn,
        _prefill_bf16=prefill_bf16,
        _linear_packed=linear_packed,
        _pack_bf16=pack_bf16,
    )
