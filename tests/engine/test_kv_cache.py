"""Block pool: ref-counts, prefix hits, salt isolation, LRU eviction (torch-free)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from local_engine.kv_cache import BlockPool, BlockTable, hash_block

BS = 4


def computed(pool: BlockPool, tokens: list[int], salt: str | None = None) -> BlockTable:
    """Allocate ``tokens`` and mark them all computed (as after a full prefill)."""
    table = BlockTable(salt)
    assert pool.allocate(table, tokens) is not None
    pool.commit(table, tokens, len(tokens))
    return table


def test_engine_bookkeeping_imports_no_torch() -> None:
    code = (
        "import sys\n"
        "import local_engine.kv_cache, local_engine.scheduler, local_engine.sequence\n"
        "import local_engine.sampling_params, local_engine.stop\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_hash_chain_depends_on_parent_tokens_and_salt() -> None:
    a = hash_block(None, [1, 2, 3, 4])
    assert a == hash_block(None, [1, 2, 3, 4])
    assert a != hash_block(None, [1, 2, 3, 5])
    assert a != hash_block(None, [1, 2, 3, 4], "tenant")
    assert hash_block(a, [5, 6, 7, 8]) != hash_block(None, [5, 6, 7, 8])
    assert hash_block(None, [1], "") != hash_block(None, [1])


def test_allocate_and_free_restore_counts() -> None:
    pool = BlockPool(8, BS)
    table = BlockTable()
    assert pool.allocate(table, list(range(10))) == 0
    assert len(table) == 3
    assert pool.num_free_blocks == 5
    assert all(pool.ref_count(b) == 1 for b in table.block_ids)
    pool.free(table)
    assert pool.num_free_blocks == 8
    assert table.block_ids == []


def test_allocate_refuses_atomically_when_short() -> None:
    pool = BlockPool(3, BS)
    keep = BlockTable()
    assert pool.allocate(keep, list(range(8))) == 0
    table = BlockTable()
    assert pool.allocate(table, list(range(100, 108))) is None
    assert table.block_ids == [] and pool.num_free_blocks == 1


def test_prefix_hit_shares_blocks_and_keeps_last_token_uncached() -> None:
    pool = BlockPool(16, BS)
    prompt = list(range(12))
    first = computed(pool, prompt)
    assert pool.num_cached_blocks == 3
    second = BlockTable()
    # 12 tokens = 3 full blocks, but the last token must be computed: only 2 blocks hit.
    assert pool.allocate(second, prompt) == 8
    assert second.block_ids[:2] == first.block_ids[:2]
    assert second.block_ids[2] != first.block_ids[2]
    assert pool.ref_count(first.block_ids[0]) == 2
    # A longer prompt with the same prefix hits all three blocks.
    third = BlockTable()
    assert pool.allocate(third, [*prompt, 99]) == 12
    assert third.block_ids[:3] == first.block_ids


def test_partial_prefix_match_stops_at_first_difference() -> None:
    pool = BlockPool(16, BS)
    computed(pool, list(range(12)))
    table = BlockTable()
    tokens = [0, 1, 2, 3, 9, 9, 9, 9, 8, 9, 10, 11, 12]
    assert pool.allocate(table, tokens) == 4


def test_uncommitted_blocks_are_not_shared() -> None:
    pool = BlockPool(16, BS)
    prompt = list(range(9))
    first = BlockTable()
    pool.allocate(first, prompt)
    pool.commit(first, prompt, 4)  # only the first chunk has been computed
    table = BlockTable()
    assert pool.allocate(table, prompt) == 4


def test_salt_isolates_tenants() -> None:
    pool = BlockPool(16, BS)
    prompt = list(range(9))
    computed(pool, prompt, salt="alice")
    assert pool.allocate(BlockTable("bob"), prompt) == 0
    assert pool.allocate(BlockTable(), prompt) == 0
    assert pool.allocate(BlockTable("alice"), prompt) == 8


def test_freed_blocks_stay_cached_until_evicted_lru() -> None:
    pool = BlockPool(4, BS)
    old = computed(pool, [1, 1, 1, 1, 0])
    new = computed(pool, [2, 2, 2, 2, 0])
    old_block, new_block = old.block_ids[0], new.block_ids[0]
    pool.free(old)
    pool.free(new)
    assert pool.num_free_blocks == 4 and pool.num_evictable_blocks == 2
    # Both prefixes are still reusable after being freed.
    probe = BlockTable()
    assert pool.allocate(probe, [1, 1, 1, 1, 5]) == 4
    pool.free(probe)
    # Now [2...] was freed longest ago; filling the pool evicts it before [1...].
    filler = BlockTable()
    assert pool.allocate(filler, list(range(100, 112))) == 0
    assert new_block in filler.block_ids and old_block not in filler.block_ids
    pool.free(filler)
    assert pool.allocate(BlockTable(), [1, 1, 1, 1, 7]) == 4
    assert pool.allocate(BlockTable(), [2, 2, 2, 2, 7]) == 0


def test_plain_free_blocks_are_used_before_cached_ones() -> None:
    pool = BlockPool(4, BS)
    cached = computed(pool, [3, 3, 3, 3, 0])
    pool.free(cached)
    table = BlockTable()
    pool.allocate(table, list(range(8)))
    assert cached.block_ids == [] and pool.num_evictable_blocks == 1
    assert pool.allocate(BlockTable(), [3, 3, 3, 3, 1]) == 4


def test_free_releases_tail_first_so_prefix_outlives_suffix() -> None:
    pool = BlockPool(3, BS)
    table = computed(pool, list(range(12)))
    head, tail = table.block_ids[0], table.block_ids[2]
    pool.free(table)
    grab = BlockTable()
    pool.allocate(grab, [50])
    assert grab.block_ids == [tail]
    assert head not in grab.block_ids


def test_revived_cached_block_counts_against_free_space() -> None:
    pool = BlockPool(3, BS)
    table = computed(pool, list(range(8)))
    pool.free(table)
    assert pool.num_free_blocks == 3
    again = BlockTable()
    # 9 tokens need 3 blocks: 2 revived from cache + 1 new.
    assert pool.allocate(again, [*range(8), 8]) == 8
    assert pool.num_free_blocks == 0


def test_append_slots_grows_by_block() -> None:
    pool = BlockPool(3, BS)
    table = BlockTable()
    pool.allocate(table, [1, 2, 3, 4])
    assert pool.append_slots(table, 4) and len(table) == 1
    assert pool.append_slots(table, 5) and len(table) == 2
    assert pool.append_slots(table, 12) and len(table) == 3
    assert not pool.can_append(table, 13)
    assert not pool.append_slots(table, 13) and len(table) == 3


def test_identical_prompts_computed_together_keep_one_cached_copy() -> None:
    pool = BlockPool(8, BS)
    prompt = list(range(5))
    a, b = BlockTable(), BlockTable()
    pool.allocate(a, prompt)
    pool.allocate(b, prompt)
    pool.commit(a, prompt, 5)
    pool.commit(b, prompt, 5)
    assert pool.num_cached_blocks == 1
    pool.free(a)
    pool.free(b)
    assert pool.num_free_blocks == 8 and pool.num_evictable_blocks == 1


def test_prefix_caching_disabled_never_hits() -> None:
    pool = BlockPool(8, BS, enable_prefix_caching=False)
    computed(pool, list(range(9)))
    assert pool.allocate(BlockTable(), list(range(9))) == 0
    assert pool.num_cached_blocks == 0


def test_reset_prefix_cache_forgets_unreferenced_blocks() -> None:
    pool = BlockPool(8, BS)
    pool.free(computed(pool, list(range(9))))
    pool.reset_prefix_cache()
    assert pool.num_cached_blocks == 0 and pool.num_free_blocks == 8
    assert pool.allocate(BlockTable(), list(range(9))) == 0


@pytest.mark.parametrize(("blocks", "size"), [(0, 4), (4, 0)])
def test_bad_pool_shape(blocks: int, size: int) -> None:
    with pytest.raises(ValueError):
        BlockPool(blocks, size)
