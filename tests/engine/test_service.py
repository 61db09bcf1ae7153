"""ChatService: OpenAI fields from engine outputs (logprob entries)."""

from __future__ import annotations

import logging

import pytest

from local_engine import service as service_module
from local_engine.engine import Engine, EngineConfig
from local_engine.loader import load_model
from local_engine.sampling_params import TokenLogprob
from local_engine.service import ChatService
from local_engine.tokenizer import Tokenizer
from swiftclient.types import ChatRequest

from .test_tokenizer import _byte_level, _write_dir
from .tiny import make_tiny_model


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> ChatService:
    root = tmp_path_factory.mktemp("service")
    tokenizer = Tokenizer.from_dir(_write_dir(root / "tok", _byte_level(), {}))
    model_dir = make_tiny_model(root / "model", "qwen2", vocab_size=tokenizer.vocab_size)
    engine = Engine(load_model(model_dir), EngineConfig(num_blocks=16), tokenizer)
    return ChatService(engine)


def test_logprob_bytes_of_tokens_split_inside_a_character_join_to_the_text(
    service: ChatService,
) -> None:
    """Bug 1.9: a token ending inside a UTF-8 sequence reported U+FFFD's bytes."""
    text = "Streaming 🧪 déjà vu 中文"
    ids = service.tokenizer.encode(text)
    assert any("\ufffd" in service.tokenizer.decode([i]) for i in ids)
    entries = service.logprob_entries(
        [TokenLogprob(i, -0.5, top_logprobs=((i, -0.5),)) for i in ids]
    )
    assert b"".join(bytes(e["bytes"]) for e in entries) == text.encode("utf-8")
    tops = [e["top_logprobs"][0]["bytes"] for e in entries]
    assert b"".join(bytes(b) for b in tops) == text.encode("utf-8")
    assert [e["token"] for e in entries] == [service.tokenizer.decode([i]) for i in ids]


def test_ignored_extra_body_keys_are_logged_printable_and_remembered_boundedly(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client's key with a CR-LF wrote a forged log line, and every new key a client
    sent was remembered for the life of the process."""
    monkeypatch.setattr(service_module, "_ignored_logged", service_module.NamesSeen(limit=3))

    def request(*keys: str) -> ChatRequest:
        return ChatRequest(
            model="m",
            messages=[{"role": "user", "content": "x"}],
            extra_body=dict.fromkeys(keys, 1),
        )

    with caplog.at_level(logging.WARNING, logger="local_engine.service"):
        service_module._extra(request("a\r\nFORGED line", "top_k"))
        service_module._extra(request("a\r\nFORGED line"))  # logged once
        service_module._extra(request("k1", "k2", "k3"))
        service_module._extra(request("k4"))  # past the bound: not remembered, not logged
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert all("\n" not in line and "\r" not in line for line in lines)
    assert lines[0].startswith("ignoring extra_body keys the local engine does not use: a\\r\\n")
    assert service_module._ignored_logged.names == {"a\\r\\nFORGED line", "k1", "k2"}
