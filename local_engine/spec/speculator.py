"""The engine's side of speculative decoding: who speculates, how far, and what it earned.

Before each step :meth:`Speculator.propose` asks the proposer for drafts for every running
sequence that is about to decode and may speculate (no penalties, no log-probabilities:
those need per-position state the verification step does not keep). The scheduler fits the
drafts into the step; the runner scores them and hands the target rows to
:meth:`Speculator.verify`; the engine reports what was kept with :meth:`Speculator.verified`.

Back-off: each request keeps an exponential moving average of the drafts accepted per
verification and proposes at most one draft more than that (so the draft length grows to
``num_speculative_tokens`` while drafts are kept and shrinks when they are not: each draft
row adds to the target step's cost). Below ``min_accepted`` it pauses speculation for 2, 4,
8, ... steps (doubling with every consecutive pause, up to ``max_backoff_steps``), then
probes again with one draft; a probe that is kept resets the pause length. A new request
starts at the full draft length when proposing is free (n-gram lookup: its first drafts
cost only their rows in the target step, and a reply that copies the prompt is short enough
that a slow start would waste much of it), with a one-draft probe otherwise (a draft model
runs once per draft token). A step without drafts costs nothing extra, so a workload the
proposer cannot predict runs close to plain decoding.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable
from dataclasses import dataclass, replace
from typing import Protocol

import torch

from local_engine.sampler import Sampler
from local_engine.scheduler import ScheduledSequence
from local_engine.sequence import Sequence, SequenceStatus
from local_engine.stop import stop_token_ids

from .config import SpeculativeConfig
from .verify import Draft, verify_drafts

__all__ = ["Proposer", "SpecStats", "Speculator"]

_SMOOTHING = 0.5
"""Weight of the newest verification in a request's moving average of accepted drafts."""
_PROBE_AVERAGE = 0.0
"""The average a request back from a pause (or a new one, when proposing costs model work)
starts from: its next verification is a one-draft probe that decides whether it goes on
speculating."""


class Proposer(Protocol):
    """Where draft tokens come from."""

    def propose(self, seqs: list[Sequence], num_tokens: list[int]) -> list[Draft]:
        """Up to ``num_tokens[i]`` draft tokens for each ``seqs[i]`` (fewer, or none, is fine)."""
        ...

    def verified(self, seq: Sequence, num_accepted: int) -> None:
        """``seq`` kept ``num_accepted`` of its drafts (its tokens are already appended)."""
        ...

    def release(self, request_id: str) -> None:
        """Drop a finished request's state."""
        ...

    @property
    def free(self) -> bool:
        """True when proposing costs no model work (a new request then starts at the full
        draft length instead of a one-draft probe)."""
        ...


@dataclass
class SpecStats:
    """Speculative decoding counters, for the engine as a whole or for one request."""

    num_verifications: int = 0
    """Steps that verified drafts."""
    num_draft_tokens: int = 0
    """Draft tokens proposed and verified."""
    num_accepted_tokens: int = 0
    """Draft tokens the target model kept."""

    @property
    def acceptance_rate(self) -> float:
        """Accepted over proposed draft tokens (0.0 before any were proposed)."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    def add(self, proposed: int, accepted: int) -> None:
        """Count one verification."""
        self.num_verifications += 1
        self.num_draft_tokens += proposed
        self.num_accepted_tokens += accepted


@dataclass
class _RequestState:
    stats: SpecStats
    average: float  # moving average of accepted drafts per verification
    stop_ids: frozenset[int]  # tokens that end the request: drafts stop at the first
    trigger: int | None  # a lazy grammar's trigger token: drafts stop before it
    pause: int = 0  # steps left without speculation
    backoff: int = 2  # length of the next pause


class Speculator:
    """Drafts, verification and back-off for one engine."""

    def __init__(
        self,
        config: SpeculativeConfig,
        proposer: Proposer,
        sampler: Sampler,
        eos_token_ids: Collection[int] = (),
    ) -> None:
        """Speculate with ``proposer``; verification draws noise from ``sampler``.
        ``eos_token_ids`` end requests (unless they ignore EOS), as their stop tokens do: a
        draft is cut after the first such token, since nothing after it can be kept."""
        self.config = config
        self.eos_token_ids = frozenset(eos_token_ids)
        self.proposer = proposer
        self.sampler = sampler
        self.stats = SpecStats()
        self._states: dict[str, _RequestState] = {}
        self._drafts: dict[str, tuple[Sequence, Draft]] = {}  # this step's proposals
        # The average a new request starts from: a full-length first draft when proposing
        # is free, else a one-draft probe.
        self._start_average = (
            float(config.num_speculative_tokens - 1) if proposer.free else _PROBE_AVERAGE
        )

    def request_stats(self, request_id: str) -> SpecStats | None:
        """The counters of a live request (None when it never speculated): a snapshot,
        which later verifications leave as it is (they count in a new object)."""
        state = self._states.get(request_id)
        return state.stats if state is not None else None

    def propose(self, running: Iterable[Sequence]) -> None:
        """Set ``spec_token_ids`` on every running sequence (empty where it does not speculate)."""
        self._drafts.clear()  # drafts the scheduler had no room for were never verified
        asking: list[Sequence] = []
        counts: list[int] = []
        k_max = self.config.num_speculative_tokens
        for seq in running:
            seq.spec_token_ids = []
            if seq.num_tokens - seq.num_computed_tokens != 1 or not _may_speculate(seq):
                continue
            state = self._state(seq)
            if state.pause:
                state.pause -= 1
                continue
            # One more draft than the request's recent verifications kept: every draft row
            # costs the target step a little, so a request that misses proposes few.
            wanted = min(k_max, math.ceil(state.average) + 1)
            k = min(wanted, seq.max_total_tokens - seq.num_tokens - 1)
            if k > 0:
                asking.append(seq)
                counts.append(k)
        if not asking:
            return
        for seq, draft in zip(asking, self.proposer.propose(asking, counts), strict=True):
            state = self._states[seq.request_id]
            draft = _cut_at_stop(_cut_before(draft, state.trigger), state.stop_ids)
            if draft.tokens:
                seq.spec_token_ids = list(draft.tokens)
                self._drafts[seq.request_id] = (seq, draft)

    def verify(self, logits: torch.Tensor, items: list[ScheduledSequence]) -> list[list[int]]:
        """Emitted tokens of each verified item (see :func:`verify_drafts`)."""
        seqs = [item.seq for item in items]
        drafts = []
        for item in items:
            draft = self._drafts[item.seq.request_id][1]
            k = item.num_spec_tokens
            if k < len(draft.tokens):  # the scheduler trimmed it to the step's budget
                probs = draft.probs[:k] if draft.probs is not None else None
                draft = Draft(draft.tokens[:k], probs)
            drafts.append(draft)
        return verify_drafts(logits, seqs, drafts, self.sampler)

    def verified(self, seq: Sequence, proposed: int, accepted: int) -> None:
        """Count one verification of ``seq`` and decide whether it keeps speculating."""
        del self._drafts[seq.request_id]
        self.stats.add(proposed, accepted)
        state = self._state(seq)
        state.stats = replace(state.stats)  # outputs keep the snapshot they were given
        state.stats.add(proposed, accepted)
        state.average += _SMOOTHING * (accepted - state.average)
        if state.average < self.config.min_accepted:
            state.pause = state.backoff
            state.backoff = min(2 * state.backoff, self.config.max_backoff_steps)
            state.average = _PROBE_AVERAGE
        else:
            state.backoff = 2
        self.proposer.verified(seq, accepted)

    def release(self, request_id: str) -> None:
        """Forget a finished request."""
        self._states.pop(request_id, None)
        self._drafts.pop(request_id, None)
        self.proposer.release(request_id)

    def _state(self, seq: Sequence) -> _RequestState:
        state = self._states.get(seq.request_id)
        if state is None:
            stop_ids = stop_token_ids(seq.params, self.eos_token_ids)
            grammar = seq.params.grammar
            trigger = grammar.trigger if grammar is not None else None
            state = _RequestState(SpecStats(), self._start_average, stop_ids, trigger)
            self._states[seq.request_id] = state
        return state


def _cut_at_stop(draft: Draft, stop_ids: frozenset[int]) -> Draft:
    """``draft`` up to and including its first stop token: when that token is kept the
    request ends there, so later drafts would only add rows to the step."""
    for j, token in enumerate(draft.tokens):
        if token in stop_ids:
            if j + 1 == len(draft.tokens):
                break
            probs = draft.probs[: j + 1] if draft.probs is not None else None
            return Draft(draft.tokens[: j + 1], probs)
    return draft


def _cut_before(draft: Draft, trigger: int | None) -> Draft:
    """``draft`` up to, not including, its first ``trigger`` (a lazy grammar's): tokens
    after the trigger would need the grammar's masks, so the trigger itself comes only
    from the target model's own token at the end of a verification, and the grammar
    starts from there."""
    if trigger is None or trigger not in draft.tokens:
        return draft
    j = list(draft.tokens).index(trigger)
    probs = draft.probs[:j] if draft.probs is not None else None
    return Draft(draft.tokens[:j], probs)


def _may_speculate(seq: Sequence) -> bool:
    """Whether ``seq`` may take drafts: its sampling needs no state per position (no
    penalties, no logprobs, no grammar mask, which covers only the next token; a lazy
    grammar waiting for its trigger masks nothing yet)."""
    params = seq.params
    return (
        seq.status is SequenceStatus.RUNNING
        and not params.has_penalties
        and not params.logprobs
        and not seq.constrained
    )
