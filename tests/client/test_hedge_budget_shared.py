"""The hedge budget across processes: clients whose admission shares one RedisStore (each
with its own store connection, as separate processes would have) spend ONE budget, the
deposits of one process's calls fund another's hedges, a store that is down falls back to
the per-process budget without failing a call, and on a MemoryStore the shared budget is
the per-process one. Every test runs on asyncio and trio.

The hedges are counted on the backends: target ``a`` answers only after the budget refused
the call's hedge (the store wrapper says when), target ``b`` at once; so a call whose hedge
was granted is answered by ``b``, and ``b``'s opens count the hedges, with no timing."""

from __future__ import annotations

import logging
import random
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager

import anyio
import pytest

from swiftclient import (
    AsyncClient,
    ChatCompletion,
    ChatCompletionChunk,
    ChatRequest,
    ConfigurationError,
    Hedge,
)
from swiftclient.admission import (
    Admission,
    Limits,
    MemoryStore,
    RedisStore,
    SharedHedgeBudget,
    StateStore,
)
from swiftclient.extend import Deadline, HedgeBudget, PolicyHub, RequestOptions

from .redisserver import redis_url
from .storewrap import Delegating

__all__ = ["redis_url"]  # the fixture, re-exported for pytest
pytestmark = pytest.mark.anyio

LIMIT = 30.0
"""Seconds a test may take before it fails (a bound on a hang, never a speed assertion)."""


def _chunk(text: str, model: str) -> ChatCompletionChunk:
    return ChatCompletionChunk.model_validate(
        {
            "id": "c",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": model,
            "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}],
        }
    )


class Refusals:
    """Counts the hedges a budget refused, and wakes whoever waits for a count."""

    def __init__(self) -> None:
        self.count = 0
        self._changed = anyio.Event()

    def add(self) -> None:
        self.count += 1
        self._changed.set()
        self._changed = anyio.Event()

    async def until(self, n: int) -> None:
        while self.count < n:
            await self._changed.wait()


class Counted:
    """A per-process HedgeBudget that counts its refusals (for the contrast)."""

    def __init__(self, budget: HedgeBudget) -> None:
        self.budget = budget
        self.refusals = Refusals()

    def on_call(self, now: float) -> None:
        self.budget.on_call(now)

    def try_spend(self, now: float) -> bool:
        spent = self.budget.try_spend(now)
        if not spent:
            self.refusals.add()
        return spent


class Watched(Delegating):
    """A store that counts the hedges its budget refused (delegates everything else)."""

    def __init__(self, inner: StateStore) -> None:
        super().__init__(inner)
        self.shared = inner.shared
        self.refusals = Refusals()

    async def hedge(
        self, key: str, deposit: float, *, spend: bool, floor_per_second: float, burst: float
    ) -> tuple[bool, float]:
        result = await self.inner.hedge(
            key, deposit, spend=spend, floor_per_second=floor_per_second, burst=burst
        )
        if spend and not result[0]:
            self.refusals.add()
        return result


class Backend:
    """Answers at once, or (``refusals``) only once the budget refused one more hedge than
    this backend has answered calls for; counts the streams opened."""

    def __init__(self, name: str, refusals: Refusals | None = None) -> None:
        self.name = name
        self.refusals = refusals
        self.open = 0
        self.answered = 0 if refusals is None else refusals.count

    @asynccontextmanager
    async def stream(
        self, request: ChatRequest, deadline: Deadline, options: RequestOptions | None = None
    ) -> AsyncIterator[AsyncIterator[ChatCompletionChunk]]:
        self.open += 1
        yield self._chunks(request.model)

    async def _chunks(self, model: str) -> AsyncIterator[ChatCompletionChunk]:
        if self.refusals is not None:
            await self.refusals.until(self.answered + 1)
        self.answered += 1
        yield _chunk(f"{self.name} one", model)

    async def complete(
        self, request: ChatRequest, deadline: Deadline, options: RequestOptions | None = None
    ) -> ChatCompletion:
        raise NotImplementedError

    async def aclose(self) -> None:
        pass


def _budget(burst: float, ratio: float = 0.0, delay: float = 0.0) -> Hedge:
    return Hedge(delay=delay, budget=ratio, budget_floor=0.0, budget_burst=burst)


class Process:
    """One process of the fleet: a client on [a, b] whose admission is on ``store``
    (``policies``: a hub of its own, whose budget counts its refusals)."""

    def __init__(
        self, store: Watched | MemoryStore, hedge: Hedge, *, policies: PolicyHub | None = None
    ) -> None:
        refusals = store.refusals if isinstance(store, Watched) else None
        if policies is not None and isinstance(policies.budget, Counted):
            refusals = policies.budget.refusals
        self.a = Backend("a", refusals)
        self.b = Backend("b")
        self.client = AsyncClient(
            backends={"a": self.a, "b": self.b},  # type: ignore[dict-item]
            hedge=hedge,
            limits=Admission(Limits(), store=store),  # type: ignore[arg-type]
            policies=policies,
            telemetry=None,
        )

    @property
    def hedges(self) -> int:
        return self.b.open

    async def call(self) -> str:
        return (await self.client.chat("hi", model=["a/m", "b/m"])).text


@asynccontextmanager
async def _fleet(url: str, hedges: Sequence[Hedge]) -> AsyncIterator[list[Process]]:
    """One process per hedge setting, each with its own store connection to ``url`` (a
    RedisStore), all with one fresh key prefix."""
    prefix = f"hedge-{uuid.uuid4().hex}:"
    async with AsyncExitStack() as stack:
        fleet = []
        for hedge in hedges:
            store = await stack.enter_async_context(RedisStore(url, prefix=prefix))
            process = Process(Watched(store), hedge)
            await stack.enter_async_context(process.client)
            fleet.append(process)
        yield fleet


async def test_clients_sharing_a_redis_store_spend_one_budget(redis_url: str) -> None:
    hedge = _budget(burst=2.0)  # no deposits, no floor: 2 hedges, ever
    with anyio.fail_after(LIMIT):
        async with _fleet(redis_url, [hedge, hedge]) as (one, two):
            texts = []
            for _ in range(3):  # the two processes take turns
                texts += [await one.call(), await two.call()]
    assert one.hedges + two.hedges == 2  # fleet-wide, whoever asked
    assert texts == ["b one", "b one", "a one", "a one", "a one", "a one"]


async def test_clients_on_per_process_stores_each_have_a_budget() -> None:
    # The contrast: the same fleet on MemoryStores spends one budget per process.
    hedge = _budget(burst=2.0)

    def process() -> Process:
        store = MemoryStore()
        budget = Counted(HedgeBudget(ratio=0.0, floor_per_second=0.0, burst=2.0))
        return Process(store, hedge, policies=PolicyHub.standard(hedge, budget=budget))

    with anyio.fail_after(LIMIT):
        one, two = process(), process()
        assert one.client.admission is not None
        assert one.client.admission.hedge_budget() is None  # nothing to share
        async with one.client, two.client:
            texts = []
            for _ in range(3):
                texts += [await one.call(), await two.call()]
    assert (one.hedges, two.hedges) == (2, 2)
    assert texts == ["b one", "b one", "b one", "b one", "a one", "a one"]


async def test_one_process_deposits_fund_another_process_hedges(redis_url: str) -> None:
    spends = _budget(burst=1.0, ratio=0.25)
    quiet = _budget(burst=1.0, ratio=0.25, delay=3600.0)  # never hedges: its a answers first
    with anyio.fail_after(LIMIT):
        async with _fleet(redis_url, [spends, quiet]) as (spender, depositor):
            depositor.a.refusals = None  # its first target answers at once
            # The spender's first call spends the full bucket's token; its second is
            # refused (its own 0.25 x 2 make half a token).
            assert [await spender.call(), await spender.call()] == ["b one", "a one"]
            # The depositor's 4 calls deposit one token, delivered at the settle of the 4th
            # (a token's worth is due then), before that call returns.
            budget = depositor.client.policies.budget
            assert isinstance(budget, SharedHedgeBudget)
            for _ in range(4):
                assert await depositor.call() == "a one"
            assert depositor.hedges == 0 and budget.pending == 0.0
            # The spender's 3rd call finds 0.5 + 1.0 (+ its own 0.25): a hedge. Alone, its
            # budget would hold 0.75: refused.
            assert await spender.call() == "b one"
    assert spender.hedges == 2


async def test_a_store_that_is_down_falls_back_to_the_per_process_budget(
    tmp_path: object, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="swiftclient.admission")
    nowhere = f"unix://{tmp_path}/no-such.sock"
    with anyio.fail_after(LIMIT):
        async with RedisStore(nowhere, retry_after_down=0.0) as down:
            process = Process(Watched(down), _budget(burst=2.0))
            async with process.client:
                texts = [await process.call() for _ in range(3)]
    assert process.hedges == 2  # the per-process budget: burst 2
    assert texts == ["b one", "b one", "a one"]  # and every call succeeded
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "per-process" in warnings[0].getMessage()


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest, redis_url: str) -> AsyncIterator[StateStore]:
    if request.param == "memory":
        yield MemoryStore()
        return
    async with RedisStore(redis_url, prefix=f"hedge-{uuid.uuid4().hex}:") as shared:
        yield shared


async def test_the_store_bucket_starts_full_caps_deposits_and_spends(store: StateStore) -> None:
    def op(deposit: float, spend: bool) -> object:
        return store.hedge("h", deposit, spend=spend, floor_per_second=0.0, burst=2.0)

    assert await op(0.0, True) == (True, 1.0)
    assert await op(5.0, False) == (False, 2.0)  # never above the burst
    assert await op(0.0, True) == (True, 1.0)
    assert await op(0.0, True) == (True, 0.0)
    assert await op(0.5, True) == (False, 0.5)  # short: nothing taken
    assert await op(0.5, True) == (True, 0.0)  # the deposit pays for the spend it rides with


async def test_on_a_memory_store_the_shared_budget_is_the_per_process_one() -> None:
    now = [0.0]
    store = MemoryStore(clock=lambda: now[0])
    shared = SharedHedgeBudget(store, ratio=0.25, floor_per_second=0.5, burst=3.0)
    alone = HedgeBudget(ratio=0.25, floor_per_second=0.5, burst=3.0)
    rng = random.Random(25)
    for _ in range(2000):
        now[0] += rng.choice([0.0, 0.0, 0.125, 0.5, 4.0])
        if rng.random() < 0.6:
            shared.on_call(now[0])
            alone.on_call(now[0])
        else:
            assert await shared.spend(now[0]) == alone.try_spend(now[0])
            assert shared.tokens == alone.tokens(now[0])


async def test_a_hub_asks_a_budget_on_a_store_asynchronously_only() -> None:
    budget = SharedHedgeBudget(MemoryStore(), ratio=0.0, floor_per_second=0.0, burst=1.0)
    hub = PolicyHub(budget=budget)
    with pytest.raises(ConfigurationError, match="may_hedge_async"):
        hub.may_hedge()  # a synchronous answer would have to guess
    hub.on_call()
    assert await hub.may_hedge_async() is True
    assert await hub.may_hedge_async() is False
    assert budget.pending == 0.0 and budget.tokens == 0.0
    alone = PolicyHub(budget=HedgeBudget(ratio=0.0, floor_per_second=0.0, burst=1.0))
    assert await alone.may_hedge_async() is True and alone.may_hedge() is False
