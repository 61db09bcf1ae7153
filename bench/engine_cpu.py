"""local_engine against transformers ``generate()`` on the same model, fp32 on CPU.

Run from the repository root::

    .venv/bin/python bench/engine_cpu.py            # full run, 6-12 minutes (load-dependent)
    .venv/bin/python bench/engine_cpu.py --quick    # smoke run, under a minute
    .venv/bin/python bench/engine_cpu.py --profile  # + cProfile of the engine workloads
    .venv/bin/python bench/engine_cpu.py --only contention   # workload 4 alone, 1-3 minutes
    .venv/bin/python bench/engine_cpu.py --only quant        # workload 5 alone, 3-20 minutes
    .venv/bin/python bench/engine_cpu.py --only grammar      # workload 6 alone, 1-5 minutes
    .venv/bin/python bench/engine_cpu.py --only spec         # workload 7 alone, about 1 minute
    .venv/bin/python bench/engine_cpu.py --only n            # workload 8 alone, 1-3 minutes

Both peers run the embedded ``swift-50m`` model (random weights, Qwen3 architecture, about
52M parameters) in float32 with the same number of torch threads, decode greedily and
generate exactly the same number of tokens (``ignore_eos`` / ``min_new_tokens``).

Workloads and goals (PASS/FAIL printed beside each):

1. Batch-1 decode: one 128-token prompt, 128 new tokens. The decode rate is
   ``(new_tokens - 1) / (end - first_token)``: every token after the first, over the time
   after the first token arrived (transformers reports token arrival through a streamer).
   Goal: local_engine >= 1.0x transformers. End-to-end tokens/s is shown too.
2. 32 concurrent requests, prompts of 32-256 tokens: total generated tokens over wall time.
   local_engine gets all 32 at once (continuous batching); transformers runs one batched
   ``generate()`` over the left-padded prompts. Two output shapes: (a) every request asks for
   64 new tokens — the static batch's best case; (b) requests ask for 16-128 new tokens, as
   real concurrent requests do: a static batch runs until its longest request is done, so
   only each request's own tokens count as generated. Goal: >= 3x transformers (printed for
   both shapes). For each shape the script also prints a ceiling: transformers' best time
   over a replay of the engine's matmuls alone, and of its matmuls plus attention (run
   together, layer by layer as the engine runs them), at the step shapes it ran: the most
   that work outside them could reach; the share of that ceiling the engine reaches step
   by step (each step's best round against its best replay) has a goal of its own
   (>= 95%); the best round's share, the median of the rounds' shares and the share of the
   two replayed apart are printed beside it. An info row times
   transformers serving the requests one ``generate()`` at a time.
3. Time to first token of a 1,024-token request whose first 1,000 tokens were already
   processed (prefix cache hit), against the same request on an engine with
   ``enable_prefix_caching=False`` and against transformers (prefill, one new token).
   Each round uses a fresh 24-token suffix, so only the shared prefix can hit.
   Goal: >= 5x lower TTFT on a hit than without the cache.
4. Batch-1 decode (workload 1's shape) while one other CPU-bound process runs (a pure-Python
   spin loop the script starts and stops, bounded in time), against the same engine with the
   machine to itself, in alternating rounds. Goal: >= 0.6x of the idle rate. The engine only:
   it measures how the engine's threads share a CPU (local_engine/cpu_threads.py); the
   OpenMP wait settings in force are printed above the table.
5. bf16 and int8 (``--only quant``; its own table): the engine loaded in bfloat16 and with
   int8 weights (bf16 activations). Batch-1 decode against the fp32 engine (goal for int8:
   >= 2x) and workload 2(a) against transformers in fp32 (goal for bf16: >= 3x) and in bf16
   (goal for bf16: >= 1.5x), with a ceiling line per quantized engine.
6. Grammar-constrained decoding (``--only grammar``; its own table): batch-1 and batch-32
   greedy decode under a JSON schema grammar against the same engine unconstrained, and the
   wall time the masks add per step and per token (bench/_grammar_rows.py). Info only.
7. Speculative decoding (``--only spec``; its own table, bench/_spec.py): batch-1 decode with
   n-gram speculation against the same engine without it, on the trained default model's
   copy/edit tasks (goal: >= 1.8x, identical greedy output) and non-grounded tasks (goal:
   >= 0.95x). Both peers run ``--spec-threads`` torch threads (default 1, the faster setting
   for that 3.2M model at batch 1 with and without speculation).
8. ``n=4`` (``--only n``; its own table, bench/_n_rows.py): one request for 4 choices of a
   prompt against the same prompt sent as four requests at once, on one engine with the
   prefix cache (the choices share the prompt's KV blocks), and against the four requests on
   an engine without the prefix cache (the goal's premise: each computes the prompt). Goal:
   >= 2x the four requests' throughput, each ratio printed with it, at the shape ``n`` is
   used for: a long prompt, short replies (1,024-token prompt, 16 new tokens each; quick:
   512 and 8). A 512-token prompt with 32 new tokens each (quick: 128 and 8), where
   decoding is about half the work, is printed for information.

Every round builds fresh random prompts (same lengths) and runs all peers on them back to
back, who goes first rotating; a warm-up round precedes the timed ones. So the engine's prefix
cache only ever hits where workload 3 means it to (the output reports the hits). The table
shows each peer's best round and the ratio of the bests (the verdict), plus the median of the
per-round ratios: on a shared machine load only ever adds time. The engine keeps freed
tensor memory for the next step (local_engine/cpu_memory.py); that allocator setting holds
for the whole process, so transformers and the ceiling replays run under it too (printed
above the table).
"""

from __future__ import annotations

# local_engine before torch: importing it sets the engine's OpenMP wait default, which the
# OpenMP runtime reads once, when torch loads it (local_engine/cpu_threads.py).
import local_engine  # noqa: F401  # isort: skip

import argparse
import cProfile
import io
import os
import platform
import pstats
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import transformers
from _contention import busy_process
from _grammar_rows import grammar_report
from _spec import run_spec
from _util import markdown_table, ratio, verdict
from transformers import AutoModelForCausalLM
from transformers.generation.streamers import BaseStreamer

from local_engine.attention import CPUPagedAttention, build_attention_metadata
from local_engine.cpu_memory import MMAP_THRESHOLD, TRIM_THRESHOLD, malloc_tuning
from local_engine.cpu_threads import SPIN_COUNT_ENV, WAIT_POLICY_ENV, openmp_setup
from local_engine.default_model import ensure_default_model
from local_engine.engine import Engine, EngineConfig, SamplingParams
from local_engine.process import apply_process_settings
from local_engine.quant import linear
from local_engine.runner import RunnerOutput
from local_engine.scheduler import SchedulerOutput
from local_engine.spec import SpeculativeConfig

MODEL_NAME = "swift-50m"
DECODE_GOAL = 1.0
BATCH_GOAL = 3.0
PREFIX_GOAL = 5.0
CONTENTION_GOAL = 0.6
CEILING_GOAL = 0.95
"""Share of the matmul-plus-attention ceiling the fp32 engine's best 2(a)/2(b) round reaches."""
BUSY_LIMIT_S = 300.0
"""The competing process exits by itself after this long, whatever happens to the script."""
WORKLOADS = ("decode", "batch", "prefix", "contention", "quant", "grammar", "spec", "n")


@dataclass(frozen=True)
class Settings:
    """Sizes and rounds for one run."""

    reps: int
    """Timed rounds of the batch-1 and TTFT workloads; an untimed warm-up round precedes them."""
    batch_reps: int
    """Timed rounds of the batched workload (the slow one)."""
    decode_prompt: int
    """Prompt tokens of the batch-1 decode workload."""
    decode_new: int
    """New tokens of the batch-1 decode workload."""
    batch_requests: int
    """Concurrent requests of the batched workload."""
    batch_min_prompt: int
    """Shortest prompt of the batched workload."""
    batch_max_prompt: int
    """Longest prompt of the batched workload."""
    batch_new: int
    """New tokens per request of the batched workload (a)."""
    batch_min_new: int
    """Fewest new tokens a request asks for in the batched workload (b)."""
    batch_max_new: int
    """Most new tokens a request asks for in the batched workload (b)."""
    prefix: int
    """Shared prefix tokens of the TTFT workload."""
    suffix: int
    """Fresh tokens after the prefix, per TTFT round."""


FULL = Settings(
    reps=5,
    batch_reps=5,
    decode_prompt=128,
    decode_new=128,
    batch_requests=32,
    batch_min_prompt=32,
    batch_max_prompt=256,
    batch_new=64,
    batch_min_new=16,
    batch_max_new=128,
    prefix=1000,
    suffix=24,
)
QUICK = Settings(
    reps=2,
    batch_reps=2,
    decode_prompt=32,
    decode_new=16,
    batch_requests=8,
    batch_min_prompt=16,
    batch_max_prompt=64,
    batch_new=8,
    batch_min_new=4,
    batch_max_new=16,
    prefix=1000,
    suffix=24,
)


@dataclass(frozen=True)
class Run:
    """One timed generation: wall-clock stamps (``perf_counter``) and the tokens it made."""

    start: float
    first_token: float
    end: float
    tokens: list[list[int]]
    """Generated tokens per prompt, in prompt order."""
    cached: int = 0
    """Prompt tokens served from the prefix cache (local_engine only)."""
    steps: list[float] = field(default_factory=list)
    """Seconds of each engine step, in order (local_engine only)."""
    shapes: list[Shape] = field(default_factory=list)
    """Each engine step as the model saw it, in order (local_engine only)."""

    @property
    def total_tokens(self) -> int:
        """Tokens generated over all prompts."""
        return sum(len(t) for t in self.tokens)

    @property
    def ttft(self) -> float:
        """Seconds from the call to the first generated token."""
        return self.first_token - self.start

    @property
    def decode_rate(self) -> float:
        """Tokens after the first, per second after the first token arrived (batch of one)."""
        return (self.total_tokens - 1) / (self.end - self.first_token)

    @property
    def end_to_end_rate(self) -> float:
        """Generated tokens per second of the whole call."""
        return self.total_tokens / (self.end - self.start)


class _ArrivalStamps(BaseStreamer):
    """A transformers streamer that only notes when the first generated token arrives."""

    def __init__(self) -> None:
        self.first: float | None = None
        self._calls = 0

    def put(self, value: Any) -> None:
        """Called with the prompt first, then with each step's new tokens."""
        self._calls += 1
        if self._calls == 2:
            self.first = time.perf_counter()

    def end(self) -> None:
        """Called once generation is over."""


class EnginePeer:
    """Drives one :class:`Engine` through ``add_request`` / ``step``, timing the first token."""

    def __init__(self, engine: Engine) -> None:
        """Wrap an idle engine."""
        self.engine = engine

    def run(self, prompts: Sequence[list[int]], new_tokens: NewTokens) -> Run:
        """Add every prompt at once and step until each has its ``new_tokens`` greedy tokens."""
        engine = self.engine
        targets = _targets(prompts, new_tokens)
        params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in targets]
        start = time.perf_counter()
        ids = [engine.add_request(p, sp) for p, sp in zip(prompts, params, strict=True)]
        tokens: dict[str, list[int]] = {rid: [] for rid in ids}
        cached: dict[str, int] = {}
        first: float | None = None
        steps: list[float] = []
        shapes: list[Shape] = []
        runner = engine.runner
        execute = runner.execute

        def noting(batch: SchedulerOutput) -> RunnerOutput:
            layout = tuple(
                (item.num_new_tokens, item.start + item.num_new_tokens) for item in batch.scheduled
            )
            samples = sum(1 for item in batch.scheduled if item.samples)
            shapes.append(Shape(batch.num_batched_tokens, samples, layout))
            return execute(batch)

        runner.execute = noting  # type: ignore[method-assign]
        try:
            while engine.has_unfinished():
                began = time.perf_counter()
                for out in engine.step():
                    tokens[out.request_id].extend(out.new_token_ids)
                    cached[out.request_id] = out.num_cached_tokens
                steps.append(time.perf_counter() - began)
                if first is None and cached:
                    first = time.perf_counter()
        finally:
            del runner.execute
        end = time.perf_counter()
        texts = [tokens[rid] for rid in ids]
        run = Run(start, first or end, end, texts, sum(cached.values()), steps, shapes)
        return _checked(run, new_tokens)

    def step_shapes(self, prompts: Sequence[list[int]], new_tokens: NewTokens) -> list[Shape]:
        """Run the workload once more, noting each step's (tokens, sampled rows)."""
        return self.run(prompts, new_tokens).shapes


class TransformersPeer:
    """One batched ``generate()`` call over left-padded prompts."""

    def __init__(self, model: Any, pad_token_id: int) -> None:
        """Wrap a transformers causal LM in eval mode."""
        self.model = model
        self.pad = pad_token_id

    def run(self, prompts: Sequence[list[int]], new_tokens: NewTokens) -> Run:
        """Generate each prompt's ``new_tokens`` greedy tokens in one static batch.

        A static batch runs until its longest request is done; each row then keeps only the
        tokens its request asked for (the rest is work a static batch cannot avoid).
        """
        targets = _targets(prompts, new_tokens)
        longest = max(targets)
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[self.pad] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        stamps = _ArrivalStamps() if len(prompts) == 1 else None
        start = time.perf_counter()
        out = self.model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=longest,
            min_new_tokens=longest,
            do_sample=False,
            pad_token_id=self.pad,
            streamer=stamps,
        )
        end = time.perf_counter()
        first = stamps.first if stamps is not None and stamps.first is not None else end
        tokens = [row[width : width + n] for row, n in zip(out.tolist(), targets, strict=True)]
        return _checked(Run(start, first, end, tokens), targets)

    def run_one_at_a_time(self, prompts: Sequence[list[int]], new_tokens: NewTokens) -> Run:
        """Serve the prompts the way a server built on plain ``generate()`` does when
        requests arrive together: one ``generate()`` per request, in turn."""
        targets = _targets(prompts, new_tokens)
        start = time.perf_counter()
        tokens: list[list[int]] = []
        first: float | None = None
        for prompt, n in zip(prompts, targets, strict=True):
            one = self.run([prompt], n)
            tokens.append(one.tokens[0])
            first = first if first is not None else one.first_token
        end = time.perf_counter()
        return _checked(Run(start, first or end, end, tokens), targets)


NewTokens = int | Sequence[int]
"""New tokens for every prompt, or one count per prompt."""


@dataclass(frozen=True)
class Shape:
    """One engine step as the model saw it."""

    tokens: int
    """Tokens run through the model."""
    samples: int
    """Rows that reach the LM head."""
    layout: tuple[tuple[int, int], ...]
    """(new tokens, context length) of each sequence in the step."""


class Ceiling:
    """The engine's matmuls and its attention replayed alone at the step shapes it ran.

    :meth:`replay` runs them twice: apart (every matmul of the run, then every attention
    call) and together (layer by layer, in the engine's order: the fused q/k/v projection,
    attention, the output, gate/up and down projections, then the LM head). The replay
    together is the ceiling: the engine's time with norms, RoPE, activations, sampling,
    scheduling and Python free. Apart, each kind ran 1-4% faster than together in paired
    replays (docs/local-engine.md), time an engine that must alternate them cannot win back
    by fusing its elementwise work, so it is printed for reference only. The workloads call
    :meth:`replay` as one more peer in every round (who goes first rotating, as for the
    engines), so the replays and the engine's rounds meet the same machine, whatever the
    other tenants do meanwhile. The first replay is the warm-up round's and is not counted,
    as the peers' is not.
    """

    def __init__(self, model: Any, block_size: int, shapes: Sequence[Shape]) -> None:
        """Prepare the replays: inputs of the widest step for the matmuls; per step, block
        tables scattered over a paged cache per layer and random queries, keys and values
        for the attention."""
        self.model = model
        self.shapes = list(shapes)
        self.matmuls: list[float] = []
        self.attention: list[float] = []
        self.together: list[float] = []
        self.together_steps: list[list[float]] = []
        """Each replay together, step by step (seconds)."""
        cfg = model.config
        widest = max(shape.tokens for shape in shapes)
        self._x_hidden = torch.randn(widest, cfg.hidden_size, dtype=model.dtype)
        self._x_attn = torch.randn(widest, cfg.num_heads * cfg.head_dim, dtype=model.dtype)
        self._x_mlp = torch.randn(widest, cfg.intermediate_size, dtype=model.dtype)
        rng = random.Random(0)
        blocks = max(sum(-(-ctx // block_size) for _, ctx in s.layout) for s in shapes)
        self._caches = [torch.randn_like(c) for c in model.make_kv_cache(blocks, block_size)]
        self._steps = []
        for shape in shapes:
            free = list(range(blocks))
            rng.shuffle(free)
            tables = []
            for _, ctx in shape.layout:
                need = -(-ctx // block_size)
                tables.append(free[:need])
                free = free[need:]
            meta = build_attention_metadata(
                tables,
                [ctx for _, ctx in shape.layout],
                [new for new, _ in shape.layout],
                block_size=block_size,
            )
            q = torch.randn(shape.tokens, cfg.num_heads, cfg.head_dim, dtype=model.dtype)
            kv = torch.randn(2, shape.tokens, cfg.num_kv_heads, cfg.head_dim, dtype=model.dtype)
            heads = cfg.num_heads + 2 * cfg.num_kv_heads
            qkv = torch.randn(shape.tokens, heads, cfg.head_dim, dtype=model.dtype)
            positions = torch.tensor(
                [p for new, ctx in shape.layout for p in range(ctx - new, ctx)], dtype=torch.int64
            )
            self._steps.append((meta, q, kv, qkv, positions))

    def replay(self, _prompts: object = None) -> Run:
        """Replay the matmuls and the attention apart and together (which first alternates
        from call to call); note the three times."""
        start = time.perf_counter()
        if len(self.together) % 2:
            self.together.append(self._together())
        self.matmuls.append(self._matmuls())
        self.attention.append(self._attention())
        if len(self.together) < len(self.matmuls):
            self.together.append(self._together())
        return Run(start, start, time.perf_counter(), [])

    def measure(self, reps: int) -> Ceiling:
        """A warm-up replay and ``reps`` counted ones, back to back (where no rounds run)."""
        for _ in range(reps + 1):
            self.replay()
        return self

    def best(self) -> tuple[float, float]:
        """The best counted matmul replay and the best counted attention replay (apart),
        seconds."""
        if len(self.matmuls) < 2:
            raise RuntimeError("the ceiling has no counted replay yet")
        return min(self.matmuls[1:]), min(self.attention[1:])

    def best_together(self) -> float:
        """The best counted replay of the two together, seconds: the ceiling."""
        if len(self.together) < 2:
            raise RuntimeError("the ceiling has no counted replay yet")
        return min(self.together[1:])

    def _project(self, layer: Any, tokens: int) -> None:
        linear(self._x_hidden[:tokens], layer.qkv_weight, layer.qkv_bias)

    def _rest(self, layer: Any, tokens: int) -> None:
        linear(self._x_attn[:tokens], layer.o_weight, layer.o_bias)
        linear(self._x_hidden[:tokens], layer.gate_up_weight)
        linear(self._x_mlp[:tokens], layer.down_weight)

    def _attend(self, layer: Any, step: tuple[Any, ...], cache: Any) -> None:
        """One layer's attention call as the engine makes it: a decode step that the CPU
        backend's fused call takes goes through it (rotation, KV write and attention; the
        engine's q/k norm is left out), every other step through ``forward``."""
        meta, q, kv, qkv, positions = step
        attention = self.model.attention
        if isinstance(attention, CPUPagedAttention):
            rotary = (positions, self.model.rope_cos, self.model.rope_sin)
            if (
                attention.rope_decode(
                    qkv,
                    q.shape[1],
                    None,
                    self.model.config.rms_norm_eps,
                    rotary,
                    cache,
                    meta,
                    scale=layer.scale,
                    sliding_window=layer.sliding_window,
                )
                is not None
            ):
                return
        attention.forward(
            q, kv[0], kv[1], cache, meta, scale=layer.scale, sliding_window=layer.sliding_window
        )

    def _matmuls(self) -> float:
        """Each step runs each layer's four projections (fused qkv, o, fused gate/up, down) on
        that step's token count and the LM head on its sampled rows, with the model's own
        weights, in order, as the engine does; attention, norms, sampling and scheduling are
        left out: the part of the engine's time only faster matmuls can shrink."""
        model = self.model
        with torch.inference_mode():
            start = time.perf_counter()
            for shape in self.shapes:
                for layer in model.layers:
                    self._project(layer, shape.tokens)
                    self._rest(layer, shape.tokens)
                if shape.samples:
                    linear(self._x_hidden[: shape.samples], model.lm_head)
            return time.perf_counter() - start

    def _attention(self) -> float:
        """One attention call per layer and step through the model's own backend (the native
        kernels where they are used), with the layer's scale and window: the KV writes,
        decode and prefill attention the engine ran (in decode steps the fused call, whose
        rotation comes with it), and nothing else."""
        with torch.inference_mode():
            start = time.perf_counter()
            for step in self._steps:
                step[0].derived.clear()
                for layer, cache in zip(self.model.layers, self._caches, strict=True):
                    self._attend(layer, step, cache)
            return time.perf_counter() - start

    def _together(self) -> float:
        """The replays of :meth:`_matmuls` and :meth:`_attention` interleaved as the engine
        runs them: per step and layer the qkv projection, attention, then the other three
        projections; the LM head last."""
        model = self.model
        times: list[float] = []
        with torch.inference_mode():
            start = time.perf_counter()
            for shape, step in zip(self.shapes, self._steps, strict=True):
                began = time.perf_counter()
                step[0].derived.clear()
                for layer, cache in zip(model.layers, self._caches, strict=True):
                    self._project(layer, shape.tokens)
                    self._attend(layer, step, cache)
                    self._rest(layer, shape.tokens)
                if shape.samples:
                    linear(self._x_hidden[: shape.samples], model.lm_head)
                times.append(time.perf_counter() - began)
            total = time.perf_counter() - start
        self.together_steps.append(times)
        return total

    def stepwise_share(self, engine_runs: Sequence[Run]) -> float | None:
        """The ceiling over the engine, step by step: the sum over steps of each step's best
        counted replay together, over the sum of the same step's best time in the engine's
        rounds plus the least time a round spent outside its steps (adding the requests,
        collecting outputs); None unless every round ran this replay's steps, shape for
        shape. A slow spell on a shared machine then costs only the steps it hit,
        in the round it hit them, where best whole rounds lose the round."""
        if len(self.together_steps) < 2 or not engine_runs:
            return None
        if any(r.shapes != self.shapes for r in engine_runs):
            return None
        replayed: float = sum(min(t) for t in zip(*self.together_steps[1:], strict=True))
        ran: float = sum(min(t) for t in zip(*(r.steps for r in engine_runs), strict=True))
        ran += min(r.end - r.start - sum(r.steps) for r in engine_runs)
        return replayed / ran


def ceiling_note(
    label: str,
    hf: Sequence[Run],
    ceiling: Ceiling,
    engine_runs: Sequence[Run] = (),
    goal: float | None = None,
) -> str:
    """Transformers' best time over the engine's matmuls alone, then over its matmuls plus
    its attention replayed together (the best replays of ``ceiling``); with ``engine_runs``
    (rounds paired with the replays), also the share of that ceiling the engine's best round
    reached (against ``goal``), the median of the per-round shares, and the share of the two
    replayed apart."""
    best = min(r.end - r.start for r in hf)
    matmuls, attention = ceiling.best()
    together = ceiling.best_together()
    note = (
        f"ceiling ({label}): replayed at the engine's step shapes, its matmuls alone take "
        f"{matmuls:.2f} s and its attention alone {attention:.2f} s ({matmuls + attention:.2f} s "
        f"apart, {together:.2f} s together, layer by layer as the engine runs them); "
        f"transformers' best round took {best:.2f} s; so the ratio could reach at most "
        f"{best / matmuls:.2f}x with everything but the matmuls free, and {best / together:.2f}x "
        "with norms, activations, sampling and scheduling free"
    )
    if engine_runs:
        ours = min(r.end - r.start for r in engine_runs)
        share = together / ours
        stepwise = ceiling.stepwise_share(engine_runs)
        if stepwise is not None:
            note += (
                f"; step by step (each step's best round) the engine reaches "
                f"{100 * stepwise:.2f}% of its matmul-plus-attention ceiling"
            )
            if goal is not None:
                note += f" (goal >= {100 * goal:.0f}%: {verdict(stepwise >= goal)})"
        note += f"; its best round took {ours:.2f} s: {100 * share:.2f}% of the ceiling's best"
        if len(ceiling.together) == len(engine_runs) + 1:  # replayed in the same rounds
            shares = [
                t / (r.end - r.start)
                for t, r in zip(ceiling.together[1:], engine_runs, strict=True)
            ]
            note += f" (median of the rounds {100 * statistics.median(shares):.1f}%)"
        if goal is not None and stepwise is None:
            note += f" (goal >= {100 * goal:.0f}%: {verdict(share >= goal)})"
        note += f", {100 * (matmuls + attention) / ours:.2f}% of the two replayed apart"
    return note


def _targets(prompts: Sequence[list[int]], new_tokens: NewTokens) -> list[int]:
    if isinstance(new_tokens, int):
        return [new_tokens] * len(prompts)
    return list(new_tokens)


def _checked(run: Run, new_tokens: NewTokens) -> Run:
    targets = _targets(run.tokens, new_tokens)
    if [len(t) for t in run.tokens] != targets:
        raise RuntimeError(f"a peer generated {[len(t) for t in run.tokens]}, not {targets}")
    return run


Prompts = list[list[int]]


def _rounds(
    reps: int, make: Callable[[int], Prompts], peers: Sequence[Callable[[Prompts], Run]]
) -> tuple[list[Run], ...]:
    """Run every peer on the same prompts per round; keep rounds ``1..reps``.

    Round 0 is an untimed warm-up. ``make(round)`` builds each round's prompts, fresh ones
    every round, so an engine never meets a prompt its prefix cache has already seen unless
    the workload means it to. Who goes first rotates from round to round.
    """
    results: tuple[list[Run], ...] = tuple([] for _ in peers)
    for rnd in range(reps + 1):
        prompts = make(rnd)
        shift = rnd % len(peers)
        order = list(range(len(peers)))
        for i in order[shift:] + order[:shift]:
            run = peers[i](prompts)
            if rnd:
                results[i].append(run)
    return results


def _rate_row(
    metric: str, eng: Sequence[Run], hf: Sequence[Run], attr: str, goal: float | None
) -> Row:
    """A higher-is-better rate: best = the highest round."""
    e = [float(getattr(r, attr)) for r in eng]
    h = [float(getattr(r, attr)) for r in hf]
    paired = statistics.median([ratio(x, y) for x, y in zip(e, h, strict=True)])
    return Row(metric, f"{max(e):.1f}", f"{max(h):.1f}", ratio(max(e), max(h)), paired, goal)


def _latency_row(
    metric: str, ours: Sequence[float], theirs: Sequence[float], goal: float | None
) -> Row:
    """A lower-is-better latency in ms: best = the lowest round; ratio = theirs / ours."""
    paired = statistics.median([ratio(t, o) for o, t in zip(ours, theirs, strict=True)])
    best = ratio(min(theirs), min(ours))
    return Row(metric, f"{min(ours):.1f}", f"{min(theirs):.1f}", best, paired, goal)


def _random_ids(rng: random.Random, n: int, high: int) -> list[int]:
    return [rng.randrange(high) for _ in range(n)]


@dataclass
class Setup:
    """The peers and the model facts the workloads need."""

    engine: EnginePeer
    engine_no_cache: EnginePeer
    hf: TransformersPeer | None
    """None when no chosen workload compares with transformers."""
    token_high: int
    """Prompts draw token ids below this (below every special token)."""

    @property
    def transformers(self) -> TransformersPeer:
        """The transformers peer (RuntimeError when it was not loaded)."""
        if self.hf is None:
            raise RuntimeError("transformers was not loaded for this run")
        return self.hf

    def ceiling(self, shapes: Sequence[Shape]) -> Ceiling:
        """The fp32 engine's :class:`Ceiling` at ``shapes``."""
        engine = self.engine.engine
        return Ceiling(engine.model, engine.config.block_size, shapes)


PRECISIONS: dict[str, dict[str, Any]] = {
    "fp32": {"dtype": "float32"},
    "bf16": {"dtype": "bfloat16"},
    "int8": {"quantization": "int8"},
    "int4": {"quantization": "int4"},
}
"""The engine's weights, by name: EngineConfig fields (the transformers peer stays fp32)."""


def build(
    path: Path, s: Settings, *, with_transformers: bool = True, precision: str = "fp32"
) -> Setup:
    """Load both peers from ``path`` (transformers only when asked); size each engine's KV
    cache for its workloads. ``precision`` names the engine's weights (:data:`PRECISIONS`)."""
    longest = max(
        s.decode_prompt + s.decode_new,
        s.batch_requests * (s.batch_max_prompt + max(s.batch_new, s.batch_max_new)),
        2 * (s.prefix + s.suffix + 1),
    )
    weights = PRECISIONS[precision]
    engine = Engine.from_pretrained(
        path, EngineConfig(**weights, num_blocks=_blocks_for(longest), seed=0)
    )
    no_cache = Engine(
        engine.model,
        EngineConfig(
            **weights,
            num_blocks=_blocks_for(2 * (s.prefix + s.suffix + 1)),
            enable_prefix_caching=False,
            seed=0,
        ),
        engine.tokenizer,
    )
    hf_peer: TransformersPeer | None = None
    specials = set(engine.eos_token_ids)
    bos = engine.model.config.bos_token_id
    if bos is not None:
        specials.add(bos)
    high = min(specials, default=engine.model.config.vocab_size)
    if with_transformers:
        hf: Any = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        hf.eval()
        hf_peer = TransformersPeer(hf, high)
    return Setup(EnginePeer(engine), EnginePeer(no_cache), hf_peer, high)


def _blocks_for(tokens: int) -> int:
    """KV blocks (of the engine's default size) for ``tokens`` tokens, with 64 spare."""
    return tokens // EngineConfig().block_size + 64


@dataclass(frozen=True)
class Row:
    """One line of the result table; ratios are local_engine-better-when-higher."""

    metric: str
    engine: str
    peer: str
    ratio: float
    """Ratio of the two peers' best rounds; the verdict uses this one."""
    median_ratio: float
    """Median of the per-round ratios (each round runs both peers back to back)."""
    goal: float | None

    def cells(self) -> list[str]:
        """Table cells: metric, engine, peer, ratio, median ratio, goal, verdict."""
        goal = f">= {self.goal:g}x" if self.goal is not None else "info"
        result = verdict(self.ratio >= self.goal) if self.goal is not None else "-"
        return [
            self.metric,
            self.engine,
            self.peer,
            f"{self.ratio:.2f}x",
            f"{self.median_ratio:.2f}x",
            goal,
            result,
        ]


def bench_decode(setup: Setup, s: Settings) -> tuple[list[Row], bool, int]:
    """Workload 1; also returns whether the peers' greedy tokens agreed in every round and
    how many prompt tokens the engine found in its prefix cache (should be 0)."""

    def make(rnd: int) -> Prompts:
        return [_random_ids(random.Random(100 + rnd), s.decode_prompt, setup.token_high)]

    eng, hf = _rounds(
        s.reps,
        make,
        [
            lambda p: setup.engine.run(p, s.decode_new),
            lambda p: setup.transformers.run(p, s.decode_new),
        ],
    )
    match = all(e.tokens == h.tokens for e, h in zip(eng, hf, strict=True))
    shape = f"{s.decode_prompt}-token prompt, {s.decode_new} new"
    rows = [
        _rate_row(f"batch-1 decode tok/s ({shape})", eng, hf, "decode_rate", DECODE_GOAL),
        _rate_row("batch-1 end-to-end tok/s (same runs)", eng, hf, "end_to_end_rate", None),
    ]
    return rows, match, sum(r.cached for r in eng)


def batch_lengths(s: Settings) -> list[int]:
    """The batched workload's prompt lengths (the same every round)."""
    rng = random.Random(2)
    return [rng.randint(s.batch_min_prompt, s.batch_max_prompt) for _ in range(s.batch_requests)]


def batch_new_tokens(s: Settings) -> list[int]:
    """Workload 2(b)'s per-request new-token counts (the same every round)."""
    rng = random.Random(3)
    return [rng.randint(s.batch_min_new, s.batch_max_new) for _ in range(s.batch_requests)]


def bench_batch_mixed(setup: Setup, s: Settings) -> tuple[list[Row], str, int]:
    """Workload 2(b): mixed output lengths; also returns the matmul-ceiling note and the
    engine's prefix-cache hits."""
    lengths = batch_lengths(s)
    targets = batch_new_tokens(s)

    def make(rnd: int) -> Prompts:
        rng = random.Random(300 + rnd)
        return [_random_ids(rng, n, setup.token_high) for n in lengths]

    ceiling = setup.ceiling(setup.engine.step_shapes(make(s.batch_reps + 1), targets))
    eng, hf, _ = _rounds(
        s.batch_reps,
        make,
        [
            lambda p: setup.engine.run(p, targets),
            lambda p: setup.transformers.run(p, targets),
            ceiling.replay,
        ],
    )
    shape = (
        f"{s.batch_requests} requests, {s.batch_min_prompt}-{s.batch_max_prompt}-token "
        f"prompts, {s.batch_min_new}-{s.batch_max_new} new each"
    )
    row = _rate_row(f"total gen tok/s ({shape})", eng, hf, "end_to_end_rate", BATCH_GOAL)
    note = ceiling_note("2b, mixed outputs", hf, ceiling, eng, CEILING_GOAL)
    return [row], note, sum(r.cached for r in eng)


def bench_batch(setup: Setup, s: Settings) -> tuple[list[Row], list[str], int]:
    """Workload 2(a); also returns notes (matching outputs, token positions each peer runs
    through the model, the matmul ceiling) and the prompt tokens the engine found in its
    prefix cache.

    After the timed rounds, one more round (fresh prompts) pits the engine against
    transformers serving the requests one ``generate()`` at a time: an info row, since
    that peer is weaker than the static batch the verdict uses.
    """
    lengths = batch_lengths(s)

    def make(rnd: int) -> Prompts:
        rng = random.Random(200 + rnd)
        return [_random_ids(rng, n, setup.token_high) for n in lengths]

    ceiling = setup.ceiling(setup.engine.step_shapes(make(s.batch_reps + 1), s.batch_new))
    eng, hf, _ = _rounds(
        s.batch_reps,
        make,
        [
            lambda p: setup.engine.run(p, s.batch_new),
            lambda p: setup.transformers.run(p, s.batch_new),
            ceiling.replay,
        ],
    )
    same = sum(
        a == b
        for e, h in zip(eng, hf, strict=True)
        for a, b in zip(e.tokens, h.tokens, strict=True)
    )
    shape = (
        f"{s.batch_requests} requests, {s.batch_min_prompt}-{s.batch_max_prompt}-token "
        f"prompts, {s.batch_new} new each"
    )
    decodes = s.batch_requests * (s.batch_new - 1)
    ours = sum(lengths) + decodes
    theirs = s.batch_requests * max(lengths) + decodes
    note = (
        f"batched outputs identical: {same}/{s.batch_requests * len(eng)} prompts; "
        f"token positions run through the model: local_engine {ours} (prompts + decodes), "
        f"transformers {theirs} (left-padded prompts + decodes), so at equal per-token "
        f"efficiency the ratio would be about {theirs / ours:.2f}x"
    )
    row = _rate_row(f"total gen tok/s ({shape})", eng, hf, "end_to_end_rate", BATCH_GOAL)
    ceiling_line = ceiling_note("2a, equal outputs", hf, ceiling, eng, CEILING_GOAL)
    prompts = make(s.batch_reps + 2)
    one = [setup.engine.run(prompts, s.batch_new)]
    alone = [setup.transformers.run_one_at_a_time(prompts, s.batch_new)]
    sequential = _rate_row(
        "total gen tok/s (same workload, 1 round): transformers one request at a time",
        one,
        alone,
        "end_to_end_rate",
        None,
    )
    return [row, sequential], [note, ceiling_line], sum(r.cached for r in eng + one)


def bench_prefix(setup: Setup, s: Settings) -> tuple[list[Row], int, bool]:
    """Workload 3; also returns the fewest cached prompt tokens of a hit and whether the
    three peers' first tokens agreed in every round.

    Every round's prompt is the shared prefix plus a fresh suffix; the warm-up round
    leaves the prefix in the caching engine's cache.
    """
    prefix = _random_ids(random.Random(3), s.prefix, setup.token_high)

    def make(rnd: int) -> Prompts:
        return [prefix + _random_ids(random.Random(300 + rnd), s.suffix, setup.token_high)]

    hit, miss, hf = _rounds(
        s.reps,
        make,
        [
            lambda p: setup.engine.run(p, 1),
            lambda p: setup.engine_no_cache.run(p, 1),
            lambda p: setup.transformers.run(p, 1),
        ],
    )
    cached = min(r.cached for r in hit)
    agree = all(a.tokens == b.tokens == c.tokens for a, b, c in zip(hit, miss, hf, strict=True))
    hit_ms = [r.ttft * 1e3 for r in hit]
    miss_ms = [r.ttft * 1e3 for r in miss]
    hf_ms = [r.ttft * 1e3 for r in hf]
    total = s.prefix + s.suffix
    rows = [
        _latency_row(
            f"TTFT ms, {total}-token prompt: {cached} cached (hit) vs engine w/o prefix cache",
            hit_ms,
            miss_ms,
            PREFIX_GOAL,
        ),
        _latency_row("TTFT ms, prefix hit vs transformers (full prefill)", hit_ms, hf_ms, None),
        _latency_row("TTFT ms, engine w/o prefix cache vs transformers", miss_ms, hf_ms, None),
    ]
    return rows, cached, agree


def contention_runs(setup: Setup, s: Settings) -> tuple[list[Run], list[Run]]:
    """Workload 4's rounds: (contended runs, idle runs), paired by round.

    Each round runs batch-1 decode (workload 1's shape) twice, on two fresh prompts (so
    neither finds the other in the prefix cache), once while one busy process spins and once
    without, who goes first alternating; the busy process is started (and seen spinning)
    before the contended run and killed after it.
    """

    def make(rnd: int) -> Prompts:
        return [_random_ids(random.Random(500 + rnd), s.decode_prompt, setup.token_high)]

    def contended(prompts: Prompts) -> Run:
        other = [[(token + 1) % setup.token_high for token in prompt] for prompt in prompts]
        with busy_process(BUSY_LIMIT_S):
            return setup.engine.run(other, s.decode_new)

    busy, idle = _rounds(s.reps, make, [contended, lambda p: setup.engine.run(p, s.decode_new)])
    return busy, idle


def bench_contention(setup: Setup, s: Settings) -> tuple[list[Row], int]:
    """Workload 4 as a table row; also returns the prompt tokens found in the prefix cache
    (should be 0)."""
    busy, idle = contention_runs(setup, s)
    row = _rate_row(
        "batch-1 decode tok/s with one busy process (local_engine) vs idle (peer)",
        busy,
        idle,
        "decode_rate",
        CONTENTION_GOAL,
    )
    return [row], sum(r.cached for r in busy + idle)


def malloc_line() -> str:
    """The allocator settings in force (local_engine/cpu_memory.py): process-wide, so every
    peer in this process runs under them."""
    tuning = malloc_tuning()
    if tuning is None:
        return "glibc defaults (not tuned)"
    if not tuning.applied:
        return f"left as it is ({tuning.reason})"
    return (
        f"freed tensor memory kept (mmap threshold {MMAP_THRESHOLD >> 20} MiB, trim threshold "
        f"{TRIM_THRESHOLD >> 20} MiB), set by this script for the whole process: every peer "
        "here runs under it"
    )


def openmp_line() -> str:
    """The OpenMP wait settings in force, and who set them."""
    setup = openmp_setup()
    values = ", ".join(
        f"{name}={os.environ.get(name, 'unset')}" for name in (WAIT_POLICY_ENV, SPIN_COUNT_ENV)
    )
    if setup.applied:
        who = "local_engine's default"
    elif setup.user_set:
        who = "set in the environment"
    else:
        who = "GNU OpenMP's default spin: torch was loaded before local_engine"
    return f"{values} ({who})"


def profile_engine(setup: Setup, s: Settings) -> None:
    """Print cProfile's top 10 (cumulative, then internal time) for the engine's batch-1 and
    batched workloads."""
    rng = random.Random(400)  # prompts no earlier workload used: no prefix-cache hits
    decode_prompt = _random_ids(rng, s.decode_prompt, setup.token_high)
    batch = [_random_ids(rng, n, setup.token_high) for n in batch_lengths(s)]
    for title, prompts, new in (
        ("batch-1 decode", [decode_prompt], s.decode_new),
        (f"{s.batch_requests} concurrent requests", batch, s.batch_new),
    ):
        profiler = cProfile.Profile()
        profiler.enable()
        setup.engine.run(prompts, new)
        profiler.disable()
        for key in ("cumulative", "tottime"):
            buf = io.StringIO()
            pstats.Stats(profiler, stream=buf).sort_stats(key).print_stats(10)
            print(f"\n### cProfile: local_engine, {title} (top 10 by {key})\n")
            print("```")
            print(buf.getvalue().strip())
            print("```")


# ------------------------------------------------------------------ bf16 and int8 rows


QUANT_DECODE_GOAL = 2.0
"""Batch-1 decode of the int8 engine over the engine's own float32."""
QUANT_BATCH_GOAL = 3.0
"""32 concurrent requests, bf16 engine over transformers float32 ``generate()``."""
SAME_DTYPE_GOAL = 1.5
"""32 concurrent requests, bf16 engine over transformers bfloat16 ``generate()``."""


@dataclass
class QuantSetup:
    """The engine in bfloat16 and with int8 weights, and transformers in bfloat16."""

    bf16: EnginePeer
    int8: EnginePeer
    hf_bf16: TransformersPeer


def build_quant(path: Path, setup: Setup, s: Settings) -> QuantSetup:
    """Load the bf16 and int8 engines (KV cache sized as ``build`` does) and transformers
    in bfloat16."""
    longest = max(
        s.decode_prompt + s.decode_new,
        s.batch_requests * (s.batch_max_prompt + max(s.batch_new, s.batch_max_new)),
    )
    blocks = _blocks_for(longest)
    bf16 = Engine.from_pretrained(path, EngineConfig(dtype="bfloat16", num_blocks=blocks, seed=0))
    int8 = Engine.from_pretrained(
        path, EngineConfig(quantization="int8", num_blocks=blocks, seed=0)
    )
    hf: Any = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    hf.eval()
    return QuantSetup(
        EnginePeer(bf16), EnginePeer(int8), TransformersPeer(hf, setup.transformers.pad)
    )


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def bench_quant_decode(setup: Setup, qs: QuantSetup, s: Settings) -> tuple[list[Row], str]:
    """Batch-1 decode of the engine in bf16 and with int8 weights against the same engine in
    float32 (workload 1's prompt shape), all three in every round; also returns how long
    each one's greedy tokens stayed identical to float32's."""

    def make(rnd: int) -> Prompts:
        return [_random_ids(random.Random(500 + rnd), s.decode_prompt, setup.token_high)]

    fp32, bf16, int8 = _rounds(
        s.reps,
        make,
        [
            lambda p: setup.engine.run(p, s.decode_new),
            lambda p: qs.bf16.run(p, s.decode_new),
            lambda p: qs.int8.run(p, s.decode_new),
        ],
    )
    shape = f"{s.decode_prompt}-token prompt, {s.decode_new} new"
    rows = [
        _rate_row(
            f"batch-1 decode tok/s ({shape}): bf16 engine vs fp32 engine",
            bf16,
            fp32,
            "decode_rate",
            None,
        ),
        _rate_row(
            "batch-1 decode tok/s (same): int8 engine vs fp32 engine",
            int8,
            fp32,
            "decode_rate",
            QUANT_DECODE_GOAL,
        ),
    ]
    agree = {
        name: statistics.median(
            _common_prefix(r.tokens[0], f.tokens[0]) for r, f in zip(runs, fp32, strict=True)
        )
        for name, runs in (("bf16", bf16), ("int8", int8))
    }
    note = (
        f"batch-1 greedy tokens identical to the fp32 engine's for the first "
        f"{agree['bf16']:g} (bf16) and {agree['int8']:g} (int8) of {s.decode_new} tokens "
        "(median over rounds; random weights give flat logits, so rounding flips them early)"
    )
    return rows, note


def bench_quant_batch(setup: Setup, qs: QuantSetup, s: Settings) -> tuple[list[Row], list[str]]:
    """Workload 2(a) for the bf16 and int8 engines against transformers in float32 and in
    bfloat16, all four in every round; also returns the bf16 and int8 ceiling notes."""
    lengths = batch_lengths(s)

    def make(rnd: int) -> Prompts:
        rng = random.Random(600 + rnd)
        return [_random_ids(rng, n, setup.token_high) for n in lengths]

    bf16, int8, hf32, hf16 = _rounds(
        s.batch_reps,
        make,
        [
            lambda p: qs.bf16.run(p, s.batch_new),
            lambda p: qs.int8.run(p, s.batch_new),
            lambda p: setup.transformers.run(p, s.batch_new),
            lambda p: qs.hf_bf16.run(p, s.batch_new),
        ],
    )
    shape = f"{s.batch_requests} requests, {s.batch_new} new each"
    rows = [
        _rate_row(
            f"total gen tok/s ({shape}): bf16 engine vs transformers fp32",
            bf16,
            hf32,
            "end_to_end_rate",
            QUANT_BATCH_GOAL,
        ),
        _rate_row(
            "total gen tok/s (same): bf16 engine vs transformers bf16",
            bf16,
            hf16,
            "end_to_end_rate",
            SAME_DTYPE_GOAL,
        ),
        _rate_row(
            "total gen tok/s (same): int8 engine vs transformers fp32",
            int8,
            hf32,
            "end_to_end_rate",
            None,
        ),
        _rate_row(
            "total gen tok/s (same): int8 engine vs transformers bf16",
            int8,
            hf16,
            "end_to_end_rate",
            None,
        ),
    ]
    notes = []
    for label, peer in (("bf16", qs.bf16), ("int8", qs.int8)):
        shapes = peer.step_shapes(make(s.batch_reps + 1), s.batch_new)
        ceiling = Ceiling(peer.engine.model, peer.engine.config.block_size, shapes)
        notes.append(
            ceiling_note(
                f"2a, {label} engine vs transformers bf16", hf16, ceiling.measure(s.batch_reps)
            )
        )
    return rows, notes


def run_quant(path: Path, setup: Setup, s: Settings, threads: int, *, quick: bool) -> None:
    """Workload 5: build the bf16 and int8 peers, run their rows, print their table."""
    qs = build_quant(path, setup, s)
    load_before = os.getloadavg()
    wall = time.perf_counter()
    decode_rows, decode_note = bench_quant_decode(setup, qs, s)
    batch_rows, batch_notes = bench_quant_batch(setup, qs, s)
    wall = time.perf_counter() - wall
    load_after = os.getloadavg()
    print(f"## local_engine in bf16 and int8, CPU ({'quick' if quick else 'full'} run)\n")
    print(
        f"- model: {MODEL_NAME} (random weights), torch {torch.__version__}, "
        f"transformers {transformers.__version__}; int8: weight-only, per-channel scales, "
        "bf16 activations"
    )
    print(
        f"- torch threads: {threads}; machine: {os.cpu_count()} CPUs, SHARED (1-min load "
        f"average {load_before[0]:.1f} before, {load_after[0]:.1f} after); same rounds and "
        f"best-of rules as above; workloads took {wall:.0f} s\n"
    )
    headers = ["metric", "local_engine", "peer", "ratio", "median ratio", "goal", "result"]
    print(markdown_table(headers, [r.cells() for r in decode_rows + batch_rows]))
    print()
    for line in [decode_note, *batch_notes]:
        print(line)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the chosen workloads and print the markdown table; exit 0 even on FAIL."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small smoke run")
    parser.add_argument("--reps", type=int, default=None, help="timed rounds of every workload")
    parser.add_argument("--threads", type=int, default=2, help="torch threads for both peers")
    parser.add_argument("--profile", action="store_true", help="cProfile the engine workloads")
    parser.add_argument(
        "--only",
        action="append",
        choices=WORKLOADS,
        help="run only this workload (repeatable; default: all; quant: bf16 and int8)",
    )
    parser.add_argument(
        "--spec-model",
        help="model directory for workload 6, or 'random' (default: the trained default model)",
    )
    parser.add_argument(
        "--spec-tokens",
        type=int,
        default=SpeculativeConfig.num_speculative_tokens,
        help="draft tokens per step in workload 7 (SpeculativeConfig's default)",
    )
    parser.add_argument(
        "--spec-threads",
        type=int,
        default=1,
        help="torch threads for both peers of workload 7 (1: the faster setting for the "
        "3.2M default model at batch 1, with or without speculation)",
    )
    args = parser.parse_args(argv)
    chosen = set(args.only or WORKLOADS)
    s = QUICK if args.quick else FULL
    if args.reps is not None:
        if args.reps < 1:
            parser.error("--reps must be >= 1")
        s = Settings(**{**s.__dict__, "reps": args.reps, "batch_reps": args.reps})
    if args.threads < 1 or args.spec_threads < 1:
        parser.error("--threads and --spec-threads must be >= 1")
    torch.set_num_threads(args.threads)
    # This script owns its process and steps its engines on the main thread: keep freed
    # tensor memory for the next step (an Engine never sets process-wide state itself).
    apply_process_settings(EngineConfig(), steps_on_main_thread=True)
    torch.manual_seed(0)
    hf_logging: Any = transformers.logging
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    if "spec" in chosen:
        run_spec(
            args.spec_model,
            quick=args.quick,
            reps=s.reps,
            threads=args.spec_threads,
            k=args.spec_tokens,
        )
        torch.set_num_threads(args.threads)
        chosen.discard("spec")
        if not chosen:
            return 0
        print()
    path = ensure_default_model(MODEL_NAME)
    setup = build(path, s, with_transformers=bool(chosen - {"contention", "grammar", "n"}))
    if chosen == {"quant"}:
        run_quant(path, setup, s, args.threads, quick=args.quick)
        return 0
    if chosen == {"grammar"}:
        run_grammar(setup, s, args.threads, quick=args.quick)
        return 0
    if chosen == {"n"}:
        run_n(setup, s, args.threads, quick=args.quick)
        return 0
    load_before = os.getloadavg()
    wall = time.perf_counter()
    rows: list[Row] = []
    notes: list[str] = []
    cached_in_fresh = 0
    if "decode" in chosen:
        decode_rows, decode_match, decode_cached = bench_decode(setup, s)
        rows += decode_rows
        cached_in_fresh += decode_cached
        notes.append(
            f"outputs match: {'yes' if decode_match else 'no'} (batch-1 greedy tokens, every round)"
        )
    if "batch" in chosen:
        batch_rows, batch_notes, batch_cached = bench_batch(setup, s)
        mixed_rows, mixed_note, mixed_cached = bench_batch_mixed(setup, s)
        rows += batch_rows + mixed_rows
        notes += [*batch_notes, mixed_note]
        cached_in_fresh += batch_cached + mixed_cached
    if "prefix" in chosen:
        prefix_rows, cached, ttft_agree = bench_prefix(setup, s)
        rows += prefix_rows
        notes.append(
            f"TTFT first tokens agree (hit, no cache, transformers): "
            f"{'yes' if ttft_agree else 'no'}"
        )
        notes.append(
            f"prefix hit served {cached} of {s.prefix + s.suffix} prompt tokens from the cache"
        )
    if "contention" in chosen:
        contention_rows, contention_cached = bench_contention(setup, s)
        rows += contention_rows
        cached_in_fresh += contention_cached
    wall = time.perf_counter() - wall
    load_after = os.getloadavg()

    print(f"## local_engine vs transformers, CPU fp32 ({'quick' if args.quick else 'full'} run)\n")
    print(
        f"- model: {MODEL_NAME} (random weights), torch {torch.__version__}, "
        f"transformers {transformers.__version__}, python {platform.python_version()}"
    )
    backend = setup.engine.engine.model.attention
    name = getattr(backend, "name", type(backend).__name__)
    if name == "cpu":
        loaded = getattr(backend, "kernel", None) is not None
        name += " (native paged-decode kernel)" if loaded else " (kernel unavailable: SDPA)"
    print(f"- local_engine attention backend: {name}")
    print(f"- OpenMP wait: {openmp_line()}")
    print(f"- malloc: {malloc_line()}")
    print(
        f"- torch threads: {args.threads} for both peers; machine: {os.cpu_count()} CPUs, "
        f"SHARED with other running jobs (1-min load average {load_before[0]:.1f} before, "
        f"{load_after[0]:.1f} after): absolute numbers are noisy"
    )
    print(
        f"- workloads: {', '.join(w for w in WORKLOADS if w in chosen)}; {s.reps} timed rounds "
        f"per workload ({s.batch_reps} for the batched one) after a "
        "warm-up round; every round uses fresh prompts and runs the peers back to back, who "
        "goes first rotating; values are each peer's best round (load only ever adds time), "
        "`ratio` compares the bests, `median ratio` is the median of per-round ratios; "
        f"higher = local_engine better; workloads took {wall:.0f} s\n"
    )
    headers = ["metric", "local_engine", "peer", "ratio", "median ratio", "goal", "result"]
    print(markdown_table(headers, [r.cells() for r in rows]))
    print()
    for line in notes:
        print(line)
    print(
        f"prefix-cache hits in the workloads with fresh prompts: {cached_in_fresh} prompt "
        "tokens (fresh prompts every round)"
    )
    if args.profile:
        profile_engine(setup, s)
    if "quant" in chosen:
        print()
        run_quant(path, setup, s, args.threads, quick=args.quick)
    if "grammar" in chosen:
        print()
        run_grammar(setup, s, args.threads, quick=args.quick)
    if "n" in chosen:
        print()
        run_n(setup, s, args.threads, quick=args.quick)
    return 0


def run_n(setup: Setup, s: Settings, threads: int, *, quick: bool) -> None:
    """Workload 8: n=4 choices against four separate requests; its own table."""
    from _n_rows import NShape, n_report

    print(f"## local_engine: n=4 against four requests, CPU ({'quick' if quick else 'full'})\n")
    print(f"- model: {MODEL_NAME} (random weights), fp32, torch threads: {threads}")
    shared = setup.engine.engine
    # The goal's shape first: a long prompt, short replies (several candidates for one long
    # context); then the shape the row had before, for information.
    shapes = (
        [NShape(512, 8, goal=True), NShape(128, 8, goal=False)]
        if quick
        else [NShape(1024, 16, goal=True), NShape(512, 32, goal=False)]
    )
    tokens = max(shape.prompt_tokens + shape.new_tokens for shape in shapes)
    engine, uncached = (
        Engine(
            shared.model,
            EngineConfig(
                dtype="float32",
                num_blocks=_blocks_for(8 * tokens),
                seed=0,
                enable_prefix_caching=cache,
            ),
            shared.tokenizer,
        )
        for cache in (True, False)
    )
    print(n_report(engine, uncached, setup.token_high, reps=s.reps, shapes=shapes))


def run_grammar(setup: Setup, s: Settings, threads: int, *, quick: bool) -> None:
    """Workload 6: constrained against unconstrained decode on the engine; its own table."""
    print(f"## local_engine: grammar-constrained decoding, CPU ({'quick' if quick else 'full'})\n")
    print(f"- model: {MODEL_NAME} (random weights), fp32, torch threads: {threads}")
    shared = setup.engine.engine
    # No prefix cache: both peers decode the same prompts, and the second would reuse them.
    engine = Engine(
        shared.model,
        EngineConfig(
            dtype="float32",
            num_blocks=_blocks_for(32 * (s.decode_prompt + s.decode_new)),
            enable_prefix_caching=False,
            seed=0,
        ),
        shared.tokenizer,
    )
    print(
        grammar_report(
            engine,
            setup.token_high,
            reps=s.reps,
            new_tokens=s.decode_new,
            prompt_tokens=s.decode_prompt,
        )
    )


if __name__ == "__main__":
    sys.exit(main())
