"""The copy warm-up of scripts/train_default_model.py (``--copy-warmup``).

Its batches must ask for a copy and nothing else (the loss only on the repeat of a sequence
and the end token after it), and with the warm-up off the recorded settings must be the ones
written before the option existed, so that the script's defaults still make the shipped
model's files.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytest.importorskip("torch")
pytest.importorskip("tokenizers")

import numpy as np  # noqa: E402

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
MODEL = Path(__file__).resolve().parents[2] / "local_engine" / "models" / "swift-tiny"


@pytest.fixture(scope="module")
def train() -> ModuleType:
    sys.path.insert(0, str(SCRIPTS))
    try:
        spec = importlib.util.spec_from_file_location(
            "train_default_model", SCRIPTS / "train_default_model.py"
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        # Dataclasses look their module up by name.
        module = sys.modules.setdefault("train_default_model", module)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(SCRIPTS))
    return module


def segments(row: list[int], end: int, pad: int) -> list[list[int]]:
    """A packed row cut after each end token, padding dropped."""
    out: list[list[int]] = [[]]
    for token in row:
        if token == pad:
            break
        out[-1].append(token)
        if token == end:
            out.append([])
    return [segment for segment in out if segment]


@pytest.mark.parametrize("pool", [0, 256])
def test_copy_batch_asks_for_the_repeat_only(train: ModuleType, pool: int) -> None:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(MODEL / "tokenizer.json"))
    tokens = train.CopyTokens.of(tokenizer, pool)
    if pool:
        assert len(tokens.pool) == pool
    cfg = train.TrainConfig(copy_warmup=1, copy_min_len=4, copy_max_len=32, copy_pool=pool)
    inputs, targets, mask = train.copy_batch(tokens, cfg, np.random.default_rng(7))
    assert inputs.shape == targets.shape == mask.shape
    assert inputs.numel() <= cfg.batch_tokens
    allowed = {*map(int, tokens.pool), tokens.space}
    for row in range(inputs.shape[0]):
        full = [*inputs[row].tolist(), int(targets[row, -1])]
        assert full[1:] == targets[row].tolist()
        found = segments(full, tokens.end, tokens.pad)
        assert found
        expected = [False] * len(full)
        at = 0
        for segment in found:
            length = (len(segment) - 2) // 2
            sequence = segment[:length]
            assert cfg.copy_min_len <= length <= cfg.copy_max_len
            assert segment == [*sequence, tokens.separator, *sequence, tokens.end]
            assert set(sequence) <= allowed
            for i in range(at + length + 1, at + len(segment)):
                expected[i] = True
            at += len(segment)
        # Target j is token j + 1: the loss covers exactly the repeats and their end tokens.
        assert mask[row].tolist() == expected[1:]


def test_warmup_off_records_the_settings_as_before(train: ModuleType) -> None:
    off = train.recorded(train.TrainConfig())
    assert not set(train.COPY_FIELDS) & set(off)
    on = train.recorded(train.TrainConfig(copy_warmup=400, copy_pool=256))
    assert on["copy_warmup"] == 400 and on["copy_pool"] == 256
    assert {k: v for k, v in on.items() if k not in train.COPY_FIELDS} == off


def test_a_continued_run_records_the_run_it_continued(train: ModuleType, tmp_path: Path) -> None:
    first = train.recorded(train.TrainConfig(vocab_size=1024, seed=7))
    (tmp_path / "training.json").write_text(
        json.dumps({"config": first, "parameters": 1, "minutes": 54.6, "device": "cpu"})
    )
    cfg = train.TrainConfig(init=str(tmp_path), steps=300, seed=2916)
    earlier = train.earlier_run(cfg.init)
    assert earlier is not None and earlier["config"] == first
    # The run keeps the earlier tokenizer: its size is recorded, not the unused option's.
    settings = train.run_settings(cfg, earlier)
    assert settings["vocab_size"] == 1024 and settings["seed"] == 2916
    card = train.model_card(cfg, 2_866_368, earlier)
    assert "trained from scratch (54.6 minutes)" in card
    assert json.dumps(first) in card and json.dumps(settings) in card
    assert str(tmp_path) not in card.split("Training settings")[0]
    # No record to read (an init directory from elsewhere, or no init): the path alone.
    assert train.earlier_run(str(tmp_path / "missing")) is None and train.earlier_run("") is None
    assert train.run_settings(cfg, None) == train.recorded(cfg)


def test_the_shipped_model_card_is_the_one_the_script_writes(train: ModuleType) -> None:
    record = json.loads((MODEL / "training.json").read_text(encoding="utf-8"))
    cfg = train.TrainConfig(**record["config"])
    card = train.model_card(cfg, record["parameters"], record.get("earlier"))
    assert (MODEL / "README.md").read_text(encoding="utf-8") == card
