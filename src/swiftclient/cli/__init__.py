"""``swiftclient chat | bench | serve | models``: the command line, built on click.

Every subcommand takes the target the same way: ``--base-url`` (any OpenAI-compatible API),
``--backend NAME`` (a preset, or ``local``), ``--local`` (the bundled engine in this
process), or the environment (``SWIFTCLIENT_PROVIDER``, ``SWIFTCLIENT_BASE_URL``,
``OPENAI_API_KEY``...), and ``--model``. Errors are one line on stderr unless ``--debug``;
exit status 0 on success, 1 on a failure, 2 on a usage or configuration error, 130 when
interrupted. Colour only on a terminal, and never with ``NO_COLOR`` set.

The engine is found through the ``swiftclient.servers`` entry point (``swiftclient serve``)
and the ``swiftclient.backends`` one (``--local``), never imported by name. ``run_command``
is public so that the engine's own command line (``python -m local_engine.server``) follows
the same conventions.
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import anyio
import click

from ..errors import SwiftClientError
from ._bench import bench
from ._chat import chat
from ._common import EXIT_USAGE, CLIError, build_target, options_from, run_command, target_options

__all__ = ["cli", "main", "run_command"]


def _version() -> str:
    try:
        return version("swiftclient-llm")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "unknown"


_MODELS_EXAMPLES = """\b
Examples:
  swiftclient models --base-url http://127.0.0.1:8000/v1
  OPENAI_API_KEY=... swiftclient models --backend openai --json
"""


@click.command(epilog=_MODELS_EXAMPLES)
@target_options
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON.")
def models(as_json: bool, **kwargs: Any) -> int:
    """List the models the backend offers (its /models endpoint)."""
    backend = build_target(options_from(kwargs), need_model=False).backend
    lister = getattr(backend, "list_models", None)
    if lister is None:
        raise CLIError(f"the {backend.name} backend cannot list its models", EXIT_USAGE)

    async def fetch() -> list[str]:
        try:
            names: list[str] = await lister()
        finally:
            await backend.aclose()
        return names

    names = anyio.run(fetch)
    if as_json:
        import json

        click.echo(json.dumps(names))
    else:
        for name in names:
            click.echo(name)
    return 0


_SERVE_EXAMPLES = """\b
Examples:
  swiftclient serve                                  (the embedded default model on :8000)
  swiftclient serve ./Qwen3-0.6B --port 8080 --kv-cache-mib 1024 --dtype bfloat16
"""


@click.command(
    short_help="Serve a local model over an OpenAI-compatible API.",
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    add_help_option=False,
    epilog=_SERVE_EXAMPLES,
)
@click.argument("engine_args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def serve(ctx: click.Context, engine_args: tuple[str, ...]) -> int:
    """Serve a local model over an OpenAI-compatible API (see `swiftclient serve --help`)."""
    from ..providers import local_server

    try:
        server_main = local_server()
    except SwiftClientError as exc:
        if "--help" in engine_args or "-h" in engine_args:
            click.echo(ctx.get_help())
        raise CLIError(str(exc), EXIT_USAGE) from exc
    debug = bool(ctx.find_root().params.get("debug"))
    status: int = server_main(list(engine_args), prog_name=ctx.command_path, debug=debug)
    return status


@click.group(
    epilog="Run `swiftclient COMMAND --help` for a command's options and examples.",
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.version_option(_version(), "--version", "-V", prog_name="swiftclient")
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
def cli(debug: bool) -> None:
    """Talk to an LLM API, measure it under load, or serve a local model.

    \b
    Examples:
      swiftclient chat --base-url http://127.0.0.1:8000/v1 -m default "hello"
      swiftclient bench --local -c 1,4 -n 16
      swiftclient serve --port 8000
      swiftclient models --backend openai
    """


cli.add_command(chat)
cli.add_command(bench)
cli.add_command(serve)
cli.add_command(models)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    return run_command(cli, argv, "swiftclient")
