"""DecoderModel and its attention backends against transformers, through a paged KV cache."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from local_engine.attention import (
    CPUPagedAttention,
    ReferenceAttention,
    build_attention_metadata,
    get_attention_backend,
)
from local_engine.attention.native import load_paged_decode
from local_engine.config import RopeScaling
from local_engine.errors import EngineConfigError
from local_engine.loader import load_model
from local_engine.model import DecoderLayer, DecoderModel, rope_inverse_frequencies

from .paged import PagedRunner
from .tiny import FAMILIES, TINY_WINDOW, make_tiny_model

ATOL = 1e-4


def _tokens(n: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, 256, (n,), generator=gen).tolist()


class Pair:
    """Our model and transformers' on the same tiny checkpoint."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.ours = load_model(path)
        self.hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)

    def hf_logits(self, ids: list[int]) -> torch.Tensor:
        with torch.no_grad():
            logits: torch.Tensor = self.hf(torch.tensor([ids])).logits[0]
        return logits.float()


@pytest.fixture(scope="module", params=FAMILIES)
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Pair:
    family = str(request.param)
    return Pair(make_tiny_model(tmp_path_factory.mktemp(family), family))


def test_prefill_logits_match_transformers(pair: Pair) -> None:
    ids = _tokens(13, seed=1)  # 13 tokens: four blocks of 4, longer than the sliding window
    ours = PagedRunner(pair.ours, block_size=4).step({"a": ids})["a"]
    torch.testing.assert_close(ours, pair.hf_logits(ids), atol=ATOL, rtol=0)


def test_incremental_decode_matches_full_sequence(pair: Pair) -> None:
    ids = _tokens(21, seed=2)
    runner = PagedRunner(pair.ours, block_size=4)
    steps = [runner.step({"a": ids[:6]})["a"]]
    steps += [runner.step({"a": [tok]})["a"] for tok in ids[6:]]
    torch.testing.assert_close(torch.cat(steps), pair.hf_logits(ids), atol=ATOL, rtol=0)


def test_greedy_generation_matches_transformers(pair: Pair) -> None:
    prompt = _tokens(7, seed=3)
    eos = set(pair.ours.config.eos_token_ids)
    with torch.no_grad():
        expected = pair.hf.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.int64),
            max_new_tokens=16,
            do_sample=False,
            pad_token_id=0,
        )[0, len(prompt) :].tolist()
    runner = PagedRunner(pair.ours, block_size=4)
    logits = runner.step({"a": prompt})["a"]
    generated: list[int] = []
    while len(generated) < 16:
        generated.append(int(logits[-1].argmax()))
        if generated[-1] in eos:
            break
        logits = runner.step({"a": generated[-1:]})["a"]
    assert generated == expected


def test_mixed_batch_matches_each_sequence_alone(pair: Pair) -> None:
    full = {
        name: _tokens(n, seed=10 + i)
        for i, (name, n) in enumerate(
            [("fresh", 7), ("decode", 11), ("chunked", 11), ("short", 4), ("long", 16)]
        )
    }
    runner = PagedRunner(pair.ours, block_size=4)
    # Step 1: several prompts prefilled together (cached prefixes for step 2).
    first = {"decode": 10, "chunked": 6, "short": 3, "long": 15}
    out1 = runner.step({name: full[name][:n] for name, n in first.items()})
    # Step 2: a fresh prefill, a chunked prefill over a cached prefix and three decodes.
    out2 = runner.step({"fresh": full["fresh"], **{n: full[n][first[n] :] for n in first}})
    # Step 3: decodes only, with different context lengths (batched decode path).
    extra = {name: [5 + i] for i, name in enumerate(["decode", "short", "long"])}
    out3 = runner.step(extra)
    for name, ids in full.items():
        got = [out1[name]] if name in out1 else []
        got.append(out2[name])
        want_ids = ids
        if name in out3:
            got.append(out3[name])
            want_ids = ids + extra[name]
        torch.testing.assert_close(
            torch.cat(got), pair.hf_logits(want_ids), atol=ATOL, rtol=0, msg=name
        )


@pytest.mark.parametrize("family", ["qwen2_sw", "mistral"])
def test_sliding_window_mask_matters(family: str, tmp_path: Path) -> None:
    pair = Pair(make_tiny_model(tmp_path, family))
    windows = pair.ours.config.sliding_windows
    assert TINY_WINDOW in windows
    if family == "qwen2_sw":
        assert windows[0] is None  # layers below max_window_layers attend fully
    ids = _tokens(14, seed=4)
    expected = pair.hf_logits(ids)
    for module in pair.ours.layers:
        assert isinstance(module, DecoderLayer)
        module.sliding_window = None
    unwindowed = PagedRunner(pair.ours).step({"a": ids})["a"]
    # Inside the window the masks agree; past it, dropping the window changes the logits.
    torch.testing.assert_close(unwindowed[:TINY_WINDOW], expected[:TINY_WINDOW], atol=ATOL, rtol=0)
    assert (unwindowed[TINY_WINDOW:] - expected[TINY_WINDOW:]).abs().max() > 1e-2


@pytest.mark.parametrize(
    "scaling",
    [RopeScaling("llama3", 8.0, 1.0, 4.0, 8192), RopeScaling("linear", 2.0)],
    ids=["llama3", "linear"],
)
def test_rope_frequencies_match_transformers(scaling: RopeScaling) -> None:
    params: dict[str, Any] = {"rope_type": scaling.rope_type, "rope_theta": 500000.0}
    params["factor"] = scaling.factor
    if scaling.rope_type == "llama3":
        params["low_freq_factor"] = scaling.low_freq_factor
        params["high_freq_factor"] = scaling.high_freq_factor
        params["original_max_position_embeddings"] = scaling.original_max_position_embeddings
    cfg = LlamaConfig(hidden_size=4096, num_attention_heads=32, rope_parameters=params)
    expected, _ = ROPE_INIT_FUNCTIONS[scaling.rope_type](cfg, torch.device("cpu"))
    ours = rope_inverse_frequencies(128, 500000.0, scaling)
    torch.testing.assert_close(ours, expected, atol=0, rtol=1e-6)
    assert not torch.allclose(ours, rope_inverse_frequencies(128, 500000.0, None))


def _naive_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, query_pos: int, window: int | None
) -> torch.Tensor:
    """One query token ``[H, D]`` over keys ``[P, KV, D]`` for positions 0..P-1, by hand."""
    group = q.shape[0] // k.shape[1]
    keys = k.repeat_interleave(group, dim=1)[: query_pos + 1]
    values = v.repeat_interleave(group, dim=1)[: query_pos + 1]
    scores = torch.einsum("hd,phd->hp", q, keys) / q.shape[-1] ** 0.5
    if window is not None:
        scores[:, : max(0, query_pos + 1 - window)] = float("-inf")
    return torch.einsum("hp,phd->hd", F.softmax(scores, dim=-1), values)


_LAYOUTS = {
    "mixed": ([9, 6, 5, 12], [3, 6, 1, 1]),  # cached-prefix prefill, fresh prefill, decodes
    "ragged_decode": ([5, 12, 2, 9], [1, 1, 1, 1]),
    "uniform_decode": ([7, 7, 7, 7], [1, 1, 1, 1]),
}


@pytest.mark.parametrize("backend", ["reference", "cpu"])
@pytest.mark.parametrize("layout", sorted(_LAYOUTS))
@pytest.mark.parametrize("window", [None, 3])
def test_attention_against_naive_loop(layout: str, window: int | None, backend: str) -> None:
    """Random q/k/v through every attention path of each backend, checked token by token."""
    gen = torch.Generator().manual_seed(0)
    heads, kv_heads, dim, block = 4, 2, 8, 4
    contexts, queries = _LAYOUTS[layout]
    cache = torch.zeros(2, 16, block, kv_heads, dim)
    full_k = [torch.randn(n, kv_heads, dim, generator=gen) for n in contexts]
    full_v = [torch.randn(n, kv_heads, dim, generator=gen) for n in contexts]
    free = torch.randperm(16, generator=gen).tolist()  # scattered blocks
    tables = [[free.pop() for _ in range(-(-n // block))] for n in contexts]
    # Pre-populate the cached prefixes, block table by block table.
    for table, n, qn, k, v in zip(tables, contexts, queries, full_k, full_v, strict=True):
        for p in range(n - qn):
            cache[0, table[p // block], p % block] = k[p]
            cache[1, table[p // block], p % block] = v[p]
    meta = build_attention_metadata(tables, contexts, queries, block_size=block)
    q = torch.randn(sum(queries), heads, dim, generator=gen)
    new_k = torch.cat([k[n - qn :] for k, n, qn in zip(full_k, contexts, queries, strict=True)])
    new_v = torch.cat([v[n - qn :] for v, n, qn in zip(full_v, contexts, queries, strict=True)])
    if backend == "cpu" and load_paged_decode() is None:
        pytest.skip("no native kernel here (no C compiler)")
    out = get_attention_backend(backend).forward(
        q, new_k, new_v, cache, meta, scale=dim**-0.5, sliding_window=window
    )
    row = 0
    for n, qn, k, v in zip(contexts, queries, full_k, full_v, strict=True):
        for i in range(qn):
            want = _naive_attention(q[row], k, v, n - qn + i, window)
            torch.testing.assert_close(out[row], want, atol=1e-5, rtol=1e-5)
            row += 1
    flat_k = cache[0].reshape(-1, kv_heads, dim)
    torch.testing.assert_close(flat_k[meta.slot_mapping], new_k)  # new keys were stored


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DecoderModel]:
    yield load_model(make_tiny_model(tmp_path_factory.mktemp("llama"), "llama"))


def test_kv_cache_layout_and_size(llama: DecoderModel) -> None:
    caches = llama.make_kv_cache(num_blocks=8, block_size=4)
    cfg = llama.config
    assert len(caches) == cfg.num_layers
    assert all(c.shape == (2, 8, 4, cfg.num_kv_heads, cfg.head_dim) for c in caches)
    assert all(c.dtype == torch.float32 and not c.any() for c in caches)
    assert llama.kv_bytes_per_token() == 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 4
    with pytest.raises(EngineConfigError):
        llama.make_kv_cache(num_blocks=0, block_size=4)


def test_forward_rejects_wrong_cache_count(llama: DecoderModel) -> None:
    meta = build_attention_metadata([[0]], [1], [1], block_size=4)
    one = torch.zeros(1, dtype=torch.int64)
    caches: list[Any] = llama.make_kv_cache(4, 4)[:1]
    with pytest.raises(EngineConfigError, match="KV cache"):
        llama(one, one, caches, meta)


def test_attention_backend_selection() -> None:
    assert isinstance(get_attention_backend(), CPUPagedAttention)  # SDPA where no kernel
    if load_paged_decode() is None:
        with pytest.raises(EngineConfigError, match="native kernel"):
            get_attention_backend("cpu")
    else:
        assert isinstance(get_attention_backend("cpu"), CPUPagedAttention)
    reference = get_attention_backend("reference")
    assert type(reference) is ReferenceAttention
    with pytest.raises(EngineConfigError, match="unknown attention backend"):
        get_attention_backend("flash-magic")


def test_metadata_rejects_inconsistent_layout() -> None:
    with pytest.raises(EngineConfigError, match="query_len"):
        build_attention_metadata([[0]], [2], [3], block_size=4)
    with pytest.raises(EngineConfigError, match="cannot hold"):
        build_attention_metadata([[0]], [5], [1], block_size=4)


@pytest.mark.parametrize("tokens", [1, 32, 600])
def test_rope_matches_the_transformers_formula_on_strided_rows(tokens: int) -> None:
    """The rotation reads queries and keys as a view of the fused qkv rows (strided) and
    gives ``q * cos + rotate_half(q) * sin``: bit for bit what the concatenating form gives
    (one fused multiply-add per element, as ``addcmul`` does), within float32 rounding of
    transformers' unfused form."""
    from local_engine.model import _rope

    heads, kv_heads, hd = 4, 2, 16
    gen = torch.Generator().manual_seed(0)
    qkv = torch.randn(tokens, heads + 2 * kv_heads, hd, generator=gen)
    qk = qkv[:, : heads + kv_heads]
    angles = torch.randn(tokens, hd // 2, generator=gen)
    cos_half, sin_half = angles.cos(), angles.sin()
    cos = torch.cat((cos_half, cos_half), dim=-1).unsqueeze(1)
    sin = torch.cat((sin_half, sin_half), dim=-1).unsqueeze(1)
    signed_sin = torch.cat((-sin_half, sin_half), dim=-1).unsqueeze(1)
    rotate_half = torch.cat((-qk[..., hd // 2 :], qk[..., : hd // 2]), dim=-1)
    half = hd // 2
    concatenated = torch.cat((qk[..., half:], qk[..., :half]), dim=-1).mul_(signed_sin)
    got = _rope(qk, cos, signed_sin)
    assert got.is_contiguous()
    assert torch.equal(got, torch.addcmul(concatenated, qk, cos))
    torch.testing.assert_close(got, qk * cos + rotate_half * sin, rtol=0, atol=1e-6)
    assert torch.equal(qkv[:, : heads + kv_heads], qk)  # the input is left alone
