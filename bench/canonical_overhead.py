"""Canonical request bytes: what canonicalization costs per request, against the exact bytes.

Run from the repository root::

    .venv/bin/python bench/canonical_overhead.py            # full run, about 20 s
    .venv/bin/python bench/canonical_overhead.py --quick    # smoke run, a few seconds

For each request shape, the process CPU per request of building the body bytes three ways,
in alternating rounds (best round counts):

- ``exact``: ``HTTPBackend(canonical=False)``'s bytes (the request's own orders);
- ``canonical``: the default bytes (tools sorted, schema keys ordered, ``required`` sorted);
- ``canonical + key``: the bytes with a ``prompt_cache_key`` from the static prefix
  (the ``openai`` preset), through the per-call ``CallEncoding`` as the call path uses it.

Shapes: a plain request (a 2,000-character system prompt and a question, no tools); 20 tools
sent identically call after call (the usual agent: canonical tools come from their memo);
20 tools whose list order and schema key order change every call (every call canonicalizes
anew; the input is rebuilt outside the timed part).

Goal: a plain request's canonical bytes cost at most 1.1x its exact bytes (nothing to
reorder, nothing to do).
"""

from __future__ import annotations

import argparse
import gc
import random
import time
from collections.abc import Callable
from typing import Any

from _util import markdown_table, ratio, verdict

from swiftclient._canonical import CallEncoding, encode
from swiftclient.types import ChatRequest

PLAIN_GOAL = 1.1
SYSTEM = {"role": "system", "content": "You are a careful assistant. " * 70}
QUESTION = {"role": "user", "content": "What changed in the last release?"}


def _tool(index: int, rng: random.Random | None) -> dict[str, Any]:
    properties = {f"arg{j}": {"type": "string", "description": f"argument {j}"} for j in range(5)}
    schema: dict[str, Any] = {
        "type": "object",
        "properties": properties,
        "required": [f"arg{j}" for j in range(5)],
        "additionalProperties": False,
    }
    if rng is not None:
        keys = list(schema)
        rng.shuffle(keys)
        schema = {key: schema[key] for key in keys}
        rng.shuffle(schema["required"])
    return {
        "type": "function",
        "function": {"name": f"tool_{index:02d}", "description": "d" * 80, "parameters": schema},
    }


def _request(tools: list[dict[str, Any]] | None) -> ChatRequest:
    return ChatRequest.model_validate(
        {"model": "m", "messages": [SYSTEM, QUESTION], "tools": tools}
    )


def _shuffled_requests(count: int, seed: int) -> list[ChatRequest]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        tools = [_tool(i, rng) for i in range(20)]
        rng.shuffle(tools)
        out.append(_request(tools))
    return out


def _cpu_per_call(build: Callable[[ChatRequest], bytes], requests: list[ChatRequest]) -> float:
    gc.collect()
    start = time.process_time()
    for request in requests:
        build(request)
    return (time.process_time() - start) / len(requests)


def _exact(request: ChatRequest) -> bytes:
    return encode(request, stream=True, exact=True)


def _canonical(request: ChatRequest) -> bytes:
    return encode(request, stream=True)


def _with_key(request: ChatRequest) -> bytes:
    return CallEncoding().encode(request, stream=True, derive_cache_key=True)


def main() -> None:
    """Measure and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small counts for a smoke run")
    args = parser.parse_args()
    iterations, rounds = (200, 3) if args.quick else (2000, 7)
    shapes = {
        "plain (no tools)": [_request(None)] * iterations,
        "20 tools, same every call": [_request([_tool(i, None) for i in range(20)])] * iterations,
        "20 tools, order changes": _shuffled_requests(iterations, seed=1),
    }
    ways = {"exact": _exact, "canonical": _canonical, "canonical + key": _with_key}
    rows = []
    plain_ratio = 0.0
    for shape, requests in shapes.items():
        for build in ways.values():
            build(requests[0])  # warm-up (and the memo, as a running client has it)
        best = dict.fromkeys(ways, float("inf"))
        for _ in range(rounds):
            for name, build in ways.items():
                best[name] = min(best[name], _cpu_per_call(build, requests))
        base = best["exact"]
        if shape.startswith("plain"):
            plain_ratio = ratio(best["canonical"], base)
        rows.append(
            [
                shape,
                f"{base * 1e6:.1f}",
                f"{best['canonical'] * 1e6:.1f}",
                f"{ratio(best['canonical'], base):.2f}x",
                f"{best['canonical + key'] * 1e6:.1f}",
                f"{ratio(best['canonical + key'], base):.2f}x",
            ]
        )
    print("## Canonical request bytes: CPU per request\n")
    print(
        markdown_table(
            ["request", "exact µs", "canonical µs", "vs exact", "canonical + key µs", "vs exact"],
            rows,
        )
    )
    print()
    print(
        markdown_table(
            ["goal", "measured", "verdict"],
            [
                [
                    f"plain request: canonical/exact <= {PLAIN_GOAL}x",
                    f"{plain_ratio:.2f}x",
                    verdict(plain_ratio <= PLAIN_GOAL),
                ]
            ],
        )
    )


if __name__ == "__main__":
    main()
