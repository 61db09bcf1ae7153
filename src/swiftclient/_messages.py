"""What a call's ``messages`` argument may be, and the messages a call sends for it.

Shared by the client (each call) and the batch (its prompt-prefix ordering), below both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pydantic

from . import errors
from ._structured import validation_summary
from .conversation import Conversation
from .prompt_cache import Marked, arrange
from .types import AssistantMessage, Message

__all__ = ["MessagesInput", "has_marks", "request_messages", "validated_messages"]

MessagesInput = (
    str | Conversation | Sequence[Message | AssistantMessage | Mapping[str, Any] | Marked]
)


def validated_messages(messages: MessagesInput) -> tuple[list[Message], int | None]:
    """The validated messages in layout order, and how many lead as static when layout marks
    (:mod:`swiftclient.prompt_cache`) said so (None: no marks)."""
    if isinstance(messages, str):
        return [Message(role="user", content=messages)], None
    if isinstance(messages, Conversation):
        return messages.request_messages(), messages.static
    if not isinstance(messages, Sequence) or isinstance(messages, bytes | bytearray):
        raise errors.ConfigurationError(
            "messages must be a string, a Conversation or a list of messages, "
            f"got {type(messages).__name__}"
        )
    out: list[Message] = []
    for index, message in enumerate(messages):
        if isinstance(message, Message):
            out.append(message)
            continue
        if isinstance(message, Marked):
            ordered, static = arrange(messages)
            return validated_messages(ordered)[0], static
        if isinstance(message, AssistantMessage):
            out.append(message.to_message())  # its thinking blocks / reasoning items go back too
            continue
        try:
            out.append(Message.model_validate(message))
        except pydantic.ValidationError as exc:
            raise errors.ConfigurationError(
                f"invalid message messages[{index}]: {validation_summary(exc)}"
            ) from exc
    return out, None


def has_marks(messages: list[Any]) -> bool:
    """Whether any message carries a layout mark (then the messages are arranged first), or
    is a reply with Anthropic thinking blocks or Responses reasoning items (then it is read
    by its request fields, which send them back)."""
    for message in messages:
        if isinstance(message, Marked) or (
            isinstance(message, AssistantMessage)
            and (message.thinking_blocks is not None or message.reasoning_items is not None)
        ):
            return True
    return False


def request_messages(messages: MessagesInput) -> tuple[list[Message], int | None, list[Any]]:
    """What a call sends for ``messages``: the validated messages in layout order, how many
    lead as static (None: no marks), and a :class:`Conversation`'s tools (else empty)."""
    validated, static = validated_messages(messages)
    tools = list(messages.tools) if isinstance(messages, Conversation) and messages.tools else []
    return validated, static, tools
