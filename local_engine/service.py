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
  is a :class:`~local_engine.errors.GrammarFailedError` (400 from the server), never a reply.
  Tools under ``tool_choice="auto"`` (or unset) get the tool-call grammar lazily, from the
  ``<tool_call>`` token on (:func:`~local_engine.grammar.auto_tool_grammar`: a tool whose
  schema cannot be compiled keeps its name and takes any arguments, logged);
- ``temperature``, ``top_p``, ``max_completion_tokens`` (else ``max_tokens``), ``stop``,
  ``seed``, ``presence_penalty``, ``frequency_penalty``, ``logprobs`` and ``top_logprobs``
  map one to one. A field the request leaves unset takes the model's default
  (``sampling_defaults``, read from its ``generation_config.json``: see
  :mod:`local_engine.generation`), else OpenAI's. With no token limit a request may generate
  ``default_max_tokens`` (or the model's ``max_new_tokens`` when smaller), fewer when the
  model's context is shorter;
- ``extra_body`` may carry vLLM's extensions ``top_k``, ``min_p``, ``min_tokens``,
  ``repetition_penalty``, ``ignore_eos`` and ``stop_token_ids``, and ``cache_salt``,
  ``chat_template_kwargs``, ``continuous_usage_stats`` (a streamed reply carries the
  running usage on every chunk) and ``tool_grammar`` (``False``: no grammar for
  ``tool_choice="auto"``); any other key is ignored, as the HTTP server ignores an
  unknown field (a warning names it, once per name);
- the prefix-cache salt (which keeps tenants from sharing cached prompt blocks) is
  ``extra_body["cache_salt"]``, else ``user``. ``prompt_cache_key`` is a routing hint for
  hosted providers and is ignored here: one engine has one cache;
- a prompt is rendered and tokenized in a worker thread, never on the event loop, and one
  too long for ``max_model_len`` by its size alone is refused before it is tokenized;
- ``n > 1`` (up to :data:`MAX_N`) samples that many choices of one prompt, which share its
  KV blocks through the prefix cache (see :func:`_fan_out`); usage counts the prompt once
  and every choice's tokens. A non-empty ``logit_bias`` is refused;
  ``parallel_tool_calls=False`` allows one call where a grammar applies (forced or
  ``auto``); ``metadata``, ``service_tier`` and ``reasoning_effort`` have no effect.

Errors are the engine's own (:mod:`local_engine.errors`): every request the engine or this
layer refuses is an :class:`~local_engine.errors.InvalidRequestError`, which the server
answers with 400 and ``LocalBackend`` raises as ``BadRequestError``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import deque
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import anyio
import anyio.to_thread

from swiftclient.types import ChatCompletion, ChatCompletionChunk, ChatRequest, Usage
from swiftclient.wire import listed_names, mark_matched_stop, printable_name

from .chat import ChatFormatter, ChatPrompt, CompletionStream, build_completion, make_usage
from .engine import Engine, RequestOutput
from .errors import EngineConfigError, EngineError, GrammarFailedError, InvalidRequestError
from .grammar import Grammar, request_grammar
from .sampling_params import SamplingParams, TokenLogprob
from .stop import stop_token_ids
from .tokenizer import Tokenizer
from .tool_calls import tool_call_marker

__all__ = [
    "EXTRA_BODY_KEYS",
    "ChatChunks",
    "ChatService",
    "OutputSource",
    "PreparedRequest",
]

EXTRA_BODY_KEYS = frozenset(
    {
        "top_k",
        "min_p",
        "min_tokens",
        "repetition_penalty",
        "ignore_eos",
        "stop_token_ids",
        "cache_salt",
        "chat_template_kwargs",
        "continue_final_message",
        "add_generation_prompt",
        "continuous_usage_stats",
        "tool_grammar",
    }
)
"""The ``extra_body`` keys the local engine understands."""


_log = logging.getLogger("local_engine.service")

MAX_N = 16
"""The most choices (``n``) one request may ask for."""


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

    def stream_choices(
        self,
        prompt_ids: Sequence[int],
        params: Sequence[SamplingParams],
        *,
        cache_salt: str | None = None,
    ) -> AbstractAsyncContextManager[AsyncIterator[tuple[int, RequestOutput]]]:
        """Add one request per ``params`` for the prompt, the first computing it and the
        others sharing its KV blocks; yield their outputs as ``(index, output)`` pairs in
        the order they come, read in the caller's task (no task group spans the block);
        abort them on exit."""
        ...


@dataclass(frozen=True)
class PreparedRequest:
    """A request ready for the engine: prompt, sampling parameters and cache salt."""

    prompt: ChatPrompt
    params: SamplingParams
    cache_salt: str | None


class NamesSeen:
    """Field names a client chose, each logged the first time it comes: at most ``limit``
    remembered (a client may send any number of names)."""

    __slots__ = ("limit", "names")

    def __init__(self, limit: int = 1000) -> None:
        self.limit = limit
        self.names: set[str] = set()

    def new(self, names: set[str]) -> list[str]:
        """Of ``names`` (printable), those not seen before, sorted, and now remembered (up
        to the limit); none once the limit is reached."""
        if len(self.names) >= self.limit:
            return []
        new = sorted(names - self.names)
        self.names.update(new[: self.limit - len(self.names)])
        return new


def unread_keys(extra_body: dict[str, Any] | None) -> set[str]:
    """The ``extra_body`` keys the engine does not read, escaped to printable ASCII (as
    they are named in a header and a log line)."""
    return {printable_name(key) for key in extra_body or () if key not in EXTRA_BODY_KEYS}


_ignored_logged = NamesSeen()


def _extra(request: ChatRequest) -> dict[str, Any]:
    """The ``extra_body`` keys the engine reads, checked; others are ignored (as the HTTP
    server ignores unknown fields, and vLLM does), each name logged once per process."""
    # null is absent, as OpenAI's own optional fields are
    body = request.extra_body or {}
    extra = {k: v for k, v in body.items() if k in EXTRA_BODY_KEYS and v is not None}
    new = _ignored_logged.new(unread_keys(body)) if body else []
    if new:
        _log.warning(
            "ignoring extra_body keys the local engine does not use: %s (it reads: %s)",
            listed_names(new),
            ", ".join(sorted(EXTRA_BODY_KEYS)),
        )
    for flag in ("ignore_eos", "continuous_usage_stats", "tool_grammar"):
        if flag in extra and not isinstance(extra[flag], bool):
            param = "stream_options." + flag if flag == "continuous_usage_stats" else flag
            raise InvalidRequestError(f"{_sent_as(param)} must be a boolean", param)
    salt = extra.get("cache_salt")
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise InvalidRequestError(
            f"{_sent_as('cache_salt')} must be a non-empty string", "cache_salt"
        )
    stop_ids = extra.get("stop_token_ids")
    if stop_ids is not None and not isinstance(stop_ids, list | tuple):
        raise InvalidRequestError(
            f"{_sent_as('stop_token_ids')} must be a list of token ids", "stop_token_ids"
        )
    return extra


def _sent_as(param: str) -> str:
    """An extension field as a request may send it: at the top level (as the local server
    takes it) or in ``extra_body`` (as OpenAI's SDKs send it); a stream option as itself."""
    return param if "." in param else f"{param} (at the top level or in extra_body)"


_NOT_OBJECT = ("string", "number", "integer", "boolean", "array", "null")


def _allows_no_object(kind: Any) -> bool:
    """Whether a schema's ``type`` allows a value that is not an object (a type name that
    is none, such as ``"strin"``, is left for the grammar compiler to explain)."""
    if isinstance(kind, list):
        return any(item != "object" for item in kind)
    return kind in _NOT_OBJECT


def _not_an_object(params: Mapping[str, Any]) -> str | None:
    """What keeps a tool's parameter schema from being an object schema (its ``type``, or
    a top-level ``anyOf``/``oneOf`` branch's, allowing more than an object), or None. A
    call's arguments are an object: under a schema that allows a string the model wrote
    one, and the reply came back as text holding the raw call."""
    kind = params.get("type")
    if _allows_no_object(kind):
        return f"type {kind!r}"
    for key in ("anyOf", "oneOf"):
        branches = params.get(key)
        for branch in branches if isinstance(branches, list) else ():
            inner = branch.get("type") if isinstance(branch, Mapping) else None
            if _allows_no_object(inner):
                return f"{'an' if key == 'anyOf' else 'a'} {key} branch of type {inner!r}"
    return None


def _check_tools(request: ChatRequest) -> None:
    """Tools a model can be asked to call: each named, names unique, parameters an object
    schema (OpenAI refuses the same with a 400)."""
    seen: set[str] = set()
    for i, tool in enumerate(request.tools or ()):
        name, params = tool.function.name, tool.function.parameters
        if not name.strip():
            raise InvalidRequestError(f"tools[{i}].function.name must not be empty", "tools")
        if name in seen:
            raise InvalidRequestError(
                f"tools[{i}] repeats the name {name!r} of another tool", "tools"
            )
        seen.add(name)
        wrong = None if params is None else _not_an_object(params)
        if wrong is not None:
            raise InvalidRequestError(
                f"tools[{i}].function.parameters must be an object schema (got {wrong})",
                "tools",
            )


def _check_supported(request: ChatRequest) -> None:
    _check_tools(request)
    if request.n is not None and request.n > MAX_N:
        raise InvalidRequestError(f"n={request.n} is over the local engine's limit of {MAX_N}", "n")
    if request.logit_bias:
        raise InvalidRequestError("logit_bias is not supported by the local engine", "logit_bias")


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
        sampling_defaults: Mapping[str, float | int] | None = None,
    ) -> None:
        """Bind the engine and its tokenizer; EngineConfigError when it has no tokenizer.

        ``sampling_defaults`` (see :func:`~local_engine.generation.read_sampling_defaults`)
        fill the sampling fields a request leaves unset."""
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
        self.sampling_defaults: dict[str, float | int] = dict(sampling_defaults or {})
        """The model's sampling defaults, applied to fields a request leaves unset."""
        self.formatter = ChatFormatter(
            self.tokenizer, chat_template=chat_template, tool_format=tool_format
        )
        self._name_markers: list[str] | None = None  # added tokens no tool name may hold

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
        banned: tuple[int, ...] = (),
    ) -> SamplingParams:
        limit = self.max_model_len
        room = limit - prompt_tokens
        if room < 1:
            raise InvalidRequestError(
                f"the prompt is {prompt_tokens} tokens, but this model's context "
                f"(max_model_len) is {limit} tokens, leaving no room for a reply",
                "messages",
            )
        defaults = self.sampling_defaults
        max_tokens = request.max_new_tokens()
        if max_tokens is None:
            default = int(defaults.get("max_new_tokens", self.default_max_tokens))
            max_tokens = min(self.default_max_tokens, default, room)
        elif max_tokens > room:
            raise InvalidRequestError(
                f"the prompt ({prompt_tokens} tokens) plus max_tokens ({max_tokens}) exceeds "
                f"this model's context (max_model_len) of {limit} tokens; "
                f"ask for at most {room} tokens",
                "max_completion_tokens" if request.max_completion_tokens else "max_tokens",
            )
        try:
            return SamplingParams(
                max_tokens=max_tokens,
                temperature=_pick(request.temperature, defaults.get("temperature"), 1.0),
                top_p=_pick(request.top_p, defaults.get("top_p"), 1.0),
                top_k=_pick(_top_k(extra.get("top_k")), defaults.get("top_k"), 0),
                min_p=_pick(extra.get("min_p"), defaults.get("min_p"), 0.0),
                min_tokens=extra.get("min_tokens", 0),
                repetition_penalty=_pick(
                    extra.get("repetition_penalty"), defaults.get("repetition_penalty"), 1.0
                ),
                seed=request.seed,
                stop=tuple(request.stop_list()),
                stop_token_ids=tuple(extra.get("stop_token_ids", ())),
                ignore_eos=extra.get("ignore_eos", False),
                presence_penalty=request.presence_penalty or 0.0,
                frequency_penalty=request.frequency_penalty or 0.0,
                logprobs=bool(request.logprobs),
                top_logprobs=request.top_logprobs or 0,
                grammar=grammar,
                banned_token_ids=banned,
            )
        except ValueError as exc:
            raise InvalidRequestError(
                f"invalid sampling parameters: {exc}", _sampling_param(str(exc), request)
            ) from exc

    def _markup_ids(self, prompt: ChatPrompt) -> tuple[int, ...]:
        """The token that opens a tool call, when no tools were offered and the marker is
        one token (``<tool_call>`` in Qwen's and the embedded model's vocabularies): the
        reply may not start a call it cannot make."""
        marker = tool_call_marker(prompt.markup_format)
        token = self.tokenizer.token_to_id(marker) if marker is not None else None
        return () if token is None else (token,)

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
        self._check_tool_names(request)
        extra = _extra(request)
        limit = self.max_prompt_bytes
        chars = sum(len(message.text()) for message in request.messages)
        if chars > limit:  # characters never outnumber bytes
            raise InvalidRequestError(
                f"the messages hold {chars} characters, more than this model's context "
                f"(max_model_len {self.max_model_len} tokens) can hold ({limit} bytes at most)",
                "messages",
            )
        try:
            prompt = self.formatter.prepare(request, max_bytes=limit)
        except RecursionError as exc:
            raise InvalidRequestError("the request nests too deeply to render") from exc
        grammar = self._grammar(request, prompt, auto=extra.get("tool_grammar", True))
        params = self._params(
            request, extra, len(prompt.token_ids), grammar, self._markup_ids(prompt)
        )
        salt = extra.get("cache_salt") or request.user or None
        return PreparedRequest(prompt, params, salt)

    def count_prompt(self, request: ChatRequest) -> int:
        """The prompt tokens ``request`` renders to, with no limit of the model's context
        (counting a prompt that does not fit says by how much). Blocking (tokenizing)."""
        _check_supported(request)
        self._check_tool_names(request)
        try:
            return len(self.formatter.prepare(request).token_ids)
        except RecursionError as exc:
            raise InvalidRequestError("the request nests too deeply to render") from exc

    def _check_tool_names(self, request: ChatRequest) -> None:
        """Tool names the model can write: no whitespace or control characters, and none of
        the tokenizer's added tokens (``<tool_call>``, ``<|im_end|>``...), which the model
        writes as tokens of their own, so a call could never spell the name (and its
        markup would end the call early)."""
        if not request.tools:
            return
        markers = self._name_markers
        if markers is None:
            markers = self._name_markers = [
                text for text in self.tokenizer.added_tokens if len(text.strip()) > 1
            ]
        for i, tool in enumerate(request.tools):
            name = tool.function.name
            if any(char.isspace() or not char.isprintable() for char in name):
                raise InvalidRequestError(
                    f"tools[{i}].function.name {name!r} holds whitespace or a control "
                    "character; a tool name is one word (OpenAI allows a-z, A-Z, 0-9, _ and -)",
                    "tools",
                )
            marker = next((m for m in markers if m in name), None)
            if marker is not None:
                raise InvalidRequestError(
                    f"tools[{i}].function.name {name!r} holds {marker!r}, one of this model's "
                    "special tokens, which no call could spell",
                    "tools",
                )

    def prepare_text(
        self,
        request: ChatRequest,
        prompt: str | Sequence[int],
        *,
        prompt_logprobs: int | None = None,
        score_only: bool = False,
    ) -> PreparedRequest:
        """A legacy text completion: ``prompt`` (text, or token ids) goes to the model as it
        is, with no chat template; the sampling fields, ``extra_body`` and the cache salt
        come from ``request`` (whose messages are not used). ``prompt_logprobs``: the
        prompt's logprobs with that many alternatives; ``score_only``: nothing is generated
        (the prompt may then fill the whole context). Blocking (tokenizing)."""
        _check_supported(request)
        extra = _extra(request)
        if isinstance(prompt, str):
            if len(prompt) > self.max_prompt_bytes:
                raise InvalidRequestError(
                    f"the prompt holds {len(prompt)} characters, more than this model's "
                    f"context (max_model_len {self.max_model_len} tokens) can hold",
                    "prompt",
                )
            try:
                prompt.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise InvalidRequestError(
                    f"the prompt is not valid Unicode text: {exc}", "prompt"
                ) from exc
            text, ids = prompt, self.tokenizer.encode(prompt, add_special_tokens=True)
        else:
            ids = list(prompt)
            vocab = self.engine.model.config.vocab_size
            if any(
                isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab for t in ids
            ):
                raise InvalidRequestError(
                    f"prompt token ids must be ints in [0, {vocab})", "prompt"
                )
            text = self.tokenizer.decode(ids, skip_special_tokens=False)
        if not ids:
            raise InvalidRequestError("the prompt is empty", "prompt")
        limit = self.max_model_len
        if len(ids) > limit or (len(ids) == limit and not score_only):
            room = "" if score_only else ", leaving no room for a reply"
            raise InvalidRequestError(
                f"the prompt is {len(ids)} tokens, but this model's context (max_model_len) "
                f"is {limit} tokens{room}",
                "prompt",
            )
        # a scored prompt needs no room for a reply: its params are made as for one token
        params = self._params(request, extra, len(ids) - score_only)
        try:
            params = dataclasses.replace(
                params,
                max_tokens=0 if score_only else params.max_tokens,
                prompt_logprobs=prompt_logprobs,
            )
        except ValueError as exc:
            raise InvalidRequestError(f"invalid sampling parameters: {exc}", "prompt") from exc
        salt = extra.get("cache_salt") or request.user or None
        return PreparedRequest(ChatPrompt(text, ids, "none"), params, salt)

    def generate(
        self, source: OutputSource, prepared: PreparedRequest
    ) -> AbstractAsyncContextManager[AsyncIterator[RequestOutput]]:
        """Add a prepared request to ``source`` and yield its raw engine outputs (the
        engine's request errors are InvalidRequestErrors); leaving the block aborts it."""
        return _add(source, prepared)

    def _grammar(
        self, request: ChatRequest, prompt: ChatPrompt, *, auto: bool = True
    ) -> Grammar | None:
        """The reply's grammar, compiled (and cached) for the engine's tokenizer here, in the
        worker thread, so the engine only copies it."""
        structured = self.engine.structured
        grammar = request_grammar(
            request,
            prompt.tool_format,
            added_tokens=self.tokenizer.added_tokens,
            check=structured.compile if structured is not None else None,
            auto=auto,
        )
        if grammar is not None and structured is not None:
            structured.compile(grammar)  # cached: "auto"'s grammar was compiled by its check
        return grammar

    # ------------------------------------------------------------------ responses

    @asynccontextmanager
    async def stream(
        self, source: OutputSource, request: ChatRequest, *, include_usage: bool = True
    ) -> AsyncIterator[ChatChunks]:
        """Run ``request`` on ``source`` and yield an iterator of OpenAI stream chunks
        (:class:`ChatChunks`: :meth:`ChatChunks.usage_so_far` counts the tokens so far).

        Errors in the request, and :class:`~swiftclient.errors.OverloadedError`, surface on
        entry; leaving the block aborts the engine request (its KV blocks are freed). With
        ``n > 1`` the choices' chunks interleave, each with its ``index``.
        """
        prepared = await anyio.to_thread.run_sync(self.prepare, request)
        continuous = include_usage and bool(
            (request.extra_body or {}).get("continuous_usage_stats")
        )
        n = request.n or 1
        async with _fan_out(source, prepared, n) as outputs:
            chunks = ChatChunks(
                self, outputs, request.model, prepared, include_usage, continuous=continuous
            )
            yield chunks.open(n, request.model, prepared)

    async def complete(self, source: OutputSource, request: ChatRequest) -> ChatCompletion:
        """Run ``request`` on ``source`` to the end and return the whole completion (with
        ``n > 1``, ``n`` choices; usage counts the prompt once)."""
        prepared = await anyio.to_thread.run_sync(self.prepare, request)
        n = request.n or 1
        texts: list[list[str]] = [[] for _ in range(n)]
        logprobs: list[list[dict[str, Any]]] = [[] for _ in range(n)]
        finals: dict[int, RequestOutput] = {}
        async with _fan_out(source, prepared, n) as outputs:
            async for index, out in outputs:
                _check_output(out)
                texts[index].append(out.new_text)
                if prepared.params.logprobs and out.logprobs:
                    shown = self.shown_logprobs(out, prepared.params)
                    logprobs[index].extend(self.logprob_entries(shown))
                if out.finished:
                    finals[index] = out
                    if len(finals) == n:
                        break
        if len(finals) < n:
            raise EngineError("the engine ended the request without a final output")
        choices = []
        for index in range(n):
            out = finals[index]
            completion = build_completion(
                "".join(texts[index]),
                model=request.model,
                finish_reason=out.finish_reason,
                prompt_tokens=out.num_prompt_tokens,
                completion_tokens=out.num_generated_tokens,
                cached_tokens=out.num_cached_tokens,
                tool_format=prepared.prompt.tool_format,
                predictions=_predictions(out),
                markup_format=prepared.prompt.markup_format,
                stop_string=out.stop_string,
            )
            choice = completion.choices[0]
            choice.index = index
            if out.stop_string is not None:
                mark_matched_stop(choice, out.stop_string)
            if prepared.params.logprobs:
                choice.logprobs = {"content": logprobs[index]}
            choices.append(choice)
        completion.choices = choices
        completion.usage = _usage([finals[i] for i in range(n)])
        return completion

    def shown_logprobs(self, out: RequestOutput, params: SamplingParams) -> list[TokenLogprob]:
        """``out``'s logprobs without the token that ended the reply by being an end or
        stop token: its text is not in the content, so its entry would not be either."""
        logprobs = list(out.logprobs or ())
        if (
            logprobs
            and out.finished
            and out.finish_reason == "stop"
            and out.stop_string is None
            and logprobs[-1].token_id in stop_token_ids(params, self.engine.eos_token_ids)
        ):
            logprobs.pop()
        return logprobs

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


_SAMPLING_FIELDS = frozenset(
    {
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "min_tokens",
        "repetition_penalty",
        "seed",
        "stop",
        "stop_token_ids",
        "presence_penalty",
        "frequency_penalty",
        "logprobs",
        "top_logprobs",
    }
)


def _sampling_param(message: str, request: ChatRequest) -> str | None:
    """The request field a :class:`SamplingParams` error names first (its messages start
    with the field: ``"top_k must be >= 0, got -5"``), or None."""
    name = message.split(" ", 1)[0]
    if name == "max_tokens":
        return "max_completion_tokens" if request.max_completion_tokens else "max_tokens"
    return name if name in _SAMPLING_FIELDS else None


def _top_k(value: Any) -> Any:
    """vLLM's ``top_k=-1`` (no top-k) is this engine's 0."""
    return 0 if value == -1 and not isinstance(value, bool) else value


def _pick(value: Any, default: Any, fallback: Any) -> Any:
    """The request's value, else the model's default, else OpenAI's."""
    if value is not None:
        return value
    return fallback if default is None else default


@asynccontextmanager
async def _add(
    source: OutputSource, prepared: PreparedRequest
) -> AsyncIterator[AsyncIterator[RequestOutput]]:
    """Add the request to the engine (which raises InvalidRequestError for a bad one)."""
    async with source.stream(
        prepared.prompt.token_ids, prepared.params, cache_salt=prepared.cache_salt
    ) as outputs:
        yield outputs


def _choice_params(params: SamplingParams, index: int) -> SamplingParams:
    """Choice ``index`` of an ``n > 1`` request: a seeded request's choices get the seeds
    ``seed``, ``seed + 1``... (as vLLM seeds them), so they differ and repeat."""
    if index == 0 or params.seed is None:
        return params
    return dataclasses.replace(params, seed=(params.seed + index) % 2**63)


@asynccontextmanager
async def _fan_out(
    source: OutputSource, prepared: PreparedRequest, n: int
) -> AsyncIterator[AsyncIterator[tuple[int, RequestOutput]]]:
    """The engine outputs of ``n`` choices of one prompt, each with its choice index.

    Every choice is added on entry, at once (errors surface there): choice 0 computes the
    prompt, and the others start once its full KV blocks are computed, take them from the
    prefix cache (shared, not copied) and compute only the last partial block
    (:meth:`OutputSource.stream_choices`). Leaving the block aborts every choice still
    running.
    """
    if n == 1:
        async with _add(source, prepared) as outputs:
            yield _Indexed(outputs)
        return
    params = [_choice_params(prepared.params, index) for index in range(n)]
    async with source.stream_choices(
        prepared.prompt.token_ids, params, cache_salt=prepared.cache_salt
    ) as merged:
        yield merged


class _Indexed:
    """One request's outputs as choice 0."""

    __slots__ = ("_outputs",)

    def __init__(self, outputs: AsyncIterator[RequestOutput]) -> None:
        self._outputs = outputs

    def __aiter__(self) -> _Indexed:
        return self

    async def __anext__(self) -> tuple[int, RequestOutput]:
        return 0, await self._outputs.__anext__()


def _usage(finals: Sequence[RequestOutput]) -> Usage:
    """Usage of a request's choices: the prompt once, every choice's tokens."""
    first = finals[0]
    spec = [p for p in (_predictions(out) for out in finals) if p is not None]
    predictions = (sum(a for a, _ in spec), sum(r for _, r in spec)) if spec else None
    return make_usage(
        first.num_prompt_tokens,
        sum(out.num_generated_tokens for out in finals),
        first.num_cached_tokens,
        predictions,
    )


def _check_output(out: RequestOutput) -> None:
    if out.finish_reason == "abort":
        raise EngineError("the local engine shut down before the request finished")
    if out.finish_reason == "error":
        raise GrammarFailedError(
            "the reply's grammar (response_format or forced tool call) failed while decoding, "
            f"so the reply would not follow it: {out.error}; simplify the schema"
        )


class ChatChunks:
    """A request's engine outputs as OpenAI chunks: role, content, tool calls, finish, usage.

    Chunking rule: one content chunk per engine output whose new text is not empty (a step
    may bring several tokens, with speculative decoding; a token whose text is still
    incomplete, a partial UTF-8 sequence or a held-back stop-string prefix, adds its text to
    a later chunk), so chunks do not count tokens. With ``continuous_usage_stats`` every
    chunk carries ``usage`` with the tokens generated so far, as vLLM sends it. With
    ``n > 1`` each choice's chunks carry its ``index``; the usage chunk comes after every
    choice finished and counts the prompt once.
    """

    __slots__ = (
        "_continuous",
        "_done",
        "_finals",
        "_held_logprobs",
        "_latest",
        "_n",
        "_outputs",
        "_pending",
        "_prompt_tokens",
        "_params",
        "_service",
        "_streams",
        "_usage",
    )

    def __init__(
        self,
        service: ChatService,
        outputs: AsyncIterator[tuple[int, RequestOutput]],
        model: str,
        prepared: PreparedRequest,
        include_usage: bool,
        *,
        continuous: bool = False,
    ) -> None:
        self._service = service
        self._params = prepared.params
        self._continuous = continuous
        self._outputs = outputs
        first = CompletionStream(
            model=model,
            tool_format=prepared.prompt.tool_format,
            markup_format=prepared.prompt.markup_format,
        )
        self._n = 1
        self._streams = [first]
        self._usage = include_usage
        self._prompt_tokens = len(prepared.prompt.token_ids)
        self._latest: dict[int, RequestOutput] = {}
        self._finals: dict[int, RequestOutput] = {}
        self._held_logprobs: list[list[dict[str, Any]]] = [[]]
        self._pending: deque[ChatCompletionChunk] = deque()
        self._done = False

    def open(self, n: int, model: str, prepared: PreparedRequest) -> ChatChunks:
        """Serve ``n`` choices (their streams share the first one's id and timestamp)."""
        first = self._streams[0]
        for _ in range(1, n):
            self._streams.append(
                CompletionStream(
                    model=model,
                    tool_format=prepared.prompt.tool_format,
                    markup_format=prepared.prompt.markup_format,
                    completion_id=first.id,
                    created=first.created,
                )
            )
            self._held_logprobs.append([])
        self._n = n
        for index, stream in enumerate(self._streams):
            self._pending.append(_indexed(stream.start(), index))
        return self

    def __aiter__(self) -> ChatChunks:
        return self

    async def __anext__(self) -> ChatCompletionChunk:
        while not self._pending:
            if self._done:
                raise StopAsyncIteration
            try:
                index, out = await self._outputs.__anext__()
            except StopAsyncIteration:
                self._done = True
                raise EngineError("the engine ended the request without a final output") from None
            self._absorb(index, out)
        chunk = self._pending.popleft()
        if self._continuous and chunk.choices:
            chunk.usage = self.usage_so_far()
        return chunk

    def usage_so_far(self) -> Usage:
        """The tokens of the prompt and those generated so far (every choice's), as a
        stream cut short reports them (a client that disconnected, say)."""
        outs = list(self._latest.values())
        if not outs:
            return make_usage(self._prompt_tokens, 0)
        first = self._latest.get(0, outs[0])
        generated = sum(out.num_generated_tokens for out in outs)
        return make_usage(first.num_prompt_tokens, generated, first.num_cached_tokens)

    def _absorb(self, index: int, out: RequestOutput) -> None:
        _check_output(out)
        self._latest[index] = out
        stream = self._streams[index]
        if out.logprobs:
            shown = self._service.shown_logprobs(out, self._params)
            self._held_logprobs[index].extend(self._service.logprob_entries(shown))
        chunk = stream.push(out.new_text) if out.new_text else None
        if chunk is not None:
            self._attach_logprobs(chunk, index)
            self._pending.append(_indexed(chunk, index))
        if not out.finished:
            return
        self._finals[index] = out
        closing = stream.finish(
            out.finish_reason,
            prompt_tokens=out.num_prompt_tokens,
            completion_tokens=out.num_generated_tokens,
            stop_string=out.stop_string,
        )
        if out.stop_string is not None:  # on the finish chunk: which stop string ended it
            for chunk in closing:
                for choice in chunk.choices:
                    if choice.finish_reason is not None:
                        mark_matched_stop(choice, out.stop_string)
        self._attach_logprobs(closing[0], index)
        self._pending.extend(_indexed(c, index) for c in closing)
        if len(self._finals) < self._n:
            return
        self._done = True
        if self._usage:
            first = self._streams[0]
            usage = _usage([self._finals[i] for i in range(self._n)])
            self._pending.append(
                ChatCompletionChunk(
                    id=first.id, created=first.created, model=first.model, choices=[], usage=usage
                )
            )

    def _attach_logprobs(self, chunk: ChatCompletionChunk, index: int) -> None:
        if self._held_logprobs[index] and chunk.choices:
            chunk.choices[0].logprobs = {"content": self._held_logprobs[index]}
            self._held_logprobs[index] = []


def _indexed(chunk: ChatCompletionChunk, index: int) -> ChatCompletionChunk:
    """``chunk`` with its choices numbered ``index``."""
    for choice in chunk.choices:
        choice.index = index
    return chunk


def _predictions(out: RequestOutput) -> tuple[int, int] | None:
    """``(accepted, rejected)`` draft tokens of a request that speculated, else None."""
    spec = out.spec
    if spec is None:
        return None
    return spec.num_accepted_tokens, spec.num_draft_tokens - spec.num_accepted_tokens
