"""LocalBackend: the bundled inference engine behind swiftclient's Backend seam.

It speaks only swiftclient's public contract (the Backend protocol, ``Deadline``,
``RequestOptions``, types and errors); swiftclient finds it through the ``swiftclient.backends``
entry point (``SWIFTCLIENT_PROVIDER=local``) and never imports this package. The engine (and
with it torch) is imported only when the backend loads its model, so ``import local_engine``
and constructing a ``LocalBackend`` stay light. The model is loaded in a
worker thread when the backend is entered (``async with AsyncClient(LocalBackend(...))``) or
warmed up; the engine's driver task runs inside that ``async with`` block.

The engine raises its own errors (:mod:`local_engine.errors`); this adapter maps them once
onto swiftclient's: a refused request (``InvalidRequestError``) is ``BadRequestError`` (400,
as over HTTP), a full queue ``OverloadedError``, an engine failure ``EngineError``, bad
settings or model files ``ConfigurationError``. Loading the model applies the engine
config's process-wide settings (CPU threads, malloc) once
(:func:`local_engine.process.apply_process_settings`).

Request mapping (prompt, sampling parameters, ``extra_body`` keys, the prefix-cache salt) is
described in :mod:`local_engine.service`; in short: ``extra_body`` may carry ``top_k``,
``min_p``, ``ignore_eos``, ``stop_token_ids``, ``cache_salt`` and ``chat_template_kwargs``, and
the cache salt is ``extra_body["cache_salt"]``, else ``user``, so that different tenants never
share cached prompt blocks (``prompt_cache_key`` is ignored).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Literal

import anyio
import anyio.lowlevel
import anyio.to_thread

from local_engine.errors import (
    EngineConfigError,
    EngineError,
    InvalidRequestError,
    OverloadedError,
)
from swiftclient import errors
from swiftclient.backends import check_backend_name
from swiftclient.extend import Deadline, RequestOptions
from swiftclient.types import ChatCompletion, ChatCompletionChunk, ChatRequest
from swiftclient.wire import listed_names

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider

    from local_engine.async_engine import AsyncEngine
    from local_engine.engine import Engine, EngineConfig
    from local_engine.metrics import EngineStats
    from local_engine.service import ChatService

__all__ = ["LocalBackend"]

_NOT_RUNNING = (
    "LocalBackend {name!r} is not running: use it inside `async with AsyncClient(backend) as "
    "client:` (or `async with backend:`), which loads the model and starts the engine"
)


def _name_ignored(request: ChatRequest, options: RequestOptions | None) -> None:
    """Name the ``extra_body`` keys the engine does not read to the call, as the engine's
    HTTP server names them in its ``x-ignored-fields`` header: the call's attempt keeps the
    header (``Attempt.headers``) and the SDK transports hand it on, so a field is named the
    same in-process and over HTTP."""
    if options is None or options.on_response is None or not request.extra_body:
        return
    from local_engine.service import unread_keys  # loaded with the engine

    ignored = unread_keys(request.extra_body)
    if ignored:
        # no HTTP status: admission learns from an in-process call what it did before
        options.on_response(None, {"x-ignored-fields": listed_names(sorted(ignored))})


class LocalBackend:
    """Chat completions from a model run in this process by the bundled engine.

    Args:
        model: a Hugging Face model directory (``config.json``, safetensors weights,
            ``tokenizer.json``), ``None``, ``"default"`` or ``"swift-tiny"`` for the trained
            embedded default model (shipped in the package; see docs/local-engine.md for what
            it can do), or ``"swift-tiny-random"`` / ``"swift-50m"`` for generated random-weight
            models that exercise the pipeline and write gibberish.
        name: the backend's name in model strings and errors.
        engine_config: KV cache size, batching limits, ``max_model_len``, dtype, device, CPU
            threads (``num_threads``). The engine's threads sleep when idle rather than spin
            (``OMP_WAIT_POLICY=PASSIVE``, set when ``local_engine`` is first imported unless
            the environment sets a wait policy; see docs/local-engine.md).
        quantization: ``"int8"`` for int8 weights (per-channel scales, quantized at load
            time), ``"int4"`` for 4-bit weights (a scale per 32 values; half of int8's bytes),
            ``"fp8"`` for fp8 weights (CUDA GPUs with compute capability 8.9+); overrides
            ``engine_config.quantization`` when given.
        default_max_tokens: the completion limit of requests that set none (capped by the
            room the model's context leaves).
        chat_template: a template source (or a named template) overriding the tokenizer's.
        tool_format: ``"hermes"``, ``"llama3"`` or ``"none"``, overriding the tool-call
            convention detected from the template.
        dtype: ``"float32"``, ``"bfloat16"`` or ``"float16"`` (default: the model's);
            overrides ``engine_config.dtype`` when given.
        device: the torch device (``"cpu"``, ``"cuda"``, ``"cuda:1"``...); overrides
            ``engine_config.device`` when given.
        generation_config: ``"auto"`` applies the model's ``generation_config.json`` as the
            default sampling parameters of requests (``do_sample: false`` means greedy;
            see :mod:`local_engine.generation`), as vLLM does; ``"none"`` ignores it
            (OpenAI's defaults: temperature 1). :attr:`sampling_defaults` says what applies.

    Use it inside ``async with AsyncClient(LocalBackend(...)) as client:``; calls outside
    that block raise :class:`~swiftclient.errors.ConfigurationError`. Leaving a stream early
    aborts its engine request and frees its KV blocks at once.
    """

    in_process = True
    """The model runs in this process: telemetry marks its call spans ``INTERNAL``."""
    default_model = "default"
    """The model name a call carries when it names none (``AsyncClient`` reads it): the
    backend serves one model and answers to any name; as ``model=``, the embedded default."""
    provider_name = "swiftclient.local_engine"
    """``gen_ai.provider.name`` on telemetry for calls to this backend."""

    def __init__(
        self,
        model: str | Path | None = None,
        *,
        name: str = "local",
        engine_config: EngineConfig | None = None,
        default_max_tokens: int = 1024,
        chat_template: str | None = None,
        tool_format: str | None = None,
        quantization: Literal["int8", "int4", "fp8"] | None = None,
        dtype: str | None = None,
        device: str | None = None,
        generation_config: Literal["auto", "none"] = "auto",
    ) -> None:
        check_backend_name(name)
        if model is not None and not isinstance(model, (str, os.PathLike)):
            raise errors.ConfigurationError(
                f"model must be a model directory, a .gguf file or an embedded model's name "
                f"(a str or a path), got {type(model).__name__}"
            )
        if chat_template is not None and not isinstance(chat_template, str):
            raise errors.ConfigurationError(
                "chat_template must be a Jinja template (a str), got "
                f"{type(chat_template).__name__}"
            )
        if generation_config not in ("auto", "none"):
            raise errors.ConfigurationError(
                f"unknown generation_config {generation_config!r}: expected 'auto' or 'none'"
            )
        for option, value in (("dtype", dtype), ("device", device)):
            if value is not None and (not isinstance(value, str) or not value):
                raise errors.ConfigurationError(f"{option} must be a non-empty string")
        if quantization not in (None, "int8", "int4", "fp8"):
            raise errors.ConfigurationError(
                f"unknown quantization {quantization!r}: expected None, 'int8', 'int4' or 'fp8'"
            )
        if isinstance(default_max_tokens, bool) or not isinstance(default_max_tokens, int):
            raise errors.ConfigurationError("default_max_tokens must be an int")
        if default_max_tokens < 1:
            raise errors.ConfigurationError("default_max_tokens must be at least 1")
        self.name = name
        self._model = model
        self._engine_config = engine_config
        self._quantization = quantization
        self._dtype = dtype
        self._device = device
        self._generation_config = generation_config
        self._default_max_tokens = default_max_tokens
        self._chat_template = chat_template
        self._tool_format = tool_format
        self._owns_engine = True
        self._model_dir: Path | None = None
        self._service: ChatService | None = None
        self._async_engine: AsyncEngine | None = None
        self._load_lock: tuple[anyio.lowlevel.EventLoopToken, anyio.Lock] | None = None
        self.meter_provider: MeterProvider | None = None
        """Where the engine's OpenTelemetry metrics go (None: the global provider); read
        when :attr:`stats` is first used."""
        self._stats: EngineStats | None = None

    @classmethod
    def from_engine(
        cls,
        engine: Engine,
        *,
        name: str = "local",
        default_max_tokens: int = 1024,
        chat_template: str | None = None,
        tool_format: str | None = None,
    ) -> LocalBackend:
        """Serve an already built :class:`~local_engine.engine.Engine` (it needs a tokenizer).

        The engine stays the caller's: :meth:`aclose` does not drop it.
        """
        from local_engine.service import ChatService

        backend = cls(
            name=name,
            default_max_tokens=default_max_tokens,
            chat_template=chat_template,
            tool_format=tool_format,
        )
        backend._service = ChatService(
            engine,
            default_max_tokens=default_max_tokens,
            chat_template=chat_template,
            tool_format=tool_format,
        )
        backend._owns_engine = False
        return backend

    def __repr__(self) -> str:
        return f"LocalBackend(name={self.name!r}, model={self._model!r})"

    # ------------------------------------------------------------------ state

    @property
    def stats(self) -> EngineStats:
        """The engine's metrics (:class:`~local_engine.metrics.EngineStats`), made on first
        use; one per backend, kept across entries."""
        if self._stats is None:
            from local_engine.metrics import EngineStats

            self._stats = EngineStats(meter_provider=self.meter_provider)
        return self._stats

    @property
    def loaded(self) -> bool:
        """True once the model is in memory."""
        return self._service is not None

    @property
    def generation_config(self) -> Literal["auto", "none"]:
        """Whether the model's ``generation_config.json`` sets the sampling defaults."""
        return self._generation_config

    @property
    def sampling_defaults(self) -> dict[str, float | int]:
        """The sampling parameters requests get for fields they leave unset, from the
        model's ``generation_config.json`` (empty before loading, or with
        ``generation_config="none"``)."""
        return dict(self._service.sampling_defaults) if self._service is not None else {}

    @property
    def running(self) -> bool:
        """True inside ``async with`` (the engine accepts requests)."""
        return self._async_engine is not None

    @property
    def engine(self) -> Engine:
        """The loaded :class:`~local_engine.engine.Engine` (ConfigurationError before loading)."""
        return self._loaded_service().engine

    @property
    def async_engine(self) -> AsyncEngine | None:
        """The running :class:`~local_engine.async_engine.AsyncEngine`, if any."""
        return self._async_engine

    @property
    def model_dir(self) -> Path | None:
        """The model directory loaded from (None before loading or for :meth:`from_engine`)."""
        return self._model_dir

    def _loaded_service(self) -> ChatService:
        if self._service is None:
            raise errors.ConfigurationError(
                f"LocalBackend {self.name!r} has not loaded its model yet (enter it or call "
                "warmup())"
            )
        return self._service

    def running_service(self) -> tuple[AsyncEngine, ChatService]:
        """The running engine and the chat service that maps requests onto it (the HTTP
        server's legacy completions use them); ConfigurationError outside ``async with``."""
        return self._running()

    def _running(self) -> tuple[AsyncEngine, ChatService]:
        if self._async_engine is None or self._service is None:
            raise errors.ConfigurationError(_NOT_RUNNING.format(name=self.name))
        return self._async_engine, self._service

    def serving(self) -> tuple[AsyncEngine, ChatService]:
        """The running engine and the chat service over it, for a server that maps the
        engine's own errors itself (:mod:`local_engine.server`) rather than through this
        adapter; ConfigurationError outside ``async with``."""
        return self._running()

    # ------------------------------------------------------------------ loading

    def _resolve_model_dir(self) -> Path:
        try:
            return self._find_model_dir()
        except EngineConfigError as exc:
            raise errors.ConfigurationError(str(exc)) from exc

    def _find_model_dir(self) -> Path:
        from local_engine.default_model import (
            DEFAULT_MODEL_NAME,
            DEFAULT_MODELS,
            find_default_model,
        )

        model = self._model
        if model is None or model == self.default_model:
            return find_default_model()
        path = Path(model).expanduser()
        if path.is_dir() or (path.is_file() and path.suffix.lower() == ".gguf"):
            return path
        if isinstance(model, str) and (model == DEFAULT_MODEL_NAME or model in DEFAULT_MODELS):
            return find_default_model(model)
        random = ", ".join(sorted(DEFAULT_MODELS))
        raise errors.ConfigurationError(
            f"model {str(model)!r} is neither a model directory, a .gguf file nor an embedded "
            f"model ({DEFAULT_MODEL_NAME}, the default; random weights, for tests and benchmarks: "
            f"{random})"
        )

    def _load_sync(self) -> tuple[Path, ChatService]:
        try:
            from local_engine.engine import Engine, EngineConfig
            from local_engine.generation import read_sampling_defaults
            from local_engine.process import apply_process_settings
            from local_engine.service import ChatService
        except ImportError as exc:
            raise errors.ConfigurationError(
                "LocalBackend needs the 'local' extra (torch, safetensors, tokenizers, jinja2): "
                "pip install 'swiftclient-llm[local]'"
            ) from exc
        path = self._resolve_model_dir()
        try:
            config = self._engine_config or EngineConfig()
            if self._quantization is not None:
                config = dataclasses.replace(config, quantization=self._quantization)
            if self._dtype is not None:
                config = dataclasses.replace(config, dtype=self._dtype)
            if self._device is not None:
                config = dataclasses.replace(config, device=self._device)
            # This backend steps its engine in worker threads (AsyncEngine).
            apply_process_settings(config, steps_on_main_thread=False)
            engine = Engine.from_pretrained(path, config)
            defaults = read_sampling_defaults(path) if self._generation_config == "auto" else {}
            service = ChatService(
                engine,
                default_max_tokens=self._default_max_tokens,
                chat_template=self._chat_template,
                tool_format=self._tool_format,
                sampling_defaults=defaults,
            )
        except EngineConfigError as exc:
            raise errors.ConfigurationError(str(exc)) from exc
        except OSError as exc:
            raise errors.ConfigurationError(f"cannot load the model in {path}: {exc}") from exc
        except (RuntimeError, MemoryError) as exc:
            raise errors.EngineError(f"loading the model in {path} failed: {exc!r}") from exc
        return path, service

    async def list_models(self, *, aliases: bool = True) -> list[str]:
        """The model this backend serves, by its directory's name (requests may name it
        or anything else: the backend serves one model, under one name, so ``aliases`` is
        accepted, as :meth:`swiftclient.backends.HTTPBackend.list_models` takes it, and changes
        nothing)."""
        if self._model_dir is not None:
            return [self._model_dir.name]
        if self._service is not None and self._model is None:
            return [self.name]
        path = await anyio.to_thread.run_sync(self._resolve_model_dir)
        return [path.name]

    async def warmup(self, connections: int = 1) -> None:
        """Load the model now (in a worker thread) rather than on entry.

        ``connections`` is accepted for the Backend ``warmup`` convention and ignored.
        """
        from local_engine.async_engine import run_in_worker

        if self._service is not None:
            return
        token = anyio.lowlevel.current_token()  # a lock serves the event loop it was made on
        if self._load_lock is None or self._load_lock[0] != token:
            self._load_lock = (token, anyio.Lock())
        async with self._load_lock[1]:
            if self._service is None:
                self._model_dir, self._service = await run_in_worker(self._load_sync)

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> LocalBackend:
        """Load the model (in a worker thread) and start the engine's driver task."""
        from local_engine.async_engine import AsyncEngine

        if self._async_engine is not None:
            raise errors.ConfigurationError(f"LocalBackend {self.name!r} is already running")
        await self.warmup()
        engine = self._loaded_service().engine
        if engine.driver is not None:  # two drivers would step it at once from two threads
            raise errors.ConfigurationError(
                f"LocalBackend {self.name!r}: its engine is already served by another "
                "LocalBackend (or AsyncEngine); one serves an engine at a time: route every "
                "client's calls through that one"
            )
        stats = self.stats
        stats.engine = engine
        async_engine = AsyncEngine(engine, stats)
        await async_engine.__aenter__()
        self._async_engine = async_engine
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        """Abort every request and stop the driver (an exception from the body propagates
        as it is)."""
        async_engine, self._async_engine = self._async_engine, None
        if async_engine is None:
            return None
        try:
            return await async_engine.__aexit__(exc_type, exc, tb)
        finally:
            # The gauges' callbacks stay registered with the global meter for the life of
            # the process; a stopped backend's stats must not keep its engine (the model's
            # weights) alive through them.
            if self._stats is not None:
                self._stats.engine = None

    async def aclose(self) -> None:
        """Abort every request and stop the engine; outside ``async with``, also drop the
        model this backend loaded (a later entry loads it again)."""
        if self._async_engine is not None:
            with anyio.CancelScope(shield=True):
                await self._async_engine.aclose()
        elif self._owns_engine:
            self._service = None
            self._model_dir = None

    # ------------------------------------------------------------------ requests

    @asynccontextmanager
    async def stream(
        self, request: ChatRequest, deadline: Deadline, options: RequestOptions | None = None
    ) -> AsyncIterator[AsyncIterator[ChatCompletionChunk]]:
        """Open a streamed completion; leaving the block aborts the engine request.

        A final usage chunk is sent unless ``request.stream_options.include_usage`` is False.
        """
        async_engine, service = self._running()
        _name_ignored(request, options)
        usage = request.stream_options is None or request.stream_options.include_usage is not False
        async with AsyncExitStack() as stack:
            try:
                chunks = await stack.enter_async_context(
                    service.stream(async_engine, request, include_usage=usage)
                )
            except (ValueError, EngineError) as exc:
                raise self._client_error(exc) from exc
            yield _ClientErrors(chunks, self)

    async def complete(
        self, request: ChatRequest, deadline: Deadline, options: RequestOptions | None = None
    ) -> ChatCompletion:
        """Run a non-streamed completion."""
        async_engine, service = self._running()
        _name_ignored(request, options)
        try:
            return await service.complete(async_engine, request)
        except (ValueError, EngineError) as exc:
            raise self._client_error(exc) from exc

    def _client_error(self, exc: ValueError | EngineError) -> errors.SwiftClientError:
        """The engine's error as swiftclient's; a refused request is the same error as over
        HTTP: a 400."""
        if isinstance(exc, OverloadedError):
            return errors.OverloadedError(str(exc))
        if isinstance(exc, EngineError):
            return errors.EngineError(str(exc))
        if isinstance(exc, InvalidRequestError | errors.ConfigurationError):
            return errors.BadRequestError(str(exc), status_code=400, backend=self.name)
        if isinstance(exc, EngineConfigError):  # e.g. llguidance missing for a grammar
            return errors.ConfigurationError(str(exc))
        return errors.EngineError(f"the engine failed: {exc!r}")


class _ClientErrors:
    """A chunk iterator whose engine errors come out as swiftclient's."""

    __slots__ = ("_backend", "_chunks")

    def __init__(self, chunks: AsyncIterator[ChatCompletionChunk], backend: LocalBackend) -> None:
        self._chunks = chunks
        self._backend = backend

    def __aiter__(self) -> _ClientErrors:
        return self

    async def __anext__(self) -> ChatCompletionChunk:
        try:
            return await self._chunks.__anext__()
        except (ValueError, EngineError) as exc:
            raise self._backend._client_error(exc) from exc
