"""Train the embedded default model (``local_engine/models/swift-tiny``), from scratch or
onwards from an earlier model directory (``--init``).

Reproducible: the data (scripts/default_model_data.py), the tokenizer, the initial weights
and the batch order all come from fixed seeds. Runs on CPU (the shipped weights, two runs
of this script given under Usage, took 54.6 and 5.5 minutes on one thread of the 2-core
development machine, ``taskset -c 1 ... --threads 1``: while another process holds a core,
two threads run several times slower than one) or on a GPU when one is present. The
forward pass runs under bfloat16 autocast and, unless ``--no-compile``, through
``torch.compile``.

Steps: generate synthetic chat conversations (tool calls, tool follow-ups, JSON extraction,
structured output, copy and light edits, sessions, greetings and canned facts), render them
with the engine's own ChatML tools template (and its JSON response-format instruction), train
a byte-level BPE tokenizer on them (or, with ``--init DIR``, take DIR's tokenizer and
weights), then train a small Qwen3-architecture decoder with the loss on assistant tokens
only.
The result is written as a Hugging Face directory (``config.json``, ``model.safetensors`` in
bfloat16, ``tokenizer.json``, ``tokenizer_config.json`` with the chat template,
``generation_config.json``, ``README.md``) and checked by loading it with
:func:`local_engine.loader.load_model` and comparing logits with the training model.

Usage::

    # the shipped weights: run O from scratch, then run P9 onwards from it
    .venv/bin/python scripts/train_default_model.py --threads 1 --vocab-size 1024 \
        --max-len 1024 --steps 3700 --conversations 110000 --mix "chat=1,tool_text=0.5" \
        --seed 7 --out /tmp/O
    .venv/bin/python scripts/train_default_model.py --threads 1 --init /tmp/O \
        --mix "chat=1,tool_text=0.5,greeting=2,tool_call=5,tool_call_general=9" \
        --steps 300 --conversations 10000 --lr 1e-3 --warmup 20 --seed 2919
    .venv/bin/python scripts/train_default_model.py --threads 1  # the defaults: run F
    # onwards from earlier weights on the current mix (--mix "name=weight,..." reweighs
    # tasks): run A of docs/local-engine.md (measured there, not shipped)
    .venv/bin/python scripts/train_default_model.py --threads 1 --no-compile \
        --init local_engine/models/swift-tiny --mix "copy_general=2.5,edit_general=1" \
        --steps 320 --conversations 10000 --lr 1e-3 --warmup 20 --seed 2835 --out /tmp/A
    # run G (from scratch, a 1,024-token vocabulary, the character-level copy data; measured
    # there, not shipped)
    .venv/bin/python scripts/train_default_model.py --threads 1 --vocab-size 1024 \
        --max-len 1024 --steps 2400 --conversations 60000 \
        --mix "chat=0.75,copy_general=4.25,copy_chars=3,structured_any=2" --out /tmp/G
    # run H (from scratch, the first 400 of the 3,800 steps on synthetic copy sequences;
    # measured there, not shipped)
    .venv/bin/python scripts/train_default_model.py --threads 1 --copy-warmup 400 \
        --copy-pool 256 --copy-min-len 4 --copy-max-len 32 --save-every 950 --out /tmp/H
    .venv/bin/python scripts/train_default_model.py --steps 50 --out /tmp/m   # a quick smoke run
    .venv/bin/python scripts/eval_default_model.py             # the held-out accuracy table
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

import default_model_data as data  # noqa: E402

from local_engine.chat import response_format_instruction, with_response_format  # noqa: E402
from local_engine.default_model import (  # noqa: E402
    DefaultModelSpec,
    model_config,
    tokenizer_config,
)
from local_engine.templates import CHATML_TOOLS_TEMPLATE, render_normalized  # noqa: E402
from swiftclient.types import ResponseFormat  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "local_engine" / "models" / "swift-tiny"
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
TOOL_TOKENS = ("<tool_call>", "</tool_call>")


@dataclass
class TrainConfig:
    """Everything that decides the result; all of it is recorded in the model card."""

    hidden_size: int = 192
    intermediate_size: int = 512
    num_layers: int = 6
    num_heads: int = 3
    num_kv_heads: int = 3
    head_dim: int = 64
    seed: int = 1234
    conversations: int = 110_000
    vocab_size: int = 3072
    steps: int = 3800
    batch_tokens: int = 4096
    lr: float = 3e-3
    min_lr_ratio: float = 0.05
    warmup: int = 100
    weight_decay: float = 0.05
    max_len: int = 640
    #: 1: a space is a token of its own, never merged into the word after it, so that a word
    #: is the same tokens after a space (" Paris" in a question), after a quote or a newline
    #: (``"Paris"`` in JSON, the first word of an answer); 0: GPT-2's byte-level pieces
    #: (" Paris" and "Paris" differ), as the weights before issue 28. A from-scratch run only
    #: (with ``init`` the tokenizer comes from there).
    split_spaces: int = 1
    #: A model directory to start from (its tokenizer and weights; same shape), or "" to
    #: train the tokenizer and the model from scratch.
    init: str = ""
    #: Task weight overrides, ``"name=weight,..."`` (the others keep those of
    #: ``default_model_data.TASKS``), or "" for the module's own weights.
    mix: str = ""
    #: A curriculum: the first ``copy_warmup`` steps train on synthetic copy sequences
    #: (:func:`copy_batch`) instead of the mix, so that induction heads form before the chat
    #: data; 0 (the shipped weights): none. Counted in ``steps`` (the learning-rate schedule
    #: spans them all); the mix's batches then come in the same order as without it.
    copy_warmup: int = 0
    #: The shortest and the longest synthetic sequence of the warm-up, in tokens.
    copy_min_len: int = 8
    copy_max_len: int = 64
    #: The warm-up draws its tokens from the first ``copy_pool`` ordinary ids of the
    #: tokenizer (the byte alphabet, then the most frequent merges), or from all of them (0).
    copy_pool: int = 0

    def spec(self) -> DefaultModelSpec:
        """The model shape."""
        return DefaultModelSpec(
            name="swift-tiny",
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_layers=self.num_layers,
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            tie_word_embeddings=True,
            max_position_embeddings=2048,
            summary="trained on synthetic chat, tool-call, JSON and copy/edit data",
        )


# ----------------------------------------------------------------------------- rendering


def render(conv: dict[str, Any], upto: int | None = None, *, generation: bool = False) -> str:
    """A conversation (or its first ``upto`` messages) as the engine would render it."""
    messages = conv["messages"] if upto is None else conv["messages"][:upto]
    response_format = conv.get("response_format")
    fmt = ResponseFormat.model_validate(response_format) if response_format else None
    normalized = with_response_format(messages, fmt)
    return render_normalized(
        CHATML_TOOLS_TEMPLATE,
        normalized,
        tools=conv.get("tools"),
        add_generation_prompt=generation,
    )


def assistant_spans(conv: dict[str, Any]) -> tuple[str, list[tuple[int, int]]]:
    """The rendered text and the character spans of every assistant turn (with <|im_end|>)."""
    text = render(conv)
    spans = []
    for i, message in enumerate(conv["messages"]):
        if message["role"] != "assistant":
            continue
        start = len(render(conv, i, generation=True))
        end = len(render(conv, i + 1)) - 1  # the newline after <|im_end|> is not generated
        spans.append((start, end))
    return text, spans


# ----------------------------------------------------------------------------- tokenizer


def fixed_phrases() -> list[str]:
    """Text the template and the engine insert verbatim, each made one token.

    The chat template's tool instructions, the three built-in tool definitions as the template
    renders them, and the engine's JSON response-format sentences. Prompts with tools shrink
    from about 300 tokens to about 40, which is what makes CPU training affordable. Other
    tools are tokenized normally (the model was never trained on them).
    """
    sentinel = "\x00TOOL\x00"
    rendered = render_normalized(
        CHATML_TOOLS_TEMPLATE,
        [{"role": "user", "content": "q"}],
        tools=[{"type": "function", "function": {"name": sentinel}}],
    )
    body = rendered.split("<|im_start|>system\n", 1)[1].split("<|im_end|>", 1)[0]
    before, after = body.split(json.dumps({"name": sentinel}), 1)
    phrases = [before.rstrip("\n"), after]
    phrases += [json.dumps(tool["function"], ensure_ascii=False) for tool in data.TOOLS.values()]
    phrases += ["<tool_response>", "</tool_response>"]
    for kind in ("json_object", "json_schema"):
        instruction = response_format_instruction(
            ResponseFormat.model_validate(
                {"type": kind, "json_schema": {"name": "x", "schema": {}}}
            )
        )
        assert instruction is not None
        phrases += [
            line.split(":")[0] + ":" if "schema:" in line else line
            for line in instruction.splitlines()
            if "It is" not in line
        ]
    return list(dict.fromkeys(phrases))


def train_tokenizer(texts: list[str], vocab_size: int, split_spaces: bool = True) -> Any:
    """A byte-level BPE (digits split one by one, and with ``split_spaces`` every space
    too) trained on ``texts``."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
    from tokenizers.trainers import BpeTrainer

    tokenizer = Tokenizer(models.BPE())
    steps: list[Any] = [pre_tokenizers.Digits(individual_digits=True)]
    if split_spaces:
        steps.append(pre_tokenizers.Split(" ", behavior="isolated"))
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(steps)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    tokenizer.add_special_tokens(
        [AddedToken(t, normalized=False, special=True) for t in SPECIAL_TOKENS]
    )
    trainer = BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=list(SPECIAL_TOKENS),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    # Added after training, so that they get fresh ids after the BPE vocabulary.
    phrases = TOOL_TOKENS + tuple(fixed_phrases())
    tokenizer.add_tokens([AddedToken(t, normalized=False, special=False) for t in phrases])
    # Use what a reload sees (the saved file is the source of truth for the engine).
    tokenizer = Tokenizer.from_str(tokenizer.to_str())
    for phrase in SPECIAL_TOKENS + phrases:
        if len(tokenizer.encode(phrase).ids) != 1:
            raise SystemExit(f"the tokenizer does not keep {phrase[:30]!r} as one token")
    return tokenizer


def load_tokenizer(path: Path) -> Any:
    """The tokenizer of the model directory ``path``, checked like a freshly trained one."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    for phrase in SPECIAL_TOKENS + TOOL_TOKENS + tuple(fixed_phrases()):
        if len(tokenizer.encode(phrase).ids) != 1:
            raise SystemExit(f"{path}'s tokenizer does not keep {phrase[:30]!r} as one token")
    return tokenizer


def encode(
    tokenizer: Any, rendered: list[tuple[str, list[tuple[int, int]]]]
) -> list[tuple[list[int], list[int]]]:
    """Token ids and a 0/1 loss mask marking the assistant tokens, per rendered conversation
    (the text and assistant spans of :func:`assistant_spans`)."""
    encodings = tokenizer.encode_batch([text for text, _ in rendered], add_special_tokens=False)
    out = []
    for encoding, (_, spans) in zip(encodings, rendered, strict=True):
        mask, span = [], 0
        for first, _ in encoding.offsets:
            while span < len(spans) and first >= spans[span][1]:
                span += 1
            mask.append(int(span < len(spans) and spans[span][0] <= first))
        out.append((list(encoding.ids), mask))
    return out


#: How many of the generated conversations the BPE tokenizer is trained on (the first ones;
#: a from-scratch run only).
TOKENIZER_SAMPLE = 40_000
#: Conversations rendered and encoded at a time: only their text is held at once, the rest
#: is kept as compact arrays.
ENCODE_CHUNK = 4_000

Example = tuple["np.ndarray[Any, Any]", "np.ndarray[Any, Any]"]


def encode_compact(tokenizer: Any, convs: list[dict[str, Any]], max_len: int) -> list[Example]:
    """:func:`encode` for every conversation, a chunk at a time, as numpy arrays (token ids
    as int16 or int32, the loss mask as bool), dropping those longer than ``max_len``.

    Python lists of ints take about 20 times the memory: the 72,000 conversations of run C
    (docs/local-engine.md) held 6.9 GB that way.
    """
    dtype = np.int16 if tokenizer.get_vocab_size(with_added_tokens=True) < 2**15 else np.int32
    out: list[Example] = []
    for first in range(0, len(convs), ENCODE_CHUNK):
        rendered = [assistant_spans(conv) for conv in convs[first : first + ENCODE_CHUNK]]
        for ids, mask in encode(tokenizer, rendered):
            if len(ids) <= max_len:
                out.append((np.asarray(ids, dtype=dtype), np.asarray(mask, dtype=np.bool_)))
    return out


# ----------------------------------------------------------------------------- model


class Attention(nn.Module):
    """Qwen3 attention: q/k RMSNorm per head, rotary embeddings, grouped KV heads."""

    def __init__(self, spec: DefaultModelSpec) -> None:
        super().__init__()
        hd, h = spec.head_dim, spec.hidden_size
        self.heads, self.kv_heads, self.head_dim = spec.num_heads, spec.num_kv_heads, hd
        self.q_proj = nn.Linear(h, spec.num_heads * hd, bias=False)
        self.k_proj = nn.Linear(h, spec.num_kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(h, spec.num_kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(spec.num_heads * hd, h, bias=False)
        self.q_norm = nn.RMSNorm(hd, eps=1e-6)
        self.k_norm = nn.RMSNorm(hd, eps=1e-6)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, t, self.heads, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(b, t, self.kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        repeat = self.heads // self.kv_heads
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding in the Hugging Face (half-split) layout."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class MLP(nn.Module):
    """SwiGLU feed-forward."""

    def __init__(self, spec: DefaultModelSpec) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(spec.hidden_size, spec.intermediate_size, bias=False)
        self.up_proj = nn.Linear(spec.hidden_size, spec.intermediate_size, bias=False)
        self.down_proj = nn.Linear(spec.intermediate_size, spec.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    """Pre-norm decoder block."""

    def __init__(self, spec: DefaultModelSpec) -> None:
        super().__init__()
        self.input_layernorm = nn.RMSNorm(spec.hidden_size, eps=1e-6)
        self.self_attn = Attention(spec)
        self.post_attention_layernorm = nn.RMSNorm(spec.hidden_size, eps=1e-6)
        self.mlp = MLP(spec)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Body(nn.Module):
    """Embeddings, layers and the final norm (parameter names follow Hugging Face Qwen3)."""

    def __init__(self, spec: DefaultModelSpec, vocab_size: int) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab_size, spec.hidden_size)
        self.layers = nn.ModuleList(Layer(spec) for _ in range(spec.num_layers))
        self.norm = nn.RMSNorm(spec.hidden_size, eps=1e-6)


class TinyQwen3(nn.Module):
    """A Qwen3 causal LM with tied embeddings, for training only."""

    def __init__(self, spec: DefaultModelSpec, vocab_size: int, rope_theta: float) -> None:
        super().__init__()
        self.model = Body(spec, vocab_size)
        exponents = torch.arange(0, spec.head_dim, 2, dtype=torch.float32) / spec.head_dim
        self.register_buffer("inv_freq", 1.0 / (rope_theta**exponents), persistent=False)
        std, depth = 0.02, 2 * spec.num_layers
        for name, param in self.named_parameters():
            if name.endswith("norm.weight"):
                nn.init.ones_(param)
            elif name.endswith(("o_proj.weight", "down_proj.weight")):
                nn.init.normal_(param, std=std / math.sqrt(depth))
            else:
                nn.init.normal_(param, std=std)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Logits for every position, or only where ``mask`` is set."""
        positions = torch.arange(ids.shape[1], device=ids.device, dtype=torch.float32)
        freqs = torch.outer(positions, self.inv_freq)
        angles = torch.cat((freqs, freqs), dim=-1)
        cos, sin = angles.cos()[None, None], angles.sin()[None, None]
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        if mask is not None:
            x = x[mask]
        return self.model.norm(x) @ self.model.embed_tokens.weight.T


def load_weights(model: TinyQwen3, path: Path) -> None:
    """Start from the weights of the model directory ``path`` (the same shape and vocabulary)."""
    from safetensors.torch import load_file

    weights = load_file(str(path / "model.safetensors"))
    own = model.state_dict()
    if set(weights) != set(own) or any(weights[k].shape != own[k].shape for k in own):
        raise SystemExit(f"{path} does not hold weights of this model's shape")
    model.load_state_dict({name: tensor.float() for name, tensor in weights.items()})


# ----------------------------------------------------------------------------- training


#: The fields that only matter with a copy warm-up: left out of the recorded settings when
#: it is off, so that such a run writes the same files as before the field existed.
COPY_FIELDS = ("copy_warmup", "copy_min_len", "copy_max_len", "copy_pool")


def recorded(cfg: TrainConfig) -> dict[str, Any]:
    """The settings as written to ``training.json`` and the model card."""
    settings = dict(vars(cfg))
    if not cfg.copy_warmup:
        for field in COPY_FIELDS:
            settings.pop(field)
    return settings


@dataclass
class CopyTokens:
    """What :func:`copy_batch` draws from: the tokenizer's ordinary BPE ids (no special or
    added tokens), the space token, and the separator and end tokens."""

    pool: np.ndarray[Any, Any]
    space: int
    separator: int
    end: int
    pad: int

    @classmethod
    def of(cls, tokenizer: Any, size: int = 0) -> CopyTokens:
        """The ids of ``tokenizer`` (one trained by :func:`train_tokenizer`); with ``size``,
        only the first ``size`` ordinary ids."""
        special = {tokenizer.token_to_id(token) for token in SPECIAL_TOKENS}
        space = tokenizer.encode(" ", add_special_tokens=False).ids
        if len(space) != 1:
            raise SystemExit("the copy warm-up needs a tokenizer with a token for one space")
        base = tokenizer.get_vocab_size(with_added_tokens=False)
        pool = np.asarray([i for i in range(base) if i not in special and i != space[0]])
        if size:
            pool = pool[:size]
        return cls(
            pool=pool,
            space=space[0],
            separator=tokenizer.token_to_id("<|im_start|>"),
            end=tokenizer.token_to_id("<|im_end|>"),
            pad=tokenizer.token_to_id("<|endoftext|>"),
        )


def copy_sequence(tokens: CopyTokens, length: int, rng: np.random.Generator) -> list[int]:
    """``length`` random tokens: half the time uniform ids, half the time made-up "words" of
    one to three ids separated by the space token (the way a text tokenizes, where the space
    before each word makes the previous token ambiguous)."""
    if rng.random() < 0.5:
        return [int(i) for i in rng.choice(tokens.pool, size=length)]
    out: list[int] = []
    while len(out) < length:
        if out:
            out.append(tokens.space)
        out += [int(i) for i in rng.choice(tokens.pool, size=int(rng.integers(1, 4)))]
    return out[:length]


def copy_batch(
    tokens: CopyTokens, cfg: TrainConfig, rng: np.random.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inputs, next-token targets and loss mask of a batch of the copy warm-up.

    Each row packs segments ``sequence <|im_start|> sequence <|im_end|>`` (lengths uniform
    in ``copy_min_len..copy_max_len``) and pads the rest; the loss is on the repeat and its
    ``<|im_end|>`` only. Rows are ``4 * copy_max_len + 4`` tokens wide (at least two
    segments of the longest kind), as many as fit in ``batch_tokens``.
    """
    width = 4 * cfg.copy_max_len + 4
    rows = max(1, cfg.batch_tokens // width)
    ids = torch.full((rows, width), tokens.pad, dtype=torch.long)
    mask = torch.zeros((rows, width), dtype=torch.bool)
    for row in range(rows):
        at = 0
        while True:
            length = int(rng.integers(cfg.copy_min_len, cfg.copy_max_len + 1))
            if at + 2 * length + 2 > width:
                break
            sequence = copy_sequence(tokens, length, rng)
            segment = [*sequence, tokens.separator, *sequence, tokens.end]
            ids[row, at : at + len(segment)] = torch.tensor(segment)
            mask[row, at + length + 1 : at + len(segment)] = True
            at += len(segment)
    return ids[:, :-1], ids[:, 1:], mask[:, 1:]


def batches(examples: list[Example], batch_tokens: int, rng: random.Random) -> list[list[int]]:
    """Indices grouped by similar length so that each batch pads little."""
    order = sorted(range(len(examples)), key=lambda i: (len(examples[i][0]), rng.random()))
    groups: list[list[int]] = []
    current: list[int] = []
    for i in order:
        longest = max([len(examples[j][0]) for j in current] + [len(examples[i][0])])
        if current and longest * (len(current) + 1) > batch_tokens:
            groups.append(current)
            current = []
        current.append(i)
    if current:
        groups.append(current)
    rng.shuffle(groups)
    return groups


def collate(
    examples: list[Example], group: list[int], pad: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inputs, next-token targets and the loss mask of one right-padded batch."""
    width = max(len(examples[i][0]) for i in group)
    ids = torch.full((len(group), width), pad, dtype=torch.long)
    mask = torch.zeros((len(group), width), dtype=torch.bool)
    for row, i in enumerate(group):
        tokens, loss_mask = examples[i]
        ids[row, : len(tokens)] = torch.from_numpy(tokens.astype(np.int64))
        mask[row, : len(tokens)] = torch.from_numpy(loss_mask)
    return ids[:, :-1], ids[:, 1:], mask[:, 1:]


def learning_rate(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up, then cosine decay to ``min_lr_ratio``."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    ratio = cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    return cfg.lr * ratio


def train(
    cfg: TrainConfig,
    out: Path,
    device: torch.device,
    save_every: int = 0,
    *,
    compile_model: bool = True,
) -> None:
    """Generate data, train the tokenizer and the model, and write the model directory
    (also every ``save_every`` steps, when given, so a long run can be tried early).

    The forward pass runs under bfloat16 autocast (on CPUs with AVX-512 BF16 as on GPUs) and,
    with ``compile_model``, through ``torch.compile`` with dynamic shapes (one compilation
    serves every batch width); on the development machine the two together halve the time
    of a step.
    """
    started = time.monotonic()
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    heldout = {data.conversation_key(conv) for conv in data.heldout_set()}
    convs = data.generate(cfg.conversations, cfg.seed, exclude=heldout, mix=cfg.mix)
    if cfg.init:
        tokenizer = load_tokenizer(Path(cfg.init))
    else:
        sample = convs[:TOKENIZER_SAMPLE]
        texts = [render(conv) for conv in sample]
        tokenizer = train_tokenizer(texts, cfg.vocab_size, bool(cfg.split_spaces))
    examples = encode_compact(tokenizer, convs, cfg.max_len)
    dropped = len(convs) - len(examples)
    del convs
    lengths = [len(ids) for ids, _ in examples]
    print(
        f"data: {len(examples)} conversations, {sum(lengths)} tokens "
        f"(mean {sum(lengths) / len(lengths):.0f}, max {max(lengths)}), "
        f"{sum(int(m.sum()) for _, m in examples)} assistant tokens, "
        f"{dropped} dropped as longer than {cfg.max_len} tokens; "
        f"{time.monotonic() - started:.0f}s",
        flush=True,
    )
    ids = {token: tokenizer.token_to_id(token) for token in SPECIAL_TOKENS + TOOL_TOKENS}
    vocab_size = -(-tokenizer.get_vocab_size(with_added_tokens=True) // 64) * 64
    spec = cfg.spec()
    config = model_config(spec, vocab_size, ids)
    model = TinyQwen3(spec, vocab_size, config["rope_theta"])
    if cfg.init:
        load_weights(model, Path(cfg.init))
    model = model.to(device)
    params = sum(p.numel() for p in model.parameters())
    print(f"model: {params} parameters, vocab {vocab_size}, device {device}", flush=True)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": cfg.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=cfg.lr,
        betas=(0.9, 0.95),
    )
    forward = torch.compile(model, dynamic=True) if compile_model else model
    rng = random.Random(cfg.seed)
    # The warm-up's own generator, so that nothing else draws differently with it on or off.
    copy_rng = np.random.default_rng([cfg.seed, 0xC0])
    copy_tokens = CopyTokens.of(tokenizer, cfg.copy_pool) if cfg.copy_warmup else None
    schedule: list[list[int]] = []
    step, seen, window = 0, 0, 0.0
    pad = ids["<|endoftext|>"]
    model.train()
    copy_right = copy_total = 0
    while step < cfg.steps:
        warming = copy_tokens is not None and step < cfg.copy_warmup
        if copy_tokens is not None and warming:
            batch = copy_batch(copy_tokens, cfg, copy_rng)
        else:
            if not schedule:
                schedule = batches(examples, cfg.batch_tokens, rng)
            batch = collate(examples, schedule.pop(), pad)
        inputs, targets, mask = (t.to(device) for t in batch)
        for group_ in optimizer.param_groups:
            group_["lr"] = learning_rate(step, cfg)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            logits = forward(inputs, mask)
        loss = F.cross_entropy(logits.float(), targets[mask])
        if warming:
            copy_right += int((logits.argmax(-1) == targets[mask]).sum())
            copy_total += int(mask.sum())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        step += 1
        seen += inputs.numel()
        window = loss.item() if step == 1 else 0.95 * window + 0.05 * loss.item()
        if save_every and step % save_every == 0 and step < cfg.steps:
            save(model, tokenizer, config, ids, out, cfg, params, 0.0, device)
            print(f"saved the step-{step} weights to {out}", flush=True)
        if step % 20 == 0 or step == cfg.steps:
            elapsed = time.monotonic() - started
            # During the warm-up: the share of the repeats' tokens predicted right since the
            # last line.
            copied = f" copy {100 * copy_right / copy_total:.1f}%" if copy_total else ""
            print(
                f"step {step}/{cfg.steps} loss {window:.4f} lr {learning_rate(step, cfg):.2e} "
                f"tokens {seen} elapsed {elapsed:.0f}s{copied}",
                flush=True,
            )
            copy_right = copy_total = 0
    minutes = (time.monotonic() - started) / 60
    save(model, tokenizer, config, ids, out, cfg, params, minutes, device)
    check_against_engine(model, out, examples[0][0].tolist(), device)
    print(f"done in {minutes:.1f} min -> {out}", flush=True)


# ----------------------------------------------------------------------------- output


def save(
    model: TinyQwen3,
    tokenizer: Any,
    config: dict[str, Any],
    ids: dict[str, int],
    out: Path,
    cfg: TrainConfig,
    params: int,
    minutes: float,
    device: torch.device,
) -> None:
    """Write the Hugging Face directory (weights in bfloat16)."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    tensors = {
        name: tensor.detach().to("cpu", torch.bfloat16).contiguous()
        for name, tensor in model.state_dict().items()
    }
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    tokenizer.save(str(out / "tokenizer.json"))
    write_json(out / "tokenizer_config.json", tokenizer_config(ids))
    write_json(out / "config.json", config)
    write_json(
        out / "generation_config.json",
        {
            "bos_token_id": ids["<|endoftext|>"],
            "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]],
            "pad_token_id": ids["<|endoftext|>"],
            "do_sample": False,
        },
    )
    earlier = earlier_run(cfg.init)
    record: dict[str, Any] = {
        "config": run_settings(cfg, earlier),
        "parameters": params,
        "minutes": round(minutes, 1),
        "device": device.type,
    }
    if earlier is not None:  # the run this one continued, and so on back to the first
        record["earlier"] = earlier
    write_json(out / "training.json", record)
    (out / "README.md").write_text(model_card(cfg, params, earlier), encoding="utf-8")


def run_settings(cfg: TrainConfig, earlier: dict[str, Any] | None) -> dict[str, Any]:
    """The settings recorded for a run: :func:`recorded`, with the vocabulary size of the
    tokenizer a ``--init`` run keeps (``earlier``'s) rather than the unused option."""
    settings = recorded(cfg)
    if earlier is not None:
        settings["vocab_size"] = earlier["config"]["vocab_size"]
    return settings


def earlier_run(init: str) -> dict[str, Any] | None:
    """The ``training.json`` of the run ``init`` names (None when it has none, or no init)."""
    path = Path(init) / "training.json" if init else None
    if path is None or not path.is_file():
        return None
    record: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return record


def write_json(path: Path, value: dict[str, Any]) -> None:
    """Pretty JSON with a trailing newline."""
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def model_card(cfg: TrainConfig, params: int, earlier: dict[str, Any] | None = None) -> str:
    """The README.md of the model directory (``earlier``: the ``training.json`` of the run
    this one continued, with ``--init``)."""
    spec = cfg.spec()
    mix = data.task_weights(cfg.mix)
    return (
        "# swift-tiny (swiftclient's embedded default model)\n\n"
        f"A {params / 1e6:.1f}M-parameter Qwen3-architecture model ({spec.num_layers} layers, "
        f"hidden size {spec.hidden_size}, {spec.num_heads} heads, {spec.num_kv_heads} KV "
        "heads, tied embeddings) with its own byte-level BPE tokenizer, trained "
        + ("onwards from earlier weights\n" if cfg.init else "from scratch\n")
        + "by `scripts/train_default_model.py` on synthetic chat data only: calls to three tools\n"
        "(`get_weather`, `convert_units`, `calculator`) and to made-up ones in the Hermes\n"
        "`<tool_call>` format, answers from a tool's result (in several field names and JSON\n"
        "styles), structured output through a forced tool or a JSON schema, copying and light\n"
        "edits of arbitrary short texts (words from a 4,500-word list, made-up words, codes,\n"
        "unicode), sessions of up to six turns, greetings and canned facts. It knows nothing\n"
        "else. `scripts/eval_default_model.py` measures it per task, and docs/local-engine.md\n"
        "has the tables.\n\n"
        + _continued(cfg.init, earlier)
        + (
            f"The first {cfg.copy_warmup} steps trained on synthetic copy sequences only (random\n"
            "token ids, repeated after a separator) before the task mix.\n\n"
            if cfg.copy_warmup
            else ""
        )
        + f"Training settings: `{json.dumps(run_settings(cfg, earlier))}`.\n\n"
        f"Task mix (sampling weights of the generated conversations): `{json.dumps(mix)}`.\n"
    )


def _continued(init: str, earlier: dict[str, Any] | None) -> str:
    """The model card's paragraph on the run a ``--init`` run continued."""
    if not init:
        return ""
    if earlier is None:
        return (
            f"This run continued from the weights and tokenizer in `{init}` when it started\n"
            "(the previous weights, trained from scratch by this script on its earlier data).\n\n"
        )
    how = "onwards from earlier weights" if earlier["config"].get("init") else "from scratch"
    return (
        "This run continued from the weights and tokenizer of an earlier run of this script,\n"
        f"trained {how} ({earlier['minutes']} minutes) with the settings\n"
        f"`{json.dumps(earlier['config'])}`; `training.json` records both runs.\n\n"
    )


def check_against_engine(
    model: TinyQwen3, out: Path, sample: list[int], device: torch.device
) -> None:
    """Load the written directory with the engine's loader and compare logits."""
    from local_engine.engine import Engine, EngineConfig
    from local_engine.sampling_params import SamplingParams

    # The weights as saved (rounded to bfloat16): a near tie between two tokens otherwise
    # goes one way in the training model's float32 weights and the other in the file's.
    model.eval().to(torch.bfloat16).float()
    prompt = sample[:24]
    with torch.no_grad():
        ids = torch.tensor([prompt], device=device)
        reference = []
        for _ in range(8):
            token = int(model(ids)[0, -1].argmax())
            reference.append(token)
            ids = torch.cat((ids, torch.tensor([[token]], device=device)), dim=1)
    engine = Engine.from_pretrained(out, EngineConfig(dtype="float32"))
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    produced = engine.generate([prompt], params)[0].token_ids
    print(f"engine check: training model {reference}, engine {produced}", flush=True)
    if produced[:4] != reference[:4]:
        raise SystemExit("the engine does not reproduce the trained model's greedy tokens")


def main() -> None:
    """Command-line entry point."""
    defaults = TrainConfig()
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    for field, value in vars(defaults).items():
        parser.add_argument(f"--{field.replace('_', '-')}", type=type(value), default=value)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--save-every", type=int, default=0, help="also save every N steps")
    parser.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run the forward pass through torch.compile (default: on)",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cfg = TrainConfig(**{field: getattr(args, field) for field in vars(defaults)})
    train(cfg, args.out, torch.device(args.device), args.save_every, compile_model=args.compile)


if __name__ == "__main__":
    main()
