"""An agent loop with streaming and timing: the project's main job (``make demo``).

A question goes to the model with three tools offered; the model calls one, the loop runs it
and sends the result back, and the model's answer streams in. Every model call prints its
timing. The first line says which backend and model answer.

By default it runs fully offline on the bundled local engine with the embedded default
model, ``swift-tiny``: a 2.9M-parameter model trained to call exactly these tools, whose
calls are well formed and whose arguments are right 93-100% of the time on held-out
questions and 68% on questions phrased apart from its training data (docs/local-engine.md
has its measured accuracy). Provider variables in the shell
(``OPENAI_API_KEY``, ``SWIFTCLIENT_PROVIDER``...) are NOT used: a hosted provider, whose
calls may be billed, runs only when asked for by name with ``SWIFTCLIENT_DEMO_PROVIDER``:
a preset (``openai``, ``oxlo``, ``deepseek``, ``vllm``, ``sglang``; the key from the
preset's variable, such as ``OPENAI_API_KEY``) or the URL of any OpenAI-compatible API
(the key, if it needs one, from ``SWIFTCLIENT_API_KEY``); ``SWIFTCLIENT_MODEL`` picks its
model. A failure to reach it, or a key it refuses, is one line on stderr saying what to do
(exit status 1). Pass your own questions as arguments: ``python examples/stream_chat.py
"Convert 5 km to miles"``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

import anyio

from local_engine.builtin_tools import TOOLS, run_tool
from swiftclient import AssistantMessage, AsyncClient, Backend, HTTPBackend, errors
from swiftclient.providers import PRESETS, preset
from swiftclient.types import ChatCompletion

QUESTIONS = ("What's the weather in Paris?", "Convert 12.5 km to miles.")
MAX_TURNS = 4
DEMO_PROVIDER = "SWIFTCLIENT_DEMO_PROVIDER"
"""The one variable that sends the demo to a provider (a preset name or a URL)."""
HOSTED_MODELS = {"openai": "gpt-4o-mini", "deepseek": "deepseek-chat"}
"""The model asked for when ``SWIFTCLIENT_MODEL`` is unset (elsewhere: the server's only one)."""
OFFLINE = f"unset {DEMO_PROVIDER} to run offline on the embedded model"
_IGNORED = ("OPENAI_API_KEY", "OPENAI_BASE_URL", "SWIFTCLIENT_PROVIDER", "SWIFTCLIENT_BASE_URL")


class DemoError(Exception):
    """A failure the demo reports as one line: what happened, then what to do."""


@dataclass(frozen=True)
class Hosted:
    """The provider ``SWIFTCLIENT_DEMO_PROVIDER`` names, and where its key comes from."""

    name: str
    backend: Backend
    base_url: str
    key_variable: str | None
    billed: bool

    def describe(self) -> str:
        """The provider in words (never its key)."""
        return self.base_url if self.name == self.base_url else f"{self.name} ({self.base_url})"


def _hosted(choice: str) -> Hosted:
    """The backend for ``SWIFTCLIENT_DEMO_PROVIDER=choice`` (a preset name or a URL).

    The tools go in the order given (``canonical=False``): the canonical form sorts them by
    name, and the embedded model, served by ``swiftclient serve``, was trained on them in
    their own order. The list never changes, so its bytes are stable either way."""
    if choice.startswith(("http://", "https://")):
        key = os.environ.get("SWIFTCLIENT_API_KEY")
        backend = HTTPBackend(choice, key, name="url", canonical=False)
        return Hosted(choice, backend, choice, "SWIFTCLIENT_API_KEY", billed=False)
    spec = PRESETS.get(choice)
    if spec is None:
        known = ", ".join(PRESETS)
        raise DemoError(
            f"{DEMO_PROVIDER}={choice!r} names no provider: use one of {known}, or the URL of "
            f"an OpenAI-compatible API (http://...), or {OFFLINE}"
        )
    if spec.key_required and spec.key_env and not os.environ.get(spec.key_env):
        raise DemoError(f"{choice} needs an API key: set {spec.key_env}, or {OFFLINE}")
    # The presets that need a key are the hosted, paying ones (vllm and sglang are yours).
    chosen = preset(choice, canonical=False)
    return Hosted(choice, chosen, spec.base_url, spec.key_env, spec.key_required)


def _failure(exc: errors.SwiftClientError, hosted: Hosted, model: str) -> DemoError:
    """``exc`` as one line: what happened and what to do (the server's own words are left
    out where they could echo the key)."""
    where = hosted.describe()
    if isinstance(exc, errors.AuthenticationError | errors.PermissionDeniedError):
        key = hosted.key_variable or "the API key"
        return DemoError(
            f"{where} refused the API key (HTTP {exc.status_code}): set a valid {key}, or {OFFLINE}"
        )
    if isinstance(exc, errors.NotFoundError):
        return DemoError(
            f"{where} has no model {model!r} (HTTP 404): set SWIFTCLIENT_MODEL to one it "
            f"serves, or {OFFLINE}"
        )
    detail = " ".join(str(exc).split())
    if isinstance(exc, errors.APIConnectionError):
        return DemoError(
            f"cannot reach {where} ({type(exc).__name__}: {detail}): check the address and "
            f"the network, or {OFFLINE}"
        )
    return DemoError(f"{where} failed ({type(exc).__name__}: {detail}); {OFFLINE}")


async def _model(hosted: Hosted) -> str:
    """``SWIFTCLIENT_MODEL``, else the preset's usual model, else the server's only one."""
    model = os.environ.get("SWIFTCLIENT_MODEL") or HOSTED_MODELS.get(hosted.name)
    if model:
        return model
    lister = getattr(hosted.backend, "list_models", None)
    # aliases=False: a server that lists one model under two names (swiftclient serve's
    # "default") serves one model.
    names: list[str] = await lister(aliases=False) if lister is not None else []
    if len(names) != 1:
        served = f" (it lists {', '.join(names[:10])})" if names else ""
        raise DemoError(f"set SWIFTCLIENT_MODEL to the model {hosted.describe()} serves{served}")
    return names[0]


def _timing(completion: ChatCompletion) -> str:
    if completion.timing is None:
        return ""
    return f"   [{completion.timing.summary()}]"


async def ask(client: AsyncClient, question: str, model: str | None = None) -> None:
    """Run the agent loop for one question, streaming each model turn."""
    tools = list(TOOLS.values())
    messages: list[AssistantMessage | dict[str, Any]] = [{"role": "user", "content": question}]
    print(f"user: {question}")
    for _ in range(MAX_TURNS):
        sys.stdout.write("assistant: ")
        try:
            async with client.stream(
                messages, model=model, tools=tools, temperature=0.0, max_tokens=96
            ) as stream:
                async for text in stream.text():
                    sys.stdout.write(text)
                    sys.stdout.flush()
                completion = await stream.final()
        except BaseException:
            print(flush=True)  # end the half-written line before the error's
            raise
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


def _note_ignored() -> None:
    present = [name for name in _IGNORED if os.environ.get(name)]
    if present:
        print(
            f"({', '.join(present)} set in the shell, not used: the demo uses a provider only "
            f"when {DEMO_PROVIDER} names one, e.g. {DEMO_PROVIDER}=openai)"
        )


async def _run(questions: list[str]) -> None:
    started = time.perf_counter()
    choice = os.environ.get(DEMO_PROVIDER, "").strip()
    if choice in ("", "local"):
        from local_engine import LocalBackend

        print(
            "Backend: the local engine, running offline on the embedded model swift-tiny "
            f"({DEMO_PROVIDER}=openai, or another provider, to use one)."
        )
        _note_ignored()
        client = AsyncClient(LocalBackend("default"))
        async with client:
            loaded = time.perf_counter()
            for question in questions:
                await ask(client, question)
    else:
        hosted = _hosted(choice)
        model = "?"
        try:
            async with AsyncClient(hosted.backend) as client:
                model = await _model(hosted)
                billed = "; its calls are billed to the key's account" if hosted.billed else ""
                print(f"Backend: {hosted.describe()} ({DEMO_PROVIDER}), model {model}{billed}.")
                loaded = time.perf_counter()
                for question in questions:
                    await ask(client, question, model=model)
        except errors.SwiftClientError as exc:
            raise _failure(exc, hosted, model) from None
    done = time.perf_counter()
    print(f"set-up {loaded - started:.2f}s, agent loop {done - loaded:.2f}s")


def main() -> int:
    """Pick the backend, run the agent loop for each question; returns the exit status."""
    try:
        anyio.run(_run, sys.argv[1:] or list(QUESTIONS))
    except DemoError as exc:
        print(f"demo: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("demo: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
