"""The ``gemini`` and ``azure`` presets: what they send, checked as the fake provider got it.

Each preset is pointed at a :class:`FakeProvider`, which serves Chat Completions at Google's
``/v1beta/openai`` path and Azure's deployment paths; the tests assert the exact path, query
string and credential header of every request, and that the key never shows in a repr or an
error.
"""

from __future__ import annotations

import pytest

from swiftclient import (
    AsyncClient,
    AuthenticationError,
    ConfigurationError,
    HTTPBackend,
    NotFoundError,
)
from swiftclient.backends.azure import DEFAULT_AZURE_API_VERSION, AzureBackend
from swiftclient.providers import from_env, preset
from swiftclient.testing import FakeProvider, Reply

pytestmark = pytest.mark.anyio

KEY = "gemini-or-azure-secret-key-0123456789"


def root(fake: FakeProvider) -> str:
    return fake.base_url.removesuffix("/v1")


async def both_ways(client: AsyncClient, model: str) -> None:
    """One plain and one streamed call, each answered."""
    for stream in (False, True):
        completion = await client.chat("hi", model=model, stream=stream)
        assert completion.text and completion.finish_reason == "stop"


# --------------------------------------------------------------------------- gemini


def test_the_gemini_preset_points_at_googles_openai_endpoint() -> None:
    backend = preset("gemini", environ={"GEMINI_API_KEY": KEY})
    assert type(backend) is HTTPBackend and backend.name == "gemini"
    assert backend.base_url == "https://generativelanguage.googleapis.com/v1beta/openai"
    assert KEY not in repr(backend)
    with pytest.raises(ConfigurationError, match="GEMINI_API_KEY"):
        preset("gemini", environ={})


async def test_gemini_sends_bearer_chat_completions_under_v1beta_openai() -> None:
    async with FakeProvider(api_key=KEY) as fake:
        backend = preset(
            "gemini", base_url=f"{root(fake)}/v1beta/openai", environ={"GEMINI_API_KEY": KEY}
        )
        async with AsyncClient(backends={"gemini": backend}) as client:
            await both_ways(client, "gemini/gemini-2.5-flash")
    assert len(fake.requests) == 2
    for request in fake.requests:
        assert (request.method, request.path, request.query) == (
            "POST",
            "/v1beta/openai/chat/completions",
            "",
        )
        assert request.headers["authorization"] == f"Bearer {KEY}"
        assert "api-key" not in request.headers
        assert request.body["model"] == "gemini-2.5-flash"


# --------------------------------------------------------------------------- azure


def test_the_azure_preset_needs_an_endpoint_and_a_key() -> None:
    with pytest.raises(ConfigurationError, match="AZURE_OPENAI_ENDPOINT"):
        preset("azure", environ={"AZURE_OPENAI_API_KEY": KEY})
    with pytest.raises(ConfigurationError, match="AZURE_OPENAI_API_KEY"):
        preset("azure", environ={"AZURE_OPENAI_ENDPOINT": "https://r.openai.azure.com"})
    with pytest.raises(ConfigurationError, match="deployment="):
        preset("azure", api_key=KEY, base_url="https://r.openai.azure.com/openai/deployments/x")
    with pytest.raises(ConfigurationError, match="not one it offers"):
        preset("azure", api_key=KEY, base_url="https://r.openai.azure.com", wire="responses")
    env = {"AZURE_OPENAI_ENDPOINT": "https://r.openai.azure.com/", "AZURE_OPENAI_API_KEY": KEY}
    backend = preset("azure", environ=env)
    assert isinstance(backend, AzureBackend) and backend.name == "azure"
    assert backend.base_url == "https://r.openai.azure.com/openai"
    assert backend.api_version == DEFAULT_AZURE_API_VERSION
    assert KEY not in repr(backend)
    assert isinstance(from_env({"SWIFTCLIENT_PROVIDER": "azure", **env}), AzureBackend)
    # an Entra ID token in a header stands in for the key
    token = preset(
        "azure",
        environ={"AZURE_OPENAI_ENDPOINT": "https://r.openai.azure.com"},
        headers={"Authorization": "Bearer entra-token"},
    )
    assert isinstance(token, AzureBackend)


async def test_azure_sends_to_the_models_deployment_with_api_version_and_api_key() -> None:
    async with FakeProvider(api_key=KEY) as fake:
        env = {"AZURE_OPENAI_ENDPOINT": root(fake), "AZURE_OPENAI_API_KEY": KEY}
        async with AsyncClient(backends={"azure": preset("azure", environ=env)}) as client:
            await both_ways(client, "azure/my-gpt-4o")
    assert len(fake.requests) == 2
    for request in fake.requests:
        assert (request.method, request.path, request.query) == (
            "POST",
            "/openai/deployments/my-gpt-4o/chat/completions",
            f"api-version={DEFAULT_AZURE_API_VERSION}",
        )
        assert request.headers["api-key"] == KEY
        assert "authorization" not in request.headers
    assert fake.requests[1].body["stream"] is True


async def test_azure_api_version_and_a_pinned_deployment_are_configurable() -> None:
    async with FakeProvider(api_key=KEY) as fake:
        env = {
            "AZURE_OPENAI_ENDPOINT": f"{root(fake)}/openai/",
            "AZURE_OPENAI_API_KEY": KEY,
            "AZURE_OPENAI_API_VERSION": "2025-01-01-preview",
        }
        from_env_version = preset("azure", environ=env)
        pinned = preset("azure", environ=env, api_version="2024-06-01", deployment="prod", name="p")
        async with AsyncClient(backends={"azure": from_env_version, "p": pinned}) as client:
            await client.chat("hi", model="azure/dev")
            await client.chat("hi", model="p/gpt-4o")
    assert [(r.path, r.query) for r in fake.requests] == [
        ("/openai/deployments/dev/chat/completions", "api-version=2025-01-01-preview"),
        ("/openai/deployments/prod/chat/completions", "api-version=2024-06-01"),
    ]
    assert fake.requests[1].body["model"] == "gpt-4o"  # kept in the body, as the SDK does


async def test_azure_lists_models_with_the_api_version() -> None:
    async with FakeProvider(api_key=KEY) as fake:
        backend = AzureBackend(root(fake), KEY, api_version="2024-10-21")
        async with backend:
            with pytest.raises(NotFoundError):  # the fake lists no Azure models
                await backend.list_models()
    assert (fake.requests[0].path, fake.requests[0].query) == (
        "/openai/models",
        "api-version=2024-10-21",
    )


async def test_a_wrong_azure_key_is_an_authentication_error_that_never_shows_the_key() -> None:
    async with FakeProvider(api_key="the-right-key") as fake:
        backend = AzureBackend(root(fake), KEY)
        async with AsyncClient(backends={"azure": backend}) as client:
            with pytest.raises(AuthenticationError) as caught:
                await client.chat("hi", model="azure/d")
            # an error body that echoes the key is scrubbed too
            fake.script(Reply(status=401, error_message="bad key the-right-key"))
            backend_ok = AzureBackend(root(fake), "the-right-key", name="ok")
            async with AsyncClient(backends={"ok": backend_ok}) as other:
                with pytest.raises(AuthenticationError) as echoed:
                    await other.chat("hi", model="ok/d")
    assert "Access denied" in str(caught.value)
    assert KEY not in str(caught.value) and KEY not in repr(caught.value)
    assert "the-right-key" not in str(echoed.value) + repr(echoed.value)
    assert KEY not in repr(backend)
