"""Accounting as arithmetic over a finished call: its attempts' results become one
:class:`CallCost`.

:class:`Accounting` keeps no state per call. When a call finishes, :meth:`Accounting.settle`
reads the call's frozen :class:`~swiftclient._stream.CallRecord` (the
:class:`~swiftclient._attempt.AttemptResult` of each attempt, and the winner), prices them
with :meth:`CallCost.from_attempts` and adds the cost to the running :class:`HedgeStats`.
A call that never finishes (a stream its caller never closes) leaves nothing behind here:
its results go with it.

How an attempt's end is read:

- the attempt the call committed to is the winner whatever its own end (a stream the caller
  left early or that broke after it committed was still answered, and is billed);
- a request the client gave up on after sending it (first-token, idle or deadline timeout)
  counts as cancelled, so billed: the server may have run its prefill;
- a request that never left the client (admission refused it or it was cancelled while it
  waited for admission; no pooled connection, connect timeout) was not sent.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from . import errors
from ._cost import AttemptRecord, CallCost, HedgeStats, Pricing
from ._outcome import Outcome
from ._policies import prompt_chars

if TYPE_CHECKING:
    from ._attempt import AttemptResult
    from ._stream import CallRecord

__all__ = ["Accounting", "attempt_record", "was_sent"]

_NOT_SENT = (errors.PoolTimeout, errors.ConnectTimeout)
"""Failures of a request handed to its backend that mean it never left the client (no
connection was had): such an attempt is neither billed nor counted as sent."""


def was_sent(result: AttemptResult) -> bool:
    """Whether the attempt's request left the client: it was handed to its backend (not
    refused admission, nor cancelled while it waited for it) and did not fail for want of a
    connection (:data:`_NOT_SENT`)."""
    if not result.sent:
        return False
    return not (result.outcome == "failed" and isinstance(result.error, _NOT_SENT))


class Accounting:
    """Per-call cost and client-wide totals (see the module).

    Args:
        pricing: prices per target; ``None`` keeps every count and leaves costs ``None``.
    """

    __slots__ = ("pricing", "stats")

    def __init__(self, pricing: Pricing | None = None) -> None:
        if pricing is not None and not isinstance(pricing, Pricing):
            raise errors.ConfigurationError(f"pricing must be a Pricing or None, got {pricing!r}")
        self.pricing = pricing
        self.stats = HedgeStats()

    def snapshot(self, *, reset: bool = False) -> HedgeStats:
        """A copy of the totals so far; ``reset`` starts counting from zero again."""
        copy = replace(self.stats)
        if reset:
            self.stats.reset()
        return copy

    def settle(self, record: CallRecord) -> CallCost:
        """The finished call's cost (from its attempts' results and the one it committed
        to), added to the totals."""
        winner = record.winner
        records = [attempt_record(result, result is winner) for result in record.results]
        chars = 0  # the prompt's size estimates what an attempt without usage was billed
        if any(r.input_tokens is None for r in records):
            chars = prompt_chars(record.request.messages)
        cost = CallCost.from_attempts(records, pricing=self.pricing, prompt_chars=chars)
        self.stats.add(cost)
        return cost


def attempt_record(result: AttemptResult, committed: bool) -> AttemptRecord:
    """What accounting reads of one ended attempt, with the call's verdict: the committed
    attempt won whatever its own end; any other that ended ``won`` lost the race."""
    outcome: Outcome = result.outcome
    error = result.error
    sent = was_sent(result)
    if sent and outcome == "failed" and isinstance(error, errors.APITimeoutError):
        outcome = "cancelled"  # abandoned after it was sent: billed
    if committed:
        outcome = "won"
    elif outcome == "won":
        outcome = "lost"
    usage = result.usage
    if usage is None:
        return AttemptRecord(result.target.name, outcome, result.trigger == "hedge", sent)
    return AttemptRecord(
        result.target.name,
        outcome,
        result.trigger == "hedge",
        sent,
        usage.prompt_tokens,
        usage.completion_tokens,
        usage.cached_tokens,
        usage.cache_write_tokens,
        usage.cache_write_1h_tokens,
    )
