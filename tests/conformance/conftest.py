"""One backend contract, seven backends: the ``target`` fixture runs each conformance test on

- ``fake``: :class:`HTTPBackend` against the scripted loopback :class:`FakeProvider`;
- ``fake_messages``: :class:`AnthropicBackend` against the same fake's ``/v1/messages``;
- ``fake_responses``: :class:`ResponsesBackend` against the same fake's ``/v1/responses``;
- ``local_http``: :class:`HTTPBackend` against :class:`LocalServer` (the local engine served
  over HTTP in this process, on a free port);
- ``local_responses``: :class:`ResponsesBackend` against the same server's ``/v1/responses``
  (the Responses wire on both sides);
- ``local_messages``: :class:`AnthropicBackend` against the same server's ``/v1/messages``
  (Anthropic's Messages wire on both sides);
- ``local``: :class:`LocalBackend` in process.

The local paths run the embedded tiny default model (random weights), generated once per
session into a temporary ``SWIFTCLIENT_CACHE_DIR``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import anyio
import pytest

from local_engine import LocalBackend
from local_engine.default_model import RANDOM_MODEL_NAME, ensure_default_model
from local_engine.server import LocalServer
from swiftclient import AnthropicBackend, AsyncClient
from swiftclient.backends.base import Backend
from swiftclient.backends.http import HTTPBackend
from swiftclient.backends.responses import ResponsesBackend
from swiftclient.testing import FakeProvider, Reply

from .tiny_local import CountingEngine, TinyModel, load_tiny_model

KINDS = (
    "fake",
    "fake_messages",
    "fake_responses",
    "local_http",
    "local_responses",
    "local_messages",
    "local",
)
MODEL = "tiny"
RELEASE_LIMIT = 30.0  # seconds; a bound on waiting for cleanup, not a speed assertion
LONG_REPLY_TOKENS = 1000
# Engine steps an abandoned request may still take before its abort lands: the HTTP server
# must first notice the disconnect. Finishing the long reply instead takes about 1000 steps.
ABORT_STEP_BUDGET = LONG_REPLY_TOKENS // 2


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TinyModel]:
    """Generate the default model into a temporary cache named by SWIFTCLIENT_CACHE_DIR."""
    cache_root = tmp_path_factory.mktemp("swiftclient-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SWIFTCLIENT_CACHE_DIR", str(cache_root))
        assert ensure_default_model() == cache_root / "models" / RANDOM_MODEL_NAME
        yield load_tiny_model(cache_root)


@dataclass
class Target:
    """A client wired to one backend, plus what is needed to check its cleanup."""

    kind: str
    client: AsyncClient
    backend: Backend
    fake: FakeProvider | None = None
    local: LocalBackend | None = None
    server: LocalServer | None = None  # serves the engine on its own loop and thread
    engine: CountingEngine | None = None

    def expect_long_reply(self) -> dict[str, Any]:
        """Arrange a reply far longer than any test reads; return the call's parameters."""
        if self.fake is not None:
            self.fake.script(Reply(tokens=5 * LONG_REPLY_TOKENS, token_delay=0.005))
        return {"max_tokens": LONG_REPLY_TOKENS, "extra_body": {"ignore_eos": True}}

    async def assert_released(self) -> None:
        """Call right after a call ended: wait until its resources are back, check that all
        of them are, and that an abandoned engine request was aborted, not run to its end."""
        engine = self.engine
        steps_before = engine.steps if engine is not None else 0
        if self.kind == "local":
            assert self.local is not None and self.local.async_engine is not None
            assert self.local.async_engine.num_active == 0  # aborted on exit, not later
        with anyio.fail_after(RELEASE_LIMIT):
            if self.fake is not None:
                await self.fake.wait_until_idle()
            if self.server is not None:
                await self.server.wait_idle()
            if self.local is not None and self.local.async_engine is not None:
                await self.local.async_engine.wait_idle()
        if isinstance(self.backend, HTTPBackend):
            assert self.backend.pool_stats()["in_use"] == 0
        if engine is not None:
            assert engine.steps - steps_before < ABORT_STEP_BUDGET
            assert not engine.has_unfinished()
            assert engine.num_free_blocks() == engine.num_blocks


@pytest.fixture(params=KINDS)
async def target(
    request: pytest.FixtureRequest, anyio_backend: str, tiny_model: TinyModel
) -> AsyncIterator[Target]:
    """A running client on one of the three backends."""
    kind: str = request.param
    async with AsyncExitStack() as stack:
        if kind == "fake":
            fake = await stack.enter_async_context(FakeProvider())
            http = HTTPBackend(fake.base_url, "sk-conformance", name="fake")
            client = AsyncClient(http, model=MODEL)
            found = Target(kind, client, http, fake=fake)
        elif kind in ("fake_messages", "fake_responses"):
            fake = await stack.enter_async_context(FakeProvider())
            wire: type[HTTPBackend] = (
                AnthropicBackend if kind == "fake_messages" else ResponsesBackend
            )
            http = wire(fake.base_url, "sk-conformance", name=kind.replace("_", ""))
            client = AsyncClient(http, model=MODEL)
            found = Target(kind, client, http, fake=fake)
        elif kind in ("local_http", "local_responses", "local_messages"):
            engine = tiny_model.engine()
            served = LocalBackend.from_engine(engine, default_max_tokens=64)
            server = await stack.enter_async_context(LocalServer(served, port=0, model_name=MODEL))
            wire = {"local_responses": ResponsesBackend, "local_messages": AnthropicBackend}.get(
                kind, HTTPBackend
            )
            http = wire(server.base_url, name=kind.replace("_", ""))
            client = AsyncClient(http, model=MODEL)
            found = Target(kind, client, http, server=server, engine=engine)
        else:
            engine = tiny_model.engine()
            local = LocalBackend.from_engine(engine, default_max_tokens=64)
            client = AsyncClient(local, model=MODEL)
            found = Target(kind, client, local, local=local, engine=engine)
        await stack.enter_async_context(client)
        yield found
