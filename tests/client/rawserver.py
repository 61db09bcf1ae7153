"""A tiny loopback HTTP/1.1 server for fault tests: each connection gets a scripted answer.

It reads one request head (and a ``content-length`` body), records it, and hands the socket
to the test's ``answer`` coroutine, which writes whatever bytes the fault needs (endless
bodies, HTML, a forward-proxy reply). Optionally wrapped in TLS. Requests are served one
per connection; the connection is closed after ``answer`` returns.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import anyio
import anyio.abc
from anyio.streams.tls import TLSListener

__all__ = ["RawRequest", "RawServer", "raw_server", "send_all"]


@dataclass
class RawRequest:
    """One request as received: its request line, lower-cased headers and body."""

    line: str
    headers: dict[str, str]
    body: bytes


Answer = Callable[[RawRequest, anyio.abc.ByteStream], Awaitable[None]]


@dataclass
class RawServer:
    """Where the server listens and what it received."""

    port: int
    scheme: str
    requests: list[RawRequest] = field(default_factory=list)

    @property
    def base_url(self) -> str:
        """``{scheme}://127.0.0.1:{port}/v1``."""
        return f"{self.scheme}://127.0.0.1:{self.port}/v1"

    @property
    def url(self) -> str:
        """``{scheme}://127.0.0.1:{port}`` (a proxy URL)."""
        return f"{self.scheme}://127.0.0.1:{self.port}"


async def _read_request(stream: anyio.abc.ByteStream) -> RawRequest | None:
    data = b""
    while b"\r\n\r\n" not in data:
        try:
            data += await stream.receive()
        except (anyio.EndOfStream, anyio.BrokenResourceError, ssl.SSLError, OSError):
            return None
    head, _, body = data.partition(b"\r\n\r\n")
    line, *rest = head.decode("latin-1").split("\r\n")
    headers = {}
    for item in rest:
        name, _, value = item.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        try:
            body += await stream.receive()
        except (anyio.EndOfStream, anyio.BrokenResourceError):
            return None
    return RawRequest(line, headers, body)


async def send_all(stream: anyio.abc.ByteStream, data: bytes) -> bool:
    """Write ``data``; False when the client has gone away."""
    try:
        await stream.send(data)
    except (anyio.BrokenResourceError, anyio.ClosedResourceError, ssl.SSLError, OSError):
        return False
    return True


@asynccontextmanager
async def raw_server(
    answer: Answer, *, tls: ssl.SSLContext | None = None
) -> AsyncIterator[RawServer]:
    """Serve on a free loopback port until the block exits."""
    listener: anyio.abc.Listener[anyio.abc.ByteStream]
    tcp = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    port = tcp.extra(anyio.abc.SocketAttribute.local_port)
    listener = TLSListener(tcp, tls, standard_compatible=False) if tls is not None else tcp
    server = RawServer(port, "https" if tls is not None else "http")

    async def handle(stream: anyio.abc.ByteStream) -> None:
        try:
            async with stream:
                request = await _read_request(stream)
                if request is None:
                    return
                server.requests.append(request)
                await answer(request, stream)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, ssl.SSLError, OSError):
            pass  # the client went away mid-answer: that is what these faults provoke

    async def serve() -> None:
        try:
            await listener.serve(handle)
        except (ssl.SSLError, anyio.BrokenResourceError):
            pass

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(serve)
            try:
                yield server
            finally:
                tg.cancel_scope.cancel()
    finally:
        await listener.aclose()
