"""One decoder for the Llama / Qwen2 / Qwen3 / Mistral families, parameterized by ModelConfig.

Numerics follow the transformers implementations (RMSNorm in float32, rotary tables computed
in float32 and cast to the model dtype, SwiGLU MLP). Weights are stored fused: q/k/v in one
matrix and gate/up in another, so each layer runs three matmuls before its MLP down
projection. Attention goes through an :class:`AttentionBackend` over a paged KV cache.
Parameters are allocated uninitialized; :func:`local_engine.loader.load_model` fills them.
With ``quantization="int8"`` the four projections of every layer and the LM head hold int8
weights with per-row scales (:mod:`local_engine.quant`; a tied head is an int8 copy of the
embeddings, :meth:`DecoderModel.tie_head`); embeddings, norms and activations stay in the
model dtype. With ``quantization="fp8"`` (CUDA GPUs with fp8 tensor
cores only) the four projections hold fp8 weights with per-row scales (:mod:`local_engine.fp8`)
and the LM head stays bfloat16.
"""

from __future__ import annotations

import logging
import math
import os

import torch
import torch.nn.functional as F
from torch import nn

from local_engine.errors import EngineConfigError

from .attention import AttentionBackend, AttentionMetadata, get_attention_backend
from .attention.cpu import CPUPagedAttention
from .attention.native import (
    LINEAR_MAX_ROWS,
    RMS_NORM_MAX_COLS,
    WEIGHT_KINDS,
    KernelError,
    LayerArgs,
    PagedDecodeKernel,
    StepArgs,
    load_paged_decode,
)
from .config import ModelConfig, RopeScaling
from .fp8 import Fp8Weight, check_fp8_device
from .quant import (
    DequantScratch,
    Int4Weight,
    Int8Weight,
    PackedWeight,
    Quantization,
    QuantizedWeight,
    check_quantization,
    linear,
)

__all__ = [
    "PACKED_WEIGHTS_ENV",
    "DecoderLayer",
    "DecoderModel",
    "Rotary",
    "rope_inverse_frequencies",
]

PACKED_WEIGHTS_ENV = "SWIFTCLIENT_PACKED_WEIGHTS"
"""``0`` keeps a bfloat16 CPU model's projections row-major (the packed layout is the
default where the native kernels have it); read when a model finishes loading."""

logger = logging.getLogger("local_engine")


def _param(*shape: int, dtype: torch.dtype, device: torch.device) -> nn.Parameter:
    return nn.Parameter(torch.empty(shape, dtype=dtype, device=device), requires_grad=False)


def _cpu_kernel(x: torch.Tensor) -> PagedDecodeKernel | None:
    """The native kernel library for a CPU tensor where it loads; None elsewhere (torch's
    operations then do the work)."""
    return load_paged_decode() if x.device.type == "cpu" else None


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last axis; ``weight`` broadcasts against ``x``.

    Half-precision inputs are normalized in float32 and cast back before the weight is
    applied, as transformers does. On CPU the native kernel does it in one pass where it
    loads (float32 and bfloat16; ``KernelError`` if it refuses sizes it was meant to take);
    torch's operations do it elsewhere.
    """
    if (kernel := _cpu_kernel(x)) is not None and (
        out := kernel.rms_norm(x, weight, eps, torch.get_num_threads())  # None: not its case
    ) is not None:
        return out
    if x.dtype == torch.float32:
        if weight.dim() == 1:
            return F.rms_norm(x, (x.shape[-1],), weight, eps)
        # Scaled in place: the normalized tensor is fresh, and a per-head weight broadcast
        # into a new tensor costs a pass over a prefill's queries and keys.
        return F.rms_norm(x, (x.shape[-1],), None, eps).mul_(weight)
    return weight * F.rms_norm(x.float(), (x.shape[-1],), None, eps).to(x.dtype)


def _rope(qk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``qk * cos + rotate_half(qk) * sin`` in a fresh tensor; ``sin`` carries the sign of
    ``rotate_half`` (its first half negated).

    Each half of the rotated product is written straight into the output (no concatenated
    copy of ``qk``, which on CPU takes a slow strided path for a prefill's many rows), then
    ``qk * cos`` is added in place (one fused multiply-add per element, as ``addcmul`` does).
    """
    half = qk.shape[-1] // 2
    out = torch.empty(qk.shape, dtype=qk.dtype, device=qk.device)
    torch.mul(qk[..., half:], sin[..., :half], out=out[..., :half])
    torch.mul(qk[..., :half], sin[..., half:], out=out[..., half:])
    return out.addcmul_(qk, cos)


class Rotary:
    """One forward's rotary inputs: the positions and the model's half-width tables, with
    the full-width ``cos``/``sin`` that torch's path uses built on first use."""

    __slots__ = ("_full", "cos_table", "positions", "sin_table")

    def __init__(self, positions: torch.Tensor, cos_table: torch.Tensor, sin_table: torch.Tensor):
        """``positions`` ``[T]`` int64; the tables ``[max_positions, head_dim // 2]``."""
        self.positions = positions
        self.cos_table = cos_table
        self.sin_table = sin_table
        self._full: tuple[torch.Tensor, torch.Tensor] | None = None

    def full(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``cos`` and the signed ``sin`` (first half negated), ``[T, 1, head_dim]``."""
        if self._full is None:
            cos_half = self.cos_table[self.positions]
            sin_half = self.sin_table[self.positions]
            cos = torch.cat((cos_half, cos_half), dim=-1).unsqueeze(1)
            sin = torch.cat((-sin_half, sin_half), dim=-1).unsqueeze(1)
            self._full = (cos, sin)
        return self._full


def _qk_rope(
    qk: torch.Tensor, norm_weight: torch.Tensor | None, eps: float, rotary: Rotary
) -> torch.Tensor:
    """The query and key heads ``qk`` ``[T, heads, head_dim]`` (a view of the fused
    projection), RMS-normalized per head where the model has a q/k norm, then rotated, in a
    fresh contiguous tensor. On CPU the native kernel does both in one pass where it loads;
    torch's operations do them elsewhere."""
    if (kernel := _cpu_kernel(qk)) is not None and (
        out := kernel.rope(
            qk,
            norm_weight,
            eps,
            rotary.cos_table,
            rotary.sin_table,
            rotary.positions,
            torch.get_num_threads(),
        )
    ) is not None:
        return out
    if norm_weight is not None:
        qk = _rms_norm(qk, norm_weight, eps)
    cos, sin = rotary.full()
    return _rope(qk, cos, sin)


def _swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` from the fused gate/up projection's output ``[T, 2 * I]``; on CPU
    in one native pass where the kernel loads."""
    if (
        (kernel := _cpu_kernel(gate_up)) is not None
        and kernel.vector_activation  # a build without AVX-512 BW/VL declines: skip the call
        and (out := kernel.silu_mul(gate_up, torch.get_num_threads())) is not None
    ):
        return out
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate, inplace=True).mul_(up)


def _decode_linear(
    x: torch.Tensor,
    weight: torch.Tensor | QuantizedWeight,
    bias: torch.Tensor | None,
    residual: torch.Tensor | None,
) -> torch.Tensor | None:
    """The native kernel's ``x @ weight.T (+ bias) (+ residual)`` for a decode step's few
    bfloat16 rows against a dense, int8 or int4 weight on CPU (one pass over the weight at
    memory speed), or for any number of rows against a packed one; None where it does not
    apply (the caller then uses torch)."""
    if x.dtype != torch.bfloat16 or x.dim() != 2 or (kernel := _cpu_kernel(x)) is None:
        return None
    if isinstance(weight, PackedWeight):
        return kernel.linear_packed(
            x,
            weight.packed,
            weight.out_features,
            weight.in_features,
            bias,
            residual,
            torch.get_num_threads(),
        )
    if x.shape[0] > LINEAR_MAX_ROWS:
        return None
    if isinstance(weight, torch.Tensor):
        return kernel.linear(x, weight, bias, residual, torch.get_num_threads())
    if isinstance(weight, Int8Weight):
        return kernel.linear_int8(
            x, weight.qweight, weight.scales, bias, residual, torch.get_num_threads()
        )
    if isinstance(weight, Int4Weight):
        return kernel.linear_int4(
            x,
            weight.qweight,
            weight.scales,
            bias,
            residual,
            torch.get_num_threads(),
            weight.out_features,
        )
    return None


def _linear(
    x: torch.Tensor, weight: torch.Tensor | QuantizedWeight, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """:func:`local_engine.quant.linear`, through the native kernel where it applies."""
    out = _decode_linear(x, weight, bias, None)
    return linear(x, weight, bias) if out is None else out


def _residual_linear(
    residual: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor | QuantizedWeight,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """``residual + linear(x, weight, bias)``; for a dense weight without bias the add rides
    in the matmul (the native kernel's, or ``addmm``'s beta term), saving a pass over the
    hidden states."""
    if bias is None and x.dim() == 2:
        if (out := _decode_linear(x, weight, None, residual)) is not None:
            return out
        if isinstance(weight, torch.Tensor):
            return torch.addmm(residual, x, weight.t())
    return residual + _linear(x, weight, bias)


def rope_inverse_frequencies(
    head_dim: int, theta: float, scaling: RopeScaling | None
) -> torch.Tensor:
    """Float32 rotary inverse frequencies ``[head_dim // 2]``, with optional scaling."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
    inv_freq = 1.0 / (theta**exponents)
    if scaling is None:
        return inv_freq
    if scaling.rope_type == "linear":
        return inv_freq / scaling.factor
    # llama3: long wavelengths are divided by factor, short ones kept, the band between blended.
    old_len = scaling.original_max_position_embeddings
    low_wavelen = old_len / scaling.low_freq_factor
    high_wavelen = old_len / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (old_len / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    blended = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    in_band = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(in_band, blended, scaled)


class DecoderLayer(nn.Module):
    """Pre-norm attention + SwiGLU MLP block with fused projections."""

    qkv_weight: torch.Tensor | QuantizedWeight
    o_weight: torch.Tensor | QuantizedWeight
    gate_up_weight: torch.Tensor | QuantizedWeight
    down_weight: torch.Tensor | QuantizedWeight

    def __init__(
        self,
        config: ModelConfig,
        index: int,
        *,
        dtype: torch.dtype,
        device: torch.device,
        scratch: DequantScratch | None = None,
        fp8: bool = False,
        int4: bool = False,
    ) -> None:
        """Allocate one layer's (uninitialized) parameters; with ``scratch`` the four
        projections are int8 weights (int4 with ``int4``) that dequantize into it when they
        must, with ``fp8`` they are fp8 weights (:mod:`local_engine.fp8`)."""
        super().__init__()
        hidden, hd = config.hidden_size, config.head_dim
        heads, kv_heads = config.num_heads, config.num_kv_heads
        qkv_rows = (heads + 2 * kv_heads) * hd

        def p(*shape: int) -> nn.Parameter:
            return _param(*shape, dtype=dtype, device=device)

        def w(rows: int, cols: int) -> torch.Tensor | QuantizedWeight:
            if fp8:
                return Fp8Weight(rows, cols, device=device)
            if scratch is None:
                return p(rows, cols)
            kind = Int4Weight if int4 else Int8Weight
            return kind(rows, cols, dtype=dtype, device=device, scratch=scratch)

        self.num_heads = heads
        self.num_kv_heads = kv_heads
        self.head_dim = hd
        self.eps = config.rms_norm_eps
        self.scale = hd**-0.5
        self.sliding_window = config.sliding_windows[index]
        self.input_norm = p(hidden)
        self.qkv_weight = w(qkv_rows, hidden)
        self.qkv_bias = p(qkv_rows) if config.attention_bias else None
        self.qk_norm_weight = p(heads + kv_heads, hd) if config.qk_norm else None
        self.o_weight = w(hidden, heads * hd)
        self.o_bias = p(hidden) if config.o_proj_bias else None
        self.post_norm = p(hidden)
        self.gate_up_weight = w(2 * config.intermediate_size, hidden)
        self.down_weight = w(hidden, config.intermediate_size)

    def native_args(self, kernel: PagedDecodeKernel) -> LayerArgs | None:
        """The layer's arguments for the whole-layer decode call (:meth:`DecoderModel.forward`),
        built once and rebuilt when a weight object is replaced; None where the call does not
        take this layer (weights other than bfloat16, int8 or int4 on CPU with their kernels,
        an output-projection bias, float16, sizes over the kernels' limits)."""
        sources = self._native_sources()
        cached: tuple[tuple[object, ...], LayerArgs | None] | None = self.__dict__.get("_native")
        if cached is not None and all(a is b for a, b in zip(cached[0], sources, strict=True)):
            return cached[1]
        args = self._build_native_args(kernel)
        self.__dict__["_native"] = (sources, args)
        return args

    def _native_sources(self) -> tuple[object, ...]:
        """The objects :meth:`native_args` points into (weights, their codes and scales)."""
        sources: list[object] = [self.input_norm, self.post_norm, self.qkv_bias, self.o_bias]
        sources.append(self.qk_norm_weight)
        for w in (self.qkv_weight, self.o_weight, self.gate_up_weight, self.down_weight):
            if isinstance(w, Int8Weight | Int4Weight):
                sources += (w, w.qweight, w.scales)
            else:
                sources += (w, w.packed) if isinstance(w, PackedWeight) else (w,)
        return tuple(sources)

    def _build_native_args(self, kernel: PagedDecodeKernel) -> LayerArgs | None:
        bf16 = torch.bfloat16
        dense = (self.input_norm, self.post_norm, self.qkv_bias, self.qk_norm_weight)
        if (
            not kernel.vector_activation
            or self.o_bias is not None
            or any(t is not None and (t.dtype != bf16 or not t.is_contiguous()) for t in dense)
            or self.input_norm.shape[0] > RMS_NORM_MAX_COLS
        ):
            return None
        hd, heads, kv_heads = self.head_dim, self.num_heads, self.num_kv_heads
        norm = self.qk_norm_weight
        if norm is None or norm.shape == (hd,):
            norm_stride = 0
        elif norm.shape == (heads + kv_heads, hd):
            norm_stride = hd
        else:
            return None
        args = LayerArgs()
        for i, w in enumerate(
            (self.qkv_weight, self.o_weight, self.gate_up_weight, self.down_weight)
        ):
            if isinstance(w, torch.Tensor):
                if not kernel.bf16_linear or w.dtype != bf16 or not w.is_contiguous():
                    return None
                kind, codes, scales = "bf16", w, None
            elif isinstance(w, PackedWeight):
                if not kernel.packed_linear:
                    return None
                kind, codes, scales = "packed", w.packed, None
            elif isinstance(w, Int8Weight | Int4Weight):
                if not kernel.int8_linear or w.scales.dtype != bf16:
                    return None
                kind = "int8" if isinstance(w, Int8Weight) else "int4"
                codes, scales = w.qweight, w.scales
                if not (codes.is_contiguous() and scales.is_contiguous()):
                    return None
            else:
                return None
            if codes.device.type != "cpu":
                return None
            args.weights[i] = codes.data_ptr()
            args.scales[i] = None if scales is None else scales.data_ptr()
            args.kinds[i] = WEIGHT_KINDS[kind]
        args.input_norm = self.input_norm.data_ptr()
        args.post_norm = self.post_norm.data_ptr()
        args.qkv_bias = None if self.qkv_bias is None else self.qkv_bias.data_ptr()
        args.qk_norm = None if norm is None else norm.data_ptr()
        args.qk_norm_stride = norm_stride
        args.hidden = self.input_norm.shape[0]
        args.heads, args.kv_heads, args.head_dim = heads, kv_heads, hd
        args.intermediate = self.gate_up_weight.shape[0] // 2
        args.window = self.sliding_window or 0
        args.eps, args.scale = self.eps, self.scale
        return args

    def forward(
        self,
        x: torch.Tensor,
        rotary: Rotary,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        attention: AttentionBackend,
    ) -> torch.Tensor:
        """Run the block on ``x`` ``[T, hidden]`` at ``rotary``'s positions."""
        tokens = x.shape[0]
        heads, kv_heads, hd = self.num_heads, self.num_kv_heads, self.head_dim
        h = _rms_norm(x, self.input_norm, self.eps)
        qkv = _linear(h, self.qkv_weight, self.qkv_bias).view(tokens, heads + 2 * kv_heads, hd)
        out = (  # a decode step on the CPU kernel: rotate, store and attend in one call
            attention.rope_decode(
                qkv,
                heads,
                self.qk_norm_weight,
                self.eps,
                (rotary.positions, rotary.cos_table, rotary.sin_table),
                kv_cache,
                meta,
                scale=self.scale,
                sliding_window=self.sliding_window,
            )
            if isinstance(attention, CPUPagedAttention)
            else None
        )
        if out is None:
            qk = _qk_rope(qkv[:, : heads + kv_heads], self.qk_norm_weight, self.eps, rotary)
            out = attention.forward(
                qk[:, :heads],
                qk[:, heads:],
                qkv[:, heads + kv_heads :],
                kv_cache,
                meta,
                scale=self.scale,
                sliding_window=self.sliding_window,
            )
        x = _residual_linear(x, out.reshape(tokens, heads * hd), self.o_weight, self.o_bias)
        h = _rms_norm(x, self.post_norm, self.eps)
        return _residual_linear(x, _swiglu(_linear(h, self.gate_up_weight)), self.down_weight)


class DecoderModel(nn.Module):
    """Token ids + positions + paged KV cache -> final hidden states; logits on demand."""

    rope_cos: torch.Tensor  # [max_position_embeddings, head_dim // 2], model dtype
    rope_sin: torch.Tensor

    def __init__(
        self,
        config: ModelConfig,
        *,
        dtype: torch.dtype | None = None,
        device: str | torch.device = "cpu",
        attention: AttentionBackend | None = None,
        quantization: Quantization | None = None,
    ) -> None:
        """Allocate an uninitialized model on ``device`` (dtype defaults to ``config.dtype``).

        Raises:
            EngineConfigError: an unknown ``quantization``, ``"fp8"`` without a capable GPU,
                or ``"int8"`` with float32
                activations (the int8 kernels take bfloat16 or float16).
        """
        super().__init__()
        dtype = dtype if dtype is not None else getattr(torch, config.dtype)
        dev = torch.device(device)
        self.quantization = check_quantization(quantization)
        if self.quantization is not None and dtype not in (torch.bfloat16, torch.float16):
            raise EngineConfigError(
                f"{self.quantization} weights run with bfloat16 or float16 activations, not "
                f"{str(dtype).removeprefix('torch.')}; use dtype='bfloat16' (or leave it unset)"
            )
        fp8 = self.quantization == "fp8"
        if fp8:
            check_fp8_device(dev)
            if dtype != torch.bfloat16:
                raise EngineConfigError("fp8 weights run with bfloat16 activations")
        int4 = self.quantization == "int4"
        scratch = DequantScratch() if self.quantization in ("int8", "int4") else None
        self.config = config
        self.attention: AttentionBackend = attention or get_attention_backend("auto", device=dev)
        self.embed_tokens = _param(config.vocab_size, config.hidden_size, dtype=dtype, device=dev)
        layers = [
            DecoderLayer(config, i, dtype=dtype, device=dev, scratch=scratch, fp8=fp8, int4=int4)
            for i in range(config.num_layers)
        ]
        self.layers = nn.ModuleList(layers)
        self._layer_seq: tuple[DecoderLayer, ...] = tuple(layers)
        self.norm = _param(config.hidden_size, dtype=dtype, device=dev)
        self.lm_head: torch.Tensor | Int8Weight
        if scratch is not None and (not config.tie_word_embeddings or dev.type == "cpu"):
            # int8 for int4 too: the head decides the tokens. On CPU a tied head is an int8
            # copy of the embeddings (tie_head), which the lookup keeps dense: a decode step
            # streams half the bytes of a bfloat16 head.
            self.lm_head = Int8Weight(
                config.vocab_size, config.hidden_size, dtype=dtype, device=dev, scratch=scratch
            )
        elif config.tie_word_embeddings:
            self.lm_head = self.embed_tokens
        else:
            self.lm_head = _param(config.vocab_size, config.hidden_size, dtype=dtype, device=dev)
        inv_freq = rope_inverse_frequencies(config.head_dim, config.rope_theta, config.rope_scaling)
        positions = torch.arange(config.max_position_embeddings, dtype=torch.float32)
        freqs = positions[:, None] * inv_freq[None, :]
        self.register_buffer("rope_cos", freqs.cos().to(device=dev, dtype=dtype), persistent=False)
        self.register_buffer("rope_sin", freqs.sin().to(device=dev, dtype=dtype), persistent=False)

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of weights, activations and the KV cache."""
        return self.embed_tokens.dtype

    @property
    def device(self) -> torch.device:
        """The device holding the weights."""
        return self.embed_tokens.device

    def set_attention_backend(self, attention: AttentionBackend) -> None:
        """Route attention through ``attention`` from the next forward on."""
        self.attention = attention

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        """Run the new tokens ``[T]`` at ``positions`` ``[T]``; return hidden ``[T, hidden]``.

        Raises:
            EngineConfigError: ``kv_caches`` does not hold one tensor per layer.
        """
        if len(kv_caches) != len(self._layer_seq):
            raise EngineConfigError(
                f"expected {len(self._layer_seq)} KV cache tensors, got {len(kv_caches)}"
            )
        meta.derived.clear()
        with torch.inference_mode():
            hidden = F.embedding(input_ids, self.embed_tokens)
            if not self._native_decode(input_ids, hidden, positions, kv_caches, meta):
                rotary = Rotary(positions, self.rope_cos, self.rope_sin)
                for layer, cache in zip(self._layer_seq, kv_caches, strict=True):
                    hidden = layer.forward(hidden, rotary, cache, meta, self.attention)
            return _rms_norm(hidden, self.norm, self.config.rms_norm_eps)

    def _native_decode(
        self,
        input_ids: torch.Tensor,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        meta: AttentionMetadata,
    ) -> bool:
        """Run a decode step of a few bfloat16 rows through every layer with one native call
        per layer (``swift_decode_layer_bf16``: the same kernels as the layer's own path, bit
        for bit, without its Python between them), updating ``hidden`` (the embeddings of
        ``input_ids``) in place; False, with ``hidden`` as it came, where the step or a layer
        is not the call's (the layers then run one operation at a time)."""
        attention = self.attention
        rows = hidden.shape[0]
        if (
            not isinstance(attention, CPUPagedAttention)
            or hidden.dtype != torch.bfloat16
            or hidden.device.type != "cpu"
            or not 0 < rows <= LINEAR_MAX_ROWS
            or (kernel := attention.kernel) is None
            or not kernel.bf16_linear
        ):
            return False
        layers = [layer.native_args(kernel) for layer in self._layer_seq]
        if any(args is None for args in layers) or any(
            not cache.is_contiguous() for cache in kv_caches
        ):
            return False
        cos, sin = self.rope_cos, self.rope_sin
        positions = positions.to(torch.int64).contiguous()
        if int(positions.max()) >= cos.shape[0] or int(positions.min()) < 0:
            return False  # the layer path reports it
        first = self._layer_seq[0]
        plan = attention.decode_step(meta, kv_caches[0], rows, first.num_heads)
        if plan is None:
            return False
        arguments, alive = plan
        step = StepArgs(
            cos=cos.data_ptr(),
            sin=sin.data_ptr(),
            positions=positions.data_ptr(),
            max_pos=cos.shape[0],
            rows=rows,
            nthreads=torch.get_num_threads(),
            **arguments,
        )
        widest = max(
            a.hidden
            + (a.heads + 2 * a.kv_heads) * a.head_dim
            + a.heads * a.head_dim
            + 3 * a.intermediate
            for a in layers
            if a is not None
        )
        scratch = torch.empty(rows * widest, dtype=torch.bfloat16)
        x = hidden.data_ptr()
        try:
            for args, cache in zip(layers, kv_caches, strict=True):
                assert args is not None
                kernel.decode_layer(
                    args, step, cache[0].data_ptr(), cache[1].data_ptr(), x, scratch.data_ptr()
                )
        except KernelError as exc:
            # Out of scratch memory in a part: the layer path redoes the whole step from the
            # embeddings (``hidden`` is recomputed) and rewrites the same cache values.
            logger.warning("%s; this step runs layer by layer", exc)
            hidden.copy_(F.embedding(input_ids, self.embed_tokens))
            return False
        del alive
        return True

    def tie_head(self) -> None:
        """Quantize the loaded embeddings into the int8 LM head of a tied int8 or int4 model
        on CPU (the loaders call it last); nothing for other models."""
        if self.config.tie_word_embeddings and isinstance(self.lm_head, Int8Weight):
            self.lm_head.rows(0, self.config.vocab_size).copy_(self.embed_tokens)

    def finish_loading(self) -> None:
        """What the loaders do once every weight is in: the int8 copy of a tied head
        (:meth:`tie_head`), then the packed layout for bfloat16 projections on CPU
        (:meth:`pack_weights`)."""
        self.tie_head()
        self.pack_weights()

    def pack_weights(self) -> int:
        """Keep the layers' bfloat16 projections on CPU in the native kernels' packed layout
        (:class:`~local_engine.quant.PackedWeight`), one weight at a time (the row-major copy
        is dropped as its packed one is made), where the kernel library has the packed
        kernel; ``SWIFTCLIENT_PACKED_WEIGHTS=0`` keeps them row-major. Returns how many were
        packed."""
        if os.environ.get(PACKED_WEIGHTS_ENV, "1").strip() == "0":
            return 0
        packed = 0
        with torch.no_grad():
            for layer in self._layer_seq:
                for name in ("qkv_weight", "o_weight", "gate_up_weight", "down_weight"):
                    weight = getattr(layer, name)
                    if not isinstance(weight, torch.Tensor) or weight.device.type != "cpu":
                        continue
                    made = PackedWeight.pack(weight.detach())
                    if made is None:
                        continue
                    delattr(layer, name)  # an nn.Parameter: the module forgets it first
                    setattr(layer, name, made)
                    packed += 1
        return packed

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Project hidden states ``[N, hidden]`` to float32 logits ``[N, vocab]``."""
        with torch.inference_mode():
            return _linear(hidden, self.lm_head).float()

    def make_kv_cache(self, num_blocks: int, block_size: int) -> list[torch.Tensor]:
        """Allocate a zeroed paged cache: per layer ``[2, num_blocks, block_size, kv, hd]``.

        Raises:
            EngineConfigError: a non-positive size.
        """
        if num_blocks <= 0 or block_size <= 0:
            raise EngineConfigError(
                f"num_blocks and block_size must be positive, got {num_blocks} and {block_size}"
            )
        shape = (2, num_blocks, block_size, self.config.num_kv_heads, self.config.head_dim)
        return [
            torch.zeros(shape, dtype=self.dtype, device=self.device)
            for _ in range(self.config.num_layers)
        ]

    def kv_bytes_per_token(self) -> int:
        """Bytes of KV cache one token occupies across all layers."""
        cfg = self.config
        return 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * self.dtype.itemsize
