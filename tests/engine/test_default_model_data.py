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
    # Every task of the mix is drawn.
    assert {conv["task"] for conv in sample} == {
        "tool_call_multiturn" if name == "tool_second_call" else name for name in data.TASKS
    }


def test_expected_is_the_last_turn(sample: list[dict[str, Any]]) -> None:
    for conv in sample:
        last, expected = conv["messages"][-1], conv["expected"]
        assert last["role"] == "assistant"
        if last.get("tool_calls"):
            (call,) = last["tool_calls"]
            assert call["function"]["name"] == expected["name"]
            assert json.loads(call["function"]["arguments"]) == expected["arguments"]
        elif conv["task"] == "json":
            assert json.loads(last["content"]) == expected
        else:
            assert last["content"] == expected


def test_answers_copy_their_numbers_from_the_prompt(sample: list[dict[str, Any]]) -> None:
    """A number in a reply (a tool result stated, a tool argument, a JSON value, a copied
    text) is written in the prompt exactly as the reply writes it."""
    checked = 0
    for conv in sample:
        prompt = json.dumps(conv["messages"][:-1], ensure_ascii=False)
        last = conv["messages"][-1]
        reply = last["content"] or last["tool_calls"][0]["function"]["arguments"]
        if conv["task"] == "chat":
            continue  # canned facts
        for number in NUMBER.findall(reply):
            assert re.search(rf"(?<![\w.-]){re.escape(number)}(?![\d.]\d)", prompt), (
                number,
                conv,
            )
            checked += 1
    assert checked > 1000
