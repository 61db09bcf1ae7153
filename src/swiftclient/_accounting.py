"""Accounting on the attempt hook: each call's attempts become one :class:`CallCost`.

:class:`Accounting` is an :class:`~swiftclient._attempt.AttemptObserver`. When an attempt
ends it notes what accounting needs (target, outcome, trigger, whether the request left the
client, the usage it reported) under the call's id; when the call finishes,
:meth:`Accounting.settle` takes the call's notes out, prices them with
:meth:`CallCost.from_attempts` and adds the result to the running :class:`HedgeStats`. State
lives only between an attempt's end and its call's end, so it cannot grow with traffic.

How an attempt's end is read:

- the attempt the call committed to is the winner whatever its own end (a stream the caller
  left early or that broke after it committed was still answered, and is billed);
- a request the client gave up on after sending it (first-token, idle or deadline timeout)
  counts as cancelled, so billed: the server may have run its prefill;
- a request that never left the client (no pooled connection, connect timeout) was not sent.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from . import errors
from ._attempt import noop_hook
from ._cost import AttemptRecord, CallCost, HedgeStats, Pricing
from ._outcome import Outcome
from ._policies import prompt_chars

if TYPE_CHECKING:
    from ._attempt import AttemptRun
    from ._stream import Call

__all__ = ["Accounting"]

_NOT_SENT = (errors.PoolTimeout, errors.ConnectTimeout)
_MAX_OPEN_CALLS = 10_000
"""Calls noted and not settled at once, at most: a stream never closed is forgotten, oldest
first, rather than kept for ever."""


class Accounting:
    """Per-call cost and client-wide totals, fed by the attempt hook (see the module).

    Args:
        pricing: prices per target; ``None`` keeps every count and leaves costs ``None``.
        max_open_calls: calls with notes awaiting their settlement, at most; past it the
            oldest is dropped (only a stream its caller never closes stays open).
    """

    __slots__ = ("_max_open", "_open", "pricing", "stats")

    def __init__(
        self, pricing: Pricing | None = None, *, max_open_calls: int = _MAX_OPEN_CALLS
    ) -> None:
        if pricing is not None and not isinstance(pricing, Pricing):
            raise errors.ConfigurationError(f"pricing must be a Pricing or None, got {pricing!r}")
        if isinstance(max_open_calls, bool) or not isinstance(max_open_calls, int):
            raise errors.ConfigurationError(f"max_open_calls must be an int: {max_open_calls!r}")
        if max_open_calls < 1:
            raise errors.ConfigurationError(f"max_open_calls must be >= 1: {max_open_calls}")
        self._max_open = max_open_calls
        self.pricing = pricing
        self.stats = HedgeStats()
        self._open: dict[str | None, list[tuple[int, AttemptRecord]]] = {}

    @property
    def open_calls(self) -> int:
        """Calls with an ended attempt whose call has not finished yet."""
        return len(self._open)

    def snapshot(self, *, reset: bool = False) -> HedgeStats:
        """A copy of the totals so far; ``reset`` starts counting from zero again."""
        copy = replace(self.stats)
        if reset:
            self.stats.reset()
        return copy

    # ------------------------------------------------------------------ AttemptObserver

    @noop_hook
    def on_start(self, attempt: AttemptRun) -> None:
        """Nothing to note until the attempt ends."""

    @noop_hook
    def on_first_token(self, attempt: AttemptRun) -> None:
        """Nothing to note until the attempt ends."""

    @noop_hook
    def on_commit(self, attempt: AttemptRun) -> None:
        """Nothing to note: the call knows its winner when it settles."""

    def on_end(self, attempt: AttemptRun) -> None:
        """Note the ended attempt under its call's id."""
        outcome: Outcome = attempt.outcome
        error = attempt.error
        sent = True
        if outcome == "failed" and error is not None:
            if isinstance(error, _NOT_SENT):
                sent = False
            elif isinstance(error, errors.APITimeoutError):
                outcome = "cancelled"  # abandoned after it was sent: billed
        usage = attempt.usage
        ended = (
            attempt.number,
            AttemptRecord(
                attempt.target.name,
                outcome,
                attempt.record.trigger == "hedge",
                sent,
                None if usage is None else usage.prompt_tokens,
                0 if usage is None else usage.completion_tokens,
                0 if usage is None else usage.cached_tokens,
                0 if usage is None else usage.cache_write_tokens,
                0 if usage is None else usage.cache_write_1h_tokens,
            ),
        )
        key = attempt.call_id
        open_calls = self._open
        notes = open_calls.get(key)
        if notes is not None:
            notes.append(ended)
            return
        if len(open_calls) >= self._max_open:
            del open_calls[next(iter(open_calls))]
        open_calls[key] = [ended]

    # ------------------------------------------------------------------ call end

    def settle(self, call: Call) -> CallCost:
        """The finished ``call``'s cost, added to the totals; its notes are dropped."""
        notes = self._open.pop(call.options.idempotency_key, None) or []
        if len(notes) > 1:
            notes.sort(key=_number)  # the order the attempts started
        winner = call.winner
        records = [_as_committed(record, number == winner) for number, record in notes]
        chars = 0
        if self.pricing is not None and any(r.input_tokens is None for r in records):
            chars = prompt_chars(call.request.messages)
        cost = CallCost.from_attempts(records, pricing=self.pricing, prompt_chars=chars)
        self.stats.add(cost)
        return cost


def _number(note: tuple[int, AttemptRecord]) -> int:
    return note[0]


def _as_committed(record: AttemptRecord, committed: bool) -> AttemptRecord:
    """``record`` with the call's verdict: the committed attempt won whatever its own end;
    any other that ended ``won`` lost the race."""
    if committed:
        return record if record.outcome == "won" else replace(record, outcome="won")
    return replace(record, outcome="lost") if record.outcome == "won" else record
