"""ASGI building blocks for OpenAI-compatible servers, served by uvicorn.

The one home of what the loopback fake provider (:mod:`swiftclient.testing`) and the local
engine's server (:mod:`local_engine.server`) share:

- wire pieces: :func:`error_body` (OpenAI-style error bodies), :func:`sse_event` and
  :data:`SSE_DONE` (server-sent-event framing), :func:`bearer_key_matches` (the bearer scheme
  case-insensitively, the key in constant time);
- :class:`App`, an ASGI application around one handler: it reads the body (413 past
  ``max_body_bytes``, 408 when it trickles in past ``body_timeout``), hands a :class:`Request`
  and a :class:`ResponseWriter` to the handler, cancels the handler as soon as the client
  goes away, answers 500 (logged with secrets redacted) when the handler fails, drops the
  connection when it fails mid-stream, and drops a client that stops reading a stream for
  ``write_timeout`` seconds;
- :class:`Router`: paths to ``(method, handler)``, 404 / 405 / 401 answered in one order;
- running on uvicorn: :class:`ServerSettings` (host, port, connection cap, keep-alive and
  request-head deadlines, root path, loop), :func:`serve` (this thread, until a signal) and
  :class:`ThreadedServer` (a background thread with its own asyncio loop, so code on any
  event loop, or none, can start and stop it).

uvicorn is imported only when a server starts; building an :class:`App` needs only anyio.
uvloop and httptools are used when installed (uvicorn's ``auto``). Connections are served by
a subclass of uvicorn's HTTP protocol that adds what uvicorn leaves out: a deadline for each
request head (a client that opens a connection, or starts a request on a kept-alive one,
and sends no complete head within ``head_timeout`` seconds is disconnected: slowloris), a
cap on head
bytes (431), and the transport handle that :meth:`ResponseWriter.abort` needs for fault
injection.
"""

from ._app import App, ConnectionTracker, Handler, Request, ResponseWriter, Router
from ._uvicorn import ServerSettings, ThreadedServer, serve
from ._wire import SSE_DONE, bearer_key_matches, error_body, sse_event

__all__ = [
    "SSE_DONE",
    "App",
    "ConnectionTracker",
    "Handler",
    "Request",
    "ResponseWriter",
    "Router",
    "ServerSettings",
    "ThreadedServer",
    "bearer_key_matches",
    "error_body",
    "serve",
    "sse_event",
]
