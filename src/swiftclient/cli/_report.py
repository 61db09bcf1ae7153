"""Figures, tables, JSON and plots for ``swiftclient bench``."""

from __future__ import annotations

import dataclasses
import json
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._common import CLIError
from ._runner import Level, Sample

if TYPE_CHECKING:
    from rich.console import Console

__all__ = [
    "Summary",
    "figure",
    "log_ticks",
    "percentile",
    "plot",
    "render",
    "summarize",
    "write_json",
]

QUANTILES = (50, 90, 99)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile, linear between the closest ranks (None for no values)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _quantiles(values: Sequence[float]) -> dict[str, float | None]:
    return {f"p{q}": percentile(values, q) for q in QUANTILES}


@dataclass(frozen=True, slots=True)
class Summary:
    """The figures of one variant at one level (measured requests only)."""

    variant: str
    level: str
    load: float
    requests: int
    ok: int
    errors: dict[str, int]
    duration: float
    ttft: dict[str, float | None]
    itl: dict[str, float | None]
    e2e: dict[str, float | None]
    output_tokens_per_s: float
    requests_per_s: float
    goodput_per_s: float | None
    slo_ttft: float | None

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready record (seconds)."""
        return dataclasses.asdict(self)


def summarize(
    samples: Sequence[Sample], level: Level, variant: str, slo_ttft: float | None
) -> Summary:
    """Figures over the measured (not warm-up) samples of one variant at one level."""
    measured = [s for s in samples if not s.warmup and s.variant == variant]
    ok = [s for s in measured if s.ok]
    if measured:
        begin = min(s.start for s in measured)
        end = max(s.start + (s.e2e or 0.0) for s in measured)
        duration = max(end - begin, 1e-9)
    else:
        duration = 0.0
    per_s = (lambda n: n / duration) if duration else (lambda n: 0.0)
    good = None
    if slo_ttft is not None:
        good = per_s(sum(1 for s in ok if s.ttft is not None and s.ttft <= slo_ttft))
    return Summary(
        variant=variant,
        level=level.label,
        load=level.load,
        requests=len(measured),
        ok=len(ok),
        errors=dict(Counter(s.error for s in measured if s.error is not None).most_common()),
        duration=duration,
        ttft=_quantiles([s.ttft for s in ok if s.ttft is not None]),
        itl=_quantiles([gap for s in ok for gap in s.itl]),
        e2e=_quantiles([s.e2e for s in ok if s.e2e is not None]),
        output_tokens_per_s=per_s(sum(s.output_tokens for s in ok)),
        requests_per_s=per_s(len(ok)),
        goodput_per_s=good,
        slo_ttft=slo_ttft,
    )


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


def render(out: Console, summaries: Sequence[Summary], title: str) -> None:
    """Print one table per level (a row per variant), then ratios when two variants ran."""
    from rich.table import Table
    from rich.text import Text

    levels: dict[str, list[Summary]] = {}
    for summary in summaries:
        levels.setdefault(summary.level, []).append(summary)
    for label, rows in levels.items():
        first = rows[0]
        table = Table(
            title=f"{title} · {label} · {first.requests} requests in {first.duration:.2f}s",
            title_justify="left",
        )
        table.add_column("" if len(rows) > 1 else "metric", justify="left", style="cyan")
        table.add_column("p50 ms", justify="right")
        table.add_column("p90 ms", justify="right")
        table.add_column("p99 ms", justify="right")
        for summary in rows:
            prefix = f"{summary.variant} " if len(rows) > 1 else ""
            for name, figures in (
                ("TTFT", summary.ttft),
                ("ITL", summary.itl),
                ("e2e", summary.e2e),
            ):
                table.add_row(prefix + name, *(_ms(figures[f"p{q}"]) for q in QUANTILES))
        out.print(table)
        for summary in rows:
            prefix = f"{summary.variant}: " if len(rows) > 1 else ""
            line = (
                f"{prefix}output {summary.output_tokens_per_s:.1f} tok/s · "
                f"{summary.requests_per_s:.2f} req/s · ok {summary.ok}/{summary.requests}"
            )
            if summary.goodput_per_s is not None and summary.slo_ttft is not None:
                share = (
                    summary.goodput_per_s / summary.requests_per_s if summary.requests_per_s else 0
                )
                line += (
                    f" · goodput {summary.goodput_per_s:.2f} req/s "
                    f"({share:.0%} with TTFT ≤ {summary.slo_ttft * 1000:g} ms)"
                )
            errors = ", ".join(f"{name} ×{count}" for name, count in summary.errors.items())
            text = Text(line + " · errors: ")
            text.append(errors or "none", style="red" if errors else "green")
            out.print(text)
        if len(rows) == 2:
            out.print(Text(_ratios(rows[0], rows[1]), style="bold"))
        out.print()


def ratios(a: Summary, b: Summary) -> dict[str, float | None]:
    """``b / a`` for the headline figures (None where either is missing or zero)."""

    def ratio(x: float | None, y: float | None) -> float | None:
        return None if x is None or y is None or x == 0 else y / x

    return {
        "ttft_p50": ratio(a.ttft["p50"], b.ttft["p50"]),
        "ttft_p99": ratio(a.ttft["p99"], b.ttft["p99"]),
        "itl_p50": ratio(a.itl["p50"], b.itl["p50"]),
        "e2e_p50": ratio(a.e2e["p50"], b.e2e["p50"]),
        "e2e_p99": ratio(a.e2e["p99"], b.e2e["p99"]),
        "output_tokens_per_s": ratio(a.output_tokens_per_s, b.output_tokens_per_s),
    }


def _ratios(a: Summary, b: Summary) -> str:
    parts = [
        f"{name.replace('_', ' ')} {value:.2f}x"
        for name, value in ratios(a, b).items()
        if value is not None
    ]
    return f"{b.variant}/{a.variant}: " + " · ".join(parts)


def write_json(
    path: Path,
    config: dict[str, Any],
    summaries: Sequence[Summary],
    samples: Sequence[Sample],
) -> None:
    """Every raw sample (warm-up ones marked) and the summaries, as one JSON document."""
    comparisons = []
    by_level: dict[str, list[Summary]] = {}
    for summary in summaries:
        by_level.setdefault(summary.level, []).append(summary)
    for label, rows in by_level.items():
        if len(rows) == 2:
            comparisons.append(
                {"level": label, "of": [rows[1].variant, rows[0].variant], **ratios(*rows)}
            )
    document = {
        "version": 1,
        "units": "seconds",
        "config": config,
        "summary": [s.as_dict() for s in summaries],
        "comparisons": comparisons,
        "samples": [s.as_dict() for s in samples],
    }
    try:
        path.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    except OSError as exc:
        raise CLIError(f"cannot write {path}: {exc}") from exc


def _ms_or_nan(value: float | None) -> float:
    return math.nan if value is None else value * 1000


_TICK_STEPS = ((1,), (1, 2, 5), (1, 2, 3, 5, 7), tuple(range(1, 10)))
"""Mantissas of the tick values of a log axis, coarsest first."""


def log_ticks(low: float, high: float, *, at_least: int = 3, at_most: int = 8) -> list[float]:
    """Tick values for a log axis from ``low`` to ``high`` (both > 0), labelled as plain
    numbers: the coarsest of 1-10-100, 1-2-5, 1-2-3-5-7 and every digit that puts
    ``at_least`` ticks in the range; a range too narrow even for that gets evenly spaced
    round values instead, and one too wide keeps every few powers of ten."""
    if not 0 < low <= high:
        raise ValueError("log_ticks needs 0 < low <= high")
    first, last = math.floor(math.log10(low)), math.ceil(math.log10(high))
    ticks: list[float] = []
    for steps in _TICK_STEPS:
        ticks = [
            float(f"{m}e{e}")  # exact decimal values: 0.3, not 0.30000000000000004
            for e in range(first, last + 1)
            for m in steps
            if low <= float(f"{m}e{e}") <= high
        ]
        if len(ticks) >= at_least:
            break
    else:
        from matplotlib.ticker import MaxNLocator

        for bins in range(at_least, at_most + 1):
            found = MaxNLocator(nbins=bins, steps=[1, 2, 2.5, 5, 10]).tick_values(low, high)
            ticks = [float(t) for t in found if low <= t <= high]
            if len(ticks) >= at_least:
                break
    stride = math.ceil(len(ticks) / at_most)
    return ticks[::stride]


def _tick_label(value: float) -> str:
    return f"{value:g}"


def _label_log_axis(ax: Any, values: Sequence[float]) -> None:
    """Plain-number ticks on a log x axis (matplotlib's own labels read ``2×10²`` and crowd
    into one another over less than two decades); minor ticks stay, unlabelled."""
    from matplotlib.ticker import NullFormatter

    shown = [v for v in values if v > 0]  # a log axis leaves out the rest
    if not shown:
        return
    ticks = log_ticks(min(shown), max(shown))
    ax.set_xticks(ticks, [_tick_label(t) for t in ticks])
    ax.xaxis.set_minor_formatter(NullFormatter())


def check_plotting() -> None:
    """Fail early, with the fix, when matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise CLIError("--plot needs matplotlib: pip install 'swiftclient-llm[plot]'", 2) from None


def plot(path: Path, summaries: Sequence[Summary], samples: Sequence[Sample], title: str) -> None:
    """Draw :func:`figure` to the PNG file ``path``."""
    import matplotlib.pyplot as plt

    fig = figure(summaries, samples, title)
    try:
        fig.savefig(path)
    except OSError as exc:
        raise CLIError(f"cannot write {path}: {exc}") from exc
    finally:
        plt.close(fig)


def figure(summaries: Sequence[Summary], samples: Sequence[Sample], title: str) -> Any:
    """The matplotlib figure of a run (the caller closes it): TTFT and ITL distributions
    per level, and throughput and latency against load."""
    check_plotting()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(9, 6.5), dpi=80)
    (ax_ttft, ax_itl), (ax_tput, ax_lat) = axes
    groups: dict[tuple[str, str], list[Sample]] = {}
    for sample in samples:
        if not sample.warmup and sample.ok:
            groups.setdefault((sample.level, sample.variant), []).append(sample)
    variants = sorted({s.variant for s in summaries})
    plotted: dict[Any, list[float]] = {ax_ttft: [], ax_itl: []}
    for (level, variant), items in groups.items():
        label = level if len(variants) == 1 else f"{variant} {level}"
        for ax, values in (
            (ax_ttft, [s.ttft * 1000 for s in items if s.ttft is not None]),
            (ax_itl, [g * 1000 for s in items for g in s.itl]),
        ):
            if values:
                ordered = sorted(values)
                ys = [(i + 1) / len(ordered) for i in range(len(ordered))]
                ax.step(ordered, ys, where="post", label=label)
                plotted[ax].extend(values)
    for ax, name in ((ax_ttft, "TTFT"), (ax_itl, "inter-token latency")):
        ax.set_xscale("log")
        _label_log_axis(ax, plotted[ax])
        ax.set_xlabel(f"{name} (ms, log scale)")
        ax.set_ylabel("fraction of requests" if ax is ax_ttft else "fraction of gaps")
        ax.set_title(f"{name} distribution")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for variant in variants:
        rows = [s for s in summaries if s.variant == variant]
        loads = [s.load for s in rows]
        suffix = "" if len(variants) == 1 else f" ({variant})"
        ax_tput.plot(
            loads, [s.output_tokens_per_s for s in rows], "o-", label="output tok/s" + suffix
        )
        for key, style in (("p50", "o-"), ("p99", "s--")):
            ax_lat.plot(
                loads,
                [_ms_or_nan(s.ttft[key]) for s in rows],
                style,
                label=f"TTFT {key}{suffix}",
            )
        ax_lat.plot(
            loads,
            [_ms_or_nan(s.itl["p50"]) for s in rows],
            "^:",
            label=f"ITL p50{suffix}",
        )
    xlabel = "requests/s offered" if any("rate=" in s.level for s in summaries) else "concurrency"
    for ax, name in ((ax_tput, "throughput"), (ax_lat, "latency (ms)")):
        ax.set_xlabel(xlabel)
        ax.set_title(f"{name} against load")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        loads = sorted({s.load for s in summaries})
        if len(loads) > 2:
            ax.set_xscale("log", base=2)
        ax.set_xticks(loads, [f"{load:g}" for load in loads])
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig
