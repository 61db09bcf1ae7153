"""The synthetic data behind the trained default model (scripts/default_model_data.py).

The generator decides what swift-tiny learns and what its held-out table measures, so its
invariants are checked here: the held-out set is fixed and kept out of training, every
conversation's ``expected`` is its last turn, and everything an answer must reproduce is
written in the prompt in the same form (the model copies, it never computes).
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
HELDOUT_FIXTURE = Path(__file__).parent / "data" / "swift_tiny_heldout.json"
# A number on its own (not the middle of a date such as 2026-10-14).
NUMBER = re.compile(r"(?<![\w.-])-?\d+(?:\.\d+)?(?![\d.]\d)")


@pytest.fixture(scope="module")
def data() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "default_model_data", SCRIPTS / "default_model_data.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("default_model_data", module)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def sample(data: ModuleType) -> list[dict[str, Any]]:
    heldout = {data.conversation_key(conv) for conv in data.heldout_set()}
    convs: list[dict[str, Any]] = data.generate(3000, 1234, exclude=heldout)
    return convs


def test_the_heldout_set_is_fixed_and_matches_the_ci_fixture(data: ModuleType) -> None:
    heldout = data.heldout_set()
    assert len(heldout) == 60 * len(data.TASKS) >= 500
    # The CI fixture is the first three held-out conversations of most tasks; the training
    # mix may change, the held-out set may not (its table is compared across models).
    fixture = json.loads(HELDOUT_FIXTURE.read_text(encoding="utf-8"))
    for conv in fixture:
        assert conv in heldout, conv["messages"][-2]
    assert data.heldout_set() == heldout


def test_training_data_is_seeded_and_never_holds_a_heldout_prompt(
    data: ModuleType, sample: list[dict[str, Any]]
) -> None:
    keys = {data.conversation_key(conv) for conv in data.heldout_set()}
    assert not keys & {data.conversation_key(conv) for conv in sample}
    assert data.generate(50, 1234, exclude=keys) == sample[:50]
    assert data.generate(50, 1235, exclude=keys) != sample[:50]
    # Every task of the mix is drawn (those weighed 0 are not).
    assert {conv["task"] for conv in sample} == {
        "tool_call_multiturn" if name == "tool_second_call" else name
        for name, (_, weight) in data.TASKS.items()
        if weight
    }


def test_expected_is_the_last_turn(sample: list[dict[str, Any]]) -> None:
    for conv in sample:
        last, expected = conv["messages"][-1], conv["expected"]
        assert last["role"] == "assistant"
        if last.get("tool_calls"):
            (call,) = last["tool_calls"]
            assert call["function"]["name"] == expected["name"]
            assert json.loads(call["function"]["arguments"]) == expected["arguments"]
        elif conv["response_format"]:  # json, json_general and some of structured_any
            assert json.loads(last["content"]) == expected
        else:
            assert last["content"] == expected


def test_answers_copy_their_numbers_from_the_prompt(
    data: ModuleType, sample: list[dict[str, Any]]
) -> None:
    """A number in a reply (a tool result stated, a tool argument, a JSON value, a copied
    text) is written in the prompt exactly as the reply writes it."""
    checked = 0
    for conv in sample:
        # The prompt's texts as written (not JSON-escaped: a copied text may follow a newline).
        prompt = "\n".join(
            m.get("content") or json.dumps(m["tool_calls"], ensure_ascii=False)
            for m in conv["messages"][:-1]
        )
        last = conv["messages"][-1]
        reply = last["content"] or last["tool_calls"][0]["function"]["arguments"]
        if conv["task"] == "chat" or reply in {answer for _, answer in data._FACTS}:
            continue  # canned facts
        # A numbered list's own numbers are the one thing written, not copied.
        for number in NUMBER.findall(re.sub(r"(?m)^\d+\. ", "", reply)):
            assert re.search(rf"(?<![\w.]){re.escape(number)}(?![\d.]\d)", prompt), (
                number,
                conv,
            )
            checked += 1
    assert checked > 1000


def test_the_data_asks_for_what_users_send(data: ModuleType, sample: list[dict[str, Any]]) -> None:
    """Issue 28: texts to copy beyond the old word lists, tool results in the styles clients
    send, tools in any order, the frameworks' structured-output formats, long sessions."""
    old_vocabulary = set(data._CITIES + data._FIRST + data._OBJECTS + data._ITEMS)
    copies = [c["expected"] for c in sample if c["task"] == "copy_general"]
    new_words = {w for text in copies for w in text.split() if w.isalpha()} - old_vocabulary
    assert len(new_words) > 500
    assert any(not text.isascii() for text in copies)
    # Texts drawn character by character: many alphabets, so every byte is seen copied; and
    # schemas with made-up field names, through a forced tool and a response format (both
    # weighed 0 by default: run G's --mix draws them).
    others = ",".join(f"{name}=0" for name in data.TASKS)
    extra = data.generate(600, 7, mix=f"{others},copy_chars=1,structured_any=1")
    chars = {ch for c in extra if c["task"] == "copy_chars" for ch in c["expected"]}
    assert len(chars) > 500 and {len(ch.encode()) for ch in chars} == {1, 2, 3, 4}
    anys = [c for c in extra if c["task"] == "structured_any"]
    fields = {
        key
        for c in anys
        for key in (c["expected"] if c["response_format"] else c["expected"]["arguments"])
    }
    assert len(fields - {name for name, _ in data._FIELDS}) > 100
    assert {bool(c["response_format"]) for c in anys} == {True, False}
    results = [m["content"] for c in sample for m in c["messages"] if m["role"] == "tool"]
    assert any(r.startswith('{"') and '":' in r and ", " not in r for r in results)  # compact
    assert any('": ' in r for r in results) and any("\n" in r for r in results)
    assert any("temp_c" in r or "temp_f" in r for r in results)  # other field names
    orders = {
        tuple(t["function"]["name"] for t in c["tools"] or ())
        for c in sample
        if c["task"] == "tool_call_general"
    }
    assert ("get_weather", "calculator") in orders and ("calculator", "get_weather") in orders
    forced = [c for c in sample if c["task"] == "forced_tool"]
    assert {c["expected"]["name"] for c in forced} > {"final_result"}
    for conv in forced:  # the arguments fill the schema that the one forced tool gives
        (tool,) = [t for t in conv["tools"] if t["function"]["name"] == conv["expected"]["name"]]
        assert list(conv["expected"]["arguments"]) == tool["function"]["parameters"]["required"]
    sessions = [c for c in sample if c["task"] == "session"]
    assert max(sum(m["role"] == "user" for m in c["messages"]) for c in sessions) == 6
    thanks_after_tool = [
        c
        for c in sessions
        for i, m in enumerate(c["messages"][:-2])
        if m["role"] == "tool" and c["messages"][i + 2]["content"] in data._THANKS
    ]
    assert thanks_after_tool


def test_a_mix_override_changes_only_the_named_weights(data: ModuleType) -> None:
    """``--mix`` of the training script: the named tasks get the given weights, the rest
    keep TASKS's, and a task that does not exist is refused."""
    weights = data.task_weights("copy=7,session=0.5")
    assert weights["copy"] == 7.0 and weights["session"] == 0.5
    assert {k: v for k, v in weights.items() if k not in ("copy", "session")} == {
        k: w for k, (_, w) in data.TASKS.items() if k not in ("copy", "session")
    }
    assert data.task_weights("") == {k: w for k, (_, w) in data.TASKS.items()}
    only_copy = data.generate(40, 7, mix=",".join(f"{k}=0" for k in data.TASKS if k != "copy"))
    assert {conv["task"] for conv in only_copy} == {"copy"}
    with pytest.raises(ValueError, match="no task"):
        data.task_weights("nonsense=1")


def test_the_greeting_task_draws_greetings_alone(data: ModuleType) -> None:
    """``greeting`` (weighed 0 by default; run L's ``--mix "greeting=1"``): first messages
    from the greeting table and their replies, never a canned fact, tools offered or not."""
    others = ",".join(f"{name}=0" for name in data.TASKS)
    convs = data.generate(300, 11, mix=f"{others},greeting=1")
    assert {conv["task"] for conv in convs} == {"greeting"}
    replies = {answer for _, answer in data._GREETINGS}
    firsts = {prompt for prompts, _ in data._GREETINGS for prompt in prompts}
    assert {conv["expected"] for conv in convs} == replies
    assert all(conv["messages"][-2]["content"] in firsts for conv in convs)
    assert {"hi", "who are you", "thanks", "bye"} <= {c["messages"][-2]["content"] for c in convs}
    assert {bool(conv["tools"]) for conv in convs} == {True, False}


def test_the_tool_text_task_states_a_plain_text_result(data: ModuleType) -> None:
    """``tool_text`` (weighed 0 by default; run M's ``--mix "...,tool_text=1.5"``): a built-in
    tool's result as plain text, answered in text that states the result's numbers, with the
    tool sometimes titled and closed as frameworks build it from a function signature."""
    others = ",".join(f"{name}=0" for name in data.TASKS)
    convs = data.generate(300, 12, mix=f"{others},tool_text=1")
    assert {conv["task"] for conv in convs} == {"tool_text"}
    titled = 0
    for conv in convs:
        tool_msg, reply = conv["messages"][-2], conv["messages"][-1]
        assert tool_msg["role"] == "tool" and reply["role"] == "assistant"
        assert "tool_calls" not in reply and reply["content"] == conv["expected"]
        assert not tool_msg["content"].startswith(("{", "["))
        call = conv["messages"][-3]["tool_calls"][0]["function"]
        numbers = NUMBER.findall(reply["content"])
        # The result is in the text; an expression or a value converted is in the call too.
        assert (
            numbers and numbers[-1 if call["name"] != "get_weather" else 0] in tool_msg["content"]
        )
        assert all(n in tool_msg["content"] + call["arguments"] for n in numbers), conv
        called = call["name"]
        (tool,) = [t for t in conv["tools"] if t["function"]["name"] == called]
        params = tool["function"]["parameters"]
        if "title" in params:
            titled += 1
            assert params["additionalProperties"] is False
            assert all("title" in p for p in params["properties"].values())
    assert 60 < titled < 240
