"""Prompt-lookup proposals: continue the sequence the way it continued before (no torch)."""

from __future__ import annotations

from collections.abc import Sequence as SequenceABC
from typing import TYPE_CHECKING

from local_engine.sequence import Sequence

from .verify import Draft

if TYPE_CHECKING:
    from local_engine.tokenizer import Tokenizer

__all__ = ["SUBSTITUTION_MIN", "NgramIndex", "NgramProposer", "spacing_classes"]

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

    def propose(self, tokens: list[int], k: int, *, keys: list[int] | None = None) -> list[int]:
        """``k`` tokens that followed the longest indexed match of the list's tail.

        ``keys`` is the list the index was built from, when it is not ``tokens`` itself but
        a same-length list of token classes (:func:`spacing_classes`): matches are found
        among the keys, and the proposal is read from ``tokens``.

        A match that ends less than ``k`` tokens before the tail is a repeating pattern
        (the tail repeats what came ``period`` tokens earlier), so the proposal carries the
        pattern on past the end of the list.

        Without a match, a *substitution* match: the tail but its last token (at least
        :data:`SUBSTITUTION_MIN` tokens of it) occurred earlier followed by a different
        token, so the last token replaced that one (a renamed name, an edited word) and the
        proposal is what followed the replaced token, up to the end of the list. Copying
        with edits then goes on at full speed right after each edit.
        """
        keys = tokens if keys is None else keys
        size = len(tokens)
        for n in range(min(self.hi, size), self.lo - 1, -1):
            end = self._ends[n - self.lo].get(tuple(keys[size - n :]))
            if end is not None:
                if end + k <= size:
                    return tokens[end : end + k]
                period = size - end
                return [tokens[end + j % period] for j in range(k)]
        last = size - 1
        for n in range(min(self.hi, last), max(self.lo, SUBSTITUTION_MIN) - 1, -1):
            key = tuple(keys[last - n : last])
            end = self._ends[n - self.lo].get(key)
            if end == last:  # that very n-gram, followed by the last token: look further back
                end = self._prev_ends[n - self.lo].get(key)
            if end is not None and end + 1 < last and keys[end] != keys[last]:
                return tokens[end + 1 : min(end + 1 + k, size)]
        return []


def spacing_classes(tokenizer: Tokenizer) -> list[int]:
    """For each token id, the smallest id that spells the same text but for one leading
    space (``" Rosa"`` and ``"Rosa"`` share a class); added and special tokens keep their own.

    A reply that copies a phrase from inside a sentence of the prompt to the start of a line
    begins with the other spelling of its first word; matching by class finds the copy
    right after it.
    """
    added = set(tokenizer.added_tokens.values())
    first: dict[bytes, int] = {}
    classes = list(range(tokenizer.vocab_size))
    for token_id in classes:
        if token_id in added:
            continue
        text = tokenizer.token_bytes(token_id)
        key = text[1:] if text.startswith(b" ") and len(text) > 1 else text
        classes[token_id] = first.setdefault(key, token_id)
    return classes


class NgramProposer:
    """Proposes draft tokens by n-gram lookup in each sequence's own prompt and output."""

    free = True
    """Proposing costs no model work, so a new request starts at the full draft length."""

    def __init__(self, lo: int, hi: int, classes: SequenceABC[int] | None = None) -> None:
        """Match tails of ``hi`` down to ``lo`` tokens; with ``classes`` (token id -> class,
        :func:`spacing_classes`) tokens of one class match each other."""
        self.lo = lo
        self.hi = hi
        self.classes = classes
        self._indexes: dict[str, tuple[NgramIndex, list[int]]] = {}

    def propose(self, seqs: list[Sequence], num_tokens: list[int]) -> list[Draft]:
        """Up to ``num_tokens[i]`` drafts for ``seqs[i]`` (none where its tail is new)."""
        drafts = []
        classes = self.classes
        for seq, k in zip(seqs, num_tokens, strict=True):
            entry = self._indexes.get(seq.request_id)
            if entry is None:
                entry = self._indexes[seq.request_id] = (NgramIndex(self.lo, self.hi), [])
            index, keys = entry
            tokens = seq.token_ids
            if classes is None:
                keys = tokens
            else:  # a live sequence's tokens only grow
                limit = len(classes)
                keys.extend(classes[t] if t < limit else t for t in tokens[len(keys) :])
            index.update(keys)
            drafts.append(Draft(index.propose(tokens, k, keys=keys)))
        return drafts

    def verified(self, seq: Sequence, num_accepted: int) -> None:
        """Nothing to roll back: the index only ever sees verified tokens."""

    def release(self, request_id: str) -> None:
        """Forget a finished request's index."""
        self._indexes.pop(request_id, None)
