"""Hedged requests against a simulated heavy-tailed provider: tail latency, extra load, waste.

Run from the repository root::

    .venv/bin/python bench/hedging.py              # full run, about 3.5 minutes
    .venv/bin/python bench/hedging.py --quick      # smoke run, a few seconds
    .venv/bin/python bench/hedging.py --strategy none,all --utilization 0.6

The server (``bench/_hedge_server.py``, uvicorn in its own process, loopback only) plays a
provider with 4 replicas; each serves ``slots`` requests at once and queues the rest. Time to
first token is a lognormal body with a Pareto tail (p99/p50 about 50, ``bench/_tail.py``),
drawn per (call, replica) so every strategy meets the same stragglers. Calls arrive
open-loop (Poisson) at a rate set from the replicas' capacity for 30%, 60% and 85%
utilization; each call names two replicas, a primary and another one.

Strategies, each on its own client (warmed up by unmeasured calls, then kept for every round
of a utilization; the strategies take turns, two rounds of 1,000 calls each):

- ``none``: ``client.stream(model="rP/sim")``, one replica, no hedging;
- ``fixed``: ``hedge=Hedge(delay=<p97 of none at this utilization>)`` over both replicas
  (the same quantile as ``adaptive``, above 1 - budget: see :func:`adaptive_policy`);
- ``adaptive``: ``hedge=Hedge(quantile=0.97)`` (the delay is the recent p97 per target);
- ``all``: both replicas at t=0 in one task group, the first token wins, the other is
  cancelled (what "fire every request at once" does).

``fixed`` and ``adaptive`` need ``swiftclient.Hedge`` (issue 8's hedged call path); without it
they are reported as skipped. A last scenario makes one replica fail (503 after 0.5 s)
a fifth of the way into a run at 60% utilization: sequential fallback and the adaptive hedge
route around it once its circuit breaker opens. Its goal: once the breaker has opened, p95 and
p99 come back within 2x of the same policy's on the same calls with r3 absent from the start
(the three replicas left then carry the same load).

Goals (PASS/FAIL printed): with at most 5% extra requests, p99 TTFT >= 4x lower than no
hedging, p99.9 >= 10x lower, p50 at most 2% higher; at 85% utilization no worse than no
hedging.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import platform
import random
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx
from _hedge_server import hedge_server_process
from _tail import TailModel
from _util import markdown_table, ratio, verdict

from swiftclient import AsyncClient, Hedge, HTTPBackend, RetryPolicy, SwiftClientError, Timeout
from swiftclient.extend import PolicyHub

STRATEGIES = ("none", "fixed", "adaptive", "all")
REPLICAS = 4
MODEL = "sim"
TOKENS = 8
FAIL_AT = 0.2
"""Where in the failure scenario's run replica r3 starts failing; the first half of the time
left is the transition (the breakers must see enough failures), the second half "after"."""
FAIL_DELAY_MEDIANS = 25.0
"""A failing replica answers 503 after this many medians (0.5 s at the default scale)."""
HEDGE_BUDGET = 0.04
HEDGE_FLOOR = 0.1
HEDGE_BURST = 8.0
"""The hedge budget: 4% of calls, a floor of 0.1/s and at most 8 hedges banked, so hedges
stay within the 5% goal over a row's 1000 calls (40 + 8 + the floor's ~1) while a burst of
stragglers still finds tokens (a burst of 2 left some unhedged and cost the p99.9)."""
ADAPTIVE_QUANTILE = 0.97
NO_RETRY = RetryPolicy(max_attempts=1)
PROMPT = "Summarize the following note in one line. " * 8
P99_GOAL, P999_GOAL, P50_TOLERANCE, EXTRA_LIMIT = 4.0, 10.0, 0.02, 0.05
FAILURE_RATE = 170.0
"""Calls/s of the failure scenario (its 30 s breaker window and phases are sized for it)."""
RECOVERY_FACTOR = 2.0
"""After a replica fails and its breaker opens, p95/p99 must come back within this factor of
the same policy's on the same calls with the replica absent from the start."""


@dataclass(frozen=True)
class Settings:
    """The size of one run."""

    calls: int
    """Measured calls per (utilization, strategy) in one round."""
    rounds: int
    """Rounds per utilization: each round runs every strategy once, in turn (the order
    rotating), on its own calls, so the strategies alternate and each row pools
    ``rounds x calls`` calls."""
    warmup: int
    """Unmeasured calls on each strategy's client before its first round (the adaptive
    estimate needs ``Hedge.min_samples`` = 20 per replica: 100 calls over 4 replicas give
    about 25 each)."""
    utilizations: tuple[float, ...]
    median: float
    """The median time to first token, seconds (the time scale)."""
    rate: float
    """Target arrival rate, calls/s; replica slots are sized from it per utilization."""
    failure_calls: int
    """Calls of the failing-replica scenario (0: skip it)."""


FULL = Settings(
    calls=1000,
    rounds=2,
    warmup=100,
    utilizations=(0.3, 0.6, 0.85),
    median=0.02,
    rate=170,
    failure_calls=1600,
)
QUICK = Settings(
    calls=60, rounds=1, warmup=30, utilizations=(0.3,), median=0.01, rate=60, failure_calls=0
)


def adaptive_policy() -> Any:
    """The adaptive policy as the bench runs it.

    The delay is the recent p97, not Hedge's default p95: with a 5% budget, a p95 delay
    asks for hedges on 5% of calls, exactly what the bucket holds, so bursts of slow calls
    find it empty and the stragglers among them go unhedged. A quantile a little above
    ``1 - budget`` leaves the budget room to catch every straggler.
    """
    return Hedge(
        quantile=ADAPTIVE_QUANTILE,
        budget=HEDGE_BUDGET,
        budget_floor=HEDGE_FLOOR,
        budget_burst=HEDGE_BURST,
    )


# --------------------------------------------------------------------------- workload


@dataclass(frozen=True)
class Workload:
    """Arrival times and the two replicas of every call (the same for every strategy)."""

    utilization: float
    slots: int
    rate: float
    arrivals: tuple[float, ...]
    primary: tuple[int, ...]
    secondary: tuple[int, ...]


def plan(settings: Settings, utilization: float, mean_service: float, seed: int) -> Workload:
    """Size the replicas for ``utilization`` near the target rate; draw arrivals and targets."""
    slots = max(1, round(settings.rate * mean_service / (utilization * REPLICAS)))
    rate = utilization * REPLICAS * slots / mean_service
    rng = random.Random(f"{seed}:{utilization}")
    total = settings.warmup + settings.rounds * settings.calls
    arrivals, now = [], 0.0
    for _ in range(total):
        now += rng.expovariate(rate)
        arrivals.append(now)
    primary = [rng.randrange(REPLICAS) for _ in range(total)]
    secondary = [(p + 1 + rng.randrange(REPLICAS - 1)) % REPLICAS for p in primary]
    return Workload(utilization, slots, rate, tuple(arrivals), tuple(primary), tuple(secondary))


def mean_service(model: TailModel) -> float:
    """Seconds a request holds a slot on average: first token plus the short decode."""
    return model.mean_busy() + model.median * 0.1 * (TOKENS - 1)


# --------------------------------------------------------------------------- one call


@dataclass
class RunResult:
    """One strategy at one utilization."""

    strategy: str
    ttfts: list[float] = field(default_factory=list)
    started: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    requests: int = 0
    wasted_tokens: int = 0
    billed_tokens: int = 0
    skipped: str | None = None
    health: dict[str, str] = field(default_factory=dict)
    wall: float = 0.0
    """Seconds of the measured part (first arrival to last call done)."""
    client_cpu: float = 0.0
    server_cpu: float = 0.0

    @property
    def calls(self) -> int:
        return len(self.ttfts)

    def add(self, other: RunResult) -> None:
        """Pool another round of the same strategy into this result."""
        self.ttfts += other.ttfts
        self.started += other.started
        self.errors.update(other.errors)
        self.requests += other.requests
        self.wasted_tokens += other.wasted_tokens
        self.billed_tokens += other.billed_tokens
        self.health = other.health or self.health
        self.wall += other.wall
        self.client_cpu += other.client_cpu
        self.server_cpu += other.server_cpu

    def quantile(self, q: float, subset: Sequence[float] | None = None) -> float:
        """The q-quantile TTFT (failed calls count as infinitely slow)."""
        values = sorted(self.ttfts if subset is None else subset)
        if not values:
            return math.nan
        return values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))]

    @property
    def extra(self) -> float:
        return ratio(self.requests - self.calls, self.calls)

    @property
    def wasted(self) -> float:
        return ratio(self.wasted_tokens, self.billed_tokens)


Call = Callable[[AsyncClient, int, Workload], Awaitable[float]]


def _messages(call: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"[call {call}] {PROMPT}"}]


def _targets(workload: Workload, index: int) -> list[str]:
    return [f"r{workload.primary[index]}/{MODEL}", f"r{workload.secondary[index]}/{MODEL}"]


async def _consume(stream: Any, started: float) -> float:
    ttft = time.perf_counter() - started
    async for _ in stream:
        pass
    return ttft


def plain_call(timeout: Timeout) -> Call:
    """No hedging: the primary replica only."""

    async def call(client: AsyncClient, index: int, workload: Workload) -> float:
        started = time.perf_counter()
        target = _targets(workload, index)[0]
        async with client.stream(
            _messages(index), model=target, timeout=timeout, retry=NO_RETRY
        ) as stream:
            return await _consume(stream, started)

    return call


def hedged_call(timeout: Timeout, hedge: Any) -> Call:
    """Both replicas through the hedged call path (``hedge=None``: sequential fallback)."""

    async def call(client: AsyncClient, index: int, workload: Workload) -> float:
        started = time.perf_counter()
        options: dict[str, Any] = {} if hedge is None else {"hedge": hedge}
        async with client.stream(
            _messages(index),
            model=_targets(workload, index),  # type: ignore[arg-type,unused-ignore]
            timeout=timeout,
            **options,
        ) as stream:
            return await _consume(stream, started)

    return call


def all_at_once_call(timeout: Timeout) -> Call:
    """Every target at t=0 in one task group; the first token wins, the rest are cancelled."""

    async def call(client: AsyncClient, index: int, workload: Workload) -> float:
        started = time.perf_counter()
        targets = _targets(workload, index)
        scopes = [anyio.CancelScope() for _ in targets]
        result: list[float] = []
        failures: list[BaseException] = []

        async def attempt(k: int) -> None:
            with scopes[k]:
                try:
                    async with client.stream(
                        _messages(index), model=targets[k], timeout=timeout, retry=NO_RETRY
                    ) as stream:
                        if result:
                            return
                        result.append(time.perf_counter() - started)
                        for other, scope in enumerate(scopes):
                            if other != k:
                                scope.cancel()
                        async for _ in stream:
                            pass
                except SwiftClientError as exc:
                    failures.append(exc)

        async with anyio.create_task_group() as tg:
            for k in range(len(targets)):
                tg.start_soon(attempt, k)
        if not result:
            raise failures[0]
        return result[0]

    return call


# --------------------------------------------------------------------------- one run


def _client(base: str) -> AsyncClient:
    backends = {
        f"r{i}": HTTPBackend(f"{base}/r{i}/v1", "sk-bench", name=f"r{i}", max_connections=512)
        for i in range(REPLICAS)
    }
    # The client's shared budget (4% extra requests, a small per-second floor, a burst
    # of 8) sizes every hedged row; the per-call Hedge only chooses the delay.
    budget = Hedge(budget=HEDGE_BUDGET, budget_floor=HEDGE_FLOOR, budget_burst=HEDGE_BURST)
    return AsyncClient(backends=backends, policies=PolicyHub.standard(budget))


async def _control(base: str, **command: Any) -> dict[str, Any]:
    async with httpx.AsyncClient() as http:
        for _ in range(200):
            answer = await http.post(f"{base}/control", json=command)
            if answer.status_code != 409:  # 409: stragglers still in flight
                answer.raise_for_status()
                result: dict[str, Any] = answer.json()
                return result
            await anyio.sleep(0.05)
    raise RuntimeError(f"the server stayed busy: {answer.text}")


async def _stats(base: str) -> dict[str, Any]:
    async with httpx.AsyncClient() as http:
        answer = await http.get(f"{base}/stats")
        answer.raise_for_status()
        result: dict[str, Any] = answer.json()
        return result


async def _drive(
    client: AsyncClient,
    call: Call,
    workload: Workload,
    indices: range,
    result: RunResult | None,
    at: Callable[[float], Coroutine[Any, Any, None]] | None = None,
) -> None:
    """Start the calls at their arrival times (open loop) and wait for all of them."""
    offset = workload.arrivals[indices.start - 1] if indices.start else 0.0
    origin = anyio.current_time()

    async def one(index: int) -> None:
        began = anyio.current_time() - origin
        try:
            ttft = await call(client, index, workload)
        except SwiftClientError as exc:
            if result is not None:
                result.errors[type(exc).__name__] += 1
            ttft = math.inf
        if result is not None:
            result.ttfts.append(ttft)
            result.started.append(began)

    async with anyio.create_task_group() as tg:
        if at is not None:
            tg.start_soon(at, origin)
        for index in indices:
            delay = workload.arrivals[index] - offset - (anyio.current_time() - origin)
            if delay > 0:
                await anyio.sleep(delay)
            tg.start_soon(one, index)


async def run_strategy(
    base: str,
    strategy: str,
    call: Call,
    workload: Workload,
    settings: Settings,
    at: Callable[[float], Coroutine[Any, Any, None]] | None = None,
    round_: int = 0,
) -> RunResult:
    """Warm a fresh client up, then measure round ``round_``'s ``settings.calls`` calls
    against fresh counters."""
    await _control(base, failing=[], reset=True)
    async with _client(base) as client:
        await warm_up(client, call, workload, settings)
        return await measure(base, strategy, client, call, workload, settings, at, round_)


async def warm_up(client: AsyncClient, call: Call, workload: Workload, settings: Settings) -> None:
    """``settings.warmup`` unmeasured calls on ``client``."""
    await _drive(client, call, workload, range(settings.warmup), None)


async def measure(
    base: str,
    strategy: str,
    client: AsyncClient,
    call: Call,
    workload: Workload,
    settings: Settings,
    at: Callable[[float], Coroutine[Any, Any, None]] | None = None,
    round_: int = 0,
) -> RunResult:
    """Measure round ``round_``'s ``settings.calls`` calls on ``client`` against fresh
    server counters."""
    result = RunResult(strategy)
    await _control(base, failing=[], reset=True)
    first = settings.warmup + round_ * settings.calls
    measured = range(first, first + settings.calls)
    server_cpu = (await _stats(base))["cpu"]
    wall, cpu = time.perf_counter(), time.process_time()
    await _drive(client, call, workload, measured, result, at)
    result.wall = time.perf_counter() - wall
    result.client_cpu = time.process_time() - cpu
    health = getattr(client, "health", None)
    if health is not None:
        result.health = dict(health())
    stats = await _stats(base)
    result.server_cpu = stats["cpu"] - server_cpu
    for counters in stats["replicas"].values():
        result.requests += counters["requests"]
        result.billed_tokens += (
            counters["billed_prompt_tokens"] + counters["billed_completion_tokens"]
        )
        result.wasted_tokens += (
            counters["wasted_prompt_tokens"] + counters["wasted_completion_tokens"]
        )
    return result


def strategy_call(
    strategy: str, timeout: Timeout, fixed_delay: float | None
) -> tuple[Call | None, str | None]:
    """The call for ``strategy``, or ``None`` and why it is skipped."""
    if strategy == "none":
        return plain_call(timeout), None
    if strategy == "all":
        return all_at_once_call(timeout), None
    if strategy == "fixed":
        hedge = Hedge(delay=fixed_delay)  # the budget is the client's (``_client``)
        return hedged_call(timeout, hedge), None
    if strategy == "adaptive":
        return hedged_call(timeout, adaptive_policy()), None
    raise ValueError(f"unknown strategy {strategy!r}")


# --------------------------------------------------------------------------- report


def _ms(seconds: float) -> str:
    return "timeout" if math.isinf(seconds) else f"{seconds * 1000:.1f}"


def results_table(results: Sequence[RunResult]) -> str:
    """One row per strategy: TTFT quantiles, extra requests, wasted tokens, errors, and the
    CPU share each process used during the measured calls (near 100%: the row measures a
    saturated process, not the replicas)."""
    rows: list[list[object]] = []
    notes: list[str] = []
    for r in results:
        if r.skipped:
            rows.append([r.strategy, *["-"] * 9])
            notes.append(f"{r.strategy}: {r.skipped}")
            continue
        rows.append(
            [
                r.strategy,
                _ms(r.quantile(0.5)),
                _ms(r.quantile(0.95)),
                _ms(r.quantile(0.99)),
                _ms(r.quantile(0.999)),
                f"{100 * r.extra:.1f}",
                f"{100 * r.wasted:.1f}",
                sum(r.errors.values()) or "0",
                f"{100 * ratio(r.client_cpu, r.wall):.0f}",
                f"{100 * ratio(r.server_cpu, r.wall):.0f}",
            ]
        )
    headers = ["strategy", "p50 ms", "p95 ms", "p99 ms", "p99.9 ms", "extra req %"]
    cpu = ["client CPU %", "server CPU %"]
    table = markdown_table([*headers, "wasted tok %", "errors", *cpu], rows)
    return "\n\n".join([table, *notes])


def goal_rows(utilization: float, results: Sequence[RunResult]) -> list[list[object]]:
    """PASS/FAIL rows for the hedged strategies against no hedging at one utilization."""
    by_name = {r.strategy: r for r in results if not r.skipped}
    base = by_name.get("none")
    rows: list[list[object]] = []
    if base is None:
        return rows
    u = f"{utilization:.0%}"
    for name in ("adaptive", "fixed"):
        r = by_name.get(name)
        if r is None:
            continue
        extra_ok = r.extra <= EXTRA_LIMIT
        p50 = ratio(r.quantile(0.5), base.quantile(0.5))
        p99 = ratio(base.quantile(0.99), r.quantile(0.99))
        p999 = ratio(base.quantile(0.999), r.quantile(0.999))
        rows.append([u, name, f"extra requests <= {EXTRA_LIMIT:.0%}", f"{r.extra:.1%}"])
        rows[-1].append(verdict(extra_ok))
        if utilization >= 0.8:
            worse = r.quantile(0.99) <= base.quantile(0.99) and p50 <= 1 + P50_TOLERANCE
            rows.append([u, name, "no worse than no hedging (p50, p99)", f"p99 {1 / p99:.2f}x"])
            rows[-1].append(verdict(worse))
            continue
        rows.append([u, name, f"p99 >= {P99_GOAL:g}x lower", f"{p99:.1f}x", verdict(p99 >= 4)])
        rows.append(
            [u, name, f"p99.9 >= {P999_GOAL:g}x lower", f"{p999:.1f}x", verdict(p999 >= 10)]
        )
        rows.append(
            [
                u,
                name,
                f"p50 within {P50_TOLERANCE:.0%} (not higher)",
                f"{p50:.3f}x",
                verdict(p50 <= 1 + P50_TOLERANCE),
            ]
        )
    return rows


# --------------------------------------------------------------------------- main


async def main_async(args: argparse.Namespace) -> int:
    settings = QUICK if args.quick else FULL
    if args.calls:
        settings = Settings(**{**settings.__dict__, "calls": args.calls})
    if args.utilization:
        utils = tuple(float(u) for u in args.utilization.split(","))
        settings = Settings(**{**settings.__dict__, "utilizations": utils})
    strategies = [s.strip() for s in args.strategy.split(",") if s.strip()]
    unknown = set(strategies) - set(STRATEGIES)
    if unknown:
        print(f"unknown strategies {sorted(unknown)}; choose from {STRATEGIES}", file=sys.stderr)
        return 2
    model = TailModel().with_median(settings.median)
    service = mean_service(model)
    timeout = Timeout(total=max(5.0, 150 * settings.median), connect=5.0, pool=30.0)
    began = time.perf_counter()
    print("# Hedging: heavy-tailed simulated provider\n")
    print(
        f"python {platform.python_version()}, {os.cpu_count()} CPUs, load average "
        f"{os.getloadavg()[0]:.2f}"
    )
    print(
        f"server: {REPLICAS} replicas, TTFT median {settings.median * 1000:.0f} ms "
        f"(lognormal sigma {model.sigma}, {model.tail_prob:.1%} Pareto tail from "
        f"{model.tail_min:g}x, alpha {model.tail_alpha}, cap {model.tail_cap:g}x), "
        f"mean slot time {service * 1000:.1f} ms; {settings.rounds} rounds of "
        f"{settings.calls} measured calls per row (the strategies take turns, the order "
        f"rotating; one client per strategy, kept from round to round, after "
        f"{settings.warmup} warm-up calls)\n"
    )
    goals: list[list[object]] = []
    with hedge_server_process(
        REPLICAS, 1, settings.median, TOKENS, FAIL_DELAY_MEDIANS * settings.median
    ) as base:
        for utilization in settings.utilizations:
            workload = plan(settings, utilization, service, args.seed)
            await _control(base, slots=workload.slots, seed=args.seed, reset=True)
            print(
                f"## {utilization:.0%} utilization: {workload.slots} slots per replica, "
                f"{workload.rate:.0f} calls/s\n"
            )
            pooled: dict[str, RunResult] = {}
            fixed_delay = model.median * 2.5
            async with AsyncExitStack() as clients_open:
                # One client per strategy, warmed up before its first round and kept for
                # the rest, as a long-running application keeps its client (its latency
                # estimates, budget and breakers carry over from round to round).
                clients: dict[str, AsyncClient] = {}
                for round_ in range(settings.rounds):
                    # The order rotates from round to round (round 0 starts with "none",
                    # whose p97 sets the fixed delay): no strategy always runs first or last.
                    shift = round_ % len(strategies)
                    for strategy in strategies[shift:] + strategies[:shift]:
                        call, skipped = strategy_call(strategy, timeout, fixed_delay)
                        if call is None:
                            pooled[strategy] = RunResult(strategy, skipped=skipped)
                            continue
                        client = clients.get(strategy)
                        if client is None:
                            client = await clients_open.enter_async_context(_client(base))
                            await warm_up(client, call, workload, settings)
                            clients[strategy] = client
                        result = await measure(
                            base, strategy, client, call, workload, settings, round_=round_
                        )
                        first_none = strategy == "none" and not round_
                        if first_none and math.isfinite(result.quantile(0.95)):
                            fixed_delay = result.quantile(ADAPTIVE_QUANTILE)
                        if strategy in pooled:
                            pooled[strategy].add(result)
                        else:
                            pooled[strategy] = result
            results = [pooled[strategy] for strategy in strategies]
            print(results_table(results))
            print()
            goals.extend(goal_rows(utilization, results))
        if settings.failure_calls and not args.no_failure:
            await failure_scenario(base, settings, service, timeout, args.seed, goals)
    if goals:
        print("## Goals\n")
        print(markdown_table(["utilization", "policy", "goal", "measured", "verdict"], goals))
        print()
    print(f"whole run: {time.perf_counter() - began:.1f} s")
    return 0


async def failure_scenario(
    base: str,
    settings: Settings,
    service: float,
    timeout: Timeout,
    seed: int,
    goals: list[list[object]],
) -> None:
    """60% utilization; replica r3 starts failing a fifth of the way in."""
    print("## One replica fails (r3 answers 503 after a delay, from a fifth of the run on)\n")
    scenario = Settings(
        **{
            **settings.__dict__,
            "calls": settings.failure_calls,
            "rounds": 1,
            "rate": min(settings.rate, FAILURE_RATE),
        }
    )
    workload = plan(scenario, 0.6, service, seed + 1)
    await _control(base, slots=workload.slots, seed=seed + 1, reset=True)
    first = workload.arrivals[scenario.warmup]
    fail_at = (workload.arrivals[-1] - first) * FAIL_AT
    transition = (workload.arrivals[-1] - first - fail_at) / 2

    async def break_r3(origin: float) -> None:
        await anyio.sleep(max(0.0, origin + fail_at - anyio.current_time()))
        await _control(base, failing=["r3"])

    healthy = without_replica(workload, 3, seed)
    rows: list[list[object]] = []
    for name, hedge in (
        ("fallback", None),
        ("adaptive", adaptive_policy()),
    ):
        call = hedged_call(timeout, hedge)
        # The baseline: the same calls with r3 gone from the start (its calls name healthy
        # replicas instead), so the three left carry the same load as after the failure.
        await _control(base, failing=[], reset=True)
        steady = await run_strategy(base, f"{name} (r3 absent)", call, healthy, scenario)
        await _control(base, reset=True)
        r = await run_strategy(base, name, call, workload, scenario, break_r3)
        phases: dict[str, list[float]] = {"before": [], "transition": [], "after": []}
        for began, ttft in zip(r.started, r.ttfts, strict=True):
            if began < fail_at:
                phases["before"].append(ttft)
            else:
                phases["transition" if began < fail_at + transition else "after"].append(ttft)
        p95 = {k: r.quantile(0.95, v) for k, v in phases.items()}
        p99 = {k: r.quantile(0.99, v) for k, v in phases.items()}
        p95["absent"], p99["absent"] = steady.quantile(0.95), steady.quantile(0.99)
        rows.append(
            [
                name,
                *(f"{_ms(p95[k])} / {_ms(p99[k])}" for k in (*phases, "absent")),
                r.health.get(f"r3/{MODEL}", "n/a"),
                sum(r.errors.values()) or "0",
            ]
        )
        for q, values in (("p95", p95), ("p99", p99)):
            recovered = values["after"] <= RECOVERY_FACTOR * values["absent"]
            measured = f"{_ms(values['after'])} vs {_ms(values['absent'])} ms"
            goal = f"{q} after <= {RECOVERY_FACTOR:g}x {q} with r3 absent"
            goals.append(["60%, r3 failing", name, goal, measured, verdict(recovered)])
    headers = ["policy", "before: p95 / p99 ms", f"first {transition:.1f} s", "after"]
    headers += ["r3 absent from the start", "r3 breaker"]
    print(markdown_table([*headers, "errors"], rows))
    print()


def without_replica(workload: Workload, gone: int, seed: int) -> Workload:
    """``workload`` with every call that names replica ``gone`` naming a healthy one instead
    (a replica that is neither ``gone`` nor the call's other one, drawn with a fixed seed)."""
    rng = random.Random(f"{seed}:without:{gone}")
    healthy = [r for r in range(REPLICAS) if r != gone]
    primary, secondary = list(workload.primary), list(workload.secondary)
    for i, (p, q) in enumerate(zip(primary, secondary, strict=True)):
        if p == gone:
            primary[i] = rng.choice([r for r in healthy if r != q])
        elif q == gone:
            secondary[i] = rng.choice([r for r in healthy if r != p])
    return dataclasses.replace(workload, primary=tuple(primary), secondary=tuple(secondary))


def main(argv: list[str] | None = None) -> int:
    """Parse arguments and run."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run, a few seconds")
    parser.add_argument(
        "--strategy", default=",".join(STRATEGIES), help=f"comma list of {STRATEGIES}"
    )
    parser.add_argument("--utilization", default="", help="comma list, e.g. 0.3,0.85")
    parser.add_argument("--calls", type=int, default=0, help="measured calls per row")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-failure", action="store_true", help="skip the failure scenario")
    return anyio.run(main_async, parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
