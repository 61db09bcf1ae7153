"""Client overhead: swiftclient against the official openai SDK, raw httpx and raw aiohttp.

Run from the repository root::

    .venv/bin/python bench/client_overhead.py            # full run, about 1-2 minutes
    .venv/bin/python bench/client_overhead.py --quick    # smoke run, well under 30 s
    .venv/bin/python bench/client_overhead.py --profile  # + cProfile of swiftclient's stream
    .venv/bin/python bench/client_overhead.py --telemetry  # only the telemetry rows (1c)
    .venv/bin/python bench/client_overhead.py --sync     # only the blocking-client row (1d)
    .venv/bin/python bench/client_overhead.py --wires    # only the other wires (1e)

Part 1 (CPU): process CPU time per non-streamed request and per streamed chunk, every client
parsing the same canned bytes from an in-process mock transport (no sockets, no server).
Part 1b (CPU over real sockets): the same per-request and per-chunk CPU with every client
talking to ``python -m swiftclient.testing`` in another process over loopback TCP (raw
aiohttp, raw httpx, openai, swiftclient); only the client process's CPU is counted, rounds
alternate the clients, best and median are printed.
Part 1c (telemetry): CPU per request and per chunk of swiftclient with telemetry off, with
the default ``Telemetry()`` and no OpenTelemetry SDK configured, and with an SDK recording
into a no-op exporter (same mock transport as part 1); plus the per-call cost of the no-SDK
telemetry hook measured alone. ``--telemetry`` runs only this part.
Part 1d (blocking clients over real sockets): CPU per non-streamed request of
``swiftclient.Client`` (its own loop thread included: the process's CPU is counted) and of
``openai.OpenAI`` (the SDK's sync client, ``max_retries=0``), both against
``python -m swiftclient.testing`` in another process, rounds alternating. ``--sync`` runs
only this part.
Part 1e (other wires over real sockets): per-request and per-chunk CPU of
``AnthropicBackend`` against the official ``anthropic`` SDK on Anthropic's Messages wire,
and of ``ResponsesBackend`` against the ``openai`` SDK's ``responses.create`` on the
Responses wire, each with a raw aiohttp floor, all against ``python -m swiftclient.testing``
in another process, rounds alternating. ``--wires`` runs only this part.
Part 2 (load): wall time and errors of 1, 64, 512 and 5,000 concurrent streams of 100 chunks
against ``python -m swiftclient.testing`` running as a separate process (at most 512
connections: the 5,000 streams share them).

Goals (PASS/FAIL printed beside each):
- per-request CPU <= 1.3x raw httpx, and openai >= 5x swiftclient's;
- per-chunk CPU <= 2x raw httpx;
- over real sockets: per-request CPU <= 1.3x raw aiohttp, per-chunk CPU <= 1.5x raw aiohttp;
- blocking clients over real sockets: openai.OpenAI's per-request CPU >= 3x
  swiftclient.Client's;
- other wires over real sockets: each vendor SDK's per-request CPU >= 3x swiftclient's and
  its per-chunk CPU >= 5x (Messages: anthropic; Responses: openai's ``responses.create``);
- telemetry without an SDK: at most 3 µs per call (measured alone) and nothing per chunk;
  with the SDK and a no-op exporter: reported;
- 512 and 5,000 concurrent streams: zero errors, wall time <= 1.2x raw aiohttp's on the
  default (asyncio, aiohttp-backed) transport; trio's httpx transport must finish with zero
  errors.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import io
import os
import platform
import pstats
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
from _canned import MESSAGES, MODEL, STREAM_CHUNKS
from _cpu_peers import API_KEY, Mode, Peer, SwiftPeer, make_peers
from _load_peers import LoadResult, Opener, measure, open_aiohttp, open_swiftclient
from _server import fake_provider_process
from _socket_peers import make_socket_peers
from _telemetry_peers import CONFIGS, start_cost, telemetry_calls, telemetry_peers
from _util import cpu_seconds_per_call, markdown_table, ratio, verdict
from _wire_peers import WIRES, Wire, make_wire_peers

REQUEST_GOAL_VS_RAW = 1.3
OPENAI_GOAL_FACTOR = 5.0
CHUNK_GOAL_VS_RAW = 2.0
LOAD_GOAL_VS_AIOHTTP = 1.2
SOCKET_REQUEST_GOAL = 1.3
SOCKET_CHUNK_GOAL = 1.5
TELEMETRY_CALL_GOAL_US = 3.0
SYNC_OPENAI_GOAL_FACTOR = 3.0
WIRE_REQUEST_GOAL_FACTOR = 3.0
WIRE_CHUNK_GOAL_FACTOR = 5.0
MAX_CONNECTIONS = 512


@dataclass(frozen=True)
class Settings:
    """Iteration counts for one run."""

    requests: int
    """Timed non-streamed requests per round."""
    streams: int
    """Timed streams per round (each ``STREAM_CHUNKS`` chunks)."""
    rounds: int
    """Rounds per client, interleaved across clients; the best round counts."""
    concurrencies: tuple[int, ...]
    """Concurrent-stream counts of the load part."""
    load_repeats: int
    """Timed batches per load configuration (more for tiny batches); the best counts."""
    socket_requests: int = 500
    """Timed non-streamed requests per round over real sockets."""
    socket_streams: int = 30
    """Timed streams per round over real sockets."""
    socket_rounds: int = 7
    """Rounds over real sockets; each round runs every client once, in rotating order."""


FULL = Settings(
    requests=2000, streams=100, rounds=3, concurrencies=(1, 64, 512, 5000), load_repeats=3
)
GOAL_CONCURRENCY = 512
"""Load rows from this many concurrent streams up carry the wall-time and error goal."""
QUICK = Settings(
    requests=100,
    streams=10,
    rounds=1,
    concurrencies=(1, 64),
    load_repeats=1,
    socket_requests=40,
    socket_streams=4,
    socket_rounds=2,
)


# --------------------------------------------------------------------------- part 1: CPU


async def _cpu_costs(mode: Mode, iterations: int, rounds: int) -> dict[str, float]:
    """Best CPU seconds per call for each peer; rounds interleave the peers."""
    peers: list[Peer] = make_peers(mode)
    best = {peer.name: float("inf") for peer in peers}
    try:
        for peer in peers:
            expected = 1 if mode == "request" else STREAM_CHUNKS
            got = await peer.run()
            if got != expected:
                raise RuntimeError(f"{peer.name} parsed {got} chunks, expected {expected}")
        warmup = max(2, iterations // 10)
        for _ in range(rounds):
            for peer in peers:
                cost = await cpu_seconds_per_call(peer.run, iterations, warmup)
                best[peer.name] = min(best[peer.name], cost)
    finally:
        for peer in peers:
            await peer.aclose()
    return best


def _cpu_table(request: dict[str, float], stream: dict[str, float]) -> str:
    per_chunk = {name: cost / STREAM_CHUNKS for name, cost in stream.items()}
    rows: list[list[object]] = []
    for name in request:
        rows.append(
            [
                name,
                f"{request[name] * 1e6:.1f}",
                f"{ratio(request[name], request['raw httpx']):.2f}x",
                f"{per_chunk[name] * 1e6:.2f}",
                f"{ratio(per_chunk[name], per_chunk['raw httpx']):.2f}x",
            ]
        )
    table = markdown_table(
        ["client", "µs/request", "vs raw httpx", "µs/chunk", "vs raw httpx"], rows
    )
    req_vs_raw = ratio(request["swiftclient"], request["raw httpx"])
    openai_vs_swift = ratio(request["openai"], request["swiftclient"])
    chunk_vs_raw = ratio(per_chunk["swiftclient"], per_chunk["raw httpx"])
    openai_chunk = ratio(per_chunk["openai"], per_chunk["swiftclient"])
    goals = markdown_table(
        ["goal", "measured", "verdict"],
        [
            [
                f"per-request CPU: swiftclient/raw httpx <= {REQUEST_GOAL_VS_RAW}x",
                f"{req_vs_raw:.2f}x",
                verdict(req_vs_raw <= REQUEST_GOAL_VS_RAW),
            ],
            [
                f"per-request CPU: openai/swiftclient >= {OPENAI_GOAL_FACTOR:.0f}x",
                f"{openai_vs_swift:.2f}x",
                verdict(openai_vs_swift >= OPENAI_GOAL_FACTOR),
            ],
            [
                f"per-chunk CPU: swiftclient/raw httpx <= {CHUNK_GOAL_VS_RAW}x",
                f"{chunk_vs_raw:.2f}x",
                verdict(chunk_vs_raw <= CHUNK_GOAL_VS_RAW),
            ],
            ["per-chunk CPU: openai/swiftclient (no goal)", f"{openai_chunk:.2f}x", "-"],
        ],
    )
    return table + "\n\n" + goals


def run_cpu_part(settings: Settings) -> str:
    """Measure part 1 on asyncio and return its markdown."""

    async def both() -> tuple[dict[str, float], dict[str, float]]:
        request = await _cpu_costs("request", settings.requests, settings.rounds)
        stream = await _cpu_costs("stream", settings.streams, settings.rounds)
        return request, stream

    request, stream = asyncio.run(both())
    return (
        "## CPU per request and per chunk (in-process mock transport, asyncio)\n\n"
        f"Best of {settings.rounds} round(s): {settings.requests} requests and "
        f"{settings.streams} streams of {STREAM_CHUNKS} chunks per round; the same canned "
        "bytes for every client.\n\n" + _cpu_table(request, stream)
    )


# --------------------------------------------------------------------------- part 1c: telemetry


async def _telemetry_costs(
    mode: Mode, iterations: int, rounds: int, calls: dict[str, int]
) -> dict[str, list[float]]:
    """CPU seconds per call of each telemetry configuration, one sample per round, the
    configurations' order rotating each round; ``calls`` gets each configuration's count of
    calls into telemetry.py during one run."""
    peers = telemetry_peers(mode)
    samples: dict[str, list[float]] = {peer.name: [] for peer in peers}
    try:
        expected = 1 if mode == "request" else STREAM_CHUNKS
        for peer in peers:
            got = await peer.run()
            if got != expected:
                raise RuntimeError(f"{peer.name} parsed {got} chunks, expected {expected}")
            calls[peer.name] = await telemetry_calls(peer)
        warmup = max(2, iterations // 10)
        for index in range(rounds):
            shift = index % len(peers)
            for peer in peers[shift:] + peers[:shift]:
                samples[peer.name].append(await cpu_seconds_per_call(peer.run, iterations, warmup))
    finally:
        for peer in peers:
            await peer.aclose()
    return samples


def run_telemetry_part(settings: Settings) -> str:
    """Measure part 1c on asyncio and return its markdown."""
    rounds = max(3, settings.rounds * 2)

    request_calls: dict[str, int] = {}
    stream_calls: dict[str, int] = {}

    async def both() -> tuple[dict[str, list[float]], dict[str, list[float]], tuple[float, float]]:
        request = await _telemetry_costs("request", settings.requests, rounds, request_calls)
        stream = await _telemetry_costs("stream", settings.streams, rounds, stream_calls)
        return request, stream, await start_cost(max(1000, settings.requests * 10))

    request, stream, (hooked, bare) = asyncio.run(both())
    off = CONFIGS[0]
    best_req = {name: min(v) for name, v in request.items()}
    med_req = {name: statistics.median(v) for name, v in request.items()}
    best_chunk = {name: min(v) / STREAM_CHUNKS for name, v in stream.items()}
    med_chunk = {name: statistics.median(v) / STREAM_CHUNKS for name, v in stream.items()}
    rows = [
        [
            name,
            f"{best_req[name] * 1e6:.1f}",
            f"{med_req[name] * 1e6:.1f}",
            f"{(best_req[name] - best_req[off]) * 1e6:+.1f}",
            f"{best_chunk[name] * 1e6:.2f}",
            f"{med_chunk[name] * 1e6:.2f}",
            f"{(best_chunk[name] - best_chunk[off]) * 1e6:+.2f}",
            f"{request_calls[name]} / {stream_calls[name]}",
        ]
        for name in CONFIGS
    ]
    table = markdown_table(
        [
            "swiftclient",
            "µs/request best",
            "median",
            "vs off",
            "µs/chunk best",
            "median",
            "vs off",
            "telemetry.py calls: request / stream",
        ],
        rows,
    )
    added = (hooked - bare) * 1e6
    no_sdk = CONFIGS[1]
    chunk_delta = (best_chunk[no_sdk] - best_chunk[off]) * 1e6
    goals = markdown_table(
        ["goal", "measured", "verdict"],
        [
            [
                f"no-SDK telemetry per call (measured alone) <= {TELEMETRY_CALL_GOAL_US:g} µs",
                f"{added:.2f} µs ({hooked * 1e6:.2f} vs {bare * 1e6:.2f} µs to start a call)",
                verdict(added <= TELEMETRY_CALL_GOAL_US),
            ],
            [
                "telemetry without an SDK, per chunk: nothing",
                f"{stream_calls[no_sdk]} calls into telemetry.py per {STREAM_CHUNKS}-chunk "
                f"stream, {request_calls[no_sdk]} per request; {chunk_delta:+.2f} µs/chunk "
                "end to end (noise)",
                verdict(stream_calls[no_sdk] == request_calls[no_sdk]),
            ],
            [
                "SDK + no-op exporter, per request / per chunk (no goal)",
                f"{(best_req[CONFIGS[2]] - best_req[off]) * 1e6:+.1f} µs / "
                f"{(best_chunk[CONFIGS[2]] - best_chunk[off]) * 1e6:+.2f} µs",
                "-",
            ],
        ],
    )
    return (
        "## Telemetry: CPU per request and per chunk (in-process mock transport, asyncio)\n\n"
        f"{rounds} round(s) of {settings.requests} requests and {settings.streams} streams of "
        f"{STREAM_CHUNKS} chunks per configuration, the order rotating each round; "
        "best and median of the rounds. The per-call line times building and beginning a "
        "one-target call with and without the default Telemetry() (no SDK), best of five. "
        "The last column counts Python calls into swiftclient/telemetry.py during one "
        "request and one stream (sys.setprofile): a count that does not grow with the "
        "stream's chunks means no telemetry work per chunk.\n\n" + table + "\n\n" + goals
    )


# --------------------------------------------------------------------------- part 1b: sockets


async def _socket_costs(
    mode: Mode, base_url: str, iterations: int, rounds: int
) -> dict[str, list[float]]:
    """CPU seconds per call of each real-socket peer, one sample per round."""
    expected = 1 if mode == "request" else STREAM_CHUNKS
    return await _rotated_costs(
        make_socket_peers(mode, base_url), lambda got: got == expected, iterations, rounds
    )


async def _rotated_costs(
    peers: list[Peer], parsed_ok: Callable[[int], bool], iterations: int, rounds: int
) -> dict[str, list[float]]:
    """CPU seconds per call of each peer, one sample per round; the order of the peers
    rotates every round so none always runs first or last. A first untimed call of each
    must parse what ``parsed_ok`` accepts."""
    samples: dict[str, list[float]] = {peer.name: [] for peer in peers}
    try:
        for peer in peers:
            got = await peer.run()
            if not parsed_ok(got):
                raise RuntimeError(f"{peer.name} parsed {got} chunks, not what was expected")
        warmup = max(2, iterations // 10)
        for index in range(rounds):
            shift = index % len(peers)
            for peer in peers[shift:] + peers[:shift]:
                samples[peer.name].append(await cpu_seconds_per_call(peer.run, iterations, warmup))
    finally:
        for peer in peers:
            await peer.aclose()
    return samples


_SOCKET_COLUMNS = [
    "client",
    "µs/request best",
    "median",
    "best vs raw aiohttp",
    "µs/chunk best",
    "median",
    "best vs raw aiohttp",
]


@dataclass(frozen=True)
class _Figures:
    """Best and median CPU per request and per chunk of each client, from round samples."""

    best_req: dict[str, float]
    med_req: dict[str, float]
    best_chunk: dict[str, float]
    med_chunk: dict[str, float]

    @classmethod
    def of(
        cls, request: dict[str, list[float]], stream: dict[str, list[float]], chunks: int
    ) -> _Figures:
        return cls(
            {name: min(v) for name, v in request.items()},
            {name: statistics.median(v) for name, v in request.items()},
            {name: min(v) / chunks for name, v in stream.items()},
            {name: statistics.median(v) / chunks for name, v in stream.items()},
        )

    def table(self, floor: str = "raw aiohttp") -> str:
        """One row per client (of the streams; ``-`` where it made no requests)."""
        best_req, best_chunk = self.best_req, self.best_chunk
        rows = []
        for name in best_chunk:
            request = (
                [
                    f"{best_req[name] * 1e6:.1f}",
                    f"{self.med_req[name] * 1e6:.1f}",
                    f"{ratio(best_req[name], best_req[floor]):.2f}x",
                ]
                if name in best_req
                else ["-", "-", "-"]
            )
            rows.append(
                [
                    name,
                    *request,
                    f"{best_chunk[name] * 1e6:.2f}",
                    f"{self.med_chunk[name] * 1e6:.2f}",
                    f"{ratio(best_chunk[name], best_chunk[floor]):.2f}x",
                ]
            )
        return markdown_table(_SOCKET_COLUMNS, rows)


def _socket_table(request: dict[str, list[float]], stream: dict[str, list[float]]) -> str:
    floor = "raw aiohttp"
    figures = _Figures.of(request, stream, STREAM_CHUNKS)
    table = figures.table(floor)
    best_req, med_req = figures.best_req, figures.med_req
    best_chunk, med_chunk = figures.best_chunk, figures.med_chunk
    req = ratio(best_req["swiftclient"], best_req[floor])
    req_med = ratio(med_req["swiftclient"], med_req[floor])
    chunk = ratio(best_chunk["swiftclient"], best_chunk[floor])
    chunk_med = ratio(med_chunk["swiftclient"], med_chunk[floor])
    goals = markdown_table(
        ["goal (best of rounds; median beside it)", "measured", "verdict"],
        [
            [
                f"per-request CPU: swiftclient/raw aiohttp <= {SOCKET_REQUEST_GOAL}x",
                f"{req:.2f}x (median {req_med:.2f}x)",
                verdict(req <= SOCKET_REQUEST_GOAL),
            ],
            [
                f"per-chunk CPU: swiftclient/raw aiohttp <= {SOCKET_CHUNK_GOAL}x",
                f"{chunk:.2f}x (median {chunk_med:.2f}x)",
                verdict(chunk <= SOCKET_CHUNK_GOAL),
            ],
            [
                "per-request CPU: openai/swiftclient (no goal)",
                f"{ratio(best_req['openai'], best_req['swiftclient']):.2f}x",
                "-",
            ],
        ],
    )
    return table + "\n\n" + goals


def run_socket_part(settings: Settings) -> str:
    """Measure part 1b (asyncio, server in another process) and return its markdown."""
    with fake_provider_process(tokens=STREAM_CHUNKS - 3) as base_url:

        async def both() -> tuple[dict[str, list[float]], dict[str, list[float]]]:
            request = await _socket_costs(
                "request", base_url, settings.socket_requests, settings.socket_rounds
            )
            stream = await _socket_costs(
                "stream", base_url, settings.socket_streams, settings.socket_rounds
            )
            return request, stream

        request, stream = asyncio.run(both())
    return (
        "## CPU per request and per chunk over real loopback sockets (asyncio)\n\n"
        f"The fake provider serves from another process; only this (client) process's CPU "
        f"is counted. {settings.socket_rounds} round(s) of {settings.socket_requests} requests "
        f"and {settings.socket_streams} streams of {STREAM_CHUNKS} chunks per client, the "
        "clients' order rotating each round; µs/chunk is a whole stream's CPU over its "
        "chunks.\n\n" + _socket_table(request, stream)
    )


# --------------------------------------------------------------------------- part 1e: wires


def _wire_table(
    wire: Wire, request: dict[str, list[float]], stream: dict[str, list[float]], tokens: int
) -> str:
    swift, floor = "swiftclient", "raw aiohttp"
    figures = _Figures.of(request, stream, tokens)
    table = figures.table(floor)
    best_req, med_req = figures.best_req, figures.med_req
    best_chunk, med_chunk = figures.best_chunk, figures.med_chunk
    goals: list[list[str]] = []
    for sdk in (name for name in request if name not in (swift, floor)):
        req = ratio(best_req[sdk], best_req[swift])
        req_med = ratio(med_req[sdk], med_req[swift])
        goals.append(
            [
                f"per-request CPU: {sdk}/swiftclient >= {WIRE_REQUEST_GOAL_FACTOR}x",
                f"{req:.2f}x (median {req_med:.2f}x)",
                verdict(req >= WIRE_REQUEST_GOAL_FACTOR),
            ]
        )
    for sdk in (name for name in stream if name not in (swift, floor)):
        chunk = ratio(best_chunk[sdk], best_chunk[swift])
        chunk_med = ratio(med_chunk[sdk], med_chunk[swift])
        goals.append(
            [
                f"per-chunk CPU: {sdk}/swiftclient >= {WIRE_CHUNK_GOAL_FACTOR}x",
                f"{chunk:.2f}x (median {chunk_med:.2f}x)",
                verdict(chunk >= WIRE_CHUNK_GOAL_FACTOR),
            ]
        )
    floor_chunk = ratio(best_chunk[floor], best_chunk[swift])
    goals.append(
        [
            "per-chunk CPU: raw aiohttp/swiftclient (the most any client could reach)",
            f"{floor_chunk:.2f}x",
            "-",
        ]
    )
    verdicts = markdown_table(
        ["goal (best of rounds; median beside it)", "measured", "verdict"], goals
    )
    return f"### {WIRES[wire]}\n\n{table}\n\n{verdicts}"


def run_wires_part(settings: Settings) -> str:
    """Measure part 1e (asyncio, server in another process) and return its markdown."""
    tokens = STREAM_CHUNKS - 3
    with fake_provider_process(tokens=tokens) as base_url:

        async def measure_wire(wire: Wire) -> tuple[dict[str, list[float]], ...]:
            iterations = {"request": settings.socket_requests, "stream": settings.socket_streams}
            results = []
            for mode in ("request", "stream"):
                limit = 1 if mode == "request" else tokens

                def parsed_ok(got: int, limit: int = limit) -> bool:
                    return got >= limit  # every peer sees at least each content delta

                peers = make_wire_peers(wire, mode, base_url)
                results.append(
                    await _rotated_costs(peers, parsed_ok, iterations[mode], settings.socket_rounds)
                )
            return tuple(results)

        async def every_wire() -> list[str]:
            sections = []
            for wire in WIRES:
                request, stream = await measure_wire(wire)
                sections.append(_wire_table(wire, request, stream, tokens))
            return sections

        sections = asyncio.run(every_wire())
    return (
        "## CPU per request and per chunk on the other wires, over real loopback sockets "
        "(asyncio)\n\n"
        f"The fake provider serves each wire from another process; only this (client) "
        f"process's CPU is counted. {settings.socket_rounds} round(s) of "
        f"{settings.socket_requests} requests and {settings.socket_streams} streams of "
        f"{tokens} content deltas per client, the clients' order rotating each round; "
        "µs/chunk is a whole stream's CPU over its content deltas (the same denominator for "
        "every client; the SDK rows iterate the raw event stream, the stream-helper rows also "
        "accumulate the message, as swiftclient's stream does).\n\n" + "\n\n".join(sections)
    )


# --------------------------------------------------------------------------- part 1d: sync


def _sync_cpu_per_call(call: Callable[[], object], iterations: int, warmup: int) -> float:
    """Process CPU seconds per ``call()`` (every thread of the process counted)."""
    for _ in range(warmup):
        call()
    gc.collect()
    start = time.process_time()
    for _ in range(iterations):
        call()
    return (time.process_time() - start) / iterations


def run_sync_part(settings: Settings) -> str:
    """Measure part 1d (blocking clients, server in another process); its markdown."""
    import openai

    from swiftclient import Client, HTTPBackend

    iterations, rounds = settings.socket_requests, settings.socket_rounds
    messages: Any = MESSAGES
    with fake_provider_process(tokens=STREAM_CHUNKS - 3) as base_url:
        swift = Client(HTTPBackend(base_url, API_KEY), model=MODEL)
        sdk = openai.OpenAI(api_key=API_KEY, base_url=base_url, max_retries=0)
        peers: dict[str, Callable[[], object]] = {
            "swiftclient.Client": lambda: swift.chat(messages, stream=False),
            "openai.OpenAI": lambda: sdk.chat.completions.create(model=MODEL, messages=messages),
        }
        samples: dict[str, list[float]] = {name: [] for name in peers}
        try:
            names = list(peers)
            for index in range(rounds):
                for name in names[index % 2 :] + names[: index % 2]:
                    samples[name].append(
                        _sync_cpu_per_call(peers[name], iterations, max(2, iterations // 10))
                    )
        finally:
            swift.close()
            sdk.close()
    best = {name: min(v) for name, v in samples.items()}
    median = {name: statistics.median(v) for name, v in samples.items()}
    table = markdown_table(
        ["client", "µs/request best", "median"],
        [[name, f"{best[name] * 1e6:.1f}", f"{median[name] * 1e6:.1f}"] for name in peers],
    )
    factor = ratio(best["openai.OpenAI"], best["swiftclient.Client"])
    factor_med = ratio(median["openai.OpenAI"], median["swiftclient.Client"])
    goals = markdown_table(
        ["goal (best of rounds; median beside it)", "measured", "verdict"],
        [
            [
                f"per-request CPU: openai.OpenAI/swiftclient.Client >= "
                f"{SYNC_OPENAI_GOAL_FACTOR:.0f}x",
                f"{factor:.2f}x (median {factor_med:.2f}x)",
                verdict(factor >= SYNC_OPENAI_GOAL_FACTOR),
            ]
        ],
    )
    return (
        "## Blocking clients: CPU per request over real loopback sockets\n\n"
        f"{rounds} round(s) of {iterations} non-streamed requests per client, alternating; "
        "the whole client process's CPU is counted (swiftclient.Client's loop thread "
        "included).\n\n" + table + "\n\n" + goals
    )


# --------------------------------------------------------------------------- part 2: load


def _load_config(
    opener: Opener, backend: str, base_url: str, settings: Settings
) -> list[LoadResult]:
    def repeats(concurrency: int) -> int:
        # A batch of a handful of streams lasts milliseconds: take more samples of it.
        return settings.load_repeats if concurrency >= 64 else 5 * settings.load_repeats

    async def main() -> list[LoadResult]:
        return await measure(
            opener,
            base_url,
            settings.concurrencies,
            repeats=repeats,
            expected_chunks=STREAM_CHUNKS,
            max_connections=MAX_CONNECTIONS,
        )

    return anyio.run(main, backend=backend)


def _errors(result: LoadResult) -> str:
    total = sum(result.errors.values())
    if not total:
        return "0"
    detail = ", ".join(f"{name}: {n}" for name, n in result.errors.most_common())
    return f"{total} ({detail})"


def _load_table(results: dict[str, list[LoadResult]]) -> str:
    peer = {r.concurrency: r for r in results["raw aiohttp"]}
    rows: list[list[object]] = []
    goals: list[list[object]] = []
    for name, runs in results.items():
        for result in runs:
            base = peer[result.concurrency]
            vs = ratio(result.wall, base.wall)
            rows.append(
                [
                    name,
                    result.concurrency,
                    f"{result.wall:.3f}",
                    f"{result.cpu:.3f}",
                    _errors(result),
                    result.streams,
                    f"{vs:.2f}x",
                ]
            )
            if result.concurrency >= min(GOAL_CONCURRENCY, max(peer)) and name != "raw aiohttp":
                # The wall-time goal is for the default transport (aiohttp, on asyncio);
                # trio runs httpx's own transport, where aiohttp cannot run: zero errors only.
                timed = "trio" not in name
                ok = not result.errors and (vs <= LOAD_GOAL_VS_AIOHTTP or not timed)
                goal = f"<= {LOAD_GOAL_VS_AIOHTTP}x aiohttp" if timed else "(wall time shown only)"
                goals.append(
                    [
                        f"{name}: {result.concurrency} streams, 0 errors, {goal}",
                        f"{vs:.2f}x, {sum(result.errors.values())} errors",
                        verdict(ok),
                    ]
                )
    table = markdown_table(
        [
            "client",
            "streams",
            "best wall s",
            "client CPU s",
            "errors (all batches)",
            "streams run",
            "vs aiohttp",
        ],
        rows,
    )
    return table + "\n\n" + markdown_table(["goal", "measured", "verdict"], goals)


def run_load_part(settings: Settings) -> str:
    """Measure part 2 against a fake provider in a separate process; return its markdown."""
    configs: list[tuple[str, Opener, str]] = [
        ("swiftclient asyncio (aiohttp transport)", open_swiftclient, "asyncio"),
        ("swiftclient trio (httpx transport)", open_swiftclient, "trio"),
        ("raw aiohttp", open_aiohttp, "asyncio"),
    ]
    results: dict[str, list[LoadResult]] = {}
    with fake_provider_process(tokens=STREAM_CHUNKS - 3) as base_url:
        for name, opener, backend in configs:
            results[name] = _load_config(opener, backend, base_url, settings)
    cpus = os.cpu_count()
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else cpus
    return (
        "## Concurrent streams against the fake provider in a separate process\n\n"
        f"CPUs: {cpus} (usable by this process: {usable}). The server runs in its own process "
        "(its CPU is off the client's GIL), but client and server still share these cores, "
        "so wall times include the server's work too. Each stream has "
        f"{STREAM_CHUNKS} chunks; max_connections={MAX_CONNECTIONS} for every client; one "
        "untimed warm-up batch per configuration, then the best of "
        f"{settings.load_repeats} timed batch(es) ({5 * settings.load_repeats} for fewer "
        "than 64 streams).\n\n" + _load_table(results)
    )


# --------------------------------------------------------------------------- profile


def profile_stream(streams: int, top: int = 10) -> str:
    """cProfile of swiftclient's streamed-chunk path; the ``top`` entries by cumulative time."""

    async def main() -> cProfile.Profile:
        peer = SwiftPeer("stream")
        try:
            for _ in range(5):
                await peer.run()
            profiler = cProfile.Profile()
            profiler.enable()
            for _ in range(streams):
                await peer.run()
            profiler.disable()
        finally:
            await peer.aclose()
        return profiler

    out = io.StringIO()
    stats = pstats.Stats(asyncio.run(main()), stream=out)
    stats.sort_stats("cumulative").print_stats(top)
    return (
        f"## cProfile: swiftclient stream path, {streams} streams x {STREAM_CHUNKS} chunks\n\n"
        "```\n" + out.getvalue().strip() + "\n```"
    )


# --------------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> int:
    """Run both parts and print their markdown; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small counts for a smoke run")
    parser.add_argument(
        "--profile", action="store_true", help="also print a cProfile of the stream path"
    )
    parser.add_argument("--telemetry", action="store_true", help="run only the telemetry part (1c)")
    parser.add_argument(
        "--sync", action="store_true", help="run only the blocking-client part (1d)"
    )
    parser.add_argument("--wires", action="store_true", help="run only the other-wires part (1e)")
    args = parser.parse_args(argv)
    settings = QUICK if args.quick else FULL
    started = time.perf_counter()
    print(
        f"# Client overhead ({'quick' if args.quick else 'full'} run)\n\n"
        f"Python {platform.python_version()} on {platform.machine()}, "
        f"{os.cpu_count()} CPUs.\n",
        flush=True,
    )
    if args.telemetry:
        print(run_telemetry_part(settings) + "\n", flush=True)
        print(f"Total time: {time.perf_counter() - started:.1f} s")
        return 0
    if args.sync:
        print(run_sync_part(settings) + "\n", flush=True)
        print(f"Total time: {time.perf_counter() - started:.1f} s")
        return 0
    if args.wires:
        print(run_wires_part(settings) + "\n", flush=True)
        print(f"Total time: {time.perf_counter() - started:.1f} s")
        return 0
    print(run_cpu_part(settings) + "\n", flush=True)
    print(run_telemetry_part(settings) + "\n", flush=True)
    print(run_socket_part(settings) + "\n", flush=True)
    print(run_sync_part(settings) + "\n", flush=True)
    print(run_wires_part(settings) + "\n", flush=True)
    print(run_load_part(settings) + "\n", flush=True)
    if args.profile:
        print(profile_stream(10 if args.quick else 100) + "\n", flush=True)
    print(f"Total time: {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
