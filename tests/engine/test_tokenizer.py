"""Tokenizer loading and incremental detokenization, on small tokenizers built here.

Three decoder styles are covered: byte-level BPE (GPT-2 / Llama 3 / Qwen), SentencePiece-style
Metaspace, and Llama 2-style Metaspace with byte fallback.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer
from tokenizers.trainers import BpeTrainer

from local_engine import tokenizer as tokenizer_module
from local_engine.errors import EngineConfigError
from local_engine.tokenizer import _BYTE_LEVEL, IncrementalDetokenizer, Tokenizer

_TEXT = [
    "The quick brown fox jumps over the lazy dog, again and again.",
    "Streaming text arrives one token at a time; spaces must come out right.",
    "def f(x):\n    return x * 2  # double it\n",
    "Café naïve résumé — déjà vu. 中文文本 日本語 한국어 Ελληνικά 🚀🙂",
    '{"name": "get_weather", "arguments": {"city": "Paris"}}',
]
_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_SETTINGS = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _write_dir(path: Path, backend: HFTokenizer, config: dict[str, Any]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    backend.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return path


def _byte_level() -> HFTokenizer:
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = BpeTrainer(
        vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(_TEXT * 3, trainer)
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in _SPECIALS])
    tok.add_tokens([AddedToken("<tool_call>", normalized=False, special=False)])
    return tok


def _metaspace() -> HFTokenizer:
    tok = HFTokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    trainer = BpeTrainer(
        vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False
    )
    tok.train_from_iterator(_TEXT * 3, trainer)
    return tok


def _byte_fallback() -> HFTokenizer:
    """Llama 2 style: normalizer adds ▁, BPE with <0xNN> byte tokens, fused decoder."""
    base = HFTokenizer(models.BPE(unk_token="<unk>"))
    base.normalizer = normalizers.Sequence(
        [normalizers.Prepend("▁"), normalizers.Replace(Regex(" "), "▁")]
    )
    trainer = BpeTrainer(
        vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False
    )
    base.train_from_iterator(_TEXT * 3, trainer)
    spec = json.loads(base.to_str())
    vocab: dict[str, int] = spec["model"]["vocab"]
    for byte in range(256):
        vocab.setdefault(f"<0x{byte:02X}>", len(vocab))
    spec["model"]["byte_fallback"] = True
    spec["decoder"] = {
        "type": "Sequence",
        "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0},
        ],
    }
    return HFTokenizer.from_str(json.dumps(spec))


@pytest.fixture(scope="module")
def byte_level_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("byte_level")
    _write_dir(
        path,
        _byte_level(),
        {"eos_token": "<|im_end|>", "pad_token": {"content": "<|endoftext|>"}, "bos_token": None},
    )
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [401, 402]}))
    return path


@pytest.fixture(scope="module")
def tokenizers_by_style(
    tmp_path_factory: pytest.TempPathFactory, byte_level_dir: Path
) -> dict[str, Tokenizer]:
    root = tmp_path_factory.mktemp("styles")
    specials = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    return {
        "byte_level": Tokenizer.from_dir(byte_level_dir),
        "metaspace": Tokenizer.from_dir(_write_dir(root / "m", _metaspace(), specials)),
        "byte_fallback": Tokenizer.from_dir(_write_dir(root / "b", _byte_fallback(), specials)),
    }


def _stream(detok: IncrementalDetokenizer, ids: list[int]) -> list[str]:
    pieces = [detok.push(i) for i in ids]
    pieces.append(detok.flush())
    return pieces


# --------------------------------------------------------------------------- loading


def test_from_dir_reads_special_tokens_and_generation_eos(byte_level_dir: Path) -> None:
    tok = Tokenizer.from_dir(byte_level_dir)
    im_end = tok.token_to_id("<|im_end|>")
    endoftext = tok.token_to_id("<|endoftext|>")
    assert im_end is not None and endoftext is not None
    # eos from tokenizer_config first, then generation_config ids, without duplicates.
    assert tok.eos_token_ids[0] == im_end
    assert set(tok.eos_token_ids) == {im_end, 401, 402}
    assert tok.pad_token_id == endoftext  # given as an AddedToken dict
    assert tok.bos_token_id is None
    assert tok.special_tokens == {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    assert tok.vocab_size == tok.backend.get_vocab_size(with_added_tokens=True)
    # Special tokens are skipped in decode, a non-special added token is kept.
    assert tok.token_to_id("<tool_call>") not in tok.special_token_ids
    ids = tok.encode("<|im_start|>hi<tool_call><|im_end|>")
    assert tok.decode(ids) == "hi<tool_call>"
    assert tok.decode(ids, skip_special_tokens=False) == "<|im_start|>hi<tool_call><|im_end|>"


def test_chat_template_sources(tmp_path: Path) -> None:
    backend = _byte_level()
    plain = Tokenizer.from_dir(_write_dir(tmp_path / "a", backend, {"chat_template": "A"}))
    assert plain.chat_template == "A"
    named = Tokenizer.from_dir(
        _write_dir(
            tmp_path / "b",
            backend,
            {
                "chat_template": [
                    {"name": "default", "template": "D"},
                    {"name": "tool_use", "template": "T"},
                ]
            },
        )
    )
    assert named.chat_template == {"default": "D", "tool_use": "T"}
    jinja_dir = _write_dir(tmp_path / "c", backend, {"chat_template": "old"})
    (jinja_dir / "chat_template.jinja").write_text("from file")
    assert Tokenizer.from_dir(jinja_dir).chat_template == "from file"
    assert Tokenizer.from_dir(_write_dir(tmp_path / "d", backend, {})).chat_template is None


def test_from_dir_errors(tmp_path: Path) -> None:
    with pytest.raises(EngineConfigError, match="no tokenizer.json"):
        Tokenizer.from_dir(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(EngineConfigError):
        Tokenizer.from_dir(tmp_path)
    bad = _write_dir(tmp_path / "bad", _byte_level(), {"chat_template": 5})
    with pytest.raises(EngineConfigError, match="chat_template"):
        Tokenizer.from_dir(bad)


def test_encode_add_special_tokens_uses_post_processor(tmp_path: Path) -> None:
    from tokenizers import processors

    backend = _byte_level()
    bos = backend.token_to_id("<|endoftext|>")
    backend.post_processor = processors.TemplateProcessing(
        single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", bos)]
    )
    tok = Tokenizer.from_dir(_write_dir(tmp_path, backend, {"bos_token": "<|endoftext|>"}))
    assert tok.bos_token_id == bos
    assert tok.encode("hi", add_special_tokens=True) == [bos, *tok.encode("hi")]


# --------------------------------------------------------------------------- detokenizer

_VALID_TEXT = st.text(
    alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="\ufffd"),
    max_size=60,
)


@pytest.mark.parametrize("style", ["byte_level", "metaspace", "byte_fallback"])
@pytest.mark.parametrize("skip", [True, False])
@_SETTINGS
@given(text=_VALID_TEXT)
def test_detokenizer_streams_valid_text_exactly(
    tokenizers_by_style: dict[str, Tokenizer], style: str, skip: bool, text: str
) -> None:
    tok = tokenizers_by_style[style]
    ids = tok.encode(text)
    pieces = _stream(tok.detokenizer(skip_special_tokens=skip), ids)
    assert "".join(pieces) == tok.decode(ids, skip_special_tokens=skip)
    assert not any("\ufffd" in piece for piece in pieces)
    assert pieces[-1] == ""  # nothing was held back once the last token arrived


@pytest.mark.parametrize("style", ["byte_level", "metaspace"])
@pytest.mark.parametrize("skip", [True, False])
@_SETTINGS
@given(data=st.data())
def test_detokenizer_equals_full_decode_for_random_ids(
    tokenizers_by_style: dict[str, Tokenizer], style: str, skip: bool, data: st.DataObject
) -> None:
    tok = tokenizers_by_style[style]
    ids = data.draw(st.lists(st.integers(0, tok.vocab_size + 3), max_size=80))
    detok = tok.detokenizer(skip_special_tokens=skip)
    pieces = _stream(detok, ids)
    assert "".join(pieces) == tok.decode(ids, skip_special_tokens=skip)
    assert detok.text == "".join(pieces)


def test_multibyte_character_is_held_until_complete(
    tokenizers_by_style: dict[str, Tokenizer],
) -> None:
    tok = tokenizers_by_style["byte_level"]
    ids = tok.encode("a🧪")  # not in the training text: split over several byte tokens
    byte_ids = ids[1:]
    assert len(byte_ids) >= 2
    detok = tok.detokenizer()
    assert detok.push(ids[0]) == "a"
    assert [detok.push(i) for i in byte_ids] == [""] * (len(byte_ids) - 1) + ["🧪"]
    assert detok.flush() == ""
    assert detok.text == "a🧪"


def test_byte_level_alphabet_is_the_tokenizers_alphabet() -> None:
    assert set(_BYTE_LEVEL) == set(pre_tokenizers.ByteLevel.alphabet())
    assert sorted(_BYTE_LEVEL.values()) == list(range(256))


@_SETTINGS
@given(text=st.text(max_size=40) | st.sampled_from(_TEXT))
def test_token_bytes_join_to_the_text_bytes(
    tokenizers_by_style: dict[str, Tokenizer], text: str
) -> None:
    tok = tokenizers_by_style["byte_level"]
    ids = tok.encode(text)
    assert b"".join(tok.token_bytes(i) for i in ids) == text.encode("utf-8")


def test_token_ending_inside_a_character_gives_its_own_bytes(
    tokenizers_by_style: dict[str, Tokenizer],
) -> None:
    tok = tokenizers_by_style["byte_level"]
    text = "a🧪 Café 中文"
    ids = tok.encode(text)
    partial = [i for i in ids if "\ufffd" in tok.decode([i])]
    assert partial  # the emoji is split over byte tokens
    for token_id in partial:
        assert b"\xef\xbf\xbd" not in tok.token_bytes(token_id)
    assert b"".join(tok.token_bytes(i) for i in ids) == text.encode("utf-8")
    special = tok.token_to_id("<|im_end|>")
    assert special is not None and tok.token_bytes(special) == b"<|im_end|>"


def test_byte_fallback_tokens_give_their_byte(
    tokenizers_by_style: dict[str, Tokenizer],
) -> None:
    tok = tokenizers_by_style["byte_fallback"]
    text = "x🧪"  # not in the training text: spelled with <0xNN> tokens
    ids = tok.encode(text)
    pieces = [tok.id_to_token(i) for i in ids]
    assert "<0xF0>" in pieces
    # the normalizer prepends the first word's space: the first piece is ▁x, b" x"
    assert b"".join(tok.token_bytes(i) for i in ids) == b" " + text.encode("utf-8")
    assert tok.token_bytes(tok.token_to_id("<0xF0>") or 0) == b"\xf0"


@_SETTINGS
@given(text=st.text(sorted(set("".join(_TEXT))), max_size=40) | st.sampled_from(_TEXT))
@pytest.mark.parametrize("style", ["metaspace", "byte_fallback"])
def test_sentencepiece_token_bytes_keep_the_word_space(
    tokenizers_by_style: dict[str, Tokenizer], style: str, text: str
) -> None:
    """After the first token, the tokens' bytes joined are the bytes the rest of the text
    adds: ``▁the`` stands for b" the", not b"the" as it decodes alone."""
    tok = tokenizers_by_style[style]
    ids = tok.encode(text)
    full, head = tok.decode(ids), tok.decode(ids[:1])
    assume(len(ids) > 1 and full.startswith(head) and "\ufffd" not in head)
    assume(tok.token_to_id("<unk>") not in ids)  # a special token: dropped from ``full``
    assert b"".join(tok.token_bytes(i) for i in ids[1:]) == full[len(head) :].encode("utf-8")


def test_sentencepiece_token_text_is_the_text_after_other_text(
    tokenizers_by_style: dict[str, Tokenizer],
) -> None:
    tok = tokenizers_by_style["metaspace"]
    the = tok.token_to_id("▁the")
    assert the is not None and tok.decode([the]) == "the"
    assert tok.token_text(the) == " the" and tok.token_bytes(the) == b" the"
    eos = tok.token_to_id("</s>")
    assert eos is not None and tok.token_text(eos) == "</s>"  # special tokens: alone
    byte_level = tokenizers_by_style["byte_level"]
    ids = byte_level.encode("over the lazy dog")
    assert [byte_level.token_text(i) for i in ids] == [byte_level.decode([i]) for i in ids]


def test_token_text_anchors_on_the_first_candidate_that_is_one_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where "a" is not one token, a later candidate anchors the decode; with none, a token
    decodes alone."""
    specials = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    path = _write_dir(tmp_path / "m", _metaspace(), specials)
    monkeypatch.setattr(tokenizer_module, "_ANCHORS", ("a cat sat", "over"))
    tok = Tokenizer.from_dir(path)
    the = tok.token_to_id("▁the")
    assert the is not None and tok.token_text(the) == " the"
    monkeypatch.setattr(tokenizer_module, "_ANCHORS", ("a cat sat",))
    assert Tokenizer.from_dir(path).token_text(the) == "the"


def test_metaspace_spacing_is_kept_between_tokens(
    tokenizers_by_style: dict[str, Tokenizer],
) -> None:
    tok = tokenizers_by_style["metaspace"]
    ids = tok.encode("over the lazy dog")
    pieces = _stream(tok.detokenizer(), ids)
    assert "".join(pieces) == "over the lazy dog"
    assert any(piece.startswith(" ") for piece in pieces[1:])


def test_special_tokens_skipped_or_kept(byte_level_dir: Path) -> None:
    tok = Tokenizer.from_dir(byte_level_dir)
    ids = tok.encode("<|im_start|>hello<|im_end|>")
    assert "".join(_stream(tok.detokenizer(), ids)) == "hello"
    kept = "".join(_stream(tok.detokenizer(skip_special_tokens=False), ids))
    assert kept == "<|im_start|>hello<|im_end|>"


def _ids_of(tok: Tokenizer, tokens: str) -> list[int]:
    """The ids of single-character tokens."""
    ids = [tok.token_to_id(c) for c in tokens]
    assert all(i is not None for i in ids)
    return [i for i in ids if i is not None]


def _record_windows(tok: Tokenizer, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    sizes: list[int] = []
    original: Callable[..., str] = tok.decode

    def decode(ids: list[int], *, skip_special_tokens: bool = True) -> str:
        sizes.append(len(ids))
        return original(ids, skip_special_tokens=skip_special_tokens)

    monkeypatch.setattr(tok, "decode", decode)
    return sizes


@pytest.mark.parametrize("style", ["byte_level", "metaspace"])
def test_work_per_token_does_not_grow_with_length(
    tokenizers_by_style: dict[str, Tokenizer], style: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    tok = tokenizers_by_style[style]
    ids = tok.encode(" ".join(_TEXT[:3]) * 40)
    expected = tok.decode(ids)
    sizes = _record_windows(tok, monkeypatch)
    detok = tok.detokenizer()
    text = "".join(_stream(detok, ids))
    assert text == expected
    assert len(ids) > 500
    assert max(sizes[:-1]) <= 4  # every decode looks at a window of a few tokens
    assert len(sizes) <= 2 * len(ids) + 1


def test_invalid_byte_runs_stay_bounded_and_exact(
    tokenizers_by_style: dict[str, Tokenizer], monkeypatch: pytest.MonkeyPatch
) -> None:
    tok = tokenizers_by_style["byte_level"]
    # 中 is E4 B8 AD; byte-level BPE spells those bytes "ä", "¸", "Ń".
    lead, *tail = _ids_of(tok, "ä¸Ń")
    assert tok.decode([lead]) == "\ufffd"
    ids = [lead] * 300 + [lead, *tail] + tok.encode(" ok")
    expected = tok.decode(ids)
    sizes = _record_windows(tok, monkeypatch)
    pieces = _stream(tok.detokenizer(), ids)
    assert "".join(pieces) == expected
    assert expected.endswith("\ufffd中 ok")
    assert max(sizes) <= 12  # held tokens are cut, not accumulated
    assert sum(len(p) for p in pieces[:200]) > 0  # invalid bytes are emitted as they settle


@_SETTINGS
@given(data=st.data())
def test_detokenizer_equals_full_decode_for_random_bytes(
    tokenizers_by_style: dict[str, Tokenizer], data: st.DataObject
) -> None:
    """Mostly raw byte tokens: long invalid runs exercise the held-window cut."""
    tok = tokenizers_by_style["byte_level"]
    alphabet = "".join(sorted(pre_tokenizers.ByteLevel.alphabet()))
    high = [
        i for c, i in zip(alphabet, _ids_of(tok, alphabet), strict=True) if 0xA1 <= ord(c) <= 0xFF
    ]
    anything = st.integers(0, tok.vocab_size - 1)
    some_ids = st.one_of(st.sampled_from(high), st.sampled_from(high), anything)
    ids = data.draw(st.lists(some_ids, min_size=10, max_size=120))
    pieces = _stream(tok.detokenizer(), ids)
    assert "".join(pieces) == tok.decode(ids)


def test_detokenizer_exact_on_long_runs_of_non_ascii_bytes(
    tokenizers_by_style: dict[str, Tokenizer],
) -> None:
    """Seeded sequences of bytes >= 0xA1 (leads and continuations, often invalid)."""
    tok = tokenizers_by_style["byte_level"]
    high = _ids_of(tok, "".join(chr(b) for b in range(0xA1, 0x100) if b != 0xAD))
    rng = random.Random(1234)
    for _ in range(200):
        ids = [rng.choice(high) for _ in range(rng.randint(1, 100))]
        if rng.random() < 0.5:
            ids.insert(rng.randrange(len(ids)), rng.randrange(tok.vocab_size))
        assert "".join(_stream(tok.detokenizer(), ids)) == tok.decode(ids)
