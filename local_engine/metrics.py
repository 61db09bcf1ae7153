"""Engine metrics: OpenTelemetry instruments and a Prometheus registry, fed by the driver.

:class:`EngineStats` is told of each request the :class:`~local_engine.async_engine.AsyncEngine`
adds (``on_add``), of each step's outputs and duration (``on_step``) and of each request
it lets go (``on_release``). From those it records

- ``gen_ai.server.time_to_first_token``, ``gen_ai.server.time_per_output_token`` and
  ``gen_ai.server.request.duration`` (the GenAI conventions' names and buckets);
- the engine step's duration, prompt / cached-prompt / generated token counters;

and it reads the engine live when metrics are collected: waiting and running requests, KV
blocks used and free, the prefix-cache hit ratio (cached prompt tokens over prompt tokens,
since start) and generation throughput over the last ten seconds.

Every sample goes two ways: to OpenTelemetry instruments on the given (or global)
``MeterProvider``, and to a ``prometheus_client`` registry of this object's own, which the
local server renders at ``GET /metrics`` (:meth:`EngineStats.render`). No torch here; the
per-step cost is a few dictionary operations and one histogram sample per request event.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Protocol

import prometheus_client
from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

from swiftclient.telemetry import (
    DURATION_BUCKETS,
    SEMCONV_SCHEMA_URL,
    SERVER_TPOT_BUCKETS,
    SERVER_TTFT_BUCKETS,
)

if TYPE_CHECKING:
    from local_engine.engine import RequestOutput

__all__ = ["PROMETHEUS_CONTENT_TYPE", "EngineStats", "EngineView", "StepObserver"]

PROMETHEUS_CONTENT_TYPE = prometheus_client.CONTENT_TYPE_LATEST
STEP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
"""Seconds: one engine step (a batch of prefill and decode rows)."""
THROUGHPUT_WINDOW = 10.0
"""Seconds of history behind the tokens-per-second gauge."""
_PROVIDER = "swiftclient.local_engine"


class EngineView(Protocol):
    """What the gauges read of the engine (``local_engine.engine.Engine`` is one)."""

    @property
    def num_waiting(self) -> int:
        """Requests queued for admission."""
        ...

    @property
    def num_running(self) -> int:
        """Requests holding KV blocks."""
        ...

    @property
    def num_blocks(self) -> int:
        """KV blocks in the pool."""
        ...

    def num_free_blocks(self) -> int:
        """KV blocks available to new work."""
        ...


class StepObserver(Protocol):
    """The driver's stats hook (:class:`EngineStats` is one)."""

    def on_add(self, request_id: str, now: float) -> None:
        """A request was added to the engine."""
        ...

    def on_step(self, outputs: Sequence[RequestOutput], seconds: float, now: float) -> None:
        """A step ran for ``seconds`` and produced ``outputs``."""
        ...

    def on_release(self, request_id: str) -> None:
        """The request's stream closed (finished or aborted)."""
        ...


def _prometheus_name(name: str) -> str:
    return name.replace(".", "_")


class _Histogram:
    """One histogram, both as an OpenTelemetry instrument (seconds) and in Prometheus
    (``..._seconds``)."""

    __slots__ = ("_otel", "_prometheus")

    def __init__(
        self,
        meter: metrics.Meter,
        registry: prometheus_client.CollectorRegistry,
        name: str,
        description: str,
        buckets: Sequence[float],
    ) -> None:
        self._otel = meter.create_histogram(
            name, unit="s", description=description, explicit_bucket_boundaries_advisory=buckets
        )
        self._prometheus = prometheus_client.Histogram(
            _prometheus_name(name) + "_seconds", description, buckets=buckets, registry=registry
        )

    def record(self, value: float, attributes: dict[str, str] | None = None) -> None:
        """Add one sample to both."""
        self._otel.record(value, attributes)
        self._prometheus.observe(value)


class _Counter:
    """One token counter, both as an OpenTelemetry instrument and in Prometheus
    (``..._total``)."""

    __slots__ = ("_otel", "_prometheus")

    def __init__(
        self,
        meter: metrics.Meter,
        registry: prometheus_client.CollectorRegistry,
        name: str,
        description: str,
    ) -> None:
        self._otel = meter.create_counter(name, unit="{token}", description=description)
        self._prometheus = prometheus_client.Counter(
            _prometheus_name(name), description, registry=registry
        )

    def add(self, amount: int) -> None:
        """Add ``amount`` to both."""
        self._otel.add(amount)
        self._prometheus.inc(amount)


class _Request:
    __slots__ = ("arrived", "first_at")

    def __init__(self, arrived: float) -> None:
        self.arrived = arrived
        self.first_at: float | None = None


class EngineStats:
    """Engine metrics for one served model (see the module).

    Args:
        meter_provider: where the OpenTelemetry instruments go (``None``: the global one).
        model: ``gen_ai.request.model`` on the GenAI histograms.
        clock: seconds, monotonic (the driver passes its own ``now`` to the hooks).
    """

    def __init__(
        self,
        *,
        meter_provider: metrics.MeterProvider | None = None,
        model: str = "local",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.engine: EngineView | None = None
        """The engine the gauges read (set by the driver; None: nothing to report)."""
        self._clock = clock
        self._live: dict[str, _Request] = {}
        self._recent: deque[tuple[float, int]] = deque()
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.generated_tokens = 0
        self._attributes = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": _PROVIDER,
            "gen_ai.request.model": model,
        }
        self.registry = prometheus_client.CollectorRegistry(auto_describe=True)
        meter = metrics.get_meter("local_engine", "", meter_provider, SEMCONV_SCHEMA_URL)
        self._instruments(meter, self.registry)

    # ------------------------------------------------------------------ instruments

    def _instruments(
        self, meter: metrics.Meter, registry: prometheus_client.CollectorRegistry
    ) -> None:
        def histogram(name: str, description: str, buckets: Sequence[float]) -> _Histogram:
            return _Histogram(meter, registry, name, description, buckets)

        def counter(name: str, description: str) -> _Counter:
            return _Counter(meter, registry, name, description)

        self._ttft = histogram(
            "gen_ai.server.time_to_first_token",
            "Time to generate the first token, queueing and prefill included.",
            SERVER_TTFT_BUCKETS,
        )
        self._tpot = histogram(
            "gen_ai.server.time_per_output_token",
            "Time per output token after the first, for each finished request.",
            SERVER_TPOT_BUCKETS,
        )
        self._duration = histogram(
            "gen_ai.server.request.duration",
            "Time from a request's arrival at the engine to its last token.",
            DURATION_BUCKETS,
        )
        self._step = histogram(
            "swiftclient.engine.step.duration", "Duration of one engine step.", STEP_BUCKETS
        )
        self._prompt_counter = counter("swiftclient.engine.prompt_tokens", "Prompt tokens.")
        self._cached_counter = counter(
            "swiftclient.engine.cached_prompt_tokens",
            "Prompt tokens whose KV came from the prefix cache.",
        )
        self._generated_counter = counter(
            "swiftclient.engine.generation_tokens", "Tokens generated."
        )
        for name, unit, description, read in (
            ("swiftclient.engine.requests.waiting", "{request}", "Queued requests.", self._waiting),
            (
                "swiftclient.engine.requests.running",
                "{request}",
                "Running requests.",
                self._running,
            ),
            ("swiftclient.engine.kv_cache.blocks", "{block}", "KV blocks by state.", self._blocks),
            ("swiftclient.engine.prefix_cache.hit_ratio", "1", "Cached / prompt.", self._hits),
            ("swiftclient.engine.generation_throughput", "{token}/s", "Tokens/s.", self._rate),
        ):
            meter.create_observable_gauge(name, [read], unit=unit, description=description)
        gauge = prometheus_client.Gauge
        gauge(
            "swiftclient_engine_requests_waiting", "Queued requests.", registry=registry
        ).set_function(lambda: self._read(lambda e: e.num_waiting))
        gauge(
            "swiftclient_engine_requests_running", "Running requests.", registry=registry
        ).set_function(lambda: self._read(lambda e: e.num_running))
        blocks = gauge(
            "swiftclient_engine_kv_cache_blocks",
            "KV blocks by state.",
            ["state"],
            registry=registry,
        )
        blocks.labels("free").set_function(lambda: self._read(lambda e: e.num_free_blocks()))
        blocks.labels("used").set_function(
            lambda: self._read(lambda e: e.num_blocks - e.num_free_blocks())
        )
        gauge(
            "swiftclient_engine_prefix_cache_hit_ratio",
            "Cached prompt tokens over prompt tokens since start.",
            registry=registry,
        ).set_function(self.hit_ratio)
        gauge(
            "swiftclient_engine_generation_tokens_per_second",
            f"Tokens generated per second over the last {THROUGHPUT_WINDOW:g} s.",
            registry=registry,
        ).set_function(self.throughput)

    # ------------------------------------------------------------------ readings

    def _read(self, read: Callable[[EngineView], int]) -> float:
        engine = self.engine
        return 0.0 if engine is None else float(read(engine))

    def hit_ratio(self) -> float:
        """Cached prompt tokens over prompt tokens since start (0 before any prompt)."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def throughput(self) -> float:
        """Tokens generated per second over the last :data:`THROUGHPUT_WINDOW` seconds."""
        self._expire(self._clock())
        return sum(n for _, n in self._recent) / THROUGHPUT_WINDOW

    def _expire(self, now: float) -> None:
        recent = self._recent
        while recent and recent[0][0] < now - THROUGHPUT_WINDOW:
            recent.popleft()

    def _observe(
        self, value: float | None, attributes: dict[str, str] | None = None
    ) -> list[Observation]:
        return [] if value is None else [Observation(value, attributes)]

    def _waiting(self, options: CallbackOptions) -> Iterable[Observation]:
        engine = self.engine
        return self._observe(None if engine is None else engine.num_waiting)

    def _running(self, options: CallbackOptions) -> Iterable[Observation]:
        engine = self.engine
        return self._observe(None if engine is None else engine.num_running)

    def _blocks(self, options: CallbackOptions) -> Iterable[Observation]:
        engine = self.engine
        if engine is None:
            return []
        free = engine.num_free_blocks()
        return [
            Observation(free, {"swiftclient.kv_cache.state": "free"}),
            Observation(engine.num_blocks - free, {"swiftclient.kv_cache.state": "used"}),
        ]

    def _hits(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(self.hit_ratio())]

    def _rate(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(self.throughput())]

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return prometheus_client.generate_latest(self.registry)

    # ------------------------------------------------------------------ driver hooks

    def on_add(self, request_id: str, now: float) -> None:
        """A request entered the engine at ``now``."""
        self._live[request_id] = _Request(now)

    def on_step(self, outputs: Sequence[RequestOutput], seconds: float, now: float) -> None:
        """Record a step: its duration, the tokens it made, first tokens and finishes."""
        self._step.record(seconds)
        generated = 0
        live = self._live
        attributes = self._attributes
        for out in outputs:
            generated += len(out.new_token_ids)
            request = live.get(out.request_id)
            if request is None:
                continue
            if request.first_at is None:
                request.first_at = now
                ttft = now - request.arrived
                self._ttft.record(ttft, attributes)
                self._prompt(out.num_prompt_tokens, out.num_cached_tokens)
            if out.finished:
                del live[out.request_id]
                duration = now - request.arrived
                self._duration.record(duration, attributes)
                if out.num_generated_tokens > 1:
                    tpot = (now - request.first_at) / (out.num_generated_tokens - 1)
                    self._tpot.record(tpot, attributes)
        if generated:
            self.generated_tokens += generated
            self._generated_counter.add(generated)
            self._recent.append((now, generated))
            self._expire(now)

    def _prompt(self, prompt: int, cached: int) -> None:
        self.prompt_tokens += prompt
        self.cached_tokens += cached
        self._prompt_counter.add(prompt)
        if cached:
            self._cached_counter.add(cached)

    def on_release(self, request_id: str) -> None:
        """The request's stream closed: forget it (an aborted request records no finish)."""
        self._live.pop(request_id, None)
