"""Agent frameworks on the openai SDK, over swiftclient's transport: pydantic-ai and
openai-agents, with tools, structured output and streaming, against :class:`FakeProvider`.

Each framework also makes one hedged call between a slow and a fast target: the fast one
must win and the slow one's request must be cancelled (the fake providers' counters).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import httpx2
import openai
import pydantic
import pytest

from swiftclient import AsyncClient, Hedge, HTTPBackend, RetryPolicy
from swiftclient.routing import Router
from swiftclient.testing import FakeProvider, Reply
from swiftclient.transports import AsyncTransport

from .mock import settle

pytestmark = [
    pytest.mark.anyio,
    # The openai SDK leaves its SSE async generators for the loop to finalize (trio warns).
    pytest.mark.filterwarnings(
        "ignore:Exception ignored in. <async_generator object "
        "(SSEDecoder|AsyncStream|AsyncChatCompletionStream)\\.\\w+ "
        ":pytest.PytestUnraisableExceptionWarning"
    ),
]
RELEASE_LIMIT = 30.0  # seconds; bounds waiting for cleanup, never a speed assertion


@pytest.fixture
def anyio_backend() -> str:
    """The frameworks run on asyncio only (they call asyncio directly)."""
    return "asyncio"


class Forecast(pydantic.BaseModel):
    city: str
    celsius: float


def weather(city: str) -> str:
    """The weather in a city."""
    return f"21.5 degrees in {city}"


@asynccontextmanager
async def setup() -> AsyncIterator[tuple[dict[str, FakeProvider], openai.AsyncOpenAI, AsyncClient]]:
    """Fakes ``slow`` and ``quick`` behind one client (alias ``fast`` races them, hedged)
    and an openai SDK client over the transport."""
    async with AsyncExitStack() as stack:
        fakes = {
            name: await stack.enter_async_context(
                FakeProvider(Reply(text=f"from {name}"), model=name)
            )
            for name in ("slow", "quick")
        }
        client = await stack.enter_async_context(
            AsyncClient(
                backends={n: HTTPBackend(f.base_url, name=n) for n, f in fakes.items()},
                default_backend="quick",
                router=Router({"fast": ["slow/m", "quick/m"]}),
                hedge=Hedge(delay=0.0),
                retry=RetryPolicy.none(),
            )
        )
        sdk = openai.AsyncOpenAI(
            base_url="http://swiftclient.invalid/v1",
            api_key="unused",
            http_client=httpx2.AsyncClient(transport=AsyncTransport(client)),
            max_retries=0,
        )
        stack.push_async_callback(sdk.close)
        yield fakes, sdk, client


async def slow_was_cancelled(fakes: dict[str, FakeProvider]) -> None:
    await settle(fakes["slow"], 1, RELEASE_LIMIT)
    assert len(fakes["slow"].requests) == fakes["slow"].cancelled == 1
    assert fakes["quick"].cancelled == 0


# --------------------------------------------------------------------------- pydantic-ai


async def test_pydantic_ai_agent_with_a_tool_and_structured_output() -> None:
    pydantic_ai = pytest.importorskip("pydantic_ai")
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    async with setup() as (fakes, sdk, client):
        model = OpenAIChatModel("m", provider=OpenAIProvider(openai_client=sdk))
        agent: Any = pydantic_ai.Agent(model, output_type=Forecast, tools=[weather])
        fakes["quick"].script(
            Reply(tool_calls=[("weather", {"city": "Paris"})]),
            Reply(tool_calls=[("final_result", {"city": "Paris", "celsius": 21.5})]),
        )
        result = await agent.run("How warm is Paris?")
        assert result.output == Forecast(city="Paris", celsius=21.5)
        tool_turn = fakes["quick"].requests[-1].body["messages"][-1]
        assert tool_turn["role"] == "tool" and "21.5 degrees in Paris" in tool_turn["content"]

        streamed: Any = pydantic_ai.Agent(model)
        async with streamed.run_stream("Say hi") as run:
            text = await run.get_output()
        assert text == "from quick"

        hedged: Any = pydantic_ai.Agent(
            OpenAIChatModel("fast", provider=OpenAIProvider(openai_client=sdk))
        )
        fakes["slow"].script(Reply(stall_after=0))  # never sends a token
        assert (await hedged.run("Say hi")).output == "from quick"
        await slow_was_cancelled(fakes)


# --------------------------------------------------------------------------- openai-agents


async def test_openai_agents_runner_with_a_function_tool_streamed_and_not() -> None:
    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)  # it would export traces to OpenAI

    async with setup() as (fakes, sdk, client):
        tool = agents.function_tool(weather)
        model = agents.OpenAIChatCompletionsModel(model="m", openai_client=sdk)
        agent = agents.Agent(name="forecaster", model=model, tools=[tool])
        fakes["quick"].script(
            Reply(tool_calls=[("weather", {"city": "Paris"})]), Reply(text="Mild in Paris")
        )
        result = await agents.Runner.run(agent, "How warm is Paris?")
        assert result.final_output == "Mild in Paris"
        tool_turn = fakes["quick"].requests[-1].body["messages"][-1]
        assert tool_turn["role"] == "tool" and "21.5 degrees in Paris" in tool_turn["content"]

        fakes["quick"].script(
            Reply(tool_calls=[("weather", {"city": "Oslo"})]), Reply(text="Cold in Oslo")
        )
        run = agents.Runner.run_streamed(agent, "How warm is Oslo?")
        deltas: list[str] = []
        async for event in run.stream_events():
            data = getattr(event, "data", None)
            if getattr(data, "type", None) == "response.output_text.delta":
                deltas.append(data.delta)  # type: ignore[union-attr]
        assert run.final_output == "Cold in Oslo"
        assert "".join(deltas) == "Cold in Oslo"
        assert all(r.body.get("stream") is True for r in fakes["quick"].requests[-2:])

        structured = agents.Agent(name="s", model=model, output_type=Forecast)
        fakes["quick"].script(Reply(json_object={"city": "Oslo", "celsius": -3.0}))
        result = await agents.Runner.run(structured, "Oslo?")
        assert result.final_output == Forecast(city="Oslo", celsius=-3.0)

        hedged = agents.Agent(
            name="h", model=agents.OpenAIChatCompletionsModel(model="fast", openai_client=sdk)
        )
        fakes["slow"].script(Reply(stall_after=0))
        assert (await agents.Runner.run(hedged, "Say hi")).final_output == "from quick"
        await slow_was_cancelled(fakes)


# --------------------------------------------------------------------------- langchain-openai


async def test_langchain_chat_openai_invoke_astream_tools_and_structured_output() -> None:
    langchain_openai = pytest.importorskip("langchain_openai")

    async with setup() as (fakes, sdk, client):
        llm: Any = langchain_openai.ChatOpenAI(
            model="m",
            base_url="http://swiftclient.invalid/v1",
            api_key="unused",
            max_retries=0,
            http_async_client=httpx2.AsyncClient(transport=AsyncTransport(client)),
        )
        assert (await llm.ainvoke("Say hi")).content == "from quick"
        pieces = [chunk.content async for chunk in llm.astream("Say hi")]
        assert "".join(pieces) == "from quick" and len([p for p in pieces if p]) == 2

        fakes["quick"].script(Reply(tool_calls=[("weather", {"city": "Paris"})]))
        called = await llm.bind_tools([weather]).ainvoke("How warm is Paris?")
        assert [(c["name"], c["args"]) for c in called.tool_calls] == [
            ("weather", {"city": "Paris"})
        ]

        fakes["quick"].script(Reply(json_object={"city": "Oslo", "celsius": -3.0}))
        forecast = await llm.with_structured_output(Forecast).ainvoke("Oslo?")
        assert forecast == Forecast(city="Oslo", celsius=-3.0)

        fakes["slow"].script(Reply(stall_after=0))
        assert (await llm.bind(model="fast").ainvoke("Say hi")).content == "from quick"
        await slow_was_cancelled(fakes)


# --------------------------------------------------------------------------- litellm


# litellm's own warnings: pydantic on its TypedDicts at import, and its deprecated calls.
@pytest.mark.filterwarnings("ignore:Items? .* `ReadOnly` qualifier:UserWarning")
@pytest.mark.filterwarnings("ignore::pydantic.warnings.PydanticDeprecatedSince211")
async def test_litellm_acompletion_with_the_sdk_client() -> None:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch at import
    litellm = pytest.importorskip("litellm")

    async with setup() as (fakes, sdk, client):
        user = [{"role": "user", "content": "Say hi"}]
        reply = await litellm.acompletion(model="openai/m", messages=user, client=sdk)
        assert reply.choices[0].message.content == "from quick"
        stream = await litellm.acompletion(model="openai/m", messages=user, client=sdk, stream=True)
        text = "".join([c.choices[0].delta.content or "" async for c in stream])
        assert text == "from quick"

        fakes["slow"].script(Reply(stall_after=0))
        hedged = await litellm.acompletion(model="openai/fast", messages=user, client=sdk)
        assert hedged.choices[0].message.content == "from quick"
        await slow_was_cancelled(fakes)


# --------------------------------------------------------------------------- the engine


@pytest.mark.filterwarnings("ignore:Items? .* `ReadOnly` qualifier:UserWarning")
@pytest.mark.filterwarnings("ignore::pydantic.warnings.PydanticDeprecatedSince211")
async def test_every_framework_over_the_embedded_engine_in_process() -> None:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    agents = pytest.importorskip("agents")
    pydantic_ai = pytest.importorskip("pydantic_ai")
    langchain_openai = pytest.importorskip("langchain_openai")
    litellm = pytest.importorskip("litellm")
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    from local_engine import LocalBackend

    agents.set_tracing_disabled(True)
    async with AsyncClient(backends={"local": LocalBackend()}) as client:
        http = httpx2.AsyncClient(transport=AsyncTransport(client))
        sdk = openai.AsyncOpenAI(
            base_url="http://swiftclient.invalid/v1",
            api_key="unused",
            http_client=http,
            max_retries=0,
        )
        settings: Any = {"max_tokens": 12}
        model = OpenAIChatModel("local/default", provider=OpenAIProvider(openai_client=sdk))
        said = await pydantic_ai.Agent(model, model_settings=settings).run("hi")
        assert said.output

        agent = agents.Agent(
            name="local",
            model=agents.OpenAIChatCompletionsModel(model="local/default", openai_client=sdk),
            model_settings=agents.ModelSettings(max_tokens=12),
        )
        assert (await agents.Runner.run(agent, "hi")).final_output

        llm: Any = langchain_openai.ChatOpenAI(
            model="local/default",
            base_url="http://swiftclient.invalid/v1",
            api_key="unused",
            max_retries=0,
            max_tokens=12,
            http_async_client=http,
        )
        assert (await llm.ainvoke("hi")).content

        reply = await litellm.acompletion(
            model="openai/local/default",
            messages=[{"role": "user", "content": "hi"}],
            client=sdk,
            max_tokens=12,
        )
        assert reply.choices[0].message.content
        await sdk.close()
