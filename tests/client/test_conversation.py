"""Conversation: append-only turns, a byte-stable sent prefix, warnings with the diagnosis
when an edit (or a change in place) breaks it, and ``client.chat(conversation)``."""

from __future__ import annotations

import json
import warnings
from contextlib import AbstractAsyncContextManager
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swiftclient import AsyncClient, ConfigurationError, Conversation, PrefixBrokenWarning
from swiftclient.prompt_cache import diagnose
from swiftclient.types import AssistantMessage, Message

from .mock import Script, chunk, scripted_client

pytestmark = pytest.mark.anyio
TOOLS = [
    {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "clock"}},
]


def _client(script: Script) -> AbstractAsyncContextManager[AsyncClient]:
    """A client over the ``transport`` fixture's transport, ``script`` served on a loopback
    socket."""
    return scripted_client(script, retry=None)


def _tool_call_reply(name: str = "weather") -> list[bytes]:
    call = {
        "index": 0,
        "id": "call_1",
        "type": "function",
        "function": {"name": name, "arguments": '{"city":"Paris"}'},
    }
    return [
        chunk(role="assistant"),
        chunk(tool_calls=[call]),
        chunk(finish="tool_calls"),
        b"data: [DONE]\n\n",
    ]


@pytest.mark.usefixtures("transport")  # the bytes on the wire, over aiohttp and httpx
async def test_turns_extend_the_sent_prefix_byte_for_byte() -> None:
    script = Script().add(parts=_tool_call_reply())
    conversation = Conversation("You are terse.", tools=TOOLS)
    conversation.user("Weather in Paris?")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        async with scripted_client(script, retry=None) as client:
            first = await conversation.send(client)
            assert first.choices[0].message.tool_calls is not None
            conversation.tool_result("call_1", {"temp": 21, "sky": "clear"})
            await conversation.send(client)
            conversation.user("Thanks")
            await client.chat(conversation)  # plugs into client.chat too
    assert conversation.last_break is None and conversation.sent == 6
    bodies = [json.loads(request.content) for request in script.requests]
    assert [t["function"]["name"] for t in bodies[0]["tools"]] == ["clock", "weather"]
    raw = [request.content for request in script.requests]
    for earlier, later in zip(bodies, bodies[1:], strict=False):
        sent = [json.dumps(m, sort_keys=True) for m in earlier["messages"]]
        assert [json.dumps(m, sort_keys=True) for m in later["messages"][: len(sent)]] == sent
    # the messages' bytes themselves are identical on the wire, not only equal when parsed
    first_messages = raw[0][
        raw[0].index(b'"messages":[') : raw[0].index(b"]", raw[0].index(b'"messages":['))
    ]
    assert raw[2].startswith(raw[0][: raw[0].index(b'"messages":[')])
    assert first_messages in raw[2]
    assert bodies[1]["messages"][3] == {
        "role": "tool",
        "tool_call_id": "call_1",
        "content": '{"temp": 21, "sky": "clear"}',
    }
    assert conversation[2].tool_calls is not None  # the reply in its request form


def test_a_tool_result_is_sent_as_json_dumps_writes_it_and_the_same_dict_as_the_same_bytes() -> (
    None
):
    result = {"city": "Zürich", "temperature": -2.5, "unit": "celsius", "tags": [1, None]}
    conversation = Conversation()
    first = conversation.tool_result("a", result)
    again = conversation.tool_result("b", dict(result))
    assert first.content == again.content == json.dumps(result)
    assert first.content == (
        '{"city": "Z\\u00fcrich", "temperature": -2.5, "unit": "celsius", "tags": [1, null]}'
    )
    # the key order is the dict's own: another order is another (equally stable) text
    reordered = conversation.tool_result("c", dict(reversed(result.items())))
    assert reordered.content == json.dumps(dict(reversed(result.items())))
    assert reordered.content != first.content
    result["temperature"] = 99  # the conversation keeps what was sent
    assert conversation[0].content == first.content
    assert conversation.tool_result("d", "already text").content == "already text"


async def test_the_embedded_model_answers_from_a_tool_result_added_by_the_conversation() -> None:
    """The documented path (docs/prompt-caching.md: ``tool_result(call.id, result)``) on the
    embedded model: it was trained on tool results as ``json.dumps`` writes them, and read
    the sorted compact form wrongly (``It is -21.12 °C and foggy in Paris.`` for 12.2 °C)."""
    from local_engine import LocalBackend
    from local_engine.builtin_tools import TOOLS as BUILTIN_TOOLS
    from local_engine.builtin_tools import run_tool

    answers: dict[str, str] = {}
    expected: dict[str, str] = {}

    async def ask(client: AsyncClient, city: str) -> None:
        conversation = Conversation(tools=list(BUILTIN_TOOLS.values()))
        conversation.user(f"What's the weather in {city}?")
        completion = await conversation.send(client, temperature=0.0, max_tokens=96)
        (call,) = completion.tool_calls
        assert call.function.name == "get_weather"
        arguments = json.loads(call.function.arguments)
        result = run_tool(call.function.name, arguments)
        conversation.tool_result(call.id, result)
        completion = await conversation.send(client, temperature=0.0, max_tokens=96)
        answers[city] = completion.text
        where = arguments["city"]
        expected[city] = f"It is {result['temperature']} °C and {result['conditions']} in {where}."

    async with AsyncClient(LocalBackend("default")) as client:
        async with anyio.create_task_group() as tg:
            for city in ("Paris", "Oslo"):
                tg.start_soon(ask, client, city)
    assert answers == expected


@pytest.mark.usefixtures("transport")
async def test_an_edit_of_a_sent_message_warns_with_the_diagnosis() -> None:
    script = Script()
    conversation = Conversation("You are terse.")
    conversation.user("hi")
    async with _client(script) as client:
        await conversation.send(client)
        conversation.edit(3, {"role": "user", "content": "new turn"}) if len(
            conversation
        ) > 3 else None
        with pytest.warns(PrefixBrokenWarning, match=r"messages\[0\]\.content") as caught:
            conversation.edit(0, {"role": "system", "content": "You are verbose."})
        assert len(caught) == 1
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # announced once: sending does not warn again
            await conversation.send(client)
    found = conversation.last_break
    assert found is not None and found.message_index == 0 and found.field == "content"
    assert found.offset == len(b'{"role":"system","content":"You are ')


async def test_appending_and_editing_unsent_messages_is_silent() -> None:
    conversation = Conversation(static=[{"role": "user", "content": "docs"}])
    conversation.user("q")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        conversation.edit(1, {"role": "user", "content": "q2"})
        conversation.truncate(1)
    assert [m.content for m in conversation] == ["docs"] and conversation.static == 1


@pytest.mark.usefixtures("transport")
async def test_a_change_in_place_is_found_when_sending() -> None:
    script = Script()
    mine = Message(role="user", content="hi")
    conversation = Conversation("s")
    conversation.append(mine)
    mine.content = "changed outside"  # the conversation holds its own copy
    async with _client(script) as client:
        await conversation.send(client)
        conversation[1].content = "changed inside"
        conversation.user("next")
        with pytest.warns(PrefixBrokenWarning, match=r"messages\[1\]\.content"):
            await conversation.send(client)
    first = json.loads(script.requests[0].content)
    assert first["messages"][1]["content"] == "hi"


@pytest.mark.usefixtures("transport")
async def test_truncating_sent_messages_warns() -> None:
    script = Script()
    conversation = Conversation("s")
    conversation.user("a")
    async with _client(script) as client:
        await conversation.send(client)
    with pytest.warns(PrefixBrokenWarning, match="removed"):
        conversation.truncate(1)


def test_bad_input_is_rejected() -> None:
    conversation = Conversation()
    with pytest.raises(ConfigurationError, match="length must be >= 0"):
        conversation.truncate(-1)
    # The library's own error saying what is wrong (it was pydantic's ValidationError).
    with pytest.raises(ConfigurationError, match="invalid message: role: Input should be"):
        conversation.append({"role": "robot", "content": "x"})
    with pytest.raises(ConfigurationError, match="invalid message"):
        conversation.append("hi")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"invalid tool tools\[1\]"):
        Conversation(tools=[TOOLS[0], {"type": "function"}])
    with pytest.raises(ConfigurationError, match="AsyncClient or a Client, got str"):
        conversation.send("client")  # type: ignore[call-overload]
    assert repr(conversation) == "Conversation(messages=0, static=0)"


@pytest.mark.usefixtures("transport")
async def test_the_agent_example_runs_on_a_conversation(capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[2] / "examples" / "agent_tools.py"
    spec = importlib.util.spec_from_file_location("agent_tools_example", path)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    parts = [
        chunk(role="assistant"),
        chunk("It is sunny."),
        chunk(finish="stop"),
        b"data: [DONE]\n\n",
    ]
    script = Script().add(parts=_tool_call_reply("get_weather")).add(parts=parts)
    async with _client(script) as client:
        answer = await example.run_agent(client, "Weather in Paris?")
    assert answer == "It is sunny."
    assert 'tool get_weather({"city":"Paris"})' in capsys.readouterr().out
    bodies = [json.loads(request.content) for request in script.requests]
    assert bodies[1]["messages"][: len(bodies[0]["messages"])] == bodies[0]["messages"]
    assert bodies[1]["messages"][-1]["role"] == "tool"


_KEYS = st.text(alphabet="abcxyz", min_size=1, max_size=4)
_RESULTS = st.dictionaries(_KEYS, st.integers() | st.text(max_size=5), max_size=5)
_STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("user"), st.text(max_size=10)),
        st.tuples(st.just("tool"), _RESULTS),
        st.tuples(st.just("reply"), st.text(min_size=1, max_size=10)),
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=40, deadline=None)
@given(_STEPS, st.randoms(use_true_random=False))
def test_every_turn_extends_the_last_sent_prompt(steps: list[Any], rng: Any) -> None:
    ours, theirs = Conversation("sys", tools=TOOLS), Conversation("sys", tools=TOOLS[::-1])
    previous = None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for kind, value in steps:
            if kind == "tool":
                keys = list(value)
                rng.shuffle(keys)  # whatever order the caller builds its result in
                value = {key: value[key] for key in keys}
            for conversation in (ours, theirs):
                if kind == "user":
                    conversation.user(value)
                elif kind == "tool":
                    conversation.tool_result("c", dict(value))  # an equal dict, equal bytes
                else:
                    reply = AssistantMessage(content=value, reasoning_content="hidden")
                    conversation.append(reply)
                conversation.request_messages()
                assert conversation.last_break is None
            current = ours._prefix()
            assert current == theirs._prefix()
            if previous is not None:
                assert diagnose(previous, current) is None
            previous = current
