"""The bundled inference engine, and :class:`LocalBackend`, its adapter to swiftclient.

``import local_engine`` stays light: torch loads when a model does, and swiftclient when
:class:`LocalBackend` is first used (``from local_engine import LocalBackend``). Importing the
package sets an OpenMP wait default before torch loads, unless the user set one
(:mod:`local_engine.cpu_threads`).

The engine core (config, loader, model, attention, KV cache, scheduler, sequence, sampler,
runner, engine, async engine and their helpers) imports nothing from swiftclient and raises
its own errors (:mod:`local_engine.errors`). The OpenAI-compatible layer (service, server,
backend adapter) is the one place that speaks both, and it uses swiftclient's public contract
only; swiftclient reaches it through entry points (``swiftclient.backends`` /
``swiftclient.servers``, name ``local``), never by import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from local_engine.cpu_threads import apply_openmp_defaults

# First, before any other engine module is imported: the OpenMP runtime reads its wait policy
# once, when torch loads it.
apply_openmp_defaults()

if TYPE_CHECKING:
    from local_engine.backend import LocalBackend

__all__ = ["LocalBackend"]


def __getattr__(name: str) -> object:
    """``LocalBackend``, imported on first use (with it, swiftclient)."""
    if name == "LocalBackend":
        from local_engine.backend import LocalBackend

        return LocalBackend
    raise AttributeError(f"module 'local_engine' has no attribute {name!r}")
