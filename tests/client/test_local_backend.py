"""LocalBackend: lazy import, lifecycle, cancellation, seeds, prefix cache, request mapping."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from local_engine import LocalBackend
from local_engine.default_model import embedded_model_dir
from swiftclient import AsyncClient
from swiftclient.admission import Limits
from swiftclient.errors import BadRequestError, ConfigurationError, EngineError
from swiftclient.extend import Deadline
from swiftclient.types import ChatRequest, Message, Tool

from ..conformance.tiny_local import ReplyScriptEngine, TinyModel, load_tiny_model
from .mock import TOOL_LOOP_ANSWER, tool_loop

LIMIT = 30.0  # seconds; a bound on waiting for the engine to settle, not a speed assertion
MODEL = "tiny"
FIXED: dict[str, Any] = {"temperature": 0.0, "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> TinyModel:
    return load_tiny_model(tmp_path_factory.mktemp("swiftclient-cache"))


@pytest.fixture
def cache_env(tiny: TinyModel, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Point SWIFTCLIENT_CACHE_DIR at the prebuilt cache, so the default model is found."""
    monkeypatch.setenv("SWIFTCLIENT_CACHE_DIR", str(tiny.cache_root))
    yield tiny.path


def test_importing_the_backend_does_not_import_torch() -> None:
    code = (
        "import sys\n"
        "from local_engine import LocalBackend\n"
        "from swiftclient.providers import preset\n"
        "backends = [LocalBackend(), preset('local', environ={})]\n"
        "assert all(type(b) is LocalBackend for b in backends), backends\n"
        "heavy = ('torch', 'transformers', 'safetensors', 'tokenizers')\n"
        "print(','.join(m for m in heavy if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_constructor_rejects_bad_arguments() -> None:
    with pytest.raises(ConfigurationError, match="name"):
        LocalBackend(name="a/b")
    with pytest.raises(ConfigurationError, match="default_max_tokens"):
        LocalBackend(default_max_tokens=0)
    with pytest.raises(ConfigurationError, match="model must be"):  # a bare TypeError at entry
        LocalBackend(123)  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_one_engine_is_served_by_one_backend_at_a_time(tiny: TinyModel) -> None:
    """Two backends from one engine each started a driver: two threads stepped it at once,
    and it failed ("2 blocks cannot hold 33 tokens"), refusing every request after."""
    engine = tiny.engine()
    first, second = LocalBackend.from_engine(engine), LocalBackend.from_engine(engine, name="b")
    async with AsyncClient(first, model=MODEL) as client:
        with pytest.raises(ConfigurationError, match="already served by another LocalBackend"):
            async with AsyncClient(second, model=MODEL):
                pass
        assert (await client.chat("Hi", max_tokens=2)).usage is not None
    async with AsyncClient(second, model=MODEL) as client:  # free once the first is closed
        assert (await client.chat("Hi", max_tokens=2)).usage is not None


@pytest.mark.anyio
async def test_calls_outside_async_with_raise_configuration_error(tiny: TinyModel) -> None:
    backend = LocalBackend.from_engine(tiny.engine())
    client = AsyncClient(backend, model=MODEL)
    with pytest.raises(ConfigurationError, match="async with AsyncClient"):
        await client.chat("Hi", max_tokens=2)
    with pytest.raises(ConfigurationError, match="async with AsyncClient"):
        async with client.stream("Hi", max_tokens=2):
            pass
    async with client:
        assert (await client.chat("Hi", max_tokens=2)).usage is not None
    request = ChatRequest(model=MODEL, messages=[Message(role="user", content="Hi")])
    with pytest.raises(ConfigurationError, match="not running"):
        await backend.complete(request, Deadline.after(5.0))


@pytest.mark.anyio
async def test_the_default_model_is_the_embedded_trained_one(cache_env: Path) -> None:
    backend = LocalBackend()
    assert not backend.loaded
    await backend.warmup()
    assert backend.loaded and not backend.running
    assert backend.model_dir == embedded_model_dir() != cache_env
    async with AsyncClient(backend, model="default") as client:
        assert backend.running
        completion = await client.chat("Hello", max_tokens=3, **FIXED)
    assert completion.usage is not None and completion.usage.completion_tokens == 3
    assert not backend.running and not backend.loaded  # closing drops the model it loaded


@pytest.mark.anyio
async def test_model_may_be_a_directory_or_an_embedded_model_name(cache_env: Path) -> None:
    for model in (cache_env, str(cache_env), "swift-tiny-random"):
        backend = LocalBackend(model)
        await backend.warmup()
        assert backend.model_dir == cache_env
    for name in ("swift-tiny", "default"):  # "default": the name calls carry (default_model)
        backend = LocalBackend(name)
        await backend.warmup()
        assert backend.model_dir == embedded_model_dir()
    with pytest.raises(ConfigurationError, match="neither a model directory") as caught:
        async with LocalBackend(cache_env / "missing"):
            pass
    assert "random weights, for tests and benchmarks: swift-50m" in str(caught.value)


def test_a_backend_serves_one_event_loop_after_another_of_either_library(
    cache_env: Path,
) -> None:
    """Its model-loading lock was made on the first event loop: the next run on the other
    library failed inside warmup() ("no running event loop", "must be called from async
    context")."""
    backend = LocalBackend(cache_env)

    async def once() -> int | None:
        async with AsyncClient(backend, model=MODEL) as client:
            usage = (await client.chat("Hi", max_tokens=2)).usage
            return None if usage is None else usage.completion_tokens

    for library in ("asyncio", "trio", "asyncio"):
        assert anyio.run(once, backend=library) == 2, library


@pytest.mark.anyio
async def test_a_closed_backend_does_not_keep_its_model_alive(cache_env: Path) -> None:
    """The engine's gauges stay registered with the global meter for the process's life:
    a backend that closed must not keep its engine (the weights) reachable through them."""
    import gc
    import weakref

    backend = LocalBackend(cache_env)
    async with AsyncClient(backend) as client:
        await client.chat("Hello", max_tokens=1, **FIXED)
        engine = weakref.ref(backend._loaded_service().engine)
    del client, backend
    gc.collect()
    assert engine() is None


@pytest.mark.anyio
async def test_a_client_on_the_local_backend_needs_no_model_name(tiny: TinyModel) -> None:
    """Switching a client from a hosted provider to the local engine is one setting: with
    no model named, calls carry the backend's ``default_model``."""
    backend = LocalBackend.from_engine(tiny.engine())
    async with AsyncClient(backend) as client:
        completion = await client.chat("Hello", max_tokens=2, **FIXED)
    assert completion.model == LocalBackend.default_model == "default"
    assert completion.usage is not None and completion.usage.completion_tokens == 2


@pytest.mark.anyio
async def test_a_hundred_abandoned_streams_free_every_block(tiny: TinyModel) -> None:
    engine = tiny.engine(num_blocks=1024, max_num_seqs=128, max_num_batched_tokens=4096)
    backend = LocalBackend.from_engine(engine)
    baseline = engine.num_free_blocks()
    streaming = 0
    all_streaming = anyio.Event()
    kinds = {"break": 0, "cancel while streaming": 0, "cancel before first token": 0}

    async def one(i: int) -> None:
        nonlocal streaming
        prompt = f"Request {i}: " + "tell me more " * (i % 7)
        async with client.stream(prompt, max_tokens=500, **FIXED) as stream:
            streaming += 1
            if streaming == 80:
                all_streaming.set()
            if i % 2:
                kinds["break"] += 1
                async for chunk in stream:
                    if chunk.text:
                        break
                return
            kinds["cancel while streaming"] += 1
            await anyio.sleep_forever()

    async def early(i: int) -> None:
        kinds["cancel before first token"] += 1
        async with client.stream(f"Late {i}", max_tokens=500, **FIXED) as stream:
            async for _ in stream:
                pass

    async with AsyncClient(backend, model=MODEL) as client:
        async with anyio.create_task_group() as tg:
            for i in range(80):
                tg.start_soon(one, i)
            await all_streaming.wait()
            for i in range(20):
                tg.start_soon(early, i)
            await anyio.wait_all_tasks_blocked()
            tg.cancel_scope.cancel()
        async_engine = backend.async_engine
        assert async_engine is not None and async_engine.num_active == 0
        with anyio.fail_after(LIMIT):
            await async_engine.wait_idle()
        assert not engine.has_unfinished()
        assert engine.num_free_blocks() == baseline
        # The engine is still healthy afterwards.
        completion = await client.chat("After", max_tokens=2, **FIXED)
        assert completion.finish_reason == "length"
    assert kinds == {"break": 40, "cancel while streaming": 40, "cancel before first token": 20}


@pytest.mark.anyio
async def test_same_seed_gives_the_same_text(tiny: TinyModel) -> None:
    sampled: dict[str, Any] = {
        "temperature": 1.0,
        "max_tokens": 12,
        "extra_body": {"ignore_eos": True},
    }
    async with AsyncClient(LocalBackend.from_engine(tiny.engine()), model=MODEL) as client:
        first = await client.chat("Write a line.", seed=42, **sampled)
        again = await client.chat("Write a line.", seed=42, stream=False, **sampled)
        other = await client.chat("Write a line.", seed=43, **sampled)
    assert first.text and first.text == again.text
    assert other.text != first.text


@pytest.mark.anyio
async def test_n_choices_through_the_client_and_the_next_call_still_works(
    tiny: TinyModel,
) -> None:
    """``n > 1`` through ``AsyncClient`` on the in-process engine, plain and streamed: the
    choices' block is opened inside the attempt's deadline scope and closed outside it, so
    it must hold no task group (it crashed with a cancel-scope error and broke the client's
    next call)."""
    sampled: dict[str, Any] = {"temperature": 1.0, "max_tokens": 6, "seed": 7}
    async with AsyncClient(LocalBackend.from_engine(tiny.engine()), model=MODEL) as client:
        reply = await client.chat("Write a line.", n=3, **sampled)
        assert [c.index for c in reply.choices] == [0, 1, 2]
        texts = {c.message.content for c in reply.choices}
        assert len(texts) > 1  # three seeds, three samples
        async with client.stream("Write a line.", n=3, **sampled) as stream:
            streamed = await stream.final()
        assert [c.message.content for c in streamed.choices] == [
            c.message.content for c in reply.choices
        ]
        after = await client.chat("Write a line.", **sampled)
        assert after.text == reply.choices[0].message.content
        assert reply.usage is not None and after.usage is not None
        assert reply.usage.prompt_tokens == after.usage.prompt_tokens  # the prompt once


@pytest.mark.anyio
async def test_repeated_long_prompt_reports_cached_tokens_per_salt(tiny: TinyModel) -> None:
    prompt = "The quick brown fox jumps over the lazy dog. " * 20

    async def cached(client: AsyncClient, **params: Any) -> int:
        completion = await client.chat(prompt, max_tokens=2, **{**FIXED, **params})
        assert completion.usage is not None
        assert completion.usage.cached_tokens < completion.usage.prompt_tokens
        return int(completion.usage.cached_tokens)

    async with AsyncClient(LocalBackend.from_engine(tiny.engine()), model=MODEL) as client:
        assert await cached(client) == 0
        repeat = await cached(client)
        assert repeat > 0 and repeat % 16 == 0
        assert await cached(client, user="tenant-b") == 0  # another salt shares nothing
        assert await cached(client, user="tenant-b") == repeat
        salted = {"extra_body": {"ignore_eos": True, "cache_salt": "tenant-c"}}
        assert await cached(client, **salted) == 0


@pytest.mark.anyio
async def test_logprobs_cover_every_generated_token(tiny: TinyModel) -> None:
    async with AsyncClient(LocalBackend.from_engine(tiny.engine()), model=MODEL) as client:
        for stream in (True, False):
            completion = await client.chat(
                "Hi", max_tokens=4, logprobs=True, top_logprobs=3, stream=stream, **FIXED
            )
            logprobs = completion.choices[0].logprobs
            assert logprobs is not None and len(logprobs["content"]) == 4
            for entry in logprobs["content"]:
                assert entry["logprob"] <= 0.0 and isinstance(entry["token"], str)
                assert len(entry["top_logprobs"]) == 3
            # Greedy: the chosen token is the most likely one.
            first = logprobs["content"][0]
            assert first["logprob"] == pytest.approx(first["top_logprobs"][0]["logprob"])


@pytest.mark.anyio
async def test_tools_and_response_format_reach_the_prompt(tiny: TinyModel) -> None:
    tool = Tool.model_validate(
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Current weather for a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    )

    async def prompt_tokens(client: AsyncClient, **params: Any) -> int:
        completion = await client.chat("Weather in Paris?", max_tokens=1, **{**FIXED, **params})
        assert completion.usage is not None
        return int(completion.usage.prompt_tokens)

    async with AsyncClient(LocalBackend.from_engine(tiny.engine()), model=MODEL) as client:
        plain = await prompt_tokens(client)
        assert await prompt_tokens(client, tools=[tool]) > plain
        assert await prompt_tokens(client, tools=[tool], tool_choice="none") == plain
        assert await prompt_tokens(client, response_format={"type": "json_object"}) > plain


class ToolLoopEngine(ReplyScriptEngine):
    """Answers like a tool-using model: a weather call, an add call, then the answer."""

    replies = (
        ("<tool_call>", '{"name": "get_weather", "arguments": {"city": "Paris"}}', "</tool_call>"),
        ("<tool_call>", '{"name": "add", "arguments": {"a": 20, "b": 1.5}}', "</tool_call>"),
        (TOOL_LOOP_ANSWER,),
    )


@pytest.mark.anyio
@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "plain"])
async def test_a_three_turn_tool_loop_runs_on_the_local_engine(
    tiny: TinyModel, stream: bool
) -> None:
    engine = tiny.build(ToolLoopEngine)
    async with AsyncClient(LocalBackend.from_engine(engine), model=MODEL) as client:
        completions = await tool_loop(
            client, stream=stream, max_tokens=20, extra_body={"ignore_eos": True}
        )
    prompts = [c.usage.prompt_tokens if c.usage else 0 for c in completions]
    assert prompts[0] < prompts[1] < prompts[2]  # each turn's reply and result went back in
    assert engine.num_free_blocks() == engine.num_blocks


@pytest.mark.anyio
async def test_bad_requests_raise_bad_request_error_as_over_http(tiny: TinyModel) -> None:
    engine = tiny.engine(num_blocks=8)  # a 128-token context
    async with AsyncClient(LocalBackend.from_engine(engine), model=MODEL) as client:
        with pytest.raises(BadRequestError, match="max_model_len"):
            await client.chat("word " * 200)
        with pytest.raises(BadRequestError, match="ask for at most"):
            await client.chat("Hi", max_tokens=500)
        with pytest.raises(BadRequestError, match="n=17"):
            await client.chat("Hi", n=17)
        with pytest.raises(BadRequestError, match="logit_bias"):
            await client.chat("Hi", logit_bias={"5": 1.0})
        ignored = await client.chat("Hi", max_tokens=2, extra_body={"bogus_key": 1.1})
        assert ignored.usage is not None  # an unknown key is ignored, as over HTTP
        with pytest.raises(BadRequestError, match="ignore_eos"):
            await client.chat("Hi", extra_body={"ignore_eos": "yes"})
        with pytest.raises(BadRequestError, match="top_p"):
            await client.chat("Hi", top_p=0.0)
        with pytest.raises(BadRequestError, match="top_logprobs"):
            await client.chat("Hi", top_logprobs=2)
        # Without a limit, a request gets what the context leaves.
        completion = await client.chat("Hi", **FIXED)
        assert completion.finish_reason == "length"
        assert completion.usage is not None
        assert completion.usage.total_tokens == engine.max_model_len


@pytest.mark.anyio
async def test_an_error_in_the_block_propagates_unwrapped(tiny: TinyModel) -> None:
    backend = LocalBackend.from_engine(tiny.engine())
    with pytest.raises(KeyError, match="boom"):
        async with AsyncClient(backend, model=MODEL):
            raise KeyError("boom")
    assert not backend.running


@pytest.mark.anyio
async def test_engine_shutdown_mid_stream_is_an_engine_error(tiny: TinyModel) -> None:
    backend = LocalBackend.from_engine(tiny.engine())
    async with AsyncClient(backend, model=MODEL) as client:
        async with client.stream("Go on", max_tokens=500, **FIXED) as stream:
            await backend.aclose()
            with pytest.raises(EngineError, match="shut down"):
                async for _ in stream:
                    pass


@pytest.mark.anyio
@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
async def test_extra_body_keys_the_engine_does_not_read_are_named_as_over_http(
    tiny: TinyModel, stream: bool
) -> None:
    """The engine's server names them in ``x-ignored-fields``; in-process they were only
    logged (once per process), so a call (and an SDK through the transports) heard
    nothing."""
    async with AsyncClient(LocalBackend.from_engine(tiny.engine()), model=MODEL) as client:
        extra = {"ignore_eos": True, "thinkng": {"type": "enabled"}, "ключ": 1}
        done = await client.chat("Hi", max_tokens=2, stream=stream, extra_body=extra)
        assert done.timing is not None
        assert done.timing.attempts[0].headers == {
            "x-ignored-fields": "\\u043a\\u043b\\u044e\\u0447, thinkng"  # sorted, escaped
        }
        plain = await client.chat("Hi", max_tokens=2, stream=stream, **FIXED)
        assert plain.timing is not None and plain.timing.attempts[0].headers is None


@pytest.mark.anyio
async def test_naming_ignored_keys_teaches_admission_nothing(tiny: TinyModel) -> None:
    """The header came with a "status 200", which admission took as an HTTP answer: an
    in-process attempt that failed or timed out set the target's learned latency, which
    then refused calls with shorter deadlines, only when an ignored key was sent."""
    backend = LocalBackend.from_engine(tiny.engine())
    async with AsyncClient(backend, model=MODEL, limits=Limits(concurrency=4)) as client:
        extra = {"ignore_eos": True, "not_an_engine_key": 1}
        done = await client.chat("Hi", max_tokens=2, stream=False, extra_body=extra)
        assert done.timing is not None and done.timing.attempts[0].headers
        (gate,) = client.admission._gates.values()
        assert gate.latency is None  # as for a call without the key
