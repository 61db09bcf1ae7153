"""AsyncEngine: concurrent streams, cancellation frees blocks, overload, shutdown."""

from __future__ import annotations

import threading
import weakref
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, aclosing
from pathlib import Path

import anyio
import pytest

from local_engine.async_engine import AsyncEngine, run_in_worker
from local_engine.engine import Engine, EngineConfig, RequestOutput, StepTokens
from local_engine.errors import EngineError, InvalidRequestError, OverloadedError
from local_engine.loader import load_model
from local_engine.model import DecoderModel
from local_engine.sampler import SamplingParams
from local_engine.scheduler import SchedulerOutput

from .tiny import make_tiny_model

pytestmark = pytest.mark.anyio

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
LONG = SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> DecoderModel:
    path: Path = make_tiny_model(tmp_path_factory.mktemp("tiny") / "qwen2", "qwen2", seed=5)
    return load_model(path)


_MODE: dict[str, object] = {}


@pytest.fixture(autouse=True, params=[False, True], ids=["plain", "overlapped"])
def overlap_output(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test runs with the driver's plain steps and with overlapped output."""
    monkeypatch.setitem(_MODE, "overlap_output", request.param)


def make_engine(model: DecoderModel, **overrides: object) -> Engine:
    cfg: dict[str, object] = {"num_blocks": 512, "block_size": 4, **_MODE}
    cfg.update(overrides)
    return Engine(model, EngineConfig(**cfg))  # type: ignore[arg-type]


def prompt(i: int) -> list[int]:
    return [3 + (i * 7 + j * 13) % 250 for j in range(3 + i % 11)]


async def test_concurrent_streams_get_their_own_tokens(model: DecoderModel) -> None:
    expected = [
        r.token_ids for r in make_engine(model).generate([prompt(i) for i in range(8)], GREEDY)
    ]
    got: dict[int, list[int]] = {}
    finals: dict[int, RequestOutput] = {}

    async def consume(i: int, ae: AsyncEngine) -> None:
        tokens: list[int] = []
        async for out in ae.generate(prompt(i), GREEDY, request_id=f"r{i}"):
            assert out.request_id == f"r{i}"
            tokens.extend(out.new_token_ids)
            finals[i] = out
        got[i] = tokens

    engine = make_engine(model)
    async with AsyncEngine(engine) as ae:
        async with anyio.create_task_group() as tg:
            for i in range(8):
                tg.start_soon(consume, i, ae)
    assert [got[i] for i in range(8)] == expected
    assert all(finals[i].finished and finals[i].finish_reason == "length" for i in range(8))
    assert engine.num_free_blocks() == 512 and not engine.has_unfinished()


async def test_cancelling_100_streams_frees_every_block(model: DecoderModel) -> None:
    engine = make_engine(model, max_num_seqs=32, max_num_batched_tokens=256)
    baseline = engine.num_free_blocks()
    steps = 0
    real_step = engine.run_step

    def counting_step() -> StepTokens:
        nonlocal steps
        steps += 1
        return real_step()

    engine.run_step = counting_step  # type: ignore[method-assign]
    started = 0
    all_running = anyio.Event()

    async def consume(i: int, ae: AsyncEngine) -> None:
        nonlocal started
        # Half use stream(), half a closed-on-exit generate(): both are cancel-safe.
        cm: AbstractAsyncContextManager[AsyncIterator[RequestOutput]]
        if i % 2:
            cm = ae.stream(prompt(i), LONG)
        else:
            cm = aclosing(ae.generate(prompt(i), LONG))
        async with cm as outputs:
            async for _ in outputs:
                started += 1
                if started == 32:  # every running slot streams; 68 requests still wait
                    all_running.set()
                await anyio.sleep_forever()

    async with AsyncEngine(engine) as ae:
        async with anyio.create_task_group() as tg:
            for i in range(100):
                tg.start_soon(consume, i, ae)
            await all_running.wait()
            assert engine.num_free_blocks() < baseline
            tg.cancel_scope.cancel()
            steps_at_cancel = steps
        await ae.wait_idle()
        # Aborted within a step or two of the cancel (the one in flight, and one that may
        # start before the cancelled tasks run), not run on to max_tokens (200 steps).
        assert steps - steps_at_cancel <= 2
        assert not engine.has_unfinished() and ae.num_active == 0
        assert engine.num_free_blocks() == baseline
        # The engine still serves new requests afterwards.
        outs = [o async for o in ae.generate(prompt(1), GREEDY)]
        assert outs[-1].finished


async def test_breaking_out_of_a_stream_aborts(model: DecoderModel) -> None:
    engine = make_engine(model)
    async with AsyncEngine(engine) as ae:
        async with ae.stream(prompt(2), LONG) as outputs:
            async for out in outputs:
                assert not out.finished
                break
        await ae.wait_idle()
        assert engine.num_free_blocks() == 512
        async with aclosing(ae.generate(prompt(3), LONG)) as agen:
            async for _ in agen:
                break
        await ae.wait_idle()
        assert engine.num_free_blocks() == 512 and not engine.has_unfinished()


async def test_overload_raises(model: DecoderModel) -> None:
    engine = make_engine(model, max_num_seqs=1, max_num_batched_tokens=64, max_waiting=1)
    async with AsyncEngine(engine) as ae:
        async with ae.stream(prompt(1), LONG) as running:
            await running.__anext__()  # admitted: it holds the only running slot
            async with ae.stream(prompt(2), GREEDY):  # waits behind it
                with pytest.raises(OverloadedError):
                    async with ae.stream(prompt(3), GREEDY):
                        pass
                with pytest.raises(OverloadedError):
                    await ae.generate(prompt(4), GREEDY).__anext__()
        with pytest.raises(ValueError, match="empty"):
            async with ae.stream([], GREEDY):
                pass


async def test_slow_consumer_gets_merged_outputs(model: DecoderModel) -> None:
    engine = make_engine(model)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=True)
    expected = make_engine(model).generate([prompt(4)], params)[0].token_ids
    async with AsyncEngine(engine) as ae:
        async with ae.stream(prompt(4), params) as outputs:
            await ae.wait_idle()  # the request finishes before we read anything
            outs = [o async for o in outputs]
    assert len(outs) == 1 and outs[0].finished and outs[0].num_generated_tokens == 12
    assert outs[0].new_token_ids == expected
    assert outs[0].logprobs is not None and len(outs[0].logprobs) == 12


async def test_aclose_aborts_open_streams(model: DecoderModel) -> None:
    engine = make_engine(model)
    reasons: list[str | None] = []
    first = anyio.Event()

    async def consume(ae: AsyncEngine) -> None:
        async for out in ae.generate(prompt(5), LONG):
            first.set()
            if out.finished:
                reasons.append(out.finish_reason)

    async with anyio.create_task_group() as tg:
        async with AsyncEngine(engine) as ae:
            tg.start_soon(consume, ae)
            await first.wait()
    assert reasons == ["abort"]
    assert engine.num_free_blocks() == 512 and not engine.has_unfinished()
    with pytest.raises(EngineError, match="not running"):
        await ae.generate(prompt(1), GREEDY).__anext__()


async def test_explicit_abort_ends_stream(model: DecoderModel) -> None:
    engine = make_engine(model)
    async with AsyncEngine(engine) as ae:
        async with ae.stream(prompt(6), LONG, request_id="x") as outputs:
            await outputs.__anext__()
            ae.abort("x")
            rest = [o async for o in outputs]
        assert rest[-1].finish_reason == "abort"
        await ae.wait_idle()
        assert engine.num_free_blocks() == 512


async def test_abort_counts_the_tokens_the_stream_got_not_the_step_in_flight(
    model: DecoderModel,
) -> None:
    """A step has sampled its token but not handed it out (it is still in its thread, or
    with overlap its output is not processed yet) when the request is aborted: the final
    output's count is the tokens the stream received, not one more."""
    engine = make_engine(model)
    real_run_step = engine.run_step
    armed, ran, release = threading.Event(), threading.Event(), threading.Event()

    def run_step() -> StepTokens:
        tokens = real_run_step()
        if armed.is_set():
            ran.set()  # this step's token is in the sequence, not in any output yet
            release.wait(60.0)  # bounded: a failing test must not leave the driver stuck
        return tokens

    engine.run_step = run_step  # type: ignore[method-assign]
    async with AsyncEngine(engine) as ae:
        try:
            async with ae.stream(prompt(6), LONG, request_id="x") as outputs:
                first = await outputs.__anext__()
                armed.set()
                assert await anyio.to_thread.run_sync(ran.wait, 60.0)
                ae.abort("x")
                release.set()
                rest = [o async for o in outputs]
        finally:
            release.set()  # never leave the driver's thread waiting
        await ae.wait_idle()
        assert engine.num_free_blocks() == 512
    assert rest[-1].finish_reason == "abort"
    received = sum(len(o.new_token_ids) for o in [first, *rest])
    assert rest[-1].num_generated_tokens == received >= 1


async def test_step_failure_fails_streams(model: DecoderModel) -> None:
    engine = make_engine(model)

    def broken() -> StepTokens:
        raise RuntimeError("boom")

    engine.run_step = broken  # type: ignore[method-assign]
    async with AsyncEngine(engine) as ae:
        with pytest.raises(EngineError, match="boom"):
            async for _ in ae.generate(prompt(1), GREEDY):
                pass
        with pytest.raises(EngineError):
            await ae.generate(prompt(1), GREEDY).__anext__()
    assert not engine.has_unfinished()


async def test_body_exception_propagates_unwrapped(model: DecoderModel) -> None:
    with pytest.raises(KeyError):
        async with AsyncEngine(make_engine(model)):
            raise KeyError("from the body")


async def test_request_waiting_for_the_lock_while_closing_fails_cleanly(
    model: DecoderModel,
) -> None:
    engine = make_engine(model)
    gate, in_step = threading.Event(), threading.Event()
    step = engine.run_step

    def held_step() -> StepTokens:
        in_step.set()
        gate.wait()
        return step()

    engine.run_step = held_step  # type: ignore[method-assign]
    outcome: list[str] = []
    async with AsyncEngine(engine) as ae:

        async def first() -> None:
            async with ae.stream(prompt(1), LONG) as outputs:
                async for _ in outputs:
                    pass
            outcome.append("first ended")

        async def second() -> None:
            with pytest.raises(EngineError, match="shutting down"):
                async with ae.stream(prompt(2), LONG):
                    pass
            outcome.append("second refused")

        async with anyio.create_task_group() as tg:
            tg.start_soon(first)
            await anyio.to_thread.run_sync(in_step.wait)  # the driver is mid-step
            tg.start_soon(second)
            await anyio.wait_all_tasks_blocked()  # second waits for the engine lock
            tg.start_soon(ae.aclose)
            await anyio.wait_all_tasks_blocked()
            gate.set()
    assert sorted(outcome) == ["first ended", "second refused"]
    assert engine.num_free_blocks() == engine.num_blocks


def record_steps(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> list[list[tuple[str, int]]]:
    """Record each step's (request id, tokens computed) in schedule order."""
    steps: list[list[tuple[str, int]]] = []
    schedule = engine.scheduler.schedule

    def recording() -> SchedulerOutput:
        out = schedule()
        if out.scheduled:
            steps.append([(s.seq.request_id, s.num_new_tokens) for s in out.scheduled])
        return out

    monkeypatch.setattr(engine.scheduler, "schedule", recording)
    return steps


async def test_choices_compute_their_prompt_once_and_step_together(
    model: DecoderModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = make_engine(model)
    steps = record_steps(engine, monkeypatch)
    shared = [3 + j * 11 % 240 for j in range(18)]  # 4 full blocks, 2 tokens in the fifth
    params = [SamplingParams(seed=i, max_tokens=4, ignore_eos=True) for i in range(3)]
    last: dict[int, RequestOutput] = {}
    async with AsyncEngine(engine) as ae, ae.stream_choices(shared, params) as merged:
        async for index, out in merged:
            last[index] = out
    finals = [last[i] for i in range(3)]
    first = finals[0].request_id
    assert steps[0] == [(first, 18)]  # the prompt, once
    assert sorted(n for _, n in steps[1]) == [1, 2, 2]  # the others: only the last block
    assert [len(step) for step in steps] == [1, 3, 3, 3, 2]  # then one batch to the end
    assert [f.num_cached_tokens for f in finals] == [0, 16, 16]
    assert all(f.num_generated_tokens == 4 for f in finals)
    assert engine.num_free_blocks() == 512


class _Heavy:
    """Stands for the engine and a step's tensors: what a worker thread must not hold."""

    def run(self, given: _Heavy) -> _Heavy:
        return given


async def test_a_worker_thread_keeps_nothing_of_its_call() -> None:
    """A worker of trio's thread cache dropped its job (the engine's bound method, a step's
    tensors) only when it ran again; at interpreter exit that freed the engine's tensors in
    that thread during finalization and aborted the process (seen on trio after a
    LocalBackend was entered twice). The job lets go of everything before it is handed back."""
    owner, given = _Heavy(), _Heavy()
    refs = [weakref.ref(owner), weakref.ref(given)]
    result = await run_in_worker(owner.run, given)
    assert result is given
    del owner, given, result
    assert [ref() for ref in refs] == [None, None]  # no reference left in the worker thread

    def fails() -> None:
        raise ValueError("in the worker")

    with pytest.raises(ValueError, match="in the worker"):
        await run_in_worker(fails)


async def test_one_async_engine_drives_an_engine_at_a_time(model: DecoderModel) -> None:
    engine = make_engine(model)
    async with AsyncEngine(engine):
        with pytest.raises(EngineError, match="already served by another AsyncEngine"):
            async with AsyncEngine(engine):
                pass
    async with AsyncEngine(engine) as again:  # released when the first stopped
        outs = [out async for out in again.generate(prompt(1), GREEDY)]
        assert outs[-1].finished
    # closing the first again (as its __aexit__ does after an explicit close) leaves the
    # engine's new owner alone: it aborted the new owner's requests, whose streams then hung
    first = AsyncEngine(engine)
    await first.__aenter__()
    await first.aclose()
    async with AsyncEngine(engine) as second:
        async with second.stream(prompt(2), LONG) as running:
            await running.__anext__()
            await first.aclose()
            assert engine.has_unfinished()
            outs = [out async for out in running]
        assert outs[-1].finished and outs[-1].num_generated_tokens == 200
    await first.__aexit__(None, None, None)


async def test_choices_refused_leave_none_added(model: DecoderModel) -> None:
    engine = make_engine(model, max_num_seqs=1, max_num_batched_tokens=64, max_waiting=2)
    async with AsyncEngine(engine) as ae:
        async with ae.stream(prompt(3), LONG) as running:
            await running.__anext__()  # admitted: it holds the only running slot
            async with ae.stream(prompt(2), GREEDY):  # waits behind it: one slot left
                with pytest.raises(OverloadedError):
                    async with ae.stream_choices(prompt(1), [GREEDY] * 2):
                        pass
                assert engine.scheduler.num_waiting == 1  # neither choice stayed
        # more choices than ever wait at once: refused as a bad request, not "busy" (a 503 a
        # retrying client would send again forever)
        with pytest.raises(InvalidRequestError, match="max_waiting=2"):
            async with ae.stream_choices(prompt(1), [GREEDY] * 3):
                pass
        await ae.wait_idle()  # the two streams left above are aborted
        assert not engine.has_unfinished()
        async with ae.stream_choices(prompt(1), [GREEDY] * 2) as merged:
            pairs = [pair async for pair in merged]
        assert sorted({index for index, _ in pairs}) == [0, 1]
        for choice in (0, 1):
            outs = [out for index, out in pairs if index == choice]
            assert outs[-1].finished and outs[-1].num_generated_tokens == 6
            assert not any(out.finished for out in outs[:-1])
