"""AsyncClient: resolve the model to a backend, apply the call's policies, return results."""

from __future__ import annotations

import difflib
import itertools
import os
import sys
import warnings
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from types import TracebackType
from typing import Any, Literal, Protocol, TypeVar, overload

import anyio
import pydantic

from . import _batch, errors
from ._accounting import Accounting
from ._attempt import AttemptObserver, AttemptResult, Hooks, Target
from ._batch import BatchProgress, BatchRequest, BatchResult
from ._canonical import CallEncoding, leading_static
from ._cost import HedgeStats, Pricing
from ._deadline import Deadline, Timeout
from ._messages import MessagesInput, has_marks, validated_messages
from ._policies import PolicyHub, prompt_chars
from ._retry import RetryPolicy
from ._stream import Call, ChatStream
from ._structured import structured_output, validation_summary
from .admission import Admission, Limits, TargetHealth
from .backends.base import Backend, call_headers, enter_backends
from .conversation import Conversation
from .hedging import Hedge
from .prompt_cache import CacheAccounting, CacheUsage, PrefixLint
from .telemetry import Telemetry
from .types import ChatCompletion, ChatRequest

__all__ = ["AsyncClient", "NOT_GIVEN", "NotGiven", "RouterLike"]

T = TypeVar("T")
_MAX_RESOLVED = 256
ModelInput = str | Sequence[str] | None


class RouterLike(Protocol):
    """Expands aliases into target lists (``swiftclient.routing.Router`` is one)."""

    def expand(
        self, model: str | Sequence[str], *, prompt_chars: int, task: str | None
    ) -> list[str]:
        """The targets for ``model``: an alias's list chosen by its rules, else ``model``."""
        ...


class NotGiven:
    """Marks an argument the caller did not pass (distinct from ``None``)."""

    _instance: NotGiven | None = None

    def __new__(cls) -> NotGiven:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "NOT_GIVEN"

    def __bool__(self) -> bool:
        return False


NOT_GIVEN = NotGiven()


class _CallKeys:
    """Idempotency keys: a random prefix drawn once per process (96 bits) and a counter,
    unique without a random draw per call; a forked child draws a new prefix."""

    prefix = os.urandom(12).hex()
    counter = itertools.count()

    @classmethod
    def renew(cls) -> None:
        """Start a new series (a forked child must not repeat its parent's keys)."""
        cls.prefix = os.urandom(12).hex()
        cls.counter = itertools.count()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_CallKeys.renew)


def _call_key() -> str:
    """A new call's idempotency key (the same for all of its attempts)."""
    return f"swiftclient-{_CallKeys.prefix}-{next(_CallKeys.counter)}"


def _request(model: str, messages: MessagesInput, params: dict[str, Any]) -> ChatRequest:
    """The request, validated in one pass (messages included); bad input raises
    :class:`~swiftclient.ConfigurationError` naming the message or field at fault."""
    try:
        # The model's validator itself: ``model_validate`` is one Python call around it.
        request: ChatRequest = ChatRequest.__pydantic_validator__.validate_python(
            {"model": model, "messages": messages, **params}
        )
    except pydantic.ValidationError as exc:
        loc = exc.errors(include_url=False, include_input=False)[0]["loc"]
        if len(loc) >= 2 and loc[0] == "messages" and isinstance(loc[1], int):
            raise errors.ConfigurationError(
                f"invalid message messages[{loc[1]}]: {validation_summary(exc, loc[:2])}"
            ) from exc
        raise errors.ConfigurationError(f"invalid chat request: {validation_summary(exc)}") from exc
    return request


def _hedge(hedge: Hedge | None) -> Hedge | None:
    if hedge is not None and not isinstance(hedge, Hedge):
        raise errors.ConfigurationError(f"hedge must be a Hedge or None, got {hedge!r}")
    return hedge


def _retry(retry: object) -> RetryPolicy | None:
    """``retry`` checked: a :class:`RetryPolicy` or None (an int there raised AttributeError
    only once a request failed)."""
    if retry is not None and not isinstance(retry, RetryPolicy):
        raise errors.ConfigurationError(
            f"retry must be a RetryPolicy or None, got {retry!r} "
            "(e.g. RetryPolicy(max_attempts=3), or RetryPolicy.none())"
        )
    return retry


class BackendNameWarning(UserWarning):
    """A model string's prefix is no backend's name but close to one (``"opnai/gpt-4o"``
    with a backend ``"openai"``): the whole string goes to the default backend, which is
    right only if the prefix is part of the model's own name there."""


_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _warn_near_miss(head: str, model: str, backends: Mapping[str, Backend], default: str) -> None:
    """Warn when ``head``, the prefix of ``model`` that names no backend, looks like a
    misspelt backend name (the model then goes, whole, to the default backend). An
    organisation's name that merely resembles a backend's (``deepseek-ai`` and
    ``deepseek``, ``mistralai`` and ``mistral``, ``Qwen`` and ``qwen``) is no typo."""
    lowered = head.lower()
    names = [
        name
        for name in backends
        if not (lowered.startswith(name.lower()) or name.lower().startswith(lowered))
    ]
    near = difflib.get_close_matches(head, names, 1, cutoff=0.8)
    if not near:
        return
    meant = f"{near[0]}/{model[len(head) + 1 :]}"
    frame, level = sys._getframe(), 1  # at the caller's line (a blocking Client's: its loop's)
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    warnings.warn(
        f"model {model!r}: no backend is named {head!r}, so the default backend "
        f"({default!r}) gets the whole string; did you mean {meant!r}? (If {head!r} is "
        "part of the model's name there, filter BackendNameWarning.)",
        BackendNameWarning,
        stacklevel=level,
    )


class AsyncClient:
    """The client agents call: ``await client.chat(messages=..., model=...)``.

    Args:
        backend: one backend (it becomes the default).
        backends: several named backends; ``"name/model"`` routes to ``name``.
        default_backend: which of ``backends`` gets model strings without a known prefix.
        model: the model used when a call names none.
        timeout: default :class:`Timeout` (a number sets ``total``, the other limits keep
            their defaults). A per-call ``timeout=`` number or None overrides only ``total``
            of this default; a per-call :class:`Timeout` replaces it.
        retry: default :class:`RetryPolicy`.
        stream_chat: run ``chat()`` over streaming (TTFT and ITL measured, first-token and
            idle timeouts apply); ``False`` uses the backends' non-streamed path.
        hedge: default :class:`Hedge` for calls with several targets (``model=[...]``);
            ``None`` tries the targets one after another (sequential fallback).
        observers: :class:`AttemptObserver` objects told of every attempt's start, first
            token, commit and end.
        router: expands model aliases (``"fast"``, ``"smart"``) into target lists, choosing
            by the request's prompt size and ``task`` label (see :class:`RouterLike`).
        policies: the shared hedging state (:class:`PolicyHub`: latency estimates, hedge
            budget, retry throttle, circuit breakers); by default
            :meth:`PolicyHub.standard` with the budget of ``hedge``, kept on the admission
            store when ``limits`` shares one (a :class:`~swiftclient.admission.RedisStore`:
            the processes sharing it spend one hedge budget). The policy objects learn from
            calls with several targets only.
        pricing: prices per target (:class:`Pricing`) for each call's cost
            (``Timing.cost``) and the totals of :meth:`stats`. With ``None`` only calls with
            several targets are accounted (their counts kept, costs ``None``); with prices,
            every call.
        telemetry: OpenTelemetry spans and metrics for every call (:class:`Telemetry`); by
            default the shared ``Telemetry.default()`` on the global providers, which records
            nothing until the application installs an OpenTelemetry SDK. ``None`` turns it
            off.
        limits: admission control (docs/rate-limits.md): a
            :class:`~swiftclient.admission.Limits` for every backend, a mapping from backend
            name (or ``"backend/model"``) to limits, or an
            :class:`~swiftclient.admission.Admission` (to share state through a
            :class:`~swiftclient.admission.RedisStore`). Each attempt then waits for capacity
            on its target within the call's deadline, and the limits are learned from the
            responses' rate-limit headers. ``None`` (the default): no admission.

    With no backend at all, the client configures itself from the environment (see
    :func:`swiftclient.providers.from_env`).
    """

    def __init__(
        self,
        backend: Backend | None = None,
        *,
        backends: Mapping[str, Backend] | None = None,
        default_backend: str | None = None,
        model: str | None = None,
        timeout: Timeout | float | None | NotGiven = NOT_GIVEN,
        retry: RetryPolicy | None = None,
        stream_chat: bool = True,
        hedge: Hedge | None = None,
        observers: Sequence[AttemptObserver] = (),
        policies: PolicyHub | None = None,
        router: RouterLike | None = None,
        pricing: Pricing | None = None,
        telemetry: Telemetry | None | NotGiven = NOT_GIVEN,
        limits: Limits | Mapping[str, Limits] | Admission | None = None,
    ) -> None:
        if isinstance(backend, str):
            raise errors.ConfigurationError(
                f"backend must be a Backend, got the string {backend!r}: for a URL pass "
                "HTTPBackend(url) (or AsyncClient() to read the environment)"
            )
        if model is not None and not isinstance(model, str):
            raise errors.ConfigurationError(
                f"model must be a string (a default model name), got {type(model).__name__}"
            )
        if backends is not None and not isinstance(backends, Mapping):
            raise errors.ConfigurationError(
                f"backends must be a mapping of name to Backend, got {type(backends).__name__}"
            )
        named: dict[str, Backend] = dict(backends or {})
        for label, given in [*named.items(), *([("backend", backend)] if backend else [])]:
            if not all(callable(getattr(given, m, None)) for m in ("stream", "complete")):
                raise errors.ConfigurationError(
                    f"{label!r} is not a Backend (it needs stream() and complete()), got "
                    f"{type(given).__name__}"
                )
        if backend is not None:
            named.setdefault(backend.name, backend)
            default_backend = default_backend or backend.name
        if not named:
            from .providers import from_env

            env_backend = from_env()
            named[env_backend.name] = env_backend
            default_backend = env_backend.name
            if model is None:
                model = os.environ.get("SWIFTCLIENT_MODEL")
        if default_backend is None:
            default_backend = next(iter(named))
        if default_backend not in named:
            raise errors.ConfigurationError(
                f"default_backend {default_backend!r} is not one of {sorted(named)}"
            )
        self._backends = named
        self._default = default_backend
        self.model = model
        self.timeout = Timeout() if isinstance(timeout, NotGiven) else Timeout.coerce(timeout)
        self.retry = _retry(retry) or RetryPolicy()
        if type(stream_chat) is not bool:
            raise errors.ConfigurationError(
                f"stream_chat must be True or False, got {type(stream_chat).__name__}"
            )
        self.stream_chat = stream_chat
        self.hedge = _hedge(hedge)
        self.router = router
        self.admission: Admission | None = (
            limits if isinstance(limits, Admission | None) else Admission(limits)
        )
        """Rate limits every attempt waits for (``None``: none); see ``limits``."""
        if policies is None:
            # With a shared admission store, the hedge budget lives there too: the fleet
            # spends one budget (docs/rate-limits.md, "The hedge budget across processes").
            shared = None
            if self.admission is not None:
                settings = hedge if hedge is not None else Hedge()
                shared = self.admission.hedge_budget(
                    settings.budget, settings.budget_floor, settings.budget_burst
                )
            policies = PolicyHub.standard(hedge, budget=shared)
        self.policies = policies
        self._accounting = Accounting(pricing)
        hooks: list[AttemptObserver] = [self.policies] if self.policies.observes else []
        # The policy objects learn from calls with several targets only: a one-target call
        # has no choice for them to make, and the plain path stays free of their cost.
        # Accounting settles every call with several targets, and every call once prices
        # are set (an unpriced one-target call has only its own request to account).
        # Prompt-cache counts (cache_stats) are kept for every call: one cheap handler.
        self._cache = CacheAccounting()
        self._lint = PrefixLint()
        self._hooks = Hooks.of((*hooks, self._cache, *observers))
        self._plain_hooks = Hooks.of((self._cache, *observers))
        self._plain_ledger = self._accounting if pricing is not None else None
        if isinstance(telemetry, NotGiven):
            telemetry = Telemetry.default()
        elif telemetry is not None and not isinstance(telemetry, Telemetry):
            raise errors.ConfigurationError(
                f"telemetry must be a Telemetry or None, got {telemetry!r}"
            )
        self.telemetry = telemetry
        if telemetry is not None:
            self.policies.on_breaker_change(telemetry.breaker_changed)
        if self.admission is not None and self.admission.store.shared:
            self.policies.on_breaker_change(self._share_breaker)
        self._closed = False
        self._stack: AsyncExitStack | None = None
        self._resolved: dict[str, Target] = {}
        """Targets by the model string that named them (at most ``_MAX_RESOLVED``)."""

    def _share_breaker(self, attempt: AttemptResult, old: str, new: str) -> None:
        """A breaker opened: rest its target on the shared admission store for the
        breaker's cooldown (every process then refuses it; docs/rate-limits.md)."""
        if new == "open" and self.admission is not None:
            name = attempt.target.name
            self.admission.breaker_opened(name, self.policies.open_left(name))

    def __repr__(self) -> str:
        return f"AsyncClient(backends={sorted(self._backends)}, default={self._default!r})"

    @property
    def backends(self) -> dict[str, Backend]:
        """The configured backends by name."""
        return dict(self._backends)

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> AsyncClient:
        """Enter every backend that is itself an async context manager (the local engine
        runs its driver inside this block)."""
        self._stack = await enter_backends(self._backends.values())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        stack, self._stack = self._stack, None
        try:
            if stack is not None:
                # Not wrapped in a shield: a backend that runs a task group (the local engine)
                # must exit it in the cancel scope it entered it in. Backends shield their own
                # cleanup.
                await stack.__aexit__(exc_type, exc, tb)
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        """Close every backend (their pools, engines and connections)."""
        self._closed = True
        with anyio.CancelScope(shield=True):
            for backend in self._backends.values():
                await backend.aclose()

    async def warmup(self, connections: int = 1) -> None:
        """Open pooled connections (HTTP) or load models (local) before the first call."""
        if isinstance(connections, bool) or not isinstance(connections, int) or connections < 1:
            raise errors.ConfigurationError(
                f"warmup(connections) must be an int of at least 1, got {connections!r}"
            )
        for backend in self._backends.values():
            warm = getattr(backend, "warmup", None)
            if warm is not None:
                await warm(connections)

    @overload
    def health(self, *, detail: Literal[False] = False) -> dict[str, str]: ...

    @overload
    def health(self, *, detail: Literal[True]) -> dict[str, TargetHealth]: ...

    def health(self, *, detail: bool = False) -> dict[str, str] | dict[str, TargetHealth]:
        """Circuit-breaker state per target seen so far: ``{"backend/model": "closed" |
        "open" | "half_open"}`` (empty without breakers).

        ``detail=True``: a :class:`~swiftclient.admission.TargetHealth` per target, its
        breaker state and, with admission (``limits=``), its
        :class:`~swiftclient.admission.Headroom` (docs/rate-limits.md)."""
        return self._health_any(detail)

    def _health_any(self, detail: bool) -> dict[str, str] | dict[str, TargetHealth]:
        """:meth:`health` under one signature (the sync client runs it on its loop)."""
        breakers = self.policies.health()
        if not detail:
            return breakers
        headroom = {} if self.admission is None else self.admission.headroom()
        return {
            name: TargetHealth(breakers.get(name), headroom.get(name))
            for name in {**breakers, **headroom}
        }

    @property
    def pricing(self) -> Pricing | None:
        """The prices calls are costed with (``None``: counts only)."""
        return self._accounting.pricing

    def stats(self, *, reset: bool = False) -> HedgeStats:
        """Totals over the accounted calls finished so far (every call when the client has
        ``pricing``, else the calls with several targets): calls, attempts, hedges sent and won,
        wasted requests and tokens, cost and wasted cost (a copy; ``.snapshot()`` makes it a
        dict). ``reset`` starts the totals from zero again after reading them."""
        return self._accounting.snapshot(reset=reset)

    def cache_stats(self, *, reset: bool = False) -> dict[str, CacheUsage]:
        """Prompt-cache counts per backend name: replies with usage, their prompt tokens,
        the prompt tokens served from the provider's cache, and ``hit_ratio`` (a copy).
        ``reset`` starts the counts from zero again after reading them."""
        return self._cache.snapshot(reset=reset)

    # ------------------------------------------------------------------ resolution

    def _target(self, model: str | None) -> Target:
        """The target a model string names, labelled with the backend's registered name."""
        if model is None:
            model = self.model
        try:
            found = self._resolved.get(model)  # type: ignore[arg-type]
        except TypeError:  # not a string (unhashable): refused below
            found = None
        if found is not None:
            return found
        named = model if type(model) is str and model else None
        if not model:  # a backend that serves one model may say what to call it
            model = getattr(self._backends[self._default], "default_model", None)
        if not model or not isinstance(model, str):
            raise errors.ConfigurationError(
                "no model given: pass model=... to the call or to the client"
            )
        head, sep, rest = model.partition("/")
        if sep and head in self._backends and rest:
            target = Target(self._backends[head], rest, head)
        else:
            target = Target(self._backends[self._default], model, self._default)
            if sep and rest and named is not None:  # warned once: the target is kept below
                _warn_near_miss(head, model, self._backends, self._default)
        if named is not None:  # the backends are fixed: a model string names one target
            if len(self._resolved) >= _MAX_RESOLVED:
                self._resolved.clear()
            self._resolved[named] = target
        return target

    def targets(self, model: ModelInput) -> list[Target]:
        """Resolve a model string, or a list of them, to targets (backend, model) in order.

        Duplicates are kept once; the same model behind two backend names is two targets.
        """
        if model is None or isinstance(model, str):
            return [self._target(model)]
        if not isinstance(model, Sequence):
            raise errors.ConfigurationError(
                f"model must be a string or a list of strings, got {type(model).__name__}"
            )
        if not model:
            raise errors.ConfigurationError("model=[] names no target")
        out: list[Target] = []
        for item in model:
            if not isinstance(item, str):
                raise errors.ConfigurationError(
                    f"model list entries must be strings, got {type(item).__name__}"
                )
            target = self._target(item)
            if target not in out:
                out.append(target)
        return out

    def _call(
        self,
        messages: MessagesInput,
        model: ModelInput,
        timeout: Timeout | float | None | NotGiven,
        retry: RetryPolicy | None,
        hedge: Hedge | None | NotGiven,
        task: str | None,
        params: dict[str, Any],
        extra_headers: Mapping[str, str] | None,
        streamed: bool = True,
    ) -> Call:
        if self._closed:
            raise errors.ClientClosedError("this AsyncClient is closed")
        if extra_headers is not None:
            extra_headers = call_headers(extra_headers)
        router = self.router
        static: int | None = None
        if router is None and isinstance(messages, list) and not has_marks(messages):
            validated: MessagesInput = messages  # validated with the request, in one pass
        else:
            checked, static = validated_messages(messages)
            validated = checked
            if isinstance(messages, Conversation) and messages.tools and "tools" not in params:
                params["tools"] = messages.tools
            if router is not None:
                wanted = self.model if model is None else model
                if wanted is not None:
                    model = router.expand(wanted, prompt_chars=prompt_chars(checked), task=task)
        targets = self.targets(model)
        request = _request(targets[0].model, validated, params)
        fields = request.__dict__  # the fields' values, read without pydantic's attribute hook
        sent, tools = fields["messages"], fields["tools"]
        if static is None:
            static = leading_static(sent)
        if static:
            self._lint.check(sent, static)
        if tools:
            self._lint.check_tools(tools)
        limits = (
            self.timeout if isinstance(timeout, NotGiven) else Timeout.coerce(timeout, self.timeout)
        )
        hedge = self.hedge if isinstance(hedge, NotGiven) else _hedge(hedge)
        several = len(targets) > 1
        return Call(
            targets,
            request,
            Deadline(limits),
            _retry(retry) or self.retry,
            call_id=_call_key(),
            encoding=CallEncoding(static),
            streamed=streamed,
            hedge=hedge,
            hooks=self._hooks if several else self._plain_hooks,
            policies=self.policies,
            ledger=self._accounting if several else self._plain_ledger,
            tracer=self.telemetry,
            admission=self.admission,
            headers=extra_headers or None,
        )

    # ------------------------------------------------------------------ calls

    def stream(
        self,
        messages: MessagesInput,
        *,
        model: ModelInput = None,
        timeout: Timeout | float | None | NotGiven = NOT_GIVEN,
        retry: RetryPolicy | None = None,
        hedge: Hedge | None | NotGiven = NOT_GIVEN,
        task: str | None = None,
        extra_headers: Mapping[str, str] | None = None,
        **params: Any,
    ) -> ChatStream:
        """Open a streamed chat: ``async with client.stream(messages, model=...) as s``.

        ``params`` are :class:`ChatRequest` fields (``temperature``, ``tools``, ``stop``, ...;
        provider-specific ones go in ``extra_body``). ``task`` is a label for the client's
        router only (never sent). ``extra_headers`` go with every attempt of this call (a
        provider's beta flag, say; credentials belong on the backend and are refused here).
        ``model`` may be a list of targets:
        with ``hedge`` (or the client's default) they are raced, the first to deliver a
        content token wins and the others are cancelled; without, they are tried in order
        until one works (docs/hedging.md).
        """
        if "response_model" in params:
            raise errors.ConfigurationError(
                "response_model is an argument of chat(), not stream(): a stream's chunks are "
                "not validated; call chat(..., response_model=...), which streams too under "
                "stream_chat=True"
            )
        if params.get("stream") is False:  # the request went out streamed all the same
            raise errors.ConfigurationError(
                "stream(..., stream=False) asks stream() for a whole reply: call chat(), which "
                "takes stream=False"
            )
        call = self._call(messages, model, timeout, retry, hedge, task, params, extra_headers)
        return ChatStream(call)

    @overload
    async def chat(
        self,
        messages: MessagesInput,
        *,
        model: ModelInput = ...,
        response_model: None = ...,
        timeout: Timeout | float | None | NotGiven = ...,
        retry: RetryPolicy | None = ...,
        hedge: Hedge | None | NotGiven = ...,
        task: str | None = ...,
        stream: bool | None = ...,
        extra_headers: Mapping[str, str] | None = ...,
        **params: Any,
    ) -> ChatCompletion: ...

    @overload
    async def chat(
        self,
        messages: MessagesInput,
        *,
        model: ModelInput = ...,
        response_model: type[T],
        timeout: Timeout | float | None | NotGiven = ...,
        retry: RetryPolicy | None = ...,
        hedge: Hedge | None | NotGiven = ...,
        task: str | None = ...,
        stream: bool | None = ...,
        extra_headers: Mapping[str, str] | None = ...,
        **params: Any,
    ) -> T: ...

    async def chat(
        self,
        messages: MessagesInput,
        *,
        model: ModelInput = None,
        response_model: type[T] | None = None,
        timeout: Timeout | float | None | NotGiven = NOT_GIVEN,
        retry: RetryPolicy | None = None,
        hedge: Hedge | None | NotGiven = NOT_GIVEN,
        task: str | None = None,
        stream: bool | None = None,
        extra_headers: Mapping[str, str] | None = None,
        **params: Any,
    ) -> ChatCompletion | T:
        """Run one chat completion and return it (with ``.text``, ``.tool_calls``,
        ``.usage`` and ``.timing``). Arguments as :meth:`stream`.

        With ``response_model`` (a pydantic model, TypedDict or dataclass, or a list or dict
        of them), the model is asked for JSON matching that type's schema and the validated
        value is returned; a reply that does not validate raises
        :class:`StructuredOutputError` naming the failing fields and carrying the raw text.
        A reply fenced in a Markdown code block is read from inside the fence. A type that
        cannot describe a JSON object or array raises :class:`ConfigurationError`.
        """
        structured = None
        if response_model is not None:
            if "response_format" in params:
                raise errors.ConfigurationError("pass response_model or response_format, not both")
            structured = structured_output(response_model)
            params["response_format"] = structured.response_format
        if stream is not None and type(stream) is not bool:
            raise errors.ConfigurationError(
                f"stream must be True, False or None, got {type(stream).__name__}"
            )
        use_stream = self.stream_chat if stream is None else stream
        call = self._call(
            messages, model, timeout, retry, hedge, task, params, extra_headers, use_stream
        )
        if use_stream:
            async with ChatStream(call) as chat_stream:
                completion = await chat_stream.final()
        else:
            completion = await call.complete()
        if structured is None:
            return completion
        return structured.parse(completion)

    # ------------------------------------------------------------------ batches

    def batch_iter(
        self,
        requests: Iterable[BatchRequest],
        *,
        concurrency: int = 8,
        on_progress: Callable[[BatchProgress], object] | None = None,
        min_shared_bytes: int = 1024,
        **defaults: Any,
    ) -> AbstractAsyncContextManager[AsyncIterator[BatchResult]]:
        """Run many chats grouped by shared prompt prefix; results as they finish:
        ``async with client.batch_iter(requests) as results: async for r in results``.

        Each entry is a :class:`ChatRequest`, a string (one user message, as in
        ``chat("hi")``), a list of messages (or a ``Conversation``) or a mapping of
        :meth:`stream` arguments (``messages`` required); ``defaults`` (``model``,
        ``timeout``, request fields) apply to every entry that does not set them. An argument
        name that is neither a request field nor a call option is refused before anything
        is sent. At most ``concurrency`` calls run at
        once. Entries whose canonical prompts share at least ``min_shared_bytes`` bytes form
        a group: its first entry is sent first and the rest once its first token arrives
        (the shared prefix is then cached on the server); groups go depth-first. Every
        result is a :class:`BatchResult` carrying its input ``index`` and the completion or
        the error. ``on_progress`` (a function or coroutine function) hears of each finished
        entry. Leaving the block early cancels what is still running.
        """
        return _batch.batch_iter(
            self,
            requests,
            concurrency=concurrency,
            on_progress=on_progress,
            min_shared_bytes=min_shared_bytes,
            defaults=defaults,
        )

    async def batch(
        self,
        requests: Iterable[BatchRequest],
        *,
        concurrency: int = 8,
        on_progress: Callable[[BatchProgress], object] | None = None,
        min_shared_bytes: int = 1024,
        **defaults: Any,
    ) -> list[BatchResult]:
        """Run many chats grouped by shared prompt prefix (see :meth:`batch_iter`) and return
        one :class:`BatchResult` per entry, in input order; a failed entry holds its error
        and never stops the others."""
        return await _batch.run_batch(
            self,
            requests,
            concurrency=concurrency,
            on_progress=on_progress,
            min_shared_bytes=min_shared_bytes,
            defaults=defaults,
        )
