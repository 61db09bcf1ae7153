"""Prompt-lookup proposals: continue the sequence the way it continued before (no torch)."""

from __future__ import annotations

from local_engine.sequence import Sequence

from .verify import Draft

__all__ = ["NgramIndex", "NgramProposer"]


class NgramIndex:
    """For each n-gram (``lo <= n <= hi``) of a growing token list, where it last ended.

    Only n-grams whose following token is already known are indexed, so a lookup of the
    list's own tail finds an EARLIER occurrence. Indexing is incremental: each call to
    :meth:`update` looks only at the tokens added since the last one.
    """

    __slots__ = ("_ends", "_next_end", "hi", "lo")

    def __init__(self, lo: int, hi: int) -> None:
        """Index n-grams of ``lo`` to ``hi`` tokens."""
        self.lo = lo
        self.hi = hi
        self._ends: list[dict[tuple[int, ...], int]] = [{} for _ in range(lo, hi + 1)]
        self._next_end = lo

    def update(self, tokens: list[int]) -> None:
        """Index every n-gram of ``tokens`` that has a following token."""
        lo = self.lo
        for end in range(self._next_end, len(tokens)):
            for n, ends in enumerate(self._ends, start=lo):
                if end >= n:
                    ends[tuple(tokens[end - n : end])] = end
        self._next_end = max(self._next_end, len(tokens))

    def propose(self, tokens: list[int], k: int) -> list[int]:
        """``k`` tokens that followed the longest indexed match of the list's tail.

        A match that ends less than ``k`` tokens before the tail is a repeating pattern
        (the tail repeats what came ``period`` tokens earlier), so the proposal carries the
        pattern on past the end of the list.
        """
        size = len(tokens)
        for n in range(min(self.hi, size), self.lo - 1, -1):
            end = self._ends[n - self.lo].get(tuple(tokens[size - n :]))
            if end is not None:
                if end + k <= size:
                    return tokens[end : end + k]
                period = size - end
                return [tokens[end + j % period] for j in range(k)]
        return []


class NgramProposer:
    """Proposes draft tokens by n-gram lookup in each sequence's own prompt and output."""

    def __init__(self, lo: int, hi: int) -> None:
        """Match tails of ``hi`` down to ``lo`` tokens."""
        self.lo = lo
        self.hi = hi
        self._indexes: dict[str, NgramIndex] = {}

    def propose(self, seqs: list[Sequence], num_tokens: list[int]) -> list[Draft]:
        """Up to ``num_tokens[i]`` drafts for ``seqs[i]`` (none where its tail is new)."""
        drafts = []
        for seq, k in zip(seqs, num_tokens, strict=True):
            index = self._indexes.get(seq.request_id)
            if index is None:
                index = self._indexes[seq.request_id] = NgramIndex(self.lo, self.hi)
            index.update(seq.token_ids)
            drafts.append(Draft(index.propose(seq.token_ids, k)))
        return drafts

    def verified(self, seq: Sequence, num_accepted: int) -> None:
        """Nothing to roll back: the index only ever sees verified tokens."""

    def release(self, request_id: str) -> None:
        """Forget a finished request's index."""
        self._indexes.pop(request_id, None)
