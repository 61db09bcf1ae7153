"""The synchronous engine: ``add_request`` / ``step`` / ``abort`` over one model.

Not thread-safe: one caller drives it (see :mod:`local_engine.async_engine` for the
concurrent front end).
"""

from __future__ import annotations

import logging
import operator
import uuid
from collections import deque
from collections.abc import Sequence as SequenceABC
from dataclasses import dataclass, field
from pathlib import Path

from local_engine.attention import get_attention_backend
from local_engine.errors import (
    EngineConfigError,
    EngineError,
    InvalidRequestError,
    OverloadedError,
)
from local_engine.kv_cache import BlockPool
from local_engine.model import DecoderModel
from local_engine.quant import Quantization, check_quantization
from local_engine.runner import ModelRunner
from local_engine.sampler import Sampler, SamplingParams, TokenLogprob
from local_engine.scheduler import Scheduler
from local_engine.sequence import Sequence, SequenceStatus
from local_engine.spec import SpecStats, SpeculativeConfig, Speculator, make_proposer
from local_engine.step_buffers import plan_step_buffers
from local_engine.stop import StopChecker
from local_engine.structured import GrammarVerdict, StructuredOutput
from local_engine.tokenizer import Tokenizer

__all__ = [
    "Engine",
    "EngineConfig",
    "GenerationResult",
    "RequestOutput",
    "SamplingParams",
    "SpecStats",
    "SpeculativeConfig",
    "StepTokens",
    "TokenLogprob",
]

logger = logging.getLogger("local_engine")


@dataclass
class EngineConfig:
    """Engine sizing and policy.

    ``num_blocks=None`` sizes the KV cache from ``kv_cache_memory`` bytes.
    ``max_model_len=None`` means the model's ``max_position_embeddings``, capped by what
    the KV pool can hold. ``dtype``/``device``/``quantization`` apply when
    :meth:`Engine.from_pretrained` loads the model (``quantization="int8"``: int8 weights
    with per-channel scales, bfloat16 activations unless ``dtype`` says float16). ``seed``
    fixes the sampling noise of requests without their own seed.
    ``num_threads`` and ``tune_malloc`` are process-wide settings, which the engine never
    applies: whoever owns the process does, once, with
    :func:`local_engine.process.apply_process_settings` (``LocalBackend`` when it loads its
    model, and so the server; a script stepping an engine itself calls it).
    ``num_threads`` sets torch's CPU threads (``torch.set_num_threads``); ``None`` keeps
    torch's count (``OMP_NUM_THREADS``, else the CPUs this process may use). How idle threads
    wait is set before torch loads, from the environment: see :mod:`local_engine.cpu_threads`.
    ``static_buffers`` keeps step inputs in persistent (pinned, on CUDA) buffers and
    ``cuda_graphs`` replays decode steps from CUDA graphs; ``None`` means on for a CUDA
    model (graphs with the Triton attention backend), off elsewhere
    (:func:`local_engine.step_buffers.plan_step_buffers`).
    ``speculative`` turns on speculative decoding (:class:`SpeculativeConfig`).
    ``overlap_output`` lets :class:`~local_engine.async_engine.AsyncEngine` detokenize, check
    stop strings and emit step n's outputs while step n+1 runs (:meth:`Engine.run_step`,
    :meth:`Engine.process_step`); the outputs are the same either way. ``None`` means on for
    a CUDA model, where the text is made while the GPU computes, and off elsewhere: on CPU
    that host work is well under 1% of a step, so a second thread has nothing to win.
    ``tune_malloc`` keeps the memory of freed CPU tensors in the process for the next step
    instead of returning it to the kernel (glibc ``mallopt``, process-wide and for good;
    :mod:`local_engine.cpu_memory`). ``None`` applies it where the owner says its engine
    steps on the main thread of a CPU process: the heap that step allocates from is the one
    that gave memory back (:class:`~local_engine.async_engine.AsyncEngine` steps in worker
    threads, whose heaps keep theirs, so there it changes nothing). ``True`` applies it (a
    warning says why where it cannot); ``False`` leaves the allocator as it is, and cannot
    undo an earlier setting.
    """

    block_size: int = 16
    num_blocks: int | None = None
    kv_cache_memory: int = 256 * 2**20
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None
    enable_prefix_caching: bool = True
    max_waiting: int = 1024
    attention_backend: str = "auto"
    dtype: str | None = None
    device: str = "cpu"
    seed: int | None = None
    num_threads: int | None = None
    quantization: Quantization | None = None
    static_buffers: bool | None = None
    cuda_graphs: bool | None = None
    speculative: SpeculativeConfig | None = None
    overlap_output: bool | None = None
    tune_malloc: bool | None = None

    def __post_init__(self) -> None:
        for name in (
            "block_size",
            "kv_cache_memory",
            "max_num_seqs",
            "max_num_batched_tokens",
            "max_waiting",
        ):
            _positive(name, getattr(self, name))
        for name in ("num_blocks", "max_model_len", "num_threads"):
            if getattr(self, name) is not None:
                _positive(name, getattr(self, name))
        self.quantization = check_quantization(self.quantization)
        for name in ("static_buffers", "cuda_graphs", "overlap_output", "tune_malloc"):
            if not isinstance(getattr(self, name), bool | None):  # 0 and 1 are not bools here
                raise EngineConfigError(f"{name} must be None or a bool")
        if self.speculative is not None and not isinstance(self.speculative, SpeculativeConfig):
            raise EngineConfigError(
                f"speculative must be a SpeculativeConfig, got {type(self.speculative).__name__}"
            )


def _positive(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise EngineConfigError(f"{name} must be a positive int, got {value!r}")


@dataclass
class RequestOutput:
    """What one step produced for one request.

    ``num_cached_tokens`` counts prompt tokens served from the prefix cache.
    ``logprobs`` covers ``new_token_ids`` when the request asked for them, else None.
    With speculative decoding one step may bring several tokens; ``spec`` counts the
    request's draft tokens so far and how many were accepted (None when it never had any).
    ``finish_reason`` is ``"stop"``, ``"length"``, ``"abort"`` or ``"error"``: the request's
    grammar failed while decoding (a limit of the grammar library), so its text so far does
    not follow it; ``error`` says why.
    """

    request_id: str
    new_token_ids: list[int]
    new_text: str
    finished: bool
    finish_reason: str | None
    num_prompt_tokens: int
    num_cached_tokens: int
    num_generated_tokens: int
    logprobs: list[TokenLogprob] | None = None
    spec: SpecStats | None = None
    error: str | None = None
    stop_string: str | None = None
    """The stop string that ended the request (``finish_reason == "stop"``), else None."""
    prompt_logprobs: list[TokenLogprob | None] | None = None
    """On a request's first output when its params asked for them: one entry per prompt
    token, None for the first (nothing comes before it), else the token's logprob given
    the tokens before it (see :class:`~local_engine.sampling_params.SamplingParams`)."""


@dataclass
class GenerationResult:
    """A finished request, as returned by :meth:`Engine.generate`."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    num_cached_tokens: int = 0
    logprobs: list[TokenLogprob] | None = None
    spec: SpecStats | None = None
    error: str | None = None
    """Why the request's grammar failed (``finish_reason == "error"``), else None."""
    prompt_logprobs: list[TokenLogprob | None] | None = None
    """The prompt's logprobs when the params asked for them (as in :class:`RequestOutput`)."""


@dataclass(slots=True)
class _Request:
    seq: Sequence
    stop: StopChecker
    closed: bool = False  # its last output is made, or it was aborted: drop later tokens


@dataclass(slots=True)
class _Tokens:
    """One request's tokens from a step, settled as far as token ids go (snapshots, so
    the text can be made while the next step moves the sequence on)."""

    req: _Request
    tokens: list[int]
    reason: str | None  # stop token, max_tokens, grammar done or failed: already released
    num_prompt_tokens: int
    num_cached_tokens: int
    num_generated_tokens: int
    logprob: TokenLogprob | None
    spec: SpecStats | None
    error: str | None = None  # why the grammar failed (reason "error")
    prompt_logprobs: list[TokenLogprob | None] | None = None  # on the first output


@dataclass(slots=True)
class StepTokens:
    """The token ids one :meth:`Engine.run_step` produced, for :meth:`Engine.process_step`."""

    items: list[_Tokens] = field(default_factory=list)


def _model_path(path: str | Path) -> Path:
    """``path``, or the embedded model of that name (``swift-tiny``...) when no such path
    exists."""
    root = Path(path)
    if not root.exists():
        from local_engine.default_model import (
            DEFAULT_MODEL_NAME,
            DEFAULT_MODELS,
            find_default_model,
        )

        if str(path) == DEFAULT_MODEL_NAME or str(path) in DEFAULT_MODELS:
            return find_default_model(str(path))
    return root


class Engine:
    """Continuous-batching inference over one :class:`DecoderModel`."""

    def __init__(
        self,
        model: DecoderModel,
        config: EngineConfig | None = None,
        tokenizer: Tokenizer | None = None,
        *,
        draft_model: DecoderModel | None = None,
    ) -> None:
        """Size the KV cache, build scheduler and runner. EngineConfigError on bad sizes.

        ``draft_model`` is the proposer of ``config.speculative.method == "draft"`` (given
        here, or loaded from ``draft_model`` by :meth:`from_pretrained`).
        """
        self.config = config = config if config is not None else EngineConfig()
        self.driver: object | None = None
        """The :class:`~local_engine.async_engine.AsyncEngine` stepping this engine while one
        runs (one at a time: two would step it at once from two threads)."""
        self.model = model
        self.tokenizer = tokenizer
        if config.attention_backend != "auto":
            model.set_attention_backend(
                get_attention_backend(config.attention_backend, device=model.device)
            )
        bs = config.block_size
        num_blocks = config.num_blocks
        if num_blocks is None:
            num_blocks = config.kv_cache_memory // (model.kv_bytes_per_token() * bs)
            if num_blocks < 1:
                raise EngineConfigError(
                    f"kv_cache_memory={config.kv_cache_memory} bytes holds no block of {bs} tokens"
                )
        max_positions = model.config.max_position_embeddings
        if config.max_model_len is None:
            self.max_model_len = min(max_positions, num_blocks * bs)
        elif config.max_model_len > max_positions:
            raise EngineConfigError(
                f"max_model_len={config.max_model_len} exceeds the model's "
                f"max_position_embeddings={max_positions}"
            )
        else:
            self.max_model_len = config.max_model_len
        self.pool = BlockPool(num_blocks, bs, enable_prefix_caching=config.enable_prefix_caching)
        try:
            self.scheduler = Scheduler(
                self.pool,
                max_num_seqs=config.max_num_seqs,
                max_num_batched_tokens=config.max_num_batched_tokens,
            )
        except ValueError as exc:
            raise EngineConfigError(str(exc)) from exc
        buffers, cuda_graphs = plan_step_buffers(
            model,
            static_buffers=config.static_buffers,
            cuda_graphs=config.cuda_graphs,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_model_len=self.max_model_len,
            block_size=bs,
        )
        eos = set(model.config.eos_token_ids)
        if tokenizer is not None:
            eos.update(tokenizer.eos_token_ids)
        self.eos_token_ids = frozenset(eos)
        # Grammar-constrained decoding (SamplingParams.grammar) needs the tokenizer.
        self.structured = (
            StructuredOutput(tokenizer, model.config.vocab_size, self.eos_token_ids)
            if tokenizer is not None
            else None
        )
        self.runner = ModelRunner(
            model,
            num_blocks=num_blocks,
            block_size=bs,
            sampler=Sampler(seed=config.seed, eos_token_ids=self.eos_token_ids),
            buffers=buffers,
            cuda_graphs=cuda_graphs,
            structured=self.structured,
        )
        self.overlap_output: bool = (
            config.overlap_output
            if config.overlap_output is not None
            else model.device.type == "cuda"
        )
        """Whether :class:`~local_engine.async_engine.AsyncEngine` overlaps
        :meth:`process_step` with the next :meth:`run_step` (``config.overlap_output``
        resolved; read at every step, so it may be changed between requests)."""
        self._requests: dict[str, _Request] = {}
        # Requests a stop string ended, found by process_step; released by the next step.
        self._stopped: deque[_Request] = deque()
        self.speculator: Speculator | None = None
        if config.speculative is not None:
            sampler = self.runner.sampler
            proposer = make_proposer(
                config.speculative,
                model,
                draft_model,
                num_blocks=num_blocks,
                block_size=bs,
                sampler=sampler,
                tokenizer=tokenizer,
            )
            self.speculator = Speculator(
                config.speculative, proposer, sampler, eos_token_ids=self.eos_token_ids
            )
            self.runner.verify = self.speculator.verify

    @classmethod
    def from_pretrained(cls, path: str | Path, config: EngineConfig | None = None) -> Engine:
        """Load the model under ``path`` (and its tokenizer when tokenizer.json exists), or
        from a ``.gguf`` file (with the tokenizer it carries), or a model known by name
        (the embedded ``swift-tiny``, as ``LocalBackend`` takes it) when no such path
        exists."""
        from local_engine.loader import load_model

        config = config if config is not None else EngineConfig()
        root = path = _model_path(path)
        tokenizer: Tokenizer | None = None
        gguf = root.is_file() and root.suffix.lower() == ".gguf"
        if gguf:  # first: a tokenizer it cannot rebuild fails before the weights are read
            from local_engine.gguf_loader import load_gguf_tokenizer

            tokenizer = load_gguf_tokenizer(root)
        model = load_model(
            path, dtype=config.dtype, device=config.device, quantization=config.quantization
        )
        if not gguf and (root / "tokenizer.json").exists():
            tokenizer = Tokenizer.from_dir(root)
        spec = config.speculative
        draft = None
        if spec is not None and spec.draft_model is not None:  # an embedded name too
            draft_path = _model_path(spec.draft_model)
            draft = load_model(draft_path, dtype=config.dtype, device=config.device)
        return cls(model, config, tokenizer, draft_model=draft)

    @property
    def num_blocks(self) -> int:
        """KV blocks in the pool."""
        return self.pool.num_blocks

    @property
    def spec_stats(self) -> SpecStats | None:
        """Speculative decoding counters over the engine's life (None without it)."""
        return self.speculator.stats if self.speculator is not None else None

    @property
    def num_waiting(self) -> int:
        """Requests queued for admission."""
        return self.scheduler.num_waiting

    @property
    def num_running(self) -> int:
        """Requests holding KV blocks."""
        return self.scheduler.num_running

    def has_unfinished(self) -> bool:
        """True while any request is waiting or running (one that :meth:`process_step`
        found ended by a stop string counts until the next :meth:`run_step` frees it)."""
        return bool(self._requests)

    def num_free_blocks(self) -> int:
        """KV blocks available to new work (free or evictable cached blocks)."""
        return self.pool.num_free_blocks

    def add_request(
        self,
        prompt_ids: SequenceABC[int],
        params: SamplingParams,
        *,
        request_id: str | None = None,
        cache_salt: str | None = None,
        shares_prompt_with: str | None = None,
    ) -> str:
        """Queue a request; return its id.

        ``shares_prompt_with`` names a request queued earlier with the same prompt and
        ``cache_salt`` (another choice of an ``n > 1`` request): this one is admitted once
        that one has computed the prompt's full KV blocks, and takes them from the prefix
        cache, so the prompt is computed once. An id that is no longer live is ignored
        (what it computed is in the prefix cache, if anywhere).

        Raises:
            InvalidRequestError: empty or out-of-vocabulary prompt, prompt + ``max_tokens``
                over ``max_model_len``, stop strings or a grammar without a tokenizer, a
                duplicate id, a ``shares_prompt_with`` request whose prompt or salt differs;
                :class:`~local_engine.grammar.GrammarError` (one too) for a
                grammar that cannot be compiled, or ``params`` that are not
                :class:`SamplingParams`. A ``ValueError``.
            OverloadedError: ``max_waiting`` requests are already queued.
        """
        if not isinstance(params, SamplingParams):
            raise InvalidRequestError(f"params must be SamplingParams, got {type(params).__name__}")
        vocab = self.model.config.vocab_size
        try:
            prompt = [operator.index(t) for t in prompt_ids]
        except TypeError as exc:
            raise InvalidRequestError(f"prompt_ids must be ints in [0, {vocab})") from exc
        if not prompt:
            raise InvalidRequestError("prompt_ids must not be empty")
        if min(prompt) < 0 or max(prompt) >= vocab:
            raise InvalidRequestError(f"prompt_ids must be ints in [0, {vocab})")
        total = len(prompt) + params.max_tokens
        if total > self.max_model_len:
            raise InvalidRequestError(
                f"prompt ({len(prompt)} tokens) + max_tokens ({params.max_tokens}) = {total} "
                f"exceeds max_model_len ({self.max_model_len})"
            )
        if request_id is None:
            request_id = uuid.uuid4().hex
        elif request_id in self._requests:
            raise InvalidRequestError(f"request id {request_id!r} is already in use")
        source = self._prompt_source(shares_prompt_with, prompt, cache_salt)
        detok = self.tokenizer.detokenizer() if self.tokenizer is not None else None
        stop = StopChecker(params, self.eos_token_ids, detok)
        if self.scheduler.num_waiting >= self.config.max_waiting:
            raise OverloadedError(
                f"{self.scheduler.num_waiting} "
                f"{'request is' if self.scheduler.num_waiting == 1 else 'requests are'} already "
                f"waiting (max_waiting={self.config.max_waiting})"
            )
        if params.grammar is not None:
            if self.structured is None:
                raise InvalidRequestError("a grammar needs an engine with a tokenizer")
            self.structured.add(request_id, params.grammar)
        seq = Sequence(request_id, prompt, params, cache_salt=cache_salt, shares_prompt_of=source)
        self.scheduler.add(seq)
        self._requests[request_id] = _Request(seq, stop)
        return request_id

    def _prompt_source(
        self, request_id: str | None, prompt: list[int], cache_salt: str | None
    ) -> Sequence | None:
        """The live sequence ``add_request(shares_prompt_with=request_id)`` waits for."""
        req = self._requests.get(request_id) if request_id is not None else None
        if req is None:
            return None
        seq = req.seq
        if seq.block_table.salt != cache_salt or seq.token_ids[: seq.num_prompt_tokens] != prompt:
            raise InvalidRequestError(
                f"request {request_id!r} has another prompt or cache_salt: it cannot share its "
                "prompt's blocks"
            )
        return seq

    def abort(self, request_id: str) -> None:
        """Drop a request and free its blocks; unknown or finished ids are ignored."""
        req = self._requests.get(request_id)
        if req is not None:
            req.closed = True
            self._release(req)

    def abort_all(self) -> None:
        """Abort every live request."""
        for request_id in list(self._requests):
            self.abort(request_id)
        self._stopped.clear()

    def _release(self, req: _Request) -> None:
        """Retire a live request: its blocks, sampler, grammar and draft state."""
        request_id = req.seq.request_id
        del self._requests[request_id]
        self.scheduler.finish(req.seq)
        self.runner.sampler.release(request_id)
        if self.structured is not None:
            self.structured.release(request_id)
        if self.speculator is not None:
            self.speculator.release(request_id)

    def _release_stopped(self) -> None:
        while self._stopped:
            req = self._stopped.popleft()
            if self._requests.get(req.seq.request_id) is req:
                self._release(req)

    def step(self) -> list[RequestOutput]:
        """Run one batch; return an output for every request that got tokens
        (:meth:`run_step`, then :meth:`process_step` at once)."""
        outputs = self.process_step(self.run_step())
        self._release_stopped()
        return outputs

    def run_step(self) -> StepTokens:
        """The part of :meth:`step` that decides the next one: schedule, run the model,
        append the sampled tokens, and settle what token ids say (stop tokens,
        ``max_tokens``, grammars, accepted drafts), freeing the blocks of requests that
        end. Requests that :meth:`process_step` found stopped by a stop string are
        released first.

        :meth:`process_step` of the previous step may run on another thread meanwhile,
        nothing else: adds and aborts go between steps.
        """
        self._release_stopped()
        if self.speculator is not None:
            self.speculator.propose(self.scheduler.running)
        batch = self.scheduler.schedule()
        if batch.is_empty:
            if self._requests:
                raise EngineError("the scheduler found no work for unfinished requests")
            return StepTokens()
        result = self.runner.execute(batch)
        for scored_seq, scored in result.prompt_logprobs:
            scored_seq.prompt_logprobs.extend(scored)
        sampled = result.sampled
        emitted: list[tuple[Sequence, list[int], TokenLogprob | None]] = []
        for seq, token, logprob in zip(
            result.seqs, sampled.token_ids, sampled.logprobs, strict=True
        ):
            seq.append_token(token)
            emitted.append((seq, [token], logprob))
        for item, tokens in zip(result.spec_items, result.spec_tokens, strict=True):
            item.num_accepted = len(tokens) - 1
            item.seq.token_ids.extend(tokens)
            emitted.append((item.seq, tokens, None))
        self.scheduler.update(batch)
        if self.speculator is not None:
            for item in result.spec_items:
                if item.seq.status is SequenceStatus.RUNNING:
                    self.speculator.verified(item.seq, item.num_spec_tokens, item.num_accepted)
        return StepTokens([self._settle(seq, tokens, logprob) for seq, tokens, logprob in emitted])

    def _settle(self, seq: Sequence, tokens: list[int], logprob: TokenLogprob | None) -> _Tokens:
        """Run ``tokens`` (already appended to ``seq``) through the checks on token ids
        and the grammar, cutting them at the first that ends the request (which is
        released), and snapshot what its output needs."""
        req = self._requests[seq.request_id]
        reason: str | None = None
        error: str | None = None
        before = seq.num_generated_tokens - len(tokens)
        if seq.params.max_tokens == 0:  # it only scores its prompt: no token is kept
            del seq.token_ids[seq.num_prompt_tokens :]
            tokens, reason, logprob = [], "length", None
        for n, token in enumerate(tokens, start=1):
            reason = req.stop.check(token, before + n)
            verdict = self._grammar_verdict(seq, token)
            if verdict == "error":
                reason = "error"
                error = self._grammar_error(seq)
            elif reason is None:
                reason = verdict
            if reason is not None:
                if n < len(tokens):
                    del seq.token_ids[len(seq.token_ids) - len(tokens) + n :]
                    tokens = tokens[:n]
                break
        # A snapshot: later verifications count in a new object.
        spec = self.speculator.request_stats(seq.request_id) if self.speculator else None
        prompt_logprobs: list[TokenLogprob | None] | None = None
        if before == 0 and seq.params.prompt_logprobs is not None:
            prompt_logprobs = [None, *seq.prompt_logprobs]
        settled = _Tokens(
            req,
            tokens,
            reason,
            seq.num_prompt_tokens,
            seq.num_cached_tokens or 0,
            seq.num_generated_tokens,
            logprob,
            spec,
            error,
            prompt_logprobs,
        )
        if reason is not None:
            self._release(req)
        return settled

    def process_step(self, step: StepTokens) -> list[RequestOutput]:
        """Make the outputs of a :meth:`run_step`: detokenize, check stop strings, and
        describe each request's new tokens. A stop string ends its request here; its
        blocks are freed by the next :meth:`run_step`, and tokens a step made for it
        meanwhile are dropped, as are those of requests aborted since.

        Touches only text state and the snapshots in ``step``, so it may run on another
        thread while the next :meth:`run_step` does.
        """
        outputs: list[RequestOutput] = []
        for item in step.items:
            req = item.req
            if req.closed:
                continue
            tokens = item.tokens
            texts: list[str] = []
            reason: str | None = item.reason if not tokens else None  # a scored prompt
            for n, token in enumerate(tokens, start=1):
                text, reason = req.stop.push_text(token, item.reason if n == len(tokens) else None)
                texts.append(text)
                if reason is not None:
                    break
            dropped = len(tokens) - len(texts)
            if reason is not None:
                req.closed = True
                if item.reason is None:
                    self._stopped.append(req)
            outputs.append(
                RequestOutput(
                    request_id=req.seq.request_id,
                    new_token_ids=tokens[: len(texts)] if dropped else tokens,
                    new_text="".join(texts),
                    finished=reason is not None,
                    finish_reason=reason,
                    num_prompt_tokens=item.num_prompt_tokens,
                    num_cached_tokens=item.num_cached_tokens,
                    num_generated_tokens=item.num_generated_tokens - dropped,
                    logprobs=[item.logprob] if item.logprob is not None else None,
                    spec=item.spec,
                    error=item.error if reason == "error" else None,
                    stop_string=req.stop.stopped_by if reason == "stop" else None,
                    prompt_logprobs=item.prompt_logprobs,
                )
            )
        return outputs

    def _grammar_verdict(self, seq: Sequence, token: int) -> GrammarVerdict:
        """Advance a constrained request's grammar: ``"stop"`` once the reply is complete,
        ``"error"`` when the grammar failed (the reply cannot be valid), else None."""
        grammar = seq.params.grammar
        if grammar is None or self.structured is None:
            return None
        verdict = self.structured.accept(seq.request_id, token)
        if token == grammar.trigger:
            seq.constrained = self.structured.constrains(seq.request_id)
        return verdict

    def _grammar_error(self, seq: Sequence) -> str:
        structured = self.structured
        reason = structured.error(seq.request_id) if structured is not None else ""
        return reason or "the grammar library gave no reason"

    def generate(
        self,
        prompts: SequenceABC[SequenceABC[int]],
        params: SamplingParams | SequenceABC[SamplingParams],
    ) -> list[GenerationResult]:
        """Run ``prompts`` to completion (offline batch use); results in prompt order.

        Requests are fed in as the waiting queue has room, so any number of prompts
        works. Needs an otherwise idle engine, since it consumes every step's outputs;
        on an error every request it added is aborted.
        """
        if self._requests:
            raise EngineError("generate() needs an idle engine")
        plist = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        if len(plist) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(plist)} SamplingParams")
        results: dict[str, GenerationResult] = {}
        texts: dict[str, list[str]] = {}
        todo = iter(zip(prompts, plist, strict=True))
        pending = len(prompts)
        try:
            while pending or self._requests:
                while pending and self.scheduler.num_waiting < self.config.max_waiting:
                    prompt, p = next(todo)
                    pending -= 1
                    rid = self.add_request(prompt, p)
                    results[rid] = GenerationResult(
                        rid, list(prompt), logprobs=[] if p.logprobs else None
                    )
                    texts[rid] = []
                for out in self.step():
                    res = results[out.request_id]
                    res.token_ids.extend(out.new_token_ids)
                    texts[out.request_id].append(out.new_text)
                    res.num_cached_tokens = out.num_cached_tokens
                    res.spec = out.spec
                    if res.logprobs is not None and out.logprobs is not None:
                        res.logprobs.extend(out.logprobs)
                    if out.prompt_logprobs is not None:
                        res.prompt_logprobs = out.prompt_logprobs
                    if out.finished:
                        res.finish_reason = out.finish_reason
                        res.error = out.error
        finally:
            self.abort_all()
        for rid, res in results.items():
            res.text = "".join(texts[rid])
        return list(results.values())
