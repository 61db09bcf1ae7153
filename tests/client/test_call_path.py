"""The call path's contract with its caller: per-call limits, messages in and out, errors
that say what happened after retries."""

from __future__ import annotations

import pytest

from swiftclient import FirstTokenTimeout, Timeout

from .mock import Script, chunk
from .test_client import make

pytestmark = pytest.mark.anyio


# --------------------------------------------------------------------------- per-call timeout


def test_a_number_overrides_total_only() -> None:
    base = Timeout(total=60, connect=2, pool=3, first_token=4, idle=5)
    assert Timeout.coerce(9, base) == Timeout(total=9, connect=2, pool=3, first_token=4, idle=5)
    assert Timeout.coerce(None, base) == Timeout(
        total=None, connect=2, pool=3, first_token=4, idle=5
    )
    assert Timeout.coerce(9) == Timeout(total=9)
    replaced = Timeout(total=1)
    assert Timeout.coerce(replaced, base) is replaced


async def test_a_per_call_number_keeps_the_clients_first_token_limit() -> None:
    # The client's first_token limit must survive `timeout=20`: each stalled attempt times
    # out on it and is retried, instead of the call waiting out its whole total.
    script = Script()
    for _ in range(3):
        script.add(parts=[chunk(role="assistant"), b": keep-alive\n\n"], stall=True)
    limits = Timeout(total=60, first_token=0.3, idle=None)
    async with make(script, timeout=limits) as client:
        with pytest.raises(FirstTokenTimeout):
            await client.chat("hi", timeout=20)
    assert len(script.requests) == 3
