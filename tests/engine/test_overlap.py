"""Overlapped output processing: step n's text and stop strings while step n+1 runs.

The overlapped order is ``run_step`` of step n+1 before ``process_step`` of step n. The
outputs must be those of plain :meth:`Engine.step`, a request that a stop string ends must
free its blocks exactly once (one step late), and aborts must drop what was in flight.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace
from pathlib import Path

import anyio
import pytest

from local_engine.async_engine import AsyncEngine
from local_engine.engine import Engine, EngineConfig, RequestOutput, StepTokens
from local_engine.errors import EngineConfigError
from local_engine.sampler import SamplingParams
from local_engine.spec import SpeculativeConfig

from .stepping import step_rounds
from .tiny import make_tiny_model, write_char_tokenizer

EOS = 2
FULL = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = make_tiny_model(tmp_path_factory.mktemp("tiny") / "llama", "llama", seed=3)
    write_char_tokenizer(root)
    return root


def make_engine(model_dir: Path, **overrides: object) -> Engine:
    cfg: dict[str, object] = {"num_blocks": 128, "block_size": 4, "seed": 0}
    cfg.update(overrides)
    return Engine.from_pretrained(model_dir, EngineConfig(**cfg))  # type: ignore[arg-type]


def prompt(i: int) -> list[int]:
    # Repeating patterns, so n-gram speculation finds drafts.
    return [3 + (i * 7 + (j % 4) * 13) % 250 for j in range(4 + i % 7)]


@dataclass
class Plan:
    """A mixed batch: stop strings, max_tokens, stop tokens, EOS, and aborted requests."""

    params: list[SamplingParams]
    abort: set[int] = field(default_factory=set)  # aborted right after their first output


def mixed_plan(model_dir: Path, n: int = 12) -> Plan:
    """Stop conditions picked from each prompt's unconstrained greedy output, so they hit
    at different steps."""
    full = make_engine(model_dir).generate([prompt(i) for i in range(n)], FULL)
    plan = Plan([])
    for i, res in enumerate(full):
        kind = i % 5
        if kind == 0:  # a two-character stop string, ending the request early
            at = 2 + i % 5
            plan.params.append(replace(FULL, stop=(res.text[at : at + 2],)))
        elif kind == 1:
            plan.params.append(replace(FULL, max_tokens=2 + i % 6))
        elif kind == 2:  # a stop token
            stop = res.token_ids[1 + i % 6]
            plan.params.append(replace(FULL, stop_token_ids=(stop,)))
        elif kind == 3:  # EOS counts (the random model may never say it: then length)
            plan.params.append(replace(FULL, ignore_eos=False))
        else:
            plan.params.append(FULL)
            plan.abort.add(i)
    return plan


@dataclass
class Seen:
    """What one request's stream delivered."""

    tokens: list[int] = field(default_factory=list)
    text: str = ""
    outputs: int = 0
    finish_reason: str | None = None
    num_generated_tokens: int = 0

    def take(self, out: RequestOutput) -> None:
        assert self.finish_reason is None, "an output after the finished one"
        self.tokens.extend(out.new_token_ids)
        self.text += out.new_text
        self.outputs += 1
        self.num_generated_tokens = out.num_generated_tokens
        if out.finished:
            self.finish_reason = out.finish_reason


def drive(engine: Engine, plan: Plan, *, overlapped: bool) -> dict[str, Seen]:
    """Run ``plan`` to the end with plain steps or in the overlapped order (no threads)."""
    seen: dict[str, Seen] = {}
    aborting: set[str] = set()
    for i, params in enumerate(plan.params):
        rid = engine.add_request(prompt(i), params, request_id=f"r{i}")
        seen[rid] = Seen()
        if i in plan.abort:
            aborting.add(rid)

    for outputs in step_rounds(engine, overlapped=overlapped):
        for out in outputs:
            seen[out.request_id].take(out)
            if out.request_id in aborting:
                engine.abort(out.request_id)  # between steps, as AsyncEngine applies it
                aborting.discard(out.request_id)
    return seen


def check_idle(engine: Engine) -> None:
    assert not engine.has_unfinished()
    assert engine.num_running == 0 and engine.num_waiting == 0
    assert engine.num_free_blocks() == engine.num_blocks  # freed, and freed once


def check_same(got: dict[str, Seen], want: dict[str, Seen], plan: Plan) -> None:
    for i in range(len(plan.params)):
        rid = f"r{i}"
        g, w = got[rid], want[rid]
        if i in plan.abort:  # one output, then nothing (not the step in flight)
            assert g.outputs == w.outputs == 1 and g.finish_reason is None
        assert (g.tokens, g.text, g.finish_reason) == (w.tokens, w.text, w.finish_reason)
        assert g.num_generated_tokens == w.num_generated_tokens == len(w.tokens)


@pytest.mark.parametrize("speculative", [None, SpeculativeConfig(ngram_min=1)])
def test_overlapped_order_gives_the_plain_outputs(
    model_dir: Path, speculative: SpeculativeConfig | None
) -> None:
    plan = mixed_plan(model_dir)
    plain_engine = make_engine(model_dir, speculative=speculative)
    want = drive(plain_engine, plan, overlapped=False)
    check_idle(plain_engine)
    reasons = {w.finish_reason for w in want.values()}
    assert {"stop", "length", None} <= reasons  # the plan covers every ending
    assert any(w.text and p.stop for w, p in zip(want.values(), plan.params, strict=True))
    engine = make_engine(model_dir, speculative=speculative)
    got = drive(engine, plan, overlapped=True)
    check_same(got, want, plan)
    check_idle(engine)


def test_a_stop_string_frees_blocks_at_the_next_step_and_drops_its_late_tokens(
    model_dir: Path,
) -> None:
    full = make_engine(model_dir).generate([prompt(0)], FULL)[0]
    stop = full.text[3:5]
    engine = make_engine(model_dir)
    engine.add_request(prompt(0), replace(FULL, stop=(stop,)), request_id="s")
    outputs: list[RequestOutput] = []
    pending = engine.run_step()
    while not (outputs and outputs[-1].finished):
        ran = engine.run_step()  # includes "s" while its stop string is not yet found
        outputs.extend(engine.process_step(pending))
        pending = ran
    assert outputs[-1].finish_reason == "stop"
    assert "".join(o.new_text for o in outputs) == full.text[:3]
    # The request ran one step past its stop string and still holds its blocks...
    assert pending.items and engine.has_unfinished()
    assert engine.num_free_blocks() < engine.num_blocks
    # ...whose tokens are dropped, and the next step frees them (once).
    assert engine.process_step(pending) == []
    assert engine.run_step().items == []
    check_idle(engine)


def test_aborting_a_request_a_stop_string_ended_frees_its_blocks_once(model_dir: Path) -> None:
    full = make_engine(model_dir).generate([prompt(1)], FULL)[0]
    engine = make_engine(model_dir)
    params = replace(FULL, stop=(full.text[1:3],))
    engine.add_request(prompt(1), params, request_id="s")
    engine.add_request(prompt(2), FULL, request_id="other")
    finished = False
    pending = engine.run_step()
    while not finished:
        ran = engine.run_step()
        finished = any(o.finished for o in engine.process_step(pending) if o.request_id == "s")
        pending = ran
    engine.abort("s")  # e.g. the stream closed at once: released here, not again later
    engine.abort("other")
    assert engine.process_step(pending) == []
    engine.run_step()
    check_idle(engine)


def test_overlap_output_is_on_for_cuda_models_unless_set(model_dir: Path) -> None:
    with pytest.raises(EngineConfigError, match="overlap_output"):
        EngineConfig(overlap_output=1)  # type: ignore[arg-type]
    assert make_engine(model_dir).overlap_output is False  # a CPU model
    assert make_engine(model_dir, overlap_output=True).overlap_output is True


# ---------------------------------------------------------------------- AsyncEngine

pytest_anyio = pytest.mark.anyio


async def stream_plan(engine: Engine, plan: Plan) -> dict[str, Seen]:
    seen: dict[str, Seen] = {f"r{i}": Seen() for i in range(len(plan.params))}

    async def consume(i: int, ae: AsyncEngine) -> None:
        rid = f"r{i}"
        async with ae.stream(prompt(i), plan.params[i], request_id=rid) as outputs:
            async for out in outputs:
                seen[rid].take(out)
                if i in plan.abort:
                    break  # leaving the block aborts the request

    async with AsyncEngine(engine) as ae:
        async with anyio.create_task_group() as tg:
            for i in range(len(plan.params)):
                tg.start_soon(consume, i, ae)
        with anyio.fail_after(60):
            await ae.wait_idle()
    return seen


@pytest_anyio
@pytest.mark.parametrize("overlap", [True, False])
async def test_async_streams_match_plain_steps(model_dir: Path, overlap: bool) -> None:
    plan = mixed_plan(model_dir)
    want = drive(make_engine(model_dir), plan, overlapped=False)
    engine = make_engine(model_dir, overlap_output=overlap)
    got = await stream_plan(engine, plan)
    for i in range(len(plan.params)):
        g, w = got[f"r{i}"], want[f"r{i}"]
        if i in plan.abort:  # the consumer broke out after its first output
            assert g.outputs == 1 and w.tokens[: len(g.tokens)] == g.tokens
        else:  # a slow consumer may get outputs merged: compare the whole stream
            assert (g.tokens, g.text, g.finish_reason) == (w.tokens, w.text, w.finish_reason)
            assert g.num_generated_tokens == len(w.tokens)
    check_idle(engine)


@pytest_anyio
async def test_async_engine_processes_a_step_while_the_next_one_runs(model_dir: Path) -> None:
    """The driver runs process_step(n) while run_step(n+1) is in flight: the wrapped
    run_step(n+1) waits until process_step(n) has seen it running (events, no timing)."""
    engine = make_engine(model_dir, overlap_output=True)
    run_step, process_step = engine.run_step, engine.process_step
    running, seen = threading.Event(), threading.Event()
    calls = 0
    overlapped: list[bool] = []

    def wrapped_run() -> StepTokens:
        nonlocal calls
        calls += 1
        running.set()
        try:
            if calls == 2:
                seen.wait(timeout=60)
            return run_step()
        finally:
            running.clear()

    def wrapped_process(step: StepTokens) -> list[RequestOutput]:
        if not overlapped:
            overlapped.append(running.wait(timeout=60))
            seen.set()
        return process_step(step)

    engine.run_step = wrapped_run  # type: ignore[method-assign]
    engine.process_step = wrapped_process  # type: ignore[method-assign]
    async with AsyncEngine(engine) as ae:
        outs = [o async for o in ae.generate(prompt(0), FULL)]
    assert overlapped == [True]
    assert outs[-1].finish_reason == "length" and sum(len(o.new_token_ids) for o in outs) == 12
    check_idle(engine)
