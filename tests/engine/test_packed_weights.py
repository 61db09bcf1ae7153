"""bfloat16 weights in the packed layout: the kernel equals torch's matmul up to the last
bfloat16 rounding for every row count, the layout round-trips, a loaded bfloat16 CPU model
packs its projections (and gives the logits it gave row-major), and the switch keeps them
row-major."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from local_engine.attention.native import PACK_ROWS, KernelError, PagedDecodeKernel
from local_engine.errors import EngineConfigError
from local_engine.loader import load_model
from local_engine.model import PACKED_WEIGHTS_ENV, DecoderModel
from local_engine.quant import PackedWeight, linear

from .paged import PagedRunner, random_tokens
from .tiny import make_tiny_model


@pytest.fixture
def packed_kernel(kernel: PagedDecodeKernel) -> PagedDecodeKernel:
    """The library where it holds the packed kernel (AVX-512 BF16)."""
    if not kernel.packed_linear:
        pytest.skip("this CPU (or compiler) has no AVX-512 BF16")
    return kernel


def _inputs(rows: int, n: int, k: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g).to(torch.bfloat16)
    weight = (0.1 * torch.randn(n, k, generator=g)).to(torch.bfloat16)
    bias = torch.randn(n, generator=g).to(torch.bfloat16)
    residual = torch.randn(rows, n, generator=g).to(torch.bfloat16)
    return x, weight, bias, residual


def _one_step_apart(got: torch.Tensor, exact: torch.Tensor) -> None:
    """``got`` is ``exact`` (float32) rounded to bfloat16, give or take one bfloat16 step."""
    step = torch.where(exact == 0, torch.tensor(2.0**-133), exact.abs() * 2.0**-7)
    assert ((got.float() - exact).abs() <= step + 1e-6).all()


# (N, K): no multiple of 64 rows (the last block padded), a K of one pair, the model's
# shapes at small scale, and a weight large enough for the threads to split it.
SHAPES = [(100, 30), (16, 2), (96, 64), (130, 160), (2304, 1024)]


@pytest.mark.parametrize(("n", "k"), SHAPES)
@pytest.mark.parametrize("rows", [1, 2, 5, 6, 7, 13, 70])
def test_packed_linear_matches_torch(
    packed_kernel: PagedDecodeKernel, n: int, k: int, rows: int
) -> None:
    x, weight, bias, residual = _inputs(rows, n, k, seed=n + k + rows)
    packed = packed_kernel.pack_bf16(weight)
    assert packed is not None and packed.numel() == -(-n // PACK_ROWS) * PACK_ROWS * k
    exact = x.float() @ weight.float().t()
    plain = packed_kernel.linear_packed(x, packed, n, k, None, None, 2)
    assert plain is not None and plain.dtype == torch.bfloat16 and plain.shape == (rows, n)
    _one_step_apart(plain, exact)
    both = packed_kernel.linear_packed(x, packed, n, k, bias, residual, 2)
    assert both is not None
    _one_step_apart(both, exact + bias.float() + residual.float())


def test_packed_linear_is_the_same_on_every_thread_count(
    packed_kernel: PagedDecodeKernel,
) -> None:
    x, weight, bias, residual = _inputs(33, 2304, 1024, seed=5)
    packed = packed_kernel.pack_bf16(weight)
    assert packed is not None
    outs = [
        packed_kernel.linear_packed(x, packed, 2304, 1024, bias, residual, threads)
        for threads in (1, 2, 7)
    ]
    assert all(o is not None for o in outs)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])  # type: ignore[arg-type]


def test_packed_linear_takes_strided_rows(packed_kernel: PagedDecodeKernel) -> None:
    x, weight, _, _ = _inputs(9, 96, 64, seed=3)
    wide = torch.zeros(9, 80, dtype=torch.bfloat16)
    wide[:, :64] = x
    packed = packed_kernel.pack_bf16(weight)
    assert packed is not None
    got = packed_kernel.linear_packed(wide[:, :64], packed, 96, 64, None, None, 2)
    want = packed_kernel.linear_packed(x, packed, 96, 64, None, None, 2)
    assert got is not None and want is not None and torch.equal(got, want)


def test_packing_declines_what_it_does_not_take(packed_kernel: PagedDecodeKernel) -> None:
    weight = torch.randn(32, 64).to(torch.bfloat16)
    assert packed_kernel.pack_bf16(weight[:, :63].contiguous()) is None  # an odd column count
    assert packed_kernel.pack_bf16(weight.float()) is None
    assert packed_kernel.pack_bf16(weight.t()) is None  # not contiguous
    packed = packed_kernel.pack_bf16(weight)
    assert packed is not None
    x = torch.randn(3, 64).to(torch.bfloat16)
    assert packed_kernel.linear_packed(x, packed, 32, 62, None, None, 1) is None  # sizes
    assert packed_kernel.linear_packed(x[:, :32], packed, 32, 64, None, None, 1) is None
    assert packed_kernel.linear_packed(x.float(), packed, 32, 64, None, None, 1) is None


def test_the_layout_round_trips(packed_kernel: PagedDecodeKernel) -> None:
    weight = torch.randn(100, 30).to(torch.bfloat16)
    made = PackedWeight.pack(weight)
    assert made is not None and made.shape == (100, 30) and made.dtype == torch.bfloat16
    assert torch.equal(made.dequantize(), weight)
    out = torch.empty(100, 30, dtype=torch.bfloat16)
    assert made.dequantize(out) is out and torch.equal(out, weight)
    x = torch.randn(70, 30).to(torch.bfloat16)
    _one_step_apart(linear(x, made), x.float() @ weight.float().t())
    with pytest.raises(EngineConfigError, match="2-D bfloat16 inputs, got float32"):
        made.linear(x.float())


def _logits(model: DecoderModel, ids: list[int]) -> list[torch.Tensor]:
    """A prompt longer than the decode kernels' rows, then decode steps of one token."""
    runner = PagedRunner(model, block_size=4, num_blocks=64)
    out = [runner.step({"a": ids[:20]})["a"]]
    out += [runner.step({"a": [token]})["a"] for token in ids[20:]]
    return out


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_a_loaded_bf16_model_packs_its_projections(
    packed_kernel: PagedDecodeKernel,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    family: str,
) -> None:
    path = make_tiny_model(tmp_path, family)
    packed = load_model(path, dtype="bfloat16")
    for layer in packed.layers:
        for name in ("qkv_weight", "o_weight", "gate_up_weight", "down_weight"):
            assert isinstance(getattr(layer, name), PackedWeight)
    monkeypatch.setenv(PACKED_WEIGHTS_ENV, "0")
    dense = load_model(path, dtype="bfloat16")
    assert isinstance(dense.layers[0].qkv_weight, torch.Tensor)
    for layer, other in zip(packed.layers, dense.layers, strict=True):
        assert torch.equal(layer.gate_up_weight.dequantize(), other.gate_up_weight)
    ids = random_tokens(26, seed=4)
    for got, want in zip(_logits(packed, ids), _logits(dense, ids), strict=True):
        # the same bfloat16 model; sums in another order round a few values differently
        assert F.cosine_similarity(got.flatten(), want.flatten(), dim=0).item() > 0.999
        assert torch.equal(got.argmax(-1), want.argmax(-1))
    float32 = load_model(path, dtype="float32")
    assert isinstance(float32.layers[0].qkv_weight, torch.Tensor)  # bfloat16 only


def test_a_packed_weight_is_no_load_target(packed_kernel: PagedDecodeKernel) -> None:
    from local_engine.loader import _rows

    made = PackedWeight.pack(torch.randn(16, 8).to(torch.bfloat16))
    assert made is not None
    with pytest.raises(EngineConfigError, match="not a load target"):
        _rows(made, 0, 4)


def test_a_packing_refusal_is_reported(packed_kernel: PagedDecodeKernel) -> None:
    class Refusing:
        packed_linear = True

        def _pack_bf16(self, *args: object) -> int:
            return 2

    with pytest.raises(KernelError, match="packing refused"):
        PagedDecodeKernel.pack_bf16(
            Refusing(),  # type: ignore[arg-type]
            torch.randn(16, 8).to(torch.bfloat16),
        )
