"""``POST /v1/responses`` on the local server, driven by the official ``openai`` client's
``responses.create`` (plain, streamed, a function tool, ``text.format``) and by openai-agents
on its default model path (``OpenAIResponsesModel``).

The wire checks run on the tiny random-weight model (asyncio and trio); the tool round trips
run on ``swiftclient serve`` with the embedded default model, which is trained to call its
tools (one server process for the module's synchronous and agents tests).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pydantic
import pytest

from local_engine.server import IGNORED_FIELDS_HEADER
from swiftclient import AsyncClient, HTTPBackend, ResponsesBackend, RetryPolicy

from ..conformance.tiny_local import TinyModel, load_tiny_model
from .test_server import KEY as KEY_TINY
from .test_server import Served, serve

openai = pytest.importorskip("openai")

pytestmark = [
    pytest.mark.filterwarnings(
        "ignore:Exception ignored in. <async_generator object (AsyncStream|SSEDecoder)\\.:"
        "pytest.PytestUnraisableExceptionWarning"
    ),
]

KEY = "sk-responses-test-0123456789"
LIMIT = 60.0  # seconds; a bound on a hung server, not a speed assertion
WEATHER = "What's the weather in Paris?"
TOOL: Any = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather for a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}},
        "required": ["city"],
    },
}
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 8}},
    "required": ["city"],
}
GREEDY: dict[str, Any] = {"temperature": 0.0, "extra_body": {"ignore_eos": True}}


class City(pydantic.BaseModel):
    city: str = pydantic.Field(max_length=12)


# ---------------------------------------------------------------------- the tiny model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> TinyModel:
    return load_tiny_model(tmp_path_factory.mktemp("swiftclient-cache"))


@pytest.fixture
async def served(tiny: TinyModel, anyio_backend: str) -> AsyncIterator[Served]:
    async with serve(tiny.engine()) as running:
        yield running


@pytest.mark.anyio
async def test_plain_and_streamed_responses_parse_with_the_same_text_and_usage(
    served: Served,
) -> None:
    ask: Any = {"model": "tiny-test", "input": "Hi there", "max_output_tokens": 5, **GREEDY}
    plain = await served.oa.responses.create(**ask, instructions="Be brief.", store=True)
    assert plain.object == "response" and plain.id.startswith("resp_")
    assert plain.status == "incomplete"  # cut by max_output_tokens, as OpenAI says it
    assert plain.incomplete_details is not None
    assert plain.incomplete_details.reason == "max_output_tokens"
    assert plain.instructions == "Be brief." and plain.max_output_tokens == 5
    [message] = plain.output
    assert message.type == "message" and message.role == "assistant"
    assert message.content[0].type == "output_text" and plain.output_text
    assert plain.usage is not None and plain.usage.output_tokens == 5
    assert plain.usage.total_tokens == plain.usage.input_tokens + 5
    assert plain.usage.input_tokens_details.cached_tokens >= 0

    stream = await served.oa.responses.create(**ask, instructions="Be brief.", stream=True)
    events = [event async for event in stream]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) == len(kinds) - 8
    text = "".join(e.delta for e in deltas)
    assert text == plain.output_text  # greedy: the same reply
    item_id = events[2].item.id
    # no part yet: content_part.added brings it (a part in both made the openai SDK's running
    # snapshot hold two, the second empty)
    assert events[2].item.content == [] and events[3].part.text == ""
    assert all(e.item_id == item_id and e.output_index == 0 for e in deltas)
    final = events[-1].response
    assert final.output[0].id == item_id and final.output_text == text
    assert final.usage is not None and final.usage.output_tokens == 5
    await served.settle()


@pytest.mark.anyio
async def test_text_format_json_schema_constrains_the_reply(served: Served) -> None:
    shaped = await served.oa.responses.create(
        model="tiny-test",
        input="Which city?",
        max_output_tokens=60,
        text={"format": {"type": "json_schema", "name": "place", "schema": SCHEMA}},
    )
    assert shaped.status == "completed"
    assert list(json.loads(shaped.output_text)) == ["city"]
    assert shaped.text is not None and shaped.text.format is not None
    assert shaped.text.format.type == "json_schema"


@pytest.mark.anyio
async def test_requests_a_stateless_server_cannot_serve_are_400_with_their_param(
    served: Served,
) -> None:
    ask: Any = {"model": "tiny-test", "input": "Hi"}
    with pytest.raises(openai.BadRequestError, match="stateless") as caught:
        await served.oa.responses.create(**ask, previous_response_id="resp_123")
    assert caught.value.body["param"] == "previous_response_id"
    with pytest.raises(openai.BadRequestError, match="only function tools") as caught:
        await served.oa.responses.create(**ask, tools=[{"type": "web_search"}])
    assert caught.value.body["param"] == "tools[0].type"
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        await served.oa.responses.create(model="gpt-5", input="Hi")
    with pytest.raises(openai.BadRequestError, match="max_output_tokens=5000") as caught:
        await served.oa.responses.create(**ask, max_output_tokens=5000)
    assert caught.value.body["param"] == "max_output_tokens"
    # the engine's refusals name the Responses field, not its chat name (max_tokens)
    words = served.engine.max_model_len // 3  # about two tokens a word
    for size, output, param in ((words, 2000, "max_output_tokens"), (words * 2, 1, "input")):
        with pytest.raises(openai.BadRequestError, match="max_model_len") as caught:
            await served.oa.responses.create(
                model="tiny-test", input="word " * size, max_output_tokens=output
            )
        assert caught.value.body.get("param") == param, caught.value.body
    # the request's own validation names the Responses fields too, in param and message
    for extra, param in (
        ({"max_output_tokens": -3}, "max_output_tokens"),
        ({"input": []}, "input"),
        ({"text": {"format": {"type": "json_schema", "schema": {}}}}, "text.format.name"),
    ):
        bad = await served.http.post("/v1/responses", json={**ask, **extra})
        error = bad.json()["error"]
        assert bad.status_code == 400 and error["param"] == param, error
        for chat_name in ("max_completion_tokens", "max_tokens", "messages", "response_format"):
            assert chat_name not in error["message"], error
    raw = await served.http.post(
        "/v1/responses", json={**ask, "max_output_tokens": 1, "safety_identifier": "u1"}
    )
    assert raw.status_code == 200, raw.text
    assert raw.headers[IGNORED_FIELDS_HEADER] == "safety_identifier"
    bad = await served.http.post("/v1/responses", content=b"{not json")
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_json"
    await served.settle()


@pytest.mark.anyio
async def test_the_stream_is_named_events_without_a_done_marker(served: Served) -> None:
    body = {"model": "tiny-test", "input": "Hi", "max_output_tokens": 2, "stream": True}
    async with served.http.stream("POST", "/v1/responses", json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        raw = (await response.aread()).decode()
    blocks = [block for block in raw.split("\n\n") if block]
    assert "[DONE]" not in raw
    for block in blocks:
        name, data = block.split("\n")
        assert name.removeprefix("event: ") == json.loads(data.removeprefix("data: "))["type"]
    await served.settle()


JSON = {"content-type": "application/json"}


@pytest.mark.anyio
async def test_a_lone_surrogate_the_response_echoes_goes_back_escaped(served: Served) -> None:
    """Valid JSON (``"\\ud800"``) in a field the response object echoes was a 500, or a
    200 stream cut off before its first event: UTF-8 cannot carry it. It goes back
    escaped, as it came."""
    ask = {"model": "tiny-test", "input": "Hi", "max_output_tokens": 2}
    for extra in ({"user": "\ud800"}, {"metadata": {"k": "\ud800"}}, {"truncation": "\ud800"}):
        sent = json.dumps({**ask, **extra})  # escaped, as every JSON encoder sends it
        plain = await served.http.post("/v1/responses", content=sent, headers=JSON)
        assert plain.status_code == 200, (extra, plain.text)
        assert plain.json()["status"] in ("completed", "incomplete")
        sent = json.dumps({**ask, **extra, "stream": True})
        async with served.http.stream(
            "POST", "/v1/responses", content=sent, headers=JSON
        ) as response:
            assert response.status_code == 200
            raw = await response.aread()
        last = raw.decode().rstrip("\n").split("\n\n")[-1]
        terminal = ("event: response.completed", "event: response.incomplete")
        assert last.startswith(terminal), (extra, raw[-200:])
        assert b"\\ud800" in raw
    await served.settle()


@pytest.mark.anyio
async def test_the_responses_backend_gets_what_the_chat_backend_gets(served: Served) -> None:
    """swiftclient's own Responses wire against the server: the same greedy reply, finish
    reason and usage as over chat completions, plain and streamed."""
    url = served.server.base_url
    backends = {
        "chat": HTTPBackend(url, api_key=KEY_TINY, name="chat"),
        "resp": ResponsesBackend(url, api_key=KEY_TINY, name="resp"),
    }
    settings: Any = {
        "max_tokens": 6,
        "temperature": 0.0,
        "logprobs": True,
        "top_logprobs": 2,
        "extra_body": {"ignore_eos": True},
    }
    async with AsyncClient(backends=backends, retry=RetryPolicy.none()) as client:
        chat = await client.chat("Hi there", model="chat/tiny-test", **settings)
        resp = await client.chat("Hi there", model="resp/tiny-test", **settings)
        async with client.stream("Hi there", model="resp/tiny-test", **settings) as stream:
            streamed = await stream.final()
    for reply in (resp, streamed):
        assert reply.choices[0].message.content == chat.choices[0].message.content
        assert reply.choices[0].finish_reason == chat.choices[0].finish_reason == "length"
        assert reply.usage is not None and chat.usage is not None
        assert reply.usage.completion_tokens == chat.usage.completion_tokens == 6
        assert reply.usage.prompt_tokens == chat.usage.prompt_tokens
        assert reply.choices[0].logprobs == chat.choices[0].logprobs
        assert len((reply.choices[0].logprobs or {})["content"]) == 6
    assert resp.id.startswith("resp_")
    await served.settle()


# ---------------------------------------------------------------------- swiftclient serve


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    argv = [sys.executable, "-c", "from swiftclient.cli import main; raise SystemExit(main())"]
    argv += ["serve", "--port", "0", "--api-key", KEY, "--no-access-log"]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("serving swift-tiny at http://"), line
        yield line.split(" at ")[1].strip()
    finally:
        process.terminate()
        process.wait(timeout=LIMIT)
        assert process.stdout is not None
        process.stdout.close()


@pytest.fixture(scope="module")
def oa(base_url: str) -> Iterator[Any]:
    client = openai.OpenAI(base_url=base_url, api_key=KEY, max_retries=0, timeout=LIMIT)
    yield client
    client.close()


def test_a_function_tool_round_trip_plain_and_streamed(oa: Any) -> None:
    called = oa.responses.create(model="default", input=WEATHER, tools=[TOOL])
    assert called.status == "completed"
    [call] = [item for item in called.output if item.type == "function_call"]
    assert call.name == "get_weather" and call.call_id and call.id.startswith("fc_")
    assert "city" in json.loads(call.arguments)
    assert called.tools[0].name == "get_weather"

    stream = oa.responses.create(model="default", input=WEATHER, tools=[TOOL], stream=True)
    events = list(stream)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    added = [e for e in events if e.type == "response.output_item.added"]
    assert [e.item.type for e in added] == ["function_call"]
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    [done] = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert "".join(deltas) == done.arguments == call.arguments  # greedy: the same call
    assert events[-1].type == "response.completed"
    assert events[-1].response.output[0].arguments == call.arguments

    # the call and its output go back as input items; the model answers in text
    answer = oa.responses.create(
        model="default",
        input=[
            {"role": "user", "content": WEATHER},
            *[item.model_dump(exclude_none=True) for item in called.output],
            {"type": "function_call_output", "call_id": call.call_id, "output": "21 C, sunny"},
        ],
        tools=[TOOL],
    )
    assert answer.status == "completed"
    assert [item.type for item in answer.output] == ["message"]
    assert answer.output_text


def test_forced_tool_choice_and_a_parsed_text_format(oa: Any) -> None:
    forced = oa.responses.create(
        model="default",
        input="Hello!",
        tools=[TOOL],
        tool_choice={"type": "function", "name": "get_weather"},
    )
    assert [item.type for item in forced.output] == ["function_call"]
    assert list(json.loads(forced.output[0].arguments)) == ["city"]
    parsed = oa.responses.parse(
        model="default", input="Which city? Answer in JSON.", text_format=City
    )
    assert isinstance(parsed.output_parsed, City)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # openai-agents calls asyncio directly
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
async def test_openai_agents_default_responses_model_runs_a_tool(
    base_url: str, anyio_backend: str
) -> None:
    agents = pytest.importorskip("agents")
    from agents.models.openai_provider import OpenAIProvider
    from agents.models.openai_responses import OpenAIResponsesModel

    agents.set_tracing_disabled(True)  # it would export traces to OpenAI
    calls: list[str] = []

    def get_weather(city: str) -> str:
        """Current weather for a city."""
        calls.append(city)
        return f"21 C and sunny in {city}"

    client = openai.AsyncOpenAI(base_url=base_url, api_key=KEY, max_retries=0, timeout=LIMIT)
    try:
        provider = OpenAIProvider(openai_client=client)  # its default: the Responses API
        assert isinstance(provider.get_model("default"), OpenAIResponsesModel)
        config = agents.RunConfig(model_provider=provider)
        agent = agents.Agent(
            name="forecaster", model="default", tools=[agents.function_tool(get_weather)]
        )
        result = await agents.Runner.run(agent, WEATHER, run_config=config)
        kinds = [item.type for item in result.new_items]
        assert kinds[:2] == ["tool_call_item", "tool_call_output_item"]
        assert kinds[-1] == "message_output_item" and result.final_output
        assert calls and calls[0]
        assert result.new_items[1].output == f"21 C and sunny in {calls[0]}"

        streamed = agents.Runner.run_streamed(agent, WEATHER, run_config=config)
        seen = [event async for event in streamed.stream_events()]
        names = [e.name for e in seen if e.type == "run_item_stream_event"]
        assert names[:2] == ["tool_called", "tool_output"]
        assert streamed.final_output and len(calls) == 2
    finally:
        await client.close()


def test_the_sdk_stream_helper_accumulates_the_reply(oa: Any) -> None:
    """openai's ``responses.stream`` checks the events' order and ids as it builds its
    snapshot; it must end with the same call the plain reply makes."""
    with oa.responses.stream(model="default", input=WEATHER, tools=[TOOL]) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    [call] = final.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert set(json.loads(call.arguments)) == {"city"}


# third-party clients' own deprecation notices are theirs, not the server's
THIRD_PARTY_WARNINGS = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::PendingDeprecationWarning"),
    pytest.mark.filterwarnings("ignore::pydantic.warnings.PydanticDeprecatedSince20"),
    pytest.mark.filterwarnings("ignore:.*Pydantic serializer warnings.*:UserWarning"),
    pytest.mark.filterwarnings("ignore:.*using the `ReadOnly` qualifier.*:UserWarning"),
]


def _third_party(test: Any) -> Any:
    for mark in THIRD_PARTY_WARNINGS:
        test = mark(test)
    return test


@_third_party
def test_langchain_use_responses_api(base_url: str) -> None:
    langchain_openai = pytest.importorskip("langchain_openai")
    import httpx

    # a client the test closes: ChatOpenAI's default comes from a cache nothing closes
    with httpx.Client(timeout=LIMIT) as http:
        llm = langchain_openai.ChatOpenAI(
            model="default",
            base_url=base_url,
            api_key=KEY,
            use_responses_api=True,
            max_retries=0,
            http_client=http,
        )
        assert llm.invoke("hi").text
        weather = {"type": "function", "function": {k: v for k, v in TOOL.items() if k != "type"}}
        called = llm.bind_tools([weather]).invoke(WEATHER)
        assert [call["name"] for call in called.tool_calls] == ["get_weather"]
        assert "".join(chunk.text for chunk in llm.stream("hi"))


@_third_party
@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # pydantic-ai calls asyncio directly
async def test_pydantic_ai_responses_model_runs_a_tool(base_url: str, anyio_backend: str) -> None:
    pydantic_ai = pytest.importorskip("pydantic_ai")
    from pydantic_ai.models.openai import OpenAIResponsesModel
    from pydantic_ai.providers.openai import OpenAIProvider

    client = openai.AsyncOpenAI(base_url=base_url, api_key=KEY, max_retries=0, timeout=LIMIT)
    try:
        model = OpenAIResponsesModel("default", provider=OpenAIProvider(openai_client=client))
        agent = pydantic_ai.Agent(model)
        cities: list[str] = []

        def get_weather(city: str) -> str:
            """Current weather for a city."""
            cities.append(city)
            return f"21 C in {city}"

        agent.tool_plain(get_weather)
        result = await agent.run(WEATHER)
        assert cities and result.output
        kinds = [part.part_kind for m in result.all_messages() for part in m.parts]
        assert "tool-call" in kinds and "tool-return" in kinds
    finally:
        await client.close()
