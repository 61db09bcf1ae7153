"""Run benchmark servers (the fake provider, the simulated provider) as separate processes.

A separate process keeps the server's CPU work off the client's GIL; on a small machine the
two still share the cores. The process is terminated (then killed) however the block exits.
"""

from __future__ import annotations

import os
import re
import select
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["fake_provider_process", "server_process"]

_STARTUP_TIMEOUT = 120.0
_URL = re.compile(r"https?://\S+")


@contextmanager
def server_process(
    argv: list[str], *, env: dict[str, str] | None = None, cwd: str | None = None
) -> Iterator[tuple[int, str]]:
    """Run ``python ARGV`` until the block exits; yield its pid and the first URL it prints."""
    proc = subprocess.Popen(
        [sys.executable, *argv],
        stdout=subprocess.PIPE,
        text=True,
        env=None if env is None else {**os.environ, **env},
        cwd=cwd,
    )
    try:
        stdout = proc.stdout
        if stdout is None:
            raise RuntimeError("the server's stdout is not a pipe")
        ready, _, _ = select.select([stdout], [], [], _STARTUP_TIMEOUT)
        line = stdout.readline() if ready else ""
        match = _URL.search(line)
        if match is None:
            raise RuntimeError(f"{argv} did not start (it printed {line!r})")
        yield proc.pid, match.group(0)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


@contextmanager
def fake_provider_process(tokens: int) -> Iterator[str]:
    """Start the fake provider on a free loopback port; yield its base URL (``.../v1``).

    Every streamed reply carries ``tokens`` content chunks plus the role, finish and usage
    chunks (the usage chunk only when the request asks for it).
    """
    argv = ["-m", "swiftclient.testing", "--port", "0", "--tokens", str(tokens)]
    with server_process(argv) as (_, url):
        yield url
