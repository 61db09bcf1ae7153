"""The benchmarks still run (smoke runs: no speed is asserted, only that they measure)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_client_overhead_quick_run_prints_its_tables() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "client_overhead.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=240,
        check=True,
        cwd=ROOT,
    )
    text = out.stdout
    for peer in ("swiftclient", "openai", "raw httpx", "raw aiohttp"):
        assert peer in text
    assert "µs/chunk" in text and "vs aiohttp" in text


def test_server_overhead_quick_run_compares_two_trees() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "server_overhead.py"), "--before", str(ROOT)]
        + ["--quick"],
        capture_output=True,
        text=True,
        timeout=240,
        check=True,
        cwd=ROOT,
    )
    for row in ("| fake ", "| local ", "before", "after", "CPU µs/token"):
        assert row in out.stdout
