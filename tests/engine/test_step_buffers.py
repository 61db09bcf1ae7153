"""Persistent step buffers (the GPU runner's input path) on CPU: same outputs as fresh tensors.

CUDA graph capture itself needs a GPU; here a stand-in "graph" runs the captured forward
eagerly on the same buffers, which checks everything the graphs rely on: bucketed padding
(rows that write no KV and attend to nothing), fixed-width block tables and stable buffer
addresses across steps.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from local_engine.engine import Engine, EngineConfig, GenerationResult, SamplingParams
from local_engine.errors import EngineConfigError, EngineError
from local_engine.step_buffers import (
    DecodeGraphs,
    StepBuffers,
    StepTensors,
    graph_buckets,
    plan_step_buffers,
)

from .tiny import make_tiny_model

PREFIX = list(range(3, 40))
PROMPTS = [PREFIX + [41, 42], PREFIX + [50], [7, 8, 9], list(range(60, 100))]


def _params() -> list[SamplingParams]:
    return [
        SamplingParams(temperature=0.0, max_tokens=7, ignore_eos=True, logprobs=True),
        SamplingParams(temperature=0.9, top_p=0.8, seed=5, max_tokens=6, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=9, ignore_eos=True, presence_penalty=0.5),
        SamplingParams(temperature=1.0, top_k=20, seed=9, max_tokens=5, ignore_eos=True),
    ]


def _generate(path: Path, **overrides: object) -> list[GenerationResult]:
    # A small token budget splits prompts into chunks that share steps with decodes.
    config = EngineConfig(
        num_blocks=48,
        max_num_batched_tokens=24,
        max_num_seqs=4,
        seed=1,
        dtype="float32",
        **overrides,
    )  # type: ignore[arg-type]
    return Engine.from_pretrained(path, config).generate(PROMPTS, _params())


def _same(a: list[GenerationResult], b: list[GenerationResult]) -> None:
    assert [r.token_ids for r in a] == [r.token_ids for r in b]
    assert [r.logprobs for r in a] == [r.logprobs for r in b]
    assert [r.num_cached_tokens for r in a] == [r.num_cached_tokens for r in b]


@pytest.mark.parametrize("family", ["qwen2", "mistral"])
def test_static_buffers_give_the_same_output(tmp_path: Path, family: str) -> None:
    path = make_tiny_model(tmp_path, family)
    fresh = _generate(path, static_buffers=False)
    _same(fresh, _generate(path, static_buffers=True))
    assert any(r.num_cached_tokens for r in fresh)  # the prefix cache took part


def test_buffers_are_reused_across_steps(tmp_path: Path) -> None:
    engine = Engine.from_pretrained(
        make_tiny_model(tmp_path, "llama"), EngineConfig(num_blocks=16, static_buffers=True)
    )
    buffers = engine.runner.buffers
    assert buffers is not None and buffers.dev is buffers.host  # CPU: nothing to copy
    for prompt in ([5, 6, 7], [8, 9]):
        engine.add_request(prompt, SamplingParams(max_tokens=4, ignore_eos=True))
    engine.step()  # both prompts
    decode = engine.scheduler.schedule().scheduled
    first = engine.runner.prepare(decode)
    second = engine.runner.prepare(decode)
    storage = buffers.dev.untyped_storage().data_ptr()
    for tensor in (first.input_ids, first.positions, first.meta.block_tables):
        assert tensor.untyped_storage().data_ptr() == storage
    assert first.input_ids.data_ptr() == second.input_ids.data_ptr()


def test_padded_decode_layout() -> None:
    buffers = StepBuffers(
        max_tokens=8, max_seqs=4, max_blocks_per_seq=3, block_size=4, device=torch.device("cpu")
    )
    step = buffers.load(
        input_ids=[11, 12],
        positions=[4, 0],
        tables=[[7, 2], [5]],
        context_lens=[5, 1],
        query_lens=[1, 1],
        sample_indices=[0, 1],
        pad_to=4,
    )
    assert step.input_ids.tolist() == [11, 12, 0, 0]
    assert step.meta.slot_mapping.tolist() == [2 * 4 + 0, 5 * 4 + 0, -1, -1]
    assert step.meta.context_lens.tolist() == [5, 1, 0, 0]
    assert step.meta.block_tables.tolist() == [[7, 2, 0], [5, 0, 0], [0, 0, 0], [0, 0, 0]]
    assert step.meta.query_start_loc.tolist() == [0, 1, 2, 3, 4]
    with pytest.raises(EngineError, match="blocks"):
        buffers.load(
            input_ids=[1],
            positions=[0],
            tables=[[1, 2, 3, 4]],
            context_lens=[1],
            query_lens=[1],
            sample_indices=[0],
        )
    with pytest.raises(EngineError, match="9 slots entries"):
        buffers.load(
            input_ids=list(range(9)),
            positions=list(range(9)),
            tables=[[1, 2, 3]],
            context_lens=[9],
            query_lens=[9],
            sample_indices=[8],
        )


def test_graph_buckets() -> None:
    assert graph_buckets(1) == (1,)
    assert graph_buckets(40) == (1, 2, 4, 8, 16, 24, 32, 40)
    graphs = DecodeGraphs.__new__(DecodeGraphs)
    graphs.buckets = graph_buckets(40)
    assert [graphs.bucket_for(n) for n in (1, 3, 17, 40, 41)] == [1, 4, 24, 40, None]


def test_plan_follows_the_device_and_rejects_graphs_without_cuda(tmp_path: Path) -> None:
    engine = Engine.from_pretrained(make_tiny_model(tmp_path, "llama"), EngineConfig(num_blocks=8))
    assert engine.runner.buffers is None and engine.runner.graphs is None  # CPU default
    sizes = {"max_num_seqs": 4, "max_num_batched_tokens": 16, "max_model_len": 64}
    for static in (None, True, False):
        with pytest.raises(EngineConfigError, match="cuda_graphs"):
            plan_step_buffers(
                engine.model, static_buffers=static, cuda_graphs=True, block_size=16, **sizes
            )
    with pytest.raises(EngineConfigError, match="static_buffers"):
        EngineConfig(static_buffers="yes")  # type: ignore[arg-type]


class _EagerGraph:
    """Stands in for a captured graph: replays the forward eagerly into a fixed output."""

    def __init__(self, forward: Callable[[], torch.Tensor], out: torch.Tensor) -> None:
        self.forward = forward
        self.out = out
        self.replays = 0

    def replay(self) -> None:
        self.out.copy_(self.forward())
        self.replays += 1


def test_bucketed_decode_replays_match_eager(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The graph path on CPU: Triton kernels (interpreted), padded buckets, replays over the
    same buffers; the tokens match the plain engine's."""
    from local_engine.attention import TritonPagedAttention, triton_kernels

    if not triton_kernels.INTERPRETING:  # a GPU machine: bench/gpu.py replays real graphs
        pytest.skip("runs the Triton kernels under the interpreter, on CPU tensors")

    captured: list[tuple[int, _EagerGraph]] = []

    def capture(self: DecodeGraphs, step: StepTensors) -> tuple[object, torch.Tensor]:
        def forward() -> torch.Tensor:
            return self.model.forward(step.input_ids, step.positions, self.kv_caches, step.meta)

        graph = _EagerGraph(forward, forward().clone())
        captured.append((step.input_ids.numel(), graph))
        return graph, graph.out

    monkeypatch.setattr(DecodeGraphs, "_capture", capture)
    path = make_tiny_model(tmp_path, "qwen3")
    prompts = [[5, 6, 7], list(range(10, 30)), [9] * 17]
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    plain = Engine.from_pretrained(path, EngineConfig(num_blocks=24, dtype="float32"))
    want = [r.token_ids for r in plain.generate(prompts, params)]
    engine = Engine.from_pretrained(
        path,
        EngineConfig(
            num_blocks=24, dtype="float32", attention_backend="triton", static_buffers=True
        ),
    )
    engine.model.set_attention_backend(TritonPagedAttention(num_splits=2))  # fewer programs
    buffers = engine.runner.buffers
    assert buffers is not None
    engine.runner.graphs = DecodeGraphs(engine.model, engine.runner.kv_caches, buffers, (2, 4))
    got = [r.token_ids for r in engine.generate(prompts, params)]
    assert got == want
    assert [size for size, _ in captured] == [4]  # three rows ride the 4-row bucket
    assert captured[0][1].replays >= 3
