"""The native kernels' worker pool: the same results on any number of threads, from several
Python threads at once, in a forked child, and with the pool switched off.

The pool's state (its workers, the switch) is per process, so those cases run in a fresh
interpreter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest
import torch

from local_engine.attention.native import POOL_ENV, PagedDecodeKernel

# A norm of 65,536 values and a 1 MiB weight: above the pool's parallel thresholds, so two
# threads split them.
NORM_SHAPE = (64, 1024)
LINEAR_SHAPE = (512, 1024)


def test_kernels_called_from_several_threads_at_once_agree(kernel: PagedDecodeKernel) -> None:
    cases = []
    for seed in range(4):
        g = torch.Generator().manual_seed(seed)
        x, w = torch.randn(*NORM_SHAPE, generator=g), torch.randn(NORM_SHAPE[1], generator=g)
        xb = torch.randn(3, LINEAR_SHAPE[1], generator=g).to(torch.bfloat16)
        wb = (0.1 * torch.randn(*LINEAR_SHAPE, generator=g)).to(torch.bfloat16)
        norm = kernel.rms_norm(x, w, 1e-6, 1)
        linear = kernel.linear(xb, wb, None, None, 1)  # None without AVX-512 BF16
        cases.append((x, w, norm, xb, wb, linear))
    errors: list[str] = []

    def work(worker: int) -> None:
        try:
            for i in range(40):
                x, w, norm, xb, wb, linear = cases[(worker + i) % len(cases)]
                if not torch.equal(kernel.rms_norm(x, w, 1e-6, 2), norm):
                    errors.append(f"norm differs (thread {worker}, call {i})")
                if linear is not None and not torch.equal(
                    kernel.linear(xb, wb, None, None, 2), linear
                ):
                    errors.append(f"linear differs (thread {worker}, call {i})")
        except Exception as exc:  # noqa: BLE001 - reported below, not lost in the thread
            errors.append(repr(exc))

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads), "a kernel call hung"
    assert errors == []


_SCRIPT = """
import json, os
import local_engine
import torch
from local_engine.attention.native import load_paged_decode

k = load_paged_decode()
g = torch.Generator().manual_seed(0)
x, w = torch.randn(64, 1024, generator=g), torch.randn(1024, generator=g)
ref = k.rms_norm(x, w, 1e-6, 1)
report = {"after_one": k.pool_workers()}
same = torch.equal(k.rms_norm(x, w, 1e-6, 2), ref)
report["after_two"] = k.pool_workers()
same = same and torch.equal(k.rms_norm(x, w, 1e-6, 3), ref)
report["after_three"] = k.pool_workers()
same = same and torch.equal(k.rms_norm(x, w, 1e-6, 1), ref)
expected = ref.numpy().tobytes()
read, write = os.pipe()
pid = os.fork()
if pid == 0:  # only the kernel and plain bytes here: no torch parallel region in the child
    got = k.rms_norm(x, w, 1e-6, 2).numpy().tobytes()
    os.write(write, json.dumps({"ok": got == expected, "workers": k.pool_workers()}).encode())
    os._exit(0)
os.close(write)
child = json.loads(os.read(read, 4096))
_, status = os.waitpid(pid, 0)
report.update(same=same, child=child, child_status=status, after_fork=k.pool_workers())
print(json.dumps(report))
"""


def _run(**env: str) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", _SCRIPT],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    result: dict[str, object] = json.loads(out.stdout.splitlines()[-1])
    return result


def test_the_pool_honours_thread_counts_and_survives_fork(kernel: PagedDecodeKernel) -> None:
    if kernel.pool_workers() is None and os.environ.get(POOL_ENV) is None:
        pytest.skip("this build has no worker pool")
    report = _run(**{POOL_ENV: "1"})
    # one thread starts no worker; each extra thread asked for is one more worker
    assert report["after_one"] == 0
    assert report["after_two"] == 1
    assert report["after_three"] == 2
    assert report["same"] is True
    # the child starts its own worker (the parent's do not exist there) and gets the result
    assert report["child"] == {"ok": True, "workers": 1}
    assert report["child_status"] == 0
    assert report["after_fork"] == 2


def test_the_pool_can_be_switched_off(kernel: PagedDecodeKernel) -> None:
    report = _run(**{POOL_ENV: "0"})
    assert report["after_one"] is None and report["after_three"] is None
    assert report["same"] is True
    assert report["child"] == {"ok": True, "workers": None}
    assert report["child_status"] == 0
