"""The legacy text-completions API (``POST /v1/completions``) over the chat service.

The prompt (a string, a list of token ids, or a list holding one of either) goes to the
model as it is, with no chat template. Sampling fields map as for chat
(:mod:`local_engine.service`; vLLM's extensions such as ``top_k``, ``min_tokens`` or
``ignore_eos`` included); ``max_tokens`` defaults to 16, as in OpenAI's and vLLM's API;
``logprobs`` is the number of alternatives per token (0 to 20) and comes back in the legacy
layout (``tokens``, ``token_logprobs``, ``top_logprobs``, ``text_offset``); ``echo`` puts
the prompt before the reply (in the text only). Several prompts in one request, ``n > 1``,
``suffix`` and ``best_of`` other than ``n`` are refused (400). A streamed reply is one chunk
per engine output that brings text or a finish reason, then a usage chunk with
``stream_options.include_usage`` (usage on every chunk with ``continuous_usage_stats``).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from swiftclient.types import ChatRequest

from .engine import RequestOutput
from .errors import EngineError, InvalidRequestError
from .sampling_params import TokenLogprob
from .service import ChatService, OutputSource, PreparedRequest
from .tokenizer import Tokenizer

__all__ = ["TextRequest", "complete_text", "text_chunks", "text_request_fields"]

LEGACY_DEFAULT_MAX_TOKENS = 16
"""``max_tokens`` of a legacy completion that sets none (OpenAI's and vLLM's default)."""


@dataclass(frozen=True)
class TextRequest:
    """A parsed legacy completion: the sampling request, the prompt, and the echo flag."""

    request: ChatRequest
    prompt: str | list[int]
    echo: bool


def text_request_fields(body: dict[str, Any]) -> tuple[dict[str, Any], str | list[int], bool]:
    """Split a ``/v1/completions`` body into chat-request fields, the prompt and ``echo``.

    Raises InvalidRequestError (a ValueError) naming a prompt or field the server cannot
    serve, with the field as its ``param``.
    """
    fields = dict(body)
    prompt = _single_prompt(fields.pop("prompt", None))
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
    fields["messages"] = [{"role": "user", "content": "(legacy completion)"}]
    return fields, prompt, echo


def _single_prompt(prompt: Any) -> str | list[int]:
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt:
        if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return list(prompt)
        if len(prompt) == 1 and isinstance(prompt[0], str | list):
            return _single_prompt(prompt[0])
        raise InvalidRequestError(
            "one prompt per request: send a string or a list of token ids", "prompt"
        )
    raise InvalidRequestError("prompt must be a non-empty string or list of token ids", "prompt")


def _completion_id() -> str:
    return f"cmpl-{secrets.token_hex(12)}"


def _usage(out: RequestOutput) -> dict[str, Any]:
    return {
        "prompt_tokens": out.num_prompt_tokens,
        "completion_tokens": out.num_generated_tokens,
        "total_tokens": out.num_prompt_tokens + out.num_generated_tokens,
        "prompt_tokens_details": {"cached_tokens": out.num_cached_tokens},
    }


class _Logprobs:
    """Legacy ``logprobs``: tokens, their logprobs, alternatives, and text offsets."""

    def __init__(self, tokenizer: Tokenizer, offset: int) -> None:
        self._tokenizer = tokenizer
        self.offset = offset
        self.data: dict[str, list[Any]] = {
            "tokens": [],
            "token_logprobs": [],
            "top_logprobs": [],
            "text_offset": [],
        }

    def add(self, items: Sequence[TokenLogprob]) -> None:
        for item in items:
            text = self._tokenizer.token_text(item.token_id)
            self.data["tokens"].append(text)
            self.data["token_logprobs"].append(item.logprob)
            self.data["top_logprobs"].append(
                {self._tokenizer.token_text(t): lp for t, lp in item.top_logprobs}
            )
            self.data["text_offset"].append(self.offset)
            self.offset += len(text)

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
    start = prepared.prompt.text if parsed.echo else ""
    texts = [start]
    logprobs = _Logprobs(service.tokenizer, len(start)) if prepared.params.logprobs else None
    async with service.generate(source, prepared) as outputs:
        async for out in outputs:
            _check(out)
            texts.append(out.new_text)
            if logprobs is not None:
                logprobs.add(service.shown_logprobs(out, prepared.params))
            if out.finished:
                choice = {
                    "index": 0,
                    "text": "".join(texts),
                    "logprobs": None if logprobs is None else logprobs.take(),
                    "finish_reason": out.finish_reason,
                }
                return {
                    "id": _completion_id(),
                    "object": "text_completion",
                    "created": int(time.time()),
                    "model": parsed.request.model,
                    "choices": [choice],
                    "usage": _usage(out),
                }
    raise EngineError("the engine ended the request without a final output")


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
    start = prepared.prompt.text if parsed.echo else ""
    logprobs = _Logprobs(service.tokenizer, len(start)) if prepared.params.logprobs else None
    pending = start
    async for out in outputs:
        _check(out)
        if logprobs is not None:
            logprobs.add(service.shown_logprobs(out, prepared.params))
        text = pending + out.new_text
        pending = ""
        if not text and not out.finished and not continuous_usage:
            continue
        choice = {
            "index": 0,
            "text": text,
            "logprobs": None if logprobs is None else logprobs.take(),
            "finish_reason": out.finish_reason if out.finished else None,
        }
        chunk = {**head, "choices": [choice]}
        if continuous_usage:
            chunk["usage"] = _usage(out)
        yield chunk
        if out.finished:
            if include_usage:
                yield {**head, "choices": [], "usage": _usage(out)}
            return
    raise EngineError("the engine ended the request without a final output")
