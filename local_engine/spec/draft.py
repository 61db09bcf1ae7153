"""Draft-model proposals: a second, smaller model with its own paged KV cache.

The draft model keeps, per request, its own block table in its own block pool (with prefix
caching, so requests sharing a prompt share the draft's blocks too) and how many of the
request's tokens it has computed. Proposing ``k`` tokens runs ``k`` batched forward passes:
the first catches up on the tokens the target accepted since the last proposal and yields
the first draft, each later one feeds the previous draft. After verification the draft's
computed count drops back to the tokens the target kept and blocks past them are released;
their stale entries are overwritten when those positions are computed again.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from local_engine.attention import build_attention_metadata
from local_engine.kv_cache import BlockPool, BlockTable
from local_engine.model import DecoderModel
from local_engine.sampler import Sampler
from local_engine.sequence import Sequence

from .verify import Draft, sampling_probs

__all__ = ["DraftProposer"]


@dataclass(slots=True)
class _State:
    table: BlockTable
    computed: int  # leading tokens of the request whose KV the draft holds
    base: int  # the request's length when its drafts were last proposed


class DraftProposer:
    """Proposes draft tokens by running ``model`` autoregressively."""

    free = False
    """Each draft token costs a forward pass of the draft model."""

    def __init__(
        self, model: DecoderModel, *, num_blocks: int, block_size: int, sampler: Sampler
    ) -> None:
        """Give ``model`` a KV cache of ``num_blocks`` blocks; draw noise from ``sampler``."""
        self.model = model
        self.block_size = block_size
        self.sampler = sampler
        self.pool = BlockPool(num_blocks, block_size)
        self.kv_caches = model.make_kv_cache(num_blocks, block_size)
        self._states: dict[str, _State] = {}

    @torch.inference_mode()
    def propose(self, seqs: list[Sequence], num_tokens: list[int]) -> list[Draft]:
        """Up to ``num_tokens[i]`` drafts for each ``seqs[i]`` (none when the draft's pool
        has no room for it this step)."""
        drafts = [Draft([]) for _ in seqs]
        live: list[int] = []
        for i, (seq, k) in enumerate(zip(seqs, num_tokens, strict=True)):
            state = self._reserve(seq, k)
            if state is not None:
                # Feed at least the last token: its logits give the first draft.
                state.computed = min(state.computed, seq.num_tokens - 1)
                state.base = seq.num_tokens
                live.append(i)
        feeds = [seqs[i].token_ids[self._states[seqs[i].request_id].computed :] for i in live]
        probs: dict[int, list[torch.Tensor]] = {}
        for step in range(max((num_tokens[i] for i in live), default=0)):
            rows = [i for i in live if num_tokens[i] > step]
            if step:
                feeds = [[drafts[i].tokens[-1]] for i in rows]
            logits = self._forward([seqs[i] for i in rows], feeds)
            tokens, dists = self._pick(logits, [seqs[i] for i in rows])
            for i, token, dist in zip(rows, tokens, dists, strict=True):
                drafts[i].tokens.append(token)
                if dist is not None:
                    probs.setdefault(i, []).append(dist)
        for i, rows_probs in probs.items():
            drafts[i].probs = torch.stack(rows_probs)
        return drafts

    def verified(self, seq: Sequence, num_accepted: int) -> None:
        """Keep the draft's KV only for tokens the target kept; publish full blocks."""
        state = self._states.get(seq.request_id)
        if state is None:
            return
        state.computed = min(state.computed, state.base + num_accepted)
        self.pool.truncate(state.table, state.computed + 1)
        self.pool.commit(state.table, seq.token_ids, state.computed)

    def release(self, request_id: str) -> None:
        """Free a finished request's draft blocks."""
        state = self._states.pop(request_id, None)
        if state is not None:
            self.pool.free(state.table)

    def _reserve(self, seq: Sequence, k: int) -> _State | None:
        """The request's state with room for ``k - 1`` drafts fed after its tokens."""
        state = self._states.get(seq.request_id)
        if state is None:
            table = BlockTable(seq.block_table.salt)
            cached = self.pool.allocate(table, seq.token_ids)
            if cached is None:
                return None
            state = self._states[seq.request_id] = _State(table, cached, seq.num_tokens)
        if not self.pool.append_slots(state.table, seq.num_tokens + k - 1):
            return None
        return state

    def _forward(self, seqs: list[Sequence], feeds: list[list[int]]) -> torch.Tensor:
        """Feed each sequence its tokens after those computed; logits of each last one."""
        input_ids: list[int] = []
        positions: list[int] = []
        context_lens: list[int] = []
        tables: list[list[int]] = []
        last: list[int] = []
        for seq, feed in zip(seqs, feeds, strict=True):
            state = self._states[seq.request_id]
            start = state.computed
            input_ids.extend(feed)
            positions.extend(range(start, start + len(feed)))
            state.computed = start + len(feed)
            context_lens.append(state.computed)
            tables.append(state.table.block_ids)
            last.append(len(input_ids) - 1)
        dev = self.model.device
        meta = build_attention_metadata(
            tables,
            context_lens,
            [len(f) for f in feeds],
            block_size=self.block_size,
            device=dev,
        )
        hidden = self.model.forward(
            torch.tensor(input_ids, dtype=torch.int64, device=dev),
            torch.tensor(positions, dtype=torch.int64, device=dev),
            self.kv_caches,
            meta,
        )
        index = torch.tensor(last, dtype=torch.int64, device=dev)
        return self.model.compute_logits(hidden.index_select(0, index))

    def _pick(
        self, logits: torch.Tensor, seqs: list[Sequence]
    ) -> tuple[list[int], list[torch.Tensor | None]]:
        """Greedy requests take the argmax; sampled ones draw from their processed
        distribution, which is returned for verification."""
        tokens: list[int] = logits.argmax(dim=-1).tolist()
        dists: list[torch.Tensor | None] = [None] * len(seqs)
        rows = [i for i, s in enumerate(seqs) if not s.params.greedy]
        if not rows:
            return tokens, dists
        probs = sampling_probs(logits[rows], [seqs[i].params for i in rows])
        for j, i in enumerate(rows):
            gen = self.sampler.generator_for(seqs[i], probs.device)
            noise = torch.empty_like(probs[j]).exponential_(generator=gen)
            noise.clamp_(min=torch.finfo(noise.dtype).tiny)
            tokens[i] = int((probs[j] / noise).argmax())
            dists[i] = probs[j]
        return tokens, dists
