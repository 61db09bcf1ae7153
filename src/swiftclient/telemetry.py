"""OpenTelemetry tracing and metrics for every call, on the OpenTelemetry API only.

:class:`Telemetry` subscribes to the attempt hook (:class:`~swiftclient.extend.AttemptObserver`)
and to the call's start and end; the call path never calls a tracer or a meter itself.
Names follow the OpenTelemetry GenAI semantic conventions (the version is pinned in
docs/telemetry.md):

- one span per call, ``chat {model}``: kind ``CLIENT`` for HTTP backends, ``INTERNAL`` for
  a backend that runs in this process (``in_process = True``, the local engine), with the
  request's settings, the response's id, model and finish reasons, token usage and
  ``error.type``;
- one child span per attempt, ``attempt {backend/model}``, with its number, trigger
  (first, retry, fallback, hedge), outcome (won, lost, cancelled, failed) and an event at
  its first token; hedges, fallbacks, retries and circuit-breaker decisions are events on
  the call span;
- the histograms ``gen_ai.client.operation.duration``, ``gen_ai.client.token.usage``,
  ``gen_ai.client.operation.time_to_first_chunk`` and
  ``gen_ai.client.operation.time_per_output_chunk`` with the conventions' bucket
  boundaries, and counters of retries, hedges sent and won, circuit-state changes and
  cached input tokens;
- with admission control (docs/rate-limits.md), the time each attempt waited for capacity:
  an event ``swiftclient.admission`` on the attempt's span and the histogram
  ``swiftclient.client.admission.wait``; and the counter ``swiftclient.client.throttled`` of
  responses answered 429 (with or without admission);
- a W3C ``traceparent`` (through the configured propagators) on every attempt's request,
  so a server that extracts it joins the caller's trace.

Nothing here needs an OpenTelemetry SDK. Without one, a call costs one non-recording span
start and nothing per chunk; attribute work only happens for a span that records, and
metric work only once a real ``MeterProvider`` is installed. Message contents are recorded
only on opt-in (``capture_content=True`` or
``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true``); API keys and headers never.
"""

from __future__ import annotations

import json
import math
import os
import time
import weakref
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlsplit

from opentelemetry import context as otel_context
from opentelemetry import metrics, propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from ._accounting import was_sent
from .backends.base import Backend
from .types import ChatCompletion

if TYPE_CHECKING:
    from ._attempt import AttemptResult, Target
    from ._stream import Call, CallRecord
    from .types import Message, Timing, ToolCall, Usage

__all__ = [
    "ADMISSION_WAIT_BUCKETS",
    "CAPTURE_CONTENT_ENV",
    "DURATION_BUCKETS",
    "SEMCONV_SCHEMA_URL",
    "SERVER_TPOT_BUCKETS",
    "SERVER_TTFT_BUCKETS",
    "TOKEN_BUCKETS",
    "Telemetry",
    "capture_content_from_env",
    "error_type",
    "provider_name",
]

SEMCONV_SCHEMA_URL: Final = "https://opentelemetry.io/schemas/1.42.0"
"""The schema URL the tracer and meter declare (see docs/telemetry.md for the version)."""
CAPTURE_CONTENT_ENV: Final = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"

DURATION_BUCKETS: Final = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
)  # fmt: skip
"""Seconds: operation duration, time to first chunk and time per output chunk."""
TOKEN_BUCKETS: Final = (
    1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864,
)  # fmt: skip
"""Tokens: ``gen_ai.client.token.usage``."""
SERVER_TTFT_BUCKETS: Final = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
)  # fmt: skip
"""Seconds: ``gen_ai.server.time_to_first_token``."""
SERVER_TPOT_BUCKETS: Final = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
)  # fmt: skip
"""Seconds: ``gen_ai.server.time_per_output_token``."""
ADMISSION_WAIT_BUCKETS: Final = (
    0.0, 0.001, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24,
    20.48, 40.96, 81.92,
)  # fmt: skip
"""Seconds: ``swiftclient.client.admission.wait`` (most calls wait not at all: 0 is a
bucket of its own)."""

_OPERATION = "chat"
_RECHECK_SECONDS = 1.0
_monotonic = time.monotonic
_current_span = trace.get_current_span
_current_context = otel_context.get_current


def _has_parent() -> bool:
    """Whether the current context holds a valid span (an empty context holds none, which
    is the common case without an SDK: checked first, a few calls less per call)."""
    return bool(_current_context()) and _current_span().get_span_context().is_valid


_LOCAL_PROVIDER = "swiftclient.local_engine"
_KNOWN_HOSTS = (
    ("openai.azure.com", "azure.ai.openai"),
    ("api.openai.com", "openai"),
    ("groq.com", "groq"),
    ("mistral.ai", "mistral_ai"),
    ("deepseek.com", "deepseek"),
    ("x.ai", "x_ai"),
    ("perplexity.ai", "perplexity"),
    ("anthropic.com", "anthropic"),
    ("generativelanguage.googleapis.com", "gcp.gemini"),
    ("aiplatform.googleapis.com", "gcp.vertex_ai"),
    ("moonshot.ai", "moonshot_ai"),
)
_DEFAULT_PORTS = {"http": 80, "https": 443}


def capture_content_from_env() -> bool:
    """True when ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` is ``true``."""
    return os.environ.get(CAPTURE_CONTENT_ENV, "").strip().lower() == "true"


def provider_name(backend: Backend) -> str:
    """``gen_ai.provider.name`` for ``backend``: its ``provider_name`` attribute when it has
    one, else the well-known name of its ``base_url``'s host, else ``openai`` (the API
    every swiftclient backend speaks)."""
    declared = getattr(backend, "provider_name", None)
    if isinstance(declared, str) and declared:
        return declared
    if getattr(backend, "in_process", False):
        return _LOCAL_PROVIDER
    host = (urlsplit(str(getattr(backend, "base_url", ""))).hostname or "").lower()
    for suffix, name in _KNOWN_HOSTS:
        if host == suffix or host.endswith("." + suffix):
            return name
    return "openai"


def error_type(exc: BaseException) -> str:
    """``error.type`` for ``exc``: the HTTP status for a status error, ``cancelled`` for a
    cancellation, else the exception's class name."""
    status = getattr(exc, "status_code", None)
    if isinstance(status, int):
        return str(status)
    name = type(exc).__name__
    if name in ("CancelledError", "Cancelled"):
        return "cancelled"
    return name


def _api_only(provider: object) -> bool:
    """Whether ``provider`` is one of the API package's own (the no-op one, or the proxy that
    waits for an SDK): those record nothing, so no work for them is worth doing."""
    module = type(provider).__module__
    return module.startswith(("opentelemetry.metrics", "opentelemetry.trace"))


class _TargetInfo:
    """What never changes for one target: span name, kind, static attributes."""

    __slots__ = ("attributes", "core", "kind", "name", "server")

    def __init__(self, target: Target, provider: str) -> None:
        backend = target.backend
        in_process = bool(getattr(backend, "in_process", False))
        self.kind = SpanKind.INTERNAL if in_process else SpanKind.CLIENT
        self.name = f"{_OPERATION} {target.model}"
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": _OPERATION,
            "gen_ai.provider.name": provider,
            "gen_ai.request.model": target.model,
        }
        self.server: dict[str, Any] = {}
        base_url = getattr(backend, "base_url", None)
        if not in_process and isinstance(base_url, str):
            parts = urlsplit(base_url)
            if parts.hostname:
                port = parts.port or _DEFAULT_PORTS.get(parts.scheme)
                self.server["server.address"] = parts.hostname
                if port is not None:
                    self.server["server.port"] = port
        self.core = dict(attributes)
        """The required attributes only: per-chunk samples carry these (with an SDK each
        attribute costs time on every sample)."""
        attributes.update(self.server)
        self.attributes = attributes


class _Instruments:
    """The client's metric instruments, created once per :class:`Telemetry` (the counters
    of attempts are named by their trigger)."""

    def __init__(self, meter: metrics.Meter) -> None:
        self.duration = meter.create_histogram(
            "gen_ai.client.operation.duration",
            unit="s",
            description="GenAI operation duration.",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self.tokens = meter.create_histogram(
            "gen_ai.client.token.usage",
            unit="{token}",
            description="Number of input and output tokens used.",
            explicit_bucket_boundaries_advisory=TOKEN_BUCKETS,
        )
        self.ttfc = meter.create_histogram(
            "gen_ai.client.operation.time_to_first_chunk",
            unit="s",
            description="Time from issuing the request to the first chunk of the response.",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self.tpoc = meter.create_histogram(
            "gen_ai.client.operation.time_per_output_chunk",
            unit="s",
            description="Time between consecutive output chunks after the first one.",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self.retry = meter.create_counter(
            "swiftclient.client.retries",
            unit="{attempt}",
            description="Attempts started as a retry of an earlier round.",
        )
        self.hedge = meter.create_counter(
            "swiftclient.client.hedges",
            unit="{attempt}",
            description="Attempts started as a hedge (another attempt was still running).",
        )
        self.hedges_won = meter.create_counter(
            "swiftclient.client.hedges_won",
            unit="{attempt}",
            description="Hedge attempts the call committed to.",
        )
        self.fallback = meter.create_counter(
            "swiftclient.client.fallbacks",
            unit="{attempt}",
            description="Attempts started because an earlier target failed.",
        )
        self.breaker = meter.create_counter(
            "swiftclient.client.circuit_breaker.transitions",
            unit="{transition}",
            description="Circuit-breaker state changes, by target and new state.",
        )
        self.cached = meter.create_counter(
            "swiftclient.client.cached_tokens",
            unit="{token}",
            description="Input tokens the provider served from its prompt cache.",
        )
        self.admission_wait = meter.create_histogram(
            "swiftclient.client.admission.wait",
            unit="s",
            description="Time an attempt waited for admission (rate limits) before sending.",
            explicit_bucket_boundaries_advisory=ADMISSION_WAIT_BUCKETS,
        )
        self.throttled = meter.create_counter(
            "swiftclient.client.throttled",
            unit="{response}",
            description="Responses answered 429 Too Many Requests, by target.",
        )


class Telemetry:
    """OpenTelemetry for an :class:`~swiftclient.AsyncClient` (see the module).

    Args:
        tracer_provider: where spans go; ``None``: the global provider (set by the
            application, never by this library).
        meter_provider: where metrics go; ``None``: the global provider.
        capture_content: record message contents (``gen_ai.input.messages``,
            ``gen_ai.output.messages``, ``gen_ai.system_instructions``) on call spans;
            ``None`` reads ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` whenever a
            recording span could carry them.
        provider_names: ``gen_ai.provider.name`` per backend name, overriding what is
            derived from each backend (:func:`provider_name`).
    """

    def __init__(
        self,
        *,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
        capture_content: bool | None = None,
        provider_names: Mapping[str, str] | None = None,
    ) -> None:
        from . import __version__

        self._capture_content = None if capture_content is None else bool(capture_content)
        self._provider_names = dict(provider_names or {})
        self.tracer = trace.get_tracer(
            "swiftclient", __version__, tracer_provider, schema_url=SEMCONV_SCHEMA_URL
        )
        meter = metrics.get_meter(
            "swiftclient", __version__, meter_provider, schema_url=SEMCONV_SCHEMA_URL
        )
        self.instruments = _Instruments(meter)
        self._tracer_provider = tracer_provider
        self._meter_provider = meter_provider
        self._tracing = tracer_provider is not None and not _api_only(tracer_provider)
        self._metering = meter_provider is not None and not _api_only(meter_provider)
        self._recheck_at = -math.inf
        self._targets: weakref.WeakKeyDictionary[Backend, dict[tuple[str, str | None], _TargetInfo]]
        self._targets = weakref.WeakKeyDictionary()

    _default: Telemetry | None = None

    @classmethod
    def default(cls) -> Telemetry:
        """The shared instance clients use unless given one: the global providers, content
        capture from the environment. (Every ``Telemetry`` asks the API for a meter and
        instruments, which the API keeps for ever while no SDK is installed: clients made
        by the thousand share this one instead.)"""
        if cls._default is None:
            cls._default = cls()
        return cls._default

    @property
    def capture_content(self) -> bool:
        """Whether message contents are recorded: the flag given, else
        ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` now."""
        flag = self._capture_content
        return capture_content_from_env() if flag is None else flag

    def __repr__(self) -> str:
        return f"Telemetry(capture_content={self._capture_content})"

    # ------------------------------------------------------------------ per call

    def _refresh(self) -> None:
        """Look again, at most once a second, whether the global providers are real (an
        application may install an SDK after creating the client); asking the API for the
        global providers on every call would cost more than the rest of this module."""
        now = _monotonic()
        if now < self._recheck_at:
            return
        self._recheck_at = now + _RECHECK_SECONDS
        if self._tracer_provider is None:
            self._tracing = not _api_only(trace.get_tracer_provider())
        if self._meter_provider is None:
            self._metering = not _api_only(metrics.get_meter_provider())

    def metrics_enabled(self) -> bool:
        """Whether recording metrics does anything (a real ``MeterProvider`` is in use)."""
        self._refresh()
        return self._metering

    def _info(self, target: Target) -> _TargetInfo:
        """The target's static span data, built once per (backend, model, name)."""
        backend = target.backend
        try:
            infos = self._targets.get(backend)
            if infos is None:
                infos = self._targets[backend] = {}
        except TypeError:  # a backend that is not hashable or weak-referenceable
            infos = {}
        key = (target.model, target.alias)
        info = infos.get(key)
        if info is None:
            name = self._provider_names.get(target.backend_name)
            info = _TargetInfo(target, name or provider_name(backend))
            if len(infos) >= 256:  # model strings come from callers: stay bounded
                infos.clear()
            infos[key] = info
        return info

    def start(self, call: Call) -> CallTrace | None:
        """The call begins: start its span. Returns the call's observer, or None when there
        is nothing to record and no trace context to propagate."""
        if _monotonic() >= self._recheck_at:
            self._refresh()
        metered = self._metering
        if not (self._tracing or metered or _has_parent()):
            return None  # no SDK, and no trace context to pass on: nothing to do
        info = self._info(call.targets[0])
        span = self.tracer.start_span(info.name, kind=info.kind, attributes=info.attributes)
        recording = span.is_recording()
        if not (recording or metered or span.get_span_context().is_valid):
            return None
        trace_ = CallTrace(self, span, info, recording, metered)
        if recording:
            trace_.request_attributes(call)
        return trace_

    def breaker_changed(self, attempt: AttemptResult, old: str, new: str) -> None:
        """A target's circuit breaker changed state after ``attempt`` ended."""
        if self.metrics_enabled():
            self.instruments.breaker.add(
                1, {"swiftclient.target": attempt.target.name, "swiftclient.breaker.state": new}
            )
        trace_ = attempt.call_trace
        if isinstance(trace_, CallTrace) and trace_.recording:
            trace_.span.add_event(
                "swiftclient.breaker.transition",
                {"swiftclient.target": attempt.target.name, "from": old, "to": new},
            )


class CallTrace:
    """One call's span, its attempts' spans and its metrics; an attempt observer."""

    __slots__ = ("_attempts", "_info", "_telemetry", "metered", "recording", "span")

    def __init__(
        self,
        telemetry: Telemetry,
        span: trace.Span,
        info: _TargetInfo,
        recording: bool,
        metered: bool,
    ) -> None:
        self._telemetry = telemetry
        self._info = info
        self.span = span
        self.recording = recording
        self.metered = metered
        self._attempts: dict[int, trace.Span] = {}

    # ------------------------------------------------------------------ call span

    def request_attributes(self, call: Call) -> None:
        """Set the request's settings (and, on opt-in, its messages) on the call span."""
        request = call.request
        span = self.span
        attributes: dict[str, Any] = {}
        max_tokens = request.max_completion_tokens or request.max_tokens
        if max_tokens is not None:
            attributes["gen_ai.request.max_tokens"] = max_tokens
        for key, value in (
            ("gen_ai.request.temperature", request.temperature),
            ("gen_ai.request.top_p", request.top_p),
            ("gen_ai.request.seed", request.seed),
            ("gen_ai.request.presence_penalty", request.presence_penalty),
            ("gen_ai.request.frequency_penalty", request.frequency_penalty),
        ):
            if value is not None:
                attributes[key] = value
        stop = request.stop
        if stop is not None:
            attributes["gen_ai.request.stop_sequences"] = [stop] if isinstance(stop, str) else stop
        if request.n is not None and request.n != 1:
            attributes["gen_ai.request.choice.count"] = request.n
        if request.response_format is not None:
            attributes["gen_ai.output.type"] = (
                "text" if request.response_format.type == "text" else "json"
            )
        if len(call.targets) > 1:
            attributes["swiftclient.targets"] = [t.name for t in call.targets]
        if self._telemetry.capture_content:
            system, messages = _input_messages(request.messages)
            if system:
                attributes["gen_ai.system_instructions"] = json.dumps(system)
            attributes["gen_ai.input.messages"] = json.dumps(messages)
        span.set_attributes(attributes)

    def hedge_refused(self) -> None:
        """An event: a hedge was due, but the hedge budget or the retry throttle said no."""
        if self.recording:
            self.span.add_event("swiftclient.hedge.refused")

    def admitted(self, attempt: AttemptResult, waited: float, refused: bool) -> None:
        """An event on the attempt's span and a histogram sample: the seconds ``attempt``
        waited for admission, and whether it was let through or ``refused``."""
        outcome = "refused" if refused else "admitted"
        span = self._attempts.get(attempt.number)
        if span is not None:
            span.add_event(
                "swiftclient.admission",
                {"swiftclient.admission.wait": waited, "swiftclient.admission.outcome": outcome},
            )
        if self.metered:
            self._telemetry.instruments.admission_wait.record(
                waited,
                {
                    "swiftclient.target": attempt.target.name,
                    "swiftclient.admission.outcome": outcome,
                },
            )

    def skipped(self, targets: Sequence[Target]) -> None:
        """Targets left out of a round because their circuit breaker is open."""
        if self.recording:
            self.span.add_event(
                "swiftclient.breaker.skip", {"swiftclient.targets": [t.name for t in targets]}
            )

    def end(self, record: CallRecord) -> None:
        """The call finished (once): close its span and record its metrics."""
        timing = record.timing
        winner = record.winner
        usage = winner.usage if winner is not None else None
        reply: Any = record.reply  # a completion, the stream's accumulator, or None
        model = reply.model if reply is not None else None
        span = self.span
        exc = record.error
        error = None if exc is None else error_type(exc)
        if self.recording:
            attributes: dict[str, Any] = {
                "swiftclient.attempts": len(timing.attempts),
                "gen_ai.request.stream": record.streamed,
            }
            if reply is not None:
                completion = reply if isinstance(reply, ChatCompletion) else None
                if reply.id:
                    attributes["gen_ai.response.id"] = reply.id
                if model:
                    attributes["gen_ai.response.model"] = model
                reasons = (
                    reply.finish_reasons()
                    if completion is None
                    else [c.finish_reason for c in completion.choices if c.finish_reason]
                )
                if reasons:
                    attributes["gen_ai.response.finish_reasons"] = reasons
                if self._telemetry.capture_content:
                    messages = output_messages(completion or reply.build())
                    attributes["gen_ai.output.messages"] = json.dumps(messages)
            if usage is not None:
                attributes.update(_usage_attributes(usage))
            if timing.ttft is not None:
                attributes["gen_ai.response.time_to_first_chunk"] = timing.ttft
            if winner is not None and len(record.targets) > 1:
                attributes["swiftclient.target"] = winner.target.name
            if error is not None:
                attributes["error.type"] = error
                span.set_status(Status(StatusCode.ERROR, error))
            span.set_attributes(attributes)
        span.end()
        if self.metered:
            self._record(timing, error, usage, model)

    def _record(
        self, timing: Timing, error: str | None, usage: Usage | None, model: str | None
    ) -> None:
        instruments = self._telemetry.instruments
        attributes: dict[str, Any] = self._info.attributes
        if model or error is not None:
            attributes = dict(attributes)
            if model:
                attributes["gen_ai.response.model"] = model
            if error is not None:
                attributes["error.type"] = error
        if timing.total is not None:
            instruments.duration.record(timing.total, attributes)
        if usage is not None:
            tokens = instruments.tokens
            tokens.record(usage.prompt_tokens, {**attributes, "gen_ai.token.type": "input"})
            tokens.record(usage.completion_tokens, {**attributes, "gen_ai.token.type": "output"})
            cached = usage.cached_tokens
            if cached:
                instruments.cached.add(cached, attributes)
        if timing.ttft is not None:
            instruments.ttfc.record(timing.ttft, attributes)
            record = instruments.tpoc.record
            core = self._info.core
            for gap in timing.itl:
                record(gap, core)

    # ------------------------------------------------------------------ AttemptObserver

    def on_start(self, attempt: AttemptResult) -> None:
        """Start the attempt's span (its context goes out through :meth:`headers_for`)."""
        trigger = attempt.trigger
        target = attempt.target
        parent = self.span
        if self.recording:
            if trigger != "first":
                parent.add_event(
                    f"swiftclient.{trigger}",
                    {"swiftclient.attempt": attempt.number, "swiftclient.target": target.name},
                )
            info = self._telemetry._info(target)
            attributes = dict(info.attributes)
            attributes["swiftclient.attempt"] = attempt.number
            attributes["swiftclient.trigger"] = trigger
            attributes["swiftclient.target"] = target.name
            span = self._telemetry.tracer.start_span(
                f"attempt {target.name}",
                context=trace.set_span_in_context(parent),
                kind=info.kind,
                attributes=attributes,
            )
            self._attempts[attempt.number] = span

    def headers_for(self, attempt: AttemptResult) -> dict[str, str]:
        """The trace context for ``attempt``'s request: its span's, else the call's."""
        carrier: dict[str, str] = {}
        span = self._attempts.get(attempt.number, self.span)
        propagate.inject(carrier, context=trace.set_span_in_context(span))
        return carrier

    def on_first_token(self, attempt: AttemptResult) -> None:
        """An event on the attempt's span, with its time to first token."""
        span = self._attempts.get(attempt.number)
        if span is not None:
            span.add_event("swiftclient.first_token", {"swiftclient.ttft": attempt.ttft or 0.0})

    def on_commit(self, attempt: AttemptResult) -> None:
        """Count a hedge that won (the call keeps which attempt won)."""
        if self.metered and attempt.trigger == "hedge":
            self._telemetry.instruments.hedges_won.add(
                1, {"swiftclient.target": attempt.target.name}
            )

    def on_end(self, attempt: AttemptResult) -> None:
        """End the attempt's span with its outcome; count a 429, and a retry, hedge or
        fallback that was sent (one admission refused never left the client)."""
        error = attempt.error
        if self.metered:
            if error is not None and getattr(error, "status_code", None) == 429:
                self._telemetry.instruments.throttled.add(
                    1, {"swiftclient.target": attempt.target.name}
                )
            trigger = attempt.trigger
            if trigger != "first" and was_sent(attempt):  # its counter: retry, hedge, fallback
                counter = getattr(self._telemetry.instruments, trigger)
                counter.add(1, {"swiftclient.target": attempt.target.name})
        span = self._attempts.pop(attempt.number, None)
        if span is None:
            return
        outcome = attempt.outcome
        attributes: dict[str, Any] = {"swiftclient.outcome": outcome}
        ttft = attempt.ttft
        if ttft is not None and attempt.streamed:  # a whole reply's time is not a chunk's
            attributes["gen_ai.response.time_to_first_chunk"] = ttft
        if attempt.usage is not None:
            attributes.update(_usage_attributes(attempt.usage))
        if outcome == "failed" and error is not None:
            kind = error_type(error)
            attributes["error.type"] = kind
            span.set_status(Status(StatusCode.ERROR, kind))
        span.set_attributes(attributes)
        span.end()


def _usage_attributes(usage: Usage) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "gen_ai.usage.input_tokens": usage.prompt_tokens,
        "gen_ai.usage.output_tokens": usage.completion_tokens,
    }
    cached = usage.cached_tokens
    if cached:
        attributes["gen_ai.usage.cache_read.input_tokens"] = cached
    return attributes


def _parts(content: object) -> list[dict[str, Any]]:
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "content": content}]
    parts: list[dict[str, Any]] = []
    for part in content:  # type: ignore[attr-defined]
        text = getattr(part, "text", None)
        if isinstance(text, str):
            parts.append({"type": "text", "content": text})
        else:
            parts.append({"type": str(getattr(part, "type", "unknown"))})
    return parts


def _tool_call_parts(calls: Sequence[ToolCall] | None) -> list[dict[str, Any]]:
    return [
        {
            "type": "tool_call",
            "id": c.id,
            "name": c.function.name,
            "arguments": c.function.arguments,
        }
        for c in calls or ()
    ]


def _input_messages(
    messages: Sequence[Message],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(system instructions, input messages)`` in the conventions' JSON shape."""
    system: list[dict[str, Any]] = []
    out: list[dict[str, Any]] = []
    for message in messages:
        parts = _parts(message.content)
        if message.role in ("system", "developer"):
            system.extend(parts)
            continue
        parts.extend(_tool_call_parts(message.tool_calls))
        if message.role == "tool":
            parts = [
                {
                    "type": "tool_call_response",
                    "id": message.tool_call_id,
                    "result": p.get("content"),
                }
                for p in parts
            ]
        out.append({"role": message.role, "parts": parts})
    return system, out


def output_messages(completion: ChatCompletion) -> list[dict[str, Any]]:
    """A completion's choices in the conventions' ``gen_ai.output.messages`` shape."""
    out: list[dict[str, Any]] = []
    for choice in completion.choices:
        message = choice.message
        parts = _parts(message.content)
        parts.extend(_tool_call_parts(message.tool_calls))
        out.append({"role": "assistant", "parts": parts, "finish_reason": choice.finish_reason})
    return out
