"""Tiny random HF checkpoints for engine tests, built with transformers and saved to disk.

Weights are drawn wider than transformers' default init and the norm weights and biases are
randomized too, so logits are peaked (greedy decoding is not decided by rounding noise) and a
swapped or dropped norm/bias weight changes the output.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

__all__ = ["FAMILIES", "TINY_WINDOW", "make_tiny_model", "write_char_tokenizer"]

TINY_WINDOW = 5  # sliding window of the qwen2_sw and mistral tiny models

_BASE: dict[str, Any] = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "initializer_range": 0.08,
    "bos_token_id": 1,
    "eos_token_id": 2,
}

_FAMILIES: dict[str, tuple[Any, Any, dict[str, Any]]] = {
    "llama": (LlamaConfig, LlamaForCausalLM, {}),
    "llama3": (
        LlamaConfig,
        LlamaForCausalLM,
        {
            # With head_dim 16 the wavelengths span ~6..6000 positions, so a 32-token
            # original context puts frequencies in all three llama3 bands.
            "rope_parameters": {
                "rope_type": "llama3",
                "rope_theta": 10000.0,
                "factor": 4.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            }
        },
    ),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, {}),
    "qwen2_sw": (
        Qwen2Config,
        Qwen2ForCausalLM,
        {
            "num_hidden_layers": 3,
            "use_sliding_window": True,
            "sliding_window": TINY_WINDOW,
            "max_window_layers": 1,
        },
    ),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, {"head_dim": 32}),
    "mistral": (MistralConfig, MistralForCausalLM, {"sliding_window": TINY_WINDOW}),
}

FAMILIES = tuple(_FAMILIES)


def make_tiny_model(
    dir: Path,
    family: str,
    *,
    seed: int = 0,
    max_shard_size: str | int | None = None,
    **config_overrides: Any,
) -> Path:
    """Build a tiny float32 model of ``family`` with transformers and save it under ``dir``.

    ``family`` is one of :data:`FAMILIES`; ``config_overrides`` replace config fields (e.g.
    ``tie_word_embeddings=True``); ``max_shard_size`` (e.g. ``"40KB"``) forces a sharded
    checkpoint. Returns ``dir``.
    """
    if family not in _FAMILIES:
        raise ValueError(f"unknown tiny family {family!r}; expected one of {FAMILIES}")
    config_cls, model_cls, extra = _FAMILIES[family]
    config = config_cls(**{**_BASE, **extra, **config_overrides})
    torch.manual_seed(seed)
    model = model_cls(config).to(torch.float32).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.normal_(1.0, 0.2)
            elif name.endswith(".bias"):
                param.normal_(0.0, 0.2)
    dir.mkdir(parents=True, exist_ok=True)
    if max_shard_size is None:
        model.save_pretrained(dir)
    else:
        model.save_pretrained(dir, max_shard_size=max_shard_size)
    return dir


def write_char_tokenizer(root: Path, *, vocab_size: int = 256, eos: int = 2) -> None:
    """Save a tokenizer for a tiny model under ``root``: token id i reads as one character
    (chr(0x100 + i)); id ``eos`` is the special "</s>"."""
    from tokenizers import AddedToken, decoders, models
    from tokenizers import Tokenizer as HFTokenizer

    vocab = {chr(0x100 + i): i for i in range(vocab_size) if i != eos}
    vocab["</s>"] = eos
    backend = HFTokenizer(models.WordLevel(vocab, unk_token=chr(0x100)))
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens([AddedToken("</s>", special=True)])
    backend.save(str(root / "tokenizer.json"))
    (root / "tokenizer_config.json").write_text('{"eos_token": "</s>"}')
