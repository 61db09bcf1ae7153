"""What the fake provider sends on OpenAI's Responses wire (``/v1/responses``), without I/O.

The request is read as the local server reads it (:func:`swiftclient.wire.responses.chat_fields`),
a reply planned as on the chat route (:func:`~._events.plan_reply`) and rendered through
the same translation the servers use: a ``response`` object, or its event stream. A
reply's ``thinking`` text becomes a ``reasoning`` output item first, with an
``encrypted_content`` when the request includes ``reasoning.encrypted_content``; a
reasoning item sent back in ``input`` must carry the encrypted content the fake gave it,
unchanged, as OpenAI checks it (a stateless request cannot refer to it by id alone).

Unlike the local server, the fake accepts ``previous_response_id`` and ``store`` (it keeps
nothing; the request is recorded for the test to check).
"""

from __future__ import annotations

import hashlib
from typing import Any

from ..types import ChatCompletion, ChatCompletionChunk
from ..wire.responses import (
    ResponseEcho,
    ResponseEvents,
    ResponsesRequestError,
    chat_fields,
    event_bytes,
    response_body,
)
from ._events import Plan, completion_body
from ._reply import Reply

__all__ = [
    "ResponsesRequestError",
    "ResponsesTurn",
    "check_reasoning_items",
    "responses_error",
]

_ENCRYPTED = "reasoning.encrypted_content"


def responses_error(
    status: int, message: str, *, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """OpenAI's error body, as the Responses API answers it."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def _sealed(item_id: str, summary: str) -> str:
    """The fake's ``encrypted_content`` for a reasoning item: bound to its id and text."""
    return "fake-enc-" + hashlib.sha256(f"{item_id}\0{summary}".encode()).hexdigest()


def _summary_text(item: dict[str, Any]) -> str:
    return "".join(
        part.get("text", "") for part in item.get("summary") or () if isinstance(part, dict)
    )


def check_reasoning_items(body: dict[str, Any]) -> tuple[int, dict[str, Any]] | None:
    """The error OpenAI answers for a reasoning item in ``input`` it cannot use, or None:
    404 for one with no ``encrypted_content`` on an unstored request (nothing to look it
    up by), 400 for one whose encrypted content is not what the fake sent with it."""
    items = body.get("input")
    if not isinstance(items, list):
        return None
    for index, item in enumerate(items):
        if not isinstance(item, dict) or item.get("type") != "reasoning":
            continue
        where = f"input[{index}]"
        sealed = item.get("encrypted_content")
        if sealed is None:
            message = (
                f"Item with id '{item.get('id')}' not found. Items are not persisted when "
                "`store` is set to false. Try again with `store` set to true, or send the "
                "item's encrypted_content (include reasoning.encrypted_content)."
            )
            return 404, responses_error(404, message, param="input")
        if sealed != _sealed(str(item.get("id")), _summary_text(item)):
            message = f"The encrypted content for item {item.get('id')} could not be verified."
            return 400, responses_error(400, message, param=where, code="invalid_encrypted_content")
    return None


class ResponsesTurn:
    """One request to the Responses route: its chat form, and the reply rendered back."""

    def __init__(self, body: dict[str, Any], model: str, seq: int) -> None:
        """Read ``body``; :class:`ResponsesRequestError` when it cannot be served."""
        stateless = {k: v for k, v in body.items() if k not in ("previous_response_id",)}
        self.chat, fields = chat_fields(stateless, [])
        fields["store"] = body.get("store", True) is not False
        fields["previous_response_id"] = body.get("previous_response_id")
        self._echo = ResponseEcho(model, fields)
        self._model = model
        self._seq = seq
        include = body.get("include") or []
        self._encrypted = _ENCRYPTED in include
        self.stream = body.get("stream") is True

    def reasoning(self, reply: Reply) -> list[dict[str, Any]]:
        """The reasoning output item a reply's ``thinking`` stands for (none without)."""
        if reply.thinking is None:
            return []
        item_id = f"rs_fake_{self._seq}"
        summary = [{"type": "summary_text", "text": reply.thinking}]
        item: dict[str, Any] = {"id": item_id, "type": "reasoning", "summary": summary}
        if self._encrypted:
            item["encrypted_content"] = _sealed(item_id, reply.thinking)
        return [item]

    def body(self, plan: Plan, reply: Reply) -> dict[str, Any]:
        """The whole ``response`` object."""
        completion = ChatCompletion.model_validate(
            completion_body(plan, completion_id=self._echo.id, model=self._model, created=0)
        )
        return response_body(completion, self._echo, self.reasoning(reply))

    def events(self, plan: Plan, reply: Reply) -> tuple[bytes, list[bytes], bytes]:
        """The event stream: the opening events (with the reasoning item), one step per
        content or tool-call chunk, and the closing events."""
        events = ResponseEvents(self._echo)
        opening = events.start()
        for item in self.reasoning(reply):
            opening.extend(events.reasoning(item))
        steps = [
            b"".join(map(event_bytes, events.feed(_chunk({"content": text}))))
            for text in plan.content_chunks
        ]
        for index, call in enumerate(plan.tool_calls):
            first = {"index": index, "id": call.id, "function": {"name": call.name}}
            steps.append(b"".join(map(event_bytes, events.feed(_chunk({"tool_calls": [first]})))))
            for piece in call.argument_pieces():
                delta = {"tool_calls": [{"index": index, "function": {"arguments": piece}}]}
                steps.append(b"".join(map(event_bytes, events.feed(_chunk(delta)))))
        closing = events.feed(_chunk({}, plan.finish_reason))
        closing.extend(events.feed(ChatCompletionChunk.model_validate({"usage": plan.usage})))
        return b"".join(map(event_bytes, opening)), steps, b"".join(map(event_bytes, closing))

    def error_event(self, message: str) -> bytes:
        """An ``error`` event, for a stream that breaks off."""
        event = {"type": "error", "code": "server_error", "message": message, "param": None}
        return event_bytes({**event, "sequence_number": 0})


def _chunk(delta: dict[str, Any], finish: str | None = None) -> ChatCompletionChunk:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return ChatCompletionChunk.model_validate({"choices": [choice]})
