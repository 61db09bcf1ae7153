"""The benchmarks still run (smoke runs: no speed is asserted, only that they measure)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def quick_run(script: str) -> str:
    """Run ``bench/<script> --quick`` and return what it printed."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), "--quick"],
        capture_output=True,
        text=True,
        timeout=240,
        check=True,
        cwd=ROOT,
    )
    return out.stdout


def test_client_overhead_quick_run_prints_its_tables() -> None:
    text = quick_run("client_overhead.py")
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


def test_engine_cpu_spec_quick_run_prints_both_workloads() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "engine_cpu.py"), "--only", "spec", "--quick"]
        + ["--reps", "1", "--threads", "1"],
        capture_output=True,
        text=True,
        timeout=240,
        check=True,
        cwd=ROOT,
    )
    for row in ("| copy/edit: batch-1 decode", "| non-grounded: batch-1 decode"):
        assert row in out.stdout
    assert out.stdout.count("outputs identical: yes") == 2
