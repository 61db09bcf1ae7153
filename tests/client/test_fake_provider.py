"""The scripted fake OpenAI-compatible provider, driven over real sockets."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import anyio
import httpx
import pytest

from swiftclient.testing import FakeProvider, Reply, ReplyUsage
from swiftclient.types import ChatCompletion, ChatCompletionChunk

pytestmark = pytest.mark.anyio

MESSAGES = [{"role": "user", "content": "say something nice"}]


def chat_body(stream: bool = False, **extra: Any) -> dict[str, Any]:
    return {"model": "m1", "messages": MESSAGES, "stream": stream, **extra}


def data_lines(raw: bytes) -> list[str]:
    """The ``data:`` payloads of an SSE body, in order (comments skipped)."""
    payloads = []
    for block in raw.decode().split("\n\n"):
        data = [line[5:].lstrip() for line in block.split("\n") if line.startswith("data:")]
        if data:
            payloads.append("\n".join(data))
    return payloads


async def stream_raw(client: httpx.AsyncClient, **extra: Any) -> bytes:
    response = await client.post("/chat/completions", json=chat_body(True, **extra))
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/event-stream"
    return response.content


def chunks_of(raw: bytes) -> list[ChatCompletionChunk]:
    payloads = data_lines(raw)
    assert payloads[-1] == "[DONE]"
    return [ChatCompletionChunk.model_validate_json(p) for p in payloads[:-1]]


async def test_stream_follows_the_openai_chunk_format() -> None:
    async with FakeProvider(Reply(tokens=4)) as fake:
        async with httpx.AsyncClient(base_url=fake.base_url) as client:
            raw = await stream_raw(client, stream_options={"include_usage": True})
            plain = await stream_raw(client)
    chunks = chunks_of(raw)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert not chunks[0].has_content()
    assert "".join(c.text for c in chunks) == "tok0 tok1 tok2 tok3"
    assert [c.text for c in chunks[1:5]] == ["tok0", " tok1", " tok2", " tok3"]
    assert chunks[5].choices[0].finish_reason == "stop"
    assert all(c.choices[0].finish_reason is None for c in chunks[:5])
    usage_chunk = chunks[6]
    assert usage_chunk.choices == [] and usage_chunk.usage is not None
    assert usage_chunk.usage.completion_tokens == 4
    assert usage_chunk.usage.prompt_tokens == 3
    assert usage_chunk.usage.total_tokens == 7
    assert all(c.object == "chat.completion.chunk" and c.model == "m1" for c in chunks)
    assert len({c.id for c in chunks}) == 1
    plain_chunks = chunks_of(plain)
    assert len(plain_chunks) == 6 and all(c.usage is None for c in plain_chunks)
    assert b'"usage"' not in plain


async def test_non_stream_body_is_a_chat_completion() -> None:
    async with FakeProvider() as fake, httpx.AsyncClient(base_url=fake.base_url) as client:
        response = await client.post("/chat/completions", json=chat_body())
    assert response.status_code == 200
    assert response.headers["x-request-id"]
    completion = ChatCompletion.model_validate_json(response.content)
    assert completion.object == "chat.completion"
    assert completion.text == "tok0 tok1 tok2 tok3 tok4"
    assert completion.finish_reason == "stop"
    assert completion.usage is not None and completion.usage.completion_tokens == 5


async def test_text_chunk_size_and_max_tokens() -> None:
    async with FakeProvider() as fake, httpx.AsyncClient(base_url=fake.base_url) as client:
        fake.script(Reply(text="one two three four five", chunk_size=2), Reply(tokens=10))
        chunks = chunks_of(await stream_raw(client))
        truncated = await client.post("/chat/completions", json=chat_body(max_tokens=3))
    assert [c.text for c in chunks if c.text] == ["one two", " three four", " five"]
    completion = ChatCompletion.model_validate_json(truncated.content)
    assert completion.text == "tok0 tok1 tok2"
    assert completion.finish_reason == "length"


async def test_status_errors_carry_retry_headers_and_an_openai_error_body() -> None:
    reply = Reply(
        status=429,
        retry_after=2,
        retry_after_ms=1500,
        headers={"x-should-retry": "true", "x-request-id": "req_custom"},
        error_message="Slow down.",
    )
    async with FakeProvider() as fake, httpx.AsyncClient(base_url=fake.base_url) as client:
        fake.script(reply, Reply(status=503))
        limited = await client.post("/chat/completions", json=chat_body(True))
        unavailable = await client.post("/chat/completions", json=chat_body())
        recovered = await client.post("/chat/completions", json=chat_body())
    assert limited.status_code == 429
    assert limited.headers["retry-after"] == "2"
    assert limited.headers["retry-after-ms"] == "1500"
    assert limited.headers["x-should-retry"] == "true"
    assert limited.headers["x-request-id"] == "req_custom"
    assert limited.json()["error"] == {
        "message": "Slow down.",
        "type": "rate_limit_error",
        "code": "rate_limit_exceeded",
    }
    assert unavailable.status_code == 503
    assert unavailable.json()["error"]["type"] == "server_error"
    assert recovered.status_code == 200


async def test_several_choices_are_refused_not_answered_with_one() -> None:
    async with FakeProvider() as fake, httpx.AsyncClient(base_url=fake.base_url) as client:
        fake.script(Reply(text="kept for the next request"))
        refused = await client.post("/chat/completions", json=chat_body(n=2))
        one = await client.post("/chat/completions", json=chat_body(n=1))
        unset = await client.post("/chat/completions", json=chat_body(n=None))
    assert unset.status_code == 200
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "n"
    assert "one choice per request" in refused.json()["error"]["message"]
    assert one.json()["choices"][0]["message"]["content"] == "kept for the next request"


async def test_drop_after_breaks_the_stream_after_n_chunks() -> None:
    async with FakeProvider() as fake, httpx.AsyncClient(base_url=fake.base_url) as client:
        fake.script(Reply(tokens=5, drop_after=2), Reply(drop_after=0))
        received = bytearray()
        with pytest.raises(httpx.RemoteProtocolError):
            async with client.stream("POST", "/chat/completions", json=chat_body(True)) as response:
                assert response.status_code == 200
                async for data in response.aiter_raw():
                    received += data
        with pytest.raises(httpx.RemoteProtocolError):
            await client.post("/chat/completions", json=chat_body())
    texts = [ChatCompletionChunk.model_validate_json(p).text for p in data_lines(bytes(received))]
    assert texts == ["", "tok0", " tok1"]


async def test_stall_sends_keepalive_comments_until_the_client_leaves() -> None:
    reply = Reply(tokens=5, stall_after=1, keepalive_comments=0.01)
    async with FakeProvider(reply) as fake, httpx.AsyncClient(base_url=fake.base_url) as client:
        received = bytearray()
        with anyio.fail_after(10):
            async with client.stream("POST", "/chat/completions", json=chat_body(True)) as response:
                with anyio.CancelScope() as enough:  # cancel, not break: httpx's generators close
                    async for data in response.aiter_raw():
                        received += data
                        if received.count(b": keep-alive\n\n") >= 3:
                            enough.cancel()
            await fake.wait_until_idle()
        assert fake.cancelled == 1
    texts = [ChatCompletionChunk.model_validate_json(p).text for p in data_lines(bytes(received))]
    assert texts == ["", "tok0"]


async def test_stall_without_comments_sends_nothing_more() -> None:
    async with FakeProvider(Reply(stall_after=0, ttft=0)) as fake:
        async with httpx.AsyncClient(base_url=fake.base_url) as client:
            async with client.stream("POST", "/chat/completions", json=chat_body(True)) as response:
                assert response.status_code == 200
                with anyio.move_on_after(0.2) as waited:
                    async for _ in response.aiter_raw():
                        pytest.fail("a stalled stream sent data")
                assert waited.cancelled_caught
            with anyio.fail_after(10):
                await fake.wait_until_idle()
        assert fake.cancelled == 1


async def test_a_wait_given_up_does_not_keep_the_fake_from_stopping() -> None:
    """A wait for requests that never come, cut by a timeout, ends on the fake's loop too:
    the fake then stops (it used to wait for the abandoned wait forever)."""
    fake = FakeProvider()
    with anyio.fail_after(30):  # bounds the hang this test is about; not a speed assertion
        async with fake:
            with anyio.move_on_after(0.2) as waited:
                await fake.wait_until_idle(after=1)
            assert waited.cancelled_caught


async def test_ttft_delays_the_first_chunk_not_the_headers() -> None:
    async with FakeProvider(Reply(ttft=60)) as fake:
        async with httpx.AsyncClient(base_url=fake.base_url) as client:
            async with client.stream("POST", "/chat/completions", json=chat_body(True)) as response:
                assert response.status_code == 200
                with anyio.move_on_after(0.2) as waited:
                    async for _ in response.aiter_raw():
                        pytest.fail("data arrived before ttft")
                assert waited.cancelled_caught
            with anyio.fail_after(10):
                await fake.wait_until_idle()


async def test_malformed_after_sends_a_broken_data_line() -> None:
    async with FakeProvider() as fake, httpx.AsyncClient(base_url=fake.base_url) as client:
        fake.script(Reply(tokens=3, malformed_after=1), Reply(malformed_after=0))
        payloads = data_lines(await stream_raw(client))
        whole = await client.post("/chat/completions", json=chat_body())
    assert ChatCompletionChunk.model_validate_json(payloads[1]).text == "tok0"
    with pytest.raises(ValueError):
        json.loads(payloads[2])
    assert payloads[-1] == "[DONE]"
    assert whole.status_code == 200
    with pytest.raises(ValueError):
        whole.json()


async def test_error_event_after_ends_the_stream_with_an_error() -> None:
    async with FakeProvider() as fake, httpx.AsyncClient(base_url=fake.base_url) as client:
        fake.script(Reply(tokens=5, error_event_after=2, error_message="overloaded"))
        payloads = data_lines(await stream_raw(client))
    assert [ChatCompletionChunk.model_validate_json(p).text for p in payloads[:3]] == [
        "",
        "tok0",
        " tok1",
    ]
    assert json.loads(payloads[3])["error"]["message"] == "overloaded"
    assert len(payloads) == 4  # no finish chunk, no [DONE]


async def test_tool_calls_stream_as_deltas_with_split_arguments() -> None:
    calls = [("get_weather", {"city": "Paris", "unit": "celsius"}), ("noop", {})]
    async with FakeProvider(Reply(tool_calls=calls)) as fake:
        async with httpx.AsyncClient(base_url=fake.base_url) as client:
            chunks = chunks_of(await stream_raw(client))
            whole = await client.post("/chat/completions", json=chat_body())
    assert chunks[0].choices[0].delta.content is None
    names: dict[int, str] = {}
    arguments: dict[int, list[str]] = {}
    ids: dict[int, str] = {}
    for chunk in chunks:
        for delta in chunk.choices[0].delta.tool_calls or []:
            assert delta.function is not None
            if delta.id is not None:
                ids[delta.index] = delta.id
                names[delta.index] = delta.function.name or ""
            arguments.setdefault(delta.index, []).append(delta.function.arguments or "")
    assert names == {0: "get_weather", 1: "noop"}
    assert len(set(ids.values())) == 2
    assert len([a for a in arguments[0] if a]) > 1  # split over several chunks
    assert json.loads("".join(arguments[0])) == calls[0][1]
    assert json.loads("".join(arguments[1])) == {}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    completion = ChatCompletion.model_validate_json(whole.content)
    assert completion.text == "" and completion.finish_reason == "tool_calls"
    assert [(c.function.name, json.loads(c.function.arguments)) for c in completion.tool_calls] == [
        (name, args) for name, args in calls
    ]


async def test_json_object_content_and_usage_override() -> None:
    payload = {"answer": 42, "items": ["a", "b"]}
    reply = Reply(json_object=payload, usage=ReplyUsage(prompt_tokens=100, cached_tokens=64))
    async with FakeProvider(reply) as fake, httpx.AsyncClient(base_url=fake.base_url) as client:
        chunks = chunks_of(await stream_raw(client, stream_options={"include_usage": True}))
        whole = ChatCompletion.model_validate_json(
            (await client.post("/chat/completions", json=chat_body())).content
        )
    assert json.loads("".join(c.text for c in chunks)) == payload
    assert json.loads(whole.text) == payload
    usage = chunks[-1].usage
    assert usage is not None and usage.prompt_tokens == 100 and usage.cached_tokens == 64
    assert whole.usage is not None and whole.usage.cached_tokens == 64


async def test_requests_are_recorded_and_the_script_consumed_in_order() -> None:
    async with FakeProvider(Reply(text="default")) as fake:
        fake.script(Reply(text="first"), Reply(text="second"))
        assert fake.pending == 2
        async with httpx.AsyncClient(base_url=fake.base_url) as client:
            texts = []
            for i in range(3):
                body = {"model": f"m{i}", "messages": MESSAGES}
                response = await client.post(
                    "/chat/completions", json=body, headers={"x-trace": str(i)}
                )
                texts.append(ChatCompletion.model_validate_json(response.content).text)
            await client.get("/models")
        assert fake.pending == 0
        assert fake.connections_opened == 1
    assert texts == ["first", "second", "default"]
    assert [r.path for r in fake.requests] == ["/v1/chat/completions"] * 3 + ["/v1/models"]
    assert [r.body["model"] for r in fake.requests[:3]] == ["m0", "m1", "m2"]
    assert [r.headers["x-trace"] for r in fake.requests[:3]] == ["0", "1", "2"]
    assert fake.requests[3].method == "GET" and fake.requests[3].body is None


async def test_api_key_is_required_when_set() -> None:
    async with FakeProvider(api_key="sk-test-secret-123456") as fake:
        async with httpx.AsyncClient(base_url=fake.base_url) as client:
            missing = await client.post("/chat/completions", json=chat_body())
            wrong = await client.get("/models", headers={"authorization": "Bearer nope"})
            right = await client.post(
                "/chat/completions",
                json=chat_body(),
                headers={"authorization": "Bearer sk-test-secret-123456"},
            )
    assert missing.status_code == wrong.status_code == 401
    assert missing.json()["error"]["code"] == "invalid_api_key"
    assert "sk-test" not in missing.text
    assert missing.headers["x-request-id"]
    assert right.status_code == 200
    assert "sk-test" not in repr(fake) + repr(fake.requests)


async def test_models_and_unknown_routes() -> None:
    async with FakeProvider(model="tiny") as fake:
        async with httpx.AsyncClient(base_url=fake.base_url) as client:
            models = await client.get("/models")
            unknown = await client.get("/nope")
            wrong_method = await client.get("/chat/completions")
            not_chat = await client.post("/chat/completions", json={"model": "x"})
    assert [m["id"] for m in models.json()["data"]] == ["tiny"]
    assert unknown.status_code == 404 and unknown.json()["error"]["message"]
    assert wrong_method.status_code == 405
    assert not_chat.status_code == 400
    assert fake.pending == 0 and len(fake.requests) == 4


def test_reply_rejects_conflicting_settings() -> None:
    with pytest.raises(ValueError):
        Reply(text="a", tokens=3)
    with pytest.raises(ValueError):
        Reply(keepalive_comments=1.0)
    with pytest.raises(ValueError):
        Reply(token_delay=-1)
    with pytest.raises(ValueError):
        Reply(status=99)
    with pytest.raises(TypeError):
        FakeProvider().script("not a reply")  # type: ignore[arg-type]


def test_run_in_thread_for_sync_code() -> None:
    with FakeProvider(Reply(text="from a thread")).run_in_thread() as fake:
        with httpx.Client(base_url=fake.base_url) as client:
            response = client.post("/chat/completions", json=chat_body())
    assert ChatCompletion.model_validate_json(response.content).text == "from a thread"
    assert len(fake.requests) == 1


def test_command_line_serves_until_killed() -> None:
    command = [sys.executable, "-m", "swiftclient.testing", "--port", "0", "--tokens", "3"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as process:
        try:
            assert process.stdout is not None
            url = process.stdout.readline().rsplit(" ", 1)[-1].strip()
            assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
            with httpx.Client(base_url=url, timeout=30) as client:
                response = client.post("/chat/completions", json=chat_body())
            assert ChatCompletion.model_validate_json(response.content).text == "tok0 tok1 tok2"
        finally:
            process.terminate()
            process.wait(timeout=30)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_official_openai_client_streams_from_the_fake(anyio_backend: str) -> None:
    openai = pytest.importorskip("openai")
    reply = Reply(text="Hello from the fake provider", chunk_size=2)
    async with FakeProvider(reply) as fake:
        client = openai.AsyncOpenAI(base_url=fake.base_url, api_key="test", max_retries=0)
        try:
            stream = await client.chat.completions.create(
                model="fake-model",
                messages=[{"role": "user", "content": "hi"}],
                stream=True,
                stream_options={"include_usage": True},
            )
            pieces = []
            usage = None
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    pieces.append(chunk.choices[0].delta.content)
                if chunk.usage is not None:
                    usage = chunk.usage
            whole = await client.chat.completions.create(
                model="fake-model", messages=[{"role": "user", "content": "hi"}]
            )
        finally:
            await client.close()
    assert "".join(pieces) == "Hello from the fake provider"
    assert usage is not None and usage.completion_tokens == 5
    assert whole.choices[0].message.content == "Hello from the fake provider"
    assert fake.requests[0].headers["authorization"] == "Bearer test"


async def test_the_fake_can_be_entered_again_after_it_stopped() -> None:
    fake = FakeProvider(Reply(tokens=2))
    for _ in range(2):
        async with fake, httpx.AsyncClient(base_url=fake.base_url) as client:
            raw = await stream_raw(client)
        assert "".join(c.text for c in chunks_of(raw)) == "tok0 tok1"
    assert len(fake.requests) == 2


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--tokens", "-5"], "argument --tokens: must be at least 0, got -5"),
        (["--chunk-size", "0"], "argument --chunk-size: must be at least 1, got 0"),
        (["--ttft", "nan"], "argument --ttft: must be a finite number, got nan"),
        (["--token-delay", "soon"], "argument --token-delay: not a number: 'soon'"),
    ],
)
def test_the_command_line_refuses_bad_numbers_by_flag(
    args: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from swiftclient.testing.__main__ import main

    # A usage error naming the flag (it was the reply model's validation dump).
    with pytest.raises(SystemExit) as exited:
        main(args)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert said in err and "pydantic" not in err
