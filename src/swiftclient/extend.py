"""What you need to extend swiftclient rather than use it.

``from swiftclient import ...`` holds what a program that makes calls writes: the clients,
backends, types, errors and the knobs (``Timeout``, ``Hedge``, ``RetryPolicy``, ``Pricing``).
This module holds the machinery behind them, for whoever plugs something into the call path:

- **Attempt observers**: :class:`AttemptObserver` (the hook protocol that
  ``AsyncClient(observers=[...])`` takes), :class:`AttemptResult` (the frozen attempt each
  handler is handed) and :class:`Target` (where one attempt goes).
- **A hub of your own**: :class:`PolicyHub` (``AsyncClient(policies=...)``), the standard
  parts it is built from (:class:`LatencyEstimator` with :func:`prompt_bucket`,
  :class:`HedgeBudget`, :class:`RetryThrottle`, :class:`CircuitBreaker`) and the protocols a
  part of your own implements (:class:`LatencySource`, :class:`HedgeGate` or
  :class:`AsyncHedgeGate`, :class:`Throttle`, :class:`Breaker`).
- **A backend of your own**: what :class:`~swiftclient.Backend`'s methods receive,
  :class:`RequestOptions` and :class:`Deadline`.
- **Wrappers and routers**: :data:`NOT_GIVEN` / :class:`NotGiven` (an argument the caller did
  not pass) and :class:`RouterLike` (what ``AsyncClient(router=...)`` accepts).

Earlier versions exported these names from ``swiftclient`` itself; they moved here so that
the top-level namespace stays small. See docs/hedging.md ("Budget and throttle") and
docs/architecture.md.
"""

from ._attempt import AttemptObserver, AttemptResult, Target
from ._breaker import CircuitBreaker
from ._budget import HedgeBudget, RetryThrottle
from ._client import NOT_GIVEN, NotGiven, RouterLike
from ._deadline import Deadline
from ._estimator import LatencyEstimator, prompt_bucket
from ._policies import AsyncHedgeGate, Breaker, HedgeGate, LatencySource, PolicyHub, Throttle
from .backends.base import RequestOptions

__all__ = [
    "NOT_GIVEN",
    "AsyncHedgeGate",
    "AttemptObserver",
    "AttemptResult",
    "Breaker",
    "CircuitBreaker",
    "Deadline",
    "HedgeBudget",
    "HedgeGate",
    "LatencyEstimator",
    "LatencySource",
    "NotGiven",
    "PolicyHub",
    "RequestOptions",
    "RetryThrottle",
    "RouterLike",
    "Target",
    "Throttle",
    "prompt_bucket",
]
