"""A GGUF file's tokenizer rebuilt as a ``tokenizers.Tokenizer``: byte-level BPE
(``tokenizer.ggml.model = "gpt2"``) from its vocabulary, merges and token types, with the
pre-tokenizer that ``tokenizer.ggml.pre`` names.

Token types follow llama.cpp: CONTROL (3) tokens become special added tokens, USER_DEFINED
(4) ones plain added tokens; ``tokenizer.ggml.{bos,eos,unknown,padding}_token_id`` name the
special tokens, ``tokenizer.ggml.eot_token_id`` (end of turn) also ends generation,
``tokenizer.ggml.add_bos_token`` adds BOS when special tokens are added, and
``tokenizer.chat_template`` is the chat template.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers, processors
from tokenizers import Tokenizer as _HFTokenizer
from tokenizers.models import BPE

from .errors import EngineConfigError
from .gguf_loader import UnsupportedGGUFError
from .tokenizer import Tokenizer

__all__ = ["PRE_TOKENIZERS", "tokenizer_from_gguf"]

_QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

PRE_TOKENIZERS: dict[str, str] = {
    "qwen2": _QWEN2,
    "llama-bpe": _LLAMA3,
    "llama3": _LLAMA3,
}
"""``tokenizer.ggml.pre`` names this module rebuilds, and the split regex of each (the one
llama.cpp's ``llama-vocab.cpp`` and the models' own tokenizer.json use)."""

_NFC = ("qwen2",)  # Qwen2's tokenizer.json normalizes to NFC first
_IGNORE_MERGES = ("llama-bpe", "llama3")  # Llama 3's BPE takes whole-vocabulary words first
_CONTROL, _USER_DEFINED = 3, 4
_SPECIAL_IDS = {
    "bos_token": "tokenizer.ggml.bos_token_id",
    "eos_token": "tokenizer.ggml.eos_token_id",
    "unk_token": "tokenizer.ggml.unknown_token_id",
    "pad_token": "tokenizer.ggml.padding_token_id",
}


def tokenizer_from_gguf(meta: Mapping[str, Any]) -> Tokenizer:
    """The tokenizer described by a GGUF file's ``tokenizer.*`` metadata.

    Raises:
        UnsupportedGGUFError: a tokenizer model other than ``gpt2`` (byte-level BPE), or a
            pre-tokenizer not in :data:`PRE_TOKENIZERS`.
    """
    model = meta.get("tokenizer.ggml.model")
    if model != "gpt2":
        raise UnsupportedGGUFError(
            f"unsupported GGUF tokenizer model {model!r}: the engine rebuilds 'gpt2' "
            "(byte-level BPE); put the model's tokenizer.json beside the .gguf file instead"
        )
    pre = str(meta.get("tokenizer.ggml.pre", "default"))
    if pre not in PRE_TOKENIZERS:
        raise UnsupportedGGUFError(
            f"unsupported GGUF pre-tokenizer {pre!r}: the engine rebuilds "
            f"{', '.join(sorted(PRE_TOKENIZERS))}; put the model's tokenizer.json beside the "
            ".gguf file instead"
        )
    if not meta.get("tokenizer.ggml.tokens"):
        raise EngineConfigError(
            "the GGUF file names a 'gpt2' tokenizer but holds no tokenizer.ggml.tokens (an "
            "incomplete conversion?); put the model's tokenizer.json beside the .gguf file"
        )
    tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
    types: list[int] = [int(t) for t in meta.get("tokenizer.ggml.token_type", [1] * len(tokens))]
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
    vocab = {token: i for i, token in enumerate(tokens)}
    bpe = BPE(
        vocab,
        [(a, b) for a, b in merges],
        fuse_unk=False,
        byte_fallback=False,
        ignore_merges=pre in _IGNORE_MERGES,
    )
    backend = _HFTokenizer(bpe)
    if pre in _NFC:
        backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRE_TOKENIZERS[pre]), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    pairs = list(zip(tokens, types, strict=False))
    backend.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t, k in pairs if k == _CONTROL]
    )
    backend.add_tokens(
        [AddedToken(t, special=False, normalized=False) for t, k in pairs if k == _USER_DEFINED]
    )
    special: dict[str, str] = {}
    for name, key in _SPECIAL_IDS.items():
        token_id = meta.get(key)
        if token_id is not None and 0 <= int(token_id) < len(tokens):
            special[name] = tokens[int(token_id)]
    bos = special.get("bos_token")
    if meta.get("tokenizer.ggml.add_bos_token") and bos is not None:
        backend.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A",
            pair=f"{bos} $A {bos} $B:1",
            special_tokens=[(bos, vocab[bos])],
        )
    template = meta.get("tokenizer.chat_template")
    eot = meta.get("tokenizer.ggml.eot_token_id")
    return Tokenizer(
        backend,
        special_tokens=special,
        extra_eos_token_ids=[int(eot)] if eot is not None else [],
        chat_template=template if isinstance(template, str) else None,
    )
