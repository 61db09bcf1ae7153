"""``swiftclient chat``: one prompt, or a multi-turn conversation, with a timing line."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import signal
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, TextIO

import anyio
import anyio.from_thread
import click
import pydantic

from .._client import AsyncClient
from ..errors import AuthenticationError, ConfigurationError, SwiftClientError
from ..providers import BuiltinTools, local_tools
from ..types import ChatCompletion, Message, Timing
from ._common import (
    EXIT_USAGE,
    POSITIVE_DURATION,
    CLIError,
    Target,
    TargetOptions,
    build_target,
    options_from,
    target_options,
)

__all__ = ["chat", "timing_line"]

_EXAMPLES = """\b
Examples:
  swiftclient chat --base-url http://127.0.0.1:8000/v1 -m default "Say hello"
  swiftclient chat --local "What can you do?"         (the embedded tiny model)
  swiftclient chat --local -m ./Qwen3-0.6B "Write a haiku about caches"
  echo "Summarize this" | swiftclient chat -m gpt-4o-mini --system "Be brief"
  swiftclient chat --local            (a conversation: Ctrl-C stops a reply, Ctrl-D quits)
  swiftclient chat -m gpt-4o-mini --json "hi" | jq .choices[0].message.content
  swiftclient chat --local --builtin-tools "What's the weather in Paris?"
"""
_INTERACTIVE_HINT = "(a conversation: Ctrl-C stops a reply, Ctrl-D or /exit quits)"
MAX_TOOL_ROUNDS = 4
"""Most replies with tool calls answered in one turn (--builtin-tools); then the model is
asked once more without tools."""

_TIMING = pydantic.TypeAdapter(Timing)  # --json: a reply's timing, as JSON


def timing_line(completion: ChatCompletion) -> str:
    """``ttft 201.3 ms · itl p50 20.1 ms · 49.7 tok/s · 32 tokens in 0.82 s``.

    tok/s counts the tokens after the first over the time after the first token; ``-``
    when the reply came in one chunk (a tool call the server sends whole, say), where no
    decoding time was seen.
    """
    timing = completion.timing
    if timing is None or timing.total is None:
        return "no timing"
    usage = completion.usage
    tokens = usage.completion_tokens if usage is not None else len(timing.itl) + 1
    parts = []
    if timing.ttft is not None:
        parts.append(f"ttft {timing.ttft * 1000:.1f} ms")
        itl = timing.itl_p50
        parts.append(f"itl p50 {itl * 1000:.1f} ms" if itl is not None else "itl p50 -")
        decode = timing.total - timing.ttft
        rate = (tokens - 1) / decode if tokens > 1 and decode > 0 and timing.itl else None
        parts.append(f"{rate:.1f} tok/s" if rate is not None else "- tok/s")
    parts.append(f"{tokens} tokens in {timing.total:.2f} s")
    return " · ".join(parts)


@dataclass(slots=True)
class _Conversation:
    client: AsyncClient
    model: str
    params: dict[str, Any]
    as_json: bool
    out: TextIO
    tools: BuiltinTools | None = None
    """Offered with every request; the model's calls to them run here (--builtin-tools)."""
    history: list[Message] = field(default_factory=list)

    async def turn(self, prompt: str) -> ChatCompletion:
        """Send the history plus ``prompt``; the reply joins the history once complete.

        With tools, each reply that calls them is answered with the calls' results (shown on
        stderr with the reply's timing) and the model asked again, up to
        :data:`MAX_TOOL_ROUNDS` times; the last reply is returned. Calls cut short by the
        token limit (``finish_reason`` "length") are not run: stderr says so.
        """
        messages = [*self.history, Message(role="user", content=prompt)]
        params = dict(self.params)
        if self.tools is not None:
            params["tools"] = list(self.tools.definitions.values())
        for _ in range(MAX_TOOL_ROUNDS):
            completion = await self._ask(messages, params)
            if self.tools is None or not completion.tool_calls:
                break
            if completion.finish_reason == "length":
                names = ", ".join(call.function.name for call in completion.tool_calls)
                print(
                    f"[tool] not run: the reply reached its token limit inside a call to "
                    f"{names}; raise --max-tokens",
                    file=sys.stderr,
                    flush=True,
                )
                if self.as_json:  # the reply is the turn's document (it was held back)
                    self._write_json(completion)
                break
            _report(completion)
            messages.append(Message.model_validate(completion.choices[0].message))
            messages.extend(self._run_tools(self.tools, completion))
        else:
            completion = await self._ask(messages, self.params)  # no tools: it must answer
        self.history = [*messages, Message(role="assistant", content=completion.text)]
        return completion

    async def _ask(self, messages: list[Message], params: dict[str, Any]) -> ChatCompletion:
        """One model call: printed as JSON (unless it calls tools that run here: then only
        its stderr lines show it, so stdout holds one document), or its text streamed."""
        if self.as_json:
            completion: ChatCompletion = await self.client.chat(
                messages, model=self.model, **params
            )
            if "tools" not in params or not completion.tool_calls:
                self._write_json(completion)
        else:
            wrote = ""  # the last text written
            try:
                async with self.client.stream(messages, model=self.model, **params) as stream:
                    async for text in stream.text():
                        self.out.write(text)
                        self.out.flush()
                        wrote = text or wrote
                    completion = await stream.final()
            except Exception:
                if wrote and not wrote.endswith("\n"):  # the error's line starts its own
                    self.out.write("\n")
                    self.out.flush()
                raise
            if wrote or not completion.tool_calls:
                self.out.write("\n")
        self.out.flush()
        if not completion.tool_calls and completion.finish_reason == "length":
            print(
                "[the reply was cut off at its token limit; raise --max-tokens]"
                if completion.text
                else "[the reply reached its token limit before any text; raise --max-tokens]",
                file=sys.stderr,
                flush=True,
            )
        return completion

    def _write_json(self, completion: ChatCompletion) -> None:
        """The reply as one JSON document on stdout (with its timing)."""
        body = completion.model_dump(mode="json", exclude_none=True)
        if completion.timing is not None:
            body["timing"] = _TIMING.dump_python(
                completion.timing, mode="json", exclude={"attempts"}
            )
        self.out.write(json.dumps(body, indent=2) + "\n")
        self.out.flush()

    @staticmethod
    def _run_tools(tools: BuiltinTools, completion: ChatCompletion) -> list[Message]:
        """Run the reply's tool calls; their results as ``tool`` messages (a call that fails
        answers ``{"error": ...}``, as an agent loop would send it back)."""
        results = []
        for call in completion.tool_calls:
            name, arguments = call.function.name, call.function.arguments
            try:
                parsed = json.loads(arguments)
                if not isinstance(parsed, dict):
                    raise ValueError("the arguments are not a JSON object")
                result: dict[str, Any] = tools.run(name, parsed)
            except ValueError as exc:  # json.JSONDecodeError is one too
                result = {"error": str(exc)}
            content = json.dumps(result, ensure_ascii=False)
            print(f"[tool] {name}({arguments}) -> {content}", file=sys.stderr, flush=True)
            results.append(Message(role="tool", tool_call_id=call.id, content=content))
        return results


_NO_MODEL = "no model given: pass --model NAME or set SWIFTCLIENT_MODEL"
_LISTED_AT_MOST = 20


def _only_model(options: TargetOptions) -> str:
    """The model to use when none is given: the backend's only one (said on stderr), else a
    usage error that names the models it lists, or says why they could not be listed."""
    backend = build_target(options, need_model=False).backend  # its own, closed here
    lister = getattr(backend, "list_models", None)
    if lister is None:
        raise CLIError(f"{_NO_MODEL} (`swiftclient models` lists what it offers)", EXIT_USAGE)

    async def fetch() -> list[str]:
        try:
            # One model served under two names (the local server's "default") is one model.
            names: list[str] = await lister(aliases=False)
        finally:
            await backend.aclose()
        return names

    try:
        names = anyio.run(fetch)
    except AuthenticationError:
        raise  # the key is what to fix, not the model (said as any call's 401 is)
    except SwiftClientError as exc:
        reason = " ".join(str(exc).split()).rstrip(".")
        raise CLIError(
            f"{_NO_MODEL} (the backend's model list could not be read: {reason}; "
            "`swiftclient models` lists what it offers)",
            EXIT_USAGE,
        ) from exc
    if len(names) == 1:
        print(
            f"swiftclient: no model given; using {names[0]}, the only one "
            f"{options.describe()} lists",
            file=sys.stderr,
            flush=True,
        )
        return names[0]
    if not names:
        raise CLIError(f"{_NO_MODEL} (the backend lists no model)", EXIT_USAGE)
    shown = ", ".join(names[:_LISTED_AT_MOST])
    if len(names) > _LISTED_AT_MOST:
        shown += f" and {len(names) - _LISTED_AT_MOST} more (`swiftclient models` lists all)"
    raise CLIError(f"{_NO_MODEL}; the backend lists {len(names)} models: {shown}", EXIT_USAGE)


def _report(completion: ChatCompletion) -> None:
    print(f"[{timing_line(completion)}]", file=sys.stderr, flush=True)


async def _one_shot(
    target: Target,
    prompt: str,
    system: str | None,
    params: dict[str, Any],
    as_json: bool,
    tools: BuiltinTools | None,
) -> int:
    async with AsyncClient(target.backend, model=target.model) as client:
        conversation = _Conversation(client, target.model, params, as_json, sys.stdout, tools)
        if system:
            conversation.history.append(Message(role="system", content=system))
        completion = await conversation.turn(prompt)
    _report(completion)
    return 0


def _read_line() -> str | None:
    if sys.stdin.isatty():
        sys.stderr.write("> ")
        sys.stderr.flush()
    line = sys.stdin.readline()
    return None if line == "" else line.rstrip("\n")


def _start_turn(
    portal: anyio.from_thread.BlockingPortal, conversation: _Conversation, line: str
) -> tuple[concurrent.futures.Future[ChatCompletion], bool]:
    """Start a reply in the portal; True beside it when Ctrl-C came while it was starting.

    The reply's task can run (and print) before ``start_task_soon`` returns here, so a
    Ctrl-C in that moment would interrupt this thread with no future to cancel; it is held
    back until the future exists and reported to the caller instead.
    """
    if threading.current_thread() is not threading.main_thread():
        return portal.start_task_soon(conversation.turn, line), False
    stopped: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: stopped.append(signum))
    try:
        future = portal.start_task_soon(conversation.turn, line)
    finally:
        signal.signal(signal.SIGINT, previous)
    return future, bool(stopped)


def _interactive(
    target: Target,
    system: str | None,
    params: dict[str, Any],
    as_json: bool,
    tools: BuiltinTools | None,
) -> int:
    """Read a prompt, stream the reply, repeat. Ctrl-C during a reply stops that reply."""
    if sys.stdin.isatty():
        try:
            import readline  # noqa: F401  (line editing and history for input on a terminal)
        except ImportError:  # pragma: no cover - not on every platform
            pass
    print(f"chatting with {target.model} {_INTERACTIVE_HINT}", file=sys.stderr, flush=True)
    client = AsyncClient(target.backend, model=target.model)
    with (
        anyio.from_thread.start_blocking_portal() as portal,
        portal.wrap_async_context_manager(client),
    ):
        conversation = _Conversation(client, target.model, params, as_json, sys.stdout, tools)
        if system:
            conversation.history.append(Message(role="system", content=system))
        while True:
            try:
                line = _read_line()
            except KeyboardInterrupt:
                print(f"\n{_INTERACTIVE_HINT}", file=sys.stderr, flush=True)
                continue
            if line is None or line.strip() in ("/exit", "/quit"):
                if line is None:
                    print(file=sys.stderr)
                return 0
            if not line.strip():
                continue
            future, stopped = _start_turn(portal, conversation, line)
            try:
                if stopped:
                    raise KeyboardInterrupt
                completion = future.result()
            except KeyboardInterrupt:
                future.cancel()
                print("\n[reply stopped]", file=sys.stderr, flush=True)
                continue
            except concurrent.futures.CancelledError:
                print("\n[reply stopped]", file=sys.stderr, flush=True)
                continue
            except ConfigurationError:
                raise
            except SwiftClientError as exc:  # this turn failed; the conversation goes on
                reason = " ".join(f"{type(exc).__name__}: {exc}".split())
                print(
                    f"swiftclient: error: {reason} (this turn was not kept; /exit quits)",
                    file=sys.stderr,
                    flush=True,
                )
                continue
            _report(completion)


@click.command(epilog=_EXAMPLES, short_help="Chat with a model: one prompt, or a conversation.")
@click.argument("prompt", required=False)
@target_options
@click.option("--system", "-s", metavar="TEXT", help="System prompt.")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the completion as JSON (with its timing) instead of streaming text.",
)
@click.option(
    "--max-tokens",
    type=click.IntRange(min=1),
    help="Most tokens to generate (default: the server's; 4096 for Anthropic's API, which "
    "requires one).",
)
@click.option(
    "--temperature", type=click.FloatRange(0.0, 2.0), help="Sampling temperature (0 to 2)."
)
@click.option(
    "--timeout",
    **POSITIVE_DURATION,
    help="Time limit for each reply (e.g. 30s; default: the client's).",
)
@click.option(
    "--interactive",
    "-i",
    is_flag=True,
    help="Hold a conversation even when stdin is not a terminal (one prompt per line).",
)
@click.option(
    "--builtin-tools",
    is_flag=True,
    help="Offer the local engine's three built-in tools (a weather stand-in, unit "
    "conversion, a calculator; the 'local' extra) and run the model's calls to them; each "
    "call and its result is shown on stderr.",
)
def chat(
    prompt: str | None,
    system: str | None,
    as_json: bool,
    max_tokens: int | None,
    temperature: float | None,
    timeout: float | None,
    interactive: bool,
    builtin_tools: bool,
    **kwargs: Any,
) -> int:
    """Send PROMPT and stream the reply, then a one-line timing summary on stderr.

    With no PROMPT: a prompt piped on stdin is read whole, and on a terminal a conversation
    starts (history kept; Ctrl-C stops the current reply, Ctrl-D or /exit quits).
    """
    if prompt is not None and not prompt.strip():  # as an empty stdin is
        raise CLIError("no prompt: the PROMPT argument is empty", EXIT_USAGE)
    options = options_from(kwargs)
    # The built-in tools go in their own order, not sorted by name as the canonical form
    # would send them: the embedded model, behind `swiftclient serve`, knows them that way
    # (sorted, it answered nonsense), and a fixed list is byte-stable as it is.
    http = {"canonical": False} if builtin_tools else None
    target = build_target(options, need_model=False, http=http)
    if not target.model:
        target = dataclasses.replace(target, model=_only_model(options))
    params: dict[str, Any] = {}
    if max_tokens is not None:
        params["max_tokens"] = max_tokens
    if temperature is not None:
        params["temperature"] = temperature
    if timeout is not None:
        params["timeout"] = timeout
    if prompt is None and not interactive and not sys.stdin.isatty():
        prompt = sys.stdin.read().strip()
        if not prompt:
            raise CLIError("no prompt: give one as an argument or on stdin", EXIT_USAGE)
    tools = local_tools() if builtin_tools else None
    if prompt is None:
        return _interactive(target, system, params, as_json, tools)
    return anyio.run(_one_shot, target, prompt, system, params, as_json, tools)
