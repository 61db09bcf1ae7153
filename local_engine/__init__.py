"""The bundled inference engine (see docs/local-engine.md).

Importing the package sets an OpenMP wait default before torch loads, unless the user set
one (:mod:`local_engine.cpu_threads`); nothing else happens on import.
"""

from local_engine.cpu_threads import apply_openmp_defaults

apply_openmp_defaults()
