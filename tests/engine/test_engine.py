"""Engine: batching equivalence, preemption, prefix cache, chunked prefill, validation."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

from local_engine.engine import Engine, EngineConfig, GenerationResult
from local_engine.errors import EngineConfigError, InvalidRequestError, OverloadedError
from local_engine.loader import load_model
from local_engine.model import DecoderModel
from local_engine.sampler import SamplingParams

from .tiny import make_tiny_model, write_char_tokenizer

VOCAB = 256
EOS = 2
SHORT = SamplingParams(max_tokens=8)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "llama", "llama", seed=3)


@pytest.fixture(scope="module")
def model(model_dir: Path) -> DecoderModel:
    return load_model(model_dir)


def engine_for(model: DecoderModel, **overrides: object) -> Engine:
    cfg: dict[str, object] = {"num_blocks": 256, "block_size": 4, "seed": 0}
    cfg.update(overrides)
    return Engine(model, EngineConfig(**cfg))  # type: ignore[arg-type]


def workload() -> tuple[list[list[int]], list[SamplingParams]]:
    """32 mixed-length prompts; half greedy, half seeded sampling with assorted knobs."""
    rng = random.Random(7)
    shared = [rng.randrange(3, VOCAB) for _ in range(9)]
    prompts: list[list[int]] = []
    params: list[SamplingParams] = []
    for i in range(32):
        own = [rng.randrange(3, VOCAB) for _ in range(rng.randrange(1, 30))]
        prompts.append(shared + own if i % 3 == 0 else own)
        max_tokens = rng.randrange(2, 10)
        if i % 2 == 0:
            params.append(SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))
        else:
            params.append(
                SamplingParams(
                    temperature=0.9,
                    top_k=40 if i % 4 == 1 else 0,
                    top_p=0.9 if i % 4 == 3 else 1.0,
                    presence_penalty=0.3 if i % 8 == 1 else 0.0,
                    seed=1000 + i,
                    max_tokens=max_tokens,
                    ignore_eos=True,
                )
            )
    return prompts, params


def tokens(results: Sequence[GenerationResult]) -> list[list[int]]:
    return [r.token_ids for r in results]


@pytest.fixture(scope="module")
def alone(model: DecoderModel) -> list[list[int]]:
    """Every workload request run by itself, on a fresh engine with no prefix cache."""
    prompts, params = workload()
    out = []
    for prompt, p in zip(prompts, params, strict=True):
        engine = engine_for(model, enable_prefix_caching=False)
        out.append(engine.generate([prompt], p)[0].token_ids)
    return out


def test_greedy_matches_transformers(model_dir: Path, model: DecoderModel) -> None:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    prompt = [5, 17, 99, 3, 250, 41, 8]
    ref = hf.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, eos_token_id=None)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    result = engine_for(model).generate([prompt], params)[0]
    assert result.token_ids == ref[0, len(prompt) :].tolist()


def test_batch_of_32_matches_alone(model: DecoderModel, alone: list[list[int]]) -> None:
    prompts, params = workload()
    engine = engine_for(model, max_num_seqs=32, enable_prefix_caching=False)
    assert tokens(engine.generate(prompts, params)) == alone


def test_preemption_matches_alone(model: DecoderModel, alone: list[list[int]]) -> None:
    prompts, params = workload()
    # 12 blocks of 4 = 48 slots: the longest request (38 + 9) just fits on its own.
    engine = engine_for(model, num_blocks=12, max_num_seqs=16, enable_prefix_caching=False)
    assert tokens(engine.generate(prompts, params)) == alone
    assert engine.scheduler.num_preemptions > 0
    assert engine.num_free_blocks() == 12


def test_prefix_cache_hits_match_alone(model: DecoderModel, alone: list[list[int]]) -> None:
    prompts, params = workload()
    engine = engine_for(model, max_num_seqs=8)
    first = engine.generate(prompts[:1], params[:1])  # warms the shared prefix
    assert first[0].num_cached_tokens == 0
    results = engine.generate(prompts, params)
    assert tokens(results) == alone
    shared = [r for i, r in enumerate(results) if i % 3 == 0]
    assert all(r.num_cached_tokens >= 8 for r in shared)
    # Running it all again hits every full block of every prompt.
    again = engine.generate(prompts, params)
    assert tokens(again) == alone
    assert sum(r.num_cached_tokens for r in again) > sum(r.num_cached_tokens for r in results)


def test_chunked_prefill_matches_alone(model: DecoderModel, alone: list[list[int]]) -> None:
    prompts, params = workload()
    engine = engine_for(model, max_num_seqs=4, max_num_batched_tokens=5)
    assert tokens(engine.generate(prompts, params)) == alone


def test_step_outputs_stream_every_token(model: DecoderModel) -> None:
    engine = engine_for(model)
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True, logprobs=True)
    rid = engine.add_request([9, 8, 7], params, request_id="r1")
    assert rid == "r1"
    seen: list[int] = []
    outputs = []
    while engine.has_unfinished():
        outputs.extend(engine.step())
    for out in outputs:
        seen.extend(out.new_token_ids)
        assert out.num_prompt_tokens == 3
        assert out.logprobs is not None and out.logprobs[0].token_id == out.new_token_ids[0]
        assert out.logprobs[0].logprob <= 0.0
    assert [o.num_generated_tokens for o in outputs] == [1, 2, 3, 4, 5]
    assert [o.finished for o in outputs] == [False] * 4 + [True]
    assert outputs[-1].finish_reason == "length"
    assert len(seen) == 5 and engine.num_free_blocks() == 256


def test_stop_token_and_eos_finish_with_stop(model: DecoderModel) -> None:
    engine = engine_for(model)
    greedy = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    ref = engine.generate([[11, 12, 13]], greedy)[0].token_ids
    stop_at = ref[2]
    first = ref.index(stop_at)
    params = SamplingParams(temperature=0.0, max_tokens=6, stop_token_ids=(stop_at,))
    result = engine.generate([[11, 12, 13]], params)[0]
    assert result.finish_reason == "stop" and result.token_ids == ref[: first + 1]


def test_abort_frees_blocks(model: DecoderModel) -> None:
    engine = engine_for(model, num_blocks=32)
    rid = engine.add_request(list(range(3, 30)), SamplingParams(max_tokens=50))
    engine.step()
    assert engine.num_free_blocks() < 32
    engine.abort(rid)
    engine.abort(rid)  # idempotent
    assert engine.num_free_blocks() == 32 and not engine.has_unfinished()
    assert engine.step() == []


def test_kv_cache_sized_from_memory(model: DecoderModel) -> None:
    per_block = model.kv_bytes_per_token() * 16
    engine = Engine(model, EngineConfig(kv_cache_memory=per_block * 10 + 5))
    assert engine.num_blocks == 10
    assert engine.max_model_len == 160  # capped by the pool (max_position_embeddings 256)
    big = Engine(model, EngineConfig(num_blocks=100))
    assert big.max_model_len == 256
    with pytest.raises(EngineConfigError):
        Engine(model, EngineConfig(kv_cache_memory=per_block - 1))
    with pytest.raises(EngineConfigError):
        Engine(model, EngineConfig(num_blocks=4, max_model_len=10_000))


@pytest.mark.parametrize(
    ("prompt", "params", "match"),
    [
        ([], SHORT, "empty"),
        ([1, VOCAB], SHORT, "ints in"),
        ([1, -1], SHORT, "ints in"),
        ([1, 2.0], SHORT, "ints in"),
        ([1] * 250, SamplingParams(max_tokens=7), "max_model_len"),
        ([1, 2], SamplingParams(max_tokens=4, stop=("x",)), "tokenizer"),
    ],
)
def test_bad_requests_raise_value_error(
    model: DecoderModel, prompt: list[int], params: SamplingParams, match: str
) -> None:
    engine = engine_for(model)
    with pytest.raises(ValueError, match=match):
        engine.add_request(prompt, params)
    assert not engine.has_unfinished()


def test_duplicate_request_id(model: DecoderModel) -> None:
    engine = engine_for(model)
    engine.add_request([5], SHORT, request_id="x")
    with pytest.raises(ValueError, match="in use"):
        engine.add_request([5], SHORT, request_id="x")


def test_overloaded_when_waiting_queue_full(model: DecoderModel) -> None:
    engine = engine_for(model, max_waiting=2)
    engine.add_request([5], SHORT)
    engine.add_request([6], SHORT)
    with pytest.raises(OverloadedError):
        engine.add_request([7], SHORT)
    engine.step()  # both admitted: the queue has room again
    engine.add_request([7], SHORT)


def test_generate_feeds_more_prompts_than_max_waiting(model: DecoderModel) -> None:
    engine = engine_for(model, max_waiting=2, max_num_seqs=2)
    prompts = [[10 + i, 20 + i] for i in range(5)]
    greedy = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    results = engine.generate(prompts, greedy)
    assert [r.prompt_token_ids for r in results] == prompts
    assert all(len(r.token_ids) == 3 and r.finish_reason == "length" for r in results)
    assert results[0].token_ids == engine.generate(prompts[:1], greedy)[0].token_ids


def test_bad_config_rejected(model: DecoderModel) -> None:
    with pytest.raises(EngineConfigError, match="block_size"):
        EngineConfig(block_size=0)
    with pytest.raises(EngineConfigError, match="max_num_seqs"):
        EngineConfig(max_num_seqs=0)
    with pytest.raises(EngineConfigError, match="max_num_batched_tokens"):
        Engine(model, EngineConfig(num_blocks=8, max_num_seqs=8, max_num_batched_tokens=4))


@pytest.mark.parametrize("name", ["static_buffers", "cuda_graphs", "overlap_output", "tune_malloc"])
@pytest.mark.parametrize("value", [0, 1, "yes"])
def test_switches_take_only_bools_or_none(name: str, value: object) -> None:
    """0 and 1 compare equal to False and True but are not switches: a typo caught early."""
    with pytest.raises(EngineConfigError, match=f"{name} must be None or a bool"):
        EngineConfig(**{name: value})  # type: ignore[arg-type]
    assert getattr(EngineConfig(**{name: True}), name) is True  # type: ignore[arg-type]


def test_a_grammar_on_a_tokenizer_llguidance_cannot_read_is_a_bad_request(
    tmp_path: Path, model_dir: Path
) -> None:
    """JSON mode on such a model said "the engine failed: ValueError(can't determine decoder
    type...)" though the engine had not failed; it is the request's 400, naming why."""
    import shutil

    from local_engine.grammar import GrammarError, json_object_grammar

    root = tmp_path / "m"
    shutil.copytree(model_dir, root)
    write_char_tokenizer(root)  # a decoder llguidance does not know
    engine = Engine.from_pretrained(root, EngineConfig(num_blocks=64, block_size=4))
    assert engine.structured is not None
    with pytest.raises(GrammarError, match="llguidance cannot read its tokenizer") as caught:
        engine.structured.compile(json_object_grammar())
    assert caught.value.param == "response_format"
    plain = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    assert len(engine.generate([[20, 21, 22]], plain)[0].token_ids) == 3  # still serving


def test_from_pretrained_with_tokenizer_streams_text_and_stops(
    tmp_path: Path, model_dir: Path
) -> None:
    import shutil

    root = tmp_path / "m"
    shutil.copytree(model_dir, root)
    assert Engine.from_pretrained(root, EngineConfig(num_blocks=8)).tokenizer is None
    write_char_tokenizer(root)
    engine = Engine.from_pretrained(root, EngineConfig(num_blocks=64, block_size=4))
    assert engine.tokenizer is not None and EOS in engine.eos_token_ids
    base = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    full = engine.generate([[20, 21, 22]], base)[0]
    assert full.text == engine.tokenizer.decode(full.token_ids) and len(full.text) == 10
    stop = full.text[4:6]
    cut = full.text.index(stop)
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, stop=(stop,))
    engine.add_request([20, 21, 22], params)
    streamed = ""
    last = None
    while engine.has_unfinished():
        for out in engine.step():
            streamed += out.new_text
            assert full.text[:cut].startswith(streamed)  # never a stop-string prefix
            last = out
    assert last is not None and last.finish_reason == "stop"
    assert streamed == full.text[:cut]


def test_num_threads_is_set_by_the_process_owner_not_the_engine(model: DecoderModel) -> None:
    from local_engine.process import apply_process_settings

    before = torch.get_num_threads()
    target = 2 if before == 1 else 1
    try:
        engine = engine_for(model, num_threads=target)
        assert torch.get_num_threads() == before  # an engine never sets process state
        apply_process_settings(engine.config)  # whoever owns the process does, once
        assert torch.get_num_threads() == target
        apply_process_settings(engine_for(model).config)  # None leaves the count alone
        assert torch.get_num_threads() == target
    finally:
        torch.set_num_threads(before)


def test_a_request_shares_only_the_same_prompt_and_salt(model: DecoderModel) -> None:
    engine = engine_for(model)
    prompt = list(range(3, 21))
    first = engine.add_request(prompt, SHORT, cache_salt="a")
    with pytest.raises(InvalidRequestError, match="another prompt or cache_salt"):
        engine.add_request(prompt[:-1] + [99], SHORT, cache_salt="a", shares_prompt_with=first)
    with pytest.raises(InvalidRequestError, match="another prompt or cache_salt"):
        engine.add_request(prompt, SHORT, cache_salt="b", shares_prompt_with=first)
    assert engine.num_waiting == 1  # the refused ones were not queued
    engine.add_request(prompt, SHORT, cache_salt="a", shares_prompt_with=first)
    engine.add_request(prompt, SHORT, shares_prompt_with="gone")  # not live: goes alone
    while engine.has_unfinished():
        engine.step()
    assert engine.num_free_blocks() == 256


def test_from_pretrained_takes_the_embedded_model_by_name() -> None:
    """As LocalBackend and SWIFTCLIENT_LOCAL_MODEL take it (docs' Engine API example failed
    with "model path 'swift-tiny' does not exist")."""
    from local_engine.default_model import DEFAULT_MODEL_NAME, embedded_model_dir

    engine = Engine.from_pretrained(DEFAULT_MODEL_NAME, EngineConfig(num_blocks=8))
    assert engine.tokenizer is not None
    assert (
        engine.tokenizer.vocab_size
        == Engine.from_pretrained(
            embedded_model_dir(), EngineConfig(num_blocks=8)
        ).tokenizer.vocab_size
    )  # type: ignore[union-attr]
    with pytest.raises(Exception, match="does not exist"):
        Engine.from_pretrained("no-such-model-dir", EngineConfig(num_blocks=8))


def test_prompt_logprobs_match_transformers(model_dir: Path, model: DecoderModel) -> None:
    """Each prompt token's logprob given the tokens before it, as the reference model
    scores it: in one prefill, in chunks, with the prompt's blocks already cached (not
    taken from the cache: a cached position has no logits), and through preemption."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    rng = random.Random(11)
    prompts = [[rng.randrange(3, VOCAB) for _ in range(20)] for _ in range(3)]
    expected = []
    for prompt in prompts:
        with torch.no_grad():
            ref = torch.log_softmax(hf(torch.tensor([prompt])).logits[0].float(), dim=-1)
        chosen = [ref[i - 1, prompt[i]].item() for i in range(1, len(prompt))]
        top = [ref[i - 1].topk(3).indices.tolist() for i in range(1, len(prompt))]
        expected.append((chosen, top))

    def check(results: Sequence[GenerationResult]) -> None:
        for result, (chosen, top) in zip(results, expected, strict=True):
            scores = result.prompt_logprobs
            assert scores is not None and len(scores) == 20 and scores[0] is None
            got = [s.logprob for s in scores[1:] if s is not None]
            assert got == pytest.approx(chosen, abs=1e-4)
            assert [[t for t, _ in s.top_logprobs] for s in scores[1:] if s is not None] == top
            assert [s.token_id for s in scores[1:] if s is not None] == result.prompt_token_ids[1:]

    params = SamplingParams(max_tokens=12, ignore_eos=True, prompt_logprobs=3)
    check(engine_for(model).generate(prompts, params))
    check(engine_for(model, max_num_seqs=4, max_num_batched_tokens=5).generate(prompts, params))
    warm = engine_for(model)
    warm.generate(prompts, SamplingParams(max_tokens=2))
    again = warm.generate(prompts, params)
    check(again)
    assert [r.num_cached_tokens for r in again] == [0, 0, 0]
    assert warm.generate(prompts, SamplingParams(max_tokens=2))[0].num_cached_tokens > 0
    # 12 blocks of 4 tokens: two prompts fit, and their replies push one out
    tight = engine_for(model, num_blocks=12, max_num_seqs=3, max_num_batched_tokens=5)
    check(tight.generate(prompts, params))
    assert tight.scheduler.num_preemptions > 0
    plain = engine_for(model).generate(prompts[:1], SamplingParams(max_tokens=2))
    assert plain[0].prompt_logprobs is None
    # a choice sharing its prompt with another (n > 1) does not wait for blocks it cannot take
    shared = engine_for(model, max_num_seqs=4, max_num_batched_tokens=64)
    first = shared.add_request(prompts[0], params)
    shared.add_request(prompts[0], params, shares_prompt_with=first)
    step = shared.scheduler.schedule()
    assert len(step.scheduled) == 2  # both prefill in the first step
    shared.abort_all()
    with pytest.raises(ValueError, match="prompt_logprobs"):
        SamplingParams(prompt_logprobs=21)
