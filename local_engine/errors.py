"""The engine's own errors (no swiftclient): what the core raises and the server maps.

The engine core (config, loader, model, attention, KV cache, scheduler, sampler, runner,
engine, async engine and their helpers) raises only these, and plain ``ValueError`` /
``TypeError`` for misuse of its Python API. The OpenAI-compatible layer maps them once:
:mod:`local_engine.server` onto HTTP statuses, :class:`~local_engine.backend.LocalBackend`
onto swiftclient's errors.

- :class:`InvalidRequestError`: a request the engine refuses (bad prompt ids, a prompt too
  long, a schema that cannot be compiled, an unsupported field). The server answers 400;
  ``LocalBackend`` raises ``BadRequestError``. One type from the place that finds it to the
  400.
- :class:`EngineConfigError`: bad engine settings or model files (``ConfigurationError`` from
  ``LocalBackend``; the server and the command line refuse to start).
- :class:`EngineError`: the engine failed (a step raised, it shut down); the server answers
  500. :class:`OverloadedError`: the waiting queue is full (503). :class:`GrammarFailedError`:
  a reply's grammar failed partway through decoding (400 from the server, with the reason:
  the request's schema met a limit of the grammar library).
"""

from __future__ import annotations

__all__ = [
    "EngineConfigError",
    "EngineError",
    "GrammarFailedError",
    "InvalidRequestError",
    "OverloadedError",
]


class InvalidRequestError(ValueError):
    """A request the engine refuses as it is; sending it again will not help (a 400).

    ``param`` names the offending request field when there is one (``"n"``, ``"messages"``),
    as OpenAI's error objects name it.
    """

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class EngineConfigError(ValueError):
    """Engine settings, or model files, the engine cannot work with."""


class EngineError(Exception):
    """The engine failed while serving requests (a 500)."""


class OverloadedError(EngineError):
    """The engine's waiting queue is full; try again later (a 503)."""


class GrammarFailedError(EngineError):
    """A reply's grammar failed partway through decoding (a limit of the grammar library was
    hit), so the text so far does not follow it and there is no reply.

    A grammar that fails at once is refused before decoding instead
    (:class:`~local_engine.grammar.GrammarError`, an :class:`InvalidRequestError`).
    """
