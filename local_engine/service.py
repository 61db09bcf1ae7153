"""Chat requests over the engine: :class:`ChatRequest` in, OpenAI chunks and completions out.

The one place where OpenAI request fields become a prompt and :class:`SamplingParams`, shared
by :class:`local_engine.backend.LocalBackend` and the HTTP server
(:mod:`local_engine.server`).

Mapping:

- the prompt is the chat template rendered by :class:`~local_engine.chat.ChatFormatter`
  (tools, ``tool_choice``, the ``response_format`` instruction,
  ``extra_body["chat_template_kwargs"]``);
- ``response_format`` (``json_object``, ``json_schema``) and a forced ``tool_choice``
  (``"required"`` or a named tool) become a grammar the reply is decoded under
  (:mod:`local_engine.grammar`); one that cannot be compiled, or that fails on the text it
  forces from the start, is a :class:`~local_engine.grammar.GrammarError` (an
  InvalidRequestError: 400 from the server); one that fails later, partway through a reply,
  is a :class:`~local_engine.errors.GrammarFailedError` (500 from the server), never a reply;
- ``temperature``, ``top_p``, ``max_completion_tokens`` (else ``max_tokens``), ``stop``,
  ``seed``, ``presence_penalty``, ``frequency_penalty``, ``logprobs`` and ``top_logprobs``
  map one to one (OpenAI's defaults where unset). With no token limit a request may generate
  ``default_max_tokens``, fewer when the model's context is shorter;
- ``extra_body`` may carry ``top_k``, ``min_p``, ``ignore_eos``, ``stop_token_ids``,
  ``cache_salt`` and ``chat_template_kwargs``; any other key is an
  :class:`~local_engine.errors.InvalidRequestError`;
- the prefix-cache salt (which keeps tenants from sharing cached prompt blocks) is
  ``extra_body["cache_salt"]``, else ``user``. ``prompt_cache_key`` is a routing hint for
  hosted providers and is ignored here: one engine has one cache;
- a prompt is rendered and tokenized in a worker thread, never on the event loop, and one
  too long for ``max_model_len`` by its size alone is refused before it is tokenized;
- ``n > 1`` and a non-empty ``logit_bias`` are refused; ``parallel_tool_calls``,
  ``metadata``, ``service_tier`` and ``reasoning_effort`` have no effect.

Errors are the engine's own (:mod:`local_engine.errors`): every request the engine or this
layer refuses is an :class:`~local_engine.errors.InvalidRequestError`, which the server
answers with 400 and ``LocalBackend`` raises as ``BadRequestError``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import anyio.to_thread

from swiftclient.types import ChatCompletion, ChatCompletionChunk, ChatRequest

from .chat import ChatFormatter, ChatPrompt, CompletionStream, build_completion
from .engine import Engine, RequestOutput
from .errors import EngineConfigError, EngineError, GrammarFailedError, InvalidRequestError
from .grammar import Grammar, request_grammar
from .sampling_params import SamplingParams, TokenLogprob
from .tokenizer import Tokenizer

__all__ = [
    "EXTRA_BODY_KEYS",
    "ChatService",
    "OutputSource",
    "PreparedRequest",
]

EXTRA_BODY_KEYS = frozenset(
    {"top_k", "min_p", "ignore_eos", "stop_token_ids", "cache_salt", "chat_template_kwargs"}
)
"""The ``extra_body`` keys the local engine understands."""


class OutputSource(Protocol):
    """What :class:`ChatService` needs of :class:`~local_engine.async_engine.AsyncEngine`."""

    def stream(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        *,
        request_id: str | None = None,
        cache_salt: str | None = None,
    ) -> AbstractAsyncContextManager[AsyncIterator[RequestOutput]]:
        """Add a request on entry, yield its outputs, abort it on exit."""
        ...


@dataclass(frozen=True)
class PreparedRequest:
    """A request ready for the engine: prompt, sampling parameters and cache salt."""

    prompt: ChatPrompt
    params: SamplingParams
    cache_salt: str | None


def _extra(request: ChatRequest) -> dict[str, Any]:
    extra = dict(request.extra_body or {})
    unknown = sorted(set(extra) - EXTRA_BODY_KEYS)
    if unknown:
        raise InvalidRequestError(
            f"unsupported extra_body keys for the local engine: {unknown}; "
            f"supported: {sorted(EXTRA_BODY_KEYS)}"
        )
    if "ignore_eos" in extra and not isinstance(extra["ignore_eos"], bool):
        raise InvalidRequestError("extra_body['ignore_eos'] must be a boolean")
    salt = extra.get("cache_salt")
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise InvalidRequestError("extra_body['cache_salt'] must be a non-empty string")
    stop_ids = extra.get("stop_token_ids")
    if stop_ids is not None and not isinstance(stop_ids, list | tuple):
        raise InvalidRequestError("extra_body['stop_token_ids'] must be a list of token ids")
    return extra


def _check_supported(request: ChatRequest) -> None:
    if request.n is not None and request.n > 1:
        raise InvalidRequestError(f"n={request.n} is not supported by the local engine (only 1)")
    if request.logit_bias:
        raise InvalidRequestError("logit_bias is not supported by the local engine")


class ChatService:
    """Maps chat requests onto one :class:`Engine` and its outputs back onto OpenAI types.

    ``engine`` must have a tokenizer. ``chat_template`` and ``tool_format`` override the
    tokenizer's template and the detected tool-call convention.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        default_max_tokens: int = 1024,
        chat_template: str | None = None,
        tool_format: str | None = None,
    ) -> None:
        """Bind the engine and its tokenizer; EngineConfigError when it has no tokenizer."""
        if engine.tokenizer is None:
            raise EngineConfigError(
                "the model has no tokenizer (tokenizer.json): chat needs one to render prompts"
            )
        if isinstance(default_max_tokens, bool) or default_max_tokens < 1:
            raise EngineConfigError(
                f"default_max_tokens must be a positive int, got {default_max_tokens!r}"
            )
        self.engine = engine
        self.tokenizer: Tokenizer = engine.tokenizer
        self.default_max_tokens = default_max_tokens
        self.formatter = ChatFormatter(
            self.tokenizer, chat_template=chat_template, tool_format=tool_format
        )

    @property
    def max_model_len(self) -> int:
        """The longest prompt plus completion the engine accepts, in tokens."""
        return self.engine.max_model_len

    # ------------------------------------------------------------------ request mapping

    def _params(
        self,
        request: ChatRequest,
        extra: dict[str, Any],
        prompt_tokens: int,
        grammar: Grammar | None = None,
    ) -> SamplingParams:
        limit = self.max_model_len
        room = limit - prompt_tokens
        if room < 1:
            raise InvalidRequestError(
                f"the prompt is {prompt_tokens} tokens, but this model's context "
                f"(max_model_len) is {limit} tokens, leaving no room for a reply"
            )
        max_tokens = request.max_new_tokens()
        if max_tokens is None:
            max_tokens = min(self.default_max_tokens, room)
        elif max_tokens > room:
            raise InvalidRequestError(
                f"the prompt ({prompt_tokens} tokens) plus max_tokens ({max_tokens}) exceeds "
                f"this model's context (max_model_len) of {limit} tokens; "
                f"ask for at most {room} tokens"
            )
        try:
            return SamplingParams(
                max_tokens=max_tokens,
                temperature=1.0 if request.temperature is None else request.temperature,
                top_p=1.0 if request.top_p is None else request.top_p,
                top_k=extra.get("top_k", 0),
                min_p=extra.get("min_p", 0.0),
                seed=request.seed,
                stop=tuple(request.stop_list()),
                stop_token_ids=tuple(extra.get("stop_token_ids", ())),
                ignore_eos=extra.get("ignore_eos", False),
                presence_penalty=request.presence_penalty or 0.0,
                frequency_penalty=request.frequency_penalty or 0.0,
                logprobs=bool(request.logprobs),
                top_logprobs=request.top_logprobs or 0,
                grammar=grammar,
            )
        except ValueError as exc:
            raise InvalidRequestError(f"invalid sampling parameters: {exc}") from exc

    @property
    def max_prompt_bytes(self) -> int:
        """A prompt longer than this many UTF-8 bytes cannot fit ``max_model_len`` tokens."""
        return self.max_model_len * self.tokenizer.max_token_bytes

    def prepare(self, request: ChatRequest) -> PreparedRequest:
        """Render and encode the prompt, and map the sampling parameters and salt.

        Blocking (rendering and tokenizing); :meth:`stream` and :meth:`complete` run it in a
        worker thread. A prompt too long for the model by its size alone is refused before
        it is rendered or tokenized.
        """
        _check_supported(request)
        extra = _extra(request)
        limit = self.max_prompt_bytes
        chars = sum(len(message.text()) for message in request.messages)
        if chars > limit:  # characters never outnumber bytes
            raise InvalidRequestError(
                f"the messages hold {chars} characters, more than this model's context "
                f"(max_model_len {self.max_model_len} tokens) can hold ({limit} bytes at most)"
            )
        try:
            prompt = self.formatter.prepare(request, max_bytes=limit)
        except RecursionError as exc:
            raise InvalidRequestError("the request nests too deeply to render") from exc
        grammar = self._grammar(request, prompt)
        params = self._params(request, extra, len(prompt.token_ids), grammar)
        salt = extra.get("cache_salt") or request.user or None
        return PreparedRequest(prompt, params, salt)

    def _grammar(self, request: ChatRequest, prompt: ChatPrompt) -> Grammar | None:
        """The reply's grammar, compiled (and cached) for the engine's tokenizer here, in the
        worker thread, so the engine only copies it."""
        grammar = request_grammar(
            request, prompt.tool_format, added_tokens=self.tokenizer.added_tokens
        )
        structured = self.engine.structured
        if grammar is not None and structured is not None:
            structured.compile(grammar)
        return grammar

    # ------------------------------------------------------------------ responses

    @asynccontextmanager
    async def stream(
        self, source: OutputSource, request: ChatRequest, *, include_usage: bool = True
    ) -> AsyncIterator[AsyncIterator[ChatCompletionChunk]]:
        """Run ``request`` on ``source`` and yield an iterator of OpenAI stream chunks.

        Errors in the request, and :class:`~local_engine.errors.OverloadedError`, surface on
        entry; leaving the block aborts the engine request (its KV blocks are freed).
        """
        prepared = await anyio.to_thread.run_sync(self.prepare, request)
        async with _add(source, prepared) as outputs:
            yield _ChunkIterator(self, outputs, request.model, prepared, include_usage)

    async def complete(self, source: OutputSource, request: ChatRequest) -> ChatCompletion:
        """Run ``request`` on ``source`` to the end and return the whole completion."""
        prepared = await anyio.to_thread.run_sync(self.prepare, request)
        texts: list[str] = []
        logprobs: list[dict[str, Any]] | None = [] if prepared.params.logprobs else None
        async with _add(source, prepared) as outputs:
            async for out in outputs:
                _check_output(out)
                texts.append(out.new_text)
                if logprobs is not None and out.logprobs:
                    logprobs.extend(self.logprob_entries(out.logprobs))
                if out.finished:
                    completion = build_completion(
                        "".join(texts),
                        model=request.model,
                        finish_reason=out.finish_reason,
                        prompt_tokens=out.num_prompt_tokens,
                        completion_tokens=out.num_generated_tokens,
                        cached_tokens=out.num_cached_tokens,
                        tool_format=prepared.prompt.tool_format,
                        predictions=_predictions(out),
                    )
                    if logprobs is not None:
                        completion.choices[0].logprobs = {"content": logprobs}
                    return completion
        raise EngineError("the engine ended the request without a final output")

    def logprob_entries(self, logprobs: Sequence[TokenLogprob]) -> list[dict[str, Any]]:
        """OpenAI ``logprobs.content`` entries for generated tokens."""
        entries = []
        for item in logprobs:
            entry = self._token_entry(item.token_id, item.logprob)
            entry["top_logprobs"] = [self._token_entry(t, lp) for t, lp in item.top_logprobs]
            entries.append(entry)
        return entries

    def _token_entry(self, token_id: int, logprob: float) -> dict[str, Any]:
        return {
            "token": self.tokenizer.token_text(token_id),
            "logprob": logprob,
            "bytes": list(self.tokenizer.token_bytes(token_id)),
        }


@asynccontextmanager
async def _add(
    source: OutputSource, prepared: PreparedRequest
) -> AsyncIterator[AsyncIterator[RequestOutput]]:
    """Add the request to the engine (which raises InvalidRequestError for a bad one)."""
    async with source.stream(
        prepared.prompt.token_ids, prepared.params, cache_salt=prepared.cache_salt
    ) as outputs:
        yield outputs


def _check_output(out: RequestOutput) -> None:
    if out.finish_reason == "abort":
        raise EngineError("the local engine shut down before the request finished")
    if out.finish_reason == "error":
        raise GrammarFailedError(
            "the reply's grammar (response_format or forced tool call) failed while decoding, "
            f"so the reply would not follow it: {out.error}; simplify the schema"
        )


class _ChunkIterator:
    """One request's engine outputs as OpenAI chunks: role, content, tool calls, finish, usage."""

    __slots__ = ("_done", "_held_logprobs", "_outputs", "_pending", "_service", "_stream", "_usage")

    def __init__(
        self,
        service: ChatService,
        outputs: AsyncIterator[RequestOutput],
        model: str,
        prepared: PreparedRequest,
        include_usage: bool,
    ) -> None:
        self._service = service
        self._outputs = outputs
        self._stream = CompletionStream(model=model, tool_format=prepared.prompt.tool_format)
        self._usage = include_usage
        self._held_logprobs: list[dict[str, Any]] = []
        self._pending: deque[ChatCompletionChunk] = deque([self._stream.start()])
        self._done = False

    def __aiter__(self) -> _ChunkIterator:
        return self

    async def __anext__(self) -> ChatCompletionChunk:
        while not self._pending:
            if self._done:
                raise StopAsyncIteration
            try:
                out = await self._outputs.__anext__()
            except StopAsyncIteration:
                self._done = True
                raise EngineError("the engine ended the request without a final output") from None
            self._absorb(out)
        return self._pending.popleft()

    def _absorb(self, out: RequestOutput) -> None:
        _check_output(out)
        if out.logprobs:
            self._held_logprobs.extend(self._service.logprob_entries(out.logprobs))
        chunk = self._stream.push(out.new_text) if out.new_text else None
        if chunk is not None:
            self._attach_logprobs(chunk)
            self._pending.append(chunk)
        if not out.finished:
            return
        self._done = True
        closing = self._stream.finish(
            out.finish_reason,
            prompt_tokens=out.num_prompt_tokens,
            completion_tokens=out.num_generated_tokens,
            cached_tokens=out.num_cached_tokens,
            include_usage=self._usage,
            predictions=_predictions(out),
        )
        self._attach_logprobs(closing[0])
        self._pending.extend(closing)

    def _attach_logprobs(self, chunk: ChatCompletionChunk) -> None:
        if self._held_logprobs and chunk.choices:
            chunk.choices[0].logprobs = {"content": self._held_logprobs}
            self._held_logprobs = []


def _predictions(out: RequestOutput) -> tuple[int, int] | None:
    """``(accepted, rejected)`` draft tokens of a request that speculated, else None."""
    spec = out.spec
    if spec is None:
        return None
    return spec.num_accepted_tokens, spec.num_draft_tokens - spec.num_accepted_tokens
