"""The embedded tiny default model for tests of the local backend and server.

Built once per test session into a temporary cache and loaded once; every test gets fresh
engines (each with its own KV cache) over the shared weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from local_engine.default_model import ensure_default_model
from local_engine.engine import Engine, EngineConfig, RequestOutput
from local_engine.loader import load_model
from local_engine.model import DecoderModel
from local_engine.tokenizer import Tokenizer

__all__ = ["CountingEngine", "TinyModel", "load_tiny_model"]

EngineT = TypeVar("EngineT", bound=Engine)


class CountingEngine(Engine):
    """An engine that counts its steps (to tell an abort from a natural finish)."""

    steps = 0

    def step(self) -> list[RequestOutput]:
        """Run one step and count it."""
        self.steps += 1
        return super().step()


@dataclass(frozen=True)
class TinyModel:
    """The embedded default model, loaded once: cache root, directory, weights, tokenizer."""

    cache_root: Path
    path: Path
    model: DecoderModel
    tokenizer: Tokenizer

    def engine(self, **config: Any) -> CountingEngine:
        """A fresh :class:`CountingEngine` over the shared weights (see :meth:`build`)."""
        return self.build(CountingEngine, **config)

    def build(self, cls: type[EngineT], **config: Any) -> EngineT:
        """A fresh engine of class ``cls`` over the shared weights (``config``: EngineConfig
        fields; 256 blocks of 16 tokens unless given)."""
        settings: dict[str, Any] = {"num_blocks": 256, "block_size": 16}
        settings.update(config)
        return cls(self.model, EngineConfig(**settings), self.tokenizer)


def load_tiny_model(cache_root: Path) -> TinyModel:
    """Generate (or find) the default model under ``cache_root`` and load it."""
    path = ensure_default_model(cache_dir=cache_root)
    return TinyModel(cache_root, path, load_model(path), Tokenizer.from_dir(path))
