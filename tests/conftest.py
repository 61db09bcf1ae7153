"""Shared fixtures: every async test runs on asyncio and on trio."""

from __future__ import annotations

import os
import shutil

import pytest

# Without an NVIDIA GPU the Triton attention kernels run under Triton's interpreter. Triton
# reads the switch when a kernel (its own library's included) is decorated, i.e. when it is
# first imported, and transformers imports it, so it is set here, before any test module.
if shutil.which("nvidia-smi") is None:
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Run each ``@pytest.mark.anyio`` test on both event loops."""
    return str(request.param)
