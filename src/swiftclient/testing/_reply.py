"""``Reply``: how the fake provider answers one chat request."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["Reply", "ReplyUsage"]

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class ReplyUsage(BaseModel):
    """Token counts to report; a count left ``None`` is derived from the request and reply."""

    model_config = _FROZEN
    prompt_tokens: int | None = Field(default=None, ge=0)
    completion_tokens: int | None = Field(default=None, ge=0)
    cached_tokens: int | None = Field(default=None, ge=0)
    cache_write_tokens: int | None = Field(default=None, ge=0)
    """Prompt tokens written to the cache (``cache_creation_input_tokens`` on the Messages
    route, ``cache_write_tokens`` in the prompt or input token details on the OpenAI
    routes, as GPT-5.6 and later report them)."""
    cache_write_1h_tokens: int | None = Field(default=None, ge=0)
    """Of ``cache_write_tokens``, those reported as 1-hour writes (the Messages route's
    ``cache_creation.ephemeral_1h_input_tokens``; the rest are 5-minute writes)."""


class Reply(BaseModel):
    """One scripted behaviour of :class:`~swiftclient.testing.FakeProvider`.

    Content: ``text`` (split into word tokens), ``tokens`` (``"tok0 tok1 ..."``) or
    ``json_object`` (sent as JSON text), at most one of them; ``tool_calls`` adds
    ``(name, arguments)`` calls after the content. With none of the four the reply is
    ``tokens=5``.

    Timing: ``ttft`` seconds before the first chunk (or before an error or a whole body);
    ``token_delay`` seconds between chunks; ``chunk_size`` tokens per content chunk.

    Errors: ``status`` >= 400 answers an OpenAI-style error body (``error_message``);
    ``retry_after`` / ``retry_after_ms`` set ``Retry-After`` / ``retry-after-ms``;
    ``headers`` adds response headers (they may override ``x-request-id``).

    Faults, counted in chunks (content or tool-call deltas; ``0`` means before the first):
    ``drop_after`` drops the connection; ``stall_after`` stops sending until the client
    leaves, sending ``: keep-alive`` comments every ``keepalive_comments`` seconds when set;
    ``malformed_after`` sends a data line that is not JSON, then carries on;
    ``error_event_after`` sends an in-band ``{"error": ...}`` event and ends the stream.
    A non-streamed request with ``drop_after`` is dropped with no response, with
    ``stall_after`` gets none, with ``malformed_after`` gets a 200 body that is not JSON, and
    with ``error_event_after`` gets a 200 ``{"error": ...}`` body.

    ``usage`` overrides token counts; ``finish_reason`` overrides ``stop`` / ``tool_calls`` /
    ``length`` (``length`` is chosen when the request's max tokens cut the content short).
    """

    model_config = _FROZEN
    text: str | None = None
    tokens: int | None = Field(default=None, ge=0)
    json_object: dict[str, Any] | None = None
    tool_calls: Sequence[tuple[str, dict[str, Any]]] = ()
    ttft: float = Field(default=0.0, ge=0.0)
    token_delay: float = Field(default=0.0, ge=0.0)
    chunk_size: int = Field(default=1, ge=1)
    status: int = Field(default=200, ge=200, le=599)
    error_message: str | None = None
    retry_after: float | None = Field(default=None, ge=0.0)
    retry_after_ms: float | None = Field(default=None, ge=0.0)
    headers: dict[str, str] = Field(default_factory=dict)
    drop_after: int | None = Field(default=None, ge=0)
    stall_after: int | None = Field(default=None, ge=0)
    keepalive_comments: float | None = Field(default=None, gt=0.0)
    malformed_after: int | None = Field(default=None, ge=0)
    error_event_after: int | None = Field(default=None, ge=0)
    usage: ReplyUsage | None = None
    finish_reason: str | None = None
    thinking: str | None = None
    """Reasoning text sent first: on the Messages route (``/v1/messages``) as a signed
    ``thinking`` block, on the Responses route (``/v1/responses``) as a ``reasoning`` item
    (summary, and encrypted content when asked for); the chat route ignores it."""

    @model_validator(mode="after")
    def _consistent(self) -> Reply:
        given = [n for n in ("text", "tokens", "json_object") if getattr(self, n) is not None]
        if len(given) > 1:
            raise ValueError(f"give at most one of text, tokens, json_object (got {given})")
        if self.keepalive_comments is not None and self.stall_after is None:
            raise ValueError("keepalive_comments only applies with stall_after")
        return self

    @property
    def is_error(self) -> bool:
        """True when the reply answers an HTTP error status."""
        return self.status >= 400

    def response_headers(self) -> dict[str, str]:
        """The headers this reply adds: retry hints, then ``headers``."""
        out: dict[str, str] = {}
        if self.retry_after is not None:
            out["retry-after"] = _number(self.retry_after)
        if self.retry_after_ms is not None:
            out["retry-after-ms"] = _number(self.retry_after_ms)
        out.update(self.headers)
        return out


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))
