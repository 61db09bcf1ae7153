"""The embedded tiny default model for tests of the local backend and server.

Built once per test session into a temporary cache and loaded once; every test gets fresh
engines (each with its own KV cache) over the shared weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from local_engine.default_model import ensure_default_model
from local_engine.engine import Engine, EngineConfig, RequestOutput, StepTokens
from local_engine.loader import load_model
from local_engine.model import DecoderModel
from local_engine.tokenizer import Tokenizer

__all__ = ["CountingEngine", "ReplyScriptEngine", "TinyModel", "load_tiny_model"]

EngineT = TypeVar("EngineT", bound=Engine)


class CountingEngine(Engine):
    """An engine that counts its steps (to tell an abort from a natural finish): the model
    runs, which ``step()`` and the overlapped AsyncEngine both do through ``run_step()``."""

    steps = 0

    def run_step(self) -> StepTokens:
        """Run one step and count it."""
        self.steps += 1
        return super().run_step()


class ReplyScriptEngine(CountingEngine):
    """Writes fixed replies (what a trained model would have written) in place of the tiny
    model's random text: the n-th request gets ``replies[n]`` as its text pieces, one per
    step, then stops (the last reply repeats for later requests). Set ``replies`` on a
    subclass. It rewrites whole ``step()`` outputs and aborts requests there, so it turns
    ``overlap_output`` off (an overlapped ``process_step`` may not abort)."""

    replies: tuple[tuple[str, ...], ...] = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.overlap_output = False
        self._left: dict[str, list[str]] = {}

    def step(self) -> list[RequestOutput]:
        """Run one step, then replace each request's new text with its next scripted piece."""
        outputs = super().step()
        for out in outputs:
            left = self._left.get(out.request_id)
            if left is None:
                reply = self.replies[min(len(self._left), len(self.replies) - 1)]
                left = self._left[out.request_id] = list(reply)
            out.new_text = left.pop(0) if left else ""
            if not left and not out.finished:
                self.abort(out.request_id)
                out.finished, out.finish_reason = True, "stop"
        return outputs


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
