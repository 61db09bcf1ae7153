"""How an attempt ends: the one vocabulary, defined once.

An attempt's record (:class:`~swiftclient.types.Attempt`, in ``timing.attempts`` and on
errors) names its end ``ok`` or ``error``; what observers read (``AttemptResult.outcome``),
accounting (:class:`~swiftclient._cost.AttemptRecord`) and telemetry
(``swiftclient.outcome``) name the same ends ``won`` or ``failed``. Both spellings are
public, so both stay; they are defined here side by side, with the one map between them,
and every other module imports them from here.
"""

from __future__ import annotations

from typing import Final, Literal

__all__ = ["OUTCOME_OF", "AttemptOutcome", "Outcome"]

AttemptOutcome = Literal["ok", "error", "cancelled", "lost", "pending"]
"""An attempt's end as its record says it: ``ok`` (committed and finished), ``error``,
``cancelled``, ``lost`` (another attempt committed first; this one was cancelled or
discarded) or ``pending``."""

Outcome = Literal["won", "lost", "cancelled", "failed", "pending"]
"""The same ends as observers, accounting and telemetry say them: ``won`` is ``ok`` and
``failed`` is ``error``; the others are spelled alike."""

OUTCOME_OF: Final[dict[AttemptOutcome, Outcome]] = {
    "ok": "won",
    "error": "failed",
    "cancelled": "cancelled",
    "lost": "lost",
    "pending": "pending",
}
"""A record's outcome in the observers' words (read it, never change it)."""
