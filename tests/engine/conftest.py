"""Fixtures shared by the engine tests."""

from __future__ import annotations

import pytest

from local_engine.attention.native import PagedDecodeKernel, load_paged_decode


@pytest.fixture
def kernel() -> PagedDecodeKernel:
    """The process-wide native kernel library; tests that need it skip where it cannot be
    built (no C compiler, or switched off)."""
    loaded = load_paged_decode()
    if loaded is None:
        pytest.skip("no native kernel here (no C compiler, or switched off)")
    return loaded
