"""Assemble stream chunks into one ChatCompletion: text and tool-call argument deltas merged.

Every string that streams in pieces (content, refusal, reasoning, tool-call names and
arguments, and a provider's unknown string fields of a delta) is collected as a list of its
pieces and joined once, when the completion is built: linear in the pieces' total size.
"""

from __future__ import annotations

from typing import Any

from .types import (
    AssistantMessage,
    ChatCompletion,
    ChatCompletionChunk,
    Choice,
    FunctionCall,
    ToolCall,
    Usage,
)

__all__ = ["Accumulator"]


class _ToolCallParts:
    __slots__ = ("arguments", "id", "name")

    def __init__(self) -> None:
        self.id: str | None = None
        self.name: list[str] = []
        self.arguments: list[str] = []


class _Text(list[str]):
    """The pieces of one unknown string field of a delta, joined once in ``build``."""

    __slots__ = ()


def _merge_extra(into: dict[str, Any], extra: dict[str, Any]) -> None:
    """Fold a chunk's or choice's unknown fields in: each keeps its latest value."""
    for key, value in extra.items():
        if value is not None:
            into[key] = value


def _merge_delta_extra(into: dict[str, Any], extra: dict[str, Any]) -> None:
    """Fold a delta's unknown fields in: strings stream in pieces, collected in a list (a
    pieced-together string costs linear time in the pieces, however many arrive); anything
    else keeps its latest value."""
    for key, value in extra.items():
        if value is None:
            continue
        if isinstance(value, str):
            pieces = into.get(key)
            if isinstance(pieces, _Text):
                pieces.append(value)
            else:
                into[key] = _Text((value,))
        else:
            into[key] = value


def _joined(fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` with every collected string joined."""
    return {
        key: "".join(value) if isinstance(value, _Text) else value for key, value in fields.items()
    }


class _ChoiceParts:
    __slots__ = (
        "content",
        "extra",
        "finish_reason",
        "logprobs",
        "message_extra",
        "reasoning",
        "reasoning_content",
        "refusal",
        "tool_calls",
    )

    def __init__(self) -> None:
        self.extra: dict[str, Any] = {}
        self.message_extra: dict[str, Any] = {}
        self.content: list[str] = []
        self.refusal: list[str] = []
        self.reasoning_content: list[str] = []
        self.reasoning: list[str] = []
        self.tool_calls: dict[int, _ToolCallParts] = {}
        self.finish_reason: str | None = None
        self.logprobs: dict[str, list[Any]] | None = None


class Accumulator:
    """Collects chunks in O(1) per chunk and builds the final completion once."""

    __slots__ = ("_choices", "_created", "_extra", "_fingerprint", "id", "model", "usage")

    def __init__(self) -> None:
        self._choices: dict[int, _ChoiceParts] = {}
        self.id = ""
        """The completion id the stream reported ("" before any)."""
        self.model = ""
        """The model the stream reported ("" before any)."""
        self._created = 0
        self._fingerprint: str | None = None
        self._extra: dict[str, Any] = {}
        self.usage: Usage | None = None

    def add(self, chunk: ChatCompletionChunk) -> bool:
        """Fold one chunk in; True when it carried content (see ``has_content``).

        Once per streamed chunk: fields are read from each model's ``__dict__`` (where
        pydantic keeps them), which costs about half an attribute read on a model (pydantic
        models define ``__getattr__``, which takes every attribute read off the fast path)."""
        content = False
        said = chunk.__dict__
        if not self.id and said["id"]:
            self.id = said["id"]
            self.model = said["model"]
            self._created = said["created"]
        if said["system_fingerprint"]:
            self._fingerprint = said["system_fingerprint"]
        if said["usage"] is not None:
            self.usage = said["usage"]
        extra = chunk.__pydantic_extra__
        if extra:
            _merge_extra(self._extra, extra)
        for choice in said["choices"]:
            fields = choice.__dict__
            index = fields["index"]
            parts = self._choices.get(index)
            if parts is None:
                parts = self._choices[index] = _ChoiceParts()
            delta = fields["delta"]
            if choice.__pydantic_extra__:
                _merge_extra(parts.extra, choice.__pydantic_extra__)
            if delta.__pydantic_extra__:
                _merge_delta_extra(parts.message_extra, delta.__pydantic_extra__)
            adds = delta.__dict__
            if adds["content"]:
                parts.content.append(adds["content"])
                content = True
            if adds["refusal"]:
                parts.refusal.append(adds["refusal"])
                content = True
            if adds["reasoning_content"]:
                parts.reasoning_content.append(adds["reasoning_content"])
                content = True
            if adds["reasoning"]:
                parts.reasoning.append(adds["reasoning"])
                content = True
            if adds["tool_calls"]:
                content = True
                for call in adds["tool_calls"]:
                    tc = parts.tool_calls.get(call.index)
                    if tc is None:
                        tc = parts.tool_calls[call.index] = _ToolCallParts()
                    if call.id:
                        tc.id = call.id
                    if call.function is not None:
                        if call.function.name:
                            tc.name.append(call.function.name)
                        if call.function.arguments:
                            tc.arguments.append(call.function.arguments)
            if fields["finish_reason"] is not None:
                parts.finish_reason = fields["finish_reason"]
            logprobs = fields["logprobs"]
            if logprobs:
                merged = parts.logprobs if parts.logprobs is not None else {}
                for key, value in logprobs.items():
                    if isinstance(value, list):
                        merged.setdefault(key, []).extend(value)
                parts.logprobs = merged
        return content

    def finish_reasons(self) -> list[str]:
        """The finish reasons seen so far, by choice index."""
        return [p.finish_reason for _, p in sorted(self._choices.items()) if p.finish_reason]

    @property
    def text(self) -> str:
        """Text of choice 0 so far."""
        parts = self._choices.get(0)
        return "".join(parts.content) if parts else ""

    def build(self) -> ChatCompletion:
        """Return the assembled completion."""
        choices = []
        for index in sorted(self._choices):
            parts = self._choices[index]
            tool_calls = [
                ToolCall(
                    id=tc.id or f"call_{index}_{i}",
                    function=FunctionCall(name="".join(tc.name), arguments="".join(tc.arguments)),
                )
                for i, tc in sorted(parts.tool_calls.items())
            ]
            message = AssistantMessage(
                content="".join(parts.content) if parts.content or not tool_calls else None,
                refusal="".join(parts.refusal) or None,
                reasoning_content="".join(parts.reasoning_content) or None,
                reasoning="".join(parts.reasoning) or None,
                tool_calls=tool_calls or None,
                **_joined(parts.message_extra),
            )
            choices.append(
                Choice(
                    index=index,
                    message=message,
                    finish_reason=parts.finish_reason,
                    logprobs=parts.logprobs,
                    **parts.extra,
                )
            )
        return ChatCompletion(
            id=self.id,
            created=self._created,
            model=self.model,
            choices=choices,
            usage=self.usage,
            system_fingerprint=self._fingerprint,
            **self._extra,
        )
