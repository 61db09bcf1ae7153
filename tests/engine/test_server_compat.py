"""The local server behaves like the servers tools already point at (issue 27): the model's
sampling defaults, unknown fields ignored, vLLM's extensions, the endpoints and names tools
expect, the access log, and usage on every chunk."""

from __future__ import annotations

import argparse
import json
import logging
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import torch

from local_engine import LocalBackend
from local_engine.generation import read_sampling_defaults, sampling_defaults
from local_engine.sampler import Sampler, SamplingParams
from local_engine.sequence import Sequence
from local_engine.server import IGNORED_FIELDS_HEADER, _build, command
from local_engine.service import ChatService
from swiftclient import AsyncClient
from swiftclient.types import ChatRequest

from ..conformance.tiny_local import TinyModel, load_tiny_model
from .test_server import HI, LIMIT, Served, serve

pytestmark = [
    pytest.mark.filterwarnings(
        "ignore:Exception ignored in. <async_generator object (AsyncStream|SSEDecoder)\\.:"
        "pytest.PytestUnraisableExceptionWarning"
    ),
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> TinyModel:
    return load_tiny_model(tmp_path_factory.mktemp("swiftclient-cache"))


@pytest.fixture
async def served(tiny: TinyModel, anyio_backend: str) -> AsyncIterator[Served]:
    async with serve(tiny.engine()) as running:
        yield running


def _parse(*argv: str) -> argparse.Namespace:
    return argparse.Namespace(**command.make_context("serve", list(argv)).params)


# ---------------------------------------------------------------------- 1: model defaults


def test_generation_config_fields_become_sampling_defaults(tmp_path: Path) -> None:
    config = {
        "temperature": 0.6,
        "top_p": 0.95,
        "top_k": 20,
        "min_p": 0.0,
        "repetition_penalty": 1.05,
        "max_new_tokens": 300,
        "eos_token_id": [1, 2],
        "do_sample": True,
    }
    assert sampling_defaults(config) == {
        "temperature": 0.6,
        "top_p": 0.95,
        "top_k": 20,
        "min_p": 0.0,
        "repetition_penalty": 1.05,
        "max_new_tokens": 300,
    }
    # do_sample false is greedy (Hugging Face's meaning); nonsense values are left out
    assert sampling_defaults({"do_sample": False, "temperature": 0.7}) == {"temperature": 0.0}
    assert sampling_defaults({"temperature": "hot", "top_k": True, "top_p": 2.0}) == {}
    assert read_sampling_defaults(tmp_path) == {}  # no generation_config.json
    (tmp_path / "generation_config.json").write_text("{broken", encoding="utf-8")
    assert read_sampling_defaults(tmp_path) == {}


def test_the_service_fills_unset_fields_from_the_model_defaults(tiny: TinyModel) -> None:
    defaults = {"temperature": 0.0, "top_k": 5, "repetition_penalty": 1.2, "max_new_tokens": 7}
    service = ChatService(tiny.engine(), default_max_tokens=64, sampling_defaults=defaults)
    params = service.prepare(ChatRequest(model="m", messages=HI)).params
    assert params.temperature == 0.0 and params.top_k == 5
    assert params.repetition_penalty == 1.2 and params.max_tokens == 7
    asked = ChatRequest(
        model="m", messages=HI, temperature=0.9, max_tokens=20, extra_body={"top_k": -1}
    )
    params = service.prepare(asked).params
    assert params.temperature == 0.9 and params.max_tokens == 20 and params.top_k == 0


@pytest.mark.anyio
async def test_the_embedded_model_decodes_greedily_unless_told_otherwise() -> None:
    """Issue 27.1: swift-tiny says do_sample false; with temperature omitted the engine sampled
    at 1.0 and 'Say hello' got a different line each time."""
    hello: Any = [{"role": "user", "content": "Say hello"}]
    ask = ChatRequest(model="default", messages=hello)
    async with LocalBackend() as backend:
        assert backend.sampling_defaults == {"temperature": 0.0}
        replies = set()
        for _ in range(4):
            completion = await backend.complete(ask, _deadline())
            replies.add(completion.choices[0].message.content)
        assert len(replies) == 1
    ignoring = LocalBackend(generation_config="none")
    await ignoring.warmup()
    assert ignoring.sampling_defaults == {}
    with pytest.raises(Exception, match="generation_config"):
        LocalBackend(generation_config="vllm")  # type: ignore[arg-type]


def _deadline() -> Any:
    from swiftclient import Timeout
    from swiftclient.extend import Deadline

    return Deadline(Timeout(total=None, connect=None, pool=None, first_token=None, idle=None))


def test_the_server_option_ignores_the_generation_config() -> None:
    assert _build(_parse()).backend.generation_config == "auto"
    assert _build(_parse("--generation-config", "none")).backend.generation_config == "none"


@pytest.mark.anyio
async def test_models_list_both_names_and_their_sampling_defaults(served: Served) -> None:
    listed = (await served.http.get("/v1/models")).json()["data"]
    assert [m["id"] for m in listed] == ["tiny-test", "default"]
    assert all(m["root"] == "tiny-test" and m["sampling_defaults"] == {} for m in listed)
    assert listed[0]["max_model_len"] == served.engine.max_model_len


# ---------------------------------------------------------------------- 2: unknown fields


@pytest.mark.anyio
async def test_unknown_fields_are_ignored_named_in_a_header_and_logged_once(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    body = {
        "model": "tiny-test",
        "messages": HI,
        "max_tokens": 2,
        "verbosity": "low",
        "safety_identifier": "u1",
        "prompt_cache_retention": "24h",
        "modalities": ["text"],
        "store": False,
        "stream": True,
        "stream_options": {"include_usage": True, "include_obfuscation": False},
    }
    with caplog.at_level(logging.WARNING, logger="local_engine.server"):
        for _ in range(2):
            response = await served.http.post("/v1/chat/completions", json=body)
            assert response.status_code == 200, response.text
            assert response.headers[IGNORED_FIELDS_HEADER] == (
                "modalities, prompt_cache_retention, safety_identifier, store, "
                "stream_options.include_obfuscation, verbosity"
            )
    warnings = [r.getMessage() for r in caplog.records if r.name == "local_engine.server"]
    assert len(warnings) == 1 and "verbosity" in warnings[0]
    plain = await served.http.post(
        "/v1/chat/completions", json={"model": "tiny-test", "messages": HI, "max_tokens": 1}
    )
    assert IGNORED_FIELDS_HEADER not in plain.headers


@pytest.mark.anyio
async def test_any_unknown_field_name_is_a_200_with_a_safe_header_and_log_line(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    """A client picks the names: non-Latin-1 ones failed the header's encoding (a text/plain
    500 after the reply was generated), one with a newline was refused as a header and could
    forge a log line, and thousands of them made a header no client could read."""
    forged = 'x\n2026-12-06 00:00:00,000 10.0.0.1:4444 "POST /v1/chat/completions" 200'
    many = {f"field_{i:04d}_{'y' * 90}": 1 for i in range(300)}
    bodies = [{"ключ": 1}, {forged: 1}, many, {"a, b": 1}]
    with caplog.at_level(logging.WARNING, logger="local_engine.server"):
        for extra in bodies:
            body = {"model": "tiny-test", "messages": HI, "max_tokens": 2, **extra}
            for stream in (False, True):
                response = await served.http.post(
                    "/v1/chat/completions", json={**body, "stream": stream}
                )
                assert response.status_code == 200, response.text
                header = response.headers[IGNORED_FIELDS_HEADER]
                assert header.isascii() and header.isprintable() and len(header) < 2000
    assert "\\u043a\\u043b\\u044e\\u0447" in caplog.text  # ключ, escaped
    lines = caplog.text.splitlines()
    assert not any(line.startswith("2026-12-06 00:00:00,000") for line in lines)
    assert "and 280 more" in caplog.text
    assert "a\\x2c b" in caplog.text  # a comma in a name would split it in two


@pytest.mark.anyio
async def test_null_extensions_are_absent_and_reserved_template_variables_are_400(
    served: Served,
) -> None:
    """``"stop_token_ids": null`` was a 500 (a TypeError) and ``min_tokens``/``ignore_eos``
    null were 400s, where ``top_k: null`` was fine; chat_template_kwargs naming a variable
    the request fills (``messages``, ``tools``...) was a 500 (a TypeError) on every route."""
    base = {"model": "tiny-test", "messages": HI, "max_tokens": 2}
    for key in ("stop_token_ids", "min_tokens", "ignore_eos", "top_k", "cache_salt"):
        for path in ("/v1/chat/completions", "/v1/messages"):
            response = await served.http.post(path, json={**base, key: None})
            assert response.status_code == 200, (key, path, response.text)
    # "source" is no variable the request fills: the template just sees it (it was a 500)
    body = {**base, "chat_template_kwargs": {"source": 1}}
    assert (await served.http.post("/v1/chat/completions", json=body)).status_code == 200
    for key in ("messages", "tools", "documents", "response_format", "special_tokens"):
        body = {**base, "chat_template_kwargs": {key: 1, "enable_thinking": False}}
        for path in ("/v1/chat/completions", "/v1/messages", "/v1/messages/count_tokens"):
            response = await served.http.post(path, json=body)
            assert response.status_code == 400, (key, path, response.text)
            assert key in response.text and "chat_template_kwargs" in response.text
    assert (await served.http.get("/health")).status_code == 200


@pytest.mark.anyio
async def test_a_bad_extension_at_the_top_level_is_named_where_it_was_sent(
    served: Served,
) -> None:
    """The error said ``extra_body['ignore_eos']`` for a field sent at the top level."""
    base = {"model": "tiny-test", "messages": HI, "max_tokens": 2}
    for field, value, words in (
        ("ignore_eos", "yes", "ignore_eos (at the top level or in extra_body) must be a boolean"),
        ("cache_salt", "", "cache_salt (at the top level or in extra_body) must be a non-empty"),
        ("stop_token_ids", 7, "stop_token_ids (at the top level or in extra_body) must be a"),
    ):
        response = await served.http.post("/v1/chat/completions", json={**base, field: value})
        assert response.status_code == 400
        error = response.json()["error"]
        assert error["param"] == field and words in error["message"], error
        assert "extra_body[" not in error["message"]


@pytest.mark.anyio
async def test_known_fields_with_values_the_engine_cannot_honour_stay_400(served: Served) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"min_tokens": 5, "max_tokens": 2}, "min_tokens"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"logit_bias": {"1": 5}}, "logit_bias"),
        ({"verbosity": "low", "temperature": 9}, "temperature"),
    ]
    for extra, fragment in cases:
        body = {"model": "tiny-test", "messages": HI, "max_tokens": 2, **extra}
        response = await served.http.post("/v1/chat/completions", json=body)
        assert response.status_code == 400, extra
        assert fragment in response.json()["error"]["message"]


@pytest.mark.anyio
async def test_vllm_extensions_are_applied(served: Served) -> None:
    completion = await served.oa.chat.completions.create(
        model="tiny-test",
        messages=HI,
        max_tokens=12,
        temperature=0.0,
        extra_body={"min_tokens": 12, "repetition_penalty": 1.3, "top_k": -1},
    )
    assert completion.usage is not None and completion.usage.completion_tokens == 12


def _seq(params: SamplingParams, prompt: list[int], generated: tuple[int, ...] = ()) -> Sequence:
    s = Sequence("r", prompt, params)
    for t in generated:
        s.append_token(t)
    return s


def test_min_tokens_holds_back_eos_and_stop_ids_until_reached() -> None:
    sampler = Sampler(eos_token_ids=[0])
    logits = [5.0, 4.0, 1.0, 0.5]
    params = SamplingParams(temperature=0.0, min_tokens=2, stop_token_ids=(1,))
    pick = sampler.sample(torch.tensor([logits]), [_seq(params, [3], (2,))]).token_ids
    assert pick == [2]  # eos (0) and the stop id (1) are masked while 1 < 2 tokens exist
    done = sampler.sample(torch.tensor([logits]), [_seq(params, [3], (2, 2))]).token_ids
    assert done == [0]
    ignoring = SamplingParams(temperature=0.0, min_tokens=2, ignore_eos=True)
    assert sampler.sample(torch.tensor([logits]), [_seq(ignoring, [3])]).token_ids == [0]
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(max_tokens=2, min_tokens=3)


def test_repetition_penalty_covers_the_prompt_and_the_reply() -> None:
    sampler = Sampler()
    logits = [3.0, 2.0, -1.0, -1.5]
    penalised = SamplingParams(temperature=0.0, repetition_penalty=2.0)
    # token 0 (3.0 -> 1.5) is in the prompt; token 1 (2.0) now wins
    assert sampler.sample(torch.tensor([logits]), [_seq(penalised, [0, 2])]).token_ids == [1]
    # a negative logit is multiplied: token 2 (-1.0 -> -2.0) falls below token 3
    row = torch.tensor([[-5.0, -5.0, -1.0, -1.5]])
    assert sampler.sample(row, [_seq(penalised, [2])]).token_ids == [3]
    plain = SamplingParams(temperature=0.0)
    assert Sampler().sample(torch.tensor([logits]), [_seq(plain, [0])]).token_ids == [0]


# ---------------------------------------------------------------------- 4: every token counted


@pytest.mark.anyio
async def test_continuous_usage_stats_put_the_running_count_on_every_chunk(
    served: Served,
) -> None:
    body = {
        "model": "tiny-test",
        "messages": HI,
        "max_tokens": 10,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    async with served.http.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        assert IGNORED_FIELDS_HEADER not in response.headers
        chunks = [
            json.loads(line[6:])
            async for line in response.aiter_lines()
            if line.startswith("data: {")
        ]
    counts = [c["usage"]["completion_tokens"] for c in chunks]
    assert all("usage" in c for c in chunks)
    assert counts == sorted(counts) and counts[-1] == 10
    assert all(c["usage"]["prompt_tokens"] == chunks[-1]["usage"]["prompt_tokens"] for c in chunks)
    # without include_usage, continuous_usage_stats adds nothing (as in vLLM)
    body["stream_options"] = {"continuous_usage_stats": True}
    async with served.http.stream("POST", "/v1/chat/completions", json=body) as response:
        lines = [line async for line in response.aiter_lines() if line.startswith("data: {")]
    assert not any("usage" in json.loads(line[6:]) for line in lines)


# ---------------------------------------------------------------------- 5: endpoints and names


@pytest.mark.anyio
async def test_a_model_can_be_fetched_by_id(served: Served) -> None:
    for name in ("tiny-test", "default"):
        model = await served.oa.models.retrieve(name)
        assert model.id == name and model.object == "model"
    missing = await served.http.get("/v1/models/gpt-4o")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "model_not_found"
    async with httpx.AsyncClient() as bare:
        anonymous = await bare.get(served.server.base_url + "/models/tiny-test")
    assert anonymous.status_code == 401
    # HEAD as on every GET route (it was a 404); another method a 405 naming both
    get = await served.http.get("/v1/models/tiny-test")
    head = await served.http.head("/v1/models/tiny-test")
    assert head.status_code == 200 and head.content == b""
    assert head.headers["content-length"] == get.headers["content-length"]
    wrong = await served.http.delete("/v1/models/tiny-test")
    assert wrong.status_code == 405 and wrong.headers["allow"] == "GET, HEAD"


@pytest.mark.anyio
async def test_legacy_completions(served: Served) -> None:
    completion = await served.oa.completions.create(
        model="tiny-test",
        prompt="Once upon a time",
        max_tokens=5,
        temperature=0.0,
        extra_body={"ignore_eos": True},
    )
    assert completion.object == "text_completion"
    assert completion.usage is not None and completion.usage.completion_tokens == 5
    text = completion.choices[0].text
    assert completion.choices[0].finish_reason == "length"
    echoed = await served.oa.completions.create(
        model="default",
        prompt="Once upon a time",
        max_tokens=5,
        temperature=0.0,
        echo=True,
        logprobs=2,
        extra_body={"ignore_eos": True},
    )
    choice = echoed.choices[0]
    assert choice.text == "Once upon a time" + text
    assert choice.logprobs is not None
    prompt_tokens = echoed.usage.prompt_tokens if echoed.usage else 0
    assert len(choice.logprobs.tokens or []) == prompt_tokens + 5  # the prompt's, then the reply's
    tops = choice.logprobs.top_logprobs or []
    tokens = choice.logprobs.tokens or []
    assert tops[0] is None  # the 2 most likely, and the token itself when it is not one
    pairs = zip(tokens[1:], tops[1:], strict=True)
    assert all(token in top and len(top) in (2, 3) for token, top in pairs)
    stream = await served.oa.completions.create(
        model="tiny-test",
        prompt="Once upon a time",
        max_tokens=5,
        temperature=0.0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    pieces: list[str] = []
    usage = None
    async for chunk in stream:
        pieces.extend(c.text for c in chunk.choices)
        usage = chunk.usage or usage
    assert "".join(pieces) == text and usage is not None and usage.completion_tokens == 5
    default = await served.oa.completions.create(
        model="tiny-test", prompt="x", extra_body={"ignore_eos": True}
    )
    assert default.usage is not None and default.usage.completion_tokens == 16  # OpenAI's default
    for bad, param in (
        ({"prompt": ["a", "b"], "stream": True}, "prompt"),  # several: not streamed
        ({"prompt": ["a", 5]}, "prompt"),
        ({"prompt": [[1, 2], []]}, "prompt"),
        ({"prompt": "a", "suffix": "z"}, "suffix"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": "a", "n": 2}, "n"),
        ({"prompt": "a", "logprobs": -1}, "logprobs"),
        ({"prompt": "a", "logprobs": 50}, "logprobs"),  # it named top_logprobs
        ({"prompt": "a", "max_tokens": -1}, "max_tokens"),
    ):
        response = await served.http.post("/v1/completions", json={"model": "tiny-test", **bad})
        assert response.status_code == 400, bad
        assert response.json()["error"]["param"] == param, bad
    # 0 is taken (with echo): the error said "greater than or equal to 1"
    for limit in (-1, -1.0):
        negative = {"model": "tiny-test", "prompt": "a", "max_tokens": limit}
        response = await served.http.post("/v1/completions", json=negative)
        assert "at least 0" in response.json()["error"]["message"], limit


@pytest.mark.anyio
async def test_several_prompts_are_a_choice_each_with_the_usage_summed(served: Served) -> None:
    """What lm-evaluation-harness sends with a batch size over 1 (a list of strings or of
    token-id lists): each prompt's reply is the choice of its index, as alone (it was a 400,
    "one prompt per request")."""
    ask = {"model": "tiny-test", "max_tokens": 4, "temperature": 0.0, "ignore_eos": True}
    for prompts in (["Once upon", "The capital of", "Hi"], [[40, 41, 42], [50, 51]]):
        alone = []
        for prompt in prompts:
            body = {**ask, "prompt": prompt, "echo": True, "logprobs": 1}
            response = await served.http.post("/v1/completions", json=body)
            alone.append(response.json())
        several = {**ask, "prompt": prompts, "echo": True, "logprobs": 1}
        response = await served.http.post("/v1/completions", json=several)
        assert response.status_code == 200, response.text
        got = response.json()
        assert [choice["index"] for choice in got["choices"]] == list(range(len(prompts)))
        for choice, single in zip(got["choices"], alone, strict=True):
            assert choice["text"] == single["choices"][0]["text"]
            assert choice["logprobs"]["tokens"] == single["choices"][0]["logprobs"]["tokens"]
        for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
            assert got["usage"][key] == sum(single["usage"][key] for single in alone), key
    # the openai SDK's form of a batch
    batch = await served.oa.completions.create(
        model="tiny-test", prompt=["a", "b"], max_tokens=2, extra_body={"ignore_eos": True}
    )
    assert [choice.index for choice in batch.choices] == [0, 1]
    assert batch.usage is not None and batch.usage.completion_tokens == 4


async def _scored(served: Served, prompt: list[int], **fields: Any) -> dict[str, Any]:
    body = {"model": "tiny-test", "prompt": prompt, "echo": True, "logprobs": 2, **fields}
    response = await served.http.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    return dict(response.json())


@pytest.mark.anyio
async def test_echo_with_logprobs_scores_the_prompt(served: Served) -> None:
    """What evaluation harnesses send to score a text (``echo``, ``logprobs``, ``max_tokens``
    0): every prompt token's logprob given the tokens before it, the same numbers the model
    gives those tokens when it generates them, whether or not the prompt is cached."""
    prompt = list(range(40, 75))
    body = {"model": "tiny-test", "prompt": prompt, "max_tokens": 6, "temperature": 0.0}
    body |= {"logprobs": 2, "ignore_eos": True}
    generated = (await served.http.post("/v1/completions", json=body)).json()["choices"][0]
    reply_logprobs = generated["logprobs"]["token_logprobs"]
    tokenizer = served.engine.tokenizer
    assert tokenizer is not None
    ids = tokenizer.encode(generated["text"])
    assert len(ids) == 6 and len(reply_logprobs) == 6
    text = prompt + ids
    for attempt in range(2):  # the second time every block of it is in the prefix cache
        scored = await _scored(served, text, max_tokens=0)
        choice, usage = scored["choices"][0], scored["usage"]
        assert usage["completion_tokens"] == 0 and usage["prompt_tokens"] == len(text)
        assert usage["prompt_tokens_details"]["cached_tokens"] == 0, attempt
        assert choice["finish_reason"] == "length"
        assert choice["text"] == tokenizer.decode(text, skip_special_tokens=False)
        logprobs = choice["logprobs"]
        assert len(logprobs["tokens"]) == len(text)
        assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
        assert all(lp <= 0 for lp in logprobs["token_logprobs"][1:])
        # the 2 most likely, and the token itself when it is not one of them
        for token, top in zip(logprobs["tokens"][1:], logprobs["top_logprobs"][1:], strict=True):
            assert token in top and len(top) in (2, 3)
        assert logprobs["text_offset"][0] == 0 and logprobs["text_offset"] == sorted(
            logprobs["text_offset"]
        )
        tail = logprobs["token_logprobs"][len(prompt) :]
        assert tail == pytest.approx(reply_logprobs, abs=2e-3)
    # logprobs 0: each entry the token alone (it was {}, and a sampled token outside the top
    # logprobs was missing: harnesses read top_logprobs[i][tokens[i]])
    for sampled in ({"logprobs": 0}, {"logprobs": 1, "temperature": 2.0, "seed": 1}):
        body = {"model": "tiny-test", "prompt": prompt, "max_tokens": 8, "ignore_eos": True}
        got = (await served.http.post("/v1/completions", json=body | sampled)).json()
        entry = got["choices"][0]["logprobs"]
        for token, lp, top in zip(
            entry["tokens"], entry["token_logprobs"], entry["top_logprobs"], strict=True
        ):
            assert token in top and 1 <= len(top) <= sampled["logprobs"] + 1
            assert sampled["logprobs"] or top == {token: lp}
    # with tokens to generate, the prompt's entries come first, then the reply's
    more = (await _scored(served, text, max_tokens=3, ignore_eos=True))["choices"][0]
    assert len(more["logprobs"]["tokens"]) == len(text) + 3
    assert more["logprobs"]["token_logprobs"][0] is None
    assert more["logprobs"]["token_logprobs"][1 : len(text)] == pytest.approx(
        logprobs["token_logprobs"][1:], abs=2e-3
    )
    # streamed: the prompt's entries in the first chunk, the same numbers
    streamed = {"model": "tiny-test", "prompt": text, "echo": True, "logprobs": 2}
    streamed |= {"max_tokens": 0, "stream": True}
    entries: list[float | None] = []
    async with served.http.stream("POST", "/v1/completions", json=streamed) as response:
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                for c in chunk["choices"]:
                    entries.extend((c["logprobs"] or {}).get("token_logprobs", []))
    assert entries[0] is None and entries[1:] == pytest.approx(
        logprobs["token_logprobs"][1:], abs=2e-3
    )
    # a window that fills the whole context (evaluation harnesses send such) is scored too
    window = [40 + i % 30 for i in range(served.engine.max_model_len)]
    whole = (await _scored(served, window, max_tokens=0))["choices"][0]
    assert len(whole["logprobs"]["tokens"]) == len(window)
    too_long = {"model": "tiny-test", "prompt": window + [40], "echo": True, "max_tokens": 0}
    refused = await served.http.post("/v1/completions", json=too_long)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "prompt"
    # echo and max_tokens 0 without logprobs: the prompt back, as vLLM answers (it was a 400)
    bare = {"model": "tiny-test", "prompt": text, "echo": True, "max_tokens": 0}
    echoed = (await served.http.post("/v1/completions", json=bare)).json()
    assert echoed["choices"][0]["text"] == choice["text"]
    assert echoed["choices"][0]["logprobs"] is None
    assert echoed["usage"]["completion_tokens"] == 0
    for bad in ({"echo": False}, {"logprobs": 2, "echo": False}):
        body = {"model": "tiny-test", "prompt": text, "max_tokens": 0, **bad}
        response = await served.http.post("/v1/completions", json=body)
        assert response.status_code == 400 and response.json()["error"]["param"] == "max_tokens"


@pytest.mark.anyio
async def test_text_offsets_count_characters_of_the_text(served: Served) -> None:
    """``text_offset`` is where each token starts in the returned text, in characters: a
    token inside a multi-byte character starts where the character does (the tokenizer's
    own offsets), and an end token that ``ignore_eos`` keeps adds nothing (it counted token
    texts: ``é`` split over two tokens moved it twice, an end token by its name)."""
    tokenizer = served.engine.tokenizer
    assert tokenizer is not None
    text = "héllo wörld, naïve café: 東京 ✓ ok"
    body = {"model": "tiny-test", "prompt": text, "echo": True, "logprobs": 1, "max_tokens": 0}
    choice = (await served.http.post("/v1/completions", json=body)).json()["choices"][0]
    assert choice["text"] == text
    encoding = tokenizer.backend.encode(text, add_special_tokens=False)
    starts = [start for start, _ in encoding.offsets]
    assert len(set(starts)) < len(starts)  # some characters span two tokens or more
    assert choice["logprobs"]["text_offset"] == starts
    # an echoed prompt keeps its special tokens' text, and the offsets count it; a reply
    # drops it, and a special token adds nothing there
    eos = min(served.engine.eos_token_ids)
    ids = tokenizer.encode("héllo") + [eos] + tokenizer.encode(" ok")
    body = {"model": "tiny-test", "prompt": ids, "echo": True, "logprobs": 1, "max_tokens": 0}
    choice = (await served.http.post("/v1/completions", json=body)).json()["choices"][0]
    eos_text = tokenizer.token_text(eos)
    assert choice["text"] == f"héllo{eos_text} ok"
    offsets = choice["logprobs"]["text_offset"]
    assert offsets[-len(tokenizer.encode(" ok")) - 1 :][:2] == [5, 5 + len(eos_text)]
    assert tokenizer.text_bytes(eos) == b""
    assert b"".join(tokenizer.text_bytes(i) for i in ids) == "héllo ok".encode()


@pytest.mark.anyio
async def test_every_request_gets_an_access_line(
    tiny: TinyModel, anyio_backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="local_engine.server.access"):
        async with serve(tiny.engine()) as running:
            await running.oa.chat.completions.create(
                model="tiny-test", messages=HI, max_tokens=3, extra_body={"ignore_eos": True}
            )
            stream = await running.oa.chat.completions.create(
                model="tiny-test",
                messages=HI,
                max_tokens=3,
                stream=True,
                extra_body={"ignore_eos": True},
            )
            async for _ in stream:
                pass
            await running.http.get("/nowhere")
        lines = [r.getMessage() for r in caplog.records if r.name == "local_engine.server.access"]
        assert len(lines) == 3
        assert '"POST /v1/chat/completions" 200 ' in lines[0]
        assert "completion_tokens=3" in lines[0] and "duration_ms=" in lines[0]
        assert "completion_tokens=3" in lines[1] and "ttft_ms=" in lines[1]
        assert '"GET /nowhere" 404' in lines[2]
        caplog.clear()
        async with serve(tiny.engine(), access_log=False) as quiet:
            await quiet.http.get("/health")
        assert not [r for r in caplog.records if r.name == "local_engine.server.access"]
    assert _parse("--no-access-log").access_log is False and _parse().access_log is True


@pytest.mark.anyio
async def test_a_request_answered_500_is_logged_as_500_not_499(
    tiny: TinyModel,
    anyio_backend: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An error that escaped the handler was answered 500 by the app, but the access line
    (and the span) said 499, the client-went-away status."""
    from local_engine.service import ChatService

    def broken(self: Any, request: Any) -> Any:
        raise RuntimeError("a bug in the server")

    monkeypatch.setattr(ChatService, "prepare", broken)
    with caplog.at_level(logging.INFO, logger="local_engine.server.access"):
        async with serve(tiny.engine()) as running:
            body = {"model": "tiny-test", "messages": HI, "max_tokens": 2}
            response = await running.http.post("/v1/chat/completions", json=body)
            assert response.status_code == 500
    lines = [r.getMessage() for r in caplog.records if r.name == "local_engine.server.access"]
    assert any('"POST /v1/chat/completions" 500 ' in line for line in lines), lines


class _AccessLines(logging.Handler):
    """The access lines, from the server's thread; ``wait`` blocks for the next one."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []
        self._arrived = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())
        self._arrived.set()

    def wait(self) -> str:
        assert self._arrived.wait(LIMIT), "no access line"
        self._arrived.clear()
        return self.lines[-1]


def _has_text(event: dict[str, Any]) -> bool:
    """Whether a streamed chat, legacy completion or Responses event carries text."""
    if event.get("type") == "response.output_text.delta":
        return bool(event["delta"])
    choices = event.get("choices") or [{}]
    return bool(choices[0].get("text") or choices[0].get("delta", {}).get("content"))


@pytest.mark.anyio
async def test_a_stream_cut_short_still_reports_its_tokens(served: Served) -> None:
    long = {"model": "tiny-test", "stream": True, "max_tokens": 1000, "ignore_eos": True}
    bodies = {
        "/v1/chat/completions": {**long, "messages": HI},
        "/v1/completions": {**long, "prompt": "Once upon a time"},
        "/v1/responses": {**long, "input": "Hi there", "max_output_tokens": 1000},
    }
    lines = _AccessLines()
    logger = logging.getLogger("local_engine.server.access")
    logger.addHandler(lines)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        for path, body in bodies.items():
            if path == "/v1/responses":
                del body["max_tokens"]
            texts = 0
            async with served.http.stream("POST", path, json=body) as response:
                assert response.status_code == 200
                async for line in response.aiter_lines():
                    texts += line.startswith("data: {") and _has_text(json.loads(line[6:]))
                    if texts == 3:
                        break  # and disconnect
            line = await anyio.to_thread.run_sync(lines.wait)
            assert f'"POST {path}" 200 ' in line
            tokens = dict(part.split("=") for part in line.split() if "=" in part)
            assert int(tokens["prompt_tokens"]) > 0, line
            assert 3 <= int(tokens["completion_tokens"]) < 1000, line  # each text a token or more
            await served.settle()
    finally:
        logger.removeHandler(lines)
        logger.setLevel(level)


def test_serve_takes_the_model_as_m_like_chat_and_bench(tiny: TinyModel) -> None:
    server = _build(_parse("-m", str(tiny.path)))
    assert repr(server.backend) == f"LocalBackend(name='local', model={str(tiny.path)!r})"
    same = _build(_parse(str(tiny.path), "--model", str(tiny.path)))
    assert "model=" in repr(same.backend)
    with pytest.raises(Exception, match="two models"):
        _build(_parse("a", "-m", "b"))


@pytest.mark.anyio
async def test_local_backend_takes_the_serve_options(tiny: TinyModel) -> None:
    backend = LocalBackend(tiny.path, dtype="bfloat16", device="cpu", quantization="int8")
    await backend.warmup()
    config = backend.engine.config
    assert config.dtype == "bfloat16" and config.quantization == "int8"
    assert config.device == "cpu"
    with pytest.raises(Exception, match="dtype"):
        LocalBackend(tiny.path, dtype="")


# ---------------------------------------------------------------------- 7: no tools, no markup

WEATHER: Any = [{"role": "user", "content": "What's the weather in Paris?"}]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def test_tool_markup_is_never_content_when_no_tools_were_offered() -> None:
    from local_engine.chat import CompletionStream, build_completion

    stray = '{"city": "Paris"}}\n</tool_call>'  # a closer with no opener: streamed, it leaked
    cases = [
        (CALL, ""),
        ("Sunny. " + CALL, "Sunny. "),
        ("<tool_call>{oops", ""),
        (stray, '{"city": "Paris"}}\n'),
        ("a </tool_call> b </tool_", "a  b </tool_"),
    ]
    for text, shown in cases:
        completion = build_completion(
            text,
            model="m",
            finish_reason="stop",
            prompt_tokens=1,
            completion_tokens=1,
            markup_format="hermes",
        )
        message = completion.choices[0].message
        assert (message.content or "") == shown and not message.tool_calls
        assert completion.choices[0].finish_reason == "stop"
        stream = CompletionStream(model="m", markup_format="hermes")
        pieces = [stream.push(text[i : i + 3]) for i in range(0, len(text), 3)]
        pieces += stream.finish("stop", prompt_tokens=1, completion_tokens=1)
        deltas = [c.choices[0].delta for c in pieces if c is not None and c.choices]
        assert "".join(d.content or "" for d in deltas) == shown
        assert not any(d.tool_calls for d in deltas)
    # offered tools still come back as tool calls
    offered = build_completion(
        CALL,
        model="m",
        finish_reason="stop",
        prompt_tokens=1,
        completion_tokens=1,
        tool_format="hermes",
    )
    assert offered.choices[0].message.tool_calls


@pytest.mark.anyio
async def test_the_embedded_model_writes_no_tool_call_without_tools() -> None:
    """Issue 27.7: with no tools offered, 'What's the weather in Paris?' got a raw
    <tool_call> block as its text."""
    async with LocalBackend() as backend:
        service = backend.running_service()[1]
        ask = ChatRequest(model="default", messages=WEATHER, temperature=0.0, max_tokens=40)
        prepared = service.prepare(ask)
        marker = service.tokenizer.token_to_id("<tool_call>")
        assert marker is not None and prepared.params.banned_token_ids == (marker,)
        completion = await backend.complete(ask, _deadline())
        message = completion.choices[0].message
        assert "tool_call" not in (message.content or "") and not message.tool_calls
        with_tools = ask.model_copy(update={"tools": _weather_tool()})
        assert service.prepare(with_tools).params.banned_token_ids == ()
        called = await backend.complete(with_tools, _deadline())
        assert called.choices[0].message.tool_calls  # the model does call it when offered


@pytest.mark.anyio
async def test_logprobs_cover_the_content_not_the_end_token() -> None:
    """The end-of-text token that ended a reply had an entry (``<|im_end|>``) though its text
    is not in the content, plain and streamed."""
    hello: Any = [{"role": "user", "content": "Hello!"}]
    params: dict[str, Any] = {"temperature": 0.0, "max_tokens": 60, "logprobs": True}
    async with AsyncClient(backend=LocalBackend()) as client:
        completion = await client.chat(hello, model="default", **params)
        choice = completion.choices[0]
        assert choice.finish_reason == "stop" and choice.logprobs is not None
        tokens = [entry["token"] for entry in choice.logprobs["content"]]
        assert "".join(tokens) == choice.message.content
        async with client.stream(hello, model="default", **params) as stream:
            streamed = [
                entry["token"]
                async for chunk in stream
                if chunk.choices and chunk.choices[0].logprobs
                for entry in chunk.choices[0].logprobs["content"]
            ]
    assert streamed == tokens


def test_shown_logprobs_leave_out_exactly_the_token_that_ended_the_reply(
    tiny: TinyModel,
) -> None:
    """A stop token id ends a reply under ``ignore_eos`` too, and its entry went out then;
    a stop string's tokens, a grammar's last token and an unfinished step keep theirs."""
    from local_engine.engine import RequestOutput
    from local_engine.sampling_params import TokenLogprob

    service = ChatService(tiny.engine())
    eos = next(iter(service.engine.eos_token_ids))

    def out(last: int, *, finished: bool = True, stop: str | None = None) -> RequestOutput:
        items = [TokenLogprob(5, -0.1, []), TokenLogprob(last, -0.2, [])]
        return RequestOutput(
            "r",
            [5, last],
            "x",
            finished,
            "stop" if finished else None,
            1,
            0,
            2,
            logprobs=items,
            stop_string=stop,
        )

    def kept(output: RequestOutput, **params: Any) -> list[int]:
        shown = service.shown_logprobs(output, SamplingParams(logprobs=True, **params))
        return [item.token_id for item in shown]

    assert kept(out(eos)) == [5]
    assert kept(out(7), stop_token_ids=[7]) == [5]
    assert kept(out(7), stop_token_ids=[7], ignore_eos=True) == [5]
    assert kept(out(eos), ignore_eos=True) == [5, eos]  # EOS is text then, not an end
    assert kept(out(7)) == [5, 7]  # a grammar that completed: its last token is content
    assert kept(out(7, stop="x"), stop_token_ids=[7]) == [5, 7]
    assert kept(out(eos, finished=False)) == [5, eos]


def _weather_tool() -> Any:
    from swiftclient.types import Tool

    return [
        Tool.model_validate(
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "description": "Current weather for a city",
                    "parameters": {
                        "type": "object",
                        "properties": {"city": {"type": "string"}},
                        "required": ["city"],
                    },
                },
            }
        )
    ]


# ---------------------------------------------------------------------- 6: strict schemas


def test_a_schema_that_leaves_additional_properties_unset_is_closed() -> None:
    from local_engine.grammar import closed_objects

    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "object", "properties": {"b": {"type": "integer"}}},
            "m": {"type": "object", "additionalProperties": {"type": "integer"}},
            "any": {"type": "object"},
        },
        "$defs": {"D": {"type": "object", "properties": {"x": {"type": "string"}}}},
        "allOf": [
            {"properties": {"p": {"type": "string"}}},
            {"properties": {"q": {"type": "string"}}},
        ],
    }
    closed = closed_objects(schema)
    # The allOf members add keys ("p", "q") the top does not list: closing the top would
    # refuse every value that has them, so it stays open (it was closed before).
    assert "additionalProperties" not in closed
    alone = {key: value for key, value in schema.items() if key != "allOf"}
    assert closed_objects(alone)["additionalProperties"] is False
    assert closed["properties"]["a"]["additionalProperties"] is False
    assert closed["properties"]["m"]["additionalProperties"] == {"type": "integer"}
    assert "additionalProperties" not in closed["properties"]["any"]  # any object stays any
    assert closed["$defs"]["D"]["additionalProperties"] is False
    assert all("additionalProperties" not in member for member in closed["allOf"])
    assert "additionalProperties" not in schema  # the argument is left alone


@pytest.mark.anyio
async def test_a_loose_schema_gets_no_invented_keys(served: Served) -> None:
    """Issue 27.6: a random-weight model under a schema without additionalProperties
    invented keys until max_tokens."""
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 8}},
        "required": ["city"],
    }
    response_format: Any = {
        "type": "json_schema",
        "json_schema": {"name": "place", "schema": schema},
    }
    for seed in range(3):
        completion = await served.oa.chat.completions.create(
            model="tiny-test",
            messages=HI,
            max_tokens=60,
            seed=seed,
            response_format=response_format,
        )
        reply = json.loads(completion.choices[0].message.content or "")
        assert list(reply) == ["city"]
        assert completion.choices[0].finish_reason == "stop"


# ---------------------------------------------------------------------- 3: n > 1


@pytest.mark.anyio
async def test_n_choices_in_one_completion_count_the_prompt_once(served: Served) -> None:
    single = await served.oa.chat.completions.create(
        model="tiny-test", messages=HI, max_tokens=5, extra_body={"ignore_eos": True}
    )
    several = await served.oa.chat.completions.create(
        model="tiny-test", messages=HI, max_tokens=5, n=3, seed=7, extra_body={"ignore_eos": True}
    )
    assert [c.index for c in several.choices] == [0, 1, 2]
    assert all(c.finish_reason == "length" for c in several.choices)
    assert single.usage is not None and several.usage is not None
    assert several.usage.prompt_tokens == single.usage.prompt_tokens
    assert several.usage.completion_tokens == 15
    # seeded choices differ from each other, and repeat
    texts = [c.message.content for c in several.choices]
    again = await served.oa.chat.completions.create(
        model="tiny-test", messages=HI, max_tokens=5, n=3, seed=7, extra_body={"ignore_eos": True}
    )
    assert [c.message.content for c in again.choices] == texts
    assert len(set(texts)) > 1
    await served.settle()


@pytest.mark.anyio
async def test_n_choices_stream_with_their_index(served: Served) -> None:
    stream = await served.oa.chat.completions.create(
        model="tiny-test",
        messages=HI,
        max_tokens=4,
        n=2,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    texts = ["", ""]
    finished: list[int] = []
    usage = None
    async for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            if choice.finish_reason is not None:
                finished.append(choice.index)
        usage = chunk.usage or usage
    assert sorted(finished) == [0, 1]
    assert usage is not None and usage.completion_tokens == 8
    await served.settle()


async def _four_choices(engine: Any, max_tokens: int) -> tuple[int, dict[int, Any]]:
    """Run an n=4 request for a long prompt through the chat service's fan-out; return the
    prompt's length and each choice's final output."""
    from local_engine.service import _fan_out

    async with LocalBackend.from_engine(engine) as backend:
        source, service = backend.running_service()
        long: Any = [{"role": "user", "content": "tell me a story about a fox " * 12}]
        ask = ChatRequest(
            model="m", messages=long, max_tokens=max_tokens, n=4, extra_body={"ignore_eos": True}
        )
        prepared = service.prepare(ask)
        finals: dict[int, Any] = {}
        async with _fan_out(source, prepared, 4) as outputs:
            async for index, out in outputs:
                if out.finished:
                    finals[index] = out
                    if len(finals) == 4:
                        break
    return len(prepared.prompt.token_ids), finals


@pytest.mark.anyio
async def test_the_choices_share_the_prompt_blocks(tiny: TinyModel) -> None:
    engine = tiny.engine()
    prompt, finals = await _four_choices(engine, 3)
    block = engine.config.block_size
    full_blocks = prompt // block * block
    assert full_blocks >= 4 * block
    assert finals[0].num_cached_tokens == 0
    # every full block of the prompt (all but the last, when it is full) is shared
    assert all(finals[i].num_cached_tokens >= full_blocks - block for i in (1, 2, 3))


@pytest.mark.anyio
async def test_the_choices_compute_the_prompt_once_and_decode_as_one_batch(
    tiny: TinyModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """n=4: one step computes the prompt; the next has all four choices (three computing only
    the prompt's last partial block), and they decode together to the end: no step runs
    choice 0 alone while the others wait to be added."""
    from local_engine.scheduler import SchedulerOutput

    engine = tiny.engine()
    steps: list[list[int]] = []  # tokens computed per sequence, per step
    schedule = engine.scheduler.schedule

    def recording() -> SchedulerOutput:
        out = schedule()
        if out.scheduled:
            steps.append(sorted(s.num_new_tokens for s in out.scheduled))
        return out

    monkeypatch.setattr(engine.scheduler, "schedule", recording)
    prompt, _ = await _four_choices(engine, 5)
    block = engine.config.block_size
    tail = prompt - (prompt - 1) // block * block
    assert steps[0] == [prompt]
    assert steps[1] == sorted([1, tail, tail, tail])
    assert steps[2:] == [[1, 1, 1, 1]] * 3 + [[1, 1, 1]]
