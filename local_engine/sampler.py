"""Batched token sampling over a step's logits.

Per row, in order: banned tokens (``banned_token_ids``, and the stop and EOS ids while fewer
than ``min_tokens`` were generated) masked out; the repetition penalty over the prompt and
the reply; presence/frequency penalties over the request's generated tokens;
temperature (0 means greedy: the argmax of the penalized logits); top-k, then top-p
(nucleus, over the top-k survivors), then min-p (drop tokens whose probability is below
``min_p`` times the most likely one's); then a draw by the exponential race
(``argmax(p / q)`` with ``q ~ Exp(1)``), which samples exactly from ``p``.

A seeded request draws its noise from its own ``torch.Generator``, one draw of the
vocabulary's size per token, and every operation is row-wise, so its tokens do not
depend on what else shares the batch. Log-probabilities are described on
:class:`TokenLogprob`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence as SequenceABC
from dataclasses import dataclass

import torch

from local_engine.sampling_params import SamplingParams, TokenLogprob
from local_engine.sequence import Sequence
from local_engine.structured import TokenMask

__all__ = ["Sampler", "SamplerOutput", "SamplingParams", "TokenLogprob", "truncate_logits"]


@dataclass(slots=True)
class SamplerOutput:
    """One sampled token per row, and its log-probabilities where they were asked for."""

    token_ids: list[int]
    logprobs: list[TokenLogprob | None]


@dataclass(slots=True)
class _Counts:
    counts: torch.Tensor  # [V] occurrences of each generated token
    seen: int = 0  # generated tokens already counted


class Sampler:
    """Samples next tokens for a batch of sequences; keeps seeded requests' generators."""

    def __init__(
        self, *, seed: int | None = None, eos_token_ids: SequenceABC[int] | frozenset[int] = ()
    ) -> None:
        """``seed`` fixes the noise of unseeded requests too (tests); default: random.
        ``eos_token_ids`` are held back, with each request's stop ids, until it has
        generated ``min_tokens``."""
        self._seed = seed
        self.eos_token_ids = tuple(sorted(eos_token_ids))
        self._generators: dict[str, torch.Generator] = {}
        self._counts: dict[str, _Counts] = {}
        self._seen: dict[str, _Counts] = {}
        self._shared: dict[torch.device, torch.Generator] = {}

    def release(self, request_id: str) -> None:
        """Forget a finished request's generator and penalty counts."""
        self._generators.pop(request_id, None)
        self._counts.pop(request_id, None)
        self._seen.pop(request_id, None)

    def _shared_generator(self, device: torch.device) -> torch.Generator:
        gen = self._shared.get(device)
        if gen is None:
            gen = torch.Generator(device)
            if self._seed is None:
                gen.seed()
            else:
                gen.manual_seed(self._seed)
            self._shared[device] = gen
        return gen

    def _seeded_generator(self, device: torch.device, seq: Sequence) -> torch.Generator:
        gen = self._generators.get(seq.request_id)
        if gen is None:
            gen = torch.Generator(device).manual_seed(seq.params.seed or 0)
            self._generators[seq.request_id] = gen
        return gen

    def generator_for(self, seq: Sequence, device: torch.device) -> torch.Generator:
        """The noise source of ``seq``: its own generator when seeded, else the shared one."""
        if seq.params.seed is not None:
            return self._seeded_generator(device, seq)
        return self._shared_generator(device)

    @torch.inference_mode()
    def sample(
        self,
        logits: torch.Tensor,
        seqs: SequenceABC[Sequence],
        *,
        allowed: TokenMask | None = None,
    ) -> SamplerOutput:
        """Pick one token per row of ``logits`` (``[N, V]`` float32; modified in place).

        ``allowed`` (grammar-constrained rows) is applied before anything else, so every
        path, greedy included, picks only allowed tokens.
        """
        if logits.dim() != 2 or logits.shape[0] != len(seqs):
            raise ValueError(f"logits shape {tuple(logits.shape)} does not match {len(seqs)} rows")
        if allowed is not None:
            allowed.apply(logits)
        self._apply_bans(logits, seqs)
        params = [s.params for s in seqs]
        want_logprobs = any(p.logprobs for p in params)
        if all(p.greedy and not p.has_penalties for p in params) and not want_logprobs:
            return SamplerOutput(logits.argmax(dim=-1).tolist(), [None] * len(seqs))
        self._apply_penalties(logits, seqs)
        device = logits.device
        temps = [1.0 if p.greedy else p.temperature for p in params]
        if any(t != 1.0 for t in temps):
            logits.div_(_device_tensor(temps, logits.dtype, device).unsqueeze(1))
        logprobs = torch.log_softmax(logits, dim=-1) if want_logprobs else None
        tokens = logits.argmax(dim=-1)
        sampled_rows = [i for i, p in enumerate(params) if not p.greedy]
        if sampled_rows:
            tokens = self._sample_rows(logits, tokens, seqs, sampled_rows)
        token_list: list[int] = tokens.tolist()
        out_logprobs: list[TokenLogprob | None] = [None] * len(seqs)
        if logprobs is not None:
            self._gather_logprobs(logprobs, tokens, params, out_logprobs)
        return SamplerOutput(token_list, out_logprobs)

    def _sample_rows(
        self,
        logits: torch.Tensor,
        greedy_tokens: torch.Tensor,
        seqs: SequenceABC[Sequence],
        rows: list[int],
    ) -> torch.Tensor:
        device = logits.device
        sub = logits if len(rows) == len(seqs) else logits[rows]
        params = [seqs[i].params for i in rows]
        truncate_logits(sub, params)
        probs = torch.softmax(sub, dim=-1)
        noise = torch.empty_like(probs)
        noise.exponential_(generator=self._shared_generator(device))
        for j, i in enumerate(rows):
            if seqs[i].params.seed is not None:  # redraw from the request's own stream
                noise[j].exponential_(generator=self._seeded_generator(device, seqs[i]))
        noise.clamp_(min=torch.finfo(noise.dtype).tiny)
        choice = probs.div_(noise).argmax(dim=-1)
        if len(rows) == len(seqs):
            return choice
        out = greedy_tokens.clone()
        out[_device_tensor(rows, torch.int64, device)] = choice
        return out

    def _apply_penalties(self, logits: torch.Tensor, seqs: SequenceABC[Sequence]) -> None:
        self._apply_repetition_penalty(logits, seqs)
        rows = [
            i
            for i, s in enumerate(seqs)
            if (s.params.presence_penalty or s.params.frequency_penalty) and s.num_generated_tokens
        ]
        if not rows:
            return
        counts = torch.stack([self._token_counts(seqs[i], logits) for i in rows])
        freq = [seqs[i].params.frequency_penalty for i in rows]
        pres = [seqs[i].params.presence_penalty for i in rows]
        coef = _device_tensor([freq, pres], logits.dtype, logits.device).unsqueeze(2)
        penalty = counts * coef[0] + (counts > 0).to(logits.dtype) * coef[1]
        row_index = _device_tensor(rows, torch.int64, logits.device)
        logits.index_add_(0, row_index, penalty, alpha=-1.0)

    def _apply_bans(self, logits: torch.Tensor, seqs: SequenceABC[Sequence]) -> None:
        """Mask ``banned_token_ids``, and the stop and EOS ids of rows short of
        ``min_tokens`` (not under a grammar's mask, which decides when the reply may end)."""
        rows: list[int] = []
        cols: list[int] = []
        vocab = logits.shape[1]
        for i, seq in enumerate(seqs):
            params = seq.params
            banned = list(params.banned_token_ids)
            if params.min_tokens > seq.num_generated_tokens and not seq.constrained:
                banned.extend(params.stop_token_ids)
                if not params.ignore_eos:
                    banned.extend(self.eos_token_ids)
            for token in banned:
                if token < vocab:
                    rows.append(i)
                    cols.append(token)
        if rows:
            device = logits.device
            index = (
                _device_tensor(rows, torch.int64, device),
                _device_tensor(cols, torch.int64, device),
            )
            logits.index_put_(index, torch.tensor(-math.inf, dtype=logits.dtype, device=device))

    def _apply_repetition_penalty(self, logits: torch.Tensor, seqs: SequenceABC[Sequence]) -> None:
        """Hugging Face's rule: a token seen in the prompt or reply has its logit divided by
        the penalty when positive, multiplied by it when not."""
        for i, seq in enumerate(seqs):
            penalty = seq.params.repetition_penalty
            if penalty == 1.0:
                continue
            seen = self._seen_tokens(seq, logits) > 0
            row = logits[i]
            scaled = torch.where(row > 0, row / penalty, row * penalty)
            row.copy_(torch.where(seen, scaled, row))

    def _seen_tokens(self, seq: Sequence, logits: torch.Tensor) -> torch.Tensor:
        """Occurrences of each token in ``seq`` (prompt and reply), kept per request."""
        entry = self._seen.get(seq.request_id)
        if entry is None:
            entry = _Counts(torch.zeros(logits.shape[1], dtype=logits.dtype, device=logits.device))
            self._seen[seq.request_id] = entry
        new = [t for t in seq.token_ids[entry.seen :] if t < logits.shape[1]]
        if new:
            index = _device_tensor(new, torch.int64, logits.device)
            entry.counts.index_add_(0, index, torch.ones_like(index, dtype=logits.dtype))
        entry.seen = len(seq.token_ids)
        return entry.counts

    def _token_counts(self, seq: Sequence, logits: torch.Tensor) -> torch.Tensor:
        """Occurrences of each token among ``seq``'s generated tokens, kept per request
        and brought up to date with only the tokens added since the last call."""
        entry = self._counts.get(seq.request_id)
        if entry is None:
            entry = _Counts(torch.zeros(logits.shape[1], dtype=logits.dtype, device=logits.device))
            self._counts[seq.request_id] = entry
        new = seq.token_ids[seq.num_prompt_tokens + entry.seen :]
        if new:
            index = _device_tensor(new, torch.int64, logits.device)
            entry.counts.index_add_(0, index, torch.ones_like(index, dtype=logits.dtype))
            entry.seen += len(new)
        return entry.counts

    @staticmethod
    def _gather_logprobs(
        logprobs: torch.Tensor,
        tokens: torch.Tensor,
        params: list[SamplingParams],
        out: list[TokenLogprob | None],
    ) -> None:
        chosen: list[float] = logprobs.gather(1, tokens.unsqueeze(1)).squeeze(1).tolist()
        k = max(p.top_logprobs for p in params)
        top_vals: list[list[float]] = []
        top_ids: list[list[int]] = []
        if k:
            vals, ids = logprobs.topk(min(k, logprobs.shape[1]), dim=-1)
            top_vals, top_ids = vals.tolist(), ids.tolist()
        token_list: list[int] = tokens.tolist()
        for i, p in enumerate(params):
            if not p.logprobs:
                continue
            n = p.top_logprobs
            top = tuple(zip(top_ids[i][:n], top_vals[i][:n], strict=True)) if n else ()
            out[i] = TokenLogprob(token_list[i], chosen[i], top)


def truncate_logits(logits: torch.Tensor, params: list[SamplingParams]) -> None:
    """Mask (to -inf) tokens outside each row's top-k / top-p / min-p set, in place."""
    vocab = logits.shape[1]
    device = logits.device
    use_k = any(0 < p.top_k < vocab for p in params)
    use_p = any(p.top_p < 1.0 for p in params)
    if use_k or use_p:
        sorted_logits, order = logits.sort(dim=-1, descending=True, stable=True)
        rank = torch.arange(vocab, device=device).unsqueeze(0)
        remove = torch.zeros_like(sorted_logits, dtype=torch.bool)
        if use_k:
            ks = [p.top_k if 0 < p.top_k < vocab else vocab for p in params]
            remove |= rank >= _device_tensor(ks, torch.int64, device).unsqueeze(1)
            sorted_logits.masked_fill_(remove, -math.inf)
        if use_p:
            probs = torch.softmax(sorted_logits, dim=-1)
            mass_before = probs.cumsum(dim=-1) - probs
            ps = _device_tensor([p.top_p for p in params], probs.dtype, device)
            cut = (mass_before >= ps.unsqueeze(1)) & (ps < 1.0).unsqueeze(1)
            remove |= cut
        mask = torch.zeros_like(remove).scatter_(1, order, remove)
        logits.masked_fill_(mask, -math.inf)
    if any(p.min_p > 0 for p in params):
        log_min_p = [math.log(p.min_p) if p.min_p > 0 else -math.inf for p in params]
        floor = logits.max(dim=-1, keepdim=True).values + _device_tensor(
            log_min_p, logits.dtype, device
        ).unsqueeze(1)
        logits.masked_fill_(logits < floor, -math.inf)


def _device_tensor(
    values: SequenceABC[object], dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """``torch.tensor(values)`` on ``device``. On CUDA it is staged in pinned memory and
    copied without blocking: a plain copy from pageable memory waits for every kernel queued
    before it, which would add host syncs to the step's one (reading the sampled tokens)."""
    if device.type != "cuda":
        return torch.tensor(values, dtype=dtype, device=device)
    return torch.tensor(values, dtype=dtype).pin_memory().to(device, non_blocking=True)
