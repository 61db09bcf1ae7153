"""Transport errors are mapped once: each adapter maps every exception its library can raise
to the seam's transport errors in one table, and those map to the public tree in one place.

The tables are checked against the libraries' whole exception trees, so a class a new
aiohttp or httpx adds fails here until someone decides what it means.
"""

from __future__ import annotations

import inspect
import ssl
from collections.abc import Sequence
from types import SimpleNamespace

import aiohttp
import anyio
import httpx
import pytest

from swiftclient import AsyncClient, HTTPBackend, RetryPolicy, errors
from swiftclient.backends import _errors as seam
from swiftclient.backends._aiohttp import AIOHTTP_ERRORS, map_aiohttp_error
from swiftclient.backends._httpx import HTTPX_ERRORS, map_httpx_error

# httpx's classes for misusing its own objects (reading a stream twice, a cookie jar
# conflict): not request failures, so the adapter lets them through unmapped.
HTTPX_NOT_REQUEST_FAILURES: set[type[Exception]] = {
    httpx.CookieConflict,
    httpx.StreamError,
    httpx.StreamConsumed,
    httpx.StreamClosed,
    httpx.ResponseNotRead,
    httpx.RequestNotRead,
}

# What each library class is to a user; every class not named is a plain
# APIConnectionError (retried, not a timeout).
HTTPX_PUBLIC: dict[type[Exception], type[errors.SwiftClientError]] = {
    httpx.ConnectTimeout: errors.ConnectTimeout,
    httpx.ReadTimeout: errors.APITimeoutError,
    httpx.WriteTimeout: errors.APITimeoutError,
    httpx.TimeoutException: errors.APITimeoutError,
    httpx.PoolTimeout: errors.PoolTimeout,
    httpx.DecodingError: errors.APIResponseValidationError,
    httpx.UnsupportedProtocol: errors.ConfigurationError,
    httpx.InvalidURL: errors.ConfigurationError,
}
AIOHTTP_PUBLIC: dict[type[Exception], type[errors.SwiftClientError]] = {
    aiohttp.ConnectionTimeoutError: errors.ConnectTimeout,
    aiohttp.SocketTimeoutError: errors.APITimeoutError,
    aiohttp.NonHttpUrlClientError: errors.ConfigurationError,
}


def _tree(roots: Sequence[type[Exception]], package: str) -> set[type[Exception]]:
    """The roots and every subclass of them the package defines."""
    found: set[type[Exception]] = set()
    todo = list(roots)
    while todo:
        cls = todo.pop()
        if cls not in found and cls.__module__.startswith(package):
            found.add(cls)
            todo.extend(cls.__subclasses__())
    return found


def _httpx_classes() -> set[type[Exception]]:
    public = [
        obj
        for _, obj in inspect.getmembers(httpx)
        if inspect.isclass(obj) and issubclass(obj, Exception)
    ]
    return _tree(public, "httpx")


def _aiohttp_classes() -> set[type[Exception]]:
    return _tree([aiohttp.ClientError], "aiohttp")


def _httpx_instance(cls: type[Exception]) -> Exception:
    if cls is httpx.HTTPStatusError:
        request = httpx.Request("POST", "http://h/v1")
        response = httpx.Response(503, request=request)
        return httpx.HTTPStatusError("status", request=request, response=response)
    made = cls("what happened")
    assert isinstance(made, Exception)
    return made


def _aiohttp_instance(cls: type[Exception]) -> Exception:
    """An instance built the way aiohttp builds it (several classes take no message)."""
    key = SimpleNamespace(host="h", port=443, ssl=True, is_ssl=True)
    refused = ConnectionRefusedError(111, "Connection refused")
    if issubclass(cls, aiohttp.ClientResponseError):
        return cls(None, (), status=400, message="what happened")  # type: ignore[arg-type]
    if cls is aiohttp.client_exceptions.UnixClientConnectorError:
        return cls("/sock", key, refused)  # type: ignore[arg-type]
    if cls is aiohttp.ClientConnectorCertificateError:
        return cls(key, ssl.SSLCertVerificationError("bad certificate"))  # type: ignore[arg-type]
    if issubclass(cls, aiohttp.ClientConnectorError):
        return cls(key, refused)  # type: ignore[arg-type]
    if cls is aiohttp.ServerFingerprintMismatch:
        return cls(b"a", b"b", "h", 443)
    if issubclass(cls, aiohttp.InvalidURL):
        return cls("ftp://h/v1")
    return cls("what happened")


def test_every_httpx_exception_class_is_mapped_or_deliberately_left_out() -> None:
    classes = _httpx_classes()
    assert {httpx.HTTPError, httpx.ReadTimeout, httpx.StreamClosed, httpx.InvalidURL} <= classes
    undecided = sorted(
        cls.__name__
        for cls in classes
        if cls not in HTTPX_ERRORS and cls not in HTTPX_NOT_REQUEST_FAILURES
    )
    assert not undecided, f"httpx exception classes without their own mapping: {undecided}"
    assert not HTTPX_NOT_REQUEST_FAILURES & set(HTTPX_ERRORS)


def test_every_aiohttp_exception_class_is_mapped_directly() -> None:
    # Reaching a mapped parent is not enough: each class is mapped on purpose.
    classes = _aiohttp_classes()
    assert {aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError} <= classes
    missing = sorted(cls.__name__ for cls in classes if cls not in AIOHTTP_ERRORS)
    assert not missing, f"aiohttp exception classes without their own mapping: {missing}"


def test_every_transport_error_class_has_its_public_class() -> None:
    classes = _tree([seam.TransportError], "swiftclient")
    assert set(seam.PUBLIC_ERRORS) == classes - {seam.TransportError}


def _name(cls: object) -> str:
    return getattr(cls, "__name__", "?")


@pytest.mark.parametrize(
    "cls", sorted(_httpx_classes() - HTTPX_NOT_REQUEST_FAILURES, key=_name), ids=_name
)
def test_each_httpx_exception_becomes_its_intended_error(cls: type[Exception]) -> None:
    exc = _httpx_instance(cls)
    transport_error = map_httpx_error(exc)
    assert type(transport_error) is HTTPX_ERRORS[cls]
    public = seam.to_public(transport_error, backend="b")
    assert type(public) is HTTPX_PUBLIC.get(cls, errors.APIConnectionError)
    said = "what happened"
    if cls is httpx.ConnectTimeout:  # worded as the aiohttp transport words it
        said = f"opening a connection timed out ({said})"
    assert str(public) == f"b: {said}" or cls is httpx.HTTPStatusError


@pytest.mark.parametrize(
    "cls",
    sorted(_aiohttp_classes() | {ConnectionResetError, OSError}, key=_name),
    ids=_name,
)
def test_each_aiohttp_exception_becomes_its_intended_error(cls: type[Exception]) -> None:
    exc = _aiohttp_instance(cls)
    transport_error = map_aiohttp_error(exc)
    assert transport_error is not None
    assert type(transport_error) is AIOHTTP_ERRORS[cls][0]
    public = seam.to_public(transport_error, backend="b")
    assert type(public) is AIOHTTP_PUBLIC.get(cls, errors.APIConnectionError)
    assert str(public).startswith("b: ") and len(str(public)) > len("b: ")


def test_what_is_not_a_transport_failure_is_not_mapped() -> None:
    assert map_aiohttp_error(RuntimeError("a bug")) is None
    assert map_aiohttp_error(ValueError("a bug")) is None


def test_the_public_error_keeps_only_a_scrubbed_stand_in() -> None:
    key = "0123456789abcdef0123456789abcdef"
    library = aiohttp.ServerDisconnectedError(f"Authorization: Bearer {key}")
    try:
        raise seam.ReadError(f"reset while sending Bearer {key}") from library
    except seam.TransportError as exc:
        public = seam.to_public(exc, backend="b", secrets=(key,))
    assert type(public) is errors.APIConnectionError and public.backend == "b"
    cause = public.__cause__
    assert type(cause) is seam.ReadError
    assert cause.__cause__ is None and cause.__context__ is None
    assert public.__suppress_context__
    for text in (str(public), repr(public), str(cause), repr(cause)):
        assert key not in text


async def _fail(base_url: str) -> BaseException:
    backend = HTTPBackend(base_url, "sk-test-key-1234567890", name="b")
    async with AsyncClient(backend, model="m", retry=RetryPolicy(max_attempts=1)) as client:
        with pytest.raises(errors.SwiftClientError) as info:
            await client.chat("hi")
    return info.value


@pytest.mark.anyio
async def test_a_refused_connection_is_the_same_error_on_both_transports() -> None:
    # asyncio runs the aiohttp transport, trio the httpx one.
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    await listener.aclose()
    error = await _fail(f"http://127.0.0.1:{port}/v1")
    assert type(error) is errors.APIConnectionError
    assert isinstance(error.__cause__, seam.ConnectError)
    assert error.__cause__.__cause__ is None and error.__cause__.__context__ is None


def test_a_url_that_is_not_http_is_refused_when_the_backend_is_made() -> None:
    # aiohttp's "not an http URL" used to be a retried connection error on asyncio, while
    # httpx's "unsupported protocol" was a configuration error on trio; then both were a
    # ConfigurationError at the first call. The backend refuses it as it is made.
    with pytest.raises(errors.ConfigurationError, match=r"absolute http\(s\) URL"):
        HTTPBackend("ftp://127.0.0.1:1/v1", "sk-test-key-1234567890", name="b")
