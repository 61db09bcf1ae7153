"""Workload 8 of bench/engine_cpu.py: ``n=4`` choices of one prompt against four requests.

One request asking for ``n=4`` choices (the chat service's fan-out: the four are added at
once; choice 0 computes the prompt, and the other three join the next step, taking the
prompt's full KV blocks from the prefix cache and computing only its last partial block)
against the same prompt sent as four separate requests at once (each computes the prompt:
they are added together, before any of its blocks is cached). Same engine, prefix cache on,
sampled at temperature 1, exactly ``new_tokens`` tokens per choice (``ignore_eos``); a fresh
random prompt per round and peer, so no round reuses another's blocks; who goes first
alternates. Throughput is generated tokens over wall time (best round).

Only the prompt's compute is saved, so the ratio depends on the shape: it approaches 4x
where the prompt is nearly all the work and 1x where decoding is. Each shape is a row whose
label states it; the goal (n=4 >= 2x the four requests) applies to the long-prompt,
short-reply shape ``n`` is used for (several candidate replies to one long context), and
the other rows are printed for information. The prompt tokens each peer computed per round
are printed beside the rates (from the requests' ``num_cached_tokens``).
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

import anyio
from _util import markdown_table, ratio, verdict

from local_engine.async_engine import AsyncEngine
from local_engine.chat import ChatPrompt
from local_engine.engine import Engine, RequestOutput, SamplingParams
from local_engine.service import PreparedRequest, _fan_out

__all__ = ["NShape", "n_report"]

N = 4
GOAL = 2.0


@dataclass(frozen=True)
class NShape:
    """One row's workload: the prompt's length, the tokens each choice generates, and
    whether the goal applies (False: printed for information)."""

    prompt_tokens: int
    new_tokens: int
    goal: bool


@dataclass
class _Round:
    """What one peer's requests did in a round."""

    generated: int = 0
    computed_prompt: int = 0  # prompt tokens not served by the prefix cache

    def add(self, final: RequestOutput) -> None:
        self.generated += final.num_generated_tokens
        self.computed_prompt += final.num_prompt_tokens - final.num_cached_tokens


async def _fanned(engine: AsyncEngine, prompt: list[int], params: SamplingParams) -> _Round:
    prepared = PreparedRequest(ChatPrompt("", prompt, "none"), params, None)
    done = _Round()
    finished = 0
    async with _fan_out(engine, prepared, N) as outputs:
        async for _, out in outputs:
            if out.finished:
                done.add(out)
                finished += 1
                if finished == N:
                    break
    return done


async def _separate(engine: AsyncEngine, prompt: list[int], params: SamplingParams) -> _Round:
    done = _Round()

    async def one() -> None:
        async with engine.stream(prompt, params) as outputs:
            async for out in outputs:
                if out.finished:
                    done.add(out)

    async with anyio.create_task_group() as group:
        for _ in range(N):
            group.start_soon(one)
    return done


def _rounds(
    engine: Engine, rng: random.Random, token_high: int, shape: NShape, reps: int
) -> tuple[dict[str, list[float]], dict[str, int]]:
    """Each peer's rate (generated tokens/s) per timed round, and the prompt tokens it
    computed in a round."""
    params = SamplingParams(temperature=1.0, max_tokens=shape.new_tokens, ignore_eos=True)
    rates: dict[str, list[float]] = {"n": [], "separate": []}
    computed: dict[str, int] = {}

    async def run() -> None:
        async with AsyncEngine(engine) as running:
            for round_ in range(reps + 1):  # round 0 warms up
                order = ["n", "separate"] if round_ % 2 == 0 else ["separate", "n"]
                for peer in order:
                    prompt = [rng.randrange(token_high) for _ in range(shape.prompt_tokens)]
                    start = time.perf_counter()
                    if peer == "n":
                        done = await _fanned(running, prompt, params)
                    else:
                        done = await _separate(running, prompt, params)
                    elapsed = time.perf_counter() - start
                    assert done.generated == N * shape.new_tokens, done
                    computed[peer] = done.computed_prompt
                    if round_:
                        rates[peer].append(done.generated / elapsed)

    anyio.run(run)
    return rates, computed


def n_report(engine: Engine, token_high: int, *, reps: int, shapes: Sequence[NShape]) -> str:
    """Run the workload at each shape on ``engine`` (prefix cache on); return its table."""
    rng = random.Random(8)
    rows = []
    for shape in shapes:
        rates, computed = _rounds(engine, rng, token_high, shape, reps)
        best_n, best_sep = max(rates["n"]), max(rates["separate"])
        per_round = [a / b for a, b in zip(rates["n"], rates["separate"], strict=True)]
        goal = f">= {GOAL:.1f}x {verdict(best_n / best_sep >= GOAL)}" if shape.goal else "info"
        rows.append(
            [
                f"n={N}, prompt {shape.prompt_tokens}, {shape.new_tokens} new tokens each",
                f"{best_n:.1f}",
                f"{best_sep:.1f}",
                f"{ratio(best_n, best_sep):.2f}x",
                f"{statistics.median(per_round):.2f}x",
                f"{computed['n']} / {computed['separate']}",
                goal,
            ]
        )
    headers = [
        "workload",
        f"n={N} tok/s",
        f"{N} requests tok/s",
        "best ratio",
        "median",
        "prompt tokens computed",
        "goal",
    ]
    return markdown_table(headers, rows)
