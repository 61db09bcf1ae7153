"""The embedded default model: deterministic, cached atomically, loadable by transformers."""

from __future__ import annotations

import copy
import hashlib
import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM, AutoTokenizer

from local_engine.chat import ChatFormatter
from local_engine.default_model import (
    DEFAULT_MODELS,
    FORMAT_VERSION,
    MARKER_FILE,
    RANDOM_MODEL_NAME,
    count_parameters,
    default_cache_root,
    embedded_model_dir,
    ensure_default_model,
    find_default_model,
)
from local_engine.errors import EngineConfigError
from local_engine.loader import load_model
from local_engine.tokenizer import Tokenizer
from swiftclient.types import Message, Tool


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_default_model(cache_dir=tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def model_tokenizer(model_dir: Path) -> Tokenizer:
    return Tokenizer.from_dir(model_dir)


def _hashes(directory: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.iterdir())
        if p.is_file()
    }


def test_generation_is_deterministic_across_processes(model_dir: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    code = (
        "import sys; from local_engine.default_model import write_default_model; "
        "write_default_model('swift-tiny-random', sys.argv[1])"
    )
    subprocess.run([sys.executable, "-c", code, str(other)], check=True, timeout=240)
    expected = _hashes(model_dir)
    assert set(expected) >= {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "README.md",
        MARKER_FILE,
    }
    assert _hashes(other) == expected


def test_cache_location_and_reuse(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWIFTCLIENT_CACHE_DIR", str(tmp_path))
    assert default_cache_root() == tmp_path
    first = ensure_default_model()
    assert first == tmp_path / "models" / RANDOM_MODEL_NAME
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert ensure_default_model() == first
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp  # not rewritten
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == [RANDOM_MODEL_NAME]


def test_concurrent_first_use_is_safe(tmp_path: Path) -> None:
    barrier = threading.Barrier(3)
    results: list[Path] = []
    errors: list[BaseException] = []

    def worker() -> None:
        barrier.wait()
        try:
            results.append(ensure_default_model(cache_dir=tmp_path))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(set(results)) == 1 and len(results) == 3
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == [RANDOM_MODEL_NAME]
    Tokenizer.from_dir(results[0])  # complete and readable


def test_stale_cache_is_rebuilt(model_dir: Path, tmp_path: Path) -> None:
    target = tmp_path / "models" / RANDOM_MODEL_NAME
    target.mkdir(parents=True)
    (target / MARKER_FILE).write_text(json.dumps({"format_version": FORMAT_VERSION - 1}))
    (target / "junk.bin").write_bytes(b"x")
    assert ensure_default_model(cache_dir=tmp_path) == target
    assert _hashes(target) == _hashes(model_dir)


def test_unknown_model_name(tmp_path: Path) -> None:
    with pytest.raises(EngineConfigError, match="unknown random-weight model"):
        ensure_default_model("swift-huge", cache_dir=tmp_path)
    with pytest.raises(EngineConfigError, match="unknown model name 'swift-huge'"):
        find_default_model("swift-huge")
    assert find_default_model() == embedded_model_dir()
    assert find_default_model("swift-tiny") == embedded_model_dir()


def test_sizes_and_honest_labels(model_dir: Path) -> None:
    assert set(DEFAULT_MODELS) == {"swift-tiny-random", "swift-50m"}
    assert 5_000_000 <= count_parameters("swift-tiny-random") <= 10_000_000
    assert 40_000_000 <= count_parameters("swift-50m") <= 60_000_000
    card = (model_dir / "README.md").read_text()
    assert "Random, untrained weights" in card and "gibberish" in card
    assert json.loads((model_dir / MARKER_FILE).read_text())["random_weights"] is True


def test_config_and_special_tokens(model_dir: Path) -> None:
    config = json.loads((model_dir / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForCausalLM"] and config["model_type"] == "qwen3"
    tok = Tokenizer.from_dir(model_dir)
    assert config["vocab_size"] >= tok.vocab_size and config["vocab_size"] % 64 == 0
    ids = {t: tok.token_to_id(t) for t in ("<|im_start|>", "<|im_end|>", "<|endoftext|>")}
    assert None not in ids.values()
    assert set(ids.values()) <= tok.special_token_ids
    assert tok.eos_token_ids == (ids["<|im_end|>"], ids["<|endoftext|>"])
    assert tok.pad_token_id == ids["<|endoftext|>"]
    for marker in ("<tool_call>", "</tool_call>"):
        marker_id = tok.token_to_id(marker)
        assert tok.encode(f"a{marker}b")[1] == marker_id
        assert marker_id not in tok.special_token_ids  # survives skip_special_tokens
    assert ChatFormatter(tok).tool_format() == "hermes"


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=80))
def test_tokenizer_round_trips_unicode(model_tokenizer: Tokenizer, text: str) -> None:
    tok = model_tokenizer
    ids = tok.encode(text)
    assert tok.decode(ids, skip_special_tokens=False) == text
    detok = tok.detokenizer(skip_special_tokens=False)
    streamed = "".join(detok.push(i) for i in ids) + detok.flush()
    assert streamed == text


def test_transformers_loads_it_and_renders_the_same(model_dir: Path) -> None:
    model: Any = AutoModelForCausalLM.from_pretrained(model_dir)
    hf_tok: Any = AutoTokenizer.from_pretrained(model_dir)
    ours = Tokenizer.from_dir(model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    assert type(model).__name__ == "Qwen3ForCausalLM"

    text = "Hello, world! Ça va? 你好 🚀 <tool_call>{}</tool_call>"
    assert hf_tok(text, add_special_tokens=False)["input_ids"] == ours.encode(text)

    # Weights are what the generator promises: std 0.02 matrices, unit norms, tied head.
    embed = model.model.embed_tokens.weight
    assert abs(float(embed.detach().std()) - 0.02) < 0.002
    assert torch.equal(model.model.layers[0].self_attn.q_norm.weight, torch.ones(64))
    assert model.lm_head.weight.data_ptr() == embed.data_ptr()
    ids = torch.tensor([ours.encode(text)])
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], config["vocab_size"])
    assert bool(torch.isfinite(logits).all())

    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather in a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]
    conversation: list[dict[str, Any]] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Oslo?"},
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Oslo"}},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "-3 C"},
        {"role": "user", "content": "And tomorrow?"},
    ]
    formatter = ChatFormatter(ours)
    for offered in (None, tools):
        for generation_prompt in (False, True):
            expected = hf_tok.apply_chat_template(
                conversation,
                tools=offered,
                tokenize=False,
                add_generation_prompt=generation_prompt,
            )
            rendered = formatter.render(
                [_openai(m) for m in conversation],
                tools=[Tool.model_validate(t) for t in offered] if offered else None,
                add_generation_prompt=generation_prompt,
            )
            assert rendered == expected
    assert "<tool_call>\n" in expected and "<tool_response>\n-3 C" in expected


def _openai(message: dict[str, Any]) -> Message:
    """The OpenAI shape of a message: tool-call arguments as a JSON string."""
    data = copy.deepcopy(message)
    for call in data.get("tool_calls", []):
        call["function"]["arguments"] = json.dumps(call["function"]["arguments"])
    return Message.model_validate(data)


def test_local_loader_loads_it(model_dir: Path) -> None:
    model = load_model(model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    tok = Tokenizer.from_dir(model_dir)
    assert model.config.family == "qwen3"
    assert model.config.vocab_size == config["vocab_size"]
    assert model.config.num_layers == DEFAULT_MODELS[RANDOM_MODEL_NAME].num_layers
    assert model.config.tie_word_embeddings and model.config.qk_norm
    assert set(model.config.eos_token_ids) == set(tok.eos_token_ids)
