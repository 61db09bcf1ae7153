"""Verification of draft tokens against the target model's distributions.

For a sequence with ``k`` draft tokens the target model scored ``k + 1`` positions in one
step: row ``j`` is its distribution for the token after draft ``j - 1`` (row 0 after the
last verified token). Greedy requests keep drafts while they equal the row's argmax and then
take the argmax of the first row that disagreed (or of the last row): the output is exactly
what plain greedy decoding produces, several tokens per step.

Sampled requests use rejection sampling: draft ``j`` drawn from the proposer's distribution
``q`` is kept with probability ``min(1, p(d) / q(d))`` where ``p`` is the target row after
the request's temperature and top-k / top-p / min-p truncation (the same distribution the
plain sampler draws from); the first rejected position draws from the residual
``max(p - q, 0)`` renormalized, and when every draft is kept a bonus token is drawn from the
last row. Each emitted token is then distributed exactly as plain sampling's. A proposer
that picks its drafts deterministically (n-gram lookup) has ``q`` one-hot: the draft is
kept with probability ``p(d)`` and a rejection draws from ``p`` with ``d`` removed.
"""

from __future__ import annotations

from collections.abc import Sequence as SequenceABC
from dataclasses import dataclass

import torch

from local_engine.sampler import Sampler, SamplingParams, truncate_logits
from local_engine.sequence import Sequence

__all__ = ["Draft", "sampling_probs", "verify_drafts"]


@dataclass(slots=True)
class Draft:
    """Proposed tokens and the distribution each was drawn from.

    ``probs`` is ``[len(tokens), vocab]`` float32 (row ``j`` the distribution ``tokens[j]``
    was sampled from), or ``None`` when the proposer chose them deterministically.
    """

    tokens: list[int]
    probs: torch.Tensor | None = None


@torch.inference_mode()
def verify_drafts(
    logits: torch.Tensor,
    seqs: SequenceABC[Sequence],
    drafts: SequenceABC[Draft],
    sampler: Sampler,
) -> list[list[int]]:
    """Return each sequence's emitted tokens: its accepted drafts, then one more token.

    ``logits`` holds ``len(drafts[i].tokens) + 1`` consecutive rows per sequence, in order
    (``[rows, vocab]`` float32; sampled requests' rows are modified in place). Noise comes
    from ``sampler``'s generators, so seeded requests draw from their own streams.
    """
    counts = [len(d.tokens) + 1 for d in drafts]
    if logits.dim() != 2 or logits.shape[0] != sum(counts) or len(seqs) != len(drafts):
        raise ValueError(
            f"logits shape {tuple(logits.shape)} does not match {len(seqs)} sequences with "
            f"{sum(counts)} rows"
        )
    starts = [0]
    for n in counts:
        starts.append(starts[-1] + n)
    out: list[list[int]] = [[] for _ in seqs]
    greedy = [i for i, s in enumerate(seqs) if s.params.greedy]
    if greedy:
        best: list[int] = logits.argmax(dim=-1).tolist()
        for i in greedy:
            out[i] = _accept_greedy(best[starts[i] : starts[i + 1]], drafts[i].tokens)
    sampled = [i for i, s in enumerate(seqs) if not s.params.greedy]
    if sampled:
        _sample(logits, seqs, drafts, sampler, sampled, starts, out)
    return out


def sampling_probs(logits: torch.Tensor, params: SequenceABC[SamplingParams]) -> torch.Tensor:
    """The distribution plain sampling draws each row from: temperature, then top-k / top-p /
    min-p truncation, then softmax (``logits`` of sampled requests, modified in place)."""
    temps = torch.tensor([p.temperature for p in params], dtype=logits.dtype, device=logits.device)
    logits.div_(temps.unsqueeze(1))
    truncate_logits(logits, list(params))
    return torch.softmax(logits, dim=-1)


def _accept_greedy(targets: list[int], draft: list[int]) -> list[int]:
    for j, token in enumerate(draft):
        if token != targets[j]:
            return targets[: j + 1]
    return targets


def _sample(
    logits: torch.Tensor,
    seqs: SequenceABC[Sequence],
    drafts: SequenceABC[Draft],
    sampler: Sampler,
    sampled: list[int],
    starts: list[int],
    out: list[list[int]],
) -> None:
    device = logits.device
    rows = [r for i in sampled for r in range(starts[i], starts[i + 1])]
    sub = logits if len(rows) == logits.shape[0] else logits[rows]
    params = [seqs[i].params for i in sampled for _ in range(starts[i], starts[i + 1])]
    probs = sampling_probs(sub, params)
    finals: list[torch.Tensor] = []
    offset = 0
    for i in sampled:
        seq, draft = seqs[i], drafts[i]
        k = len(draft.tokens)
        p = probs[offset : offset + k + 1]
        offset += k + 1
        gen = sampler.generator_for(seq, device)
        accepted = k
        if k:
            index = torch.tensor(draft.tokens, dtype=torch.int64, device=device).unsqueeze(1)
            p_draft = p[:k].gather(1, index).squeeze(1)
            q_draft = draft.probs.gather(1, index).squeeze(1) if draft.probs is not None else None
            u = torch.rand(k, generator=gen, device=device, dtype=p.dtype)
            keep = u * q_draft < p_draft if q_draft is not None else u < p_draft
            rejected = (~keep).nonzero()
            if rejected.numel():
                accepted = int(rejected[0, 0])
        if accepted < k:
            row = p[accepted].clone()
            if draft.probs is None:
                row[draft.tokens[accepted]] = 0.0
            else:
                row.sub_(draft.probs[accepted]).clamp_(min=0.0)
            if not float(row.sum()) > 0.0:  # p == q up to rounding: any draw from p is right
                row = p[accepted]
        else:
            row = p[k]
        noise = torch.empty_like(row).exponential_(generator=gen)
        noise.clamp_(min=torch.finfo(noise.dtype).tiny)
        finals.append(row / noise)
        out[i] = [*draft.tokens[:accepted], -1]
    chosen: list[int] = torch.stack(finals).argmax(dim=-1).tolist()
    for i, token in zip(sampled, chosen, strict=True):
        out[i][-1] = token
