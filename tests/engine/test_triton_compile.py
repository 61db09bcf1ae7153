"""Every Triton kernel compiles for a Hopper GPU (sm_90), with no GPU here.

CI runs the kernels under Triton's interpreter, which executes the Python body and so never
sees what only the compiler checks: names a kernel may not read (a type annotation such as
``Any``), or a variable whose integer type differs between the branches of an ``if``. Both
reached the first run on an H200. This test compiles each kernel through Triton's own
compiler, down to machine code, for the argument types the engine passes: index tensors in
int32 (metadata built per step) and int64 (the persistent step buffers), data in float32 and
bfloat16. It runs in a subprocess, because this test session imports the kernels for the
interpreter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

_COMPILE_ALL = r"""
import json, os, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

import local_engine.attention.triton_kernels as k

assert not k.INTERPRETING
INDEX = ("slot", "tables", "lens", "starts")
# the launched kernels (helpers such as _attend_block compile as part of them)
kernels = [(n, f) for n, f in vars(k).items() if isinstance(f, triton.JITFunction)]
kernels = [(n, f) for n, f in kernels if n.endswith("_kernel")]
results = {}
for index in ("i32", "i64"):
    for data, upcast in (("fp32", False), ("bf16", True)):
        for name, fn in kernels:
            signature, constants = {}, {}
            for i, p in enumerate(fn.params):
                if p.is_constexpr:
                    signature[p.name] = "constexpr"
                    constants[(i,)] = {"UPCAST": upcast, "PRECISION": "ieee"}.get(p.name, 16)
                elif p.name.endswith("_ptr"):
                    kind = index if any(w in p.name for w in INDEX) else data
                    signature[p.name] = "*fp32" if "lse" in p.name else f"*{kind}"
                else:
                    signature[p.name] = "i32"
            key = f"{name} index={index} data={data}"
            try:
                compiled = triton.compile(
                    ASTSource(fn, signature, constants), target=GPUTarget("cuda", 90, 32)
                )
                results[key] = "ok" if compiled.asm.get("cubin") else "no cubin"
            except Exception as exc:
                results[key] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1]}"
print(json.dumps(results))
"""


def _nvidia_backend() -> bool:
    try:
        from triton.backends.nvidia import compiler  # noqa: F401
    except Exception:
        return False
    return True


@pytest.mark.slow
@pytest.mark.skipif(not _nvidia_backend(), reason="this Triton has no NVIDIA backend")
def test_every_triton_kernel_compiles_for_sm90() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT)])
    env["TRITON_DEFAULT_FP_FUSION"] = "1"  # Triton 3.9 warns when it is unset
    proc = subprocess.run(
        [sys.executable, "-c", _COMPILE_ALL],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    names = {key.split()[0] for key in results}
    assert {"_store_kv_kernel", "_decode_split_kernel", "_prefill_kernel"} <= names
    failed = {key: why for key, why in results.items() if why != "ok"}
    assert not failed, failed
