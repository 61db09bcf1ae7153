"""Canonical bytes on the call path: built once per call and model, reused by retries;
the opt-out; ``prompt_cache_key`` derived for providers that take it."""

from __future__ import annotations

import json
from contextlib import AbstractAsyncContextManager
from typing import Any

import pytest

from swiftclient import AsyncClient, HTTPBackend, _canonical
from swiftclient._canonical import cache_key, prompt_prefix
from swiftclient.providers import from_env, preset
from swiftclient.types import ChatRequest

from .mock import Script, scripted_client, transport_options

pytestmark = pytest.mark.anyio
over_transports = pytest.mark.usefixtures("transport")
"""The bytes that reach the socket, over aiohttp and httpx (presets too: their base URL
moved to the loopback server)."""
SYSTEM = {"role": "system", "content": "You are a careful assistant."}
TOOLS = [
    {"type": "function", "function": {"name": "zeta", "parameters": {"required": ["b", "a"]}}},
    {"type": "function", "function": {"name": "alpha"}},
]


def _client(script: Script, **backend: Any) -> AbstractAsyncContextManager[AsyncClient]:
    return scripted_client(script, backend=backend)


@over_transports
async def test_retries_send_the_bytes_built_once(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[bool] = []
    real = _canonical._body

    def counting(*args: Any, **kwargs: Any) -> Any:
        built.append(True)
        return real(*args, **kwargs)

    monkeypatch.setattr(_canonical, "_body", counting)
    script = Script().add(503).add(503)
    async with _client(script) as client:
        completion = await client.chat([SYSTEM, {"role": "user", "content": "hi"}], tools=TOOLS)
    assert completion.text == "Hello world" and len(script.requests) == 3
    assert len(built) == 1
    sent = [request.content for request in script.requests]
    assert sent[0] == sent[1] == sent[2]
    names = [t["function"]["name"] for t in json.loads(sent[0])["tools"]]
    assert names == ["alpha", "zeta"]


@over_transports
async def test_attempts_on_other_models_get_their_own_bytes() -> None:
    script = Script().add(503)
    async with _client(script) as client:
        await client.chat("hi", model=["m", "n"])
    models = [json.loads(request.content)["model"] for request in script.requests]
    assert models == ["m", "n"]


@over_transports
async def test_canonical_false_sends_the_callers_orders() -> None:
    script = Script()
    async with _client(script, canonical=False) as client:
        await client.chat("hi", tools=TOOLS)
    body = json.loads(script.requests[0].content)
    assert [t["function"]["name"] for t in body["tools"]] == ["zeta", "alpha"]
    assert body["tools"][0]["function"]["parameters"]["required"] == ["b", "a"]


@over_transports
async def test_prompt_cache_key_is_derived_from_the_static_prefix() -> None:
    script = Script()
    messages = [SYSTEM, {"role": "user", "content": "hi"}]
    async with _client(script, prompt_cache_key=True) as client:
        await client.chat(messages, tools=TOOLS)
        await client.chat([SYSTEM, {"role": "user", "content": "other turn"}], tools=TOOLS[::-1])
        await client.chat(messages, prompt_cache_key="mine")
        await client.chat("no static prefix")
    keys = [json.loads(r.content).get("prompt_cache_key") for r in script.requests]
    expected = cache_key(
        prompt_prefix(
            ChatRequest.model_validate({"model": "x", "messages": messages, "tools": TOOLS})
        )
    )
    assert expected is not None and expected.startswith("swc-")
    assert keys == [expected, expected, "mine", None]


@over_transports
async def test_no_prompt_cache_key_unless_the_backend_asks() -> None:
    script = Script()
    async with _client(script) as client:
        await client.chat([SYSTEM, {"role": "user", "content": "hi"}])
    assert "prompt_cache_key" not in json.loads(script.requests[0].content)


@over_transports
async def test_presets_know_which_providers_take_prompt_cache_key() -> None:
    env = {"OPENAI_API_KEY": "k", "DEEPSEEK_API_KEY": "k"}
    sent: dict[str, Any] = {}
    for name, backend_kwargs in [
        ("openai", {}),
        ("deepseek", {}),
        ("openai-off", {"prompt_cache_key": False}),
    ]:
        script = Script()
        async with script.serve() as base_url:
            backend = preset(
                name.split("-")[0],
                environ=env,
                base_url=base_url,  # the preset's own choice of prompt_cache_key is kept
                **backend_kwargs,
                **transport_options(),
            )
            async with AsyncClient(backend, model="m") as client:
                await client.chat([SYSTEM, {"role": "user", "content": "hi"}])
        sent[name] = json.loads(script.requests[0].content).get("prompt_cache_key")
    assert sent["openai"] is not None and sent["deepseek"] is None and sent["openai-off"] is None
    from_openai_key = from_env({"OPENAI_API_KEY": "k"})
    assert isinstance(from_openai_key, HTTPBackend)
    assert from_openai_key.name == "openai"
