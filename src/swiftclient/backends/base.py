"""The backend seam: one protocol every backend speaks.

A backend speaks one wire protocol and never retries, hedges or sleeps on its own; the
execution policies in the client compose around it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from .._deadline import Deadline
from ..errors import ConfigurationError
from ..types import ChatCompletion, ChatCompletionChunk, ChatRequest

__all__ = ["Backend", "RequestOptions", "check_backend_name"]


def check_backend_name(name: str) -> str:
    """Return ``name`` if it can prefix model strings (non-empty, no ``/``), else raise."""
    if not name or "/" in name:
        raise ConfigurationError(f"backend name must be non-empty without '/': {name!r}")
    return name


@dataclass(frozen=True, slots=True)
class RequestOptions:
    """Per-call settings the policy layer hands each attempt.

    ``idempotency_key`` is the same for every attempt of one call; ``headers`` are extra
    transport headers (backends that have no headers ignore them).
    """

    idempotency_key: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)


@runtime_checkable
class Backend(Protocol):
    """A chat-completion backend.

    ``stream`` returns an async context manager yielding an iterator of chunks; leaving it
    early (break, cancel, error, deadline) releases everything the stream holds.
    ``request.model`` is the backend's own model name (the ``backend/`` prefix removed).
    """

    name: str

    def stream(
        self, request: ChatRequest, deadline: Deadline, options: RequestOptions | None = None
    ) -> AbstractAsyncContextManager[AsyncIterator[ChatCompletionChunk]]:
        """Open a streamed completion."""
        ...

    async def complete(
        self, request: ChatRequest, deadline: Deadline, options: RequestOptions | None = None
    ) -> ChatCompletion:
        """Run a non-streamed completion."""
        ...

    async def aclose(self) -> None:
        """Release every resource the backend holds."""
        ...
