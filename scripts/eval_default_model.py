"""Held-out accuracy of the embedded default model, per task (greedy decoding).

The held-out set is :func:`default_model_data.heldout_set` (60 conversations per generator,
1,200 in all: the first 540 from the original generators, unchanged, then the general ones,
``copy_chars``, ``structured_any``, ``greeting`` and ``tool_text`` last, so each added row
left the rows before it as they were; drawn from their own seed and excluded from
training). Each prompt goes through the engine's own request path
(:class:`local_engine.chat.ChatFormatter` with the model's chat template and the JSON
response-format instruction), is decoded greedily by the engine, and the reply is parsed as
the local backend parses it (Hermes tool calls).
Columns:

* ``exact``: the reply is exactly the expected one (a tool call with the same name and
  arguments, a JSON value equal to the expected one, or the same text).
* ``tool call``: the reply holds one well-formed tool call (tool tasks only).
* ``json``: the reply parses as JSON and has the schema's keys and types (JSON tasks only).

``structured_any`` asks for a forced tool or a JSON response format: its ``tool call`` and
``json`` columns are each over its conversations of that kind.

Usage::

    .venv/bin/python scripts/eval_default_model.py [--model DIR] [--per-task N]
    .venv/bin/python scripts/eval_default_model.py --write-fixture tests/engine/data/x.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import default_model_data as data  # noqa: E402

from local_engine.chat import ChatFormatter  # noqa: E402
from local_engine.engine import Engine, EngineConfig  # noqa: E402
from local_engine.sampling_params import SamplingParams  # noqa: E402
from local_engine.tool_calls import parse_tool_calls  # noqa: E402
from swiftclient.types import ChatRequest  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = REPO / "local_engine" / "models" / "swift-tiny"
TOOL_TASKS = ("tool_call", "tool_call_multiturn", "tool_call_general", "forced_tool")
JSON_TASKS = ("json", "json_general")
_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
}


def request(conv: dict[str, Any]) -> ChatRequest:
    """The chat request of a held-out conversation (everything but its last turn)."""
    body: dict[str, Any] = {"model": "default", "messages": conv["messages"][:-1]}
    if conv.get("tools"):
        body["tools"] = conv["tools"]
    if conv.get("response_format"):
        body["response_format"] = conv["response_format"]
    if forced_tool(conv):  # as the frameworks send it: required, or by name
        name = conv["expected"]["name"]
        body["tool_choice"] = (
            "required"
            if name == "final_result"
            else {"type": "function", "function": {"name": name}}
        )
    return ChatRequest.model_validate(body)


def forced_tool(conv: dict[str, Any]) -> bool:
    """Whether the conversation asks for structured output through a forced tool (the
    ``forced_tool`` task, and ``structured_any`` when it answers with a call)."""
    return conv["task"] == "forced_tool" or (
        conv["task"] == "structured_any" and bool(conv["messages"][-1].get("tool_calls"))
    )


def expected_schema(conv: dict[str, Any]) -> dict[str, Any]:
    """The schema a JSON answer must follow: the response format's, or the fixed one of the
    expected keys."""
    response_format = conv.get("response_format") or {}
    if response_format.get("type") == "json_schema":
        schema: dict[str, Any] = response_format["json_schema"]["schema"]
        return schema
    if conv["task"] == "json":
        return data.schema_for(conv["expected"])
    kinds = {bool: "boolean", int: "integer", float: "number", str: "string"}
    properties = {key: {"type": kinds[type(v)]} for key, v in conv["expected"].items()}
    return {"type": "object", "properties": properties, "required": list(properties)}


def schema_valid(value: Any, schema: dict[str, Any]) -> bool:
    """Whether ``value`` is an object with the schema's required keys and property types."""
    if not isinstance(value, dict) or set(schema.get("required", ())) - set(value):
        return False
    for key, item in value.items():
        spec = schema["properties"].get(key)
        if spec is None:
            return False
        types = _TYPES[spec["type"]]
        if isinstance(item, bool) and bool not in types:
            return False
        if not isinstance(item, types) or ("enum" in spec and item not in spec["enum"]):
            return False
    return True


def score(conv: dict[str, Any], text: str, tool_format: str) -> dict[str, bool]:
    """The metrics of one reply."""
    task, expected = conv["task"], conv["expected"]
    if task in TOOL_TASKS or forced_tool(conv):
        parsed = parse_tool_calls(text, "hermes" if tool_format == "hermes" else "none")
        calls = parsed.tool_calls
        well_formed = len(calls) == 1 and not (parsed.content or "").strip()
        arguments: Any = None
        if well_formed:
            try:
                arguments = json.loads(calls[0].function.arguments)
            except ValueError:
                well_formed = False
        exact = (
            well_formed
            and calls[0].function.name == expected["name"]
            and arguments == expected["arguments"]
        )
        return {"exact": exact, "tool_call": well_formed}
    if task in JSON_TASKS or conv.get("response_format"):
        try:
            value = json.loads(text)
        except ValueError:
            return {"exact": False, "json": False}
        return {"exact": value == expected, "json": schema_valid(value, expected_schema(conv))}
    return {"exact": text.strip() == expected}


def evaluate(model: Path, per_task: int) -> tuple[list[dict[str, Any]], float]:
    """Greedy replies and metrics for the held-out set; also the seconds it took."""
    seen: Counter[str] = Counter()
    convs = []
    for conv in data.heldout_set():
        seen[conv["task"]] += 1
        if seen[conv["task"]] <= per_task:
            convs.append(conv)
    engine = Engine.from_pretrained(model, EngineConfig(seed=0))
    assert engine.tokenizer is not None
    formatter = ChatFormatter(engine.tokenizer)
    prompts = [formatter.prepare(request(conv)) for conv in convs]
    params = SamplingParams(max_tokens=200, temperature=0.0)
    started = time.monotonic()
    results = engine.generate([p.token_ids for p in prompts], params)
    seconds = time.monotonic() - started
    rows = []
    for conv, prompt, result in zip(convs, prompts, results, strict=True):
        rows.append(
            {
                "task": conv["task"],
                "expected": conv["expected"],
                "reply": result.text,
                **score(conv, result.text, prompt.tool_format),
            }
        )
    return rows, seconds


def table(rows: list[dict[str, Any]]) -> str:
    """The per-task accuracy table, as printed."""
    tasks = list(dict.fromkeys(row["task"] for row in rows))
    lines = [
        f"{'task':<22}{'n':>5}{'exact':>9}{'tool call':>11}{'json':>8}",
        "-" * 55,
    ]

    def rate(subset: list[dict[str, Any]], key: str) -> str:
        measured = [r[key] for r in subset if key in r]  # structured_any: its rows of a kind
        if not measured:
            return "-"
        return f"{100 * sum(measured) / len(measured):.1f}%"

    for task in tasks:
        subset = [row for row in rows if row["task"] == task]
        lines.append(
            f"{task:<22}{len(subset):>5}{rate(subset, 'exact'):>9}"
            f"{rate(subset, 'tool_call'):>11}{rate(subset, 'json'):>8}"
        )
    total = f"{100 * sum(r['exact'] for r in rows) / len(rows):.1f}%"
    lines.append("-" * 55)
    lines.append(f"{'all':<22}{len(rows):>5}{total:>9}")
    return "\n".join(lines)


def write_fixture(path: Path, per_task: int) -> None:
    """A few held-out conversations (prompt and expected reply) for the CI test."""
    picked: list[dict[str, Any]] = []
    counts: dict[str, int] = {}
    for conv in data.heldout_set():
        if conv["task"] in ("chat", "tool_call_multiturn"):
            continue
        if counts.get(conv["task"], 0) < per_task:
            counts[conv["task"]] = counts.get(conv["task"], 0) + 1
            picked.append(conv)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(picked, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def main() -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--per-task", type=int, default=10**9)
    parser.add_argument("--show-errors", type=int, default=0, help="print N wrong replies per task")
    parser.add_argument("--write-fixture", type=Path, help="write held-out CI examples and exit")
    args = parser.parse_args()
    if args.write_fixture:
        write_fixture(args.write_fixture, 3)
        return
    rows, seconds = evaluate(args.model, args.per_task)
    print(table(rows))
    print(f"{len(rows)} held-out conversations decoded in {seconds:.1f}s")
    if args.show_errors:
        shown: dict[str, int] = {}
        for row in rows:
            if not row["exact"] and shown.get(row["task"], 0) < args.show_errors:
                shown[row["task"]] = shown.get(row["task"], 0) + 1
                print(f"--- {row['task']}: expected {json.dumps(row['expected'])}")
                print(f"    got {row['reply']!r}")


if __name__ == "__main__":
    main()
