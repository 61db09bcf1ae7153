"""The server side of the OpenAI Responses API (``POST /v1/responses``), stateless, over the
chat contract.

A Responses request is translated into a chat request (:func:`chat_fields`), served as a
chat call, and the chat reply translated back: a whole completion into a ``response``
object (:func:`response_body`), streamed chunks into the Responses event stream
(:class:`ResponseEvents`). Two servers use it: the local engine's ``/v1/responses``
(:mod:`local_engine.responses`) and the SDK transports (:mod:`swiftclient.transports`),
which answer the ``openai`` SDK's ``responses.create`` with a swiftclient client. It lives
here, not in the engine, because swiftclient never imports ``local_engine``; it needs only
the chat types.

Request mapping:

- ``input``: a string (one user message) or a list of items: messages (``role`` user,
  system, developer or assistant; ``content`` a string or ``input_text`` / ``output_text``
  parts; images pass on as for chat, where a text-only model refuses them), ``function_call``
  items (consecutive calls become one assistant message, so parallel calls stay together),
  ``function_call_output`` items (tool messages) and ``reasoning`` items (their text goes
  with the next assistant turn, for templates that render it; an item with
  ``encrypted_content`` also goes with it whole, as ``reasoning_items``, which a Responses
  backend upstream sends back unchanged);
- ``instructions``: a system message first; ``tools``: function tools in the flat form
  (``name``, ``description``, ``parameters``, ``strict``), any other tool type is refused;
  ``tool_choice``: ``none`` / ``auto`` / ``required`` or ``{"type": "function", "name"}``;
  ``text.format``: ``text``, ``json_object`` or ``json_schema`` (decoded under its grammar,
  as ``response_format`` is on chat); ``max_output_tokens``; ``temperature``, ``top_p``,
  ``top_logprobs`` (or ``include`` of ``message.output_text.logprobs``), ``user``,
  ``metadata``, ``parallel_tool_calls``, ``reasoning.effort``, ``seed``, ``stop``, the
  penalties and the server's own extensions (``passed``, vLLM's sampling fields on the
  engine) map as on chat;
- nothing is kept between requests: ``store`` is accepted and nothing is stored (the response says
  ``store: false``); ``previous_response_id``, ``conversation``, item references, stored
  ``prompt`` templates and ``background`` need server-side state and are refused (400), as
  is ``n`` other than 1 (a response is one reply);
- other fields are ignored, as the engine's chat endpoint ignores them (the servers name
  them in the ``x-ignored-fields`` header).

Reply mapping: the message's ``reasoning_items`` (from a Responses provider upstream) come
first, as received; text becomes a ``message`` item with one ``output_text`` part, each tool call
a ``function_call`` item (``call_id`` the engine's call id); a reply cut by the token limit
has status ``incomplete`` with ``incomplete_details.reason`` ``max_output_tokens``; usage is
``input_tokens`` (with ``input_tokens_details.cached_tokens``, the prefix-cache hits),
``output_tokens`` and ``total_tokens``. The stream is named server-sent events, each with
its ``type`` and a ``sequence_number``: ``response.created``, ``response.in_progress``, per
item ``response.output_item.added``, then for text ``response.content_part.added``,
``response.output_text.delta``..., ``response.output_text.done``,
``response.content_part.done`` and for a call ``response.function_call_arguments.delta``,
``response.function_call_arguments.done``, then ``response.output_item.done``; last
``response.completed`` (or ``response.incomplete``) with the whole response and its usage,
or ``response.failed`` with its ``error`` when the engine fails partway. No ``[DONE]``.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Mapping
from typing import Any

from ..types import ChatCompletion, ChatCompletionChunk, ToolCallDelta, Usage
from . import joined_content, matched_stop, named_event

__all__ = [
    "ResponsesRequestError",
    "ResponseEcho",
    "ResponseEvents",
    "chat_fields",
    "event_bytes",
    "response_body",
]

_STATEFUL = {
    "previous_response_id": "previous_response_id needs stored responses",
    "conversation": "conversation needs stored conversations",
    "prompt": "prompt templates are stored on OpenAI's side",
}
# fields that mean the same on chat and are passed on as they are
_SAME = ("temperature", "top_p", "user", "metadata", "parallel_tool_calls", "service_tier")
# chat fields a Responses client may send as extra body fields (a server adds its own)
_PASSED = frozenset({"seed", "stop", "presence_penalty", "frequency_penalty"})
# fields accepted with nothing to do: no state is kept, nothing is truncated, no obfuscation
_ACCEPTED = frozenset({"store", "truncation", "stream_options", "prompt_cache_key", "model", "n"})
_LOGPROBS_INCLUDE = "message.output_text.logprobs"


class ResponsesRequestError(ValueError):
    """A Responses request a stateless server cannot serve; ``param`` names the field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class ResponseEcho:
    """What a ``response`` object repeats of its request, and its id and creation time."""

    __slots__ = ("created_at", "fields", "id", "model")

    def __init__(self, model: str, fields: dict[str, Any]) -> None:
        """``fields``: the request settings the response object echoes."""
        self.id = f"resp_{secrets.token_hex(16)}"
        self.created_at = int(time.time())
        self.model = model
        self.fields = fields

    def response(
        self,
        status: str,
        output: list[dict[str, Any]],
        usage: dict[str, Any] | None = None,
        error: dict[str, Any] | None = None,
        reason: str = "max_output_tokens",
    ) -> dict[str, Any]:
        """The ``response`` object in a given state (``reason``: why, when ``incomplete``)."""
        body: dict[str, Any] = {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "background": False,
            "error": error,
            "incomplete_details": {"reason": reason} if status == "incomplete" else None,
            "model": self.model,
            "output": output,
            "previous_response_id": None,
            "store": False,
            "usage": usage,
            **self.fields,
        }
        if status == "completed":  # OpenAI's: present only then
            body["completed_at"] = int(time.time())
        return body


# ---------------------------------------------------------------------- request


def chat_fields(
    body: Mapping[str, Any], ignored: list[str], passed: frozenset[str] = frozenset()
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split a ``/v1/responses`` body into chat-completions fields and the fields its
    response object echoes; append the names of ignored fields to ``ignored``. Top-level
    fields named in ``passed`` (a server's own extensions) go on to the chat request as
    they are, besides ``seed``, ``stop`` and the penalties.

    Raises :class:`ResponsesRequestError` naming a field a stateless server cannot serve.
    """
    for name, why in _STATEFUL.items():
        if body.get(name) is not None:
            raise ResponsesRequestError(
                f"{name} is not supported: this server is stateless and stores no "
                f"responses ({why}); send the whole conversation in `input`",
                name,
            )
    n = body.get("n")
    if n is not None and n != 1:
        raise ResponsesRequestError(
            f"n={n} is not supported: a response is one reply (use /v1/chat/completions for "
            "several choices)",
            "n",
        )
    if body.get("background"):
        raise ResponsesRequestError(
            "background responses are not supported: this server is stateless",
            "background",
        )
    fields: dict[str, Any] = {"model": body.get("model")}
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise ResponsesRequestError("instructions must be a string", "instructions")
        messages.append({"role": "system", "content": instructions})
    messages.extend(_messages(body.get("input")))
    fields["messages"] = messages
    echo: dict[str, Any] = {"instructions": instructions}
    tools = body.get("tools")
    if tools is not None:
        fields["tools"] = _tools(tools)
    echo["tools"] = tools or []
    choice = body.get("tool_choice")
    if choice is not None:
        fields["tool_choice"] = _tool_choice(choice)
    echo["tool_choice"] = "auto" if choice is None else choice
    echo["text"] = _text(body.get("text"), fields)
    limit = body.get("max_output_tokens")
    if limit is not None:
        fields["max_completion_tokens"] = limit
    echo["max_output_tokens"] = limit
    for name in _SAME:
        if body.get(name) is not None:
            fields[name] = body[name]
    echo.update(
        temperature=body.get("temperature"),
        top_p=body.get("top_p"),
        user=body.get("user"),
        metadata=body.get("metadata") or {},
        parallel_tool_calls=body.get("parallel_tool_calls", True) is not False,
        truncation=body.get("truncation") or "disabled",
    )
    reasoning = body.get("reasoning")
    if reasoning is not None and not isinstance(reasoning, Mapping):  # was dropped unsaid
        raise ResponsesRequestError("reasoning must be an object", "reasoning")
    if isinstance(reasoning, Mapping) and reasoning.get("effort") is not None:
        fields["reasoning_effort"] = reasoning["effort"]
    echo["reasoning"] = {"effort": fields.get("reasoning_effort"), "summary": None}
    _logprobs(body, fields, echo)
    if body.get("stream") is not None:
        fields["stream"] = body["stream"]
    extra = body.get("extra_body")
    if isinstance(extra, Mapping):
        fields["extra_body"] = dict(extra)
    for name, value in body.items():
        if name in _PASSED or name in passed:
            fields[name] = value
        elif name not in _HANDLED and name not in _ACCEPTED:
            ignored.append(str(name))
    ignored.extend(_unserved(body))
    return fields, echo


def _unserved(body: Mapping[str, Any]) -> list[str]:
    """Accepted settings this translation cannot honour, as ``x-ignored-fields`` names
    them: storing the response, truncating the input, reasoning summaries, verbosity, the
    outputs ``include`` asks for but logprobs (``include:<value>``)."""
    unserved = []
    if body.get("store") is True:
        unserved.append("store")
    if body.get("truncation") not in (None, "disabled"):
        unserved.append("truncation")
    reasoning, text = body.get("reasoning"), body.get("text")
    if isinstance(reasoning, Mapping) and reasoning.get("summary") is not None:
        unserved.append("reasoning.summary")
    if isinstance(text, Mapping) and text.get("verbosity") is not None:
        unserved.append("text.verbosity")
    include = body.get("include")
    if isinstance(include, list):  # each output asked for but the logprobs is not produced
        unserved.extend(f"include:{item}" for item in include if item != _LOGPROBS_INCLUDE)
    return unserved


_HANDLED = frozenset(
    {
        *_STATEFUL,
        *_SAME,
        "background",
        "input",
        "instructions",
        "tools",
        "tool_choice",
        "text",
        "max_output_tokens",
        "reasoning",
        "top_logprobs",
        "include",
        "stream",
        "extra_body",
    }
)


def _logprobs(body: Mapping[str, Any], fields: dict[str, Any], echo: dict[str, Any]) -> None:
    include = body.get("include") or []
    if not isinstance(include, list) or not all(isinstance(item, str) for item in include):
        raise ResponsesRequestError("include must be a list of strings", "include")
    top = body.get("top_logprobs")
    if top is not None or _LOGPROBS_INCLUDE in include:
        fields["logprobs"] = True
        fields["top_logprobs"] = top or 0
    echo["top_logprobs"] = top


def _text(text: Any, fields: dict[str, Any]) -> dict[str, Any]:
    """``text.format`` as ``response_format``; the ``text`` setting the response echoes."""
    if text is None:
        return {"format": {"type": "text"}}
    if not isinstance(text, Mapping):
        raise ResponsesRequestError("text must be an object", "text")
    fmt = text.get("format")
    if fmt is None:
        return {**text, "format": {"type": "text"}}
    if not isinstance(fmt, Mapping):
        raise ResponsesRequestError("text.format must be an object", "text.format")
    kind = fmt.get("type")
    if kind == "json_schema":
        schema = {k: fmt[k] for k in ("name", "description", "schema", "strict") if k in fmt}
        fields["response_format"] = {"type": "json_schema", "json_schema": schema}
    elif kind == "json_object":
        fields["response_format"] = {"type": "json_object"}
    elif kind != "text":
        raise ResponsesRequestError(
            f"text.format.type must be text, json_object or json_schema, not {kind!r}",
            "text.format.type",
        )
    return dict(text)


def _tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise ResponsesRequestError("tools must be a list", "tools")
    converted = []
    for index, tool in enumerate(tools):
        if not isinstance(tool, Mapping) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, Mapping) else None
            raise ResponsesRequestError(
                f"tools[{index}]: only function tools are supported here "
                f"(got type {kind!r}); hosted tools run on OpenAI's side",
                f"tools[{index}].type",
            )
        if "function" in tool and "name" not in tool:
            raise ResponsesRequestError(
                f"tools[{index}] is in the Chat Completions form ({{'type': 'function', "
                "'function': {...}}); the Responses API takes the function's fields at the "
                "top: {'type': 'function', 'name': ..., 'parameters': ...}",
                f"tools[{index}]",
            )
        function = {
            k: tool[k]
            for k in ("name", "description", "parameters", "strict")
            if tool.get(k) is not None
        }
        converted.append({"type": "function", "function": function})
    return converted


def _tool_choice(choice: Any) -> Any:
    if choice in ("none", "auto", "required"):
        return choice
    if isinstance(choice, Mapping) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    raise ResponsesRequestError(
        "tool_choice must be none, auto, required or {'type': 'function', 'name': ...}",
        "tool_choice",
    )


def _messages(items: Any) -> list[dict[str, Any]]:
    """``input`` as chat messages."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list):
        raise ResponsesRequestError("input must be a string or a list of items", "input")
    messages: list[dict[str, Any]] = []
    reasoning: list[str] = []
    carried: list[dict[str, Any]] = []  # encrypted reasoning items, passed on unchanged
    for index, item in enumerate(items):
        where = f"input[{index}]"
        if not isinstance(item, Mapping):
            raise ResponsesRequestError(f"{where} must be an object", where)
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise ResponsesRequestError(
                    f"{where}.role must be user, system, developer or assistant", f"{where}.role"
                )
            message = {"role": role, "content": _content(item.get("content"), where)}
            if role == "assistant":
                _attach_reasoning(message, reasoning, carried)
            messages.append(message)
        elif kind == "function_call":
            arguments = item.get("arguments")
            arguments = "" if arguments is None else arguments
            if not isinstance(arguments, str):
                raise ResponsesRequestError(
                    f"{where}.arguments must be a string (the call's JSON arguments, encoded)",
                    f"{where}.arguments",
                )
            call = {
                "id": _string(item, "call_id", where),
                "type": "function",
                "function": {"name": _string(item, "name", where), "arguments": arguments},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and not (reasoning or carried):
                last.setdefault("tool_calls", []).append(call)
            else:
                message = {"role": "assistant", "content": None, "tool_calls": [call]}
                _attach_reasoning(message, reasoning, carried)
                messages.append(message)
        elif kind == "function_call_output":
            output = item.get("output")
            content = output if isinstance(output, str) else _content(output, where, "output")
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": _string(item, "call_id", where),
                    "content": content,
                }
            )
        elif kind == "reasoning":
            reasoning.extend(_reasoning_text(item, where))
            if item.get("encrypted_content") is not None:
                carried.append(dict(item))
        elif kind == "item_reference":
            raise ResponsesRequestError(
                f"{where}: item references need stored items; this server is stateless",
                where,
            )
        else:
            raise ResponsesRequestError(
                f"{where}: input items of type {kind!r} are not supported here",
                f"{where}.type",
            )
    return messages


def _string(item: Mapping[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value:
        raise ResponsesRequestError(f"{where}.{key} must be a non-empty string", f"{where}.{key}")
    return value


def _attach_reasoning(
    message: dict[str, Any], reasoning: list[str], carried: list[dict[str, Any]]
) -> None:
    if reasoning:
        message["reasoning_content"] = "".join(reasoning)
        reasoning.clear()
    if carried:
        message["reasoning_items"] = list(carried)
        carried.clear()


def _reasoning_text(item: Mapping[str, Any], where: str) -> list[str]:
    """A reasoning item's text: its ``content`` parts', else its ``summary``'s (each a list
    of parts; a part that carries no text is skipped)."""
    for key in ("content", "summary"):
        parts = item.get(key)
        if parts is not None and not isinstance(parts, list):
            raise ResponsesRequestError(f"{where}.{key} must be a list of parts", f"{where}.{key}")
    parts = item.get("content") or item.get("summary") or []
    return [p["text"] for p in parts if isinstance(p, Mapping) and isinstance(p.get("text"), str)]


def _content(content: Any, where: str, field: str = "content") -> str | list[dict[str, Any]]:
    """A message's content (or a call output's ``output``, the ``field`` errors name): a
    string, or parts as chat content parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list) or not content:
        raise ResponsesRequestError(
            f"{where}.{field} must be a string or a non-empty list of parts", f"{where}.{field}"
        )
    parts: list[dict[str, Any]] = []
    for index, part in enumerate(content):
        at = f"{where}.{field}[{index}]"
        if not isinstance(part, Mapping):
            raise ResponsesRequestError(f"{at} must be an object (a content part)", at)
        kind = part.get("type")
        kind = kind if isinstance(kind, str) else repr(kind)  # a list is no key of a dict
        key = _PART_FIELDS.get(kind)
        if key is None:
            raise ResponsesRequestError(
                f"{at}: content parts of type {kind!r} are not supported here",
                at,
            )
        value = part.get(key)
        if not isinstance(value, str):  # a known part without its value
            article = "an" if kind[0] in "aeiou" else "a"
            raise ResponsesRequestError(
                f"{at}: {article} {kind} part needs {key} (a string)", f"{at}.{key}"
            )
        if kind == "input_image":
            image = {"url": value}
            if part.get("detail") in ("auto", "low", "high"):
                image["detail"] = part["detail"]
            parts.append({"type": "image_url", "image_url": image})
        else:  # text, or a refusal read back as text
            parts.append({"type": "text", "text": value})
    return joined_content(parts)


_PART_FIELDS = {  # each part type this wire takes, and the field holding its value
    "input_text": "text",
    "output_text": "text",
    "text": "text",
    "refusal": "refusal",
    "input_image": "image_url",
}


# ---------------------------------------------------------------------- reply


def _usage(usage: Usage | None) -> dict[str, Any] | None:
    if usage is None:
        return None
    details = usage.prompt_tokens_details
    output = usage.completion_tokens_details
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {
            "cached_tokens": (details.cached_tokens if details else None) or 0,
            "cache_write_tokens": usage.cache_write_tokens,
        },
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {
            "reasoning_tokens": (output.reasoning_tokens if output else None) or 0
        },
        "total_tokens": usage.total_tokens,
    }


def _message_item(item_id: str, text: str, status: str, logprobs: list[Any]) -> dict[str, Any]:
    return {
        "type": "message",
        "id": item_id,
        "status": status,
        "role": "assistant",
        "content": [_text_part(text, logprobs)],
    }


def _refusal_part(text: str) -> dict[str, Any]:
    return {"type": "refusal", "refusal": text}


def _text_part(text: str, logprobs: list[Any]) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}


def _call_item(
    item_id: str, call_id: str, name: str, arguments: str, status: str
) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def _item_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(16)}"


def _status(finish_reason: str | None) -> str:
    return "incomplete" if finish_reason in _INCOMPLETE else "completed"


_INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}
"""The chat finish reasons a response is ``incomplete`` for, and the reason it gives."""


def _reason(finish_reason: str | None) -> str:
    return _INCOMPLETE.get(finish_reason or "", "max_output_tokens")


def response_body(
    completion: ChatCompletion,
    echo: ResponseEcho,
    reasoning: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A whole chat completion as a ``response`` object; ``reasoning``: ``reasoning``
    output items that come first, as given (default: the message's ``reasoning_items``,
    which a Responses provider upstream sent)."""
    choice = completion.choices[0]
    message = choice.message
    status = _status(choice.finish_reason)
    if reasoning is None:
        reasoning = message.reasoning_items
    output: list[dict[str, Any]] = [dict(item) for item in reasoning or ()]
    logprobs = list((choice.logprobs or {}).get("content") or [])
    calls = message.tool_calls or []
    # the last item is the one a token limit cut (as the streamed items' statuses say); a
    # call a stop string cut short (it ended the text, and no "tool_calls" finish) is too
    said = "completed" if calls else status
    cut_call = status
    if calls and choice.finish_reason == "stop" and matched_stop(choice) is not None:
        cut_call = "incomplete"
    if message.content or not (message.refusal or calls):
        text_said = "completed" if message.refusal else said  # the refusal comes after it
        output.append(_message_item(_item_id("msg"), message.content or "", text_said, logprobs))
    if message.refusal:  # a message of its own, as the stream sends it
        item = _message_item(_item_id("msg"), "", said, [])
        item["content"] = [_refusal_part(message.refusal)]
        output.append(item)
    for i, call in enumerate(calls):
        done = cut_call if i == len(calls) - 1 else "completed"
        output.append(
            _call_item(_item_id("fc"), call.id, call.function.name, call.function.arguments, done)
        )
    return echo.response(
        status, output, _usage(completion.usage), reason=_reason(choice.finish_reason)
    )


def event_bytes(event: Mapping[str, Any]) -> bytes:
    """One named server-sent event: ``event: <type>`` then its JSON ``data``."""
    return named_event(event["type"], event)


class _Item:
    """An output item being streamed: a message (text), a function call or a reasoning
    item (given whole)."""

    __slots__ = (
        "arguments",
        "call_id",
        "id",
        "index",
        "kind",
        "logprobs",
        "name",
        "reasoning",
        "refusal",
        "status",
        "text",
    )

    def __init__(self, kind: str, index: int, refusal: bool = False) -> None:
        self.kind = kind
        self.refusal = refusal
        """A message whose one part is a refusal (its ``text``), not output text."""
        self.index = index
        self.id = _item_id("msg" if kind == "message" else "fc")
        self.text: list[str] = []
        self.logprobs: list[Any] = []
        self.call_id = ""
        self.name = ""
        self.arguments: list[str] = []
        self.reasoning: dict[str, Any] = {}
        self.status: str | None = None  # the status it was closed with

    def snapshot(self, status: str) -> dict[str, Any]:
        if self.kind == "reasoning":
            return dict(self.reasoning)
        if self.kind == "message":
            item = _message_item(self.id, "".join(self.text), status, list(self.logprobs))
            if self.refusal:
                item["content"] = [_refusal_part("".join(self.text))]
            return item
        return _call_item(self.id, self.call_id, self.name, "".join(self.arguments), status)


class ResponseEvents:
    """Turns a chat stream's chunks into the Responses event stream, numbering the events.

    :meth:`start` gives the opening events, :meth:`feed` the events of each chunk (a final
    chunk with usage closes the response), :meth:`end` the closing events of a stream that
    ended without such a chunk, :meth:`fail` the closing event of a stream that broke off.
    """

    def __init__(self, echo: ResponseEcho) -> None:
        """Stream the response ``echo`` describes."""
        self._echo = echo
        self._seq = 0
        self._items: list[_Item] = []
        self._current: _Item | None = None
        self._calls: dict[int, _Item] = {}
        self._finish: str | None = None
        self._cut_by_stop = False
        self._usage: Usage | None = None
        self._reasoned = 0  # reasoning items already sent, of a stream that carries them
        self.closed = False

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return event

    def _output(self, status: str) -> list[dict[str, Any]]:
        return [item.snapshot(item.status or status) for item in self._items]

    def start(self) -> list[dict[str, Any]]:
        """``response.created`` and ``response.in_progress``."""
        response = self._echo.response("in_progress", [])
        return [
            self._event("response.created", response=response),
            self._event("response.in_progress", response=response),
        ]

    def feed(self, chunk: ChatCompletionChunk) -> list[dict[str, Any]]:
        """The events a chat chunk brings."""
        events: list[dict[str, Any]] = []
        for choice in chunk.choices:
            delta = choice.delta
            extra = delta.__pydantic_extra__
            if extra and isinstance(extra.get("reasoning_items"), list):
                # every item so far (a Responses provider upstream): the new ones go out
                for item in extra["reasoning_items"][self._reasoned :]:
                    if isinstance(item, dict) and isinstance(item.get("id"), str):
                        events.extend(self.reasoning(item))
                self._reasoned = len(extra["reasoning_items"])
            if delta.content:
                events.extend(self._text(delta.content, choice.logprobs))
            if delta.refusal:
                events.extend(self._text(delta.refusal, None, refusal=True))
            for call in delta.tool_calls or ():
                events.extend(self._call(call))
            if choice.finish_reason is not None:
                self._finish = choice.finish_reason
                # a stop string that ended a reply inside a call cut the call short
                self._cut_by_stop = choice.finish_reason == "stop" and bool(matched_stop(choice))
        if chunk.usage is not None:
            self._usage = chunk.usage
            if not chunk.choices and not self.closed:
                events.extend(self._close(chunk.usage))
        return events

    def end(self) -> list[dict[str, Any]]:
        """The closing events when the chat stream ended without a usage-only chunk (the
        usage of the last chunk that had some, if any); nothing once closed."""
        if self.closed:
            return []
        return self._close(self._usage)

    def _open(self, kind: str, refusal: bool = False) -> tuple[_Item, list[dict[str, Any]]]:
        events = self._end_current()
        item = _Item(kind, len(self._items), refusal)
        self._items.append(item)
        self._current = item
        opening = item.snapshot("in_progress")
        if kind == "message":  # its one part comes next, in response.content_part.added
            opening["content"] = []
        events.append(
            self._event("response.output_item.added", output_index=item.index, item=opening)
        )
        if kind == "message":
            events.append(
                self._event(
                    "response.content_part.added",
                    item_id=item.id,
                    output_index=item.index,
                    content_index=0,
                    part=_refusal_part("") if refusal else _text_part("", []),
                )
            )
        return item, events

    def reasoning(self, item: dict[str, Any]) -> list[dict[str, Any]]:
        """The events of a whole ``reasoning`` output item (``id``, ``summary`` parts and
        ``encrypted_content``): added, each summary part streamed as one delta, done. The
        item is sent as given in ``response.output_item.done`` and the final response;
        ``response.output_item.added`` carries it without its summary or encrypted content,
        which are whole only at the end."""
        events = self._end_current()
        entry = _Item("reasoning", len(self._items))
        entry.id = str(item["id"])
        entry.reasoning = dict(item)
        self._items.append(entry)
        opening = {**item, "summary": []}
        opening.pop("encrypted_content", None)
        where = {"item_id": entry.id, "output_index": entry.index}
        events.append(
            self._event("response.output_item.added", output_index=entry.index, item=opening)
        )
        for at, part in enumerate(item.get("summary") or ()):
            text = part.get("text", "")
            empty = {"type": "summary_text", "text": ""}
            events.append(
                self._event(
                    "response.reasoning_summary_part.added", **where, summary_index=at, part=empty
                )
            )
            events.append(
                self._event(
                    "response.reasoning_summary_text.delta", **where, summary_index=at, delta=text
                )
            )
            events.append(
                self._event(
                    "response.reasoning_summary_text.done", **where, summary_index=at, text=text
                )
            )
            events.append(
                self._event(
                    "response.reasoning_summary_part.done",
                    **where,
                    summary_index=at,
                    part={"type": "summary_text", "text": text},
                )
            )
        events.append(
            self._event("response.output_item.done", output_index=entry.index, item=dict(item))
        )
        return events

    def _text(
        self, text: str, logprobs: dict[str, Any] | None, *, refusal: bool = False
    ) -> list[dict[str, Any]]:
        """A piece of the reply's text (``refusal``: of its refusal, a message of its own)."""
        events: list[dict[str, Any]] = []
        item = self._current
        if item is None or item.kind != "message" or item.refusal != refusal:
            item, events = self._open("message", refusal)
        item.text.append(text)
        if refusal:
            where = {"item_id": item.id, "output_index": item.index, "content_index": 0}
            events.append(self._event("response.refusal.delta", **where, delta=text))
            return events
        entries = list((logprobs or {}).get("content") or [])
        item.logprobs.extend(entries)
        events.append(
            self._event(
                "response.output_text.delta",
                item_id=item.id,
                output_index=item.index,
                content_index=0,
                delta=text,
                logprobs=entries,
            )
        )
        return events

    def _call(self, delta: ToolCallDelta) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        item = self._calls.get(delta.index)
        function = delta.function
        if item is None:
            item, events = self._open("function_call")
            item.call_id = delta.id or _item_id("call")
            item.name = (function.name or "") if function is not None else ""
            self._calls[delta.index] = item
            events[-1]["item"] = item.snapshot("in_progress")
        elif function is not None and function.name:
            item.name += function.name
        if function is not None and function.arguments:
            item.arguments.append(function.arguments)
            events.append(
                self._event(
                    "response.function_call_arguments.delta",
                    item_id=item.id,
                    output_index=item.index,
                    delta=function.arguments,
                )
            )
        return events

    def _end_current(self) -> list[dict[str, Any]]:
        item = self._current
        if item is None:
            return []
        self._current = None
        status = _status(self._finish) if self._finish is not None else "completed"
        if item.kind == "function_call" and self._cut_by_stop:
            status = "incomplete"
        item.status = status
        events: list[dict[str, Any]] = []
        if item.kind == "message" and item.refusal:
            text = "".join(item.text)
            fields = {"item_id": item.id, "output_index": item.index, "content_index": 0}
            events.append(self._event("response.refusal.done", **fields, refusal=text))
            events.append(
                self._event("response.content_part.done", **fields, part=_refusal_part(text))
            )
        elif item.kind == "message":
            text = "".join(item.text)
            fields = {"item_id": item.id, "output_index": item.index, "content_index": 0}
            events.append(
                self._event(
                    "response.output_text.done", **fields, text=text, logprobs=item.logprobs
                )
            )
            events.append(
                self._event(
                    "response.content_part.done", **fields, part=_text_part(text, item.logprobs)
                )
            )
        else:
            events.append(
                self._event(
                    "response.function_call_arguments.done",
                    item_id=item.id,
                    output_index=item.index,
                    name=item.name,
                    arguments="".join(item.arguments),
                )
            )
        events.append(
            self._event(
                "response.output_item.done", output_index=item.index, item=item.snapshot(status)
            )
        )
        return events

    def _close(self, usage: Usage | None) -> list[dict[str, Any]]:
        status = _status(self._finish)
        events: list[dict[str, Any]] = []
        if all(item.kind == "reasoning" for item in self._items):
            # an empty reply is still one (empty) message
            _, events = self._open("message")
        events.extend(self._end_current())
        self.closed = True
        reason = _reason(self._finish)
        response = self._echo.response(status, self._output(status), _usage(usage), reason=reason)
        kind = "response.completed" if status == "completed" else "response.incomplete"
        events.append(self._event(kind, response=response))
        return events

    def fail(self, code: str, message: str) -> dict[str, Any]:
        """``response.failed``, for a stream the engine broke off."""
        self.closed = True
        error = {"code": code, "message": message}
        response = self._echo.response("failed", self._output("incomplete"), error=error)
        return self._event("response.failed", response=response)
