"""One request's token state as the scheduler sees it (no torch)."""

from __future__ import annotations

import enum
from collections.abc import Sequence as SequenceABC

from local_engine.kv_cache import BlockTable
from local_engine.sampling_params import SamplingParams, TokenLogprob

__all__ = ["Sequence", "SequenceStatus"]


class SequenceStatus(enum.Enum):
    """Where a sequence is in its life."""

    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """A request's prompt and generated tokens, its KV blocks and its progress.

    ``token_ids`` is the prompt followed by every generated token. ``num_computed_tokens``
    counts the leading tokens whose KV is in the cache; the scheduler feeds the model
    the tokens after that. After preemption the blocks are gone and
    ``num_computed_tokens`` drops to 0: the whole of ``token_ids`` is recomputed, the
    generated tokens acting as part of the prompt. ``spec_token_ids`` holds the draft tokens
    proposed for the next step by speculative decoding (empty otherwise); they join
    ``token_ids`` only once the model has verified them.

    ``shares_prompt_of`` is another sequence with the same prompt (the choices of an ``n > 1``
    request): until that one has computed the prompt's full blocks, the scheduler leaves this
    one waiting, so that it takes them from the prefix cache instead of computing them too.
    The scheduler clears it at admission.

    ``prompt_logprobs`` holds, for a request that asked for them, the log-probabilities of
    the prompt's tokens after the first, in order, as far as the model has computed them.
    """

    __slots__ = (
        "block_table",
        "constrained",
        "num_cached_tokens",
        "num_computed_tokens",
        "num_preemptions",
        "num_prompt_tokens",
        "params",
        "prompt_logprobs",
        "request_id",
        "shares_prompt_of",
        "spec_token_ids",
        "status",
        "token_ids",
    )

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: SequenceABC[int],
        params: SamplingParams,
        *,
        cache_salt: str | None = None,
        shares_prompt_of: Sequence | None = None,
    ) -> None:
        """Create a waiting sequence; ``prompt_token_ids`` must not be empty."""
        if not prompt_token_ids:
            raise ValueError("prompt_token_ids must not be empty")
        self.request_id = request_id
        self.token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(self.token_ids)
        self.params = params
        self.block_table = BlockTable(cache_salt)
        self.num_computed_tokens = 0
        self.num_cached_tokens: int | None = None  # prefix-cache hits at first admission
        self.num_preemptions = 0
        self.status = SequenceStatus.WAITING
        self.spec_token_ids: list[int] = []
        self.prompt_logprobs: list[TokenLogprob] = []
        self.shares_prompt_of = shares_prompt_of
        # Whether a grammar masks the next token: from the start, or once a lazy grammar
        # (one with a trigger token) has seen its trigger (the engine sets it then).
        grammar = params.grammar
        self.constrained = grammar is not None and grammar.trigger is None

    def __repr__(self) -> str:
        return (
            f"Sequence({self.request_id!r}, status={self.status.value}, "
            f"tokens={self.num_tokens}, computed={self.num_computed_tokens})"
        )

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens."""
        return len(self.token_ids)

    @property
    def num_generated_tokens(self) -> int:
        """Tokens generated so far."""
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        """The generated tokens (a copy)."""
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def max_total_tokens(self) -> int:
        """The most tokens this sequence can ever hold (prompt + ``max_tokens``)."""
        return self.num_prompt_tokens + self.params.max_tokens

    @property
    def is_finished(self) -> bool:
        """True once the sequence has stopped or was aborted."""
        return self.status is SequenceStatus.FINISHED

    @property
    def prompt_cache_limit(self) -> int | None:
        """The most leading tokens this sequence may take from the prefix cache: those whose
        prompt logprobs it already has when it asked for them (a cached position brings no
        logits), else no limit (None)."""
        if self.params.prompt_logprobs is None:
            return None
        done = len(self.prompt_logprobs)
        return None if done >= self.num_prompt_tokens - 1 else done

    def append_token(self, token_id: int) -> None:
        """Record a newly sampled token."""
        self.token_ids.append(token_id)
