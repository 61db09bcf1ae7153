"""A state store that hands every operation to another one, for tests that watch a few."""

from __future__ import annotations

from collections.abc import Sequence

from swiftclient.admission import Admit, BucketCost, StateStore


class Delegating:
    """Forwards every :class:`StateStore` operation to ``inner``; a test subclasses it and
    overrides the operations it counts (no ``hedge``: a subclass adds it when it needs it)."""

    shared = True

    def __init__(self, inner: StateStore) -> None:
        self.inner = inner

    async def take(self, key: str, costs: Sequence[BucketCost], **kwargs: object) -> Admit:
        return await self.inner.take(key, costs, **kwargs)  # type: ignore[arg-type]

    async def leave(self, key: str, queue: str) -> None:
        await self.inner.leave(key, queue)

    async def release(self, key: str, holder: str) -> None:
        await self.inner.release(key, holder)

    async def adjust(self, key: str, cost: BucketCost) -> None:
        await self.inner.adjust(key, cost)

    async def set_level(self, key: str, cost: BucketCost, reset: float | None = None) -> None:
        await self.inner.set_level(key, cost, reset)

    async def update(
        self,
        key: str,
        levels: Sequence[tuple[BucketCost, float | None]] = (),
        corrections: Sequence[BucketCost] = (),
    ) -> None:
        await self.inner.update(key, levels, corrections)

    async def block(self, key: str, seconds: float) -> None:
        await self.inner.block(key, seconds)

    async def blocked_for(self, key: str) -> float:
        return await self.inner.blocked_for(key)

    async def leases(self, key: str) -> int:
        return await self.inner.leases(key)

    async def aclose(self) -> None:
        await self.inner.aclose()
