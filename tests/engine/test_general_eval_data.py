"""The separate evaluation set of the embedded model (scripts/general_eval_data.py).

The set measures whether swift-tiny generalizes past its training generators
(scripts/default_model_data.py), so it must stay independent of them: it never imports the
generator, and no string of 20 characters or more (a template, a tool-result shape, a
sentence) is shared with it, in either direction. Its judges are checked too: each accepts
the expected reply and refuses a near miss.
"""

from __future__ import annotations

import ast
import importlib
import json
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from local_engine.builtin_tools import run_tool

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
EVAL_FILES = ("general_eval_data.py", "eval_general.py")
TRAINING = SCRIPTS / "default_model_data.py"
MIN_SHARED = 20  # characters: shorter strings ("weather {city}", unit names) may coincide
# Strings both sides must hold because a format requires them, not because a template was
# shared; each with the reason. Nothing a user would write belongs here.
ALLOWED_SHARED = {
    # The JSON Schema keyword: the generator puts it in schemas as pydantic-ai sends them
    # (``"additionalProperties": false``), the set reads it to judge schema validity.
    "additionalproperties": "JSON Schema keyword that frameworks send and validity depends on",
}


@pytest.fixture(scope="module")
def data() -> ModuleType:
    """scripts/general_eval_data.py, imported as eval_general imports it."""
    sys.path.insert(0, str(SCRIPTS))
    try:
        return importlib.import_module("general_eval_data")
    finally:
        sys.path.remove(str(SCRIPTS))


@pytest.fixture(scope="module")
def cases(data: ModuleType) -> list[dict[str, Any]]:
    """The whole set, built once."""
    return list(data.build())


# --------------------------------------------------------------------------- independence


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring nodes of a module, its classes and functions."""
    found = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
        ):
            found.add(id(body[0].value))
    return found


def literals(source: str) -> set[str]:
    """The string literals of a module (docstrings aside) of at least MIN_SHARED characters,
    normalized: casefolded, blanks collapsed, each f-string or format placeholder as ``{}``."""
    tree = ast.parse(source)
    skip = _docstrings(tree)
    inside_fstrings = {
        id(part)
        for node in ast.walk(tree)
        if isinstance(node, ast.JoinedStr)
        for part in node.values
    }
    texts = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            texts.append(
                "".join(
                    part.value if isinstance(part, ast.Constant) else "{}" for part in node.values
                )
            )
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in skip | inside_fstrings
        ):
            texts.append(node.value)
    normalized = (re.sub(r"\s+", " ", re.sub(r"\{[^{}]*\}", "{}", t)).casefold() for t in texts)
    return {t for t in normalized if len(t) >= MIN_SHARED}


def shared(ours: set[str], theirs: set[str]) -> set[str]:
    """Our strings equal to, inside, or holding one of theirs."""
    return {a for a in ours for b in theirs if a in b or b in a}


def imports_training(source: str) -> list[str]:
    """How a module reaches the training generator: imports of it, or dynamic imports."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if "default_model_data" in a.name]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""] + [a.name for a in node.names]
            found += [n for n in names if "default_model_data" in n or n in ("importlib", "runpy")]
        elif isinstance(node, ast.Name) and node.id in ("__import__", "exec", "importlib"):
            found.append(node.id)
    return found


def _source(name: str) -> str:
    return (SCRIPTS / name).read_text(encoding="utf-8")


@pytest.mark.parametrize("name", EVAL_FILES)
def test_the_set_never_imports_the_training_generator(name: str) -> None:
    assert imports_training(_source(name)) == []


def test_importing_the_set_loads_no_training_code() -> None:
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import general_eval_data, eval_general; "
        "general_eval_data.build(); "
        "print(sorted(m for m in sys.modules if 'default_model_data' in m))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(SCRIPTS)], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("name", EVAL_FILES)
def test_no_string_is_shared_with_the_training_generator(name: str) -> None:
    theirs = literals(TRAINING.read_text(encoding="utf-8"))
    assert len(theirs) > 20  # the generator's templates were found
    assert shared(literals(_source(name)), theirs) - set(ALLOWED_SHARED) == set()


def test_the_texts_to_copy_use_words_the_generator_never_draws(data: ModuleType) -> None:
    """The set's copy texts are built from its own word lists; none of those words is one the
    generator draws from for its texts (its word list and its unicode words, casefolded), so
    an exact copy on the set is a copy of words the model never saw as words to copy."""
    sys.path.insert(0, str(SCRIPTS))
    try:
        training = importlib.import_module("default_model_data")
    finally:
        sys.path.remove(str(SCRIPTS))
    theirs = {w.casefold() for w in (*training.WORDS, *training._UNICODE_WORDS)}
    ours = {w.casefold() for w in (*data.WORDS, *data.UNICODE_WORDS)}
    assert ours & theirs == set()


def test_the_guards_catch_a_copied_template_and_an_import() -> None:
    """The checks above can fail: a module holding one of the generator's strings, or
    importing it, is caught."""
    theirs = sorted(literals(TRAINING.read_text(encoding="utf-8")))
    copied = f"TEMPLATE = {theirs[len(theirs) // 2]!r}\n"
    assert shared(literals(copied), set(theirs))
    assert imports_training("import default_model_data as d\n") == ["default_model_data"]
    assert imports_training("from importlib import import_module\n") == ["importlib"]
    assert literals('x = f"Tell me the weather in {city} right now, please"') == {
        "tell me the weather in {} right now, please"
    }


# --------------------------------------------------------------------------- the set


def test_the_set_is_fixed_and_covers_every_task(data: ModuleType, cases: list[Any]) -> None:
    assert json.dumps(cases) == json.dumps(data.build())
    assert json.dumps(cases) != json.dumps(data.build(seed=1))
    counts = {
        task: sum(c["task"] == task for c in cases)
        for task in dict.fromkeys(c["task"] for c in cases)
    }
    assert counts == {
        "tool_call": 90, "tool_result": 90, "copy": 80, "structured": 60, "session": 40,
    }  # fmt: skip
    styles = {(c["task"], c["style"]) for c in cases if c["task"] != "session"}
    assert {s for t, s in styles if t == "structured"} == {
        "json_schema", "final_result", "named_tool",
    }  # fmt: skip
    assert {s for t, s in styles if t == "copy"} == {
        "words", "codes", "punctuation", "mixed_case", "unicode",
    }  # fmt: skip
    for case in cases:
        if case["task"] == "tool_call":
            run_tool(case["expected"]["name"], case["expected"]["arguments"])
        elif case["task"] == "copy":
            assert 3 <= len(case["expected"].split()) <= 20
            assert case["expected"] in case["request"]["messages"][-1]["content"]
        elif case["task"] == "structured":
            assert data.valid(case["expected"], case["schema"])
        elif case["task"] == "session":
            kinds = [turn["kind"] for turn in case["turns"]]
            assert len(kinds) == 6 and kinds.count("tool") >= 2 and "chat" in kinds
    # What the set's texts hold beyond plain words: non-ASCII, digits, mixed case.
    texts = [c["expected"] for c in cases if c["task"] == "copy"]
    assert sum(not t.isascii() for t in texts) >= 16
    results = [c["request"]["messages"][-1]["content"] for c in cases if c["task"] == "tool_result"]
    assert any(',"' in r and ', "' not in r for r in results)  # compact JSON
    assert any("\n" in r for r in results) and any("\\u00b0" in r for r in results)


def _right_reply(data: ModuleType, case: dict[str, Any]) -> Any:
    """The reply a perfect model gives."""
    task, expected = case["task"], case["expected"]
    if task == "tool_call":
        return data.Reply("", ((expected["name"], json.dumps(expected["arguments"])),))
    if task == "tool_result":
        number = int(expected) if expected == int(expected) else expected
        return data.Reply(f"The answer is {number}.")
    if task == "copy":
        return data.Reply(expected)
    if case["style"] == "json_schema":
        return data.Reply(json.dumps(expected))
    name = case["request"]["tools"][0]["function"]["name"]
    return data.Reply("", ((name, json.dumps(expected)),))


def _near_miss(data: ModuleType, case: dict[str, Any]) -> Any:
    """A reply one slip away from the right one."""
    task, expected = case["task"], case["expected"]
    if task == "tool_call":
        arguments = dict(expected["arguments"])
        key = {"get_weather": "city", "convert_units": "value", "calculator": "expression"}
        slipped = {"city": "Paris", "value": 7.5, "expression": "41.2 + 7"}[key[expected["name"]]]
        arguments[key[expected["name"]]] = slipped
        return data.Reply("", ((expected["name"], json.dumps(arguments)),))
    if task == "tool_result":
        wrong = -expected if expected else 1.5
        return data.Reply(f"The answer is {wrong}.")
    if task == "copy":
        return data.Reply(expected[:-1] + ("x" if expected[-1] != "x" else "y"))
    value = dict(expected)
    key = next(iter(value))
    value[key] = value[key] + "!" if isinstance(value[key], str) else not value[key]
    if case["style"] == "json_schema":
        return data.Reply(json.dumps(value))
    name = case["request"]["tools"][0]["function"]["name"]
    return data.Reply("", ((name, json.dumps(value)),))


def test_each_judge_accepts_the_right_reply_and_refuses_a_near_miss(
    data: ModuleType, cases: list[dict[str, Any]]
) -> None:
    for case in cases:
        if case["task"] == "session":
            continue
        assert data.check(case, _right_reply(data, case))["ok"], case
        assert not data.check(case, _near_miss(data, case))["ok"], case


def test_the_calculator_judge_wants_the_calculation_not_its_answer(data: ModuleType) -> None:
    expected = {"name": "calculator", "arguments": {"expression": "41.2 + 7"}}
    assert data.call_matches(expected, "calculator", '{"expression": "7 + 41.2"}')
    assert not data.call_matches(expected, "calculator", '{"expression": "48.2"}')
    assert not data.call_matches(expected, "calculator", '{"expression": "74.12 + 7"}')


def test_a_result_answer_must_keep_the_sign_and_invent_nothing(data: ModuleType) -> None:
    messages = [
        {"role": "user", "content": "weather in Oslo?"},
        {"role": "tool", "content": '{"temp_c":12.2,"sky":"fog"}'},
    ]
    assert data.result_used(12.2, messages, data.Reply("12.2 °C and fog in Oslo."))
    assert not data.result_used(12.2, messages, data.Reply("-12.2 °C and fog in Oslo."))
    assert not data.result_used(12.2, messages, data.Reply("12.2 °C (54 °F) in Oslo."))
    assert not data.result_used(12.2, messages, data.Reply("", (("calculator", "{}"),)))


def test_schema_validity_follows_json_schema(data: ModuleType) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    assert data.valid({"n": 3, "extra": "x"}, schema)
    assert not data.valid({"n": 3, "extra": "x"}, {**schema, "additionalProperties": False})
    assert not data.valid({"n": 3.5}, schema) and not data.valid({"n": True}, schema)
    assert not data.valid({}, schema)


def test_malformed_replies_are_named(data: ModuleType) -> None:
    reply = data.Reply
    assert data.malformed(reply("You're welcome!")) is None
    assert data.malformed(reply("", (("get_weather", '{"city": "Oslo"}'),))) is None
    assert "markup" in data.malformed(reply('<tool_call>\n{"name": "get_weather"'))
    assert "markup" in data.malformed(reply('{"name": "Sofia", "arguments": 7'))
    assert data.malformed(reply("It is", finish_reason="length")) == "cut at max_tokens"
    assert data.malformed(reply("  ")) == "empty"
    assert "not offered" in data.malformed(reply("", (("final_result", "{}"),)))
    assert "refuses" in data.malformed(reply("", (("calculator", '{"expression": "2 ** 8"}'),)))
    turn = {
        "kind": "tool",
        "expected": {"name": "calculator", "arguments": {"expression": "1 + 2"}},
    }
    call = reply("", (("calculator", '{"expression": "1 + 2"}'),))
    assert data.check_turn(turn, [call, reply("It is 3.")], 3.0)
    assert not data.check_turn(turn, [call, reply("It is 4.")], 3.0)
    assert not data.check_turn(turn, [reply("It is 3.")], None)


# --------------------------------------------------------------------------- the runner


@pytest.fixture(scope="module")
def runner_module() -> ModuleType:
    """scripts/eval_general.py."""
    sys.path.insert(0, str(SCRIPTS))
    try:
        return importlib.import_module("eval_general")
    finally:
        sys.path.remove(str(SCRIPTS))


@pytest.mark.anyio
async def test_the_runner_answers_as_the_local_backend(
    runner_module: ModuleType, cases: list[dict[str, Any]]
) -> None:
    """eval_general decodes through the request path users get: for a tool question, a
    forced final_result tool and a JSON schema, its reply is LocalBackend's, greedy."""
    from local_engine import LocalBackend
    from swiftclient import AsyncClient

    picked = [
        next(c for c in cases if c["task"] == "tool_call"),
        next(c for c in cases if c.get("style") == "final_result"),
        next(c for c in cases if c.get("style") == "json_schema"),
    ]
    runner = runner_module.Runner(runner_module.DEFAULT_MODEL)
    async with AsyncClient(LocalBackend(), model="default") as client:
        for case in picked:
            limit = runner_module.MAX_TOKENS[case["task"]]
            (ours,) = runner.run([case["request"]], [limit])
            body = dict(case["request"])
            completion = await client.chat(
                body.pop("messages"), temperature=0.0, max_tokens=limit, **body
            )
            calls = tuple((c.function.name, c.function.arguments) for c in completion.tool_calls)
            finish = completion.choices[0].finish_reason
            assert ours == runner_module.data.Reply(completion.text, calls, finish), case["task"]


def test_a_session_is_played_to_its_end_or_its_first_malformed_reply(
    runner_module: ModuleType, cases: list[dict[str, Any]]
) -> None:
    runner = runner_module.Runner(runner_module.DEFAULT_MODEL)
    sessions = [c for c in cases if c["task"] == "session"][:2]
    rows = runner_module.play_sessions(runner, sessions)
    for row in rows:
        assert row["ok"] == (not row["problems"])
        assert len(row["turns"]) == 6 or (row["problems"] and row["turns"][-1]["problem"])
        for turn in row["turns"]:
            assert (
                turn["replies"] and len(turn["replies"]) <= runner_module.data.MAX_TOOL_ROUNDS + 1
            )
