"""Persistent step-input buffers, and decode steps replayed from CUDA graphs.

:class:`StepBuffers` holds every integer input of a step (token ids, positions, KV slots,
sampled rows, context lengths, query offsets, block tables) in ONE int64 host buffer, pinned
on CUDA, with a device twin of the same layout. A step writes the used prefix of each segment
on the host and copies it to the device without blocking the host; the tensors the model and
the attention backend read are views of the device buffer, so their addresses never change.
On CPU the two are the same tensor and nothing is copied.

Prefill and decode are laid out apart: a decode step (one new token per sequence, the common
case) needs no per-token loop, and can be padded to a batch-size bucket with rows that write
no KV (slot -1) and attend to nothing (context length 0), which is what
:class:`DecodeGraphs` captures: one CUDA graph per bucket, over the same buffers, replayed
with their new contents. Block tables then have a fixed width (the longest sequence the
engine admits), because a captured kernel keeps the row stride it saw.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence as SequenceABC
from dataclasses import dataclass
from typing import Any

import torch

from local_engine.attention import AttentionMetadata
from local_engine.attention.base import slot_mapping
from local_engine.errors import EngineConfigError, EngineError
from local_engine.model import DecoderModel

__all__ = [
    "DEFAULT_GRAPH_BUCKETS",
    "DecodeGraphs",
    "StepBuffers",
    "StepTensors",
    "graph_buckets",
    "plan_step_buffers",
]

DEFAULT_GRAPH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256)
"""Batch sizes decode graphs are captured for (those up to ``max_num_seqs``, plus it)."""

_SEGMENTS = ("ids", "positions", "slots", "samples", "context_lens", "starts", "tables")


@dataclass(slots=True)
class StepTensors:
    """A step's inputs as views of the device buffer."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    sample_indices: torch.Tensor


def plan_step_buffers(
    model: DecoderModel,
    *,
    static_buffers: bool | None,
    cuda_graphs: bool | None,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    max_model_len: int,
    block_size: int,
) -> tuple[StepBuffers | None, bool]:
    """The engine's step buffers (None for fresh tensors each step) and whether decode
    steps replay CUDA graphs.

    ``None`` settings follow the device: on CUDA both are on (graphs where the attention
    backend is graph-safe, i.e. the Triton one), elsewhere both off.

    Raises:
        EngineConfigError: graphs asked for without a CUDA model, without static buffers,
            or with an attention backend that reads host values each step.
    """
    on_cuda = model.device.type == "cuda"
    static = on_cuda if static_buffers is None else static_buffers
    graph_safe = getattr(model.attention, "name", None) == "triton"
    graphs = on_cuda and static and graph_safe if cuda_graphs is None else cuda_graphs
    if graphs:
        if not on_cuda:
            raise EngineConfigError(f"cuda_graphs needs a CUDA model, not {model.device.type}")
        if not static:
            raise EngineConfigError("cuda_graphs needs static_buffers")
        if not graph_safe:
            raise EngineConfigError("cuda_graphs needs the 'triton' attention backend")
    if not static:
        return None, False
    buffers = StepBuffers(
        max_tokens=max(max_num_batched_tokens, max_num_seqs),
        max_seqs=max_num_seqs,
        max_blocks_per_seq=-(-max_model_len // block_size),
        block_size=block_size,
        device=model.device,
    )
    return buffers, graphs


def graph_buckets(max_num_seqs: int) -> tuple[int, ...]:
    """The decode batch sizes to capture: the defaults up to ``max_num_seqs``, and it."""
    return tuple(sorted({b for b in DEFAULT_GRAPH_BUCKETS if b < max_num_seqs} | {max_num_seqs}))


class StepBuffers:
    """One host (pinned on CUDA) and one device int64 buffer holding a step's inputs."""

    def __init__(
        self,
        *,
        max_tokens: int,
        max_seqs: int,
        max_blocks_per_seq: int,
        block_size: int,
        device: torch.device,
    ) -> None:
        """Size the segments for steps of up to ``max_tokens`` tokens over ``max_seqs``
        sequences of up to ``max_blocks_per_seq`` blocks."""
        self.max_tokens = max_tokens
        self.max_seqs = max_seqs
        self.width = max_blocks_per_seq
        self.block_size = block_size
        self.device = device
        sizes = {
            "ids": max_tokens,
            "positions": max_tokens,
            "slots": max_tokens,
            "samples": max_seqs,
            "context_lens": max_seqs,
            "starts": max_seqs + 1,
            "tables": max_seqs * max_blocks_per_seq,
        }
        offsets = [0, *itertools.accumulate(sizes[name] for name in _SEGMENTS)]
        self._span = {name: (offsets[i], sizes[name]) for i, name in enumerate(_SEGMENTS)}
        on_cuda = device.type == "cuda"
        self.host = torch.zeros(offsets[-1], dtype=torch.int64, pin_memory=on_cuda)
        self.dev = self.host if device.type == "cpu" else torch.zeros_like(self.host, device=device)

    def _put(self, name: str, values: SequenceABC[int]) -> torch.Tensor:
        """Write ``values`` into segment ``name``; return the device view of them."""
        start, size = self._span[name]
        n = len(values)
        if n > size:
            raise EngineError(f"this step needs {n} {name} entries, the step buffers hold {size}")
        if n:
            self.host[start : start + n] = torch.tensor(values, dtype=torch.int64)
            if self.dev is not self.host:
                self.dev[start : start + n].copy_(self.host[start : start + n], non_blocking=True)
        return self.dev[start : start + n]

    def load(
        self,
        *,
        input_ids: SequenceABC[int],
        positions: SequenceABC[int],
        tables: SequenceABC[SequenceABC[int]],
        context_lens: SequenceABC[int],
        query_lens: SequenceABC[int],
        sample_indices: SequenceABC[int],
        pad_to: int | None = None,
    ) -> StepTensors:
        """Lay out a step (prefill or mixed) and return device views of it.

        With ``pad_to`` (decode steps replayed from a graph) the batch is padded to that many
        one-token rows that write no KV and attend to nothing, and block tables take the
        full width; otherwise they are as wide as this step's longest table.

        Raises:
            EngineError: the step does not fit the buffers.
        """
        rows = len(tables)
        slots = slot_mapping(tables, context_lens, query_lens, block_size=self.block_size)
        lens = list(context_lens)
        qlens = list(query_lens)
        width = self.width if pad_to is not None else max(len(t) for t in tables)
        if width > self.width:
            raise EngineError(f"a sequence needs {width} blocks, the buffers hold {self.width}")
        if pad_to is not None:
            extra = pad_to - rows
            input_ids = [*input_ids, *([0] * extra)]
            positions = [*positions, *([0] * extra)]
            slots.extend([-1] * extra)
            lens.extend([0] * extra)
            qlens.extend([1] * extra)
            rows = pad_to
        flat: list[int] = []
        for table in tables:
            flat.extend(table)
            flat.extend(itertools.repeat(0, width - len(table)))
        flat.extend(itertools.repeat(0, (rows - len(tables)) * width))
        starts = [0, *itertools.accumulate(qlens)]
        meta = AttentionMetadata(
            slot_mapping=self._put("slots", slots),
            block_tables=self._put("tables", flat).view(rows, width),
            context_lens=self._put("context_lens", lens),
            query_start_loc=self._put("starts", starts),
            query_lens_host=qlens,
            context_lens_host=lens,
            max_query_len=max(qlens),
            max_context_len=max(lens),
        )
        return StepTensors(
            input_ids=self._put("ids", input_ids),
            positions=self._put("positions", positions),
            meta=meta,
            sample_indices=self._put("samples", sample_indices),
        )


class DecodeGraphs:
    """Decode forwards captured as CUDA graphs, one per batch-size bucket, over
    :class:`StepBuffers`; each is captured the first time a batch needs it."""

    def __init__(
        self,
        model: DecoderModel,
        kv_caches: list[torch.Tensor],
        buffers: StepBuffers,
        buckets: SequenceABC[int],
    ) -> None:
        """Capture nothing yet; ``buckets`` are the batch sizes that will be captured."""
        self.model = model
        self.kv_caches = kv_caches
        self.buffers = buffers
        self.buckets = tuple(sorted(buckets))
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._pool: Any = None  # the graphs' shared memory pool, from the first capture

    def bucket_for(self, rows: int) -> int | None:
        """The smallest bucket that holds ``rows`` decode rows, or None."""
        i = bisect.bisect_left(self.buckets, rows)
        return self.buckets[i] if i < len(self.buckets) else None

    def run(self, bucket: int, rows: int, step: StepTensors) -> torch.Tensor:
        """Replay (capturing first if needed) the graph for ``bucket`` on ``step``, laid out
        with ``pad_to=bucket``; return the hidden states of the ``rows`` real rows."""
        entry = self._graphs.get(bucket)
        if entry is None:
            entry = self._capture(step)
            self._graphs[bucket] = entry
        graph, hidden = entry
        graph.replay()
        return hidden[:rows]

    def _capture(self, step: StepTensors) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        def forward() -> torch.Tensor:
            return self.model.forward(step.input_ids, step.positions, self.kv_caches, step.meta)

        # Warm up on a side stream (kernels compiled, allocator settled), then capture.
        # The padded rows write no KV, so the warm-up changes nothing the real rows need
        # beyond writing this step's own keys and values, which the replay writes again.
        stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            forward()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            hidden = forward()
        if self._pool is None:
            self._pool = graph.pool()
        return graph, hidden
