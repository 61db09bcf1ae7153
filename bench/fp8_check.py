"""The fp8 check: is the fp8 weights' loss the method's or the engine's?

Run from the repository root::

    python bench/fp8_check.py               # on a CUDA GPU (8.9+), meant for under 90 s
    python bench/fp8_check.py --init 0.02   # the same with transformers' default init
    python bench/fp8_check.py --smoke       # a tiny model on CPU in seconds (the tests run it)

Two parts, each a markdown table with its goal and verdict:

1. The rowwise ``_scaled_mm`` contract. :meth:`Fp8Weight.linear` (fp8 codes of the weight
   and of the per-token quantized input, ``torch._scaled_mm`` with both scales, bfloat16 out)
   against :meth:`Fp8Weight.reference_linear` (the same codes dequantized, float32 matmul), at
   the model's four projection shapes, for 1, 7 and 64 tokens, with weight rows and input
   tokens whose magnitudes span six decades: a scale applied to the wrong axis or token, a
   transposed operand or a clamped code shows as a large error. Goal: each token's relative
   error (``|got - want| / |want|`` over its row) <= 0.01 (bfloat16 output rounding is 0.002).
2. The model. bench/gpu.py's checkpoint (random weights in the Qwen3-0.6B shape) and its
   part-0 prompts, as logits of: the engine in bfloat16 and with fp8 weights, transformers in
   float32, and a float32 emulation of the fp8 method in transformers (each of the seven
   projections' weights rounded to e4m3 with one scale per output row, its input rounded to
   e4m3 with one scale per token; the quantizer is written here, not taken from the engine).
   The engine's fp8 is judged against what the emulation loses to float32: the engine's fp8
   path is sound when it loses no more (cosine to float32 within 0.03 of the emulation's).

On CPU (``--smoke``) the engine's fp8 arithmetic runs through torch's CPU ``_scaled_mm``: the
loader refuses fp8 off a capable GPU, so this script lifts that check for its own load.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import torch
import torch.nn.functional as F
from _util import markdown_table, verdict
from gpu import (
    QWEN3_06B,
    TINY,
    _agreement,
    build_checkpoint,
    hf_logits,
    hf_model,
    model_logits,
    random_prompts,
)

from local_engine.fp8 import FP8_DTYPE, Fp8Weight
from local_engine.loader import load_model

E4M3_MAX = 448.0
CONTRACT_GOAL = 0.01
METHOD_MARGIN = 0.03
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def fake_fp8_rows(x: torch.Tensor) -> torch.Tensor:
    """``x`` rounded to e4m3 with one float32 scale per row of the last axis, in float32."""
    rows = x.detach().reshape(-1, x.shape[-1]).to(torch.float32)
    scale = rows.abs().amax(dim=1, keepdim=True).div(E4M3_MAX).clamp(min=1e-30)
    codes = (rows / scale).clamp(-E4M3_MAX, E4M3_MAX).to(FP8_DTYPE)
    return (codes.to(torch.float32) * scale).reshape(x.shape)


def _row_errors(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """Each row's ``|got - want| / |want|`` (a wrong per-token scale keeps the cosine)."""
    return (got.float() - want).norm(dim=-1) / want.norm(dim=-1)


def check_contract(shape: dict[str, Any], device: torch.device) -> bool:
    """Part 1: ``Fp8Weight.linear`` against its float32 reference at the projection shapes;
    True when every token's error is within the goal."""
    torch.manual_seed(0)
    hidden, inter = shape["hidden_size"], shape["intermediate_size"]
    heads, kv, hd = shape["num_attention_heads"], shape["num_key_value_heads"], shape["head_dim"]
    shapes = {
        "qkv": ((heads + 2 * kv) * hd, hidden),
        "o": (hidden, heads * hd),
        "gate_up": (2 * inter, hidden),
        "down": (hidden, inter),
    }
    rows: list[list[object]] = []
    ok = True
    for name, (n, k) in shapes.items():
        dense = torch.randn(n, k, device=device) * torch.logspace(-3, 3, n, device=device)[:, None]
        weight = Fp8Weight(n, k, device=device)
        weight.rows(0, n).copy_(dense)
        for tokens in (1, 7, 64):
            x = torch.randn(tokens, k, device=device)
            x = (x * torch.logspace(3, -3, tokens, device=device)[:, None]).to(torch.bfloat16)
            got = weight.linear(x)
            want = weight.reference_linear(x)
            worst = _row_errors(got, want).max().item()
            dense_err = _row_errors(got, F.linear(x.float(), dense)).max().item()
            passed = worst <= CONTRACT_GOAL
            ok &= passed
            rows.append(
                [name, f"{n}x{k}", tokens, f"{worst:.5f}", f"{dense_err:.4f}", verdict(passed)]
            )
    print(
        markdown_table(
            [
                "projection",
                "weight",
                "tokens",
                "error vs reference (worst token)",
                "vs dense weight",
                f"goal <= {CONTRACT_GOAL}",
            ],
            rows,
        )
    )
    return ok


@contextlib.contextmanager
def _fp8_anywhere(device: str) -> Iterator[None]:
    """Off CUDA, let the loader build fp8 weights (torch's CPU ``_scaled_mm`` does the
    arithmetic); on CUDA, the engine's own device check stands."""
    if device == "cuda":
        yield
        return
    with mock.patch("local_engine.model.check_fp8_device", lambda _device: None):
        yield


def emulated_fp8(model: Any) -> Callable[[], None]:
    """Turn a float32 transformers Qwen3 into the fp8 method's emulation, in place; the
    returned function undoes it."""
    saved: list[tuple[torch.nn.Linear, torch.Tensor]] = []
    hooks = []
    for layer in model.model.layers:
        for name in PROJECTIONS:
            module = getattr(layer.self_attn if name in PROJECTIONS[:4] else layer.mlp, name)
            saved.append((module, module.weight.data))
            module.weight.data = fake_fp8_rows(module.weight.data)
            hooks.append(
                module.register_forward_pre_hook(lambda _m, args: (fake_fp8_rows(args[0]),))
            )

    def undo() -> None:
        for module, weight in saved:
            module.weight.data = weight
        for hook in hooks:
            hook.remove()

    return undo


def check_model(path: Path, shape: dict[str, Any], device: str, prompts: int) -> bool:
    """Part 2: the engine's fp8 and the float32 emulation against float32 and bfloat16;
    True when the engine's fp8 loses no more than the emulation (within the margin)."""
    ids = random_prompts(random.Random(0), [64] * 4, shape["vocab_size"])[:prompts]
    bf16 = load_model(path, dtype="bfloat16", device=device)
    ours16 = [model_logits(bf16, p) for p in ids]
    del bf16
    with _fp8_anywhere(device):
        fp8 = load_model(path, dtype="bfloat16", device=device, quantization="fp8")
    ours8 = [model_logits(fp8, p) for p in ids]
    del fp8
    hf = hf_model(path, torch.float32, device)
    ref = [hf_logits(hf, p) for p in ids]
    undo = emulated_fp8(hf)
    emu = [hf_logits(hf, p) for p in ids]
    undo()
    rows: list[list[object]] = [
        ["engine fp8 vs engine bf16 (gpu.py's row)", *_agreement(ours8, ours16)],
        ["fp8 emulation (float32) vs transformers float32", *_agreement(emu, ref)],
        ["engine fp8 vs transformers float32", *_agreement(ours8, ref)],
        ["engine fp8 vs fp8 emulation", *_agreement(ours8, emu)],
        ["engine bf16 vs transformers float32", *_agreement(ours16, ref)],
    ]
    print(markdown_table(["logits", "top-1 agreement", "max |delta|", "cosine (worst)"], rows))
    engine_cos, method_cos = float(str(rows[2][3])), float(str(rows[1][3]))
    sound = engine_cos >= method_cos - METHOD_MARGIN
    print(
        f"\nthe engine's fp8 loses no more than the method (cosine to float32 {engine_cos:.5f} "
        f"against the emulation's {method_cos:.5f}, margin {METHOD_MARGIN}): {verdict(sound)}"
    )
    return sound


def main(argv: list[str] | None = None) -> int:
    """Run both parts; exit 0 whatever the verdicts (FAIL marks a missed goal)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny model on CPU, seconds")
    parser.add_argument("--prompts", type=int, default=4, help="prompts of part 2 (1-4)")
    parser.add_argument(
        "--init", type=float, help="initializer_range (default: bench/gpu.py's 0.05)"
    )
    args = parser.parse_args(argv)
    device = "cpu" if args.smoke else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device here: run with --smoke for the CPU smoke run", file=sys.stderr)
        return 2
    shape = TINY if args.smoke else QWEN3_06B
    print(f"# fp8 check ({'smoke, CPU' if args.smoke else torch.cuda.get_device_name()})\n")
    start = time.perf_counter()
    print("## 1. Rowwise _scaled_mm against its float32 reference\n")
    check_contract(shape, torch.device(device))
    with tempfile.TemporaryDirectory() as tmp:
        path = build_checkpoint(Path(tmp), shape, initializer_range=args.init)
        print(f"\n({time.perf_counter() - start:.1f} s)\n\n## 2. The model\n")
        check_model(path, shape, device, max(1, min(4, args.prompts)))
    print(f"\n({time.perf_counter() - start:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
