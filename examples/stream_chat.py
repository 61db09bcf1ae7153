"""An agent loop with streaming and timing: the project's main job (``make demo``).

A question goes to the model with three tools offered; the model calls one, the loop runs it
and sends the result back, and the model's answer streams in. Every model call prints its
timing. With a hosted provider configured in the environment (``SWIFTCLIENT_PROVIDER=oxlo``
with ``OXLO_API_KEY``, ``SWIFTCLIENT_BASE_URL``, or ``OPENAI_API_KEY``) it runs against that
provider. Otherwise it runs fully offline on the bundled local engine with the embedded
default model, ``swift-tiny``: a 3.2M-parameter model trained to call exactly these tools,
whose calls are well formed and whose arguments are right 92-100% of the time on held-out
questions (docs/local-engine.md has its measured accuracy). Switching between the two is one
setting. Pass your own questions as arguments: ``python examples/stream_chat.py "Convert 5 km
to miles"``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import anyio

from local_engine.builtin_tools import TOOLS, run_tool
from swiftclient import AssistantMessage, AsyncClient
from swiftclient.types import ChatCompletion

QUESTIONS = ("What's the weather in Paris?", "Convert 12.5 km to miles.")
MAX_TURNS = 4


def _hosted_configured() -> bool:
    names = ("SWIFTCLIENT_PROVIDER", "SWIFTCLIENT_BASE_URL", "OPENAI_BASE_URL", "OPENAI_API_KEY")
    return any(os.environ.get(name) for name in names)


def _timing(completion: ChatCompletion) -> str:
    if completion.timing is None:
        return ""
    return f"   [{completion.timing.summary()}]"


async def ask(client: AsyncClient, question: str) -> None:
    """Run the agent loop for one question, streaming each model turn."""
    tools = list(TOOLS.values())
    messages: list[AssistantMessage | dict[str, Any]] = [{"role": "user", "content": question}]
    print(f"user: {question}")
    for _ in range(MAX_TURNS):
        sys.stdout.write("assistant: ")
        async with client.stream(messages, tools=tools, temperature=0.0, max_tokens=96) as stream:
            async for text in stream.text():
                sys.stdout.write(text)
                sys.stdout.flush()
            completion = await stream.final()
        calls = completion.tool_calls
        if not calls:
            print(_timing(completion))
            return
        for call in calls:
            print(
                f"<tool call> {call.function.name}({call.function.arguments}){_timing(completion)}"
            )
        messages.append(completion.choices[0].message)
        for call in calls:
            try:
                result: Any = run_tool(call.function.name, json.loads(call.function.arguments))
            except ValueError as exc:
                result = {"error": str(exc)}
            print(f"tool: {json.dumps(result)}")
            messages.append(
                {"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)}
            )
    print("(no answer within the turn limit)")


async def main() -> None:
    """Pick the backend, then run the agent loop for each question."""
    started = time.perf_counter()
    if _hosted_configured():
        client = AsyncClient(model=os.environ.get("SWIFTCLIENT_MODEL", "gpt-4o-mini"))
    else:
        from local_engine import LocalBackend

        print("No hosted provider configured: running offline on the embedded model swift-tiny.")
        client = AsyncClient(LocalBackend(), model="default")
    async with client:
        loaded = time.perf_counter()
        for question in sys.argv[1:] or QUESTIONS:
            await ask(client, question)
    done = time.perf_counter()
    print(f"set-up {loaded - started:.2f}s, agent loop {done - loaded:.2f}s")


if __name__ == "__main__":
    anyio.run(main)
