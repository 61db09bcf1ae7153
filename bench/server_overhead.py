"""Server overhead per streamed token: two source trees' servers, measured in one run.

Run from the repository root (the "before" tree is any checkout of an older commit)::

    git -C . worktree add --detach ../before 06c0073      # once: the tree to compare with
    .venv/bin/python bench/server_overhead.py --before ../before            # full run
    .venv/bin/python bench/server_overhead.py --before ../before --quick    # smoke run

What is measured. Each tree's servers run as separate processes started with this venv's
Python and ``PYTHONPATH`` pointed at that tree (so each runs its own ``swiftclient`` and
``local_engine``), all of them listening at once; the rounds alternate between the trees.
A raw aiohttp client in this process opens 1 or 64 concurrent streams and reads every event;
the server process's own CPU time (user + system, from ``/proc/PID/stat``) over the batch,
divided by the tokens streamed, is the "server CPU per token", and the batch's wall time per
token is shown beside it. Two servers:

- ``fake``: ``python -m swiftclient.testing --tokens N --token-delay 0.000001`` (the fake
  provider; the 1 µs delay makes it write each token on its own, as a server streaming from
  an engine does, instead of the whole reply at once): no engine at all, so its CPU is the
  HTTP stack, the SSE framing, the chunk rendering and one timer per token: the server
  overhead, and the fake provider's capacity (tokens/s of wall at 64 streams);
- ``local``: ``python -m local_engine.server`` over the embedded ``swift-tiny`` model (random
  weights, 6.7M parameters), ``max_tokens=N`` with ``ignore_eos``: the engine's CPU is the
  same in both trees, so the difference between the trees is the server's.

Printed: best and median over the rounds, and the ratio after/before of each (below 1.00x:
the "after" tree uses less). Linux only (``/proc``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from _server import server_process
from _util import markdown_table, ratio

ROOT = Path(__file__).resolve().parent.parent
_TICK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Settings:
    """Sizes of one run."""

    rounds: int
    tokens: int
    local_tokens: int
    batches: dict[int, int]  # concurrency -> streams per timed batch


FULL = Settings(rounds=5, tokens=256, local_tokens=64, batches={1: 20, 64: 128})
QUICK = Settings(rounds=1, tokens=32, local_tokens=8, batches={1: 3, 64: 64})


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def _process(argv: list[str], tree: Path, env: dict[str, str]) -> Any:
    """Start a server from ``tree`` (its ``src`` and root first on ``PYTHONPATH``)."""
    paths = os.pathsep.join([str(tree / "src"), str(tree)])
    return server_process(argv, env={**env, "PYTHONPATH": paths}, cwd=str(tree))


async def _stream(session: aiohttp.ClientSession, url: str, body: dict[str, object]) -> int:
    """One streamed completion read to its end; returns its completion tokens (from the
    usage event)."""
    tokens = 0
    async with session.post(url + "/chat/completions", json=body) as response:
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {await response.text()}")
        async for line in response.content:
            if line.startswith(b"data: {") and b'"usage":{' in line:
                tokens += json.loads(line[6:])["usage"]["completion_tokens"]
    return tokens


async def _batch(
    url: str, pid: int, body: dict[str, object], concurrency: int, streams: int
) -> tuple[float, float, int]:
    """Run ``streams`` streams, ``concurrency`` at a time: (server CPU s, wall s, events)."""
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        await _stream(session, url, body)  # warm the connection and the server
        gate = asyncio.Semaphore(concurrency)

        async def one() -> int:
            async with gate:
                return await _stream(session, url, body)

        cpu = _cpu_seconds(pid)
        start = time.perf_counter()
        counts = await asyncio.gather(*(one() for _ in range(streams)))
        wall = time.perf_counter() - start
        cpu = _cpu_seconds(pid) - cpu
    return cpu, wall, sum(counts)


@dataclass
class Samples:
    """Per-token costs of one (server, tree, concurrency), one sample per round."""

    cpu: list[float]
    wall: list[float]


def _servers(trees: dict[str, Path], settings: Settings, stack: ExitStack) -> dict[str, object]:
    cache = stack.enter_context(tempfile.TemporaryDirectory(prefix="swiftclient-bench-"))
    env = {"SWIFTCLIENT_CACHE_DIR": cache, "OMP_NUM_THREADS": "1"}
    found: dict[str, object] = {}
    for name, tree in trees.items():
        fake = ["-m", "swiftclient.testing", "--port", "0", "--tokens", str(settings.tokens)]
        fake += ["--token-delay", "0.000001"]  # one write per token, not one per stream
        found[f"fake/{name}"] = stack.enter_context(_process(fake, tree, env))
        local = ["-m", "local_engine.server", "", "--port", "0", "--max-num-seqs", "64"]
        found[f"local/{name}"] = stack.enter_context(_process(local, tree, env))
    return found


def run(trees: dict[str, Path], settings: Settings) -> str:
    """Measure every server of every tree; return the markdown report."""
    samples: dict[tuple[str, str, int], Samples] = {}
    with ExitStack() as stack:
        servers = _servers(trees, settings, stack)
        for _ in range(settings.rounds):
            for kind in ("fake", "local"):
                for concurrency, streams in settings.batches.items():
                    for tree in trees:  # alternate the trees within each round
                        pid, url = servers[f"{kind}/{tree}"]  # type: ignore[misc]
                        tokens = settings.tokens if kind == "fake" else settings.local_tokens
                        body: dict[str, object] = {
                            "model": "swift-tiny" if kind == "local" else "fake-model",
                            "messages": [{"role": "user", "content": "Say something."}],
                            "stream": True,
                            "stream_options": {"include_usage": True},
                            "max_tokens": tokens,
                            "ignore_eos": True,
                        }
                        if kind == "fake":
                            body.pop("ignore_eos")
                        cpu, wall, events = asyncio.run(
                            _batch(url, pid, body, concurrency, streams)
                        )
                        if events != streams * tokens:
                            raise RuntimeError(
                                f"{kind}/{tree}: {events} tokens streamed, "
                                f"expected {streams * tokens}"
                            )
                        slot = samples.setdefault((kind, tree, concurrency), Samples([], []))
                        slot.cpu.append(cpu / events)
                        slot.wall.append(wall / events)
    return _report(samples, list(trees), settings)


def _report(
    samples: dict[tuple[str, str, int], Samples], trees: list[str], settings: Settings
) -> str:
    before, after = trees
    rows: list[list[object]] = []
    for (kind, tree, concurrency), got in sorted(samples.items()):
        base = samples[(kind, before, concurrency)]
        rows.append(
            [
                kind,
                concurrency,
                tree,
                f"{min(got.cpu) * 1e6:.1f}",
                f"{statistics.median(got.cpu) * 1e6:.1f}",
                f"{ratio(min(got.cpu), min(base.cpu)):.2f}x",
                f"{ratio(statistics.median(got.cpu), statistics.median(base.cpu)):.2f}x",
                f"{min(got.wall) * 1e6:.1f}",
                f"{1 / min(got.wall):,.0f}",
            ]
        )
    table = markdown_table(
        [
            "server",
            "streams",
            "tree",
            "CPU µs/token best",
            "median",
            "vs before (best)",
            "(median)",
            "wall µs/token best",
            "tokens/s",
        ],
        rows,
    )
    return (
        f"Rounds: {settings.rounds}; fake provider {settings.tokens} tokens per stream, local "
        f"server {settings.local_tokens}; streams per batch {settings.batches}.\n\n" + table
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments, measure, print; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--before", type=Path, required=True, help="the older source tree")
    parser.add_argument("--after", type=Path, default=ROOT, help="the newer tree (this one)")
    parser.add_argument("--quick", action="store_true", help="small counts for a smoke run")
    args = parser.parse_args(argv)
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    settings = QUICK if args.quick else FULL
    started = time.perf_counter()
    print(
        f"# Server overhead per streamed token ({'quick' if args.quick else 'full'} run)\n\n"
        f"Python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.2f}; before={trees['before']}, "
        f"after={trees['after']}.\n",
        flush=True,
    )
    print(run(trees, settings) + "\n")
    print(f"Total time: {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
