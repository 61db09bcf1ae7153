"""bench/canonical_overhead.py still measures (a smoke run: no speed is asserted)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_canonical_overhead_quick_run_prints_its_table() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "canonical_overhead.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=240,
        check=True,
        cwd=ROOT,
    ).stdout
    for shape in ("plain (no tools)", "20 tools, same every call", "20 tools, order changes"):
        assert shape in out
    assert "canonical/exact" in out
