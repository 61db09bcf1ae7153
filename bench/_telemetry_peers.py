"""swiftclient with and without telemetry, for the telemetry rows of client_overhead.py.

Three configurations over the same in-process mock transport as part 1:

- ``telemetry off``: ``AsyncClient(..., telemetry=None)``;
- ``no SDK``: the default ``Telemetry()`` on the global providers, with no OpenTelemetry SDK
  configured (the API's own no-op proxies: what a user without an SDK runs);
- ``SDK, no-op exporter``: an SDK ``TracerProvider`` with a synchronous span processor and
  an exporter that drops every span, and an SDK ``MeterProvider`` whose reader is never
  collected: the whole cost of recording, none of exporting.
"""

from __future__ import annotations

from collections.abc import Sequence

from _canned import MODEL
from _cpu_peers import API_KEY, BASE_URL, Mode, SwiftPeer, _httpx_transport
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from swiftclient import AsyncClient, HTTPBackend, Telemetry

__all__ = ["CONFIGS", "NoOpExporter", "start_cost", "telemetry_calls", "telemetry_peers"]

CONFIGS = ("telemetry off", "no SDK", "SDK, no-op exporter")


class NoOpExporter(SpanExporter):
    """Drops every span."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Accept and forget."""
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        """Nothing to release."""


def _sdk_telemetry() -> Telemetry:
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(NoOpExporter()))
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    return Telemetry(tracer_provider=tracer_provider, meter_provider=meter_provider)


class _Peer(SwiftPeer):
    def __init__(self, mode: Mode, name: str, telemetry: Telemetry | None) -> None:
        backend = HTTPBackend(BASE_URL, API_KEY, transport=_httpx_transport(mode))
        self._client = AsyncClient(backend, model=MODEL, telemetry=telemetry)
        self._mode = mode
        self.name = name


def telemetry_peers(mode: Mode) -> list[SwiftPeer]:
    """One swiftclient peer per configuration in :data:`CONFIGS`."""
    return [
        _Peer(mode, CONFIGS[0], None),
        _Peer(mode, CONFIGS[1], Telemetry()),
        _Peer(mode, CONFIGS[2], _sdk_telemetry()),
    ]


async def start_cost(iterations: int) -> tuple[float, float]:
    """Seconds per call that telemetry adds to starting a call, without an SDK: building and
    beginning a one-target call with the default ``Telemetry()`` against the same with none
    (timed over ``iterations`` calls each, best of five), as ``(with, without)``."""
    import time

    from swiftclient import RetryPolicy, Timeout
    from swiftclient._stream import Call
    from swiftclient.extend import Deadline, Target
    from swiftclient.types import ChatRequest, Message

    backend = HTTPBackend(BASE_URL, API_KEY, transport=_httpx_transport("request"))
    request = ChatRequest(model=MODEL, messages=[Message(role="user", content="hi")])
    targets = [Target(backend, MODEL, "http")]
    deadline = Deadline(Timeout())
    policy = RetryPolicy()
    telemetry = Telemetry()

    def best(tracer: Telemetry | None) -> float:
        times = []
        for _ in range(5):
            start = time.process_time()
            for _ in range(iterations):
                Call(
                    targets,
                    request,
                    deadline,
                    policy,
                    call_id="bench",
                    streamed=True,
                    tracer=tracer,
                ).begin()
            times.append((time.process_time() - start) / iterations)
        return min(times)

    without = best(None)
    with_ = best(telemetry)
    return with_, without


async def telemetry_calls(peer: SwiftPeer) -> int:
    """Python function calls made into ``swiftclient/telemetry.py`` during one ``peer.run()``
    (a deterministic count, unlike CPU time: it shows whether anything runs per chunk)."""
    import sys
    from types import FrameType

    count = 0

    def profile(frame: FrameType, event: str, arg: object) -> None:
        nonlocal count
        if event == "call" and frame.f_code.co_filename.endswith("swiftclient/telemetry.py"):
            count += 1

    sys.setprofile(profile)
    try:
        await peer.run()
    finally:
        sys.setprofile(None)
    return count
