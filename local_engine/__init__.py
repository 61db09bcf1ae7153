"""The bundled inference engine, and :class:`LocalBackend`, its adapter to swiftclient.

``import local_engine`` stays light: torch loads when a model does. The package depends on
swiftclient's public contract only; swiftclient reaches it through entry points
(``swiftclient.backends`` / ``swiftclient.servers``, name ``local``), never by import.
"""

from local_engine.backend import LocalBackend

__all__ = ["LocalBackend"]
