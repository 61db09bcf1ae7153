"""Sampler and stop handling: greedy, truncation, seeds, penalties, logprobs, stop strings."""

from __future__ import annotations

import math

import pytest
import torch

from local_engine.sampler import Sampler, SamplingParams
from local_engine.sequence import Sequence
from local_engine.stop import StopChecker

V = 8


def seq(rid: str, params: SamplingParams, generated: tuple[int, ...] = ()) -> Sequence:
    """A sequence with a one-token prompt and ``generated`` already sampled."""
    s = Sequence(rid, [0], params)
    for t in generated:
        s.append_token(t)
    return s


def logits_for(*rows: list[float]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


def draw(sampler: Sampler, row: list[float], params: SamplingParams, n: int) -> list[int]:
    """Sample ``n`` times from the same distribution (one request)."""
    s = seq("r", params)
    return [sampler.sample(logits_for(row), [s]).token_ids[0] for _ in range(n)]


ROW = [0.5, 3.0, 1.0, 2.5, -1.0, 2.0, 0.0, 1.5]  # ranks: 1, 3, 5, 7, 2, 0, 6, 4


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_tokens", 0),
        ("temperature", -0.1),
        ("temperature", math.nan),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("top_k", -1),
        ("min_p", 1.1),
        ("seed", -3),
        ("presence_penalty", 2.5),
        ("frequency_penalty", -3.0),
        ("top_logprobs", 21),
        ("stop", ("",)),
        ("stop_token_ids", (-1,)),
    ],
)
def test_bad_params_raise_value_error(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field.split("_")[0]):
        SamplingParams(**{field: value})  # type: ignore[arg-type]


def test_top_logprobs_needs_logprobs() -> None:
    with pytest.raises(ValueError, match="logprobs"):
        SamplingParams(top_logprobs=2)


def test_greedy_is_argmax_per_row() -> None:
    logits = torch.randn(5, 50, generator=torch.Generator().manual_seed(1))
    expected = logits.argmax(-1).tolist()
    seqs = [seq(str(i), SamplingParams(temperature=0.0)) for i in range(5)]
    assert Sampler().sample(logits.clone(), seqs).token_ids == expected


@pytest.mark.parametrize(
    ("params", "allowed"),
    [
        (SamplingParams(top_k=3), {1, 3, 5}),
        (SamplingParams(top_k=1, temperature=5.0), {1}),
        (SamplingParams(top_p=0.5), {1, 3}),
        (SamplingParams(top_k=3, top_p=0.01), {1}),
        (SamplingParams(min_p=math.exp(-1.25)), {1, 3, 5}),  # p_i/p_max >= e^-1.25
    ],
)
def test_truncation_only_picks_allowed_tokens(params: SamplingParams, allowed: set[int]) -> None:
    picks = draw(Sampler(seed=0), ROW, params, 300)
    assert set(picks) == allowed


def test_top_p_nucleus_boundary() -> None:
    probs = torch.softmax(torch.tensor(ROW), -1).sort(descending=True).values
    # Mass of the two best tokens; asking for slightly more needs the third one too.
    two = float(probs[:2].sum())
    assert set(draw(Sampler(seed=1), ROW, SamplingParams(top_p=two - 1e-3), 300)) == {1, 3}
    assert set(draw(Sampler(seed=1), ROW, SamplingParams(top_p=two + 1e-3), 300)) == {1, 3, 5}


def test_sampling_follows_the_distribution() -> None:
    row = [math.log(0.7), math.log(0.2), math.log(0.1)]
    picks = draw(Sampler(seed=3), row, SamplingParams(), 2000)
    freq = [picks.count(i) / 2000 for i in range(3)]
    assert freq == pytest.approx([0.7, 0.2, 0.1], abs=0.05)


def test_seed_reproducible_regardless_of_batch() -> None:
    params = SamplingParams(temperature=1.5, top_k=6, seed=1234)
    gen = torch.Generator().manual_seed(0)
    steps = [torch.randn(V, generator=gen).tolist() for _ in range(20)]

    alone_sampler = Sampler()
    alone = seq("a", params)
    solo = [alone_sampler.sample(logits_for(r), [alone]).token_ids[0] for r in steps]

    batched_sampler = Sampler()
    target = seq("a", params)
    others = [
        seq("x", SamplingParams(temperature=0.7)),
        seq("y", SamplingParams(seed=99, top_p=0.9)),
        seq("z", SamplingParams(temperature=0.0, presence_penalty=1.0), (1, 2)),
    ]
    batched = []
    for i, r in enumerate(steps):
        noise = torch.randn(3, V, generator=gen)
        batch = [*others[: i % 4], target]  # batch composition changes every step
        rows = torch.cat([noise[: i % 4], logits_for(r)])
        batched.append(batched_sampler.sample(rows, batch).token_ids[-1])
    assert batched == solo
    assert len(set(solo)) > 1  # actually random, not degenerate


def test_release_forgets_generator() -> None:
    sampler = Sampler()
    params = SamplingParams(seed=5)
    first = draw(sampler, ROW, params, 10)
    sampler.release("r")
    assert draw(sampler, ROW, params, 10) == first


def test_penalties_follow_openai_formula() -> None:
    params = SamplingParams(
        temperature=0.0, logprobs=True, presence_penalty=0.5, frequency_penalty=0.25
    )
    s = seq("p", params, generated=(1, 1, 1, 3))
    base = logits_for(ROW)
    out = Sampler().sample(base.clone(), [s])
    expected = base[0].clone()
    expected[1] -= 0.5 + 3 * 0.25  # 3.0 -> 1.75
    expected[3] -= 0.5 + 0.25  # 2.5 -> 1.75
    ref = torch.log_softmax(expected, -1)
    assert out.token_ids == [int(expected.argmax())] == [5]
    lp = out.logprobs[0]
    assert lp is not None and lp.logprob == pytest.approx(float(ref[5]), abs=1e-6)


def test_penalty_counts_follow_new_tokens_across_steps() -> None:
    params = SamplingParams(temperature=0.0, logprobs=True, top_logprobs=V, frequency_penalty=1.0)
    sampler = Sampler()
    s = seq("p", params, generated=(1,))
    assert sampler.sample(logits_for(ROW), [s]).token_ids == [3]  # 3.0 - 1 < 2.5
    s.append_token(1)
    s.append_token(5)
    out = sampler.sample(logits_for(ROW), [s])
    expected = torch.tensor(ROW)
    expected[1] -= 2.0
    expected[5] -= 1.0
    lp = out.logprobs[0]
    assert lp is not None and out.token_ids == [3]
    ref = torch.log_softmax(expected, -1)
    assert dict(lp.top_logprobs)[1] == pytest.approx(float(ref[1]), abs=1e-6)
    sampler.release("p")
    fresh = seq("p", params, generated=(5,))
    assert sampler.sample(logits_for(ROW), [fresh]).token_ids == [1]


def test_penalties_only_touch_their_own_row() -> None:
    plain = seq("a", SamplingParams(temperature=0.0, logprobs=True, top_logprobs=V))
    penal = seq("b", SamplingParams(temperature=0.0, frequency_penalty=2.0), generated=(1,))
    out = Sampler().sample(logits_for(ROW, ROW), [plain, penal])
    assert out.token_ids == [1, 3]
    lp = out.logprobs[0]
    assert lp is not None
    ref = torch.log_softmax(torch.tensor(ROW), -1)
    assert dict(lp.top_logprobs)[1] == pytest.approx(float(ref[1]), abs=1e-6)


@pytest.mark.parametrize("temperature", [1e-38, 1e-45, 1e-320, 9e-6])
def test_a_vanishing_temperature_is_greedy_not_nan(temperature: float) -> None:
    """Logits divided by 1e-38 overflowed to infinities: the softmax was NaN, the token the
    end of text and every logprob null. Under 1e-5 it decodes greedily, logprobs at 1."""
    params = SamplingParams(temperature=temperature, seed=3, logprobs=True, top_logprobs=2)
    assert params.greedy
    out = Sampler().sample(logits_for(ROW), [seq("t", params)])
    assert out.token_ids == [max(range(V), key=ROW.__getitem__)]
    lp = out.logprobs[0]
    assert lp is not None and math.isfinite(lp.logprob)
    assert all(math.isfinite(v) for _, v in lp.top_logprobs)
    assert not SamplingParams(temperature=1e-5).greedy


def test_logprobs_are_normalized_and_sorted() -> None:
    params = SamplingParams(temperature=0.7, top_k=2, seed=0, logprobs=True, top_logprobs=V)
    out = Sampler().sample(logits_for(ROW), [seq("l", params)])
    lp = out.logprobs[0]
    assert lp is not None and lp.token_id == out.token_ids[0]
    values = [v for _, v in lp.top_logprobs]
    assert values == sorted(values, reverse=True)
    assert sum(math.exp(v) for v in values) == pytest.approx(1.0, abs=1e-5)
    # Before truncation and after temperature:
    ref = torch.log_softmax(torch.tensor(ROW) / 0.7, -1)
    assert dict(lp.top_logprobs)[lp.token_id] == pytest.approx(lp.logprob)
    assert lp.logprob == pytest.approx(float(ref[lp.token_id]), abs=1e-5)


def test_top_logprobs_count_per_request() -> None:
    a = seq("a", SamplingParams(temperature=0.0, logprobs=True, top_logprobs=2))
    b = seq("b", SamplingParams(temperature=0.0, logprobs=True))
    c = seq("c", SamplingParams(temperature=0.0))
    out = Sampler().sample(logits_for(ROW, ROW, ROW), [a, b, c])
    la, lb = out.logprobs[0], out.logprobs[1]
    assert la is not None and [t for t, _ in la.top_logprobs] == [1, 3]
    assert lb is not None and lb.top_logprobs == ()
    assert out.logprobs[2] is None


# --- stop handling -----------------------------------------------------------------


class CharDetok:
    """Token id i decodes to chr(i)."""

    def push(self, token_id: int) -> str:
        return chr(token_id)

    def flush(self) -> str:
        return ""


def run(checker: StopChecker, text: str) -> tuple[list[str], str | None]:
    pieces: list[str] = []
    reason = None
    for ch in text:
        piece, reason = checker.push(ord(ch))
        pieces.append(piece)
        if reason:
            break
    return pieces, reason


def test_stop_string_truncates_and_never_leaks() -> None:
    checker = StopChecker(SamplingParams(stop=("END", "xy")), (), CharDetok())
    pieces, reason = run(checker, "abENxENDzz")
    assert reason == "stop"
    assert "".join(pieces) == "abENx"
    # "E" and "EN" were held back until they could no longer start a stop string.
    assert pieces == ["a", "b", "", "", "EN", "x", "", ""]


def test_stop_string_earliest_match_wins() -> None:
    checker = StopChecker(SamplingParams(stop=("cd", "bcde")), (), CharDetok())
    pieces, reason = run(checker, "abcdef")
    assert reason == "stop" and "".join(pieces) == "ab"


def test_held_text_released_at_length_limit() -> None:
    checker = StopChecker(SamplingParams(max_tokens=3, stop=("abc",)), (), CharDetok())
    pieces, reason = run(checker, "xab")
    assert reason == "length" and "".join(pieces) == "xab"


def test_stop_and_eos_tokens() -> None:
    checker = StopChecker(SamplingParams(stop_token_ids=(5,)), (2,), CharDetok())
    assert checker.push(ord("a")) == ("a", None)
    assert checker.push(2) == ("", "stop")
    ignore = StopChecker(SamplingParams(ignore_eos=True, stop_token_ids=(5,)), (2,), CharDetok())
    assert ignore.push(2) == ("\x02", None)
    assert ignore.push(5) == ("", "stop")


def test_stop_strings_need_a_detokenizer() -> None:
    with pytest.raises(ValueError, match="tokenizer"):
        StopChecker(SamplingParams(stop=("x",)), (), None)
