"""Prompt distributions for ``swiftclient bench``: synthetic, JSONL requests, ShareGPT."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pydantic

from ..types import Message
from ._common import EXIT_USAGE, CLIError

__all__ = ["BenchRequest", "Workload", "load_jsonl", "load_sharegpt", "synthetic"]

# Common short English words: each is one token in the tokenizers of the usual model
# families, so a prompt of N of them is close to N tokens.
_WORDS = (
    "the of and to in is for on that with as it was at by be this from are or have an not "
    "but all they we can which one more when will there time so some what about out up if "
    "into no them only other new like then now over also could after first use two how our "
    "work way even because any these day most us year people good just well very back down "
    "long make made part place right same set small still such take three through under"
).split()


_BY_BYTE = [_WORDS[i % len(_WORDS)] for i in range(256)]  # a random byte picks a word
PREPARED_TOKENS = 4_000_000
"""The most prompt tokens :meth:`Workload.prepare` builds ahead (some 20 MB of text)."""


def _draw(rng: random.Random, count: int) -> str:
    """``count`` words drawn by ``rng``, space-separated."""
    return " ".join(map(_BY_BYTE.__getitem__, rng.randbytes(count)))


@dataclass(frozen=True, slots=True)
class BenchRequest:
    """One request of a workload: its messages, output limit and approximate prompt size."""

    messages: tuple[Message, ...]
    max_tokens: int | None
    prompt_tokens: int
    """The prompt's size in tokens, approximated by words when no tokenizer is at hand."""


@dataclass(slots=True)
class Workload:
    """Requests by number: a list that ``at(n)`` wraps around (a dataset), or prompts made
    from their number (synthetic ones: ``fresh``, a new prompt for every number)."""

    name: str
    requests: Sequence[BenchRequest] = ()
    make: Callable[[int], BenchRequest] | None = None
    """Builds request ``n`` (synthetic prompts); ``requests`` is unused then."""
    _made: dict[int, BenchRequest] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.make is None and not self.requests:
            raise CLIError(f"the workload {self.name} holds no request", EXIT_USAGE)

    def prepare(self, numbers: range) -> None:
        """Build the requests ``numbers`` now (synthetic prompts), so that making them does
        not take the event loop's time while other requests are being measured; as many
        as :data:`PREPARED_TOKENS` tokens of prompts are kept (the rest are made when
        sent). Those of an earlier call are dropped."""
        self._made.clear()
        if self.make is None:
            return
        for number in numbers:
            request = self.make(number)
            if (len(self._made) + 1) * request.prompt_tokens > PREPARED_TOKENS:
                break
            self._made[number] = request

    @property
    def fresh(self) -> bool:
        """True when every request number has a prompt of its own (synthetic prompts)."""
        return self.make is not None

    def at(self, number: int) -> BenchRequest:
        """Request ``number``: made for it, or from the list, counting round it again past
        its end."""
        if self.make is not None:
            made = self._made.get(number)
            return made if made is not None else self.make(number)
        return self.requests[number % len(self.requests)]


def _words(text: str) -> int:
    return max(1, len(text.split()))


def synthetic(
    input_tokens: int, output_tokens: int, *, seed: int = 0, shared_prefix: int = 0
) -> Workload:
    """Prompts of about ``input_tokens`` tokens (random common words), each asking for
    ``output_tokens``. Prompt ``n`` is drawn from ``(seed, n)``: the same seed gives the same
    prompts, another seed other ones, and within a run every request number has its own
    prompt, so none is served from a prefix cache that an earlier request (or an earlier
    run with another seed) filled. The first ``shared_prefix`` tokens are the same in every
    prompt of the seed, to measure a prefix cache on purpose."""
    if input_tokens < 1 or output_tokens < 1:
        raise CLIError("--input-tokens and --output-tokens must be at least 1", EXIT_USAGE)
    if not 0 <= shared_prefix <= input_tokens:
        raise CLIError(
            f"--shared-prefix must be between 0 and --input-tokens ({input_tokens})", EXIT_USAGE
        )
    shared = _draw(random.Random(f"swiftclient-bench:{seed}:shared"), shared_prefix)
    own = input_tokens - shared_prefix

    def make(number: int) -> BenchRequest:
        words = _draw(random.Random(f"swiftclient-bench:{seed}:{number}"), own)
        message = Message(role="user", content=" ".join(part for part in (shared, words) if part))
        return BenchRequest((message,), output_tokens, input_tokens)

    name = f"synthetic {input_tokens} in / {output_tokens} out"
    if shared_prefix:
        name += f", first {shared_prefix} shared"
    return Workload(name, make=make)


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CLIError(f"cannot read {path}: {exc}", EXIT_USAGE) from exc


def _message(value: object, index: int) -> Message:
    """``messages[index]`` as a :class:`Message`; a ValueError naming what is wrong."""
    try:
        return Message.model_validate(value)
    except pydantic.ValidationError as exc:
        error = exc.errors(include_url=False, include_input=False)[0]
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error["loc"])
        raise ValueError(f"messages[{index}]{where}: {error['msg']}") from None


def load_jsonl(path: Path, *, output_tokens: int | None = None) -> Workload:
    """One chat request per line: ``{"messages": [...], "max_tokens": N}`` (an OpenAI
    request body; ``max_completion_tokens`` also counts, other fields are ignored)."""
    requests = []
    for number, line in enumerate(_read(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            body = json.loads(line)
            if not isinstance(body, dict):
                raise ValueError("not a JSON object")
            listed = body.get("messages")
            if not isinstance(listed, list) or not listed:
                raise ValueError("messages must be a non-empty list of messages")
            messages = tuple(_message(m, index) for index, m in enumerate(listed))
        except ValueError as exc:  # json.JSONDecodeError is one too
            raise CLIError(f"{path}:{number}: not a chat request: {exc}", EXIT_USAGE) from None
        limit = body.get("max_completion_tokens") or body.get("max_tokens")
        size = sum(_words(m.content) for m in messages if isinstance(m.content, str))
        requests.append(
            BenchRequest(
                messages, output_tokens or (limit if isinstance(limit, int) else None), size
            )
        )
    return Workload(f"{path.name} ({len(requests)} requests)", requests)


def load_sharegpt(path: Path, *, output_tokens: int | None = None) -> Workload:
    """A ShareGPT-style JSON list of ``{"conversations": [{"from": "human", "value": ...},
    {"from": "gpt", "value": ...}, ...]}``: the first human turn is the prompt and the reply
    after it sets the output length (in words, unless ``output_tokens`` is given)."""
    try:
        data = json.loads(_read(path))
    except ValueError as exc:
        raise CLIError(f"{path}: not JSON: {exc}", EXIT_USAGE) from None
    if not isinstance(data, list):
        raise CLIError(f"{path}: expected a JSON list of conversations", EXIT_USAGE)
    requests = []
    for item in data:
        turns = item.get("conversations") if isinstance(item, dict) else None
        if not isinstance(turns, list) or len(turns) < 2:
            continue
        first, second = turns[0], turns[1]
        if not (isinstance(first, dict) and isinstance(second, dict)):
            continue
        prompt, reply = first.get("value"), second.get("value")
        if first.get("from") not in ("human", "user") or not isinstance(prompt, str):
            continue
        if not prompt.strip() or not isinstance(reply, str):
            continue
        limit = output_tokens or _words(reply)
        message = Message(role="user", content=prompt)
        requests.append(BenchRequest((message,), limit, _words(prompt)))
    return Workload(f"{path.name} ({len(requests)} conversations)", requests)
