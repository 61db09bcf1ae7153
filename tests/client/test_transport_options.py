"""HTTPBackend's enterprise options over real loopback sockets: TLS verification, client
certificates, proxies (given or from the environment), per-backend headers; and the
transport being ready before the first call."""

from __future__ import annotations

import json
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio.abc
import pytest
import trustme

from swiftclient import APIConnectionError, AsyncClient, ConfigurationError, HTTPBackend
from swiftclient import RetryPolicy as Retry
from swiftclient.testing import FakeProvider, Reply

from .rawserver import RawRequest, raw_server, send_all

pytestmark = pytest.mark.anyio
KEY = "sk-test-key-1234567890"
COMPLETION = json.dumps(
    {
        "id": "chatcmpl-raw",
        "object": "chat.completion",
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "via raw"},
                "finish_reason": "stop",
            }
        ],
    }
).encode()


async def _completion(request: RawRequest, stream: anyio.abc.ByteStream) -> None:
    head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n"
        b"content-length: " + str(len(COMPLETION)).encode() + b"\r\n\r\n"
    )
    await send_all(stream, head + COMPLETION)


async def _chat(backend: HTTPBackend) -> str:
    async with AsyncClient(backend, model="m", retry=Retry.none()) as client:
        return (await client.chat("hi", stream=False)).text


@pytest.fixture
def no_proxy_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "SSL_CERT_FILE"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    yield monkeypatch


# --------------------------------------------------------------------------- TLS


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def ca_file(ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("ca") / "ca.pem"
    ca.cert_pem.write_to_path(str(path))
    return str(path)


def _server_context(ca: trustme.CA, *, require_client_cert: bool = False) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    if require_client_cert:
        context.verify_mode = ssl.CERT_REQUIRED
        ca.configure_trust(context)
    return context


async def test_verify_with_a_ca_file_accepts_the_server(
    ca: trustme.CA, ca_file: str, no_proxy_env: pytest.MonkeyPatch
) -> None:
    async with raw_server(_completion, tls=_server_context(ca)) as server:
        assert await _chat(HTTPBackend(server.base_url, KEY, verify=ca_file)) == "via raw"


async def test_default_verify_rejects_an_unknown_ca(
    ca: trustme.CA, no_proxy_env: pytest.MonkeyPatch
) -> None:
    async with raw_server(_completion, tls=_server_context(ca)) as server:
        with pytest.raises(APIConnectionError, match="(?i)certificate"):
            await _chat(HTTPBackend(server.base_url, KEY))
        assert await _chat(HTTPBackend(server.base_url, KEY, verify=False)) == "via raw"


async def test_ssl_cert_file_is_honoured_only_with_trust_env(
    ca: trustme.CA, ca_file: str, no_proxy_env: pytest.MonkeyPatch
) -> None:
    no_proxy_env.setenv("SSL_CERT_FILE", ca_file)
    async with raw_server(_completion, tls=_server_context(ca)) as server:
        assert await _chat(HTTPBackend(server.base_url, KEY)) == "via raw"
        with pytest.raises(APIConnectionError):
            await _chat(HTTPBackend(server.base_url, KEY, trust_env=False))


async def test_a_client_certificate_is_presented(
    ca: trustme.CA, ca_file: str, tmp_path: Path, no_proxy_env: pytest.MonkeyPatch
) -> None:
    identity = ca.issue_cert("client.example")
    cert_file = tmp_path / "client.pem"
    identity.private_key_and_cert_chain_pem.write_to_path(str(cert_file))
    tls = _server_context(ca, require_client_cert=True)
    async with raw_server(_completion, tls=tls) as server:
        backend = HTTPBackend(server.base_url, KEY, verify=ca_file, cert=str(cert_file))
        assert await _chat(backend) == "via raw"
        with pytest.raises(APIConnectionError):
            await _chat(HTTPBackend(server.base_url, KEY, verify=ca_file))


async def test_a_missing_ca_path_is_a_configuration_error() -> None:
    backend = HTTPBackend("https://127.0.0.1:1/v1", verify="/no/such/ca.pem")
    with pytest.raises(ConfigurationError, match="no CA file"):
        async with AsyncClient(backend, model="m"):
            pass


# --------------------------------------------------------------------------- proxies


async def test_a_given_proxy_carries_every_request(no_proxy_env: pytest.MonkeyPatch) -> None:
    # The API host does not exist: only the proxy can answer, and it sees the absolute URL.
    async with raw_server(_completion) as proxy:
        backend = HTTPBackend("http://api.invalid/v1", KEY, proxy=proxy.url)
        assert await _chat(backend) == "via raw"
    assert [r.line for r in proxy.requests] == [
        "POST http://api.invalid/v1/chat/completions HTTP/1.1"
    ]
    assert proxy.requests[0].headers["authorization"] == f"Bearer {KEY}"


async def test_proxy_environment_variables_are_honoured_by_default(
    no_proxy_env: pytest.MonkeyPatch,
) -> None:
    async with raw_server(_completion) as proxy:
        no_proxy_env.setenv("HTTP_PROXY", proxy.url)
        no_proxy_env.setenv("http_proxy", proxy.url)
        backend = HTTPBackend("http://api.invalid/v1", KEY)
        assert backend.proxy == proxy.url
        assert await _chat(backend) == "via raw"
    assert len(proxy.requests) == 1


async def test_trust_env_false_and_no_proxy_bypass_the_environment_proxy(
    no_proxy_env: pytest.MonkeyPatch,
) -> None:
    async with raw_server(_completion) as proxy, FakeProvider(Reply(text="direct")) as fake:
        no_proxy_env.setenv("HTTP_PROXY", proxy.url)
        no_proxy_env.setenv("http_proxy", proxy.url)
        assert await _chat(HTTPBackend(fake.base_url, KEY, trust_env=False)) == "direct"
        no_proxy_env.setenv("NO_PROXY", "localhost, 127.0.0.1")
        no_proxy_env.setenv("no_proxy", "localhost, 127.0.0.1")
        fake.script(Reply(text="direct"))
        assert await _chat(HTTPBackend(fake.base_url, KEY)) == "direct"
    assert proxy.requests == []
    assert len(fake.requests) == 2


def test_proxy_credentials_are_never_shown(no_proxy_env: pytest.MonkeyPatch) -> None:
    backend = HTTPBackend("http://api.invalid/v1", proxy="http://user:s3cret@proxy.local:3128")
    assert backend.proxy == "http://***@proxy.local:3128"
    assert "s3cret" not in repr(backend)
    with pytest.raises(ConfigurationError):
        HTTPBackend("http://api.invalid/v1", proxy="socks5://proxy.local:1080")


# --------------------------------------------------------------------------- headers, setup


async def test_custom_headers_go_with_every_request_of_that_backend() -> None:
    async with FakeProvider() as fake:
        team = HTTPBackend(fake.base_url, KEY, name="team", headers={"X-Team": "search"})
        other = HTTPBackend(fake.base_url, KEY, name="other")
        async with AsyncClient(backends={"team": team, "other": other}, model="team/m") as client:
            await client.chat("hi")
            await client.chat("hi", stream=False)
            await client.chat("hi", model="other/m")
    sent = [r.headers.get("x-team") for r in fake.requests]
    assert sent == ["search", "search", None]


def test_constructing_a_backend_imports_the_asyncio_transport() -> None:
    # The first call's measured time must not include importing aiohttp.
    code = (
        "import sys, swiftclient\n"
        "before = 'swiftclient.backends._aiohttp' in sys.modules\n"
        "swiftclient.HTTPBackend('http://127.0.0.1:1/v1')\n"
        "print(before, 'swiftclient.backends._aiohttp' in sys.modules, 'aiohttp' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True", "True"]
