"""How the engine's CPU threads wait, compared: batch-1 decode idle and beside a busy process.

Run from the repository root::

    .venv/bin/python bench/engine_threads.py            # full run, about 10 minutes
    .venv/bin/python bench/engine_threads.py --quick    # smoke run, 2-3 minutes

The OpenMP runtime reads its wait settings once, when torch loads it, so every setting runs
in its own child process (this script, ``--child``) with that setting in its environment.
Each child loads the engine (``swift-50m``, float32 unless ``--precision bf16`` or ``int8``,
2 torch threads unless the setting says otherwise) and runs workload 4 of ``engine_cpu.py``:
batch-1 decode on a fresh prompt, once with the machine to itself and once while one busy
process spins, who goes first alternating, for several rounds. The parent runs the children
round-robin for ``--passes`` passes (order reversed every other pass), so slow phases of a
shared machine fall on every setting alike.

Printed per setting: the best and median decode rate, idle and contended; contended over idle
(best over best, and the median of the per-round ratios); and the idle best over that of
GNU OpenMP's own default (``GOMP_SPINCOUNT=300000``, what the engine ran with before it set a
default). Goals for the engine's default: contended >= 0.6x idle, and idle >= 0.95x GNU
OpenMP's default idle.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from _util import markdown_table, ratio, verdict

from local_engine import cpu_threads

HERE = Path(__file__).resolve().parent
WAIT_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS")
CONTENTION_GOAL = 0.6
IDLE_GOAL = 0.95


@dataclass(frozen=True)
class Setting:
    """One way for the threads to wait."""

    key: str
    """Its name for ``--settings``."""
    name: str
    env: dict[str, str]
    """Set in the child's environment (after removing every variable of WAIT_VARS)."""
    threads: int = 2


DEFAULT = Setting("default", "local_engine default", {})
GNU = Setting("gnu", "GNU OpenMP default (GOMP_SPINCOUNT=300000)", {"GOMP_SPINCOUNT": "300000"})
SETTINGS = (
    DEFAULT,
    GNU,
    Setting("passive", "OMP_WAIT_POLICY=PASSIVE", {"OMP_WAIT_POLICY": "PASSIVE"}),
    Setting("spin10000", "GOMP_SPINCOUNT=10000", {"GOMP_SPINCOUNT": "10000"}),
    Setting("spin3000", "GOMP_SPINCOUNT=3000", {"GOMP_SPINCOUNT": "3000"}),
    Setting("spin1000", "GOMP_SPINCOUNT=1000", {"GOMP_SPINCOUNT": "1000"}),
    Setting("1t-gnu", "1 thread, GNU default spin", {"GOMP_SPINCOUNT": "300000"}, threads=1),
    Setting("1t-default", "1 thread, local_engine default", {}, threads=1),
)


@dataclass
class Rates:
    """Decode rates of one setting over all its rounds, paired by round."""

    idle: list[float] = field(default_factory=list)
    busy: list[float] = field(default_factory=list)


def child(quick: bool, reps: int | None, threads: int, model: str, precision: str) -> None:
    """Run workload 4 under this process's environment; print the rates as one JSON line."""
    sys.path.insert(0, str(HERE))
    import engine_cpu  # imports local_engine before torch
    import torch

    from local_engine.default_model import find_default_model

    settings = engine_cpu.QUICK if quick else engine_cpu.FULL
    if reps is not None:
        settings = engine_cpu.Settings(**{**settings.__dict__, "reps": reps})
    torch.set_num_threads(threads)
    setup = engine_cpu.build(
        find_default_model(model), settings, with_transformers=False, precision=precision
    )
    busy, idle = engine_cpu.contention_runs(setup, settings)
    print(
        json.dumps(
            {
                "idle": [r.decode_rate for r in idle],
                "busy": [r.decode_rate for r in busy],
                "env": {name: os.environ.get(name) for name in WAIT_VARS},
                "threads": torch.get_num_threads(),
            }
        )
    )


def run_child(setting: Setting, args: argparse.Namespace) -> dict[str, object]:
    """One child run of ``setting``; its JSON report."""
    env = {k: v for k, v in os.environ.items() if k not in WAIT_VARS}
    env.update(setting.env)
    command = [sys.executable, __file__, "--child", "--threads", str(setting.threads)]
    command += ["--model", args.model, "--precision", args.precision]
    command += ["--quick"] if args.quick else []
    if args.reps is not None:
        command += ["--reps", str(args.reps)]
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{setting.name}: child failed:\n{out.stderr[-3000:]}")
    report: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return report


def main(argv: Sequence[str] | None = None) -> int:
    """Compare the settings and print the markdown table; exit 0 even on FAIL."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small smoke run")
    parser.add_argument("--reps", type=int, default=None, help="rounds per child")
    parser.add_argument("--passes", type=int, default=None, help="children per setting")
    parser.add_argument("--model", default="swift-50m", help="embedded model (swift-50m)")
    parser.add_argument(
        "--precision",
        choices=("fp32", "bf16", "int8", "int4"),
        default="fp32",
        help="the engine's weights (fp32)",
    )
    parser.add_argument(
        "--settings",
        default=",".join(s.key for s in SETTINGS),
        help="comma-separated settings to run (default: all; 'default' and 'gnu' always run): "
        + ", ".join(s.key for s in SETTINGS),
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.reps is not None and args.reps < 1:
        parser.error("--reps must be >= 1")
    if args.child:
        child(args.quick, args.reps, args.threads, args.model, args.precision)
        return 0
    passes = args.passes if args.passes is not None else (1 if args.quick else 2)
    if passes < 1:
        parser.error("--passes must be >= 1")
    keys = {key.strip() for key in args.settings.split(",") if key.strip()}
    unknown = keys - {s.key for s in SETTINGS}
    if unknown:
        parser.error(f"unknown --settings: {', '.join(sorted(unknown))}")
    chosen = [s for s in SETTINGS if s.key in keys | {DEFAULT.key, GNU.key}]
    rates = {s.name: Rates() for s in chosen}
    load_before = os.getloadavg()
    for n in range(passes):
        for setting in chosen if n % 2 == 0 else chosen[::-1]:
            report = run_child(setting, args)
            rates[setting.name].idle += report["idle"]  # type: ignore[arg-type]
            rates[setting.name].busy += report["busy"]  # type: ignore[arg-type]
    load_after = os.getloadavg()
    gnu_idle = max(rates[GNU.name].idle)
    rows = []
    default_env = ", ".join(f"{k}={v}" for k, v in cpu_threads.DEFAULTS.items())
    for setting in chosen:
        r = rates[setting.name]
        paired = statistics.median(ratio(b, i) for b, i in zip(r.busy, r.idle, strict=True))
        contended = ratio(max(r.busy), max(r.idle))
        idle_vs_gnu = ratio(max(r.idle), gnu_idle)
        goals = "-"
        if setting is DEFAULT:
            goals = verdict(contended >= CONTENTION_GOAL and idle_vs_gnu >= IDLE_GOAL)
        rows.append(
            [
                f"{setting.name} ({default_env})" if setting is DEFAULT else setting.name,
                f"{max(r.idle):.1f}",
                f"{statistics.median(r.idle):.1f}",
                f"{max(r.busy):.1f}",
                f"{statistics.median(r.busy):.1f}",
                f"{contended:.2f}x",
                f"{paired:.2f}x",
                f"{idle_vs_gnu:.2f}x",
                goals,
            ]
        )
    print(f"## local_engine CPU threads: how they wait ({'quick' if args.quick else 'full'})\n")
    print(
        f"- model: {args.model} ({args.precision} weights), batch-1 decode "
        "(engine_cpu.py workload 4 shape); "
        f"{passes} child(ren) per setting, rounds alternate idle / one busy process; "
        f"machine: {os.cpu_count()} CPUs, 1-min load average {load_before[0]:.1f} before, "
        f"{load_after[0]:.1f} after (other jobs add noise: compare within a column)\n"
    )
    headers = [
        "setting",
        "idle best",
        "idle median",
        "busy best",
        "busy median",
        "busy/idle",
        "median ratio",
        "idle vs GNU",
        f"goals (>= {CONTENTION_GOAL}x, >= {IDLE_GOAL}x)",
    ]
    print(markdown_table(headers, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
