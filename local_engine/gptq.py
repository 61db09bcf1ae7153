"""Load a GPTQ 4-bit checkpoint (an HF directory whose config.json has
``quantization_config.quant_method = "gptq"``) onto the int4 path.

GPTQ stores each projection ``X`` as ``X.qweight`` (int32 ``[K / 8, N]``: eight 4-bit codes
per word along the input dimension, lowest bits first), ``X.scales`` (``[K / g, N]``, one
per group of ``g`` inputs), ``X.qzeros`` (int32 ``[K / g, N / 8]``: the zero points packed
along the output dimension; the original "gptq" format stores ``zero - 1``, "gptq_v2" the
zero itself) and ``X.g_idx`` (the group of each input), with ``value = (q - zero) * scale``.

The symmetric format (``sym=True``: every zero point is 8) with groups of a multiple of 32
inputs in order (``desc_act=False``, or a ``g_idx`` that is the identity's) maps onto the
int4 weights exactly: the codes are their stored codes, and a group's scale is the scale
of each of its 32-value blocks (a 128-group's repeated 4 times), rounded to the activation
dtype (float16 checkpoints usually run in float16: exact). Anything else GPTQ describes
(asymmetric zero points, act-order with a permuted ``g_idx``, groups not a multiple of 32)
is dequantized and requantized to the int4 blocks: a rounding. Other bit widths and other
``quant_method`` values (AWQ: asymmetric zero points and its own packing order) raise
:class:`UnsupportedCheckpointError`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from local_engine.errors import EngineConfigError

from .config import ModelConfig, _read_json
from .model import DecoderModel
from .quant import INT4_BLOCK, Int4Rows, Quantization, check_quantization
from .weight_rows import QuantizedRows

__all__ = [
    "GPTQLayout",
    "UnsupportedCheckpointError",
    "dequantize_gptq",
    "gptq_layout",
    "load_gptq_model",
    "quantization_config",
]


class UnsupportedCheckpointError(EngineConfigError):
    """A pre-quantized checkpoint whose format the engine cannot load; the message names it
    and what is supported."""


@dataclasses.dataclass(frozen=True)
class GPTQLayout:
    """What a GPTQ ``quantization_config`` says about its tensors."""

    group_size: int
    """Inputs per scale; -1: one group of all inputs."""
    zero_offset: int
    """Added to the stored zero points: 1 for the original "gptq" format, 0 for v2."""


def quantization_config(root: str | Path) -> dict[str, Any] | None:
    """The ``quantization_config`` object of ``root/config.json``, or None without one."""
    config = _read_json(Path(root) / "config.json", required=False)
    value = config.get("quantization_config")
    return dict(value) if isinstance(value, Mapping) else None


def gptq_layout(config: Mapping[str, Any]) -> GPTQLayout:
    """Check a ``quantization_config`` and return its layout.

    Raises:
        UnsupportedCheckpointError: a method other than GPTQ, or GPTQ with other than 4 bits.
    """
    method = str(config.get("quant_method", "")).lower()
    if method != "gptq":
        why = {
            "awq": "AWQ's zero points are asymmetric and its packing order differs; "
            "re-quantize from the float checkpoint with quantization='int4'"
        }.get(method, "load the float checkpoint and quantize it with quantization=...")
        raise UnsupportedCheckpointError(
            f"unsupported pre-quantized checkpoint: quant_method {method!r}; the engine loads "
            f"GPTQ 4-bit (quant_method 'gptq', bits 4) onto int4 ({why})"
        )
    bits = config.get("bits")
    if bits != 4:
        raise UnsupportedCheckpointError(
            f"unsupported GPTQ checkpoint: bits={bits!r}; the engine loads 4-bit GPTQ"
        )
    group = config.get("group_size", 128)
    if not isinstance(group, int) or (group <= 0 and group != -1):
        raise EngineConfigError(f"GPTQ group_size must be a positive integer or -1, got {group!r}")
    fmt = str(config.get("checkpoint_format", config.get("format", "gptq"))).lower()
    return GPTQLayout(group_size=group, zero_offset=0 if fmt == "gptq_v2" else 1)


_SHIFTS = torch.arange(0, 32, 4, dtype=torch.int32)


def _unpack_rows(packed: torch.Tensor) -> torch.Tensor:
    """int32 ``[R, C]`` holding 8 codes per word along R -> codes ``[8 R, C]`` (int32)."""
    r, c = packed.shape
    codes = (packed.to(torch.int32).unsqueeze(1) >> _SHIFTS.view(1, 8, 1)) & 15
    return codes.reshape(8 * r, c)


def _unpack_cols(packed: torch.Tensor) -> torch.Tensor:
    """int32 ``[R, C]`` holding 8 codes per word along C -> codes ``[R, 8 C]`` (int32)."""
    r, c = packed.shape
    codes = (packed.to(torch.int32).unsqueeze(2) >> _SHIFTS.view(1, 1, 8)) & 15
    return codes.reshape(r, 8 * c)


@dataclasses.dataclass(frozen=True)
class _GPTQWeight:
    codes: torch.Tensor  # [N, K] int32, 0..15
    zeros: torch.Tensor  # [G, N] int32
    scales: torch.Tensor  # [G, N] float32
    g_idx: torch.Tensor  # [K] int64


def _read_weight(
    tensors: Mapping[str, torch.Tensor], prefix: str, shape: tuple[int, int], layout: GPTQLayout
) -> _GPTQWeight:
    n, k = shape
    try:
        qweight = tensors[f"{prefix}.qweight"]
        qzeros = tensors[f"{prefix}.qzeros"]
        scales = tensors[f"{prefix}.scales"]
    except KeyError as exc:
        raise EngineConfigError(f"GPTQ checkpoint lacks {exc.args[0]!r}") from exc
    if tuple(qweight.shape) != (k // 8, n):
        raise EngineConfigError(
            f"GPTQ weight {prefix}.qweight has shape {tuple(qweight.shape)}, expected "
            f"{(k // 8, n)} for a {n}x{k} projection"
        )
    group = k if layout.group_size == -1 else layout.group_size
    g_idx = tensors.get(f"{prefix}.g_idx")
    if g_idx is not None and (tuple(g_idx.shape) != (k,) or (k and int(g_idx.min()) < 0)):
        raise EngineConfigError(
            f"GPTQ weight {prefix}.g_idx has shape {tuple(g_idx.shape)}, expected ({k},): "
            f"one non-negative group index per input of a {n}x{k} projection"
        )
    index = torch.arange(k, dtype=torch.int64) // group if g_idx is None else g_idx.to(torch.int64)
    zeros = _unpack_cols(qzeros)[:, :n] + layout.zero_offset
    groups = int(index.max().item()) + 1
    if tuple(scales.shape) != (groups, n) or zeros.shape[0] != groups:
        raise EngineConfigError(
            f"GPTQ weight {prefix}: scales {tuple(scales.shape)} and qzeros "
            f"{tuple(qzeros.shape)} do not match {groups} groups of {n} outputs"
        )
    return _GPTQWeight(_unpack_rows(qweight).t(), zeros, scales.to(torch.float32), index)


def dequantize_gptq(weight: _GPTQWeight) -> torch.Tensor:
    """The float32 weight ``[N, K]`` a GPTQ projection stands for."""
    scales = weight.scales[weight.g_idx].t()  # [N, K]
    zeros = weight.zeros[weight.g_idx].t()
    return (weight.codes - zeros).to(torch.float32) * scales


def _exact_blocks(weight: _GPTQWeight) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Stored codes ``[N, K]`` and block scales ``[N, K / 32]`` when the weight maps onto
    the int4 blocks exactly (symmetric, groups of whole 32-value blocks in order)."""
    k = weight.codes.shape[1]
    if k % INT4_BLOCK or not bool((weight.zeros == 8).all()):
        return None
    blocks = weight.g_idx.view(k // INT4_BLOCK, INT4_BLOCK)
    if not bool((blocks == blocks[:, :1]).all()):
        return None  # a block spans two groups (act-order, or groups not a multiple of 32)
    scales = weight.scales[blocks[:, 0]].t().contiguous()  # [N, K / 32]
    return weight.codes.to(torch.uint8), scales


def load_gptq_model(
    path: str | Path,
    *,
    dtype: str | torch.dtype | None = None,
    device: str | torch.device = "cpu",
    quantization: Quantization | None = None,
) -> DecoderModel:
    """Read a GPTQ checkpoint directory into a DecoderModel on the int4 path (see the module
    docstring for what maps exactly). ``quantization`` None means ``"int4"``; another
    method dequantizes and requantizes to it.

    Raises:
        EngineConfigError: missing or misshapen tensors;
            :class:`UnsupportedCheckpointError` for a format it cannot load.
    """
    from .loader import _check_names, _targets, _weight_files, resolve_dtype

    root = Path(path)
    qconfig = quantization_config(root)
    if qconfig is None:
        raise EngineConfigError(f"{str(root)!r} has no quantization_config in config.json")
    layout = gptq_layout(qconfig)
    quantization = check_quantization(quantization) or "int4"
    config = ModelConfig.from_pretrained(root)
    torch_dtype = resolve_dtype(dtype, config, quantization)
    config = dataclasses.replace(config, dtype=str(torch_dtype).removeprefix("torch."))
    model = DecoderModel(config, dtype=torch_dtype, device=device, quantization=quantization)
    targets = _targets(model)
    quantized = {
        name[: -len(".weight")]
        for name, (target, _) in targets.items()
        if isinstance(target, QuantizedRows) and name != "lm_head.weight"
    }
    tensors: dict[str, torch.Tensor] = {}
    for file in _weight_files(root):
        with safe_open(str(file), framework="pt", device="cpu") as handle:
            for name in handle.keys():
                tensors[name] = handle.get_tensor(name)
    plain = {
        name: tuple(t.shape)
        for name, t in tensors.items()
        if name.rsplit(".", 1)[0] not in quantized or not name.endswith(_GPTQ_SUFFIXES)
    }
    plain.update({f"{prefix}.weight": targets[f"{prefix}.weight"][1] for prefix in quantized})
    _check_names(targets, {root / "config.json": plain}, config)
    with torch.no_grad():
        for name, (target, shape) in targets.items():
            prefix = name[: -len(".weight")]
            if prefix not in quantized:
                target.copy_(tensors[name])
                continue
            weight = _read_weight(tensors, prefix, (shape[0], shape[1]), layout)
            exact = _exact_blocks(weight) if isinstance(target, Int4Rows) else None
            if exact is None:
                target.copy_(dequantize_gptq(weight))
                continue
            assert isinstance(target, Int4Rows)
            target.write(*exact)
    model.finish_loading()
    return model


_GPTQ_SUFFIXES = (".qweight", ".qzeros", ".scales", ".g_idx")
