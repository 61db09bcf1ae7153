"""``swiftclient chat | bench | serve``: talk to a model, measure it, or serve one locally.

The backend comes from the same settings as ``AsyncClient()``: ``--provider`` (a preset or
``local``), ``--base-url``/``--api-key``, or the environment (``SWIFTCLIENT_PROVIDER``,
``SWIFTCLIENT_BASE_URL``, ``OPENAI_API_KEY``...). ``--local DIR`` runs the bundled engine on a
model directory (with no directory: ``SWIFTCLIENT_LOCAL_MODEL``, else the embedded default
model); the engine is found through the ``local`` entry points, never imported by name.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import anyio

from ._client import AsyncClient
from .backends.base import Backend
from .errors import SwiftClientError
from .types import Timing, _percentile

__all__ = ["main"]


def _backend(args: argparse.Namespace) -> Backend | None:
    from .backends.http import HTTPBackend
    from .providers import preset

    if args.local is not None:
        return preset("local", model=args.local or None)
    if args.provider:
        return preset(args.provider, api_key=args.api_key, base_url=args.base_url)
    if args.base_url:
        return HTTPBackend(args.base_url, args.api_key, name="cli")
    return None


def _client(args: argparse.Namespace) -> AsyncClient:
    backend = _backend(args)
    model = args.model
    if model is None and args.local is not None:
        model = "default"
    return AsyncClient(backend, model=model) if backend else AsyncClient(model=model)


async def _chat(args: argparse.Namespace) -> int:
    async with _client(args) as client:
        async with client.stream(
            args.prompt, max_tokens=args.max_tokens, temperature=args.temperature
        ) as stream:
            async for text in stream.text():
                sys.stdout.write(text)
                sys.stdout.flush()
            completion = await stream.final()
    sys.stdout.write("\n")
    timing = completion.timing or Timing()
    print(f"[{timing.summary()}]", file=sys.stderr)
    if completion.usage is not None:
        usage = completion.usage
        print(
            f"[prompt_tokens={usage.prompt_tokens} completion_tokens={usage.completion_tokens} "
            f"cached_tokens={usage.cached_tokens}]",
            file=sys.stderr,
        )
    return 0


def _ms(values: Sequence[float], q: int) -> str:
    value = _percentile(values, q)
    return "-" if value is None else f"{value * 1000:.1f}"


async def _bench(args: argparse.Namespace) -> int:
    ttfts: list[float] = []
    itls: list[float] = []
    totals: list[float] = []
    tokens = 0
    failures = 0
    limiter = anyio.CapacityLimiter(args.concurrency)
    async with _client(args) as client:
        start = anyio.current_time()

        async def one() -> None:
            nonlocal tokens, failures
            async with limiter:
                try:
                    completion = await client.chat(
                        args.prompt, max_tokens=args.max_tokens, temperature=args.temperature
                    )
                except SwiftClientError as exc:
                    failures += 1
                    print(f"error: {exc}", file=sys.stderr)
                    return
            timing = completion.timing or Timing()
            if timing.ttft is not None:
                ttfts.append(timing.ttft)
            itls.extend(timing.itl)
            if timing.total is not None:
                totals.append(timing.total)
            tokens += completion.usage.completion_tokens if completion.usage else 0

        async with anyio.create_task_group() as tg:
            for _ in range(args.requests):
                tg.start_soon(one)
        wall = anyio.current_time() - start
    print(f"requests={args.requests} concurrency={args.concurrency} errors={failures}")
    print("| metric | p50 ms | p95 ms |")
    print("|---|---|---|")
    print(f"| TTFT | {_ms(ttfts, 50)} | {_ms(ttfts, 95)} |")
    print(f"| ITL | {_ms(itls, 50)} | {_ms(itls, 95)} |")
    print(f"| total | {_ms(totals, 50)} | {_ms(totals, 95)} |")
    print(f"completion tokens/s: {tokens / wall:.1f} (wall {wall:.2f}s)")
    return 1 if failures else 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="swiftclient", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("chat", "bench"):
        p = sub.add_parser(name, help=f"{name} against the configured backend")
        p.add_argument("prompt", nargs="?", default="Say hello in five words.")
        p.add_argument("--model")
        p.add_argument("--provider", help="oxlo, openai, deepseek, vllm, sglang or local")
        p.add_argument("--base-url")
        p.add_argument("--api-key")
        p.add_argument("--local", nargs="?", const="", metavar="MODEL_DIR")
        p.add_argument("--max-tokens", type=int, default=64)
        p.add_argument("--temperature", type=float, default=0.7)
        if name == "bench":
            p.add_argument("--requests", type=int, default=16)
            p.add_argument("--concurrency", type=int, default=4)
    sub.add_parser(
        "serve",
        help="serve a local model over an OpenAI-compatible API "
        "(the options of python -m local_engine.server; see `swiftclient serve --help`)",
        add_help=False,
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["serve"]:  # the server parses its own options: the same flags either way
        from .providers import local_server

        try:
            serve_main = local_server()
        except SwiftClientError as exc:
            print(f"swiftclient: {exc}", file=sys.stderr)
            return 2
        return serve_main(argv[1:])
    args = _parser().parse_args(argv)
    try:
        runner = _chat if args.command == "chat" else _bench
        return anyio.run(runner, args)
    except SwiftClientError as exc:
        print(f"swiftclient: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
