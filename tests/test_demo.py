"""`make demo` (examples/stream_chat.py): offline on the embedded model unless a provider is
named with SWIFTCLIENT_DEMO_PROVIDER, and a provider's failure is one line, not a traceback."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import pytest

from local_engine.builtin_tools import TOOLS, run_tool
from swiftclient.testing import FakeProvider, Reply

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "examples" / "stream_chat.py"
PROVIDER_VARIABLES = (
    "SWIFTCLIENT_DEMO_PROVIDER",
    "SWIFTCLIENT_PROVIDER",
    "SWIFTCLIENT_BASE_URL",
    "SWIFTCLIENT_API_KEY",
    "SWIFTCLIENT_MODEL",
    "OPENAI_BASE_URL",
    "OPENAI_API_KEY",
)
STALE_KEY = "sk-stale0123456789abcdef"


def _demo(*questions: str, env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k not in PROVIDER_VARIABLES}
    return subprocess.run(
        [sys.executable, str(DEMO), *questions],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
        env={**environ, **env},
    )


@contextmanager
def _refusing_port() -> Iterator[int]:
    """A loopback port bound but not listening: every connection to it is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


def test_the_demo_runs_offline_with_provider_variables_in_the_shell() -> None:
    """Issue 22: with OPENAI_API_KEY in the shell the demo went to api.openai.com (a stale
    key ended in a traceback; a real one would have made billed calls). Every provider
    variable here points at a refusing port, so any request sent would fail the run."""
    with _refusing_port() as port:
        url = f"http://127.0.0.1:{port}/v1"
        env = {
            "OPENAI_API_KEY": STALE_KEY,
            "OPENAI_BASE_URL": url,
            "SWIFTCLIENT_PROVIDER": "openai",
            "SWIFTCLIENT_BASE_URL": url,
        }
        done = _demo("What's the weather in Oslo?", env=env)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    first, note = out.splitlines()[:2]
    assert first.startswith("Backend: the local engine, running offline on the embedded model")
    assert "swift-tiny" in first and "SWIFTCLIENT_DEMO_PROVIDER" in first
    assert note.startswith("(OPENAI_API_KEY, OPENAI_BASE_URL, SWIFTCLIENT_PROVIDER, ")
    assert "not used" in note and STALE_KEY not in out + done.stderr
    # The loop: the model calls the weather tool, the tool's result goes back, an answer
    # streams in, each model call with its timing. (Whether the model copies the city right
    # is its accuracy, measured by scripts/eval_default_model.py.)
    assert "assistant: <tool call> get_weather(" in out, out
    (arguments,) = [
        line.split("get_weather(", 1)[1].split(")   [", 1)[0]
        for line in out.splitlines()
        if "<tool call> get_weather(" in line
    ]
    result = run_tool("get_weather", json.loads(arguments))
    assert f"tool: {json.dumps(result)}" in out, out
    assert "assistant: It is " in out, out
    assert out.count("ttft=") == 2
    assert "set-up" in out and "agent loop" in out


def test_a_provider_named_by_the_demo_variable_runs_the_loop() -> None:
    with FakeProvider(api_key="right-key", model="served-model").run_in_thread() as fake:
        fake.script(
            Reply(tool_calls=[("get_weather", {"city": "Paris"})]),
            Reply(text="It is mild in Paris."),
        )
        env = {
            "SWIFTCLIENT_DEMO_PROVIDER": fake.base_url,
            "SWIFTCLIENT_API_KEY": "right-key",
            "OPENAI_API_KEY": STALE_KEY,  # not this one: the variable names the key
        }
        done = _demo("What's the weather in Paris?", env=env)
        chats = [r.body for r in fake.requests if r.path.endswith("/chat/completions")]
    assert done.returncode == 0, done.stderr
    first = done.stdout.splitlines()[0]
    # the model is the one the server lists, and a server of yours is not said to bill
    assert first == f"Backend: {fake.base_url} (SWIFTCLIENT_DEMO_PROVIDER), model served-model."
    assert [body["model"] for body in chats] == ["served-model", "served-model"]
    # the tools in the order the embedded model knows (served by `swiftclient serve`, it
    # answered nonsense to them sorted by name, the canonical order)
    assert [tool["function"]["name"] for tool in chats[0]["tools"]] == list(TOOLS)
    assert "tool: " in done.stdout and "assistant: It is mild in Paris." in done.stdout


@pytest.mark.parametrize("failure", ["refused connection", "401"])
def test_a_failing_provider_is_one_line_that_says_what_to_do(failure: str) -> None:
    if failure == "401":
        with FakeProvider(api_key="right-key").run_in_thread() as fake:
            env = {
                "SWIFTCLIENT_DEMO_PROVIDER": fake.base_url,
                "SWIFTCLIENT_API_KEY": STALE_KEY,
                "SWIFTCLIENT_MODEL": "m",
            }
            done = _demo("What's the weather in Paris?", env=env)
        expected = (
            f"{fake.base_url} refused the API key (HTTP 401): set a valid SWIFTCLIENT_API_KEY"
        )
    else:
        with _refusing_port() as port:
            url = f"http://127.0.0.1:{port}/v1"
            done = _demo(env={"SWIFTCLIENT_DEMO_PROVIDER": url, "SWIFTCLIENT_API_KEY": STALE_KEY})
        expected = f"cannot reach {url} (APIConnectionError: "
    assert done.returncode == 1
    (line,) = [line for line in done.stderr.splitlines() if line.strip()]
    assert line.startswith(f"demo: error: {expected}"), line
    assert line.endswith("or unset SWIFTCLIENT_DEMO_PROVIDER to run offline on the embedded model")
    assert "Traceback" not in done.stdout + done.stderr
    assert STALE_KEY not in done.stdout + done.stderr
