"""The client's shared hedging state, wired to the call path through the attempt hook.

:class:`PolicyHub` is both what a call asks (which targets are usable, the hedge delay,
whether a hedge fits the budget) and an :class:`~swiftclient._attempt.AttemptObserver` that
feeds what attempts did back into the policy objects: time to first token into the latency
estimator, successes and failures into each target's circuit breaker and the retry
throttle, ``Retry-After`` into the breaker.

The policy objects are duck-typed here (:class:`LatencySource`, :class:`HedgeGate`,
:class:`Throttle`, :class:`Breaker`); the call path never imports them. Every one is
optional: without an estimator an adaptive hedge waits ``Hedge.max_delay``, without a budget
every hedge is allowed, without breakers every target is usable.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Sequence
from typing import Protocol, runtime_checkable

from ._attempt import AttemptResult, Target, noop_hook, prompt_chars
from ._breaker import CircuitBreaker
from ._budget import HedgeBudget, RetryThrottle
from ._estimator import LatencyEstimator, prompt_bucket
from .errors import ConfigurationError, RateLimited
from .hedging import Hedge, is_fatal
from .types import ChatRequest

__all__ = [
    "AsyncHedgeGate",
    "Breaker",
    "HedgeGate",
    "LatencySource",
    "PolicyHub",
    "Throttle",
    "prompt_chars",
]


class LatencySource(Protocol):
    """Recent time to first token per key (backend, model, prompt-size bucket)."""

    def observe(self, key: Hashable, value: float, now: float) -> None:
        """Add one sample."""
        ...

    def quantile(self, key: Hashable, q: float, now: float) -> float | None:
        """The ``q`` quantile, or None while too few samples exist."""
        ...


class HedgeGate(Protocol):
    """The hedge budget: extra requests as a fraction of calls."""

    def on_call(self, now: float) -> None:
        """A call happened (it earns the budget its share)."""
        ...

    def try_spend(self, now: float) -> bool:
        """Take one hedge from the budget; False when it is spent."""
        ...


@runtime_checkable
class AsyncHedgeGate(Protocol):
    """A hedge budget that asks a store before a hedge (shared by processes:
    :class:`~swiftclient.admission.SharedHedgeBudget`); calls still pay in synchronously."""

    def on_call(self, now: float) -> None:
        """A call happened (it earns the budget its share; no I/O)."""
        ...

    async def spend(self, now: float) -> bool:
        """Take one hedge from the budget; False when it is spent."""
        ...


class Throttle(Protocol):
    """Switches hedging off while targets fail."""

    def on_failure(self) -> None:
        """An attempt failed."""
        ...

    def on_success(self) -> None:
        """An attempt succeeded."""
        ...

    def allowed(self) -> bool:
        """Whether hedges may be sent now."""
        ...


class Breaker(Protocol):
    """One target's circuit breaker."""

    def allow(self, now: float) -> bool:
        """Whether the target may be tried now."""
        ...

    def record(self, ok: bool, now: float) -> None:
        """The outcome of one attempt on the target."""
        ...

    def state(self, now: float) -> str:
        """``closed``, ``open`` or ``half_open``."""
        ...

    def block_until(self, until: float) -> None:
        """The target asked to be left alone until ``until`` (Retry-After)."""
        ...


class PolicyHub:
    """Breakers, latency estimates, budget and throttle for one client; see the module."""

    def __init__(
        self,
        *,
        estimator: LatencySource | None = None,
        bucket: Callable[[int], int] | None = None,
        budget: HedgeGate | AsyncHedgeGate | None = None,
        throttle: Throttle | None = None,
        breaker: Callable[[], Breaker] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._estimator = estimator
        self._bucket = bucket
        self._budget = budget
        self._throttle = throttle
        self._new_breaker = breaker
        self._breakers: dict[str, Breaker] = {}
        self._clock = clock
        self._breaker_listeners: list[Callable[[AttemptResult, str, str], None]] = []

    @classmethod
    def standard(
        cls, hedge: Hedge | None = None, *, budget: HedgeGate | AsyncHedgeGate | None = None
    ) -> PolicyHub:
        """The client's default: a decaying TTFT estimator per (backend, model, prompt-size
        bucket), a hedge budget and the gRPC-style throttle taken from ``hedge`` (the client's
        default :class:`Hedge`, or ``Hedge()``), and a circuit breaker per target.

        ``budget``: the hedge budget to use instead of a per-process ``HedgeBudget`` with
        ``hedge``'s numbers (the client passes the one its shared admission store keeps)."""
        settings = hedge if hedge is not None else Hedge()
        if budget is None:
            budget = HedgeBudget(
                ratio=settings.budget,
                floor_per_second=settings.budget_floor,
                burst=settings.budget_burst,
            )
        return cls(
            estimator=LatencyEstimator(min_samples=settings.min_samples),
            bucket=prompt_bucket,
            budget=budget,
            throttle=RetryThrottle(),
            breaker=CircuitBreaker,
        )

    @property
    def observes(self) -> bool:
        """Whether any policy object listens to attempt outcomes (else the hub stays off the
        attempt hook, and the plain path pays nothing for it)."""
        return any(p is not None for p in (self._estimator, self._throttle, self._new_breaker))

    def on_breaker_change(self, listener: Callable[[AttemptResult, str, str], None]) -> None:
        """Call ``listener(attempt, old_state, new_state)`` whenever the outcome of an attempt
        changes its target's breaker state (telemetry counts and traces these)."""
        if listener not in self._breaker_listeners:
            self._breaker_listeners.append(listener)

    # ------------------------------------------------------------------ what a call asks

    def usable(self, targets: Sequence[Target]) -> list[Target]:
        """The targets whose breaker lets a request through now, in order."""
        if self._new_breaker is None:
            return list(targets)
        now = self._clock()
        return [t for t in targets if self._breaker(t.name).allow(now)]

    def hedge_delay(
        self, hedge: Hedge, target: Target, request: ChatRequest, *, streamed: bool = True
    ) -> float:
        """The hedge's delay after an attempt on ``target`` started: estimates of first
        tokens for streamed attempts, of whole replies for non-streamed ones."""
        estimate = None
        if hedge.delay is None and self._estimator is not None:
            estimate = self._estimator.quantile(
                self._key(target, request, streamed), hedge.quantile, self._clock()
            )
        return hedge.delay_for(estimate)

    @property
    def budget(self) -> HedgeGate | AsyncHedgeGate | None:
        """The hedge budget (None: every hedge is allowed)."""
        return self._budget

    def may_hedge(self) -> bool:
        """True when the throttle is on and the budget has a hedge to spend (spends it).

        Raises:
            ConfigurationError: the budget lives on a store (an :class:`AsyncHedgeGate`):
                ask :meth:`may_hedge_async`.
        """
        if self._throttle is not None and not self._throttle.allowed():
            return False
        budget = self._budget
        if isinstance(budget, AsyncHedgeGate):
            raise ConfigurationError("this hedge budget lives on a store: use may_hedge_async")
        return budget is None or budget.try_spend(self._clock())

    async def may_hedge_async(self) -> bool:
        """:meth:`may_hedge` for the call path: a budget on a store (:class:`AsyncHedgeGate`)
        is asked there, a per-process one by :meth:`may_hedge`, without suspending."""
        budget = self._budget
        if isinstance(budget, AsyncHedgeGate) and (
            self._throttle is None or self._throttle.allowed()
        ):
            return await budget.spend(self._clock())
        return self.may_hedge()  # with a budget on a store, only a refusing throttle gets here

    def on_call(self) -> None:
        """A call with several targets began."""
        if self._budget is not None:
            self._budget.on_call(self._clock())

    def open_left(self, name: str) -> float:
        """Seconds target ``name``'s breaker stays open because requests failed (0: it is
        not, or its breaker cannot say: it has no ``open_left``)."""
        breaker = self._breakers.get(name)
        open_left = getattr(breaker, "open_left", None)
        return 0.0 if open_left is None else float(open_left(self._clock()))

    def health(self) -> dict[str, str]:
        """Breaker state of every target seen so far, by ``"backend/model"``."""
        now = self._clock()
        return {name: breaker.state(now) for name, breaker in self._breakers.items()}

    # ------------------------------------------------------------------ AttemptObserver

    @noop_hook
    def on_start(self, attempt: AttemptResult) -> None:
        """Nothing to do when an attempt starts."""

    def on_first_token(self, attempt: AttemptResult) -> None:
        """Feed the attempt's time to first token (non-streamed: its whole reply) to the
        estimator."""
        self._observe(attempt, attempt.ttft)

    @noop_hook
    def on_commit(self, attempt: AttemptResult) -> None:
        """Nothing to do on commit (the outcome comes with ``on_end``)."""

    def on_end(self, attempt: AttemptResult) -> None:
        """Record the outcome: success or a target's failure; errors of the request itself
        (400, 401, ...), attempts admission refused (``RateLimited``: nothing was sent) and
        cancelled or lost attempts say nothing about the target's health.

        A lost attempt that had no first token yet still tells the estimator something: its
        time to first token was at least as long as it waited. Without that censored sample
        the estimate would only ever see the attempts that answered in time (the slow ones
        are the ones hedging cancels), so its high quantiles would sit too low and the hedge
        would fire, and spend the budget, more often than its quantile says.
        """
        outcome = attempt.outcome
        if outcome == "won":
            ok = True
        elif (
            outcome == "failed"
            and attempt.error is not None
            and not is_fatal(attempt.error)
            and not isinstance(attempt.error, RateLimited)  # refused here: never sent
        ):
            ok = False
        else:
            if outcome == "lost" and attempt.ttft is None:
                self._observe(attempt, attempt.duration)  # censored: at least this long
            return
        now = self._clock()
        if self._throttle is not None:
            (self._throttle.on_success if ok else self._throttle.on_failure)()
        if self._new_breaker is not None:
            breaker = self._breaker(attempt.target.name)
            listeners = self._breaker_listeners
            before = breaker.state(now) if listeners else ""
            breaker.record(ok, now)
            retry_after = attempt.retry_after
            if retry_after is not None:
                breaker.block_until(now + retry_after)
            if listeners:
                after = breaker.state(now)
                if after != before:
                    for listener in listeners:
                        listener(attempt, before, after)

    # ------------------------------------------------------------------ helpers

    def _observe(self, attempt: AttemptResult, seconds: float | None) -> None:
        if self._estimator is not None and seconds is not None:
            key = self._key(attempt.target, attempt.request, attempt.streamed)
            self._estimator.observe(key, seconds, self._clock())

    def _breaker(self, name: str) -> Breaker:
        breaker = self._breakers.get(name)
        if breaker is None:
            assert self._new_breaker is not None
            breaker = self._breakers[name] = self._new_breaker()
        return breaker

    def _key(self, target: Target, request: ChatRequest, streamed: bool) -> Hashable:
        bucket = 0 if self._bucket is None else self._bucket(prompt_chars(request.messages))
        return (target.backend_name, target.model, bucket, streamed)
