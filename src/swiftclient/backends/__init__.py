"""Backends: the seam between policies and wire protocols."""

from .anthropic import AnthropicBackend
from .azure import AzureBackend
from .base import Backend, RequestOptions, check_backend_name
from .http import HTTPBackend
from .replicas import ReplicaBackend, ReplicaStats
from .responses import ResponsesBackend

__all__ = [
    "AnthropicBackend",
    "AzureBackend",
    "Backend",
    "HTTPBackend",
    "ReplicaBackend",
    "ReplicaStats",
    "RequestOptions",
    "ResponsesBackend",
    "check_backend_name",
]
