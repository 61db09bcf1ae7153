"""``swiftclient bench``: TTFT, ITL and end-to-end latency under load, from the client side."""

from __future__ import annotations

import dataclasses
import os
import shlex
import statistics
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import click
from click.core import ParameterSource

from .._client import AsyncClient
from ..hedging import Hedge
from ._common import (
    DURATION,
    EXIT_ERROR,
    EXIT_USAGE,
    POSITIVE_DURATION,
    CLIError,
    TargetOptions,
    build_target,
    console,
    options_from,
    parse_duration,
    target_options,
)
from ._report import Summary, check_plotting, plot, render, summarize, write_json
from ._runner import Level, Sample, Variant, run_level
from ._workload import Workload, load_jsonl, load_sharegpt, synthetic

__all__ = ["bench"]

_EXAMPLES = """\b
Examples:
  swiftclient bench --base-url http://127.0.0.1:8000/v1 -m default -c 1,8,64 -n 64
  swiftclient bench --local --ignore-eos --input-tokens 256 --output-tokens 64 -c 1,4
  swiftclient bench -m gpt-4o-mini --rate 2,4 --duration 30s --slo-ttft 500ms
  swiftclient bench -m my-model --dataset chats.jsonl --json out.json --plot out.png
  swiftclient bench -m my-model -c 8 --compare "--hedge 150ms"
"""


@dataclass(frozen=True, slots=True)
class VariantSpec:
    """A target plus the client settings one variant runs with."""

    target: TargetOptions
    hedge: float | None = None

    def describe(self) -> str:
        """The variant in words (no secrets)."""
        text = self.target.describe()
        if self.target.model and not self.target.is_local:
            text += f" · model {self.target.model}"
        if self.hedge is not None:
            text += f" · hedge after {self.hedge * 1000:g} ms"
        return text


def _check_writable(flag: str, path: Path) -> None:
    """A usage error unless ``path``'s folder exists and may be written to."""
    folder = path.parent
    if not folder.is_dir():
        raise CLIError(f"{flag} {path}: the folder {folder} does not exist", EXIT_USAGE)
    if not os.access(folder, os.W_OK):
        raise CLIError(f"{flag} {path}: the folder {folder} is not writable", EXIT_USAGE)


def _hedge(value: str | None) -> float | None:
    if value is None or value.lower() in ("off", "none", "no"):
        return None
    try:
        return parse_duration(value)
    except click.BadParameter as exc:  # parsed after click's own pass: name the flag
        exc.param_hint = "'--hedge'"
        raise


def _levels(concurrency: str | None, rate: str | None) -> list[Level]:
    if concurrency and rate:
        raise CLIError("give --concurrency or --rate, not both", EXIT_USAGE)
    try:
        if rate:
            rates = [float(x) for x in rate.split(",") if x.strip()]
            if not rates or any(not r > 0 for r in rates):
                raise ValueError
            return [Level(rate=r) for r in rates]
        counts = [int(x) for x in (concurrency or "1").split(",") if x.strip()]
        if not counts or any(c < 1 for c in counts):
            raise ValueError
    except ValueError:
        raise CLIError(
            "--concurrency takes positive integers and --rate positive numbers, "
            "comma-separated (e.g. -c 1,8,64 or --rate 0.5,2)",
            EXIT_USAGE,
        ) from None
    return [Level(concurrency=c) for c in counts]


RAMP_PER_WORKER = 0.002
"""Default spacing of worker starts (seconds): 64 workers start over 128 ms."""


def _ramp_up(level: Level, given: float | None) -> float:
    """The spread of the level's worker starts: as given, else 2 ms per worker (at most 2 s)."""
    if given is not None:
        return given
    return min(2.0, RAMP_PER_WORKER * (level.concurrency or 1))


def _connections(levels: Sequence[Level]) -> int:
    """A pool that never makes a request wait for a connection: the largest concurrency
    (at a rate, room for 1,024 requests in flight)."""
    if any(level.rate is not None for level in levels):
        return 1024
    return max(100, *(level.concurrency or 1 for level in levels))


def _workload(
    dataset: Path | None,
    dataset_format: str | None,
    input_tokens: int,
    output_tokens: int | None,
    *,
    seed: int,
    shared_prefix: int | None,
) -> Workload:
    if dataset is None:
        return synthetic(
            input_tokens, output_tokens or 128, seed=seed, shared_prefix=shared_prefix or 0
        )
    if shared_prefix is not None:
        raise CLIError(
            "--shared-prefix shapes synthetic prompts; a --dataset has its own", EXIT_USAGE
        )
    kind = dataset_format or ("jsonl" if dataset.suffix.lower() == ".jsonl" else "sharegpt")
    if kind == "jsonl":
        return load_jsonl(dataset, output_tokens=output_tokens)
    return load_sharegpt(dataset, output_tokens=output_tokens)


def _compare_command() -> click.Command:
    @click.command("--compare", add_help_option=False)
    @target_options
    @click.option("--hedge")
    def parse(**kwargs: Any) -> None:
        """The options a second variant may change."""

    return parse


def _variant_b(spec: str, a: VariantSpec) -> VariantSpec:
    command = _compare_command()
    try:
        ctx = command.make_context("--compare", shlex.split(spec))
    except (click.UsageError, ValueError) as exc:
        message = exc.format_message() if isinstance(exc, click.UsageError) else str(exc)
        # The options are not echoed: they may hold an API key.
        raise CLIError(f"--compare: {message}", EXIT_USAGE) from None
    given = {
        name: value
        for name, value in ctx.params.items()
        if ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE
    }
    if not given:
        raise CLIError(
            "--compare needs at least one option that differs, e.g. --compare "
            '"--base-url http://other:8000/v1" or --compare "--hedge 150ms"',
            EXIT_USAGE,
        )
    try:  # as the command line's own: --local is --backend local, alone
        place = options_from(dict(given))
    except CLIError as exc:
        raise CLIError(f"--compare: {exc.format_message()}", EXIT_USAGE) from None
    given.pop("local", None)
    if place.backend is not None:
        given["backend"] = place.backend
    target = a.target
    changes = {k: v for k, v in given.items() if k in ("backend", "base_url", "api_key", "model")}
    if "backend" in changes or "base_url" in changes:
        # A new place: the first variant's provider and URL do not carry over.
        target = TargetOptions(model=target.model, api_key=target.api_key)
    target = dataclasses.replace(target, **changes)
    hedge = _hedge(given["hedge"]) if "hedge" in given else a.hedge
    return VariantSpec(target, hedge)


async def _open_variant(
    stack: AsyncExitStack, name: str, spec: VariantSpec, timeout: float | None, connections: int
) -> Variant:
    http = {"max_connections": connections}
    kwargs: dict[str, Any] = {}
    if timeout is not None:
        kwargs["timeout"] = timeout
    if spec.hedge is None:
        target = build_target(spec.target, http=http)
        client = AsyncClient(target.backend, model=target.model, **kwargs)
        model: str | list[str] = target.model
        hedge = None
    else:
        if spec.target.is_local:
            raise CLIError(
                "--hedge needs an HTTP target (one engine cannot race itself)", EXIT_USAGE
            )
        # Two backends to the same place, registered under two names: the race's targets.
        first, second = build_target(spec.target, http=http), build_target(spec.target, http=http)
        client = AsyncClient(
            backends={"first": first.backend, "second": second.backend},
            default_backend="first",
            **kwargs,
        )
        model = [f"first/{first.model}", f"second/{second.model}"]
        hedge = Hedge(delay=spec.hedge)
    await stack.enter_async_context(client)
    return Variant(name, spec.describe(), client, model, hedge)


class _Progress:
    """Live progress on stderr: a rich bar on a terminal, a plain line every few seconds
    otherwise, so a long run never looks stuck."""

    PLAIN_EVERY = 5.0

    def __init__(self) -> None:
        self.err = console(stderr=True)
        self.live = self.err.is_terminal and not self.err.is_dumb_terminal
        self.done = 0
        self.errors = 0
        self.ttfts: list[float] = []
        self.total: int | None = None
        self.label = ""
        self.ended = False
        """The level being followed ran to its end (else it was interrupted)."""
        self._bar: Any = None
        self._task: Any = None
        self._last_line = 0.0

    def on_sample(self, sample: Sample) -> None:
        """Count one finished request."""
        self.done += 1
        if sample.error is not None:
            self.errors += 1
        elif sample.ttft is not None and not sample.warmup:
            self.ttfts.append(sample.ttft)

    def _status(self) -> tuple[str, str]:
        p50 = f"{statistics.median(self.ttfts) * 1000:.1f} ms" if self.ttfts else "-"
        return str(self.errors), p50

    def _plain(self, final: bool = False) -> None:
        errors, p50 = self._status()
        total = "?" if self.total is None else str(self.total)
        word = ("done" if self.ended else "interrupted") if final else "running"
        self.err.print(
            f"  {self.label} {word}: {self.done}/{total} requests, {errors} errors, p50 TTFT {p50}"
        )

    async def follow(self, label: str, total: int | None) -> None:
        """Refresh until cancelled (the level's end)."""
        self.done, self.errors, self.ttfts, self.total, self.label = 0, 0, [], total, label
        self.ended = False
        if not self.live:
            self._last_line = anyio.current_time()
            try:
                while True:
                    await anyio.sleep(self.PLAIN_EVERY)
                    self._plain()
            finally:
                self._plain(final=True)
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("errors {task.fields[errors]}"),
            TextColumn("p50 TTFT {task.fields[ttft]}"),
            TimeElapsedColumn(),
            console=self.err,
            auto_refresh=False,
        )
        task = bar.add_task(label, total=total, errors="0", ttft="-")
        with bar:
            try:
                while True:
                    errors, p50 = self._status()
                    bar.update(task, completed=self.done, errors=errors, ttft=p50)
                    bar.refresh()
                    await anyio.sleep(0.25)
            finally:
                errors, p50 = self._status()
                label = label if self.ended else f"{label} interrupted"
                bar.update(task, description=label, completed=self.done, errors=errors, ttft=p50)
                bar.refresh()


@click.command(epilog=_EXAMPLES, short_help="Measure TTFT, ITL and throughput under load.")
@target_options
@click.option(
    "-c", "--concurrency", metavar="N[,N...]", help="Concurrency levels, closed loop (default 1)."
)
@click.option(
    "--rate", metavar="R[,R...]", help="Request rates per second, Poisson arrivals (instead of -c)."
)
@click.option(
    "-n", "--requests", type=click.IntRange(min=1), help="Measured requests per level (default 32)."
)
@click.option(
    "--duration",
    **POSITIVE_DURATION,
    help="Measure each level for this long instead of -n (e.g. 30s).",
)
@click.option(
    "--warmup",
    type=click.IntRange(min=0),
    help="Warm-up requests per level, left out of the figures (default: one per worker; "
    "one second of arrivals at a rate).",
)
@click.option(
    "--input-tokens",
    type=click.IntRange(min=1),
    default=128,
    show_default=True,
    help="Synthetic prompt length (tokens, approximated by common words).",
)
@click.option(
    "--shared-prefix",
    type=click.IntRange(min=0),
    metavar="N",
    help="Start every synthetic prompt with the same N tokens, to measure a prefix cache "
    "(default 0: prompts share nothing, so no cache can serve them).",
)
@click.option(
    "--output-tokens",
    type=click.IntRange(min=1),
    help="Tokens to ask for (synthetic default 128; overrides a dataset's lengths).",
)
@click.option(
    "--dataset",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Prompts from a JSONL file of chat requests or a ShareGPT-style JSON file.",
)
@click.option(
    "--dataset-format",
    type=click.Choice(["jsonl", "sharegpt"]),
    help="Dataset kind (default: by suffix, .jsonl or else ShareGPT).",
)
@click.option(
    "--ignore-eos",
    is_flag=True,
    help="Ask the server to generate every requested token (local engine, vLLM, SGLang).",
)
@click.option(
    "--temperature",
    type=click.FloatRange(0.0, 2.0),
    help="Sampling temperature sent with every request (0 to 2).",
)
@click.option(
    "--timeout", **POSITIVE_DURATION, help="Per-request time limit (default: the client's)."
)
@click.option(
    "--ramp-up",
    **DURATION,
    help="Spread the workers' first requests over this long, so that identical requests do "
    "not arrive in bursts (default: 2 ms per worker, at most 2s; 0 starts all at once).",
)
@click.option(
    "--max-connections",
    type=click.IntRange(min=1),
    help="Connection pool size per variant (default: the largest concurrency, at least 100; "
    "1024 at a rate), so no request waits for a connection unless you ask for it.",
)
@click.option(
    "--hedge",
    metavar="DELAY",
    help="Hedge: a second request to the same target after DELAY (e.g. 150ms).",
)
@click.option(
    "--compare",
    metavar="OPTIONS",
    help="Run a second variant interleaved with the first and print ratios: the options it "
    'changes, e.g. "--hedge 150ms" or "--base-url http://other:8000/v1".',
)
@click.option(
    "--slo-ttft",
    **POSITIVE_DURATION,
    help="Count goodput: requests per second with TTFT within this (e.g. 500ms).",
)
@click.option(
    "--json",
    "json_path",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    help="Write every raw sample and the summary to this JSON file.",
)
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    help="Draw distributions and load curves to this PNG (needs the 'plot' extra).",
)
@click.option(
    "--seed",
    type=int,
    default=0,
    show_default=True,
    help="Seed for the synthetic prompts' words and the Poisson arrivals: the same seed "
    "sends the same prompts, another seed other ones.",
)
def bench(**kwargs: Any) -> int:
    """Measure TTFT, inter-token latency and throughput under load.

    Runs each load level (concurrency or request rate) against the target, with live
    progress on stderr, then prints a table per level: TTFT, ITL and end-to-end latency at
    p50/p90/p99, output tokens/s, requests/s, goodput under --slo-ttft and errors by type.
    Warm-up requests are sent first and left out. Times are the SDK's own, measured from
    the start of each call (see docs/cli.md).
    """
    target = options_from(kwargs)
    levels = _levels(kwargs["concurrency"], kwargs["rate"])
    if kwargs["requests"] is not None and kwargs["duration"] is not None:
        raise CLIError("give --requests or --duration, not both", EXIT_USAGE)
    requests = kwargs["requests"] if kwargs["duration"] is not None or kwargs["requests"] else 32
    if kwargs["duration"] is not None:
        requests = None
    for flag, path in (("--json", kwargs["json_path"]), ("--plot", kwargs["plot_path"])):
        if path is not None:  # checked now, not after a run whose results it would lose
            _check_writable(flag, path)
    if kwargs["plot_path"] is not None:
        check_plotting()
    workload = _workload(
        kwargs["dataset"],
        kwargs["dataset_format"],
        kwargs["input_tokens"],
        kwargs["output_tokens"],
        seed=kwargs["seed"],
        shared_prefix=kwargs["shared_prefix"],
    )
    specs = [VariantSpec(target, _hedge(kwargs["hedge"]))]
    if kwargs["compare"] is not None:
        specs.append(_variant_b(kwargs["compare"], specs[0]))
    params: dict[str, Any] = {}
    if kwargs["temperature"] is not None:
        params["temperature"] = kwargs["temperature"]
    if kwargs["ignore_eos"]:
        params["extra_body"] = {"ignore_eos": True}
    settings = _Settings(
        levels=levels,
        specs=specs,
        workload=workload,
        requests=requests,
        duration=kwargs["duration"],
        warmup=kwargs["warmup"],
        params=params,
        timeout=kwargs["timeout"],
        slo_ttft=kwargs["slo_ttft"],
        ramp_up=kwargs["ramp_up"],
        connections=kwargs["max_connections"] or _connections(levels),
        json_path=kwargs["json_path"],
        plot_path=kwargs["plot_path"],
        seed=kwargs["seed"],
    )
    return anyio.run(_bench, settings)


@dataclass(frozen=True, slots=True)
class _Settings:
    levels: list[Level]
    specs: list[VariantSpec]
    workload: Workload
    requests: int | None
    duration: float | None
    warmup: int | None
    params: dict[str, Any]
    timeout: float | None
    slo_ttft: float | None
    ramp_up: float | None
    connections: int
    json_path: Path | None
    plot_path: Path | None
    seed: int

    @property
    def pair_prompts(self) -> bool:
        """Whether both variants of a round send the same prompt (like for like): not when
        they go to the same target, where the second would hit the first's cached prompt."""
        return len(self.specs) < 2 or self.specs[0].target != self.specs[1].target

    def config(self) -> dict[str, Any]:
        """What was measured, for the JSON file."""
        return {
            "variants": {
                name: spec.describe() for name, spec in zip("AB", self.specs, strict=False)
            },
            "workload": self.workload.name,
            "levels": [level.label for level in self.levels],
            "requests_per_level": self.requests,
            "duration_per_level": self.duration,
            "warmup": self.warmup,
            "slo_ttft": self.slo_ttft,
            "params": self.params,
            "seed": self.seed,
        }


def _header(settings: _Settings, variants: Sequence[Variant]) -> str:
    amount = (
        f"{settings.requests} requests"
        if settings.requests is not None
        else f"{settings.duration:g}s"
    )
    if settings.warmup is not None:
        warm = f"{settings.warmup} warm-up"
    elif any(level.rate is not None for level in settings.levels):  # rates and -c never mix
        warm = "warm-up: one second of arrivals, at least one request"
    else:
        warm = "one warm-up request per worker"
    lines = [
        f"swiftclient bench: {settings.workload.name} · levels "
        f"{', '.join(level.label for level in settings.levels)} · {amount} per level ({warm})"
    ]
    if len(variants) == 1:
        lines.append(f"  target: {variants[0].description}")
    else:
        lines.extend(f"  {v.name}: {v.description}" for v in variants)
        lines.append("  requests alternate between the variants")
    return "\n".join(lines)


async def _bench(settings: _Settings) -> int:
    progress = _Progress()
    err = progress.err
    out = console()
    samples: list[Sample] = []
    summaries: list[Summary] = []
    try:
        await _run_levels(settings, progress, samples, summaries)
    except (KeyboardInterrupt, anyio.get_cancelled_exc_class()):
        path = settings.json_path
        if path is not None and summaries:  # keep the levels that finished
            write_json(path, {**settings.config(), "interrupted": True}, summaries, samples)
            levels = len({summary.level for summary in summaries})
            which = "the level" if levels == 1 else f"the {levels} levels"
            err.print(f"wrote {path}: {which} that finished before the interrupt")
        elif path is not None:
            err.print(f"nothing written to {path}: no level finished before the interrupt")
        raise
    title = f"swiftclient bench · {settings.workload.name}"
    render(out, summaries, title)
    if settings.json_path is not None:
        write_json(settings.json_path, settings.config(), summaries, samples)
        err.print(f"wrote {settings.json_path}")
    if settings.plot_path is not None:
        plot(settings.plot_path, summaries, samples, title)
        err.print(f"wrote {settings.plot_path}")
    measured = [s for s in samples if not s.warmup]
    if measured and all(not s.ok for s in measured):
        first = next(s for s in measured if s.message)
        raise CLIError(
            f"every request failed; the first: {first.error}: {first.message}", EXIT_ERROR
        )
    return 0


async def _run_levels(
    settings: _Settings, progress: _Progress, samples: list[Sample], summaries: list[Summary]
) -> None:
    """Run every level, adding each one's samples and summaries as it ends."""
    err = progress.err
    async with AsyncExitStack() as stack:
        if any(spec.target.is_local for spec in settings.specs):
            err.print("loading the local model...")
        variants = [
            await _open_variant(stack, name, spec, settings.timeout, settings.connections)
            for name, spec in zip("AB", settings.specs, strict=False)
        ]
        err.print(_header(settings, variants))
        clock_zero = anyio.current_time()
        sent = 0  # requests of the earlier levels: synthetic prompts go on from there
        for level in settings.levels:
            warmup = level.default_warmup() if settings.warmup is None else settings.warmup
            total = (
                None if settings.requests is None else (warmup + settings.requests) * len(variants)
            )
            if total is not None:  # the level's prompts, built before it is measured
                settings.workload.prepare(range(sent, sent + total))
            async with anyio.create_task_group() as tg:
                tg.start_soon(progress.follow, level.label, total)
                level_samples = await run_level(
                    level,
                    variants,
                    settings.workload,
                    requests=settings.requests,
                    duration=settings.duration,
                    warmup=warmup,
                    params=settings.params,
                    clock_zero=clock_zero,
                    on_sample=progress.on_sample,
                    seed=settings.seed,
                    ramp_up=_ramp_up(level, settings.ramp_up),
                    first=sent,
                    pair_prompts=settings.pair_prompts,
                )
                # kept before the level says it is done: an interrupt from then on keeps it
                samples.extend(level_samples)
                summaries.extend(
                    summarize(level_samples, level, v.name, settings.slo_ttft) for v in variants
                )
                progress.ended = True
                tg.cancel_scope.cancel()
            sent += len(level_samples)
