"""What one response may hold, checked before it is validated; the deadline after parsing;
a checkpoint after a large event.

Validating costs microseconds per choice or tool call: a 12 MB event of 300,000 choices used
to hold the event loop for seconds past the deadline. Such bodies are refused after reading
about a thousand items (``ResponseTooLarge``), whatever their size.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import pytest

from swiftclient import (
    APIResponseValidationError,
    AsyncClient,
    DeadlineExceeded,
    HTTPBackend,
    Price,
    Pricing,
    ResponseTooLarge,
    RetryPolicy,
    Timeout,
)
from swiftclient._deadline import Deadline
from swiftclient.admission import Limits
from swiftclient.backends.base import BufferedChunkIterator
from swiftclient.backends.http import MAX_DEPTH, _overfull
from swiftclient.transports._core import _ChatEncoder
from swiftclient.types import (
    MAX_CHOICES,
    MAX_TOOL_CALLS,
    ChatCompletionChunk,
    ChatRequest,
    Message,
    Usage,
)

from .mock import backend_for, serve_handler

pytestmark = pytest.mark.anyio
over_transports = pytest.mark.usefixtures("transport")
"""A test that reads a response runs over aiohttp and httpx, served on a loopback socket."""
SSE = {"content-type": "text/event-stream"}
# Far more than a limit, yet quick to build: on the old code each call validated them all.
MANY = 50_000


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _choice(index: int = 0, **delta: Any) -> dict[str, Any]:
    return {"index": index, "delta": delta, "finish_reason": None}


@asynccontextmanager
async def _backend(
    status: int, body: bytes, headers: dict[str, str] | None = None
) -> AsyncIterator[HTTPBackend]:
    """A backend over the ``transport`` fixture's transport, answered ``body`` (all of it,
    with its length) from a loopback socket."""

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, headers=headers or {}, content=body)

    async with serve_handler(handler) as base_url:
        yield backend_for(base_url, name="mock")


@asynccontextmanager
async def _client(body: bytes, *, stream: bool = True) -> AsyncIterator[AsyncClient]:
    headers = SSE if stream else {"content-type": "application/json"}
    async with (
        _backend(200, body, headers) as backend,
        AsyncClient(backend, model="m", retry=RetryPolicy.none(), stream_chat=stream) as client,
    ):
        yield client


def _tool_call(i: int) -> dict[str, Any]:
    return {"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": "{}"}}


@over_transports
async def test_a_stream_event_with_too_many_choices_is_refused_before_validation() -> None:
    event = _event({"id": "c", "choices": [_choice(0, content="x")] * MANY})
    async with _client(event + b"data: [DONE]\n\n") as client:
        with pytest.raises(ResponseTooLarge, match=f"more than {MAX_CHOICES} choices"):
            await client.chat("hi")


@over_transports
async def test_a_body_with_too_many_choices_is_refused_before_validation() -> None:
    choice = {"index": 0, "message": {"role": "assistant", "content": "x"}, "finish_reason": "stop"}
    body = json.dumps({"id": "c", "choices": [choice] * MANY}).encode()
    async with _client(body, stream=False) as client:
        with pytest.raises(ResponseTooLarge, match=f"more than {MAX_CHOICES} choices"):
            await client.chat("hi")


@over_transports
async def test_a_message_with_too_many_tool_calls_is_refused() -> None:
    message = {"role": "assistant", "tool_calls": [_tool_call(i) for i in range(MANY)]}
    body = json.dumps({"id": "c", "choices": [{"index": 0, "message": message}]}).encode()
    async with _client(body, stream=False) as client:
        with pytest.raises(ResponseTooLarge, match=f"more than {MAX_TOOL_CALLS} tool calls"):
            await client.chat("hi")


@over_transports
async def test_a_delta_with_too_many_tool_calls_is_refused() -> None:
    calls = [{"index": 0, "function": {"arguments": "{}"}}] * MANY
    event = _event({"id": "c", "choices": [_choice(0, tool_calls=calls)]})
    async with _client(event + b"data: [DONE]\n\n") as client:
        with pytest.raises(ResponseTooLarge, match="tool calls in one message"):
            await client.chat("hi")


@over_transports
@pytest.mark.parametrize(
    "choice",
    [
        pytest.param(_choice(MAX_CHOICES, content="x"), id="choice-index"),
        pytest.param(_choice(0, tool_calls=[{"index": MAX_TOOL_CALLS}]), id="tool-call-index"),
    ],
)
async def test_stream_indices_past_the_limits_are_refused(choice: dict[str, Any]) -> None:
    # One small event each, but a stream that numbers its choices or tool calls past the
    # limits would make the accumulated reply as large: refused like an over-long list.
    events = _event({"id": "c", "choices": [_choice(0, content="a")]}) + _event(
        {"id": "c", "choices": [choice]}
    )
    async with _client(events + b"data: [DONE]\n\n") as client:
        with pytest.raises(APIResponseValidationError, match="not a chat completion chunk"):
            await client.chat("hi")


@over_transports
async def test_lists_up_to_the_limits_pass() -> None:
    calls = [
        {"index": i, "id": f"c{i}", "function": {"name": "f", "arguments": "{}"}}
        for i in range(MAX_TOOL_CALLS)
    ]
    events = [
        _event({"id": "c", "choices": [_choice(i, content=f"{i},") for i in range(MAX_CHOICES)]}),
        _event({"id": "c", "choices": [_choice(0, tool_calls=calls)]}),
        _event({"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}),
    ]
    async with _client(b"".join(events) + b"data: [DONE]\n\n") as client:
        completion = await client.chat("hi")
    assert len(completion.choices) == MAX_CHOICES
    assert len(completion.tool_calls) == MAX_TOOL_CALLS
    assert completion.choices[7].message.content == "7,"


def test_the_scan_reads_the_structure_not_the_strings() -> None:
    def body(**fields: Any) -> bytes:
        return json.dumps(fields).encode()

    text = '"choices": [' + "," * 5000 + "] [[[[" * 300  # structure inside a string
    assert _overfull(body(choices=[{"message": {"content": text}}])) is None
    long_lists = {"logprobs": {"content": [{"t": "a"}] * 5000}, "x": [0] * 5000}
    assert _overfull(body(choices=[long_lists] * 2, extra=[0] * 5000)) is None
    assert _overfull(body(choices=[0] * (MAX_CHOICES + 1))) == "choices"
    spaced = b'{"choices" :\n [' + b"{}," * MAX_CHOICES + b"{}]}"
    assert _overfull(spaced) == "choices"
    tools: dict[str, Any] = {"tool_calls": [{}] * (MAX_TOOL_CALLS + 1)}
    assert _overfull(body(choices=[{"message": tools}])) == "tool calls"
    deep = b'{"x": ' + b"[1," * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1) + b"}"
    assert _overfull(deep) == "nesting"
    shallow = b'{"x": ' + b"[1," * (MAX_DEPTH - 2) + b"]" * (MAX_DEPTH - 2) + b"}"
    assert _overfull(shallow) is None


def test_a_malformed_body_is_left_to_the_parser() -> None:
    # An unterminated string (here one of escaped quotes, ending in a lone backslash) is
    # read to the end once: no quote inside it starts another scan to the end.
    commas = b"," * (MAX_CHOICES + 1)
    assert _overfull(commas + b'"' + b'\\"' * 50_000 + b"\\") is None
    assert _overfull(b'{"choices": [' + commas + b'"open') == "choices"


@over_transports
async def test_deep_nesting_is_a_validation_error() -> None:
    deep = b"[0," * 5000 + b"]" * 5000
    event = b'data: {"id": "c", "choices": [], "x": ' + deep + b"}\n\n"
    async with _client(event + b"data: [DONE]\n\n") as client:
        with pytest.raises(APIResponseValidationError, match="nested more than"):
            await client.chat("hi")


def _request() -> ChatRequest:
    return ChatRequest(model="m", messages=[Message(role="user", content="hi")])


class _Clock:
    """A deadline's clock that a test moves by hand."""

    def __init__(self, deadline: Deadline) -> None:
        self.at = deadline.started
        deadline.now = self

    def __call__(self) -> float:
        return self.at


@over_transports
async def test_the_deadline_is_checked_after_parsing_a_large_event() -> None:
    big = _event({"id": "c", "choices": [_choice(0, content="x" * 10_000)]})
    body = _event({"id": "c", "choices": [_choice(0, content="a")]}) + big
    deadline = Deadline(Timeout(total=10))
    clock = _Clock(deadline)
    async with (
        _backend(200, body, SSE) as backend,
        backend,
        backend.stream(_request(), deadline) as chunks,
    ):
        first = await chunks.__anext__()
        assert first.text == "a"
        clock.at = deadline.at  # parsing the next event used up the call's time
        with pytest.raises(DeadlineExceeded):
            await chunks.__anext__()


@over_transports
async def test_the_deadline_is_checked_after_parsing_a_whole_body() -> None:
    deadline = Deadline(Timeout(total=10))
    clock = _Clock(deadline)
    body = json.dumps({"id": "c", "choices": [{"message": {"content": "late"}}]}).encode()

    def handler(request: httpx.Request) -> httpx.Response:
        clock.at = deadline.at  # the answer arrives just as the deadline passes
        return httpx.Response(200, content=body)

    async with serve_handler(handler) as base_url, backend_for(base_url, name="mock") as backend:
        with pytest.raises(DeadlineExceeded):
            await backend.complete(_request(), deadline)


async def test_events_after_a_large_one_wait_for_a_checkpoint() -> None:
    # Both events arrive in one read: the second is handed out only after the loop ran.
    # An in-process httpx transport, not a socket: only it guarantees the one read.
    big = _event({"id": "c", "choices": [_choice(0, content="x" * (100 << 10))]})
    after = _event({"id": "c", "choices": [_choice(0, content="after")]})
    body = big + after + b"data: [DONE]\n\n"

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers=SSE, content=body)

    async with (
        HTTPBackend("http://x/v1", name="mock", transport=httpx.MockTransport(handler)) as backend,
        backend.stream(_request(), Deadline(Timeout(total=60))) as chunks,
    ):
        assert isinstance(chunks, BufferedChunkIterator)
        first = await chunks.__anext__()
        assert len(first.text) == 100 << 10
        assert chunks.next_nowait() is None  # not handed out without a checkpoint
        with anyio.CancelScope() as scope:
            scope.cancel()
            await chunks.__anext__()  # the checkpoint sees the cancellation
        assert scope.cancelled_caught
        second = await chunks.__anext__()
        assert second.text == "after"


_USAGE_FIELDS = [
    pytest.param({"prompt_tokens": 10**400}, id="huge"),
    pytest.param({"completion_tokens": -5}, id="negative"),
    pytest.param({"prompt_tokens_details": {"cached_tokens": -1}}, id="negative-cached"),
    pytest.param({"total_tokens": 2**53 + 1}, id="past-2-53"),
    pytest.param({"prompt_tokens": 1e20}, id="float-past-2-63"),
]


def _usage_reply(usage: object, stream: bool) -> bytes:
    if stream:
        return (
            _event({"id": "c", "choices": [_choice(0, content="hi")]})
            + _event({"id": "c", "choices": [], "usage": usage})
            + b"data: [DONE]\n\n"
        )
    message = {"role": "assistant", "content": "hi"}
    choice = {"index": 0, "message": message, "finish_reason": "stop"}
    return json.dumps({"id": "c", "choices": [choice], "usage": usage}).encode()


@asynccontextmanager
async def _priced_client(body: bytes, stream: bool) -> AsyncIterator[AsyncClient]:
    headers = SSE if stream else {"content-type": "application/json"}
    pricing = Pricing({"*": Price(per_input_token=0.001, per_output_token=0.002)})
    async with (
        _backend(200, body, headers) as backend,
        AsyncClient(
            backend,
            model="m",
            retry=RetryPolicy.none(),
            stream_chat=stream,
            pricing=pricing,
            limits=Limits(),
        ) as client,
    ):
        yield client


@over_transports
@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
@pytest.mark.parametrize("usage", _USAGE_FIELDS)
async def test_a_usage_count_out_of_range_is_dropped_and_the_reply_kept(
    usage: dict[str, Any], stream: bool, caplog: pytest.LogCaptureFixture
) -> None:
    # A provider's usage feeds pricing, the rate-limit learner and the token histograms, all
    # float arithmetic: a count past 2**53 raised OverflowError out of a call that had
    # succeeded, and a negative one a ConfigurationError blaming the caller. The reply is
    # kept, as one that reports no usage is.
    async with _priced_client(_usage_reply(usage, stream), stream) as client:
        with caplog.at_level(logging.WARNING, logger="swiftclient"):
            completion = await client.chat("hi")
    assert completion.text == "hi" and completion.usage is None
    assert "usage dropped" in caplog.text


@over_transports
@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
async def test_a_usage_of_the_wrong_shape_is_still_a_malformed_reply(stream: bool) -> None:
    async with _priced_client(_usage_reply("lots", stream), stream) as client:
        with pytest.raises(APIResponseValidationError):
            await client.chat("hi")


def test_usage_counts_up_to_2_53_are_taken() -> None:
    usage = Usage.model_validate({"prompt_tokens": 2**53, "completion_tokens": 0})
    assert usage.prompt_tokens == 2**53


@pytest.mark.parametrize(
    "extra",
    [
        {"prompt_cache_hit_tokens": -1, "prompt_tokens_details": {}},
        {"cache_read_input_tokens": 2**60},
        {"cache_creation_input_tokens": -2},
        {"cache_creation": {"ephemeral_1h_input_tokens": -3, "some_id": -7}},
    ],
)
def test_cache_counts_other_providers_name_are_read_only_in_range(extra: dict[str, Any]) -> None:
    # Read from the extras (DeepSeek's and Anthropic-style names): a negative count reached
    # pricing through the cache properties unchecked; out of range, it is not reported.
    usage = Usage.model_validate({"prompt_tokens": 9, **extra})
    assert (usage.cached_tokens, usage.cache_write_tokens, usage.cache_write_1h_tokens) == (
        0,
        0,
        0,
    )


def test_a_dropped_usage_chunk_does_not_reach_an_sdk_that_asked_for_none() -> None:
    """The usage-only chunk is left out for an SDK that did not ask for usage; with its
    usage dropped it went through as ``{"choices": [], "usage": null}``, and a loop reading
    ``chunk.choices[0]`` failed on it."""
    encoder = _ChatEncoder(usage=False)
    dropped = ChatCompletionChunk.model_validate(
        {"id": "c", "choices": [], "usage": {"prompt_tokens": -1}}
    )
    assert dropped.usage is None
    assert encoder.chunk(dropped) == b""
    assert _ChatEncoder(usage=True).chunk(dropped) != b""
