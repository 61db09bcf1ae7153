"""Grammar-constrained decoding: JSON mode, JSON schemas and forced tool calls.

The models have RANDOM weights (the embedded tiny default model, and a still smaller one
with its tokenizer for the many-schema test), so whatever parses here parses because of the
grammar, not the model.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

import anyio
import jsonschema
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict

from local_engine.async_engine import AsyncEngine
from local_engine.engine import Engine, EngineConfig
from local_engine.errors import InvalidRequestError
from local_engine.grammar import (
    Grammar,
    GrammarError,
    json_object_grammar,
    json_schema_grammar,
    request_grammar,
    tool_call_grammar,
)
from local_engine.loader import load_model
from local_engine.sampler import Sampler, SamplingParams
from local_engine.sequence import Sequence
from local_engine.service import ChatService
from local_engine.spec import SpeculativeConfig
from local_engine.structured import TokenMask
from swiftclient.types import ChatRequest, Tool

from ..conformance.tiny_local import TinyModel, load_tiny_model
from .stepping import step_rounds
from .tiny import make_tiny_model


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread() -> Iterator[None]:
    """These tests check output, not speed: one torch thread keeps their many small steps
    from waiting on a busy machine's scheduler for a second OpenMP thread at every op."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> TinyModel:
    return load_tiny_model(tmp_path_factory.mktemp("grammar-cache"))


@pytest.fixture(scope="module")
def engine(tiny: TinyModel) -> Engine:
    """One engine for the module (tests leave it idle); its compiled grammars are cached."""
    return tiny.engine(num_blocks=512)


@pytest.fixture(scope="module")
def micro(tiny: TinyModel, tmp_path_factory: pytest.TempPathFactory) -> Engine:
    """A 2-layer, 64-wide random model with the default model's tokenizer: cheap steps."""
    path = tmp_path_factory.mktemp("micro")
    vocab = tiny.model.config.vocab_size
    model = load_model(make_tiny_model(path, "qwen3", vocab_size=vocab, eos_token_id=None))
    return Engine(model, EngineConfig(num_blocks=1024, seed=0), tiny.tokenizer)


def _prompt(tiny: TinyModel, text: str = "Answer in JSON.") -> list[int]:
    return tiny.tokenizer.encode(text)


# ---------------------------------------------------------------------- random schemas
#
# Every schema bounds the length of its values (strings, arrays, integers, enums), so its
# longest JSON text is known; a token carries at least one byte, so a reply decoded under
# the grammar is complete within that many tokens plus the end token, whatever the model.

_KEYS = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_ÄЖ中", min_size=1, max_size=6)
_JSON_SCALARS = st.one_of(
    st.integers(-1000, 1000),
    st.text(max_size=5),
    st.booleans(),
    st.none(),
    st.sampled_from([0.5, -2.25, 1e3]),
)


@st.composite
def _integer(draw: st.DrawFn) -> dict[str, Any]:
    low = draw(st.integers(-10_000, 10_000))
    return {"type": "integer", "minimum": low, "maximum": low + draw(st.integers(0, 500))}


@st.composite
def _string(draw: st.DrawFn) -> dict[str, Any]:
    high = draw(st.integers(0, 6))
    return {"type": "string", "minLength": draw(st.integers(0, high)), "maxLength": high}


_LEAVES = st.one_of(
    st.just({"type": "boolean"}),
    st.just({"type": "null"}),
    _integer(),
    _string(),
    st.lists(_JSON_SCALARS, min_size=1, max_size=4, unique_by=json.dumps).map(
        lambda values: {"enum": values}
    ),
    _JSON_SCALARS.map(lambda value: {"const": value}),
)


@st.composite
def _object(draw: st.DrawFn, children: st.SearchStrategy[dict[str, Any]]) -> dict[str, Any]:
    props = draw(st.dictionaries(_KEYS, children, max_size=3))
    required = [k for k in props if draw(st.booleans())]
    return {
        "type": "object",
        "properties": props,
        "required": required,
        "additionalProperties": False,
    }


@st.composite
def _array(draw: st.DrawFn, children: st.SearchStrategy[dict[str, Any]]) -> dict[str, Any]:
    high = draw(st.integers(0, 3))
    return {
        "type": "array",
        "items": draw(children),
        "minItems": draw(st.integers(0, high)),
        "maxItems": high,
    }


_TREES = st.recursive(
    _LEAVES,
    lambda children: st.one_of(
        _object(children),
        _array(children),
        st.lists(children, min_size=2, max_size=3).map(lambda options: {"anyOf": options}),
    ),
    max_leaves=6,
)


def max_bytes(schema: dict[str, Any]) -> int:
    """An upper bound on the UTF-8 length of any compact JSON text valid under ``schema``."""
    if "const" in schema:
        return len(json.dumps(schema["const"]).encode()) * 2
    if "enum" in schema:
        return max(len(json.dumps(v).encode()) * 2 for v in schema["enum"])
    if "anyOf" in schema:
        return max(max_bytes(s) for s in schema["anyOf"])
    kind = schema["type"]
    if kind in ("boolean", "null"):
        return 5
    if kind == "integer":
        return max(len(str(schema["minimum"])), len(str(schema["maximum"])))
    if kind == "string":
        return 2 + 12 * schema["maxLength"]  # at worst an escaped surrogate pair per char
    if kind == "array":
        return 2 + schema["maxItems"] * (max_bytes(schema["items"]) + 2)
    return 2 + sum(
        len(json.dumps(key).encode()) * 2 + 4 + max_bytes(sub)
        for key, sub in schema["properties"].items()
    )


MAX_REPLY_BYTES = 160
SCHEMAS = _TREES.filter(lambda schema: max_bytes(schema) <= MAX_REPLY_BYTES)
"""Schemas whose replies need at most ``MAX_REPLY_BYTES`` tokens (keeps the test short)."""
BATCH = 20


@settings(
    max_examples=10,  # x BATCH schemas per batch = 200 schemas
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(schemas=st.lists(SCHEMAS, min_size=BATCH, max_size=BATCH), seed=st.integers(0, 2**16))
def test_random_schemas_every_reply_parses_and_validates(
    micro: Engine, tiny: TinyModel, schemas: list[dict[str, Any]], seed: int
) -> None:
    engine = micro
    prompt = _prompt(tiny)
    params = [
        SamplingParams(
            max_tokens=max_bytes(schema) + 1,
            temperature=0.0 if i % 4 == 0 else 1.0,
            seed=seed + i,
            grammar=json_schema_grammar(schema),
        )
        for i, schema in enumerate(schemas)
    ]
    plain = SamplingParams(max_tokens=8, temperature=1.0, seed=seed, ignore_eos=True)
    results = engine.generate([prompt] * (len(schemas) + 1), [*params, plain])
    for schema, result in zip(schemas, results, strict=False):
        assert result.finish_reason == "stop", (schema, result.text)
        jsonschema.validate(json.loads(result.text), schema)
    assert len(results[-1].token_ids) == 8  # the unconstrained request shared the batch
    assert engine.structured is not None and engine.structured.num_active == 0


# ---------------------------------------------------------------------- one engine step


def test_greedy_fast_path_applies_the_mask() -> None:
    """An all-greedy batch takes the sampler's argmax shortcut; the mask still applies."""
    logits = torch.zeros(2, 70)
    logits[:, 3] = 10.0  # the unconstrained favourite
    bitmask = torch.zeros(1, 3, dtype=torch.int32)
    bitmask[0, 1] = 1 << (40 - 32)  # only token 40 allowed in row 0
    done: Future[None] = Future()
    done.set_result(None)
    seqs = [Sequence(f"r{i}", [1], SamplingParams(temperature=0.0)) for i in range(2)]
    out = Sampler(seed=0).sample(logits, seqs, allowed=TokenMask([0], bitmask, done))
    assert out.token_ids == [40, 3]


def test_constrained_and_plain_requests_share_a_batch(engine: Engine, tiny: TinyModel) -> None:
    """The plain request's greedy tokens are the same as when it runs alone."""
    prompt = _prompt(tiny, "Tell me something.")
    plain = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    alone = engine.generate([prompt], plain)[0].token_ids
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    strict = SamplingParams(max_tokens=20, temperature=0.0, grammar=json_schema_grammar(schema))
    mixed = engine.generate([prompt, prompt, prompt], [strict, plain, strict])
    assert mixed[1].token_ids == alone
    for result in (mixed[0], mixed[2]):
        if result.finish_reason == "stop":
            jsonschema.validate(json.loads(result.text), schema)
        else:  # an integer may go on for ever; what there is must be its beginning
            assert result.text.startswith('{"n": ')


@pytest.mark.parametrize("overlapped", [False, True])
def test_constrained_requests_in_the_overlapped_order(
    micro: Engine, tiny: TinyModel, overlapped: bool
) -> None:
    """The grammar advances before the next step is scheduled, so running step n+1 before
    step n's outputs are made gives the same replies (and stop strings still cut)."""
    prompt = _prompt(tiny, "Tell me something.")
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    strict = SamplingParams(max_tokens=16, temperature=0.0, grammar=json_schema_grammar(schema))
    cut = SamplingParams(max_tokens=16, temperature=0.0, grammar=json_object_grammar(), stop=(":",))
    plain = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    params = [strict, cut, plain, strict]
    results = micro.generate([prompt] * 4, params)
    ids = [micro.add_request(prompt, p) for p in params]
    got: dict[str, tuple[list[int], str, str | None]] = {rid: ([], "", None) for rid in ids}
    for outputs in step_rounds(micro, overlapped=overlapped):
        for out in outputs:
            tokens, text, _ = got[out.request_id]
            got[out.request_id] = (
                tokens + out.new_token_ids,
                text + out.new_text,
                out.finish_reason,
            )
    want = [(r.token_ids, r.text, r.finish_reason) for r in results]
    assert [got[rid] for rid in ids] == want
    assert ":" not in want[1][1] and want[1][2] == "stop"  # the stop string ended it
    assert micro.num_free_blocks() == micro.num_blocks
    assert micro.structured is not None and micro.structured.num_active == 0


def test_json_object_mode_gives_an_object(engine: Engine, tiny: TinyModel) -> None:
    params = SamplingParams(max_tokens=30, temperature=0.0, grammar=json_object_grammar())
    result = engine.generate([_prompt(tiny)], params)[0]
    assert result.text.startswith("{")
    # A reply cut by max_tokens is the beginning of an object; a complete one parses.
    if result.finish_reason == "stop":
        assert isinstance(json.loads(result.text), dict)
    else:
        assert result.finish_reason == "length" and len(result.token_ids) == 30


# ---------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "schema",
    [{"type": "strin"}, {"$ref": "#/$defs/missing"}, {"type": "object", "minProperties": "x"}],
)
def test_a_schema_that_cannot_compile_is_a_typed_error(
    engine: Engine, tiny: TinyModel, schema: dict[str, Any]
) -> None:
    with pytest.raises(GrammarError, match="cannot be compiled"):
        grammar = json_schema_grammar(schema)
        engine.add_request(_prompt(tiny), SamplingParams(grammar=grammar))
    assert not engine.has_unfinished()
    assert engine.structured is not None and engine.structured.num_active == 0


def test_a_grammar_without_a_tokenizer_is_refused(tiny: TinyModel) -> None:
    engine = Engine(tiny.model, tiny.engine().config, tokenizer=None)
    with pytest.raises(ValueError, match="needs an engine with a tokenizer"):
        engine.add_request([1, 2], SamplingParams(grammar=json_object_grammar()))


def test_sampling_params_check_the_grammar_type() -> None:
    with pytest.raises(ValueError, match="grammar must be a Grammar"):
        SamplingParams(grammar='{"type": "object"}')  # type: ignore[arg-type]


def test_chat_service_refuses_an_uncompilable_schema(tiny: TinyModel) -> None:
    service = ChatService(tiny.engine())
    request = ChatRequest.model_validate(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "strin"}},
            },
        }
    )
    with pytest.raises(GrammarError, match="response_format JSON schema cannot be compiled"):
        service.prepare(request)


# ---------------------------------------------------------------------- cancellation


@pytest.mark.anyio
async def test_cancelling_a_constrained_stream_frees_its_grammar_state(tiny: TinyModel) -> None:
    engine = tiny.engine()
    schema = {"type": "array", "items": {"type": "integer"}, "minItems": 1000}
    params = SamplingParams(max_tokens=500, grammar=json_schema_grammar(schema))
    structured = engine.structured
    assert structured is not None
    async with AsyncEngine(engine) as runner:
        async with runner.stream(_prompt(tiny), params) as outputs:
            async for _ in outputs:
                assert structured.num_active == 1
                break
        with anyio.fail_after(30):
            await runner.wait_idle()
    assert structured.num_active == 0
    assert engine.num_free_blocks() == engine.num_blocks


def test_abort_frees_the_grammar_state(engine: Engine, tiny: TinyModel) -> None:
    structured = engine.structured
    assert structured is not None
    rid = engine.add_request(_prompt(tiny), SamplingParams(grammar=json_object_grammar()))
    engine.step()
    assert structured.num_active == 1
    engine.abort(rid)
    assert structured.num_active == 0


# ---------------------------------------------------------------------- tool calls

WEATHER = Tool.model_validate(
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 8},
                    "unit": {"enum": ["c", "f"]},
                },
                "required": ["city", "unit"],
                "additionalProperties": False,
            },
        },
    }
)
CONVERT = Tool.model_validate(
    {
        "type": "function",
        "function": {
            "name": "convert",
            "parameters": {
                "type": "object",
                "properties": {"value": {"$ref": "#/$defs/Amount"}},
                "required": ["value"],
                "additionalProperties": False,
                "$defs": {"Amount": {"type": "integer", "minimum": 0, "maximum": 999}},
            },
        },
    }
)


def _chat(tool_choice: Any, **fields: Any) -> ChatRequest:
    return ChatRequest.model_validate(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "Weather in Paris?"}],
            "tools": [WEATHER.model_dump(), CONVERT.model_dump(by_alias=True)],
            "tool_choice": tool_choice,
            "max_tokens": 200,  # more than the bytes of the longest call the grammar allows
            **fields,
        }
    )


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("tool_choice", "names"),
    [
        ("required", {"get_weather", "convert"}),
        ({"type": "function", "function": {"name": "convert"}}, {"convert"}),
    ],
)
async def test_forced_tool_calls_always_parse(
    tiny: TinyModel, tool_choice: Any, names: set[str]
) -> None:
    service = ChatService(tiny.engine())
    tools = {"get_weather": WEATHER, "convert": CONVERT}
    async with AsyncEngine(service.engine) as runner:
        for seed in range(4):
            request = _chat(tool_choice, seed=seed, parallel_tool_calls=False)
            completion = await service.complete(runner, request)
            choice = completion.choices[0]
            assert choice.finish_reason == "tool_calls", choice.message
            calls = choice.message.tool_calls or []
            assert len(calls) == 1 and choice.message.content is None
            call = calls[0]
            assert call.function.name in names
            schema = tools[call.function.name].function.parameters
            jsonschema.validate(json.loads(call.function.arguments), schema or {})


def test_tool_call_grammar_uses_the_tokenizers_marker_tokens(tiny: TinyModel) -> None:
    added = tiny.tokenizer.added_tokens
    grammar = tool_call_grammar([WEATHER], tool_format="hermes", added_tokens=added)
    assert f"<[{added['<tool_call>']}]>" in grammar.text
    spelled = tool_call_grammar([WEATHER], tool_format="hermes")
    assert "<[" not in spelled.text and "\\u003ctool_call\\u003e" not in spelled.text


def test_tool_definitions_that_clash_are_a_grammar_error() -> None:
    other = CONVERT.model_copy(deep=True)
    assert other.function.parameters is not None
    other.function.parameters["$defs"] = {"Amount": {"type": "string"}}
    other.function.name = "convert2"
    with pytest.raises(GrammarError, match="differently") as raised:
        tool_call_grammar([CONVERT, other], tool_format="hermes")
    assert raised.value.param == "tools"


def test_which_requests_get_a_grammar(tiny: TinyModel) -> None:
    plain = ChatRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    )
    assert request_grammar(plain, "hermes") is None
    auto = _chat("auto")
    # tool_choice="auto" is lazy, triggered by the tokenizer's own <tool_call> token...
    added = tiny.tokenizer.added_tokens
    for request in (auto, _chat(None)):
        lazy = request_grammar(request, "hermes", added_tokens=added)
        assert lazy is not None and lazy.kind == "tool_call_auto"
        assert lazy.trigger == added["<tool_call>"]
        assert f"<[{lazy.trigger}]>" in lazy.text
    # ... and stays free where it cannot be: no such token, another format, no tools, "none".
    assert request_grammar(auto, "hermes") is None
    assert request_grammar(auto, "llama3", added_tokens=added) is None
    assert request_grammar(plain, "hermes", added_tokens=added) is None
    assert request_grammar(_chat("none"), "hermes", added_tokens=added) is None
    assert request_grammar(_chat("required"), "none") is None  # no format to force
    forced = request_grammar(_chat("required", response_format={"type": "json_object"}), "hermes")
    assert isinstance(forced, Grammar) and forced.kind == "tool_call"
    json_mode = request_grammar(_chat("auto", response_format={"type": "json_object"}), "hermes")
    assert json_mode is not None and json_mode.kind == "json_object"


def test_tool_call_arguments_take_no_keys_the_tool_does_not_list(tiny: TinyModel) -> None:
    """Tool parameter objects are closed, as response_format's are: a call cannot invent an
    argument the tool would refuse."""
    added = tiny.tokenizer.added_tokens
    open_schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    tool = Tool.model_validate(
        {"type": "function", "function": {"name": "get_weather", "parameters": open_schema}}
    )
    grammar = tool_call_grammar([tool], tool_format="hermes", added_tokens=added)
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"%s}}\n</tool_call>'
    assert _follows(tiny, grammar, call % "")
    assert not _follows(tiny, grammar, call % ', "country": "NO"')


def _follows(tiny: TinyModel, grammar: Grammar, text: str) -> bool:
    """Whether ``text`` (as the tokenizer encodes it) is a complete reply under ``grammar``."""
    structured = tiny.engine().structured
    assert structured is not None
    matcher = structured.compile(grammar).deep_copy()
    ids = tiny.tokenizer.encode(text)
    return all(matcher.consume_token(t) for t in ids) and matcher.is_accepting()


_OSLO = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "c"}}\n</tool_call>'
)


def test_a_newline_after_a_call_is_no_promise_of_another(tiny: TinyModel) -> None:
    """After a call, a newline may end the reply (forced) or start a remark ("auto"), so a
    model that writes "\n\n" after its call is not pushed into a call it did not mean."""
    added = tiny.tokenizer.added_tokens
    forced = tool_call_grammar([WEATHER], tool_format="hermes", added_tokens=added)
    assert _follows(tiny, forced, _OSLO) and _follows(tiny, forced, _OSLO + "\n")
    assert _follows(tiny, forced, _OSLO + "\n" + _OSLO)
    assert not _follows(tiny, forced, _OSLO + "\n\nDone.")
    auto = request_grammar(_chat("auto"), "hermes", added_tokens=added)
    assert auto is not None
    for after in ("", "\n", "\n\nI asked for the weather in Oslo.", "\n" + _OSLO + " ok"):
        assert _follows(tiny, auto, _OSLO + after), after
    single = request_grammar(_chat("auto", parallel_tool_calls=False), "hermes", added_tokens=added)
    assert single is not None
    assert _follows(tiny, single, _OSLO + "\n\nDone.")
    assert not _follows(tiny, single, _OSLO + "\n" + _OSLO)


def test_a_tool_schema_whose_branches_add_properties_stays_satisfiable(tiny: TinyModel) -> None:
    """An object with properties of its own and ``anyOf`` branches that add more is left
    open (closing it would refuse the branches' keys), and its branches too."""
    schema = {
        "type": "object",
        "properties": {"kind": {"type": "string", "maxLength": 4}},
        "required": ["kind"],
        "anyOf": [
            {"properties": {"x": {"type": "integer"}}, "required": ["x"]},
            {"properties": {"y": {"type": "integer"}}, "required": ["y"]},
        ],
    }
    tool = Tool.model_validate(
        {"type": "function", "function": {"name": "pick", "parameters": schema}}
    )
    added = tiny.tokenizer.added_tokens
    grammar = tool_call_grammar([tool], tool_format="hermes", added_tokens=added)
    call = '<tool_call>\n{"name": "pick", "arguments": {"kind": "a", "x": 1}}\n</tool_call>'
    assert _follows(tiny, grammar, call)


def test_a_required_key_the_properties_do_not_list_leaves_the_object_open(
    tiny: TinyModel,
) -> None:
    """Closing an object whose ``required`` names a key it does not list would leave no valid
    value (a forced call that worked became a 400): such an object stays open."""
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city", "day"],
    }
    tool = Tool.model_validate(
        {"type": "function", "function": {"name": "get_weather", "parameters": schema}}
    )
    added = tiny.tokenizer.added_tokens
    grammar = tool_call_grammar([tool], tool_format="hermes", added_tokens=added)
    args = '{"city": "Oslo", "day": "Monday"}'
    call = f'<tool_call>\n{{"name": "get_weather", "arguments": {args}}}\n</tool_call>'
    assert _follows(tiny, grammar, call)


def test_auto_keeps_a_tool_whose_schema_cannot_compile_by_name(
    tiny: TinyModel, caplog: pytest.LogCaptureFixture
) -> None:
    """One tool whose schema the grammar compiler refuses does not lift "auto"'s grammar from
    the others: it keeps its name, with any object for its arguments, and a warning says so."""
    structured = tiny.engine().structured
    assert structured is not None
    request = _chat("auto")
    assert request.tools is not None
    request.tools[1].function.parameters = {
        "type": "object",
        "properties": {"x": {"type": "strin"}},
    }
    added = tiny.tokenizer.added_tokens
    with caplog.at_level("WARNING", logger="local_engine.grammar"):
        grammar = request_grammar(request, "hermes", added_tokens=added, check=structured.compile)
    assert grammar is not None and grammar.kind == "tool_call_auto"
    assert "'convert'" in caplog.text
    loose = '<tool_call>\n{"name": "convert", "arguments": {"anything": [1, "x"]}}\n</tool_call>'
    assert _follows(tiny, grammar, loose)
    assert _follows(tiny, grammar, _OSLO)
    assert not _follows(tiny, grammar, _OSLO.replace('"c"', '"kelvin"'))
    assert not _follows(tiny, grammar, loose.replace("convert", "get_time"))


@pytest.mark.parametrize(
    ("tools", "match"),
    [
        ([{"name": " ", "parameters": {"type": "object"}}], r"tools\[0\]\.function\.name must not"),
        ([{"name": "f"}, {"name": "f"}], r"tools\[1\] repeats the name 'f'"),
        ([{"name": "f", "parameters": {"type": "string"}}], "must be an object schema"),
        # the added token made the "auto" grammar unusable: a call named a tool never offered
        ([{"name": "get<tool_call>"}], r"holds '<tool_call>', one of this model's special"),
        ([{"name": "a<|im_end|>"}], r"holds '<\|im_end\|>'"),
        ([{"name": "get weather"}], "holds whitespace or a control character"),
        ([{"name": "f\x00"}], "holds whitespace or a control character"),
    ],
    ids=[
        "empty-name",
        "repeated-name",
        "non-object-parameters",
        "markup-in-name",
        "special-token-in-name",
        "space-in-name",
        "control-in-name",
    ],
)
def test_tools_a_model_cannot_be_asked_to_call_are_a_400(
    tiny: TinyModel, tools: list[dict[str, Any]], match: str
) -> None:
    """As OpenAI answers: such a tool would be a call the parser drops, or a grammar that
    runs to max_tokens."""
    service = ChatService(tiny.engine())
    request = ChatRequest.model_validate(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"type": "function", "function": fn} for fn in tools],
        }
    )
    with pytest.raises(InvalidRequestError, match=match) as raised:
        service.prepare(request)
    assert raised.value.param == "tools"


def test_extra_body_tool_grammar_false_turns_the_auto_grammar_off(tiny: TinyModel) -> None:
    """A caller whose model writes calls the grammar would bend can turn "auto"'s grammar
    off per request; a forced call keeps its grammar."""
    service = ChatService(tiny.engine())
    assert service.prepare(_chat("auto")).params.grammar is not None
    off = service.prepare(_chat("auto", extra_body={"tool_grammar": False}))
    assert off.params.grammar is None
    forced = service.prepare(_chat("required", extra_body={"tool_grammar": False}))
    assert forced.params.grammar is not None and forced.params.grammar.kind == "tool_call"
    with pytest.raises(InvalidRequestError, match="must be a boolean"):
        service.prepare(_chat("auto", extra_body={"tool_grammar": "no"}))


def _lazy_grammar(trigger: int, schema: dict[str, Any]) -> Grammar:
    """A lazy grammar: after its ``trigger`` token, a newline and a JSON value of ``schema``."""
    import llguidance

    body = json.dumps(schema)
    text = llguidance.LLMatcher.grammar_from_lark(f'start: <[{trigger}]> "\\n" %json {body}')
    return Grammar(str(text), "tool_call_auto", trigger)


_SMALL_INT = {"type": "integer", "minimum": 0, "maximum": 999}


def _first_new_token(tokens: list[int], start: int) -> int:
    """The position of the first token at or after ``start`` that does not occur before it."""
    return next(k for k in range(start, len(tokens)) if tokens[k] not in tokens[:k])


@pytest.mark.parametrize("speculative", [False, True], ids=["plain", "draft=target"])
def test_a_lazy_grammar_leaves_the_reply_free_until_its_trigger(
    tiny: TinyModel, micro: Engine, speculative: bool
) -> None:
    """tool_choice="auto"'s grammar: the reply is the model's own until the trigger token,
    and follows the grammar after it, with or without speculative decoding (whose drafts stop
    before the trigger)."""
    prompt = _prompt(tiny, "Tell me something.")
    free = micro.generate(
        [prompt], SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    )[0]
    k = _first_new_token(free.token_ids, 3)
    trigger = free.token_ids[k]
    engine = micro
    if speculative:
        config = EngineConfig(
            num_blocks=1024,
            seed=0,
            speculative=SpeculativeConfig(method="draft", draft_model="the same model"),
        )
        engine = Engine(micro.model, config, tiny.tokenizer, draft_model=micro.model)
    params = SamplingParams(
        max_tokens=40, temperature=0.0, grammar=_lazy_grammar(trigger, _SMALL_INT)
    )
    result = engine.generate([prompt], params)[0]
    assert result.token_ids[: k + 1] == free.token_ids[: k + 1]
    rest = tiny.tokenizer.decode(result.token_ids[k + 1 :])
    assert rest.startswith("\n") and 0 <= json.loads(rest) <= 999, rest
    assert result.finish_reason == "stop"
    if speculative:
        stats = engine.spec_stats
        assert stats is not None and stats.num_draft_tokens > 0
    assert engine.structured is not None and engine.structured.num_active == 0


def test_a_lazy_grammar_that_never_triggers_constrains_nothing(
    tiny: TinyModel, micro: Engine
) -> None:
    prompt = _prompt(tiny, "Tell me something.")
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, min_tokens=12)
    free = micro.generate([prompt], params)[0]
    unused = next(t for t in range(3, 1000) if t not in free.token_ids)
    lazy = replace(params, grammar=_lazy_grammar(unused, _SMALL_INT))
    assert micro.generate([prompt], lazy)[0].token_ids == free.token_ids
    assert micro.structured is not None and micro.structured.num_active == 0


@pytest.mark.anyio
async def test_auto_tool_choice_with_a_schema_the_compiler_refuses_still_answers(
    tiny: TinyModel,
) -> None:
    service = ChatService(tiny.engine())
    request = _chat("auto", max_tokens=8)
    assert request.tools is not None
    request.tools[0].function.parameters = {
        "type": "object",
        "properties": {"x": {"type": "strin"}},
    }
    async with AsyncEngine(service.engine) as runner:
        completion = await service.complete(runner, request)
    assert completion.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_llama3_tool_calls_parse(engine: Engine, tiny: TinyModel) -> None:
    from local_engine.tool_calls import parse_tool_calls

    grammar = tool_call_grammar([WEATHER], tool_format="llama3", parallel=False)
    params = SamplingParams(max_tokens=200, temperature=1.0, seed=1, grammar=grammar)
    text = engine.generate([_prompt(tiny)], params)[0].text
    parsed = parse_tool_calls(text, "llama3")
    assert [c.function.name for c in parsed.tool_calls] == ["get_weather"]


def test_compile_is_cached_by_grammar_text(engine: Engine, tmp_path: Path) -> None:
    structured = engine.structured
    assert structured is not None
    first = structured.compile(json_schema_grammar({"type": "boolean"}))
    assert structured.compile(json_schema_grammar({"type": "boolean"})) is first


# ---------------------------------------------------------------------- the server


def _json_schema_body(schema: Any) -> dict[str, Any]:
    return {
        "model": "tiny-test",
        "messages": [{"role": "user", "content": "Is it raining?"}],
        "max_tokens": 30,
        "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}},
    }


@pytest.mark.anyio
async def test_server_answers_an_uncompilable_schema_with_400(tiny: TinyModel) -> None:
    from .test_server import serve

    ok = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    }  # at most 13 bytes, so 30 tokens always finish it
    async with serve(tiny.engine()) as served:
        bad = await served.http.post("/v1/chat/completions", json=_json_schema_body({"type": 7}))
        assert bad.status_code == 400
        error = bad.json()["error"]
        assert error["type"] == "invalid_request_error"
        assert "response_format JSON schema cannot be compiled" in error["message"]
        good = await served.http.post("/v1/chat/completions", json=_json_schema_body(ok))
        assert good.status_code == 200
        content = good.json()["choices"][0]["message"]["content"]
        jsonschema.validate(json.loads(content), ok)
        await served.settle()


_EXPLAINED_SCHEMAS = {
    '{"type": "object", "propertyNames": {"pattern": "^a"}}': (
        "it uses a JSON schema keyword the local engine does not support (propertyNames)"
    ),
    '{"if": {"type": "string"}, "then": {"minLength": 3}}': (
        "it uses JSON schema keywords the local engine does not support (if, then)"
    ),
    '{"type": "string", "format": "shoe-size"}': (
        "it uses a string format the local engine does not support ('shoe-size')"
    ),
    '{"type": "string", "pattern": "(?<=a)b"}': (
        "a pattern is not a regular expression the local engine supports (look-around"
    ),
    '{"type": "object", "properties": {"a": {"$ref": "#/$defs/gone"}}}': (
        "a $ref points at '#/$defs/gone', which the schema does not define"
    ),
    '{"type": "strin"}': "'strin' is not a JSON schema type",
    '{"oneOf": [{"type": "string"}, {"type": "string", "maxLength": 3}]}': (
        "it uses oneOf with branches a value could match more than one of"
    ),
}


@pytest.mark.anyio
async def test_an_uncompilable_schema_is_explained_in_the_libraries_words(
    tiny: TinyModel,
) -> None:
    """The 400 says what is wrong with the schema (the keyword kept), with none of
    llguidance's own wording or its grammar listing, and names the field in ``param``."""
    from .test_server import serve

    async with serve(tiny.engine()) as served:
        for schema, reason in _EXPLAINED_SCHEMAS.items():
            body = _json_schema_body(json.loads(schema))
            bad = await served.http.post("/v1/chat/completions", json=body)
            assert bad.status_code == 400, schema
            error = bad.json()["error"]
            assert error["message"].startswith(
                f"the response_format JSON schema cannot be compiled: {reason}"
            ), error
            assert error["param"] == "response_format"
            for internal in ("Unimplemented", "Unknown format", "regex parse", "Pointer", "\n"):
                assert internal not in error["message"], error
        tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "strin"}}}
        body = {**_json_schema_body({}), "tools": [tool], "tool_choice": "required"}
        del body["response_format"]
        bad = await served.http.post("/v1/chat/completions", json=body)
        error = bad.json()["error"]
        assert bad.status_code == 400 and error["param"] == "tools"
        assert error["message"] == (
            "the tools' parameter schema cannot be compiled: 'strin' is not a JSON schema type"
        )  # not the tool-call grammar's listing (its token ids, %json, x-guidance)


def _mask_workers() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("swift-grammar-masks")}


def test_close_stops_the_worker_and_a_later_step_starts_another(tiny: TinyModel) -> None:
    engine = tiny.engine()
    structured = engine.structured
    assert structured is not None
    params = SamplingParams(max_tokens=4, temperature=0.0, grammar=json_object_grammar())
    engine.add_request(_prompt(tiny), params)
    before = _mask_workers()
    first = engine.step()[0].new_text
    started = _mask_workers() - before
    assert len(started) == 1  # this engine's worker (other engines keep theirs)
    structured.close()
    assert not started & _mask_workers()
    assert structured.num_active == 1
    rest = [out.new_text for _ in range(3) for out in engine.step()]
    assert not engine.has_unfinished()
    assert (first + "".join(rest)).startswith("{")


# ---------------------------------------------------------------------- through the client


class Verdict(BaseModel):
    """A reply shape whose JSON is at most a few dozen bytes."""

    model_config = ConfigDict(extra="forbid")
    ok: bool
    level: Literal["low", "high"]


@pytest.mark.anyio
async def test_client_response_model_on_the_local_engine_always_validates(
    tiny: TinyModel,
) -> None:
    from local_engine import LocalBackend
    from swiftclient import AsyncClient
    from swiftclient.errors import BadRequestError

    async with AsyncClient(LocalBackend.from_engine(tiny.engine()), model="tiny") as client:
        for seed, stream in ((1, True), (2, False), (3, True)):
            verdict = await client.chat(
                "Rate it.", response_model=Verdict, seed=seed, max_tokens=60, stream=stream
            )
            assert isinstance(verdict, Verdict)
        bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}
        with pytest.raises(BadRequestError, match="cannot be compiled"):
            await client.chat("Rate it.", response_format=bad)


# ---------------------------------------------------------------------- grammar limits
#
# llguidance never raises for a grammar it cannot follow: a matcher that hits one of its
# limits enters an error state and from then on allows only the end token. Such a reply
# once came back as '{"' or 'null' with finish_reason "stop".

_NODE = {"type": "object", "properties": {"child": {"$ref": "#/$defs/node"}}, "required": ["child"]}
_TOO_LONG = {"type": "string", "pattern": "^a{1000000}$"}
_FAILS_AT_ONCE = {
    "recursive required $ref": {"$ref": "#/$defs/node", "$defs": {"node": _NODE}},
    "pattern a{1000000}": _TOO_LONG,
}
# The same limits behind a free choice (true or false): the grammar builds and its forced
# start is fine, and it fails whatever the model picks, a few tokens into the reply.
_FAILS_MID_REPLY = {
    "recursive required $ref": {
        "type": "object",
        "properties": {"k": {"type": "boolean"}, "r": {"$ref": "#/$defs/node"}},
        "required": ["k", "r"],
        "$defs": {"node": _NODE},
    },
    "pattern a{1000000}": {
        "type": "object",
        "properties": {"k": {"type": "boolean"}, "r": _TOO_LONG},
        "required": ["k", "r"],
    },
}


@pytest.mark.parametrize("schema", _FAILS_AT_ONCE.values(), ids=_FAILS_AT_ONCE.keys())
def test_a_grammar_that_fails_on_its_forced_start_is_refused_before_decoding(
    engine: Engine, tiny: TinyModel, schema: dict[str, Any]
) -> None:
    grammar = json_schema_grammar(schema)
    with pytest.raises(GrammarError, match=r"cannot be compiled: it is too large for the local"):
        engine.add_request(_prompt(tiny), SamplingParams(grammar=grammar))
    assert not engine.has_unfinished()
    assert engine.structured is not None and engine.structured.num_active == 0


@pytest.mark.parametrize("schema", _FAILS_MID_REPLY.values(), ids=_FAILS_MID_REPLY.keys())
def test_a_grammar_that_fails_mid_reply_ends_with_an_error_not_a_stop(
    micro: Engine, tiny: TinyModel, schema: dict[str, Any]
) -> None:
    grammar = json_schema_grammar(schema)
    params = [SamplingParams(max_tokens=40, seed=seed, grammar=grammar) for seed in range(3)]
    results = micro.generate([_prompt(tiny)] * 3, params)
    for result in results:
        assert result.finish_reason == "error", result.text
        assert result.error is not None and re.search(r"(lexer|parser) error", result.error)
        assert "<state>" not in result.error  # the reason, without llguidance's state dump
        assert result.text.startswith('{"k": ')
    assert micro.structured is not None and micro.structured.num_active == 0


def _late_failure_request(stream: bool = False) -> dict[str, Any]:
    body = _json_schema_body(_FAILS_MID_REPLY["recursive required $ref"])
    return {**body, "stream": stream, "seed": 1}


@pytest.mark.anyio
async def test_chat_service_raises_a_typed_error_for_a_grammar_that_fails_mid_reply(
    tiny: TinyModel,
) -> None:
    from local_engine.errors import GrammarFailedError

    engine = tiny.engine()
    service = ChatService(engine)
    request = ChatRequest.model_validate(_late_failure_request())
    async with AsyncEngine(engine) as running:
        with pytest.raises(GrammarFailedError, match="failed while decoding.*parser error"):
            await service.complete(running, request)
        texts: list[str] = []
        with pytest.raises(GrammarFailedError, match="failed while decoding"):
            async with service.stream(running, request) as chunks:
                async for chunk in chunks:
                    assert chunk.choices[0].finish_reason is None  # never a finished reply
                    texts.append(chunk.choices[0].delta.content or "")
        assert "".join(texts).startswith('{"k": ')


@pytest.mark.anyio
async def test_server_refuses_or_fails_a_grammar_it_cannot_follow(tiny: TinyModel) -> None:
    from .test_server import serve

    async with serve(tiny.engine()) as served:
        for name, schema in _FAILS_AT_ONCE.items():
            bad = await served.http.post("/v1/chat/completions", json=_json_schema_body(schema))
            assert bad.status_code == 400, name
            assert "cannot be compiled" in bad.json()["error"]["message"]
        late = await served.http.post("/v1/chat/completions", json=_late_failure_request())
        # the request's schema met a limit of the grammar library: the request's fault, as
        # when it fails at once (it was a 500)
        assert late.status_code == 400
        error = late.json()["error"]
        assert error["code"] == "grammar_failed"
        assert "failed while decoding" in error["message"]
        streamed = await served.http.post(
            "/v1/chat/completions", json=_late_failure_request(stream=True)
        )
        events = [line for line in streamed.text.splitlines() if line.startswith("data: ")]
        assert streamed.status_code == 200  # the stream had begun: the error is its last event
        assert '"grammar_failed"' in events[-1] and "[DONE]" not in streamed.text
        assert all('"finish_reason":"stop"' not in e.replace(" ", "") for e in events)
        await served.settle()


@pytest.mark.anyio
async def test_client_on_the_local_engine_sees_a_typed_error_not_broken_json(
    tiny: TinyModel,
) -> None:
    from local_engine import LocalBackend
    from swiftclient import AsyncClient
    from swiftclient.errors import BadRequestError, EngineError

    schema = _FAILS_MID_REPLY["pattern a{1000000}"]
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    at_once = {"type": "json_schema", "json_schema": {"name": "x", "schema": _TOO_LONG}}
    async with AsyncClient(LocalBackend.from_engine(tiny.engine()), model="tiny") as client:
        for stream in (False, True):
            with pytest.raises(EngineError, match="failed while decoding"):
                await client.chat("Rate it.", response_format=fmt, max_tokens=30, stream=stream)
            with pytest.raises(BadRequestError, match="cannot be compiled"):
                await client.chat("Rate it.", response_format=at_once, stream=stream)
