"""The anyio HTTP/1.1 server: keep-alive, limits, errors, disconnects, shutdown, threads."""

from __future__ import annotations

import json
import logging

import anyio
import httpx
import pytest

from swiftclient._httpserver import (
    HTTPRequest,
    HTTPServer,
    ResponseWriter,
    error_body,
    run_in_thread,
)
from swiftclient.errors import ConfigurationError

pytestmark = pytest.mark.anyio


async def echo(request: HTTPRequest, writer: ResponseWriter) -> None:
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


async def exchange(port: int, data: bytes) -> bytes:
    """Send raw bytes and read until the server closes the connection."""
    received = bytearray()
    with anyio.fail_after(10):
        async with await anyio.connect_tcp("127.0.0.1", port) as stream:
            await stream.send(data)
            try:
                while True:
                    received += await stream.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                pass
    return bytes(received)


def split_response(raw: bytes) -> tuple[str, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return lines[0], headers, body


async def test_keep_alive_serves_many_requests_on_one_connection() -> None:
    async with HTTPServer(echo) as server, httpx.AsyncClient(base_url=server.base_url) as client:
        for i in range(4):
            response = await client.post(
                f"/v1/x?i={i}", content=f"body{i}", headers={"x-agent": "t"}
            )
            assert response.status_code == 200
            assert response.json() == {
                "method": "POST",
                "path": "/v1/x",
                "query": f"i={i}",
                "body": f"body{i}",
                "agent": "t",
            }
        assert server.connections_opened == 1


async def test_pipelined_requests_are_answered_in_order() -> None:
    async with HTTPServer(echo) as server:
        one = b"POST /a HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\n\r\nabc"
        two = b"GET /b HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
        raw = await exchange(server.port, one + two)
    assert raw.count(b"HTTP/1.1 200 OK") == 2
    assert raw.index(b'"path":"/a"') < raw.index(b'"path":"/b"')
    assert b'"body":"abc"' in raw


async def test_connection_close_is_honoured() -> None:
    async with HTTPServer(echo) as server:
        raw = await exchange(server.port, b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
    status, headers, body = split_response(raw)
    assert status == "HTTP/1.1 200 OK"
    assert headers["connection"] == "close"
    assert json.loads(body)["path"] == "/"


async def test_expect_continue_gets_an_interim_response() -> None:
    async with HTTPServer(echo) as server:
        with anyio.fail_after(10):
            async with await anyio.connect_tcp("127.0.0.1", server.port) as stream:
                await stream.send(
                    b"POST / HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\n"
                    b"content-length: 2\r\nconnection: close\r\n\r\n"
                )
                interim = await stream.receive()
                assert interim.startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
                await stream.send(b"hi")
                rest = bytearray(interim[len(b"HTTP/1.1 100 Continue\r\n\r\n") :])
                try:
                    while True:
                        rest += await stream.receive()
                except anyio.EndOfStream:
                    pass
    assert json.loads(split_response(bytes(rest))[2])["body"] == "hi"


async def test_body_over_the_limit_gets_413_json() -> None:
    async with HTTPServer(echo, max_body_bytes=1024) as server:
        async with httpx.AsyncClient(base_url=server.base_url) as client:
            response = await client.post("/", content=b"x" * 4096)
            assert response.status_code == 413
            error = response.json()["error"]
            assert error["code"] == "request_too_large"
            assert error["type"] == "invalid_request_error"
            assert "1024" in error["message"]
            ok = await client.post("/", content=b"x" * 1024)
            assert ok.status_code == 200


async def test_headers_over_the_limit_get_431() -> None:
    async with HTTPServer(echo, max_header_bytes=1024) as server:
        async with httpx.AsyncClient(base_url=server.base_url) as client:
            response = await client.get("/", headers={"x-big": "y" * 4096})
            assert response.status_code == 431
            assert response.json()["error"]["code"] == "headers_too_large"


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"NONSENSE\r\n\r\n", "400"),
        (b"GET / HTTP/1.1\r\nno colon here\r\n\r\n", "400"),
        (b"GET / HTTP/1.1\r\n folded: header\r\n\r\n", "400"),
        (b"GET nopath HTTP/1.1\r\n\r\n", "400"),
        (b"POST / HTTP/1.1\r\ncontent-length: abc\r\n\r\n", "400"),
        (b"POST / HTTP/1.1\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n", "400"),
        (b"GET / HTTP/2.0\r\n\r\n", "505"),
        (b"POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", "411"),
    ],
)
async def test_malformed_requests_get_json_errors(request_bytes: bytes, status: str) -> None:
    async with HTTPServer(echo) as server:
        raw = await exchange(server.port, request_bytes)
        status_line, headers, body = split_response(raw)
        assert status_line.split(" ")[1] == status
        assert headers["connection"] == "close"
        assert set(json.loads(body)["error"]) == {"message", "type", "code"}
        # the server is still serving
        async with httpx.AsyncClient(base_url=server.base_url) as client:
            assert (await client.get("/")).status_code == 200


async def test_handler_crash_gets_500_and_the_server_keeps_serving(
    caplog: pytest.LogCaptureFixture,
) -> None:
    secret = "sk-proj-abcdefghijklmnop1234"

    async def handler(request: HTTPRequest, writer: ResponseWriter) -> None:
        if request.path == "/boom":
            raise RuntimeError(f"boom with Bearer {secret}")
        await echo(request, writer)

    caplog.set_level(logging.ERROR, logger="swiftclient.httpserver")
    async with HTTPServer(handler) as server, httpx.AsyncClient(base_url=server.base_url) as client:
        failed = await client.get("/boom")
        assert failed.status_code == 500
        assert failed.json()["error"]["type"] == "server_error"
        assert "boom" not in failed.text  # exception details stay in the log
        assert (await client.get("/fine")).json()["path"] == "/fine"
        assert server.connections_opened == 1  # the connection survived the crash
    assert "RuntimeError: boom" in caplog.text
    assert secret not in caplog.text


async def test_handler_without_a_response_gets_500() -> None:
    async def lazy(request: HTTPRequest, writer: ResponseWriter) -> None:
        return None

    async with HTTPServer(lazy) as server, httpx.AsyncClient(base_url=server.base_url) as client:
        assert (await client.get("/")).status_code == 500


async def test_crash_mid_stream_breaks_the_response() -> None:
    async def handler(request: HTTPRequest, writer: ResponseWriter) -> None:
        await writer.start_stream(200)
        await writer.write(b"partial")
        raise RuntimeError("mid-stream")

    async with HTTPServer(handler) as server, httpx.AsyncClient(base_url=server.base_url) as client:
        with pytest.raises(httpx.RemoteProtocolError):
            await client.get("/")


async def test_stream_is_chunked_and_auto_ended() -> None:
    async def handler(request: HTTPRequest, writer: ResponseWriter) -> None:
        await writer.start_stream(200, {"x-kind": "stream"})
        for i in range(3):
            await writer.write(f"part{i};".encode())
        await writer.write(b"")  # sends nothing, does not end the body

    async with HTTPServer(handler) as server, httpx.AsyncClient(base_url=server.base_url) as client:
        response = await client.get("/")
        assert response.headers["transfer-encoding"] == "chunked"
        assert response.headers["content-type"] == "text/event-stream"
        assert response.headers["x-kind"] == "stream"
        assert response.text == "part0;part1;part2;"


async def test_http10_stream_ends_with_the_connection() -> None:
    async def handler(request: HTTPRequest, writer: ResponseWriter) -> None:
        await writer.start_stream(200)
        await writer.write(b"one ")
        await writer.write(b"two")
        await writer.end()

    async with HTTPServer(handler) as server:
        raw = await exchange(server.port, b"GET / HTTP/1.0\r\n\r\n")
    status, headers, body = split_response(raw)
    assert status == "HTTP/1.1 200 OK"
    assert "transfer-encoding" not in headers
    assert headers["connection"] == "close"
    assert body == b"one two"


async def test_client_disconnect_cancels_the_handler() -> None:
    streaming = anyio.Event()
    cleaned_up = anyio.Event()
    seen: list[str] = []

    async def handler(request: HTTPRequest, writer: ResponseWriter) -> None:
        try:
            await writer.start_stream(200)
            await writer.write(b"first")
            streaming.set()
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            seen.append("cancelled")
            raise
        finally:
            cleaned_up.set()

    async with HTTPServer(handler) as server:
        with anyio.fail_after(10):
            async with await anyio.connect_tcp("127.0.0.1", server.port) as stream:
                await stream.send(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
                await streaming.wait()
            await cleaned_up.wait()
    assert seen == ["cancelled"]


async def test_disconnect_before_any_response_cancels_the_handler() -> None:
    entered = anyio.Event()
    cleaned_up = anyio.Event()

    async def handler(request: HTTPRequest, writer: ResponseWriter) -> None:
        try:
            entered.set()
            await anyio.sleep_forever()
        finally:
            cleaned_up.set()

    async with HTTPServer(handler) as server:
        with anyio.fail_after(10):
            async with await anyio.connect_tcp("127.0.0.1", server.port) as stream:
                await stream.send(b"POST / HTTP/1.1\r\ncontent-length: 2\r\n\r\n{}")
                await entered.wait()
            await cleaned_up.wait()


async def test_abort_drops_the_connection_mid_response() -> None:
    async def handler(request: HTTPRequest, writer: ResponseWriter) -> None:
        await writer.start_stream(200)
        await writer.write(b"some")
        await writer.abort()
        with pytest.raises(RuntimeError):
            await writer.write(b"more")

    async with HTTPServer(handler) as server, httpx.AsyncClient(base_url=server.base_url) as client:
        with pytest.raises(httpx.RemoteProtocolError):
            await client.get("/")


async def test_shutdown_cancels_handlers_and_closes_every_connection() -> None:
    streaming = anyio.Event()
    cleaned_up = anyio.Event()

    async def handler(request: HTTPRequest, writer: ResponseWriter) -> None:
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

    with anyio.fail_after(10):
        server = HTTPServer(handler)
        async with server:
            idle = await anyio.connect_tcp("127.0.0.1", server.port)
            busy = await anyio.connect_tcp("127.0.0.1", server.port)
            await idle.send(b"GET /idle HTTP/1.1\r\n\r\n")
            assert (await idle.receive()).startswith(b"HTTP/1.1 200")
            await busy.send(b"GET /busy HTTP/1.1\r\n\r\n")
            await streaming.wait()
            assert server.open_connections == 2
        assert cleaned_up.is_set()
        assert server.open_connections == 0
        for stream in (idle, busy):
            with pytest.raises((anyio.EndOfStream, anyio.BrokenResourceError)):
                while True:
                    await stream.receive()
            await stream.aclose()


async def test_serve_forever_reports_its_url() -> None:
    server = HTTPServer(echo)
    async with anyio.create_task_group() as task_group:
        url = await task_group.start(server.serve_forever)
        async with httpx.AsyncClient() as client:
            assert (await client.get(f"{url}/p")).json()["path"] == "/p"
        task_group.cancel_scope.cancel()


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_run_in_thread_serves_sync_code(backend: str) -> None:
    with run_in_thread(echo, backend=backend) as server:
        with httpx.Client(base_url=server.base_url) as client:
            assert client.get("/a").json()["path"] == "/a"
            assert client.post("/b", content=b"z").json()["body"] == "z"
        assert server.connections_opened == 1
    with pytest.raises(httpx.ConnectError), httpx.Client() as client:
        client.get(server.base_url)


def test_bad_settings_are_configuration_errors() -> None:
    with pytest.raises(ConfigurationError):
        HTTPServer(echo, max_body_bytes=0)
    with pytest.raises(ConfigurationError):
        HTTPServer(echo, port=70000)
    with pytest.raises(RuntimeError):
        _ = HTTPServer(echo).port


async def test_response_headers_are_validated() -> None:
    outcomes: list[str] = []

    async def handler(request: HTTPRequest, writer: ResponseWriter) -> None:
        for bad in ({"x-a": "1\r\nx-injected: 2"}, {"content-length": "3"}):
            try:
                await writer.send(200, b"abc", bad)
            except ValueError:
                outcomes.append("rejected")
        await writer.send(200, b"abc", {"Connection": "close"})

    async with HTTPServer(handler) as server:
        raw = await exchange(server.port, b"GET / HTTP/1.1\r\n\r\n")
    assert outcomes == ["rejected", "rejected"]
    assert b"x-injected" not in raw
    assert split_response(raw)[1]["connection"] == "close"


def test_error_body_shape() -> None:
    assert error_body(429, "slow down", code="rate_limit_exceeded") == {
        "error": {"message": "slow down", "type": "rate_limit_error", "code": "rate_limit_exceeded"}
    }
    assert error_body(503, "down")["error"]["type"] == "server_error"
    assert error_body(400, "bad", type="custom")["error"]["type"] == "custom"
