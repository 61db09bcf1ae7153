"""``python -m swiftclient.testing``: serve a fake OpenAI-compatible provider until killed."""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from collections.abc import Callable, Sequence

from ..asgi import serve
from ..errors import ConfigurationError
from ._fake import FakeProvider
from ._reply import Reply


def _at_least(low: float, kind: type[int] | type[float]) -> Callable[[str], int | float]:
    """An argparse type: a number of ``kind`` no smaller than ``low`` (a usage error
    otherwise, rather than the reply model's validation dump)."""

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low:g}, got {text}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m swiftclient.testing",
        description="Serve a fake OpenAI-compatible chat provider on loopback until killed.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port to bind, 0 for any free one")
    parser.add_argument(
        "--tokens", type=_at_least(0, int), default=5, help="tokens per reply (default 5)"
    )
    parser.add_argument(
        "--token-delay", type=_at_least(0, float), default=0.0, help="seconds between chunks"
    )
    parser.add_argument(
        "--ttft", type=_at_least(0, float), default=0.0, help="seconds before the first chunk"
    )
    parser.add_argument("--chunk-size", type=_at_least(1, int), default=1, help="tokens per chunk")
    parser.add_argument("--model", default="fake-model", help="model id served at /v1/models")
    parser.add_argument("--api-key", default=None, help="require this bearer token")
    parser.add_argument(
        "--loop", choices=("auto", "asyncio", "uvloop"), default="auto", help="event loop"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and serve until interrupted; returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        default = Reply(
            tokens=args.tokens,
            token_delay=args.token_delay,
            ttft=args.ttft,
            chunk_size=args.chunk_size,
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        fake = FakeProvider(
            default, api_key=args.api_key, model=args.model, host=args.host, port=args.port
        )
    except ConfigurationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    def ready(url: str) -> None:
        print(f"fake provider serving on {url}/v1", flush=True)

    try:
        settings = dataclasses.replace(fake.settings, loop=args.loop)
        serve(fake.app, settings, on_ready=ready, log_level="warning")
    except ConfigurationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
