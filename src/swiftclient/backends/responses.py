"""The OpenAI Responses API (``POST /responses``) as a second OpenAI wire, stateless.

:class:`ResponsesBackend` is an :class:`~swiftclient.backends.http.HTTPBackend` (the same
transport, pool, deadline, retries, telemetry and error mapping) that sends the chat
contract as a Responses request and decodes the reply back into the same
:class:`~swiftclient.types.ChatCompletion` and chunk stream:

- messages become ``input`` items (system and developer messages keep their role; text and
  image parts become ``input_text`` / ``input_image``; an assistant's ``tool_calls`` become
  ``function_call`` items and tool messages ``function_call_output`` items); tools the flat
  function form; ``tool_choice`` the Responses form; ``response_format`` ``text.format``;
  ``max_completion_tokens`` (else ``max_tokens``) ``max_output_tokens``;
  ``reasoning_effort`` ``reasoning.effort``; ``logprobs`` ``include`` of
  ``message.output_text.logprobs`` (``top_logprobs`` as it is); ``store`` is false unless
  the backend is made with ``store=True`` (nothing kept on the provider's side); other
  fields pass as they are (``n`` too: a provider without it refuses it);
- a ``message`` item's text is the content, ``function_call`` items the tool calls (their
  ``call_id`` the call id), reasoning text ``reasoning_content``, the text's logprobs
  ``logprobs.content``; ``status: incomplete``
  for ``max_output_tokens`` is ``finish_reason="length"``; usage maps ``input_tokens``,
  ``input_tokens_details.cached_tokens``, ``output_tokens`` and reasoning tokens;
- the event stream (``response.output_text.delta``, ``response.output_item.added`` for a
  call, ``response.function_call_arguments.delta``, reasoning deltas, then
  ``response.completed`` / ``response.incomplete``) decodes into the same chunks, the usage
  chunk last; ``response.failed`` and ``error`` events are a
  :class:`~swiftclient.StreamError`.

Reasoning across turns, statelessly: a reasoning request (``reasoning`` set, or reasoning
items in the conversation) that is not stored asks for ``reasoning.encrypted_content``;
the reply's ``reasoning`` items are the message's ``reasoning_items``, exactly as received
(streamed: each from its ``response.output_item.done``, where the encrypted content is
whole), and an assistant message's ``reasoning_items`` go back as input items, unchanged,
before its text and calls. Server-side state is opt-in: ``ResponsesBackend(store=True)``
and ``extra_body={"previous_response_id": ...}``.
"""

from __future__ import annotations

import json
from collections import deque
from typing import Any

import pydantic_core

from .. import errors
from .._canonical import CallEncoding
from .._deadline import Deadline
from ..types import ChatCompletion, ChatCompletionChunk, ChatRequest
from .base import RequestOptions
from .http import (
    NO_IDS,
    HTTPBackend,
    TextChunks,
    _ChunkStream,
    _inband_error,
    _Response,
    _stream_error,
)

__all__ = ["ResponsesBackend", "chat_completion", "responses_body"]

# chat fields with no Responses counterpart of the same name (mapped or dropped)
_CHAT_ONLY = frozenset(
    {
        "messages",
        "tools",
        "tool_choice",
        "response_format",
        "max_tokens",
        "max_completion_tokens",
        "stream_options",
        "logprobs",
        "reasoning_effort",
    }
)


_LOGPROBS = "message.output_text.logprobs"
_ENCRYPTED = "reasoning.encrypted_content"


def responses_body(chat: dict[str, Any], store: bool = False) -> dict[str, Any]:
    """A chat-completions request body as a Responses request body.

    ``store`` is sent unless the body sets it. Unstored (``store: false``), a request to a
    reasoning model (``reasoning`` set, or reasoning items in the conversation) asks for
    ``reasoning.encrypted_content``, so the reply's reasoning items can be sent back."""
    body: dict[str, Any] = {k: v for k, v in chat.items() if k not in _CHAT_ONLY}
    body["input"] = _input(chat.get("messages") or [])
    tools = chat.get("tools")
    if tools:
        body["tools"] = [{"type": "function", **tool["function"]} for tool in tools]
    choice = chat.get("tool_choice")
    if isinstance(choice, dict):
        body["tool_choice"] = {"type": "function", "name": choice["function"]["name"]}
    elif choice is not None:
        body["tool_choice"] = choice
    fmt = chat.get("response_format")
    if fmt is not None and fmt.get("type") != "text":
        if fmt["type"] == "json_schema":
            body["text"] = {"format": {"type": "json_schema", **fmt.get("json_schema", {})}}
        else:
            body["text"] = {"format": {"type": fmt["type"]}}
    limit = chat.get("max_completion_tokens") or chat.get("max_tokens")
    if limit is not None:
        body["max_output_tokens"] = limit
    if chat.get("reasoning_effort") is not None:
        body["reasoning"] = {"effort": chat["reasoning_effort"]}
    if chat.get("logprobs"):
        body["include"] = [*body.get("include", ()), _LOGPROBS]
        body.setdefault("top_logprobs", 0)
    body.setdefault("store", store)
    if body["store"] is False and _reasons(body):
        include = list(body.get("include") or ())
        if _ENCRYPTED not in include:
            body["include"] = [*include, _ENCRYPTED]
    return body


def _reasons(body: dict[str, Any]) -> bool:
    """Whether the request is to a reasoning model: it sets ``reasoning``, or the
    conversation already carries reasoning items (a reasoning model answered before)."""
    if body.get("reasoning") is not None:
        return True
    return any(item.get("type") == "reasoning" for item in body["input"])


def _input(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for message in messages:
        role = message["role"]
        content = message.get("content")
        if role == "tool":
            output = content if isinstance(content, str) else _text_of(content)
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": message["tool_call_id"],
                    "output": output,
                }
            )
            continue
        if role == "assistant":
            # reasoning items first, as received: they preceded the reply they led to
            reasoned = message.get("reasoning_items") or ()
            items.extend(item for item in reasoned if isinstance(item, dict))
            text = content if isinstance(content, str) or content is None else _text_of(content)
            if text:
                items.append({"role": "assistant", "content": text})
            for call in message.get("tool_calls") or ():
                function = call["function"]
                items.append(
                    {
                        "type": "function_call",
                        "call_id": call["id"],
                        "name": function["name"],
                        "arguments": function.get("arguments") or "",
                    }
                )
            continue
        items.append({"role": role, "content": _parts(content)})
    return items


def _text_of(parts: Any) -> str:
    return "".join(p.get("text", "") for p in parts or () if p.get("type") == "text")


def _parts(content: Any) -> Any:
    if not isinstance(content, list):
        return content
    parts: list[dict[str, Any]] = []
    for part in content:
        if part.get("type") == "image_url":
            image = part["image_url"]
            item = {"type": "input_image", "image_url": image["url"]}
            if image.get("detail"):
                item["detail"] = image["detail"]
        else:
            item = {"type": "input_text", "text": part.get("text", "")}
        if "prompt_cache_breakpoint" in part:
            item["prompt_cache_breakpoint"] = part["prompt_cache_breakpoint"]
        parts.append(item)
    return parts


def _usage(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    if not usage:
        return None
    input_details = usage.get("input_tokens_details") or {}
    output_details = usage.get("output_tokens_details") or {}
    prompt = int(usage.get("input_tokens") or 0)
    completion = int(usage.get("output_tokens") or 0)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": int(usage.get("total_tokens") or prompt + completion),
        "prompt_tokens_details": {
            "cached_tokens": input_details.get("cached_tokens"),
            "cache_write_tokens": input_details.get("cache_write_tokens"),
        },
        "completion_tokens_details": {"reasoning_tokens": output_details.get("reasoning_tokens")},
    }


def _reasoning_text(item: dict[str, Any]) -> list[str]:
    """A reasoning item's readable text: its reasoning text, else its summary."""
    parts = (item.get("content") or []) + (item.get("summary") or [])
    return [part.get("text", "") for part in parts]


def _finish_reason(response: dict[str, Any], called: bool) -> str:
    details = response.get("incomplete_details") or {}
    if response.get("status") == "incomplete":
        reason = details.get("reason")
        return "content_filter" if reason == "content_filter" else "length"
    return "tool_calls" if called else "stop"


def chat_completion(response: dict[str, Any]) -> ChatCompletion:
    """A ``response`` object as a chat completion (one choice)."""
    texts: list[str] = []
    refusals: list[str] = []
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    logprobs: list[Any] = []
    items: list[dict[str, Any]] = []
    for item in response.get("output") or ():
        kind = item.get("type")
        if kind == "message":
            for part in item.get("content") or ():
                if part.get("type") == "output_text":
                    texts.append(part.get("text", ""))
                    logprobs.extend(part.get("logprobs") or ())
                elif part.get("type") == "refusal":
                    refusals.append(part.get("refusal", ""))
        elif kind == "function_call":
            function = {"name": item["name"], "arguments": item.get("arguments") or ""}
            calls.append({"id": item["call_id"], "type": "function", "function": function})
        elif kind == "reasoning":
            items.append(item)
            reasoning.extend(_reasoning_text(item))
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
    if items:
        message["reasoning_items"] = items
    if refusals:
        message["refusal"] = "".join(refusals)
    if calls:
        message["tool_calls"] = calls
    if reasoning:
        message["reasoning_content"] = "".join(reasoning)
    return ChatCompletion.model_validate(
        {
            "id": response.get("id", ""),
            "created": int(response.get("created_at") or 0),
            "model": response.get("model", ""),
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": _finish_reason(response, bool(calls)),
                    "logprobs": {"content": logprobs} if logprobs else None,
                }
            ],
            "usage": _usage(response.get("usage")),
        }
    )


class ResponsesBackend(HTTPBackend):
    """An :class:`HTTPBackend` that speaks the Responses API (``{base_url}/responses``).

    Takes :class:`HTTPBackend`'s arguments. Stateless by default: every call sends the
    whole conversation (reasoning items included) and ``store: false``.
    """

    _path = "/responses"
    _breakpoint_roles = frozenset({"system", "developer", "user"})  # input content only

    def __init__(
        self, base_url: str, api_key: str | None = None, *, store: bool = False, **kwargs: Any
    ) -> None:
        """Takes :class:`HTTPBackend`'s arguments, and ``store``: whether the provider
        keeps each response (``store: true``, for ``previous_response_id``), or nothing is
        kept and reasoning travels encrypted in the conversation (the default)."""
        super().__init__(base_url, api_key, **kwargs)
        self.store = store

    def __repr__(self) -> str:
        return "Responses" + super().__repr__().removeprefix("HTTP")

    def _encode(self, request: ChatRequest, stream: bool, encoding: CallEncoding | None) -> bytes:
        # the chat body first (canonical bytes and the derived prompt_cache_key carry over)
        chat = json.loads(super()._encode(request, stream, encoding))
        return json.dumps(responses_body(chat, self.store), separators=(",", ":")).encode()

    def _chunk_stream(
        self, response: _Response, deadline: Deadline, request: ChatRequest
    ) -> _ChunkStream:
        return _EventStream(response, self, deadline)

    async def complete(
        self, request: ChatRequest, deadline: Deadline, options: RequestOptions | None = None
    ) -> ChatCompletion:
        """Run a non-streamed call."""
        body = await self._whole_body(request, deadline, options)
        inband = _inband_error(self, body)
        if inband is not None:
            raise inband
        completion: ChatCompletion | None = None
        try:
            data = json.loads(body)
            if data.get("status") == "failed":
                raise _stream_error(self, json.dumps({"error": data.get("error")}).encode())
            completion = chat_completion(data)
        except errors.StreamError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
            pass  # not a response object: the error below, with no body quoted
        if completion is None:
            raise errors.APIResponseValidationError(
                f"{self.name}: response body is not a Responses API response", backend=self.name
            )
        if deadline.now() >= deadline.at:  # parsing took the call past its deadline
            raise deadline.exceeded(self.name)
        return completion


class _EventStream(_ChunkStream):
    """The HTTP backend's chunk stream, decoding Responses API events instead of OpenAI
    chunks: bytes, SSE framing, bounds, deadline checks and closing are the parent's."""

    __slots__ = (
        "_calls",
        "_created",
        "_id",
        "_model",
        "_pending",
        "_reasoning",
        "_streamed",
        "_texts",
    )

    def __init__(self, response: _Response, backend: ResponsesBackend, deadline: Deadline) -> None:
        super().__init__(response, backend, deadline, 1)
        self._pending: deque[ChatCompletionChunk] = deque()
        self._calls: dict[int, int] = {}  # output_index -> tool call index
        self._streamed: set[int] = set()  # output indexes whose arguments came as deltas
        self._reasoning: list[dict[str, Any]] = []  # finished reasoning items, as received
        self._id = ""
        self._model = ""
        self._created = 0
        self._texts = NO_IDS

    def next_nowait(self) -> ChatCompletionChunk | None:
        """The next chunk already received, or None when the next one needs I/O (or the end)."""
        pending = self._pending
        events = self._events
        backend = self._backend
        while not pending and events and not self.complete:
            event = events.popleft()
            malformed = False
            try:
                data = pydantic_core.from_json(event.data)
                if not isinstance(data, dict):
                    raise ValueError
                self._event(data)
            except (KeyError, TypeError, AttributeError, ValueError, RecursionError):
                malformed = True  # pydantic's errors quote the event: kept off the chain
            if malformed:
                self._done = True
                raise errors.APIResponseValidationError(
                    f"{backend.name}: a stream event is not a Responses API event",
                    backend=backend.name,
                )
        if self.complete:
            events.clear()
        return pending.popleft() if pending else None

    def _chunk(
        self, delta: dict[str, Any], finish: str | None = None, logprobs: Any = None
    ) -> None:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        if logprobs:
            choice["logprobs"] = {"content": logprobs}
        self._pending.append(
            ChatCompletionChunk.model_validate(
                {
                    "id": self._id,
                    "created": self._created,
                    "model": self._model,
                    "choices": [choice],
                }
            )
        )

    def _event(self, data: dict[str, Any]) -> None:
        kind = data.get("type")
        if kind == "response.created":
            response = data.get("response") or {}
            self._id = response.get("id", "")
            self._model = response.get("model", "")
            self._created = int(response.get("created_at") or 0)
            self._chunk({"role": "assistant", "content": ""})
            self._texts = TextChunks(self._id, self._model, self._created)
        elif kind == "response.output_text.delta":
            text = data.get("delta", "")
            logprobs = data.get("logprobs")
            if logprobs or not isinstance(text, str):
                self._chunk({"content": text}, logprobs=logprobs)
            else:  # the per-token path: nothing to validate
                self._pending.append(self._texts.text(text))
        elif kind == "response.refusal.delta":
            self._chunk({"refusal": data.get("delta", "")})
        elif kind in ("response.reasoning_text.delta", "response.reasoning_summary_text.delta"):
            self._chunk({"reasoning_content": data.get("delta", "")})
        elif kind == "response.output_item.added":
            item = data.get("item") or {}
            if item.get("type") == "function_call":
                index = self._calls[data.get("output_index", 0)] = len(self._calls)
                function = {"name": item.get("name", ""), "arguments": item.get("arguments", "")}
                call = {
                    "index": index,
                    "id": item.get("call_id"),
                    "type": "function",
                    "function": function,
                }
                self._chunk({"tool_calls": [call]})
        elif kind == "response.function_call_arguments.delta":
            known = self._calls.get(data.get("output_index", 0))
            if known is not None:
                self._streamed.add(data.get("output_index", 0))
                call = {"index": known, "function": {"arguments": data.get("delta", "")}}
                self._chunk({"tool_calls": [call]})
        elif kind == "response.output_item.done":
            item = data.get("item") or {}
            if item.get("type") == "reasoning":
                # the finished item (its encrypted_content whole only here), handed out
                # with every one before it: the latest value is the message's full list
                self._reasoning.append(item)
                self._chunk({"reasoning_items": list(self._reasoning)})
                return
            # a server that sends a call's arguments whole, with no deltas
            at = data.get("output_index", 0)
            known = self._calls.get(at)
            if known is not None and at not in self._streamed and item.get("arguments"):
                self._streamed.add(at)
                call = {"index": known, "function": {"arguments": item["arguments"]}}
                self._chunk({"tool_calls": [call]})
        elif kind in ("response.completed", "response.incomplete"):
            response = data.get("response") or {}
            self._chunk({}, _finish_reason(response, bool(self._calls)))
            self.finished.add(0)
            usage = _usage(response.get("usage"))
            if usage is not None:
                self._pending.append(
                    ChatCompletionChunk.model_validate(
                        {
                            "id": self._id,
                            "created": self._created,
                            "model": self._model,
                            "choices": [],
                            "usage": usage,
                        }
                    )
                )
            self._finished = True
            self.complete = True
        elif kind == "response.failed":
            self._done = True
            error = (data.get("response") or {}).get("error")
            raise _stream_error(self._backend, json.dumps({"error": error}).encode())
        elif kind == "error":
            self._done = True
            error = {k: data.get(k) for k in ("message", "code", "param")}
            raise _stream_error(self._backend, json.dumps({"error": error}).encode())
