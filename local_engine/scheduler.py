"""Continuous batching under a per-step token budget (no torch).

Each step the scheduler picks, in this order and within ``max_num_batched_tokens``:

1. one token for every running sequence that is decoding (plus its draft tokens, when
   speculative decoding proposed some and the budget and pool have room for them: drafts
   are trimmed or dropped first, never a reason to preempt), growing its block table
   when a block fills; if the pool runs dry it preempts the most recently admitted
   running sequence (possibly the one asking) by recompute: its blocks are freed and
   it returns to the front of the waiting queue with its generated tokens kept, to be
   recomputed as part of its prompt;
2. the next chunk of every running sequence still prefilling;
3. new sequences from the waiting queue, first come first served, while blocks and
   ``max_num_seqs`` allow (none in a step that had to preempt). Admission allocates
   blocks for the whole prompt at once and reuses cached prefix blocks. A sequence that
   shares its prompt with another (``Sequence.shares_prompt_of``: the choices of an
   ``n > 1`` request) is passed over until that one has computed the prompt's full blocks,
   so it takes them from the prefix cache rather than computing them in the same step; the
   sequences behind it are admitted meanwhile.

Admission cannot deadlock: :meth:`Scheduler.add` rejects a sequence whose prompt plus
``max_tokens`` could never fit in the whole pool, and a lone running sequence can
always take every block, so it always makes progress.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from local_engine.kv_cache import BlockPool
from local_engine.sequence import Sequence, SequenceStatus

__all__ = ["ScheduledSequence", "Scheduler", "SchedulerOutput"]


@dataclass(slots=True)
class ScheduledSequence:
    """``num_new_tokens`` tokens of ``seq`` to compute, starting at position ``start``.

    ``samples`` is True when the chunk reaches the end of the sequence (prompt complete
    or a decode), so the step samples a token for it. ``num_spec_tokens`` of the new tokens
    are draft tokens (the last ones) for the model to verify; the engine sets
    ``num_accepted`` to how many of them it kept before :meth:`Scheduler.update`.
    """

    seq: Sequence
    start: int
    num_new_tokens: int
    samples: bool = False
    num_spec_tokens: int = 0
    num_accepted: int = 0

    @classmethod
    def of(cls, seq: Sequence, num_new_tokens: int) -> ScheduledSequence:
        """Schedule ``num_new_tokens`` tokens of ``seq`` after those already computed."""
        start = seq.num_computed_tokens
        return cls(seq, start, num_new_tokens, start + num_new_tokens == seq.num_tokens)


@dataclass(slots=True)
class SchedulerOutput:
    """What one step computes, and which sequences it preempted to make room."""

    scheduled: list[ScheduledSequence] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        """Total new tokens in this step."""
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        """True when there is nothing to compute."""
        return not self.scheduled


class Scheduler:
    """Decides which tokens of which sequences each engine step computes."""

    def __init__(
        self, pool: BlockPool, *, max_num_seqs: int = 64, max_num_batched_tokens: int = 2048
    ) -> None:
        """Schedule over ``pool``; ``max_num_batched_tokens`` must cover ``max_num_seqs``
        decodes so that no running sequence ever starves."""
        if max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
        if max_num_batched_tokens < max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({max_num_batched_tokens}) must be >= "
                f"max_num_seqs ({max_num_seqs})"
            )
        self.pool = pool
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # admission order: newest last
        self._seqs: dict[str, Sequence] = {}
        self.num_preemptions = 0  # total, for metrics and tests

    @property
    def num_waiting(self) -> int:
        """Sequences waiting for admission (new or preempted)."""
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        """Sequences holding KV blocks."""
        return len(self.running)

    def has_unfinished(self) -> bool:
        """True while any sequence is waiting or running."""
        return bool(self._seqs)

    def get(self, request_id: str) -> Sequence | None:
        """Return the live sequence with this id, if any."""
        return self._seqs.get(request_id)

    def max_blocks_for(self, seq: Sequence) -> int:
        """The most blocks ``seq`` can ever hold: the last sampled token is never computed."""
        return self.pool.blocks_for(seq.max_total_tokens - 1)

    def add(self, seq: Sequence) -> None:
        """Queue a new sequence; ValueError if its id is in use or it can never fit."""
        if seq.request_id in self._seqs:
            raise ValueError(f"request id {seq.request_id!r} is already in use")
        if seq.status is not SequenceStatus.WAITING or seq.block_table.block_ids:
            raise ValueError("only a fresh waiting sequence can be added")
        needed = self.max_blocks_for(seq)
        if needed > self.pool.num_blocks:
            raise ValueError(
                f"prompt ({seq.num_prompt_tokens} tokens) plus max_tokens "
                f"({seq.params.max_tokens}) needs {needed} KV blocks but the pool has only "
                f"{self.pool.num_blocks} of {self.pool.block_size} tokens"
            )
        self._seqs[seq.request_id] = seq
        self.waiting.append(seq)

    def schedule(self) -> SchedulerOutput:
        """Pick this step's work (see the module docstring for the policy)."""
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        # 1. decodes, oldest first; may preempt from the newest end. Drafts only take budget
        # that the decodes after them do not need.
        decodes_left = sum(1 for s in self.running if s.num_tokens - s.num_computed_tokens == 1)
        for seq in list(self.running):
            if budget == 0:
                break
            if seq.status is not SequenceStatus.RUNNING:
                continue  # preempted earlier in this loop
            if seq.num_tokens - seq.num_computed_tokens != 1:
                continue
            decodes_left -= 1
            spec = seq.spec_token_ids
            room = max(budget - 1 - decodes_left, 0)
            if len(spec) > room:
                del spec[room:]
            while not self.pool.append_slots(seq.block_table, seq.num_tokens + len(spec)):
                if spec:
                    spec.clear()
                    continue
                victim = self.running[-1]
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is seq:
                    break
            if seq.status is SequenceStatus.RUNNING:
                n = 1 + len(spec)
                out.scheduled.append(
                    ScheduledSequence(seq, seq.num_computed_tokens, n, True, len(spec))
                )
                budget -= n
        # 2. running prefills, next chunk each (their blocks were allocated at admission).
        for seq in self.running:
            remaining = seq.num_tokens - seq.num_computed_tokens
            if budget == 0:
                break
            if remaining > 1:
                n = min(remaining, budget)
                out.scheduled.append(ScheduledSequence.of(seq, n))
                budget -= n
        # 3. admissions.
        passed_over: list[Sequence] = []
        while (
            self.waiting
            and budget > 0
            and not out.preempted
            and len(self.running) < self.max_num_seqs
        ):
            seq = self.waiting.popleft()
            if self._awaits_shared_prompt(seq):
                passed_over.append(seq)
                continue
            cached = self.pool.allocate(seq.block_table, seq.token_ids, seq.prompt_cache_limit)
            if cached is None:
                self.waiting.appendleft(seq)
                break
            seq.shares_prompt_of = None
            seq.status = SequenceStatus.RUNNING
            seq.num_computed_tokens = cached
            if seq.num_cached_tokens is None:
                seq.num_cached_tokens = cached
            self.running.append(seq)
            n = min(seq.num_tokens - cached, budget)
            out.scheduled.append(ScheduledSequence.of(seq, n))
            budget -= n
        self.waiting.extendleft(reversed(passed_over))
        return out

    def _awaits_shared_prompt(self, seq: Sequence) -> bool:
        """True while the sequence ``seq`` shares its prompt with is live and has not yet
        computed the prompt's full blocks (all the prefix cache can give ``seq``)."""
        source = seq.shares_prompt_of
        if source is None or not self.pool.enable_prefix_caching:
            return False
        if seq.params.prompt_logprobs is not None:  # it takes no prompt blocks from the cache
            return False
        bs = self.pool.block_size
        shared = (seq.num_prompt_tokens - 1) // bs * bs
        return source.status is not SequenceStatus.FINISHED and source.num_computed_tokens < shared

    def update(self, out: SchedulerOutput) -> None:
        """Mark the scheduled tokens computed and publish newly full blocks' hashes.

        Call after the model ran the step and after appending the tokens it produced (the
        accepted drafts among them). Rejected draft tokens do not count as computed, and
        the blocks only they reached go back to the pool.
        """
        for item in out.scheduled:
            seq = item.seq
            if seq.status is not SequenceStatus.RUNNING:
                continue  # aborted while the step ran
            rejected = item.num_spec_tokens - item.num_accepted
            seq.num_computed_tokens = item.start + item.num_new_tokens - rejected
            if rejected:
                self.pool.truncate(seq.block_table, seq.num_computed_tokens + 1)
            self.pool.commit(seq.block_table, seq.token_ids, seq.num_computed_tokens)

    def finish(self, seq: Sequence) -> None:
        """Retire ``seq`` (stopped or aborted) and free its blocks."""
        if seq.status is SequenceStatus.FINISHED:
            return
        queue = self.running if seq.status is SequenceStatus.RUNNING else self.waiting
        try:
            queue.remove(seq)
        except ValueError:
            pass  # a step that raised while admitting ``seq`` left it in neither queue
        self.pool.free(seq.block_table)
        seq.status = SequenceStatus.FINISHED
        del self._seqs[seq.request_id]

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        seq.spec_token_ids.clear()
        self.pool.free(seq.block_table)
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        self.num_preemptions += 1
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
