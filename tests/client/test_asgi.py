"""The shared ASGI stack on uvicorn: request limits, errors, disconnects, shutdown, deadlines.

Every server here runs on its own loop in a background thread (ThreadedServer); the tests
drive it over real loopback sockets from asyncio and trio.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import pytest

from swiftclient.asgi import (
    SSE_DONE,
    App,
    Request,
    ResponseWriter,
    Router,
    ServerSettings,
    ThreadedServer,
    bearer_key_matches,
    error_body,
    sse_event,
)
from swiftclient.errors import ConfigurationError

pytestmark = pytest.mark.anyio

LIMIT = 30.0  # seconds; a bound on waiting for the server, never a speed assertion


async def echo(request: Request, writer: ResponseWriter) -> None:
    """Answer with what was received."""
    await writer.send_json(
        200,
        {
            "method": request.method,
            "path": request.path,
            "query": request.query,
            "body": request.body.decode(),
            "agent": request.headers.get("x-agent"),
        },
    )


@asynccontextmanager
async def running(app: App, **settings: Any) -> AsyncIterator[ThreadedServer]:
    server = ThreadedServer(app, ServerSettings(**settings))
    await server.astart()
    try:
        yield server
    finally:
        await server.astop()


async def exchange(port: int, data: bytes) -> bytes:
    """Send raw bytes and read until the server closes the connection."""
    received = bytearray()
    with anyio.fail_after(LIMIT):
        async with await anyio.connect_tcp("127.0.0.1", port) as stream:
            await stream.send(data)
            try:
                while True:
                    received += await stream.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                pass
    return bytes(received)


async def wait_for(event: threading.Event) -> None:
    """Wait for an event the server's thread sets (without blocking this loop)."""
    assert await anyio.to_thread.run_sync(event.wait, LIMIT)


def split_response(raw: bytes) -> tuple[str, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return lines[0], headers, body


async def test_keep_alive_query_and_root_path() -> None:
    async with running(App(echo), root_path="/api") as server:
        assert not server.base_url.endswith("/api")  # the proxy in front adds it
        async with httpx.AsyncClient(base_url=server.base_url) as client:
            for i in range(3):
                response = await client.post(
                    f"/v1/x?i={i}", content=f"body{i}", headers={"x-agent": "t"}
                )
                assert response.json() == {
                    "method": "POST",
                    "path": "/v1/x",
                    "query": f"i={i}",
                    "body": f"body{i}",
                    "agent": "t",
                }
        assert server.app.connections.opened == 1


async def test_pipelined_requests_are_answered_in_order() -> None:
    async with running(App(echo)) as server:
        one = b"POST /a HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\n\r\nabc"
        two = b"GET /b HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
        raw = await exchange(server.port, one + two)
    assert raw.count(b"HTTP/1.1 200 OK") == 2
    assert raw.index(b'"path":"/a"') < raw.index(b'"path":"/b"')


async def test_body_over_the_limit_gets_413_json() -> None:
    async with running(App(echo, max_body_bytes=1024)) as server:
        async with httpx.AsyncClient(base_url=server.base_url) as client:
            response = await client.post("/", content=b"x" * 4096)
            assert response.status_code == 413
            error = response.json()["error"]
            assert error["code"] == "request_too_large" and "1024" in error["message"]
            assert (await client.post("/", content=b"x" * 1024)).status_code == 200
        # A body sent without Content-Length (chunked) is counted as it arrives.
        chunked = (
            b"POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n"
            + b"800\r\n"
            + b"y" * 2048
            + b"\r\n0\r\n\r\n"
        )
        assert split_response(await exchange(server.port, chunked))[0].split()[1] == "413"


async def test_oversized_head_gets_431_and_the_server_keeps_serving() -> None:
    async with running(App(echo), max_head_bytes=4096) as server:
        raw = await exchange(
            server.port, b"GET / HTTP/1.1\r\nhost: x\r\nx-big: " + b"y" * 65536 + b"\r\n\r\n"
        )
        status, _, body = split_response(raw)
        assert status.split()[1] == "431"
        assert json.loads(body)["error"]["code"] == "headers_too_large"
        async with httpx.AsyncClient(base_url=server.base_url) as client:
            assert (await client.get("/ok")).status_code == 200


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"NONSENSE\r\n\r\n",
        b"GET / HTTP/1.1\r\nno colon here\r\n\r\n",
        b"POST / HTTP/1.1\r\ncontent-length: abc\r\n\r\n",
    ],
)
async def test_malformed_requests_get_4xx_and_the_server_keeps_serving(
    request_bytes: bytes,
) -> None:
    async with running(App(echo)) as server:
        status = split_response(await exchange(server.port, request_bytes))[0]
        assert status.split()[1].startswith("4")
        async with httpx.AsyncClient(base_url=server.base_url) as client:
            assert (await client.get("/")).status_code == 200


async def test_handler_crash_gets_500_with_the_secret_redacted_from_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    secret = "sk-proj-abcdefghijklmnop1234"

    async def handler(request: Request, writer: ResponseWriter) -> None:
        if request.path == "/boom":
            raise RuntimeError(f"boom with Bearer {secret}")
        await echo(request, writer)

    caplog.set_level(logging.ERROR, logger="swiftclient.asgi")
    async with running(App(handler)) as server:
        async with httpx.AsyncClient(base_url=server.base_url) as client:
            failed = await client.get("/boom")
            assert failed.status_code == 500
            assert failed.json()["error"]["type"] == "server_error"
            assert "boom" not in failed.text
            assert (await client.get("/fine")).json()["path"] == "/fine"
    assert "RuntimeError: boom" in caplog.text
    assert secret not in caplog.text


async def test_stream_is_chunked_auto_ended_and_a_crash_mid_stream_breaks_it() -> None:
    async def handler(request: Request, writer: ResponseWriter) -> None:
        await writer.start_stream(200, {"x-kind": "stream"})
        for i in range(3):
            await writer.write(sse_event({"i": i}))
        if request.path == "/crash":
            raise RuntimeError("mid-stream")
        await writer.write(SSE_DONE)

    async with running(App(handler)) as server:
        async with httpx.AsyncClient(base_url=server.base_url) as client:
            response = await client.get("/")
            assert response.headers["content-type"] == "text/event-stream"
            assert response.headers["x-kind"] == "stream"
            assert response.text == 'data: {"i":0}\n\ndata: {"i":1}\n\ndata: {"i":2}\n\n' + (
                "data: [DONE]\n\n"
            )
            with pytest.raises(httpx.RemoteProtocolError):
                await client.get("/crash")


async def test_client_disconnect_cancels_the_handler_before_and_during_a_response() -> None:
    entered = {"/waiting": threading.Event(), "/streaming": threading.Event()}
    cleaned: list[str] = []
    done = threading.Event()

    async def handler(request: Request, writer: ResponseWriter) -> None:
        try:
            if request.path == "/streaming":
                await writer.start_stream(200)
                await writer.write(b"first")
            entered[request.path].set()
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            cleaned.append(request.path)
            raise
        finally:
            if len(cleaned) == 2:
                done.set()

    async with running(App(handler)) as server:
        for path, event in entered.items():
            with anyio.fail_after(LIMIT):
                async with await anyio.connect_tcp("127.0.0.1", server.port) as stream:
                    await stream.send(f"GET {path} HTTP/1.1\r\nhost: x\r\n\r\n".encode())
                    await wait_for(event)
        await wait_for(done)
    assert sorted(cleaned) == ["/streaming", "/waiting"]


async def test_abort_drops_the_connection_before_or_mid_response() -> None:
    async def handler(request: Request, writer: ResponseWriter) -> None:
        if request.path == "/mid":
            await writer.start_stream(200)
            await writer.write(b"some")
        await writer.abort()
        with pytest.raises(RuntimeError):
            await writer.write(b"more")

    async with running(App(handler)) as server:
        async with httpx.AsyncClient(base_url=server.base_url) as client:
            with pytest.raises(httpx.RemoteProtocolError):
                await client.get("/before")
            with pytest.raises(httpx.RemoteProtocolError):
                await client.get("/mid")


async def test_shutdown_cancels_handlers_and_closes_every_connection() -> None:
    streaming = threading.Event()
    cleaned_up = threading.Event()

    async def handler(request: Request, writer: ResponseWriter) -> None:
        if request.path == "/idle":
            await writer.send(200, b"ok")
            return
        try:
            await writer.start_stream(200)
            await writer.write(b"x")
            streaming.set()
            await anyio.sleep_forever()
        finally:
            cleaned_up.set()

    app = App(handler)
    with anyio.fail_after(LIMIT):
        server = ThreadedServer(app)
        await server.astart()
        try:
            idle = await anyio.connect_tcp("127.0.0.1", server.port)
            busy = await anyio.connect_tcp("127.0.0.1", server.port)
            await idle.send(b"GET /idle HTTP/1.1\r\nhost: x\r\n\r\n")
            assert (await idle.receive()).startswith(b"HTTP/1.1 200")
            await busy.send(b"GET /busy HTTP/1.1\r\nhost: x\r\n\r\n")
            await wait_for(streaming)
            assert app.connections.open == 2
        finally:
            await server.astop()
        assert cleaned_up.is_set()
        assert app.connections.open == 0
        for stream in (idle, busy):
            with pytest.raises((anyio.EndOfStream, anyio.BrokenResourceError)):
                while True:
                    await stream.receive()
            await stream.aclose()


async def test_a_request_head_that_never_completes_is_cut_off() -> None:
    """Slowloris: a connection that sends part of a head and stalls is closed by the head
    deadline, on a fresh connection and after a kept-alive response alike."""
    async with running(App(echo), head_timeout=0.5, keepalive_timeout=600) as server:
        with anyio.fail_after(LIMIT):
            async with await anyio.connect_tcp("127.0.0.1", server.port) as fresh:
                await fresh.send(b"GET / HTTP/1.1\r\nhost: x\r\nx-slow: ")
                with pytest.raises((anyio.EndOfStream, anyio.BrokenResourceError)):
                    while True:
                        await fresh.receive()
            async with await anyio.connect_tcp("127.0.0.1", server.port) as kept:
                await kept.send(b"GET /first HTTP/1.1\r\nhost: x\r\n\r\n")
                first = await kept.receive()
                assert first.startswith(b"HTTP/1.1 200")
                await kept.send(b"GET /second HTTP/1.1\r\nho")
                with pytest.raises((anyio.EndOfStream, anyio.BrokenResourceError)):
                    while True:
                        await kept.receive()
        assert server.app.connections.open == 0


async def test_connection_cap_answers_503_past_the_limit() -> None:
    async with running(App(echo), limit_concurrency=2) as server:
        with anyio.fail_after(LIMIT):
            held = await anyio.connect_tcp("127.0.0.1", server.port)
            try:
                await held.send(b"GET /held HTTP/1.1\r\nhost: x\r\n\r\n")
                assert (await held.receive()).startswith(b"HTTP/1.1 200")  # kept alive
                raw = await exchange(
                    server.port, b"GET /over HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
                )
                assert raw.startswith(b"HTTP/1.1 503")
                # The held connection itself is still served.
                await held.send(b"GET /held HTTP/1.1\r\nhost: x\r\n\r\n")
                assert (await held.receive()).startswith(b"HTTP/1.1 200")
            finally:
                await held.aclose()


async def test_a_client_that_stops_reading_is_dropped_after_the_write_timeout() -> None:
    cancelled = threading.Event()
    writes = 0

    async def firehose(request: Request, writer: ResponseWriter) -> None:
        nonlocal writes
        await writer.start_stream(200)
        try:
            while True:
                await writer.write(b"x" * 65536)
                writes += 1
        except anyio.get_cancelled_exc_class():
            cancelled.set()
            raise

    async with running(App(firehose, write_timeout=0.5)) as server:
        with anyio.fail_after(LIMIT):
            async with await anyio.connect_tcp("127.0.0.1", server.port) as stream:
                await stream.send(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
                await wait_for(cancelled)  # never reading a byte
        assert writes > 1
        assert server.app.connections.open == 0


async def test_router_orders_404_405_401_and_matches_the_scheme_in_any_case() -> None:
    async def secret(request: Request, writer: ResponseWriter) -> None:
        await writer.send_json(200, {"ok": True})

    router = Router(
        {"/v1/x": ("POST", secret), "/health": ("GET", secret)},
        api_key="sk-key-123",
        public=frozenset({"/health"}),
    )
    async with running(App(router)) as server:
        async with httpx.AsyncClient(base_url=server.base_url) as client:
            assert (await client.get("/nope")).status_code == 404
            wrong_method = await client.get("/v1/x")
            assert wrong_method.status_code == 405 and wrong_method.headers["allow"] == "POST"
            missing = await client.post("/v1/x")
            assert missing.status_code == 401
            assert missing.headers["www-authenticate"] == "Bearer"
            assert missing.json()["error"]["type"] == "authentication_error"
            for scheme in ("Bearer", "bearer", "BEARER"):
                ok = await client.post("/v1/x/", headers={"authorization": f"{scheme} sk-key-123"})
                assert ok.status_code == 200, scheme
            get = await client.get("/health")
            assert get.status_code == 200
            # HEAD on a GET route: the GET's status and headers, no body
            head = await client.head("/health")
            assert head.status_code == 200 and head.content == b""
            assert head.headers["content-length"] == get.headers["content-length"] != "0"
            assert (await client.head("/v1/x")).headers["allow"] == "POST"
            post = await client.post("/health")
            assert post.status_code == 405 and post.headers["allow"] == "GET, HEAD"


def test_bearer_key_matches() -> None:
    assert bearer_key_matches("Bearer k1", "k1")
    assert bearer_key_matches("bearer  k1 ", "k1")
    assert not bearer_key_matches("Bearer k2", "k1")
    assert not bearer_key_matches("Basic k1", "k1")
    assert not bearer_key_matches("k1", "k1")
    assert not bearer_key_matches(None, "k1")
    assert not bearer_key_matches("Bearer \udcff", "k1")


def test_error_body_and_sse_framing() -> None:
    assert error_body(429, "slow down", code="rate_limit_exceeded") == {
        "error": {"message": "slow down", "type": "rate_limit_error", "code": "rate_limit_exceeded"}
    }
    assert error_body(503, "down")["error"]["type"] == "server_error"
    assert error_body(400, "bad", type="custom", param="x")["error"] == {
        "message": "bad",
        "type": "custom",
        "code": None,
        "param": "x",
    }
    assert sse_event({"a": "é"}) == 'data: {"a":"é"}\n\n'.encode()
    assert sse_event("[DONE]") == SSE_DONE


def test_threaded_server_serves_sync_code_and_stops() -> None:
    server = ThreadedServer(App(echo))
    server.start()
    try:
        with httpx.Client(base_url=server.base_url) as client:
            assert client.get("/a").json()["path"] == "/a"
    finally:
        server.stop()
    with pytest.raises(httpx.ConnectError), httpx.Client() as client:
        client.get(server.base_url)


def test_bad_settings_are_configuration_errors() -> None:
    with pytest.raises(ConfigurationError):
        App(echo, max_body_bytes=0)
    with pytest.raises(ConfigurationError):
        ServerSettings(port=70000)
    with pytest.raises(ConfigurationError):
        ServerSettings(limit_concurrency=0)
    with pytest.raises(ConfigurationError):
        ServerSettings(root_path="api/")
    with pytest.raises(ConfigurationError):
        ServerSettings(loop="trio")
    with pytest.raises(RuntimeError):
        _ = ThreadedServer(App(echo)).port
