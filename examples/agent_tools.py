"""A multi-turn tool-calling agent loop.

The model asks for tools, the loop runs them and sends the results back, until the model
answers in text. The turns live in a :class:`~swiftclient.Conversation`: append-only, so
every request resends the previous one's prompt byte for byte and the provider can serve it
from its prompt cache (``conversation.last_break`` says where a turn broke that, and
``client.cache_stats()`` how much was cached). With no provider configured it runs against
swiftclient's loopback fake provider, scripted to behave like a tool-using model, so the
example runs anywhere.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import anyio

from swiftclient import AsyncClient, Conversation, HTTPBackend
from swiftclient.testing import FakeProvider, Reply

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


def get_weather(city: str) -> dict[str, Any]:
    """A stand-in tool: a real agent would call a weather API here."""
    return {"city": city, "celsius": 21.5, "sky": "clear"}


REGISTRY: dict[str, Callable[..., Any]] = {"get_weather": get_weather}


SYSTEM = "You are a concise assistant. Use the tools for facts you do not know."


async def run_agent(client: AsyncClient, question: str, max_turns: int = 5) -> str:
    """Loop until the model answers without calling a tool."""
    conversation = Conversation(SYSTEM, tools=TOOLS)
    conversation.user(question)
    for _ in range(max_turns):
        completion = await conversation.send(client)  # the reply is appended
        if conversation.last_break is not None:
            print(f"prompt cache: {conversation.last_break}")
        calls = completion.tool_calls
        if not calls:
            return completion.text
        for call in calls:
            result = REGISTRY[call.function.name](**json.loads(call.function.arguments))
            print(f"tool {call.function.name}({call.function.arguments}) -> {result}")
            conversation.tool_result(call.id, result)
    raise RuntimeError("the agent did not finish within max_turns")


async def main() -> None:
    question = "What's the weather in Paris?"
    if os.environ.get("OPENAI_API_KEY") or os.environ.get("SWIFTCLIENT_PROVIDER"):
        async with AsyncClient(model=os.environ.get("SWIFTCLIENT_MODEL", "gpt-4o-mini")) as client:
            print(await run_agent(client, question))
        return
    async with FakeProvider() as fake:
        fake.script(
            Reply(tool_calls=(("get_weather", {"city": "Paris"}),)),
            Reply(text="It is 21.5 °C and clear in Paris."),
        )
        async with AsyncClient(
            HTTPBackend(fake.base_url, name="fake"), model="fake-model"
        ) as client:
            print(await run_agent(client, question))


if __name__ == "__main__":
    anyio.run(main)
