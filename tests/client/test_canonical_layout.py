"""Prompt layout marks, the volatile-content lint, cache accounting with normalized usage,
and the prefix-break diagnosis."""

from __future__ import annotations

import json
import warnings
from contextlib import AbstractAsyncContextManager
from typing import Any

import pytest

from swiftclient import AsyncClient
from swiftclient._canonical import prompt_prefix
from swiftclient.prompt_cache import (
    PrefixBreak,
    VolatilePrefixWarning,
    arrange,
    diagnose,
    session,
    static,
    turn,
)
from swiftclient.types import ChatRequest, Usage

from .mock import Script, backend_for, chunk, scripted_client, sse

SYSTEM = {"role": "system", "content": "You are a careful assistant."}
DOCS = {"role": "user", "content": "Reference: the manual, chapter 1."}
NOW = {"role": "system", "content": "The time is 2026-12-01T02:03:04Z."}
over_transports = pytest.mark.usefixtures("transport")
"""A test that sends requests runs over aiohttp and httpx, on a loopback socket."""


def _client(script: Script, **backend: Any) -> AbstractAsyncContextManager[AsyncClient]:
    """A client over the ``transport`` fixture's transport, ``script`` served on a loopback
    socket."""
    return scripted_client(script, retry=None, backend=backend)


def _sent(script: Script, index: int = -1) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(script.requests[index].content)
    return body


# --------------------------------------------------------------------------- layout


def test_arrange_emits_static_then_session_then_turn() -> None:
    history = {"role": "assistant", "content": "earlier"}
    question = {"role": "user", "content": "and now?"}
    ordered, count = arrange([SYSTEM, turn(NOW), static(DOCS), session(history), question])
    assert ordered == [SYSTEM, DOCS, history, question, NOW]
    assert count == 2
    plain = [SYSTEM, history, question]
    assert arrange(plain) == (plain, 1)
    # a system message after other content is session content: nothing moves
    late = [question, SYSTEM]
    assert arrange(late) == (late, 0)


@pytest.mark.anyio
@over_transports
async def test_marked_messages_are_sent_static_first_with_their_fingerprint() -> None:
    script = Script()
    async with _client(script, prompt_cache_key=True) as client:
        await client.chat(
            [turn(NOW), static(SYSTEM), static(DOCS), turn({"role": "user", "content": "q1"})]
        )
        await client.chat([static(SYSTEM), static(DOCS), turn({"role": "user", "content": "q2"})])
        other_docs = {"role": "user", "content": "Reference: another manual."}
        await client.chat(
            [static(SYSTEM), static(other_docs), turn({"role": "user", "content": "q2"})]
        )
    first = _sent(script, 0)
    assert [m["content"] for m in first["messages"]] == [
        SYSTEM["content"],
        DOCS["content"],
        NOW["content"],
        "q1",
    ]
    keys = [_sent(script, i)["prompt_cache_key"] for i in range(3)]
    # the static documents are part of the fingerprint; the turn content is not
    assert keys[0] == keys[1] != keys[2]


# --------------------------------------------------------------------------- the lint


@pytest.mark.anyio
@over_transports
async def test_volatile_content_in_the_static_prefix_warns_once_with_its_place() -> None:
    script = Script()
    async with _client(script) as client:
        with pytest.warns(
            VolatilePrefixWarning,
            match=r"a timestamp '2026-12-01T02:03:04' in messages\[1\] \(system\) at character 12",
        ) as caught:
            await client.chat([SYSTEM, NOW, {"role": "user", "content": "hi"}])
        assert len(caught) == 1 and "turn(" in str(caught[0].message)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            later = {"role": "system", "content": "The time is 2026-12-01T02:09:59Z."}
            await client.chat([SYSTEM, later, {"role": "user", "content": "hi"}])  # once
            # turn-marked and non-prefix content is not linted
            await client.chat([static(SYSTEM), turn(NOW), {"role": "user", "content": "10:11:12"}])
        with pytest.warns(VolatilePrefixWarning, match="a UUID"):
            uuid = {"role": "system", "content": "id 123e4567-e89b-12d3-a456-426614174000"}
            await client.chat([uuid, {"role": "user", "content": "hi"}])


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("It is 14:03:59 now.", "a timestamp"),
        ("Epoch 1764554584 seconds.", "a Unix timestamp"),
        ("This is turn 7 of the session.", "a counter"),
        ("Trace req_8fj2k1la93 follows.", "a random id"),
    ],
)
def test_the_lint_knows_each_kind(text: str, kind: str) -> None:
    from swiftclient.prompt_cache import PrefixLint
    from swiftclient.types import Message

    with pytest.warns(VolatilePrefixWarning, match=kind):
        PrefixLint().check([Message(role="system", content=text)], 1)


@pytest.mark.anyio
@over_transports
async def test_a_tool_description_with_volatile_content_warns_once() -> None:
    tool = {
        "type": "function",
        "function": {"name": "search", "description": "Index built at 2026-12-01 02:03:04."},
    }
    script = Script()
    async with _client(script) as client:
        with pytest.warns(VolatilePrefixWarning, match="the description of tool 'search'"):
            await client.chat("hi", tools=[tool])
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            await client.chat("hi", tools=[tool])


def test_a_stable_prefix_does_not_warn() -> None:
    from swiftclient.prompt_cache import PrefixLint
    from swiftclient.types import Message

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        PrefixLint().check(
            [
                Message(
                    role="system",
                    content="You answer in 3 sentences. Version 2 of the rules. Step 1: read. "
                    "Step 2: call 2 tools at most. Chapter 12:3 of the manual.",
                )
            ],
            1,
        )


# --------------------------------------------------------------------------- accounting


@pytest.mark.parametrize(
    "usage",
    [
        {"prompt_tokens": 100, "prompt_tokens_details": {"cached_tokens": 64}},
        {"prompt_tokens": 100, "prompt_cache_hit_tokens": 64, "prompt_cache_miss_tokens": 36},
        {"prompt_tokens": 100, "cache_read_input_tokens": 64, "cache_creation_input_tokens": 9},
        {"prompt_tokens": 100, "prompt_tokens_details": {}, "prompt_cache_hit_tokens": 64},
    ],
    ids=["openai", "deepseek", "anthropic-style", "empty-details"],
)
def test_usage_normalizes_cached_tokens(usage: dict[str, Any]) -> None:
    parsed = Usage.model_validate_json(json.dumps(usage))
    assert parsed.cached_tokens == 64
    assert parsed.prompt_tokens_details is not None
    assert parsed.prompt_tokens_details.cached_tokens == 64
    assert parsed.cache_write_tokens == (9 if "cache_creation_input_tokens" in usage else 0)
    assert Usage(prompt_tokens=3).cached_tokens == 0


def _reply(usage: dict[str, Any]) -> list[bytes]:
    return [
        chunk(role="assistant"),
        chunk("ok"),
        chunk(finish="stop"),
        sse({"id": "c", "choices": [], "usage": usage}),
        b"data: [DONE]\n\n",
    ]


@pytest.mark.anyio
@over_transports
async def test_cache_stats_give_a_hit_ratio_per_backend() -> None:
    a, b = Script(), Script()
    a.add(parts=_reply({"prompt_tokens": 100, "prompt_tokens_details": {"cached_tokens": 0}}))
    a.add(parts=_reply({"prompt_tokens": 100, "prompt_tokens_details": {"cached_tokens": 80}}))
    b.add(parts=_reply({"prompt_tokens": 50, "prompt_cache_hit_tokens": 25}))
    async with a.serve() as a_url, b.serve() as b_url:
        backends = {"a": backend_for(a_url, name="a"), "b": backend_for(b_url, name="b")}
        async with AsyncClient(backends=backends, model="m") as client:
            await client.chat("x", model="a/m")
            await client.chat("x", model="a/m")
            await client.chat("x", model="b/m", stream=True)
            stats = client.cache_stats(reset=True)
            assert client.cache_stats() == {}
    assert stats["a"].requests == 2 and stats["a"].hit_ratio == pytest.approx(0.4)
    assert stats["b"].cached_tokens == 25 and stats["b"].hit_ratio == pytest.approx(0.5)


# --------------------------------------------------------------------------- diagnosis


def _prefix(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> Any:
    return prompt_prefix(
        ChatRequest.model_validate({"model": "m", "messages": messages, "tools": tools})
    )


def test_an_appended_turn_is_no_break() -> None:
    one = [SYSTEM, {"role": "user", "content": "hi"}]
    two = [*one, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "more"}]
    assert diagnose(_prefix(one), _prefix(two)) is None


def test_a_changed_system_prompt_is_found_at_its_byte() -> None:
    one = [NOW, {"role": "user", "content": "hi"}]
    later = {"role": "system", "content": "The time is 2026-12-01T02:04:00Z."}
    found = diagnose(_prefix(one), _prefix([later, *one[1:], {"role": "user", "content": "x"}]))
    assert isinstance(found, PrefixBreak)
    assert found.segment == 1 and found.message_index == 0 and found.field == "content"
    segment = _prefix(one).segments[1]
    assert segment[: found.offset] == b'{"role":"system","content":"The time is 2026-12-01T02:0'
    assert found.prompt_offset == found.offset  # no tools block before it
    assert b"03:04" in found.before and b"04:00" in found.after
    assert "messages[0].content" in str(found)


def test_tool_calls_tools_and_removed_messages() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}}
    edited = {**call, "function": {"name": "f", "arguments": '{"a": 1}'}}
    base = [SYSTEM, {"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": [call]}]
    changed = [*base[:2], {"role": "assistant", "tool_calls": [edited]}]
    found = diagnose(_prefix(base), _prefix(changed))
    assert found is not None and found.message_index == 2
    assert found.field == "tool_calls[0].function.arguments"
    assert found.prompt_offset == len(b"".join(_prefix(base).segments[:3])) + found.offset
    tools = [{"type": "function", "function": {"name": "f", "description": "one"}}]
    other = [{"type": "function", "function": {"name": "f", "description": "two"}}]
    found = diagnose(_prefix(base, tools), _prefix(base, other))
    assert found is not None and found.segment == 0 and found.message_index is None
    assert found.field == "tools[0].function.description"
    removed = diagnose(_prefix(base), _prefix(base[:2]))
    assert removed is not None and removed.field == "(removed)" and removed.message_index == 2
