"""Client-test fixtures: the HTTP transport, parametrized like the event loop."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from . import mock


@pytest.fixture(params=mock.TRANSPORTS)
def transport(request: pytest.FixtureRequest, anyio_backend: str) -> Iterator[str]:
    """Run a test whose backends come from :func:`mock.backend_for` (``client_for``,
    ``scripted_client``) over each HTTP transport: aiohttp (asyncio's default) and httpx
    (trio's, and asyncio's on request). A module or a test opts in with
    ``pytest.mark.usefixtures("transport")``."""
    name = str(request.param)
    if name == "aiohttp" and anyio_backend != "asyncio":
        pytest.skip("aiohttp runs on asyncio only")
    before, mock.transport_in_use = mock.transport_in_use, name
    try:
        yield name
    finally:
        mock.transport_in_use = before
