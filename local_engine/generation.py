"""Default sampling parameters from a checkpoint's ``generation_config.json``.

A model directory may say how it is meant to be sampled; the chat service applies that as
the default of every field a request leaves unset, as vLLM does with
``--generation-config auto`` (its default). The fields read are ``temperature``, ``top_p``,
``top_k``, ``min_p``, ``repetition_penalty`` and ``max_new_tokens`` (the default
``max_tokens``, capped by the server's own default); ``do_sample: false`` means greedy
decoding, as in Hugging Face transformers, so it sets ``temperature`` to 0. Values that are
out of range or of the wrong type are left out.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

__all__ = ["GENERATION_CONFIG_MODES", "read_sampling_defaults"]

GENERATION_CONFIG_MODES = ("auto", "none")
"""``auto``: apply the model's ``generation_config.json``; ``none``: ignore it."""

_FLOATS = {
    "temperature": (0.0, 100.0),
    "top_p": (1e-9, 1.0),
    "min_p": (0.0, 1.0),
    "repetition_penalty": (0.01, 100.0),
}
_INTS = ("top_k", "max_new_tokens")


def read_sampling_defaults(model_dir: str | Path) -> dict[str, float | int]:
    """The sampling defaults ``model_dir/generation_config.json`` sets (empty when it has
    none, or the file is missing or unreadable)."""
    path = Path(model_dir) / "generation_config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    return sampling_defaults(data) if isinstance(data, dict) else {}


def sampling_defaults(config: dict[str, Any]) -> dict[str, float | int]:
    """The sampling defaults in a parsed ``generation_config.json``."""
    defaults: dict[str, float | int] = {}
    for key, (low, high) in _FLOATS.items():
        value = _number(config.get(key))
        if value is not None and low <= value <= high:
            defaults[key] = value
    for key in _INTS:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            defaults[key] = value
    if config.get("do_sample") is False:
        defaults["temperature"] = 0.0
    return defaults


def _number(value: object) -> float | None:
    """``value`` as a finite float, else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None
