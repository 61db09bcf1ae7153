"""Affinity routing over several real local engine servers: each session's turns reach the
replica its prefix prefers, where the engine reports the shared prefix as cached."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import pytest

from local_engine import LocalBackend
from local_engine.server import LocalServer
from swiftclient import AsyncClient, ChatRequest, ReplicaBackend, RetryPolicy

from ..conformance.tiny_local import TinyModel, load_tiny_model

pytestmark = pytest.mark.anyio
BLOCK = 16  # the engines' block size: cached tokens come in whole blocks


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> TinyModel:
    return load_tiny_model(tmp_path_factory.mktemp("swiftclient-cache"))


@asynccontextmanager
async def _servers(tiny: TinyModel, count: int) -> AsyncIterator[list[LocalServer]]:
    async with AsyncExitStack() as stack:
        servers = []
        for _ in range(count):
            engine = tiny.engine(num_blocks=128, block_size=BLOCK)
            backend = LocalBackend.from_engine(engine, default_max_tokens=2)
            server = LocalServer(backend, port=0, model_name="tiny-test")
            servers.append(await stack.enter_async_context(server))
        yield servers


def _session(name: str, turn: int) -> list[dict[str, str]]:
    system = f"You are agent {name}. " + "Follow the project rules with care. " * 12
    return [{"role": "system", "content": system}, {"role": "user", "content": f"step {turn}"}]


async def test_sessions_stick_to_their_replica_and_hit_its_prefix_cache(tiny: TinyModel) -> None:
    names = ["north", "south", "east", "west", "up", "down"]
    async with _servers(tiny, 3) as servers:
        backend = ReplicaBackend.from_urls([server.base_url for server in servers])

        def preferred(name: str) -> str:
            return backend.preferred(ChatRequest(model="tiny-test", messages=_session(name, 0)))

        # The replicas' ports are random, and so is where six sessions hash: all of them
        # on one replica (about 1 in 240) would leave nothing to spread; add sessions then.
        while len({preferred(name) for name in names}) < 2:
            names.append(f"extra-{len(names)}")
        async with AsyncClient(
            backend=backend, model="tiny-test", retry=RetryPolicy(max_attempts=1)
        ) as client:
            for turn in range(3):
                for name in names:
                    reply = await client.chat(_session(name, turn), temperature=0.0)
                    usage = reply.usage
                    assert usage is not None and usage.prompt_tokens_details is not None
                    cached = usage.prompt_tokens_details.cached_tokens or 0
                    if turn == 0:
                        assert cached == 0  # a cold replica: nothing cached yet
                    else:  # the whole system prompt was cached by the session's first turn
                        assert cached >= 4 * BLOCK, (name, turn, cached)
        stats = backend.stats()
        expected: dict[str, int] = {}
        for name in names:
            url = preferred(name)
            expected[url] = expected.get(url, 0) + 3
        assert {url: s.sent for url, s in stats.items() if s.sent} == expected
        assert len(expected) >= 2  # the sessions spread over the replicas
        assert all(s.in_flight == 0 and s.diverted == 0 for s in stats.values())
