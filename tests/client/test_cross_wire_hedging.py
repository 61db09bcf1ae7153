"""One call across three wires: ``model=["anthropic/...", "openai/...", "local/default"]``
with Anthropic's Messages API, OpenAI's Responses API and a chat-completions server (the
local engine's wire), each a fake provider. Hedges and fallbacks cross wires under the
call's one deadline, and every attempt has its span and its share of the cost."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager

import anyio
import pytest

from swiftclient import (
    AnthropicBackend,
    AsyncClient,
    DeadlineExceeded,
    Hedge,
    HTTPBackend,
    Price,
    Pricing,
    ResponsesBackend,
    RetryPolicy,
    Timeout,
)
from swiftclient.testing import FakeProvider, Reply

from ..otel import Otel, attrs, recording
from .mock import HELD

pytestmark = pytest.mark.anyio

KEY = "sk-cross-wire-test-key"
MODELS = ["anthropic/claude-sonnet-4-5", "openai/gpt-5", "local/default"]
PRICE = Price(per_input_token=1e-6, per_output_token=2e-6)
RELEASE_LIMIT = 30.0  # seconds; bounds waiting for cleanup, never a speed assertion


@pytest.fixture
def otel() -> Iterator[Otel]:
    yield from recording()


@asynccontextmanager
async def three_wires(otel: Otel) -> AsyncIterator[tuple[dict[str, FakeProvider], AsyncClient]]:
    """A fake per wire, each answering its own name, and a client over all three."""
    async with AsyncExitStack() as stack:
        fakes = {
            name: await stack.enter_async_context(
                FakeProvider(Reply(text=f"from {name}"), api_key=KEY)
            )
            for name in ("anthropic", "openai", "local")
        }
        backends = {
            "anthropic": AnthropicBackend(fakes["anthropic"].base_url, KEY),
            "openai": ResponsesBackend(fakes["openai"].base_url, KEY, name="openai"),
            "local": HTTPBackend(fakes["local"].base_url, KEY, name="local"),
        }
        client = await stack.enter_async_context(
            AsyncClient(
                backends=backends,
                retry=RetryPolicy.none(),
                pricing=Pricing({"*": PRICE}),
                telemetry=otel.telemetry(),
            )
        )
        yield fakes, client


async def idle(*fakes: FakeProvider) -> None:
    with anyio.fail_after(RELEASE_LIMIT):
        for fake in fakes:
            await fake.wait_until_idle()


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
async def test_a_hedge_crosses_from_the_messages_wire_to_the_responses_wire(
    otel: Otel, streamed: bool
) -> None:
    async with three_wires(otel) as (fakes, client):
        fakes["anthropic"].script(HELD)
        completion = await client.chat("hi", model=MODELS, hedge=Hedge(delay=0.05), stream=streamed)
        await idle(*fakes.values())
    assert completion.text == "from openai"
    assert completion.timing is not None
    attempts = completion.timing.attempts
    assert [(a.backend, a.trigger, a.outcome) for a in attempts] == [
        ("anthropic", "first", "lost"),
        ("openai", "hedge", "ok"),
    ]
    assert fakes["anthropic"].requests[0].path == "/v1/messages"
    assert fakes["openai"].requests[0].path == "/v1/responses"
    assert not fakes["local"].requests
    spans = otel.attempt_spans()
    assert [attrs(s)["swiftclient.target"] for s in spans] == MODELS[:2]
    assert [attrs(s)["gen_ai.provider.name"] for s in spans] == ["anthropic", "openai"]
    assert [attrs(s)["swiftclient.trigger"] for s in spans] == ["first", "hedge"]
    cost = completion.timing.cost
    assert cost is not None and cost.attempts == 2 and cost.wasted_requests == 1
    assert cost.cost is not None and cost.wasted_cost is not None
    assert cost.cost > cost.wasted_cost > 0  # the lost Messages attempt is billed as waste


async def test_failures_fall_back_across_all_three_wires(otel: Otel) -> None:
    async with three_wires(otel) as (fakes, client):
        fakes["anthropic"].script(Reply(status=529, error_message="Overloaded"))
        fakes["openai"].script(Reply(status=500))
        completion = await client.chat("hi", model=MODELS)
    assert completion.text == "from local"
    assert completion.timing is not None
    assert [(a.backend, a.trigger, a.outcome) for a in completion.timing.attempts] == [
        ("anthropic", "first", "error"),
        ("openai", "fallback", "error"),
        ("local", "fallback", "ok"),
    ]
    spans = otel.attempt_spans()
    assert [attrs(s)["swiftclient.target"] for s in spans] == MODELS
    assert [attrs(s).get("error.type") for s in spans] == ["529", "500", None]
    cost = completion.timing.cost
    assert cost is not None and cost.attempts == 3 and cost.wasted_requests == 2


async def test_one_deadline_ends_the_call_on_every_wire(otel: Otel) -> None:
    async with three_wires(otel) as (fakes, client):
        for fake in fakes.values():
            fake.script(HELD)
        with pytest.raises(DeadlineExceeded) as caught:
            await client.chat(
                "hi",
                model=MODELS,
                hedge=Hedge(delay=0.0, max_attempts=3),
                timeout=Timeout(total=0.3),
            )
        await idle(*fakes.values())
    ended = [(a.backend, a.outcome) for a in caught.value.attempts]
    assert [backend for backend, _ in ended] == ["anthropic", "openai", "local"]
    assert {outcome for _, outcome in ended} <= {"error", "cancelled"}
    assert len(otel.attempt_spans()) == 3
