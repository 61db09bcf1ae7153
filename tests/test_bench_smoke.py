"""The benchmarks still run (smoke runs: no speed is asserted, only that they measure)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def bench_run(script: str, *args: str) -> str:
    """Run ``bench/<script> <args>`` and return what it printed."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *args],
        capture_output=True,
        text=True,
        timeout=240,
        check=True,
        cwd=ROOT,
    )
    return out.stdout


def quick_run(script: str) -> str:
    """Run ``bench/<script> --quick`` and return what it printed."""
    return bench_run(script, "--quick")


def test_client_overhead_quick_run_prints_its_tables() -> None:
    text = quick_run("client_overhead.py")
    for peer in ("swiftclient", "openai", "raw httpx", "raw aiohttp"):
        assert peer in text
    assert "µs/chunk" in text and "vs aiohttp" in text
    assert "swiftclient.Client" in text and "openai.OpenAI" in text
    for config in ("telemetry off", "no SDK", "SDK, no-op exporter"):
        assert config in text
    for peer in ("anthropic SDK, messages.stream", "openai SDK, responses.stream"):
        assert peer in text


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


def test_fp8_check_smoke_runs_on_cpu() -> None:
    """bench/fp8_check.py --smoke: the rowwise contract holds at every projection shape and
    the engine's fp8 (through torch's CPU ``_scaled_mm``) loses no more than the emulation."""
    out = bench_run("fp8_check.py", "--smoke", "--prompts", "2")
    contract = out.split("## 1.")[1].split("## 2.")[0]
    assert contract.count("| PASS") == 12 and "FAIL" not in contract
    for row in ("engine fp8 vs engine bf16", "fp8 emulation (float32) vs transformers float32"):
        assert row in out
    sound = next(line for line in out.splitlines() if "loses no more than the method" in line)
    assert sound.endswith(": PASS"), sound


def test_cli_accuracy_quick_run_prints_the_error_table() -> None:
    text = quick_run("cli_accuracy.py")
    assert "| c=1 " in text and "| c=8 " in text and "TTFT p50 error ms" in text


def test_gpu_check_smoke_runs_on_cpu() -> None:
    """bench/gpu.py --smoke: every part runs on a tiny model on CPU, and float32 greedy
    decoding agrees with transformers."""
    out = bench_run("gpu.py", "--smoke")
    for heading in ("0. Correctness", "W1: batch-1 decode", "W2: 6 sequences", "W3: shared", "W4"):
        assert heading in out
    greedy = out.split("float32 greedy")[1].split("\n\n")[1]
    assert greedy.count("| PASS") == 2 and "FAIL" not in greedy
    for row in ("local_engine vs transformers, both bf16", "transformers eager", "miss / hit"):
        assert row in out
    same = next(line for line in out.splitlines() if line.startswith("| same tokens on and off"))
    assert "| overlap_output=True " in out and "| yes " in same
    assert "fp8 weights: not measured here" in out
    features = out.split("5. CUDA graphs, grammar and speculative decoding")[1]
    assert "CUDA graphs: not measured here" in features
    for table in ("| grammar requests ", "| speculative (n-gram) "):
        row = features.split(table)[1].splitlines()[2]
        assert row.split("|")[-2].strip() == "PASS", row


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


def test_engine_cpu_n_quick_run_prints_its_row() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "engine_cpu.py"), "--only", "n", "--quick"]
        + ["--reps", "1", "--threads", "1"],
        capture_output=True,
        text=True,
        timeout=240,
        check=True,
        cwd=ROOT,
    )
    rows = [line for line in out.stdout.splitlines() if line.startswith("| n=4, prompt")]
    assert [row.split("|")[1].strip() for row in rows] == [
        "n=4, prompt 512, 8 new tokens each",
        "n=4, prompt 128, 8 new tokens each",
    ]
    # prompt tokens computed per round (n=4 / 4 requests / 4 requests without the prefix
    # cache): the choices share all but the last block (16 tokens); prompts this short fit one
    # step's token budget, so the four requests compute the prompt four times on both engines
    assert [row.split("|")[7].strip() for row in rows] == [
        "560 / 2048 / 2048",
        "176 / 512 / 512",
    ]


def test_engine_breakdown_quick_run_prints_both_workloads() -> None:
    text = quick_run("engine_breakdown.py")
    for label in ("2a, equal outputs", "2b, mixed outputs"):
        assert f"- {label}: engine best" in text
    assert text.count("of its matmul-plus-attention ceiling") == 2
    assert text.count("profiled run") == 2
    assert "rest (sampling, scheduling, inputs, Python)" in text


def test_rate_limits_quick_run_prints_every_mode_and_the_goals() -> None:
    """bench/rate_limits.py --quick: client processes in each mode against the limited fake
    provider, a Redis server of its own, and the single-process CPU row."""
    text = quick_run("rate_limits.py")
    for mode in ("| off ", "| memory ", "| redis "):
        assert text.count(mode) == 2  # the fleet table and the single-process table
    assert "goodput % of L" in text and "min share / fair" in text and "p99 / unloaded" in text
    assert "Goals, Redis-shared admission at N=2:" in text
    assert text.count("PASS") + text.count("FAIL") == 5  # four fleet goals and the CPU goal
    assert "paired rounds" in text and "(alternating)" in text
    assert "admission alone, in process" in text
    assert "load average before:" in text and "load average after:" in text
