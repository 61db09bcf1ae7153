"""The transport seam's errors, and the one place they become swiftclient exceptions.

A :class:`~swiftclient.backends.base.Transport` reports every failure as one of the classes
below, whatever library it runs on: each adapter (``_aiohttp.py``, ``_httpx.py``) maps its
library's exceptions to these in one table, and :func:`to_public` maps these to the public
tree (``swiftclient.errors``) in another. A test walks aiohttp's and httpx's exception trees
and checks that every class has its own entry in its adapter's table.

::

    TransportError
    ├── ConnectError          no connection: refused, DNS, TLS, a proxy that fails the tunnel
    │   └── ConnectTimeout    opening a connection took over the connect limit
    ├── PoolTimeout           the transport's own pool had no connection in time
    ├── ReadError             the connection failed while the response was read (reset, OS)
    │   └── ReadTimeout
    ├── WriteError            the connection failed while the request was sent
    │   └── WriteTimeout
    ├── ProtocolError         the server broke HTTP: a malformed head, a close without an
    │                         answer, a body cut short
    ├── DecodingError         the body's content-encoding does not decode
    └── InvalidURL            a URL or scheme the transport cannot send to

The library's exception never becomes part of the chain a user can reach: it may hold the
request (``Authorization`` header included) or the server's words unredacted. The public
error's ``__cause__`` is a fresh transport error of the same class carrying only the
redacted message.
"""

from __future__ import annotations

from .. import errors

__all__ = [
    "PUBLIC_ERRORS",
    "ConnectError",
    "ConnectTimeout",
    "DecodingError",
    "InvalidURL",
    "PoolTimeout",
    "ProtocolError",
    "ReadError",
    "ReadTimeout",
    "TransportError",
    "WriteError",
    "WriteTimeout",
    "closed_under",
    "to_public",
]


class TransportError(Exception):
    """A transport failure in the seam's own terms (never raised itself)."""


class ConnectError(TransportError):
    """No connection could be opened: refused, DNS, TLS, or a proxy that fails the tunnel."""


class ConnectTimeout(ConnectError):
    """Opening a connection took over the connect limit."""


class PoolTimeout(TransportError):
    """The transport's own pool had no connection in time (a given httpx transport's)."""


class ReadError(TransportError):
    """The connection failed while the response was read (reset, an OS error)."""


class ReadTimeout(ReadError):
    """The response did not arrive within the transport's read limit."""


class WriteError(TransportError):
    """The connection failed while the request was sent."""


class WriteTimeout(WriteError):
    """The request could not be sent within the transport's write limit."""


class ProtocolError(TransportError):
    """The server broke HTTP: a malformed head, a close without an answer, a body cut short."""


class DecodingError(TransportError):
    """The body's content-encoding does not decode."""


class InvalidURL(TransportError):
    """A URL or scheme the transport cannot send to (a configuration error)."""


PUBLIC_ERRORS: dict[type[TransportError], type[errors.SwiftClientError]] = {
    ConnectError: errors.APIConnectionError,
    ConnectTimeout: errors.ConnectTimeout,
    PoolTimeout: errors.PoolTimeout,
    ReadError: errors.APIConnectionError,
    ReadTimeout: errors.APITimeoutError,
    WriteError: errors.APIConnectionError,
    WriteTimeout: errors.APITimeoutError,
    ProtocolError: errors.APIConnectionError,
    DecodingError: errors.APIResponseValidationError,
    InvalidURL: errors.ConfigurationError,
}
"""Each transport error class's public class (every class has its own entry)."""


def to_public(
    exc: TransportError, *, backend: str, secrets: tuple[str | None, ...] = ()
) -> errors.SwiftClientError:
    """Return the swiftclient exception for a transport error, its ``__cause__`` already
    set to a scrubbed stand-in of ``exc``. The caller raises it outside its ``except``
    block (``raise error``, not ``from exc``), so ``__context__`` does not keep ``exc``
    (nor the library exception on its chain) either."""
    message = errors.redact(str(exc) or type(exc).__name__, *secrets)
    target = next(
        (PUBLIC_ERRORS[cls] for cls in type(exc).__mro__ if cls in PUBLIC_ERRORS),
        errors.APIConnectionError,
    )
    error: errors.SwiftClientError
    if issubclass(target, errors.APIError):
        error = target(f"{backend}: {message}", backend=backend)
    else:
        error = target(f"{backend}: {message}")
    error.__cause__ = type(exc)(message)
    error.__suppress_context__ = True
    return error


def closed_under(reading: bool) -> errors.ClientClosedError:
    """The error of a request whose transport was closed under it: while its reply was
    read (``reading``), or before the reply began (a connection error there would be
    retried, on a transport opened anew)."""
    when = "while this reply was read" if reading else "before this reply began"
    return errors.ClientClosedError(f"the client was closed {when}")
