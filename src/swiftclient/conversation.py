"""An append-only multi-turn conversation whose sent prefix stays byte-stable.

Each turn of a conversation resends everything before it, and the provider serves that part
from its prompt cache only if its bytes are unchanged. :class:`Conversation` holds the
messages, tool calls and tool results of one conversation so that they are:

- **append-only**: :meth:`Conversation.append`, :meth:`~Conversation.user`,
  :meth:`~Conversation.tool_result` add at the end; replies are stored in their request form
  (:meth:`~swiftclient.types.AssistantMessage.to_message`), tool results that are not text
  as ``json.dumps(result)`` writes them (keys in the dict's own order, ``", "`` and ``": "``
  separators: the form models see in training, the embedded one included), and every
  message as a private copy, so a later change to the caller's own object does not reach
  the conversation;
- **checked**: :meth:`~Conversation.edit` and :meth:`~Conversation.truncate` exist for the
  cases that need them, and warn (:class:`PrefixBrokenWarning`, with the diagnosis) when they
  change what an earlier request already sent; sending again compares the prompt with the
  previous one and warns the same way about any other change (an object changed in place);
- **pluggable**: ``await client.chat(conversation)`` sends it (with its tools), and
  :meth:`~Conversation.send` also appends the reply.
"""

from __future__ import annotations

import inspect
import json
import warnings
from collections.abc import Awaitable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast, overload

import pydantic

from . import errors
from ._canonical import PromptPrefix, prompt_prefix
from ._structured import validation_summary
from .prompt_cache import PrefixBreak, diagnose
from .types import AssistantMessage, ChatCompletion, ChatRequest, Message, Tool

if TYPE_CHECKING:
    from collections.abc import Coroutine

    from ._client import AsyncClient
    from ._sync import Client

__all__ = ["Conversation", "PrefixBrokenWarning"]

MessageLike = Message | AssistantMessage | ChatCompletion | Mapping[str, Any]


class PrefixBrokenWarning(UserWarning):
    """A change to a conversation alters a prompt prefix an earlier request already sent."""


def _message(message: MessageLike) -> Message:
    """``message`` as a private request :class:`Message`; one that is not a message raises
    :class:`~swiftclient.ConfigurationError` saying what is wrong with it."""
    if isinstance(message, ChatCompletion):
        if not message.choices:
            raise errors.ConfigurationError("the completion has no choice to append")
        return message.choices[0].message.to_message()
    if isinstance(message, AssistantMessage):
        return message.to_message()
    if isinstance(message, Message):
        return message.model_copy(deep=True)
    try:
        return Message.model_validate(message)
    except pydantic.ValidationError as exc:
        raise errors.ConfigurationError(f"invalid message: {validation_summary(exc)}") from exc


def _tool(index: int, tool: Tool | Mapping[str, Any]) -> Tool:
    try:
        return Tool.model_validate(tool)
    except pydantic.ValidationError as exc:
        raise errors.ConfigurationError(
            f"invalid tool tools[{index}]: {validation_summary(exc)}"
        ) from exc


class Conversation(Sequence[Message]):
    """One conversation's messages, append-only, with a byte-stable sent prefix.

    Args:
        system: the system prompt (text or a message); static.
        static: more static messages sent right after it (reference documents).
        tools: the tools offered on every turn (sent by ``client.chat(conversation)``).
    """

    def __init__(
        self,
        system: str | MessageLike | None = None,
        *,
        static: Sequence[MessageLike] = (),
        tools: Sequence[Tool | Mapping[str, Any]] | None = None,
    ) -> None:
        self._messages: list[Message] = []
        if system is not None:
            self._messages.append(
                Message(role="system", content=system)
                if isinstance(system, str)
                else _message(system)
            )
        self._messages.extend(_message(message) for message in static)
        self.static = len(self._messages)
        """How many leading messages are static (the cacheable prefix with the tools)."""
        self.tools: list[Tool] | None = (
            [_tool(index, tool) for index, tool in enumerate(tools)] if tools else None
        )
        self.last_break: PrefixBreak | None = None
        """Where the last request stopped extending the one before it (None: it extended
        it, so the whole earlier prompt could be served from the cache)."""
        self._sent: PromptPrefix | None = None
        self._announced = False

    # ------------------------------------------------------------------ the sequence

    def __len__(self) -> int:
        return len(self._messages)

    @overload
    def __getitem__(self, index: int) -> Message: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Message]: ...

    def __getitem__(self, index: int | slice) -> Message | Sequence[Message]:
        if isinstance(index, slice):
            return tuple(self._messages[index])
        return self._messages[index]

    def __iter__(self) -> Iterator[Message]:
        return iter(self._messages)

    def __repr__(self) -> str:
        return f"Conversation(messages={len(self._messages)}, static={self.static})"

    @property
    def sent(self) -> int:
        """How many messages the last request sent (0 before the first)."""
        return 0 if self._sent is None else len(self._sent.segments) - 1

    # ------------------------------------------------------------------ appending

    def append(self, message: MessageLike) -> Message:
        """Add a message at the end: a :class:`Message`, a dict, a reply
        (:class:`AssistantMessage`) or a whole :class:`ChatCompletion` (its first choice)."""
        stored = _message(message)
        self._messages.append(stored)
        return stored

    def user(self, content: str | list[Any]) -> Message:
        """Add a user message."""
        return self.append({"role": "user", "content": content})

    def tool_result(self, tool_call_id: str, result: Any) -> Message:
        """Add a tool's result. A result that is not text is sent as ``json.dumps(result)``
        writes it: the keys in the dict's own order, ``", "`` and ``": "`` between items,
        non-ASCII escaped. The same dict (same keys in the same order) always gives the same
        bytes; build a result's keys in a fixed order, as a function returning a dict literal
        does, and every turn's prefix stays byte-stable."""
        if not isinstance(result, str):
            result = json.dumps(result)
        return self.append({"role": "tool", "tool_call_id": tool_call_id, "content": result})

    # ------------------------------------------------------------------ edits

    def edit(self, index: int, message: MessageLike) -> None:
        """Replace message ``index``. Warns (:class:`PrefixBrokenWarning`) when the message
        was already sent: the next request cannot reuse the cached prompt past it."""
        self._messages[index] = _message(message)
        self._check_edit()

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` messages. Warns when that removes sent messages."""
        if length < 0:
            raise errors.ConfigurationError("length must be >= 0")
        del self._messages[length:]
        self._check_edit()

    def _check_edit(self) -> None:
        found = self._diagnose()
        if found is not None and not self._announced:
            self._announced = True
            warnings.warn(
                f"this edit breaks the conversation's cached prefix: {found}",
                PrefixBrokenWarning,
                stacklevel=3,
            )

    def _prefix(self) -> PromptPrefix:
        request = ChatRequest.model_construct(
            model="-", messages=list(self._messages), tools=self.tools
        )
        return prompt_prefix(request, self.static)

    def _diagnose(self) -> PrefixBreak | None:
        sent = self._sent
        return None if sent is None else diagnose(sent, self._prefix())

    # ------------------------------------------------------------------ sending

    def request_messages(self) -> list[Message]:
        """The messages to send now; records them as sent and sets :attr:`last_break`,
        warning (:class:`PrefixBrokenWarning`) about a change no edit announced.
        ``client.chat(conversation)`` calls it."""
        current = self._prefix()
        sent = self._sent
        found = None if sent is None else diagnose(sent, current)
        if found is not None and not self._announced:
            warnings.warn(
                f"the conversation changed since its last request: {found}",
                PrefixBrokenWarning,
                stacklevel=4,
            )
        self.last_break = found
        self._sent = current
        self._announced = False
        return list(self._messages)

    @overload
    def send(self, client: AsyncClient, **params: Any) -> Coroutine[Any, Any, ChatCompletion]: ...

    @overload
    def send(self, client: Client, **params: Any) -> ChatCompletion: ...

    def send(
        self, client: AsyncClient | Client, **params: Any
    ) -> Coroutine[Any, Any, ChatCompletion] | ChatCompletion:
        """Send the conversation with ``client.chat`` (``params`` as there, without
        ``response_model``), append the reply, and return the completion: ``await
        conversation.send(async_client)``, or ``conversation.send(client)`` with a blocking
        :class:`~swiftclient.Client`."""
        chat = getattr(client, "chat", None)
        if not callable(chat):
            raise errors.ConfigurationError(
                f"send() takes an AsyncClient or a Client, got {type(client).__name__}"
            )
        answer = chat(self, response_model=None, **params)
        if inspect.isawaitable(answer):  # an AsyncClient's call: appended once awaited
            return self._appended(answer)
        self.append(answer)
        return cast("ChatCompletion", answer)

    async def _appended(self, answer: Awaitable[ChatCompletion]) -> ChatCompletion:
        completion = await answer
        self.append(completion)
        return completion
