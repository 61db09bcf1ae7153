"""Backends: the seam between policies and wire protocols."""

from .base import Backend, RequestOptions
from .http import HTTPBackend

__all__ = ["Backend", "HTTPBackend", "RequestOptions"]
