"""In-memory OpenTelemetry SDK providers for the telemetry tests (never the global ones)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from swiftclient import Telemetry


@dataclass
class Otel:
    """An SDK tracer and meter provider recording in memory."""

    spans: InMemorySpanExporter
    reader: InMemoryMetricReader
    tracer_provider: TracerProvider
    meter_provider: MeterProvider

    def telemetry(self, **kwargs: Any) -> Telemetry:
        return Telemetry(
            tracer_provider=self.tracer_provider, meter_provider=self.meter_provider, **kwargs
        )

    def finished(self) -> list[ReadableSpan]:
        return list(self.spans.get_finished_spans())

    def call_span(self) -> ReadableSpan:
        (span,) = [s for s in self.finished() if s.name.startswith("chat ")]
        return span

    def attempt_spans(self) -> list[ReadableSpan]:
        spans = [s for s in self.finished() if s.name.startswith("attempt ")]
        return sorted(spans, key=lambda s: s.attributes["swiftclient.attempt"])  # type: ignore[arg-type,index,return-value]

    def metrics(self) -> dict[str, Any]:
        data = self.reader.get_metrics_data()
        out: dict[str, Any] = {}
        if data is None:
            return out
        for resource in data.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    out[metric.name] = metric
        return out


def recording() -> Iterator[Otel]:
    """Yield fresh in-memory providers, shut down afterwards (a fixture's body)."""
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    yield Otel(spans, reader, tracer_provider, meter_provider)
    tracer_provider.shutdown()
    meter_provider.shutdown()


def attrs(span: ReadableSpan) -> dict[str, Any]:
    """A span's attributes as a plain dict."""
    return dict(span.attributes or {})


def points(metric: Any) -> list[Any]:
    """A metric's data points."""
    return list(metric.data.data_points)
