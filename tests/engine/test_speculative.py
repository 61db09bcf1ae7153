"""Speculative decoding: identical greedy output, the sampled distribution, rollback, stats."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from local_engine import LocalBackend
from local_engine.engine import Engine, EngineConfig, GenerationResult
from local_engine.errors import EngineConfigError
from local_engine.grammar import Grammar
from local_engine.kv_cache import BlockPool
from local_engine.loader import load_model
from local_engine.model import DecoderModel
from local_engine.runner import RunnerOutput
from local_engine.sampler import Sampler, SamplingParams
from local_engine.scheduler import ScheduledSequence, Scheduler, SchedulerOutput
from local_engine.sequence import Sequence as Sequence_
from local_engine.sequence import SequenceStatus
from local_engine.spec import (
    SUBSTITUTION_MIN,
    Draft,
    NgramIndex,
    NgramProposer,
    SpeculativeConfig,
    Speculator,
    spacing_classes,
)
from swiftclient import AsyncClient
from swiftclient.errors import ConfigurationError

from ..conformance.tiny_local import TinyModel, load_tiny_model
from .tiny import make_tiny_model

GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
NGRAM = SpeculativeConfig(ngram_min=1)
DRAFT = SpeculativeConfig(method="draft", draft_model="unused: the model is passed in")


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> DecoderModel:
    return load_model(make_tiny_model(tmp_path_factory.mktemp("t") / "llama", "llama", seed=3))


@pytest.fixture(scope="module")
def other(tmp_path_factory: pytest.TempPathFactory) -> DecoderModel:
    """A smaller, unrelated draft model over the same vocabulary."""
    path = tmp_path_factory.mktemp("d") / "llama"
    return load_model(make_tiny_model(path, "llama", seed=4, num_hidden_layers=1))


def engine_for(
    model: DecoderModel,
    spec: SpeculativeConfig | None = None,
    draft: DecoderModel | None = None,
    **overrides: object,
) -> Engine:
    cfg: dict[str, object] = {"num_blocks": 256, "block_size": 4, "seed": 0, "speculative": spec}
    cfg.update(overrides)
    return Engine(model, EngineConfig(**cfg), draft_model=draft)  # type: ignore[arg-type]


def repetitive_prompts(n: int = 12, seed: int = 0) -> list[list[int]]:
    """Prompts that repeat a random phrase, so n-gram lookup finds matches."""
    rng = random.Random(seed)
    prompts = []
    for _ in range(n):
        phrase = [rng.randrange(3, 256) for _ in range(rng.randrange(3, 12))]
        prompts.append(phrase * 3)
    return prompts


def tokens(results: Sequence[GenerationResult]) -> list[list[int]]:
    return [r.token_ids for r in results]


def spy_steps(engine: Engine) -> list[tuple[int, int]]:
    """Record (items with drafts, items without) of every step the engine runs."""
    seen: list[tuple[int, int]] = []
    execute = engine.runner.execute

    def noting(batch: SchedulerOutput) -> RunnerOutput:
        spec = sum(1 for item in batch.scheduled if item.num_spec_tokens)
        seen.append((spec, len(batch.scheduled) - spec))
        return execute(batch)

    engine.runner.execute = noting  # type: ignore[method-assign]
    return seen


def test_ngram_index_finds_the_latest_earlier_occurrence() -> None:
    index = NgramIndex(1, 3)
    seq = [1, 2, 3, 9, 1, 2, 3, 7, 5, 1, 2, 3]
    index.update(seq)
    assert index.propose(seq, 2) == [7, 5]  # the 3-gram (1, 2, 3) last continued with 7
    assert index.propose([*seq, 4], 2) == []  # 4 never occurred before
    index.update([*seq, 7])
    assert index.propose([*seq, 7], 3) == [5, 1, 2]


def test_ngram_index_ignores_matches_across_token_boundaries() -> None:
    """The tokens are searched as packed bytes: a byte match that starts inside a token
    (256's high bytes and a 0 read like the pair (1, 0)) is no occurrence."""
    index = NgramIndex(2, 2)
    seq = [256, 0, 0, 7, 1, 0]
    index.update(seq)
    assert index.propose(seq, 2) == []
    seq = [9, 1, 0, 4, 256, 0, 0, 7, 1, 0]  # an aligned (1, 0) before the misaligned one
    index = NgramIndex(2, 2)
    index.update(seq)
    assert index.propose(seq, 2) == [4, 256]


def test_ngram_index_carries_a_repeating_pattern_on() -> None:
    index = NgramIndex(2, 3)
    seq = [4, 8, 1, 2, 1, 2, 1]
    index.update(seq)
    assert index.propose(seq, 5) == [2, 1, 2, 1, 2]  # (2, 1) last continued with 2, period 2


def test_ngram_index_resumes_after_a_substituted_token() -> None:
    """An edit (a renamed word) breaks exact lookup; the tokens before it still place the
    copy, so the proposal is what followed the replaced token."""
    index = NgramIndex(1, 4)
    seq = [10, 1, 2, 3, 4, 5, 6, 7, 8, 11, 1, 2, 3, 4, 99]  # 99 replaced 5
    index.update(seq)
    assert index.propose(seq, 3) == [6, 7, 8]
    assert index.propose(seq, 20) == seq[6:]  # never past the end of the list
    # Fewer than SUBSTITUTION_MIN tokens before the edit are too weak a hint.
    short = [10, 2, 3, 4, 5, 6, 7, 11, 2, 3, 4, 99]
    index = NgramIndex(1, 4)
    index.update(short)
    assert SUBSTITUTION_MIN == 4 and index.propose(short, 3) == []
    # An exact match always wins over a substitution.
    both = [*seq, 6, 7, 8, 1, 2, 3, 4, 99]
    index = NgramIndex(1, 4)
    index.update(both)
    assert index.propose(both, 2) == [6, 7]  # (2, 3, 4, 99) continued with 6
    assert index.propose([*both, 0], 2) == [7, 8]  # 0 replaced the 6 after (2, 3, 4, 99)


def test_ngram_matches_across_a_leading_space() -> None:
    """A reply that starts a line with a word the prompt had inside a sentence spells it
    without the leading space; its classes match, so the copy is found at once."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    from local_engine.tokenizer import Tokenizer

    backend = HFTokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|end|>"],
        show_progress=False,
    )
    text = "Repeat exactly: Rosa needs 11 onions and 4 beans.\nRosa needs 11 onions and 4 beans."
    backend.train_from_iterator([text] * 20, trainer)
    tokenizer = Tokenizer(backend)
    classes = spacing_classes(tokenizer)
    inner, start = tokenizer.encode(" Rosa"), tokenizer.encode("Rosa")
    assert len(inner) == len(start) == 1 and inner != start
    assert classes[inner[0]] == classes[start[0]]
    assert all(classes[t] == t for t in tokenizer.added_tokens.values())
    prompt = tokenizer.encode("Repeat exactly: Rosa needs 11 onions and 4 beans.\n")
    reply = tokenizer.encode("Rosa needs")
    seq = Sequence_("r", prompt + reply, SamplingParams(max_tokens=32))
    expected = tokenizer.encode(" 11 onions")
    plain = NgramProposer(2, 4).propose([seq], [len(expected)])
    spaced = NgramProposer(2, 4, classes).propose([seq], [len(expected)])
    assert plain[0].tokens == [] and spaced[0].tokens == expected


def test_ngram_requests_start_at_the_full_draft_length(
    model: DecoderModel, other: DecoderModel
) -> None:
    """Prompt lookup costs nothing to propose, so a request's first drafts are as long as
    the lookup allows; a draft model (a forward per draft) still opens with a probe."""
    prompt = repetitive_prompts(1, seed=8)[0]
    firsts = []
    for spec, draft in (
        (SpeculativeConfig(num_speculative_tokens=5), None),
        (SpeculativeConfig(method="draft", draft_model="d", num_speculative_tokens=5), other),
    ):
        engine = engine_for(model, spec, draft)
        drafts: list[int] = []
        schedule = engine.scheduler.schedule

        def noting(schedule: Any = schedule, drafts: list[int] = drafts) -> SchedulerOutput:
            out: SchedulerOutput = schedule()
            drafts.extend(item.num_spec_tokens for item in out.scheduled if item.num_spec_tokens)
            return out

        engine.scheduler.schedule = noting  # type: ignore[method-assign]
        engine.generate([prompt], GREEDY)
        firsts.append(drafts[0])
    assert firsts == [5, 1]


class _FixedProposer:
    """Proposes the same drafts, with distributions, for every sequence."""

    free = True

    def __init__(self, tokens: list[int]) -> None:
        self.tokens = tokens

    def propose(self, seqs: list[Sequence_], num_tokens: list[int]) -> list[Draft]:
        probs = torch.eye(8)[self.tokens]
        return [Draft(self.tokens[:k], probs[:k]) for k in num_tokens]

    def verified(self, seq: Sequence_, num_accepted: int) -> None:
        pass

    def release(self, request_id: str) -> None:
        pass


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        (SamplingParams(max_tokens=32), [5, 6, 2]),  # EOS 2 ends the request
        (SamplingParams(max_tokens=32, ignore_eos=True), [5, 6, 2, 7, 4, 3]),
        (SamplingParams(max_tokens=32, ignore_eos=True, stop_token_ids=(7,)), [5, 6, 2, 7]),
        (SamplingParams(max_tokens=32, stop_token_ids=(5,)), [5]),
    ],
)
def test_drafts_end_at_the_first_stop_token(params: SamplingParams, expected: list[int]) -> None:
    """Nothing after a stop token can be kept, so a draft stops there (and its
    distributions with it)."""
    config = SpeculativeConfig(num_speculative_tokens=6)
    speculator = Speculator(config, _FixedProposer([5, 6, 2, 7, 4, 3]), Sampler(), [2])
    seq = Sequence_("r", [1, 3, 4], params)
    seq.status = SequenceStatus.RUNNING
    seq.num_computed_tokens = 2
    speculator.propose([seq])
    assert seq.spec_token_ids == expected
    # Verification sees the cut draft: one target row per draft and one more (a draft of
    # another length would not match the rows), its distributions cut alike.
    k = len(expected)
    item = ScheduledSequence(seq, 2, k + 1, samples=True, num_spec_tokens=k)
    emitted = speculator.verify(torch.randn(k + 1, 8), [item])
    assert 1 <= len(emitted[0]) <= k + 1
    assert emitted[0][:-1] == expected[: len(emitted[0]) - 1]


@pytest.mark.parametrize(("triggered", "expected"), [(False, [5]), (True, [])])
def test_drafts_end_before_a_lazy_grammars_trigger(triggered: bool, expected: list[int]) -> None:
    """A lazy grammar (tool_choice="auto") masks nothing until its trigger token: drafts stop
    before the trigger, which only the target model's own last token of a step can be, and
    once the grammar is triggered its masks cover one token at a time, so no drafts."""
    grammar = Grammar("unused: never compiled here", "tool_call_auto", trigger=6)
    speculator = Speculator(
        SpeculativeConfig(num_speculative_tokens=6), _FixedProposer([5, 6, 2, 7]), Sampler(), [2]
    )
    seq = Sequence_("r", [1, 3, 4], SamplingParams(max_tokens=32, grammar=grammar))
    assert not seq.constrained
    seq.constrained = triggered
    seq.status = SequenceStatus.RUNNING
    seq.num_computed_tokens = 2
    speculator.propose([seq])
    assert seq.spec_token_ids == expected


def test_greedy_ngram_matches_plain_in_shared_steps(model: DecoderModel) -> None:
    prompts = repetitive_prompts()
    # Every third request has a penalty: it never speculates, yet shares every step.
    params = [
        SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, presence_penalty=0.5)
        if i % 3 == 0
        else GREEDY
        for i in range(len(prompts))
    ]
    plain = engine_for(model).generate(prompts, params)
    engine = engine_for(model, NGRAM)
    steps = spy_steps(engine)
    spec = engine.generate(prompts, params)
    assert tokens(spec) == tokens(plain)
    assert any(with_drafts and without for with_drafts, without in steps)
    stats = engine.spec_stats
    assert stats is not None and stats.num_accepted_tokens > 0
    assert all(r.spec is None for i, r in enumerate(spec) if i % 3 == 0)
    assert engine.num_free_blocks() == engine.num_blocks


@pytest.mark.parametrize("same", [True, False], ids=["draft=target", "unrelated-draft"])
def test_greedy_draft_matches_plain(model: DecoderModel, other: DecoderModel, same: bool) -> None:
    prompts = repetitive_prompts(seed=1)
    plain = engine_for(model).generate(prompts, GREEDY)
    engine = engine_for(model, DRAFT, model if same else other)
    spec = engine.generate(prompts, GREEDY)
    assert tokens(spec) == tokens(plain)
    stats = engine.spec_stats
    assert stats is not None and stats.num_draft_tokens > 0
    if same:  # a draft identical to the target is always right
        assert stats.acceptance_rate == 1.0
    proposer = engine.speculator.proposer if engine.speculator else None
    assert getattr(proposer, "pool").num_free_blocks == engine.num_blocks  # noqa: B009


def test_per_request_stats_add_up_to_the_engine_stats(model: DecoderModel) -> None:
    prompts = repetitive_prompts(seed=2)
    engine = engine_for(model, NGRAM)
    results = engine.generate(prompts, GREEDY)
    total = engine.spec_stats
    assert total is not None
    per = [r.spec for r in results if r.spec is not None]
    assert per and sum(s.num_draft_tokens for s in per) == total.num_draft_tokens
    assert sum(s.num_accepted_tokens for s in per) == total.num_accepted_tokens
    assert all(0.0 <= s.acceptance_rate <= 1.0 for s in per)
    # Every token a request got came from a verification or a plain step.
    for r in results:
        assert len(r.token_ids) == GREEDY.max_tokens


def test_each_output_keeps_the_stats_of_its_step(model: DecoderModel) -> None:
    """``RequestOutput.spec`` is a snapshot: later verifications do not change it."""
    engine = engine_for(model, NGRAM)
    engine.add_request(repetitive_prompts(1, seed=9)[0], GREEDY)
    seen = []
    while engine.has_unfinished():
        for out in engine.step():
            if out.spec is not None:
                seen.append((out.spec, out.spec.num_verifications, out.spec.num_draft_tokens))
    assert len({count for _, count, _ in seen}) > 2  # several verifications happened
    assert all((s.num_verifications, s.num_draft_tokens) == (v, d) for s, v, d in seen)


def test_blocks_track_verified_tokens_every_step(model: DecoderModel) -> None:
    """Rejected drafts give their blocks back at once; cached prefixes stay right."""
    prompts = repetitive_prompts(seed=3)
    engine = engine_for(model, SpeculativeConfig(ngram_min=1, min_accepted=0.0))
    pool = engine.pool
    for prompt in prompts:
        engine.add_request(prompt, GREEDY)
    while engine.has_unfinished():
        engine.step()
        for seq in engine.scheduler.running:
            held = len(seq.block_table)  # the newest token's slot may come next step
            assert pool.blocks_for(seq.num_tokens - 1) <= held <= pool.blocks_for(seq.num_tokens)
            assert seq.num_computed_tokens == seq.num_tokens - 1
    assert engine.num_free_blocks() == engine.num_blocks
    assert engine.spec_stats is not None
    assert engine.spec_stats.num_accepted_tokens < engine.spec_stats.num_draft_tokens
    # The prefix cache now holds blocks published during speculation: prompts that extend
    # the earlier outputs hit them and still decode exactly as plain decoding does.
    plain_engine = engine_for(model)
    first = plain_engine.generate(prompts, GREEDY)
    longer = [p + r.token_ids for p, r in zip(prompts, first, strict=True)]
    again = engine.generate(longer, GREEDY)
    assert sum(r.num_cached_tokens for r in again) > 0
    assert tokens(again) == tokens(plain_engine.generate(longer, GREEDY))


def test_stop_token_inside_accepted_drafts(model: DecoderModel) -> None:
    prompt = repetitive_prompts(1, seed=4)[0]
    plain = engine_for(model).generate([prompt], GREEDY)[0].token_ids
    stop = plain[10]
    cut = plain.index(stop) + 1
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, stop_token_ids=(stop,))
    engine = engine_for(model, SpeculativeConfig(ngram_min=1, num_speculative_tokens=8))
    result = engine.generate([prompt], params)[0]
    assert result.token_ids == plain[:cut]
    assert result.finish_reason == "stop"
    assert engine.num_free_blocks() == engine.num_blocks


def test_drafts_fit_the_step_budget_and_never_preempt(model: DecoderModel) -> None:
    prompts = repetitive_prompts(seed=5)
    plain = engine_for(model).generate(prompts, GREEDY)
    engine = engine_for(model, NGRAM, num_blocks=40, max_num_seqs=6, max_num_batched_tokens=8)
    assert tokens(engine.generate(prompts, GREEDY)) == tokens(plain)
    assert engine.num_free_blocks() == 40


def test_draft_cache_rolls_back_drafts_the_step_had_no_room_for(model: DecoderModel) -> None:
    """With a draft model equal to the target every draft is right, unless the draft's own
    cache kept tokens it proposed but the scheduler trimmed or dropped."""
    rng = random.Random(7)  # short prompts, so several requests decode at once
    prompts = [[rng.randrange(3, 256) for _ in range(2)] * 2 for _ in range(8)]
    plain = engine_for(model).generate(prompts, GREEDY)
    engine = engine_for(model, DRAFT, model, max_num_seqs=6, max_num_batched_tokens=10)
    assert tokens(engine.generate(prompts, GREEDY)) == tokens(plain)
    stats = engine.spec_stats
    assert stats is not None and stats.num_draft_tokens > 0
    assert stats.acceptance_rate == 1.0


def test_speculation_backs_off_when_drafts_miss(model: DecoderModel, other: DecoderModel) -> None:
    prompt = repetitive_prompts(1, seed=6)[0]
    params = SamplingParams(temperature=0.0, max_tokens=120, ignore_eos=True)
    engine = engine_for(model, DRAFT, other, num_blocks=512)
    result = engine.generate([prompt], params)[0]
    stats = result.spec
    assert stats is not None and stats.num_accepted_tokens == 0  # the drafts never agree
    # Pauses of 1, 2, 4, 8, 16, 32, 64 steps: a handful of probes over 120 tokens.
    assert stats.num_verifications <= 10


def chi_square_p_value(
    observed: Counter[tuple[int, ...]], expected: dict[tuple[int, ...], float]
) -> float:
    """Pearson's test; cells expecting fewer than 5 draws are pooled into one."""
    n = sum(observed.values())
    stat, cells, pooled_obs, pooled_exp = 0.0, 0, 0, 0.0
    for cell, p in expected.items():
        e = p * n
        if e < 5:
            pooled_obs += observed.get(cell, 0)
            pooled_exp += e
            continue
        stat += (observed.get(cell, 0) - e) ** 2 / e
        cells += 1
    if pooled_exp > 0:
        stat += (pooled_obs - pooled_exp) ** 2 / pooled_exp
        cells += 1
    df = cells - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2), torch.tensor(stat / 2)))


VOCAB8 = 8


@pytest.fixture(scope="module")
def small_vocab(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("v8")
    kw: dict[str, Any] = {
        "vocab_size": VOCAB8,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "initializer_range": 0.15,
    }
    target = make_tiny_model(root / "target", "llama", seed=5, **kw)
    draft = make_tiny_model(root / "draft", "llama", seed=6, num_hidden_layers=1, **kw)
    return target, draft


def exact_joints(
    path: Path, prompt: list[int], depth: int, temperature: float, top_ks: Sequence[int]
) -> list[dict[tuple[int, ...], float]]:
    """The target distribution of the next ``depth`` tokens under each top-k, computed with
    transformers' model over every possible continuation (one batched pass per depth)."""
    from transformers import AutoModelForCausalLM

    hf: Any = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    hf.eval()
    logits: dict[tuple[int, ...], torch.Tensor] = {}
    prefixes: list[tuple[int, ...]] = [()]
    for _ in range(depth):
        with torch.no_grad():
            rows = hf(torch.tensor([prompt + list(p) for p in prefixes])).logits[:, -1]
        for prefix, row in zip(prefixes, rows.double() / temperature, strict=True):
            logits[prefix] = row
        prefixes = [(*p, t) for p in prefixes for t in range(VOCAB8)]
    joints = []
    for top_k in top_ks:
        joint: dict[tuple[int, ...], float] = {(): 1.0}
        for _ in range(depth):
            grown: dict[tuple[int, ...], float] = {}
            for prefix, p in joint.items():
                row = logits[prefix].clone()
                row[row < row.topk(top_k).values[-1]] = -float("inf")
                for token, q in enumerate(torch.softmax(row, dim=-1).tolist()):
                    if q > 0:
                        grown[(*prefix, token)] = p * q
            joint = grown
        joints.append(joint)
    return joints


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_rejection_sampling_keeps_the_target_distribution(
    small_vocab: tuple[Path, Path], method: str
) -> None:
    """Chi-square of 4-token continuations sampled with speculation against the exact joint
    distribution of the target (temperature 0.9, top-k 6); a wrong distribution fails."""
    target_dir, draft_dir = small_vocab
    prompt = [2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 1, 5, 6, 7, 2, 3]
    depth, temperature, top_k, draws = 4, 0.9, 6, 2000
    target = load_model(target_dir)
    if method == "ngram":
        spec = SpeculativeConfig(ngram_min=1, min_accepted=0.0)
        draft = None
    else:
        spec = SpeculativeConfig(method="draft", draft_model=str(draft_dir), min_accepted=0.0)
        draft = load_model(draft_dir)
    engine = engine_for(target, spec, draft, max_num_seqs=256, max_num_batched_tokens=2048)
    params = SamplingParams(temperature=temperature, top_k=top_k, max_tokens=depth, ignore_eos=True)
    results = engine.generate([prompt] * draws, params)
    observed = Counter(tuple(r.token_ids) for r in results)
    stats = engine.spec_stats
    assert stats is not None
    assert stats.num_accepted_tokens > 0.1 * draws  # drafts were really kept...
    assert stats.num_accepted_tokens < stats.num_draft_tokens  # ...and really rejected
    exact, wrong = exact_joints(target_dir, prompt, depth, temperature, [top_k, VOCAB8])
    assert chi_square_p_value(observed, exact) > 1e-3
    # The same draws against the untruncated distribution fail the same threshold.
    assert chi_square_p_value(observed, wrong) < 1e-3


def test_config_is_checked(model: DecoderModel, other: DecoderModel, tmp_path: Path) -> None:
    with pytest.raises(EngineConfigError, match="unknown speculative method"):
        SpeculativeConfig(method="medusa")  # type: ignore[arg-type]
    with pytest.raises(EngineConfigError, match="num_speculative_tokens"):
        SpeculativeConfig(num_speculative_tokens=0)
    with pytest.raises(EngineConfigError, match="ngram_min"):
        SpeculativeConfig(ngram_min=5, ngram_max=3)
    with pytest.raises(EngineConfigError, match="needs draft_model"):
        SpeculativeConfig(method="draft")
    with pytest.raises(EngineConfigError, match="needs a draft model"):
        engine_for(model, DRAFT)
    small = load_model(make_tiny_model(tmp_path / "v", "llama", vocab_size=64))
    with pytest.raises(EngineConfigError, match="vocabulary"):
        engine_for(model, DRAFT, small)
    with pytest.raises(EngineConfigError, match="SpeculativeConfig"):
        EngineConfig(speculative="ngram")  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> TinyModel:
    return load_tiny_model(tmp_path_factory.mktemp("swiftclient-cache"))


@pytest.mark.anyio
async def test_served_completions_report_accepted_drafts(tiny: TinyModel) -> None:
    """Through the client and the local backend: same text as without speculation, and
    usage carries the request's accepted and rejected draft tokens."""
    prompt = "Copy this: the quick brown fox jumps over the lazy dog. " * 3
    fixed: dict[str, Any] = {"temperature": 0.0, "max_tokens": 32}
    fixed["extra_body"] = {"ignore_eos": True}
    async with AsyncClient(LocalBackend.from_engine(tiny.engine()), model="tiny") as client:
        plain = await client.chat(prompt, **fixed)
    assert plain.usage is not None and plain.usage.completion_tokens_details is None
    engine = tiny.engine(speculative=SpeculativeConfig(ngram_min=1))
    async with AsyncClient(LocalBackend.from_engine(engine), model="tiny") as client:
        for stream in (True, False):
            completion = await client.chat(prompt, stream=stream, **fixed)
            assert completion.text == plain.text
            usage = completion.usage
            assert usage is not None and usage.completion_tokens_details is not None
            accepted = usage.completion_tokens_details.accepted_prediction_tokens
            rejected = usage.completion_tokens_details.rejected_prediction_tokens
            assert accepted is not None and rejected is not None
            assert accepted > 0 and rejected >= 0
    assert engine.spec_stats is not None and engine.spec_stats.num_accepted_tokens >= accepted


def test_command_line_turns_speculation_on() -> None:
    import argparse

    from local_engine.server import _engine_config, command

    def parse(*argv: str) -> argparse.Namespace:
        ctx = command.make_context("serve", list(argv))
        return argparse.Namespace(**ctx.params)

    spec = _engine_config(parse("--speculative", "ngram", "--num-speculative-tokens", "6"))
    assert spec.speculative is not None
    assert spec.speculative.method == "ngram" and spec.speculative.num_speculative_tokens == 6
    spec = _engine_config(parse("--speculative", "draft", "--draft-model", "/models/small"))
    assert spec.speculative is not None
    assert spec.speculative.method == "draft" and spec.speculative.draft_model == "/models/small"
    assert _engine_config(parse()).speculative is None
    for bad in (["--speculative", "draft"], ["--draft-model", "/m"]):
        with pytest.raises(ConfigurationError, match="draft"):
            _engine_config(parse(*bad))


def _running_pair(
    pool: BlockPool, max_num_batched_tokens: int
) -> tuple[Scheduler, Sequence_, Sequence_]:
    """Two running sequences of 8 tokens (7 computed) in 2 blocks each of a 4-block pool."""
    sched = Scheduler(pool, max_num_seqs=2, max_num_batched_tokens=max_num_batched_tokens)
    pair = []
    for i in range(2):
        seq = Sequence_(f"r{i}", list(range(10 * i + 3, 10 * i + 10)), SamplingParams(max_tokens=8))
        sched.add(seq)
        pair.append(seq)
    out = sched.schedule()
    for item in out.scheduled:
        item.seq.append_token(5)
    sched.update(out)
    return sched, pair[0], pair[1]


def test_scheduler_drops_drafts_rather_than_preempt() -> None:
    pool = BlockPool(4, 4)
    sched, a, b = _running_pair(pool, 64)
    assert pool.num_free_blocks == 0
    a.spec_token_ids = [1, 2]  # 10 tokens need a third block: there is none
    out = sched.schedule()
    assert [(i.seq, i.num_new_tokens, i.num_spec_tokens) for i in out.scheduled] == [
        (a, 1, 0),
        (b, 1, 0),
    ]
    assert not out.preempted and a.spec_token_ids == []


def test_scheduler_drafts_leave_budget_for_every_decode() -> None:
    pool = BlockPool(8, 4)
    sched, a, b = _running_pair(pool, 64)
    sched.max_num_batched_tokens = 4
    a.spec_token_ids = [1, 2, 3, 4]
    out = sched.schedule()
    # Four tokens of budget: b's decode keeps one, a takes its token and two drafts.
    assert [(i.seq, i.num_new_tokens, i.num_spec_tokens) for i in out.scheduled] == [
        (a, 3, 2),
        (b, 1, 0),
    ]


def test_the_draft_model_may_be_an_embedded_model_name() -> None:
    """The target took ``"swift-tiny"``; the draft said "model path 'swift-tiny' does not
    exist"."""
    spec = SpeculativeConfig(method="draft", draft_model="swift-tiny", num_speculative_tokens=2)
    engine = Engine.from_pretrained("swift-tiny", EngineConfig(num_blocks=64, speculative=spec))
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    plain = Engine.from_pretrained("swift-tiny", EngineConfig(num_blocks=64))
    prompt = [5, 6, 7, 8]
    # the model drafts for itself: greedy tokens are the plain ones
    assert (
        engine.generate([prompt], params)[0].token_ids
        == plain.generate([prompt], params)[0].token_ids
    )
