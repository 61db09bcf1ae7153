"""How far `swiftclient bench`'s figures are from the truth, and what the tool costs.

A fake provider in its own process is scripted to a 200 ms time to first token and 20 ms
between tokens (10 tokens per reply). `swiftclient bench` runs against it, as a user runs
it (a child process, `--json`), at concurrency 1, 64 and 512. For each level it prints the
measured p50 and p99 of TTFT and ITL beside the scripted values, and the bench process's own
CPU: seconds of CPU per second of the run (the share of one core the client used) and per
streamed chunk. Whatever the fake or the machine adds shows up as error too, so the figures
are an upper bound on the tool's own distortion.

    .venv/bin/python bench/cli_accuracy.py           # c=1,64,512, about a minute
    .venv/bin/python bench/cli_accuracy.py --quick   # c=1,8, a few seconds (tests)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _util import markdown_table  # noqa: E402

TTFT = 0.2
ITL = 0.02
TOKENS = 10


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("SWIFTCLIENT_", "OPENAI_"))}


def _bench(url: str, level: int, requests: int, out: Path) -> tuple[Any, float]:
    """Run one level; return the JSON document and the child's CPU seconds."""
    before = _children_cpu()
    subprocess.run(
        [sys.executable, "-m", "swiftclient.cli", "bench", "--base-url", url, "-m", "fake"]
        + ["-c", str(level), "-n", str(requests), "--output-tokens", str(TOKENS)]
        + ["--json", str(out)],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=_env(),
    )
    return json.loads(out.read_text()), _children_cpu() - before


def _baseline_cpu() -> float:
    """CPU of starting the command line and doing nothing (imports), to subtract."""
    before = _children_cpu()
    subprocess.run(
        [sys.executable, "-c", "import swiftclient.cli._bench, rich.table, rich.progress"],
        check=True,
        env=_env(),
    )
    return _children_cpu() - before


def main() -> int:
    """Measure and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: c=1,8")
    parser.add_argument(
        "--server-loop",
        choices=("asyncio", "uvloop"),
        default="uvloop",
        help="the fake's event loop: uvloop leaves more of the machine to the client",
    )
    args = parser.parse_args()
    levels = [(1, 8), (8, 16)] if args.quick else [(1, 32), (64, 256), (512, 1024)]
    fake = subprocess.Popen(
        [sys.executable, "-m", "swiftclient.testing", "--port", "0", "--loop", args.server_loop]
        + ["--ttft", str(TTFT), "--token-delay", str(ITL), "--tokens", str(TOKENS)],
        stdout=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    rows = []
    try:
        assert fake.stdout is not None
        url = fake.stdout.readline().rsplit(" ", 1)[1].strip()
        baseline = _baseline_cpu()
        with tempfile.TemporaryDirectory() as tmp:
            for level, requests in levels:
                data, cpu = _bench(url, level, requests, Path(tmp) / "out.json")
                (summary,) = data["summary"]
                samples = data["samples"]
                chunks = sum(len(s["itl"]) + 1 for s in samples)
                cpu -= baseline
                ttft, itl = summary["ttft"], summary["itl"]
                rows.append(
                    [
                        f"c={level}",
                        summary["requests"],
                        f"{(ttft['p50'] - TTFT) * 1000:+.1f}",
                        f"{(ttft['p99'] - TTFT) * 1000:+.1f}",
                        f"{(itl['p50'] - ITL) * 1000:+.2f}",
                        f"{(itl['p99'] - ITL) * 1000:+.2f}",
                        f"{cpu / summary['duration']:.2f}",
                        f"{cpu / chunks * 1e6:.0f}",
                    ]
                )
    finally:
        fake.send_signal(signal.SIGINT)
        fake.wait(timeout=60)
    print(f"scripted: TTFT {TTFT * 1000:g} ms, ITL {ITL * 1000:g} ms, {TOKENS} tokens per reply")
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}\n")
    headers = [
        "level",
        "requests",
        "TTFT p50 error ms",
        "TTFT p99 error ms",
        "ITL p50 error ms",
        "ITL p99 error ms",
        "client CPU (cores)",
        "client CPU µs/chunk",
    ]
    print(markdown_table(headers, rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
