"""Prefix-grouped batches: ``client.batch(...)`` and ``client.batch_iter(...)``.

Requests that share a long prompt prefix are sent so that the server computes the prefix
once: a radix tree over the requests' canonical bytes finds the groups; one leader per
group is sent first, and its followers are released when the leader's first token arrives
(its prompt has then been prefilled and its prefix is in the server's cache). Groups nest (a
shared system prompt, then a shared document under it) and are visited depth-first, and a
ready request of an earlier group goes before a later group's leader, so a shared prefix is
still hot when its followers reach the server.

Each request runs as its own ``client.stream(...)`` call, with every policy of the client
(retries, deadlines, hedging, replica routing). A failed request becomes a
:class:`BatchResult` with its error; the others carry on.
"""

from __future__ import annotations

import contextlib
import difflib
import heapq
import inspect
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
import pydantic

from ._canonical import prompt_prefix
from ._messages import request_messages
from .errors import ConfigurationError
from .types import ChatCompletion, ChatRequest

if TYPE_CHECKING:
    from ._client import AsyncClient

__all__ = [
    "BatchProgress",
    "BatchRequest",
    "BatchResult",
    "RadixTree",
    "batch_iter",
    "plan_batch",
    "run_batch",
]

BatchRequest = ChatRequest | str | Sequence[Any] | Mapping[str, Any]
"""One batch entry: a :class:`ChatRequest`, a string (one user message, as
``client.chat("hi")`` takes it: the same as ``{"messages": "hi"}``), a list of messages (or a
``Conversation``: the same as ``{"messages": [...]}``), or the keyword arguments of
``client.stream(...)`` as a mapping (``messages`` required; ``model``, ``timeout``,
``retry``, ``hedge``, ``task``, ``extra_headers`` and request fields such as ``tools``
optional)."""

_CALL_ONLY = frozenset({"timeout", "retry", "hedge", "task", "extra_headers"})
_NOT_FROM_REQUEST = frozenset({"model", "messages", "stream", "stream_options"})
_ARGUMENTS = (
    frozenset(ChatRequest.model_fields)
    | frozenset(f.alias for f in ChatRequest.model_fields.values() if f.alias)
    | _CALL_ONLY
)


def check_arguments(names: Iterable[str], where: str) -> None:
    """Refuse argument names that are neither request fields nor call options, naming the
    closest known one (a typo failed every entry of a batch, one by one, when sent)."""
    for name in names:
        if name == "stream":
            raise ConfigurationError(
                f"{where}: 'stream' is not a batch argument (each entry's reply is whole)"
            )
        if name == "response_model":
            raise ConfigurationError(
                f"{where}: 'response_model' is not a batch argument; pass response_format "
                "(a JSON schema) and validate each reply's text, or call chat() per entry"
            )
        if name not in _ARGUMENTS:
            close = difflib.get_close_matches(str(name), sorted(_ARGUMENTS), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigurationError(f"{where}: unknown argument {name!r}{hint}")


@dataclass(frozen=True, slots=True)
class BatchResult:
    """The outcome of one batch entry: its input ``index``, and either the ``completion``
    or the ``error`` it raised. ``waited`` is the seconds from the batch's start until the
    entry's call started (its place in the queue, its leader's first token)."""

    index: int
    completion: ChatCompletion | None
    error: Exception | None = None
    waited: float = 0.0

    @property
    def ok(self) -> bool:
        """True when the entry completed."""
        return self.error is None

    def unwrap(self) -> ChatCompletion:
        """The completion, or the entry's error raised."""
        if self.error is not None:
            raise self.error
        if self.completion is None:  # pragma: no cover - constructed only with one of them
            raise ConfigurationError(f"batch entry {self.index} has no result")
        return self.completion


@dataclass(frozen=True, slots=True)
class BatchProgress:
    """Where a batch stands after an entry finished: entries ``done`` (``failed`` of them
    with an error) of ``total``, and the entry that just finished (``last``)."""

    done: int
    failed: int
    total: int
    last: BatchResult


# ---------------------------------------------------------------------- the radix tree


@dataclass(eq=False, slots=True)
class _Node:
    label: bytes = b""
    depth: int = 0  # bytes from the root to the end of this node's label
    children: dict[int, _Node] = field(default_factory=dict)
    items: list[int] = field(default_factory=list)  # entries whose key ends here
    first: int = -1  # smallest entry index in the subtree: the children's visiting order
    count: int = 0  # entries in the subtree


class RadixTree:
    """A compressed trie over byte strings; each string is stored with an entry index."""

    def __init__(self) -> None:
        self.root = _Node()

    def insert(self, key: bytes, index: int) -> None:
        """Add ``key`` for entry ``index``."""
        node = self.root
        node.count += 1
        node.first = index if node.first < 0 else min(node.first, index)
        at = 0
        while at < len(key):
            child = node.children.get(key[at])
            if child is None:
                child = _Node(key[at:], len(key))
                node.children[key[at]] = child
                node = child
                at = len(key)
            else:
                label = child.label
                common = _common_prefix(label, key, at)
                if common < len(label):  # split the edge where the key leaves it
                    head = _Node(label[:common], child.depth - len(label) + common)
                    head.count, head.first = child.count, child.first
                    child.label = label[common:]
                    head.children[child.label[0]] = child
                    node.children[key[at]] = head
                    child = head
                node = child
                at += common
            node.count += 1
            node.first = index if node.first < 0 else min(node.first, index)
        node.items.append(index)

    def shared(self, a: bytes, b: bytes) -> int:
        """Bytes ``a`` and ``b`` share at the start (a helper for tests and callers)."""
        return _common_prefix(a, b, 0, 0)


def _common_prefix(label: bytes, key: bytes, at: int, start: int = 0) -> int:
    """Length of the common prefix of ``label[start:]`` and ``key[at:]``."""
    limit = min(len(label) - start, len(key) - at)
    if label[start : start + limit] == key[at : at + limit]:
        return limit
    low, high = 0, limit  # binary search over slice equality: C-speed comparisons
    while low < high:
        mid = (low + high + 1) // 2
        if label[start : start + mid] == key[at : at + mid]:
            low = mid
        else:
            high = mid - 1
    return low


@dataclass(frozen=True, slots=True)
class BatchPlan:
    """The send order: ``order`` lists entry indexes depth-first; ``gate[i]`` is the entry
    whose first token entry ``i`` waits for (``None``: it may start at once)."""

    order: tuple[int, ...]
    gate: tuple[int | None, ...]


def plan_batch(keys: Sequence[bytes | None], min_shared: int) -> BatchPlan:
    """Group entries by shared key prefixes of at least ``min_shared`` bytes.

    Every node of the radix tree that has two or more entries below it and lies at least
    ``min_shared`` bytes deep is a group; its leader is its first entry in depth-first order.
    An entry waits for the leader of the deepest group it belongs to but does not lead (that
    leader in turn waits for the groups above it). Entries without a key (``None``) form no
    group and start at once, after the grouped ones in the order.
    """
    tree = RadixTree()
    for index, key in enumerate(keys):
        if key is not None:
            tree.insert(key, index)
    order: list[int] = []
    gate: list[int | None] = [None] * len(keys)
    # Iterative depth-first walk. A node's own entries and its children are visited in the
    # order of their smallest entry index, so a group's leader (its smallest index) is also
    # the first of the group that is sent. Stack items: (node, leaders on the path) or
    # (None, leaders, entry index).
    stack: list[tuple[_Node | None, tuple[int, ...], int]] = [(tree.root, (), -1)]
    while stack:
        node, leaders, index = stack.pop()
        if node is None:
            order.append(index)
            gate[index] = next((lead for lead in reversed(leaders) if lead != index), None)
            continue
        if node.count >= 2 and node.depth >= min_shared:
            leaders = (*leaders, node.first)
        visits: list[tuple[int, _Node | None, int]] = [(i, None, i) for i in node.items]
        visits.extend((child.first, child, -1) for child in node.children.values())
        visits.sort(key=lambda visit: visit[0], reverse=True)
        stack.extend((child, leaders, i) for _, child, i in visits)
    order.extend(index for index, key in enumerate(keys) if key is None)
    return BatchPlan(tuple(order), tuple(gate))


# ---------------------------------------------------------------------- entries


@dataclass(frozen=True, slots=True)
class _Entry:
    messages: Any
    kwargs: dict[str, Any]


def _entry(item: BatchRequest, defaults: Mapping[str, Any], index: int) -> _Entry:
    if isinstance(item, ChatRequest):
        fields = item.model_dump(exclude_none=True, exclude=set(_NOT_FROM_REQUEST))
        return _Entry(item.messages, {**defaults, "model": item.model, **fields})
    if isinstance(item, str | Sequence) and not isinstance(item, bytes | bytearray):
        item = {"messages": item}  # one user message, as chat("hi") takes it, or a list
    if not isinstance(item, Mapping):
        raise ConfigurationError(
            f"batch requests[{index}] must be a ChatRequest, a string (one user message), a "
            f"list of messages or a mapping of chat arguments, got {type(item).__name__}"
        )
    if "messages" not in item:
        raise ConfigurationError(f"batch requests[{index}] has no 'messages'")
    check_arguments(item, f"batch requests[{index}]")
    kwargs = {**defaults, **item}
    messages = kwargs.pop("messages")
    return _Entry(messages, kwargs)


def _prefix_key(entry: _Entry, default_model: str | None) -> bytes | None:
    """The entry's canonical prompt bytes (model first, in layout order), or None when it is
    not a valid request (it then fails on its own when sent, with the client's error)."""
    fields = {k: v for k, v in entry.kwargs.items() if k not in _CALL_ONLY}
    model = fields.pop("model", None) or default_model
    if not isinstance(model, str):
        return None
    try:
        messages, static, tools = request_messages(entry.messages)
        if tools and "tools" not in fields:
            fields["tools"] = tools
        request = ChatRequest.model_validate({"model": model, "messages": messages, **fields})
    except (pydantic.ValidationError, TypeError, ValueError):
        return None
    prefix = prompt_prefix(request, static)
    tools_block, segments = prefix.segments[0], prefix.segments[1:]
    # In the order chat templates render a prompt (vLLM, SGLang and our engine alike): the
    # leading static messages, then the tools (rendered into the system turn), then the rest.
    # Requests with different system prompts share no prefix there even when their tools
    # are equal, so they are not held back for each other.
    head, rest = segments[: prefix.static], segments[prefix.static :]
    parts = [model.encode(), *head, tools_block, *rest]
    # Each part ends in a byte canonical JSON never holds raw, so a boundary stays one.
    return b"\x00".join(parts) + b"\x00"


# ---------------------------------------------------------------------- running


class _Scheduler:
    """Ready entries by depth-first position; gates release followers."""

    def __init__(self, plan: BatchPlan) -> None:
        self.position = {index: at for at, index in enumerate(plan.order)}
        self.followers: dict[int, list[int]] = {}
        self.ready: list[tuple[int, int]] = []
        for index in plan.order:
            lead = plan.gate[index]
            if lead is None:
                self.ready.append((self.position[index], index))
            else:
                self.followers.setdefault(lead, []).append(index)
        heapq.heapify(self.ready)
        self.held = len(plan.order) - len(self.ready)
        self.wake = anyio.Event()

    def release(self, leader: int) -> None:
        """Let ``leader``'s followers go (idempotent)."""
        followers = self.followers.pop(leader, None)
        if not followers:
            return
        for index in followers:
            heapq.heappush(self.ready, (self.position[index], index))
        self.held -= len(followers)
        self.wake.set()
        self.wake = anyio.Event()

    async def next(self) -> int | None:
        """The next entry to send, or None when every entry has been handed out."""
        while not self.ready:
            if self.held == 0:
                return None
            await self.wake.wait()
        return heapq.heappop(self.ready)[1]


@asynccontextmanager
async def batch_iter(
    client: AsyncClient,
    requests: Iterable[BatchRequest],
    *,
    concurrency: int,
    on_progress: Callable[[BatchProgress], object] | None,
    min_shared_bytes: int,
    defaults: Mapping[str, Any],
) -> AsyncIterator[AsyncIterator[BatchResult]]:
    """Run a batch; yields an iterator of results in completion order (see
    :meth:`AsyncClient.batch_iter`)."""
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ConfigurationError(f"concurrency must be a positive int, got {concurrency!r}")
    if isinstance(min_shared_bytes, bool) or not isinstance(min_shared_bytes, int):
        raise ConfigurationError(f"min_shared_bytes must be an int, got {min_shared_bytes!r}")
    if isinstance(requests, (str, bytes, Mapping, ChatRequest)):
        raise ConfigurationError("requests must be an iterable of requests, not one request")
    if not isinstance(requests, Iterable):
        raise ConfigurationError(
            f"requests must be an iterable of requests, got {type(requests).__name__}"
        )
    check_arguments(defaults, "batch()")
    entries = [_entry(item, defaults, index) for index, item in enumerate(requests)]
    keys = [_prefix_key(entry, client.model) for entry in entries]
    scheduler = _Scheduler(plan_batch(keys, min_shared_bytes))
    total = len(entries)
    send, receive = anyio.create_memory_object_stream[BatchResult](max(total, 1))
    counts = [0, 0]  # done, failed
    started = anyio.current_time()

    async def run(index: int) -> None:
        entry = entries[index]
        waited = anyio.current_time() - started
        try:
            async with client.stream(entry.messages, **entry.kwargs) as chat:
                scheduler.release(index)  # the first token is in: the prefix is cached
                completion = await chat.final()
            result = BatchResult(index, completion, None, waited)
        except Exception as exc:  # one entry's failure never loses the others
            result = BatchResult(index, None, exc, waited)
        finally:
            scheduler.release(index)
        counts[0] += 1
        counts[1] += 0 if result.ok else 1
        with contextlib.suppress(anyio.BrokenResourceError):  # the caller stopped reading
            send.send_nowait(result)  # the buffer holds every result: never blocks
        if on_progress is not None:
            try:
                outcome = on_progress(BatchProgress(counts[0], counts[1], total, result))
                if inspect.isawaitable(outcome):
                    await outcome
            except Exception as exc:  # the callback's own failure ends the batch
                failures.append(exc)
                group.cancel_scope.cancel()

    async def worker() -> None:
        while (index := await scheduler.next()) is not None:
            await run(index)

    async def drive() -> None:
        async with send:
            async with anyio.create_task_group() as workers:
                for _ in range(min(concurrency, total)):
                    workers.start_soon(worker)

    # Errors reach the caller as they are, not wrapped in an exception group: the caller's
    # own (raised in its block) and the progress callback's are held until the group ends.
    failures: list[Exception] = []
    async with anyio.create_task_group() as group:
        group.start_soon(drive)
        try:
            async with receive:
                yield receive
        except Exception as exc:
            failures.append(exc)
        group.cancel_scope.cancel()  # the caller left early: stop what is still running
    if failures:
        raise failures[0]


async def run_batch(
    client: AsyncClient,
    requests: Iterable[BatchRequest],
    *,
    concurrency: int,
    on_progress: Callable[[BatchProgress], object] | None,
    min_shared_bytes: int,
    defaults: Mapping[str, Any],
) -> list[BatchResult]:
    """Run a batch to its end; results in input order (see :meth:`AsyncClient.batch`)."""
    results: list[BatchResult] = []
    async with batch_iter(
        client,
        requests,
        concurrency=concurrency,
        on_progress=on_progress,
        min_shared_bytes=min_shared_bytes,
        defaults=defaults,
    ) as stream:
        async for result in stream:
            results.append(result)
    results.sort(key=lambda result: result.index)
    return results
