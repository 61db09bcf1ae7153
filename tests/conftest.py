"""Shared fixtures: every async test runs on asyncio and on trio."""

from __future__ import annotations

import pytest


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Run each ``@pytest.mark.anyio`` test on both event loops."""
    return str(request.param)
