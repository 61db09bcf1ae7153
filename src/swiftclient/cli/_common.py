"""What every subcommand shares: the target options, durations, one-line errors, consoles."""

from __future__ import annotations

import os
import re
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

import click

from ..errors import AuthenticationError, ConfigurationError, SwiftClientError
from ..providers import PRESETS

if TYPE_CHECKING:
    from rich.console import Console

    from ..backends.base import Backend

__all__ = [
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_USAGE",
    "POSITIVE_DURATION",
    "CLIError",
    "Target",
    "TargetOptions",
    "console",
    "parse_duration",
    "run_command",
    "target_options",
]

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
LOCAL = "local"
LOCAL_MODEL = "default"
"""The model name requests carry on the local engine (it answers to any; see server.py)."""
_KNOWN = ", ".join([*PRESETS, LOCAL])
_NOT_CONFIGURED = (
    "no backend configured: pass --base-url URL (any OpenAI-compatible API), "
    f"--backend NAME ({_KNOWN}) or --local, or set SWIFTCLIENT_PROVIDER, "
    "SWIFTCLIENT_BASE_URL or OPENAI_API_KEY"
)

F = TypeVar("F", bound=Callable[..., Any])


class CLIError(click.ClickException):
    """A failure to report as one line, exiting with ``status`` (1 by default)."""

    def __init__(self, message: str, status: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.status = status


_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "": 1.0}
_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ms|s|min|m|h|)\s*$")


def parse_duration(text: str) -> float:
    """Seconds from ``"500ms"``, ``"2s"``, ``"1.5m"``, ``"1h"`` or a bare number of seconds."""
    match = _DURATION.match(text)
    if match is None:
        raise click.BadParameter(f"{text!r} is not a duration (examples: 500ms, 2s, 1m)")
    return float(match.group(1)) * _UNITS[match.group(2)]


def _duration_callback(ctx: click.Context, param: click.Parameter, value: Any) -> float | None:
    return None if value is None else parse_duration(str(value))


DURATION: dict[str, Any] = {"callback": _duration_callback, "metavar": "DURATION"}
"""Keyword arguments of a click option that takes a duration (``500ms``, ``2s``, ``1m``)."""


def _positive_duration_callback(
    ctx: click.Context, param: click.Parameter, value: Any
) -> float | None:
    seconds = _duration_callback(ctx, param, value)
    if seconds is not None and seconds <= 0:
        raise click.BadParameter(f"{value!r} is not a positive duration (e.g. 500ms, 30s)")
    return seconds


POSITIVE_DURATION: dict[str, Any] = {
    "callback": _positive_duration_callback,
    "metavar": "DURATION",
}
"""As :data:`DURATION`, for a limit that must be above zero (a timeout, a run's length)."""


@dataclass(frozen=True, slots=True)
class TargetOptions:
    """Where the requests go, as the command line and the environment say."""

    backend: str | None = None
    base_url: str | None = None
    api_key: str | None = None
    model: str | None = None

    @property
    def provider(self) -> str | None:
        """The preset named by ``--backend``, else by ``SWIFTCLIENT_PROVIDER``."""
        named = self.backend or os.environ.get("SWIFTCLIENT_PROVIDER", "").strip().lower()
        return named or None

    @property
    def is_local(self) -> bool:
        """True when the target is the bundled engine."""
        return self.provider == LOCAL

    def describe(self) -> str:
        """Where the requests go, in words, with no secret in it."""
        if self.is_local:
            model = self.model or os.environ.get("SWIFTCLIENT_LOCAL_MODEL")
            return f"local engine in this process ({model or 'embedded default model'})"
        if self.base_url:
            return self.base_url.split("?", 1)[0]
        if self.provider:
            return f"provider {self.provider}"
        return "the backend configured in the environment"


@dataclass(frozen=True, slots=True)
class Target:
    """A backend built from :class:`TargetOptions` and the model its requests carry."""

    backend: Backend
    model: str


def build_target(
    options: TargetOptions,
    *,
    need_model: bool = True,
    http: dict[str, Any] | None = None,
) -> Target:
    """Build the backend and pick the model, or raise a :class:`CLIError` naming the flags
    (with ``need_model=False`` a missing model is left as ``""``). ``http`` holds
    :class:`~swiftclient.HTTPBackend` options for an HTTP target."""
    http = http or {}
    from ..backends.http import HTTPBackend
    from ..providers import from_env, preset

    provider = options.provider
    env = os.environ
    try:
        if provider == LOCAL:
            if options.base_url:  # the flag conflict is options_from's; this is the variable's
                raise CLIError(
                    "--base-url has no use with the local engine (SWIFTCLIENT_PROVIDER=local "
                    "runs it in this process; unset it, or pass --backend, for a server)",
                    EXIT_USAGE,
                )
            return Target(preset(LOCAL, model=options.model), LOCAL_MODEL)
        if provider:
            backend = preset(
                provider,
                api_key=options.api_key or env.get("SWIFTCLIENT_API_KEY"),
                base_url=options.base_url or env.get("SWIFTCLIENT_BASE_URL"),
                **http,
            )
        elif options.base_url:
            # Named by its host, as the user gave it (errors read "127.0.0.1:8000: ...").
            name = urlsplit(options.base_url).netloc.rpartition("@")[2] or "http"
            key = options.api_key or env.get("SWIFTCLIENT_API_KEY") or env.get("OPENAI_API_KEY")
            backend = HTTPBackend(options.base_url, key, name=name, **http)
        else:
            try:
                backend = from_env(**http)
            except ConfigurationError:
                raise CLIError(_NOT_CONFIGURED, EXIT_USAGE) from None
    except ConfigurationError as exc:
        raise CLIError(_in_flags(str(exc)), EXIT_USAGE) from exc
    model = options.model or env.get("SWIFTCLIENT_MODEL") or ""
    if not model and need_model:
        raise CLIError(
            "no model given: pass --model NAME or set SWIFTCLIENT_MODEL "
            "(`swiftclient models` lists what the backend offers)",
            EXIT_USAGE,
        )
    return Target(backend, model)


# The library's words for what the command line calls a flag.
_FLAG_WORDS = (("pass api_key=", "pass --api-key"), ("base_url must", "--base-url must"))


def _in_flags(message: str) -> str:
    """A configuration error of the library, naming the flag where it names an argument."""
    for words, flag in _FLAG_WORDS:
        message = message.replace(words, flag)
    return message


def target_options(func: F) -> F:
    """The options that say where requests go, shared by chat, bench and models."""
    decorators = [
        click.option(
            "--model",
            "-m",
            metavar="NAME",
            help="Model to ask for (default: $SWIFTCLIENT_MODEL; chat: else the backend's "
            "only model, if /models lists one). With --local: a model "
            "directory, a .gguf file or an embedded model name (default: "
            "$SWIFTCLIENT_LOCAL_MODEL, else the "
            "embedded default model).",
        ),
        click.option(
            "--backend",
            "-b",
            metavar="NAME",
            help=f"Provider preset: {_KNOWN} (default: $SWIFTCLIENT_PROVIDER).",
        ),
        click.option("--provider", "backend", hidden=True),
        click.option(
            "--local",
            "local",
            is_flag=True,
            help="Run the bundled local engine in this process (same as --backend local).",
        ),
        click.option(
            "--base-url",
            metavar="URL",
            help="Any OpenAI-compatible API root, e.g. http://127.0.0.1:8000/v1 "
            "(default: $SWIFTCLIENT_BASE_URL).",
        ),
        click.option(
            "--api-key",
            metavar="KEY",
            help="Bearer key (default: the preset's variable, $SWIFTCLIENT_API_KEY or "
            "$OPENAI_API_KEY; prefer the environment, since arguments show in `ps`).",
        ),
    ]
    for decorator in reversed(decorators):
        func = decorator(func)
    return func


def options_from(kwargs: dict[str, Any]) -> TargetOptions:
    """Take the target options out of a command's keyword arguments (a usage error for two
    that name different targets: ``--local`` with another ``--backend``, or the local
    engine with ``--base-url``)."""
    backend: str | None = kwargs.pop("backend", None)
    base_url: str | None = kwargs.pop("base_url", None)
    if kwargs.pop("local", False):
        if backend not in (None, LOCAL):
            raise CLIError(
                f"--local and --backend {backend} name two targets; give one", EXIT_USAGE
            )
        backend = LOCAL
    if backend == LOCAL and base_url:
        raise CLIError(
            "--base-url has no use with the local engine (--local runs it in this process; "
            "for a server, drop --local)",
            EXIT_USAGE,
        )
    return TargetOptions(
        backend=backend,
        base_url=base_url,
        api_key=kwargs.pop("api_key", None),
        model=kwargs.pop("model", None),
    )


def console(*, stderr: bool = False) -> Console:
    """A rich console: colour only on a terminal, never with ``NO_COLOR`` set."""
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, markup=False, soft_wrap=True)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


_KEY_HINT = (
    "(pass the key with --api-key, or better in the environment: the preset's own variable, "
    "and for --base-url SWIFTCLIENT_API_KEY or OPENAI_API_KEY)"
)


def _debug_first(command: click.Command, args: list[str]) -> tuple[list[str], bool]:
    """``--debug`` given after a subcommand (``chat --debug ...``), moved to the group it
    belongs to, so that every subcommand takes it; and whether it was given. One after
    ``--``, or that is the value of an option before it (``-m --debug``), stays."""
    own = any(isinstance(p, click.Option) and "--debug" in p.opts for p in command.params)
    end = args.index("--") if "--" in args else len(args)
    valued: set[str] = set()
    sub = None
    if isinstance(command, click.Group) and args and own:
        sub = command.get_command(click.Context(command), args[0])
    if sub is not None:
        for param in sub.params:
            if isinstance(param, click.Option) and not param.is_flag and not param.count:
                valued.update(param.opts)
    flags = [
        i for i in range(end) if args[i] == "--debug" and (i == 0 or args[i - 1] not in valued)
    ]
    if not own or not flags:
        return args, bool(flags)
    rest = [a for i, a in enumerate(args) if i not in flags]
    return ["--debug", *rest], True


def run_command(
    command: click.Command,
    argv: Sequence[str] | None,
    prog_name: str,
    *,
    debug: bool | None = None,
) -> int:
    """Run a click command with the CLI's conventions; returns the exit status.

    Errors are one line on stderr (``prog: error: ...``) with no traceback unless
    ``--debug`` is among the arguments (or ``debug=True``, or ``SWIFTCLIENT_DEBUG=1``);
    usage errors exit 2, failures 1, an interrupt 130.
    """
    args, given = _debug_first(command, list(sys.argv[1:] if argv is None else argv))
    if debug is None:
        debug = given or os.environ.get("SWIFTCLIENT_DEBUG", "") not in ("", "0")

    def fail(message: str, code: int) -> int:
        if debug:
            traceback.print_exc()
        print(f"{prog_name}: error: {_one_line(message)}", file=sys.stderr, flush=True)
        return code

    try:
        result = command.main(args=args, prog_name=prog_name, standalone_mode=False)
    except click.UsageError as exc:
        where = exc.ctx.command_path if exc.ctx is not None else prog_name
        return fail(f"{exc.format_message().rstrip('.')} (see `{where} --help`)", EXIT_USAGE)
    except CLIError as exc:
        return fail(exc.format_message(), exc.status)
    except click.ClickException as exc:
        return fail(exc.format_message(), exc.exit_code)
    except (click.Abort, KeyboardInterrupt):
        if debug:
            traceback.print_exc()
        print(f"{prog_name}: interrupted", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    except ConfigurationError as exc:
        return fail(str(exc), EXIT_USAGE)
    except AuthenticationError as exc:
        return fail(f"{type(exc).__name__}: {exc} {_KEY_HINT}", EXIT_ERROR)
    except SwiftClientError as exc:
        return fail(f"{type(exc).__name__}: {exc}", EXIT_ERROR)
    except OSError as exc:
        return fail(str(exc), EXIT_ERROR)
    except Exception as exc:
        if debug:
            raise
        return fail(f"unexpected {exc!r} (run with --debug for the traceback)", EXIT_ERROR)
    return result if isinstance(result, int) else 0
