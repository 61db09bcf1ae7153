"""ReplicaBackend: rendezvous affinity on the prefix fingerprint, the load rule, cooldowns,
and in-flight counts released on every path out of a request."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.abc
import pytest

from swiftclient import (
    APIConnectionError,
    AsyncClient,
    ChatCompletion,
    ChatCompletionChunk,
    ChatRequest,
    ConfigurationError,
    FirstTokenTimeout,
    InternalServerError,
    ReplicaBackend,
    RetryPolicy,
    Timeout,
)
from swiftclient.backends.replicas import prefix_fingerprint
from swiftclient.extend import Deadline, RequestOptions
from swiftclient.testing import FakeProvider

pytestmark = pytest.mark.anyio
LIMIT = 30.0  # seconds: a bound on waiting for an event, never a speed assertion
NO_RETRY = RetryPolicy(max_attempts=1)


def _chunk(text: str | None = None, finish: str | None = None) -> ChatCompletionChunk:
    delta: dict[str, Any] = {} if text is None else {"content": text}
    return ChatCompletionChunk.model_validate(
        {"id": "c", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    )


class Replica:
    """A scripted backend: records requests; can hold streams open, fail on open, or break
    after its first chunk."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.base_url = f"http://{name}.test/v1"
        self.requests: list[ChatRequest] = []
        self.opened = 0
        self.hold: anyio.Event | None = None  # streams wait on it after their first chunk
        self.fail_open: BaseException | None = None
        self.break_after_first = False
        self.silent = False  # streams never send a chunk
        self.opening = anyio.Event()  # set when a stream starts opening
        self.open_gate: anyio.Event | None = None  # opening waits on it
        self.closed = False

    @asynccontextmanager
    async def _stream(self) -> AsyncIterator[AsyncIterator[ChatCompletionChunk]]:
        self.opening.set()
        if self.open_gate is not None:
            await self.open_gate.wait()
        if self.fail_open is not None:
            raise self.fail_open
        self.opened += 1
        chunks = self._chunks()
        try:
            yield chunks
        finally:
            with anyio.CancelScope(shield=True):
                await chunks.aclose()

    async def _chunks(self) -> AsyncIterator[ChatCompletionChunk]:
        if self.silent:
            await anyio.sleep_forever()
        yield _chunk(self.base_url)
        if self.break_after_first:
            raise APIConnectionError("the connection broke mid-stream")
        if self.hold is not None:
            await self.hold.wait()
        yield _chunk(finish="stop")

    def stream(
        self, request: ChatRequest, deadline: Deadline, options: RequestOptions | None = None
    ) -> Any:
        self.requests.append(request)
        return self._stream()

    async def complete(
        self, request: ChatRequest, deadline: Deadline, options: RequestOptions | None = None
    ) -> ChatCompletion:
        self.requests.append(request)
        if self.fail_open is not None:
            raise self.fail_open
        return ChatCompletion.model_validate(
            {
                "id": "c",
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": self.base_url}}
                ],
            }
        )

    async def aclose(self) -> None:
        self.closed = True


def _replicas(count: int = 3) -> list[Replica]:
    return [Replica(f"r{i}") for i in range(count)]


def _system(text: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": text}, {"role": "user", "content": "question"}]


def _request(system: str, user: str = "question") -> ChatRequest:
    return ChatRequest(
        model="m",
        messages=[{"role": "system", "content": system}, {"role": "user", "content": user}],
    )


def _in_flight(backend: ReplicaBackend) -> list[int]:
    return [stats.in_flight for stats in backend.stats().values()]


# ---------------------------------------------------------------------- rendezvous


def test_order_is_the_same_whatever_the_list_order_and_instance() -> None:
    a = ReplicaBackend(_replicas())
    b = ReplicaBackend(list(reversed(_replicas())))
    for n in range(50):
        key = f"prefix-{n}"
        assert a.ids[a.order(key)[0]] == b.ids[b.order(key)[0]]
        assert [a.ids[i] for i in a.order(key)] == [b.ids[i] for i in b.order(key)]


def test_keys_spread_over_replicas_and_removing_one_moves_only_its_keys() -> None:
    full = ReplicaBackend(_replicas(3))
    keys = [f"prefix-{n}" for n in range(300)]
    chosen = {key: full.ids[full.order(key)[0]] for key in keys}
    counts = {replica_id: list(chosen.values()).count(replica_id) for replica_id in full.ids}
    assert all(count > 60 for count in counts.values()), counts  # about 100 each
    smaller = ReplicaBackend(_replicas(3)[:2])
    for key in keys:
        after = smaller.ids[smaller.order(key)[0]]
        if chosen[key] in smaller.ids:
            assert after == chosen[key]  # only the removed replica's keys move


async def test_equal_prefixes_meet_on_one_replica_and_others_spread() -> None:
    replicas = _replicas(3)
    backend = ReplicaBackend(replicas)
    async with AsyncClient(backend=backend, model="m", retry=NO_RETRY) as client:
        for system in ("alpha", "beta", "gamma", "delta", "epsilon", "zeta"):
            for turn in range(3):  # the user turn differs; the static prefix does not
                reply = await client.chat(
                    _system(system)[:1] + [{"role": "user", "content": f"turn {turn}"}]
                )
                assert reply.text == backend.preferred(_request(system))
        used = {replica.name for replica in replicas if replica.requests}
        assert len(used) >= 2
        for replica in replicas:
            systems = {request.messages[0].content for request in replica.requests}
            for system in systems:  # every request of a prefix went to the same replica
                count = sum(1 for r in replica.requests if r.messages[0].content == system)
                assert count == 3
    assert all(replica.closed for replica in replicas)


def test_the_default_key_is_the_canonical_prefix_fingerprint() -> None:
    backend = ReplicaBackend(_replicas())
    one = _request("same system", "first question")
    two = _request("same system", "another question")
    assert prefix_fingerprint(one) == prefix_fingerprint(two)
    assert backend.preferred(one) == backend.preferred(two)


# ---------------------------------------------------------------------- the load rule


async def _hold_stream(
    client: AsyncClient, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
) -> None:
    async with client.stream(_system("hot")) as stream:
        task_status.started()
        async for _ in stream:
            pass


async def test_preferred_replica_is_left_when_over_both_thresholds() -> None:
    replicas = _replicas(2)
    for replica in replicas:
        replica.hold = anyio.Event()
    backend = ReplicaBackend(replicas, balance_abs_threshold=2, balance_rel_threshold=1.5)
    preferred = backend.preferred(_request("hot"))
    other = next(i for i in backend.ids if i != preferred)
    async with AsyncClient(backend=backend, model="m", retry=NO_RETRY) as client:
        async with anyio.create_task_group() as tg:
            with anyio.fail_after(LIMIT):
                for _ in range(3):  # in flight 0-0, 1-0, 2-0: not over 2
                    await tg.start(_hold_stream, client)
                assert backend.stats()[preferred].in_flight == 3
                await tg.start(_hold_stream, client)  # 3 - 0 > 2 and 3 > 1.5 * 0
            stats = backend.stats()
            assert (stats[preferred].in_flight, stats[other].in_flight) == (3, 1)
            assert stats[other].diverted == 1
            for replica in replicas:
                assert replica.hold is not None
                replica.hold.set()
    assert _in_flight(backend) == [0, 0]


def test_relative_threshold_keeps_the_preferred_replica() -> None:
    backend = ReplicaBackend(_replicas(2), balance_abs_threshold=0, balance_rel_threshold=2.0)
    request = _request("hot")
    preferred = backend.ids.index(backend.preferred(request))
    least = 1 - preferred
    backend._in_flight[preferred], backend._in_flight[least] = 2, 1
    assert backend._choose(request) == preferred  # 2 - 1 > 0 but 2 is not > 2 * 1
    backend._in_flight[preferred] = 3
    assert backend._choose(request) == least  # 3 - 1 > 0 and 3 > 2 * 1


# ---------------------------------------------------------------------- release paths


async def test_in_flight_released_after_normal_end_break_and_complete() -> None:
    backend = ReplicaBackend(_replicas(2))
    async with AsyncClient(backend=backend, model="m", retry=NO_RETRY) as client:
        await client.chat(_system("a"))
        assert _in_flight(backend) == [0, 0]
        async with client.stream(_system("a")) as stream:
            assert _in_flight(backend) != [0, 0]
            async for _ in stream:
                break  # leave early
        assert _in_flight(backend) == [0, 0]
        await client.chat(_system("a"), stream=False)
        assert _in_flight(backend) == [0, 0]
        assert sum(stats.sent for stats in backend.stats().values()) == 3


async def test_in_flight_released_when_open_fails_or_stream_breaks() -> None:
    replicas = _replicas(2)
    backend = ReplicaBackend(replicas)
    target = replicas[backend.ids.index(backend.preferred(_request("a")))]
    async with AsyncClient(backend=backend, model="m", retry=NO_RETRY) as client:
        target.fail_open = InternalServerError("boom", status_code=500)
        with pytest.raises(InternalServerError):
            await client.chat(_system("a"))
        assert _in_flight(backend) == [0, 0]
        with pytest.raises(InternalServerError):
            await client.chat(_system("a"), stream=False)
        assert _in_flight(backend) == [0, 0]
        target.fail_open = None
        target.break_after_first = True
        with pytest.raises(APIConnectionError):
            await client.chat(_system("a"))
        assert _in_flight(backend) == [0, 0]


async def test_in_flight_released_on_cancellation_and_timeout() -> None:
    replicas = _replicas(2)
    for replica in replicas:
        replica.hold = anyio.Event()  # streams never end on their own
    backend = ReplicaBackend(replicas)
    async with AsyncClient(backend=backend, model="m", retry=NO_RETRY) as client:
        opened = anyio.Event()

        async def reader() -> None:
            async with client.stream(_system("a")) as stream:
                opened.set()
                async for _ in stream:
                    pass

        with anyio.fail_after(LIMIT):
            async with anyio.create_task_group() as tg:
                tg.start_soon(reader)
                await opened.wait()
                assert sum(_in_flight(backend)) == 1
                tg.cancel_scope.cancel()
        assert _in_flight(backend) == [0, 0]
        for replica in replicas:  # cancelled while the replica is still opening
            replica.open_gate = anyio.Event()
            replica.opening = anyio.Event()
        with anyio.fail_after(LIMIT):
            async with anyio.create_task_group() as tg:
                tg.start_soon(reader)
                await replicas[backend.ids.index(backend.preferred(_request("a")))].opening.wait()
                assert sum(_in_flight(backend)) == 1
                tg.cancel_scope.cancel()
        assert _in_flight(backend) == [0, 0]
        for replica in replicas:
            replica.open_gate = None
            replica.silent = True
        with pytest.raises(FirstTokenTimeout):
            await client.chat(_system("b"), timeout=Timeout(first_token=0.05))
        assert _in_flight(backend) == [0, 0]


# ---------------------------------------------------------------------- failures


async def test_a_replica_whose_connection_failed_is_skipped_for_the_cooldown() -> None:
    replicas = _replicas(3)
    backend = ReplicaBackend(replicas, cooldown=3600.0)
    request = _request("a")
    order = backend.order(prefix_fingerprint(request))
    first, second = replicas[order[0]], replicas[order[1]]
    first.fail_open = APIConnectionError("refused")
    async with AsyncClient(
        backend=backend, model="m", retry=RetryPolicy(max_attempts=2, initial_backoff=0.0)
    ) as client:
        reply = await client.chat(_system("a"))
    assert reply.text == second.base_url  # the retry round went to the next replica
    assert len(first.requests) == 1 and len(second.requests) == 1


async def test_a_timeout_does_not_send_a_replica_to_cooldown() -> None:
    replicas = _replicas(2)
    backend = ReplicaBackend(replicas, cooldown=3600.0)
    request = _request("a")
    preferred = backend.ids.index(backend.preferred(request))
    backend._failed(preferred, FirstTokenTimeout("slow"))
    assert backend._choose(request) == preferred
    backend._failed(preferred, APIConnectionError("refused"))
    assert backend._choose(request) != preferred


# ---------------------------------------------------------------------- configuration


def test_bad_configuration_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="at least one"):
        ReplicaBackend([])
    with pytest.raises(ConfigurationError, match="unique"):
        ReplicaBackend([Replica("a"), Replica("a")])
    with pytest.raises(ConfigurationError, match="balance_abs_threshold"):
        ReplicaBackend(_replicas(), balance_abs_threshold=-1)
    with pytest.raises(ConfigurationError, match="balance_rel_threshold"):
        ReplicaBackend(_replicas(), balance_rel_threshold=0.5)
    with pytest.raises(ConfigurationError, match="balance_rel_threshold"):
        ReplicaBackend(_replicas(), balance_rel_threshold=float("nan"))
    with pytest.raises(ConfigurationError, match="cooldown"):
        ReplicaBackend(_replicas(), cooldown=-1.0)
    with pytest.raises(ConfigurationError, match="list of URLs"):
        ReplicaBackend.from_urls("http://a/v1")
    with pytest.raises(ConfigurationError, match="unique"):
        ReplicaBackend.from_urls(["http://a/v1", "http://a/v1/"])
    with pytest.raises(ConfigurationError):
        ReplicaBackend(_replicas(), name="bad/name")


async def test_from_urls_routes_each_prefix_to_one_server() -> None:
    async with FakeProvider() as one, FakeProvider() as two:
        backend = ReplicaBackend.from_urls([one.base_url, two.base_url], "sk-secret-key-123")
        assert "sk-secret" not in repr(backend)
        with pytest.raises(ConfigurationError, match="query string") as refused:
            ReplicaBackend.from_urls([f"{one.base_url}?api-key=sk-in-the-query-1234"])
        assert "sk-in-the-query" not in str(refused.value)
        by_url = {one.base_url: one, two.base_url: two}
        async with AsyncClient(backend=backend, model="fake-model", retry=NO_RETRY) as client:
            for system in ("alpha", "beta", "gamma", "delta"):
                for turn in range(2):
                    await client.chat(
                        [
                            {"role": "system", "content": system},
                            {"role": "user", "content": f"turn {turn}"},
                        ]
                    )
        for system in ("alpha", "beta", "gamma", "delta"):
            fake = by_url[backend.preferred(_request(system))]
            got = [r for r in fake.requests if r.body["messages"][0]["content"] == system]
            assert len(got) == 2
        assert len(one.requests) + len(two.requests) == 8
        assert _in_flight(backend) == [0, 0]


async def test_a_custom_key_decides_the_route() -> None:
    replicas = _replicas(3)
    backend = ReplicaBackend(replicas, key=lambda request: "one tenant")
    expected = backend.ids[backend.order("one tenant")[0]]
    async with AsyncClient(backend=backend, model="m", retry=NO_RETRY) as client:
        for system in ("alpha", "beta", "gamma", "delta"):
            assert (await client.chat(_system(system))).text == expected
    assert backend.stats()[expected].sent == 4
