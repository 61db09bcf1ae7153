"""Scheduler: budgets, chunked prefill, preemption, no deadlock, abort (torch-free)."""

from __future__ import annotations

import pytest

from local_engine.kv_cache import BlockPool
from local_engine.sampling_params import SamplingParams
from local_engine.scheduler import Scheduler, SchedulerOutput
from local_engine.sequence import Sequence, SequenceStatus

BS = 4


def make_seq(
    rid: str, n: int, max_tokens: int = 8, base: int = 0, salt: str | None = None
) -> Sequence:
    """A sequence with an ``n``-token prompt of distinct ids starting at ``base``."""
    prompt = list(range(base, base + n))
    return Sequence(rid, prompt, SamplingParams(max_tokens=max_tokens), cache_salt=salt)


def run_step(sched: Scheduler) -> SchedulerOutput:
    """One fake engine step: every sampling sequence gets token 7; finish at max_tokens."""
    out = sched.schedule()
    sched.update(out)
    for item in out.scheduled:
        if item.samples:
            item.seq.append_token(7)
            if item.seq.num_generated_tokens >= item.seq.params.max_tokens:
                sched.finish(item.seq)
    return out


def drain(sched: Scheduler, limit: int = 1000) -> int:
    """Run until nothing is left; return the number of steps."""
    steps = 0
    while sched.has_unfinished():
        run_step(sched)
        steps += 1
        if steps > limit:
            raise AssertionError("scheduler made no progress")
    return steps


def test_prefill_then_decode() -> None:
    sched = Scheduler(BlockPool(16, BS), max_num_seqs=4, max_num_batched_tokens=64)
    seq = make_seq("a", 10, max_tokens=3)
    sched.add(seq)
    out = run_step(sched)
    assert [(s.start, s.num_new_tokens, s.samples) for s in out.scheduled] == [(0, 10, True)]
    out = run_step(sched)
    assert [(s.start, s.num_new_tokens) for s in out.scheduled] == [(10, 1)]
    run_step(sched)
    assert seq.is_finished and seq.output_token_ids == [7, 7, 7]
    assert sched.pool.num_free_blocks == 16


def test_chunked_prefill_respects_budget_and_mixes_decodes_first() -> None:
    sched = Scheduler(BlockPool(64, BS), max_num_seqs=4, max_num_batched_tokens=8)
    short = make_seq("short", 3, max_tokens=20)
    long = make_seq("long", 20, base=100)
    sched.add(short)
    sched.add(long)
    out = run_step(sched)
    assert [(s.seq.request_id, s.num_new_tokens) for s in out.scheduled] == [
        ("short", 3),
        ("long", 5),
    ]
    assert not out.scheduled[1].samples
    for _ in range(3):
        out = run_step(sched)
        assert out.num_batched_tokens <= 8
        assert out.scheduled[0].seq is short and out.scheduled[0].num_new_tokens == 1
    # 5 + 7 + 7 + 1 = 20: the last chunk completes the prompt and samples.
    assert [s.num_new_tokens for s in out.scheduled] == [1, 1]
    assert out.scheduled[1].samples and long.num_generated_tokens == 1


def test_max_num_seqs_limits_running() -> None:
    sched = Scheduler(BlockPool(64, BS), max_num_seqs=2, max_num_batched_tokens=64)
    for i in range(3):
        sched.add(make_seq(str(i), 4, base=10 * i))
    run_step(sched)
    assert sched.num_running == 2 and sched.num_waiting == 1


def test_budget_must_cover_max_num_seqs() -> None:
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        Scheduler(BlockPool(4, BS), max_num_seqs=8, max_num_batched_tokens=4)


def test_preempts_newest_by_recompute_and_keeps_generated_tokens() -> None:
    pool = BlockPool(4, BS)
    sched = Scheduler(pool, max_num_seqs=4, max_num_batched_tokens=64)
    old = make_seq("old", 4, max_tokens=8)
    new = make_seq("new", 4, max_tokens=8, base=50)
    sched.add(old)
    sched.add(new)
    run_step(sched)  # both prefilled: 1 block each, 2 free
    run_step(sched)  # both decode into a second block: 0 free
    assert pool.num_free_blocks == 0
    for _ in range(3):
        run_step(sched)
    # Each needs a third block now; "new" (admitted last) is preempted for "old".
    out = run_step(sched)
    assert out.preempted == [new]
    assert new.status is SequenceStatus.WAITING and sched.waiting[0] is new
    assert new.num_computed_tokens == 0 and new.block_table.block_ids == []
    assert new.output_token_ids == [7] * 5  # generated tokens kept for recompute
    assert [s.seq for s in out.scheduled] == [old]
    drain(sched)
    assert old.output_token_ids == [7] * 8 and new.output_token_ids == [7] * 8
    # The resumed sequence recomputed prompt + generated tokens in one chunk.
    assert new.num_preemptions == 1
    assert pool.num_free_blocks == 4


def test_request_that_fits_alone_always_finishes_among_others() -> None:
    pool = BlockPool(6, BS)
    sched = Scheduler(pool, max_num_seqs=8, max_num_batched_tokens=32)
    big = make_seq("big", 8, max_tokens=17)  # 24 tokens in KV at most = 6 blocks
    sched.add(big)
    for i in range(4):
        sched.add(make_seq(f"s{i}", 3, max_tokens=9, base=100 + 10 * i))
    drain(sched)
    assert big.output_token_ids == [7] * 17
    assert pool.num_free_blocks == 6


def test_request_that_can_never_fit_is_rejected() -> None:
    sched = Scheduler(BlockPool(4, BS), max_num_seqs=4, max_num_batched_tokens=16)
    with pytest.raises(ValueError, match="KV blocks"):
        sched.add(make_seq("x", 10, max_tokens=8))  # 17 tokens in KV > 16 slots
    sched.add(make_seq("y", 10, max_tokens=7))  # exactly 16: fits
    assert sched.num_waiting == 1


def test_duplicate_request_id_rejected() -> None:
    sched = Scheduler(BlockPool(4, BS), max_num_seqs=4, max_num_batched_tokens=16)
    sched.add(make_seq("x", 2))
    with pytest.raises(ValueError, match="already in use"):
        sched.add(make_seq("x", 2))


def test_no_deadlock_under_heavy_contention() -> None:
    pool = BlockPool(8, BS)
    sched = Scheduler(pool, max_num_seqs=6, max_num_batched_tokens=6)
    seqs = [make_seq(str(i), 3 + i % 7, max_tokens=4 + i % 9, base=20 * i) for i in range(24)]
    for s in seqs:
        sched.add(s)
    drain(sched, limit=5000)
    assert all(s.num_generated_tokens == s.params.max_tokens for s in seqs)
    assert sum(s.num_preemptions for s in seqs) > 0
    assert pool.num_free_blocks == 8


def test_prefix_cache_hit_skips_computed_tokens() -> None:
    sched = Scheduler(BlockPool(16, BS), max_num_seqs=4, max_num_batched_tokens=64)
    first = make_seq("a", 9, max_tokens=1)
    sched.add(first)
    drain(sched)
    second = make_seq("b", 10, max_tokens=1)
    sched.add(second)
    out = run_step(sched)
    assert (out.scheduled[0].start, out.scheduled[0].num_new_tokens) == (8, 2)
    assert second.num_cached_tokens == 8
    third = make_seq("c", 10, max_tokens=1, salt="other")
    sched.add(third)
    out = run_step(sched)
    assert out.scheduled[0].start == 0 and third.num_cached_tokens == 0


def test_finish_frees_blocks_waiting_and_running() -> None:
    pool = BlockPool(8, BS)
    sched = Scheduler(pool, max_num_seqs=1, max_num_batched_tokens=16)
    a, b = make_seq("a", 6), make_seq("b", 6, base=40)
    sched.add(a)
    sched.add(b)
    run_step(sched)
    assert pool.num_free_blocks == 6
    sched.finish(a)
    assert a.is_finished and pool.num_free_blocks == 8
    sched.finish(b)
    assert sched.num_waiting == 0
    sched.finish(a)  # already finished: nothing to free twice
    assert pool.num_free_blocks == 8
    assert not sched.has_unfinished()


def test_a_sequence_lost_by_a_failed_admission_can_still_be_finished(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An admission that raised (a salt the prefix cache could not hash) left the sequence
    out of both queues while it still said waiting; finishing it (what aborting every
    request does when the engine fails) raised "not in deque"."""
    pool = BlockPool(8, BS)
    sched = Scheduler(pool, max_num_seqs=2, max_num_batched_tokens=16)
    seq = make_seq("a", 6)
    sched.add(seq)

    def broken(*args: object) -> None:
        raise UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed")

    monkeypatch.setattr(pool, "allocate", broken)
    with pytest.raises(UnicodeEncodeError):
        sched.schedule()
    assert seq.status is SequenceStatus.WAITING and sched.num_waiting == 0
    sched.finish(seq)
    assert seq.is_finished and pool.num_free_blocks == 8 and not sched.has_unfinished()


def test_update_ignores_sequences_aborted_mid_step() -> None:
    sched = Scheduler(BlockPool(8, BS), max_num_seqs=2, max_num_batched_tokens=16)
    seq = make_seq("a", 6)
    sched.add(seq)
    out = sched.schedule()
    sched.finish(seq)
    sched.update(out)
    assert seq.num_computed_tokens == 0 and sched.pool.num_free_blocks == 8


def test_a_sequence_sharing_a_prompt_waits_for_its_full_blocks_and_lets_others_pass() -> None:
    """The choices of an ``n > 1`` request: the others are admitted once the first has
    computed the prompt's full blocks and share them; requests behind them go ahead."""
    sched = Scheduler(BlockPool(64, BS), max_num_seqs=8, max_num_batched_tokens=20)
    first = make_seq("c0", 14, max_tokens=3)  # 3 full blocks (12 tokens) to share
    choices = [
        Sequence(f"c{i}", first.token_ids, first.params, shares_prompt_of=first) for i in (1, 2)
    ]
    other = make_seq("o", 3, max_tokens=3, base=100)
    for seq in (first, *choices, other):
        sched.add(seq)
    out = run_step(sched)
    assert [(s.seq.request_id, s.num_new_tokens) for s in out.scheduled] == [("c0", 14), ("o", 3)]
    assert list(sched.waiting) == choices
    out = run_step(sched)
    assert [(s.seq.request_id, s.num_new_tokens) for s in out.scheduled] == [
        ("c0", 1),
        ("o", 1),
        ("c1", 2),
        ("c2", 2),
    ]
    shared = first.block_table.block_ids[:3]
    for choice in choices:
        assert choice.num_cached_tokens == 12
        assert choice.block_table.block_ids[:3] == shared
        assert choice.shares_prompt_of is None
    assert [sched.pool.ref_count(b) for b in shared] == [3, 3, 3]
    drain(sched)
    assert sched.pool.num_free_blocks == 64


def test_a_sequence_sharing_a_prompt_goes_alone_once_the_other_is_gone() -> None:
    sched = Scheduler(BlockPool(64, BS), max_num_seqs=8, max_num_batched_tokens=20)
    first = make_seq("c0", 14)
    choice = Sequence("c1", first.token_ids, first.params, shares_prompt_of=first)
    sched.add(first)
    sched.add(choice)
    sched.finish(first)  # aborted before it computed anything
    out = run_step(sched)
    assert [(s.seq.request_id, s.num_new_tokens) for s in out.scheduled] == [("c1", 14)]


def test_a_short_shared_prompt_has_no_full_block_to_wait_for() -> None:
    sched = Scheduler(BlockPool(64, BS), max_num_seqs=8, max_num_batched_tokens=20)
    first = make_seq("c0", BS)  # its one block holds the last token: never shared
    choice = Sequence("c1", first.token_ids, first.params, shares_prompt_of=first)
    sched.add(first)
    sched.add(choice)
    out = run_step(sched)
    assert [(s.seq.request_id, s.num_new_tokens) for s in out.scheduled] == [("c0", 4), ("c1", 4)]
