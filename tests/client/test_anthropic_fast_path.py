"""The Messages wire's text-delta fast path gives exactly the slow path's chunks.

A ``content_block_delta`` event carrying a ``text_delta``, written as the API writes it, is
recognised from its bytes and only its text's JSON string is decoded
(:meth:`MessageDecoder.text_delta`); every other event, and any text delta written another
way, goes through the full JSON decode (:meth:`MessageDecoder.event`). These tests hold the
two paths to the same chunks (values and fields set) for many texts and shapes, sans-IO and
through whole streams on asyncio and trio.
"""

from __future__ import annotations

import copy
import json
import pickle
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pydantic
import pydantic_core
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swiftclient import AnthropicBackend, AsyncClient
from swiftclient._accumulate import Accumulator
from swiftclient.backends.anthropic import MessageDecoder
from swiftclient.backends.http import TextChunks, text_chunk
from swiftclient.testing import FakeProvider, Reply
from swiftclient.types import ChatCompletionChunk, ChoiceDelta, ChunkChoice

KEY = "sk-ant-api03-fast-path-key-0123456789"
HEAD = b'{"type":"content_block_delta","index":%d,"delta":{"type":"text_delta","text":'

TEXTS = [
    "",
    " hello",
    "Hello, world!",
    "line\nbreak\r\nand\ttab",
    'a "quoted" word',
    "back\\slash \\n not a newline",
    "\\",
    '"',
    '\\"',
    "é ü ß 中文 日本語",
    "emoji 🎉 and 👩‍💻 (surrogate pairs when escaped)",
    "\u2028\u2029 separators",
    "\x00\x01\x1f controls",
    "\x7f del",
    "}}",
    '"}}',
    ',"extra":"key"',
    "a" * 5000,
]


def sig(chunk: ChatCompletionChunk | None) -> Any:
    """Everything that tells two chunks apart: values and, at each level, the fields set."""
    if chunk is None:
        return None
    choices = [
        (
            choice.model_dump(),
            choice.model_fields_set,
            choice.delta.model_fields_set,
            choice.delta.__pydantic_extra__,
        )
        for choice in chunk.choices
    ]
    return (chunk.model_dump(), chunk.model_fields_set, chunk.__pydantic_extra__, choices)


def started(index: int = 0, message_id: str = "msg_01", model: str = "claude-x") -> MessageDecoder:
    """A decoder after ``message_start`` and a text block's ``content_block_start``."""
    decoder = MessageDecoder()
    message = {"id": message_id, "model": model, "usage": {"input_tokens": 3}}
    decoder.event("message_start", {"type": "message_start", "message": message})
    block = {"type": "content_block_start", "index": index, "content_block": {"type": "text"}}
    decoder.event("content_block_start", block)
    return decoder


def slow(decoder: MessageDecoder, data: bytes) -> Any:
    """The full path's chunk (or the error it raises) for one content_block_delta."""
    try:
        return sig(decoder.event("content_block_delta", pydantic_core.from_json(data)))
    except ValueError as exc:
        return type(exc)


def both(data: bytes, index: int = 0) -> tuple[ChatCompletionChunk | None, Any, Any]:
    """(the fast path's chunk, its signature or the slow path's when it declined, the slow
    path's), each decoder fresh."""
    fast = started(index).text_delta(data)
    expected = slow(started(index), data)
    got = sig(fast) if fast is not None else expected
    return fast, got, expected


def text_event(text: str, index: int = 0, ascii_only: bool = False) -> bytes:
    literal = json.dumps(text, ensure_ascii=ascii_only).encode()
    return HEAD % index + literal + b"}}"


@pytest.mark.parametrize("ascii_only", [False, True], ids=["utf8", "escaped"])
@pytest.mark.parametrize("text", TEXTS, ids=range(len(TEXTS)))
def test_the_fast_path_takes_text_deltas_and_gives_the_slow_paths_chunk(
    text: str, ascii_only: bool
) -> None:
    data = text_event(text, ascii_only=ascii_only)
    fast, got, expected = both(data)
    assert fast is not None  # the API's own shape is taken by the fast path
    assert fast.choices[0].delta.content == text
    assert got == expected
    assert sig(fast) == sig(text_chunk("msg_01", "claude-x", text))


@settings(max_examples=300, deadline=None)
@given(text=st.text(), index=st.integers(0, 1000), ascii_only=st.booleans())
def test_any_text_gives_the_same_chunk_on_both_paths(
    text: str, index: int, ascii_only: bool
) -> None:
    fast, got, expected = both(text_event(text, index, ascii_only), index)
    assert fast is not None
    assert got == expected


@settings(max_examples=300, deadline=None)
@given(literal=st.binary(max_size=40) | st.text(max_size=40).map(str.encode))
def test_any_bytes_in_the_texts_place_give_the_same_outcome(literal: bytes) -> None:
    """Raw bytes where the JSON string goes (quotes, escapes, invalid UTF-8, anything): the
    fast path either gives the slow path's chunk or declines, never another chunk."""
    for wrapped in (literal, b'"' + literal + b'"'):
        _, got, expected = both(HEAD % 0 + wrapped + b"}}")
        assert got == expected


ESCAPES = [
    rb'"\n\"\\\/\b\f\r\t"',
    rb'"\u00e9\u4e2d\u0000"',
    rb'"\ud83c\udf89 party"',  # a surrogate pair: one character
    rb'"\uD83D\uDC69\u200D\uD83D\uDCBB"',  # upper-case hex, a ZWJ sequence
    rb'"lone \ud800 high"',
    rb'"lone \udc00 low"',
    rb'"\ud800\ud800 two highs"',
    rb'"\u12"',  # truncated escape: not JSON
    rb'"\x"',  # unknown escape: not JSON
    rb'"raw\nnewline"'.replace(rb"\n", b"\n"),  # a raw control character: not JSON
    b'"\xff\xfe invalid utf-8"',
    b'"\xe4\xb8"',  # a truncated UTF-8 sequence
    rb'"a","x":"b"',  # two strings: an extra key in disguise
    rb'"a"}}',
    rb'"unterminated\"',
    rb'"',
    rb"",
    rb"null",
    rb"123",
    rb'["a"]',
]


@pytest.mark.parametrize("literal", ESCAPES, ids=range(len(ESCAPES)))
def test_escapes_and_malformed_strings_give_the_same_outcome(literal: bytes) -> None:
    fast, got, expected = both(HEAD % 0 + literal + b"}}")
    assert got == expected
    try:
        one_string = isinstance(pydantic_core.from_json(literal), str)
    except ValueError:
        one_string = False
    assert (fast is not None) == one_string  # every valid JSON string, and only that


def test_a_surrogate_pair_decodes_to_one_character() -> None:
    fast = started().text_delta(HEAD % 0 + rb'"\ud83c\udf89"' + b"}}")
    assert fast is not None and fast.choices[0].delta.content == "🎉"


_HI = b'{"type":"text_delta","text":"hi"}'
OTHER_SHAPES = {
    "keys reordered": b'{"index":0,"type":"content_block_delta","delta":' + _HI + b"}",
    "delta keys reordered": b'{"type":"content_block_delta","index":0,"delta":'
    + b'{"text":"hi","type":"text_delta"}}',
    "index last": b'{"type":"content_block_delta","delta":' + _HI + b',"index":0}',
    "extra delta key": b'{"type":"content_block_delta","index":0,"delta":'
    + b'{"type":"text_delta","text":"hi","x":1}}',
    "extra key": b'{"type":"content_block_delta","index":0,"delta":' + _HI + b',"x":1}',
    "trailing space": b'{"type":"content_block_delta","index":0,"delta":' + _HI + b"} ",
    "spaces": json.dumps(json.loads((HEAD % 0) + b'"hi"}}')).encode(),
    "another index": b'{"type":"content_block_delta","index":1,"delta":' + _HI + b"}",
    "leading zero": b'{"type":"content_block_delta","index":00,"delta":' + _HI + b"}",
    "null text": (HEAD % 0) + b"null}}",
    "number text": (HEAD % 0) + b"7}}",
    "thinking": b'{"type":"content_block_delta","index":0,"delta":'
    + b'{"type":"thinking_delta","thinking":"x"}}',
    "tool input": b'{"type":"content_block_delta","index":0,"delta":'
    + b'{"type":"input_json_delta","partial_json":"{"}}',
    "signature": b'{"type":"content_block_delta","index":0,"delta":'
    + b'{"type":"signature_delta","signature":"s"}}',
    "citation": b'{"type":"content_block_delta","index":0,"delta":'
    + b'{"type":"citations_delta","citation":{}}}',
    "ping": b'{"type":"ping"}',
}


@pytest.mark.parametrize("data", OTHER_SHAPES.values(), ids=OTHER_SHAPES.keys())
def test_other_shapes_take_the_slow_path(data: bytes) -> None:
    fast, got, expected = both(data)
    assert fast is None
    assert got == expected


def test_only_the_latest_started_text_block_is_taken() -> None:
    data = text_event("hi", index=0)
    decoder = MessageDecoder()
    assert decoder.text_delta(data) is None  # no block started
    decoder = started(index=0)
    assert decoder.text_delta(data) is not None
    tool = {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {}}
    decoder.event("content_block_start", {"index": 1, "content_block": tool})
    assert decoder.text_delta(data) is None  # a later block started: the full path
    assert sig(decoder.event("content_block_delta", json.loads(data))) == sig(
        text_chunk("msg_01", "claude-x", "hi")
    )
    # a block index started again as another kind: the full path, which drops the text
    decoder = started(index=0)
    decoder.event("content_block_start", {"index": 0, "content_block": tool})
    assert decoder.text_delta(data) is None
    assert decoder.event("content_block_delta", json.loads(data)) is None


@pytest.mark.parametrize(
    ("message_id", "model"), [("", ""), ('msg_"q\\', "claude/é"), ("msg_\U0001f389", "m\n")]
)
def test_the_chunk_template_carries_any_id_and_model(message_id: str, model: str) -> None:
    fast = TextChunks(message_id, model).chunk(b'"hi"')
    assert sig(fast) == sig(text_chunk(message_id, model, "hi"))


# ------------------------------------------------- chunks assembled without validation


def everything(chunk: ChatCompletionChunk) -> Any:
    """All a user can see of a chunk: its type, values, fields set and extras at each level,
    each level's ``__dict__`` in order, private state, repr and both serializations."""
    choice = chunk.choices[0]
    models = (chunk, choice, choice.delta)
    return (
        [type(model) for model in models],
        [list(model.__dict__.items()) for model in models],
        [model.model_fields_set for model in models],
        [model.model_extra for model in models],
        [object.__getattribute__(model, "__pydantic_private__") for model in models],
        repr(chunk),
        str(chunk),
        chunk.model_dump(),
        chunk.model_dump(exclude_unset=True),
        chunk.model_dump(exclude_defaults=True),
        chunk.model_dump_json(),
        chunk.model_dump_json(exclude_unset=True),
        chunk.text,
        chunk.has_content(),
    )


SLOTS = ("__dict__", "__pydantic_fields_set__", "__pydantic_extra__", "__pydantic_private__")


def test_the_assembled_models_have_nothing_validation_would_add() -> None:
    """TextChunks sets the four slots validation sets, through BaseModel's descriptors: a
    model class with a post-init hook or private attributes would need more, so these must
    have none, and their slots must be BaseModel's."""
    for cls in (ChatCompletionChunk, ChunkChoice, ChoiceDelta):
        assert cls.__pydantic_post_init__ is None
        assert cls.__private_attributes__ == {}
        assert not cls.__pydantic_root_model__
        assert cls.model_config.get("extra") == "allow"
        # the slots are BaseModel's, whose descriptors TextChunks writes through
        for slot in SLOTS:
            assert [k for k in cls.__mro__ if slot in vars(k)][0] is pydantic.BaseModel


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(),
    message_id=st.text(max_size=30),
    model=st.text(max_size=30),
    created=st.integers(0, 2**40),
)
def test_an_assembled_chunk_is_the_validated_chunk(
    text: str, message_id: str, model: str, created: int
) -> None:
    chunks = TextChunks(message_id, model, created)
    fast = chunks.text(text)
    validated = text_chunk(message_id, model, text, created)
    assert fast == validated
    assert everything(fast) == everything(validated)
    assert sig(fast) == sig(validated)
    # it survives every round trip a validated chunk does, unchanged
    assert ChatCompletionChunk.model_validate_json(fast.model_dump_json()) == validated
    assert ChatCompletionChunk.model_validate(fast.model_dump()) == validated
    assert everything(pickle.loads(pickle.dumps(fast))) == everything(validated)
    assert everything(copy.deepcopy(fast)) == everything(validated)
    assert everything(fast.model_copy(deep=True)) == everything(validated)
    assert ChatCompletionChunk.model_validate(fast) is fast  # an instance, as validated


def test_assembled_chunks_share_nothing_a_user_can_change() -> None:
    chunks = TextChunks("msg_1", "claude-x")
    first, second = chunks.text("a"), chunks.text("b")
    for one, two in [
        (first, second),
        (first.choices[0], second.choices[0]),
        (first.choices[0].delta, second.choices[0].delta),
    ]:
        assert one.__dict__ is not two.__dict__
        assert one.model_fields_set is not two.model_fields_set
        assert one.model_extra is not two.model_extra
    assert first.choices is not second.choices
    # changing one chunk (fields, fields set, extras) changes it as it changes a validated
    # chunk, and leaves the other chunks as they were
    validated = text_chunk("msg_1", "claude-x", "a")
    for chunk in (first, validated):
        chunk.id = "changed"
        chunk.system_fingerprint = "fp"
        chunk.choices[0].delta.role = "assistant"
        chunk.choices[0].finish_reason = "stop"
        chunk.surprise = 1  # type: ignore[attr-defined]  # extra="allow"
        chunk.choices[0].delta.refusal = "no"
        chunk.choices.append(ChunkChoice(index=1))
    assert everything(first) == everything(validated)
    assert everything(chunks.text("c")) == everything(text_chunk("msg_1", "claude-x", "c"))
    assert everything(second) == everything(text_chunk("msg_1", "claude-x", "b"))


def test_assembled_and_validated_chunks_accumulate_alike() -> None:
    texts = ["Hello", ", ", "", "wörld 🎉", "\n"]
    chunks = TextChunks("msg_acc", "claude-acc", 7)
    fast, validated = Accumulator(), Accumulator()
    for text in texts:
        assert fast.add(chunks.text(text)) == validated.add(
            text_chunk("msg_acc", "claude-acc", text, 7)
        )
    assert fast.build() == validated.build()
    assert fast.build().choices[0].message.content == "".join(texts)


# --------------------------------------------------------------------------- whole streams


def sse(kind: str, data: dict[str, Any], **dumps: Any) -> bytes:
    dumps.setdefault("separators", (",", ":"))
    dumps.setdefault("ensure_ascii", False)
    return f"event: {kind}\ndata: {json.dumps(data, **dumps)}\n\n".encode()


def delta(index: int, kind: str, **fields: Any) -> dict[str, Any]:
    """A content_block_delta event's data, keys in the API's order."""
    body = {"type": kind, **fields}
    return {"type": "content_block_delta", "index": index, "delta": body}


def text_delta(index: int, text: str) -> dict[str, Any]:
    return delta(index, "text_delta", text=text)


def block(kind: str, index: int, content: dict[str, Any] | None = None) -> bytes:
    """A content_block_start (with ``content``) or content_block_stop event."""
    data: dict[str, Any] = {"type": kind, "index": index}
    if content is not None:
        data["content_block"] = content
    return sse(kind, data)


def mixed_stream() -> bytes:
    """Text blocks around thinking and tool blocks, pings, and text deltas written the
    API's way and other ways."""
    thinking = {"type": "thinking", "thinking": "", "signature": ""}
    tool = {"type": "tool_use", "id": "toolu_9", "name": "weather", "input": {}}
    usage = {"input_tokens": 9, "cache_read_input_tokens": 4}
    message = {"id": "msg_mix", "model": "claude-mix", "usage": usage}
    reordered = {"index": 1, "delta": {"text": "reordered", "type": "text_delta"}}
    parts = [
        sse("message_start", {"type": "message_start", "message": message}),
        sse("ping", {"type": "ping"}),
        block("content_block_start", 0, thinking),
        sse("content_block_delta", delta(0, "thinking_delta", thinking='hmm "é"')),
        sse("content_block_delta", delta(0, "signature_delta", signature="c2ln")),
        block("content_block_stop", 0),
        block("content_block_start", 1, {"type": "text", "text": ""}),
    ]
    for i, text in enumerate(TEXTS):
        parts.append(sse("content_block_delta", text_delta(1, text), ensure_ascii=bool(i % 2)))
    parts += [
        sse("ping", {"type": "ping"}),
        sse("content_block_delta", text_delta(1, "spaced"), separators=(", ", ": ")),
        sse("content_block_delta", {**reordered, "type": "content_block_delta"}),
        sse("content_block_delta", {**text_delta(1, "extra"), "x": [1]}),
        block("content_block_stop", 1),
        block("content_block_start", 2, tool),
        sse("content_block_delta", delta(2, "input_json_delta", partial_json='{"city": "S')),
        sse("content_block_delta", delta(2, "input_json_delta", partial_json='F\\u00e9"}')),
        sse("content_block_delta", text_delta(2, "text for a tool block")),
        block("content_block_stop", 2),
        sse(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "tool_use"},
                "usage": {"output_tokens": 42},
            },
        ),
        sse("message_stop", {"type": "message_stop"}),
    ]
    return b"".join(parts)


def replay(body: bytes, split: int) -> AnthropicBackend:
    """A backend answering every request with ``body``, sent in pieces of ``split`` bytes."""

    async def pieces() -> AsyncIterator[bytes]:
        for at in range(0, len(body), split):
            yield body[at : at + split]

    def handler(request: httpx.Request) -> httpx.Response:
        headers = {"content-type": "text/event-stream"}
        return httpx.Response(200, content=pieces(), headers=headers)

    return AnthropicBackend(
        "http://replay.test", api_key=KEY, transport=httpx.MockTransport(handler)
    )


async def collect(backend: AnthropicBackend) -> tuple[list[Any], Any]:
    async with AsyncClient(backends={"a": backend}, model="a/claude-mix") as client:
        async with client.stream(messages="hi") as stream:
            chunks = [sig(chunk) async for chunk in stream]
            completion = await stream.final()
    return chunks, completion.model_dump()


def slow_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(MessageDecoder, "text_delta", lambda self, data: None)


def count_fast(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether each text_delta call took the fast path, as streams call it."""
    taken: list[bool] = []
    fast_delta = MessageDecoder.text_delta

    def counting(self: MessageDecoder, data: bytes) -> ChatCompletionChunk | None:
        chunk = fast_delta(self, data)
        taken.append(chunk is not None)
        return chunk

    monkeypatch.setattr(MessageDecoder, "text_delta", counting)
    return taken


@pytest.mark.anyio
@pytest.mark.parametrize("split", [1 << 20, 7, 1])
async def test_a_mixed_stream_gives_the_same_chunks_on_both_paths(
    monkeypatch: pytest.MonkeyPatch, split: int
) -> None:
    body = mixed_stream()
    taken = count_fast(monkeypatch)
    fast = await collect(replay(body, split))
    assert sum(taken) == len(TEXTS)  # every API-shaped text delta took the fast path
    slow_path(monkeypatch)
    assert await collect(replay(body, split)) == fast
    message = fast[1]["choices"][0]["message"]
    assert message["content"] == "".join(TEXTS) + "spacedreorderedextra"
    assert message["tool_calls"][0]["function"]["arguments"] == '{"city": "SF\\u00e9"}'


@pytest.mark.anyio
async def test_the_fake_providers_stream_gives_the_same_chunks_on_both_paths(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    text = 'Unicode é 中文 🎉, quotes " and \\ backslashes,\nnew lines\tand tabs. ' * 3

    async def through_a_fresh_fake() -> tuple[list[Any], Any]:
        async with FakeProvider() as fake:  # the same message id each time
            fake.script(Reply(text=text))
            return await collect(AnthropicBackend(fake.base_url, api_key=KEY))

    taken = count_fast(monkeypatch)
    fast = await through_a_fresh_fake()
    assert taken and all(taken)  # every text delta the fake sent took the fast path
    slow_path(monkeypatch)
    assert await through_a_fresh_fake() == fast
    assert fast[1]["choices"][0]["message"]["content"] == text
