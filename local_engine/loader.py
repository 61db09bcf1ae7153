"""Load an HF-format checkpoint directory (config.json + safetensors) into a DecoderModel.

Each HF tensor name maps onto a slice of one of the model's fused parameters (q/k/v rows of
``qkv_weight``, gate/up rows of ``gate_up_weight``, ...). All shard headers are checked
before any tensor is read: a missing, unexpected or misshapen weight raises
:class:`~local_engine.errors.EngineConfigError` naming it. Tensors are copied one at a time
into preallocated parameters, converting dtype on the way; with ``quantization="int8"`` the
projection weights are quantized as they are read (see :mod:`local_engine.quant`).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import cast

import torch
from safetensors import SafetensorError, safe_open

from local_engine.errors import EngineConfigError

from .config import ModelConfig, normalize_dtype_name
from .fp8 import Fp8Rows
from .gptq import load_gptq_model, quantization_config
from .model import DecoderLayer, DecoderModel
from .quant import (
    Int4Rows,
    Int8Rows,
    PackedWeight,
    Quantization,
    QuantizedWeight,
    check_quantization,
)

__all__ = ["load_model", "resolve_dtype"]

_INDEX_FILE = "model.safetensors.index.json"
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)

# HF name -> (destination view inside a model parameter, shape the checkpoint must have)
_Targets = dict[str, tuple[torch.Tensor | Int8Rows | Int4Rows | Fp8Rows, tuple[int, ...]]]


def resolve_dtype(
    dtype: str | torch.dtype | None,
    config: ModelConfig,
    quantization: Quantization | None = None,
) -> torch.dtype:
    """The torch dtype to load as: ``dtype`` if given (``"auto"``/None: the config's own,
    except that quantized weights turn a float32 checkpoint's into bfloat16).

    Raises:
        EngineConfigError: an unsupported dtype.
    """
    if dtype is None or dtype == "auto":
        name = config.dtype
        if quantization is not None and name == "float32":
            name = "bfloat16"
    elif isinstance(dtype, torch.dtype):
        name = normalize_dtype_name(str(dtype))
    else:
        name = normalize_dtype_name(dtype)
    return cast(torch.dtype, getattr(torch, name))


def _check_not_a_gguf_folder(root: Path) -> None:
    """A folder of .gguf files (no config.json) is not a model directory: say which file."""
    if not root.is_dir() or (root / "config.json").exists():
        return
    files = sorted(path.name for path in root.glob("*.gguf") if path.is_file())
    if files:
        listed = ", ".join(files[:5]) + (", ..." if len(files) > 5 else "")
        raise EngineConfigError(
            f"{str(root)!r} has no config.json but holds {len(files)} .gguf file(s) ({listed}): "
            f"give the file itself as the model, e.g. {str(root / files[0])!r}"
        )


def check_device(device: str | torch.device) -> None:
    """Raise EngineConfigError for a device name torch cannot parse, or a CUDA device this
    torch build or machine lacks (torch's own errors there are assertion failures)."""
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise EngineConfigError(f"unknown device {device!r}: {exc}") from exc
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            raise EngineConfigError(
                f"device {str(device)!r}: this torch has no usable CUDA "
                f"(torch {torch.__version__}, torch.cuda.is_available() is False)"
            )
        if parsed.index is not None and parsed.index >= torch.cuda.device_count():
            raise EngineConfigError(
                f"device {str(device)!r}: this machine has {torch.cuda.device_count()} CUDA "
                "device(s)"
            )


def load_model(
    path: str | Path,
    *,
    dtype: str | torch.dtype | None = None,
    device: str | torch.device = "cpu",
    quantization: Quantization | None = None,
) -> DecoderModel:
    """Read ``config.json`` and the safetensors weights under ``path`` into a DecoderModel.

    Single-file (``model.safetensors``) and sharded (``model.safetensors.index.json``)
    checkpoints are supported, with tied or untied embeddings. A ``.gguf`` file is read by
    :func:`local_engine.gguf_loader.load_gguf_model` (``quantization`` None: the file's own),
    a directory whose config.json has a ``quantization_config`` by
    :func:`local_engine.gptq.load_gptq_model` (GPTQ 4-bit onto int4).
    ``quantization="int8"`` quantizes the projection weights and the LM head (a tied one on
    CPU: an int8 copy of the embeddings, :meth:`DecoderModel.tie_head`) from the checkpoint's own
    precision as they are read; activations then default to bfloat16.

    Raises:
        EngineConfigError: the directory, config or weights are missing, unsupported or
            do not match the config; an unknown ``quantization``, or int8 with float32; a
            ``device`` this torch cannot use.
    """
    check_device(device)
    root = Path(path)
    if root.is_file() and root.suffix.lower() == ".gguf":
        from .gguf_loader import load_gguf_model

        return load_gguf_model(root, dtype=dtype, device=device, quantization=quantization)
    _check_not_a_gguf_folder(root)
    if root.is_dir() and quantization_config(root) is not None:
        return load_gptq_model(root, dtype=dtype, device=device, quantization=quantization)
    quantization = check_quantization(quantization)
    config = ModelConfig.from_pretrained(root)
    torch_dtype = resolve_dtype(dtype, config, quantization)
    config = dataclasses.replace(config, dtype=str(torch_dtype).removeprefix("torch."))
    files = _weight_files(root)
    model = DecoderModel(config, dtype=torch_dtype, device=device, quantization=quantization)
    targets = _targets(model)
    shapes_by_file = {file: _tensor_shapes(file) for file in files}
    _check_names(targets, shapes_by_file, config)
    with torch.no_grad():
        for file, shapes in shapes_by_file.items():
            with safe_open(str(file), framework="pt", device="cpu") as handle:
                for name in shapes:
                    if name in targets:
                        targets[name][0].copy_(handle.get_tensor(name))
    model.finish_loading()
    return model


def _weight_files(root: Path) -> list[Path]:
    index = root / _INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            names = sorted(set(weight_map.values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise EngineConfigError(f"cannot read {str(index)!r}: {exc}") from exc
        files = [root / name for name in names]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise EngineConfigError(f"{_INDEX_FILE} lists missing shard files: {missing}")
        return files
    single = root / "model.safetensors"
    if single.is_file():
        return [single]
    files = sorted(root.glob("*.safetensors"))
    if not files:
        raise EngineConfigError(
            f"no *.safetensors weights in {str(root)!r} (PyTorch .bin checkpoints are not "
            "supported; re-save with safetensors)"
        )
    return files


def _tensor_shapes(file: Path) -> dict[str, tuple[int, ...]]:
    """Tensor names and shapes from a safetensors header, without reading any data."""
    try:
        with safe_open(str(file), framework="pt", device="cpu") as handle:
            return {name: tuple(handle.get_slice(name).get_shape()) for name in handle.keys()}
    except (OSError, SafetensorError) as exc:
        raise EngineConfigError(f"cannot read weights file {str(file)!r}: {exc}") from exc


def _check_names(
    targets: _Targets, shapes_by_file: dict[Path, dict[str, tuple[int, ...]]], config: ModelConfig
) -> None:
    seen: dict[str, Path] = {}
    unexpected: list[str] = []
    for file, shapes in shapes_by_file.items():
        for name, shape in shapes.items():
            if name in targets and targets[name][1] != shape:
                raise EngineConfigError(
                    f"weight {name!r} in {file.name} has shape {shape}, expected "
                    f"{targets[name][1]} from config.json"
                )
            if name in seen:
                raise EngineConfigError(
                    f"weight {name!r} appears in both {seen[name].name} and {file.name}"
                )
            seen[name] = file
            ignorable = name.endswith(_IGNORED_SUFFIXES) or (
                name == "lm_head.weight" and config.tie_word_embeddings
            )
            if name not in targets and not ignorable:
                unexpected.append(name)
    if unexpected:
        raise EngineConfigError(
            f"checkpoint has {len(unexpected)} weights the {config.family} config does not "
            f"use, e.g. {sorted(unexpected)[:5]}"
        )
    missing = sorted(set(targets) - set(seen))
    if missing:
        raise EngineConfigError(
            f"checkpoint lacks {len(missing)} weights the {config.family} config needs, "
            f"e.g. {missing[:5]}"
        )


def _targets(model: DecoderModel) -> _Targets:
    cfg = model.config
    hidden, hd, inter = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    q_rows, kv_rows = cfg.num_heads * hd, cfg.num_kv_heads * hd
    targets: _Targets = {
        "model.embed_tokens.weight": (model.embed_tokens, (cfg.vocab_size, hidden)),
        "model.norm.weight": (model.norm, (hidden,)),
    }
    if not cfg.tie_word_embeddings:
        targets["lm_head.weight"] = (
            _rows(model.lm_head, 0, cfg.vocab_size),
            (cfg.vocab_size, hidden),
        )
    for i, module in enumerate(model.layers):
        layer = cast(DecoderLayer, module)
        attn, mlp = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
        splits = {
            "q_proj": (0, q_rows),
            "k_proj": (q_rows, kv_rows),
            "v_proj": (q_rows + kv_rows, kv_rows),
        }
        for proj, (start, rows) in splits.items():
            targets[f"{attn}{proj}.weight"] = (
                _rows(layer.qkv_weight, start, start + rows),
                (rows, hidden),
            )
            if layer.qkv_bias is not None:
                targets[f"{attn}{proj}.bias"] = (layer.qkv_bias[start : start + rows], (rows,))
        targets[f"{attn}o_proj.weight"] = (_rows(layer.o_weight, 0, hidden), (hidden, q_rows))
        if layer.o_bias is not None:
            targets[f"{attn}o_proj.bias"] = (layer.o_bias, (hidden,))
        if layer.qk_norm_weight is not None:
            # One per-head weight each, broadcast over that projection's heads.
            targets[f"{attn}q_norm.weight"] = (layer.qk_norm_weight[: cfg.num_heads], (hd,))
            targets[f"{attn}k_norm.weight"] = (layer.qk_norm_weight[cfg.num_heads :], (hd,))
        targets[f"{mlp}gate_proj.weight"] = (_rows(layer.gate_up_weight, 0, inter), (inter, hidden))
        targets[f"{mlp}up_proj.weight"] = (
            _rows(layer.gate_up_weight, inter, 2 * inter),
            (inter, hidden),
        )
        targets[f"{mlp}down_proj.weight"] = (_rows(layer.down_weight, 0, hidden), (hidden, inter))
        targets[f"model.layers.{i}.input_layernorm.weight"] = (layer.input_norm, (hidden,))
        targets[f"model.layers.{i}.post_attention_layernorm.weight"] = (layer.post_norm, (hidden,))
    return targets


def _rows(
    weight: torch.Tensor | QuantizedWeight, start: int, stop: int
) -> torch.Tensor | Int8Rows | Int4Rows | Fp8Rows:
    """Rows ``start:stop`` of a dense or quantized weight, as a copy target.

    Raises:
        EngineConfigError: a packed weight (packed once loaded, never a load target).
    """
    if isinstance(weight, torch.Tensor):
        return weight[start:stop]
    if isinstance(weight, PackedWeight):
        raise EngineConfigError("a packed weight is not a load target; load before packing")
    return weight.rows(start, stop)
