"""The chat layer of the local engine: requests to prompt tokens, engine output to responses.

:class:`ChatFormatter` renders a :class:`~swiftclient.types.ChatRequest` with the model's chat
template and encodes it. :func:`build_completion` and :class:`CompletionStream` turn generated
text and token counts into :class:`~swiftclient.types.ChatCompletion` and
:class:`~swiftclient.types.ChatCompletionChunk` objects, parsing tool calls on the way. Nothing
here imports the engine: plain strings and ints in, swiftclient types out.

``response_format`` (``json_object`` / ``json_schema``) adds a system instruction asking for
JSON only; the engine also decodes such replies under a grammar (:mod:`local_engine.grammar`,
applied by :class:`~local_engine.service.ChatService`), so they always parse.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from swiftclient.errors import ConfigurationError
from swiftclient.types import (
    AssistantMessage,
    ChatCompletion,
    ChatCompletionChunk,
    ChatRequest,
    Choice,
    ChoiceDelta,
    ChunkChoice,
    CompletionTokensDetails,
    FunctionCallDelta,
    Message,
    PromptTokensDetails,
    ResponseFormat,
    Tool,
    ToolCallDelta,
    ToolChoice,
    Usage,
)

from .stop import _held_suffix
from .templates import (
    compile_template,
    normalize_messages,
    render_normalized,
    select_template,
)
from .tokenizer import Tokenizer
from .tool_calls import (
    ParsedOutput,
    ToolCallFormat,
    ToolCallStream,
    check_tool_format,
    detect_tool_format,
    parse_tool_calls,
    strip_tool_markup,
    tool_call_closer,
)

__all__ = [
    "ChatFormatter",
    "ChatPrompt",
    "CompletionStream",
    "build_completion",
    "make_usage",
    "new_completion_id",
    "response_format_instruction",
    "with_response_format",
]


def new_completion_id() -> str:
    """A fresh completion id: ``chatcmpl-`` and 24 random hex digits."""
    return f"chatcmpl-{secrets.token_hex(12)}"


def make_usage(
    prompt_tokens: int,
    completion_tokens: int,
    cached_tokens: int = 0,
    predictions: tuple[int, int] | None = None,
) -> Usage:
    """Usage with totals and ``prompt_tokens_details.cached_tokens``.

    ``predictions`` is ``(accepted, rejected)`` draft tokens of speculative decoding, reported
    as ``completion_tokens_details.accepted_prediction_tokens`` / ``rejected_prediction_tokens``.
    """
    details = None
    if predictions is not None:
        details = CompletionTokensDetails(
            accepted_prediction_tokens=predictions[0], rejected_prediction_tokens=predictions[1]
        )
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=cached_tokens),
        completion_tokens_details=details,
    )


def response_format_instruction(response_format: ResponseFormat | None) -> str | None:
    """The system instruction that asks for JSON output, or None for plain text."""
    if response_format is None or response_format.type == "text":
        return None
    if response_format.type == "json_object" or response_format.json_schema is None:
        return "Respond only with a single valid JSON object, with no other text."
    spec = response_format.json_schema
    lines = ["Respond only with a single valid JSON value, with no other text."]
    if spec.description:
        lines.append(f"It is {spec.name}: {spec.description}")
    if spec.schema_ is not None:
        schema = json.dumps(spec.schema_, ensure_ascii=False, sort_keys=True)
        lines.append(f"It must conform to this JSON schema: {schema}")
    return "\n".join(lines)


def with_response_format(
    messages: Sequence[Message | Mapping[str, Any]], response_format: ResponseFormat | None
) -> list[dict[str, Any]]:
    """Normalized messages with the JSON instruction added to (or as) the system message."""
    result = normalize_messages(messages)
    instruction = response_format_instruction(response_format)
    if instruction is None:
        return result
    if result and result[0]["role"] == "system" and isinstance(result[0].get("content"), str):
        head = result[0]
        result[0] = {**head, "content": f"{head['content']}\n\n{instruction}"}
    else:
        result.insert(0, {"role": "system", "content": instruction})
    return result


def _offered_tools(
    tools: list[Tool] | None, tool_choice: str | ToolChoice | None
) -> list[Tool] | None:
    """The tools to show the model: none for ``tool_choice="none"``, one for a named choice."""
    if not tools or tool_choice == "none":
        return None
    if isinstance(tool_choice, ToolChoice):
        chosen = [t for t in tools if t.function.name == tool_choice.function.name]
        if not chosen:
            raise ConfigurationError(
                f"tool_choice names {tool_choice.function.name!r}, which is not in tools"
            )
        return chosen
    return tools


@dataclass(frozen=True)
class ChatPrompt:
    """A rendered request: prompt text and ids, and how to parse tool calls in the reply.

    ``markup_format`` is the template's tool-call convention when no tools were offered
    (else "none"): the reply must not call tools then, so markup in that convention is
    kept from being sampled and removed from the text.
    """

    text: str
    token_ids: list[int]
    tool_format: ToolCallFormat
    markup_format: ToolCallFormat = "none"


def _check_tool_results(request: ChatRequest) -> None:
    """Every tool message answers a call an earlier assistant message made (by its
    ``tool_call_id``), as OpenAI's API requires: a result of no call was accepted, and the
    model read it as a call's result."""
    called: set[str] = set()
    for index, message in enumerate(request.messages):
        for call in message.tool_calls or ():
            called.add(call.id)
        answered = message.tool_call_id
        if message.role == "tool" and answered is not None and answered not in called:
            raise ConfigurationError(
                f"messages[{index}]: the tool message's tool_call_id {answered!r} answers no "
                "tool call of an earlier assistant message"
            )


def _generation_prompt(request: ChatRequest) -> bool:
    """``extra_body["add_generation_prompt"]`` (vLLM's extension; default true): whether
    the prompt ends with the header of a new assistant turn."""
    wanted = (request.extra_body or {}).get("add_generation_prompt", True)
    if not isinstance(wanted, bool):
        raise ConfigurationError("extra_body['add_generation_prompt'] must be a boolean")
    return wanted


def _prefill(request: ChatRequest) -> str | None:
    """The final message's text when the request asks to continue it
    (``extra_body["continue_final_message"]``, vLLM's extension: the reply is the rest of
    that assistant message, as a Messages API prefill is), else None."""
    wanted = (request.extra_body or {}).get("continue_final_message")
    if wanted is None or wanted is False:
        return None
    if wanted is not True:
        raise ConfigurationError("extra_body['continue_final_message'] must be a boolean")
    if _generation_prompt(request) and "add_generation_prompt" in (request.extra_body or {}):
        raise ConfigurationError(
            "continue_final_message cannot be combined with add_generation_prompt: true (a "
            "new turn's header would follow the message to continue)"
        )
    last = request.messages[-1]
    content = last.content
    if isinstance(content, list):  # text parts, joined as the template joins them
        texts = [text for part in content if isinstance(text := getattr(part, "text", None), str)]
        content = "\n".join(texts) if len(texts) == len(content) else None
    if last.role != "assistant" or last.tool_calls or not content:
        raise ConfigurationError(
            "continue_final_message needs the final message to be an assistant message with "
            "text (and no tool calls) to continue"
        )
    forced = request.tool_choice not in (None, "auto", "none")
    if forced or (request.response_format is not None and request.response_format.type != "text"):
        raise ConfigurationError(
            "a prefill (a final assistant message to continue: continue_final_message) cannot "
            "be combined with a response_format or a forced tool_choice: their grammar holds "
            "from the reply's first token, which the final message has already written"
        )
    return content


def _check_template(source: str, own: object) -> None:
    """Refuse, when it is given, a ``chat_template`` that could never render a conversation:
    one that does not compile, or a word with no Jinja in it (a misspelt name of a template
    would otherwise be the prompt of every request, as its literal text)."""
    if "{{" not in source and "{%" not in source:
        names = sorted(own) if isinstance(own, dict) else []
        known = f"; the tokenizer's named templates: {', '.join(names)}" if names else ""
        raise ConfigurationError(
            f"chat_template {source[:60]!r} is no Jinja template (it holds no '{{{{' or "
            f"'{{%'){known}"
        )
    compile_template(source)  # ChatTemplateError (a ConfigurationError) when it does not


class ChatFormatter:
    """Renders chat requests with a tokenizer's chat template.

    ``chat_template`` overrides the tokenizer's (a template source, or the name of one of the
    tokenizer's named templates); ``tool_format`` overrides the tool-call convention that is
    otherwise detected from the template's markers.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        *,
        chat_template: str | None = None,
        tool_format: str | None = None,
    ) -> None:
        """Bind a tokenizer, an optional template override and tool-call format override."""
        self.tokenizer = tokenizer
        self._template = tokenizer.chat_template
        self._template_name: str | None = None
        if chat_template is not None:
            named = isinstance(self._template, dict) and chat_template in self._template
            if named:
                self._template_name = chat_template
            else:
                _check_template(chat_template, self._template)
                self._template = chat_template
        self._tool_format = None if tool_format is None else check_tool_format(tool_format)

    def template_source(self, *, has_tools: bool = False) -> str:
        """The template source used for a conversation with or without tools."""
        return select_template(self._template, name=self._template_name, has_tools=has_tools)

    def tool_format(self, *, has_tools: bool = True) -> ToolCallFormat:
        """The tool-call convention for replies ("none" when no tools were offered)."""
        if not has_tools:
            return "none"
        if self._tool_format is not None:
            return self._tool_format
        return detect_tool_format(self.template_source(has_tools=True))

    def render(
        self,
        messages: Sequence[Message | Mapping[str, Any]],
        /,
        *,
        tools: Sequence[Tool | Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        response_format: ResponseFormat | None = None,
        **template_kwargs: Any,
    ) -> str:
        """Render messages (and tools) to prompt text."""
        tools = list(tools) if tools else None
        return render_normalized(
            self.template_source(has_tools=tools is not None),
            with_response_format(messages, response_format),  # normalizes the messages
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            special_tokens=self.tokenizer.special_tokens,
            **template_kwargs,
        )

    def prepare(self, request: ChatRequest, *, max_bytes: int | None = None) -> ChatPrompt:
        """Render and encode a request.

        Tools follow ``tool_choice`` ("none" hides them, a named choice shows only that one;
        "required" and a named choice are enforced by a grammar in the chat service).
        ``extra_body["chat_template_kwargs"]`` is passed to the
        template (e.g. ``{"enable_thinking": False}``). A rendered prompt of more than
        ``max_bytes`` UTF-8 bytes, or one that is not valid Unicode (a lone surrogate), is a
        ConfigurationError raised before tokenizing.
        """
        tools = _offered_tools(request.tools, request.tool_choice)
        extra = (request.extra_body or {}).get("chat_template_kwargs") or {}
        if not isinstance(extra, Mapping):
            raise ConfigurationError("extra_body['chat_template_kwargs'] must be an object")
        taken = sorted(set(map(str, extra)) & _TEMPLATE_OWN)
        if taken:
            raise ConfigurationError(
                f"extra_body['chat_template_kwargs'] may not set {', '.join(taken)}: the "
                "request's own fields fill those template variables"
            )
        _check_tool_results(request)
        prefill = _prefill(request)
        text = self.render(
            request.messages,
            tools=tools,
            response_format=request.response_format,
            add_generation_prompt=prefill is None and _generation_prompt(request),
            **{str(k): v for k, v in extra.items()},
        )
        if prefill is not None:  # the reply goes on from the final message's text
            at = text.rfind(prefill)
            if at < 0:
                raise ConfigurationError(
                    "continue_final_message: this model's chat template changes the final "
                    "message's text, so the reply cannot continue it"
                )
            text = text[: at + len(prefill)]
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError as exc:
            raise ConfigurationError(
                f"the prompt is not valid Unicode text: {exc.reason} at character {exc.start} "
                "(a lone surrogate such as \\ud800 cannot be tokenized)"
            ) from exc
        if max_bytes is not None and size > max_bytes:
            raise ConfigurationError(
                f"the rendered prompt is {size} bytes, more than this model's context "
                f"(max_model_len) can hold ({max_bytes} bytes at most)"
            )
        return ChatPrompt(
            text=text,
            token_ids=self.tokenizer.encode(text, add_special_tokens=False),
            tool_format=self.tool_format(has_tools=tools is not None),
            markup_format=self.tool_format(has_tools=True) if tools is None else "none",
        )


# Template variables the request itself fills (chat_template_kwargs may set any other;
# the render functions take the source and messages positionally, so "source" is free).
_TEMPLATE_OWN = frozenset({"messages", "tools", "documents", "response_format", "special_tokens"})


def _final_reason(finish_reason: str | None, parsed: ParsedOutput) -> str | None:
    """``finish_reason``, or "tool_calls" when the model stopped after whole calls (never for
    a call cut short: the reason it was cut stays)."""
    done = parsed.tool_calls and not parsed.partial and finish_reason == "stop"
    return "tool_calls" if done else finish_reason


def build_completion(
    text: str,
    *,
    model: str,
    finish_reason: str | None,
    prompt_tokens: int,
    completion_tokens: int,
    cached_tokens: int = 0,
    tool_format: ToolCallFormat = "none",
    completion_id: str | None = None,
    created: int | None = None,
    predictions: tuple[int, int] | None = None,
    markup_format: ToolCallFormat = "none",
    stop_string: str | None = None,
) -> ChatCompletion:
    """A complete response for generated ``text``, with tool calls parsed out of it.

    ``finish_reason`` is the engine's ("stop", "length", ...); it becomes "tool_calls" when
    the model stopped after calling tools. A call cut short (at "length", or by the
    ``stop_string`` that ended the text) is returned with the arguments generated so far and
    the reason it was cut. With no tools offered (``tool_format`` "none"), tool-call markup in
    ``markup_format`` is removed from the text, never returned as content.
    """
    if tool_format == "none" and markup_format != "none":
        text = strip_tool_markup(text, markup_format)
    parsed = parse_tool_calls(text, tool_format, cut=_cut(finish_reason, stop_string))
    message = AssistantMessage(content=parsed.content, tool_calls=parsed.tool_calls or None)
    return ChatCompletion(
        id=completion_id or new_completion_id(),
        created=int(time.time()) if created is None else created,
        model=model,
        choices=[Choice(message=message, finish_reason=_final_reason(finish_reason, parsed))],
        usage=make_usage(prompt_tokens, completion_tokens, cached_tokens, predictions),
    )


def _cut(finish_reason: str | None, stop_string: str | None) -> bool:
    """Did the reply end before the model ended it (its token limit, or a stop string)?"""
    return finish_reason == "length" or stop_string is not None


class CompletionStream:
    """Turns the text deltas of one generation into stream chunks.

    Call :meth:`start` once, :meth:`push` for every text delta, and :meth:`finish` at the end.
    Content that may be the start of a tool call is held back until it is known not to be.
    """

    def __init__(
        self,
        *,
        model: str,
        tool_format: ToolCallFormat = "none",
        completion_id: str | None = None,
        created: int | None = None,
        markup_format: ToolCallFormat = "none",
    ) -> None:
        """Start a stream of chunks that share an id, a timestamp and a model name.

        With no tools offered (``tool_format`` "none"), tool-call markup in ``markup_format``
        is held back like a tool call, then dropped rather than sent."""
        self.id = completion_id or new_completion_id()
        self.created = int(time.time()) if created is None else created
        self.model = model
        self._markup: ToolCallFormat = markup_format if tool_format == "none" else "none"
        self._tools = ToolCallStream(tool_format if self._markup == "none" else self._markup)
        # stray closing tags of the markup, held and dropped as build_completion drops them
        self._closer = tool_call_closer(self._markup)
        self._held = ""

    def _chunk(self, delta: ChoiceDelta, finish_reason: str | None = None) -> ChatCompletionChunk:
        return ChatCompletionChunk(
            id=self.id,
            created=self.created,
            model=self.model,
            choices=[ChunkChoice(delta=delta, finish_reason=finish_reason)],
        )

    def start(self) -> ChatCompletionChunk:
        """The opening chunk: the assistant role and empty content."""
        return self._chunk(ChoiceDelta(role="assistant", content=""))

    def push(self, text: str) -> ChatCompletionChunk | None:
        """A content chunk for a text delta, or None when nothing can be shown yet."""
        content = self._without_closers(self._tools.feed(text))
        return self._chunk(ChoiceDelta(content=content)) if content else None

    def _without_closers(self, content: str) -> str:
        """``content`` without the markup's stray closing tags (with no tools offered),
        holding back a tail that may begin one."""
        if self._closer is None:
            return content
        text = (self._held + content).replace(self._closer, "")
        keep = _held_suffix(text, (self._closer,))
        self._held = text[len(text) - keep :]
        return text[: len(text) - keep]

    def finish(
        self,
        finish_reason: str | None,
        *,
        prompt_tokens: int,
        completion_tokens: int,
        cached_tokens: int = 0,
        include_usage: bool = False,
        predictions: tuple[int, int] | None = None,
        stop_string: str | None = None,
    ) -> list[ChatCompletionChunk]:
        """The closing chunks: held content, tool calls, finish reason, then usage if asked
        (``stop_string``: the one that ended the text; a call it or "length" cut short is sent
        as :func:`build_completion` returns it)."""
        parsed = self._tools.finish(cut=_cut(finish_reason, stop_string))
        if self._markup != "none":  # no tools were offered: drop the calls and their markup
            held, self._held = self._held, ""
            content = strip_tool_markup(held + (parsed.content or ""), self._markup)
            parsed = ParsedOutput(content=content or None, tool_calls=[])
        chunks: list[ChatCompletionChunk] = []
        if parsed.content:
            chunks.append(self._chunk(ChoiceDelta(content=parsed.content)))
        if parsed.tool_calls:
            deltas = [
                ToolCallDelta(
                    index=i,
                    id=call.id,
                    type="function",
                    function=FunctionCallDelta(
                        name=call.function.name, arguments=call.function.arguments
                    ),
                )
                for i, call in enumerate(parsed.tool_calls)
            ]
            chunks.append(self._chunk(ChoiceDelta(tool_calls=deltas)))
        chunks.append(self._chunk(ChoiceDelta(), _final_reason(finish_reason, parsed)))
        if include_usage:
            chunks.append(
                ChatCompletionChunk(
                    id=self.id,
                    created=self.created,
                    model=self.model,
                    choices=[],
                    usage=make_usage(prompt_tokens, completion_tokens, cached_tokens, predictions),
                )
            )
        return chunks
