"""Canonical request bytes: tools sorted, schemas in one key order, set-like arrays sorted,
meaning kept, identical bytes whatever order the caller's dicts were built in; and the
prompt prefix (segments and static fingerprint) built from them."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swiftclient._canonical import (
    PromptPrefix,
    _encode,
    _encode_general,
    _plain_body,
    cache_key,
    canonical_schema,
    encode,
    prompt_prefix,
)
from swiftclient.types import ChatRequest

_DATA_KEYS = {"enum", "const", "default", "examples"}
_NAMES = st.text(alphabet="abcdefghij_", min_size=1, max_size=6)


def _tool(name: str, parameters: dict[str, Any] | None = None) -> dict[str, Any]:
    function: dict[str, Any] = {"name": name, "description": f"the {name} tool"}
    if parameters is not None:
        function["parameters"] = parameters
    return {"type": "function", "function": function}


def _request(**fields: Any) -> ChatRequest:
    return ChatRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    )


# --------------------------------------------------------------------------- examples


def test_tools_are_sorted_by_name_and_schema_keys_ordered() -> None:
    params = {
        "required": ["b", "a"],
        "properties": {"b": {"type": "string"}, "a": {"description": "x", "type": "integer"}},
        "type": "object",
    }
    body = json.loads(encode(_request(tools=[_tool("zeta", params), _tool("alpha")]), stream=False))
    assert [t["function"]["name"] for t in body["tools"]] == ["alpha", "zeta"]
    schema = body["tools"][1]["function"]["parameters"]
    assert list(schema) == ["type", "properties", "required"]
    assert schema["required"] == ["a", "b"]
    assert list(schema["properties"]) == ["b", "a"]  # generation order: kept
    assert list(schema["properties"]["a"]) == ["type", "description"]


def test_enum_prefix_items_and_any_of_keep_their_order() -> None:
    schema = {
        "enum": ["z", "a", "m"],
        "prefixItems": [{"type": "string"}, {"type": "integer"}],
        "anyOf": [{"type": "null"}, {"type": "array"}],
        "type": ["string", "array", "null"],
        "$defs": {"b": {"type": "string"}, "a": {"type": "integer"}},
    }
    out = canonical_schema(schema)
    assert out["enum"] == ["z", "a", "m"]
    assert out["prefixItems"] == [{"type": "string"}, {"type": "integer"}]
    assert out["anyOf"] == [{"type": "null"}, {"type": "array"}]
    assert out["type"] == ["array", "null", "string"]
    assert list(out["$defs"]) == ["a", "b"]
    assert list(out) == ["type", "enum", "prefixItems", "anyOf", "$defs"]
    assert schema["type"] == ["string", "array", "null"]  # the argument is left alone


def test_response_format_schema_and_extra_body_are_canonical() -> None:
    fmt = {
        "type": "json_schema",
        "json_schema": {"name": "X", "schema": {"required": ["y", "x"], "type": "object"}},
    }
    a = _request(response_format=fmt, extra_body={"top_k": 5, "min_p": 0.1})
    body = json.loads(encode(a, stream=False))
    assert list(body["response_format"]["json_schema"]["schema"]) == ["type", "required"]
    assert body["response_format"]["json_schema"]["schema"]["required"] == ["x", "y"]
    raw = encode(a, stream=False)
    assert raw.index(b'"min_p"') < raw.index(b'"top_k"')


def test_exact_keeps_the_callers_orders() -> None:
    params = {"type": "object", "required": ["b", "a"]}
    request = _request(tools=[_tool("zeta", params), _tool("alpha")], extra_body={"z": 1, "a": 2})
    body = json.loads(encode(request, stream=False, exact=True))
    assert [t["function"]["name"] for t in body["tools"]] == ["zeta", "alpha"]
    assert body["tools"][0]["function"]["parameters"]["required"] == ["b", "a"]
    assert list(body)[-2:] == ["z", "a"]


def test_a_plain_request_encodes_as_its_plain_dump() -> None:
    request = _request(temperature=0.5, metadata={"b": "1"})
    assert encode(request, stream=True) == encode(request, stream=True, exact=True)


def test_prompt_prefix_segments_and_fingerprint() -> None:
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "hi"},
    ]
    tools = [_tool("b", {"type": "object", "required": ["q", "p"]}), _tool("a")]
    one = prompt_prefix(_request(messages=messages, tools=tools))
    assert isinstance(one, PromptPrefix)
    assert one.static == 1 and len(one.segments) == 3
    assert (
        json.loads(one.segments[0])
        == json.loads(encode(_request(messages=messages, tools=tools), stream=False))["tools"]
    )
    assert json.loads(one.segments[2]) == {"role": "user", "content": "hi"}
    # the tools in another order, another model and sampling: the same fingerprint
    other = prompt_prefix(
        _request(messages=messages, tools=tools[::-1], model="other", temperature=1.0)
    )
    assert other.fingerprint == one.fingerprint and other.segments == one.segments
    # a different turn keeps the static fingerprint; a different system prompt changes it
    turn = prompt_prefix(_request(messages=[messages[0], {"role": "user", "content": "yo"}]))
    no_tools = prompt_prefix(_request(messages=messages))
    assert turn.fingerprint == no_tools.fingerprint != one.fingerprint
    assert turn.segments[0] == b""
    changed = prompt_prefix(_request(messages=[{"role": "system", "content": "Be long."}]))
    assert changed.fingerprint != no_tools.fingerprint
    assert len(one.fingerprint) == 32 and int(one.fingerprint, 16) >= 0


def test_segments_are_the_bytes_the_body_sends() -> None:
    content = [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "u"}}]
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": content, "name": "ann"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c", "content": "1"},
    ]
    tools = [_tool("b", {"type": "object"}), _tool("a")]
    request = _request(messages=messages, tools=tools, extra_body={"top_k": 2})
    raw = encode(request, stream=True)
    prefix = prompt_prefix(request)
    assert b'"messages":[' + b",".join(prefix.segments[1:]) + b"]" in raw
    assert b'"tools":' + prefix.segments[0] in raw


def test_fingerprint_is_the_same_in_another_process() -> None:
    import subprocess
    import sys

    code = (
        "from swiftclient._canonical import prompt_prefix;"
        "from swiftclient.types import ChatRequest;"
        "print(prompt_prefix(ChatRequest.model_validate({'model': 'm', 'messages': ["
        "{'role': 'system', 'content': 's'}, {'role': 'user', 'content': 'u'}]})).fingerprint)"
    )
    here = prompt_prefix(
        _request(messages=[{"role": "system", "content": "s"}, {"role": "user", "content": "u"}])
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "123", "PATH": ""},
    )
    assert out.stdout.strip() == here.fingerprint


# --------------------------------------------------------------------------- properties


def _schemas() -> st.SearchStrategy[dict[str, Any]]:
    kinds = st.sampled_from(["string", "integer", "number", "boolean"])
    type_lists = st.lists(
        st.sampled_from(["string", "null", "integer"]), min_size=1, max_size=3, unique=True
    )
    leaf = st.fixed_dictionaries(
        {"type": kinds | type_lists},
        optional={
            "description": st.text(max_size=8),
            "enum": st.lists(st.text(alphabet="xyz", max_size=3), min_size=1, max_size=4),
            "default": st.dictionaries(_NAMES, st.integers(), max_size=3),
        },
    )

    def extend(children: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
        obj = st.dictionaries(_NAMES, children, min_size=1, max_size=4).flatmap(
            lambda props: st.fixed_dictionaries(
                {"type": st.just("object"), "properties": st.just(props)},
                optional={
                    "required": st.lists(
                        st.sampled_from(sorted(props)), unique=True, max_size=len(props)
                    ),
                    "additionalProperties": st.booleans(),
                    "$defs": st.dictionaries(_NAMES, children, max_size=2),
                    "x-extension": st.integers(),
                },
            )
        )
        arr = st.fixed_dictionaries(
            {"type": st.just("array"), "items": children},
            optional={"prefixItems": st.lists(children, max_size=2), "minItems": st.integers(0)},
        )
        union = st.fixed_dictionaries({"anyOf": st.lists(children, min_size=1, max_size=3)})
        return obj | arr | union

    return st.recursive(leaf, extend, max_leaves=8)


def _requests() -> st.SearchStrategy[dict[str, Any]]:
    tools = st.lists(
        st.tuples(_NAMES, st.none() | _schemas()), max_size=4, unique_by=lambda t: t[0]
    ).map(lambda pairs: [_tool(name, params) for name, params in pairs])
    fmt = _schemas().map(
        lambda schema: {"type": "json_schema", "json_schema": {"name": "R", "schema": schema}}
    )
    return st.fixed_dictionaries(
        {
            "model": st.just("m"),
            "messages": st.just(
                [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
            ),
        },
        optional={
            "tools": tools,
            "response_format": fmt,
            "extra_body": st.dictionaries(_NAMES, st.integers(), max_size=4),
            "metadata": st.dictionaries(_NAMES, st.text(max_size=3), max_size=3),
        },
    )


def _shuffled(value: Any, rng: random.Random, *, data: bool = False, names: bool = False) -> Any:
    """``value`` rebuilt with every reorderable dict's keys (and ``required``) shuffled;
    ``properties`` names and data values keep their order."""
    if isinstance(value, list):
        return [_shuffled(item, rng, data=data) for item in value]
    if not isinstance(value, dict) or data:
        return value
    keys = list(value)
    if not names:
        rng.shuffle(keys)
    out = {}
    for key in keys:
        item = value[key]
        if key == "required" and isinstance(item, list):
            item = rng.sample(item, len(item))
        elif key == "properties":
            item = {name: _shuffled(sub, rng) for name, sub in item.items()}
        else:
            item = _shuffled(item, rng, data=key in _DATA_KEYS)
        out[key] = item
    return out


def _norm(value: Any, key: str | None = None) -> Any:
    """``value`` with its set-like arrays (``required``, a list ``type``) sorted."""
    if isinstance(value, dict):
        return {k: _norm(v, k) for k, v in value.items()}
    if isinstance(value, list):
        items = [_norm(v) for v in value]
        return sorted(items) if key in {"required", "type"} else items
    return value


def _meaning(body: dict[str, Any]) -> Any:
    """What a body means, up to the documented reorderings (tools by name, set-like arrays
    sorted); dict equality ignores key order, so the rest compares as is."""
    out = _norm(body)
    if "tools" in out:
        out["tools"] = sorted(out["tools"], key=lambda t: t["function"]["name"])
    return out


def _orders(value: Any, path: str = "") -> list[tuple[str, Any]]:
    """Every order that carries meaning: properties names, enum, prefixItems, anyOf."""
    found: list[tuple[str, Any]] = []
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "properties" and isinstance(item, dict):
                found.append((path + "/properties", list(item)))
            if key in {"enum", "prefixItems", "anyOf"}:
                found.append((f"{path}/{key}", json.dumps(_norm(item), sort_keys=True)))
            found.extend(_orders(item, f"{path}/{key}"))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found.extend(_orders(item, f"{path}/{index}"))
    return sorted(found)


@settings(max_examples=40, deadline=None)
@given(_requests())
def test_canonicalization_keeps_the_meaning(fields: dict[str, Any]) -> None:
    request = ChatRequest.model_validate(fields)
    canonical = json.loads(encode(request, stream=False))
    exact = json.loads(encode(request, stream=False, exact=True))
    assert _meaning(canonical) == _meaning(exact)
    by_name = {t["function"]["name"]: t for t in exact.get("tools", [])}
    for tool in canonical.get("tools", []):
        assert _orders(tool) == _orders(by_name[tool["function"]["name"]])
    assert _orders(canonical.get("response_format")) == _orders(exact.get("response_format"))


@settings(max_examples=40, deadline=None)
@given(_requests(), st.randoms(use_true_random=False))
def test_identical_bytes_across_dict_orderings(fields: dict[str, Any], rng: random.Random) -> None:
    shuffled = dict(fields)
    if "tools" in shuffled:
        shuffled["tools"] = rng.sample(shuffled["tools"], len(shuffled["tools"]))
    shuffled = _shuffled(shuffled, rng, names=True)
    for key in ("tools", "response_format", "extra_body", "metadata"):
        if key in shuffled:
            shuffled[key] = _shuffled(shuffled[key], rng)
    a, b = ChatRequest.model_validate(fields), ChatRequest.model_validate(shuffled)
    assert encode(a, stream=True) == encode(b, stream=True)
    pa, pb = prompt_prefix(a), prompt_prefix(b)
    assert pa == pb


def test_the_tools_memo_stays_bounded() -> None:
    from swiftclient import _canonical

    for index in range(_canonical._CACHE_SIZE + 50):
        encode(_request(tools=[_tool(f"t{index}", {"type": "object"})]), stream=False)
    assert len(_canonical._tools_memo._items) == _canonical._CACHE_SIZE


# --------------------------------------------------------------------------- one-pass bodies

_PLAIN_MESSAGES: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "hi"}],
    [
        {"role": "system", "content": "You are terse.", "name": "sys"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
        {"role": "user", "content": "é ✓ \u2028", "cache_control": {"type": "ephemeral"}},
    ],
]
_PLAIN_FIELDS: list[dict[str, Any]] = [
    {},
    {"temperature": 0.7, "max_tokens": 64, "stop": ["\n", "END"], "seed": 3},
    {"prompt_cache_key": "mine", "user": "u1", "top_p": 0.5, "n": 2, "logprobs": True},
    {"reasoning_effort": "low", "service_tier": "auto", "parallel_tool_calls": False},
]


@pytest.mark.parametrize("messages", _PLAIN_MESSAGES)
@pytest.mark.parametrize("fields", _PLAIN_FIELDS)
def test_one_pass_body_is_the_general_paths_bytes(
    messages: list[dict[str, Any]], fields: dict[str, Any]
) -> None:
    """A request with nothing to reorder is serialized in one pass; its bytes are exactly
    the general path's for every stream / usage / exact / cache-key variant."""
    request = ChatRequest.model_validate({"model": "m", "messages": messages, **fields})
    assert _plain_body(request)
    prefix = prompt_prefix(request)
    for stream in (False, True):
        for usage in (False, True):
            for exact in (False, True):
                for with_key in (False, True):
                    key = cache_key(prefix) if with_key else None
                    fast = _encode(request, stream, usage, exact, prefix if with_key else None)
                    general = _encode_general(request, stream, usage, exact, key)
                    assert fast == general
                    assert json.loads(fast)["stream"] is stream


def test_requests_with_something_to_reorder_take_the_general_path() -> None:
    for fields in (
        {"tools": [_tool("b"), _tool("a")]},
        {"extra_body": {"z": 1, "a": 2}},
        {"metadata": {"b": "1", "a": "2"}},
        {"stream": True},
        {"stream_options": {"include_usage": False}},
        {"response_format": {"type": "json_object"}},
    ):
        assert not _plain_body(_request(**fields))


def test_a_usage_flag_that_is_not_a_bool_reads_as_its_truth_value() -> None:
    request = _request()
    for usage in (None, 0, 1):
        assert _encode(request, True, usage, False, None) == _encode_general(  # type: ignore[arg-type]
            request,
            True,
            usage,
            False,
            None,  # type: ignore[arg-type]
        )
