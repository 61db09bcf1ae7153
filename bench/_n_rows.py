"""Workload 8 of bench/engine_cpu.py: ``n=4`` choices of one prompt against four requests.

One request asking for ``n=4`` choices (the chat service's fan-out: choice 0 first, the
other three once its prompt is computed, taking the prompt's full KV blocks from the prefix
cache) against the same prompt sent as four separate requests at once (each computes the
prompt: they are added together, before any of its blocks is cached). Same engine, prefix
cache on, sampled at temperature 1, exactly ``new_tokens`` tokens per choice
(``ignore_eos``); a fresh random prompt per round and peer, so no round reuses another's
blocks; who goes first alternates. Throughput is generated tokens over wall time (best
round). Goal: n=4 >= 2x the four requests (the prompt is computed once, not four times).
"""

from __future__ import annotations

import random
import statistics
import time

import anyio
from _util import markdown_table, ratio

from local_engine.async_engine import AsyncEngine
from local_engine.chat import ChatPrompt
from local_engine.engine import Engine, SamplingParams
from local_engine.service import PreparedRequest, _fan_out

__all__ = ["n_report"]

N = 4
GOAL = 2.0


async def _fanned(engine: AsyncEngine, prompt: list[int], params: SamplingParams) -> int:
    prepared = PreparedRequest(ChatPrompt("", prompt, "none"), params, None)
    finished = generated = 0
    async with _fan_out(engine, prepared, N) as outputs:
        async for _, out in outputs:
            if out.finished:
                finished += 1
                generated += out.num_generated_tokens
                if finished == N:
                    break
    return generated


async def _separate(engine: AsyncEngine, prompt: list[int], params: SamplingParams) -> int:
    counts: list[int] = []

    async def one() -> None:
        async with engine.stream(prompt, params) as outputs:
            async for out in outputs:
                if out.finished:
                    counts.append(out.num_generated_tokens)

    async with anyio.create_task_group() as group:
        for _ in range(N):
            group.start_soon(one)
    return sum(counts)


def n_report(
    engine: Engine, token_high: int, *, reps: int, prompt_tokens: int, new_tokens: int
) -> str:
    """Run the workload on ``engine`` (prefix cache on) and return its markdown table."""
    params = SamplingParams(temperature=1.0, max_tokens=new_tokens, ignore_eos=True)
    rng = random.Random(8)
    rates: dict[str, list[float]] = {"n": [], "separate": []}

    async def run() -> None:
        async with AsyncEngine(engine) as running:
            for round_ in range(reps + 1):  # round 0 warms up
                order = ["n", "separate"] if round_ % 2 == 0 else ["separate", "n"]
                for peer in order:
                    prompt = [rng.randrange(token_high) for _ in range(prompt_tokens)]
                    start = time.perf_counter()
                    if peer == "n":
                        tokens = await _fanned(running, prompt, params)
                    else:
                        tokens = await _separate(running, prompt, params)
                    elapsed = time.perf_counter() - start
                    assert tokens == N * new_tokens, tokens
                    if round_:
                        rates[peer].append(tokens / elapsed)

    anyio.run(run)
    best_n, best_sep = max(rates["n"]), max(rates["separate"])
    per_round = [a / b for a, b in zip(rates["n"], rates["separate"], strict=True)]
    verdict = "PASS" if best_n / best_sep >= GOAL else "FAIL"
    rows = [
        [
            f"n={N}, prompt {prompt_tokens}, {new_tokens} new tokens each",
            f"{best_n:.1f}",
            f"{best_sep:.1f}",
            f"{ratio(best_n, best_sep):.2f}x",
            f"{statistics.median(per_round):.2f}x",
            f">= {GOAL:.1f}x {verdict}",
        ]
    ]
    headers = ["workload", "n=4 tok/s", "4 requests tok/s", "best ratio", "median", "goal"]
    return markdown_table(headers, rows)
