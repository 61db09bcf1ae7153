"""The typed contract for OpenAI-compatible chat completions (pydantic 2).

Requests are strict: a misspelled parameter is an error, and provider-specific fields go in
``extra_body``. Responses are lenient: unknown fields a provider adds are kept (``extra="allow"``)
so nothing the server said is lost. Responses and stream chunks are parsed straight from bytes
with ``model_validate_json``.
"""

from __future__ import annotations

import logging
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import pydantic
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    field_validator,
    model_validator,
)

from ._cost import CallCost
from ._outcome import AttemptOutcome

__all__ = [
    "AssistantMessage",
    "Attempt",
    "ChatCompletion",
    "ChatCompletionChunk",
    "ChatRequest",
    "Choice",
    "ChoiceDelta",
    "ChunkChoice",
    "CompletionTokensDetails",
    "ContentPart",
    "FunctionCall",
    "FunctionCallDelta",
    "FunctionDefinition",
    "ImageContentPart",
    "ImageURL",
    "JSONSchemaFormat",
    "Message",
    "PromptTokensDetails",
    "ResponseFormat",
    "StreamOptions",
    "TextContentPart",
    "Timing",
    "Tool",
    "ToolCall",
    "ToolCallDelta",
    "ToolChoice",
    "ToolChoiceFunction",
    "Usage",
]

_REQUEST = ConfigDict(extra="forbid", populate_by_name=True, allow_inf_nan=False)
_RESPONSE = ConfigDict(extra="allow", populate_by_name=True)

_MAX_COUNT = 2**53
"""The largest token count a request may ask for or a reply may report: the largest integer
JSON numbers and floats hold exactly (a count past it is a provider's or a caller's error, and
would overflow the float arithmetic of pricing, rate limits and metrics)."""
_TokenCount = Annotated[int, Field(ge=0, le=_MAX_COUNT)]
"""A token count in a reply's usage: never negative, at most ``_MAX_COUNT``."""
_RANGE_ERRORS = frozenset(
    {"greater_than_equal", "less_than_equal", "int_parsing_size", "finite_number"}
)
"""A count out of range: negative, past 2**53, past 2**63 as a float, or past a float's."""
_log = logging.getLogger("swiftclient")


def _count(value: object) -> int | None:
    """A count a provider reports under a name of its own (read from a usage's extras): an
    integer from 0 to ``_MAX_COUNT``, else None (not reported)."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _MAX_COUNT:
        return value
    return None


def unreported_usage(exc: pydantic.ValidationError) -> None:
    """Judge a reply's usage that did not validate: when its only fault is a count out of
    range (negative, or past 2**53, a provider's bad number), the reply is kept without
    usage, as a reply that reports none is, and a warning is logged; any other fault is
    raised (the reply's body is malformed)."""
    if not all(error["type"] in _RANGE_ERRORS for error in exc.errors()):
        raise exc
    where = ", ".join(".".join(str(p) for p in error["loc"]) for error in exc.errors())
    _log.warning("a reply's usage has a token count out of range (%s): usage dropped", where)


def _usage_or_none(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    try:
        return handler(value)
    except pydantic.ValidationError as exc:
        unreported_usage(exc)
        return None


_ReportedUsage = Annotated["Usage", WrapValidator(_usage_or_none)] | None
"""A reply's usage: a count out of range drops it (:func:`unreported_usage`). The validator
wraps the object alone: a chunk's ``"usage": null`` (every chunk of an OpenAI stream that
asks for usage) is read as before, at no cost."""

Role = Literal["system", "developer", "user", "assistant", "tool"]
# What else an assistant message may carry instead of content, tool calls or a refusal (a
# legacy function call, a reference to earlier audio output).
_ASSISTANT_BODIES = ("function_call", "audio")
# Where providers report cached prompt tokens outside prompt_tokens_details.
_CACHE_HIT_FIELDS = ("prompt_cache_hit_tokens", "cache_read_input_tokens")
MAX_CHOICES = 1024
"""The most choices one response may hold (OpenAI's ``n`` stops at 128): a stream's choice
indices are below it, and a body or event listing more is refused before validation."""
MAX_TOOL_CALLS = 1024
"""The most tool calls one message may hold: a stream's tool-call indices are below it, and
a body or event listing more in one message is refused before validation."""


# --------------------------------------------------------------------------- request parts


class TextContentPart(BaseModel):
    """A text part of a message's content."""

    model_config = _REQUEST
    type: Literal["text"] = "text"
    text: str


class ImageURL(BaseModel):
    """An image reference: an https URL or a ``data:`` URL."""

    model_config = _REQUEST
    url: str
    detail: Literal["auto", "low", "high"] | None = None


class ImageContentPart(BaseModel):
    """An image part of a message's content."""

    model_config = _REQUEST
    type: Literal["image_url"] = "image_url"
    image_url: ImageURL


ContentPart = Annotated[TextContentPart | ImageContentPart, Field(discriminator="type")]
_PART_TYPES = ("text", "image_url")


class FunctionCall(BaseModel):
    """A function call the model made: its name and JSON-encoded arguments."""

    model_config = _RESPONSE
    name: str
    arguments: str = ""


class ToolCall(BaseModel):
    """One tool call in an assistant message."""

    model_config = _RESPONSE
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(BaseModel):
    """One chat message, in any role.

    Checked on construction, so a malformed conversation fails before it is sent:

    - ``system``, ``developer`` and ``user`` messages need ``content`` (a string, possibly
      empty, or a non-empty list of parts);
    - an ``assistant`` message needs ``content``, ``tool_calls`` or a ``refusal`` (or a
      legacy ``function_call`` / an ``audio`` reference); ``content`` may be ``None`` when it
      calls tools;
    - a ``tool`` message needs ``tool_call_id`` (the id of the call it answers) and
      ``content``;
    - ``tool_calls`` belong on assistant messages only, ``tool_call_id`` on tool messages only.

    An :class:`AssistantMessage` from a completion validates as a ``Message`` (see
    :meth:`AssistantMessage.to_message`), so ``messages.append(completion.choices[0].message)``
    continues a conversation.
    """

    # ``from_attributes``: an AssistantMessage (or any object with these attributes) is read
    # by its fields, so a reply appended to the messages validates as its request fields
    # (reasoning text and provider-specific extras are not fields here: left out).
    model_config = ConfigDict(extra="allow", populate_by_name=True, from_attributes=True)
    role: Role
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    refusal: str | None = None
    """An assistant message's refusal (instead of content)."""

    @field_validator("content", mode="before")
    @classmethod
    def _content_parts(cls, value: Any) -> Any:
        """Name what is wrong with a list of parts in words (pydantic's own errors for the
        union of a string and tagged parts are two, of which the first is beside the point)."""
        if not isinstance(value, list):
            return value
        for i, part in enumerate(value):
            if isinstance(part, BaseModel):
                continue
            if not isinstance(part, dict):
                raise ValueError(f"part {i} is {type(part).__name__}, not an object")
            kind = part.get("type")
            if kind not in _PART_TYPES:
                raise ValueError(
                    f"content parts of type {kind!r} are not supported here "
                    f"(part {i}; this API takes {' and '.join(map(repr, _PART_TYPES))} parts)"
                )
            if kind == "text" and not isinstance(part.get("text"), str):
                raise ValueError(f"part {i} is a text part without a string 'text'")
        return value

    @model_validator(mode="after")
    def _well_formed(self) -> Message:
        # The fields read from __dict__: pydantic's attribute hook costs more than these
        # checks, on every message of every request.
        fields = self.__dict__
        role, content = fields["role"], fields["content"]
        tool_calls, tool_call_id = fields["tool_calls"], fields["tool_call_id"]
        if isinstance(content, list) and not content:
            raise ValueError(f"a {role} message's content must not be an empty list")
        if tool_calls is not None and role != "assistant":
            raise ValueError(f"tool_calls belong on assistant messages, not on a {role} message")
        if tool_call_id is not None and role != "tool":
            raise ValueError(f"tool_call_id belongs on tool messages, not on a {role} message")
        if role == "tool":
            if not tool_call_id:
                raise ValueError(
                    "a tool message needs tool_call_id (the id of the call it answers)"
                )
            if content is None:
                raise ValueError("a tool message needs content (the tool's result)")
        elif role == "assistant":
            extra = self.__pydantic_extra__ or {}
            if content is None and not tool_calls and fields["refusal"] is None:
                if all(extra.get(key) is None for key in _ASSISTANT_BODIES):
                    raise ValueError("an assistant message needs content or tool_calls")
        elif content is None:
            raise ValueError(f"a {role} message needs content")
        return self

    def text(self) -> str:
        """Return the message's text, joining text parts and skipping images."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content if isinstance(p, TextContentPart))


class FunctionDefinition(BaseModel):
    """A function the model may call."""

    model_config = _REQUEST
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(BaseModel):
    """A tool offered to the model."""

    model_config = _REQUEST
    type: Literal["function"] = "function"
    function: FunctionDefinition


class ToolChoiceFunction(BaseModel):
    """Names the function in a forced tool choice."""

    model_config = _REQUEST
    name: str


class ToolChoice(BaseModel):
    """Force a call to one named function."""

    model_config = _REQUEST
    type: Literal["function"] = "function"
    function: ToolChoiceFunction


class JSONSchemaFormat(BaseModel):
    """The schema half of a ``json_schema`` response format."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: str
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    """``{"type": "text" | "json_object" | "json_schema", ...}``."""

    model_config = _REQUEST
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None


class StreamOptions(BaseModel):
    """Streaming options; ``include_usage`` asks for a final usage chunk."""

    model_config = _REQUEST
    include_usage: bool | None = None


def _tool_choice_hint(value: dict[str, Any]) -> str:
    """Why a ``tool_choice`` object without ``function`` is refused, and what to send."""
    kind, name = value.get("type"), value.get("name")
    named = f"{{'type': 'function', 'function': {{'name': {name!r}}}}}"
    if isinstance(name, str) and kind in ("tool", "function"):
        wire = "Anthropic Messages" if kind == "tool" else "OpenAI Responses"
        return f"tool_choice {value!r} is the {wire} form; Chat Completions takes {named}"
    plain = {"any": "required", "auto": "auto", "none": "none", "required": "required"}
    if isinstance(kind, str) and kind in plain:
        return f"tool_choice {value!r} is not this wire's form; pass the string {plain[kind]!r}"
    return (
        f"tool_choice {value!r} is not valid: pass 'none', 'auto', 'required' or "
        "{'type': 'function', 'function': {'name': ...}}"
    )


def _non_finite(value: Any, path: str) -> tuple[str, float] | None:
    """The first NaN or infinity in a JSON-like value, with its path, or None."""
    if isinstance(value, float):
        return None if math.isfinite(value) else (path, value)
    if isinstance(value, dict):
        for key, item in value.items():
            found = _non_finite(item, f"{path}.{key}" if path else str(key))
            if found is not None:
                return found
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            found = _non_finite(item, f"{path}[{index}]")
            if found is not None:
                return found
    return None


class ChatRequest(BaseModel):
    """A chat-completion request, as sent on the wire.

    Unknown keyword arguments are rejected; put provider-specific fields in ``extra_body``,
    which is merged into the JSON body as is. A ``tool_choice`` that requires a tool
    (``"required"`` or a named tool) needs ``tools``, and a named tool must be one of them.
    """

    model_config = _REQUEST
    model: str
    messages: list[Message]
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)
    max_tokens: int | None = Field(default=None, ge=1, le=_MAX_COUNT)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=_MAX_COUNT)
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int | None = Field(default=None, ge=1, le=_MAX_COUNT)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    stream: bool | None = Field(default=None, strict=True)  # "yes" or 0 is no boolean
    stream_options: StreamOptions | None = None
    user: str | None = None
    metadata: dict[str, str] | None = None
    prompt_cache_key: str | None = None
    reasoning_effort: str | None = None
    service_tier: str | None = None
    extra_body: dict[str, Any] | None = None

    @field_validator("messages")
    @classmethod
    def _non_empty(cls, value: list[Message]) -> list[Message]:
        if not value:
            raise ValueError("messages must hold at least one message")
        return value

    @field_validator("extra_body")
    @classmethod
    def _json_numbers(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        # NaN and the infinities have no JSON form: they went out as bare NaN / Infinity,
        # which providers' strict parsers refuse (as a 400 naming nothing of the caller's)
        found = _non_finite(value, "") if value else None
        if found is not None:
            raise ValueError(f"{found[0]} is {found[1]!r}: JSON has no form for it")
        return value

    @field_validator(
        "temperature",
        "top_p",
        "max_tokens",
        "max_completion_tokens",
        "seed",
        "n",
        "presence_penalty",
        "frequency_penalty",
        "top_logprobs",
        mode="before",
    )
    @classmethod
    def _not_a_boolean(cls, value: Any) -> Any:
        # pydantic reads True as 1 for a number; a request that sends a boolean here is wrong
        if isinstance(value, bool):
            raise ValueError("must be a number, not a boolean")
        return value

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _tool_choice_shape(cls, value: Any) -> Any:
        # A dict without "function" may be another wire's form: say which, and this wire's.
        if isinstance(value, dict) and "function" not in value:
            raise ValueError(_tool_choice_hint(value))
        if isinstance(value, str) and value not in ("none", "auto", "required"):
            raise ValueError(
                f"tool_choice {value!r} is none of 'none', 'auto', 'required' (or name a tool: "
                "{'type': 'function', 'function': {'name': ...}})"
            )
        return value

    @field_validator("tool_choice")
    @classmethod
    def _chosen_tool_offered(
        cls, value: Literal["none", "auto", "required"] | ToolChoice | None, info: ValidationInfo
    ) -> Literal["none", "auto", "required"] | ToolChoice | None:
        # As OpenAI answers 400: a call that must use a tool needs the tools it may use.
        if "tools" not in info.data:  # tools itself was invalid, and is reported
            return value
        tools: list[Tool] = info.data["tools"] or []
        if value == "required" and not tools:
            raise ValueError("tool_choice='required' needs tools: pass tools=[...]")
        if isinstance(value, ToolChoice):
            name = value.function.name
            if not tools:
                raise ValueError(f"tool_choice names the tool {name!r}, but no tools are given")
            if all(tool.function.name != name for tool in tools):
                offered = ", ".join(repr(tool.function.name) for tool in tools)
                raise ValueError(
                    f"tool_choice names the tool {name!r}, which is not in tools ({offered})"
                )
        return value

    @field_validator("model")
    @classmethod
    def _model_named(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("model must be a non-empty string")
        return value

    def stop_list(self) -> list[str]:
        """Return ``stop`` as a list (empty when unset)."""
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def max_new_tokens(self) -> int | None:
        """Return the token limit, preferring ``max_completion_tokens``."""
        return self.max_completion_tokens or self.max_tokens


# --------------------------------------------------------------------------- responses


class PromptTokensDetails(BaseModel):
    """Breakdown of prompt tokens; ``cached_tokens`` came from a prompt cache."""

    model_config = _RESPONSE
    cached_tokens: _TokenCount | None = None
    cache_write_tokens: _TokenCount | None = None
    """Prompt tokens written to the cache, where the provider reports them here (OpenAI's
    GPT-5.6 and later models)."""


class CompletionTokensDetails(BaseModel):
    """Breakdown of completion tokens."""

    model_config = _RESPONSE
    reasoning_tokens: _TokenCount | None = None
    accepted_prediction_tokens: _TokenCount | None = None
    rejected_prediction_tokens: _TokenCount | None = None


class Usage(BaseModel):
    """Token counts for one completion."""

    model_config = _RESPONSE
    prompt_tokens: _TokenCount = 0
    completion_tokens: _TokenCount = 0
    total_tokens: _TokenCount = 0
    prompt_tokens_details: PromptTokensDetails | None = None
    completion_tokens_details: CompletionTokensDetails | None = None

    @model_validator(mode="after")
    def _normalize_cache_fields(self) -> Usage:
        # One field for cached prompt tokens: DeepSeek's ``prompt_cache_hit_tokens`` and the
        # Anthropic-style ``cache_read_input_tokens`` land in prompt_tokens_details.
        extra = self.__pydantic_extra__
        if not extra:
            return self
        details = self.prompt_tokens_details
        if details is not None and details.cached_tokens is not None:
            return self
        for key in _CACHE_HIT_FIELDS:
            hit = _count(extra.get(key))
            if hit is not None:
                if details is None:
                    self.prompt_tokens_details = PromptTokensDetails(cached_tokens=hit)
                else:
                    details.cached_tokens = hit
                break
        return self

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens served from a prompt cache (0 when the provider does not say), from
        ``prompt_tokens_details.cached_tokens`` (OpenAI, vLLM, SGLang), DeepSeek's
        ``prompt_cache_hit_tokens`` or an Anthropic-style ``cache_read_input_tokens``."""
        details = self.prompt_tokens_details
        return (details.cached_tokens or 0) if details else 0

    @property
    def cache_write_tokens(self) -> int:
        """Prompt tokens written to a prompt cache, where the provider bills them apart
        (OpenAI's ``prompt_tokens_details.cache_write_tokens``, Anthropic-style
        ``cache_creation_input_tokens``); else 0."""
        details = self.prompt_tokens_details
        if details is not None and details.cache_write_tokens:
            return details.cache_write_tokens
        extra = self.__pydantic_extra__ or {}
        return _count(extra.get("cache_creation_input_tokens")) or 0

    @property
    def cache_write_1h_tokens(self) -> int:
        """Of :attr:`cache_write_tokens`, those written with a 1-hour TTL (Anthropic's
        ``cache_creation.ephemeral_1h_input_tokens``); 0 when the provider does not say.
        The rest were written with the 5-minute TTL."""
        extra = self.__pydantic_extra__ or {}
        split = extra.get("cache_creation")
        if not isinstance(split, dict):
            return 0
        return _count(split.get("ephemeral_1h_input_tokens")) or 0


class AssistantMessage(BaseModel):
    """The message a choice carries.

    It can be sent back as is: ``messages.append(completion.choices[0].message)`` works with
    ``client.chat`` and ``ChatRequest``, which take it as :meth:`to_message` does.
    """

    model_config = _RESPONSE
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    refusal: str | None = None
    tool_calls: list[ToolCall] | None = None
    reasoning_content: str | None = None
    """Reasoning text, where the provider sends it as ``reasoning_content`` (DeepSeek,
    SGLang, vLLM's older releases)."""
    reasoning: str | None = None
    """Reasoning text, where the provider sends it as ``reasoning`` (vLLM, OpenRouter)."""
    thinking_blocks: list[dict[str, Any]] | None = None
    """Anthropic's ``thinking`` and ``redacted_thinking`` blocks, exactly as received
    (signatures included); sent back on the next turn by :meth:`request_fields`."""
    reasoning_items: list[dict[str, Any]] | None = None
    """The Responses API's ``reasoning`` output items (``id``, ``summary``,
    ``encrypted_content``), exactly as received; sent back on the next turn by
    :meth:`request_fields`, so a stateless (``store: false``) conversation keeps the
    model's reasoning."""

    def request_fields(self) -> dict[str, Any]:
        """The fields a request's assistant message carries: ``role``, ``content``,
        ``tool_calls``, ``refusal``, ``thinking_blocks`` (Anthropic's signed thinking,
        which must go back unchanged) and ``reasoning_items`` (the Responses API's encrypted
        reasoning, likewise) when set.

        Reasoning text and provider-specific response fields are left out: providers reject
        or ignore them in requests (DeepSeek answers 400 to ``reasoning_content``). To send
        such a field back, append a dict that has it.
        """
        fields: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls is not None:
            fields["tool_calls"] = self.tool_calls
        if self.refusal is not None:
            fields["refusal"] = self.refusal
        if self.thinking_blocks is not None:
            fields["thinking_blocks"] = self.thinking_blocks
        if self.reasoning_items is not None:
            fields["reasoning_items"] = self.reasoning_items
        return fields

    def to_message(self) -> Message:
        """This reply as a request :class:`Message` (see :meth:`request_fields`)."""
        return Message.model_validate(self.request_fields())


class Choice(BaseModel):
    """One choice of a completion."""

    model_config = _RESPONSE
    index: int = 0
    message: AssistantMessage
    finish_reason: str | None = None
    logprobs: dict[str, Any] | None = None


@dataclass(slots=True)
class Attempt:
    """One attempt of a call against one backend and model.

    Attempts are first-class so that telemetry and hedging can wrap them. A record the SDK
    fills in on every call: a plain slotted dataclass, not a pydantic model (building and
    updating a validated model cost about a tenth of a plain call's CPU); dump it with
    ``dataclasses.asdict`` or ``pydantic.TypeAdapter(Attempt)``.
    """

    number: int
    backend: str
    model: str
    started: float
    duration: float | None = None
    ttft: float | None = None
    status_code: int | None = None
    error: str | None = None
    trigger: Literal["first", "hedge", "fallback", "retry"] = "first"
    """Why it started: the call's first attempt, a hedge (the hedge delay passed), a
    fallback (an earlier attempt failed) or a retry (the first of a later round)."""
    outcome: AttemptOutcome = "pending"
    """``ok`` (committed and finished), ``error``, ``cancelled``, ``lost`` (another attempt
    committed first; this one was cancelled or discarded) or ``pending``."""
    headers: dict[str, str] | None = None
    """The provider's rate-limit and request-id headers from this attempt's HTTP response
    (``x-ratelimit-*``, ``anthropic-ratelimit-*``, ``retry-after``, ``retry-after-ms``,
    ``x-request-id``, ``request-id``), and ``x-ignored-fields`` where the provider named
    fields it ignored (names lower-cased, values redacted like an error's),
    set when the response's head arrived, whether it was a success or an error; ``{}``
    when it had none of them, None when no HTTP response came (the local engine, a
    connection failure, an attempt cancelled before the answer)."""


def _percentile(values: Sequence[float], q: int) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


@dataclass(slots=True)
class Timing:
    """What the SDK measured for one call.

    ``ttft`` is the time from the call's start to its first content token, ``itl`` the
    gaps between content chunks, ``total`` the whole call, ``attempts`` every try made,
    ``cost`` what they cost (set when the call finishes; see docs/hedging.md).

    Like :class:`Attempt`, a slotted dataclass filled in by the SDK: dump it with
    ``dataclasses.asdict`` or ``pydantic.TypeAdapter(Timing)`` (which also reads it back).
    """

    ttft: float | None = None
    itl: list[float] = field(default_factory=list)
    total: float | None = None
    attempts: list[Attempt] = field(default_factory=list)
    cost: CallCost | None = None
    """The call's :class:`CallCost`: winner, hedges, waste and price including waste."""

    @property
    def itl_p50(self) -> float | None:
        """Median inter-token latency in seconds."""
        return _percentile(self.itl, 50)

    @property
    def itl_p95(self) -> float | None:
        """95th-percentile inter-token latency in seconds."""
        return _percentile(self.itl, 95)

    def summary(self) -> str:
        """Return a one-line human summary, times in milliseconds."""

        def ms(value: float | None) -> str:
            return "-" if value is None else f"{value * 1000:.1f}ms"

        return (
            f"ttft={ms(self.ttft)} itl_p50={ms(self.itl_p50)} itl_p95={ms(self.itl_p95)} "
            f"total={ms(self.total)} attempts={len(self.attempts)}"
        )


class ChatCompletion(BaseModel):
    """A complete chat-completion response."""

    model_config = _RESPONSE
    id: str = ""
    object: str = "chat.completion"
    created: int = 0
    model: str = ""
    choices: list[Choice] = Field(default_factory=list)
    usage: _ReportedUsage = None
    system_fingerprint: str | None = None
    timing: Timing | None = Field(default=None, exclude=True)

    @property
    def text(self) -> str:
        """The first choice's text ("" when it has none)."""
        return (self.choices[0].message.content or "") if self.choices else ""

    @property
    def tool_calls(self) -> list[ToolCall]:
        """The first choice's tool calls (empty when it has none)."""
        return (self.choices[0].message.tool_calls or []) if self.choices else []

    @property
    def finish_reason(self) -> str | None:
        """The first choice's finish reason."""
        return self.choices[0].finish_reason if self.choices else None


def set_timing(completion: ChatCompletion, timing: Timing) -> None:
    """Set ``completion.timing`` as pydantic's own assignment of a field does (the value in
    the model's ``__dict__``, the name in its fields set), without the generic
    ``__setattr__`` walk: the call path does this once per call."""
    completion.__dict__["timing"] = timing
    completion.__pydantic_fields_set__.add("timing")


class FunctionCallDelta(BaseModel):
    """A fragment of a function call in a stream."""

    model_config = _RESPONSE
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(BaseModel):
    """A fragment of a tool call in a stream; fragments share ``index``."""

    model_config = _RESPONSE
    index: int = Field(default=0, lt=MAX_TOOL_CALLS)
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionCallDelta | None = None


class ChoiceDelta(BaseModel):
    """What one chunk adds to a choice."""

    model_config = _RESPONSE
    role: str | None = None
    content: str | None = None
    refusal: str | None = None
    tool_calls: list[ToolCallDelta] | None = None
    reasoning_content: str | None = None
    """A piece of reasoning text sent as ``reasoning_content`` (DeepSeek, SGLang)."""
    reasoning: str | None = None
    """A piece of reasoning text sent as ``reasoning`` (vLLM, OpenRouter)."""


class ChunkChoice(BaseModel):
    """One choice within a stream chunk."""

    model_config = _RESPONSE
    index: int = Field(default=0, lt=MAX_CHOICES)
    delta: ChoiceDelta = Field(default_factory=ChoiceDelta)
    finish_reason: str | None = None
    logprobs: dict[str, Any] | None = None


class ChatCompletionChunk(BaseModel):
    """One event of a streamed chat completion."""

    model_config = _RESPONSE
    id: str = ""
    object: str = "chat.completion.chunk"
    created: int = 0
    model: str = ""
    choices: list[ChunkChoice] = Field(default_factory=list)
    usage: _ReportedUsage = None
    system_fingerprint: str | None = None

    @property
    def text(self) -> str:
        """Content text this chunk adds to the first choice ("" when none)."""
        for choice in self.choices:
            if choice.index == 0:
                return choice.delta.content or ""
        return ""

    def has_content(self) -> bool:
        """True when the chunk carries a content token (text, refusal, reasoning or
        tool-call data)."""
        for choice in self.choices:
            delta = choice.delta
            if (
                delta.content
                or delta.refusal
                or delta.tool_calls
                or delta.reasoning_content
                or delta.reasoning
            ):
                return True
        return False
