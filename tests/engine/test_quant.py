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
from local_engine.model import DecoderLayer
from local_engine.quant import (
    DEQUANT_ROWS,
    DequantScratch,
    Int8Weight,
    check_quantization,
    quantize_rows,
)
from local_engine.sampling_params import SamplingParams
from swiftclient.errors import ConfigurationError

from .paged import PagedRunner
from .tiny import FAMILIES, make_tiny_model

COSINE_FLOOR = 0.99
TOP1_FLOOR = 0.8  # measured 0.9-1.0 on every family; the floor catches a broken path


def _tokens(n: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, 256, (n,), generator=gen).tolist()


def _logits(path: Path, ids: list[int], **load: object) -> torch.Tensor:
    """Float32 logits of every position: one prefill longer than DEQUANT_ROWS (the
    dequantize-then-matmul path), then one decode step per token (the fused int8 kernel)."""
    model = load_model(path, **load)  # type: ignore[arg-type]
    runner = PagedRunner(model, block_size=4, num_blocks=64)
    split = DEQUANT_ROWS + 8
    steps = [runner.step({"a": ids[:split]})["a"]]
    steps += [runner.step({"a": [tok]})["a"] for tok in ids[split:]]
    return torch.cat(steps)


@pytest.fixture(scope="module", params=FAMILIES)
def family_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    family = str(request.param)
    return make_tiny_model(tmp_path_factory.mktemp(family), family)


@pytest.mark.parametrize(
    "load",
    [{"dtype": "bfloat16"}, {"quantization": "int8"}],
    ids=["bf16", "int8"],
)
def test_logits_close_to_float32(
    family_dir: Path, load: dict[str, object], record_property: pytest.RecordProperty
) -> None:
    ids = _tokens(DEQUANT_ROWS + 24, seed=5)
    reference = _logits(family_dir, ids)
    ours = _logits(family_dir, ids, **load)
    cosine = F.cosine_similarity(ours, reference, dim=-1)
    top1 = (ours.argmax(-1) == reference.argmax(-1)).float().mean().item()
    record_property("min_cosine", round(cosine.min().item(), 5))
    record_property("top1_agreement", round(top1, 3))
    print(f"{family_dir.name} {load}: min cosine {cosine.min():.5f}, top-1 agreement {top1:.3f}")
    assert cosine.min().item() >= COSINE_FLOOR
    assert top1 >= TOP1_FLOOR


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
    assert tied.lm_head is tied.embed_tokens  # the embedding lookup keeps it dense


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


@pytest.mark.parametrize("fmt", ["int8", "fp8"])
def test_rows_are_quantized_a_block_at_a_time_with_the_same_result(
    fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Loading quantizes a few rows at a time (no full-precision copy of a large matrix is
    held), and the codes and scales are those of quantizing every row at once."""
    torch.manual_seed(3)
    dense = torch.randn(48, 32).to(torch.bfloat16)

    def load(chunk_values: int) -> tuple[Int8Weight | Fp8Weight, list[int]]:
        monkeypatch.setattr(weight_rows, "CHUNK_VALUES", chunk_values)
        weight: Int8Weight | Fp8Weight
        if fmt == "int8":
            weight = Int8Weight(
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
    blocked, blocks = load(7 * 32)  # 7 rows at a time
    assert whole_blocks == [45] and blocks == [7] * 6 + [3]
    assert torch.equal(blocked.qweight[3:].view(torch.uint8), whole.qweight[3:].view(torch.uint8))
    assert torch.equal(blocked.scales[3:], whole.scales[3:])


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


def test_engine_generates_with_int8(tmp_path: Path) -> None:
    path = make_tiny_model(tmp_path, "qwen3")
    engine = Engine.from_pretrained(path, EngineConfig(num_blocks=64, quantization="int8"))
    assert engine.model.quantization == "int8"
    prompts = [_tokens(n, seed=n) for n in (3, 9, 80)]
    results = engine.generate(prompts, SamplingParams(max_tokens=6, ignore_eos=True))
    assert [len(r.token_ids) for r in results] == [6, 6, 6]


@pytest.mark.parametrize("bad", ["int4", "INT8", 8, ""])
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
