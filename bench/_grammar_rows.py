"""Workload 6 of bench/engine_cpu.py: the cost of grammar-constrained decoding per token.

The same engine decodes the same prompts twice per round, unconstrained and under a JSON
schema grammar (an array of at least 1,000 objects with strings, an enum, a bounded integer,
a string array and a nested object, so no reply can finish early and every token is masked);
who goes first alternates. Both peers generate exactly ``new_tokens`` tokens per request
(``ignore_eos``), so the difference is the masking's cost: computing the masks (in the
engine's worker thread, during the forward pass), waiting for any part that did not overlap,
applying them to the logits and advancing the matchers. Reported at batch 1 and 32, as
tokens/s (wall clock, best round) and as the process CPU time added per decode step and per
generated token (``time.process_time``, every thread of the process: the median of the
per-round differences), which a busy machine disturbs far less than wall time.
"""

from __future__ import annotations

import os
import random
import statistics
import time
from collections.abc import Sequence
from typing import Any

from _util import markdown_table, ratio

from local_engine.engine import Engine, SamplingParams
from local_engine.grammar import json_schema_grammar

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
) -> tuple[float, float]:
    """Generate for every prompt at once; return (wall, process CPU) seconds; check the
    token counts."""
    start, cpu = time.perf_counter(), time.process_time()
    results = engine.generate(prompts, params)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    counts = {len(r.token_ids) for r in results}
    if counts != {params.max_tokens}:
        raise RuntimeError(f"expected {params.max_tokens} tokens per request, got {counts}")
    return wall, cpu


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
    for batch in (1, 32):
        times: dict[str, list[float]] = {"plain": [], "grammar": []}
        cpu: dict[str, list[float]] = {"plain": [], "grammar": []}
        for rnd in range(reps + 1):
            rng = random.Random(600 + rnd)
            prompts = [
                [rng.randrange(token_high) for _ in range(prompt_tokens)] for _ in range(batch)
            ]
            order = ["plain", "grammar"] if rnd % 2 else ["grammar", "plain"]
            for name in order:
                seconds, cpu_seconds = _run(
                    engine, prompts, plain if name == "plain" else constrained
                )
                if rnd:  # round 0 warms up (and compiles the grammar)
                    times[name].append(seconds)
                    cpu[name].append(cpu_seconds)
        best_plain, best_grammar = min(times["plain"]), min(times["grammar"])
        tokens = batch * new_tokens
        added = statistics.median(g - p for g, p in zip(cpu["grammar"], cpu["plain"], strict=True))
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
    ]
    return "\n".join(lines)
