"""Every value of a rich Responses and Messages request replaced, one at a time, by a value
of another shape: the wires refuse each with their own ``ValueError`` naming the field
(a server answers it 400), never another exception (a 500). A fault run found a list as a
block's ``type`` and a number as a reasoning item's ``summary`` raising ``TypeError``."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest

from swiftclient.types import ChatRequest
from swiftclient.wire import messages, responses

IMAGE = "data:image/png;base64,AAAA"
MESSAGES: dict[str, Any] = {
    "model": "m",
    "max_tokens": 10,
    "system": [{"type": "text", "text": "s"}],
    "stop_sequences": ["x"],
    "metadata": {"user_id": "u"},
    "temperature": 0.5,
    "thinking": {"type": "enabled", "budget_tokens": 1024},
    "tools": [
        {
            "name": "f",
            "description": "d",
            "input_schema": {"type": "object", "properties": {"a": {"type": "string"}}},
        }
    ],
    "tool_choice": {"type": "tool", "name": "f"},
    "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}},
    "messages": [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "hi"},
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"},
                },
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "t", "signature": "s"},
                {"type": "redacted_thinking", "data": "x"},
                {"type": "text", "text": "a"},
                {"type": "tool_use", "id": "c1", "name": "f", "input": {"a": "b"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "c1",
                    "content": [{"type": "text", "text": "r"}],
                }
            ],
        },
    ],
}
RESPONSES: dict[str, Any] = {
    "model": "m",
    "instructions": "i",
    "max_output_tokens": 10,
    "temperature": 0.3,
    "reasoning": {"effort": "low"},
    "text": {
        "format": {"type": "json_schema", "name": "n", "schema": {"type": "object"}, "strict": True}
    },
    "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
    "tool_choice": {"type": "function", "name": "f"},
    "input": [
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "hi"},
                {"type": "input_image", "image_url": IMAGE},
            ],
        },
        {
            "type": "reasoning",
            "summary": [{"type": "summary_text", "text": "s"}],
            "encrypted_content": "e",
        },
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "o"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "x"}]},
        {"role": "user", "content": "more"},
    ],
}
OTHER_SHAPES: list[Any] = [["x"], {"k": 1}, 1, -1, 1.5, True, None, "", "zz", [], {}, [[1]]]
OTHER_SHAPES.append([{"type": ["t"]}])


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if prefix:
        yield prefix
    items = (
        value.items()
        if isinstance(value, dict)
        else enumerate(value)
        if isinstance(value, list)
        else ()
    )
    for key, inner in items:
        yield from _paths(inner, (*prefix, key))


def _replaced(body: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(body)
    node: Any = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = copy.deepcopy(value)
    return out


def _messages_fields(body: dict[str, Any]) -> dict[str, Any]:
    return messages.chat_fields(body, [])


def _responses_fields(body: dict[str, Any]) -> dict[str, Any]:
    return responses.chat_fields(body, [])[0]


@pytest.mark.parametrize(
    ("body", "convert"),
    [(MESSAGES, _messages_fields), (RESPONSES, _responses_fields)],
    ids=["messages", "responses"],
)
def test_every_field_of_another_shape_is_a_value_error(body: dict[str, Any], convert: Any) -> None:
    ChatRequest.model_validate(convert(copy.deepcopy(body)))  # the request as written is fine
    tried = 0
    for path in list(_paths(body)):
        for value in OTHER_SHAPES:
            tried += 1
            try:
                fields = convert(_replaced(body, path, value))
                ChatRequest.model_validate(fields)
            except ValueError:  # the wire's refusal, or the request's validation
                continue
            except Exception as exc:  # a 500 on a server
                raise AssertionError(f"{path} = {value!r}: {exc!r}") from exc
    assert tried > 500
