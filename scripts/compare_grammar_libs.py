"""Measure llguidance and xgrammar on this machine: schema compile time and mask time per token.

The measurement behind the local engine's choice of grammar library (docs/architecture.md,
"Grammar-constrained decoding"). Both libraries get the same tokenizer (the embedded default
model's, or with ``--vocab N`` a byte-level BPE of about N tokens trained here on the Python
standard library's sources, for a vocabulary the size of a real model's), the same JSON
schema and the same token sequence (a valid answer, tokenized by that tokenizer). Measured:
building the library's tokenizer state, compiling the schema (up to the first mask), and the
mask time per decode step at batch 1 and at batch 32 (32 matchers in one call, one thread,
as the engine runs it), each including advancing the matchers by the step's token. Every
timing is the best of several rounds, so on a busy machine the numbers are the least
disturbed ones.

    .venv/bin/pip install xgrammar llguidance   # xgrammar is not a project dependency
    .venv/bin/python scripts/compare_grammar_libs.py [--rounds 5] [--vocab 32000]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

import torch

from local_engine.config import ModelConfig
from local_engine.default_model import ensure_default_model
from local_engine.tokenizer import Tokenizer

TYPICAL = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 40},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
        "location": {
            "type": "object",
            "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}},
            "required": ["lat", "lon"],
            "additionalProperties": False,
        },
    },
    "required": ["city", "unit", "days", "tags", "location"],
    "additionalProperties": False,
}
ANSWER = {
    "city": "Lisbon, Portugal",
    "unit": "celsius",
    "days": 7,
    "tags": ["coast", "sunny weather", "weekend"],
    "location": {"lat": 38.7223, "lon": -9.1393},
}
BATCH = 32


def best(fn: Callable[[], None], rounds: int) -> float:
    """The fastest of ``rounds`` runs of ``fn``, in seconds."""
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def measure_llguidance(tok: Tokenizer, vocab: int, eos: list[int], ids: list[int], rounds: int):
    import llguidance
    import llguidance.torch as llt

    t0 = time.perf_counter()
    lltok = llguidance.LLTokenizer(tok.backend.to_str(), n_vocab=vocab, eos_token=eos)
    tokenizer_s = time.perf_counter() - t0
    opts: Any = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}

    def compile_once() -> None:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(TYPICAL, overrides=opts)
        matcher = llguidance.LLMatcher(lltok, grammar)
        mask = llt.allocate_token_bitmask(1, vocab)
        llt.fill_next_token_bitmask(matcher, mask)  # the first mask builds the lexer
        assert not matcher.is_error(), matcher.get_error()

    compile_s = best(compile_once, rounds)
    grammar = llguidance.LLMatcher.grammar_from_json_schema(TYPICAL, overrides=opts)

    executor = llguidance.LLExecutor(num_threads=1)

    def steps(batch: int) -> float:
        matchers = [llguidance.LLMatcher(lltok, grammar) for _ in range(batch)]
        mask = llt.allocate_token_bitmask(batch, vocab)
        t0 = time.perf_counter()
        for token in ids:
            if batch == 1:
                llt.fill_next_token_bitmask(matchers[0], mask)
            else:
                llt.fill_next_token_bitmask_par(
                    executor, [(m, i) for i, m in enumerate(matchers)], mask
                )
            for m in matchers:
                if not m.consume_token(token):
                    raise RuntimeError(m.get_error())
        return time.perf_counter() - t0

    return tokenizer_s, compile_s, {b: min(steps(b) for _ in range(rounds)) for b in (1, BATCH)}


def measure_xgrammar(tok: Tokenizer, vocab: int, eos: list[int], ids: list[int], rounds: int):
    import xgrammar as xgr
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_object=tok.backend)
    t0 = time.perf_counter()
    info = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=vocab, stop_token_ids=eos)
    tokenizer_s = time.perf_counter() - t0

    def compile_once() -> None:
        compiler = xgr.GrammarCompiler(info, max_threads=2, cache_enabled=False)
        compiled = compiler.compile_json_schema(
            json.dumps(TYPICAL), any_whitespace=False, separators=(", ", ": ")
        )
        matcher = xgr.GrammarMatcher(compiled)
        mask = xgr.allocate_token_bitmask(1, vocab)
        matcher.fill_next_token_bitmask(mask)

    compile_s = best(compile_once, rounds)
    compiler = xgr.GrammarCompiler(info, max_threads=2)
    compiled = compiler.compile_json_schema(
        json.dumps(TYPICAL), any_whitespace=False, separators=(", ", ": ")
    )

    batcher = xgr.BatchGrammarMatcher(max_threads=1)

    def steps(batch: int) -> float:
        matchers = [xgr.GrammarMatcher(compiled) for _ in range(batch)]
        mask = xgr.allocate_token_bitmask(batch, vocab)
        t0 = time.perf_counter()
        for token in ids:
            if batch == 1:
                matchers[0].fill_next_token_bitmask(mask)
            else:
                batcher.batch_fill_next_token_bitmask(matchers, mask)
            for m in matchers:
                if not m.accept_token(token):
                    raise RuntimeError(f"xgrammar rejected token {token}")
        return time.perf_counter() - t0

    return tokenizer_s, compile_s, {b: min(steps(b) for _ in range(rounds)) for b in (1, BATCH)}


def trained_tokenizer(vocab_size: int) -> Tokenizer:
    """A byte-level BPE of about ``vocab_size`` tokens over the standard library's sources,
    with the default model's special tokens (deterministic for one Python version)."""
    import sysconfig
    from pathlib import Path

    from tokenizers import AddedToken, decoders, models, pre_tokenizers, trainers
    from tokenizers import Tokenizer as HFTokenizer

    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    backend = HFTokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train([str(f) for f in files], trainer)
    backend.add_special_tokens([AddedToken("<|im_end|>", special=True)])
    return Tokenizer(backend, special_tokens={"eos_token": "<|im_end|>"})


def main() -> None:
    """Print one table row per library."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--vocab", type=int, default=None, help="train a BPE of this size")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.vocab is None:
        path = ensure_default_model()
        tok = Tokenizer.from_dir(path)
        config = ModelConfig.from_pretrained(path)
        vocab = config.vocab_size
        eos = sorted(set(config.eos_token_ids) | set(tok.eos_token_ids))
        name = "swift-tiny"
    else:
        tok = trained_tokenizer(args.vocab)
        vocab = -(-tok.vocab_size // 64) * 64
        eos = list(tok.eos_token_ids)
        name = "BPE trained on the stdlib"
    text = json.dumps(ANSWER, ensure_ascii=False)
    ids = tok.encode(text) + [eos[0]]
    print(f"tokenizer: {name}, vocab {vocab}; answer: {len(ids)} tokens; batch {BATCH}")
    print(
        f"{'library':<12} {'version':<8} {'tokenizer ms':>12} {'compile ms':>10} "
        f"{'mask us/step b1':>15} {f'mask us/step b{BATCH}':>16}"
    )
    for lib, fn in (("llguidance", measure_llguidance), ("xgrammar", measure_xgrammar)):
        from importlib.metadata import version

        try:
            tokenizer_s, compile_s, per_batch = fn(tok, vocab, eos, ids, args.rounds)
        except ImportError as exc:
            print(f"{lib:<12} not installed ({exc})")
            continue
        row = [per_batch[b] / len(ids) * 1e6 for b in (1, BATCH)]
        print(
            f"{lib:<12} {version(lib):<8} {tokenizer_s * 1e3:>12.1f} {compile_s * 1e3:>10.2f} "
            f"{row[0]:>15.1f} {row[1]:>16.1f}"
        )


if __name__ == "__main__":
    main()
