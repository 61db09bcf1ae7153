"""The single place where transport exceptions become swiftclient exceptions.

Every httpx exception class maps to exactly one swiftclient class (a test walks httpx's
whole exception tree); messages are scrubbed of secrets on the way.
"""

from __future__ import annotations

import httpx

from .. import errors

__all__ = ["HTTPX_ERROR_MAP", "map_httpx_error"]

# Most specific first is not needed: lookup walks the raised class's MRO.
HTTPX_ERROR_MAP: dict[type[Exception], type[errors.SwiftClientError]] = {
    httpx.ConnectTimeout: errors.ConnectTimeout,
    httpx.PoolTimeout: errors.PoolTimeout,
    httpx.TimeoutException: errors.APITimeoutError,
    httpx.NetworkError: errors.APIConnectionError,
    httpx.ProtocolError: errors.APIConnectionError,
    httpx.ProxyError: errors.APIConnectionError,
    httpx.UnsupportedProtocol: errors.ConfigurationError,
    httpx.DecodingError: errors.APIResponseValidationError,
    httpx.TooManyRedirects: errors.APIConnectionError,
    httpx.TransportError: errors.APIConnectionError,
    httpx.RequestError: errors.APIConnectionError,
    httpx.HTTPStatusError: errors.APIStatusError,
    httpx.HTTPError: errors.APIError,
    httpx.InvalidURL: errors.ConfigurationError,
    httpx.CookieConflict: errors.APIError,
    httpx.StreamError: errors.APIError,
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


def map_httpx_error(
    exc: Exception, *, backend: str, secrets: tuple[str | None, ...] = ()
) -> errors.SwiftClientError:
    """Return the swiftclient exception for an httpx exception (caller raises it ``from exc``)."""
    message = errors.redact(_detail(exc), *secrets)
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
