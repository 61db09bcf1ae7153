"""Where the engine's CPU tensors get their memory: glibc ``malloc`` settings for big tensors.

torch allocates every CPU tensor with the C library's ``malloc`` and frees it when the last
reference goes, so an engine step allocates and frees its activations (a prefill's hidden
states, the MLP's gate and up projections: megabytes each) layer after layer. glibc serves
a request at or above its mmap threshold (128 KiB to start, raised up to 32 MiB as such
blocks are freed) with a fresh ``mmap`` and gives it back to the kernel on ``free``; below
it, from the heap, whose free top it returns to the kernel once that exceeds the trim
threshold (128 KiB to start, twice the mmap threshold once glibc has raised that). Either
way, memory a step just freed is often handed back, and the next layer's tensor of the same
size takes a page fault on every page it touches again. On the 2-core VM this project is
measured on, one RMSNorm over a 4,096-token prefill (8 MiB in and out) took 6-9 ms that way
and 0.5 ms with the settings below, and a loop writing and freeing three 16 MiB tensors took
thousands of page faults a round (1,800 to 12,000, by how many huge pages it got) against
none.

That is the main thread's heap (glibc's main arena): an engine stepped from the main thread
(``Engine.step`` or ``Engine.generate`` in a script, the benchmarks) paid it on every
prefill. :class:`~local_engine.async_engine.AsyncEngine` (and so ``LocalBackend`` and the
server) steps the engine in worker threads, whose own arenas kept their memory already: 32
concurrent requests there took a handful of page faults a round after the first, with or
without these settings. So the engine applies them where they help: at its first step taken
on the main thread (``EngineConfig(tune_malloc=None)``, the default, on a CPU model), or when
it is built with ``tune_malloc=True``; ``False`` never.

:func:`tune_malloc` calls glibc's ``mallopt``: the trim threshold at :data:`TRIM_THRESHOLD`,
so a heap keeps up to that much free memory for the next step instead of returning it, and
the mmap threshold at 32 MiB (glibc's maximum on 64-bit), so tensors below that size come
from the heap. Each arena's resident memory then stays near the peak of its steps' working
set (up to the trim threshold more, per arena) rather than shrinking between them. It changes
the allocator for the whole process and for good, like ``torch.set_num_threads``, and turns
off glibc's own adjustment of both thresholds. It does nothing, and says why, where the C
library is not glibc, where another allocator (jemalloc, tcmalloc) was preloaded, or where
the environment already sets either threshold (``MALLOC_MMAP_THRESHOLD_``,
``MALLOC_TRIM_THRESHOLD_``, or ``glibc.malloc.mmap_threshold`` / ``trim_threshold`` in
``GLIBC_TUNABLES``): the user's setting wins.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
import threading
from dataclasses import dataclass

__all__ = [
    "ENV_SETTINGS",
    "MMAP_THRESHOLD",
    "TRIM_THRESHOLD",
    "MallocTuning",
    "malloc_tuning",
    "tune_malloc",
]

logger = logging.getLogger("local_engine")

MMAP_THRESHOLD = 32 * 2**20
"""Requests of this many bytes or more get their own ``mmap`` (glibc's largest value)."""
TRIM_THRESHOLD = 256 * 2**20
"""Free memory a heap keeps at its top before returning any to the kernel."""
ENV_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")
"""Environment variables that set the same thresholds: when present, nothing is changed."""
_TUNABLES = ("glibc.malloc.mmap_threshold", "glibc.malloc.trim_threshold")

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
_lock = threading.Lock()


def _user_setting() -> str | None:
    """The environment's own threshold setting, if any."""
    for name in ENV_SETTINGS:
        if name in os.environ:
            return name
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    for item in tunables.replace(",", ":").split(":"):
        if item.split("=", 1)[0].strip() in _TUNABLES:
            return "GLIBC_TUNABLES"
    return None


def _glibc() -> ctypes.CDLL | None:
    """glibc, when it is this process's C library and its ``malloc`` is the one in use."""
    if not sys.platform.startswith("linux") or not os.confstr("CS_GNU_LIBC_VERSION"):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
        process = ctypes.CDLL(None)
        mallopt = libc.mallopt
        ours = ctypes.cast(libc.malloc, ctypes.c_void_p).value
        used = ctypes.cast(process.malloc, ctypes.c_void_p).value
    except (OSError, AttributeError, ValueError):
        return None
    if ours != used:  # a preloaded allocator answers malloc: glibc's settings do nothing
        return None
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return libc


def _tune() -> MallocTuning:
    setting = _user_setting()
    if setting is not None:
        return MallocTuning(False, f"the environment sets malloc thresholds ({setting})")
    libc = _glibc()
    if libc is None:
        return MallocTuning(False, "malloc is not glibc's")
    # The trim threshold first: glibc takes any value for it, so a refusal of the mmap
    # threshold after it leaves only a harmless, larger trim threshold behind.
    if libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) != 1:
        return MallocTuning(False, "mallopt refused the trim threshold")
    if libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) != 1:
        return MallocTuning(False, "mallopt refused the mmap threshold")
    logger.debug(
        "malloc: mmap threshold %d MiB, trim threshold %d MiB",
        MMAP_THRESHOLD >> 20,
        TRIM_THRESHOLD >> 20,
    )
    return MallocTuning(True, "")


def tune_malloc() -> MallocTuning:
    """Keep freed tensor memory in the process (see the module docs); idempotent and
    thread-safe: the first call decides, later calls return its result."""
    global _tuning
    with _lock:
        if _tuning is None:
            _tuning = _tune()
        return _tuning


def malloc_tuning() -> MallocTuning | None:
    """The result of :func:`tune_malloc` in this process, or None before any call."""
    return _tuning
