"""Model configuration: one frozen description of a decoder, read from an HF ``config.json``.

Supported families are Llama (including llama3 rope scaling), Qwen2 (qkv bias, optional
sliding window), Qwen3 (per-head q/k RMSNorm) and Mistral (sliding window). Both the
transformers 4.x layout (``rope_theta`` + ``rope_scaling``) and the 5.x layout
(``rope_parameters``) are understood. Anything else raises
:class:`~local_engine.errors.EngineConfigError` with the reason.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from local_engine.errors import EngineConfigError

__all__ = ["SUPPORTED_FAMILIES", "ModelConfig", "RopeScaling", "normalize_dtype_name"]

SUPPORTED_FAMILIES = ("llama", "qwen2", "qwen3", "mistral")

_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "MistralForCausalLM": "mistral",
}

_DTYPE_ALIASES = {
    "float32": "float32",
    "fp32": "float32",
    "float": "float32",
    "torch.float32": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "torch.bfloat16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
    "torch.float16": "float16",
}

# Defaults transformers uses when a key is absent from config.json, per family.
_DEFAULT_MAX_POSITIONS = {"llama": 2048, "qwen2": 32768, "qwen3": 32768, "mistral": 131072}
_ROPE_TYPES = ("default", "linear", "llama3")


def normalize_dtype_name(name: str) -> str:
    """Map a dtype spelling (``"bf16"``, ``"torch.float16"``, ...) to a canonical torch name.

    Raises:
        EngineConfigError: the name is not one of float32, bfloat16 or float16.
    """
    canonical = _DTYPE_ALIASES.get(name.strip().lower())
    if canonical is None:
        raise EngineConfigError(
            f"unsupported dtype {name!r}: expected one of float32, bfloat16, float16"
        )
    return canonical


@dataclass(frozen=True)
class RopeScaling:
    """Rotary frequency scaling: ``linear`` (divide by factor) or ``llama3`` (banded)."""

    rope_type: str
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True)
class ModelConfig:
    """Everything the decoder needs to know about a checkpoint's shape and numerics."""

    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    rope_scaling: RopeScaling | None
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    o_proj_bias: bool
    qk_norm: bool
    sliding_windows: tuple[int | None, ...]
    dtype: str
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None

    @classmethod
    def from_pretrained(cls, path: str | Path) -> ModelConfig:
        """Read ``config.json`` (and ``generation_config.json`` when present) from a model dir.

        Raises:
            EngineConfigError: the directory or config is missing, unreadable or unsupported.
        """
        root = Path(path)
        if not root.exists():
            raise EngineConfigError(f"model path {str(root)!r} does not exist")
        if not root.is_dir():
            raise EngineConfigError(
                f"model path {str(root)!r} is neither a model directory (with config.json) "
                "nor a .gguf file"
            )
        config = _read_json(root / "config.json", required=True)
        generation = _read_json(root / "generation_config.json", required=False)
        return cls.from_dict(config, generation)

    @classmethod
    def from_dict(
        cls, config: Mapping[str, Any], generation: Mapping[str, Any] | None = None
    ) -> ModelConfig:
        """Build a config from parsed ``config.json`` (+ optional ``generation_config.json``).

        Raises:
            EngineConfigError: unknown family, missing or inconsistent fields.
        """
        family = _family(config)
        if config.get("hidden_act", "silu") != "silu":
            raise EngineConfigError(f"unsupported hidden_act {config.get('hidden_act')!r}")
        if config.get("mlp_bias", False):
            raise EngineConfigError("mlp_bias=true is not supported")
        hidden = _positive_int(config, "hidden_size")
        heads = _positive_int(config, "num_attention_heads")
        kv_heads = _positive_int(config, "num_key_value_heads", default=heads)
        layers = _positive_int(config, "num_hidden_layers")
        default_head_dim = 128 if family == "qwen3" else hidden // heads
        head_dim = _positive_int(config, "head_dim", default=default_head_dim)
        if heads % kv_heads != 0:
            raise EngineConfigError(
                f"num_attention_heads ({heads}) must be a multiple of num_key_value_heads "
                f"({kv_heads})"
            )
        if head_dim % 2 != 0:
            raise EngineConfigError(f"head_dim must be even for rotary embeddings, got {head_dim}")
        max_positions = _positive_int(
            config, "max_position_embeddings", default=_DEFAULT_MAX_POSITIONS[family]
        )
        rope_theta, rope_scaling = _rope(config, max_positions)
        attention_bias = family == "qwen2" or bool(config.get("attention_bias", False))
        gen = generation or {}
        eos = gen.get("eos_token_id", config.get("eos_token_id"))
        bos = gen.get("bos_token_id", config.get("bos_token_id"))
        dtype = config.get("dtype") or config.get("torch_dtype") or "float32"
        return cls(
            family=family,
            vocab_size=_positive_int(config, "vocab_size"),
            hidden_size=hidden,
            intermediate_size=_positive_int(config, "intermediate_size"),
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=max_positions,
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            attention_bias=attention_bias,
            o_proj_bias=attention_bias and family != "qwen2",
            qk_norm=family == "qwen3",
            sliding_windows=_sliding_windows(config, family, layers),
            dtype=normalize_dtype_name(str(dtype)),
            eos_token_ids=_token_ids(eos, "eos_token_id"),
            bos_token_id=bos if isinstance(bos, int) and not isinstance(bos, bool) else None,
        )


def _read_json(path: Path, *, required: bool) -> dict[str, Any]:
    if not path.is_file():
        if required:
            raise EngineConfigError(f"{path.name} not found in {str(path.parent)!r}")
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise EngineConfigError(f"cannot read {str(path)!r}: {exc}") from exc
    if not isinstance(data, dict):
        raise EngineConfigError(f"{str(path)!r} does not hold a JSON object")
    return data


def _family(config: Mapping[str, Any]) -> str:
    model_type = config.get("model_type")
    if model_type not in SUPPORTED_FAMILIES:
        raise EngineConfigError(
            f"unsupported model_type {model_type!r}: the local engine runs "
            f"{', '.join(SUPPORTED_FAMILIES)}"
        )
    architectures = config.get("architectures") or []
    if architectures and not any(_ARCHITECTURES.get(a) == model_type for a in architectures):
        raise EngineConfigError(
            f"unsupported architectures {architectures!r} for model_type {model_type!r}: "
            f"expected a causal LM ({', '.join(sorted(_ARCHITECTURES))})"
        )
    return str(model_type)


def _positive_int(config: Mapping[str, Any], key: str, *, default: int | None = None) -> int:
    value = config.get(key)
    if value is None:
        if default is None:
            raise EngineConfigError(f"config.json lacks required field {key!r}")
        value = default
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise EngineConfigError(f"config field {key!r} must be a positive integer, got {value!r}")
    return value


def _rope(config: Mapping[str, Any], max_positions: int) -> tuple[float, RopeScaling | None]:
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if not isinstance(params, Mapping):
        raise EngineConfigError(f"rope settings must be an object, got {params!r}")
    if params and all(isinstance(v, Mapping) for v in params.values()):
        raise EngineConfigError("per-layer-type rope parameters are not supported")
    theta = float(params.get("rope_theta", config.get("rope_theta", 10000.0)))
    rope_type = params.get("rope_type", params.get("type", "default"))
    partial = params.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        raise EngineConfigError(f"partial_rotary_factor={partial!r} is not supported")
    if rope_type not in _ROPE_TYPES:
        raise EngineConfigError(
            f"unsupported rope type {rope_type!r}: expected one of {', '.join(_ROPE_TYPES)}"
        )
    if rope_type == "default":
        return theta, None
    if "factor" not in params:
        raise EngineConfigError(f"rope type {rope_type!r} needs a 'factor'")
    scaling = RopeScaling(
        rope_type=rope_type,
        factor=float(params["factor"]),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(
            params.get("original_max_position_embeddings", max_positions)
        ),
    )
    if scaling.factor <= 0 or scaling.high_freq_factor <= scaling.low_freq_factor:
        raise EngineConfigError(f"invalid rope scaling parameters {dict(params)!r}")
    return theta, scaling


def _sliding_windows(
    config: Mapping[str, Any], family: str, num_layers: int
) -> tuple[int | None, ...]:
    if family == "llama":
        return (None,) * num_layers
    if family == "mistral":
        window = config.get("sliding_window", 4096)
        return (_window(window),) * num_layers
    # qwen2 / qwen3: the window is used only when enabled, and only on some layers.
    window = _window(config.get("sliding_window", 4096))
    if not config.get("use_sliding_window", False) or window is None:
        return (None,) * num_layers
    layer_types = config.get("layer_types")
    if layer_types is not None:
        if not isinstance(layer_types, list) or len(layer_types) != num_layers:
            raise EngineConfigError("layer_types must list one entry per hidden layer")
        return tuple(window if t == "sliding_attention" else None for t in layer_types)
    first = config.get("max_window_layers", 28)
    if not isinstance(first, int):
        raise EngineConfigError(f"max_window_layers must be an integer, got {first!r}")
    return tuple(window if i >= first else None for i in range(num_layers))


def _window(value: Any) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise EngineConfigError(f"sliding_window must be a positive integer, got {value!r}")
    return value


def _token_ids(value: Any, key: str) -> tuple[int, ...]:
    if value is None:
        return ()
    items = value if isinstance(value, list) else [value]
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in items):
        raise EngineConfigError(f"{key} must be an integer or a list of integers, got {value!r}")
    return tuple(dict.fromkeys(items))
