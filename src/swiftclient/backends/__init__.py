"""Backends: the seam between policies and wire protocols."""

from .base import Backend, RequestOptions, check_backend_name
from .http import HTTPBackend

__all__ = ["Backend", "HTTPBackend", "RequestOptions", "check_backend_name"]
