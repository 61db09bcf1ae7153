"""Load a GGUF file (llama.cpp's format) into a DecoderModel, with its tokenizer.

Architectures: ``llama``, ``qwen2`` and ``qwen3`` as llama.cpp's converter names them. The
metadata (``{arch}.embedding_length``, ``.block_count``, ``.attention.head_count[_kv]``,
``.rope.freq_base``, ...) becomes the engine's :class:`~local_engine.config.ModelConfig`, and
each GGUF tensor name (``blk.N.attn_q.weight``, ...) its HF name, so the HF loader's targets
take the tensors. llama.cpp's converter permutes the rows of a llama model's Q and K
projections for its rope layout; they are permuted back here (a row permutation, so quantized
rows move whole). Llama 3.1+'s rope scaling, stored as a ``rope_freqs`` tensor of divisors,
becomes the llama3 rope parameters that give those divisors.

Tensor types:

- ``F32``, ``F16``, ``BF16``: loaded as the engine's dtype (a float32 file runs in float32).
- ``Q4_0``: onto the int4 path (``quantization="int4"``, chosen by default for such a
  file). Its numbers map exactly: 4-bit codes ``q`` with ``value = (q - 8) * d`` per block of
  32 are the int4 weights' stored codes (laid out 16 rows at a time), and the block
  scale ``d`` is stored in the activation dtype (float16: exact; bfloat16: rounded to 8
  significant bits).
- ``Q8_0``: onto the int8 path (``quantization="int8"``). Its per-32 scales do not map onto
  the int8 weights' one scale per row, so each row is dequantized and requantized per row
  (a rounding, measured in docs/local-engine.md).
- Any other type the ``gguf`` package dequantizes (the K-quants ``Q2_K``..``Q6_K`` of the
  common ``Q4_K_M``-style files, ``Q4_1``, ``Q5_0``, ``Q5_1``, the ``IQ`` types, ...): each
  tensor is dequantized to float32 and requantized, to int8 for types above 5 bits a weight
  (``Q5_0``, ``Q5_1``, ``Q5_K``, ``Q6_K``) and to int4 for the others: a second rounding,
  measured in docs/local-engine.md. The engine runs one quantization for all projections, the
  one most of the file's projections map onto: a ``Q4_K_M`` file of a 7B Llama (mostly
  ``Q4_K``, some ``Q6_K``) runs as int4, one of a model whose rows llama.cpp cannot
  K-quantize (mostly ``Q5_0``) as int8.
- The token embedding and the LM head take the same types; they are dense in the engine
  (the LM head of an int8/int4 model is requantized to int8).

A type the ``gguf`` package cannot dequantize (``Q8_K``, ``Q8_1``, integer tensors) raises
:class:`UnsupportedGGUFError` naming it. A ``quantization`` given explicitly wins: the
weights are dequantized and requantized to it.

The tokenizer: ``tokenizer.ggml.model = "gpt2"`` (byte-level BPE) is rebuilt from the
vocabulary, merges and token types with the pre-tokenizer that ``tokenizer.ggml.pre`` names
(:data:`local_engine.gguf_tokenizer.PRE_TOKENIZERS`), and ``"llama"`` (SentencePiece BPE:
Llama 2, Mistral) from its pieces, scores and token types (:mod:`local_engine.gguf_tokenizer`);
the chat template comes from ``tokenizer.chat_template``. A ``tokenizer.json`` beside the
file takes precedence (the file's chat template still applies where no
``tokenizer_config.json`` or ``chat_template.jinja`` beside it gives one).
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from pathlib import Path
from typing import Any

import numpy as np
import torch

from local_engine.errors import EngineConfigError

from .config import ModelConfig
from .fp8 import Fp8Rows
from .model import DecoderModel
from .quant import Int4Rows, Int8Rows, Quantization, check_quantization
from .tokenizer import Tokenizer

__all__ = [
    "GGUF_ARCHITECTURES",
    "UnsupportedGGUFError",
    "gguf_quantization",
    "load_gguf_model",
    "load_gguf_tokenizer",
    "read_gguf_config",
]

GGUF_ARCHITECTURES = ("llama", "qwen2", "qwen3")
"""The ``general.architecture`` values the engine loads."""

_FLOAT_TYPES = ("F32", "F16", "BF16")
# The types whose numbers map directly onto the engine's quantized weights.
_NATIVE_TYPES: dict[str, Quantization] = {"Q8_0": "int8", "Q4_0": "int4"}
_INT8_ABOVE_BITS = 5.0  # a requantized type above this many bits a weight goes to int8

_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOP_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


_WHAT_TO_DO = (
    "use the model's Q4_K_M, Q4_0, Q8_0, F16 or BF16 file, or make one with llama.cpp's "
    "`llama-quantize --allow-requantize IN.gguf OUT.gguf Q8_0` (or Q4_0; from an F16/BF16 "
    "file when there is one), or load the Hugging Face checkpoint directory with "
    "quantization='int8' or 'int4'"
)


class UnsupportedGGUFError(EngineConfigError):
    """A GGUF file the engine cannot load: an unknown architecture, tensor type, rope
    layout or tokenizer; the message names it and what is supported."""


def _reader(path: str | Path) -> Any:
    try:
        from gguf import GGUFReader
    except ImportError as exc:
        raise EngineConfigError(
            "loading a .gguf file needs the 'gguf' package: pip install 'swiftclient-llm[gguf]'"
        ) from exc
    try:
        return GGUFReader(str(path))
    except OSError as exc:
        raise EngineConfigError(f"cannot read GGUF file {str(path)!r}: {exc}") from exc
    except Exception as exc:  # gguf's parser fails on a cut file with numpy's own errors
        raise EngineConfigError(
            f"cannot read GGUF file {str(path)!r}: it is not a GGUF file, or is truncated or "
            f"corrupt (an interrupted download or copy?); fetch or convert it again "
            f"({type(exc).__name__}: {exc})"
        ) from exc


def _fields(reader: Any) -> dict[str, Any]:
    return {name: field.contents() for name, field in reader.fields.items()}


def _arch(meta: dict[str, Any]) -> str:
    arch = meta.get("general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise UnsupportedGGUFError(
            f"unsupported GGUF architecture {arch!r}: the local engine loads "
            f"{', '.join(GGUF_ARCHITECTURES)}"
        )
    return str(arch)


def _check_not_split(meta: dict[str, Any], path: str | Path) -> None:
    count = meta.get("split.count")
    if isinstance(count, int) and count > 1:
        # llama.cpp names shards NAME-00001-of-00003.gguf; the merge reads the first one
        file = Path(path)
        named = _SHARD_NAME.fullmatch(file.name)
        if named:
            stem, suffix = named.group(1), named.group(2)
            first = file.with_name(f"{stem}-00001-of-{count:05d}{suffix}")
            merged = file.with_name(f"{stem}{suffix}")
            command = (
                f"llama-gguf-split --merge {shlex.quote(str(first))} {shlex.quote(str(merged))}"
            )
        else:  # renamed: the first shard's name is not known
            command = "llama-gguf-split --merge FIRST-SHARD.gguf MERGED.gguf"
        raise UnsupportedGGUFError(
            f"this GGUF file is shard {int(meta.get('split.no', 0)) + 1} of {count} of a split "
            f"model, which the local engine does not load; merge the shards into one file "
            f"with llama.cpp's `{command}` and load that"
        )


#: llama.cpp's name for a shard of a split model: NAME-00002-of-00003.gguf.
_SHARD_NAME = re.compile(r"(.+)-\d{5}-of-\d{5}(\.gguf)", re.IGNORECASE)


#: The metadata keys (after ``{arch}.``) that give the model's shape: no default fits them.
_REQUIRED_KEYS = (
    "embedding_length",
    "feed_forward_length",
    "block_count",
    "attention.head_count",
)


def _config_dict(meta: dict[str, Any], tensors: dict[str, Any], path: str | Path) -> dict[str, Any]:
    """An HF ``config.json`` equivalent of the GGUF metadata (of the file at ``path``)."""
    _check_not_split(meta, path)
    arch = _arch(meta)

    def key(name: str, default: Any = None) -> Any:
        return meta.get(f"{arch}.{name}", default)

    missing = [f"{arch}.{name}" for name in _REQUIRED_KEYS if key(name) is None]
    if missing:
        raise UnsupportedGGUFError(
            f"this GGUF file lacks {', '.join(missing)}, which the model's shape is read from "
            "(an incomplete conversion?)"
        )
    heads = key("attention.head_count")
    embed = tensors.get("token_embd.weight")
    vocab = key("vocab_size")
    if vocab is None and embed is not None:
        vocab = int(embed.shape[-1])  # GGUF shapes list the fastest-varying dimension first
    config: dict[str, Any] = {
        "model_type": arch,
        "hidden_size": key("embedding_length"),
        "intermediate_size": key("feed_forward_length"),
        "num_hidden_layers": key("block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": key("attention.head_count_kv", heads),
        "max_position_embeddings": key("context_length"),
        # stored as float32: 1e-6 reads back as 9.99999997e-07
        "rms_norm_eps": float(f"{float(key('attention.layer_norm_rms_epsilon', 1e-6)):.7g}"),
        "rope_theta": float(key("rope.freq_base", 10000.0)),
        "vocab_size": vocab,
        "tie_word_embeddings": "output.weight" not in tensors,
        "attention_bias": arch == "llama" and "blk.0.attn_output.bias" in tensors,
        "hidden_act": "silu",
    }
    # GGUF's head size is embedding_length / head_count unless key_length says otherwise
    # (transformers' qwen3 default of 128 does not apply).
    head_dim = key("attention.key_length")
    config["head_dim"] = head_dim if head_dim is not None else config["hidden_size"] // heads
    scaling = key("rope.scaling.type")
    if "rope_freqs.weight" in tensors:
        hd = int(head_dim or config["hidden_size"] // heads)
        freqs = np.asarray(tensors["rope_freqs.weight"].data, dtype=np.float64).reshape(-1)
        config["rope_scaling"] = _llama3_rope(freqs, hd, config["rope_theta"])
    elif scaling not in (None, "none"):
        if scaling != "linear":
            raise UnsupportedGGUFError(
                f"unsupported GGUF rope scaling {scaling!r}: expected none or linear"
            )
        config["rope_scaling"] = {"rope_type": "linear", "factor": key("rope.scaling.factor")}
    bos = meta.get("tokenizer.ggml.bos_token_id")
    if bos is not None:
        config["bos_token_id"] = int(bos)
    # llama.cpp stops at the end-of-turn token too (Llama 3's <|eot_id|>, Qwen's <|im_end|>)
    eos = [meta.get(f"tokenizer.ggml.{name}_token_id") for name in ("eos", "eot")]
    if any(e is not None for e in eos):
        config["eos_token_id"] = [int(e) for e in eos if e is not None]
    config["dtype"] = _float_dtype(tensors)
    return config


def _llama3_rope(freqs: np.ndarray, head_dim: int, theta: float) -> dict[str, Any]:
    """The llama3 rope parameters that give llama.cpp's ``rope_freqs`` divisors.

    The converter stores, per rotary frequency, the factor its wavelength is divided by
    (1 for short wavelengths, ``factor`` for long ones, a blend in the band between).
    Llama 3.x's own parameters (low 1, high 4, original context a power of two) are tried
    first; otherwise the blend, linear in 1/wavelength, gives the band's edges from two
    in-band frequencies (``low_freq_factor`` taken as 1: only the ratios to the original
    context matter). The parameters are checked by recomputing every divisor.

    Raises:
        UnsupportedGGUFError: divisors that no llama3 rope scaling produces.
    """
    inv = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * np.pi / inv
    if freqs.shape != inv.shape:
        raise UnsupportedGGUFError(
            f"rope_freqs has {freqs.size} values; expected {inv.size} for head_dim {head_dim}"
        )
    factor = float(freqs.max())
    params: dict[str, Any] | None = None
    # Llama 3.x's own values first (low 1, high 4, a power-of-two original context) ...
    for exponent in range(4, 21):
        candidate = {
            "rope_type": "llama3",
            "factor": float(f"{factor:.6g}"),
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 1 << exponent,
        }
        if np.allclose(_llama3_divisors(candidate, wavelen), freqs, rtol=1e-4):
            return candidate
    # ... else the band's edges from two in-band frequencies.
    band = (np.abs(freqs - 1) > 1e-6) & (np.abs(freqs - factor) > 1e-6 * factor)
    if factor > 1 and band.sum() >= 2:
        smooth = (1 / freqs[band] - 1 / factor) / (1 - 1 / factor)
        slope, intercept = np.polyfit(1 / wavelen[band], smooth, 1)
        high = 1 - 1 / intercept  # with low_freq_factor 1: smooth = (L / w - 1) / (high - 1)
        params = {
            "rope_type": "llama3",
            "factor": float(f"{factor:.6g}"),
            "low_freq_factor": 1.0,
            "high_freq_factor": float(f"{high:.6g}"),
            "original_max_position_embeddings": int(round(slope * (high - 1))),
        }
    if params is None or not np.allclose(_llama3_divisors(params, wavelen), freqs, rtol=1e-4):
        raise UnsupportedGGUFError(
            "this GGUF file's rope_freqs tensor is not a llama3 rope scaling the loader can "
            "recover; load the HF checkpoint"
        )
    return params


def _llama3_divisors(params: dict[str, Any], wavelen: np.ndarray) -> np.ndarray:
    """What llama.cpp's converter stores in rope_freqs for llama3 ``params``."""
    factor, low, high = params["factor"], params["low_freq_factor"], params["high_freq_factor"]
    old = params["original_max_position_embeddings"]
    smooth = (old / wavelen - low) / (high - low)
    blended = 1 / ((1 - smooth) / factor + smooth)
    return np.where(
        wavelen < old / high, 1.0, np.where(wavelen > old / low, factor, blended)
    ).astype(np.float64)


def _type_name(tensor: Any) -> str:
    return str(tensor.tensor_type.name)


def _is_projection(name: str) -> bool:
    return name.startswith("blk.") and name.endswith(".weight") and "norm" not in name


def _float_dtype(tensors: dict[str, Any]) -> str:
    """The dtype a float file runs in: its projections' (bfloat16 for a quantized file)."""
    types = {_type_name(t) for name, t in tensors.items() if _is_projection(name)}
    if types == {"F32"}:
        return "float32"
    if types == {"F16"}:
        return "float16"
    return "bfloat16"


def gguf_quantization(path: str | Path) -> Quantization | None:
    """The quantization a GGUF file's projections map onto: ``"int4"`` for ``Q4_0`` and the
    types of 5 bits a weight or fewer (``Q4_K``, ``Q4_1``, ``Q3_K``, ...), ``"int8"`` for
    ``Q8_0`` and the other types above that (``Q5_0``, ``Q5_K``, ``Q6_K``, ...); the one most
    projections map onto when they differ (int4 on a tie); None for a float file.

    Raises:
        UnsupportedGGUFError: a tensor in a type the ``gguf`` package cannot dequantize.
    """
    reader = _reader(path)
    return _quantization_of({t.name: t for t in reader.tensors})


def _quantization_of(tensors: dict[str, Any]) -> Quantization | None:
    counts = {"int4": 0, "int8": 0}
    for name, tensor in tensors.items():
        _check_type(name, tensor)
        if _is_projection(name) and _type_name(tensor) not in _FLOAT_TYPES:
            counts[_maps_onto(tensor)] += 1
    if not counts["int4"] and not counts["int8"]:
        return None
    return "int4" if counts["int4"] >= counts["int8"] else "int8"


def _maps_onto(tensor: Any) -> Quantization:
    """The engine quantization a quantized tensor's type maps onto."""
    kind = _type_name(tensor)
    if kind in _NATIVE_TYPES:
        return _NATIVE_TYPES[kind]
    from gguf.constants import GGML_QUANT_SIZES

    block, size = GGML_QUANT_SIZES[tensor.tensor_type]
    return "int8" if 8 * size / block > _INT8_ABOVE_BITS else "int4"


def _check_type(name: str, tensor: Any) -> None:
    """Refuse a tensor whose type the ``gguf`` package cannot dequantize (before any weight
    is read)."""
    if not _dequantizable(tensor.tensor_type):
        raise UnsupportedGGUFError(
            f"GGUF tensor {name!r} has type {_type_name(tensor)}, which the local engine "
            f"cannot load (the gguf package does not dequantize it); {_WHAT_TO_DO}"
        )


_DEQUANTIZABLE: dict[Any, bool] = {}


def _dequantizable(kind: Any) -> bool:
    """Whether ``gguf.quants.dequantize`` takes ``kind`` (tried once, on a zero block)."""
    known = _DEQUANTIZABLE.get(kind)
    if known is None:
        from gguf.constants import GGML_QUANT_SIZES
        from gguf.quants import dequantize

        sizes = GGML_QUANT_SIZES.get(kind)
        known = sizes is not None
        if sizes is not None:
            try:
                dequantize(np.zeros((1, sizes[1]), dtype=np.uint8), kind)
            except NotImplementedError:
                known = False
        _DEQUANTIZABLE[kind] = known
    return known


def read_gguf_config(path: str | Path) -> ModelConfig:
    """The engine's model config from a GGUF file's metadata.

    Raises:
        EngineConfigError: the file cannot be read or its metadata is incomplete;
            :class:`UnsupportedGGUFError` for an architecture or rope layout it cannot run.
    """
    reader = _reader(path)
    meta = _fields(reader)
    return ModelConfig.from_dict(_config_dict(meta, {t.name: t for t in reader.tensors}, path))


def _hf_name(name: str) -> str | None:
    if name in _TOP_NAMES:
        return _TOP_NAMES[name]
    parts = name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{parts[3]}"
    return None


def _unpermute(rows: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's ``LlamaModel.permute`` of Q/K rows (``heads``: that projection's)."""
    n = rows.shape[0]
    head_dim = n // heads
    shaped = rows.reshape(heads, head_dim // 2, 2, *rows.shape[1:])
    return np.ascontiguousarray(shaped.swapaxes(1, 2).reshape(rows.shape))


def _dequantize(data: np.ndarray, kind: Any, shape: tuple[int, ...]) -> torch.Tensor:
    from gguf.quants import dequantize

    values = np.asarray(dequantize(np.asarray(data), kind), dtype=np.float32).reshape(shape)
    if not values.flags.writeable:  # an F32 tensor's values: a view of the memory-mapped file
        values = values.copy()
    return torch.from_numpy(np.ascontiguousarray(values))


def _q4_0_codes(data: np.ndarray, rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_0 blocks ``[rows, cols / 32 * 18]`` as stored codes ``[rows, cols]`` (0..15) and
    float32 scales ``[rows, cols / 32]``."""
    blocks = np.asarray(data, dtype=np.uint8).reshape(rows, cols // 32, 18)
    scales = blocks[..., :2].copy().view(np.float16).reshape(rows, cols // 32)
    qs = blocks[..., 2:]
    codes = np.concatenate((qs & 15, qs >> 4), axis=-1).reshape(rows, cols)
    return torch.from_numpy(codes), torch.from_numpy(scales.astype(np.float32))


def load_gguf_model(
    path: str | Path,
    *,
    dtype: str | torch.dtype | None = None,
    device: str | torch.device = "cpu",
    quantization: Quantization | None = None,
) -> DecoderModel:
    """Read a GGUF file into a DecoderModel (see the module docstring for what maps how).

    ``quantization`` None takes the file's own (:func:`gguf_quantization`); a method given
    explicitly requantizes to it.

    Raises:
        EngineConfigError: the file is unreadable, incomplete or does not match its own
            metadata; :class:`UnsupportedGGUFError` for what the engine cannot run.
    """
    from .loader import _targets, resolve_dtype

    reader = _reader(path)
    meta = _fields(reader)
    tensors = {t.name: t for t in reader.tensors}
    config = ModelConfig.from_dict(_config_dict(meta, tensors, path))
    native = _quantization_of(tensors)
    quantization = check_quantization(quantization) if quantization is not None else native
    torch_dtype = resolve_dtype(dtype, config, quantization)
    config = dataclasses.replace(config, dtype=str(torch_dtype).removeprefix("torch."))
    model = DecoderModel(config, dtype=torch_dtype, device=device, quantization=quantization)
    targets = _targets(model)
    seen: set[str] = set()
    unexpected: list[str] = []
    with torch.no_grad():
        for name, tensor in tensors.items():
            if name == "rope_freqs.weight":  # read into the config's rope scaling
                continue
            hf = _hf_name(name)
            if hf is None or hf not in targets:
                if not (hf == "lm_head.weight" and config.tie_word_embeddings):
                    unexpected.append(name)
                continue
            target, shape = targets[hf]
            _check_shape(name, tensor, shape)
            seen.add(hf)
            _load_tensor(name, tensor, target, shape, config)
    if unexpected:
        raise EngineConfigError(
            f"GGUF file has {len(unexpected)} tensors the {config.family} loader does not use, "
            f"e.g. {sorted(unexpected)[:5]}"
        )
    missing = sorted(set(targets) - seen)
    if missing:
        raise EngineConfigError(
            f"GGUF file lacks {len(missing)} tensors the {config.family} config needs, "
            f"e.g. {missing[:5]}"
        )
    model.finish_loading()
    return model


def _check_shape(name: str, tensor: Any, shape: tuple[int, ...]) -> None:
    got = tuple(int(d) for d in reversed(list(tensor.shape)))
    if got != shape:
        raise EngineConfigError(
            f"GGUF tensor {name!r} has shape {got}, expected {shape} from its metadata"
        )


def _load_tensor(
    name: str,
    tensor: Any,
    target: torch.Tensor | Int8Rows | Int4Rows | Fp8Rows,
    shape: tuple[int, ...],
    config: ModelConfig,
) -> None:
    kind = _type_name(tensor)  # every type was checked by _quantization_of already
    data = np.asarray(tensor.data)
    rows = shape[0]
    if len(shape) == 2:
        data = data.reshape(rows, -1)
    if config.family == "llama" and ".attn_q." in name:
        data = _unpermute(data, config.num_heads)
    elif config.family == "llama" and ".attn_k." in name:
        data = _unpermute(data, config.num_kv_heads)
    if kind == "Q4_0" and isinstance(target, Int4Rows):
        target.write(*_q4_0_codes(data, rows, shape[1]))
        return
    values = _dequantize(data, tensor.tensor_type, shape)
    target.copy_(values)


def load_gguf_tokenizer(path: str | Path) -> Tokenizer | None:
    """The tokenizer for a GGUF file: ``tokenizer.json`` beside it when present, else one
    rebuilt from the file's byte-level BPE or SentencePiece metadata; None when the file
    carries none.

    Raises:
        UnsupportedGGUFError: a tokenizer model or pre-tokenizer it cannot rebuild.
    """
    file = Path(path)
    if (file.parent / "tokenizer.json").is_file():
        tokenizer = Tokenizer.from_dir(file.parent)
        if tokenizer.chat_template is None:  # no tokenizer_config.json beside gave one
            field = _reader(file).fields.get("tokenizer.chat_template")
            template = None if field is None else field.contents()
            if isinstance(template, str):
                tokenizer.chat_template = template
        return tokenizer
    meta = _fields(_reader(file))
    if "tokenizer.ggml.model" not in meta:
        return None
    from .gguf_tokenizer import tokenizer_from_gguf

    return tokenizer_from_gguf(meta)
