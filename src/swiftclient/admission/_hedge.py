"""The hedge budget of a fleet: one token bucket on a shared :class:`StateStore`.

:class:`~swiftclient._budget.HedgeBudget` caps one process's hedges at ``ratio`` x calls +
``floor_per_second`` x seconds + ``burst``. :class:`SharedHedgeBudget` keeps that bucket on
the store instead (:meth:`StateStore.hedge`), so N processes that point at one
:class:`~swiftclient.admission.RedisStore` stay within ONE such budget, counted over the
fleet's calls, on the server's clock.

A call must not pay a round trip for its deposit, so deposits are counted here and
delivered later: with the next spend (in the same script run), and, once this process holds
one token's worth or more (``due``), at the next store operation admission makes anyway (the
settle at the end of an attempt). Deposits only ever arrive late, never early, so the
fleet's hedges stay within ratio x (fleet calls) + floor x seconds + burst; what the lag
costs is hedges not taken: each process holds back less than one token plus the deposits
of its calls in flight (and loses what it holds back when it exits).
"""

from __future__ import annotations

from .._budget import HedgeBudget
from ._store import StateStore

__all__ = ["SharedHedgeBudget"]


class SharedHedgeBudget:
    """A hedge budget on a :class:`StateStore` (see the module): the processes sharing the
    store spend one budget. On a :class:`~swiftclient.admission.MemoryStore` it behaves as
    :class:`~swiftclient._budget.HedgeBudget` does; on a
    :class:`~swiftclient.admission.RedisStore` that cannot be reached, the store's
    per-process fallback holds the budget (and the deposits) until it answers again.

    The client builds one for itself when its admission has a shared store
    (:meth:`~swiftclient.admission.Admission.hedge_budget`).

    Args:
        store: where the bucket lives.
        ratio: tokens each call deposits.
        floor_per_second: tokens deposited per second whatever the traffic.
        burst: the most tokens the bucket holds.
        key: the bucket's key on the store (one budget per key).

    Raises:
        ConfigurationError: a number is out of range (as for ``HedgeBudget``).
    """

    def __init__(
        self,
        store: StateStore,
        *,
        ratio: float = 0.05,
        floor_per_second: float = 1.0,
        burst: float = 10.0,
        key: str = "hedge",
    ) -> None:
        HedgeBudget(ratio, floor_per_second, burst)  # the same checks
        self.ratio = ratio
        self.floor_per_second = floor_per_second
        self.burst = burst
        self.key = key
        self._store = store
        self._pending = 0.0
        self._tokens = burst

    def __repr__(self) -> str:
        return (
            f"SharedHedgeBudget(ratio={self.ratio}, floor_per_second={self.floor_per_second}, "
            f"burst={self.burst}, key={self.key!r}, pending={self._pending:.2f})"
        )

    @property
    def pending(self) -> float:
        """Tokens this process's calls deposited that the store has not received yet."""
        return self._pending

    @property
    def due(self) -> bool:
        """Whether the undelivered deposits reach one token (:meth:`flush` them)."""
        return self._pending >= 1.0

    @property
    def tokens(self) -> float:
        """The tokens the store said were left at this process's last operation."""
        return self._tokens

    def on_call(self, now: float) -> None:
        """Deposit ``ratio`` tokens for one call (counted here; delivered later)."""
        self._pending += self.ratio

    async def spend(self, now: float) -> bool:
        """Deliver the undelivered deposits and take one token for a hedge, in one store
        operation; ``False`` (nothing taken) when the fleet's bucket is short. ``now`` is
        not used: the store keeps its own clock."""
        return await self._send(spend=True)

    async def flush(self) -> None:
        """Deliver the undelivered deposits (nothing when there are none)."""
        if self._pending > 0:
            await self._send(spend=False)

    async def _send(self, *, spend: bool) -> bool:
        deposit, self._pending = self._pending, 0.0
        taken, self._tokens = await self._store.hedge(
            self.key,
            deposit,
            spend=spend,
            floor_per_second=self.floor_per_second,
            burst=self.burst,
        )
        return taken
