"""The Triton attention kernels against the reference backend.

Without a GPU they run on CPU under the Triton interpreter, which tests/conftest.py turns on
(``TRITON_INTERPRET=1``) before anything imports triton: triton reads it when a kernel is
decorated, its own library's kernels included. With a GPU the same tests run on CUDA.
Shapes stay tiny: the interpreter runs every program in numpy.
"""

from __future__ import annotations

import importlib
import random
from pathlib import Path
from types import ModuleType

import pytest
import torch

from local_engine.attention import (
    CPUPagedAttention,
    ReferenceAttention,
    build_attention_metadata,
    get_attention_backend,
)
from local_engine.engine import Engine, EngineConfig, SamplingParams
from local_engine.errors import EngineConfigError

from .tiny import make_tiny_model

_MODULE = "local_engine.attention.triton_kernels"

BLOCK = 16
HEADS, KV_HEADS, DIM = 4, 2, 32


@pytest.fixture(scope="module")
def kernels() -> ModuleType:
    """The kernel module (decorated for the interpreter where there is no GPU)."""
    module = importlib.import_module(_MODULE)
    if not module.INTERPRETING and not torch.cuda.is_available():
        pytest.fail("no GPU and TRITON_INTERPRET is not 1: tests/conftest.py sets it")
    return module


@pytest.fixture
def device(kernels: ModuleType) -> str:
    """Where the kernels run: CPU under the interpreter, else the GPU."""
    return "cpu" if kernels.INTERPRETING else "cuda"


@pytest.fixture
def triton_backend(kernels: ModuleType) -> object:
    from local_engine.attention.triton_backend import TritonPagedAttention

    return TritonPagedAttention(num_splits=4)


def _layout(
    context_lens: list[int], query_lens: list[int], *, num_blocks: int = 24, seed: int = 0
) -> tuple[list[list[int]], int]:
    free = list(range(num_blocks))
    random.Random(seed).shuffle(free)
    tables = [[free.pop() for _ in range(-(-ctx // BLOCK))] for ctx in context_lens]
    return tables, num_blocks


def _run(
    backend: object,
    context_lens: list[int],
    query_lens: list[int],
    *,
    window: int | None,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Output and cache of ``backend`` on a random cache whose prefixes are already stored."""
    torch.manual_seed(seed)
    tables, num_blocks = _layout(context_lens, query_lens, seed=seed)
    cache = torch.randn(2, num_blocks, BLOCK, KV_HEADS, DIM).to(device, dtype)
    tokens = sum(query_lens)
    qkv = torch.randn(tokens, HEADS + 2 * KV_HEADS, DIM).to(device, dtype)  # views, as in the model
    q, k, v = qkv[:, :HEADS], qkv[:, HEADS : HEADS + KV_HEADS], qkv[:, HEADS + KV_HEADS :]
    meta = build_attention_metadata(
        tables, context_lens, query_lens, block_size=BLOCK, device=device
    )
    out = backend.forward(q, k, v, cache, meta, scale=DIM**-0.5, sliding_window=window)  # type: ignore[attr-defined]
    return out, cache


def _check(
    backend: object,
    context_lens: list[int],
    query_lens: list[int],
    *,
    window: int | None,
    device: str,
    dtype: torch.dtype = torch.float32,
    atol: float = 1e-5,
) -> None:
    kw = {"window": window, "dtype": dtype, "device": device}
    got, got_cache = _run(backend, context_lens, query_lens, **kw)  # type: ignore[arg-type]
    want, want_cache = _run(ReferenceAttention(), context_lens, query_lens, **kw)  # type: ignore[arg-type]
    assert torch.equal(got_cache, want_cache)
    torch.testing.assert_close(got.float(), want.float(), atol=atol, rtol=atol)


@pytest.mark.parametrize("window", [None, 20])
def test_decode_matches_reference(triton_backend: object, device: str, window: int | None) -> None:
    # Lengths that end mid-block, on a block edge, span more blocks than splits, and
    # leave some splits empty.
    _check(triton_backend, [1, 16, 37, 70, 90], [1] * 5, window=window, device=device)


@pytest.mark.parametrize("window", [None, 20])
def test_prefill_and_extend_match_reference(
    triton_backend: object, device: str, window: int | None
) -> None:
    # A fresh prompt, an extension over a cached prefix (crossing a query tile),
    # a decode row in the same batch, and a one-block prompt.
    _check(triton_backend, [40, 75, 21, 9], [40, 38, 1, 9], window=window, device=device)


def test_bfloat16_is_cast_after_loading(triton_backend: object, device: str) -> None:
    bf16 = {"window": None, "dtype": torch.bfloat16, "atol": 2e-2, "device": device}
    _check(triton_backend, [5, 33, 50], [1, 1, 1], **bf16)  # type: ignore[arg-type]
    _check(triton_backend, [30, 50], [30, 7], **bf16)  # type: ignore[arg-type]


def test_store_kv_skips_negative_slots(kernels: ModuleType, device: str) -> None:
    cache = torch.zeros(2, 4, BLOCK, KV_HEADS, DIM, device=device)
    k = torch.randn(3, KV_HEADS, DIM, device=device)
    v = torch.randn(3, KV_HEADS, DIM, device=device)
    slots = torch.tensor([5, -1, 40], device=device)
    kernels.store_kv(k, v, cache, slots)
    flat = cache.view(2, -1, KV_HEADS, DIM)
    assert torch.equal(flat[0, 5], k[0]) and torch.equal(flat[1, 40], v[2])
    flat[0, 5] = 0
    flat[0, 40] = 0
    flat[1, 5] = 0
    flat[1, 40] = 0
    assert not cache.any()  # the padded row wrote nothing


def test_decode_of_an_empty_row_is_zero(kernels: ModuleType, device: str) -> None:
    """A padded row of a captured batch (length 0) attends to nothing and yields zeros."""
    cache = torch.randn(2, 4, BLOCK, KV_HEADS, DIM, device=device)
    q = torch.randn(2, HEADS, DIM, device=device)
    tables = torch.tensor([[1, 2], [0, 0]], dtype=torch.int32, device=device)
    lens = torch.tensor([20, 0], dtype=torch.int32, device=device)
    out = kernels.paged_decode(q, cache, tables, lens, scale=0.1, window=None, num_splits=2)
    assert torch.isfinite(out).all()
    assert not out[1].any()


def test_bad_settings_are_configuration_errors(triton_backend: object, device: str) -> None:
    from local_engine.attention.triton_backend import TritonPagedAttention

    with pytest.raises(EngineConfigError, match="power of two"):
        TritonPagedAttention(num_splits=3)
    cache = torch.zeros(2, 4, 8, KV_HEADS, DIM, device=device)
    meta = build_attention_metadata([[0]], [1], [1], block_size=8, device=device)
    x = torch.zeros(1, HEADS, DIM, device=device)
    kv = torch.zeros(1, KV_HEADS, DIM, device=device)
    with pytest.raises(EngineConfigError, match="block_size"):
        triton_backend.forward(x, kv, kv, cache, meta, scale=1.0, sliding_window=None)  # type: ignore[attr-defined]


def test_auto_chooses_by_device(kernels: ModuleType) -> None:
    from local_engine.attention.triton_backend import TritonPagedAttention

    assert isinstance(get_attention_backend("auto", device="cuda"), TritonPagedAttention)
    assert isinstance(get_attention_backend("auto", device="cpu"), CPUPagedAttention)
    assert isinstance(get_attention_backend("auto"), CPUPagedAttention)
    assert isinstance(get_attention_backend("triton"), TritonPagedAttention)


@pytest.mark.parametrize("family", ["qwen3", "mistral"])
def test_engine_on_triton_matches_reference(tmp_path: Path, device: str, family: str) -> None:
    """Greedy generation through the whole engine is the same on both backends (mistral has a
    sliding window; prefix caching makes the second prompt an extend over cached blocks)."""
    path = make_tiny_model(tmp_path, family)
    prompts = [list(range(3, 40)), list(range(3, 30)) + [7, 8, 9], [5, 6]]
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    outputs = []
    for backend in ("reference", "triton"):
        config = EngineConfig(
            attention_backend=backend, num_blocks=32, dtype="float32", device=device
        )
        engine = Engine.from_pretrained(path, config)
        outputs.append([r.token_ids for r in engine.generate(prompts, params)])
    assert outputs[0] == outputs[1]
