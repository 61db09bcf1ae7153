"""OpenAI's explicit prompt caching (GPT-5.6 and later), driven by the breakpoint planner on
both OpenAI wires: ``prompt_cache_breakpoint`` on content parts where the layout marks and
the conversation say, ``prompt_cache_options.mode`` explicit, the caller's markers kept;
cache writes counted and priced. The official ``openai`` SDK's request types validate
every body sent."""

from __future__ import annotations

import warnings
from typing import Any

import pydantic
import pytest

from swiftclient import (
    AsyncClient,
    ConfigurationError,
    HTTPBackend,
    Price,
    Pricing,
    ResponsesBackend,
)
from swiftclient.breakpoints import CacheBreakpointWarning
from swiftclient.prompt_cache import static, turn
from swiftclient.testing import FakeProvider, Reply, ReplyUsage

pytestmark = pytest.mark.anyio

MANUAL = "A long reference manual, page after page. " * 300  # about 3,000 tokens
EXPLICIT = {"mode": "explicit"}
WIRES = [HTTPBackend, ResponsesBackend]


def sdk_check(body: dict[str, Any], wire: type[HTTPBackend]) -> None:
    """The official SDK's request type for the wire validates ``body``."""
    pytest.importorskip("openai")
    from openai.types.chat.completion_create_params import CompletionCreateParamsNonStreaming
    from openai.types.responses.response_create_params import ResponseCreateParamsNonStreaming

    params: Any = (
        ResponseCreateParamsNonStreaming
        if wire is ResponsesBackend
        else CompletionCreateParamsNonStreaming
    )
    pydantic.TypeAdapter(params).validate_python(body)


def marks(body: dict[str, Any]) -> list[tuple[int, str, Any]]:
    """(message index, role, marker) for each message of either wire, in order."""
    found = []
    for index, message in enumerate(body.get("messages") or body.get("input") or ()):
        content = message.get("content")
        last = content[-1] if isinstance(content, list) else {}
        found.append((index, message.get("role"), last.get("prompt_cache_breakpoint")))
    return found


def agent_turns() -> list[Any]:
    return [
        static({"role": "system", "content": MANUAL}),
        {"role": "user", "content": "Where is the index?"},
        {"role": "assistant", "content": "On page 12."},
        turn({"role": "user", "content": "And the glossary?"}),
    ]


@pytest.mark.parametrize("wire", WIRES, ids=["chat", "responses"])
async def test_the_planner_marks_the_static_prefix_the_history_and_the_last_turn(
    wire: type[HTTPBackend],
) -> None:
    async with FakeProvider() as fake:
        backend = wire(fake.base_url, name="o", cache_breakpoints=True, cache_ttl="12h")
        async with AsyncClient(backends={"o": backend}, model="o/gpt-5.6") as client:
            await client.chat(agent_turns())
    body = fake.requests[-1].body
    sdk_check({**body, "stream": False}, wire)
    assert body["prompt_cache_options"] == EXPLICIT
    long = {"mode": "explicit", "ttl": "12h"}
    if wire is ResponsesBackend:  # assistant text is output, which takes no breakpoint
        assert marks(body) == [
            (0, "system", long),
            (1, "user", None),
            (2, "assistant", None),
            (3, "user", EXPLICIT),
        ]
        assert body["input"][0]["content"][0]["type"] == "input_text"
    else:
        assert marks(body) == [
            (0, "system", long),
            (1, "user", None),
            (2, "assistant", EXPLICIT),
            (3, "user", EXPLICIT),
        ]
        assert body["messages"][0]["content"] == [
            {"type": "text", "text": MANUAL, "prompt_cache_breakpoint": long}
        ]


@pytest.mark.parametrize("wire", WIRES, ids=["chat", "responses"])
async def test_off_by_default_and_nothing_on_short_prompts(wire: type[HTTPBackend]) -> None:
    async with FakeProvider() as fake:
        plain = wire(fake.base_url, name="plain")
        planned = wire(fake.base_url, name="planned", cache_breakpoints=True)
        backends = {"plain": plain, "planned": planned}
        async with AsyncClient(backends=backends) as client:
            await client.chat(agent_turns(), model="plain/gpt-5.6")
            assert "prompt_cache_options" not in fake.requests[-1].body
            assert all(mark is None for *_, mark in marks(fake.requests[-1].body))
            await client.chat("short", model="planned/gpt-5.6")
            assert "prompt_cache_options" not in fake.requests[-1].body
            assert all(mark is None for *_, mark in marks(fake.requests[-1].body))


async def test_the_callers_markers_are_kept_moved_onto_content_and_merged_past_four() -> None:
    turns: list[Any] = [{"role": "system", "content": MANUAL}]
    for i in range(5):
        marker = {"type": "ephemeral"} if i % 2 else {"mode": "explicit"}
        key = "cache_control" if i % 2 else "prompt_cache_breakpoint"
        turns.append({"role": "user", "content": f"question {i} " * 50, key: marker})
        turns.append({"role": "assistant", "content": f"answer {i}"})
    turns.append({"role": "user", "content": "last"})
    async with FakeProvider() as fake:
        backend = HTTPBackend(fake.base_url, name="o", cache_breakpoints=True)
        async with AsyncClient(backends={"o": backend}, model="o/gpt-5.6") as client:
            with pytest.warns(CacheBreakpointWarning, match="merged"):
                await client.chat(turns)
    body = fake.requests[-1].body
    sdk_check({**body, "stream": False}, HTTPBackend)
    placed = [(index, mark) for index, _, mark in marks(body) if mark is not None]
    assert len(placed) == 4  # the API's limit, all of them the caller's
    assert {index for index, _ in placed} <= {1, 3, 5, 7, 9}
    assert placed[-1][0] == 9  # the last marker of the caller's stays where it was
    assert all(
        "cache_control" not in m and "prompt_cache_breakpoint" not in m for m in body["messages"]
    )


async def test_implicit_mode_asked_for_leaves_room_for_openais_own_breakpoint() -> None:
    async with FakeProvider() as fake:
        backend = HTTPBackend(fake.base_url, name="o", cache_breakpoints=True)
        async with AsyncClient(backends={"o": backend}, model="o/gpt-5.6") as client:
            turns: list[Any] = [static({"role": "system", "content": MANUAL})]
            for i in range(4):
                turns.append({"role": "user", "content": f"q{i}", "cache_control": {}})
                turns.append({"role": "assistant", "content": f"a{i}"})
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", CacheBreakpointWarning)
                await client.chat(
                    turns + [{"role": "user", "content": "last"}],
                    extra_body={"prompt_cache_options": {"mode": "implicit"}},
                )
    body = fake.requests[-1].body
    assert body["prompt_cache_options"] == {"mode": "implicit"}
    assert sum(mark is not None for *_, mark in marks(body)) == 3


def test_a_bad_ttl_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="cache_ttl"):
        HTTPBackend("http://localhost/v1", cache_ttl="1h")  # type: ignore[arg-type]


@pytest.mark.parametrize("wire", WIRES, ids=["chat", "responses"])
async def test_cache_writes_are_counted_and_priced_at_openais_multipliers(
    wire: type[HTTPBackend],
) -> None:
    usage = ReplyUsage(prompt_tokens=10_000, cached_tokens=6_000, cache_write_tokens=3_000)
    price = Price.openai(per_input_token=1e-6, per_output_token=8e-6)
    async with FakeProvider() as fake:
        async with AsyncClient(
            backends={"o": wire(fake.base_url, name="o")},
            model="o/gpt-5.6",
            pricing=Pricing({"o/*": price}),
        ) as client:
            for stream in (False, True):
                fake.script(Reply(text="ok", usage=usage))
                completion = await client.chat("hi", stream=stream)
                counted = completion.usage
                assert counted is not None
                assert (counted.cached_tokens, counted.cache_write_tokens) == (6_000, 3_000)
                assert completion.timing is not None and completion.timing.cost is not None
                cost = completion.timing.cost
                assert cost.cache_write_cost == pytest.approx(3_000 * 1.25e-6)
                assert cost.cache_savings == pytest.approx(6_000 * 0.9e-6)
                assert cost.cost == pytest.approx(
                    1_000 * 1e-6
                    + 6_000 * 0.1e-6
                    + 3_000 * 1.25e-6
                    + counted.completion_tokens * 8e-6
                )
