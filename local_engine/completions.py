"""The legacy text-completions API (``POST /v1/completions``) over the chat service.

The prompt (a string, a list of token ids, or a list of either) goes to the
model as it is, with no chat template. Sampling fields map as for chat
(:mod:`local_engine.service`; vLLM's extensions such as ``top_k``, ``min_tokens`` or
``ignore_eos`` included); ``max_tokens`` defaults to 16, as in OpenAI's and vLLM's API;
``logprobs`` is the number of alternatives per token (0 to 20) and comes back in the legacy
layout (``tokens``, ``token_logprobs``, ``top_logprobs``, ``text_offset``); ``echo`` puts
the prompt before the reply, in the text and, with ``logprobs``, in the logprobs too (the
first prompt token's logprob and alternatives are null: nothing comes before it). With
``echo``, ``max_tokens: 0`` scores the prompt alone: the reply holds the prompt and its
logprobs, no generated token, ``finish_reason`` ``"length"`` (what evaluation harnesses send
to score a text). Several prompts in one request (a list of strings or of token-id lists)
are served unstreamed, each reply the choice of its prompt's index (:func:`merge_texts`);
streamed, they are refused, as are ``n > 1``, ``suffix`` and ``best_of`` other than ``n``
(400). A streamed reply is one chunk
per engine output that brings text or a finish reason, then a usage chunk with
``stream_options.include_usage`` (usage on every chunk with ``continuous_usage_stats``).
"""

from __future__ import annotations

import codecs
import secrets
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from swiftclient.types import ChatRequest

from .chat import make_usage
from .engine import RequestOutput
from .errors import EngineError, InvalidRequestError
from .sampling_params import TokenLogprob
from .service import ChatService, OutputSource, PreparedRequest
from .tokenizer import Tokenizer

__all__ = ["TextRequest", "TextShape", "complete_text", "text_chunks", "text_request_fields"]

LEGACY_DEFAULT_MAX_TOKENS = 16
"""``max_tokens`` of a legacy completion that sets none (OpenAI's and vLLM's default)."""


@dataclass(frozen=True)
class TextShape:
    """What a legacy completion asks beyond the chat fields: the prompt, ``echo``, the
    alternatives per token when it asked for logprobs, and whether it only scores the
    prompt (``max_tokens: 0`` with ``echo``)."""

    prompt: str | list[int]
    echo: bool = False
    logprobs: int | None = None
    score_only: bool = False
    more: tuple[str | list[int], ...] = ()
    """The prompts after the first of a request that sent several (a list of strings or of
    token-id lists): each is its own choice, in order."""

    @property
    def prompts(self) -> list[str | list[int]]:
        """Every prompt of the request, in order."""
        return [self.prompt, *self.more]

    @property
    def prompt_logprobs(self) -> int | None:
        """The prompt logprobs the engine computes: with ``echo``, ``logprobs`` many
        alternatives; a scored prompt without ``logprobs`` still takes the scoring path
        (none shown), else None."""
        if not self.echo:
            return None
        return 0 if self.logprobs is None and self.score_only else self.logprobs


@dataclass(frozen=True)
class TextRequest:
    """A parsed legacy completion: the sampling request and the rest of what it asks."""

    request: ChatRequest
    shape: TextShape


_CHAT_ONLY = (
    "messages",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "functions",
    "function_call",
    "response_format",
)


def text_request_fields(body: dict[str, Any]) -> tuple[dict[str, Any], TextShape]:
    """Split a ``/v1/completions`` body into chat-request fields and the rest.

    Raises InvalidRequestError (a ValueError) naming a prompt or field the server cannot
    serve, with the field as its ``param``.
    """
    fields = dict(body)
    for name in _CHAT_ONLY:  # a chat field here was dropped without a word
        if fields.get(name) is not None:
            raise InvalidRequestError(
                f"{name} is not supported on /v1/completions (use /v1/chat/completions)", name
            )
    prompt, *more = _prompts(fields.pop("prompt", None))
    echo = fields.pop("echo", False)
    if not isinstance(echo, bool):
        raise InvalidRequestError("echo must be a boolean", "echo")
    suffix = fields.pop("suffix", None)
    if suffix:
        raise InvalidRequestError("suffix is not supported by the local engine", "suffix")
    n = fields.get("n")
    if n is not None and n != 1:
        raise InvalidRequestError(
            "n > 1 is not supported on /v1/completions (use /v1/chat/completions)", "n"
        )
    best_of = fields.pop("best_of", None)
    if best_of is not None and best_of != fields.get("n", 1):
        raise InvalidRequestError(
            "best_of is not supported by the local engine (only best_of == n)", "best_of"
        )
    logprobs = fields.pop("logprobs", None)
    if logprobs is not None:
        if isinstance(logprobs, bool) or not isinstance(logprobs, int) or not 0 <= logprobs <= 20:
            raise InvalidRequestError(
                "logprobs must be an int from 0 to 20 (alternatives per token)", "logprobs"
            )
        fields["logprobs"] = True
        fields["top_logprobs"] = logprobs
    fields.setdefault("max_tokens", LEGACY_DEFAULT_MAX_TOKENS)
    if fields["max_tokens"] is None:
        fields["max_tokens"] = LEGACY_DEFAULT_MAX_TOKENS
    limit = fields["max_tokens"]
    if isinstance(limit, int | float) and not isinstance(limit, bool) and limit < 0:
        raise InvalidRequestError(
            "max_tokens must be at least 0 here (0 with echo scores the prompt)", "max_tokens"
        )
    score_only = _scores_only(fields, echo)
    fields["messages"] = [{"role": "user", "content": "(legacy completion)"}]
    return fields, TextShape(prompt, echo, logprobs, score_only, tuple(more))


def _scores_only(fields: dict[str, Any], echo: bool) -> bool:
    """Whether the request only scores its prompt (``max_tokens: 0`` with ``echo``; the
    chat fields then say 1, which the chat request takes, and the engine generates
    nothing)."""
    max_tokens = fields["max_tokens"]
    if max_tokens != 0 or isinstance(max_tokens, bool):
        return False
    if not echo:
        raise InvalidRequestError(
            "max_tokens 0 generates nothing: send echo=true to score the prompt", "max_tokens"
        )
    if fields.get("min_tokens"):
        raise InvalidRequestError("min_tokens must not exceed max_tokens (0)", "min_tokens")
    fields["max_tokens"] = 1
    return True


def _prompts(prompt: Any) -> list[str | list[int]]:
    """The request's prompts: one string or token-id list, or a list of several."""
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return [list(prompt)]
        return [_one_prompt(each) for each in prompt]
    raise InvalidRequestError("prompt must be a non-empty string or list of token ids", "prompt")


def _one_prompt(prompt: Any) -> str | list[int]:
    """One of several prompts: a string or a non-empty list of token ids."""
    if isinstance(prompt, str):
        return prompt
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    ):
        return list(prompt)
    raise InvalidRequestError(
        "prompt must be a string, a list of token ids, or a list of either (several prompts)",
        "prompt",
    )


def merge_texts(bodies: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One ``text_completion`` of the whole replies to a request's several prompts: each
    reply's choice in prompt order (``index`` the prompt's), the usage summed."""
    first = bodies[0]
    choices: list[dict[str, Any]] = []
    totals: dict[str, int] = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    cached = 0
    for index, body in enumerate(bodies):
        choices.extend({**choice, "index": index} for choice in body["choices"])
        usage = body["usage"]
        for key in totals:
            totals[key] += usage[key]
        cached += (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    usage_sum: dict[str, Any] = dict(totals)
    if any("prompt_tokens_details" in body["usage"] for body in bodies):
        usage_sum["prompt_tokens_details"] = {"cached_tokens": cached}
    return {**first, "choices": choices, "usage": usage_sum}


def _completion_id() -> str:
    return f"cmpl-{secrets.token_hex(12)}"


class _TextOffsets:
    """The character offset in a text at which each token starts: tokens add their bytes
    (special tokens none where the text drops them), and a token that ends inside a
    multi-byte character moves the offset only once the character is whole."""

    def __init__(self, tokenizer: Tokenizer, start: int, *, special: bool = False) -> None:
        """Offsets from ``start``; ``special``: the text keeps special tokens (an echoed
        prompt does, a reply does not)."""
        self._bytes = tokenizer.token_bytes if special else tokenizer.text_bytes
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.chars = start

    def next(self, token_id: int) -> int:
        """The offset of ``token_id``, the next token; moves past it."""
        offset = self.chars
        self.chars += len(self._decoder.decode(self._bytes(token_id)))
        return offset


class _Logprobs:
    """Legacy ``logprobs``: tokens, their logprobs, alternatives, and text offsets."""

    def __init__(self, tokenizer: Tokenizer, offset: int) -> None:
        self._tokenizer = tokenizer
        self._offsets = _TextOffsets(tokenizer, offset)
        self.data: dict[str, list[Any]] = {
            "tokens": [],
            "token_logprobs": [],
            "top_logprobs": [],
            "text_offset": [],
        }

    def add(self, items: Sequence[TokenLogprob]) -> None:
        text = self._tokenizer.token_text
        for item in items:
            token = text(item.token_id)
            self.data["tokens"].append(token)
            self.data["token_logprobs"].append(item.logprob)
            top = {text(t): lp for t, lp in item.top_logprobs}
            # the token itself is always there, as OpenAI's legacy API and vLLM give it (so
            # up to logprobs + 1 entries): harnesses read top_logprobs[i][tokens[i]]
            top.setdefault(token, item.logprob)
            self.data["top_logprobs"].append(top)
            self.data["text_offset"].append(self._offsets.next(item.token_id))

    def add_prompt(self, items: Sequence[TokenLogprob | None], first_token: int) -> None:
        """The echoed prompt's entries (its first token, which has none, as nulls), from
        text offset 0; the reply's entries then go on from the offset given at creation."""
        prompt_offsets = _TextOffsets(self._tokenizer, 0, special=True)
        reply_offsets, self._offsets = self._offsets, prompt_offsets
        self.data["tokens"].append(self._tokenizer.token_text(first_token))
        self.data["token_logprobs"].append(None)
        self.data["top_logprobs"].append(None)
        self.data["text_offset"].append(self._offsets.next(first_token))
        self.add([item for item in items if item is not None])
        self._offsets = reply_offsets

    def take(self) -> dict[str, list[Any]]:
        data = self.data
        self.data = {key: [] for key in data}
        return data


def _check(out: RequestOutput) -> None:
    if out.finish_reason == "abort":
        raise EngineError("the local engine shut down before the request finished")


async def complete_text(
    service: ChatService, source: OutputSource, parsed: TextRequest, prepared: PreparedRequest
) -> dict[str, Any]:
    """Run a legacy completion to the end; the ``text_completion`` response body."""
    reply = _Reply(service, parsed, prepared)
    async with service.generate(source, prepared) as outputs:
        async for out in outputs:
            _check(out)
            reply.texts.append(reply.add(out))
            if out.finished:
                choice = {
                    "index": 0,
                    "text": "".join(reply.texts),
                    "logprobs": reply.take_logprobs(),
                    "finish_reason": out.finish_reason,
                }
                return {
                    "id": _completion_id(),
                    "object": "text_completion",
                    "created": int(time.time()),
                    "model": parsed.request.model,
                    "choices": [choice],
                    "usage": reply.usage(out),
                }
    raise EngineError("the engine ended the request without a final output")


class _Reply:
    """What a legacy completion's outputs add to its reply: text (the echoed prompt first)
    and logprobs (the prompt's first when echoed), none of the generated token's when the
    request only scores its prompt."""

    def __init__(
        self, service: ChatService, parsed: TextRequest, prepared: PreparedRequest
    ) -> None:
        """Start the reply of ``parsed`` as ``prepared`` for the model."""
        self._service = service
        self._prepared = prepared
        self.start = prepared.prompt.text if parsed.shape.echo else ""
        self.echo = parsed.shape.echo
        self.texts = [self.start]
        self._logprobs = (
            _Logprobs(service.tokenizer, len(self.start)) if prepared.params.logprobs else None
        )

    def add(self, out: RequestOutput) -> str:
        """Take in ``out``'s logprobs; the text it adds."""
        logprobs = self._logprobs
        if logprobs is not None and self.echo and out.prompt_logprobs is not None:
            logprobs.add_prompt(out.prompt_logprobs, self._prepared.prompt.token_ids[0])
        if logprobs is not None:
            logprobs.add(self._service.shown_logprobs(out, self._prepared.params))
        return out.new_text

    def take_logprobs(self) -> dict[str, list[Any]] | None:
        """The logprobs taken in since the last call (None when not asked for)."""
        return None if self._logprobs is None else self._logprobs.take()

    @staticmethod
    def usage(out: RequestOutput) -> dict[str, Any]:
        """The usage of the reply so far."""
        usage = make_usage(out.num_prompt_tokens, out.num_generated_tokens, out.num_cached_tokens)
        return usage.model_dump(exclude_none=True)


async def text_chunks(
    service: ChatService,
    outputs: AsyncIterator[RequestOutput],
    parsed: TextRequest,
    prepared: PreparedRequest,
    *,
    include_usage: bool,
    continuous_usage: bool,
) -> AsyncIterator[dict[str, Any]]:
    """The ``text_completion`` chunks of a streamed legacy completion."""
    head = {"id": _completion_id(), "object": "text_completion", "created": int(time.time())}
    head["model"] = parsed.request.model
    reply = _Reply(service, parsed, prepared)
    pending = reply.start
    async for out in outputs:
        _check(out)
        text = pending + reply.add(out)
        pending = ""
        if not text and not out.finished and not continuous_usage:
            continue
        choice = {
            "index": 0,
            "text": text,
            "logprobs": reply.take_logprobs(),
            "finish_reason": out.finish_reason if out.finished else None,
        }
        chunk = {**head, "choices": [choice]}
        if continuous_usage:
            chunk["usage"] = reply.usage(out)
        yield chunk
        if out.finished:
            if include_usage:
                yield {**head, "choices": [], "usage": reply.usage(out)}
            return
    raise EngineError("the engine ended the request without a final output")
