"""The one checkpoint that bench/engine_peers.py serves on every engine, and its GGUF files.

A random-weight Qwen2 model at Qwen2.5-0.5B's shape (hidden 896, 24 layers, 14 heads of 64,
2 KV heads, MLP 4,864, biased q/k/v projections, a tied LM head), with a byte-level BPE
tokenizer of about 32k tokens trained here on the text of Python's standard library (the
tokenizers library, Qwen2's pre-tokenizer split, so llama.cpp's ``qwen2`` pre-tokenizer
reproduces it). Weights are normal(0, 0.02) from fixed seeds, norm weights 1, written as
float32 safetensors: each engine casts them to the precision it serves.

The GGUF files come from the converter that ships in llama.cpp's source
(``convert_hf_to_gguf.py``: f32, bf16, q8_0) and its ``llama-quantize`` (q4_0, from f32).
The converter names a BPE tokenizer's pre-tokenizer by hashing how it splits a test string,
which a self-trained tokenizer never matches; :func:`convert_to_gguf` runs it with that name
given (``qwen2``), through a small launcher instead of an edited copy of the converter.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "GGUF_TYPES",
    "QWEN2_PRE_TOKENIZER",
    "QWEN2_SPLIT",
    "Shape",
    "build_checkpoint",
    "convert_to_gguf",
    "corpus_lines",
]

#: Qwen2's pre-tokenization split (the regex of its tokenizer.json), which llama.cpp's
#: ``qwen2`` pre-tokenizer implements.
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_PRE_TOKENIZER = "qwen2"
#: GGUF type -> how it is made: the converter's own ``--outtype``, or llama-quantize from f32.
GGUF_TYPES = {"f32": "convert", "bf16": "convert", "q8_0": "convert", "q4_0": "quantize"}
_SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
_FORMAT = 1  # bump when the files written here change


@dataclass(frozen=True)
class Shape:
    """The model's shape; the default is Qwen2.5-0.5B's."""

    hidden: int = 896
    layers: int = 24
    heads: int = 14
    kv_heads: int = 2
    intermediate: int = 4864
    vocab: int = 32_000
    max_positions: int = 4096
    seed: int = 29

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.hidden // self.heads


def corpus_lines(limit_bytes: int) -> Iterator[str]:
    """Non-empty lines of the standard library's ``.py`` files, in a fixed order, up to
    ``limit_bytes`` of text: a deterministic corpus that every Python installation has."""
    root = Path(sysconfig.get_paths()["stdlib"])
    total = 0
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts or "test" in path.parts:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        for line in text.splitlines():
            if line.strip():
                yield line
                total += len(line) + 1
                if total >= limit_bytes:
                    return


def _train_tokenizer(vocab: int, corpus_bytes: int) -> Any:
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
    )
    from tokenizers.trainers import BpeTrainer

    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = BpeTrainer(
        vocab_size=vocab - len(_SPECIAL),
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus_lines(corpus_bytes), trainer)
    tokenizer.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in _SPECIAL])
    return tokenizer


def _config(shape: Shape, vocab: int, eos: int) -> dict[str, Any]:
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "vocab_size": vocab,
        "hidden_size": shape.hidden,
        "intermediate_size": shape.intermediate,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "hidden_act": "silu",
        "max_position_embeddings": shape.max_positions,
        "max_window_layers": shape.layers,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1_000_000.0,
        "sliding_window": None,
        "use_sliding_window": False,
        "tie_word_embeddings": True,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "bos_token_id": eos,
        "eos_token_id": eos,
        "torch_dtype": "float32",
        "use_cache": True,
    }


def _weights(shape: Shape, vocab: int) -> Iterator[tuple[str, tuple[int, ...]]]:
    h, kv = shape.hidden, shape.kv_heads * shape.head_dim
    yield "model.embed_tokens.weight", (vocab, h)
    for i in range(shape.layers):
        p = f"model.layers.{i}."
        yield p + "input_layernorm.weight", (h,)
        for name, rows in (("q", h), ("k", kv), ("v", kv)):
            yield p + f"self_attn.{name}_proj.weight", (rows, h)
            yield p + f"self_attn.{name}_proj.bias", (rows,)
        yield p + "self_attn.o_proj.weight", (h, h)
        yield p + "post_attention_layernorm.weight", (h,)
        yield p + "mlp.gate_proj.weight", (shape.intermediate, h)
        yield p + "mlp.up_proj.weight", (shape.intermediate, h)
        yield p + "mlp.down_proj.weight", (h, shape.intermediate)
    yield "model.norm.weight", (h,)


def _marker(shape: Shape, corpus_bytes: int) -> dict[str, Any]:
    return {"format": _FORMAT, "shape": shape.__dict__, "corpus_bytes": corpus_bytes}


def build_checkpoint(directory: Path, shape: Shape, *, corpus_bytes: int = 12_000_000) -> Path:
    """Write the checkpoint into ``directory`` unless an identical one is already there."""
    marker = directory / "engine_peers.json"
    want = _marker(shape, corpus_bytes)
    if marker.is_file() and json.loads(marker.read_text()) == want:
        return directory
    import torch
    from safetensors.torch import save_file

    from local_engine.default_model import tokenizer_config

    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = _train_tokenizer(shape.vocab, corpus_bytes)
    ids = {token: tokenizer.token_to_id(token) for token in _SPECIAL}
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    tok_config = tokenizer_config(ids)
    tok_config["eos_token"] = "<|endoftext|>"
    (directory / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2))
    eos = ids["<|endoftext|>"]
    (directory / "config.json").write_text(json.dumps(_config(shape, vocab, eos), indent=2))
    generation = {"bos_token_id": eos, "eos_token_id": eos, "do_sample": False}
    (directory / "generation_config.json").write_text(json.dumps(generation, indent=2))
    tensors: dict[str, Any] = {}
    for name, size in _weights(shape, vocab):
        if name.endswith("norm.weight"):
            tensors[name] = torch.ones(size)
            continue
        digest = hashlib.sha256(f"{shape.seed}:{name}".encode()).digest()
        generator = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little"))
        tensors[name] = torch.randn(size, generator=generator) * 0.02
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    marker.write_text(json.dumps(want))
    return directory


#: Runs llama.cpp's converter with the pre-tokenizer's name given: argv[1] is the llama.cpp
#: source directory, argv[2] the name, the rest the converter's own arguments.
_CONVERT_LAUNCHER = """
import runpy, sys
source, name = sys.argv[1], sys.argv[2]
sys.path.insert(0, source)
sys.path.insert(0, source + "/gguf-py")
import conversion.base
conversion.base.TextModel.get_vocab_base_pre = lambda self, tokenizer: name
sys.argv = [source + "/convert_hf_to_gguf.py", *sys.argv[3:]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def convert_to_gguf(
    checkpoint: Path, out_dir: Path, kind: str, *, python: str, source: Path, quantize: Path
) -> Path:
    """``out_dir/model-KIND.gguf``, made from ``checkpoint`` unless it is already there."""
    if kind not in GGUF_TYPES:
        raise ValueError(f"GGUF type {kind!r} is not one of {sorted(GGUF_TYPES)}")
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"model-{kind}.gguf"
    if (
        target.is_file()
        and target.stat().st_mtime >= (checkpoint / "model.safetensors").stat().st_mtime
    ):
        return target
    partial = target.with_suffix(".partial")
    if GGUF_TYPES[kind] == "convert":
        argv = [python, "-c", _CONVERT_LAUNCHER, str(source), QWEN2_PRE_TOKENIZER]
        argv += [str(checkpoint), "--outtype", kind, "--outfile", str(partial)]
    else:
        f32 = convert_to_gguf(
            checkpoint, out_dir, "f32", python=python, source=source, quantize=quantize
        )
        argv = [str(quantize), str(f32), str(partial), kind.upper(), "2"]
    subprocess.run(argv, check=True, stdout=sys.stderr)
    partial.rename(target)
    return target
