"""ModelConfig parsing and checkpoint loading: families, layouts, dtypes and bad inputs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from local_engine.config import ModelConfig, RopeScaling
from local_engine.errors import EngineConfigError
from local_engine.loader import load_model

from .paged import PagedRunner
from .tiny import TINY_WINDOW, make_tiny_model

IDS = [5, 17, 3, 99, 42, 7, 250, 11, 64, 128, 31]


def _logits(path: Path, **kwargs: Any) -> torch.Tensor:
    return PagedRunner(load_model(path, **kwargs)).step({"a": IDS})["a"]


def _hf_logits(path: Path, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    with torch.no_grad():
        logits: torch.Tensor = hf(torch.tensor([IDS])).logits[0]
    return logits.float()


def _edit_config(path: Path, **changes: Any) -> None:
    file = path / "config.json"
    data = json.loads(file.read_text())
    data.update(changes)
    file.write_text(json.dumps(data))


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("llama"), "llama")


# --- config -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("family", "expected"),
    [
        ("llama", {"family": "llama", "head_dim": 16, "attention_bias": False, "qk_norm": False}),
        ("qwen2", {"family": "qwen2", "attention_bias": True, "o_proj_bias": False}),
        ("qwen2_sw", {"sliding_windows": (None, TINY_WINDOW, TINY_WINDOW)}),
        ("qwen3", {"family": "qwen3", "head_dim": 32, "qk_norm": True, "attention_bias": False}),
        ("mistral", {"family": "mistral", "sliding_windows": (TINY_WINDOW, TINY_WINDOW)}),
    ],
)
def test_config_from_saved_checkpoint(
    family: str, expected: dict[str, Any], tmp_path: Path
) -> None:
    cfg = ModelConfig.from_pretrained(make_tiny_model(tmp_path, family))
    for field, value in expected.items():
        assert getattr(cfg, field) == value, field
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.vocab_size) == (4, 2, 256)
    assert cfg.dtype == "float32"
    assert cfg.eos_token_ids == (2,) and cfg.bos_token_id == 1


def test_config_llama3_rope_from_transformers_5_layout(tmp_path: Path) -> None:
    cfg = ModelConfig.from_pretrained(make_tiny_model(tmp_path, "llama3"))
    assert cfg.rope_theta == 10000.0
    assert cfg.rope_scaling == RopeScaling("llama3", 4.0, 1.0, 4.0, 32)


def _llama_dict(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "vocab_size": 256,
    }
    return {**base, **changes}


def test_config_transformers_4_layout_and_defaults() -> None:
    cfg = ModelConfig.from_dict(
        _llama_dict(
            rope_theta=500000.0,
            rope_scaling={
                "type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
            torch_dtype="bfloat16",
            eos_token_id=[128001, 128009],
        )
    )
    assert cfg.rope_theta == 500000.0
    assert cfg.rope_scaling == RopeScaling("llama3", 8.0, 1.0, 4.0, 8192)
    assert cfg.dtype == "bfloat16"
    assert cfg.eos_token_ids == (128001, 128009)
    assert (cfg.num_kv_heads, cfg.head_dim, cfg.max_position_embeddings) == (4, 16, 2048)
    assert cfg.sliding_windows == (None, None)
    assert not cfg.tie_word_embeddings
    plain = ModelConfig.from_dict(_llama_dict(rope_scaling=None))
    assert plain.rope_scaling is None and plain.rope_theta == 10000.0


def test_generation_config_eos_takes_precedence(tmp_path: Path) -> None:
    path = make_tiny_model(tmp_path, "qwen2")
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 9, 7]}))
    assert ModelConfig.from_pretrained(path).eos_token_ids == (7, 9)


def test_qwen_sliding_layers_without_layer_types() -> None:
    base = _llama_dict(
        model_type="qwen2",
        architectures=["Qwen2ForCausalLM"],
        num_hidden_layers=4,
        sliding_window=8,
        max_window_layers=2,
    )
    on = ModelConfig.from_dict({**base, "use_sliding_window": True})
    assert on.sliding_windows == (None, None, 8, 8)
    off = ModelConfig.from_dict({**base, "use_sliding_window": False})
    assert off.sliding_windows == (None,) * 4
    typed = ModelConfig.from_dict(
        {
            **base,
            "use_sliding_window": True,
            "layer_types": [
                "sliding_attention",
                "full_attention",
                "sliding_attention",
                "full_attention",
            ],
        }
    )
    assert typed.sliding_windows == (8, None, 8, None)


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"model_type": "gpt2"}, "unsupported model_type 'gpt2'"),
        ({"architectures": ["LlamaForSequenceClassification"]}, "unsupported architectures"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "unsupported rope type 'yarn'"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"num_key_value_heads": 3}, "multiple of num_key_value_heads"),
        ({"hidden_size": None}, "hidden_size"),
        ({"torch_dtype": "int8"}, "unsupported dtype"),
    ],
)
def test_config_rejects_unsupported(changes: dict[str, Any], match: str) -> None:
    with pytest.raises(EngineConfigError, match=match):
        ModelConfig.from_dict(_llama_dict(**changes))


def test_missing_or_broken_config(tmp_path: Path) -> None:
    with pytest.raises(EngineConfigError, match="config.json not found"):
        load_model(tmp_path)
    with pytest.raises(EngineConfigError, match="does not exist"):
        load_model(tmp_path / "nope")
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(EngineConfigError, match="cannot read"):
        ModelConfig.from_pretrained(tmp_path)


# --- loader -------------------------------------------------------------------------------


def test_sharded_checkpoint_loads_like_single_file(tmp_path: Path, llama_dir: Path) -> None:
    sharded = make_tiny_model(tmp_path, "llama", max_shard_size="40KB")
    assert (sharded / "model.safetensors.index.json").is_file()
    assert len(list(sharded.glob("*.safetensors"))) > 2
    torch.testing.assert_close(_logits(sharded), _logits(llama_dir), atol=0, rtol=0)


def test_tied_embeddings(tmp_path: Path) -> None:
    path = make_tiny_model(tmp_path, "qwen2", tie_word_embeddings=True)
    assert "lm_head.weight" not in load_file(path / "model.safetensors")
    model = load_model(path)
    assert model.lm_head is model.embed_tokens
    torch.testing.assert_close(_logits(path), _hf_logits(path), atol=1e-4, rtol=0)


def test_untied_embeddings_are_separate(llama_dir: Path) -> None:
    model = load_model(llama_dir)
    assert model.lm_head is not model.embed_tokens
    assert not torch.equal(model.lm_head, model.embed_tokens)


@pytest.mark.parametrize("how", ["argument", "config"])
def test_bf16_load(how: str, tmp_path: Path) -> None:
    path = make_tiny_model(tmp_path, "qwen3")
    if how == "config":
        _edit_config(path, dtype="bfloat16")
        model = load_model(path)
    else:
        model = load_model(path, dtype="bf16")
    assert model.dtype == torch.bfloat16 and model.config.dtype == "bfloat16"
    assert model.make_kv_cache(2, 4)[0].dtype == torch.bfloat16
    logits = PagedRunner(model).step({"a": IDS})["a"]
    assert logits.dtype == torch.float32
    reference = _hf_logits(path, torch.bfloat16)
    assert (logits - reference).abs().max() < 0.1
    assert (logits.argmax(-1) == reference.argmax(-1)).float().mean() > 0.8


def test_explicit_fp32_override_of_bf16_config(tmp_path: Path) -> None:
    path = make_tiny_model(tmp_path, "llama")
    _edit_config(path, dtype="bfloat16")
    assert load_model(path, dtype=torch.float32).dtype == torch.float32
    with pytest.raises(EngineConfigError, match="unsupported dtype"):
        load_model(path, dtype="int4")


def _rewrite_weights(path: Path, drop: str | None = None, add: str | None = None) -> None:
    tensors = load_file(path / "model.safetensors")
    if drop is not None:
        del tensors[drop]
    if add is not None:
        tensors[add] = torch.zeros(3)
    save_file(tensors, path / "model.safetensors")


def test_missing_weight_is_named(tmp_path: Path) -> None:
    path = make_tiny_model(tmp_path, "llama")
    _rewrite_weights(path, drop="model.layers.1.self_attn.k_proj.weight")
    with pytest.raises(EngineConfigError, match=r"lacks 1 weights.*layers\.1\.self_attn\.k_proj"):
        load_model(path)


def test_unexpected_weight_is_named(tmp_path: Path) -> None:
    path = make_tiny_model(tmp_path, "llama")
    _rewrite_weights(path, add="model.layers.0.mlp.extra.weight")
    with pytest.raises(EngineConfigError, match=r"does not\s+use.*mlp\.extra"):
        load_model(path)


def test_ignorable_rotary_buffers_are_skipped(tmp_path: Path, llama_dir: Path) -> None:
    path = make_tiny_model(tmp_path, "llama")
    _rewrite_weights(path, add="model.layers.0.self_attn.rotary_emb.inv_freq")
    torch.testing.assert_close(_logits(path), _logits(llama_dir), atol=0, rtol=0)


def test_shape_mismatch_with_config(tmp_path: Path) -> None:
    path = make_tiny_model(tmp_path, "llama")
    _edit_config(path, intermediate_size=96)
    with pytest.raises(
        EngineConfigError, match=r"mlp\.\w+_proj\.weight.*has shape \(\d+, \d+\), expected"
    ):
        load_model(path)


def test_missing_weights_files(tmp_path: Path) -> None:
    path = make_tiny_model(tmp_path, "llama", max_shard_size="40KB")
    shard = sorted(path.glob("*.safetensors"))[0]
    shard.unlink()
    with pytest.raises(EngineConfigError, match="missing shard"):
        load_model(path)
    (path / "model.safetensors.index.json").unlink()
    for file in path.glob("*.safetensors"):
        file.unlink()
    with pytest.raises(EngineConfigError, match=r"no \*\.safetensors"):
        load_model(path)


def test_corrupt_weights_file(tmp_path: Path) -> None:
    path = make_tiny_model(tmp_path, "llama")
    (path / "model.safetensors").write_bytes(b"\x00garbage")
    with pytest.raises(EngineConfigError, match="cannot read weights"):
        load_model(path)


def test_a_device_torch_cannot_use_is_a_config_error() -> None:
    """``serve --device cuda`` on a CPU-only torch ended in "unexpected AssertionError('Torch
    not compiled with CUDA enabled')"; an unknown name in torch's RuntimeError."""
    from local_engine.default_model import embedded_model_dir
    from local_engine.loader import load_model

    with pytest.raises(EngineConfigError, match="unknown device 'gpu0'"):
        load_model(embedded_model_dir(), device="gpu0")
    if not torch.cuda.is_available():
        with pytest.raises(EngineConfigError, match="no usable CUDA"):
            load_model(embedded_model_dir(), device="cuda")
    else:
        count = torch.cuda.device_count()
        with pytest.raises(EngineConfigError, match="CUDA device"):
            load_model(embedded_model_dir(), device=f"cuda:{count}")
