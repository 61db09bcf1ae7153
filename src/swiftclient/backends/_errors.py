"""The single place where transport exceptions become swiftclient exceptions.

Every httpx exception class maps to exactly one swiftclient class (a test walks httpx's
whole exception tree); messages are scrubbed of secrets on the way. The transport's own
exception never becomes part of the chain a user can reach: it may hold the request
(``Authorization`` header included) or the server's words unredacted. The mapped error's
``__cause__`` is a stand-in of the same httpx type carrying only the redacted message.
"""

from __future__ import annotations

import httpx

from .. import errors

__all__ = ["HTTPX_ERROR_MAP", "map_httpx_error"]

# Every class httpx defines has its own entry (a test checks it), so each mapping is a
# deliberate choice; the lookup still walks the MRO for subclasses a later httpx adds.
HTTPX_ERROR_MAP: dict[type[Exception], type[errors.SwiftClientError]] = {
    httpx.HTTPError: errors.APIError,
    httpx.HTTPStatusError: errors.APIStatusError,
    httpx.RequestError: errors.APIConnectionError,
    httpx.TooManyRedirects: errors.APIConnectionError,
    httpx.DecodingError: errors.APIResponseValidationError,
    httpx.TransportError: errors.APIConnectionError,
    httpx.UnsupportedProtocol: errors.ConfigurationError,
    httpx.ProxyError: errors.APIConnectionError,
    httpx.TimeoutException: errors.APITimeoutError,
    httpx.ConnectTimeout: errors.ConnectTimeout,
    httpx.ReadTimeout: errors.APITimeoutError,
    httpx.WriteTimeout: errors.APITimeoutError,
    httpx.PoolTimeout: errors.PoolTimeout,
    httpx.NetworkError: errors.APIConnectionError,
    httpx.ConnectError: errors.APIConnectionError,
    httpx.ReadError: errors.APIConnectionError,
    httpx.WriteError: errors.APIConnectionError,
    httpx.CloseError: errors.APIConnectionError,
    httpx.ProtocolError: errors.APIConnectionError,
    httpx.LocalProtocolError: errors.APIConnectionError,
    httpx.RemoteProtocolError: errors.APIConnectionError,
    httpx.InvalidURL: errors.ConfigurationError,
    httpx.CookieConflict: errors.APIError,
    httpx.StreamError: errors.APIError,
    httpx.StreamConsumed: errors.APIError,
    httpx.StreamClosed: errors.APIError,
    httpx.ResponseNotRead: errors.APIError,
    httpx.RequestNotRead: errors.APIError,
}


def _detail(exc: BaseException) -> str:
    """The first non-empty message along the exception's cause chain (httpx often re-raises
    with an empty message, the reason being in the lower layer's exception)."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            break
        if str(seen):
            return str(seen)
        seen = seen.__cause__ or seen.__context__
    return type(exc).__name__


def _stand_in(exc: Exception, message: str) -> BaseException | None:
    """A fresh exception of ``exc``'s type holding only ``message`` (no request, response,
    cause or context); None when the type cannot be built from a message alone."""
    try:
        clean = type(exc)(message)
    except Exception:
        return None
    return clean if type(clean) is type(exc) else None


def map_httpx_error(
    exc: Exception, *, backend: str, secrets: tuple[str | None, ...] = ()
) -> errors.SwiftClientError:
    """Return the swiftclient exception for an httpx exception, its ``__cause__`` already
    set to a scrubbed stand-in of ``exc``. The caller raises it outside its ``except``
    block (``raise error``, not ``from exc``), so ``__context__`` does not keep ``exc``
    either."""
    message = errors.redact(_detail(exc), *secrets)
    error = _mapped(exc, message, backend)
    error.__cause__ = _stand_in(exc, message)
    error.__suppress_context__ = True
    return error


def _mapped(exc: Exception, message: str, backend: str) -> errors.SwiftClientError:
    for cls in type(exc).__mro__:
        target = HTTPX_ERROR_MAP.get(cls)
        if target is None:
            continue
        if target is errors.APIStatusError and isinstance(exc, httpx.HTTPStatusError):
            status = exc.response.status_code
            return errors.status_error_class(status)(message, status_code=status, backend=backend)
        if issubclass(target, errors.APIError):
            return target(f"{backend}: {message}", backend=backend)
        return target(f"{backend}: {message}")
    return errors.APIError(f"{backend}: {message}", backend=backend)
