"""Prompt-lookup proposals: continue the sequence the way it continued before (no torch)."""

from __future__ import annotations

from local_engine.sequence import Sequence

from .verify import Draft

__all__ = ["SUBSTITUTION_MIN", "NgramIndex", "NgramProposer"]

SUBSTITUTION_MIN = 4
"""Shortest n-gram a substitution match (see :meth:`NgramIndex.propose`) may rest on: shorter
ones recur too often in text the output does not copy."""


class NgramIndex:
    """For each n-gram (``lo <= n <= hi``) of a growing token list, where it last ended, and
    where it ended the time before.

    Only n-grams whose following token is already known are indexed, so a lookup of the
    list's own tail finds an EARLIER occurrence. Indexing is incremental: each call to
    :meth:`update` looks only at the tokens added since the last one.
    """

    __slots__ = ("_ends", "_next_end", "_prev_ends", "hi", "lo")

    def __init__(self, lo: int, hi: int) -> None:
        """Index n-grams of ``lo`` to ``hi`` tokens."""
        self.lo = lo
        self.hi = hi
        self._ends: list[dict[tuple[int, ...], int]] = [{} for _ in range(lo, hi + 1)]
        self._prev_ends: list[dict[tuple[int, ...], int]] = [{} for _ in range(lo, hi + 1)]
        self._next_end = lo

    def update(self, tokens: list[int]) -> None:
        """Index every n-gram of ``tokens`` that has a following token."""
        tables = list(zip(range(self.lo, self.hi + 1), self._ends, self._prev_ends, strict=True))
        for end in range(self._next_end, len(tokens)):
            for n, ends, prev in tables:
                if end >= n:
                    key = tuple(tokens[end - n : end])
                    last = ends.get(key)
                    if last is not None:
                        prev[key] = last
                    ends[key] = end
        self._next_end = max(self._next_end, len(tokens))

    def propose(self, tokens: list[int], k: int) -> list[int]:
        """``k`` tokens that followed the longest indexed match of the list's tail.

        A match that ends less than ``k`` tokens before the tail is a repeating pattern
        (the tail repeats what came ``period`` tokens earlier), so the proposal carries the
        pattern on past the end of the list.

        Without a match, a *substitution* match: the tail but its last token (at least
        :data:`SUBSTITUTION_MIN` tokens of it) occurred earlier followed by a different
        token, so the last token replaced that one (a renamed name, an edited word) and the
        proposal is what followed the replaced token, up to the end of the list. Copying
        with edits then goes on at full speed right after each edit.
        """
        size = len(tokens)
        for n in range(min(self.hi, size), self.lo - 1, -1):
            end = self._ends[n - self.lo].get(tuple(tokens[size - n :]))
            if end is not None:
                if end + k <= size:
                    return tokens[end : end + k]
                period = size - end
                return [tokens[end + j % period] for j in range(k)]
        last = size - 1
        for n in range(min(self.hi, last), max(self.lo, SUBSTITUTION_MIN) - 1, -1):
            key = tuple(tokens[last - n : last])
            end = self._ends[n - self.lo].get(key)
            if end == last:  # that very n-gram, followed by the last token: look further back
                end = self._prev_ends[n - self.lo].get(key)
            if end is not None and end + 1 < last and tokens[end] != tokens[last]:
                return tokens[end + 1 : min(end + 1 + k, size)]
        return []


class NgramProposer:
    """Proposes draft tokens by n-gram lookup in each sequence's own prompt and output."""

    free = True
    """Proposing costs no model work, so a new request starts at the full draft length."""

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
