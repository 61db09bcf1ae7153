"""Process-wide settings of the process an engine runs in: torch's CPU threads and glibc malloc.

Both hold for the whole process and for good, so they are not an engine's to change: whoever
owns the process applies them once, at its start, with :func:`apply_process_settings`:
:class:`~local_engine.backend.LocalBackend` when it loads its model (and so the server and
``swiftclient serve``, which serve through one), or a script that builds and steps an
:class:`~local_engine.engine.Engine` itself. An engine never applies them, and nothing is
checked per step. (The OpenMP wait policy is a third such setting; it must be in the
environment before torch loads, so ``import local_engine`` sets it:
:mod:`local_engine.cpu_threads`.)
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from local_engine.cpu_memory import MallocTuning, tune_malloc
from local_engine.cpu_threads import log_openmp_setup, set_num_threads

if TYPE_CHECKING:
    from local_engine.engine import EngineConfig

__all__ = ["apply_process_settings"]

logger = logging.getLogger("local_engine")


def apply_process_settings(
    config: EngineConfig, *, steps_on_main_thread: bool = False
) -> MallocTuning | None:
    """Apply ``config``'s process-wide settings; the malloc tuning's result when it was tuned.

    ``config.num_threads`` sets torch's CPU threads (``None`` keeps torch's count). On a CPU
    device the OpenMP wait setup is logged once. ``config.tune_malloc=True`` keeps freed
    tensor memory in the process (:func:`~local_engine.cpu_memory.tune_malloc`; a warning
    says why where it cannot); ``None`` does so only when ``steps_on_main_thread`` (a script
    stepping the engine on its main thread, whose heap is the one that gives memory back;
    :class:`~local_engine.async_engine.AsyncEngine` steps in worker threads, where it changes
    nothing) and the device is the CPU; ``False`` leaves the allocator as it is.
    """
    if config.num_threads is not None:
        set_num_threads(config.num_threads)
    cpu = config.device.split(":", 1)[0] == "cpu"
    if cpu:
        log_openmp_setup()
    wanted = config.tune_malloc
    if wanted is False or (wanted is None and not (steps_on_main_thread and cpu)):
        return None
    tuning = tune_malloc()
    if wanted and not tuning.applied:
        logger.warning("tune_malloc=True had no effect: %s", tuning.reason)
    return tuning
