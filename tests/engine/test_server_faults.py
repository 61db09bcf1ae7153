"""Requests from a hostile or buggy client that the local server answered with a 500, or
with a 200 that broke what was asked (a fault run): each is a 4xx in its wire's own error
shape, and the server serves on."""

from __future__ import annotations

from typing import Any

import pytest

from ..conformance.tiny_local import TinyModel
from .test_server import Served, serve, tiny

__all__ = ["tiny"]  # the fixture, re-exported for pytest

pytestmark = pytest.mark.anyio
HI = [{"role": "user", "content": "hi"}]
# ``required`` must list names: a list or an object there made the engine's schema reading
# fail with "unhashable type" (a 500)
NOT_A_SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": [["a"]]}


@pytest.fixture
async def served(tiny: TinyModel, anyio_backend: str) -> Any:
    async with serve(tiny.engine()) as running:
        yield running


async def _refused(served: Served, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """POST ``body`` (streamed and not); both must be a 400; the error object."""
    error: dict[str, Any] = {}
    for stream in (False, True):
        response = await served.http.post(
            path, json={"model": "tiny-test", **body, "stream": stream}
        )
        assert response.status_code == 400, (path, stream, response.text)
        error = response.json()
        assert error == response.json()
    return error


async def test_a_schema_that_is_not_a_json_schema_is_400_on_every_wire(served: Served) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": NOT_A_SCHEMA}}
    tool = {"type": "function", "function": {"name": "f", "parameters": NOT_A_SCHEMA}}
    chat = "/v1/chat/completions"
    error = (await _refused(served, chat, {"messages": HI, "response_format": fmt}))["error"]
    assert error["param"] == "response_format"
    assert "cannot be compiled" in error["message"]
    assert "Expected string for 'required' item" in error["message"]
    for choice in ("required", {"type": "function", "function": {"name": "f"}}):
        body = {"messages": HI, "tools": [tool], "tool_choice": choice}
        error = (await _refused(served, chat, body))["error"]
        assert error["param"] == "tools" and "cannot be compiled" in error["message"]
    text = {"format": {"type": "json_schema", "name": "x", "schema": NOT_A_SCHEMA}}
    error = (await _refused(served, "/v1/responses", {"input": "hi", "text": text}))["error"]
    assert "cannot be compiled" in error["message"]
    messages = {"messages": HI, "max_tokens": 8}
    output = {"format": {"type": "json_schema", "schema": NOT_A_SCHEMA}}
    body = {**messages, "output_config": output}
    error = await _refused(served, "/v1/messages", body)
    assert error["type"] == "error" and "cannot be compiled" in error["error"]["message"]
    forced = {"type": "tool", "name": "f"}
    body = {
        **messages,
        "tools": [{"name": "f", "input_schema": NOT_A_SCHEMA}],
        "tool_choice": forced,
    }
    error = await _refused(served, "/v1/messages", body)
    assert error["error"]["type"] == "invalid_request_error"
    await served.settle()


@pytest.mark.parametrize(
    ("parameters", "said"),
    [
        ({"type": ["string", "null"]}, "got type ['string', 'null']"),
        ({"anyOf": [{"type": "string"}, {"type": "object"}]}, "an anyOf branch of type 'string'"),
    ],
)
async def test_a_tool_whose_arguments_may_be_no_object_is_400(
    served: Served, parameters: dict[str, Any], said: str
) -> None:
    # A forced call under such a schema came back as a 200 whose text held the raw
    # ``<tool_call>`` markup, finish_reason "stop" and no tool_calls.
    tool = {"type": "function", "function": {"name": "f", "parameters": parameters}}
    body = {"messages": HI, "tools": [tool], "tool_choice": "required"}
    error = (await _refused(served, "/v1/chat/completions", body))["error"]
    assert error["param"] == "tools" and "must be an object schema" in error["message"]
    assert said in error["message"]
    anthropic = {"name": "f", "input_schema": parameters}
    body = {"messages": HI, "max_tokens": 8, "tools": [anthropic], "tool_choice": {"type": "any"}}
    assert (
        "must be an object schema"
        in (await _refused(served, "/v1/messages", body))["error"]["message"]
    )


async def test_malformed_blocks_and_items_are_400_in_the_wires_shape(served: Served) -> None:
    turns = [
        *HI,
        {"role": "assistant", "content": [{"type": ["text"], "text": "x"}]},
        {"role": "user", "content": "hi"},
    ]
    error = await _refused(served, "/v1/messages", {"messages": turns, "max_tokens": 8})
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    output = {"output_config": {"format": {"type": "bogus"}}}
    error = await _refused(served, "/v1/messages", {"messages": HI, "max_tokens": 8, **output})
    assert error["error"]["message"].startswith("output_config.format must be")  # as sent
    items = [{"role": "user", "content": "hi"}, {"type": "reasoning", "summary": 1}]
    error = (await _refused(served, "/v1/responses", {"input": items}))["error"]
    assert error["param"] == "input[1].summary" and "must be a list of parts" in error["message"]
    items = [{"role": "user", "content": [{"type": "input_text"}]}]
    error = (await _refused(served, "/v1/responses", {"input": items}))["error"]
    # (it said parts of type 'input_text' were not supported)
    assert error["message"] == "input[0].content[0]: an input_text part needs text (a string)"
    assert error["param"] == "input[0].content[0].text"
    await served.settle()


@pytest.mark.parametrize(
    "field",
    [
        {"response_format": {"type": "json_object"}},
        {"tools": [{"type": "function", "function": {"name": "f"}}]},
        {"tool_choice": "required"},
        {"messages": HI},
    ],
)
async def test_chat_fields_on_the_text_api_are_400_not_dropped(
    served: Served, field: dict[str, Any]
) -> None:
    # They were dropped without a word: a reply that is no JSON and no call, as a 200.
    body = {"prompt": "hi", "max_tokens": 5, **field}
    error = (await _refused(served, "/v1/completions", body))["error"]
    (name,) = field
    assert error["param"] == name and "use /v1/chat/completions" in error["message"]


async def test_a_failing_messages_handler_answers_in_anthropics_shape(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    import local_engine.server

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a fault in the handler")

    monkeypatch.setattr(local_engine.server, "message_body", broken)
    body = {"model": "tiny-test", "messages": HI, "max_tokens": 4}
    response = await served.http.post("/v1/messages", json=body)
    assert response.status_code == 500
    # It was OpenAI's {"error": {"code": "internal_error", ...}}, which Anthropic's SDK
    # cannot read.
    assert response.json()["type"] == "error"
    assert response.json()["error"]["type"] == "api_error"
    assert "fault in the handler" not in response.text  # the reason stays in the log
    await served.settle()


@pytest.mark.parametrize(
    ("field", "param", "said"),
    [
        (
            {"messages": [{"role": "user", "content": 5}]},
            "messages.0.content",
            "messages.0.content: Input should be a valid string, or a valid list",
        ),
        (
            {"messages": HI, "stop": 5},
            "stop",
            "stop: Input should be a valid string, or a valid list",
        ),
    ],
)
async def test_a_value_no_branch_of_a_union_takes_is_named_by_its_field(
    served: Served, field: dict[str, Any], param: str, said: str
) -> None:
    # It named the first branch pydantic tried (param ``messages.0.content.str``, "Input
    # should be a valid string (and 1 more error)").
    error = (await _refused(served, "/v1/chat/completions", field))["error"]
    assert error["param"] == param and said in error["message"]
    assert "more error" not in error["message"]


async def test_an_image_to_the_text_only_model_is_named_as_every_wire_sent_it(
    served: Served,
) -> None:
    # It said "a message has a 'image_url' content part": the chat form the Messages
    # `image` block and the Responses `input_image` part became on the way in.
    url = "https://example.invalid/a.png"
    image = {"type": "image", "source": {"type": "url", "url": url}}
    turns = [{"role": "user", "content": [image, {"type": "text", "text": "what?"}]}]
    error = await _refused(served, "/v1/messages", {"messages": turns, "max_tokens": 8})
    assert error["error"]["message"] == "this local model is text-only; a message holds an image"
    parts = [{"type": "input_image", "image_url": url}, {"type": "input_text", "text": "what?"}]
    items = [{"role": "user", "content": parts}]
    error = (await _refused(served, "/v1/responses", {"input": items}))["error"]
    assert error["message"] == "this local model is text-only; a message holds an image"
