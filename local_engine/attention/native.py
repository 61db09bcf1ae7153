"""The CPU paged-decode kernel: C source shipped with the package, compiled on first use.

The kernel (``csrc/paged_decode.c``) is plain C99 with no Python or torch headers, so
building it takes well under a second with the system C compiler. Its threads are an OpenMP
team on torch's own runtime where torch uses GNU OpenMP (Linux wheels), else pthreads. The shared
library is cached under ``<cache root>/kernels/`` (the root is ``$SWIFTCLIENT_CACHE_DIR`` or
``~/.cache/swiftclient``), named by a hash of the source, the compiler, its flags and the
machine, and written to a temporary file that is renamed into place, so concurrent first
uses are safe. It is loaded with :mod:`ctypes`.

Where no compiler works (``$CC``, else ``cc``), or ``SWIFTCLIENT_NATIVE_KERNELS=0`` is set,
:func:`load_paged_decode` returns ``None`` and the engine keeps the portable SDPA path; the
reason is logged once on the ``local_engine`` logger.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import logging
import os
import platform
import secrets
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# torch first: its OpenMP runtime must be loaded before the kernel library, which then
# shares it (see torch_uses_gomp).
import torch  # noqa: F401  # isort: skip

from local_engine.default_model import default_cache_root

__all__ = [
    "DISABLE_ENV",
    "KernelError",
    "PagedDecodeKernel",
    "build_library",
    "load_paged_decode",
    "open_library",
    "torch_uses_gomp",
]

logger = logging.getLogger("local_engine")

DISABLE_ENV = "SWIFTCLIENT_NATIVE_KERNELS"
SOURCE = Path(__file__).with_name("csrc") / "paged_decode.c"
SYMBOL = "swift_paged_decode_f32"
MAX_GROUP = 16
"""Query heads per KV head the kernel takes (``MAX_GROUP`` in the C source)."""
MAX_HEADS = 256
"""Query heads the kernel takes (``MAX_HEADS`` in the C source)."""

# Tried in order: the first set that compiles wins. ``-march=native`` lets the compiler use
# the machine's vector units (AVX-512 paths are written out in the source).
_FLAG_SETS = (
    ("-O3", "-march=native", "-fno-math-errno"),
    ("-O3", "-fno-math-errno"),
)
_OPENMP = "-fopenmp"
_COMPILE_TIMEOUT_S = 120

_I64 = ctypes.c_int64
_PTR = ctypes.c_void_p
_ARGTYPES = [_PTR, _I64, _I64, _PTR, _PTR, _PTR, _I64, _PTR, _PTR]
_ARGTYPES += [_I64] * 8 + [ctypes.c_float, ctypes.c_int]


class KernelError(RuntimeError):
    """The kernel refused its arguments or ran out of scratch memory."""


@dataclass(frozen=True)
class PagedDecodeKernel:
    """The loaded kernel; :meth:`__call__` takes raw pointers (see the C source)."""

    path: Path
    _fn: Callable[..., int]

    def __call__(
        self,
        *,
        q: int,
        q_strides: tuple[int, int],
        k: int,
        v: int,
        tables: int,
        table_stride: int,
        lens: int,
        out: int,
        shape: tuple[int, int, int, int],
        block_size: int,
        window: int,
        max_len: int,
        num_blocks: int,
        scale: float,
        threads: int,
    ) -> None:
        """Run the kernel; ``shape`` is ``(rows, heads, kv_heads, dim)``.

        Every block id a row uses is checked against ``num_blocks`` first.

        Raises:
            KernelError: the kernel returned a non-zero status.
        """
        rows, heads, kv_heads, dim = shape
        status = self._fn(
            q,
            q_strides[0],
            q_strides[1],
            k,
            v,
            tables,
            table_stride,
            lens,
            out,
            rows,
            heads,
            kv_heads,
            dim,
            block_size,
            window,
            max_len,
            num_blocks,
            scale,
            threads,
        )
        if status:
            what = "out of scratch memory" if status == 1 else "arguments out of its limits"
            raise KernelError(f"paged decode kernel failed ({what}, status {status})")


def torch_uses_gomp() -> bool:
    """True when this process has GNU OpenMP loaded (torch's Linux wheels bring their own).

    Only then is the kernel built with ``-fopenmp``: the dynamic loader resolves its
    ``libgomp.so.1`` to the copy already loaded, so the kernel runs on torch's own worker
    threads. Those spin for a while after every parallel torch op; a separate pool of
    threads would only fight them for the cores.
    """
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return False
    return "libgomp" in maps


def build_library(
    directory: Path, *, compiler: str | None = None, openmp: bool | None = None
) -> Path:
    """Compile the kernel into ``directory`` (or find it there) and return the library path.

    ``openmp`` (default: :func:`torch_uses_gomp`) adds ``-fopenmp`` to the first flag sets
    tried, with the plain ones as the fallback.

    Raises:
        OSError: no flag set compiled (the compiler's last error is in the message), or
            the compiler is missing.
    """
    cc = compiler or os.environ.get("CC") or "cc"
    exe = shutil.which(cc)
    if exe is None:
        raise OSError(f"no C compiler {cc!r} on PATH")
    source = SOURCE.read_bytes()
    directory.mkdir(parents=True, exist_ok=True)
    errors: list[str] = []
    flag_sets = list(_FLAG_SETS)
    if torch_uses_gomp() if openmp is None else openmp:
        flag_sets = [(*flags, _OPENMP) for flags in _FLAG_SETS] + flag_sets
    for flags in flag_sets:
        parts = [source, exe.encode(), " ".join(flags).encode(), platform.machine().encode()]
        digest = hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]
        target = directory / f"paged_decode-{digest}.so"
        if target.exists():
            return target
        scratch = directory / f".paged_decode-{digest}.{os.getpid()}-{secrets.token_hex(4)}.so"
        cmd = [exe, *flags, "-shared", "-fPIC", "-pthread", "-o", str(scratch), str(SOURCE), "-lm"]
        try:
            done = subprocess.run(
                cmd, capture_output=True, text=True, timeout=_COMPILE_TIMEOUT_S, check=False
            )
            if done.returncode == 0 and scratch.exists():
                os.replace(scratch, target)  # atomic; a concurrent builder's copy is identical
                return target
            errors.append(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "")
        except subprocess.TimeoutExpired:
            errors.append(f"timed out after {_COMPILE_TIMEOUT_S} s")
        finally:
            with contextlib.suppress(OSError):
                scratch.unlink()
    raise OSError(f"could not compile {SOURCE.name} with {cc}: {errors[-1] or 'unknown error'}")


@functools.cache
def load_paged_decode() -> PagedDecodeKernel | None:
    """The kernel, built and loaded once per process; ``None`` where it cannot be."""
    if os.environ.get(DISABLE_ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        logger.info("native CPU kernels disabled by %s", DISABLE_ENV)
        return None
    try:
        return open_library(build_library(default_cache_root() / "kernels"))
    except OSError as exc:
        logger.warning("CPU paged-decode kernel unavailable, using SDPA attention: %s", exc)
        return None


def open_library(path: Path) -> PagedDecodeKernel:
    """Load a library built by :func:`build_library`.

    Raises:
        OSError: it cannot be loaded or lacks the kernel's symbol.
    """
    try:
        fn = getattr(ctypes.CDLL(str(path)), SYMBOL)
    except AttributeError as exc:
        raise OSError(f"{path} has no {SYMBOL}") from exc
    fn.argtypes = _ARGTYPES
    fn.restype = ctypes.c_int
    return PagedDecodeKernel(path, fn)
