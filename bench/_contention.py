"""A competing CPU-bound process for the contention benchmarks, bounded in time.

:func:`busy_process` starts a separate Python process that spins on the CPU (it never
sleeps) and returns once it is spinning; leaving the ``with`` block kills it, and it exits by
itself after ``limit_s`` seconds, so a benchmark that crashes or is interrupted leaves no
process behind for longer than that.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["busy_process"]

_SPIN = (
    "import sys, time\n"
    "end = time.monotonic() + float(sys.argv[1])\n"
    "print('spinning', flush=True)\n"
    "n = 0\n"
    "while time.monotonic() < end:\n"
    "    for _ in range(10_000):\n"
    "        n += 1\n"
)


@contextmanager
def busy_process(limit_s: float = 120.0) -> Iterator[subprocess.Popen[bytes]]:
    """Run one CPU-bound process (pure-Python spinning) while the block runs.

    Entering returns once the process has started spinning. It exits by itself after
    ``limit_s`` seconds; leaving the block kills it first.
    """
    proc = subprocess.Popen(
        [sys.executable, "-c", _SPIN, str(limit_s)],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    try:
        if proc.stdout is not None:
            proc.stdout.readline()  # "spinning" (or b"" if it died at once)
        yield proc
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
