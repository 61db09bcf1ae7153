"""Grammar-constrained decoding at run time: per-request matchers and per-step token masks.

:class:`StructuredOutput` holds one llguidance matcher per request that has a
:class:`~local_engine.grammar.Grammar`. Each step, :meth:`StructuredOutput.begin` starts
computing the next-token bitmask of the step's constrained rows in a worker thread (llguidance
releases the GIL while it computes), so the masks are built while the model runs its forward
pass; the sampler then waits for them and sets every disallowed logit to ``-inf`` before any
other sampling work, greedy included (:meth:`TokenMask.apply`). After sampling,
:meth:`StructuredOutput.accept` advances the request's matcher by the sampled token.
Requests without a grammar share the batch untouched.

Compiling a grammar for the tokenizer (:meth:`StructuredOutput.compile`) is cached by grammar
text (least recently used first out); each request gets its own copy of the compiled matcher.

llguidance never raises for a grammar it cannot follow: a matcher that hits one of its limits
(a lexer or parser too complex, a regex too large) enters an error state for good, and from
then on allows only the end token. So :meth:`StructuredOutput.compile` walks a copy of a new
matcher through the text its grammar forces from the start, refusing (GrammarError) a
grammar that fails there, before any decoding; a matcher that fails later, mid-reply, makes
:meth:`StructuredOutput.accept` answer ``"error"`` with llguidance's reason
(:meth:`StructuredOutput.error`), and the engine ends the request with the ``"error"``
finish, never as a complete reply.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Collection
from collections.abc import Sequence as SequenceABC
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Literal

import torch

from local_engine.grammar import Grammar, GrammarError, llguidance_module, schema_problem
from local_engine.sequence import Sequence
from local_engine.tokenizer import Tokenizer

__all__ = ["GrammarVerdict", "StructuredOutput", "TokenMask"]

logger = logging.getLogger(__name__)

_CACHE_SIZE = 64
_PROBE_TOKENS = 256
"""Forced tokens a new grammar is walked through before it is accepted (its first limit
errors show within a few; the cap keeps a grammar that forces a long text cheap to check)."""

GrammarVerdict = Literal["stop", "error"] | None
"""What a sampled token did to a request's grammar: None (more may follow), ``"stop"`` (the
reply is complete) or ``"error"`` (the grammar failed; the reply is not valid)."""


class TokenMask:
    """The allowed next tokens of some rows of one step's logits, being computed.

    ``rows`` are the constrained rows' positions among the step's sampled rows.
    """

    __slots__ = ("_bitmask", "_future", "rows")

    def __init__(self, rows: list[int], bitmask: torch.Tensor, future: Future[None]) -> None:
        """Wrap a bitmask (``[len(rows), ceil(V / 32)]`` int32) that ``future`` fills."""
        self.rows = rows
        self._bitmask = bitmask
        self._future = future

    def wait(self) -> None:
        """Block until the masks are computed (re-raising a failure of the computation)."""
        self._future.result()

    def apply(self, logits: torch.Tensor) -> None:
        """Wait for the masks, then set the disallowed logits of the constrained rows to -inf."""
        self.wait()
        vocab = logits.shape[1]
        bits = self._bitmask.to(logits.device, non_blocking=True)
        shifts = torch.arange(32, dtype=torch.int32, device=logits.device)
        allowed = ((bits.unsqueeze(-1) >> shifts) & 1).flatten(1)[:, :vocab].bool()
        if len(self.rows) == logits.shape[0]:
            logits.masked_fill_(~allowed, float("-inf"))
            return
        index = torch.tensor(self.rows, device=logits.device)
        logits[index] = logits.index_select(0, index).masked_fill_(~allowed, float("-inf"))


class StructuredOutput:
    """The grammar state of one engine: compiled grammars, matchers per request, masks.

    ``vocab_size`` is the model's (the logits' width, which may exceed the tokenizer's);
    ``eos_token_ids`` are the tokens that may end a reply once its grammar is satisfied.
    llguidance is loaded on the first :meth:`compile`.
    """

    def __init__(
        self, tokenizer: Tokenizer, vocab_size: int, eos_token_ids: Collection[int]
    ) -> None:
        """Bind the tokenizer; nothing is built until a grammar is compiled."""
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._eos = sorted(eos_token_ids)
        self._lock = threading.Lock()
        self._lltok: Any = None
        self._executor: Any = None  # llguidance.LLExecutor, for masks of several rows
        self._compiled: OrderedDict[str, Any] = OrderedDict()
        self._matchers: dict[str, Any] = {}
        # Lazy grammars not yet triggered: request id -> (trigger token, matcher).
        self._waiting: dict[str, tuple[int, Any]] = {}
        self._worker: ThreadPoolExecutor | None = None

    @property
    def num_active(self) -> int:
        """Requests that hold a matcher."""
        return len(self._matchers)

    @property
    def words_per_mask(self) -> int:
        """int32 words in one row's bitmask."""
        return (self._vocab_size + 31) // 32

    def _llg_tokenizer(self) -> Any:
        if self._lltok is None:
            llg = llguidance_module()
            self._lltok = llg.LLTokenizer(
                self._tokenizer.backend.to_str(), n_vocab=self._vocab_size, eos_token=self._eos
            )
        return self._lltok

    def compile(self, grammar: Grammar) -> Any:
        """Compile ``grammar`` for this tokenizer (cached) and return the compiled matcher.

        Thread-safe; may take milliseconds for a large schema, so the chat service calls it
        in a worker thread before the request reaches the engine. GrammarError when
        llguidance cannot compile it.
        """
        with self._lock:
            cached = self._compiled.get(grammar.text)
            if cached is not None:
                self._compiled.move_to_end(grammar.text)
                return cached
            llg = llguidance_module()
            param = "tools" if grammar.kind.startswith("tool_call") else "response_format"
            try:
                tokenizer = self._llg_tokenizer()
            except ValueError as exc:  # the model's, not the request's: every grammar fails
                raise GrammarError(
                    f"the {_describe(grammar)} needs constrained decoding, which this model "
                    f"does not have: llguidance cannot read its tokenizer ({exc})",
                    param,
                ) from None
        matcher = llg.LLMatcher(tokenizer, grammar.text, log_level=0)
        error = matcher.get_error() if matcher.is_error() else _probe(matcher)
        if error:
            problem = schema_problem(error)
            raise GrammarError(f"the {_describe(grammar)} cannot be compiled: {problem}", param)
        with self._lock:
            self._compiled[grammar.text] = matcher
            if len(self._compiled) > _CACHE_SIZE:
                self._compiled.popitem(last=False)
        return matcher

    def add(self, request_id: str, grammar: Grammar) -> None:
        """Give ``request_id`` a fresh matcher for ``grammar`` (GrammarError when it cannot
        be compiled). A lazy grammar (one with a ``trigger``) waits, constraining nothing,
        until :meth:`accept` sees its trigger token."""
        matcher = self.compile(grammar).deep_copy()
        if grammar.trigger is None:
            self._matchers[request_id] = matcher
        else:
            self._waiting[request_id] = (grammar.trigger, matcher)

    def constrains(self, request_id: str) -> bool:
        """Whether ``request_id``'s next token is constrained (it holds a matcher that is not
        a lazy grammar still waiting for its trigger)."""
        return request_id in self._matchers

    def release(self, request_id: str) -> None:
        """Drop a request's matcher (finished or aborted); unknown ids are ignored."""
        self._matchers.pop(request_id, None)
        self._waiting.pop(request_id, None)

    def begin(self, seqs: SequenceABC[Sequence]) -> TokenMask | None:
        """Start computing the masks of the constrained rows among ``seqs`` (a step's sampled
        rows, in order); None when no row is constrained."""
        if not self._matchers:
            return None
        rows: list[int] = []
        matchers: list[Any] = []
        for i, seq in enumerate(seqs):
            matcher = self._matchers.get(seq.request_id)
            if matcher is not None:
                rows.append(i)
                matchers.append(matcher)
        if not rows:
            return None
        bitmask = torch.full((len(rows), self.words_per_mask), -1, dtype=torch.int32)
        if self._worker is None:
            self._worker = ThreadPoolExecutor(1, thread_name_prefix="swift-grammar-masks")
        future = self._worker.submit(self._fill, matchers, bitmask)
        return TokenMask(rows, bitmask, future)

    def _fill(self, matchers: list[Any], bitmask: torch.Tensor) -> None:
        """Compute each matcher's mask into its row of ``bitmask`` (runs in the worker).

        One call for all rows, so the GIL is released once per step, on one llguidance
        thread: more threads would take CPU from the forward pass the masks overlap with.
        """
        row_bytes = bitmask.shape[1] * 4
        if self._executor is None:
            self._executor = llguidance_module().LLExecutor(num_threads=1)
        pairs = [(m, i) for i, m in enumerate(matchers)]
        self._executor.unsafe_compute_mask_ptr(pairs, bitmask.data_ptr(), row_bytes, len(pairs))

    def accept(self, request_id: str, token_id: int) -> GrammarVerdict:
        """Advance a request's matcher by its sampled token (a lazy grammar's trigger token
        starts its matcher; other tokens before it pass unchecked).

        ``"stop"`` when the grammar is complete (nothing more may follow); ``"error"`` when
        the matcher failed, in computing this step's mask or in taking the token (a limit of
        llguidance's, or a token the mask should have kept out): the reply so far is not
        valid, and :meth:`error` says why. None while more may follow.
        """
        waiting = self._waiting.get(request_id)
        if waiting is not None:
            if token_id != waiting[0]:
                return None
            del self._waiting[request_id]
            self._matchers[request_id] = waiting[1]
        matcher = self._matchers.get(request_id)
        if matcher is None:
            return None
        if matcher.is_error() or not matcher.consume_token(token_id) or matcher.is_error():
            logger.warning(
                "request %s: its grammar failed at token %d: %s",
                request_id,
                token_id,
                self.error(request_id),
            )
            return "error"
        return "stop" if matcher.is_stopped() else None

    def error(self, request_id: str) -> str:
        """Why a request's matcher failed, in one line ("" when it did not, or is gone)."""
        matcher = self._matchers.get(request_id)
        return _first_line(matcher.get_error()) if matcher is not None else ""

    def close(self) -> None:
        """Stop the mask worker thread, e.g. when the engine is put away; requests keep their
        matchers, and a later step starts a new worker."""
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.shutdown(wait=True)


def _first_line(error: str) -> str:
    """llguidance's error without the parser-state dump that follows its first line."""
    return error.strip().split("\n", 1)[0].strip()


def _probe(matcher: Any) -> str:
    """Walk a copy of a new matcher through the tokens its grammar forces from the start,
    and compute the mask there; llguidance's error ("" when none) where it fails."""
    probe = matcher.deep_copy()
    budget = _PROBE_TOKENS
    while budget > 0 and not probe.is_error():
        forced = probe.compute_ff_tokens()[:budget]
        if not forced:
            probe.compute_bitmask()
            break
        budget -= len(forced)
        for token in forced:
            if not probe.consume_token(token):
                break
    return _first_line(probe.get_error()) if probe.is_error() else ""


def _describe(grammar: Grammar) -> str:
    return {
        "json_object": "JSON object grammar",
        "json_schema": "response_format JSON schema",
        "tool_call": "tools' parameter schema",
        "tool_call_auto": "tools' parameter schema",
    }[grammar.kind]
