"""A simulated heavy-tailed, OpenAI-compatible streaming provider, for bench/hedging.py.

Run as its own process (``python bench/_hedge_server.py --replicas 4``): a plain ASGI app on
uvicorn, serving ``/r0/v1/chat/completions`` ... ``/r{N-1}/v1/...`` on one loopback port. It
prints ``listening http://127.0.0.1:PORT`` once it accepts connections.

Each replica serves at most ``slots`` requests at once and queues the rest in arrival order,
so extra load (hedges) raises everyone's latency, as on a real provider. A request's time to
first token is drawn from :class:`_tail.TailModel`, keyed on the call id the client writes
into its prompt as ``[call N]``; a straggler first stalls outside any slot, then every
request queues for a slot, holds it for the rest of its time to first token plus a short
decode (``TailModel.split``). A client that goes away frees its slot at once, as a provider
that aborts a cancelled request does; it is billed (its prompt and the tokens sent) only if
it got a slot, i.e. once prefill started.

Control and accounting (JSON, for the benchmark only):

- ``GET /stats``: the server process's CPU seconds so far, and per replica the requests
  received, completed, cancelled (the client left first) and failed, the prompt and
  completion tokens of every request that got a slot (billed) and of those cancelled
  (wasted), and the service latencies drawn.
- ``POST /control`` with ``{"slots": K, "seed": S, "failing": ["r3"], "reset": true}``: resize
  the replicas (only when idle), change the seed, make replicas fail (503 after
  ``fail_delay`` seconds) and zero the counters.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import re
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _tail import TailModel  # noqa: E402

__all__ = ["hedge_server_process"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_CALL = re.compile(rb"\[call (\d+)\]")
_PATH = re.compile(r"^/(r\d+)/v1/chat/completions$")
_SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
_JSON_HEADERS = [(b"content-type", b"application/json")]
_MAX_LATENCIES = 200_000


@dataclass
class Counters:
    """One replica's accounting since the last reset."""

    requests: int = 0
    completed: int = 0
    cancelled: int = 0
    failed: int = 0
    billed_prompt_tokens: int = 0
    billed_completion_tokens: int = 0
    wasted_prompt_tokens: int = 0
    wasted_completion_tokens: int = 0
    latencies: list[float] = field(default_factory=list)


class Replica:
    """Slots, a FIFO queue (anyio's semaphore wakes waiters in order) and counters."""

    def __init__(self, name: str, slots: int) -> None:
        self.name = name
        self.slots = anyio.Semaphore(slots)
        self.counters = Counters()
        self.seen: dict[int, int] = {}


class Provider:
    """The ASGI application."""

    def __init__(
        self, replicas: int, slots: int, model: TailModel, tokens: int, fail_delay: float
    ) -> None:
        self.model = model
        self.tokens = tokens
        self.fail_delay = fail_delay
        self.seed = 0
        self.failing: set[str] = set()
        self.replicas = {f"r{i}": Replica(f"r{i}", slots) for i in range(replicas)}
        self.in_flight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        body = await _read_body(receive)
        path, method = scope["path"], scope["method"]
        if path == "/stats" and method == "GET":
            await _json(send, 200, self.stats())
            return
        if path == "/control" and method == "POST":
            status, answer = self.control(json.loads(body or b"{}"))
            await _json(send, status, answer)
            return
        match = _PATH.match(path)
        if match is None or match.group(1) not in self.replicas or method != "POST":
            await _json(send, 404, {"error": {"message": f"no route {method} {path}"}})
            return
        self.in_flight += 1
        try:
            await self.chat(self.replicas[match.group(1)], body, receive, send)
        finally:
            self.in_flight -= 1

    # ------------------------------------------------------------------ chat

    async def chat(self, replica: Replica, body: bytes, receive: Receive, send: Send) -> None:
        """Serve one chat request; a client that disconnects cancels it."""
        counters = replica.counters
        counters.requests += 1
        request = json.loads(body)
        model = str(request.get("model", "m"))
        prompt_tokens = max(1, len(body) // 4)
        call = _CALL.search(body)
        state = {"streamed": 0, "slot": False, "done": False}

        async def watch(scope: anyio.CancelScope) -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            if not state["done"]:
                scope.cancel()

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch, tg.cancel_scope)
            if replica.name in self.failing:
                await anyio.sleep(self.fail_delay)
                state["done"] = True
                counters.failed += 1
                await _json(send, 503, {"error": {"message": "replica down", "type": "server"}})
                tg.cancel_scope.cancel()
                return
            await self._serve(replica, call, model, request, prompt_tokens, state, send)
            tg.cancel_scope.cancel()
        if state["done"]:
            counters.completed += 1
        else:
            counters.cancelled += 1
            if state["slot"]:
                counters.wasted_prompt_tokens += prompt_tokens
                counters.wasted_completion_tokens += int(state["streamed"])

    async def _serve(
        self,
        replica: Replica,
        call: re.Match[bytes] | None,
        model: str,
        request: dict[str, Any],
        prompt_tokens: int,
        state: dict[str, Any],
        send: Send,
    ) -> None:
        counters = replica.counters
        if call is None:
            latency = self.model.draw(_RNG)
        else:
            number = int(call.group(1))
            n = replica.seen.get(number, 0)
            replica.seen[number] = n + 1
            latency = self.model.draw_for(self.seed, number, replica.name, n)
        if len(counters.latencies) < _MAX_LATENCIES:
            counters.latencies.append(latency)
        stall, busy = self.model.split(latency)
        stream = bool(request.get("stream"))
        usage = bool((request.get("stream_options") or {}).get("include_usage"))
        if stream:
            await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
        await anyio.sleep(stall)
        async with replica.slots:
            state["slot"] = True
            counters.billed_prompt_tokens += prompt_tokens
            await anyio.sleep(busy)
            if not stream:
                await anyio.sleep(self.model.median * 0.1 * self.tokens)
                state["done"] = True
                counters.billed_completion_tokens += self.tokens
                await _json(send, 200, _completion(model, self.tokens, prompt_tokens))
                return
            await send(_body(_chunk(model, {"role": "assistant", "content": "w "})))
            state["streamed"] = 1
            counters.billed_completion_tokens += 1
            await anyio.sleep(self.model.median * 0.1 * (self.tokens - 1))
            rest = b"".join(_chunk(model, {"content": "w "}) for _ in range(self.tokens - 1))
            rest += _chunk(model, {}, finish="stop")
            if usage:
                rest += _usage_chunk(model, prompt_tokens, self.tokens)
            rest += b"data: [DONE]\n\n"
            state["done"] = True
            state["streamed"] = self.tokens
            counters.billed_completion_tokens += self.tokens - 1
            await send({"type": "http.response.body", "body": rest, "more_body": False})

    # ------------------------------------------------------------------ control

    def stats(self) -> dict[str, Any]:
        """Counters per replica, plus what is in flight."""
        return {
            "cpu": time.process_time(),
            "in_flight": self.in_flight,
            "replicas": {name: vars(r.counters) for name, r in self.replicas.items()},
        }

    def control(self, command: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """Apply a control command; 409 when resizing while requests are in flight."""
        if "slots" in command:
            if self.in_flight:
                return 409, {"error": {"message": f"{self.in_flight} requests in flight"}}
            self.replicas = {name: Replica(name, int(command["slots"])) for name in self.replicas}
        if "seed" in command:
            self.seed = int(command["seed"])
            for replica in self.replicas.values():
                replica.seen.clear()
        if "failing" in command:
            self.failing = {str(name) for name in command["failing"]}
        if command.get("reset"):
            for replica in self.replicas.values():
                replica.counters = Counters()
                replica.seen.clear()
        return 200, {"ok": True}


_RNG = random.Random(7)
"""Draws for requests that carry no call id."""


def _chunk(model: str, delta: dict[str, str], finish: str | None = None) -> bytes:
    event = {
        "id": "chatcmpl-sim",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"


def _usage_chunk(model: str, prompt: int, completion: int) -> bytes:
    event = {
        "id": "chatcmpl-sim",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": model,
        "choices": [],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
    }
    return b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"


def _completion(model: str, tokens: int, prompt: int) -> dict[str, Any]:
    return {
        "id": "chatcmpl-sim",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "w " * tokens},
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": tokens,
            "total_tokens": prompt + tokens,
        },
    }


def _body(data: bytes) -> Message:
    return {"type": "http.response.body", "body": data, "more_body": True}


async def _read_body(receive: Receive) -> bytes:
    parts = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        parts.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    return b"".join(parts)


async def _json(send: Send, status: int, payload: dict[str, Any]) -> None:
    data = json.dumps(payload).encode()
    await send({"type": "http.response.start", "status": status, "headers": _JSON_HEADERS})
    await send({"type": "http.response.body", "body": data, "more_body": False})


@contextmanager
def hedge_server_process(
    replicas: int,
    slots: int,
    median: float,
    tokens: int = 8,
    fail_delay: float = 0.5,
    busy_cap: float = TailModel().busy_cap,
) -> Iterator[str]:
    """Run the simulated provider in its own process; yield its root URL (no ``/v1``)."""
    from _server import server_process

    argv = [
        str(Path(__file__).resolve()),
        "--replicas",
        str(replicas),
        "--slots",
        str(slots),
        "--median",
        str(median),
        "--tokens",
        str(tokens),
        "--fail-delay",
        str(fail_delay),
        "--busy-cap",
        str(busy_cap),
    ]
    with server_process(argv) as (_, url):
        yield url


def main(argv: list[str] | None = None) -> None:
    """Serve until terminated."""
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--median", type=float, default=TailModel().median)
    parser.add_argument("--tokens", type=int, default=8)
    parser.add_argument("--fail-delay", type=float, default=0.5)
    parser.add_argument("--busy-cap", type=float, default=TailModel().busy_cap)
    args = parser.parse_args(argv)
    model = dataclasses.replace(TailModel(), median=args.median, busy_cap=args.busy_cap)
    app = Provider(args.replicas, args.slots, model, args.tokens, args.fail_delay)
    # proto=IPPROTO_TCP matters: asyncio turns Nagle's algorithm off (TCP_NODELAY) only on
    # sockets that say they are TCP, and accepted sockets inherit the listener's proto.
    # Without it the headers and the first chunk, written apart, wait out the client's
    # delayed ACK (about 40 ms on Linux) on every request.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app, log_level="warning", access_log=False, lifespan="on", backlog=2048, http="h11"
    )
    # Listening before uvicorn starts: early connections wait in the backlog.
    sock.listen(2048)
    print(f"listening http://127.0.0.1:{port}", flush=True)
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
