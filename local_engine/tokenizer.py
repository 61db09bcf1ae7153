"""Tokenizer for a Hugging Face model directory, and incremental detokenization.

:class:`Tokenizer` wraps a ``tokenizers`` ``tokenizer.json`` and reads what the engine and the
chat layer need from ``tokenizer_config.json`` (named special tokens, the chat template) and
``generation_config.json`` (extra end-of-sequence ids).

:class:`IncrementalDetokenizer` turns a stream of token ids into text as it arrives. It decodes
a short sliding window of recent tokens rather than the whole sequence, so the work per token
does not grow with the sequence length, and it holds back text while the window ends in an
incomplete UTF-8 sequence (byte-level BPE may split one character over several tokens).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as _HFTokenizer
from tokenizers import decoders

from local_engine.errors import EngineConfigError

from .config import _read_json, _token_ids

__all__ = ["SPECIAL_TOKEN_NAMES", "IncrementalDetokenizer", "Tokenizer"]

#: The named special tokens transformers exposes to chat templates (``special_tokens_map``).
SPECIAL_TOKEN_NAMES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)

_REPLACEMENT = "\ufffd"
# After this many tokens held back behind a trailing U+FFFD, look for a point where the window
# can be cut without changing the decoded text (invalid byte runs would otherwise grow it).
_MAX_HELD_TOKENS = 8
# A UTF-8 sequence is at most 4 bytes and every token carries at least one byte, so any
# incomplete sequence before a cut is resolved by the next 3 tokens.
_RESOLVE_TOKENS = 3


_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")
_ANCHORS = ("a", "e", "x", "the", "0", ".", ",")  # texts one token in almost any vocabulary
"""A byte-fallback token (SentencePiece / Llama 2 style) stands for one raw byte."""


def _byte_level_alphabet() -> dict[str, int]:
    """The character -> byte table of byte-level BPE (GPT-2, Llama 3, Qwen).

    Vocabulary strings spell each byte as one printable character: the printable Latin-1
    bytes as themselves, every other byte as ``chr(256 + n)``, n counting those bytes upwards.
    """
    table = {chr(b): b for b in (*range(33, 127), *range(161, 173), *range(174, 256))}
    others = [b for b in range(256) if chr(b) not in table]
    table.update({chr(256 + n): b for n, b in enumerate(others)})
    return table


_BYTE_LEVEL = _byte_level_alphabet()


def _token_text(value: object) -> str | None:
    """A special token as written in a config: a string, or an AddedToken dict."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _load_chat_template(path: Path, config: Mapping[str, Any]) -> str | dict[str, str] | None:
    """The chat template: ``chat_template.jinja`` first, then ``tokenizer_config.json``."""
    jinja_file = path / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    raw = config.get("chat_template")
    if raw is None or isinstance(raw, str):
        return raw
    if isinstance(raw, list):
        named: dict[str, str] = {}
        for entry in raw:
            if not (
                isinstance(entry, Mapping)
                and isinstance(entry.get("name"), str)
                and isinstance(entry.get("template"), str)
            ):
                raise EngineConfigError(
                    "tokenizer_config.json chat_template list entries need 'name' and 'template'"
                )
            named[entry["name"]] = entry["template"]
        return named
    raise EngineConfigError("tokenizer_config.json chat_template must be a string or a list")


_GIL_FREE_CHARS = 16_384


class Tokenizer:
    """A model's tokenizer: encode, decode, special tokens and chat template."""

    def __init__(
        self,
        backend: _HFTokenizer,
        *,
        special_tokens: Mapping[str, str] | None = None,
        extra_eos_token_ids: Sequence[int] = (),
        chat_template: str | Mapping[str, str] | None = None,
    ) -> None:
        """Wrap a ``tokenizers.Tokenizer``.

        ``special_tokens`` maps names from :data:`SPECIAL_TOKEN_NAMES` to token strings;
        ``extra_eos_token_ids`` adds ids (from ``generation_config.json``) that end generation.
        """
        self._backend = backend
        self.special_tokens: dict[str, str] = {
            name: text
            for name, text in (special_tokens or {}).items()
            if name in SPECIAL_TOKEN_NAMES
        }
        self.chat_template: str | dict[str, str] | None = (
            dict(chat_template) if isinstance(chat_template, Mapping) else chat_template
        )
        self.vocab_size: int = backend.get_vocab_size(with_added_tokens=True)
        added = backend.get_added_tokens_decoder()
        self.special_token_ids: frozenset[int] = frozenset(
            token_id for token_id, token in added.items() if token.special
        )
        self.added_tokens: dict[str, int] = {token.content: tid for tid, token in added.items()}
        self._added_ids = frozenset(added)
        self._byte_level = isinstance(backend.decoder, decoders.ByteLevel)
        self._byte_fallback = bool(getattr(backend.model, "byte_fallback", False))
        self._texts: dict[int, str] = {}  # token_text by id (at most one entry per token)
        self.bos_token_id = self._named_id("bos_token")
        self.pad_token_id = self._named_id("pad_token")
        eos: list[int] = []
        for token_id in (self._named_id("eos_token"), *extra_eos_token_ids):
            if token_id is not None and token_id not in eos:
                eos.append(token_id)
        self.eos_token_ids: tuple[int, ...] = tuple(eos)

    @classmethod
    def from_dir(cls, path: str | Path) -> Tokenizer:
        """Load ``tokenizer.json`` and its configs from a model directory."""
        root = Path(path)
        tokenizer_file = root / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise EngineConfigError(f"no tokenizer.json in {root}")
        try:
            backend = _HFTokenizer.from_file(str(tokenizer_file))
        except Exception as exc:  # the Rust side raises bare Exception subclasses
            raise EngineConfigError(f"cannot load {tokenizer_file}: {exc}") from exc
        config = _read_json(root / "tokenizer_config.json", required=False)
        legacy_map = _read_json(root / "special_tokens_map.json", required=False)
        special: dict[str, str] = {}
        for name in SPECIAL_TOKEN_NAMES:
            text = _token_text(config.get(name))
            if text is None:
                text = _token_text(legacy_map.get(name))
            if text is not None:
                special[name] = text
        generation = _read_json(root / "generation_config.json", required=False)
        extra_eos = list(_token_ids(generation.get("eos_token_id"), "eos_token_id"))
        return cls(
            backend,
            special_tokens=special,
            extra_eos_token_ids=extra_eos,
            chat_template=_load_chat_template(root, config),
        )

    def _named_id(self, name: str) -> int | None:
        text = self.special_tokens.get(name)
        return None if text is None else self.token_to_id(text)

    @property
    def backend(self) -> _HFTokenizer:
        """The wrapped ``tokenizers.Tokenizer``."""
        return self._backend

    def token_to_id(self, token: str) -> int | None:
        """The id of a vocabulary token, or None when it is not in the vocabulary."""
        token_id = self._backend.token_to_id(token)
        return None if token_id is None else int(token_id)

    def id_to_token(self, token_id: int) -> str | None:
        """The vocabulary string of an id, or None when the id is out of range."""
        token = self._backend.id_to_token(token_id)
        return None if token is None else str(token)

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        """Token ids for ``text``; ``add_special_tokens`` applies the post-processor (e.g. BOS)."""
        if len(text) > _GIL_FREE_CHARS:
            # encode_batch releases the GIL while it works; encode holds it throughout, which
            # would freeze every other thread (a server's event loop) on a long text.
            batch = self._backend.encode_batch([text], add_special_tokens=add_special_tokens)
            return list(batch[0].ids)
        ids = self._backend.encode(text, add_special_tokens=add_special_tokens).ids
        return list(ids)

    @functools.cached_property
    def max_token_bytes(self) -> int:
        """An upper bound on the UTF-8 bytes of text one token stands for.

        The longest vocabulary entry in UTF-8 (byte-level and SentencePiece vocabularies
        spell each input byte with at least one byte), times 4 for normalizers that fold
        several input characters into one. A text of more than ``n * max_token_bytes``
        bytes needs more than ``n`` tokens.
        """
        vocab = self._backend.get_vocab(with_added_tokens=True)
        longest = max((len(token.encode("utf-8", "replace")) for token in vocab), default=1)
        return 4 * max(1, longest)

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        """Text for ``ids``; special tokens are dropped unless ``skip_special_tokens`` is False."""
        return str(self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for (the ``bytes`` of an OpenAI logprob entry).

        Byte-level BPE and byte-fallback tokens may end inside a multi-byte UTF-8 character,
        where decoding the token alone gives U+FFFD; their own bytes are read from the
        vocabulary string instead, so that the bytes of a token sequence joined are the UTF-8
        of its text. Other tokens give the UTF-8 of :meth:`token_text`.
        """
        piece = self._backend.id_to_token(token_id)
        if piece is not None and token_id not in self._added_ids:
            if self._byte_level and all(ch in _BYTE_LEVEL for ch in piece):
                return bytes(_BYTE_LEVEL[ch] for ch in piece)
            match = _BYTE_TOKEN.fullmatch(piece) if self._byte_fallback else None
            if match is not None:
                return bytes([int(match[1], 16)])
        return self.token_text(token_id).encode("utf-8")

    def text_bytes(self, token_id: int) -> bytes:
        """The bytes one token adds to a decoded text (special tokens dropped, as
        :meth:`decode` drops them): :meth:`token_bytes`, except that an added token gives
        what it decodes to, nothing for a special one."""
        if token_id in self._added_ids:
            return self.decode([token_id]).encode("utf-8")
        return self.token_bytes(token_id)

    def token_text(self, token_id: int) -> str:
        """The text one token adds after other text (the ``token`` of a logprob entry).

        A SentencePiece word piece such as ``▁Hello`` decodes alone to ``Hello``, since the
        decoder drops the space of a text's first word; after other text it adds
        `` Hello``, and that is its text here. Added and special tokens decode alone.
        """
        text = self._texts.get(token_id)
        if text is None:
            text = self._texts[token_id] = self._text_after_anchor(token_id)
        return text

    def _text_after_anchor(self, token_id: int) -> str:
        anchor = self._anchor
        if anchor is not None and token_id not in self._added_ids:
            anchor_id, anchor_text = anchor
            both = self.decode([anchor_id, token_id], skip_special_tokens=False)
            if both.startswith(anchor_text):
                return both[len(anchor_text) :]
        return self.decode([token_id], skip_special_tokens=False)

    @functools.cached_property
    def _anchor(self) -> tuple[int, str] | None:
        """A one-token text to decode a token after (``"a"``, else another common one), or
        None if no candidate is one plain token."""
        for candidate in _ANCHORS:
            ids = self.encode(candidate)
            if len(ids) == 1 and ids[0] not in self._added_ids:
                return ids[0], self.decode(ids, skip_special_tokens=False)
        return None

    def detokenizer(self, *, skip_special_tokens: bool = True) -> IncrementalDetokenizer:
        """A fresh :class:`IncrementalDetokenizer` for one generated sequence."""
        return IncrementalDetokenizer(self, skip_special_tokens=skip_special_tokens)


class IncrementalDetokenizer:
    """Streams the text of a token sequence, one token at a time.

    The concatenation of everything :meth:`push` and :meth:`flush` return equals
    ``tokenizer.decode(all_ids)``. Each push decodes only a window that starts one emission
    back (so SentencePiece-style leading spaces come out right), which keeps the cost per
    token independent of the sequence length.
    """

    def __init__(self, tokenizer: Tokenizer, *, skip_special_tokens: bool = True) -> None:
        """Start an empty stream over ``tokenizer``."""
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0
        self._prefix_text = ""
        self._held = 0
        self._pieces: list[str] = []
        self._text: str | None = ""

    @property
    def text(self) -> str:
        """All text emitted so far."""
        if self._text is None:
            self._text = "".join(self._pieces)
        return self._text

    def _emit(self, piece: str) -> str:
        if piece:
            self._pieces.append(piece)
            self._text = None
        return piece

    def _decode(self, start: int, stop: int | None = None) -> str:
        return self._tokenizer.decode(self._ids[start:stop], skip_special_tokens=False)

    def push(self, token_id: int) -> str:
        """Add one token; return the text it completes (possibly "")."""
        if self._skip and token_id in self._tokenizer.special_token_ids:
            return ""
        self._ids.append(token_id)
        new_text = self._decode(self._prefix_offset)
        if new_text.endswith(_REPLACEMENT) or len(new_text) <= len(self._prefix_text):
            self._held += 1
            if self._held >= _MAX_HELD_TOKENS:
                return self._cut_held(new_text)
            return ""
        piece = new_text[len(self._prefix_text) :]
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        self._prefix_text = self._decode(self._prefix_offset)
        self._held = 0
        return self._emit(piece)

    def _cut_held(self, window_text: str) -> str:
        """Emit held text up to a cut that later tokens can no longer change.

        A cut at ``split`` is safe when the window decodes to the same text whole as in two
        parts and at least :data:`_RESOLVE_TOKENS` tokens follow it: the bytes after the cut
        then start a fresh sequence, so the window can restart there.
        """
        split = len(self._ids) - _RESOLVE_TOKENS
        if split <= self._read_offset:
            return ""
        head = self._decode(self._prefix_offset, split)
        tail = self._decode(split)
        if head + tail != window_text or not head.startswith(self._prefix_text):
            return ""
        piece = head[len(self._prefix_text) :]
        self._prefix_offset = self._read_offset = split
        self._prefix_text = ""
        self._held = 0
        # The restarted window may already be complete text.
        if tail and not tail.endswith(_REPLACEMENT):
            self._prefix_offset = split
            self._read_offset = len(self._ids)
            self._prefix_text = tail
            return self._emit(piece + tail)
        self._held = len(self._ids) - split
        return self._emit(piece)

    def flush(self) -> str:
        """Return whatever text is still held back (call once, at the end)."""
        remainder = self._decode(self._prefix_offset)[len(self._prefix_text) :]
        self._prefix_offset = self._read_offset = len(self._ids)
        self._prefix_text = ""
        self._held = 0
        return self._emit(remainder)
