"""Write a tiny HF checkpoint as a GGUF file the way llama.cpp's converter does, with the
``gguf`` package's own writer and quantizers (the converter itself is not a test dependency).

Tensor names and metadata keys are the converter's; a llama model's Q and K rows are
permuted for llama.cpp's rope layout (``LlamaModel.permute``), qwen2/qwen3's are not. Float
1-D tensors (norms, biases) are written as F32, as the converter does.
"""

from __future__ import annotations

import json
import math
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize, quantize
from safetensors.torch import load_file, save_file

__all__ = [
    "add_tokenizer",
    "gguf_name",
    "llama3_rope_factors",
    "permute",
    "add_sentencepiece_tokenizer",
    "random_blocks",
    "write_gguf",
]

_LAYER = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
_TOP = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def gguf_name(hf: str) -> str:
    """The converter's GGUF name for an HF tensor name."""
    if hf in _TOP:
        return _TOP[hf]
    parts = hf.split(".")
    return f"blk.{parts[2]}.{_LAYER['.'.join(parts[3:-1])]}.{parts[-1]}"


def permute(weights: np.ndarray, n_head: int, n_head_kv: int | None) -> np.ndarray:
    """llama.cpp's ``LlamaModel.permute`` (convert_hf_to_gguf), verbatim in numpy."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (
        weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


# Byte offsets of a block's float16 scale and (when it has one) its float16 minimum, for the
# types the gguf package dequantizes but does not quantize (ggml's block layouts).
_SCALE_FIELDS: dict[str, tuple[int, int | None]] = {
    "Q2_K": (80, 82),
    "Q3_K": (108, None),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208, None),
    "IQ4_NL": (0, None),
    "IQ4_XS": (0, None),
}


# Types neither quantized nor dequantized by the gguf package: written as random bytes.
_UNREADABLE = ("Q8_K", "Q8_1")


def random_blocks(kind: str, shape: tuple[int, int], std: float, seed: int) -> np.ndarray:
    """Valid ``kind`` blocks for a ``shape`` tensor, for the types the gguf package cannot
    quantize (the K-quants): random codes and sub-block scales, the block's float16 scale
    (and minimum) set so that the values are about zero-mean with standard deviation
    ``std``. Returns the raw bytes ``[rows, bytes per row]``."""
    gtype = GGMLQuantizationType[kind]
    block, size = GGML_QUANT_SIZES[gtype]
    rows, cols = shape
    raw = np.random.default_rng(seed).integers(0, 256, (rows * cols // block, size), np.uint8)
    d_at, m_at = _SCALE_FIELDS[kind]

    def with_scales(d: float, m: float) -> np.ndarray:
        out = raw.copy()
        out[:, d_at : d_at + 2] = np.frombuffer(np.float16(d).tobytes(), np.uint8)
        if m_at is not None:
            out[:, m_at : m_at + 2] = np.frombuffer(np.float16(m).tobytes(), np.uint8)
        return out

    def values(blocks: np.ndarray) -> np.ndarray:
        return np.asarray(dequantize(blocks, gtype), dtype=np.float64)

    minimum = 0.0
    if m_at is not None:  # the minimum's share that centres the values on zero
        lows = -values(with_scales(0.0, 1.0)).mean()
        minimum = float(values(with_scales(1.0, 0.0)).mean() / lows)
    scale = std / float(values(with_scales(1.0, minimum)).std())
    return with_scales(scale, minimum * scale).reshape(rows, -1)


def write_gguf(
    hf_dir: Path,
    out: Path,
    qtype: str,
    *,
    head_qtype: str | None = None,
    qtypes: dict[str, str] | None = None,
    arch: str | None = None,
    extra: dict[str, Any] | None = None,
    dequant_dir: Path | None = None,
    tokenizer: tuple[Any, str, str] | None = None,
    sentencepiece: tuple[bytes, str] | None = None,
    split_max_tensors: int = 0,
    drop_keys: tuple[str, ...] = (),
) -> Path:
    """Write the float32 HF checkpoint in ``hf_dir`` as the GGUF file ``out``.

    ``qtype`` (``F32``, ``F16``, ``Q8_0``, ``Q4_0``, ...) is the type of every 2-D tensor
    (for a type the gguf package cannot quantize, a K-quant, :func:`random_blocks` of each
    tensor's spread: the file's weights are then not the checkpoint's, and ``dequant_dir``
    holds them);
    ``head_qtype`` overrides it for the LM head (``output.weight``, when untied), ``qtypes``
    for the 2-D tensors of a kind (``{"ffn_down": "Q6_K"}``, as llama-quantize's mixes do). ``arch``
    overrides ``general.architecture``; ``extra`` adds tensors (name -> float32 array).
    With ``dequant_dir``, the weights as the file holds them (quantized and dequantized)
    are also saved there as an HF checkpoint: the reference the file should load as.
    ``tokenizer`` (a ``tokenizers.Tokenizer``, its pre-tokenizer name, a chat template) adds
    the tokenizer metadata (:func:`add_tokenizer`); ``sentencepiece`` (a serialized
    SentencePiece model, a chat template) a SentencePiece one
    (:func:`add_sentencepiece_tokenizer`). ``split_max_tensors`` splits the file
    into shards of that many tensors, as llama.cpp's ``--split-max-tensors`` does
    (``out``'s stem gets ``-00001-of-0000N``). ``drop_keys`` leaves those metadata keys out
    (``"qwen2.block_count"``), as an incomplete conversion would.
    """
    config = json.loads((hf_dir / "config.json").read_text())
    family = config["model_type"]
    weights = {k: v.float().numpy() for k, v in load_file(hf_dir / "model.safetensors").items()}
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    out.parent.mkdir(parents=True, exist_ok=True)
    writer = GGUFWriter(out, arch or family, split_max_tensors=split_max_tensors)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(float(config.get("rope_theta", 10000.0)))
    writer.add_layer_norm_rms_eps(float(config["rms_norm_eps"]))
    writer.add_vocab_size(config["vocab_size"])
    if "head_dim" in config:
        writer.add_key_length(config["head_dim"])
        writer.add_value_length(config["head_dim"])
    if sentencepiece is not None:
        add_sentencepiece_tokenizer(writer, *sentencepiece)
    elif tokenizer is None:
        writer.add_bos_token_id(config["bos_token_id"])
        writer.add_eos_token_id(config["eos_token_id"])
    else:
        add_tokenizer(writer, *tokenizer)
    stored: dict[str, torch.Tensor] = {}
    for hf, value in weights.items():
        if hf == "lm_head.weight" and config.get("tie_word_embeddings"):
            continue
        name = gguf_name(hf)
        data = value
        if family == "llama" and ".attn_q." in name:
            data = permute(data, heads, heads)
        elif family == "llama" and ".attn_k." in name:
            data = permute(data, heads, kv_heads)
        kind = "F32" if data.ndim == 1 else qtype
        if name == "output.weight" and head_qtype is not None:
            kind = head_qtype
        for part, override in (qtypes or {}).items():
            if data.ndim == 2 and f".{part}." in name:
                kind = override
        gtype = GGMLQuantizationType[kind]
        seed = zlib.crc32(name.encode())
        if kind in _SCALE_FIELDS:  # no quantizer: random blocks of the tensor's spread
            packed = random_blocks(kind, data.shape, float(data.std()), seed)
        elif kind in _UNREADABLE:  # bytes only, for files the loader must refuse
            block, size = GGML_QUANT_SIZES[gtype]
            rng = np.random.default_rng(seed)
            packed = rng.integers(0, 256, (data.shape[0], data.shape[1] // block * size), np.uint8)
        else:
            packed = quantize(np.ascontiguousarray(data, dtype=np.float32), gtype)
        writer.add_tensor(name, packed, raw_dtype=gtype)
        if kind in _UNREADABLE:  # nothing to compare against: the loader refuses the file
            stored[hf] = torch.zeros(value.shape)
            continue
        back = np.asarray(dequantize(packed, gtype), dtype=np.float32).reshape(value.shape)
        if family == "llama" and ".attn_q." in name:
            back = _unpermute(back, heads)
        elif family == "llama" and ".attn_k." in name:
            back = _unpermute(back, kv_heads)
        stored[hf] = torch.from_numpy(np.ascontiguousarray(back))
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if rope.get("rope_type") == "llama3":
        head_dim = config.get("head_dim") or config["hidden_size"] // heads
        writer.add_tensor("rope_freqs.weight", llama3_rope_factors(rope, head_dim))
    for name, value in (extra or {}).items():
        writer.add_tensor(name, np.ascontiguousarray(value, dtype=np.float32))
    for key in drop_keys:
        assert writer.kv_data[0].pop(key, None) is not None, key
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    if dequant_dir is not None:
        dequant_dir.mkdir(parents=True, exist_ok=True)
        for file in ("config.json", "generation_config.json"):
            if (hf_dir / file).is_file():
                (dequant_dir / file).write_text((hf_dir / file).read_text())
        save_file(stored, dequant_dir / "model.safetensors")
    return out


def llama3_rope_factors(rope: dict[str, Any], dim: int) -> np.ndarray:
    """llama.cpp's converter's ``rope_freqs`` for llama3 rope scaling
    (``LlamaModel.generate_extra_tensors``), in numpy."""
    base = rope.get("rope_theta", 10000.0)
    freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    factor = rope.get("factor", 8.0)
    low_freq_factor = rope.get("low_freq_factor", 1.0)
    high_freq_factor = rope.get("high_freq_factor", 4.0)
    old_context_len = rope.get("original_max_position_embeddings", 8192)
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_freq_wavelen:
            factors.append(1)
        elif wavelen > low_freq_wavelen:
            factors.append(factor)
        else:
            smooth = (old_context_len / wavelen - low_freq_factor) / (
                high_freq_factor - low_freq_factor
            )
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(factors, dtype=np.float32)


def add_tokenizer(writer: GGUFWriter, backend: Any, pre: str, template: str) -> None:
    """The tokenizer metadata llama.cpp's converter writes for a byte-level BPE
    ``tokenizers.Tokenizer``: tokens by id, token types (control for special added tokens,
    user-defined for the other added ones), merges as "a b", EOS ``<|im_end|>``."""
    data = json.loads(backend.to_str())
    size = backend.get_vocab_size(with_added_tokens=True)
    by_id = {i: t for t, i in backend.get_vocab(with_added_tokens=True).items()}
    added = {t["content"]: t["special"] for t in data["added_tokens"]}
    tokens = [by_id[i] for i in range(size)]
    types = [(3 if added[t] else 4) if t in added else 1 for t in tokens]
    merges = [" ".join(m) if isinstance(m, list) else m for m in data["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_eos_token_id(backend.token_to_id("<|im_end|>"))
    writer.add_chat_template(template)


def add_sentencepiece_tokenizer(writer: GGUFWriter, model: bytes, template: str) -> None:
    """The tokenizer metadata llama.cpp's converter writes for a SentencePiece model (a
    serialized ``ModelProto``): pieces, scores and types by id (unknown, control, byte,
    user-defined, normal), BOS/EOS/UNK ids, BOS added, the dummy-prefix setting."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_proto=model)
    tokens, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        tokens.append(sp.id_to_piece(i))
        scores.append(sp.get_score(i))
        if sp.is_unknown(i):
            types.append(2)
        elif sp.is_control(i):
            types.append(3)
        elif sp.is_byte(i):
            types.append(6)
        elif sp.is_unused(i):
            types.append(5)
        else:
            types.append(1)
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(sp.bos_id())
    writer.add_eos_token_id(sp.eos_id())
    writer.add_unk_token_id(sp.unk_id())
    writer.add_add_bos_token(True)
    writer.add_add_space_prefix(True)
    writer.add_chat_template(template)


def _unpermute(rows: np.ndarray, heads: int) -> np.ndarray:
    shaped = rows.reshape(heads, rows.shape[0] // heads // 2, 2, *rows.shape[1:])
    return shaped.swapaxes(1, 2).reshape(rows.shape)
