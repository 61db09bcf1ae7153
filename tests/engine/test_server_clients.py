"""`swiftclient serve` driven by the clients people point at servers: the official ``openai``
client, ``langchain-openai`` and ``litellm`` (test-only dependencies), through plain and
streamed chat, tools, a JSON schema, ``n=2``, logprobs and the legacy completions endpoint.

One server process (the embedded default model, which is trained to call its tools) serves
the whole module.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pydantic
import pytest

openai = pytest.importorskip("openai")
langchain_openai = pytest.importorskip("langchain_openai")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network at import
litellm = pytest.importorskip("litellm")

pytestmark = [
    # third-party clients' own deprecation notices are theirs, not the server's
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::PendingDeprecationWarning"),
    pytest.mark.filterwarnings("ignore::pydantic.warnings.PydanticDeprecatedSince20"),
    pytest.mark.filterwarnings("ignore:.*Pydantic serializer warnings.*:UserWarning"),
    pytest.mark.filterwarnings("ignore:.*using the `ReadOnly` qualifier.*:UserWarning"),
]

KEY = "sk-clients-test-0123456789"
LIMIT = 60.0  # seconds; a bound on a hung server, not a speed assertion
WEATHER = "What's the weather in Paris?"
TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}},
    "required": ["city"],
}


class City(pydantic.BaseModel):
    city: str = pydantic.Field(max_length=12)


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    argv = [sys.executable, "-c", "from swiftclient.cli import main; raise SystemExit(main())"]
    argv += ["serve", "--port", "0", "--api-key", KEY, "--no-access-log"]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("serving swift-tiny at http://"), line
        yield line.split(" at ")[1].strip()
    finally:
        process.terminate()
        process.wait(timeout=LIMIT)
        assert process.stdout is not None
        process.stdout.close()


# ---------------------------------------------------------------------- openai


@pytest.fixture(scope="module")
def oa(base_url: str) -> Iterator[Any]:
    client = openai.OpenAI(base_url=base_url, api_key=KEY, max_retries=0, timeout=LIMIT)
    yield client
    client.close()


def test_openai_plain_and_stream(oa: Any) -> None:
    reply = oa.chat.completions.create(
        model="default", messages=[{"role": "user", "content": "hi"}], max_tokens=16
    )
    assert reply.choices[0].message.content
    assert reply.usage.completion_tokens > 0
    stream = oa.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=16,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == reply.choices[0].message.content  # greedy by the model's defaults
    assert chunks[-1].usage.completion_tokens == reply.usage.completion_tokens


def test_openai_tools_schema_n_logprobs_and_legacy(oa: Any) -> None:
    called = oa.chat.completions.create(
        model="default", messages=[{"role": "user", "content": WEATHER}], tools=[TOOL]
    )
    call = called.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and "city" in json.loads(call.function.arguments)
    assert called.choices[0].finish_reason == "tool_calls"
    shaped = oa.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "Which city? Answer in JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": SCHEMA}},
        max_tokens=40,
    )
    assert list(json.loads(shaped.choices[0].message.content)) == ["city"]
    two = oa.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "hi"}],
        n=2,
        temperature=1.0,
        max_tokens=8,
        logprobs=True,
        top_logprobs=2,
    )
    assert [c.index for c in two.choices] == [0, 1]
    for choice in two.choices:
        assert choice.logprobs.content and len(choice.logprobs.content[0].top_logprobs) == 2
    legacy = oa.completions.create(model="default", prompt="Hello", max_tokens=4, logprobs=1)
    assert legacy.object == "text_completion" and legacy.usage.completion_tokens >= 1
    assert [m.id for m in oa.models.list().data] == ["swift-tiny", "default"]
    assert oa.models.retrieve("default").id == "default"


# ---------------------------------------------------------------------- langchain-openai


@pytest.fixture
def lc_http() -> Iterator[Any]:
    """An HTTP client the test owns and closes: ChatOpenAI otherwise takes one from a
    process-wide cache that nothing closes (its socket outlives the tests)."""
    import httpx

    with httpx.Client(timeout=LIMIT) as client:
        yield client


def _chat(base_url: str, http: Any, **options: Any) -> Any:
    return langchain_openai.ChatOpenAI(
        base_url=base_url,
        api_key=KEY,
        model="default",
        max_retries=0,
        timeout=LIMIT,
        http_client=http,
        **options,
    )


def test_langchain_plain_stream_tools_and_structured(base_url: str, lc_http: Any) -> None:
    chat = _chat(base_url, lc_http, max_tokens=16)
    reply = chat.invoke("hi")
    assert isinstance(reply.content, str) and reply.content
    streamed = "".join(str(piece.content) for piece in chat.stream("hi"))
    assert streamed == reply.content
    called = _chat(base_url, lc_http).bind_tools([TOOL]).invoke(WEATHER)
    assert called.tool_calls and called.tool_calls[0]["name"] == "get_weather"
    structured = _chat(base_url, lc_http, max_tokens=40).with_structured_output(
        City, method="json_schema"
    )
    assert isinstance(structured.invoke("Which city? Answer in JSON."), City)


def test_langchain_n_logprobs_and_legacy(base_url: str, lc_http: Any) -> None:
    from langchain_core.messages import HumanMessage

    result = _chat(base_url, lc_http, n=2, max_tokens=8, temperature=1.0).generate(
        [[HumanMessage("hi")]]
    )
    assert len(result.generations[0]) == 2
    reply = _chat(base_url, lc_http, max_tokens=4, logprobs=True).invoke("hi")
    assert reply.response_metadata["logprobs"]["content"]
    legacy = langchain_openai.OpenAI(
        base_url=base_url, api_key=KEY, model="default", max_tokens=4, max_retries=0
    )
    assert isinstance(legacy.invoke("Hello"), str)


# ---------------------------------------------------------------------- litellm


@pytest.fixture(scope="module", autouse=True)
def _close_litellm_clients() -> Iterator[None]:
    """litellm keeps the OpenAI clients it builds in a process-wide cache and never closes
    them; close the synchronous ones when this module's tests are done, so no socket
    outlives them."""
    yield
    import httpx

    cache = litellm.in_memory_llm_clients_cache
    for client in list(cache.cache_dict.values()):
        if isinstance(client, openai.OpenAI | httpx.Client):
            client.close()
    cache.flush_cache()


def _litellm(base_url: str, **options: Any) -> Any:
    return litellm.completion(
        model="openai/default", api_base=base_url, api_key=KEY, timeout=LIMIT, **options
    )


def test_litellm_plain_stream_tools_schema_n_logprobs(base_url: str) -> None:
    hi = [{"role": "user", "content": "hi"}]
    reply = _litellm(base_url, messages=hi, max_tokens=16)
    assert reply.choices[0].message.content
    stream = _litellm(base_url, messages=hi, max_tokens=16, stream=True)
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in stream)
    assert streamed == reply.choices[0].message.content
    called = _litellm(base_url, messages=[{"role": "user", "content": WEATHER}], tools=[TOOL])
    assert called.choices[0].message.tool_calls[0].function.name == "get_weather"
    shaped = _litellm(
        base_url,
        messages=[{"role": "user", "content": "Which city? Answer in JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": SCHEMA}},
        max_tokens=40,
    )
    assert list(json.loads(shaped.choices[0].message.content)) == ["city"]
    two = _litellm(base_url, messages=hi, n=2, max_tokens=8, temperature=1.0, logprobs=True)
    assert len(two.choices) == 2 and two.choices[0].logprobs is not None


def test_litellm_legacy_completions(base_url: str) -> None:
    legacy = litellm.text_completion(
        model="text-completion-openai/default",
        api_base=base_url,
        api_key=KEY,
        prompt="Hello",
        max_tokens=4,
        timeout=LIMIT,
    )
    assert legacy.choices[0].text is not None
    assert legacy.usage.completion_tokens >= 1
