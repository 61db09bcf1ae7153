"""The embedded default models: a trained one shipped in the package, and generated ones.

``swift-tiny`` (:data:`DEFAULT_MODEL_NAME`) is the model the local engine loads when no model
is named. It is trained (by ``scripts/train_default_model.py``, on synthetic data) and its
files ship inside this package in ``local_engine/models/swift-tiny``: about 2.9M parameters
trained to call three built-in tools, answer in JSON, copy and lightly edit short texts and
make small talk; it has learned the formats better than the content (docs/local-engine.md
has its measured accuracy).

The models in :data:`DEFAULT_MODELS` (``swift-tiny-random``, ``swift-50m``) have RANDOM
WEIGHTS. They were never trained and write gibberish; they exist to exercise the local
pipeline (tokenizer, chat template, scheduler, KV cache, sampler, streaming) at a chosen size
in tests and benchmarks, not to answer anything.

Each random model is a Hugging Face directory in the Qwen3 architecture, built
deterministically on first use: a byte-level BPE tokenizer trained on a small built-in
corpus, a ChatML chat template with tool calls in the Hermes style, and weights drawn from a
fixed seed (normal with std 0.02, norm weights 1). It is written to a temporary directory and
renamed into place, so concurrent first uses are safe. The cache root is
``$SWIFTCLIENT_CACHE_DIR`` or ``~/.cache/swiftclient``; a model lives in
``<root>/models/<name>``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from local_engine.errors import EngineConfigError

from ._default_corpus import CORPUS

__all__ = [
    "DEFAULT_MODEL_NAME",
    "DEFAULT_MODELS",
    "RANDOM_MODEL_NAME",
    "DefaultModelSpec",
    "count_parameters",
    "default_cache_root",
    "embedded_model_dir",
    "ensure_default_model",
    "find_default_model",
    "model_config",
    "tokenizer_config",
    "write_default_model",
]

#: Bump when the generated files change, so stale caches are rebuilt.
FORMAT_VERSION = 1
MARKER_FILE = "swiftclient_model.json"
#: The trained model shipped in the package; the local engine's default.
DEFAULT_MODEL_NAME = "swift-tiny"
#: The small random-weight model that :func:`ensure_default_model` generates by default.
RANDOM_MODEL_NAME = "swift-tiny-random"
_EMBEDDED_ROOT = Path(__file__).resolve().parent / "models"

_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# Added as plain (non-special) tokens, as Qwen does, so decoding with skip_special_tokens keeps
# them in the text for the tool-call parser.
_TOOL_TOKENS = ("<tool_call>", "</tool_call>")
_BPE_VOCAB_SIZE = 4096


@dataclass(frozen=True)
class DefaultModelSpec:
    """The shape of one default model."""

    name: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    tie_word_embeddings: bool
    max_position_embeddings: int = 4096
    seed: int = 0
    summary: str = ""


#: The generated random-weight models, by name.
DEFAULT_MODELS: dict[str, DefaultModelSpec] = {
    "swift-tiny-random": DefaultModelSpec(
        name="swift-tiny-random",
        hidden_size=256,
        intermediate_size=768,
        num_layers=8,
        num_heads=4,
        num_kv_heads=2,
        head_dim=64,
        tie_word_embeddings=True,
        summary="about 7M parameters; for examples and tests",
    ),
    "swift-50m": DefaultModelSpec(
        name="swift-50m",
        hidden_size=512,
        intermediate_size=1536,
        num_layers=16,
        num_heads=8,
        num_kv_heads=4,
        head_dim=64,
        tie_word_embeddings=False,
        seed=1,
        summary="about 52M parameters; for the CPU benchmark",
    ),
}


def default_cache_root() -> Path:
    """``$SWIFTCLIENT_CACHE_DIR``, else ``~/.cache/swiftclient``."""
    env = os.environ.get("SWIFTCLIENT_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "swiftclient"


def _spec(name: str) -> DefaultModelSpec:
    try:
        return DEFAULT_MODELS[name]
    except KeyError:
        raise EngineConfigError(
            f"unknown random-weight model {name!r}; choose one of {sorted(DEFAULT_MODELS)}"
        ) from None


def embedded_model_dir(name: str = DEFAULT_MODEL_NAME) -> Path:
    """The directory of the trained model shipped in the package.

    Raises:
        EngineConfigError: an unknown name, or an installation that lacks the model files.
    """
    if name != DEFAULT_MODEL_NAME:
        raise EngineConfigError(
            f"unknown embedded model {name!r}; the package ships {DEFAULT_MODEL_NAME!r}"
        )
    path = _EMBEDDED_ROOT / name
    missing = [
        f
        for f in ("config.json", "model.safetensors", "tokenizer.json")
        if not (path / f).is_file()
    ]
    if missing:
        raise EngineConfigError(
            f"the embedded model {name!r} is incomplete in {path} (missing {missing}); "
            "reinstall swiftclient-llm or run scripts/train_default_model.py"
        )
    return path


def _marker(spec: DefaultModelSpec) -> dict[str, Any]:
    return {
        "name": spec.name,
        "format_version": FORMAT_VERSION,
        "random_weights": True,
        "note": "Random, untrained weights: output is gibberish. For offline pipeline tests.",
    }


def _is_current(directory: Path, spec: DefaultModelSpec) -> bool:
    try:
        return bool(json.loads((directory / MARKER_FILE).read_text()) == _marker(spec))
    except (OSError, ValueError):
        return False


def find_default_model(name: str = DEFAULT_MODEL_NAME) -> Path:
    """The directory of a model known by name: the embedded ``swift-tiny``, or a
    random-weight model from :data:`DEFAULT_MODELS` (generated on first use).

    Raises:
        EngineConfigError: an unknown name.
    """
    if name == DEFAULT_MODEL_NAME:
        return embedded_model_dir()
    if name not in DEFAULT_MODELS:
        known = ", ".join([DEFAULT_MODEL_NAME, *sorted(DEFAULT_MODELS)])
        raise EngineConfigError(f"unknown model name {name!r}; choose one of {known}")
    return ensure_default_model(name)


def ensure_default_model(
    name: str = RANDOM_MODEL_NAME, *, cache_dir: str | Path | None = None
) -> Path:
    """Return the directory of a random-weight model, generating it on first use.

    ``cache_dir`` is the cache root (default :func:`default_cache_root`); the model lives in
    ``<cache_dir>/models/<name>``. Safe when several processes call it at once.
    """
    spec = _spec(name)
    models = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_root()
    models = models / "models"
    target = models / spec.name
    if _is_current(target, spec):
        return target
    models.mkdir(parents=True, exist_ok=True)
    scratch = models / f".{spec.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        scratch.mkdir()
        write_default_model(spec.name, scratch)
        _install(scratch, target, spec)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if not _is_current(target, spec):
        raise EngineConfigError(f"could not install the default model into {target}")
    return target


def _install(scratch: Path, target: Path, spec: DefaultModelSpec) -> None:
    """Move a finished directory into place; a concurrent winner's copy is kept."""
    if target.exists() and not _is_current(target, spec):
        # A stale or broken copy: move it aside first (a rename is atomic), then remove it.
        stale = target.with_name(f".{target.name}.stale-{secrets.token_hex(4)}")
        with contextlib.suppress(OSError):
            target.rename(stale)
            shutil.rmtree(stale, ignore_errors=True)
    with contextlib.suppress(OSError):  # another process installed it first
        scratch.rename(target)


def write_default_model(name: str, directory: str | Path) -> None:
    """Write every file of a random-weight model into an existing, empty ``directory``."""
    spec = _spec(name)
    root = Path(directory)
    tokenizer = _train_tokenizer()
    ids = {token: tokenizer.token_to_id(token) for token in _SPECIAL_TOKENS + _TOOL_TOKENS}
    vocab_size = _round_up(tokenizer.get_vocab_size(with_added_tokens=True), 64)
    tokenizer.save(str(root / "tokenizer.json"))
    _write_json(root / "tokenizer_config.json", tokenizer_config(ids))
    _write_json(root / "config.json", model_config(spec, vocab_size, ids))
    _write_json(
        root / "generation_config.json",
        {
            "bos_token_id": ids["<|endoftext|>"],
            "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]],
            "pad_token_id": ids["<|endoftext|>"],
            "do_sample": True,
        },
    )
    _write_weights(root / "model.safetensors", spec, vocab_size)
    (root / "README.md").write_text(_model_card(spec), encoding="utf-8")
    _write_json(root / MARKER_FILE, _marker(spec))


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _train_tokenizer() -> Any:
    """A byte-level BPE trained on the built-in corpus (deterministic)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
    from tokenizers.trainers import BpeTrainer

    from .templates import CHATML_TOOLS_TEMPLATE  # the chat layer's, only when training

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = BpeTrainer(
        vocab_size=_BPE_VOCAB_SIZE,
        min_frequency=1,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    lines = [line for line in (CORPUS + "\n" + CHATML_TOOLS_TEMPLATE).splitlines() if line]
    tokenizer.train_from_iterator(lines, trainer)
    tokenizer.add_special_tokens(
        [AddedToken(t, normalized=False, special=True) for t in _SPECIAL_TOKENS]
    )
    tokenizer.add_tokens([AddedToken(t, normalized=False, special=False) for t in _TOOL_TOKENS])
    return tokenizer


def tokenizer_config(ids: dict[str, int]) -> dict[str, Any]:
    """``tokenizer_config.json`` for a ChatML tokenizer with the given special-token ids."""
    from .templates import CHATML_TOOLS_TEMPLATE  # the chat layer's, only when generating

    added = {
        str(token_id): {
            "content": token,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": token in _SPECIAL_TOKENS,
        }
        for token, token_id in sorted(ids.items(), key=lambda item: item[1])
    }
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "add_bos_token": False,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "errors": "replace",
        "model_max_length": 4096,
        "split_special_tokens": False,
        "chat_template": CHATML_TOOLS_TEMPLATE,
    }


def model_config(spec: DefaultModelSpec, vocab_size: int, ids: dict[str, int]) -> dict[str, Any]:
    """``config.json`` (Qwen3 architecture) for ``spec`` with this vocabulary."""
    rope_theta = 1_000_000.0
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": vocab_size,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": spec.max_position_embeddings,
        "rms_norm_eps": 1e-6,
        "rope_theta": rope_theta,
        "rope_scaling": None,
        "rope_parameters": {"rope_type": "default", "rope_theta": rope_theta},
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": spec.tie_word_embeddings,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": spec.num_layers,
        "initializer_range": 0.02,
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
        "torch_dtype": "float32",
        "dtype": "float32",
        "use_cache": True,
    }


def _weight_shapes(spec: DefaultModelSpec, vocab_size: int) -> list[tuple[str, tuple[int, ...]]]:
    """Every weight in the Hugging Face Qwen3 naming, with its shape; norms end in ``norm``."""
    h, q, kv = spec.hidden_size, spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    shapes: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (vocab_size, h))]
    for i in range(spec.num_layers):
        p = f"model.layers.{i}."
        shapes += [
            (p + "input_layernorm.weight", (h,)),
            (p + "self_attn.q_proj.weight", (q, h)),
            (p + "self_attn.k_proj.weight", (kv, h)),
            (p + "self_attn.v_proj.weight", (kv, h)),
            (p + "self_attn.o_proj.weight", (h, q)),
            (p + "self_attn.q_norm.weight", (spec.head_dim,)),
            (p + "self_attn.k_norm.weight", (spec.head_dim,)),
            (p + "post_attention_layernorm.weight", (h,)),
            (p + "mlp.gate_proj.weight", (spec.intermediate_size, h)),
            (p + "mlp.up_proj.weight", (spec.intermediate_size, h)),
            (p + "mlp.down_proj.weight", (h, spec.intermediate_size)),
        ]
    shapes.append(("model.norm.weight", (h,)))
    if not spec.tie_word_embeddings:
        shapes.append(("lm_head.weight", (vocab_size, h)))
    return shapes


def count_parameters(name: str) -> int:
    """The number of parameters of a random-weight model (without generating it)."""
    spec = _spec(name)
    sizes = [_product(shape) for _, shape in _weight_shapes(spec, _vocab_size_estimate())]
    return sum(sizes)


def _product(shape: tuple[int, ...]) -> int:
    result = 1
    for dim in shape:
        result *= dim
    return result


def _vocab_size_estimate() -> int:
    tokenizer = _train_tokenizer()
    return _round_up(tokenizer.get_vocab_size(with_added_tokens=True), 64)


def _write_weights(path: Path, spec: DefaultModelSpec, vocab_size: int) -> None:
    """Random weights, each drawn from its own generator seeded by the model seed and name."""
    import torch
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    for weight_name, shape in _weight_shapes(spec, vocab_size):
        if weight_name.endswith("norm.weight"):
            tensors[weight_name] = torch.ones(shape, dtype=torch.float32)
            continue
        digest = hashlib.sha256(f"{spec.seed}:{weight_name}".encode()).digest()
        generator = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little"))
        tensors[weight_name] = torch.randn(shape, generator=generator) * 0.02
    save_file(tensors, str(path), metadata={"format": "pt"})


def _model_card(spec: DefaultModelSpec) -> str:
    return (
        f"# {spec.name} (swiftclient embedded default model)\n\n"
        "**Random, untrained weights. Its output is gibberish.** This model exists only to run\n"
        "the swiftclient local engine end to end without a network or a download: tokenizer,\n"
        "chat template, scheduling, KV cache, sampling and streaming. Do not use it to answer\n"
        "anything.\n\n"
        f"- Architecture: Qwen3 ({spec.num_layers} layers, hidden size {spec.hidden_size}, "
        f"{spec.num_heads} heads, {spec.num_kv_heads} KV heads); {spec.summary}.\n"
        "- Weights: normal(0, 0.02) from a fixed seed; norm weights 1.\n"
        "- Tokenizer: byte-level BPE trained on a few KB of built-in text.\n"
        "- Chat template: ChatML, tool calls as `<tool_call>{...}</tool_call>`.\n"
        "- Generated by `local_engine.default_model.ensure_default_model`.\n"
    )
