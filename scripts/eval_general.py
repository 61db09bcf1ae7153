"""The embedded model on the separate evaluation set (written apart from its training data).

Usage::

    .venv/bin/python scripts/eval_general.py                      # the shipped swift-tiny
    .venv/bin/python scripts/eval_general.py --model DIR          # a checkpoint directory
    .venv/bin/python scripts/eval_general.py --show-errors 3      # and 3 failures per task
    .venv/bin/python scripts/eval_general.py --json out.json      # every reply and verdict

It prints one row per task with the goal of issue 28 and PASS or FAIL, and exits 0 when
every goal passes, 1 otherwise. On 2 CPU cores it takes about a minute or two.

The set is ``scripts/general_eval_data.py`` (360 conversations, fixed seed; what each task
holds and how a reply is judged is said there). Every request goes through the engine's own
request path: :class:`local_engine.service.ChatService` renders it with the model's chat
template, JSON instruction and tool choice, and attaches the grammar that
``response_format`` or a forced ``tool_choice`` asks for; the engine decodes it greedily
(``temperature=0``); the reply is parsed as :class:`local_engine.backend.LocalBackend`
parses it (:func:`local_engine.chat.build_completion`). Six-turn sessions are played out:
after each reply its message goes back into the conversation as the model wrote it, a tool
call gets a scripted result, and the next request carries all of it.

Columns: ``n``; ``goal metric`` (the rate the goal is about: right call with right
arguments, result used, exact copy, valid and correctly filled, sessions with no malformed
reply); ``aux`` (a looser rate, named in the row: one well-formed call, a text reply,
schema-valid, every session turn right); ``goal`` and the verdict.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import general_eval_data as data  # noqa: E402

from local_engine.chat import build_completion  # noqa: E402
from local_engine.engine import Engine, EngineConfig  # noqa: E402
from local_engine.service import ChatService  # noqa: E402
from swiftclient.types import ChatRequest  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = REPO / "local_engine" / "models" / "swift-tiny"
# task -> (what the goal measures, the goal, the auxiliary metric and its name)
GOALS: dict[str, tuple[str, float, str, str]] = {
    "tool_call": ("right call+args", 0.90, "one_call", "one call"),
    "tool_result": ("result used", 0.90, "text", "text reply"),
    "copy": ("exact copy", 0.90, "text", "text reply"),
    "structured": ("valid+filled", 0.85, "valid", "schema-valid"),
    "session": ("no malformed", 0.95, "all_right", "all turns right"),
}
MAX_TOKENS = {"tool_call": 96, "tool_result": 96, "copy": 200, "structured": 160, "session": 160}


class Runner:
    """Prepares requests as the chat service does and decodes a batch of them greedily."""

    def __init__(self, model: Path) -> None:
        """Load the model and its chat service."""
        self.engine = Engine.from_pretrained(model, EngineConfig(seed=0))
        self.service = ChatService(self.engine)

    def run(self, bodies: Sequence[dict[str, Any]], max_tokens: Sequence[int]) -> list[data.Reply]:
        """Greedy replies to request bodies, parsed as the local backend parses them."""
        prepared = []
        for body, limit in zip(bodies, max_tokens, strict=True):
            request = ChatRequest.model_validate(
                {"model": "default", **body, "temperature": 0.0, "max_tokens": limit}
            )
            prepared.append(self.service.prepare(request))
        results = self.engine.generate(
            [p.prompt.token_ids for p in prepared], [p.params for p in prepared]
        )
        replies = []
        for p, result in zip(prepared, results, strict=True):
            completion = build_completion(
                result.text,
                model="default",
                finish_reason=result.finish_reason,
                prompt_tokens=len(result.prompt_token_ids),
                completion_tokens=len(result.token_ids),
                tool_format=p.prompt.tool_format,
                markup_format=p.prompt.markup_format,
            )
            message = completion.choices[0].message
            calls = tuple(
                (call.function.name, call.function.arguments) for call in message.tool_calls or ()
            )
            replies.append(
                data.Reply(message.content or "", calls, completion.choices[0].finish_reason or "")
            )
        return replies


@dataclass
class Session:
    """One six-turn session being played out."""

    case: data.Case
    messages: list[dict[str, Any]] = field(default_factory=list)
    turn: int = 0
    replies: list[data.Reply] = field(default_factory=list)  # of the current turn
    result: float | None = None  # the number of the current turn's last tool result
    calls: int = 0  # tool calls made in the whole session (rotates the result styles)
    problems: list[str] = field(default_factory=list)
    right: list[bool] = field(default_factory=list)
    log: list[dict[str, Any]] = field(default_factory=list)

    def body(self) -> dict[str, Any]:
        """The next request: the conversation so far, with the session's tools."""
        return {"messages": self.messages, "tools": self.case["tools"]}

    def start_turn(self) -> None:
        """Add the user message of the current turn."""
        self.messages.append({"role": "user", "content": self.case["turns"][self.turn]["user"]})
        self.replies, self.result = [], None

    def absorb(self, reply: data.Reply) -> bool:
        """Take a reply; whether the session wants another request."""
        self.replies.append(reply)
        spec = self.case["turns"][self.turn]
        problem = data.malformed(reply)
        if problem is None and len(self.replies) > data.MAX_TOOL_ROUNDS and reply.calls:
            problem = f"more than {data.MAX_TOOL_ROUNDS} tool rounds in one turn"
        if problem is None and reply.calls:
            ids = [f"call_{self.calls}_{i}" for i in range(len(reply.calls))]
            self.messages.append(
                {
                    "role": "assistant",
                    "content": reply.content or None,
                    "tool_calls": [
                        {"id": cid, "type": "function", "function": {"name": n, "arguments": a}}
                        for cid, (n, a) in zip(ids, reply.calls, strict=True)
                    ],
                }
            )
            for cid, (name, arguments) in zip(ids, reply.calls, strict=True):
                content, self.result = data.session_result(
                    self.case, name, json.loads(arguments), self.calls
                )
                self.calls += 1
                self.messages.append({"role": "tool", "tool_call_id": cid, "content": content})
            return True
        self.log.append(
            {
                "user": spec["user"],
                "replies": [[r.content, list(r.calls), r.finish_reason] for r in self.replies],
                "problem": problem,
            }
        )
        if problem is not None:
            self.problems.append(f"turn {self.turn + 1}: {problem}")
            self.right.append(False)
            return False  # a malformed reply ends the session: it failed
        self.right.append(data.check_turn(spec, self.replies, self.result))
        self.messages.append({"role": "assistant", "content": reply.content})
        self.turn += 1
        if self.turn == len(self.case["turns"]):
            return False
        self.start_turn()
        return True


def play_sessions(runner: Runner, cases: Sequence[data.Case]) -> list[dict[str, Any]]:
    """Play every session to its end, batching the sessions' next requests."""
    sessions = []
    for case in cases:
        session = Session(case)
        if case["system"]:
            session.messages.append({"role": "system", "content": case["system"]})
        session.start_turn()
        sessions.append(session)
    active = list(sessions)
    while active:
        replies = runner.run([s.body() for s in active], [MAX_TOKENS["session"]] * len(active))
        active = [s for s, r in zip(active, replies, strict=True) if s.absorb(r)]
    rows = []
    for session in sessions:
        rows.append(
            {
                "task": "session",
                "style": session.case["style"],
                "ok": not session.problems,
                "all_right": not session.problems and all(session.right),
                "problems": session.problems,
                "turns": session.log,
            }
        )
    return rows


def evaluate(model: Path) -> tuple[list[dict[str, Any]], float]:
    """Every case's verdicts (and replies); also the seconds decoding took."""
    cases = data.build()
    runner = Runner(model)
    started = time.monotonic()
    single = [c for c in cases if c["task"] != "session"]
    replies = runner.run([c["request"] for c in single], [MAX_TOKENS[c["task"]] for c in single])
    rows = []
    for case, reply in zip(single, replies, strict=True):
        rows.append(
            {
                "task": case["task"],
                "style": case["style"],
                **data.check(case, reply),
                "expected": case["expected"],
                "prompt": [m for m in case["request"]["messages"] if m["role"] == "user"][-1][
                    "content"
                ],
                "reply": [reply.content, list(reply.calls), reply.finish_reason],
            }
        )
    rows += play_sessions(runner, [c for c in cases if c["task"] == "session"])
    return rows, time.monotonic() - started


def table(rows: Sequence[dict[str, Any]]) -> tuple[str, bool]:
    """The per-task table as printed, and whether every goal passed."""
    lines = [
        f"{'task':<12}{'n':>5}  {'goal metric':<17}{'rate':>7}  {'aux':<16}{'rate':>7}"
        f"{'goal':>7}  verdict",
        "-" * 84,
    ]
    passed = True
    for task, (metric, goal, aux_key, aux_name) in GOALS.items():
        subset = [r for r in rows if r["task"] == task]
        rate = sum(r["ok"] for r in subset) / len(subset)
        aux = sum(r[aux_key] for r in subset) / len(subset)
        verdict = "PASS" if rate >= goal else "FAIL"
        passed = passed and verdict == "PASS"
        lines.append(
            f"{task:<12}{len(subset):>5}  {metric:<17}{100 * rate:>6.1f}%  {aux_name:<16}"
            f"{100 * aux:>6.1f}%{100 * goal:>6.0f}%  {verdict}"
        )
    return "\n".join(lines), passed


def styles(rows: Sequence[dict[str, Any]]) -> str:
    """The goal metric per task and style (which phrasings or formats fail), a line a task."""
    lines = []
    for task in GOALS:
        if task == "session":
            continue
        subset = [r for r in rows if r["task"] == task]
        parts = []
        for style in dict.fromkeys(r["style"] for r in subset):
            hits = [r["ok"] for r in subset if r["style"] == style]
            parts.append(f"{style} {sum(hits)}/{len(hits)}")
        lines.append(f"  {task + ':':<13}" + ", ".join(parts))
    return "by style:\n" + "\n".join(lines)


def main() -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="model directory")
    parser.add_argument("--show-errors", type=int, default=0, help="print N failures per task")
    parser.add_argument("--json", type=Path, help="write every row (replies, verdicts) here")
    args = parser.parse_args()
    rows, seconds = evaluate(args.model)
    text, passed = table(rows)
    print(text)
    print(styles(rows))
    print(f"{len(rows)} conversations (separate set, seed {data.SEED}) in {seconds:.1f}s")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1, ensure_ascii=False) + "\n")
    if args.show_errors:
        shown: dict[str, int] = {}
        for row in rows:
            if not row["ok"] and shown.get(row["task"], 0) < args.show_errors:
                shown[row["task"]] = shown.get(row["task"], 0) + 1
                if row["task"] == "session":
                    print(f"--- session: {row['problems']}")
                    for turn in row["turns"]:
                        print(f"    {turn['user']!r} -> {turn['replies']}")
                else:
                    print(f"--- {row['task']}/{row['style']}: {row['prompt']!r}")
                    print(f"    expected {json.dumps(row['expected'], ensure_ascii=False)}")
                    print(f"    got {row['reply']}")
    raise SystemExit(0 if passed else 1)


if __name__ == "__main__":
    main()
