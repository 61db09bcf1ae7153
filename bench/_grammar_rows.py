"""Workload 6 of bench/engine_cpu.py: the cost of grammar-constrained decoding per token.

The same engine decodes the same prompts twice per round, unconstrained and under a JSON
schema grammar (an array of at least 1,000 objects with strings, an enum, a bounded integer,
a string array and a nested object, so no reply can finish early and every token is masked);
who goes first alternates (the engine has no prefix cache, so neither reuses the other's
prompts). Both peers generate exactly ``new_tokens`` tokens per request
(``ignore_eos``), so the difference is the masking's cost: computing the masks (in the
engine's worker thread, during the forward pass), waiting for any part that did not overlap,
applying them to the logits and advancing the matchers. Reported at batch 1 and 32, as
tokens/s (wall clock, best round) and as the process CPU time added per decode step and per
generated token (``time.process_time``, every thread of the process: the median of the
per-round differences). A busy machine disturbs both, so the masking work is also timed on
its own: the constrained run's tokens are replayed through fresh matchers, step by step,
timing the mask computation (started and waited for at once, so none of it overlaps a
forward pass: the most it can add), applying the masks to a step's logits, and advancing
the matchers (medians over the steps).
"""

from __future__ import annotations

import os
import random
import statistics
import time
from collections.abc import Sequence
from typing import Any

import torch
from _util import markdown_table, ratio

from local_engine.engine import Engine, SamplingParams
from local_engine.grammar import Grammar, json_schema_grammar
from local_engine.sequence import Sequence as EngineSequence

__all__ = ["SCHEMA", "grammar_report"]

_ITEM: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 40},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
        "location": {
            "type": "object",
            "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}},
            "required": ["lat", "lon"],
            "additionalProperties": False,
        },
    },
    "required": ["city", "unit", "days", "tags", "location"],
    "additionalProperties": False,
}
SCHEMA: dict[str, Any] = {"type": "array", "items": _ITEM, "minItems": 1000}
"""A schema no reply of the benchmark's length can complete: every token is constrained."""


def _run(
    engine: Engine, prompts: Sequence[list[int]], params: SamplingParams
) -> tuple[float, float, list[list[int]]]:
    """Generate for every prompt at once; return (wall, process CPU) seconds and the tokens;
    check the token counts."""
    start, cpu = time.perf_counter(), time.process_time()
    results = engine.generate(prompts, params)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    counts = {len(r.token_ids) for r in results}
    if counts != {params.max_tokens}:
        raise RuntimeError(f"expected {params.max_tokens} tokens per request, got {counts}")
    return wall, cpu, [r.token_ids for r in results]


def _replay(engine: Engine, grammar: Grammar, tokens: list[list[int]]) -> tuple[float, ...]:
    """Median seconds per step to compute the masks, apply them and advance the matchers,
    replaying ``tokens`` (one list per request) through fresh matchers."""
    structured = engine.structured
    if structured is None:
        raise RuntimeError("the engine has no tokenizer")
    seqs = [
        EngineSequence(f"replay-{i}", [0], SamplingParams(grammar=grammar))
        for i in range(len(tokens))
    ]
    for seq in seqs:
        structured.add(seq.request_id, grammar)
    logits = torch.zeros(len(seqs), engine.model.config.vocab_size)
    spans: list[list[float]] = [[], [], []]
    try:
        for step in range(len(tokens[0])):
            t0 = time.perf_counter()
            mask = structured.begin(seqs)
            if mask is None:
                raise RuntimeError("no constrained row")
            mask.wait()
            t1 = time.perf_counter()
            mask.apply(logits)
            t2 = time.perf_counter()
            for seq, ids in zip(seqs, tokens, strict=True):
                structured.accept(seq.request_id, ids[step])
            t3 = time.perf_counter()
            for span, seconds in zip(spans, (t1 - t0, t2 - t1, t3 - t2), strict=True):
                span.append(seconds)
    finally:
        for seq in seqs:
            structured.release(seq.request_id)
    return tuple(statistics.median(span) for span in spans)


def grammar_report(
    engine: Engine, token_high: int, *, reps: int, new_tokens: int, prompt_tokens: int
) -> str:
    """Run the workload at batch 1 and 32 and return its markdown table and notes."""
    grammar = json_schema_grammar(SCHEMA)
    plain = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    constrained = SamplingParams(
        max_tokens=new_tokens, temperature=0.0, ignore_eos=True, grammar=grammar
    )
    load_before = os.getloadavg()
    wall = time.perf_counter()
    rows: list[list[object]] = []
    work: list[list[object]] = []
    for batch in (1, 32):
        times: dict[str, list[float]] = {"plain": [], "grammar": []}
        cpu: dict[str, list[float]] = {"plain": [], "grammar": []}
        replay_tokens: list[list[int]] = []
        for rnd in range(reps + 1):
            rng = random.Random(600 + rnd)
            prompts = [
                [rng.randrange(token_high) for _ in range(prompt_tokens)] for _ in range(batch)
            ]
            order = ["plain", "grammar"] if rnd % 2 else ["grammar", "plain"]
            for name in order:
                seconds, cpu_seconds, generated = _run(
                    engine, prompts, plain if name == "plain" else constrained
                )
                if name == "grammar":
                    replay_tokens = generated
                if rnd:  # round 0 warms up (and compiles the grammar)
                    times[name].append(seconds)
                    cpu[name].append(cpu_seconds)
        best_plain, best_grammar = min(times["plain"]), min(times["grammar"])
        tokens = batch * new_tokens
        added = statistics.median(g - p for g, p in zip(cpu["grammar"], cpu["plain"], strict=True))
        compute, apply, advance = _replay(engine, grammar, replay_tokens)
        work.append(
            [
                f"batch {batch}: masking work per step, replayed",
                f"{compute * 1e6:.0f}",
                f"{apply * 1e6:.0f}",
                f"{advance * 1e6:.0f}",
                f"{(compute + apply + advance) * 1e6:.0f}",
                f"{(compute + apply + advance) / batch * 1e6:.1f}",
            ]
        )
        rows.append(
            [
                f"batch {batch}: tok/s, JSON schema vs unconstrained",
                f"{tokens / best_grammar:.1f}",
                f"{tokens / best_plain:.1f}",
                f"{ratio(best_plain, best_grammar):.2f}x",
                f"{statistics.median(cpu['plain']) / new_tokens * 1e6:.0f}",
                f"{added / new_tokens * 1e6:.0f}",
                f"{added / tokens * 1e6:.1f}",
            ]
        )
    wall = time.perf_counter() - wall
    load_after = os.getloadavg()
    headers = [
        "metric",
        "grammar",
        "unconstrained",
        "ratio",
        "CPU µs/step unconstrained",
        "CPU µs/step added",
        "CPU µs/token added",
    ]
    lines = [
        f"- {new_tokens} greedy tokens per request, {prompt_tokens}-token random prompts, "
        f"{reps} timed rounds after a warm-up; 1-min load average {load_before[0]:.1f} "
        f"before, {load_after[0]:.1f} after; took {wall:.0f} s",
        "- tok/s: wall clock, best round; ratio: grammar tok/s over unconstrained (1.00x = "
        "free); CPU µs: process CPU (all threads) per decode step, and what the grammar "
        "adds per step and per generated token (median of per-round differences)\n",
        markdown_table(headers, rows),
        "",
        markdown_table(
            [
                "metric",
                "mask µs (worker, waited at once)",
                "apply µs",
                "advance µs",
                "total µs/step",
                "µs/token",
            ],
            work,
        ),
    ]
    return "\n".join(lines)
