"""Runs one scheduled step on the model: inputs -> forward -> logits -> sampled tokens.

Host work per step is proportional to the batch (its new tokens and block tables), never
to the model: each input becomes one host list and one host-to-device copy, and only the
last position of each sequence that samples reaches the LM head. Tensors live on the
model's device, so the same code runs on CPU and GPU.

With :class:`~local_engine.step_buffers.StepBuffers` the inputs go into persistent buffers
(pinned host memory copied without blocking on CUDA) instead of fresh tensors, and with
CUDA graphs on, decode steps replay a graph captured for their batch-size bucket; the step's
one host sync is reading the sampled tokens.

A sequence with draft tokens (speculative decoding) feeds its last token and its drafts,
and every one of those positions reaches the LM head; the rows go to :attr:`ModelRunner.verify`
instead of the sampler. Its positions are laid out as single-token attention rows over the
same block table, each seeing the cache up to its own position (the step writes every key and
value before any row attends), so they take the decode attention path with plain decodes.

A sequence that asked for prompt logprobs sends the rows of its prompt positions (the
prefill chunks, all but the prompt's last position) to the LM head as well, in slices of
:data:`PROMPT_LOGPROB_ROWS`; each row scores the prompt token after it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from collections.abc import Sequence as SequenceABC
from dataclasses import dataclass, field

import torch

from local_engine.attention import AttentionMetadata, build_attention_metadata
from local_engine.model import DecoderModel
from local_engine.sampler import Sampler, SamplerOutput
from local_engine.sampling_params import TokenLogprob
from local_engine.scheduler import ScheduledSequence, SchedulerOutput
from local_engine.sequence import Sequence
from local_engine.step_buffers import DecodeGraphs, StepBuffers, StepTensors, graph_buckets
from local_engine.structured import StructuredOutput

__all__ = ["PROMPT_LOGPROB_ROWS", "ModelRunner", "RunnerOutput", "StepInputs"]

PROMPT_LOGPROB_ROWS = 128
"""Prompt positions scored at once for prompt logprobs (bounds the float32 logits held,
normalized in place: 128 rows of a 152k vocabulary are about 78 MB)."""


@dataclass(slots=True)
class StepInputs:
    """Device tensors for one forward pass, and which rows of its output to sample."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    sample_indices: torch.Tensor
    sample_seqs: list[Sequence]
    graph_bucket: int | None = None  # replay the decode graph of this batch size
    spec_items: list[ScheduledSequence] = field(default_factory=list)
    """Items with drafts; their rows follow the sampled rows in ``sample_indices``."""


@dataclass(slots=True)
class RunnerOutput:
    """Sequences that sampled a token this step, aligned with the sampler's output; then
    the items that verified drafts, with the tokens each emitted (accepted drafts + one)."""

    seqs: list[Sequence]
    sampled: SamplerOutput
    spec_items: list[ScheduledSequence] = field(default_factory=list)
    spec_tokens: list[list[int]] = field(default_factory=list)
    prompt_logprobs: list[tuple[Sequence, list[TokenLogprob]]] = field(default_factory=list)
    """The prompt logprobs this step computed, per sequence that asked for them."""


Verifier = Callable[[torch.Tensor, list[ScheduledSequence]], list[list[int]]]
"""Target rows of the items with drafts (``k + 1`` rows each, in order) -> emitted tokens."""


class ModelRunner:
    """Owns the paged KV cache and turns scheduler output into sampled tokens."""

    def __init__(
        self,
        model: DecoderModel,
        *,
        num_blocks: int,
        block_size: int,
        sampler: Sampler | None = None,
        buffers: StepBuffers | None = None,
        cuda_graphs: bool = False,
        structured: StructuredOutput | None = None,
    ) -> None:
        """Allocate ``num_blocks`` KV blocks of ``block_size`` tokens on the model's device.

        With ``buffers`` the step inputs live in them; ``cuda_graphs`` (which needs
        ``buffers``, a CUDA model and a graph-safe attention backend) replays decode steps
        from CUDA graphs. ``structured`` supplies the token masks of grammar-constrained
        requests.
        """
        self.model = model
        self.block_size = block_size
        self.device = model.device
        self.kv_caches = model.make_kv_cache(num_blocks, block_size)
        self.sampler = sampler if sampler is not None else Sampler()
        self.buffers = buffers
        self.graphs: DecodeGraphs | None = None
        if cuda_graphs and buffers is not None:
            buckets = graph_buckets(buffers.max_seqs)
            self.graphs = DecodeGraphs(model, self.kv_caches, buffers, buckets)
        self.structured = structured
        self.verify: Verifier | None = None
        """Set by an engine that speculates; needed once a step schedules draft tokens."""

    def prepare(self, scheduled: SequenceABC[ScheduledSequence]) -> StepInputs:
        """Lay out the step's new tokens, positions and attention metadata. A step with
        draft tokens takes the plain layout (the persistent buffers and graphs cover steps
        without speculation)."""
        if self.buffers is not None and not any(item.num_spec_tokens for item in scheduled):
            return self._prepare_buffered(self.buffers, scheduled)
        input_ids: list[int] = []
        positions: list[int] = []
        context_lens: list[int] = []
        query_lens: list[int] = []
        tables: list[list[int]] = []
        sample_indices: list[int] = []
        sample_seqs: list[Sequence] = []
        spec_items: list[ScheduledSequence] = []
        spec_indices: list[int] = []
        for item in scheduled:
            seq, start, end = item.seq, item.start, item.start + item.num_new_tokens
            if item.num_spec_tokens:
                spec_items.append(item)
                spec_indices.extend(range(len(input_ids), len(input_ids) + item.num_new_tokens))
                input_ids.extend(seq.token_ids[start:])
                input_ids.extend(seq.spec_token_ids[: item.num_spec_tokens])
                positions.extend(range(start, end))
                context_lens.extend(range(start + 1, end + 1))
                query_lens.extend([1] * item.num_new_tokens)
                tables.extend([seq.block_table.block_ids] * item.num_new_tokens)
                continue
            input_ids.extend(seq.token_ids[start:end])
            positions.extend(range(start, end))
            context_lens.append(end)
            query_lens.append(item.num_new_tokens)
            tables.append(seq.block_table.block_ids)
            if item.samples:
                sample_indices.append(len(input_ids) - 1)
                sample_seqs.append(seq)
        sample_indices.extend(spec_indices)
        dev = self.device
        meta = build_attention_metadata(
            tables, context_lens, query_lens, block_size=self.block_size, device=dev
        )
        return StepInputs(
            input_ids=torch.tensor(input_ids, dtype=torch.int64, device=dev),
            positions=torch.tensor(positions, dtype=torch.int64, device=dev),
            meta=meta,
            sample_indices=torch.tensor(sample_indices, dtype=torch.int64, device=dev),
            sample_seqs=sample_seqs,
            spec_items=spec_items,
        )

    def _prepare_buffered(
        self, buffers: StepBuffers, scheduled: SequenceABC[ScheduledSequence]
    ) -> StepInputs:
        """:meth:`prepare` into persistent buffers; decode steps (one token per sequence)
        are laid out without a per-token loop and padded to a graph bucket when graphs
        are on."""
        seqs = [item.seq for item in scheduled]
        samples = [i for i, item in enumerate(scheduled) if item.samples]
        tables = [seq.block_table.block_ids for seq in seqs]
        if all(item.num_new_tokens == 1 for item in scheduled):
            positions = [item.start for item in scheduled]
            bucket = self.graphs.bucket_for(len(seqs)) if self.graphs is not None else None
            step = buffers.load(
                input_ids=[seq.token_ids[p] for seq, p in zip(seqs, positions, strict=True)],
                positions=positions,
                tables=tables,
                context_lens=[p + 1 for p in positions],
                query_lens=[1] * len(seqs),
                sample_indices=samples,
                pad_to=bucket,
            )
        else:
            bucket = None
            input_ids: list[int] = []
            positions = []
            for item in scheduled:
                end = item.start + item.num_new_tokens
                input_ids.extend(item.seq.token_ids[item.start : end])
                positions.extend(range(item.start, end))
            query_lens = [item.num_new_tokens for item in scheduled]
            starts = list(itertools.accumulate(query_lens))
            step = buffers.load(
                input_ids=input_ids,
                positions=positions,
                tables=tables,
                context_lens=[item.start + item.num_new_tokens for item in scheduled],
                query_lens=query_lens,
                sample_indices=[starts[i] - 1 for i in samples],
            )
        return StepInputs(
            input_ids=step.input_ids,
            positions=step.positions,
            meta=step.meta,
            sample_indices=step.sample_indices,
            sample_seqs=[seqs[i] for i in samples],
            graph_bucket=bucket,
        )

    @torch.inference_mode()
    def execute(self, batch: SchedulerOutput) -> RunnerOutput:
        """Run the model on ``batch`` and sample for every sequence that reaches its end."""
        if batch.is_empty:
            return RunnerOutput([], SamplerOutput([], []))
        inputs = self.prepare(batch.scheduled)
        seqs = inputs.sample_seqs
        # Grammar masks are computed in a worker thread while the model runs.
        allowed = self.structured.begin(seqs) if self.structured is not None else None
        try:
            if (
                self.graphs is not None
                and inputs.graph_bucket is not None
                and not inputs.spec_items
            ):
                rows = len(batch.scheduled)
                step = StepTensors(
                    inputs.input_ids, inputs.positions, inputs.meta, inputs.sample_indices
                )
                hidden = self.graphs.run(inputs.graph_bucket, rows, step)
            else:
                hidden = self.model.forward(
                    inputs.input_ids, inputs.positions, self.kv_caches, inputs.meta
                )
            scored = self._prompt_logprobs(hidden, batch.scheduled)
            if not seqs and not inputs.spec_items:
                return RunnerOutput([], SamplerOutput([], []), prompt_logprobs=scored)
            logits = self.model.compute_logits(hidden.index_select(0, inputs.sample_indices))
            if not inputs.spec_items:
                sampled = self.sampler.sample(logits, seqs, allowed=allowed)
                return RunnerOutput(seqs, sampled, prompt_logprobs=scored)
            if self.verify is None:
                raise RuntimeError("a step scheduled draft tokens but the runner has no verifier")
            plain = len(seqs)
            sampled = (
                self.sampler.sample(logits[:plain], seqs, allowed=allowed)
                if plain
                else SamplerOutput([], [])
            )
            emitted = self.verify(logits[plain:], inputs.spec_items)
            return RunnerOutput(seqs, sampled, inputs.spec_items, emitted, scored)
        finally:
            if allowed is not None:
                allowed.wait()  # never leave the worker writing into a mask nobody reads

    def _prompt_logprobs(
        self, hidden: torch.Tensor, scheduled: SequenceABC[ScheduledSequence]
    ) -> list[tuple[Sequence, list[TokenLogprob]]]:
        """Score the prompt positions this step computed for the sequences that asked for
        prompt logprobs and do not have them yet (every item lays out ``num_new_tokens``
        rows of ``hidden``, in order)."""
        scored: list[tuple[Sequence, list[TokenLogprob]]] = []
        offset = 0
        for item in scheduled:
            seq, rows = item.seq, item.num_new_tokens
            k = seq.params.prompt_logprobs
            if k is not None and not item.num_spec_tokens:
                low = max(item.start, len(seq.prompt_logprobs))
                high = min(item.start + rows, seq.num_prompt_tokens - 1)
                if low < high:
                    targets = seq.token_ids[low + 1 : high + 1]
                    first = offset + low - item.start
                    scored.append((seq, self._score(hidden, first, targets, k)))
            offset += rows
        return scored

    def _score(
        self, hidden: torch.Tensor, first: int, targets: list[int], k: int
    ) -> list[TokenLogprob]:
        """Logprobs of ``targets`` at the rows of ``hidden`` from ``first`` on, with ``k``
        alternatives each."""
        out: list[TokenLogprob] = []
        for at in range(0, len(targets), PROMPT_LOGPROB_ROWS):
            chunk = targets[at : at + PROMPT_LOGPROB_ROWS]
            rows = hidden[first + at : first + at + len(chunk)]
            logprobs = self.model.compute_logits(rows)  # float32, a tensor of its own
            logprobs -= torch.logsumexp(logprobs, dim=-1, keepdim=True)  # log_softmax in place
            index = torch.tensor(chunk, dtype=torch.int64, device=logprobs.device)
            chosen: list[float] = logprobs.gather(1, index.unsqueeze(1)).squeeze(1).tolist()
            tops: list[tuple[tuple[int, float], ...]] = [()] * len(chunk)
            if k:
                vals, ids = logprobs.topk(min(k, logprobs.shape[1]), dim=-1)
                tops = [
                    tuple(zip(i, v, strict=True))
                    for i, v in zip(ids.tolist(), vals.tolist(), strict=True)
                ]
            out.extend(
                TokenLogprob(t, lp, top) for t, lp, top in zip(chunk, chosen, tops, strict=True)
            )
        return out
