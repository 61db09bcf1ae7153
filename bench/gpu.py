"""The GPU check: local_engine on one CUDA GPU against transformers, in one run.

Run from the repository root (``bench/gpu_check.sh`` wraps it with a time limit)::

    python bench/gpu.py            # the whole check on a GPU, under 10 minutes on an H200
    python bench/gpu.py --smoke    # a tiny model on CPU in seconds (CI runs it)
    python bench/gpu.py --no-compile   # skip the torch.compile peer (its compile is slow)
    python bench/gpu.py --smoke --only w4 --model small --w4-streams 32 --w4-new 64 \
        --w4-rounds 3                   # W4 on CPU with a 40M-parameter model

The model is built here with random weights in the Qwen3-0.6B shape (28 layers, hidden
1024, 16 query and 8 KV heads of 128, vocabulary 151,936, tied embeddings), saved once, and
loaded by both sides: nothing is downloaded. Weights are drawn wider than transformers'
default init so that greedy decoding is decided by the model, not by rounding noise.

Parts, each printed as a markdown table with its goal and verdict:

0. Correctness. float32: greedy tokens of the engine (Triton attention, CUDA graphs) equal
   transformers' ``generate`` on every prompt. bfloat16: top-1 agreement and max |delta| of
   the full-sequence logits against transformers in bfloat16 (and both against float32).
   fp8 weights (GPUs with compute capability 8.9+): logit cosine against the engine in
   bfloat16, goal >= 0.99.
1. W1 batch-1 decode: one 128-token prompt, 256 new tokens, tokens/s after the first token.
   Peers: transformers ``generate`` eager, and with a static cache + ``torch.compile``.
   Goal: >= 2,000 tok/s.
2. W2 the nano-vllm benchmark: 256 sequences, prompt and output lengths uniform in
   [100, 1024], all submitted at once; output tokens over wall time. Peer: transformers
   ``generate_batch`` (continuous batching) where this transformers has it, on the first
   ``--peer-requests`` sequences (it is two orders of magnitude slower). Goal: >= 25,000 tok/s.
3. W3 a 2,000-token shared prefix: time to first token of a request whose prefix another
   request already computed (hit) against a fresh prefix (miss). Goal: >= 10x lower on a hit.
4. W4 host work overlapped with the model: concurrent streams through ``AsyncEngine`` (a
   word-level tokenizer on the checkpoint's vocabulary, detokenized text, a stop string that
   never matches), with ``EngineConfig.overlap_output`` off and on, alternating on the same
   engine; output tokens over wall time, median of the rounds. The streams' tokens must be
   the same either way. Goal: on is not slower than off.

Anchors measured on an H200 (torch 2.11, transformers 5.17, this shape, bf16): transformers
batch-1 41 tok/s eager and 278 tok/s static+compile; ``generate_batch`` 505 tok/s on 64
requests; the bandwidth bound at batch 1 is about 3,560 tok/s.
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import anyio
import torch
import torch.nn.functional as F
import transformers
from _gpu_features import check_features
from _util import markdown_table, ratio, verdict
from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

from local_engine.async_engine import AsyncEngine
from local_engine.attention import build_attention_metadata
from local_engine.engine import Engine, EngineConfig, SamplingParams
from local_engine.errors import EngineConfigError
from local_engine.loader import load_model
from local_engine.model import DecoderModel
from local_engine.tokenizer import Tokenizer
from swiftclient.errors import ConfigurationError

QWEN3_06B: dict[str, Any] = {
    "vocab_size": 151936,
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 4096,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}
SMALL: dict[str, Any] = {  # about 40M parameters: a CPU-sized model for --smoke --model small
    "vocab_size": 32000,
    "hidden_size": 512,
    "intermediate_size": 1536,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 64,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": True,
}
TINY: dict[str, Any] = {
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 512,
    "tie_word_embeddings": True,
}


@dataclass(frozen=True)
class Settings:
    """Sizes of one run (full on a GPU, or the CPU smoke run)."""

    model: dict[str, Any]
    device: str
    correct_prompts: int
    correct_prompt_len: int
    correct_new: int
    w1_prompt: int
    w1_new: int
    w2_seqs: int
    w2_min: int
    w2_max: int
    w3_prefix: int
    w3_suffix: int
    w3_rounds: int
    kv_cache_memory: int
    max_num_batched_tokens: int
    w4_streams: int
    w4_prompt: int
    w4_new: int
    w4_rounds: int


FULL = Settings(
    model=QWEN3_06B,
    device="cuda",
    correct_prompts=4,
    correct_prompt_len=64,
    correct_new=32,
    w1_prompt=128,
    w1_new=256,
    w2_seqs=256,
    w2_min=100,
    w2_max=1024,
    w3_prefix=2000,
    w3_suffix=24,
    w3_rounds=5,
    kv_cache_memory=48 * 2**30,
    max_num_batched_tokens=16384,
    w4_streams=128,
    w4_prompt=128,
    w4_new=256,
    w4_rounds=3,
)
SMOKE = Settings(
    model=TINY,
    device="cpu",
    correct_prompts=2,
    correct_prompt_len=12,
    correct_new=6,
    w1_prompt=16,
    w1_new=8,
    w2_seqs=6,
    w2_min=4,
    w2_max=16,
    w3_prefix=40,
    w3_suffix=4,
    w3_rounds=2,
    kv_cache_memory=8 * 2**20,
    max_num_batched_tokens=256,
    w4_streams=8,
    w4_prompt=8,
    w4_new=16,
    w4_rounds=1,
)


def sync(device: str) -> None:
    """Wait for the device's queued work (a no-op on CPU)."""
    if device == "cuda":
        torch.cuda.synchronize()


def build_checkpoint(
    root: Path, shape: dict[str, Any], initializer_range: float | None = None
) -> Path:
    """Save a random-weight Qwen3 model of ``shape`` (float32) under ``root``, its weights
    drawn with ``initializer_range`` (default 0.05)."""
    torch.manual_seed(0)
    config = Qwen3Config(
        **shape, initializer_range=initializer_range or 0.05, bos_token_id=1, eos_token_id=2
    )
    model = Qwen3ForCausalLM(config)
    with torch.no_grad():  # randomized norms: a dropped or swapped norm changes the output
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(0.8, 1.2)
    model.save_pretrained(root)
    return root


def hf_model(path: Path, dtype: torch.dtype, device: str) -> Any:
    """The checkpoint as a transformers model in eval mode."""
    model = Qwen3ForCausalLM.from_pretrained(path, dtype=dtype).to(device)
    return model.eval()


def engine(
    path: Path, s: Settings, dtype: str, tokenizer: Tokenizer | None = None, **overrides: Any
) -> Engine:
    """An engine on the checkpoint, sized for the run (with ``tokenizer``, which the
    checkpoint lacks, when given)."""
    config = EngineConfig(
        device=s.device,
        dtype=dtype,
        kv_cache_memory=s.kv_cache_memory,
        max_num_seqs=256 if s.device == "cuda" else 16,
        max_num_batched_tokens=s.max_num_batched_tokens,
        max_model_len=min(4096, s.model["max_position_embeddings"]),
        seed=0,
        **overrides,
    )
    if tokenizer is not None:
        return Engine(load_model(path, dtype=dtype, device=s.device), config, tokenizer)
    return Engine.from_pretrained(path, config)


def random_prompts(rng: random.Random, lengths: Sequence[int], vocab: int) -> list[list[int]]:
    """Token ids drawn uniformly (ids below 3 left out: bos/eos/pad)."""
    return [[rng.randrange(3, vocab) for _ in range(n)] for n in lengths]


def model_logits(model: DecoderModel, ids: Sequence[int], block_size: int = 16) -> torch.Tensor:
    """Float32 logits of every position of ``ids``, through the engine's model and a cache."""
    n = len(ids)
    blocks = -(-n // block_size)
    caches = model.make_kv_cache(blocks, block_size)
    device = model.device
    meta = build_attention_metadata(
        [list(range(blocks))], [n], [n], block_size=block_size, device=device
    )
    hidden = model(
        torch.tensor(list(ids), device=device), torch.arange(n, device=device), caches, meta
    )
    return model.compute_logits(hidden)


def hf_logits(model: Any, ids: Sequence[int]) -> torch.Tensor:
    """Float32 logits of every position of ``ids`` from a transformers model."""
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([list(ids)], device=model.device))
    return out.logits[0].float()


def hf_greedy(model: Any, prompt: Sequence[int], new: int) -> tuple[list[int], float, float]:
    """Greedy tokens of one prompt, with the seconds to the first token and to the end."""
    stamps = _FirstToken()
    ids = torch.tensor([list(prompt)], device=model.device)
    start = time.perf_counter()
    out = model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=new,
        min_new_tokens=new,
        do_sample=False,
        pad_token_id=0,
        streamer=stamps,
    )
    end = time.perf_counter()
    first = stamps.first if stamps.first is not None else end
    return out[0, len(prompt) :].tolist(), first - start, end - start


class _FirstToken(transformers.generation.streamers.BaseStreamer):  # type: ignore[misc]
    """Notes when transformers hands out the first generated token."""

    def __init__(self) -> None:
        self.first: float | None = None
        self._calls = 0

    def put(self, value: Any) -> None:
        self._calls += 1  # the prompt first, then each step's tokens
        if self._calls == 2:
            self.first = time.perf_counter()

    def end(self) -> None:
        """Generation is over."""


def engine_greedy(eng: Engine, prompt: Sequence[int], new: int) -> tuple[list[int], float, float]:
    """Greedy tokens of one prompt, with the seconds to the first token and to the end."""
    params = SamplingParams(max_tokens=new, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    rid = eng.add_request(list(prompt), params)
    tokens: list[int] = []
    first: float | None = None
    while eng.has_unfinished():
        for out in eng.step():
            if out.request_id == rid:
                tokens.extend(out.new_token_ids)
        if first is None and tokens:
            first = time.perf_counter()
    end = time.perf_counter()
    return tokens, (first or end) - start, end - start


def decode_rate(tokens: int, ttft: float, total: float) -> float:
    """Tokens after the first, per second after the first arrived."""
    return ratio(tokens - 1, total - ttft)


@contextlib.contextmanager
def section(title: str) -> Iterator[None]:
    """Print a heading, and the section's wall time after it."""
    print(f"\n## {title}\n", flush=True)
    start = time.perf_counter()
    yield
    print(f"\n({time.perf_counter() - start:.1f} s)", flush=True)


def check_correctness(path: Path, s: Settings, rng: random.Random) -> None:
    """Part 0: greedy equality in float32, logit agreement in bfloat16, fp8 against bf16."""
    vocab = s.model["vocab_size"]
    prompts = random_prompts(rng, [s.correct_prompt_len] * s.correct_prompts, vocab)
    hf32 = hf_model(path, torch.float32, s.device)
    eng32 = engine(path, s, "float32")
    rows = []
    for i, prompt in enumerate(prompts):
        want, _, _ = hf_greedy(hf32, prompt, s.correct_new)
        got, _, _ = engine_greedy(eng32, prompt, s.correct_new)
        same = sum(1 for _ in common_prefix(want, got))
        rows.append([i, len(prompt), s.correct_new, same, verdict(want == got)])
    backend = getattr(eng32.model.attention, "name", "?")
    print(f"float32 greedy, engine attention backend: {backend}\n")
    print(markdown_table(["prompt", "length", "new", "equal prefix", "equal"], rows))
    ref32 = [hf_logits(hf32, p) for p in prompts]
    del hf32, eng32
    hf16 = hf_model(path, torch.bfloat16, s.device)
    ours16 = load_model(path, dtype="bfloat16", device=s.device)
    rows = []
    for name, logits in (
        ("local_engine bf16 vs transformers fp32", [model_logits(ours16, p) for p in prompts]),
        ("transformers bf16 vs transformers fp32", [hf_logits(hf16, p) for p in prompts]),
    ):
        rows.append([name, *_agreement(logits, ref32)])
    ours = [model_logits(ours16, p) for p in prompts]
    theirs = [hf_logits(hf16, p) for p in prompts]
    rows.append(["local_engine vs transformers, both bf16", *_agreement(ours, theirs)])
    print()
    print(markdown_table(["bf16 logits", "top-1 agreement", "max |delta|", "cosine"], rows))
    del hf16
    try:
        ours8 = load_model(path, dtype="bfloat16", device=s.device, quantization="fp8")
    except (ConfigurationError, EngineConfigError) as exc:
        print(f"\nfp8 weights: not measured here ({exc})")
        return
    fp8 = [model_logits(ours8, p) for p in prompts]
    agree, delta, cosine = _agreement(fp8, ours)
    print()
    print(
        markdown_table(
            ["fp8 vs bf16 logits", "top-1 agreement", "max |delta|", "cosine", "goal >= 0.99"],
            [["local_engine fp8", agree, delta, cosine, verdict(float(cosine) >= 0.99)]],
        )
    )


def common_prefix(a: Sequence[int], b: Sequence[int]) -> Iterator[int]:
    """The common prefix of two token lists."""
    for x, y in zip(a, b, strict=False):
        if x != y:
            return
        yield x


def _agreement(got: Sequence[torch.Tensor], want: Sequence[torch.Tensor]) -> list[str]:
    """Top-1 agreement, max |delta| and the worst per-position cosine over all positions."""
    g = torch.cat(list(got)).float()
    w = torch.cat(list(want)).float()
    agree = (g.argmax(-1) == w.argmax(-1)).float().mean().item()
    delta = (g - w).abs().max().item()
    cosine = F.cosine_similarity(g, w, dim=-1).min().item()
    return [f"{agree:.4f}", f"{delta:.4f}", f"{cosine:.5f}"]


def bench_w1(path: Path, s: Settings, rng: random.Random, compile_peer: bool) -> None:
    """Part 1: batch-1 decode rate."""
    prompt = random_prompts(rng, [s.w1_prompt], s.model["vocab_size"])[0]
    dtype = "bfloat16" if s.device == "cuda" else "float32"
    rows: list[list[object]] = []
    eng = engine(path, s, dtype)
    engine_greedy(eng, prompt, s.w1_new)  # warm-up: graphs captured, kernels compiled
    runs = [engine_greedy(eng, prompt, s.w1_new) for _ in range(3)]
    best = max(decode_rate(len(t), a, b) for t, a, b in runs)
    rows.append(["local_engine", f"{best:.0f}", f"{min(r[1] for r in runs) * 1e3:.1f}"])
    del eng
    hf = hf_model(path, getattr(torch, dtype), s.device)
    peers: list[tuple[str, Callable[[], tuple[list[int], float, float]]]] = [
        ("transformers eager", lambda: hf_greedy(hf, prompt, s.w1_new))
    ]
    if compile_peer:
        hf.generation_config.cache_implementation = "static"
        compiled = torch.compile(hf.forward, mode="reduce-overhead", fullgraph=True)

        def static_compiled() -> tuple[list[int], float, float]:
            hf.forward = compiled
            try:
                return hf_greedy(hf, prompt, s.w1_new)
            finally:
                del hf.forward

        peers.append(("transformers static cache + compile", static_compiled))
    for name, run in peers:
        try:
            run()  # warm-up (and compile)
            t, a, b = max((run() for _ in range(2)), key=lambda r: decode_rate(len(r[0]), *r[1:]))
        except Exception as exc:  # a peer that does not run here is reported, not fatal
            rows.append([name, f"unavailable: {type(exc).__name__}: {exc}"[:80], ""])
            continue
        rows.append([name, f"{decode_rate(len(t), a, b):.0f}", f"{a * 1e3:.1f}"])
    rows.append(["goal (local_engine)", ">= 2000", verdict(best >= 2000)])
    print(markdown_table(["W1 batch-1", "decode tok/s", "TTFT ms"], rows))


def bench_w2(path: Path, s: Settings, rng: random.Random, peer_requests: int) -> None:
    """Part 2: the nano-vllm benchmark."""
    vocab = s.model["vocab_size"]
    n = s.w2_seqs
    prompts = random_prompts(rng, [rng.randint(s.w2_min, s.w2_max) for _ in range(n)], vocab)
    outputs = [rng.randint(s.w2_min, s.w2_max) for _ in range(n)]
    dtype = "bfloat16" if s.device == "cuda" else "float32"
    eng = engine(path, s, dtype)
    warm = [SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)] * min(n, 32)
    eng.generate(random_prompts(rng, [64] * len(warm), vocab), warm)  # capture, compile
    params = [SamplingParams(max_tokens=o, temperature=0.6, ignore_eos=True) for o in outputs]
    sync(s.device)
    start = time.perf_counter()
    results = eng.generate(prompts, params)
    sync(s.device)
    seconds = time.perf_counter() - start
    made = sum(len(r.token_ids) for r in results)
    rate = made / seconds
    rows: list[list[object]] = [
        ["local_engine", n, made, f"{seconds:.2f}", f"{rate:.0f}"],
    ]
    del eng
    hf = hf_model(path, getattr(torch, dtype), s.device)
    generate_batch = getattr(hf, "generate_batch", None)
    if peer_requests == 0:
        rows.append(["transformers generate_batch", "skipped (--peer-requests 0)", "", "", ""])
    elif generate_batch is None:
        rows.append(["transformers generate_batch", "unavailable in this transformers", "", "", ""])
    else:
        k = min(peer_requests, n)
        new = min(statistics.median(outputs[:k]), 256)
        config = GenerationConfig(
            max_new_tokens=int(new), do_sample=False, eos_token_id=-1, pad_token_id=0
        )
        try:
            generate_batch(inputs=prompts[:2], generation_config=config)  # warm-up
            sync(s.device)
            start = time.perf_counter()
            out = generate_batch(inputs=prompts[:k], generation_config=config)
            sync(s.device)
            peer_seconds = time.perf_counter() - start
            peer_made = sum(len(r.generated_tokens) for r in out.values())
            rows.append(
                [
                    f"transformers generate_batch (first {k}, {int(new)} new each)",
                    k,
                    peer_made,
                    f"{peer_seconds:.2f}",
                    f"{peer_made / peer_seconds:.0f}",
                ]
            )
        except Exception as exc:  # reported, not fatal
            msg = f"unavailable: {type(exc).__name__}: {exc}"[:80]
            rows.append(["transformers generate_batch", msg, "", "", ""])
    rows.append(["goal (local_engine)", "", "", "", f">= 25000 {verdict(rate >= 25000)}"])
    print(markdown_table(["W2", "requests", "output tokens", "seconds", "output tok/s"], rows))


def bench_w3(path: Path, s: Settings, rng: random.Random) -> None:
    """Part 3: time to first token with a shared 2,000-token prefix, hit against miss."""
    vocab = s.model["vocab_size"]
    dtype = "bfloat16" if s.device == "cuda" else "float32"
    eng = engine(path, s, dtype)
    engine_greedy(eng, random_prompts(rng, [s.w3_prefix + s.w3_suffix], vocab)[0], 2)  # warm
    misses: list[float] = []
    hits: list[float] = []
    for _ in range(s.w3_rounds):
        prefix = random_prompts(rng, [s.w3_prefix], vocab)[0]
        first, second = random_prompts(rng, [s.w3_suffix, s.w3_suffix], vocab)
        misses.append(engine_greedy(eng, prefix + first, 1)[1])
        hits.append(engine_greedy(eng, prefix + second, 1)[1])
    miss, hit = statistics.median(misses), statistics.median(hits)
    rows = [
        ["miss (fresh prefix)", f"{miss * 1e3:.2f}"],
        ["hit (prefix cached)", f"{hit * 1e3:.2f}"],
        ["miss / hit (goal >= 10x)", f"{ratio(miss, hit):.1f}x {verdict(ratio(miss, hit) >= 10)}"],
    ]
    title = f"W3 {s.w3_prefix}-token prefix + {s.w3_suffix}"
    print(markdown_table([title, "TTFT ms (median)"], rows))


def word_tokenizer(root: Path, vocab: int) -> Tokenizer:
    """A word-level tokenizer over ``vocab`` ids ("w0" ... ), saved under ``root``: text to
    detokenize for a checkpoint that has no tokenizer of its own."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, pre_tokenizers

    backend = HFTokenizer(models.WordLevel({f"w{i}": i for i in range(vocab)}, unk_token="w0"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    root.mkdir(parents=True, exist_ok=True)
    backend.save(str(root / "tokenizer.json"))
    return Tokenizer.from_dir(root)


async def stream_all(
    eng: Engine, prompts: Sequence[list[int]], params: SamplingParams
) -> tuple[list[list[int]], float]:
    """Stream every prompt at once through an AsyncEngine; each stream's tokens, and the
    seconds from the first add to the last output."""
    tokens: list[list[int]] = [[] for _ in prompts]
    text_chars = 0

    async def consume(i: int, ae: AsyncEngine) -> None:
        nonlocal text_chars
        async for out in ae.generate(prompts[i], params):
            tokens[i].extend(out.new_token_ids)
            text_chars += len(out.new_text)

    async with AsyncEngine(eng) as ae:
        start = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for i in range(len(prompts)):
                tg.start_soon(consume, i, ae)
        seconds = time.perf_counter() - start
    if not text_chars:
        raise RuntimeError("the streams carried no text: nothing was detokenized")
    return tokens, seconds


def bench_w4(path: Path, s: Settings, rng: random.Random) -> None:
    """Part 4: streams with the host work (text, stop strings, outputs) overlapped with
    the next step, against after it."""
    vocab = s.model["vocab_size"]
    dtype = "bfloat16" if s.device == "cuda" else "float32"
    with tempfile.TemporaryDirectory() as tok_dir:
        tokenizer = word_tokenizer(Path(tok_dir), vocab)
    eng = engine(path, s, dtype, tokenizer)
    params = SamplingParams(
        max_tokens=s.w4_new, temperature=0.0, ignore_eos=True, stop=("w1 w1 w1 w1",)
    )
    warm = random_prompts(rng, [s.w4_prompt] * s.w4_streams, vocab)
    anyio.run(stream_all, eng, warm, replace(params, max_tokens=8))  # capture, compile
    seconds: dict[bool, list[float]] = {False: [], True: []}
    made: dict[bool, int] = {}
    timers = {o: _PhaseTimer() for o in (False, True)}
    run_step, process_step = eng.run_step, eng.process_step
    same = True
    for rnd in range(s.w4_rounds):
        prompts = random_prompts(rng, [s.w4_prompt] * s.w4_streams, vocab)
        got: dict[bool, list[list[int]]] = {}
        for overlap in (False, True) if rnd % 2 == 0 else (True, False):  # cancel drift
            eng.overlap_output = overlap
            timer = timers[overlap]
            eng.run_step = timer.wrap("run_step", run_step)  # type: ignore[method-assign]
            eng.process_step = timer.wrap("process_step", process_step)  # type: ignore[method-assign]
            eng.pool.reset_prefix_cache()
            sync(s.device)
            got[overlap], secs = anyio.run(stream_all, eng, prompts, params)
            seconds[overlap].append(secs)
            made[overlap] = sum(len(t) for t in got[overlap])
        same = same and got[False] == got[True]
    rates = {o: made[o] / statistics.median(seconds[o]) for o in (False, True)}
    gain = ratio(rates[True], rates[False])
    rows: list[list[object]] = [
        [
            f"overlap_output={o}",
            made[o],
            f"{statistics.median(seconds[o]):.3f}",
            f"{rates[o]:.0f}",
            f"{timers[o].ms_per_call('run_step'):.2f}",
            f"{timers[o].ms_per_call('process_step'):.2f}",
        ]
        for o in (False, True)
    ]
    rows.append(["same tokens on and off", "", "", "yes" if same else "NO", "", ""])
    rows.append(["on / off (goal >= 1.0)", "", "", f"{gain:.3f}x {verdict(gain >= 1.0)}", "", ""])
    title = f"W4 {s.w4_streams} streams, {s.w4_prompt} + {s.w4_new} tokens, {s.w4_rounds} rounds"
    header = [title, "output tokens", "seconds (median)", "output tok/s"]
    header += ["run_step ms/step", "process_step ms/step"]
    print(markdown_table(header, rows))
    print(
        "\nprocess_step (text, stop strings, outputs) is the host work that overlap_output "
        "runs beside the next run_step; run_step (schedule, model, sampled tokens, token-id "
        "checks) stays serial."
    )


class _PhaseTimer:
    """Seconds and calls of the engine methods it wraps."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn``, timed under ``name``."""

        def timed(*args: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args)
            finally:
                self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start
                self.calls[name] = self.calls.get(name, 0) + 1

        return timed

    def ms_per_call(self, name: str) -> float:
        """Mean milliseconds per call of ``name``."""
        return 1e3 * ratio(self.seconds.get(name, 0.0), self.calls.get(name, 0))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the check; exit 0 whatever the verdicts (FAIL marks a missed goal)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny model on CPU, seconds")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile peer")
    parser.add_argument("--peer-requests", type=int, default=32, help="generate_batch's share")
    parser.add_argument(
        "--model", choices=("tiny", "small", "qwen3-0.6b"), help="model shape (default by run)"
    )
    for name, meaning in (("streams", "W4 concurrent streams"), ("new", "W4 tokens per stream")):
        parser.add_argument(f"--w4-{name}", type=int, help=meaning)
    parser.add_argument("--w4-rounds", type=int, help="W4 rounds (off and on each)")
    parser.add_argument(
        "--only",
        choices=("correctness", "w1", "w2", "w3", "w4", "features"),
        action="append",
        help="parts to run",
    )
    args = parser.parse_args(argv)
    s = SMOKE if args.smoke else FULL
    shapes = {"tiny": TINY, "small": SMALL, "qwen3-0.6b": QWEN3_06B}
    s = replace(
        s,
        model=shapes[args.model] if args.model else s.model,
        w4_streams=args.w4_streams or s.w4_streams,
        w4_new=args.w4_new or s.w4_new,
        w4_rounds=args.w4_rounds or s.w4_rounds,
    )
    if s.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device here: run with --smoke for the CPU smoke run", file=sys.stderr)
        return 2
    parts = set(args.only or ("correctness", "w1", "w2", "w3", "w4", "features"))
    name = torch.cuda.get_device_name() if s.device == "cuda" else platform.processor() or "CPU"
    print(f"# local_engine GPU check ({'smoke, CPU' if args.smoke else name})\n")
    print(
        f"torch {torch.__version__}, transformers {transformers.__version__}, "
        f"python {platform.python_version()}"
    )
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as tmp:
        with section("Model"):
            path = build_checkpoint(Path(tmp), s.model)
            params = sum(p.numel() for p in load_model(path, device="cpu").parameters())
            print(f"random-weight Qwen3, {params / 1e6:.1f}M parameters, saved in float32")
        if "correctness" in parts:
            with section("0. Correctness"):
                check_correctness(path, s, rng)
        if "w1" in parts:
            with section("W1: batch-1 decode"):
                bench_w1(path, s, rng, compile_peer=not (args.no_compile or args.smoke))
        if "w2" in parts:
            with section(f"W2: {s.w2_seqs} sequences, lengths in [{s.w2_min}, {s.w2_max}]"):
                # generate_batch sizes its cache from free memory: minutes on a CPU.
                bench_w2(path, s, rng, 0 if args.smoke else args.peer_requests)
        if "w3" in parts:
            with section("W3: shared prefix"):
                bench_w3(path, s, rng)
        if "w4" in parts:
            with section("W4: host work overlapped with the model"):
                bench_w4(path, s, rng)
    if "features" in parts:
        with section("5. CUDA graphs, grammar and speculative decoding (embedded model)"):
            check_features(s.device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
