"""Int8 weight-only quantization and bfloat16: numerics against float32, and the option's
plumbing (EngineConfig, load_model, LocalBackend)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from local_engine import LocalBackend, weight_rows
from local_engine.engine import Engine, EngineConfig
from local_engine.errors import EngineConfigError
from local_engine.fp8 import Fp8Weight
from local_engine.loader import load_model
from local_engine.model import PACKED_WEIGHTS_ENV, DecoderLayer
from local_engine.quant import (
    DEQUANT_ROWS,
    INT4_BLOCK,
    INT4_GROUP,
    DequantScratch,
    Int4Weight,
    Int8Weight,
    check_quantization,
    deinterleave_int4,
    dequantize_int4,
    int4_blocks,
    interleave_int4,
    quantize_int4_rows,
    quantize_rows,
)
from local_engine.sampling_params import SamplingParams
from swiftclient.errors import ConfigurationError

from .paged import random_tokens, stepped_logits
from .tiny import FAMILIES, make_tiny_model

COSINE_FLOOR = 0.99
TOP1_FLOOR = 0.8  # measured 0.9-1.0 on every family; the floor catches a broken path
# int4 against float32 on these random-weight models: min cosine 0.88-0.91, top-1 0.56-0.74
# (4-bit codes of Gaussian weights carry about 9% error per matmul, and random models
# amplify it); the floors catch a broken path, and the exactness of the int4 path is held
# by test_int4_logits_are_its_dequantized_weights below.
INT4_FLOORS = (0.8, 0.4)


def _logits(path: Path, ids: list[int], **load: object) -> torch.Tensor:
    """Float32 logits of every position: one prefill longer than DEQUANT_ROWS (the
    dequantize-then-matmul path), then one decode step per token (the fused int8 kernel)."""
    return stepped_logits(load_model(path, **load), ids)  # type: ignore[arg-type]


@pytest.fixture(scope="module", params=FAMILIES)
def family_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    family = str(request.param)
    return make_tiny_model(tmp_path_factory.mktemp(family), family)


@pytest.mark.parametrize(
    "load",
    [{"dtype": "bfloat16"}, {"quantization": "int8"}, {"quantization": "int4"}],
    ids=["bf16", "int8", "int4"],
)
def test_logits_close_to_float32(
    family_dir: Path, load: dict[str, object], record_property: pytest.RecordProperty
) -> None:
    ids = random_tokens(DEQUANT_ROWS + 24, seed=5)
    reference = _logits(family_dir, ids)
    ours = _logits(family_dir, ids, **load)
    cosine = F.cosine_similarity(ours, reference, dim=-1)
    top1 = (ours.argmax(-1) == reference.argmax(-1)).float().mean().item()
    record_property("min_cosine", round(cosine.min().item(), 5))
    record_property("top1_agreement", round(top1, 3))
    print(f"{family_dir.name} {load}: min cosine {cosine.min():.5f}, top-1 agreement {top1:.3f}")
    cosine_floor, top1_floor = (
        INT4_FLOORS
        if load.get("quantization") == "int4"
        else (
            COSINE_FLOOR,
            TOP1_FLOOR,
        )
    )
    assert cosine.min().item() >= cosine_floor
    assert top1 >= top1_floor


# head_dim 12, 8 heads, 1 KV head: a fused q/k/v projection of 120 rows (k's and v's rows
# straddle the int4 weights' 16-row groups, the last group half padding)
_ODD_SHAPE = {"num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 12}


@pytest.mark.parametrize("shape", [{}, _ODD_SHAPE], ids=["default", "odd-rows"])
def test_int4_logits_are_its_dequantized_weights(
    tmp_path: Path, shape: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An int4 model computes what a bfloat16 model holding its dequantized weights computes
    (up to the decode kernel's quantized activations and bfloat16 rounding)."""
    path = make_tiny_model(tmp_path, "qwen2", **shape)
    ids = random_tokens(DEQUANT_ROWS + 24, seed=6)
    int4 = load_model(path, quantization="int4")
    monkeypatch.setenv(PACKED_WEIGHTS_ENV, "0")  # row-major weights to copy into
    dense = load_model(path, dtype="bfloat16")
    for q, d in zip(int4.layers, dense.layers, strict=True):
        assert isinstance(q, DecoderLayer) and isinstance(d, DecoderLayer)
        for name in ("qkv_weight", "o_weight", "gate_up_weight", "down_weight"):
            weight = getattr(q, name)
            assert isinstance(weight, Int4Weight)
            getattr(d, name).copy_(weight.dequantize())
    ours = stepped_logits(int4, ids)
    reference = stepped_logits(dense, ids)
    cosine = F.cosine_similarity(ours, reference, dim=-1)
    assert cosine.min().item() >= 0.995
    assert (ours.argmax(-1) == reference.argmax(-1)).float().mean().item() >= 0.9


def test_int8_model_holds_int8_projections(tmp_path: Path) -> None:
    untied = load_model(make_tiny_model(tmp_path / "u", "qwen3"), quantization="int8")
    assert untied.dtype == torch.bfloat16  # a float32 checkpoint: activations in bfloat16
    layer = untied.layers[0]
    assert isinstance(layer, DecoderLayer)
    for weight in (layer.qkv_weight, layer.o_weight, layer.gate_up_weight, layer.down_weight):
        assert isinstance(weight, Int8Weight)
        assert weight.qweight.dtype == torch.int8
    assert isinstance(untied.lm_head, Int8Weight)
    tied_dir = make_tiny_model(tmp_path / "t", "llama", tie_word_embeddings=True)
    tied = load_model(tied_dir, quantization="int8", dtype="float16")
    assert tied.dtype == torch.float16
    # the embedding lookup keeps its table dense; the head is an int8 copy of it
    assert isinstance(tied.lm_head, Int8Weight) and tied.embed_tokens.dtype == torch.float16
    codes, scales = quantize_rows(tied.embed_tokens, torch.float16)
    assert torch.equal(tied.lm_head.qweight, codes) and torch.equal(tied.lm_head.scales, scales)


def test_loaded_codes_and_scales_match_the_checkpoint_rows(tmp_path: Path) -> None:
    path = make_tiny_model(tmp_path, "qwen2")
    dense = load_model(path)
    quant = load_model(path, quantization="int8")
    for d, q in zip(dense.layers, quant.layers, strict=True):
        assert isinstance(d, DecoderLayer) and isinstance(q, DecoderLayer)
        for name in ("qkv_weight", "o_weight", "gate_up_weight", "down_weight"):
            weight, int8 = getattr(d, name), getattr(q, name)
            assert isinstance(int8, Int8Weight)
            codes, scales = quantize_rows(weight, torch.bfloat16)
            assert torch.equal(int8.qweight, codes), name
            assert torch.equal(int8.scales, scales), name


def test_quantize_rows_round_trip() -> None:
    weight = torch.randn(40, 64) * torch.linspace(0.01, 3.0, 40).unsqueeze(1)
    weight[7] = 0.0
    codes, scales = quantize_rows(weight, torch.float32)
    assert codes.dtype == torch.int8 and scales.shape == (40,)
    assert codes.abs().max().item() == 127
    assert scales[7].item() == 1.0 and not codes[7].any()
    error = (codes.float() * scales.unsqueeze(1) - weight).abs()
    assert (error <= scales.unsqueeze(1) / 2 + 1e-6).all()


@pytest.mark.parametrize("rows", [1, 5, DEQUANT_ROWS, DEQUANT_ROWS + 1, 200])
@pytest.mark.parametrize("in_features", [64, 24])  # 24: not a multiple of 16, dense path
def test_int8_linear_matches_its_dequantized_weight(rows: int, in_features: int) -> None:
    torch.manual_seed(rows)
    dense = torch.randn(48, in_features)
    weight = Int8Weight(
        48, in_features, dtype=torch.bfloat16, device=torch.device("cpu"), scratch=DequantScratch()
    )
    weight.rows(0, 48).copy_(dense)
    bias = torch.randn(48).to(torch.bfloat16)
    x = torch.randn(rows, in_features).to(torch.bfloat16)
    expected = x.float() @ weight.dequantize().float().t() + bias.float()
    out = weight.linear(x, bias)
    assert out.dtype == torch.bfloat16 and out.shape == (rows, 48)
    torch.testing.assert_close(out.float(), expected, atol=0.1, rtol=0.02)


@pytest.mark.parametrize("fmt", ["int8", "int4", "fp8"])
def test_rows_are_quantized_a_block_at_a_time_with_the_same_result(
    fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Loading quantizes a few rows at a time (no full-precision copy of a large matrix is
    held), and the codes and scales are those of quantizing every row at once."""
    torch.manual_seed(3)
    dense = torch.randn(48, 32).to(torch.bfloat16)

    def load(chunk_values: int) -> tuple[Int8Weight | Int4Weight | Fp8Weight, list[int]]:
        monkeypatch.setattr(weight_rows, "CHUNK_VALUES", chunk_values)
        weight: Int8Weight | Int4Weight | Fp8Weight
        if fmt in ("int8", "int4"):
            kind = Int8Weight if fmt == "int8" else Int4Weight
            weight = kind(
                48, 32, dtype=torch.bfloat16, device=torch.device("cpu"), scratch=DequantScratch()
            )
        else:
            weight = Fp8Weight(48, 32, device=torch.device("cpu"))
        target = weight.rows(3, 48)
        seen: list[int] = []
        quantize = target.quantize

        def recording(src: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            seen.append(src.shape[0])
            return quantize(src)

        target.quantize = recording  # type: ignore[method-assign]
        target.copy_(dense[3:])
        return weight, seen

    whole, whole_blocks = load(1 << 22)
    blocked, blocks = load(7 * 32)  # 7 rows at a time; int4: whole 16-row groups
    assert whole_blocks == [45]
    assert blocks == ([16, 16, 13] if fmt == "int4" else [7] * 6 + [3])
    # int4 storage rows are 16-row groups (zeros where never written); the others' rows 0-2
    # were never written
    first = 0 if fmt == "int4" else 3
    assert torch.equal(
        blocked.qweight[first:].view(torch.uint8), whole.qweight[first:].view(torch.uint8)
    )
    assert torch.equal(blocked.scales[first:], whole.scales[first:])


def test_int8_linear_rejects_other_inputs() -> None:
    weight = Int8Weight(
        16, 32, dtype=torch.bfloat16, device=torch.device("cpu"), scratch=DequantScratch()
    )
    with pytest.raises(EngineConfigError, match="bfloat16"):
        weight.linear(torch.randn(2, 32))
    with pytest.raises(EngineConfigError, match="2-D"):
        weight.linear(torch.randn(1, 2, 32).to(torch.bfloat16))
    with pytest.raises(EngineConfigError, match="expected a"):
        weight.rows(0, 8).copy_(torch.randn(4, 32))


@pytest.mark.parametrize("method", ["int8", "int4"])
def test_engine_generates_quantized(tmp_path: Path, method: str) -> None:
    path = make_tiny_model(tmp_path, "qwen3")
    engine = Engine.from_pretrained(path, EngineConfig(num_blocks=64, quantization=method))  # type: ignore[arg-type]
    assert engine.model.quantization == method
    prompts = [random_tokens(n, seed=n) for n in (3, 9, 80)]
    results = engine.generate(prompts, SamplingParams(max_tokens=6, ignore_eos=True))
    assert [len(r.token_ids) for r in results] == [6, 6, 6]


@pytest.mark.parametrize("bad", ["int3", "INT8", 8, ""])
def test_bad_quantization_is_a_configuration_error(bad: object, tmp_path: Path) -> None:
    with pytest.raises(EngineConfigError, match="quantization"):
        check_quantization(bad)
    with pytest.raises(EngineConfigError, match="quantization"):
        EngineConfig(quantization=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="quantization"):  # swiftclient's, from the adapter
        LocalBackend(quantization=bad)  # type: ignore[arg-type]


def test_int8_with_float32_activations_is_refused(tmp_path: Path) -> None:
    path = make_tiny_model(tmp_path, "llama")
    with pytest.raises(EngineConfigError, match="bfloat16 or float16"):
        load_model(path, dtype="float32", quantization="int8")
    with pytest.raises(EngineConfigError, match="quantization"):
        load_model(path, quantization="fp8")  # type: ignore[arg-type]


def test_int4_model_holds_int4_projections_and_an_int8_head(tmp_path: Path) -> None:
    untied = load_model(make_tiny_model(tmp_path / "u", "qwen3"), quantization="int4")
    layer = untied.layers[0]
    assert isinstance(layer, DecoderLayer)
    for weight in (layer.qkv_weight, layer.o_weight, layer.gate_up_weight, layer.down_weight):
        assert isinstance(weight, Int4Weight)
        assert weight.qweight.dtype == torch.uint8
        rows, cols = weight.shape
        padded = -(-rows // INT4_GROUP) * INT4_GROUP  # in 16-row groups
        assert weight.qweight.shape == (padded, cols // 2)
        assert weight.scales.shape == (padded, cols // INT4_BLOCK)
    assert isinstance(untied.lm_head, Int8Weight)  # the head picks the tokens: 8 bits


@pytest.mark.parametrize("cols", [64, 96, 32])
def test_int4_round_trip(cols: int) -> None:
    torch.manual_seed(cols)
    weight = torch.randn(6, cols) * torch.linspace(0.01, 3.0, 6).unsqueeze(1)
    weight[2, :32] = 0.0  # an all-zero block
    packed, grouped = quantize_int4_rows(weight, torch.float32)
    assert packed.dtype == torch.uint8 and packed.shape == (16, cols // 2)  # 6 rows padded
    assert grouped.shape == (16, cols // 32)
    stored, scales = deinterleave_int4(packed, grouped)
    assert scales[2, 0].item() == 0.0 and not scales[6:].any() and not stored[6:].any()
    restored = dequantize_int4(packed, grouped, rows=6)
    assert restored.shape == (6, cols)
    step = scales[:6].abs().repeat_interleave(32, dim=1)
    # round to nearest, but the block's value opposite its largest one may clamp at +7
    assert ((restored - weight).abs() <= step + 1e-6).all()
    assert ((restored - weight).abs() <= step / 2 + 1e-6).float().mean().item() > 0.97
    # the largest magnitude in each block is exact: it is -8 * scale
    blocks = weight.view(6, -1, 32)
    extreme = blocks.gather(-1, blocks.abs().argmax(-1, keepdim=True)).squeeze(-1)
    assert torch.allclose(
        restored.view(6, -1, 32).gather(-1, blocks.abs().argmax(-1, keepdim=True)).squeeze(-1),
        extreme,
        rtol=1e-6,
    )


def test_int4_layout_keeps_16_rows_together() -> None:
    torch.manual_seed(0)
    rows, cols = 20, 96  # a second, partial group of 4 rows; 3 blocks
    stored = torch.randint(0, 16, (rows, cols), dtype=torch.uint8)
    block_scales = torch.arange(rows * 3, dtype=torch.float32).view(rows, 3) + 1
    packed, grouped = interleave_int4(stored, block_scales)
    assert packed.shape == (32, cols // 2) and grouped.shape == (32, 3)
    flat, flat_scales = packed.reshape(-1), grouped.reshape(-1)
    for r in range(rows):
        g, i = divmod(r, 16)
        for b in range(3):
            base = (g * 3 + b) * 256
            # the row's 16 bytes of the block, slice after slice, are q4_0's: byte jj holds
            # value jj in its low nibble and value jj + 16 in its high one
            row_bytes = [flat[base + m * 64 + i * 4 + j].item() for m in range(4) for j in range(4)]
            block = stored[r, b * 32 : (b + 1) * 32].tolist()
            assert [v & 15 for v in row_bytes] == block[:16]
            assert [v >> 4 for v in row_bytes] == block[16:]
            assert flat_scales[(g * 3 + b) * 16 + i].item() == block_scales[r, b].item()
    assert not flat[(3 * 256) + 0 :].view(3, 4, 16, 4)[:, :, 4:].any()  # padding rows
    back, back_scales = deinterleave_int4(packed, grouped)
    assert torch.equal(back[:rows], stored) and torch.equal(back_scales[:rows], block_scales)


def test_int4_rows_written_in_pieces_match_one_write() -> None:
    torch.manual_seed(1)
    dense = torch.randn(37, 64)
    whole = Int4Weight(
        37, 64, dtype=torch.bfloat16, device=torch.device("cpu"), scratch=DequantScratch()
    )
    whole.rows(0, 37).copy_(dense)
    pieces = Int4Weight(
        37, 64, dtype=torch.bfloat16, device=torch.device("cpu"), scratch=DequantScratch()
    )
    for start, stop in ((20, 37), (0, 5), (5, 20)):  # unaligned, out of order
        pieces.rows(start, stop).copy_(dense[start:stop])
    assert torch.equal(whole.qweight, pieces.qweight)
    assert torch.equal(whole.scales, pieces.scales)
    stored, scales = int4_blocks(dense[3:9], torch.bfloat16)
    pieces.rows(3, 9).write(stored, scales)
    assert torch.equal(whole.qweight, pieces.qweight)
    with pytest.raises(EngineConfigError, match="expected int4 codes"):
        pieces.rows(3, 9).write(stored[:5], scales)
    with pytest.raises(EngineConfigError, match="0..15"):
        pieces.rows(3, 9).write(stored + 16, scales)


def test_int4_rows_past_the_weight_are_refused() -> None:
    """The padding rows of the last group are storage, not rows: a target reaching into them
    is an error (as a slice past an int8 weight's rows is), not a silent write."""
    weight = Int4Weight(
        50, 96, dtype=torch.bfloat16, device=torch.device("cpu"), scratch=DequantScratch()
    )
    for start, stop in ((48, 52), (50, 51), (45, 70), (-1, 3), (5, 4)):
        with pytest.raises(EngineConfigError, match="rows"):
            weight.rows(start, stop).copy_(torch.randn(max(stop - start, 0), 96))
    assert not weight.qweight.any() and not weight.scales.any()
    weight.rows(48, 50).copy_(torch.randn(2, 96))  # the last rows themselves are fine


def test_int4_needs_in_features_in_blocks_of_32() -> None:
    with pytest.raises(EngineConfigError, match="divisible by 32"):
        Int4Weight(
            8, 48, dtype=torch.bfloat16, device=torch.device("cpu"), scratch=DequantScratch()
        )
    with pytest.raises(EngineConfigError, match="divisible by 32"):
        quantize_int4_rows(torch.randn(4, 40), torch.bfloat16)


@pytest.mark.parametrize("rows", [1, 5, DEQUANT_ROWS + 1])
def test_int4_linear_matches_its_dequantized_weight(rows: int) -> None:
    torch.manual_seed(rows)
    dense = torch.randn(48, 96)
    weight = Int4Weight(
        48, 96, dtype=torch.bfloat16, device=torch.device("cpu"), scratch=DequantScratch()
    )
    weight.rows(0, 48).copy_(dense)
    bias = torch.randn(48).to(torch.bfloat16)
    x = torch.randn(rows, 96).to(torch.bfloat16)
    expected = x.float() @ weight.dequantize().float().t() + bias.float()
    out = weight.linear(x, bias)
    assert out.dtype == torch.bfloat16 and out.shape == (rows, 48)
    torch.testing.assert_close(out.float(), expected, atol=0.1, rtol=0.02)
