"""The call path's contract with its caller: per-call limits, messages in and out, errors
that say what happened after retries."""

from __future__ import annotations

import dataclasses
import json
import sys
import typing
from typing import Any

import pydantic
import pytest
from typing_extensions import TypedDict  # pydantic needs it on Python < 3.12

from swiftclient import (
    AssistantMessage,
    AsyncClient,
    BadRequestError,
    ChatRequest,
    ConfigurationError,
    DeadlineExceeded,
    FirstTokenTimeout,
    HTTPBackend,
    InternalServerError,
    Message,
    StreamStalled,
    StructuredOutputError,
    Timeout,
)
from swiftclient._canonical import canonical_schema
from swiftclient._canonical import encode as encode_request
from swiftclient._structured import _strict_schema, structured_output
from swiftclient.extend import AttemptResult
from swiftclient.testing import FakeProvider, Reply

from .mock import (
    HELD,
    KEY,
    TOOL_LOOP_ANSWER,
    Script,
    backend_for,
    chunk,
    mock_client,
    scripted_client,
    stream_body,
    tool_loop,
)

pytestmark = pytest.mark.anyio
over_transports = pytest.mark.usefixtures("transport")
"""A test that sends requests runs over aiohttp and httpx, on a loopback socket; one whose
request is refused before sending keeps the MockTransport (no transport is reached)."""
_CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


# --------------------------------------------------------------------------- per-call timeout


def test_a_number_overrides_total_only() -> None:
    base = Timeout(total=60, connect=2, pool=3, first_token=4, idle=5)
    assert Timeout.coerce(9, base) == Timeout(total=9, connect=2, pool=3, first_token=4, idle=5)
    assert Timeout.coerce(None, base) == Timeout(
        total=None, connect=2, pool=3, first_token=4, idle=5
    )
    assert Timeout.coerce(9) == Timeout(total=9)
    replaced = Timeout(total=1)
    assert Timeout.coerce(replaced, base) is replaced


@over_transports
async def test_a_per_call_number_keeps_the_clients_first_token_limit() -> None:
    # The client's first_token limit must survive `timeout=20`: each stalled attempt times
    # out on it and is retried, instead of the call waiting out its whole total.
    script = Script()
    for _ in range(3):
        script.add(parts=[chunk(role="assistant"), b": keep-alive\n\n"], stall=True)
    limits = Timeout(total=60, first_token=0.3, idle=None)
    async with scripted_client(script, timeout=limits) as client:
        with pytest.raises(FirstTokenTimeout):
            await client.chat("hi", timeout=20)
    assert len(script.requests) == 3


# --------------------------------------------------------------------------- messages


@pytest.mark.parametrize(
    ("message", "match"),
    [
        ({"role": "user"}, "a user message needs content"),
        ({"role": "system", "content": None}, "a system message needs content"),
        ({"role": "developer"}, "a developer message needs content"),
        ({"role": "user", "content": []}, "must not be an empty list"),
        ({"role": "tool", "content": "42"}, "needs tool_call_id"),
        ({"role": "tool", "tool_call_id": "", "content": "42"}, "needs tool_call_id"),
        ({"role": "tool", "tool_call_id": "c1"}, "a tool message needs content"),
        ({"role": "assistant"}, "needs content or tool_calls"),
        ({"role": "assistant", "tool_calls": []}, "needs content or tool_calls"),
        ({"role": "user", "content": "x", "tool_call_id": "c1"}, "tool_call_id belongs on tool"),
        (
            {"role": "user", "content": "x", "tool_calls": [_CALL]},
            "tool_calls belong on assistant",
        ),
        ({"role": "robot", "content": "x"}, "role"),
    ],
)
async def test_malformed_messages_are_refused_before_sending(
    message: dict[str, Any], match: str
) -> None:
    script = Script()
    async with mock_client(script) as client:
        conversation = [{"role": "user", "content": "first"}, message]
        with pytest.raises(ConfigurationError, match=r"messages\[1\]") as info:
            await client.chat(conversation)
        assert match in str(info.value)
        with pytest.raises(ConfigurationError, match=match):
            await client.chat(conversation, stream=False)
        with pytest.raises(ConfigurationError, match=match):
            client.stream(conversation)
    assert script.requests == []


@pytest.mark.parametrize("messages", [123, None, {"role": "user", "content": "hi"}, b"hi"])
async def test_messages_of_the_wrong_type_are_a_configuration_error(messages: Any) -> None:
    script = Script()
    async with mock_client(script) as client:
        with pytest.raises(ConfigurationError, match="messages must be a string"):
            await client.chat(messages)
        with pytest.raises(ConfigurationError, match="messages must be a string"):
            client.stream(messages)
    assert script.requests == []


@over_transports
async def test_every_valid_message_shape_is_sent() -> None:
    conversation: list[dict[str, Any]] = [
        {"role": "system", "content": ""},
        {"role": "developer", "content": [{"type": "text", "text": "rules"}]},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is this?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            ],
            "name": "ann",
        },
        {"role": "assistant", "tool_calls": [_CALL]},
        {"role": "assistant", "content": None, "tool_calls": [_CALL]},
        {"role": "tool", "tool_call_id": "c1", "content": ""},
        {"role": "assistant", "refusal": "I can't help with that."},
        {"role": "assistant", "content": "", "prefix": True},
        {"role": "assistant", "function_call": {"name": "f", "arguments": "{}"}},
        {"role": "assistant", "audio": {"id": "audio_1"}},
    ]
    script = Script()
    async with scripted_client(script) as client:
        await client.chat(conversation)
    sent = json.loads(script.requests[0].content)["messages"]
    assert sent[3] == {"role": "assistant", "tool_calls": [_CALL]}
    assert sent[6] == {"role": "assistant", "refusal": "I can't help with that."}
    assert sent[7] == {"role": "assistant", "content": "", "prefix": True}


def test_a_reply_validates_as_a_request_message() -> None:
    reply = AssistantMessage.model_validate(
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "let me think",
            "tool_calls": [_CALL],
            "provider_field": 1,
        }
    )
    message = Message.model_validate(reply)
    assert message == reply.to_message()
    assert message.role == "assistant" and message.content is None
    assert message.tool_calls is not None and message.tool_calls[0].id == "c1"
    request = ChatRequest(model="m", messages=[reply])  # type: ignore[list-item]
    body = json.loads(encode_request(request, stream=False))
    assert body["messages"] == [{"role": "assistant", "tool_calls": [_CALL]}]
    refused = AssistantMessage(content=None, refusal="I can't help with that.")
    assert Message.model_validate(refused) == refused.to_message()
    request = ChatRequest(model="m", messages=[refused])  # type: ignore[list-item]
    body = json.loads(encode_request(request, stream=False))
    assert body["messages"] == [{"role": "assistant", "refusal": "I can't help with that."}]


@over_transports
@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "plain"])
async def test_a_three_turn_tool_loop_appends_the_replies_as_they_come(stream: bool) -> None:
    async with FakeProvider() as fake:
        fake.script(
            Reply(tool_calls=(("get_weather", {"city": "Paris"}),)),
            Reply(tool_calls=(("add", {"a": 20, "b": 1.5}),)),
            Reply(text=TOOL_LOOP_ANSWER),
        )
        async with AsyncClient(backend_for(fake.base_url, name="fake"), model="m") as client:
            await tool_loop(client, stream=stream)
    sent = fake.requests[-1].body["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "tool", "assistant", "tool"]
    for assistant, tool, name in ((sent[1], sent[2], "get_weather"), (sent[3], sent[4], "add")):
        assert set(assistant) == {"role", "tool_calls"}
        (call,) = assistant["tool_calls"]
        assert call["function"]["name"] == name and tool["tool_call_id"] == call["id"]
    assert json.loads(sent[4]["content"]) == {"sum": 21.5}
    assert len(fake.requests) == 3


# --------------------------------------------------------------------------- usage


class _Ends:
    """Keeps every attempt's frozen result at its end."""

    attempt_hooks = ("on_end",)

    def __init__(self) -> None:
        self.results: list[AttemptResult] = []

    def on_end(self, attempt: AttemptResult) -> None:
        self.results.append(attempt)


@over_transports
@pytest.mark.parametrize("stream", [True, False])
async def test_an_attempt_reports_the_usage_of_what_it_handed_out(stream: bool) -> None:
    # The attempt reads the usage off the chunks (or the completion) it hands out: nobody
    # passes it in. A stream left before its usage chunk was handed out reports none.
    ends = _Ends()
    async with FakeProvider(Reply(tokens=2)) as fake:
        backend = backend_for(fake.base_url, name="fake")
        async with AsyncClient(backend, model="m", observers=[ends]) as client:
            completion = await client.chat("hi", stream=stream)
            async with client.stream("hi") as early:
                await early.text().__anext__()
    assert completion.usage is not None and completion.usage.completion_tokens == 2
    assert [result.usage for result in ends.results] == [completion.usage, None]


# --------------------------------------------------------------------------- errors after retries


@over_transports
@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "plain"])
async def test_an_error_after_retries_carries_its_attempts(stream: bool) -> None:
    script = Script().add(500).add(502).add(503)
    async with scripted_client(script) as client:
        with pytest.raises(InternalServerError) as info:
            await client.chat("hi", stream=stream)
    error = info.value
    assert [(a.number, a.outcome, a.status_code) for a in error.attempts] == [
        (1, "error", 500),
        (2, "error", 502),
        (3, "error", 503),
    ]
    assert str(error).endswith("(after 3 attempts)") and error.message == str(error)
    assert "after 3 attempts" in repr(error)
    assert KEY not in str(error) and KEY not in repr(error)


@over_transports
@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "plain"])
async def test_an_error_on_the_first_attempt_says_nothing_of_retries(stream: bool) -> None:
    script = Script().add(400)
    async with scripted_client(script) as client:
        with pytest.raises(BadRequestError) as info:
            await client.chat("hi", stream=stream)
    assert [a.status_code for a in info.value.attempts] == [400]
    assert "attempt" not in str(info.value)


@over_transports
async def test_timeouts_retried_and_a_stall_after_a_retry_say_how_many_attempts() -> None:
    script = Script()
    for _ in range(3):
        script.add(parts=[chunk(role="assistant"), b": keep-alive\n\n"], stall=True)
    async with scripted_client(
        script, timeout=Timeout(total=60, first_token=0.3, idle=None)
    ) as client:
        with pytest.raises(FirstTokenTimeout, match=r"\(after 3 attempts\)$") as first:
            await client.chat("hi")
    assert [a.error for a in first.value.attempts] == ["FirstTokenTimeout"] * 3

    script = Script().add(503).add(parts=[chunk(role="assistant"), chunk("a")], stall=True)
    async with scripted_client(script, timeout=Timeout(total=60, idle=0.3)) as client:
        async with client.stream("hi") as stream:
            with pytest.raises(StreamStalled, match=r"\(after 2 attempts\)$") as stalled:
                async for _ in stream:
                    pass
    assert [a.outcome for a in stalled.value.attempts] == ["error", "error"]
    assert stalled.value.attempts[-1].error == "StreamStalled"


@over_transports
async def test_deadline_messages_read_the_same_streamed_and_not() -> None:
    limits = Timeout(total=0.3, idle=None)
    script = Script().add(parts=[chunk(role="assistant")], stall=True)
    async with scripted_client(script, timeout=limits) as client:
        with pytest.raises(DeadlineExceeded) as streamed:
            await client.chat("hi")
    async with FakeProvider(HELD) as fake:  # a non-streamed request held: no response at all
        plain = backend_for(fake.base_url, KEY, name="mock")
        async with AsyncClient(plain, model="m", timeout=limits) as client:
            with pytest.raises(DeadlineExceeded) as not_streamed:
                await client.chat("hi", stream=False)
    expected = "mock: the call's total deadline of 0.3s was exceeded"
    assert str(streamed.value) == str(not_streamed.value) == expected
    assert len(streamed.value.attempts) == len(not_streamed.value.attempts) == 1


# --------------------------------------------------------------------------- response_model


class Weather(pydantic.BaseModel):
    city: str
    celsius: float


class WeatherDict(TypedDict):
    city: str
    celsius: float


@dataclasses.dataclass
class WeatherData:
    city: str
    celsius: float


class Node(pydantic.BaseModel):
    name: str
    children: list[Node] = []


def _replies(*texts: str) -> Script:
    script = Script()
    for text in texts:
        script.add(parts=stream_body([text]))
    return script


PARIS = '{"city": "Paris", "celsius": 21.5}'


@over_transports
@pytest.mark.parametrize(
    ("response_model", "reply", "expected", "name"),
    [
        (Weather, PARIS, Weather(city="Paris", celsius=21.5), "Weather"),
        (WeatherDict, PARIS, {"city": "Paris", "celsius": 21.5}, "WeatherDict"),
        (WeatherData, PARIS, WeatherData("Paris", 21.5), "WeatherData"),
        (list[Weather], f"[{PARIS}]", [Weather(city="Paris", celsius=21.5)], "list_Weather"),
        (
            dict[str, WeatherDict],
            f'{{"today": {PARIS}}}',
            {"today": {"city": "Paris", "celsius": 21.5}},
            "dict_str_WeatherDict",
        ),
        (
            Node,
            '{"name": "a", "children": [{"name": "b"}]}',
            Node(name="a", children=[Node(name="b")]),
            "Node",
        ),
    ],
)
@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "plain"])
async def test_response_model_takes_models_typeddicts_dataclasses_and_lists(
    response_model: Any, reply: str, expected: object, name: str, stream: bool
) -> None:
    if stream:
        script = _replies(reply)
    else:
        script = Script().add(parts=[json.dumps(_plain_completion(reply)).encode()])
    async with scripted_client(script) as client:
        result = await client.chat("weather", response_model=response_model, stream=stream)
    assert result == expected
    sent = json.loads(script.requests[0].content)["response_format"]
    assert sent["type"] == "json_schema" and sent["json_schema"]["name"] == name
    schema = pydantic.TypeAdapter(response_model).json_schema()
    strict = sent["json_schema"].get("strict")
    assert strict is (None if name.startswith("dict_") else True)  # a mapping cannot be strict
    expected = _strict_schema(schema) if strict else schema
    assert sent["json_schema"]["schema"] == canonical_schema(expected)  # `required` sorted


def _plain_completion(text: str) -> dict[str, Any]:
    return {
        "id": "x",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        ],
    }


@over_transports
@pytest.mark.parametrize(
    "reply",
    [
        f"```json\n{PARIS}\n```",
        f"```\n{PARIS}\n```",
        f"\n  ```JSON \r\n{PARIS}\r\n```\n",
    ],
)
async def test_a_reply_fenced_in_a_code_block_is_accepted(reply: str) -> None:
    script = _replies(reply)
    async with scripted_client(script) as client:
        assert await client.chat("w", response_model=Weather) == Weather(city="Paris", celsius=21.5)


@over_transports
async def test_structured_output_error_names_the_failing_fields() -> None:
    script = _replies('{"city": 5}', "Sure! Here it is: {", f"```json\n[{PARIS}]\n```")
    async with scripted_client(script) as client:
        with pytest.raises(StructuredOutputError) as fields:
            await client.chat("w", response_model=Weather)
        with pytest.raises(StructuredOutputError, match="Invalid JSON") as not_json:
            await client.chat("w", response_model=Weather)
        with pytest.raises(StructuredOutputError, match="Input should be an object") as wrong_shape:
            await client.chat("w", response_model=Weather)
    message = str(fields.value)
    assert message.startswith("the reply does not validate as Weather: ")
    assert "city: Input should be a valid string" in message
    assert "celsius: Field required" in message
    assert fields.value.raw == '{"city": 5}'
    assert not_json.value.raw == "Sure! Here it is: {"
    assert wrong_shape.value.raw.startswith("```json")


def _cut_off_body(words: list[str], usage: bool) -> list[bytes]:
    """A stream whose reply ends at the token limit (finish_reason "length")."""
    parts = stream_body(words, usage=usage)
    at = parts.index(chunk(finish="stop"))
    return [*parts[:at], chunk(finish="length"), *parts[at + 1 :]]


@over_transports
@pytest.mark.parametrize(("usage", "where"), [(True, "at 3 tokens"), (False, "at its token limit")])
async def test_a_reply_cut_off_at_max_tokens_says_so(usage: bool, where: str) -> None:
    script = Script()
    script.add(parts=_cut_off_body(['{"city": ', '"Par', "is"], usage=usage))
    script.add(parts=_cut_off_body([PARIS], usage=usage))  # complete although cut off: fine
    async with scripted_client(script) as client:
        with pytest.raises(StructuredOutputError) as cut:
            await client.chat("w", response_model=Weather, max_tokens=3)
        assert await client.chat("w", response_model=Weather) == Weather(city="Paris", celsius=21.5)
    message = str(cut.value)
    assert message.startswith(
        f"the reply was cut off {where} (finish_reason 'length') before a whole Weather was "
        "written: raise max_tokens to give it room (Invalid JSON: EOF while parsing"
    )
    assert cut.value.raw == '{"city": "Paris'


@over_transports
async def test_a_generic_response_model_is_named_as_its_code_spells_it() -> None:
    """A ``list[Weather]`` reply that does not validate is named ``list[Weather]``, not by
    its schema's name ``list_Weather``."""
    script = Script()
    script.add(parts=stream_body(['{"city": "Paris"}']))
    async with scripted_client(script) as client:
        with pytest.raises(StructuredOutputError) as wrong:
            await client.chat("w", response_model=list[Weather])
    assert str(wrong.value).startswith("the reply does not validate as list[Weather]: ")


@pytest.mark.anyio
async def test_a_tool_call_where_a_structure_was_asked_says_so() -> None:
    """With tools offered, a reply that is a tool call and no text read "Invalid JSON: EOF
    while parsing a value at line 1 column 0"."""
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}
    reply = Reply(tool_calls=[("get_weather", {"city": "Paris"})])
    async with (
        FakeProvider(reply) as fake,
        AsyncClient(HTTPBackend(fake.base_url), model="m") as client,
    ):
        with pytest.raises(StructuredOutputError) as called:
            await client.chat("w", response_model=Weather, tools=[tool])
    assert str(called.value).startswith(
        "the model called a tool (get_weather) instead of writing a Weather: run the call"
    )


class NotAModel:
    pass


@pytest.mark.parametrize(
    ("response_model", "match"),
    [
        (int, "describes a JSON integer"),
        (str, "describes a JSON string"),
        (Weather | None, "describes a JSON value"),
        (Weather(city="Paris", celsius=1.0), "must be a type"),
        ("Weather", "must be a type"),
        (NotAModel, "cannot be validated"),
    ],
)
async def test_response_model_refuses_what_cannot_be_structured_output(
    response_model: Any, match: str
) -> None:
    script = Script()
    async with mock_client(script) as client:
        with pytest.raises(ConfigurationError, match=match):
            await client.chat("w", response_model=response_model)
    assert script.requests == []


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="pydantic takes typing.TypedDict there")
def test_a_typing_typeddict_on_python_311_is_refused_with_pydantics_hint() -> None:
    class Plain(typing.TypedDict):
        city: str

    with pytest.raises(ConfigurationError, match="typing_extensions.TypedDict"):
        structured_output(Plain)


def test_each_response_model_is_prepared_once() -> None:
    assert structured_output(Weather) is structured_output(Weather)
    assert structured_output(list[Weather]) is structured_output(list[Weather])
    assert structured_output(list[Weather]) is not structured_output(list[WeatherDict])
