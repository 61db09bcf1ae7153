"""The trained embedded model (swift-tiny): shipped files, its tools, greedy held-out answers."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import anyio
import pytest
from safetensors import safe_open

from local_engine import LocalBackend, default_model
from local_engine.builtin_tools import TOOLS, UNITS, run_tool
from local_engine.default_model import DEFAULT_MODEL_NAME, embedded_model_dir
from local_engine.errors import EngineConfigError
from local_engine.tokenizer import Tokenizer
from swiftclient import AsyncClient
from swiftclient.types import ChatCompletion

# Held-out conversations (never trained on) written by
# `scripts/eval_default_model.py --write-fixture`: the first three of several tasks.
HELDOUT = Path(__file__).parent / "data" / "swift_tiny_heldout.json"


def _heldout() -> list[dict[str, Any]]:
    return list(json.loads(HELDOUT.read_text(encoding="utf-8")))


def test_the_shipped_files_are_small_and_complete() -> None:
    path = embedded_model_dir()
    assert path.name == DEFAULT_MODEL_NAME
    weights = path / "model.safetensors"
    assert weights.stat().st_size <= 20 * 2**20
    with safe_open(str(weights), framework="pt") as handle:
        count = sum(math.prod(handle.get_slice(n).get_shape()) for n in handle.keys())
    config = json.loads((path / "config.json").read_text())
    assert config["model_type"] == "qwen3" and config["tie_word_embeddings"] is True
    # About 2.9M (a 1,024-token vocabulary): small enough to train within the hour on one core.
    assert 2_500_000 <= count <= 10_000_000
    card = (path / "README.md").read_text()
    assert "from scratch" in card and "gibberish" not in card


def test_a_missing_model_file_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / DEFAULT_MODEL_NAME).mkdir()
    monkeypatch.setattr(default_model, "_EMBEDDED_ROOT", tmp_path)
    with pytest.raises(EngineConfigError, match="incomplete"):
        embedded_model_dir()
    with pytest.raises(EngineConfigError, match="unknown embedded model"):
        embedded_model_dir("swift-huge")


def test_each_builtin_tool_definition_is_one_token() -> None:
    tokenizer = Tokenizer.from_dir(embedded_model_dir())
    for tool in TOOLS.values():
        text = json.dumps(tool["function"], ensure_ascii=False)
        assert len(tokenizer.encode(text)) == 1, tool["function"]["name"]
    # Other text is ordinary byte-level BPE, digits one by one.
    assert tokenizer.decode(tokenizer.encode("Convert 12.5 km")) == "Convert 12.5 km"
    assert len(tokenizer.encode("2026")) == 4


def test_builtin_tools_compute_their_results() -> None:
    weather = run_tool("get_weather", {"city": "Paris"})
    assert weather == run_tool("get_weather", {"city": "Paris", "unit": "celsius"})
    assert set(weather) == {"city", "temperature", "unit", "conditions"}
    fahrenheit = run_tool("get_weather", {"city": "Paris", "unit": "fahrenheit"})
    assert fahrenheit["temperature"] == pytest.approx(weather["temperature"] * 9 / 5 + 32, abs=0.02)
    assert run_tool("convert_units", {"value": 10, "from_unit": "km", "to_unit": "mi"})[
        "result"
    ] == pytest.approx(6.21)
    assert (
        run_tool("convert_units", {"value": 100, "from_unit": "c", "to_unit": "f"})["result"] == 212
    )
    assert run_tool("calculator", {"expression": "37 * 12 - 4 / 2"})["result"] == 442
    assert set(UNITS) >= {"km", "mi", "kg", "lb", "c", "f"}
    # whole numbers stay exact (a float's 53 bits gave ...264 and 10**30 + 19884624838656)
    product = run_tool("calculator", {"expression": "123456789 * 987654321"})["result"]
    assert product == 123456789 * 987654321
    assert run_tool("calculator", {"expression": "9" * 30 + " + 1"})["result"] == 10**30
    assert run_tool("calculator", {"expression": "0.1 + 0.2"})["result"] == 0.3


@pytest.mark.parametrize(
    ("name", "arguments", "message"),
    [
        ("get_weather", {}, "needs a city"),
        ("get_weather", {"city": "Oslo", "unit": "kelvin"}, "celsius or fahrenheit"),
        ("convert_units", {"value": "1", "from_unit": "km", "to_unit": "mi"}, "number value"),
        ("convert_units", {"value": 1, "from_unit": "km", "to_unit": "kg"}, "cannot convert"),
        ("convert_units", {"value": 1, "from_unit": "km", "to_unit": "parsec"}, "unknown unit"),
        ("calculator", {"expression": "__import__('os')"}, "only numbers"),
        ("calculator", {"expression": "1 / 0"}, "cannot evaluate"),
        ("calculator", {"expression": "2 ** 8"}, "only numbers"),
        # past a float's range: OverflowError and an infinite result escaped as other errors
        ("calculator", {"expression": "1e308 * 10"}, "out of range"),
        ("calculator", {"expression": "1e308 * 10 - 1e308 * 10"}, "out of range"),
        ("calculator", {"expression": "9" * 5000}, "cannot evaluate '9999"),
        ("convert_units", {"value": 1e308, "from_unit": "km", "to_unit": "mi"}, "finite"),
        ("convert_units", {"value": float("nan"), "from_unit": "km", "to_unit": "mi"}, "finite"),
        ("convert_units", {"value": float("inf"), "from_unit": "c", "to_unit": "f"}, "finite"),
        ("send_email", {}, "unknown tool"),
    ],
)
def test_builtin_tools_reject_bad_arguments(
    name: str, arguments: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        run_tool(name, arguments)


def _request(conversation: dict[str, Any]) -> dict[str, Any]:
    extra: dict[str, Any] = {}
    if conversation["tools"]:
        extra["tools"] = conversation["tools"]
    if conversation["response_format"]:
        extra["response_format"] = conversation["response_format"]
    return extra


@pytest.mark.anyio
async def test_held_out_requests_get_well_formed_tool_calls_and_json() -> None:
    """What the shipped model does reliably (docs/local-engine.md has the measured table):
    for held-out tool questions it calls the right tool with a JSON object of arguments, and
    under a JSON response format it writes JSON with the schema's keys. Whether the argument
    values are right is measured by scripts/eval_default_model.py, not asserted here."""
    conversations = [c for c in _heldout() if c["task"] in ("tool_call", "json")]
    assert len(conversations) == 6
    replies: dict[int, ChatCompletion] = {}

    async def one(i: int, conversation: dict[str, Any]) -> None:
        replies[i] = await client.chat(
            conversation["messages"][:-1],
            temperature=0.0,
            max_tokens=96,
            **_request(conversation),
        )

    async with AsyncClient(LocalBackend(), model="default") as client:
        async with anyio.create_task_group() as tg:
            for i, conversation in enumerate(conversations):
                tg.start_soon(one, i, conversation)
    for i, conversation in enumerate(conversations):
        expected, completion = conversation["expected"], replies[i]
        if conversation["task"] == "tool_call":
            assert completion.choices[0].finish_reason == "tool_calls", completion.text
            (call,) = completion.tool_calls
            assert call.function.name == expected["name"]
            assert isinstance(json.loads(call.function.arguments), dict)
        else:
            value = json.loads(completion.text)
            assert isinstance(value, dict) and set(value) == set(expected), completion.text


# What a new user types first, as typed: lowercase, with and without marks. The training
# data has these forms (scripts/default_model_data.py, _casual); the replies are its own.
_FIRST_WORDS = {
    "hi": "Hello! How can I help you today?",
    "hello": "Hello! How can I help you today?",
    "Hey there!": "Hello! How can I help you today?",
    "good morning": "Hello! How can I help you today?",
    "thanks": "You're welcome!",
    "thank you!": "You're welcome!",
    "bye": "Goodbye! Have a nice day.",
    "who are you": "I am swift-tiny, a small assistant model that runs offline with swiftclient.",
}


@pytest.mark.anyio
async def test_everyday_greetings_get_the_trained_replies() -> None:
    replies: dict[str, str] = {}

    async def one(prompt: str) -> None:
        completion = await client.chat(prompt, temperature=0.0, max_tokens=40)
        replies[prompt] = completion.text

    async with AsyncClient(LocalBackend(), model="default") as client:
        async with anyio.create_task_group() as tg:
            for prompt in _FIRST_WORDS:
                tg.start_soon(one, prompt)
    assert replies == _FIRST_WORDS
