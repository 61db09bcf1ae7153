"""When a request stops, and which of its text may be streamed yet (no torch).

Text comes from an incremental detokenizer. The checks on token ids (:meth:`StopChecker.check`)
and on text (:meth:`StopChecker.push_text`) are apart, so an engine can settle the first
before the next step and the second while it runs. With stop strings, a tail of the text that
could still grow into a stop string is held back, so a stop string (or its beginning)
never reaches the caller; when one completes, the text is cut just before it.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Protocol

from local_engine.sampling_params import SamplingParams

__all__ = ["Detokenizer", "StopChecker", "stop_token_ids"]


def stop_token_ids(params: SamplingParams, eos_token_ids: Collection[int]) -> frozenset[int]:
    """The token ids that end a request: its ``stop_token_ids``, and ``eos_token_ids``
    unless ``params.ignore_eos``."""
    if params.ignore_eos:
        return frozenset(params.stop_token_ids)
    return frozenset(params.stop_token_ids).union(eos_token_ids)


class Detokenizer(Protocol):
    """The part of :class:`local_engine.tokenizer.IncrementalDetokenizer` used here."""

    def push(self, token_id: int) -> str:
        """Add one token; return the text it completes."""
        ...

    def flush(self) -> str:
        """Return whatever text is still held back."""
        ...


class StopChecker:
    """Follows one request's generated tokens; says what text to emit and when to stop."""

    def __init__(
        self,
        params: SamplingParams,
        eos_token_ids: Collection[int],
        detokenizer: Detokenizer | None,
    ) -> None:
        """``eos_token_ids`` stop the request unless ``params.ignore_eos``."""
        if params.stop and detokenizer is None:
            raise ValueError("stop strings need an engine with a tokenizer")
        self._params = params
        self._stop_ids = stop_token_ids(params, eos_token_ids)
        self._detok = detokenizer
        self._held = ""  # decoded but not yet emitted
        self.num_tokens = 0  # tokens taken by push()
        self.stopped_by: str | None = None
        """The stop string that ended the request (None: none did)."""

    def push(self, token_id: int) -> tuple[str, str | None]:
        """Take the next generated token; return ``(new_text, finish_reason)``: :meth:`check`
        and :meth:`push_text` in one, counting the tokens itself.

        ``finish_reason`` is ``"stop"`` (stop token or string), ``"length"``
        (``max_tokens`` reached) or ``None`` (keep going). A stop token adds no text.
        """
        self.num_tokens += 1
        return self.push_text(token_id, self.check(token_id, self.num_tokens))

    def check(self, token_id: int, num_generated: int) -> str | None:
        """What the token id alone says: ``"stop"`` for a stop token, ``"length"`` when it
        is generated token number ``num_generated`` and that reaches ``max_tokens``, else
        None. Reads no text state, so it may run while :meth:`push_text` handles earlier
        tokens on another thread."""
        if token_id in self._stop_ids:
            return "stop"
        if num_generated >= self._params.max_tokens:
            return "length"
        return None

    def push_text(self, token_id: int, reason: str | None) -> tuple[str, str | None]:
        """Take the next generated token and the reason it ends the request, if any (from
        :meth:`check`, or ``"stop"`` when its grammar completed); return ``(new_text,
        finish_reason)``.

        A stop string may end the request here (``"stop"``), also when ``reason`` is
        ``"length"`` (not when it is ``"error"``, a failed grammar, which stays the reason);
        a stop token adds no text; an ending flushes the held text.
        """
        if reason == "stop" and token_id in self._stop_ids:
            return self._finish(""), "stop"
        piece = self._detok.push(token_id) if self._detok is not None else ""
        text, stopped = self._scan(piece, final=reason is not None)
        return text, "stop" if stopped and reason != "error" else reason

    def finish(self) -> str:
        """Release held text when the request ends for another reason (e.g. abort)."""
        return self._finish("")

    def _finish(self, piece: str) -> str:
        text, _ = self._scan(piece, final=True)
        return text

    def _scan(self, piece: str, *, final: bool) -> tuple[str, bool]:
        if final and self._detok is not None:
            piece += self._detok.flush()
        buf = self._held + piece
        stops = self._params.stop
        if stops:
            found = [(i, stop) for i, stop in ((buf.find(s), s) for s in stops) if i >= 0]
            if found:
                cut, self.stopped_by = min(found, key=_position)
                self._held = ""
                return buf[:cut], True
        keep = 0 if final or not stops else _held_suffix(buf, stops)
        self._held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep], False


def _position(found: tuple[int, str]) -> int:
    return found[0]


def _held_suffix(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest tail of ``text`` that is a proper prefix of a stop string."""
    best = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:n]):
                best = n
                break
    return best
