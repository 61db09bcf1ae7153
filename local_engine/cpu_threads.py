"""How the engine's CPU threads wait: an OpenMP default set before torch loads (no torch here).

torch runs its CPU kernels, and the engine's native attention kernel, on a team of GNU
OpenMP threads. Between two parallel operations those threads spin on the CPU, by default
for about 300,000 iterations (a few milliseconds), before they sleep. Alone on a machine that
costs nothing; next to any other CPU-bound process (the user's own agent, a second engine, a
build) the spinning threads fight it for the cores, the team's barriers wait for whichever
thread the scheduler took off its core, and batch-1 decode fell from about 200 to 14 tokens/s
on a 2-core machine with one busy process.

The OpenMP runtime reads its wait settings once, when it is loaded, which is when torch is
imported. So ``import local_engine`` (every engine entry point imports this package before
torch) calls :func:`apply_openmp_defaults`, which sets ``OMP_WAIT_POLICY=PASSIVE``
(:data:`DEFAULTS`): a thread with no work sleeps at once, so it yields the core to other work,
and is woken when the next parallel operation starts. The default is only set when the
process environment has neither ``OMP_WAIT_POLICY`` nor ``GOMP_SPINCOUNT`` (the user's setting
always wins: ``GOMP_SPINCOUNT=300000`` restores GNU OpenMP's own default,
``OMP_WAIT_POLICY=ACTIVE`` spins without end), and only while no OpenMP runtime is loaded yet.
When torch (or anything else bringing GNU OpenMP) was imported first, it is too late: nothing
is changed, :func:`openmp_setup` says so, and the engine logs it once when it starts on CPU.
The variable, like any, holds for the whole process and the processes it starts.

The number of threads is a separate, run-time setting: ``EngineConfig(num_threads=...)``.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

__all__ = [
    "DEFAULTS",
    "SPIN_COUNT_ENV",
    "WAIT_POLICY_ENV",
    "OpenMPSetup",
    "apply_openmp_defaults",
    "gomp_libraries",
    "log_openmp_setup",
    "openmp_setup",
    "set_num_threads",
]

logger = logging.getLogger("local_engine")

WAIT_POLICY_ENV = "OMP_WAIT_POLICY"
SPIN_COUNT_ENV = "GOMP_SPINCOUNT"
DEFAULTS: Mapping[str, str] = MappingProxyType({WAIT_POLICY_ENV: "PASSIVE"})
"""What :func:`apply_openmp_defaults` puts in the environment. The measurement behind the
choice (against GNU OpenMP's default and shorter spins) is in docs/local-engine.md, "CPU
threads on a shared machine"."""


@dataclass(frozen=True)
class OpenMPSetup:
    """What :func:`apply_openmp_defaults` found and did."""

    applied: dict[str, str]
    """Environment variables it set (empty when it set none)."""
    user_set: dict[str, str]
    """The wait settings already in the environment, which it left alone."""
    runtime_loaded_first: bool
    """An OpenMP runtime (or torch) was loaded before: its wait settings were already fixed."""

    @property
    def spinning_by_default(self) -> bool:
        """True when the runtime keeps GNU OpenMP's long default spin: loaded before the
        default could be set, with no wait setting of the user's."""
        return self.runtime_loaded_first and not self.user_set and not self.applied


def gomp_libraries() -> set[str]:
    """Paths of the GNU OpenMP runtimes mapped into this process (Linux; empty elsewhere)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return set()
    found = set()
    for line in maps.splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and Path(parts[5].strip()).name.startswith("libgomp"):
            found.add(parts[5].strip())
    return found


_setup: OpenMPSetup | None = None


def apply_openmp_defaults() -> OpenMPSetup:
    """Put :data:`DEFAULTS` in the environment unless the user set a wait setting or an
    OpenMP runtime is already loaded; idempotent (the first call decides)."""
    global _setup
    if _setup is None:
        user_set = {
            name: os.environ[name]
            for name in (WAIT_POLICY_ENV, SPIN_COUNT_ENV)
            if name in os.environ
        }
        loaded = "torch" in sys.modules or bool(gomp_libraries())
        applied: dict[str, str] = {}
        if not user_set and not loaded:
            applied.update(DEFAULTS)
            os.environ.update(applied)
        _setup = OpenMPSetup(applied, user_set, loaded)
    return _setup


def openmp_setup() -> OpenMPSetup:
    """The result of the first :func:`apply_openmp_defaults` call (made by ``import
    local_engine``)."""
    return apply_openmp_defaults()


_logged = False


def log_openmp_setup() -> None:
    """Log, once per process, when torch's threads keep spinning because torch was loaded
    before ``local_engine`` (called by the engine when it starts on CPU)."""
    global _logged
    if _logged:
        return
    _logged = True
    if openmp_setup().spinning_by_default:
        logger.info(
            "torch was imported before local_engine, so its OpenMP threads spin for GNU "
            "OpenMP's default (~300,000 iterations) while idle; decoding slows sharply when "
            "other processes need the CPU. Import local_engine first, or set %s=PASSIVE in "
            "the environment.",
            WAIT_POLICY_ENV,
        )


def set_num_threads(num_threads: int) -> None:
    """Set torch's CPU threads for this process (``torch.set_num_threads``; imports torch)."""
    import torch

    torch.set_num_threads(num_threads)
