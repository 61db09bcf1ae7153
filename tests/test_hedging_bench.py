"""bench/hedging.py's simulated provider: the latency shape it promises, common random
numbers, slot accounting for cancelled requests, and a quick run of the benchmark itself.

Nothing here asserts speed: only shapes, counts and that the benchmark runs.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Iterator

import anyio
import httpx
import pytest

from .test_bench_smoke import ROOT, quick_run

sys.path.insert(0, str(ROOT / "bench"))

from _hedge_server import hedge_server_process  # noqa: E402
from _tail import TailModel  # noqa: E402

MEDIAN = 0.002
MODEL = TailModel().with_median(MEDIAN)


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[int(q * (len(ordered) - 1))]


def test_the_tail_model_has_a_heavy_tail() -> None:
    draws = [MODEL.draw_for(1, call, "r0", 0) for call in range(20_000)]
    p50, p99 = quantile(draws, 0.5), quantile(draws, 0.99)
    assert 0.8 * MEDIAN <= p50 <= 1.2 * MEDIAN
    assert 25 <= p99 / p50 <= 100  # "p99/p50 around 50"
    assert max(draws) <= MODEL.tail_cap * MEDIAN + 1e-12
    assert quantile(draws, 0.95) / p50 < 5  # the body stays narrow: a p95 hedge catches the tail
    # a straggler stalls outside the replica: only a bounded part of it takes a slot
    for latency in draws[:2000]:
        stall, busy = MODEL.split(latency)
        assert stall >= 0 and 0 < busy <= MODEL.busy_cap * MEDIAN
        assert stall + busy == pytest.approx(latency)
    assert MODEL.mean_busy() < statistics.fmean(draws) / 1.5


def test_draws_are_a_function_of_call_and_replica() -> None:
    assert MODEL.draw_for(3, 7, "r1", 0) == MODEL.draw_for(3, 7, "r1", 0)
    others = {MODEL.draw_for(3, 7, name, n) for name in ("r0", "r1") for n in (0, 1)}
    assert len(others) == 4  # a hedge to another replica, or a retry, draws anew


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    # busy_cap: every request spends its whole time to first token in its slot, so a
    # straggler holds the one slot long enough to see a disconnect release it
    with hedge_server_process(replicas=2, slots=1, median=MEDIAN, tokens=4, busy_cap=1e6) as url:
        yield url


def body(call: int, stream: bool = True) -> dict[str, object]:
    return {
        "model": "sim",
        "stream": stream,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": f"[call {call}] hello"}],
    }


async def control(http: httpx.AsyncClient, server: str, **command: object) -> None:
    (await http.post(f"{server}/control", json=command)).raise_for_status()


async def stats(http: httpx.AsyncClient, server: str) -> dict[str, dict[str, object]]:
    answer = await http.get(f"{server}/stats")
    replicas: dict[str, dict[str, object]] = answer.json()["replicas"]
    return replicas


@pytest.mark.anyio
async def test_the_server_serves_the_models_draws_and_counts_tokens(server: str) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        await control(http, server, seed=5, reset=True)
        for call in range(30):
            answer = await http.post(f"{server}/r0/v1/chat/completions", json=body(call))
            assert answer.status_code == 200
            assert answer.text.count("data: ") == 1 + 4 + 1 + 1  # first, rest, finish, usage
            assert answer.text.endswith("data: [DONE]\n\n")
        plain = await http.post(f"{server}/r1/v1/chat/completions", json=body(0, stream=False))
        assert plain.json()["usage"]["completion_tokens"] == 4
        r0 = (await stats(http, server))["r0"]
    assert r0["requests"] == r0["completed"] == 30
    assert r0["cancelled"] == r0["failed"] == r0["wasted_prompt_tokens"] == 0
    assert r0["billed_completion_tokens"] == 30 * 4
    assert r0["latencies"] == [MODEL.draw_for(5, call, "r0", 0) for call in range(30)]


@pytest.mark.anyio
async def test_a_client_that_leaves_frees_its_slot_and_is_counted_as_waste(server: str) -> None:
    # a straggler: its first token is at least 50 medians away
    slow = next(c for c in range(10_000) if MODEL.draw_for(9, c, "r0", 0) > 50 * MEDIAN)
    async with httpx.AsyncClient(timeout=30) as http:
        await control(http, server, seed=9, reset=True)
        async with http.stream(
            "POST", f"{server}/r0/v1/chat/completions", json=body(slow)
        ) as response:
            assert response.status_code == 200  # headers come with the slot, before any token
        fast = await http.post(f"{server}/r0/v1/chat/completions", json=body(slow + 1))
        assert fast.status_code == 200
        # The server is another process: poll its counters (bounded) until it has seen the
        # disconnect. Had it missed it, the straggler would end up completed, not cancelled.
        with anyio.fail_after(20):
            while (r0 := (await stats(http, server))["r0"])["cancelled"] + r0["completed"] < 2:  # noqa: ASYNC110
                await anyio.sleep(0.01)
    assert r0["requests"] == 2 and r0["completed"] == 1
    assert r0["wasted_completion_tokens"] == 0
    assert isinstance(r0["wasted_prompt_tokens"], int) and r0["wasted_prompt_tokens"] > 0


@pytest.mark.anyio
async def test_a_failing_replica_answers_503(server: str) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        await control(http, server, failing=["r1"], reset=True)
        try:
            answer = await http.post(f"{server}/r1/v1/chat/completions", json=body(1))
            ok = await http.post(f"{server}/r0/v1/chat/completions", json=body(1))
        finally:
            await control(http, server, failing=[])
        missing = await http.post(f"{server}/r7/v1/chat/completions", json=body(1))
    assert answer.status_code == 503 and "error" in answer.json()
    assert ok.status_code == 200
    assert missing.status_code == 404


@pytest.mark.slow
def test_the_quick_benchmark_prints_its_table() -> None:
    text = quick_run("hedging.py")
    assert "p99.9 ms" in text and "extra req %" in text
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("|")}
    assert "none" in rows and "all" in rows
    # every target at t=0 sends exactly one extra request per call (two targets per call)
    assert rows["all"].split("|")[6].strip() == "100.0"
    assert rows["none"].split("|")[6].strip() == "0.0"
