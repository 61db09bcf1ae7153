"""Loading GPTQ 4-bit checkpoints: the symmetric format onto int4 exactly (groups of 32, 64
and 128), asymmetric and act-order ones requantized, clear errors for AWQ and other bit
widths. The checkpoints are written here in GPTQ's layout (AutoGPTQ's ``QuantLinear.pack``:
codes packed 8 to an int32 along the inputs, zero points along the outputs, stored minus 1)
by round-to-nearest, which is GPTQ's storage without its error-compensating search."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from local_engine.errors import EngineConfigError
from local_engine.gptq import UnsupportedCheckpointError
from local_engine.loader import load_model
from local_engine.model import DecoderLayer
from local_engine.quant import (
    DEQUANT_ROWS,
    Int4Weight,
    Int8Weight,
    dequantize_int4,
    quantize_rows,
)

from .paged import logit_agreement, random_tokens, stepped_logits
from .tiny import make_tiny_model

_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_SHAPE = {"hidden_size": 128, "intermediate_size": 256}  # in-features 128 and 256: g=128 fits


def _pack(codes: np.ndarray, axis: int) -> np.ndarray:
    """Pack 4-bit values 8 to a word along ``axis`` (lowest bits first) as int32."""
    moved = np.moveaxis(codes.astype(np.uint32), axis, 0)
    words = np.zeros((moved.shape[0] // 8, *moved.shape[1:]), dtype=np.uint32)
    for j in range(8):
        words |= moved[j::8] << np.uint32(4 * j)
    return np.ascontiguousarray(np.moveaxis(words, 0, axis)).view(np.int32)


def _quantize(
    w: torch.Tensor, group: int, *, sym: bool, act_order: bool
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """GPTQ tensors for ``w [N, K]`` and the float32 weight they stand for."""
    n, k = w.shape
    g_idx = torch.arange(k) // group
    if act_order:  # act-order: groups follow a permutation of the inputs
        g_idx = g_idx[torch.randperm(k, generator=torch.Generator().manual_seed(n + k))]
    groups = k // group
    scales = torch.empty(groups, n)
    zeros = torch.empty(groups, n, dtype=torch.int64)
    for gi in range(groups):
        cols = w[:, g_idx == gi]
        if sym:
            xmax = cols.abs().amax(dim=1)
            scale, zero = (2 * xmax / 15).half().float(), torch.full((n,), 8)
        else:
            lo, hi = cols.amin(dim=1).clamp(max=0), cols.amax(dim=1).clamp(min=0)
            scale = ((hi - lo) / 15).half().float()
            zero = torch.round(-lo / scale).to(torch.int64).clamp(0, 15)
        scales[gi], zeros[gi] = scale, zero
    s, z = scales[g_idx].t(), zeros[g_idx].t()  # [N, K]
    codes = torch.clamp(torch.round(w / s) + z, 0, 15).to(torch.int64)
    tensors = {
        "qweight": torch.from_numpy(_pack(codes.t().numpy(), 0)),
        "qzeros": torch.from_numpy(_pack((zeros - 1).clamp(min=0).numpy(), 1)),
        "scales": scales.half(),
        "g_idx": g_idx.to(torch.int32),
    }
    return tensors, (codes - z).float() * s


def _write_gptq(
    hf_dir: Path, out: Path, group: int, *, sym: bool = True, act_order: bool = False
) -> Path:
    """``out``: ``hf_dir`` as a GPTQ checkpoint; ``out / "dequantized"``: its weights dense."""
    weights = load_file(hf_dir / "model.safetensors")
    stored, dense = {}, {}
    for name, value in weights.items():
        parts = name.split(".")
        if len(parts) > 2 and parts[-2] in _PROJECTIONS and parts[-1] == "weight":
            prefix = name[: -len(".weight")]
            tensors, back = _quantize(value.float(), group, sym=sym, act_order=act_order)
            stored.update({f"{prefix}.{key}": t for key, t in tensors.items()})
            dense[name] = back
        else:
            stored[name] = dense[name] = value
    config = json.loads((hf_dir / "config.json").read_text())
    for root, tensors, quantized in ((out, stored, True), (out / "dequantized", dense, False)):
        root.mkdir(parents=True)
        save_file(tensors, root / "model.safetensors")
        if quantized:
            config["quantization_config"] = {
                "quant_method": "gptq",
                "bits": 4,
                "group_size": group,
                "sym": sym,
                "desc_act": act_order,
            }
        else:
            config.pop("quantization_config", None)
        (root / "config.json").write_text(json.dumps(config))
    return out


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "llama"])
@pytest.mark.parametrize("group", [32, 128])
def test_symmetric_gptq_loads_exactly(tmp_path: Path, family: str, group: int) -> None:
    hf_dir = make_tiny_model(tmp_path / "hf", family, **_SHAPE)
    path = _write_gptq(hf_dir, tmp_path / "gptq", group)
    model = load_model(path, dtype="float16")
    reference = load_model(path / "dequantized", dtype="float32")
    for ours, ref in zip(model.layers, reference.layers, strict=True):
        assert isinstance(ours, DecoderLayer) and isinstance(ref, DecoderLayer)
        for name in ("qkv_weight", "o_weight", "gate_up_weight", "down_weight"):
            weight, expected = getattr(ours, name), getattr(ref, name)
            assert isinstance(weight, Int4Weight) and isinstance(expected, torch.Tensor)
            got = dequantize_int4(weight.qweight, weight.scales.float(), rows=weight.out_features)
            torch.testing.assert_close(got, expected, rtol=0, atol=0)  # fp16 scales: exact


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "llama"])
def test_gptq_logits(tmp_path: Path, family: str, record_property: pytest.RecordProperty) -> None:
    hf_dir = make_tiny_model(tmp_path / "hf", family, **_SHAPE)
    path = _write_gptq(hf_dir, tmp_path / "gptq", 128)
    ids = random_tokens(DEQUANT_ROWS + 24, seed=7)
    model = load_model(path)
    assert model.dtype == torch.bfloat16 and model.quantization == "int4"
    ours = stepped_logits(model, ids)
    vs_hf = logit_agreement(ours, stepped_logits(load_model(hf_dir), ids))
    vs_own = logit_agreement(
        ours, stepped_logits(load_model(path / "dequantized", dtype="bfloat16"), ids)
    )
    print(
        f"{family} GPTQ g=128: vs float32 HF min cosine {vs_hf[0]:.5f} top-1 {vs_hf[1]:.3f}; "
        f"vs its own weights in bf16 min cosine {vs_own[0]:.5f} top-1 {vs_own[1]:.3f}"
    )
    record_property("min_cosine_vs_hf", round(vs_hf[0], 5))
    record_property("min_cosine_vs_own", round(vs_own[0], 5))
    assert vs_own[0] >= 0.99 and vs_own[1] >= 0.8
    assert vs_hf[0] >= 0.8 and vs_hf[1] >= 0.4  # 4-bit on random weights: see test_quant.py


def test_tied_gptq_gets_an_int8_copy_of_its_embeddings_as_head(tmp_path: Path) -> None:
    hf_dir = make_tiny_model(tmp_path / "hf", "qwen2", tie_word_embeddings=True, **_SHAPE)
    path = _write_gptq(hf_dir, tmp_path / "gptq", 32)
    model = load_model(path)
    assert isinstance(model.lm_head, Int8Weight)
    codes, scales = quantize_rows(model.embed_tokens, model.dtype)
    assert torch.equal(model.lm_head.qweight, codes)
    assert torch.equal(model.lm_head.scales, scales)
    ids = random_tokens(24, seed=3)
    reference = stepped_logits(load_model(path / "dequantized"), ids)
    cosine, top1 = logit_agreement(stepped_logits(model, ids), reference)
    assert cosine >= 0.99 and top1 >= 0.8


@pytest.mark.parametrize(("sym", "act_order"), [(False, False), (True, True)])
def test_other_gptq_layouts_are_requantized(tmp_path: Path, sym: bool, act_order: bool) -> None:
    """Asymmetric zero points or act-order groups do not fit the int4 blocks: the weights
    are dequantized and requantized, a rounding that stays close."""
    hf_dir = make_tiny_model(tmp_path / "hf", "qwen2", **_SHAPE)
    path = _write_gptq(hf_dir, tmp_path / "gptq", 32, sym=sym, act_order=act_order)
    model = load_model(path)
    layer = model.layers[0]
    assert isinstance(layer, DecoderLayer) and isinstance(layer.qkv_weight, Int4Weight)
    ids = random_tokens(DEQUANT_ROWS + 8, seed=8)
    own = logit_agreement(
        stepped_logits(model, ids),
        stepped_logits(load_model(path / "dequantized", dtype="bfloat16"), ids),
    )
    print(f"GPTQ sym={sym} act_order={act_order}, requantized: vs its own weights {own}")
    assert own[0] >= 0.9


def test_gptq_to_int8(tmp_path: Path) -> None:
    hf_dir = make_tiny_model(tmp_path / "hf", "llama", **_SHAPE)
    path = _write_gptq(hf_dir, tmp_path / "gptq", 64)
    layer = load_model(path, quantization="int8").layers[0]
    assert isinstance(layer, DecoderLayer) and isinstance(layer.down_weight, Int8Weight)


def test_unsupported_quantization_configs(tmp_path: Path) -> None:
    hf_dir = make_tiny_model(tmp_path / "hf", "qwen2")
    config = json.loads((hf_dir / "config.json").read_text())
    for qconfig, match in (
        ({"quant_method": "awq", "bits": 4, "group_size": 128}, "quant_method 'awq'.*AWQ"),
        ({"quant_method": "gptq", "bits": 8, "group_size": 128}, "bits=8"),
        ({"quant_method": "bitsandbytes"}, "quant_method 'bitsandbytes'"),
    ):
        config["quantization_config"] = qconfig
        (hf_dir / "config.json").write_text(json.dumps(config))
        with pytest.raises(UnsupportedCheckpointError, match=match):
            load_model(hf_dir)
    assert issubclass(UnsupportedCheckpointError, EngineConfigError)


def test_a_g_idx_of_the_wrong_length_is_a_clear_error(tmp_path: Path) -> None:
    """Not torch's "shape '[4, 32]' is invalid for input of size 127"."""
    hf_dir = make_tiny_model(tmp_path / "hf", "qwen2")
    out = _write_gptq(hf_dir, tmp_path / "gptq", 32)
    tensors = load_file(out / "model.safetensors")
    name = next(name for name in tensors if name.endswith(".g_idx"))
    tensors[name] = tensors[name][:-1].contiguous()
    save_file(tensors, out / "model.safetensors")
    with pytest.raises(EngineConfigError, match=r"g_idx has shape \(127,\), expected \(128,\)"):
        load_model(out)
