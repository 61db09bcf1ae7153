"""The matmul options for quantized weights on this CPU, at the engine's shapes.

Run from the repository root::

    .venv/bin/python bench/quant_matmul.py                # about a minute
    .venv/bin/python bench/quant_matmul.py --rows 1 32    # chosen row counts only

For each projection of the ``swift-50m`` model (fused q/k/v, fused gate/up, down, the LM
head) and each row count, it times, in interleaved rounds (best round kept, so load on a
shared machine only ever adds time):

- ``fp32``: ``F.linear`` in float32 (the engine's float32 path);
- ``bf16``: ``F.linear`` in bfloat16 (oneDNN, AVX-512 BF16 where the CPU has it);
- ``int8 fused``: ``torch._weight_int8pack_mm``, bfloat16 activations, int8 weights with
  per-row scales (what :class:`local_engine.quant.Int8Weight` runs up to ``DEQUANT_ROWS``);
- ``int8 dequant``: the int8 weight dequantized into a bfloat16 buffer, then ``F.linear``
  (what it runs above that);
- ``int8 dynamic``: ``torch._int_mm`` on activations quantized per row at run time
  (int8 x int8 -> int32, W8A8): shown for comparison, the engine does not use it.

Microseconds per call; lower is better.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from _util import markdown_table

from local_engine.quant import quantize_rows

SHAPES = {  # swift-50m: hidden 512, 8 heads + 2 x 4 KV heads of 64, MLP 1536, vocab 8192
    "qkv 1024x512": (1024, 512),
    "gate_up 3072x512": (3072, 512),
    "down 512x1536": (512, 1536),
    "lm_head 8192x512": (8192, 512),
}
CANDIDATES = ("fp32", "bf16", "int8 fused", "int8 dequant", "int8 dynamic")


def _candidates(n: int, k: int, rows: int) -> dict[str, Callable[[], object]]:
    gen = torch.Generator().manual_seed(n + k)
    weight = torch.randn(n, k, generator=gen) * 0.05
    x = torch.randn(rows, k, generator=gen)
    codes, scales = quantize_rows(weight, torch.bfloat16)
    wb, xb = weight.to(torch.bfloat16), x.to(torch.bfloat16)
    buffer = torch.empty(n, k, dtype=torch.bfloat16)
    codes_t = codes.t().contiguous()
    scales_f = scales.float()

    def dequant() -> object:
        torch.mul(codes, scales.unsqueeze(1), out=buffer)
        return F.linear(xb, buffer)

    def dynamic() -> object:
        row_scale = xb.abs().amax(1, keepdim=True).float() / 127
        xq = (xb.float() / row_scale).round_().to(torch.int8)
        return (torch._int_mm(xq, codes_t).float() * (row_scale * scales_f)).to(torch.bfloat16)

    return {
        "fp32": lambda: F.linear(x, weight),
        "bf16": lambda: F.linear(xb, wb),
        "int8 fused": lambda: torch._weight_int8pack_mm(xb, codes, scales),
        "int8 dequant": dequant,
        "int8 dynamic": dynamic,
    }


def measure(n: int, k: int, rows: int, rounds: int) -> dict[str, float]:
    """Best-round microseconds per call of every candidate, rounds interleaved."""
    calls = _candidates(n, k, rows)
    reps = max(3, 4000 // (rows * max(1, n * k // 500_000)))
    best = dict.fromkeys(calls, float("inf"))
    with torch.inference_mode():
        for call in calls.values():
            call()
        for _ in range(rounds):
            for name, call in calls.items():
                start = time.perf_counter()
                for _ in range(reps):
                    call()
                best[name] = min(best[name], (time.perf_counter() - start) / reps * 1e6)
    return best


def main(argv: Sequence[str] | None = None) -> int:
    """Print one markdown table: a line per (projection, rows), a column per candidate."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32, 128, 512])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    if args.threads < 1 or args.rounds < 1 or min(args.rows) < 1:
        parser.error("--rows, --threads and --rounds must be positive")
    torch.set_num_threads(args.threads)
    table = []
    for label, (n, k) in SHAPES.items():
        for rows in args.rows:
            best = measure(n, k, rows, args.rounds)
            table.append([label, rows, *(f"{best[c]:.0f}" for c in CANDIDATES)])
    print(
        f"torch {torch.__version__}, {args.threads} threads, CPU capability "
        f"{torch.backends.cpu.get_cpu_capability()}; microseconds per call (best round)\n"
    )
    print(markdown_table(["projection", "rows", *CANDIDATES], table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
