"""The server side of the wires other than Chat Completions, over the chat contract.

- :mod:`swiftclient.wire.responses`: OpenAI's Responses API (``/v1/responses``), stateless;
- :mod:`swiftclient.wire.messages`: Anthropic's Messages API (``/v1/messages``).

Each translates a request of its wire into a chat request and the chat answer (a whole
completion, or the stream's chunks) back into its wire's body or event stream. The SDK
transports (:mod:`swiftclient.transports`) use them to answer the ``openai`` and
``anthropic`` SDKs with a swiftclient client, and the local engine's server its
``/v1/responses``. Nothing here does I/O; the modules need only :mod:`swiftclient.types`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pydantic
from pydantic import BaseModel

from .._json import dumps
from .._structured import field_path, validation_summary

__all__ = [
    "chat_completion_body",
    "joined_content",
    "listed_names",
    "mark_matched_stop",
    "matched_stop",
    "named_event",
    "printable_name",
    "request_problem",
]

NAME_CHARS = 64
"""The longest field name :func:`printable_name` keeps whole."""
NAMED_AT_MOST = 20
"""The most field names :func:`listed_names` lists."""


def printable_name(name: str) -> str:
    """A field name a client chose, as it may go in a header or a log line: non-ASCII and
    control characters escaped (``\\n``, ``\\u043a``), commas too (a header lists names
    by commas), cut to :data:`NAME_CHARS` characters."""
    escaped = ascii(name)[1:-1].replace(",", "\\x2c")
    return escaped if len(escaped) <= NAME_CHARS else escaped[: NAME_CHARS - 3] + "..."


def listed_names(names: list[str]) -> str:
    """``names`` joined by commas, the first :data:`NAMED_AT_MOST` of them and a count of
    the rest (a header's or a log line's list of field names, each :func:`printable_name`)."""
    more = len(names) - NAMED_AT_MOST
    return ", ".join(names[:NAMED_AT_MOST]) + (f" and {more} more" if more > 0 else "")


def request_problem(exc: pydantic.ValidationError) -> tuple[str, str | None]:
    """What a request body that does not validate has wrong, and the field to name as its
    ``param``: each field at fault once, the branches of a union pydantic tried as one
    (``messages.0.content: Input should be a valid string, or a valid list``, not
    ``messages.0.content.str``), without the input values."""
    first = exc.errors(include_url=False, include_input=False)[0]
    loc = ".".join(str(part) for part in field_path(first["loc"]))
    return validation_summary(exc), loc or None


def chat_completion_body(completion: BaseModel) -> dict[str, Any]:
    """A chat completion as the JSON body a provider sends: fields without a value are
    left out (swiftclient's own, such as ``thinking_blocks``, among them), but those the
    Chat Completions schema requires though they may be null (a choice's ``logprobs`` and
    ``finish_reason``, a message's ``content``) are sent as null."""
    data: dict[str, Any] = completion.model_dump(mode="json", exclude_none=True)
    for choice in data["choices"]:
        choice.setdefault("logprobs", None)
        choice.setdefault("finish_reason", None)
        choice["message"].setdefault("content", None)
    return data


def matched_stop(choice: BaseModel) -> str | None:
    """The stop string that ended a chat choice (vLLM's ``stop_reason`` field, a string
    when a stop string matched), else None."""
    matched = (choice.model_extra or {}).get("stop_reason")
    return matched if isinstance(matched, str) else None


def joined_content(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """A turn's content parts as chat content: text alone as one string, its blocks joined
    by a newline (as vLLM joins text parts; joined with nothing, two blocks ran together,
    and a string is what every chat provider takes); with an image, the parts as they are."""
    if all(part["type"] == "text" for part in parts):
        return "\n".join(str(part["text"]) for part in parts)
    return parts


def mark_matched_stop(choice: BaseModel, stop: str) -> None:
    """Say which stop string ended a chat choice, as vLLM does: its ``stop_reason`` field
    (what :func:`matched_stop` reads)."""
    extra = choice.__pydantic_extra__
    if extra is not None:
        extra["stop_reason"] = stop


def named_event(kind: str, data: Mapping[str, Any]) -> bytes:
    """One named server-sent event, as both wires send them: ``event: <kind>`` then its
    data as compact JSON."""
    return b"event: " + kind.encode() + b"\ndata: " + dumps(data) + b"\n\n"
