"""Stream one chat and print its timing: the project's main job (``make demo``).

With a hosted provider configured in the environment (``SWIFTCLIENT_PROVIDER=oxlo`` with
``OXLO_API_KEY``, ``SWIFTCLIENT_BASE_URL``, or ``OPENAI_API_KEY``) it streams from there.
Otherwise it runs fully offline on the bundled local engine with the embedded default model,
a tiny randomly initialized network whose output is gibberish by design: it exercises the
whole pipeline (template, tokenizer, paged KV cache, batching, streaming), not language skill.
Switching between the two is one setting.
"""

from __future__ import annotations

import os
import sys

import anyio

from swiftclient import AsyncClient


def _hosted_configured() -> bool:
    names = ("SWIFTCLIENT_PROVIDER", "SWIFTCLIENT_BASE_URL", "OPENAI_BASE_URL", "OPENAI_API_KEY")
    return any(os.environ.get(name) for name in names)


async def main() -> None:
    if _hosted_configured():
        client = AsyncClient(model=os.environ.get("SWIFTCLIENT_MODEL", "gpt-4o-mini"))
    else:
        from local_engine import LocalBackend

        print("No hosted provider configured: running offline on the embedded default model.")
        client = AsyncClient(LocalBackend(), model="default")
    messages = [
        {"role": "system", "content": "You are a concise assistant."},
        {"role": "user", "content": "In one sentence, why does streaming cut perceived latency?"},
    ]
    async with client:
        async with client.stream(messages, max_tokens=48, temperature=0.8, seed=7) as stream:
            async for text in stream.text():
                sys.stdout.write(text)
                sys.stdout.flush()
            completion = await stream.final()
    print()
    assert completion.timing is not None
    print(f"timing: {completion.timing.summary()}")
    if completion.usage is not None:
        usage = completion.usage
        print(
            f"usage: prompt={usage.prompt_tokens} completion={usage.completion_tokens} "
            f"cached={usage.cached_tokens}"
        )


if __name__ == "__main__":
    anyio.run(main)
