"""The local server's spans: one ``SERVER`` span per chat request, joined to the caller's
trace through the propagators (W3C ``traceparent`` by default).

On the OpenTelemetry API only: without an SDK, or for a request whose trace is not
sampled, :meth:`ServerTracer.start` returns a non-recording span and nothing else is done.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from swiftclient.telemetry import SEMCONV_SCHEMA_URL
from swiftclient.types import ChatRequest, Usage

__all__ = ["ServerTracer"]

_PROVIDER = "swiftclient.local_engine"


class ServerTracer:
    """Starts and ends the local server's request spans.

    Args:
        tracer_provider: where spans go (``None``: the global provider).
    """

    def __init__(self, tracer_provider: trace.TracerProvider | None = None) -> None:
        self.tracer = trace.get_tracer(
            "local_engine", None, tracer_provider, schema_url=SEMCONV_SCHEMA_URL
        )

    def start(self, headers: Mapping[str, str]) -> trace.Span:
        """A span for a request with ``headers``, a child of the caller's span when the
        headers carry its context."""
        context = propagate.extract(headers)
        return self.tracer.start_span(
            "chat",
            context=context,
            kind=SpanKind.SERVER,
            attributes={"gen_ai.operation.name": "chat", "gen_ai.provider.name": _PROVIDER},
        )

    @staticmethod
    def request(span: trace.Span, chat: ChatRequest, served_model: str) -> None:
        """Name the span after the model and record the request's settings."""
        if not span.is_recording():
            return
        span.update_name(f"chat {served_model}")
        attributes: dict[str, Any] = {
            "gen_ai.request.model": chat.model,
            "gen_ai.request.stream": bool(chat.stream),
        }
        max_tokens = chat.max_new_tokens()
        if max_tokens is not None:
            attributes["gen_ai.request.max_tokens"] = max_tokens
        for key, value in (
            ("gen_ai.request.temperature", chat.temperature),
            ("gen_ai.request.top_p", chat.top_p),
            ("gen_ai.request.seed", chat.seed),
        ):
            if value is not None:
                attributes[key] = value
        span.set_attributes(attributes)

    @staticmethod
    def end(
        span: trace.Span,
        *,
        status: int,
        response_id: str | None = None,
        model: str | None = None,
        usage: Usage | None = None,
        finish_reason: str | None = None,
    ) -> None:
        """End the span with the HTTP status and what the reply said."""
        if span.is_recording():
            attributes: dict[str, Any] = {"http.response.status_code": status}
            if response_id:
                attributes["gen_ai.response.id"] = response_id
            if model:
                attributes["gen_ai.response.model"] = model
            if finish_reason:
                attributes["gen_ai.response.finish_reasons"] = [finish_reason]
            if usage is not None:
                attributes["gen_ai.usage.input_tokens"] = usage.prompt_tokens
                attributes["gen_ai.usage.output_tokens"] = usage.completion_tokens
                if usage.cached_tokens:
                    attributes["gen_ai.usage.cache_read.input_tokens"] = usage.cached_tokens
            if status >= 400:
                attributes["error.type"] = str(status)
                if status >= 500:
                    span.set_status(Status(StatusCode.ERROR, str(status)))
            span.set_attributes(attributes)
        span.end()
