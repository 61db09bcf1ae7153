"""The bundled inference engine, and :class:`LocalBackend`, its adapter to swiftclient.

``import local_engine`` stays light: torch loads when a model does. Importing the package
sets an OpenMP wait default before torch loads, unless the user set one
(:mod:`local_engine.cpu_threads`). The package depends on swiftclient's public contract
only; swiftclient reaches it through entry points (``swiftclient.backends`` /
``swiftclient.servers``, name ``local``), never by import.
"""

from local_engine.cpu_threads import apply_openmp_defaults

# First, before any other engine module is imported: the OpenMP runtime reads its wait policy
# once, when torch loads it.
apply_openmp_defaults()

from local_engine.backend import LocalBackend  # noqa: E402

__all__ = ["LocalBackend"]
