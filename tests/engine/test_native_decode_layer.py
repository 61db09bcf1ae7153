"""The whole-layer decode call (``swift_decode_layer_bf16``): a decode step of a few bfloat16
rows through every layer in one native call each is bit-identical to the layer-by-layer
path, in its logits and in what it writes to the KV cache, for every family and weight kind
the call takes; other steps take the layer path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from local_engine.attention.native import LINEAR_MAX_ROWS, PagedDecodeKernel
from local_engine.loader import load_model
from local_engine.model import DecoderLayer, DecoderModel
from local_engine.quant import PackedWeight

from .paged import PagedRunner
from .tiny import FAMILIES, make_tiny_model


@pytest.fixture
def native(kernel: PagedDecodeKernel) -> PagedDecodeKernel:
    """The library where it holds the kernels the whole-layer call needs."""
    if not (kernel.bf16_linear and kernel.int8_linear and kernel.vector_activation):
        pytest.skip("this CPU (or compiler) lacks AVX-512 BF16 or VNNI")
    return kernel


def _layer_path(model: DecoderModel) -> DecoderModel:
    """``model`` with the whole-layer call switched off (the layer-by-layer path)."""
    model._native_decode = lambda *args: False  # type: ignore[method-assign]
    return model


def _counting(native: PagedDecodeKernel, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    original = type(native).decode_layer

    def counted(self: PagedDecodeKernel, *args: Any) -> None:
        calls.append(1)
        original(self, *args)

    monkeypatch.setattr(type(native), "decode_layer", counted)
    return calls


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize(
    "load", [{"dtype": "bfloat16"}, {"quantization": "int8"}, {"quantization": "int4"}]
)
def test_whole_layer_decode_is_the_layer_path_bit_for_bit(
    native: PagedDecodeKernel,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    family: str,
    load: dict[str, Any],
) -> None:
    _check_bit_for_bit(native, monkeypatch, make_tiny_model(tmp_path, family), load)


# q 8 x 12 and k, v 12 rows each: a fused q/k/v projection of 120 rows, seven and a half of
# the int4 weights' 16-row groups (k and v each straddle a group boundary)
_ODD_SHAPE = {
    "hidden_size": 64,
    "num_attention_heads": 8,
    "num_key_value_heads": 1,
    "head_dim": 12,
    "intermediate_size": 96,
}


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("load", [{"quantization": "int8"}, {"quantization": "int4"}])
def test_whole_layer_decode_with_rows_not_in_16_row_groups(
    native: PagedDecodeKernel,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    family: str,
    load: dict[str, Any],
) -> None:
    path = make_tiny_model(tmp_path, family, **_ODD_SHAPE)
    layer = load_model(path, **load).layers[0]
    assert isinstance(layer, DecoderLayer) and layer.qkv_weight.shape == (120, 64)
    _check_bit_for_bit(native, monkeypatch, path, load)


def _check_bit_for_bit(
    native: PagedDecodeKernel,
    monkeypatch: pytest.MonkeyPatch,
    path: Path,
    load: dict[str, Any],
) -> None:
    """Decode steps of 3 rows, then 1, through the whole-layer call and the layer path of the
    model at ``path``: the same logits and KV cache, and every step took the call."""
    fused = PagedRunner(load_model(path, **load), block_size=4, num_blocks=64)
    layered = PagedRunner(_layer_path(load_model(path, **load)), block_size=4, num_blocks=64)
    calls = _counting(native, monkeypatch)
    prompts = {"a": list(range(3, 8)), "b": list(range(10, 19)), "c": list(range(20, 33))}
    for runner in (fused, layered):
        runner.step(prompts)  # a prefill: the layer path on both
    assert calls == []
    tokens = {"a": 40, "b": 41, "c": 42}
    for step in range(6):
        chosen = tokens if step % 2 == 0 else {"b": tokens["b"]}  # 3 rows, then 1
        chunk = {seq: [tok] for seq, tok in chosen.items()}
        got, want = fused.step(chunk), layered.step(chunk)
        for seq in chunk:
            assert torch.equal(got[seq], want[seq]), (step, seq)
        tokens = {seq: int(logits[-1].argmax()) for seq, logits in want.items()} | {
            seq: tok for seq, tok in tokens.items() if seq not in want
        }
    layers = len(fused.kv_caches)
    assert len(calls) == 6 * layers  # every decode step took the call
    for ours, theirs in zip(fused.kv_caches, layered.kv_caches, strict=True):
        assert torch.equal(ours, theirs)


def test_other_steps_take_the_layer_path(
    native: PagedDecodeKernel, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    path = make_tiny_model(tmp_path, "qwen2")
    calls = _counting(native, monkeypatch)
    fp32 = PagedRunner(load_model(path), block_size=4, num_blocks=64)
    fp32.step({"a": [3, 4, 5]})
    fp32.step({"a": [6]})  # float32 rows: the layer path
    assert calls == []
    bf16 = PagedRunner(load_model(path, dtype="bfloat16"), block_size=4, num_blocks=256)
    many = {f"s{i}": [3 + i, 4, 5] for i in range(LINEAR_MAX_ROWS + 1)}
    bf16.step(many)
    bf16.step({seq: [7] for seq in many})  # more rows than the call takes
    assert calls == []
    bf16.step({"s0": [8], "s1": [9, 10]})  # a decode row beside a prefill
    assert calls == []
    bf16.step({"s0": [8]})
    assert len(calls) == len(bf16.kv_caches)


def test_a_replaced_weight_is_seen(native: PagedDecodeKernel, tmp_path: Path) -> None:
    path = make_tiny_model(tmp_path, "llama")
    fused = PagedRunner(load_model(path, dtype="bfloat16"), block_size=4, num_blocks=64)
    layered = PagedRunner(
        _layer_path(load_model(path, dtype="bfloat16")), block_size=4, num_blocks=64
    )
    for runner in (fused, layered):
        runner.step({"a": [3, 4, 5]})
        runner.step({"a": [6]})
        layer = runner.model.layers[0]
        weight = layer.o_weight
        dense = weight.dequantize() if isinstance(weight, PackedWeight) else weight.detach()
        layer.o_weight = torch.nn.Parameter(dense * 2, requires_grad=False)
    assert torch.equal(fused.step({"a": [7]})["a"], layered.step({"a": [7]})["a"])
