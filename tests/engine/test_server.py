"""The OpenAI-compatible local server, driven by the official ``openai`` client (and raw HTTP
where a client library would refuse to send the request)."""

from __future__ import annotations

import argparse
import gc
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import Any

import anyio
import httpx
import openai
import pytest

from local_engine import LocalBackend
from local_engine.engine import Engine
from local_engine.sampling_params import SamplingParams
from local_engine.server import LocalServer
from swiftclient import HTTPBackend

from ..conformance.tiny_local import CountingEngine, ReplyScriptEngine, TinyModel, load_tiny_model

pytestmark = [
    pytest.mark.anyio,
    # openai's stream leaves its inner async generators to the garbage collector, which trio
    # reports; ``serve`` collects them before its test ends. The server side is closed at once
    # (the tests check the engine and the connection).
    pytest.mark.filterwarnings(
        "ignore:Exception ignored in. <async_generator object (AsyncStream|SSEDecoder)\\.:"
        "pytest.PytestUnraisableExceptionWarning"
    ),
]

KEY = "sk-local-test-0123456789"
LIMIT = 30.0  # seconds; a bound on waiting for the engine to settle, not a speed assertion
LONG: dict[str, Any] = {"max_tokens": 1000, "extra_body": {"ignore_eos": True}}
GREEDY: dict[str, Any] = {"temperature": 0.0, "extra_body": {"ignore_eos": True}}
HI: Any = [{"role": "user", "content": "Hi there"}]  # openai's TypedDicts, loosely
TOOLS: Any = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> TinyModel:
    return load_tiny_model(tmp_path_factory.mktemp("swiftclient-cache"))


@dataclass
class Served:
    """A running server, its engine, an OpenAI client and a raw HTTP client (with the key,
    rooted at the server's origin)."""

    server: LocalServer
    engine: Engine
    oa: openai.AsyncOpenAI
    http: httpx.AsyncClient

    @property
    def steps(self) -> int:
        return self.engine.steps if isinstance(self.engine, CountingEngine) else 0

    async def settle(self) -> None:
        """Wait until the engine has no live request; check that every block is free."""
        with anyio.fail_after(LIMIT):
            await self.server.wait_idle()
        assert not self.engine.has_unfinished()
        assert self.engine.num_free_blocks() == self.engine.num_blocks


@asynccontextmanager
async def serve(engine: Engine, **options: Any) -> AsyncIterator[Served]:
    options = {"api_key": KEY, "max_tokens_limit": 2000, **options}
    backend = LocalBackend.from_engine(engine, default_max_tokens=16)
    async with LocalServer(backend, port=0, model_name="tiny-test", **options) as server:
        oa = openai.AsyncOpenAI(base_url=server.base_url, api_key=KEY, max_retries=0, timeout=60)
        headers = {"authorization": f"Bearer {KEY}"}
        root = server.base_url.removesuffix("/v1")
        async with httpx.AsyncClient(base_url=root, headers=headers) as http:
            try:
                yield Served(server, engine, oa, http)
            finally:
                await oa.close()
                gc.collect()  # finalize openai's abandoned generators within this test


@pytest.fixture
async def served(tiny: TinyModel, anyio_backend: str) -> AsyncIterator[Served]:
    async with serve(tiny.engine(), max_body_bytes=64 * 1024) as running:
        yield running


# ---------------------------------------------------------------------- chat


async def test_streaming_chat_with_usage(served: Served) -> None:
    stream = await served.oa.chat.completions.create(
        model="tiny-test",
        messages=HI,
        max_tokens=5,
        stream=True,
        stream_options={"include_usage": True},
        **GREEDY,
    )
    chunks = [chunk async for chunk in stream]

    assert chunks[0].choices[0].delta.role == "assistant"
    assert {c.object for c in chunks} == {"chat.completion.chunk"}
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length" and finishes.count("length") == 1
    usage = chunks[-1].usage
    assert usage is not None and not chunks[-1].choices
    assert usage.completion_tokens == 5 and usage.prompt_tokens > 0
    assert usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == 0
    await served.settle()


async def test_streaming_without_include_usage_sends_no_usage(served: Served) -> None:
    stream = await served.oa.chat.completions.create(
        model="tiny-test", messages=HI, max_tokens=3, stream=True, **GREEDY
    )
    chunks = [chunk async for chunk in stream]
    assert all(c.usage is None and c.choices for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "length"


async def test_raw_stream_is_server_sent_events_ending_in_done(served: Served) -> None:
    body = {"model": "tiny-test", "messages": HI, "max_tokens": 3, "stream": True}
    body["ignore_eos"] = True
    async with served.http.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        raw = (await response.aread()).decode()
    events = [block for block in raw.split("\n\n") if block]
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"
    for event in events[:-1]:
        chunk = json.loads(event.removeprefix("data: "))
        assert chunk["object"] == "chat.completion.chunk"
        assert all("finish_reason" in c and "delta" in c for c in chunk["choices"])


async def test_plain_chat_returns_a_completion(served: Served) -> None:
    completion = await served.oa.chat.completions.create(
        model="tiny-test", messages=HI, max_tokens=4, **GREEDY
    )
    assert completion.object == "chat.completion" and completion.id.startswith("chatcmpl-")
    assert completion.model == "tiny-test"
    choice = completion.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason == "length"
    assert completion.usage is not None and completion.usage.completion_tokens == 4
    # Without max_tokens, the backend's default applies.
    default = await served.oa.chat.completions.create(model="tiny-test", messages=HI, **GREEDY)
    assert default.usage is not None and default.usage.completion_tokens == 16


async def test_repeated_long_prompt_reports_cached_tokens(served: Served) -> None:
    messages: Any = [{"role": "user", "content": "Tell me about the sea and the sky. " * 12}]
    counts = []
    for _ in range(2):
        completion = await served.oa.chat.completions.create(
            model="tiny-test", messages=messages, max_tokens=1, **GREEDY
        )
        assert completion.usage is not None and completion.usage.prompt_tokens_details
        counts.append(completion.usage.prompt_tokens_details.cached_tokens)
    assert counts[0] == 0 and counts[1] and counts[1] > 0


async def test_tool_definitions_are_rendered_into_the_prompt(served: Served) -> None:
    async def prompt_tokens(**params: Any) -> int:
        completion = await served.oa.chat.completions.create(
            model="tiny-test", messages=HI, max_tokens=1, **GREEDY, **params
        )
        assert completion.usage is not None
        return int(completion.usage.prompt_tokens)

    plain = await prompt_tokens()
    assert await prompt_tokens(tools=TOOLS) > plain + 10
    assert await prompt_tokens(tools=TOOLS, tool_choice="none") == plain


async def test_stop_string_cuts_the_text(served: Served) -> None:
    async def greedy(**params: Any) -> tuple[str, str | None]:
        completion = await served.oa.chat.completions.create(
            model="tiny-test", messages=HI, max_tokens=12, **GREEDY, **params
        )
        choice = completion.choices[0]
        return choice.message.content or "", choice.finish_reason

    full, _ = await greedy()
    stop = full[len(full) // 2 :][:2]
    assert stop
    cut, reason = await greedy(stop=[stop])
    assert reason == "stop"
    assert cut == full[: full.find(stop)]


async def test_same_seed_same_text(served: Served) -> None:
    async def sampled(seed: int) -> str:
        completion = await served.oa.chat.completions.create(
            model="tiny-test",
            messages=HI,
            max_tokens=10,
            temperature=1.0,
            seed=seed,
            extra_body={"ignore_eos": True},
        )
        return completion.choices[0].message.content or ""

    first = await sampled(7)
    assert first and first == await sampled(7)
    assert first != await sampled(8)


class ScriptedEngine(ReplyScriptEngine):
    """Writes a fixed reply (what a trained model would have written) in place of the
    tiny model's random text, so the tool-call path runs end to end."""

    replies = (
        (
            "Let me check. ",
            "<tool_call>",
            '{"name": "get_weather", ',
            '"arguments": ',
            '{"city": "Paris"}}',
            "</tool_call>",
        ),
    )


async def _chat_with_tools(
    running: Served, stream: bool, max_tokens: int
) -> tuple[str, list[tuple[str | None, str | None, str | None]], str | None]:
    """One chat request with :data:`TOOLS`, streamed or not: its content, its calls as
    ``(id, name, arguments)`` and its finish reason."""
    params: dict[str, Any] = {"model": "tiny-test", "messages": HI, "tools": TOOLS}
    params |= {"max_tokens": max_tokens, "extra_body": {"ignore_eos": True}}
    create: Any = running.oa.chat.completions.create
    if stream:
        chunks = [c async for c in await create(stream=True, **params)]
        content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        deltas = [t for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or []]
        assert all(d.function is not None for d in deltas)
        calls = [(d.id, d.function.name, d.function.arguments) for d in deltas if d.function]
        return content, calls, chunks[-1].choices[0].finish_reason
    completion = await create(**params)
    message = completion.choices[0].message
    assert all(call.type == "function" for call in message.tool_calls or [])
    calls = [(c.id, c.function.name, c.function.arguments) for c in message.tool_calls or []]
    return message.content or "", calls, completion.choices[0].finish_reason


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "plain"])
async def test_tool_call_output_is_returned_as_tool_calls(
    tiny: TinyModel, anyio_backend: str, stream: bool
) -> None:
    async with serve(tiny.build(ScriptedEngine)) as running:
        content, calls, finish = await _chat_with_tools(running, stream, 50)
        assert content.strip() == "Let me check."
        assert len(calls) == 1
        call_id, name, arguments = calls[0]
        assert call_id and call_id.startswith("call_")
        assert name == "get_weather" and json.loads(arguments or "") == {"city": "Paris"}
        assert finish == "tool_calls"
        await running.settle()


class CutCallEngine(ReplyScriptEngine):
    """Writes a tool call one piece a step, for ``max_tokens`` to cut it short (the tiny
    model's end-of-text token ignored, as no wire but OpenAI's can ask for that)."""

    def add_request(self, prompt_ids: Any, params: SamplingParams, **kwargs: Any) -> str:
        return super().add_request(prompt_ids, replace(params, ignore_eos=True), **kwargs)

    replies = (
        (
            "Checking. ",
            "<tool_call>",
            '{"name": "get_weather", "arguments": ',
            '{"city": "Pa',
            'ris"}}',
            "</tool_call>",
        ),
    )


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "plain"])
async def test_a_call_cut_by_max_tokens_keeps_its_arguments_so_far_and_says_length(
    tiny: TinyModel, anyio_backend: str, stream: bool
) -> None:
    """As OpenAI returns one: the call with the arguments generated so far, finish_reason
    "length"; never the model's tool-call markup as content, never "tool_calls"."""
    async with serve(tiny.build(CutCallEngine)) as running:
        seen = []
        for limit in (2, 3, 4):
            content, calls, finish = await _chat_with_tools(running, stream, limit)
            assert "<tool_call>" not in content and content.strip() == "Checking."
            seen.append(([call[1:] for call in calls], finish))
        assert seen == [
            ([], "length"),  # cut before the call's name was whole: its markup is dropped
            ([("get_weather", "")], "length"),
            ([("get_weather", '{"city": "Pa')], "length"),
        ]
        # the Messages and Responses wires say the same in their words
        function = TOOLS[0]["function"]
        tool = {"name": "get_weather", "input_schema": function["parameters"]}
        body = {"model": "tiny-test", "max_tokens": 4, "tools": [tool]}
        body |= {"messages": [{"role": "user", "content": "Hi"}]}
        message = (await running.http.post("/v1/messages", json=body)).json()
        assert message["stop_reason"] == "max_tokens"
        assert [b["type"] for b in message["content"]] == ["text", "tool_use"]
        assert message["content"][1]["input"] == {}  # the SDK needs an object
        body = {"model": "tiny-test", "max_output_tokens": 4, "input": "Hi"}
        body["tools"] = [{"type": "function", **function}]
        response = (await running.http.post("/v1/responses", json=body)).json()
        assert response["status"] == "incomplete"
        assert [(i["type"], i["status"]) for i in response["output"]] == [
            ("message", "completed"),
            ("function_call", "incomplete"),
        ]
        assert response["output"][1]["arguments"] == '{"city": "Pa'
        await running.settle()


# ---------------------------------------------------------------------- refusals


async def test_wrong_or_missing_key_is_401(served: Served) -> None:
    stranger = openai.AsyncOpenAI(base_url=served.server.base_url, api_key="sk-wrong-key-000")
    try:
        with pytest.raises(openai.AuthenticationError) as caught:
            await stranger.chat.completions.create(model="tiny-test", messages=HI)
        assert caught.value.status_code == 401 and caught.value.code == "invalid_api_key"
        assert "sk-wrong" not in str(caught.value)
        with pytest.raises(openai.AuthenticationError):
            await stranger.models.list()
    finally:
        await stranger.close()
    response = await served.http.get("/v1/models", headers={"authorization": ""})
    assert response.status_code == 401
    assert response.json()["error"]["type"] == "authentication_error"


async def test_body_too_large_is_413(served: Served) -> None:
    huge: Any = [{"role": "user", "content": "x" * 100_000}]
    with pytest.raises(openai.APIStatusError) as caught:
        await served.oa.chat.completions.create(model="tiny-test", messages=huge)
    assert caught.value.status_code == 413
    assert (await served.http.get("/health")).status_code == 200


async def test_max_tokens_over_the_limit_is_400(tiny: TinyModel, anyio_backend: str) -> None:
    async with serve(tiny.engine(), max_tokens_limit=8) as running:
        for key in ("max_tokens", "max_completion_tokens"):
            with pytest.raises(openai.BadRequestError) as caught:
                limit: dict[str, Any] = {key: 9}
                await running.oa.chat.completions.create(model="tiny-test", messages=HI, **limit)
            assert caught.value.code == "max_tokens_too_large" and caught.value.param == key
        ok = await running.oa.chat.completions.create(model="tiny-test", messages=HI, max_tokens=8)
        assert ok.choices[0].finish_reason in ("stop", "length")


_HI = b'{"model": "tiny-test", "messages": [{"role": "user", "content": "hi"}], '


@pytest.mark.parametrize(
    ("body", "code", "fragment", "param"),
    [
        (b"{not json", "invalid_json", "not valid JSON", None),
        (b"[1, 2]", "invalid_request", "JSON object", None),
        (b"{}", "invalid_request", "model", "model"),
        (b'{"model": "tiny-test", "messages": "hi"}', "invalid_request", "messages", "messages"),
        (b'{"model": "tiny-test", "messages": []}', "invalid_request", "at least one", "messages"),
        (
            b'{"model": "tiny-test", "messages": [{"role": "robot"}]}',
            "invalid_request",
            "role",
            "messages.0.role",
        ),
        (
            b'{"model": "tiny-test", "messages": [{"role": "user"}]}',
            "invalid_request",
            "needs content",
            "messages.0",
        ),
        (_HI + b'"n": 17}', "invalid_request", "n=17", "n"),  # over the engine's limit
        (_HI + b'"top_k": "x"}', "invalid_request", "top_k", "top_k"),
        (_HI + b'"min_p": 3}', "invalid_request", "min_p", "min_p"),
        (_HI + b'"cache_salt": ""}', "invalid_request", "cache_salt", "cache_salt"),
        (_HI + b'"logit_bias": {"1": 2}}', "invalid_request", "logit_bias", "logit_bias"),
        (_HI + b'"temperature": 9}', "invalid_request", "temperature", "temperature"),
    ],
)
async def test_invalid_requests_are_400_and_the_server_keeps_serving(
    served: Served, body: bytes, code: str, fragment: str, param: str | None
) -> None:
    response = await served.http.post(
        "/v1/chat/completions", content=body, headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == code
    assert fragment in error["message"]
    assert error.get("param") == param  # OpenAI's error objects name the offending field


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"tool_choice": "required"}, "tool_choice='required' needs tools"),
        (
            {"tool_choice": {"type": "function", "function": {"name": "f"}}},
            "names the tool 'f', but no tools are given",
        ),
        (
            {
                "tool_choice": {"type": "function", "function": {"name": "g"}},
                "tools": [{"type": "function", "function": {"name": "f"}}],
            },
            "names the tool 'g', which is not in tools ('f')",
        ),
    ],
)
async def test_a_tool_choice_without_its_tool_is_400_as_on_openai(
    served: Served, fields: dict[str, Any], fragment: str
) -> None:
    for stream in (False, True):
        body = {"model": "tiny-test", "messages": HI, "stream": stream, **fields}
        response = await served.http.post("/v1/chat/completions", json=body)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["code"] == "invalid_request" and error["param"] == "tool_choice"
        assert fragment in error["message"]
        assert "Value error" not in error["message"]  # the validator's words, not pydantic's
    await served.settle()
    assert (await served.http.get("/health")).status_code == 200


async def test_another_wires_tool_choice_is_400_naming_this_wires_form(served: Served) -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    for choice, fragment in (
        ({"type": "tool", "name": "f"}, "is the Anthropic Messages form"),
        ({"type": "function", "name": "f"}, "is the OpenAI Responses form"),
        ({"type": "any"}, "pass the string 'required'"),
    ):
        body = {"model": "tiny-test", "messages": HI, "tools": tools, "tool_choice": choice}
        response = await served.http.post("/v1/chat/completions", json=body)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == "tool_choice" and fragment in error["message"]
    await served.settle()
    assert (await served.http.get("/health")).status_code == 200


async def test_prompt_longer_than_the_context_is_400(served: Served) -> None:
    long: Any = [{"role": "user", "content": "word " * 6000}]
    with pytest.raises(openai.BadRequestError, match="max_model_len"):
        await served.oa.chat.completions.create(model="tiny-test", messages=long, max_tokens=2)


async def test_unknown_routes_and_methods(served: Served) -> None:
    assert (await served.http.get("/nowhere")).status_code == 404
    response = await served.http.get("/v1/chat/completions")
    assert response.status_code == 405 and response.headers["allow"] == "POST"


async def test_health_and_models(served: Served) -> None:
    async with httpx.AsyncClient() as bare:  # no key needed
        health = await bare.get(served.server.base_url.removesuffix("/v1") + "/health")
        head = await bare.head(served.server.base_url.removesuffix("/v1") + "/health")
    assert health.status_code == 200 and health.json() == {"status": "ok"}
    assert head.status_code == 200 and head.content == b""  # load balancers probe with HEAD
    models = await served.oa.models.list()
    assert [m.id for m in models.data] == ["tiny-test", "default"]
    assert models.data[0].object == "model"
    # The alias names its root: a client that wants one name per model can tell (the CLI's
    # chat without --model, the demo against `swiftclient serve`).
    backend = HTTPBackend(served.server.base_url, api_key=KEY)
    try:
        assert await backend.list_models() == ["tiny-test", "default"]
        assert await backend.list_models(aliases=False) == ["tiny-test"]
    finally:
        await backend.aclose()


@asynccontextmanager
async def one_running_one_waiting(running: Any) -> AsyncIterator[None]:
    """Two long streams on a server of one sequence: the first runs, the second waits."""
    create: Any = running.oa.chat.completions.create
    first = await create(model="tiny-test", messages=HI, stream=True, **LONG)
    async for chunk in first:  # the first request runs...
        if chunk.choices and chunk.choices[0].delta.content:
            break
    second = await create(model="tiny-test", messages=HI, stream=True, **LONG)  # ...one waits
    yield
    await second.close()
    await first.close()
    await running.settle()


async def test_overload_is_503_with_retry_after(tiny: TinyModel, anyio_backend: str) -> None:
    engine = tiny.engine(max_num_seqs=1, max_waiting=1)
    async with serve(engine) as running, one_running_one_waiting(running):
        with pytest.raises(openai.InternalServerError) as caught:
            await running.oa.chat.completions.create(model="tiny-test", messages=HI, **LONG)
        assert caught.value.status_code == 503
        assert caught.value.response.headers["retry-after"] == "1"
        assert caught.value.code == "server_overloaded"


async def test_more_choices_than_ever_wait_is_400_not_503(
    tiny: TinyModel, anyio_backend: str
) -> None:
    """n above max_waiting was a 503 "2 requests are already waiting" on an idle server,
    which a retrying client sends again forever."""
    engine = tiny.engine(max_num_seqs=1, max_waiting=2)
    async with serve(engine) as running:
        create: Any = running.oa.chat.completions.create
        with pytest.raises(openai.BadRequestError, match="max_waiting=2"):
            await create(model="tiny-test", messages=HI, n=3, max_tokens=2)
        reply = await create(model="tiny-test", messages=HI, n=2, max_tokens=2)
        assert len(reply.choices) == 2
        body = {"model": "tiny-test", "prompt": ["a", "b", "c"], "max_tokens": 2}
        refused = await running.http.post("/v1/completions", json=body)
        assert refused.status_code == 400 and "max_waiting=2" in refused.text
        assert refused.json()["error"]["param"] == "prompt"


async def test_a_batch_of_prompts_the_queue_cannot_take_is_503_as_one_prompt_is(
    tiny: TinyModel, anyio_backend: str
) -> None:
    """Several prompts on /v1/completions run side by side; when one was refused for a full
    queue the task group's ExceptionGroup got past the handler: a 500 "internal_error",
    no Retry-After, where one prompt gets 503."""
    engine = tiny.engine(max_num_seqs=1, max_waiting=2)
    async with serve(engine) as running:
        async with one_running_one_waiting(running):
            body = {"model": "tiny-test", "prompt": ["a", "b"], "max_tokens": 2}
            refused = await running.http.post("/v1/completions", json=body)
            assert refused.status_code == 503, refused.text
            assert refused.headers["retry-after"] == "1"
            assert refused.json()["error"]["code"] == "server_overloaded"
        assert engine.num_free_blocks() == engine.num_blocks  # the batch's first was aborted


async def test_client_disconnect_mid_stream_aborts_the_request(served: Served) -> None:
    stream = await served.oa.chat.completions.create(
        model="tiny-test", messages=HI, stream=True, **LONG
    )
    seen = 0
    async for chunk in stream:
        seen += bool(chunk.choices and chunk.choices[0].delta.content)
        if seen == 2:
            break
    assert served.engine.has_unfinished()
    await stream.close()
    steps = served.steps
    await served.settle()
    assert served.steps - steps < 500  # aborted: finishing would take ~1000 more steps


# ---------------------------------------------------------------------- command line


@pytest.fixture
def server_process(tiny: TinyModel) -> Iterator[subprocess.Popen[str]]:
    env = {**os.environ, "SWIFTCLIENT_CACHE_DIR": str(tiny.cache_root)}
    argv = [sys.executable, "-m", "local_engine.server", "", "--port", "0", "--api-key", KEY]
    process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=LIMIT)
        assert process.stdout is not None
        process.stdout.close()


def test_main_serves_the_default_model_until_interrupted(
    server_process: subprocess.Popen[str],
) -> None:
    assert server_process.stdout is not None
    line = server_process.stdout.readline()
    assert line.startswith("serving swift-tiny at http://127.0.0.1:"), line
    base_url = line.split(" at ")[1].strip()
    headers = {"authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=base_url, headers=headers, timeout=LIMIT) as http:
        assert http.get("/models").json()["data"][0]["id"] == "swift-tiny"
        body = {"model": "swift-tiny", "messages": HI, "max_tokens": 2}
        assert http.post("/chat/completions", json=body).status_code == 200
    server_process.send_signal(signal.SIGINT)
    assert server_process.wait(timeout=LIMIT) == 0


# ---------------------------------------------------------------------- hardening (issue 7)


async def test_unknown_model_is_404_and_default_is_an_alias(served: Served) -> None:
    for stream in (False, True):
        body = {"model": "no-such-model", "messages": HI, "max_tokens": 2, "stream": stream}
        response = await served.http.post("/v1/chat/completions", json=body)
        assert response.status_code == 404
        error = response.json()["error"]
        assert error["code"] == "model_not_found" and error["param"] == "model"
        assert error["type"] == "invalid_request_error"
        assert "no-such-model" in error["message"] and "tiny-test" in error["message"]
    with pytest.raises(openai.NotFoundError):
        await served.oa.chat.completions.create(model="no-such-model", messages=HI)
    alias = await served.oa.chat.completions.create(model="default", messages=HI, max_tokens=2)
    assert alias.choices[0].message.role == "assistant"
    assert [m.id for m in (await served.oa.models.list()).data] == ["tiny-test", "default"]
    assert served.server.served_model_names == ("tiny-test", "default")


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b'{"model": "tiny-test", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "JSON"),
        (
            b'{"model": "tiny-test", "messages": [{"role": "user", "content": "a\\ud800b"}]}',
            "Unicode",
        ),
        (
            b'{"model": "tiny-test", "messages": [{"role": "user", "content": "hi"}],'
            b' "tools": [{"type": "function", "function": {"name": "f", "parameters":'
            b' {"x": "\\udfff"}}}]}',
            "Unicode",
        ),
    ],
    ids=["deeply-nested", "lone-surrogate", "surrogate-in-tools"],
)
async def test_nesting_and_lone_surrogates_are_400_not_500(
    tiny: TinyModel, anyio_backend: str, body: bytes, fragment: str
) -> None:
    async with serve(tiny.engine(), max_body_bytes=1 << 20) as running:
        for stream in (b"false", b"true"):
            sent = body[:-1] + b', "stream": ' + stream + b"}" if fragment != "JSON" else body
            response = await running.http.post(
                "/v1/chat/completions", content=sent, headers={"content-type": "application/json"}
            )
            assert response.status_code == 400, response.text
            error = response.json()["error"]
            assert error["type"] == "invalid_request_error" and fragment in error["message"]
        assert (await running.http.get("/health")).status_code == 200
        await running.settle()


@pytest.mark.parametrize("words", [2, 40], ids=["running", "waiting"])
async def test_a_lone_surrogate_in_the_cache_salt_is_served(
    tiny: TinyModel, anyio_backend: str, words: int
) -> None:
    """The salt (``user``, ``cache_salt``, Messages' ``metadata.user_id``) is hashed into the
    prefix cache's keys: a lone surrogate in it raised inside the engine's step, which failed
    the engine for good (every later request a 500, /health still ok) or, for a request still
    waiting, ended the process."""
    prompt = " ".join(["word"] * words)
    async with serve(tiny.engine()) as running:
        bodies: list[tuple[str, dict[str, Any]]] = [
            ("/v1/chat/completions", {"user": "\ud800"}),
            ("/v1/chat/completions", {"cache_salt": "a\udfff"}),
            ("/v1/completions", {"prompt": prompt, "user": "\udc80"}),
            ("/v1/messages", {"metadata": {"user_id": "\ud800"}}),
        ]
        for path, extra in bodies:
            body = {"model": "tiny-test", "max_tokens": 20, **extra}
            if "prompt" not in body:
                body["messages"] = [{"role": "user", "content": prompt}]
            sent = json.dumps(body).encode()  # ASCII: the surrogate as a \\u escape
            headers = {"content-type": "application/json"}
            response = await running.http.post(path, content=sent, headers=headers)
            assert response.status_code == 200, (path, response.text)
        assert (await running.http.get("/health")).json() == {"status": "ok"}
        await running.settle()


async def test_health_says_failed_once_the_engine_failed(
    tiny: TinyModel, anyio_backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failed engine answers every request 500: /health says so (it said ok)."""
    engine = tiny.engine()
    async with serve(engine) as running:

        def broken() -> Any:
            raise RuntimeError("a kernel fault")

        monkeypatch.setattr(engine, "step", broken)
        monkeypatch.setattr(engine, "overlap_output", False)
        response = await running.http.post(
            "/v1/chat/completions", json={"model": "tiny-test", "messages": HI, "max_tokens": 4}
        )
        assert response.status_code == 500
        health = await running.http.get("/health")
        assert (health.status_code, health.json()) == (503, {"status": "failed"})


async def test_health_answers_while_a_huge_prompt_is_being_tokenized(
    tiny: TinyModel, anyio_backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tokenizing runs off the event loop: with the tokenizer stuck on a long prompt, the
    same server still answers /health (before the fix, the loop itself was stuck)."""
    engine = tiny.engine()
    tokenizer = engine.tokenizer
    assert tokenizer is not None
    original = tokenizer.encode
    entered = threading.Event()
    release = threading.Event()

    def slow_encode(text: str, *, add_special_tokens: bool = False) -> list[int]:
        if len(text) > 10_000:
            entered.set()
            release.wait(LIMIT)
        return original(text, add_special_tokens=add_special_tokens)

    monkeypatch.setattr(tokenizer, "encode", slow_encode)
    async with serve(engine, max_body_bytes=1 << 20) as running:
        huge = {"model": "tiny-test", "messages": [{"role": "user", "content": "x " * 20_000}]}
        statuses: list[int] = []

        async def post_huge() -> None:
            response = await running.http.post("/v1/chat/completions", json=huge, timeout=LIMIT)
            statuses.append(response.status_code)

        try:
            async with anyio.create_task_group() as task_group:
                task_group.start_soon(post_huge)
                assert await anyio.to_thread.run_sync(entered.wait, LIMIT)
                with anyio.fail_after(LIMIT):
                    health = await running.http.get("/health")
                assert health.status_code == 200
                release.set()
        finally:
            release.set()
        assert statuses and statuses[0] in (200, 400)
        await running.settle()


async def test_a_prompt_too_long_by_size_is_refused_before_tokenizing(
    tiny: TinyModel, anyio_backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = tiny.engine(max_model_len=256)
    tokenizer = engine.tokenizer
    assert tokenizer is not None
    original = tokenizer.encode
    encoded: list[int] = []

    def spy(text: str, *, add_special_tokens: bool = False) -> list[int]:
        encoded.append(len(text))
        return original(text, add_special_tokens=add_special_tokens)

    monkeypatch.setattr(tokenizer, "encode", spy)
    limit = 256 * tokenizer.max_token_bytes
    async with serve(engine, max_body_bytes=4 << 20) as running:
        for content in ("word " * (limit // 5 + 10), "é" * (limit // 2 + 10)):
            body = {"model": "tiny-test", "messages": [{"role": "user", "content": content}]}
            response = await running.http.post("/v1/chat/completions", json=body)
            assert response.status_code == 400
            assert "max_model_len" in response.json()["error"]["message"]
        assert all(size < limit for size in encoded)  # never tokenized
        # Just under the size bound it is tokenized, and refused by its token count.
        body = {"model": "tiny-test", "messages": [{"role": "user", "content": "word " * 400}]}
        response = await running.http.post("/v1/chat/completions", json=body)
        assert response.status_code == 400 and "max_model_len" in response.text
        assert encoded


async def test_bearer_scheme_is_case_insensitive(served: Served) -> None:
    for header in (f"bearer {KEY}", f"BEARER {KEY}", f"Bearer  {KEY}"):
        response = await served.http.get("/v1/models", headers={"authorization": header})
        assert response.status_code == 200, header
    assert (await served.http.get("/v1/models", headers={"authorization": KEY})).status_code == 401


def test_command_line_exposes_the_uvicorn_knobs() -> None:
    from local_engine.server import _build, command

    ctx = command.make_context(
        "serve",
        ["--port", "0", "--limit-concurrency", "8", "--timeout-keep-alive", "2.5"]
        + ["--timeout-request-head", "3", "--root-path", "/api", "--loop", "asyncio"]
        + ["--timeout-write", "7"],
    )
    server = _build(argparse.Namespace(**ctx.params))
    assert server.app.write_timeout == 7
    settings = server.settings
    assert settings.limit_concurrency == 8 and settings.keepalive_timeout == 2.5
    assert settings.head_timeout == 3 and settings.root_path == "/api"
    assert settings.loop == "asyncio"


def test_swiftclient_serve_takes_the_same_options(capsys: pytest.CaptureFixture[str]) -> None:
    from swiftclient.cli import main as cli_main

    assert cli_main(["serve", "--help"]) == 0
    usage = capsys.readouterr().out
    assert usage.startswith("Usage: swiftclient serve [OPTIONS] [MODEL_DIR]")
    assert "local_engine" not in usage
    for flag in ("--limit-concurrency", "--timeout-keep-alive", "--root-path", "--api-key"):
        assert flag in usage


def test_the_step_budget_reaches_the_engine() -> None:
    import argparse

    from local_engine.server import _engine_config, command

    def parse(*argv: str) -> argparse.Namespace:
        return argparse.Namespace(**command.make_context("serve", list(argv)).params)

    assert _engine_config(parse()).max_num_batched_tokens == 2048
    config = _engine_config(parse("--max-num-batched-tokens", "32768"))
    assert config.max_num_batched_tokens == 32768


def test_the_malloc_setting_reaches_the_engine() -> None:
    import argparse

    from local_engine.server import _engine_config, command

    def parse(*argv: str) -> argparse.Namespace:
        return argparse.Namespace(**command.make_context("serve", list(argv)).params)

    assert _engine_config(parse()).tune_malloc is None
    assert _engine_config(parse("--tune-malloc")).tune_malloc is True
    assert _engine_config(parse("--no-tune-malloc")).tune_malloc is False
