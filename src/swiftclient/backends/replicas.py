"""Affinity routing across replicas of one model.

:class:`ReplicaBackend` is a :class:`~swiftclient.backends.base.Backend` over several
replicas (HTTP base URLs of vLLM, SGLang or local engine servers, or any backends) that
serve the same model. Each request goes to the replica its prompt prefix prefers, so
requests that share a cacheable prefix meet the replica that already holds it:

- **Rendezvous hashing** on the prefix fingerprint: every replica gets the score
  ``hash(replica id, fingerprint)`` and the highest wins. Every client process computes the
  same order, and adding or removing a replica moves only the prefixes that scored highest
  on it.
- **Load rule** (the SGLang router's balance thresholds): the preferred replica is passed
  over for the least loaded one when its in-flight count exceeds the least loaded one's by
  more than ``balance_abs_threshold`` AND by a factor of more than
  ``balance_rel_threshold``.
- A replica whose connection fails is skipped for ``cooldown`` seconds, so the client's
  next retry round goes to the next replica in the prefix's order.

In-flight counts are this client's own (requests it has open on each replica) and are
released on every path out of a request: a normal end, an error, a broken stream, a
cancellation.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import anyio

from .._canonical import prompt_prefix
from .._deadline import Deadline
from ..errors import APIConnectionError, APITimeoutError, ConfigurationError
from ..types import ChatCompletion, ChatCompletionChunk, ChatRequest
from .base import Backend, RequestOptions, check_backend_name, enter_backends
from .http import HTTPBackend

__all__ = ["ReplicaBackend", "ReplicaStats", "prefix_fingerprint"]


def prefix_fingerprint(request: ChatRequest) -> str:
    """The fingerprint of ``request``'s canonical cacheable prefix (tools and the leading
    static messages; the model and sampling settings excluded): the default routing key."""
    return prompt_prefix(request).fingerprint


@dataclass(frozen=True, slots=True)
class ReplicaStats:
    """One replica as the client sees it: requests open now, requests sent, and how many of
    those were diverted to it by the load rule (they preferred another replica)."""

    in_flight: int
    sent: int
    diverted: int


def _url_id(url: str) -> str:
    """A base URL as a replica id: without its query string, which may carry a key."""
    return url.split("?", 1)[0].rstrip("/")


def _replica_id(backend: Backend) -> str:
    base_url = getattr(backend, "base_url", None)
    return _url_id(base_url) if isinstance(base_url, str) and base_url else backend.name


class ReplicaBackend:
    """One model on several replicas, routed by prompt-prefix affinity.

    Args:
        replicas: the replicas, as backends (identified by their ``base_url`` without its
            query string, else their name) or as a mapping ``{replica id: backend}``. Ids
            must be unique and stable: they are hashed, so every client process that lists
            the same ids routes the same prefix to the same replica, whatever the order.
        name: this backend's name (the ``name/`` prefix of model strings).
        balance_abs_threshold: in-flight requests the preferred replica may carry beyond the
            least loaded one before a request is diverted (with the relative threshold).
        balance_rel_threshold: the factor the preferred replica's in-flight count must
            exceed over the least loaded one's before a request is diverted.
        cooldown: seconds a replica is skipped after its connection failed.
        key: the routing key of a request (default :func:`prefix_fingerprint`).

    Requests go to the replica unchanged, so every replica must serve the model names the
    caller uses.
    """

    def __init__(
        self,
        replicas: Sequence[Backend] | Mapping[str, Backend],
        *,
        name: str = "replicas",
        balance_abs_threshold: int = 64,
        balance_rel_threshold: float = 1.5,
        cooldown: float = 10.0,
        key: Callable[[ChatRequest], str] | None = None,
    ) -> None:
        self.name = check_backend_name(name)
        if isinstance(replicas, Mapping):
            pairs = [(str(replica_id), backend) for replica_id, backend in replicas.items()]
        else:
            pairs = [(_replica_id(backend), backend) for backend in replicas]
        if not pairs:
            raise ConfigurationError("ReplicaBackend needs at least one replica")
        ids = [replica_id for replica_id, _ in pairs]
        duplicates = sorted({replica_id for replica_id in ids if ids.count(replica_id) > 1})
        if duplicates:
            raise ConfigurationError(f"replica ids must be unique; repeated: {duplicates}")
        if isinstance(balance_abs_threshold, bool) or not isinstance(balance_abs_threshold, int):
            raise ConfigurationError(
                f"balance_abs_threshold must be an int, got {balance_abs_threshold!r}"
            )
        if balance_abs_threshold < 0:
            raise ConfigurationError(
                f"balance_abs_threshold must be >= 0, got {balance_abs_threshold}"
            )
        if not balance_rel_threshold >= 1.0:  # also refuses NaN
            raise ConfigurationError(
                f"balance_rel_threshold must be >= 1.0, got {balance_rel_threshold!r}"
            )
        if not cooldown >= 0.0:
            raise ConfigurationError(f"cooldown must be >= 0, got {cooldown!r}")
        self.ids: tuple[str, ...] = tuple(ids)
        """The replica ids, in the order given."""
        self.replicas: tuple[Backend, ...] = tuple(backend for _, backend in pairs)
        """The replica backends, in the order given."""
        self.balance_abs_threshold = balance_abs_threshold
        self.balance_rel_threshold = float(balance_rel_threshold)
        self.cooldown = float(cooldown)
        self._custom_key = key
        self._salts = tuple(replica_id.encode() + b"\x00" for replica_id in ids)
        count = len(ids)
        self._in_flight = [0] * count
        self._sent = [0] * count
        self._diverted = [0] * count
        self._down_until = [float("-inf")] * count
        self._stack: AsyncExitStack | None = None

    @classmethod
    def from_urls(
        cls,
        base_urls: Sequence[str],
        api_key: str | None = None,
        *,
        name: str = "replicas",
        balance_abs_threshold: int = 64,
        balance_rel_threshold: float = 1.5,
        cooldown: float = 10.0,
        key: Callable[[ChatRequest], str] | None = None,
        **http_options: Any,
    ) -> ReplicaBackend:
        """Replicas behind OpenAI-compatible base URLs (``http://host:8000/v1``), one
        :class:`HTTPBackend` each, all with ``api_key`` and ``http_options``."""
        if isinstance(base_urls, str):
            raise ConfigurationError("base_urls must be a list of URLs, not one string")
        replicas = {
            _url_id(url): HTTPBackend(url, api_key, name=f"{name}-{index}", **http_options)
            for index, url in enumerate(base_urls)
        }
        if len(replicas) != len(base_urls):
            raise ConfigurationError("base_urls must be unique")
        return cls(
            replicas,
            name=name,
            balance_abs_threshold=balance_abs_threshold,
            balance_rel_threshold=balance_rel_threshold,
            cooldown=cooldown,
            key=key,
        )

    def __repr__(self) -> str:
        return f"ReplicaBackend(name={self.name!r}, replicas={len(self.ids)})"

    # ------------------------------------------------------------------ routing

    def order(self, key: str) -> list[int]:
        """Replica indexes in the rendezvous order of ``key`` (the preferred one first)."""
        data = key.encode()

        def score(index: int) -> bytes:
            return hashlib.blake2b(self._salts[index] + data, digest_size=8).digest()

        return sorted(range(len(self._salts)), key=score, reverse=True)

    def preferred(self, request: ChatRequest) -> str:
        """The id of the replica ``request``'s prefix prefers (load and cooldowns aside)."""
        return self.ids[self.order(self._routing_key(request, None))[0]]

    def _routing_key(self, request: ChatRequest, options: RequestOptions | None) -> str:
        if self._custom_key is not None:
            return self._custom_key(request)
        encoding = options.encoding if options is not None else None
        if encoding is not None:  # the call's prefix, computed once for all its attempts
            return encoding.prefix(request).fingerprint
        return prefix_fingerprint(request)

    def _choose(self, request: ChatRequest, options: RequestOptions | None = None) -> int:
        order = self.order(self._routing_key(request, options))
        now = time.monotonic()
        up = [index for index in order if self._down_until[index] <= now] or order
        preferred = up[0]
        loads = self._in_flight
        least = min(up, key=lambda index: loads[index])  # ties keep the prefix's order
        load, low = loads[preferred], loads[least]
        if load - low > self.balance_abs_threshold and load > self.balance_rel_threshold * low:
            self._diverted[least] += 1
            return least
        return preferred

    def _enter(self, request: ChatRequest, options: RequestOptions | None) -> int:
        index = self._choose(request, options)
        self._in_flight[index] += 1
        self._sent[index] += 1
        return index

    def _failed(self, index: int, exc: BaseException) -> None:
        if isinstance(exc, APIConnectionError) and not isinstance(exc, APITimeoutError):
            self._down_until[index] = time.monotonic() + self.cooldown

    def stats(self) -> dict[str, ReplicaStats]:
        """Per replica id: requests open now, requests sent, requests diverted to it."""
        return {
            replica_id: ReplicaStats(self._in_flight[i], self._sent[i], self._diverted[i])
            for i, replica_id in enumerate(self.ids)
        }

    # ------------------------------------------------------------------ Backend

    @asynccontextmanager
    async def _stream(
        self, request: ChatRequest, deadline: Deadline, options: RequestOptions | None
    ) -> AsyncIterator[AsyncIterator[ChatCompletionChunk]]:
        index = self._enter(request, options)
        try:
            async with self.replicas[index].stream(request, deadline, options) as chunks:
                yield chunks
        except BaseException as exc:
            self._failed(index, exc)
            raise
        finally:
            self._in_flight[index] -= 1

    def stream(
        self, request: ChatRequest, deadline: Deadline, options: RequestOptions | None = None
    ) -> AbstractAsyncContextManager[AsyncIterator[ChatCompletionChunk]]:
        """Open a streamed completion on the replica the request's prefix prefers (the
        replica's own chunk iterator is handed out unchanged)."""
        return self._stream(request, deadline, options)

    async def complete(
        self, request: ChatRequest, deadline: Deadline, options: RequestOptions | None = None
    ) -> ChatCompletion:
        """Run a non-streamed completion on the replica the request's prefix prefers."""
        index = self._enter(request, options)
        try:
            return await self.replicas[index].complete(request, deadline, options)
        except BaseException as exc:
            self._failed(index, exc)
            raise
        finally:
            self._in_flight[index] -= 1

    async def warmup(self, connections: int = 1) -> None:
        """Warm every replica that can be warmed (pooled connections, loaded models)."""
        for replica in self.replicas:
            warm = getattr(replica, "warmup", None)
            if warm is not None:
                await warm(connections)

    async def __aenter__(self) -> ReplicaBackend:
        """Enter every replica that is an async context manager (local engines)."""
        self._stack = await enter_backends(self.replicas)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Exit the replicas entered by :meth:`__aenter__`, last first."""
        stack, self._stack = self._stack, None
        if stack is not None:
            await stack.__aexit__(exc_type, exc, tb)

    async def aclose(self) -> None:
        """Close every replica (all of them, even when one fails; the first error is
        raised afterwards)."""
        first: BaseException | None = None
        with anyio.CancelScope(shield=True):
            for replica in self.replicas:
                try:
                    await replica.aclose()
                except Exception as exc:  # close the others first
                    first = first or exc
        if first is not None:
            raise first
