"""Workload 6 of engine_cpu.py (``--only spec``): speculative decoding at batch 1.

Peers, in the same process and on the same loaded model: the engine without speculation and
the engine with n-gram speculation (prompt lookup). Both decode greedily and stop at the
model's end of turn, so their outputs must be identical (checked on every request).

The model is the trained embedded default model when this checkout has it
(``local_engine/models/swift-tiny``), with prompts from its synthetic task generators
(``scripts/default_model_data.py``, fixed seeds, fresh prompts every round):

- copy/edit: ``copy``, ``rename``, ``summary`` and ``reformat`` tasks, where the answer is
  (mostly) text of the prompt. Goal: decode rate >= 1.8x of no speculation.
- non-grounded: ``chat`` tasks (greetings, canned facts), where the answer is not in the
  prompt and drafts mostly miss. Goal: >= 0.95x (speculation backs off).

``--spec-model DIR`` measures another model on the same task prompts; ``--spec-model random``
measures the random-weight ``swift-tiny-random`` on random prompts. Without the trained
model and its generators the prompts are random token ids (a phrase written three times for
copy/edit): a random-weight model's output only repeats itself, so the rows then show the
mechanism, not the goal. The decode rate is every generated token after each request's
first, over the time after its first token arrived, summed over the round's requests (which
run one at a time). The CPU-time ratio does the same with this process's CPU time over all
timed rounds, which time-slicing by other processes on a shared machine does not inflate. The
notes give each peer's decode steps: tokens per step and milliseconds per step.
"""

from __future__ import annotations

import importlib
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from _util import markdown_table, ratio, verdict

from local_engine import default_model
from local_engine.chat import ChatFormatter
from local_engine.engine import Engine, EngineConfig, SamplingParams
from local_engine.spec import SpeculativeConfig

__all__ = ["run_spec"]

ROOT = Path(__file__).resolve().parent.parent
COPY_GOAL = 1.8
OTHER_GOAL = 0.95
COPY_TASKS = ("copy", "rename", "summary", "reformat")
OTHER_TASKS = ("chat",)
MAX_NEW = 160


@dataclass(frozen=True)
class Workload:
    """One round's prompts of one kind."""

    name: str
    prompts: list[list[int]]


@dataclass
class Timed:
    """Summed batch-1 decode time, CPU time, steps and tokens over one round's requests,
    per peer."""

    tokens: list[list[int]]
    decode_tokens: int
    decode_seconds: float
    decode_cpu_seconds: float = 0.0
    decode_steps: int = 0

    @property
    def rate(self) -> float:
        """Decode tokens per second."""
        return ratio(self.decode_tokens, self.decode_seconds)

    @property
    def cpu_rate(self) -> float:
        """Decode tokens per CPU second of this process (other processes on a shared
        machine add nothing to it, though they still share its caches)."""
        return ratio(self.decode_tokens, self.decode_cpu_seconds)


def pooled(rounds_: Sequence[Timed]) -> Timed:
    """Several rounds (or requests) of one peer summed into one."""
    return Timed(
        [t for r in rounds_ for t in r.tokens],
        sum(r.decode_tokens for r in rounds_),
        sum(r.decode_seconds for r in rounds_),
        sum(r.decode_cpu_seconds for r in rounds_),
        sum(r.decode_steps for r in rounds_),
    )


def per_step(timed: Timed) -> str:
    """``tokens/step, ms/step (CPU ms/step)`` of a peer's decode steps."""
    steps = timed.decode_steps
    return (
        f"{ratio(timed.decode_tokens, steps):.2f} tokens/step, "
        f"{1e3 * ratio(timed.decode_seconds, steps):.2f} ms/step "
        f"(CPU {1e3 * ratio(timed.decode_cpu_seconds, steps):.2f})"
    )


def trained_model_dir() -> Path | None:
    """The embedded trained model's directory, when this checkout ships one."""
    find = getattr(default_model, "embedded_model_dir", None)
    if find is None:
        return None
    try:
        path: Path = find()
    except Exception:  # noqa: BLE001 - an incomplete checkout: fall back to random weights
        return None
    return path


def task_prompts(engine: Engine, tasks: Sequence[str], count: int, seed: int) -> list[list[int]]:
    """``count`` chat prompts of ``tasks`` from the model's data generators, tokenized."""
    sys.path.insert(0, str(ROOT / "scripts"))
    data: Any = importlib.import_module("default_model_data")
    tokenizer = engine.tokenizer
    if tokenizer is None:
        raise RuntimeError("the trained model has no tokenizer")
    formatter = ChatFormatter(tokenizer)
    rng = random.Random(seed)
    prompts = []
    for i in range(count):
        conv = data.TASKS[tasks[i % len(tasks)]][0](rng)
        text = formatter.render(conv["messages"][:-1], tools=conv["tools"])
        prompts.append(tokenizer.encode(text))
    return prompts


def random_prompts(engine: Engine, count: int, seed: int, *, repeat: bool) -> list[list[int]]:
    """Random token ids below the special tokens; ``repeat`` writes a phrase three times."""
    high = min(engine.eos_token_ids, default=engine.model.config.vocab_size)
    rng = random.Random(seed)
    prompts = []
    for _ in range(count):
        if repeat:
            phrase = [rng.randrange(high) for _ in range(rng.randrange(12, 24))]
            prompts.append(phrase * 3)
        else:
            prompts.append([rng.randrange(high) for _ in range(48)])
    return prompts


def run_requests(engine: Engine, prompts: Sequence[list[int]], ignore_eos: bool) -> Timed:
    """Serve ``prompts`` one at a time, greedily, timing each after its first token."""
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=ignore_eos)
    timed = Timed([], 0, 0.0)
    for prompt in prompts:
        engine.add_request(prompt, params)
        tokens: list[int] = []
        first: tuple[float, float] | None = None
        steps = 0
        while engine.has_unfinished():
            for step_out in engine.step():
                tokens.extend(step_out.new_token_ids)
            if first is None:
                if tokens:
                    first = (time.perf_counter(), time.process_time())
            else:
                steps += 1
        end = (time.perf_counter(), time.process_time())
        first = first or end
        timed.tokens.append(tokens)
        timed.decode_tokens += len(tokens) - 1
        timed.decode_seconds += end[0] - first[0]
        timed.decode_cpu_seconds += end[1] - first[1]
        timed.decode_steps += steps
    return timed


def rounds(
    reps: int, make: Callable[[int], list[list[int]]], peers: Sequence[Callable[..., Timed]]
) -> list[list[Timed]]:
    """Round 0 warms up; each round has fresh prompts. The peers take turns request by
    request, who goes first rotating, so a burst of load on a shared machine falls on both
    alike rather than on whichever peer it happens to meet."""
    results: list[list[Timed]] = [[] for _ in peers]
    order = list(range(len(peers)))
    for rnd in range(reps + 1):
        timed = [Timed([], 0, 0.0) for _ in peers]
        for n, prompt in enumerate(make(rnd)):
            shift = (rnd + n) % len(peers)
            for i in order[shift:] + order[:shift]:
                timed[i] = pooled([timed[i], peers[i]([prompt])])
        if rnd:
            for i, t in enumerate(timed):
                results[i].append(t)
    return results


def run_spec(model_arg: str | None, *, quick: bool, reps: int, threads: int, k: int) -> None:
    """Build the peers, run both workloads with ``threads`` torch threads, print the table."""
    torch.set_num_threads(threads)
    trained = trained_model_dir() if model_arg is None else None
    if model_arg == "random":
        model_arg = None
        path = default_model.ensure_default_model()
    elif model_arg is not None:
        path = Path(model_arg)
    elif trained is not None:
        path = trained
    else:
        path = default_model.ensure_default_model()
    use_tasks = (ROOT / "scripts" / "default_model_data.py").exists() and (
        trained is not None or model_arg is not None
    )
    plain = Engine.from_pretrained(path, EngineConfig(dtype="float32", num_blocks=512, seed=0))
    spec_config = SpeculativeConfig(num_speculative_tokens=k)
    spec = Engine(
        plain.model,
        EngineConfig(dtype="float32", num_blocks=512, seed=0, speculative=spec_config),
        plain.tokenizer,
    )
    count = 4 if quick else 24
    ignore_eos = not use_tasks

    def make_for(kind: str) -> Callable[[int], list[list[int]]]:
        def make(rnd: int) -> list[list[int]]:
            seed = 600 + 10 * rnd + (kind == "copy")
            if use_tasks:
                tasks = COPY_TASKS if kind == "copy" else OTHER_TASKS
                return task_prompts(plain, tasks, count, seed)
            return random_prompts(plain, count, seed, repeat=kind == "copy")

        return make

    load_before = os.getloadavg()
    wall = time.perf_counter()
    table = []
    notes = []
    for kind, label, goal in (
        ("copy", "copy/edit", COPY_GOAL),
        ("other", "non-grounded", OTHER_GOAL),
    ):
        before = spec.spec_stats
        proposed0 = before.num_draft_tokens if before else 0
        accepted0 = before.num_accepted_tokens if before else 0
        verifications0 = before.num_verifications if before else 0
        off, on = rounds(
            reps,
            make_for(kind),
            [
                lambda p: run_requests(plain, p, ignore_eos),
                lambda p: run_requests(spec, p, ignore_eos),
            ],
        )
        same = all(a.tokens == b.tokens for a, b in zip(off, on, strict=True))
        stats = spec.spec_stats
        proposed = (stats.num_draft_tokens if stats else 0) - proposed0
        accepted = (stats.num_accepted_tokens if stats else 0) - accepted0
        verifications = (stats.num_verifications if stats else 0) - verifications0
        best_on = max(t.rate for t in on)
        best_off = max(t.rate for t in off)
        paired = statistics.median(ratio(a.rate, b.rate) for a, b in zip(on, off, strict=True))
        result = ratio(best_on, best_off)
        all_on, all_off = pooled(on), pooled(off)
        cpu = ratio(all_on.cpu_rate, all_off.cpu_rate)
        tokens = sum(len(t) for t in on[0].tokens)
        table.append(
            [
                f"{label}: batch-1 decode tok/s ({count} requests/round, {tokens} tokens)",
                f"{best_on:.1f}",
                f"{best_off:.1f}",
                f"{result:.2f}x",
                f"{paired:.2f}x",
                f"{cpu:.2f}x",
                f">= {goal:g}x",
                verdict(paired >= goal and same),
            ]
        )
        notes.append(
            f"{label}: outputs identical: {'yes' if same else 'NO'}; drafts accepted "
            f"{accepted} of {proposed} ({ratio(accepted, proposed):.0%}) in {verifications} "
            f"verifications ({ratio(proposed, verifications):.1f} drafts, "
            f"{ratio(accepted, verifications):.1f} accepted each); per decode step, all rounds: "
            f"speculative {per_step(all_on)}, plain {per_step(all_off)}"
        )
    wall = time.perf_counter() - wall
    load_after = os.getloadavg()
    if trained is not None:
        model_note = "the trained embedded default model, on its task prompts"
    elif model_arg is not None:
        model_note = f"{path} on {'task prompts' if use_tasks else 'random prompts'}"
    else:
        model_note = f"{path.name} (random weights, random prompts: mechanism only)"
    print(f"## local_engine speculative decoding, CPU fp32 ({'quick' if quick else 'full'} run)\n")
    print(
        f"- model: {model_note}; n-gram proposer, up to {k} draft tokens, back-off on; "
        f"greedy, {'until the end of turn, at most ' if not ignore_eos else ''}{MAX_NEW} new "
        f"tokens; torch {torch.__version__}"
    )
    print(
        f"- torch threads: {threads}; machine: {os.cpu_count()} CPUs, SHARED (1-min load "
        f"average {load_before[0]:.1f} before, {load_after[0]:.1f} after); {reps} timed "
        f"rounds after a warm-up, fresh prompts each round, the peers taking turns request "
        f"by request, who goes first rotating; values are each peer's best round; median "
        f"ratio: the median over rounds of the two peers' ratio in the same round, which the "
        f"result checks (the best rounds of the two need not share a load); CPU-time ratio: "
        f"decode tokens per CPU second of this process, all timed rounds pooled; workloads "
        f"took {wall:.0f} s\n"
    )
    headers = [
        "metric",
        "speculative",
        "plain",
        "ratio",
        "median ratio",
        "CPU-time ratio",
        "goal",
        "result",
    ]
    print(markdown_table(headers, table))
    print()
    for line in notes:
        print(line)
