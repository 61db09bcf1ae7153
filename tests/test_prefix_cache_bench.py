"""bench/prefix_cache.py still runs (a smoke run: no speed or ratio is asserted, only that
every arm measured every request on real local engine servers)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_prefix_cache_quick_run_measures_every_arm() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "prefix_cache.py"), "--quick"]
        + ["--workloads", "c", "--replicas", "2"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
        cwd=ROOT,
    )
    rows = [line for line in out.stdout.splitlines() if line.startswith("| c ")]
    arms = [row.split("|")[4].strip() for row in rows]
    assert arms == ["naive", "swiftclient, random routing", "swiftclient"]
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert cells[1] == "2" and cells[4] == "8", row  # 2 replicas, 8 requests
        assert cells[2] == "32768", row  # (c) runs the servers with a GPU-sized step budget
        assert cells[-1] == "0", row  # no errors
        assert int(cells[5]) > 0  # the servers reported prompt tokens
    assert "mean TTFT naive / swiftclient" in out.stdout
