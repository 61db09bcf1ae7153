"""`make demo` (examples/stream_chat.py) runs the offline agent loop on the embedded model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from local_engine.builtin_tools import run_tool

ROOT = Path(__file__).resolve().parent.parent
PROVIDER_VARIABLES = (
    "SWIFTCLIENT_PROVIDER",
    "SWIFTCLIENT_BASE_URL",
    "OPENAI_BASE_URL",
    "OPENAI_API_KEY",
)


def test_the_demo_calls_a_tool_and_answers_from_its_result() -> None:
    env = {k: v for k, v in os.environ.items() if k not in PROVIDER_VARIABLES}
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "stream_chat.py"), "What's the weather in Oslo?"],
        capture_output=True,
        text=True,
        timeout=240,
        check=True,
        cwd=ROOT,
        env=env,
    ).stdout
    assert "running offline on the embedded model swift-tiny" in out
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
