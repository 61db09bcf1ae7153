"""Prompt-lookup proposals: continue the sequence the way it continued before (no torch)."""

from __future__ import annotations

from array import array
from collections.abc import Sequence as SequenceABC
from typing import TYPE_CHECKING

from local_engine.sequence import Sequence

from .verify import Draft

if TYPE_CHECKING:
    from local_engine.tokenizer import Tokenizer

__all__ = ["SUBSTITUTION_MIN", "NgramIndex", "NgramProposer", "spacing_classes"]

_ITEM = array("I").itemsize

SUBSTITUTION_MIN = 4
"""Shortest n-gram a substitution match (see :meth:`NgramIndex.propose`) may rest on: shorter
ones recur too often in text the output does not copy."""


class NgramIndex:
    """Finds earlier occurrences of a growing token list's tail (``lo`` to ``hi`` tokens).

    The list is kept as packed machine integers, so a lookup is a byte search in C
    (``bytearray.rfind``) rather than a Python loop, and taking new tokens costs one copy of
    them, not an index entry per n-gram: a long prompt costs nothing to take in, and a reply
    that never matches costs a few searches a step. Only occurrences followed by a known
    token count, so a lookup of the list's own tail finds an EARLIER occurrence.
    """

    __slots__ = ("_buf", "_size", "hi", "lo")

    def __init__(self, lo: int, hi: int) -> None:
        """Look up tails of ``hi`` down to ``lo`` tokens."""
        self.lo = lo
        self.hi = hi
        self._buf = bytearray()
        self._size = 0  # tokens packed into _buf

    def update(self, tokens: list[int]) -> None:
        """Take the tokens of ``tokens`` added since the last call (the list only grows)."""
        if len(tokens) > self._size:
            self._buf += array("I", tokens[self._size :])
            self._size = len(tokens)

    def _last_end(self, keys: list[int], start: int, n: int, limit: int) -> int | None:
        """Where the latest occurrence of ``keys[start : start + n]`` that ends at or before
        token ``limit`` ends (the index of the token after it), or None."""
        if start + n <= self._size:  # the n-gram is packed already: slice it from there
            pattern = self._buf[start * _ITEM : (start + n) * _ITEM]
        else:
            pattern = bytearray(array("I", keys[start : start + n]))
        stop = limit * _ITEM
        while True:
            pos = self._buf.rfind(pattern, 0, stop)
            if pos < 0:
                return None
            if pos % _ITEM == 0:
                return pos // _ITEM + n
            stop = pos + len(pattern) - 1  # a match across token boundaries: look before it

    def propose(self, tokens: list[int], k: int, *, keys: list[int] | None = None) -> list[int]:
        """``k`` tokens that followed the latest earlier occurrence of the longest tail found.

        ``keys`` is the list the index holds, when it is not ``tokens`` itself but a
        same-length list of token classes (:func:`spacing_classes`): matches are found among
        the keys, and the proposal is read from ``tokens``. Call :meth:`update` first.

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
        longest = min(self.hi, size - 1)
        # Most steps of text the proposer cannot predict match nothing: when the shortest
        # tail has no earlier occurrence, no longer one has either.
        end = (
            self._last_end(keys, size - self.lo, self.lo, size - 1) if longest >= self.lo else None
        )
        if end is not None:
            for n in range(longest, self.lo, -1):
                longer = self._last_end(keys, size - n, n, size - 1)
                if longer is not None:
                    end = longer
                    break
            if end + k <= size:
                return tokens[end : end + k]
            period = size - end
            return [tokens[end + j % period] for j in range(k)]
        last = size - 1
        for n in range(min(self.hi, last - 1), max(self.lo, SUBSTITUTION_MIN) - 1, -1):
            # An occurrence of the n tokens before the last that ends by ``last - 2``: the
            # token after it (the replaced one) and at least one more come before the tail.
            end = self._last_end(keys, last - n, n, last - 2)
            if end is not None and keys[end] != keys[last]:
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
