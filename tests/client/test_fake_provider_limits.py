"""The fake provider's rate limits: RPM and TPM windows, x-ratelimit-* headers on every
chat response, 429 with Retry-After past a limit. Time is a counter the test moves."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from swiftclient import ConfigurationError
from swiftclient.admission import parse_duration, parse_rate_limit_headers
from swiftclient.testing import FakeProvider, ProviderLimits, Reply
from swiftclient.testing._limits import format_duration

pytestmark = pytest.mark.anyio

WORDS = {"model": "m", "messages": [{"role": "user", "content": "one two three"}]}  # 3 tokens


class Ticker:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


async def post(client: httpx.AsyncClient, body: dict[str, Any] = WORDS) -> httpx.Response:
    return await client.post("/chat/completions", json=body)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.02, "20ms"), (1.0, "1s"), (1.5, "1.5s"), (360.0, "6m0s"), (3725.0, "1h2m5s")],
)
def test_durations_in_openais_format_parse_back(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
    assert parse_duration(text) == pytest.approx(seconds)


def test_bad_limits_are_refused() -> None:
    for bad in ({"rpm": 0}, {"tpm": 1.5}, {"window": 0}):
        with pytest.raises(ConfigurationError):
            ProviderLimits(**bad)  # type: ignore[arg-type]


async def test_requests_past_the_rpm_window_get_429_with_retry_after() -> None:
    clock = Ticker()
    limits = ProviderLimits(rpm=2, window=10.0, clock=clock)
    async with FakeProvider(Reply(tokens=2), rate_limits=limits) as fake:
        fake.script(Reply(text="scripted"))
        async with httpx.AsyncClient(base_url=fake.base_url) as client:
            first = await post(client)
            clock.t += 4
            second = await post(client)
            refused = await post(client)
            clock.t += 6  # the first request leaves the window
            third = await post(client)
    assert [r.status_code for r in (first, second, refused, third)] == [200, 200, 429, 200]
    assert first.headers["x-ratelimit-limit-requests"] == "2"
    assert first.headers["x-ratelimit-remaining-requests"] == "1"
    assert first.headers["x-ratelimit-reset-requests"] == "10s"
    assert second.headers["x-ratelimit-remaining-requests"] == "0"
    assert second.headers["x-ratelimit-reset-requests"] == "6s"
    assert refused.headers["retry-after"] == "6"
    assert refused.headers["retry-after-ms"] == "6000"
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"
    assert fake.rate_limited == 1
    # the refused request consumed no scripted reply: the script went to the first
    assert first.json()["choices"][0]["message"]["content"] == "scripted"
    assert third.json()["choices"][0]["message"]["content"] == "tok0 tok1"


async def test_tokens_count_the_replys_usage_against_tpm() -> None:
    clock = Ticker()
    limits = ProviderLimits(tpm=12, window=60.0, clock=clock)
    async with FakeProvider(Reply(tokens=2), rate_limits=limits) as fake:
        async with httpx.AsyncClient(base_url=fake.base_url) as client:
            first = await post(client)  # 3 + 2 tokens
            clock.t += 30
            second = await post(client)  # 10 used
            refused = await post(client)  # would be 15
            clock.t += 30  # the first leaves: 5 used
            third = await post(client)
    assert [r.status_code for r in (first, second, refused, third)] == [200, 200, 429, 200]
    assert first.json()["usage"]["total_tokens"] == 5
    assert first.headers["x-ratelimit-remaining-tokens"] == "7"
    assert second.headers["x-ratelimit-remaining-tokens"] == "2"
    assert refused.headers["retry-after"] == "30"
    assert "x-ratelimit-limit-requests" not in first.headers  # no request limit set
    assert third.headers["x-ratelimit-remaining-tokens"] == "2"


async def test_streamed_responses_carry_the_headers_too() -> None:
    limits = ProviderLimits(rpm=5, tpm=1000, clock=Ticker())
    async with FakeProvider(rate_limits=limits) as fake:
        async with httpx.AsyncClient(base_url=fake.base_url) as client:
            response = await post(client, {**WORDS, "stream": True})
    assert response.status_code == 200
    info = parse_rate_limit_headers(response.headers, 0.0)
    assert info.limits["requests"].limit == 5 and info.limits["requests"].remaining == 4
    assert info.limits["tokens"].remaining == 1000 - 8


async def test_without_limits_nothing_changes() -> None:
    async with FakeProvider() as fake:
        async with httpx.AsyncClient(base_url=fake.base_url) as client:
            responses = [await post(client) for _ in range(5)]
    assert all(r.status_code == 200 for r in responses)
    assert not any(k.startswith("x-ratelimit") for k in responses[0].headers)
    assert fake.rate_limited == 0
