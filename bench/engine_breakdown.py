"""Where a batched engine step goes: the engine against its own matmul-plus-attention ceiling.

Runs workloads 2(a) and 2(b) of ``engine_cpu.py`` (32 concurrent requests, fp32, the
random-weight ``swift-50m``) on the engine alone, best of ``--reps`` rounds with fresh prompts,
with a replay of the engine's matmuls and attention at the step shapes of one more run in
every round (the same replays as the ceiling line of ``engine_cpu.py``).
``ceiling / engine`` is the share of the ceiling the engine reaches, the ceiling being the
matmuls and attention replayed together, layer by layer as the engine runs them (the share
of the two replayed apart is printed too);
transformers' time cancels out of it, so this needs no transformers run. Then one more run
of each workload under cProfile splits the engine's time by kind of work (matmul, attention,
norms, q/k norm + RoPE, activation, the rest: sampling, scheduling, input preparation and
Python), per run and per step.

    .venv/bin/python bench/engine_breakdown.py --threads 1 --reps 3
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import random
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import engine_cpu as bench  # noqa: E402

from local_engine.default_model import ensure_default_model  # noqa: E402

# cProfile keys (file, line, function) of the torch calls each kind of work makes.
_KINDS: dict[str, Callable[[tuple[str, int, str]], bool]] = {
    "matmul": lambda k: (
        k[2] in ("<built-in method torch._C._nn.linear>", "<built-in method torch.addmm>")
    ),
    "attention": lambda k: (  # rope_decode: a decode step's q/k norm, RoPE and attention
        (k[0].endswith("native.py") and k[2] in ("__call__", "rope_decode"))
        or "scaled_dot_product_attention" in k[2]
        or "index_copy_" in k[2]
    ),
    "norm": lambda k: (
        k[2] == "<built-in method torch.rms_norm>"
        or (k[0].endswith("native.py") and k[2] == "rms_norm")
    ),
    "q/k norm + rope": lambda k: (
        (k[0].endswith("native.py") and k[2] == "rope")
        or k[2]
        in (
            "<built-in method torch.mul>",
            "<method 'addcmul_' of 'torch._C.TensorBase' objects>",
            "<built-in method torch.cat>",
        )
    ),
    "activation": lambda k: (
        (k[0].endswith("native.py") and k[2] == "silu_mul") or "silu_" in k[2] or "'mul_'" in k[2]
    ),
}


def breakdown(peer: bench.EnginePeer, prompts: list[list[int]], new: bench.NewTokens) -> str:
    """One profiled run of ``prompts``; its time by kind of work."""
    profiler = cProfile.Profile()
    profiler.enable()
    run = peer.run(prompts, new)
    profiler.disable()
    stats: dict[tuple[str, int, str], tuple[int, int, float, float, object]]
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    wall = run.end - run.start
    parts = {
        kind: sum(v[2] for k, v in stats.items() if match(k)) for kind, match in _KINDS.items()
    }
    parts["rest (sampling, scheduling, inputs, Python)"] = wall - sum(parts.values())
    return f"profiled run {wall:.2f} s: " + ", ".join(
        f"{kind} {sec:.3f} s ({100 * sec / wall:.1f}%)" for kind, sec in parts.items()
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Print the engine's share of its ceiling and the profiled split for 2(a) and 2(b)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small smoke run")
    parser.add_argument("--reps", type=int, default=3, help="timed rounds per workload (3)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1)")
    args = parser.parse_args(argv)
    if args.reps < 1 or args.threads < 1:
        parser.error("--reps and --threads must be >= 1")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    s = bench.QUICK if args.quick else bench.FULL
    setup = bench.build(ensure_default_model(bench.MODEL_NAME), s, with_transformers=False)
    peer = setup.engine
    lengths = bench.batch_lengths(s)
    size = "quick" if args.quick else "full"
    print(
        f"## local_engine: the batched step against its ceiling ({size} run), "
        f"{bench.MODEL_NAME} fp32, torch threads {args.threads}, 1-min load average "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs\n"
    )
    workloads: list[tuple[str, bench.NewTokens, int]] = [
        ("2a, equal outputs", s.batch_new, 500),
        ("2b, mixed outputs", bench.batch_new_tokens(s), 600),
    ]
    for label, new, seed in workloads:

        def make(rnd: int, seed: int = seed) -> list[list[int]]:
            rng = random.Random(seed + rnd)
            return [bench._random_ids(rng, n, setup.token_high) for n in lengths]

        def engine_run(prompts: bench.Prompts, new: bench.NewTokens = new) -> bench.Run:
            return peer.run(prompts, new)

        ceiling = setup.ceiling(peer.step_shapes(make(args.reps + 1), new))
        runs, _ = bench._rounds(args.reps, make, [engine_run, ceiling.replay])
        times = [run.end - run.start for run in runs]
        stepwise = ceiling.stepwise_share(runs)
        steps = len(ceiling.shapes)
        matmuls, attention = ceiling.best()
        together = ceiling.best_together()
        best = min(times)
        other = best - together
        shares = [t / e for t, e in zip(ceiling.together[1:], times, strict=True)]
        print(
            f"- {label}: engine best {best:.2f} s of {steps} steps (rounds "
            f"{', '.join(f'{t:.2f}' for t in times)}); replayed in the same rounds, matmuls "
            f"{matmuls:.2f} s + attention {attention:.2f} s apart (best of each), "
            f"{together:.2f} s together; the engine reaches "
            f"{'-' if stepwise is None else f'{100 * stepwise:.1f}%'} of its "
            f"matmul-plus-attention ceiling step by step (each step's best round), "
            f"{100 * together / best:.1f}% best round against best replay (median of the rounds "
            f"{100 * statistics.median(shares):.1f}%; everything else {other:.2f} s, "
            f"{1000 * other / steps:.1f} ms a step; {100 * (matmuls + attention) / best:.1f}% "
            "of the two replayed apart)"
        )
        print(f"  - {breakdown(peer, make(args.reps + 2), new)}")
    print(f"\n1-min load average after: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
