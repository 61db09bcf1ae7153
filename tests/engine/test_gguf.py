"""Loading GGUF files: F32 exactly as the HF checkpoint, Q8_0 onto int8, Q4_0 onto int4
(the codes exactly), llama's Q/K permutation undone, and clear errors for what is not
supported. The files are written by tests/engine/gguf_files.py the way llama.cpp's
converter writes them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("gguf")

from local_engine.engine import Engine, EngineConfig  # noqa: E402
from local_engine.errors import EngineConfigError  # noqa: E402
from local_engine.gguf_loader import (  # noqa: E402
    UnsupportedGGUFError,
    gguf_quantization,
    load_gguf_tokenizer,
    read_gguf_config,
)
from local_engine.loader import load_model  # noqa: E402
from local_engine.model import DecoderLayer  # noqa: E402
from local_engine.quant import (  # noqa: E402
    DEQUANT_ROWS,
    Int4Weight,
    Int8Weight,
    dequantize_int4,
    quantize_rows,
)

from .gguf_files import add_sentencepiece_tokenizer, add_tokenizer, write_gguf  # noqa: E402
from .paged import logit_agreement, random_tokens, stepped_logits  # noqa: E402
from .tiny import make_tiny_model, write_char_tokenizer  # noqa: E402

GGUF_FAMILIES = ("qwen2", "qwen3", "llama")
COSINE_FLOOR = 0.99
INT4_FLOORS = (0.8, 0.4)  # 4-bit against float32 on random weights: see test_quant.py
_REQUANT_FLOORS = {"int8": (COSINE_FLOOR, 0.8), "int4": (0.8, 0.4)}  # against the file's own
_METHOD = {"Q8_0": "int8", "Q4_0": "int4"}


@pytest.fixture(scope="module", params=GGUF_FAMILIES)
def hf_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    family = str(request.param)
    return make_tiny_model(tmp_path_factory.mktemp(family), family)


def test_f32_gguf_is_the_hf_checkpoint(hf_dir: Path, tmp_path: Path) -> None:
    path = write_gguf(hf_dir, tmp_path / "model-f32.gguf", "F32")
    config = read_gguf_config(path)
    assert config == load_model(hf_dir).config
    assert gguf_quantization(path) is None
    ids = random_tokens(DEQUANT_ROWS + 12, seed=3)
    ours = stepped_logits(load_model(path), ids)
    reference = stepped_logits(load_model(hf_dir), ids)
    torch.testing.assert_close(ours, reference, rtol=1e-5, atol=1e-5)


def test_llama3_rope_freqs_become_its_rope_scaling(tmp_path: Path) -> None:
    """llama.cpp stores llama3 rope scaling as a rope_freqs tensor of divisors; the loader
    recovers the parameters (the tiny llama3 puts frequencies in all three bands)."""
    hf_dir = make_tiny_model(tmp_path / "hf", "llama3")
    path = write_gguf(hf_dir, tmp_path / "llama3.gguf", "F32")
    assert read_gguf_config(path) == load_model(hf_dir).config
    ids = random_tokens(40, seed=4)
    torch.testing.assert_close(
        stepped_logits(load_model(path), ids), stepped_logits(load_model(hf_dir), ids)
    )


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0"])
def test_quantized_gguf_logits(
    hf_dir: Path, tmp_path: Path, qtype: str, record_property: pytest.RecordProperty
) -> None:
    """Against the float32 HF checkpoint, and against the weights the file holds
    (dequantized, in bfloat16): the second measures what the loading costs."""
    dequant = tmp_path / "dequantized"
    path = write_gguf(hf_dir, tmp_path / f"model-{qtype}.gguf", qtype, dequant_dir=dequant)
    model = load_model(path)
    weight_kind = Int4Weight if qtype == "Q4_0" else Int8Weight
    layer = model.layers[0]
    assert isinstance(layer, DecoderLayer) and isinstance(layer.qkv_weight, weight_kind)
    assert model.dtype == torch.bfloat16
    ids = random_tokens(DEQUANT_ROWS + 24, seed=5)
    ours = stepped_logits(model, ids)
    reference = stepped_logits(load_model(hf_dir), ids)
    vs_hf = logit_agreement(ours, reference)
    vs_file = logit_agreement(ours, stepped_logits(load_model(dequant, dtype="bfloat16"), ids))
    at_load = logit_agreement(
        stepped_logits(load_model(hf_dir, quantization=_METHOD[qtype]), ids), reference
    )
    print(
        f"{model.config.family} {qtype}: vs float32 HF min cosine {vs_hf[0]:.5f} top-1 "
        f"{vs_hf[1]:.3f}; vs its own weights in bf16 min cosine {vs_file[0]:.5f} top-1 "
        f"{vs_file[1]:.3f}; (HF quantized at load to {_METHOD[qtype]}: min cosine "
        f"{at_load[0]:.5f} top-1 {at_load[1]:.3f})"
    )
    record_property("min_cosine_vs_hf", round(vs_hf[0], 5))
    record_property("top1_vs_hf", round(vs_hf[1], 3))
    record_property("min_cosine_vs_file", round(vs_file[0], 5))
    record_property("top1_vs_file", round(vs_file[1], 3))
    assert vs_file[0] >= COSINE_FLOOR and vs_file[1] >= 0.8
    floors = INT4_FLOORS if qtype == "Q4_0" else (COSINE_FLOOR, 0.8)
    assert vs_hf[0] >= floors[0] and vs_hf[1] >= floors[1]


def test_q4_0_codes_load_exactly(tmp_path: Path) -> None:
    """Q4_0's codes are the int4 weights' codes; only its fp16 scale is rounded (bf16)."""
    hf_dir = make_tiny_model(tmp_path / "hf", "llama")
    dequant = tmp_path / "dequantized"
    path = write_gguf(hf_dir, tmp_path / "model.gguf", "Q4_0", dequant_dir=dequant)
    for dtype in (torch.float16, torch.bfloat16):
        model = load_model(path, dtype=dtype)
        reference = load_model(dequant, dtype=torch.float32)
        for ours, ref in zip(model.layers, reference.layers, strict=True):
            assert isinstance(ours, DecoderLayer) and isinstance(ref, DecoderLayer)
            weight = ours.qkv_weight
            assert isinstance(weight, Int4Weight)
            got = dequantize_int4(weight.qweight, weight.scales.float(), rows=weight.out_features)
            expected = ref.qkv_weight
            assert isinstance(expected, torch.Tensor)
            if dtype == torch.float16:  # fp16 scales: exact
                torch.testing.assert_close(got, expected, rtol=0, atol=0)
            else:  # the scale rounded to bf16: at most 2^-9 relative
                torch.testing.assert_close(got, expected, rtol=2**-8, atol=0)


@pytest.mark.parametrize("qtype", ["Q4_0", "Q8_0"])
def test_tied_file_gets_an_int8_copy_of_its_embeddings_as_head(tmp_path: Path, qtype: str) -> None:
    hf_dir = make_tiny_model(tmp_path / "hf", "llama", tie_word_embeddings=True)
    path = write_gguf(hf_dir, tmp_path / "model.gguf", qtype)
    model = load_model(path)
    assert model.quantization == _METHOD[qtype] and isinstance(model.lm_head, Int8Weight)
    codes, scales = quantize_rows(model.embed_tokens, model.dtype)
    assert torch.equal(model.lm_head.qweight, codes)
    assert torch.equal(model.lm_head.scales, scales)
    ids = random_tokens(24, seed=2)
    cosine, top1 = logit_agreement(
        stepped_logits(model, ids), stepped_logits(load_model(hf_dir), ids)
    )
    floors = INT4_FLOORS if qtype == "Q4_0" else (COSINE_FLOOR, 0.8)
    assert cosine >= floors[0] and top1 >= floors[1]


def test_mixed_file_follows_its_projections(tmp_path: Path) -> None:
    """llama-quantize keeps the head at a higher precision than the Q4_0 projections."""
    hf_dir = make_tiny_model(tmp_path / "hf", "qwen2")
    path = write_gguf(hf_dir, tmp_path / "model.gguf", "Q4_0", head_qtype="Q8_0")
    assert gguf_quantization(path) == "int4"
    model = load_model(path)
    assert isinstance(model.lm_head, Int8Weight)


def test_explicit_quantization_requantizes(tmp_path: Path) -> None:
    hf_dir = make_tiny_model(tmp_path / "hf", "qwen3")
    path = write_gguf(hf_dir, tmp_path / "model.gguf", "Q8_0")
    layer = load_model(path, quantization="int4").layers[0]
    assert isinstance(layer, DecoderLayer) and isinstance(layer.o_weight, Int4Weight)


def test_unsupported_tensor_type_names_it(tmp_path: Path) -> None:
    """A type the gguf package cannot dequantize is refused before any weight loads."""
    hf_dir = make_tiny_model(tmp_path / "hf", "qwen2", **_K_SHAPE)
    path = write_gguf(hf_dir, tmp_path / "model.gguf", "Q4_K", qtypes={"ffn_up": "Q8_K"})
    with pytest.raises(UnsupportedGGUFError, match=r"ffn_up.*type Q8_K.*does not dequantize"):
        gguf_quantization(path)
    with pytest.raises(UnsupportedGGUFError, match=r"type Q8_K") as e:
        load_model(path)
    assert "llama-quantize" in str(e.value)  # and what to do about it


# Row lengths a multiple of 256, as the K-quants' blocks need.
_K_SHAPE: dict[str, Any] = {"hidden_size": 256, "intermediate_size": 512, "head_dim": 64}
# What each requantized type runs as: int8 above 5 bits a weight, int4 at or below.
_REQUANTIZED = {
    "Q2_K": "int4",
    "Q3_K": "int4",
    "Q4_K": "int4",
    "IQ4_XS": "int4",
    "IQ4_NL": "int4",
    "Q4_1": "int4",
    "Q5_0": "int8",
    "Q5_1": "int8",
    "Q5_K": "int8",
    "Q6_K": "int8",
}


@pytest.mark.parametrize("qtype", sorted(_REQUANTIZED))
def test_other_quantized_types_are_requantized(
    tmp_path: Path, qtype: str, record_property: pytest.RecordProperty
) -> None:
    """K-quants, the other legacy types and IQ4: each tensor dequantized by the gguf package
    and requantized (int8 above 5 bits a weight, int4 otherwise); the logits against the
    weights the file holds, dense in bfloat16: what the second rounding costs."""
    hf_dir = make_tiny_model(tmp_path / "hf", "qwen2", **_K_SHAPE)
    dequant = tmp_path / "dequantized"
    path = write_gguf(hf_dir, tmp_path / f"model-{qtype}.gguf", qtype, dequant_dir=dequant)
    method = _REQUANTIZED[qtype]
    assert gguf_quantization(path) == method
    model = load_model(path)
    layer = model.layers[0]
    weight_kind = Int4Weight if method == "int4" else Int8Weight
    assert model.quantization == method and isinstance(layer, DecoderLayer)
    assert isinstance(layer.gate_up_weight, weight_kind)
    ids = random_tokens(DEQUANT_ROWS + 24, seed=5)
    reference = stepped_logits(load_model(dequant, dtype="bfloat16"), ids)
    cosine, top1 = logit_agreement(stepped_logits(model, ids), reference)
    print(f"{qtype} -> {method}: vs its weights in bf16 min cosine {cosine:.5f} top-1 {top1:.3f}")
    record_property("min_cosine_vs_file", round(cosine, 5))
    record_property("top1_vs_file", round(top1, 3))
    floors = _REQUANT_FLOORS[method]
    assert cosine >= floors[0] and top1 >= floors[1]


def test_a_q4_k_m_style_mix_runs_as_int4(tmp_path: Path) -> None:
    """llama-quantize's Q4_K_M keeps some tensors in Q6_K: the engine runs the quantization
    most projections map onto, and the Q6_K ones are requantized to it."""
    hf_dir = make_tiny_model(tmp_path / "hf", "llama", **_K_SHAPE)
    dequant = tmp_path / "dequantized"
    mix = {"ffn_down": "Q6_K", "attn_v": "Q6_K"}
    path = write_gguf(hf_dir, tmp_path / "m.gguf", "Q4_K", qtypes=mix, dequant_dir=dequant)
    assert gguf_quantization(path) == "int4"
    model = load_model(path)
    layer = model.layers[0]
    assert isinstance(layer, DecoderLayer) and isinstance(layer.down_weight, Int4Weight)
    ids = random_tokens(40, seed=6)
    reference = stepped_logits(load_model(dequant, dtype="bfloat16"), ids)
    cosine, top1 = logit_agreement(stepped_logits(model, ids), reference)
    assert cosine >= _REQUANT_FLOORS["int4"][0] and top1 >= _REQUANT_FLOORS["int4"][1]
    # Asked for int8, the same file keeps more of what it holds.
    at_int8 = stepped_logits(load_model(path, quantization="int8"), ids)
    assert logit_agreement(at_int8, reference)[0] > max(cosine, 0.98)


def test_a_cut_or_foreign_file_is_a_clear_error(tmp_path: Path) -> None:
    """A truncated download (cut in the header or in the tensor data), an empty file and a
    file that is not GGUF at all: an EngineConfigError saying so, not numpy's IndexError."""
    hf_dir = make_tiny_model(tmp_path / "hf", "qwen2")
    data = write_gguf(hf_dir, tmp_path / "model.gguf", "Q8_0").read_bytes()
    for name, content in (
        ("header.gguf", data[:42]),  # gguf's parser: IndexError
        ("metadata.gguf", data[:600]),
        ("tensors.gguf", data[: len(data) // 2]),
        ("short.gguf", data[:20]),
        ("foreign.gguf", b"not a gguf file at all\n" * 4),
    ):
        path = tmp_path / name
        path.write_bytes(content)
        with pytest.raises(EngineConfigError, match="not a GGUF file, or is truncated or corrupt"):
            load_model(path)
    (tmp_path / "empty.gguf").write_bytes(b"")
    with pytest.raises(EngineConfigError, match="cannot read GGUF file"):
        load_model(tmp_path / "empty.gguf")


def test_a_folder_of_gguf_files_says_to_pick_one(tmp_path: Path) -> None:
    hf_dir = make_tiny_model(tmp_path / "hf", "qwen2")
    folder = tmp_path / "ggufs"
    folder.mkdir()
    write_gguf(hf_dir, folder / "m-q8_0.gguf", "Q8_0")
    write_gguf(hf_dir, folder / "m-q4_0.gguf", "Q4_0")
    with pytest.raises(EngineConfigError, match=r"holds 2 .gguf file\(s\) \(m-q4_0.gguf, m-q8_0"):
        load_model(folder)
    with pytest.raises(EngineConfigError, match="give the file itself"):
        Engine.from_pretrained(folder)


def test_a_split_file_says_to_merge_it(tmp_path: Path) -> None:
    """A shard of a split model (llama.cpp's --split-max-tensors / gguf-split), any of
    them: not "lacks N tensors" but what it is and how to merge it."""
    hf_dir = make_tiny_model(tmp_path / "hf", "qwen2")
    write_gguf(hf_dir, tmp_path / "split" / "m.gguf", "Q8_0", split_max_tensors=10)
    shards = sorted((tmp_path / "split").iterdir())
    assert [s.name for s in shards][0] == "m-00001-of-00003.gguf"
    merge = f"llama-gguf-split --merge {shards[0]} {tmp_path / 'split' / 'm.gguf'}`"
    for number, shard in enumerate(shards, 1):
        with pytest.raises(UnsupportedGGUFError, match=f"shard {number} of 3") as caught:
            Engine.from_pretrained(shard, EngineConfig(num_blocks=32, block_size=4))
        assert merge in str(caught.value)  # the command to run, with this model's names
    # A folder with a space and an upper-case suffix: quoted for the shell, the suffix kept.
    odd = tmp_path / "My Models" / "m-00002-of-00003.GGUF"
    odd.parent.mkdir()
    shutil.copyfile(shards[1], odd)
    with pytest.raises(UnsupportedGGUFError) as caught:
        Engine.from_pretrained(odd, EngineConfig(num_blocks=32, block_size=4))
    first, merged = odd.with_name("m-00001-of-00003.GGUF"), odd.with_name("m.GGUF")
    assert f"--merge '{first}' '{merged}'`" in str(caught.value)
    renamed = tmp_path / "part2.gguf"  # not llama.cpp's name: no made-up first shard
    shutil.copyfile(shards[1], renamed)
    with pytest.raises(UnsupportedGGUFError, match="merge FIRST-SHARD.gguf MERGED.gguf"):
        Engine.from_pretrained(renamed, EngineConfig(num_blocks=32, block_size=4))


def test_an_unusable_tokenizer_fails_before_the_weights_load(tmp_path: Path) -> None:
    """Engine.from_pretrained checks the file's tokenizer first: a file with a Q8_K tensor
    whose tokenizer cannot be rebuilt reports the tokenizer (what to do first), not the
    weights."""
    hf_dir = make_tiny_model(tmp_path / "hf", "qwen2", **_K_SHAPE)
    out = tmp_path / "gguf"
    out.mkdir()
    tokenizer = (_hf_bpe("qwen2"), "deepseek-llm", "")
    mix = {"ffn_up": "Q8_K"}
    path = write_gguf(hf_dir, out / "model.gguf", "Q4_K", qtypes=mix, tokenizer=tokenizer)
    with pytest.raises(UnsupportedGGUFError, match="pre-tokenizer 'deepseek-llm'"):
        Engine.from_pretrained(path, EngineConfig(num_blocks=32, block_size=4))


def test_unsupported_architecture_and_rope(tmp_path: Path) -> None:
    hf_dir = make_tiny_model(tmp_path / "hf", "llama")
    gemma = write_gguf(hf_dir, tmp_path / "gemma.gguf", "F32", arch="gemma")
    with pytest.raises(UnsupportedGGUFError, match="architecture 'gemma'.*llama, qwen2, qwen3"):
        load_model(gemma)
    freqs = {"rope_freqs.weight": np.full(8, 2.0, dtype=np.float32)}
    scaled = write_gguf(hf_dir, tmp_path / "llama3.gguf", "F32", extra=freqs)
    with pytest.raises(UnsupportedGGUFError, match="rope_freqs tensor is not a llama3"):
        load_model(scaled)
    assert issubclass(UnsupportedGGUFError, EngineConfigError)


def test_a_file_without_its_shape_metadata_names_the_missing_keys(tmp_path: Path) -> None:
    hf_dir = make_tiny_model(tmp_path / "hf", "qwen2")
    for dropped in (
        ("qwen2.embedding_length", "qwen2.attention.head_count"),  # was a bare TypeError
        ("qwen2.block_count",),  # was "config.json lacks required field 'num_hidden_layers'"
    ):
        path = write_gguf(hf_dir, tmp_path / f"{len(dropped)}.gguf", "F32", drop_keys=dropped)
        with pytest.raises(UnsupportedGGUFError, match="lacks " + ", ".join(dropped) + ","):
            load_model(path)


def test_a_missing_model_path_says_so(tmp_path: Path) -> None:
    with pytest.raises(EngineConfigError, match="does not exist"):
        load_model(tmp_path / "nope.gguf")
    text = tmp_path / "notes.txt"
    text.write_text("not a model")
    with pytest.raises(EngineConfigError, match="neither a model directory .* nor a .gguf"):
        load_model(text)


def test_engine_serves_a_gguf_file(tmp_path: Path) -> None:
    """Engine.from_pretrained takes the file; a tokenizer.json beside it is its tokenizer."""
    hf_dir = make_tiny_model(tmp_path / "hf", "qwen2")
    out = tmp_path / "gguf"
    out.mkdir()
    path = write_gguf(hf_dir, out / "model.gguf", "Q8_0")
    write_char_tokenizer(out)
    engine = Engine.from_pretrained(path, EngineConfig(num_blocks=32, block_size=4))
    assert engine.tokenizer is not None
    assert engine.model.config.family == "qwen2"


# --- tokenizer ----------------------------------------------------------------------------

_CORPUS = [
    "Hello world! The quick brown fox jumps over the lazy dog 12345 times.",
    "Grüße aus Köln: naïve café, 東京 and Ω≈ç√ — emoji 🙂🚀 too.",
    "def f(x):\n    return x * 2  # 3.14159\n\n\tTabs and  double  spaces",
    "It's they're we've I'm you'll he'd; 2024-12-05 10:42 +0100",
] * 20
_PROBES = [
    "Hello world, it's 2026!",
    "naïve café 東京 🙂 Ω",
    "  leading spaces\n\nand newlines\r\n 1234567 digits",
    "<|im_start|>user\nhi<|im_end|> <tool_call>",
]


def _hf_bpe(pre: str) -> Any:
    """A byte-level BPE tokenizer shaped like Qwen2's (``pre="qwen2"``) or Llama 3's,
    trained on a small corpus."""
    from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers, trainers
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers.models import BPE

    from local_engine.gguf_tokenizer import PRE_TOKENIZERS

    backend = HFTokenizer(BPE(ignore_merges=pre == "llama-bpe"))
    if pre == "qwen2":
        backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRE_TOKENIZERS[pre]), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(_CORPUS, trainer)
    backend.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in ("<|im_start|>", "<|im_end|>")]
    )
    backend.add_tokens([AddedToken("<tool_call>", special=False, normalized=False)])
    return backend


def _write_tokenizer_gguf(backend: Any, pre: str, path: Path, template: str) -> Path:
    """A GGUF file holding only the tokenizer metadata."""
    from gguf import GGUFWriter

    writer = GGUFWriter(path, "qwen2")
    add_tokenizer(writer, backend, pre, template)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("pre", ["qwen2", "llama-bpe"])
def test_tokenizer_from_gguf_matches_hf(tmp_path: Path, pre: str) -> None:

    backend = _hf_bpe(pre)
    template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    path = _write_tokenizer_gguf(backend, pre, tmp_path / "tok.gguf", template)
    tokenizer = load_gguf_tokenizer(path)
    assert tokenizer is not None
    for text in _PROBES:
        expected = backend.encode(text, add_special_tokens=False).ids
        assert tokenizer.encode(text) == expected, text
        assert tokenizer.decode(expected, skip_special_tokens=False) == backend.decode(
            expected, skip_special_tokens=False
        )
    assert tokenizer.eos_token_ids == (backend.token_to_id("<|im_end|>"),)
    assert tokenizer.chat_template == template
    assert backend.token_to_id("<|im_start|>") in tokenizer.special_token_ids


_SPM_PROBES = [
    *_PROBES,
    "",
    " one leading space, two trailing  ",
    "Ünïcödé ✓ 中文字符 🚀🙂 outside the training text",
    "digits 31415926535 and CamelCaseWords",
    "tabs\tand\nnewlines\n\n  indented",
]


def _sentencepiece_model() -> bytes:
    """A small SentencePiece BPE model shaped like Llama 2's (byte fallback, digits split,
    a dummy prefix, whitespace kept as written), trained on the corpus."""
    import io

    import sentencepiece as spm

    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(_CORPUS),
        model_writer=out,
        model_type="bpe",
        vocab_size=420,
        byte_fallback=True,
        split_digits=True,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        add_dummy_prefix=True,
        allow_whitespace_only_pieces=True,
        character_coverage=0.9995,
        hard_vocab_limit=False,
        minloglevel=2,
    )
    return out.getvalue()


def test_sentencepiece_tokenizer_from_gguf_matches_sentencepiece(tmp_path: Path) -> None:
    """A "llama" (SentencePiece BPE) tokenizer rebuilt from a GGUF file's pieces, scores
    and types gives sentencepiece's own ids and text, byte fallback included."""
    pytest.importorskip("sentencepiece")
    import sentencepiece as spm
    from gguf import GGUFWriter

    model = _sentencepiece_model()
    sp = spm.SentencePieceProcessor(model_proto=model)
    path = tmp_path / "spm.gguf"
    writer = GGUFWriter(path, "llama")
    template = "{% for m in messages %}[INST] {{ m['content'] }} [/INST]{% endfor %}"
    add_sentencepiece_tokenizer(writer, model, template)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tokenizer = load_gguf_tokenizer(path)
    assert tokenizer is not None
    fallback = 0
    for text in _SPM_PROBES:
        expected = sp.encode(text)
        assert tokenizer.encode(text) == expected, text
        assert tokenizer.decode(expected) == sp.decode(expected), text
        fallback += sum(sp.is_byte(i) for i in expected)
    assert fallback > 0  # the probes reach characters the model only spells in bytes
    assert tokenizer.encode("hi", add_special_tokens=True) == [sp.bos_id(), *sp.encode("hi")]
    assert tokenizer.bos_token_id == sp.bos_id()
    assert tokenizer.eos_token_ids == (sp.eos_id(),)
    assert tokenizer.chat_template == template
    # Streaming decode, token by token, gives the same text (the dummy prefix dropped once).
    ids = sp.encode(_SPM_PROBES[0])
    assert "".join(tokenizer.token_text(i) for i in ids).removeprefix(" ") == sp.decode(ids)


def test_engine_runs_a_llama_k_quant_file_with_its_sentencepiece_tokenizer(
    tmp_path: Path,
) -> None:
    """What a Llama 2 / Mistral Q4_K_M file is, in small: llama architecture, Q4_K with some
    Q6_K, a SentencePiece tokenizer in the file and nothing beside it. The engine loads it
    alone, encodes a prompt with the file's tokenizer and decodes what it generates."""
    pytest.importorskip("sentencepiece")
    import sentencepiece as spm

    from local_engine.sampler import SamplingParams

    model = _sentencepiece_model()
    sp = spm.SentencePieceProcessor(model_proto=model)
    shape = {**_K_SHAPE, "vocab_size": sp.get_piece_size()}
    hf_dir = make_tiny_model(tmp_path / "hf", "llama", **shape)
    out = tmp_path / "gguf"
    out.mkdir()
    mix = {"ffn_down": "Q6_K", "attn_v": "Q6_K"}
    template = "{% for m in messages %}[INST] {{ m['content'] }} [/INST]{% endfor %}"
    path = write_gguf(hf_dir, out / "m.gguf", "Q4_K", qtypes=mix, sentencepiece=(model, template))
    engine = Engine.from_pretrained(path, EngineConfig(num_blocks=32, block_size=4))
    tokenizer = engine.tokenizer
    assert tokenizer is not None and engine.model.quantization == "int4"
    prompt = tokenizer.encode("[INST] Grüße, 東京 🙂 [/INST]", add_special_tokens=True)
    assert prompt == [sp.bos_id(), *sp.encode("[INST] Grüße, 東京 🙂 [/INST]")]
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    (result,) = engine.generate([prompt], params)
    assert len(result.token_ids) == 6
    assert result.text == sp.decode(result.token_ids)


def test_tokenizer_model_it_cannot_rebuild_names_it(tmp_path: Path) -> None:
    from gguf import GGUFWriter

    path = tmp_path / "t.gguf"
    writer = GGUFWriter(path, "llama")
    writer.add_tokenizer_model("bert")
    writer.add_token_list(["[PAD]", "[UNK]", "hello"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(UnsupportedGGUFError, match="model 'bert'.*'gpt2'.*'llama'.*tokenizer.json"):
        load_gguf_tokenizer(path)


def test_sentencepiece_pieces_without_scores_is_a_clear_error(tmp_path: Path) -> None:
    from gguf import GGUFWriter

    path = tmp_path / "t.gguf"
    writer = GGUFWriter(path, "llama")
    writer.add_tokenizer_model("llama")
    writer.add_token_list(["<unk>", "<s>", "</s>", "\u2581hi"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(EngineConfigError, match="4 pieces but 0 scores.*tokenizer.json"):
        load_gguf_tokenizer(path)


def test_tokenizer_from_gguf_unknown_pre(tmp_path: Path) -> None:

    path = _write_tokenizer_gguf(_hf_bpe("qwen2"), "deepseek-llm", tmp_path / "t.gguf", "")
    with pytest.raises(UnsupportedGGUFError, match="pre-tokenizer 'deepseek-llm'.*llama-bpe"):
        load_gguf_tokenizer(path)


def test_tokenizer_metadata_without_tokens_is_a_clear_error(tmp_path: Path) -> None:
    from gguf import GGUFWriter

    path = tmp_path / "t.gguf"
    writer = GGUFWriter(path, "qwen2")
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(EngineConfigError, match="no tokenizer.ggml.tokens.*tokenizer.json"):
        load_gguf_tokenizer(path)


_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.mark.anyio
async def test_local_backend_chats_with_a_gguf_file_alone(tmp_path: Path) -> None:
    """One .gguf file, nothing beside it: weights, config, tokenizer and chat template."""
    from local_engine import LocalBackend
    from swiftclient import AsyncClient

    backend = _hf_bpe("qwen2")
    vocab = backend.get_vocab_size(with_added_tokens=True)
    hf_dir = make_tiny_model(tmp_path / "hf", "qwen2", vocab_size=vocab, eos_token_id=vocab - 2)
    path = write_gguf(
        hf_dir, tmp_path / "alone" / "model.gguf", "Q8_0", tokenizer=(backend, "qwen2", _TEMPLATE)
    )
    local = LocalBackend(path)
    async with AsyncClient(local) as client:
        completion = await client.chat(
            "Hello", max_tokens=3, temperature=0.0, extra_body={"ignore_eos": True}
        )
        assert local.model_dir == path
    assert completion.usage is not None and completion.usage.completion_tokens == 3


@pytest.mark.anyio
async def test_a_tokenizer_json_beside_the_file_keeps_the_files_chat_template(
    tmp_path: Path,
) -> None:
    """The docs' advice for a tokenizer the engine cannot rebuild: put tokenizer.json beside
    the file. Without a tokenizer_config.json there, the file's own chat template applies
    (before, none did, and every chat failed with "this model has no chat template")."""
    from local_engine import LocalBackend
    from swiftclient import AsyncClient

    backend = _hf_bpe("qwen2")
    vocab = backend.get_vocab_size(with_added_tokens=True)
    hf_dir = make_tiny_model(tmp_path / "hf", "qwen2", vocab_size=vocab, eos_token_id=vocab - 2)
    path = write_gguf(
        hf_dir, tmp_path / "beside" / "model.gguf", "Q8_0", tokenizer=(backend, "qwen2", _TEMPLATE)
    )
    backend.save(str(path.parent / "tokenizer.json"))
    tokenizer = load_gguf_tokenizer(path)
    assert tokenizer is not None and tokenizer.chat_template == _TEMPLATE
    async with AsyncClient(LocalBackend(path)) as client:
        completion = await client.chat(
            "Hello", max_tokens=3, temperature=0.0, extra_body={"ignore_eos": True}
        )
    assert completion.usage is not None and completion.usage.completion_tokens == 3
    # a chat template beside the file is the user's choice: it wins
    (path.parent / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ 1 }}"}))
    tokenizer = load_gguf_tokenizer(path)
    assert tokenizer is not None and tokenizer.chat_template == "{{ 1 }}"
