"""Running the command line as a user would: in this process, or as a child process."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import pytest

LIMIT = 120.0
"""Seconds any one command may take before the test fails (never reached when it works)."""


def clean_environ(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without any provider settings, plus ``extra``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SWIFTCLIENT_", "OPENAI_")) and k not in ("NO_COLOR", "FORCE_COLOR")
    }
    env.update(extra or {})
    return env


def clear_provider_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Remove every provider setting from this process's environment for one test."""
    for key in list(os.environ):
        if key.startswith(("SWIFTCLIENT_", "OPENAI_")):
            monkeypatch.delenv(key)


def command(*args: str) -> list[str]:
    """The argv that runs ``swiftclient ARGS`` with this interpreter."""
    return [sys.executable, "-m", "swiftclient.cli", *args]


def run(
    *args: str, input: str | None = None, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``swiftclient ARGS`` in a child process (stdin, stdout and stderr are pipes)."""
    return subprocess.run(
        command(*args),
        input=input if input is not None else "",
        capture_output=True,
        text=True,
        env=clean_environ(env),
        timeout=LIMIT,
    )


@contextmanager
def spawn(*args: str, stdin: int = subprocess.DEVNULL) -> Iterator[subprocess.Popen[str]]:
    """Start ``swiftclient ARGS`` with piped output; killed on the way out if still running."""
    process = subprocess.Popen(
        command(*args),
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_environ(),
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
