"""Prompt-prefix caching across replicas: a naive client against swiftclient, on real local
engine servers with the prefix cache on.

Run from the repository root::

    .venv/bin/python bench/prefix_cache.py             # full run, a few minutes on 2 cores
    .venv/bin/python bench/prefix_cache.py --quick     # smoke run (used by tests)
    .venv/bin/python bench/prefix_cache.py --workloads c --replicas 2

Each arm gets fresh servers (``python -m local_engine.server``, the embedded random-weight
``swift-tiny-random`` model (4,096 positions; the trained ``swift-tiny`` holds 2,048, too few
for workload (c)), one torch thread each, block size 16), so every arm starts cold. The
same generated requests go to every arm:

- ``naive``: the requests as the application built them, plain OpenAI-style JSON over httpx,
  each to a random replica, every wave sent at once with ``asyncio.gather``;
- ``swiftclient, random routing``: swiftclient (canonical bytes, ``client.batch``) with each
  call sent to a random replica: what the client does without affinity;
- ``swiftclient``: ``ReplicaBackend`` (rendezvous affinity on the prefix fingerprint, the
  load rule) and ``client.batch`` (prefix groups: leader first, followers at its first token).

Workloads (``--quick`` shrinks each):

- ``a``: a multi-turn agent. 8 sessions x 4 turns, each turn of every session sent at once;
  20 tools whose list order and schema keyword order (and ``required`` order) vary per call,
  and a timestamp at the end of the system prompt.
- ``b``: retrieval. 16 questions over the same 8 documents, which the application lists in a
  different order each time; sent at once. The swiftclient arms list them by document id:
  static content must be the same bytes every call, and the order of a list is the
  application's to fix (the SDK never reorders message content).
- ``c``: 64 requests sharing a 2,000-token prefix, sent at once.

Measured: the engine's cached-token ratio (``usage.prompt_tokens_details.cached_tokens`` over
prompt tokens, as the servers report them), against the oracle: each request reusing its
longest common prefix with any earlier request of the workload, in whole 16-token blocks,
on the ideal form of the requests (tools in one order, one schema key order, documents in one
order, the timestamp after the static prefix), tokenized as the engine tokenizes them. Time
to first token is measured from the moment the wave was submitted (so a follower's wait for
its leader counts), mean and p99; total is the wall time of the workload.

Goals (PASS/FAIL printed): swiftclient at >= 90% of the oracle on (a) and (c); mean TTFT on
(c) >= 3x lower than the naive gather; affinity routing >= 2x the hit ratio of random routing
on (a), where each session has its own prefix. On (b) and (c) one prefix is shared by every
request, so random routing loses at most one cold prefill per replica (and the engine's own
scheduler lets queued requests hit a prefix an earlier one just computed): the ratio is
printed there without a goal. With random routing a session's turn finds its history only
when an earlier turn happened to land on the same replica (probability 1 - (1 - 1/n)^t
after t turns on n replicas), so routing matters more the more replicas there are.

Replicas per workload (``--replicas N`` sets one count for all): 4 for (a), where that effect
is the point; 2 for (b) and (c), so that on a 2-core machine each replica has a core of its
own (with more busy replicas than cores, the naive client's spread would win or lose CPU
share against other processes rather than cache hits). The table shows the count per row.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
from _server import server_process
from _util import markdown_table, ratio, verdict

from local_engine.chat import ChatFormatter
from local_engine.default_model import ensure_default_model
from local_engine.tokenizer import Tokenizer
from swiftclient import (
    AsyncClient,
    ChatCompletion,
    ChatRequest,
    HTTPBackend,
    ReplicaBackend,
    RetryPolicy,
    Timeout,
)
from swiftclient.extend import Deadline, RequestOptions

try:  # layout marks (issue 10, item 2); without them the timestamp stays where the app put it
    from swiftclient.prompt_cache import static, turn

    HAVE_LAYOUT = True
except ImportError:  # pragma: no cover - depends on the tree being measured
    HAVE_LAYOUT = False

MODEL = "tiny"
BLOCK = 16  # the engine's KV block size (EngineConfig.block_size)
MAX_TOKENS = 4
ORACLE_GOAL, TTFT_GOAL, ROUTING_GOAL = 0.90, 3.0, 2.0
DEFAULT_REPLICAS = {"a": 4, "b": 2, "c": 2}

DEFAULT_STEP_TOKENS = {"a": 2048, "b": 2048, "c": 32768}
"""The servers' step budget (``--max-num-batched-tokens``) per workload. For (c) it is as
large as a GPU server's (vLLM and SGLang prefill many requests in one step): with 64 prompts
arriving at once, such a server prefills them together and they all miss the cache, the
case (c) is about. With the CPU default of 2,048 the engine prefills one prompt per step,
so every later prompt finds the first one's prefix cached and grouping has nothing left to
save (measured: naive 95% cached, mean TTFT ratio 1.0x)."""
ARMS = ("naive", "swiftclient, random routing", "swiftclient")
NO_LIMIT = Timeout(total=600.0, connect=30.0, pool=600.0, first_token=None, idle=None)
WORDS = (
    "cache replica prefix token block engine request schema tool agent session turn "
    "document retrieval query answer latency scheduler batch stream router affinity load "
    "queue prefill decode memory vector index shard policy budget deadline retry hedge"
).split()


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


# ---------------------------------------------------------------------- workloads


@dataclass
class Item:
    """One request: ``sent`` is what the application builds (naive and swiftclient send it),
    ``ideal`` the same request in its cache-friendly form (the oracle's input)."""

    sent: dict[str, Any]
    ideal: dict[str, Any]
    swift: dict[str, Any] | None = None  # what the swiftclient arms send, when it differs


@dataclass
class Workload:
    """Waves of items; a wave is sent at once, waves one after another."""

    name: str
    waves: list[list[Item]]

    @property
    def items(self) -> list[Item]:
        return [item for wave in self.waves for item in wave]


def _shuffled_schema(schema: Any, rng: random.Random) -> Any:
    """The schema with every object's keyword order (not its property names' order) and
    ``required`` shuffled: what dicts built in different code paths look like."""
    if isinstance(schema, list):
        return [_shuffled_schema(value, rng) for value in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    keys = list(schema)
    rng.shuffle(keys)
    for key in keys:
        value = schema[key]
        if key == "properties":
            out[key] = {name: _shuffled_schema(sub, rng) for name, sub in value.items()}
        elif key == "required":
            out[key] = rng.sample(value, len(value))
        else:
            out[key] = _shuffled_schema(value, rng)
    return out


def _tools(rng: random.Random, count: int) -> list[dict[str, Any]]:
    tools = []
    for index in range(count):
        properties = {f"arg{j}": {"type": "string", "description": _text(rng, 2)} for j in range(2)}
        tools.append(
            {
                "type": "function",
                "function": {
                    "name": f"tool_{index:02d}_{rng.choice(WORDS)}",
                    "description": _text(rng, 4),
                    "parameters": {
                        "type": "object",
                        "properties": properties,
                        "required": list(properties),
                        "additionalProperties": False,
                    },
                },
            }
        )
    return tools


def agent_workload(rng: random.Random, sessions: int, turns: int, tools: int) -> Workload:
    """(a): sessions x turns; tools and schema keys reordered per call; a timestamp."""
    base_tools = _tools(rng, tools)
    ideal_tools = sorted(base_tools, key=lambda tool: tool["function"]["name"])
    rules = [_text(rng, 80) for _ in range(sessions)]
    history: list[list[dict[str, str]]] = [[] for _ in range(sessions)]
    waves: list[list[Item]] = []
    clock = 1_764_550_000.0
    for step in range(turns):
        wave = []
        for session in range(sessions):
            clock += rng.uniform(0.5, 3.0)
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(clock))
            system = f"You are agent {session}. {rules[session]}"
            user = {"role": "user", "content": f"Step {step}: {_text(rng, 12)}"}
            calls = [_shuffled_schema(tool, rng) for tool in rng.sample(base_tools, tools)]
            sent = {
                "messages": [
                    {"role": "system", "content": f"{system}\nCurrent time: {stamp}."},
                    *history[session],
                    user,
                ],
                "tools": calls,
            }
            ideal = {
                "messages": [
                    {"role": "system", "content": system},
                    *history[session],
                    {"role": "user", "content": f"{user['content']}\nCurrent time: {stamp}."},
                ],
                "tools": ideal_tools,
            }
            swift = None
            if HAVE_LAYOUT:  # what the app writes with layout marks: the time is turn content
                swift = {
                    "messages": [
                        static({"role": "system", "content": system}),
                        *history[session],
                        turn(user),
                        turn({"role": "system", "content": f"Current time: {stamp}."}),
                    ],
                    "tools": calls,
                }
            wave.append(Item(sent, ideal, swift))
            reply = {"role": "assistant", "content": f"Result {step}: {_text(rng, 20)}"}
            history[session] += [user, reply]
        waves.append(wave)
    return Workload("a", waves)


def retrieval_workload(rng: random.Random, questions: int, documents: int) -> Workload:
    """(b): the same documents in a different order per question."""
    docs = [(f"doc-{index}", _text(rng, 60)) for index in range(documents)]
    system = "Answer from the documents below. " + _text(rng, 20)

    def request(order: Sequence[tuple[str, str]], question: str) -> dict[str, Any]:
        listing = "\n\n".join(f"[{doc_id}]\n{text}" for doc_id, text in order)
        return {
            "messages": [
                {"role": "system", "content": f"{system}\n\n{listing}"},
                {"role": "user", "content": question},
            ]
        }

    wave = []
    for _ in range(questions):
        question = f"Question: {_text(rng, 10)}?"
        shuffled = rng.sample(docs, len(docs))
        stable = sorted(docs)
        wave.append(
            Item(request(shuffled, question), request(stable, question), request(stable, question))
        )
    return Workload("b", [wave])


def shared_prefix_workload(rng: random.Random, requests: int, prefix_words: int) -> Workload:
    """(c): one long shared system prompt, a short question each, all sent at once."""
    system = "Reference manual. " + _text(rng, prefix_words)
    wave = []
    for _ in range(requests):
        body = {
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": f"Question: {_text(rng, 8)}?"},
            ]
        }
        wave.append(Item(body, body))
    return Workload("c", [wave])


# ---------------------------------------------------------------------- the oracle


def _common(a: bytes, b: bytes) -> int:
    limit = min(len(a), len(b))
    if a[:limit] == b[:limit]:
        return limit
    low, high = 0, limit
    while low < high:
        mid = (low + high + 1) // 2
        if a[:mid] == b[:mid]:
            low = mid
        else:
            high = mid - 1
    return low


def oracle(workload: Workload, formatter: ChatFormatter) -> tuple[int, int]:
    """(reusable tokens, prompt tokens) of the ideal requests in order, one shared cache,
    whole blocks, the last prompt token always computed (the engine's rule)."""
    seen: list[bytes] = []
    reusable = total = 0
    for item in workload.items:
        request = ChatRequest.model_validate({"model": MODEL, **item.ideal})
        ids = formatter.prepare(request).token_ids
        packed = b"".join(token.to_bytes(4, "little") for token in ids)
        best = max((_common(packed, other) // 4 for other in seen), default=0)
        reusable += min(best, len(ids) - 1) // BLOCK * BLOCK
        total += len(ids)
        seen.append(packed)
    return reusable, total


# ---------------------------------------------------------------------- measurements


@dataclass
class Outcome:
    """What one request measured: TTFT from its wave's start, prompt and cached tokens."""

    ttft: float
    prompt_tokens: int
    cached_tokens: int


@dataclass
class ArmResult:
    arm: str
    outcomes: list[Outcome] = field(default_factory=list)
    total: float = 0.0
    errors: int = 0

    @property
    def hit_ratio(self) -> float:
        prompt = sum(outcome.prompt_tokens for outcome in self.outcomes)
        return ratio(sum(outcome.cached_tokens for outcome in self.outcomes), prompt)

    def ttfts(self) -> list[float]:
        return [outcome.ttft for outcome in self.outcomes]


def _p99(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


async def run_naive(urls: Sequence[str], workload: Workload, rng: random.Random) -> ArmResult:
    """Plain OpenAI-style requests, a random replica each, every wave at once."""
    result = ArmResult("naive")
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    async with httpx.AsyncClient(timeout=600.0, limits=limits) as http:

        async def one(item: Item, url: str, start: float) -> None:
            body = {
                "model": MODEL,
                **item.sent,
                "max_tokens": MAX_TOKENS,
                "stream": True,
                "stream_options": {"include_usage": True},
                "ignore_eos": True,
            }
            first: float | None = None
            usage: dict[str, Any] = {}
            async with http.stream("POST", f"{url}/chat/completions", json=body) as response:
                response.raise_for_status()
                async for line in response.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    event = json.loads(line[6:])
                    choices = event.get("choices") or []
                    if first is None and choices and choices[0]["delta"].get("content"):
                        first = time.perf_counter()
                    if event.get("usage"):
                        usage = event["usage"]
            details = usage.get("prompt_tokens_details") or {}
            end = first if first is not None else time.perf_counter()
            result.outcomes.append(
                Outcome(end - start, usage["prompt_tokens"], details.get("cached_tokens") or 0)
            )

        began = time.perf_counter()
        for wave in workload.waves:
            start = time.perf_counter()
            outcomes = await asyncio.gather(
                *(one(item, rng.choice(urls), start) for item in wave), return_exceptions=True
            )
            result.errors += sum(isinstance(outcome, BaseException) for outcome in outcomes)
        result.total = time.perf_counter() - began
    return result


class RandomReplicas:
    """A backend that sends each call to a random replica (swiftclient without affinity)."""

    name = "random"

    def __init__(self, urls: Sequence[str], rng: random.Random) -> None:
        self.replicas = [HTTPBackend(url, None, name=f"r{i}") for i, url in enumerate(urls)]
        self.rng = rng

    def stream(
        self, request: ChatRequest, deadline: Deadline, options: RequestOptions | None = None
    ) -> Any:
        return self.rng.choice(self.replicas).stream(request, deadline, options)

    async def complete(
        self, request: ChatRequest, deadline: Deadline, options: RequestOptions | None = None
    ) -> ChatCompletion:
        return await self.rng.choice(self.replicas).complete(request, deadline, options)

    async def aclose(self) -> None:
        for replica in self.replicas:
            await replica.aclose()


async def run_swiftclient(
    urls: Sequence[str], workload: Workload, *, affinity: bool, rng: random.Random
) -> ArmResult:
    """swiftclient: canonical bytes, ``client.batch`` per wave; affinity or random routing."""
    arm = ARMS[2] if affinity else ARMS[1]
    result = ArmResult(arm)
    backend: Any = (
        ReplicaBackend.from_urls(urls, max_connections=256)
        if affinity
        else RandomReplicas(urls, rng)
    )
    client = AsyncClient(
        backend=backend, model=MODEL, timeout=NO_LIMIT, retry=RetryPolicy(max_attempts=1)
    )
    async with client:
        began = time.perf_counter()
        for wave in workload.waves:
            requests = [item.swift or item.sent for item in wave]
            results = await client.batch(
                requests,
                concurrency=len(requests),
                max_tokens=MAX_TOKENS,
                extra_body={"ignore_eos": True},
            )
            for entry in results:
                if not entry.ok:
                    result.errors += 1
                    continue
                completion = entry.unwrap()
                usage = completion.usage
                ttft = completion.timing.ttft if completion.timing else None
                if usage is None or ttft is None:
                    result.errors += 1
                    continue
                result.outcomes.append(
                    Outcome(entry.waited + ttft, usage.prompt_tokens, usage.cached_tokens)
                )
        result.total = time.perf_counter() - began
    return result


# ---------------------------------------------------------------------- servers


ENGINE_MODEL = "swift-tiny-random"
"""The embedded random-weight model the servers run (the prefix cache does not care what
the weights say)."""


@asynccontextmanager
async def replicas(
    count: int, threads: int, kv_mib: int, step_tokens: int = 2048
) -> AsyncIterator[list[str]]:
    """``count`` fresh local engine servers, started in parallel; yields their base URLs."""
    argv = ["-m", "local_engine.server", ENGINE_MODEL, "--port", "0", "--model-name", MODEL]
    argv += ["--threads", str(threads), "--kv-cache-mib", str(kv_mib)]
    argv += ["--max-num-batched-tokens", str(step_tokens)]
    argv += ["--max-num-seqs", "64", "--max-tokens-limit", "64"]
    with ExitStack() as stack:
        managers = [server_process(argv) for _ in range(count)]
        with ThreadPoolExecutor(count) as pool:
            starts = [pool.submit(manager.__enter__) for manager in managers]
        urls = []
        failure: BaseException | None = None
        for manager, start in zip(managers, starts, strict=True):
            try:
                urls.append(start.result()[1])
            except BaseException as exc:  # stop the ones that did start, then raise
                failure = failure or exc
            else:
                stack.push(manager.__exit__)
        if failure is not None:
            raise failure
        yield urls


# ---------------------------------------------------------------------- main


def _workloads(names: Sequence[str], quick: bool, rng: random.Random) -> list[Workload]:
    out = []
    for name in names:
        if name == "a":
            out.append(agent_workload(rng, *((2, 2, 20) if quick else (8, 4, 20))))
        elif name == "b":
            out.append(retrieval_workload(rng, *((4, 4) if quick else (16, 8))))
        elif name == "c":
            out.append(shared_prefix_workload(rng, *((8, 150) if quick else (64, 755))))
        else:
            raise SystemExit(f"unknown workload {name!r} (a, b, c)")
    return out


async def measure(args: argparse.Namespace) -> None:
    rng = random.Random(args.seed)
    workloads = _workloads(args.workloads.split(","), args.quick, rng)
    formatter = ChatFormatter(Tokenizer.from_dir(ensure_default_model()))
    print(
        f"# prefix cache across replicas: local engine servers ({ENGINE_MODEL}, {args.threads} "
        f"thread each), Python {platform.python_version()}, {os.cpu_count()} CPUs, "
        f"load {os.getloadavg()[0]:.2f}"
    )
    if not HAVE_LAYOUT:
        print("(no swiftclient.prompt_cache layout marks in this tree: in (a) swiftclient sends")
        print(" the timestamp where the application put it, in the system prompt)")
    print()
    headers = [
        "workload",
        "replicas",
        "step tok",
        "client",
        "requests",
        "prompt tok",
        "cached %",
        "oracle %",
        "of oracle",
        "mean TTFT ms",
        "p99 TTFT ms",
        "total s",
        "errors",
    ]
    rows: list[list[object]] = []
    verdicts: list[str] = []
    for workload in workloads:
        reusable, prompt_total = oracle(workload, formatter)
        oracle_ratio = ratio(reusable, prompt_total)
        arms: dict[str, ArmResult] = {}
        count = args.replicas or DEFAULT_REPLICAS[workload.name]
        step_tokens = args.step_tokens or DEFAULT_STEP_TOKENS[workload.name]
        for arm in ARMS:
            async with replicas(count, args.threads, args.kv_mib, step_tokens) as urls:
                arm_rng = random.Random(f"{args.seed}-{workload.name}-{arm}")
                if arm == "naive":
                    measured = await run_naive(urls, workload, arm_rng)
                else:
                    measured = await run_swiftclient(
                        urls, workload, affinity=arm == "swiftclient", rng=arm_rng
                    )
            arms[arm] = measured
            ttfts = measured.ttfts() or [float("nan")]
            rows.append(
                [
                    workload.name,
                    count,
                    step_tokens,
                    arm,
                    len(workload.items),
                    sum(outcome.prompt_tokens for outcome in measured.outcomes),
                    f"{100 * measured.hit_ratio:.1f}",
                    f"{100 * oracle_ratio:.1f}",
                    f"{100 * ratio(measured.hit_ratio, oracle_ratio):.0f}%",
                    f"{1000 * statistics.fmean(ttfts):.0f}",
                    f"{1000 * _p99(ttfts):.0f}",
                    f"{measured.total:.1f}",
                    measured.errors,
                ]
            )
        swift, rand, naive = arms[ARMS[2]], arms[ARMS[1]], arms[ARMS[0]]
        of_oracle = ratio(swift.hit_ratio, oracle_ratio)
        if workload.name in ("a", "c"):
            verdicts.append(
                f"- ({workload.name}) swiftclient at {100 * of_oracle:.0f}% of the oracle "
                f"(goal >= {100 * ORACLE_GOAL:.0f}%): {verdict(of_oracle >= ORACLE_GOAL)}"
            )
        if workload.name == "c":
            speedup = ratio(statistics.fmean(naive.ttfts()), statistics.fmean(swift.ttfts()))
            verdicts.append(
                f"- (c) mean TTFT naive / swiftclient = {speedup:.1f}x "
                f"(goal >= {TTFT_GOAL:.0f}x): {verdict(speedup >= TTFT_GOAL)}"
            )
        routing = ratio(swift.hit_ratio, rand.hit_ratio)
        if workload.name == "a":
            verdicts.append(
                f"- (a) hit ratio affinity / random routing = {routing:.1f}x "
                f"(goal >= {ROUTING_GOAL:.0f}x): {verdict(routing >= ROUTING_GOAL)}"
            )
        else:
            verdicts.append(
                f"- ({workload.name}) hit ratio affinity / random routing = {routing:.1f}x "
                "(no goal: one prefix shared by every request, so random routing misses at "
                "most one cold prefill per replica)"
            )
    print(markdown_table(headers, rows))
    print()
    print("\n".join(verdicts))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (smoke run)")
    parser.add_argument("--workloads", default="a,b,c", help="comma-separated: a, b, c")
    parser.add_argument(
        "--replicas", type=int, help="servers per arm for every workload (default: a 4, b 2, c 2)"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads per server")
    parser.add_argument("--kv-mib", type=int, default=256, help="KV cache per server (MiB)")
    parser.add_argument(
        "--step-tokens",
        type=int,
        default=0,
        help="the servers' --max-num-batched-tokens for every workload (default: a and b "
        "2048, c 32768)",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.replicas is not None and args.replicas < 2:
        parser.error("--replicas must be at least 2 (routing needs a choice)")
    asyncio.run(measure(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
