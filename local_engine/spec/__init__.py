"""Speculative decoding: proposers, verification of drafts in one target step, back-off.

:class:`SpeculativeConfig` (``EngineConfig.speculative``) picks the proposer: n-gram prompt
lookup (:class:`NgramProposer`) or a smaller draft model with its own KV cache
(:class:`DraftProposer`). :class:`Speculator` wires it into the engine's step.
"""

from __future__ import annotations

from local_engine.errors import EngineConfigError
from local_engine.model import DecoderModel
from local_engine.sampler import Sampler
from local_engine.tokenizer import Tokenizer

from .config import SPECULATIVE_METHODS, SpeculativeConfig, SpeculativeMethod
from .draft import DraftProposer
from .ngram import SUBSTITUTION_MIN, NgramIndex, NgramProposer, spacing_classes
from .speculator import Proposer, SpecStats, Speculator
from .verify import Draft, verify_drafts

__all__ = [
    "SPECULATIVE_METHODS",
    "SUBSTITUTION_MIN",
    "Draft",
    "DraftProposer",
    "NgramIndex",
    "NgramProposer",
    "Proposer",
    "SpecStats",
    "SpeculativeConfig",
    "SpeculativeMethod",
    "Speculator",
    "make_proposer",
    "spacing_classes",
    "verify_drafts",
]


def make_proposer(
    config: SpeculativeConfig,
    target: DecoderModel,
    draft_model: DecoderModel | None,
    *,
    num_blocks: int,
    block_size: int,
    sampler: Sampler,
    tokenizer: Tokenizer | None = None,
) -> Proposer:
    """Build the proposer ``config`` names; the draft's KV pool matches the target's. With
    ``tokenizer`` the n-gram proposer matches tokens that differ only by a leading space
    (:func:`spacing_classes`).

    Raises:
        EngineConfigError: ``"draft"`` without a draft model, or one whose vocabulary
            differs from the target's.
    """
    if config.method == "ngram":
        classes = spacing_classes(tokenizer) if tokenizer is not None else None
        return NgramProposer(config.ngram_min, config.ngram_max, classes)
    if draft_model is None:
        raise EngineConfigError("speculative method 'draft' needs a draft model")
    if draft_model.config.vocab_size != target.config.vocab_size:
        raise EngineConfigError(
            f"the draft model's vocabulary ({draft_model.config.vocab_size} tokens) differs "
            f"from the target's ({target.config.vocab_size})"
        )
    return DraftProposer(draft_model, num_blocks=num_blocks, block_size=block_size, sampler=sampler)
