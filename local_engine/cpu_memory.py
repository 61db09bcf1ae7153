"""Where the engine's CPU tensors get their memory: glibc ``malloc`` settings for big tensors.

torch allocates every CPU tensor with the C library's ``malloc`` and frees it when the last
reference goes, so an engine step allocates and frees its activations (a prefill's hidden
states, the MLP's gate and up projections: megabytes each) layer after layer. glibc serves
a request above its mmap threshold (128 KiB to start, raised up to 32 MiB as such blocks are
freed) with a fresh ``mmap`` and gives it back to the kernel on ``free``; below it, from the
heap, whose free top it returns to the kernel once that exceeds the trim threshold (twice
the mmap threshold). Either way, memory a step just freed is often handed back, and the next
layer's tensor of the same size takes a page fault on every page it touches again. On the
2-core VM this project is measured on, one RMSNorm over a 4,096-token prefill (8 MiB in and
out) took 8.9 ms that way and 0.5 ms with the settings below, and a loop of three 16 MiB
tensors took about 1,800 page faults per round against none.

This is the main thread's heap (glibc's main arena): an engine stepped from the main thread
(``Engine.step`` or ``Engine.generate`` in a script, the benchmarks) paid it on every
prefill. :class:`~local_engine.async_engine.AsyncEngine` (and so ``LocalBackend`` and the
server) steps the engine in worker threads, whose own arenas kept their memory already: 32
concurrent requests there took a handful of page faults per round after the first, with or
without these settings.

:func:`tune_malloc` calls glibc's ``mallopt`` to keep that memory: the mmap threshold at
32 MiB (glibc's maximum on 64-bit), so tensors up to that size come from the heap, and the
trim threshold at :data:`TRIM_THRESHOLD`, so a heap keeps up to that much free memory for the
next step instead of returning it. The process's resident memory then stays near the peak
of its steps' working set (at most that much more) rather than shrinking between them. The
engine calls it when it starts on CPU (``EngineConfig(tune_malloc=...)``; ``None``, the
default, means on for a CPU model). It changes the allocator for the whole process, like
``torch.set_num_threads``; it does nothing where the C library is not glibc (musl, macOS,
Windows), and its settings hold until the process ends. Setting the mmap threshold also
turns off glibc's own adjustment of both thresholds.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys
from dataclasses import dataclass

__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "MallocTuning", "malloc_tuning", "tune_malloc"]

logger = logging.getLogger("local_engine")

MMAP_THRESHOLD = 32 * 2**20
"""Requests above this many bytes get their own ``mmap`` (glibc's largest allowed value)."""
TRIM_THRESHOLD = 256 * 2**20
"""Free memory a heap keeps at its top before returning any to the kernel."""

# glibc's mallopt parameter numbers (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


@dataclass(frozen=True)
class MallocTuning:
    """What :func:`tune_malloc` did."""

    applied: bool
    """Both settings are in force."""
    reason: str
    """Why not, when they are not (empty when they are)."""


_tuning: MallocTuning | None = None


def _glibc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        version = libc.gnu_get_libc_version  # glibc only: musl has no such symbol
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return None
    version.restype = ctypes.c_char_p
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return libc


def tune_malloc() -> MallocTuning:
    """Keep freed tensor memory in the process (see the module docs); idempotent: the first
    call decides, later calls return its result."""
    global _tuning
    if _tuning is None:
        libc = _glibc()
        if libc is None:
            _tuning = MallocTuning(False, "the C library is not glibc")
        elif libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) != 1:
            _tuning = MallocTuning(False, "mallopt refused the mmap threshold")
        elif libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) != 1:
            _tuning = MallocTuning(False, "mallopt refused the trim threshold")
        else:
            _tuning = MallocTuning(True, "")
            logger.debug(
                "malloc: mmap threshold %d MiB, trim threshold %d MiB",
                MMAP_THRESHOLD >> 20,
                TRIM_THRESHOLD >> 20,
            )
    return _tuning


def malloc_tuning() -> MallocTuning | None:
    """The result of :func:`tune_malloc` in this process, or None before any call."""
    return _tuning
