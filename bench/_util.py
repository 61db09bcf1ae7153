"""Small helpers shared by the benchmark scripts: CPU timing, markdown tables, verdicts."""

from __future__ import annotations

import gc
import time
from collections.abc import Awaitable, Callable, Sequence

__all__ = ["cpu_seconds_per_call", "markdown_table", "ratio", "verdict"]


async def cpu_seconds_per_call(
    call: Callable[[], Awaitable[object]], iterations: int, warmup: int
) -> float:
    """Process CPU seconds per awaited ``call()``, after ``warmup`` untimed calls.

    ``time.process_time`` counts this process's CPU only, so neither sleeping nor other
    processes on the machine add to it. A garbage collection runs before the timed loop (the
    loop itself collects as usual).
    """
    for _ in range(warmup):
        await call()
    gc.collect()
    start = time.process_time()
    for _ in range(iterations):
        await call()
    return (time.process_time() - start) / iterations


def ratio(numerator: float, denominator: float) -> float:
    """``numerator / denominator``, ``inf`` when the denominator is zero."""
    return numerator / denominator if denominator > 0 else float("inf")


def verdict(ok: bool) -> str:
    """``PASS`` or ``FAIL``."""
    return "PASS" if ok else "FAIL"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Render a GitHub-flavoured markdown table; numbers right-aligned."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    numeric = [all(_is_number(row[i]) for row in rows) and bool(rows) for i in range(len(headers))]

    def line(row: Sequence[str]) -> str:
        parts = [
            cell.rjust(width) if right else cell.ljust(width)
            for cell, width, right in zip(row, widths, numeric, strict=True)
        ]
        return "| " + " | ".join(parts) + " |"

    rule = "|" + "|".join(
        "-" * (w + 1) + ":" if right else "-" * (w + 2)
        for w, right in zip(widths, numeric, strict=True)
    )
    return "\n".join([line(cells[0]), rule + "|", *(line(row) for row in cells[1:])])


def _is_number(value: object) -> bool:
    if isinstance(value, int | float):
        return True
    try:
        float(str(value).rstrip("x"))
    except ValueError:
        return False
    return True
