"""bench/engine_peers.py's pure parts, without the peers: its options, the table printer, the
workload generators, the servers' command lines, and the client's token-count check.

The bench itself needs llama.cpp and vLLM installed (bench/setup_engine_peers.sh) and runs
for many minutes, so it is no CI step; nothing here starts a server or asserts a speed.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import httpx
import pytest

from .test_bench_smoke import ROOT

sys.path.insert(0, str(ROOT / "bench"))

from _peer_servers import ENGINES, PeersEnv, launch_for, read_peers_env  # noqa: E402
from _peer_workloads import (  # noqa: E402
    Request,
    Workloads,
    send,
    w1_requests,
    w2_requests,
    w3_requests,
)
from engine_peers import QUICK, Results, main, parse_args, render_table  # noqa: E402

SPEC = {spec.label: spec for spec in ENGINES}


def test_defaults_measure_every_engine_at_the_full_shape() -> None:
    s = parse_args([])
    assert [spec.label for spec in s.engines] == [
        "swiftclient fp32",
        "llama.cpp f32",
        "vllm fp32",
        "swiftclient bf16",
        "llama.cpp bf16",
        "vllm bf16",
        "swiftclient int8",
        "llama.cpp q8_0",
        "swiftclient int4",
        "llama.cpp q4_0",
    ]
    assert s.workloads == ["w1", "w2", "w3"] and s.rounds == 3 and s.threads == 2
    assert s.sizes == Workloads() and s.slots == 32


def test_quick_and_selection_options() -> None:
    s = parse_args(["--quick", "--engines", "swiftclient, vllm", "--precisions", "bf16"])
    assert [spec.label for spec in s.engines] == ["swiftclient bf16", "vllm bf16"]
    assert s.rounds == 1 and s.sizes == QUICK
    s = parse_args(["--workloads", "w3,w1", "--rounds", "5", "--threads", "4"])
    assert s.workloads == ["w1", "w3"] and s.rounds == 5 and s.threads == 4
    assert s.llama_args == ()
    s = parse_args(["--llama-args=--no-repack --poll 0"])
    assert s.llama_args == ("--no-repack", "--poll", "0")


@pytest.mark.parametrize(
    "argv",
    [
        ["--engines", "ollama"],
        ["--precisions", "fp8"],
        ["--workloads", "w4"],
        ["--rounds", "0"],
        ["--engines", "vllm", "--precisions", "int8"],  # vLLM has no int8 row: nothing to run
    ],
)
def test_bad_options_are_usage_errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_the_table_prints_best_median_ratios_notes_and_load() -> None:
    s = parse_args(["--precisions", "bf16,int8"])
    results = Results()
    ours = results.row("w1", SPEC["swiftclient bf16"])
    for decode, ttft in ((10.0, 0.30), (12.0, 0.20), (11.0, 0.25)):
        ours.add("decode", decode)
        ours.add("ttft", ttft)
    peer = results.row("w1", SPEC["llama.cpp bf16"])
    for decode, ttft in ((24.0, 0.40), (20.0, 0.50), (22.0, 0.45)):
        peer.add("decode", decode)
        peer.add("ttft", ttft)
    peer.errors.append("generated 7 tokens, asked 8")
    results.row("w1", SPEC["vllm bf16"]).note = "not run: vllm exited with 1"
    results.load[("w1", "bf16")] = (1.25, 2.5)
    text = render_table("w1", results, s.engines, s)
    assert text.startswith("### W1: batch-1 decode, 128-token prompt, 128 new")
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| ")}
    cells = [c.strip() for c in rows["swiftclient bf16"].strip("|").split("|")]
    assert cells[1:6] == ["12.0", "11.0", "200", "250", "-"]
    cells = [c.strip() for c in rows["llama.cpp bf16"].strip("|").split("|")]
    # decode 12 / 24; TTFT: the peer's 400 ms over swiftclient's 200 ms
    assert cells[1:6] == ["24.0", "22.0", "400", "450", "decode 0.50x, ttft 2.00x"]
    assert "1 errors: generated 7 tokens, asked 8" in cells[6]
    assert "not run: vllm exited with 1" in rows["vllm bf16"]
    assert "swiftclient int8" not in rows  # no row measured, none printed
    assert "1-minute load, bf16 group: 1.25 before, 2.50 after" in text


def test_a_one_column_table_prints_a_bare_ratio() -> None:
    s = parse_args(["--precisions", "int8", "--engines", "swiftclient,llama.cpp"])
    results = Results()
    results.row("w2", SPEC["swiftclient int8"]).add("total", 80.0)
    results.row("w2", SPEC["llama.cpp q8_0"]).add("total", 100.0)
    text = render_table("w2", results, s.engines, s)
    assert "W2: 32 concurrent requests, prompts 32-256 tokens, 64 new each" in text
    assert "| 0.80x " in text


def test_the_workloads_have_their_shapes_and_repeat_by_seed() -> None:
    w = Workloads()
    (one,) = w1_requests(random.Random(1), w, vocab=100)
    assert len(one.prompt) == 128 and one.new_tokens == 128
    batch = w2_requests(random.Random(1), w, vocab=100)
    assert len(batch) == 32 and {r.new_tokens for r in batch} == {64}
    assert all(32 <= len(r.prompt) <= 256 for r in batch)
    assert len({len(r.prompt) for r in batch}) > 8  # lengths vary
    shared = w3_requests(random.Random(1), w, vocab=100)
    assert len(shared) == 16 and {r.new_tokens for r in shared} == {4}
    prefix = shared[0].prompt[:1024]
    assert all(r.prompt[:1024] == prefix and 16 <= len(r.prompt) - 1024 <= 32 for r in shared)
    assert len({r.prompt for r in shared}) == 16  # every suffix its own
    every = [t for r in batch + shared for t in r.prompt]
    assert min(every) >= 0 and max(every) < 100  # no special token
    assert w2_requests(random.Random(1), w, vocab=100) == batch
    assert w2_requests(random.Random(2), w, vocab=100) != batch
    assert w.max_len == 1088  # 1024 + 32 + 4 + 1, rounded up to 64


def test_the_servers_command_lines(tmp_path: Path) -> None:
    server, python = tmp_path / "llama-server", tmp_path / "python"
    server.touch()
    python.touch()
    (tmp_path / "peers.env").write_text(
        f"# written by the set-up script\nLLAMA_SERVER={server}\nVLLM_PYTHON={python}\n"
        "TCMALLOC=/usr/lib/libtcmalloc_minimal.so.4\n"
    )
    peers = read_peers_env(tmp_path)
    ckpt, gguf = tmp_path / "ckpt", tmp_path / "m.gguf"
    args = {"port": 9, "threads": 2, "checkpoint": ckpt, "peers": peers, "slots": 32}
    ours = launch_for(SPEC["swiftclient int8"], gguf=None, max_len=1088, **args)
    assert ours.argv[1:4] == ["-m", "local_engine.server", str(ckpt)]
    assert " --dtype bfloat16 " in " ".join(ours.argv) + " "
    assert ours.argv[-2:] == ["--quantization", "int8"] and "--threads" in ours.argv
    four = launch_for(SPEC["swiftclient int4"], gguf=None, max_len=1088, **args)
    assert four.argv[-2:] == ["--quantization", "int4"]
    llama = launch_for(SPEC["llama.cpp q8_0"], gguf=gguf, max_len=1088, **args)
    line = " ".join(llama.argv)
    assert llama.argv[0] == str(server) and f"-m {gguf}" in line
    assert "-t 2 -tb 2" in line and f"--parallel 32 -c {32 * 1088}" in line
    extra = launch_for(SPEC["llama.cpp q4_0"], gguf=gguf, max_len=1088, llama_args=["-nr"], **args)
    assert extra.argv == [*llama.argv, "-nr"]
    vllm = launch_for(SPEC["vllm fp32"], gguf=None, max_len=1088, **args)
    assert vllm.argv[:3] == [str(python), "-m", "vllm.entrypoints.openai.api_server"]
    assert "--dtype float32" in " ".join(vllm.argv)
    assert vllm.env["LD_PRELOAD"] == "/usr/lib/libtcmalloc_minimal.so.4"
    assert vllm.env["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"
    with pytest.raises(FileNotFoundError, match="LLAMA_QUANTIZE .*setup_engine_peers"):
        peers.path("LLAMA_QUANTIZE")
    with pytest.raises(ValueError, match="needs its GGUF file"):
        launch_for(SPEC["llama.cpp f32"], gguf=None, max_len=1088, **args)
    with pytest.raises(FileNotFoundError, match="setup_engine_peers"):
        read_peers_env(tmp_path / "nowhere")
    assert PeersEnv(tmp_path, {}).tcmalloc == ""


def _sse(events: list[dict[str, object]]) -> bytes:
    lines = [f"data: {json.dumps(event)}\n\n" for event in events] + ["data: [DONE]\n\n"]
    return "".join(lines).encode()


@pytest.mark.anyio
@pytest.mark.parametrize("generated", [3, 2])
async def test_the_client_times_a_stream_and_checks_its_token_counts(generated: int) -> None:
    seen: list[dict[str, object]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        events: list[dict[str, object]] = [
            {"choices": [{"index": 0, "text": ""}]},  # no text yet: not the first token
            {"choices": [{"index": 0, "text": "a"}]},
            {"choices": [{"index": 0, "text": "b"}]},
            {"choices": [{"index": 0, "text": "c", "finish_reason": "length"}]},
            {
                "choices": [],
                "usage": {"prompt_tokens": 5, "completion_tokens": generated},
                "timings": {"cache_n": 4},
            },
        ]
        return httpx.Response(200, content=_sse(events))

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        outcome = await send(
            client, "http://peer/v1", Request((1, 2, 3, 4, 5), 3), min_tokens=True, model="bench"
        )
    assert seen[0]["prompt"] == [1, 2, 3, 4, 5] and seen[0]["max_tokens"] == 3
    assert seen[0]["min_tokens"] == 3 and seen[0]["ignore_eos"] is True
    assert seen[0]["temperature"] == 0.0
    assert outcome.start < outcome.first < outcome.last and outcome.cached_tokens == 4
    if generated == 3:
        assert outcome.errors == [] and outcome.decode_rate > 0
    else:
        assert outcome.errors == ["generated 2 tokens, asked 3"]


@pytest.mark.anyio
async def test_an_error_status_is_recorded_not_raised() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(400, json={"error": {"message": "min_tokens unknown"}})

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        outcome = await send(
            client, "http://peer/v1", Request((1,), 2), min_tokens=False, model="m"
        )
    assert outcome.errors and outcome.errors[0].startswith("HTTP 400: ")
    assert "min_tokens unknown" in outcome.errors[0]


def test_without_the_peers_the_bench_says_how_to_install_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--quick", "--engines", "vllm", "--dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'peers.env'} is missing" in err and "setup_engine_peers.sh" in err
