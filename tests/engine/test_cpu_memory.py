"""The malloc settings for CPU tensors: freed memory stays for the next step, set once.

The settings hold for a whole process, so each case that applies them runs in a fresh
interpreter.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest

from local_engine.engine import EngineConfig
from swiftclient.errors import ConfigurationError

pytestmark = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
    reason="the settings are glibc's",
)

# Page faults per round of three 16 MiB tensors written and freed, before and after
# tune_malloc(): a round after the first should find its memory still mapped.
_FAULTS = """
import json, resource, torch
from local_engine.cpu_memory import malloc_tuning, tune_malloc

def faults(rounds=20):
    def once():
        a = torch.ones(4 << 20); b = torch.ones(4 << 20); c = torch.ones(4 << 20)
        del a, b, c
    once()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(rounds):
        once()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / rounds

default = faults()
first_seen = malloc_tuning()
tuning = tune_malloc()
print(json.dumps({
    "default": default,
    "tuned": faults(),
    "first_seen": first_seen is not None,
    "applied": tuning.applied,
    "same": tune_malloc() is tuning,
}))
"""

# An engine on CPU sets the allocator up unless its config says False.
_ENGINE = """
import json, sys
from pathlib import Path
import local_engine
from local_engine.cpu_memory import malloc_tuning
from local_engine.engine import Engine, EngineConfig
path = Path(local_engine.__file__).parent / "models" / "swift-tiny"
setting = json.loads(sys.argv[1])
Engine.from_pretrained(path, EngineConfig(num_blocks=8, tune_malloc=setting))
tuning = malloc_tuning()
print(json.dumps(None if tuning is None else tuning.applied))
"""


def _run(code: str, *args: str) -> object:
    out = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        check=True,
        timeout=180,
    )
    return json.loads(out.stdout)


def test_freed_tensor_memory_is_kept_for_the_next_allocation() -> None:
    report = _run(_FAULTS)
    assert isinstance(report, dict)
    assert report["first_seen"] is False  # nothing tuned the allocator before the call
    assert report["applied"] is True and report["same"] is True
    # Without the settings the heap gives the freed top back and every round faults its
    # pages in again (about 1,800 faults here); with them a round faults (almost) none.
    assert report["default"] > 200
    assert report["tuned"] < report["default"] / 10


@pytest.mark.parametrize(("setting", "expected"), [(None, True), (True, True), (False, None)])
def test_a_cpu_engine_tunes_malloc_unless_told_not_to(
    setting: bool | None, expected: bool | None
) -> None:
    assert _run(_ENGINE, json.dumps(setting)) == expected


def test_tune_malloc_is_validated() -> None:
    with pytest.raises(ConfigurationError, match="tune_malloc must be None or a bool"):
        EngineConfig(tune_malloc="yes")  # type: ignore[arg-type]
    assert EngineConfig(tune_malloc=False).tune_malloc is False
