"""Running an :class:`~swiftclient.asgi.App` on uvicorn: here, or in a background thread."""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager, ExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import anyio.abc
import anyio.from_thread
import anyio.to_thread

from ..errors import ConfigurationError
from ._app import App
from ._wire import dumps, error_body

if TYPE_CHECKING:
    import asyncio

__all__ = ["ServerSettings", "ThreadedServer", "serve"]

_T = TypeVar("_T")


class _HeadTooLarge(Exception):
    """A request head went past ``max_head_bytes`` (answered 431, the connection closed)."""


@dataclass(frozen=True)
class ServerSettings:
    """Where and how uvicorn serves an :class:`App`.

    Args:
        host: interface to bind (loopback by default).
        port: TCP port (0 picks a free one).
        limit_concurrency: past this many open connections or running requests, requests
            get 503 (uvicorn's ``limit_concurrency``); None: no cap.
        keepalive_timeout: seconds an idle kept-alive connection stays open.
        head_timeout: seconds a client has to send a complete request head, counted from
            the connection's start, or on a kept-alive connection from the head's first byte
            (an idle kept-alive connection is closed after ``keepalive_timeout``).
        max_head_bytes: a request head larger than this gets 431 and the connection closes.
        graceful_timeout: seconds a shutdown waits for running requests.
        root_path: the path prefix a proxy strips (ASGI ``root_path``).
        loop: ``auto`` (uvloop when installed), ``asyncio`` or ``uvloop``.
        backlog: the listening socket's backlog.
        access_log: log every request on ``uvicorn.access``.
    """

    host: str = "127.0.0.1"
    port: int = 0
    limit_concurrency: int | None = None
    keepalive_timeout: float = 5.0
    head_timeout: float = 10.0
    max_head_bytes: int = 64 * 1024
    graceful_timeout: float = 5.0
    root_path: str = ""
    loop: str = "auto"
    backlog: int = 2048
    access_log: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.port, bool) or not isinstance(self.port, int):
            raise ConfigurationError(f"port must be an integer, got {self.port!r}")
        if not 0 <= self.port <= 65535:
            raise ConfigurationError(f"port must be in 0..65535, got {self.port!r}")
        positive: list[tuple[str, object]] = [
            ("keepalive_timeout", self.keepalive_timeout),
            ("head_timeout", self.head_timeout),
            ("max_head_bytes", self.max_head_bytes),
            ("graceful_timeout", self.graceful_timeout),
            ("backlog", self.backlog),
        ]
        if self.limit_concurrency is not None:
            positive.append(("limit_concurrency", self.limit_concurrency))
        for name, value in positive:
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ConfigurationError(f"{name} must be a positive number, got {value!r}")
        if self.loop not in ("auto", "asyncio", "uvloop"):
            raise ConfigurationError(f"loop must be auto, asyncio or uvloop, got {self.loop!r}")
        if self.root_path and (not self.root_path.startswith("/") or self.root_path.endswith("/")):
            raise ConfigurationError(
                f"root_path must start with '/' and not end with one, got {self.root_path!r}"
            )

    def bind(self) -> socket.socket:
        """Open the listening socket (raises OSError when the address is taken)."""
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        return socket.create_server((self.host, self.port), family=family, backlog=self.backlog)

    def use_uvloop(self) -> bool:
        """Whether the loop setting asks for uvloop and it is installed."""
        if self.loop == "asyncio":
            return False
        try:
            import uvloop  # noqa: F401
        except ImportError:
            if self.loop == "uvloop":
                raise ConfigurationError("loop='uvloop' needs uvloop installed") from None
            return False
        return True


def _uvicorn() -> Any:
    try:
        import uvicorn
    except ImportError as exc:  # pragma: no cover - uvicorn is in the extras that serve
        raise ConfigurationError(
            "serving needs uvicorn: pip install 'swiftclient-llm[testing]' (or [local])"
        ) from exc
    return uvicorn


def _protocol_class(app: App, settings: ServerSettings) -> type[Any]:
    """uvicorn's httptools protocol (else h11), plus head deadlines and connection tracking."""
    base: type[Any]
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

        base = HttpToolsProtocol
    except ImportError:  # httptools missing: h11 has its own head size limit
        from uvicorn.protocols.http.h11_impl import H11Protocol

        base = H11Protocol

    tracker = app.connections
    head_timeout = settings.head_timeout
    max_head = settings.max_head_bytes
    overflow = (
        b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
        b"connection: close\r\ncontent-length: %d\r\n\r\n%b"
    )
    overflow_body = dumps(error_body(431, "Request headers too large.", code="headers_too_large"))
    overflow = overflow % (len(overflow_body), overflow_body)

    class GuardedProtocol(base):  # type: ignore[misc]
        """Tracks the connection; closes it when no complete head arrives in time."""

        def connection_made(self, transport: asyncio.Transport) -> None:
            super().connection_made(transport)
            peer = transport.get_extra_info("peername")
            self.guard_key = (str(peer[0]), int(peer[1])) if peer else None
            self.guard_bytes = 0
            self.guard_timer: asyncio.TimerHandle | None = None
            if self.guard_key is not None:
                tracker.add(self.guard_key, transport)
            self.guard_arm()

        def guard_arm(self) -> None:
            self.guard_disarm()
            self.guard_timer = self.loop.call_later(head_timeout, self.guard_expired)

        def guard_disarm(self) -> None:
            if self.guard_timer is not None:
                self.guard_timer.cancel()
                self.guard_timer = None

        def guard_expired(self) -> None:
            self.guard_timer = None
            cycle = self.cycle
            if cycle is None or cycle.response_complete:
                self.transport.abort()

        def connection_lost(self, exc: Exception | None) -> None:
            self.guard_disarm()
            if self.guard_key is not None:
                tracker.discard(self.guard_key)
            super().connection_lost(exc)

        def guard_count(self, size: int) -> None:
            self.guard_bytes += size
            if self.guard_bytes > max_head:
                if not self.transport.is_closing():
                    self.transport.write(overflow)
                    self.transport.close()
                raise _HeadTooLarge  # stops the parser (uvicorn's own 400 goes nowhere)

        def on_message_begin(self) -> None:
            self.guard_bytes = 0
            if self.guard_timer is None:  # a new request on a kept-alive connection
                self.guard_arm()
            super().on_message_begin()

        def on_url(self, url: bytes) -> None:
            self.guard_count(len(url))
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self.guard_count(len(name) + len(value) + 4)
            super().on_header(name, value)

        def pause_writing(self) -> None:
            super().pause_writing()
            if self.guard_key is not None:
                tracker.set_paused(self.guard_key, True)

        def resume_writing(self) -> None:
            super().resume_writing()
            if self.guard_key is not None:
                tracker.set_paused(self.guard_key, False)

        def on_headers_complete(self) -> None:
            self.guard_disarm()
            super().on_headers_complete()

    return GuardedProtocol


def _config(app: App, settings: ServerSettings, *, log: bool) -> Any:
    uvicorn = _uvicorn()
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        http=_protocol_class(app, settings),
        loop="none",
        lifespan="off",
        interface="asgi3",
        limit_concurrency=settings.limit_concurrency,
        timeout_keep_alive=settings.keepalive_timeout,
        timeout_graceful_shutdown=settings.graceful_timeout,
        root_path=settings.root_path,
        backlog=settings.backlog,
        access_log=settings.access_log,
        server_header=False,
        log_config=uvicorn.config.LOGGING_CONFIG if log else None,
    )


def serve(
    app: App,
    settings: ServerSettings,
    *,
    resources: AbstractAsyncContextManager[object] | None = None,
    on_ready: Callable[[str], None] | None = None,
    log_level: str = "info",
) -> None:
    """Serve ``app`` on uvicorn in this thread until SIGINT or SIGTERM.

    The socket is bound first (an ``OSError`` if the address is taken), then ``resources``
    is entered (loading a model, say), then ``on_ready(base_url)`` is called (the direct
    address, without the root path a proxy adds) and requests are
    served; on a signal, uvicorn stops gracefully and ``resources`` is exited. uvicorn logs
    to stderr at ``log_level``.
    """
    uvicorn = _uvicorn()
    sock = settings.bind()
    config = _config(app, settings, log=True)
    logging.getLogger("uvicorn.error").setLevel(log_level.upper())

    async def main() -> None:
        server = uvicorn.Server(config)
        with sock:
            if resources is not None:
                async with resources:
                    _ready(on_ready, settings, sock)
                    await server.serve(sockets=[sock])
            else:
                _ready(on_ready, settings, sock)
                await server.serve(sockets=[sock])

    anyio.run(main, backend="asyncio", backend_options={"use_uvloop": settings.use_uvloop()})


def _base_url(settings: ServerSettings, sock: socket.socket) -> str:
    port = sock.getsockname()[1]
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    return f"http://{host}:{port}"


def _ready(
    on_ready: Callable[[str], None] | None, settings: ServerSettings, sock: socket.socket
) -> None:
    if on_ready is not None:
        on_ready(_base_url(settings, sock))


class ThreadedServer:
    """Serves an :class:`App` on uvicorn from a background thread with its own event loop.

    ``start()`` binds the socket, enters ``resources`` on the server's loop and starts
    serving; ``stop()`` cancels every running handler, stops uvicorn and exits
    ``resources``. Both block; :meth:`astart` / :meth:`astop` run them from async code on
    any event loop (asyncio or trio). :meth:`call` / :meth:`acall` run a coroutine function
    on the server's loop (to reach state that lives there).
    """

    def __init__(
        self,
        app: App,
        settings: ServerSettings | None = None,
        *,
        resources: AbstractAsyncContextManager[object] | None = None,
    ) -> None:
        self.app = app
        self.settings = settings or ServerSettings()
        self._resources = resources
        self._stack: ExitStack | None = None
        self._portal: anyio.from_thread.BlockingPortal | None = None
        self._port: int | None = None
        self._stop: Callable[[], None] | None = None
        self._lock = threading.Lock()

    @property
    def port(self) -> int:
        """The bound port (known once started)."""
        if self._port is None:
            raise RuntimeError("the server has not started")
        return self._port

    @property
    def base_url(self) -> str:
        """``http://HOST:PORT``: the direct address (a proxy adds the root path)."""
        host = self.settings.host
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}"

    @property
    def running(self) -> bool:
        """True between start and stop."""
        return self._portal is not None

    def start(self) -> None:
        """Bind, enter the resources and start serving (blocks until requests are accepted)."""
        with self._lock:
            if self._stack is not None:
                raise RuntimeError("the server is already running")
            config = _config(self.app, self.settings, log=False)
            sock = self.settings.bind()
            with ExitStack() as stack:
                stack.callback(sock.close)
                portal = stack.enter_context(
                    anyio.from_thread.start_blocking_portal(
                        "asyncio", backend_options={"use_uvloop": self.settings.use_uvloop()}
                    )
                )
                future, _ = portal.start_task(self._run, _wakeable_server(), config, sock)
                stack.callback(future.result)
                stack.callback(portal.call, self._shutdown)
                self._port = sock.getsockname()[1]
                self._portal = portal
                self._stack = stack.pop_all()

    def stop(self) -> None:
        """Stop serving: cancel running handlers, close connections, exit the resources."""
        with self._lock:
            stack, self._stack = self._stack, None
            self._portal = None
            if stack is not None:
                stack.close()

    async def astart(self) -> None:
        """:meth:`start` from async code (in a worker thread)."""
        await anyio.to_thread.run_sync(self.start)

    async def astop(self) -> None:
        """:meth:`stop` from async code (in a worker thread, shielded from cancellation)."""
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(self.stop)

    def call(self, func: Callable[[], Awaitable[_T]]) -> _T:
        """Run ``func()`` on the server's loop and return its result (blocks)."""
        portal = self._portal
        if portal is None:
            raise RuntimeError("the server is not running")
        return portal.call(func)

    async def acall(self, func: Callable[[], Awaitable[_T]]) -> _T:
        """:meth:`call` from async code on any loop; cancelling it cancels ``func()`` on
        the server's loop too (left running, it would keep :meth:`stop` waiting for it)."""
        portal = self._portal
        if portal is None:
            raise RuntimeError("the server is not running")
        # spawned and cancelled from worker threads: the portal waits for the server's loop
        future = await anyio.to_thread.run_sync(portal.start_task_soon, func)
        try:
            return await anyio.to_thread.run_sync(future.result, abandon_on_cancel=True)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(future.cancel)
            raise

    async def _run(
        self,
        server_class: type[Any],
        config: Any,
        sock: socket.socket,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        server = server_class(config)
        self._stop = server.wake
        if self._resources is not None:
            async with self._resources:
                task_status.started()
                await server.serve(sockets=[sock])
        else:
            task_status.started()
            await server.serve(sockets=[sock])

    async def _shutdown(self) -> None:
        self.app.cancel_requests()
        if self._stop is not None:
            self._stop()


def _wakeable_server() -> type[Any]:
    """uvicorn's Server, its main loop woken at once by :meth:`wake` (not a 0.1 s poll)."""
    uvicorn = _uvicorn()

    class WakeableServer(uvicorn.Server):  # type: ignore[misc, name-defined]
        def __init__(self, config: Any) -> None:
            super().__init__(config)
            self.woken: anyio.Event | None = None

        def wake(self) -> None:
            """Ask the server to stop (call on its loop)."""
            self.should_exit = True
            if self.woken is not None:
                self.woken.set()

        async def main_loop(self) -> None:
            self.woken = anyio.Event()
            counter = 0
            while not await self.on_tick(counter):
                with anyio.move_on_after(1.0):
                    await self.woken.wait()
                counter += 10

    return WakeableServer
