"""How the engine speculates: the proposer, how many tokens, when to back off (no torch)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

from local_engine.errors import EngineConfigError

__all__ = ["SPECULATIVE_METHODS", "SpeculativeConfig", "SpeculativeMethod"]

SpeculativeMethod = Literal["ngram", "draft"]
SPECULATIVE_METHODS: tuple[str, ...] = get_args(SpeculativeMethod)


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding settings.

    ``method="ngram"`` proposes the tokens that followed the latest earlier occurrence of the
    sequence's last ``ngram_max`` .. ``ngram_min`` tokens (prompt lookup: free to propose,
    strong on copy and edit work). ``method="draft"`` runs a second, smaller model with its
    own KV cache; ``draft_model`` is its directory (it must share the target's tokenizer).

    Each decoding step proposes up to ``num_speculative_tokens`` tokens, and the target model
    verifies them all in one forward pass. A request whose recent verifications accepted
    fewer than ``min_accepted`` tokens on average (an exponential moving average) pauses
    speculation for a number of steps that doubles on every pause, up to
    ``max_backoff_steps``, then probes again with one draft: a workload the proposer cannot
    predict runs almost as plain decoding. The draft length is one more than the same
    average, so it grows while drafts are kept. With n-gram lookup, which costs nothing to
    propose, a new request starts at the full ``num_speculative_tokens``; a draft model
    starts with a one-draft probe.
    """

    method: SpeculativeMethod = "ngram"
    num_speculative_tokens: int = 12
    draft_model: str | Path | None = None
    ngram_min: int = 2
    ngram_max: int = 4
    min_accepted: float = 0.5
    max_backoff_steps: int = 64

    def __post_init__(self) -> None:
        if self.method not in SPECULATIVE_METHODS:
            raise EngineConfigError(
                f"unknown speculative method {self.method!r}: expected one of "
                f"{', '.join(SPECULATIVE_METHODS)}"
            )
        for name in ("num_speculative_tokens", "ngram_min", "ngram_max", "max_backoff_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise EngineConfigError(f"{name} must be a positive int, got {value!r}")
        if self.ngram_min > self.ngram_max:
            raise EngineConfigError(
                f"ngram_min ({self.ngram_min}) must not exceed ngram_max ({self.ngram_max})"
            )
        accepted = self.min_accepted
        if isinstance(accepted, bool) or not isinstance(accepted, int | float) or accepted < 0:
            raise EngineConfigError(f"min_accepted must be a number >= 0, got {accepted!r}")
        if self.method == "draft" and self.draft_model is None:
            raise EngineConfigError("speculative method 'draft' needs draft_model (a directory)")
        if self.method == "ngram" and self.draft_model is not None:
            raise EngineConfigError("draft_model is only used by the speculative method 'draft'")
