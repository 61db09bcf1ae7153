"""A GGUF file's tokenizer rebuilt as a ``tokenizers.Tokenizer``: byte-level BPE
(``tokenizer.ggml.model = "gpt2"``) from its vocabulary, merges and token types, with the
pre-tokenizer that ``tokenizer.ggml.pre`` names; or SentencePiece BPE
(``tokenizer.ggml.model = "llama"``: Llama 2, Mistral, TinyLlama and the like) from its
pieces, their scores and token types.

SentencePiece's BPE merges, at each step, the adjacent pair whose joined piece has the
highest score, for as long as the joined piece is in the vocabulary; llama.cpp's tokenizer
does the same. A BPE model whose merges are every such pair ranked by the joined piece's
score (highest first) makes the same choices, so that is what is built, with the
``<0xXX>`` byte pieces as byte fallback for characters outside the vocabulary. Spaces are
written as ``▁``, and with ``tokenizer.ggml.add_space_prefix`` (true unless the file says
otherwise) each text, and each run of text after a special token, starts with one, which
decoding takes off again.

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
_NORMAL, _CONTROL, _USER_DEFINED, _BYTE = 1, 3, 4, 6
_SPACE = "\u2581"  # SentencePiece's visible space
_SPECIAL_IDS = {
    "bos_token": "tokenizer.ggml.bos_token_id",
    "eos_token": "tokenizer.ggml.eos_token_id",
    "unk_token": "tokenizer.ggml.unknown_token_id",
    "pad_token": "tokenizer.ggml.padding_token_id",
}


def tokenizer_from_gguf(meta: Mapping[str, Any]) -> Tokenizer:
    """The tokenizer described by a GGUF file's ``tokenizer.*`` metadata.

    Raises:
        UnsupportedGGUFError: a tokenizer model other than ``gpt2`` (byte-level BPE) and
            ``llama`` (SentencePiece BPE), or a pre-tokenizer not in :data:`PRE_TOKENIZERS`.
        EngineConfigError: the metadata is incomplete (no pieces; scores missing).
    """
    model = meta.get("tokenizer.ggml.model")
    if model not in ("gpt2", "llama"):
        raise UnsupportedGGUFError(
            f"unsupported GGUF tokenizer model {model!r}: the engine rebuilds 'gpt2' "
            "(byte-level BPE) and 'llama' (SentencePiece BPE); put the model's tokenizer.json "
            "beside the .gguf file instead"
        )
    if not meta.get("tokenizer.ggml.tokens"):
        raise EngineConfigError(
            f"the GGUF file names a {model!r} tokenizer but holds no tokenizer.ggml.tokens (an "
            "incomplete conversion?); put the model's tokenizer.json beside the .gguf file"
        )
    if model == "llama":
        return _with_specials(_sentencepiece(meta), meta)
    pre = str(meta.get("tokenizer.ggml.pre", "default"))
    if pre not in PRE_TOKENIZERS:
        raise UnsupportedGGUFError(
            f"unsupported GGUF pre-tokenizer {pre!r}: the engine rebuilds "
            f"{', '.join(sorted(PRE_TOKENIZERS))}; put the model's tokenizer.json beside the "
            ".gguf file instead"
        )
    tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
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
    return _with_specials(backend, meta)


def _sentencepiece(meta: Mapping[str, Any]) -> _HFTokenizer:
    """SentencePiece BPE (``tokenizer.ggml.model = "llama"``) as a ``tokenizers`` BPE model
    (see the module docstring)."""
    tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
    types = _token_types(meta, len(tokens))
    scores: list[float] = [float(x) for x in meta.get("tokenizer.ggml.scores", [])]
    if len(scores) != len(tokens):
        raise EngineConfigError(
            f"the GGUF file's SentencePiece tokenizer has {len(tokens)} pieces but "
            f"{len(scores)} scores; put the model's tokenizer.json beside the .gguf file"
        )
    vocab = {token: i for i, token in enumerate(tokens)}
    pieces = {t: i for i, t in enumerate(tokens) if types[i] in (_NORMAL, _USER_DEFINED)}
    ranked: list[tuple[float, int, int, str, str]] = []
    for piece, index in pieces.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in pieces and right in pieces:
                ranked.append((-scores[index], pieces[left], pieces[right], left, right))
    ranked.sort()  # highest score first; a piece's several splits by their pieces' ids
    unk_id = meta.get("tokenizer.ggml.unknown_token_id")
    unk = tokens[int(unk_id)] if unk_id is not None and 0 <= int(unk_id) < len(tokens) else None
    bpe = BPE(
        vocab,
        [(left, right) for *_, left, right in ranked],
        unk_token=unk,
        fuse_unk=True,
        byte_fallback=any(t == _BYTE for t in types),
    )
    backend = _HFTokenizer(bpe)
    prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
    steps = [normalizers.Prepend(_SPACE)] if prefix else []
    backend.normalizer = normalizers.Sequence([*steps, normalizers.Replace(" ", _SPACE)])
    tail = [decoders.Strip(" ", 1, 0)] if prefix else []
    backend.decoder = decoders.Sequence(
        [decoders.Replace(_SPACE, " "), decoders.ByteFallback(), decoders.Fuse(), *tail]
    )
    return backend


def _token_types(meta: Mapping[str, Any], count: int) -> list[int]:
    """Each token's llama.cpp type (all NORMAL when the file gives none)."""
    return [int(t) for t in meta.get("tokenizer.ggml.token_type", [_NORMAL] * count)]


def _with_specials(backend: _HFTokenizer, meta: Mapping[str, Any]) -> Tokenizer:
    """Add the file's control and user-defined tokens, its BOS rule, special tokens, end of
    turn and chat template to a rebuilt backend."""
    tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
    types = _token_types(meta, len(tokens))
    vocab = {token: i for i, token in enumerate(tokens)}
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
