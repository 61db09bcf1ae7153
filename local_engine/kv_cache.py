"""The paged KV-cache block pool: ref-counts, a free list, prefix caching, LRU (no torch).

The pool hands out block ids; the model's KV tensors are indexed by them. A block that
is full and whose KV has been computed gets a *prefix hash* chained over every block
before it (plus an optional salt mixed into the first one, so tenants never share
blocks). Later sequences with the same prefix reuse such blocks instead of recomputing
them. A block nothing references goes back to the pool; if it holds a hash it stays
reusable until an allocation evicts it, least recently freed first.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict, deque
from collections.abc import Sequence

__all__ = ["BlockPool", "BlockTable", "hash_block"]


def hash_block(parent: bytes | None, token_ids: Sequence[int], salt: str | None = None) -> bytes:
    """Return the chained hash of one full block.

    ``parent`` is the previous block's hash (``None`` for the first block); ``salt`` is
    mixed into the first block only, which makes every later hash salt-dependent too.
    A 128-bit BLAKE2b digest keeps accidental collisions out of reach.
    """
    h = hashlib.blake2b(digest_size=16)
    if parent is None:
        # surrogatepass: a salt is any str a request carried (a lone surrogate included)
        h.update(b"\x00" if salt is None else b"\x01" + salt.encode("utf-8", "surrogatepass"))
    else:
        h.update(b"\x02" + parent)
    h.update(array("q", token_ids).tobytes())
    return h.digest()


class BlockTable:
    """One sequence's blocks, in position order, plus its cached prefix hashes.

    ``hashes[i]`` is the chained hash of block ``i`` once its tokens are known (they
    depend only on the tokens, so they survive preemption). ``num_registered`` counts
    leading blocks whose hash is already published in the pool.
    """

    __slots__ = ("block_ids", "hashes", "num_registered", "salt")

    def __init__(self, salt: str | None = None) -> None:
        self.block_ids: list[int] = []
        self.hashes: list[bytes] = []
        self.num_registered = 0
        self.salt = salt

    def __len__(self) -> int:
        return len(self.block_ids)

    def compute_hashes(
        self, token_ids: Sequence[int], num_full_blocks: int, block_size: int
    ) -> None:
        """Extend ``hashes`` to cover the first ``num_full_blocks`` blocks of ``token_ids``."""
        for i in range(len(self.hashes), num_full_blocks):
            parent = self.hashes[i - 1] if i else None
            block = token_ids[i * block_size : (i + 1) * block_size]
            self.hashes.append(hash_block(parent, block, self.salt))


class BlockPool:
    """A fixed pool of ``num_blocks`` KV blocks of ``block_size`` token slots each."""

    def __init__(
        self, num_blocks: int, block_size: int, *, enable_prefix_caching: bool = True
    ) -> None:
        """Create the pool; every block starts free and unhashed."""
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._ref_counts = [0] * num_blocks
        self._block_hash: list[bytes | None] = [None] * num_blocks
        self._free: deque[int] = deque(range(num_blocks))  # unreferenced, no hash
        self._evictable: OrderedDict[int, None] = OrderedDict()  # unreferenced, hashed; LRU first
        self._cached: dict[bytes, int] = {}  # prefix hash -> block id

    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation may take now (free ones plus evictable cached ones)."""
        return len(self._free) + len(self._evictable)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks that hold a reusable prefix hash, referenced or not."""
        return len(self._cached)

    @property
    def num_evictable_blocks(self) -> int:
        """Cached blocks that nothing references (reusable, or evicted on demand)."""
        return len(self._evictable)

    def ref_count(self, block_id: int) -> int:
        """Return how many sequences reference ``block_id``."""
        return self._ref_counts[block_id]

    def blocks_for(self, num_tokens: int) -> int:
        """Return how many blocks hold ``num_tokens`` tokens."""
        return -(-num_tokens // self.block_size)

    def allocate(
        self, table: BlockTable, token_ids: Sequence[int], max_hit_tokens: int | None = None
    ) -> int | None:
        """Give an empty ``table`` blocks for all of ``token_ids``; reuse cached prefixes
        (at most ``max_hit_tokens`` tokens of them when given).

        Returns the number of leading tokens whose KV is already cached (a multiple of
        ``block_size``, always leaving at least the last token to compute), or ``None``
        when the pool lacks free blocks; then nothing changes.
        """
        if table.block_ids:
            raise ValueError("allocate() needs an empty block table")
        if not token_ids:
            raise ValueError("cannot allocate blocks for zero tokens")
        hits = self._lookup(table, token_ids)
        if max_hit_tokens is not None:
            del hits[max(max_hit_tokens, 0) // self.block_size :]
        needed = self.blocks_for(len(token_ids)) - len(hits)
        revived = sum(1 for b in hits if self._ref_counts[b] == 0)
        if needed > self.num_free_blocks - revived:
            return None
        for b in hits:
            if self._ref_counts[b] == 0:
                del self._evictable[b]
            self._ref_counts[b] += 1
        table.block_ids = hits + [self._take() for _ in range(needed)]
        table.num_registered = len(hits)
        return len(hits) * self.block_size

    def _lookup(self, table: BlockTable, token_ids: Sequence[int]) -> list[int]:
        if not self.enable_prefix_caching:
            return []
        max_hit_blocks = (len(token_ids) - 1) // self.block_size
        table.compute_hashes(token_ids, max_hit_blocks, self.block_size)
        hits: list[int] = []
        for h in table.hashes[:max_hit_blocks]:
            block = self._cached.get(h)
            if block is None:
                break
            hits.append(block)
        return hits

    def _take(self) -> int:
        if self._free:
            block = self._free.popleft()
        else:
            block, _ = self._evictable.popitem(last=False)
            old = self._block_hash[block]
            if old is not None:
                del self._cached[old]
                self._block_hash[block] = None
        self._ref_counts[block] = 1
        return block

    def can_append(self, table: BlockTable, num_tokens: int) -> bool:
        """Return True if ``table`` can grow to hold ``num_tokens`` tokens."""
        return self.blocks_for(num_tokens) - len(table) <= self.num_free_blocks

    def append_slots(self, table: BlockTable, num_tokens: int) -> bool:
        """Grow ``table`` to hold ``num_tokens`` tokens; False (no change) if blocks run out."""
        extra = self.blocks_for(num_tokens) - len(table)
        if extra > self.num_free_blocks:
            return False
        table.block_ids.extend(self._take() for _ in range(extra))
        return True

    def truncate(self, table: BlockTable, num_tokens: int) -> None:
        """Release ``table``'s blocks past those holding ``num_tokens`` tokens (tail first).

        Speculative decoding grows a table for its draft tokens before they are verified;
        the blocks only rejected drafts reached come back here. A released block loses
        nothing the prefix cache needs: its hash, if any, stays published as in :meth:`free`.
        """
        keep = self.blocks_for(num_tokens)
        while len(table.block_ids) > keep:
            block = table.block_ids.pop()
            self._release(block)
        table.num_registered = min(table.num_registered, keep)

    def _release(self, block: int) -> None:
        self._ref_counts[block] -= 1
        if self._ref_counts[block] == 0:
            if self._block_hash[block] is None:
                self._free.append(block)
            else:
                self._evictable[block] = None

    def commit(self, table: BlockTable, token_ids: Sequence[int], num_computed: int) -> None:
        """Publish the hashes of blocks that became full now that ``num_computed`` tokens
        of ``token_ids`` have their KV in the cache.

        If another block already holds the same prefix (two identical prompts computed
        in the same step), the existing one stays cached and this one stays private.
        """
        if not self.enable_prefix_caching:
            return
        num_full = min(num_computed // self.block_size, len(table))
        if num_full <= table.num_registered:
            return
        table.compute_hashes(token_ids, num_full, self.block_size)
        for i in range(table.num_registered, num_full):
            h = table.hashes[i]
            block = table.block_ids[i]
            if h not in self._cached and self._block_hash[block] is None:
                self._cached[h] = block
                self._block_hash[block] = h
        table.num_registered = num_full

    def free(self, table: BlockTable) -> None:
        """Drop ``table``'s references; its hashes stay for a later re-allocation.

        Blocks are released tail first, so under LRU the end of a prefix is evicted
        before its beginning (the beginning is the part other requests share).
        """
        for block in reversed(table.block_ids):
            self._release(block)
        table.block_ids = []
        table.num_registered = 0

    def reset_prefix_cache(self) -> None:
        """Forget every unreferenced cached prefix (their blocks become plain free blocks)."""
        while self._evictable:
            block, _ = self._evictable.popitem(last=False)
            old = self._block_hash[block]
            if old is not None:
                del self._cached[old]
                self._block_hash[block] = None
            self._free.append(block)
