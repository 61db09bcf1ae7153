"""Part 5 of the GPU check: CUDA-graph capture by batch bucket, grammar-constrained decoding
and speculative decoding, on the embedded model (``swift-tiny``, which has a real tokenizer).

Each check compares the device path with a plainer one on the same device, so a wrong kernel,
a stale graph input or a mask applied to the wrong row shows as a token difference:

* graphs: the same greedy batches with CUDA graphs on and off (eager), batch sizes 1, 3 and 8;
  the graphs captured, by bucket, and how many decode steps replayed one.
* grammar: JSON-schema grammars, greedy and sampled, in one batch with an unconstrained
  request; every constrained reply that ended must parse and have the schema's keys and
  types, and every greedy one must end (a sampled one may run to ``max_tokens``).
* speculative: n-gram speculation against plain decoding on a copy prompt, greedy; the tokens
  must be equal; acceptance and decode rates printed.

Runs on CPU too (``--smoke``), where the graph rows are skipped (graphs need CUDA).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import torch
from _util import markdown_table, ratio, verdict

from local_engine.default_model import embedded_model_dir
from local_engine.engine import Engine, EngineConfig, SamplingParams
from local_engine.grammar import json_schema_grammar
from local_engine.spec import SpeculativeConfig

PROMPTS = (
    "hi",
    "What is the weather in Oslo?",
    "Repeat exactly: the seven brown boxes sat on the quiet shelf.",
    "Convert 12.5 km to miles.",
    "thank you",
    "Rename Anna to Maria: Anna went to Rome with Anna's brother.",
    "who are you",
    "good morning",
)
SCHEMAS: tuple[dict[str, Any], ...] = (
    {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "celsius": {"type": "number"},
            "sunny": {"type": "boolean"},
        },
        "required": ["city", "celsius", "sunny"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {"mood": {"type": "string", "enum": ["good", "bad", "neutral"]}},
        "required": ["mood"],
        "additionalProperties": False,
    },
)
_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
}


def _engine(device: str, **overrides: Any) -> Engine:
    config = EngineConfig(
        device=device,
        dtype="float32",
        kv_cache_memory=256 * 2**20,
        max_num_seqs=16,
        max_model_len=1024,
        seed=0,
        **overrides,
    )
    return Engine.from_pretrained(embedded_model_dir(), config)


def _prompt(eng: Engine, text: str) -> list[int]:
    assert eng.tokenizer is not None
    chat = f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"
    return eng.tokenizer.encode(chat)


def _valid(value: Any, schema: dict[str, Any]) -> bool:
    if not isinstance(value, dict) or set(value) != set(schema["required"]):
        return False
    for key, item in value.items():
        spec = schema["properties"][key]
        if isinstance(item, bool) and spec["type"] != "boolean":
            return False
        if not isinstance(item, _TYPES[spec["type"]]):
            return False
        if "enum" in spec and item not in spec["enum"]:
            return False
    return True


def check_graphs(device: str) -> None:
    """Greedy batches with graphs on and off: equal tokens; the buckets captured."""
    if device != "cuda":
        print("CUDA graphs: not measured here (they need a CUDA device)")
        return
    graphed = _engine(device)
    eager = _engine(device, cuda_graphs=False)
    graphs = graphed.runner.graphs
    if graphs is None:
        print("CUDA graphs: the engine did not turn them on (attention backend?)")
        return
    replays: Counter[int] = Counter()
    run = graphs.run

    def counted(bucket: int, rows: int, step: Any) -> torch.Tensor:
        replays[bucket] += 1
        return run(bucket, rows, step)

    graphs.run = counted  # type: ignore[method-assign]
    params = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)
    rows: list[list[object]] = []
    all_equal = True
    for batch in (1, 3, 8):
        prompts = [_prompt(graphed, text) for text in PROMPTS[:batch]]
        got = [r.token_ids for r in graphed.generate(prompts, params)]
        want = [r.token_ids for r in eager.generate(prompts, params)]
        equal = got == want
        all_equal &= equal
        rows.append([batch, sum(map(len, got)), verdict(equal)])
    print(markdown_table(["batch", "tokens", "graphs on == off"], rows))
    print(
        f"\ngraphs captured for buckets {sorted(graphs._graphs)}; decode steps replayed per "
        f"bucket: {dict(sorted(replays.items()))}; goal: replays > 0 and equal tokens: "
        f"{verdict(all_equal and sum(replays.values()) > 0)}"
    )


def check_grammar(device: str) -> None:
    """JSON-schema grammars (greedy and sampled) beside an unconstrained request."""
    eng = _engine(device)
    prompt = _prompt(eng, "Tell me about Anna, who is 31 and lives in sunny Lisbon at 24 C.")
    params: list[SamplingParams] = []
    for i, schema in enumerate(SCHEMAS * 4):
        params.append(
            SamplingParams(
                max_tokens=96,
                temperature=0.0 if i % 2 == 0 else 1.0,
                seed=i,
                grammar=json_schema_grammar(schema),
            )
        )
    params.append(SamplingParams(max_tokens=16, temperature=1.0, seed=7, ignore_eos=True))
    start = time.perf_counter()
    results = eng.generate([prompt] * len(params), params)
    seconds = time.perf_counter() - start
    valid = cut = bad_greedy = 0
    for i, (schema, result) in enumerate(zip(SCHEMAS * 4, results, strict=False)):
        if result.finish_reason == "length":  # a sampled string may run past max_tokens
            cut += 1
            bad_greedy += i % 2 == 0
            continue
        try:
            ok = result.finish_reason == "stop" and _valid(json.loads(result.text), schema)
        except ValueError:
            ok = False
        valid += ok
        bad_greedy += i % 2 == 0 and not ok
    n = len(params) - 1
    goal = valid + cut == n and bad_greedy == 0
    print(
        markdown_table(
            [
                "grammar requests",
                "ended valid",
                "cut at max_tokens",
                "unconstrained tokens",
                "seconds",
                "goal",
            ],
            [[n, valid, cut, len(results[-1].token_ids), f"{seconds:.2f}", verdict(goal)]],
        )
    )
    print("(goal: every reply that ended is valid JSON of its schema; every greedy one ended)")
    print(f"\nfirst reply: {results[0].text!r}")


def _timed(fn: Callable[[], Sequence[Any]]) -> tuple[Sequence[Any], float]:
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def check_speculative(device: str) -> None:
    """n-gram speculation against plain decoding, greedy, on copy work: equal tokens."""
    text = (
        "Repeat exactly: Maria and Tom took 7 apples, 3 pears and 12 plums to Oslo, then "
        "Maria and Tom took 7 apples, 3 pears and 12 plums back."
    )
    plain = _engine(device)
    spec = _engine(device, speculative=SpeculativeConfig(num_speculative_tokens=8))
    prompts = [_prompt(plain, text)] * 4
    params = SamplingParams(max_tokens=64, temperature=0.0)
    for eng in (plain, spec):  # warm-up: graphs, kernels
        eng.generate(prompts[:1], params)
    want, t_plain = _timed(lambda: plain.generate(prompts, params))
    got, t_spec = _timed(lambda: spec.generate(prompts, params))
    equal = [g.token_ids for g in got] == [w.token_ids for w in want]
    tokens = sum(len(r.token_ids) for r in got)
    stats = spec.spec_stats
    rate = stats.acceptance_rate if stats is not None else 0.0
    print(
        markdown_table(
            ["speculative (n-gram)", "tokens", "acceptance", "plain s", "spec s", "equal"],
            [[4, tokens, f"{rate:.2f}", f"{t_plain:.3f}", f"{t_spec:.3f}", verdict(equal)]],
        )
    )
    print(f"\nspeedup {ratio(t_plain, t_spec):.2f}x; reply: {got[0].text[:80]!r}")


def check_features(device: str) -> None:
    """Part 5: graphs, grammar and speculative decoding on ``device``."""
    check_graphs(device)
    print()
    check_grammar(device)
    print()
    check_speculative(device)
