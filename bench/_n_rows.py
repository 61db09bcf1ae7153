"""Workload 8 of bench/engine_cpu.py: ``n=4`` choices of one prompt against four requests.

One request asking for ``n=4`` choices (the chat service's fan-out: the four are added at
once; choice 0 computes the prompt, and the other three join the next step, taking the
prompt's full KV blocks from the prefix cache and computing only its last partial block)
against the same prompt sent as four separate requests at once, on the same engine (prefix
cache on), and on a second engine over the same model with the prefix cache off. Sampled
at temperature 1, exactly ``new_tokens`` tokens per choice (``ignore_eos``); a fresh random
prompt per round and peer, so no round reuses another's blocks; who goes first rotates.
Throughput is generated tokens over wall time (best round).

Only the prompt's compute is saved, so the ratio depends on the shape: it approaches 4x
where the prompt is nearly all the work and 1x where decoding is. Each shape is a row whose
label states it; the goal (n=4 >= 2x the four requests) applies to the long-prompt,
short-reply shape ``n`` is used for (several candidate replies to one long context), and
the other rows are printed for information. The prompt tokens each peer computed per round
are printed beside the rates (from the requests' ``num_cached_tokens``).

The four requests on the cached engine share the prompt too once it is longer than a step's
token budget: the engine prefills it in chunks, so when the later requests' prefill starts,
the first one's leading blocks are cached and they take them (at 1,024 tokens about two
prompts computed in all, not four). That bounds the ratio against them below 2x at any shape
that decodes at all. The goal's premise ("the prompt is computed once" against four times) is
measured by a third peer, the four requests on a second engine over the same model with the
prefix cache off (a server without one); both ratios are printed, each with the goal.
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


PEERS = ("n", "separate", "uncached")


def _rounds(
    engines: tuple[Engine, Engine],
    rng: random.Random,
    token_high: int,
    shape: NShape,
    reps: int,
) -> tuple[dict[str, list[float]], dict[str, int]]:
    """Each peer's rate (generated tokens/s) per timed round, and the prompt tokens it
    computed in a round. ``engines``: the one with the prefix cache, the one without."""
    params = SamplingParams(temperature=1.0, max_tokens=shape.new_tokens, ignore_eos=True)
    rates: dict[str, list[float]] = {peer: [] for peer in PEERS}
    computed: dict[str, int] = {}

    async def run() -> None:
        async with AsyncEngine(engines[0]) as cached, AsyncEngine(engines[1]) as uncached:
            for round_ in range(reps + 1):  # round 0 warms up
                shift = round_ % len(PEERS)
                for peer in PEERS[shift:] + PEERS[:shift]:
                    prompt = [rng.randrange(token_high) for _ in range(shape.prompt_tokens)]
                    start = time.perf_counter()
                    if peer == "n":
                        done = await _fanned(cached, prompt, params)
                    else:
                        done = await _separate(
                            cached if peer == "separate" else uncached, prompt, params
                        )
                    elapsed = time.perf_counter() - start
                    assert done.generated == N * shape.new_tokens, done
                    computed[peer] = done.computed_prompt
                    if round_:
                        rates[peer].append(done.generated / elapsed)

    anyio.run(run)
    return rates, computed


def n_report(
    engine: Engine, uncached: Engine, token_high: int, *, reps: int, shapes: Sequence[NShape]
) -> str:
    """Run the workload at each shape on ``engine`` (prefix cache on) and, for the third
    peer, ``uncached`` (the same model, prefix cache off); return its table."""
    if not engine.pool.enable_prefix_caching or uncached.pool.enable_prefix_caching:
        raise ValueError("n_report needs one engine with the prefix cache and one without")
    rng = random.Random(8)
    rows = []
    for shape in shapes:
        rates, computed = _rounds((engine, uncached), rng, token_high, shape, reps)
        best = {peer: max(rates[peer]) for peer in PEERS}
        cells = [f"n={N}, prompt {shape.prompt_tokens}, {shape.new_tokens} new tokens each"]
        cells += [f"{best[peer]:.1f}" for peer in PEERS]
        for peer in PEERS[1:]:
            per_round = [a / b for a, b in zip(rates["n"], rates[peer], strict=True)]
            passed = best["n"] / best[peer] >= GOAL
            cells.append(
                f"{ratio(best['n'], best[peer]):.2f}x ({statistics.median(per_round):.2f}x)"
                + (f" {verdict(passed)}" if shape.goal else "")
            )
        cells.append(" / ".join(str(computed[peer]) for peer in PEERS))
        rows.append(cells)
    headers = [
        f"workload (goal >= {GOAL:.1f}x on the first row)",
        f"n={N} tok/s",
        f"{N} requests tok/s",
        f"{N} requests, no prefix cache, tok/s",
        "vs 4 requests: best (median)",
        "vs no prefix cache: best (median)",
        "prompt tokens computed",
    ]
    return markdown_table(headers, rows)
