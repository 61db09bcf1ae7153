"""Prefix-grouped batches: the radix-tree plan, leaders before followers, input order, errors
per entry, progress, concurrency, and structured cancellation."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from swiftclient import (
    AsyncClient,
    BatchProgress,
    BatchResult,
    ChatCompletionChunk,
    ChatRequest,
    ConfigurationError,
    Conversation,
    InternalServerError,
    RetryPolicy,
)
from swiftclient._batch import RadixTree, plan_batch
from swiftclient.extend import Deadline, RequestOptions

pytestmark = pytest.mark.anyio
LIMIT = 30.0  # seconds: a bound on waiting for an event, never a speed assertion
SHARED = "You are a careful assistant. " * 60  # about 1,700 bytes of shared system prompt


def _chunk(text: str | None = None, finish: str | None = None) -> ChatCompletionChunk:
    delta: dict[str, Any] = {} if text is None else {"content": text}
    return ChatCompletionChunk.model_validate(
        {"id": "c", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    )


class Scripted:
    """A backend that echoes the last user message; the first chunk of a request whose text
    is in ``gates`` waits for that event; texts in ``fail`` raise a 500 on open."""

    name = "scripted"

    def __init__(self) -> None:
        self.opened: list[str] = []
        self.gates: dict[str, anyio.Event] = {}
        self.fail: set[str] = set()
        self.open_now = 0
        self.most_open = 0
        self.changed = anyio.Event()
        self.headers: list[dict[str, str]] = []  # each attempt's extra headers

    def _notify(self) -> None:
        self.changed.set()
        self.changed = anyio.Event()

    async def wait_for(self, condition: Any) -> None:
        with anyio.fail_after(LIMIT):
            while not condition():
                await self.changed.wait()

    @asynccontextmanager
    async def _stream(self, text: str) -> AsyncIterator[AsyncIterator[ChatCompletionChunk]]:
        self.opened.append(text)
        self.open_now += 1
        self.most_open = max(self.most_open, self.open_now)
        self._notify()
        try:
            if text in self.fail:
                raise InternalServerError("boom", status_code=500)
            chunks = self._chunks(text)
            try:
                yield chunks
            finally:
                with anyio.CancelScope(shield=True):
                    await chunks.aclose()
        finally:
            self.open_now -= 1
            self._notify()

    async def _chunks(self, text: str) -> AsyncIterator[ChatCompletionChunk]:
        gate = self.gates.get(text)
        if gate is not None:
            await gate.wait()
        yield _chunk(f"re: {text}")
        yield _chunk(finish="stop")

    def stream(
        self, request: ChatRequest, deadline: Deadline, options: RequestOptions | None = None
    ) -> Any:
        self.headers.append(dict(options.headers) if options is not None else {})
        content = request.messages[-1].content
        return self._stream(content if isinstance(content, str) else "")

    async def complete(self, *args: Any) -> Any:
        raise NotImplementedError  # batches always stream

    async def aclose(self) -> None:
        pass


def _msgs(user: str, system: str = SHARED) -> list[dict[str, str]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def _client(backend: Scripted) -> AsyncClient:
    return AsyncClient(backend=backend, model="m", retry=RetryPolicy(max_attempts=1))


# ---------------------------------------------------------------------- the plan


def test_plan_groups_nested_prefixes_depth_first() -> None:
    keys: list[bytes | None] = [
        b"SYS|docA|q1",  # 0
        b"SYS|docB|q1",  # 1
        b"SYS|docA|q2",  # 2
        b"other|q",  # 3
        b"SYS|docB|q2",  # 4
        None,  # 5: not a valid request
        b"SYS|docA|q3",  # 6
    ]
    plan = plan_batch(keys, min_shared=4)
    # Depth-first: the docA group, then the docB group, then the lone entry, then None.
    assert plan.order == (0, 2, 6, 1, 4, 3, 5)
    # 0 leads SYS and docA; 1 leads docB and waits for SYS's leader; the rest follow theirs.
    assert plan.gate == (None, 0, 0, None, 1, None, 0)


def test_plan_min_shared_keeps_short_prefixes_apart() -> None:
    keys: list[bytes | None] = [b"abcdef-1", b"abcdef-2", b"abxyz"]
    assert plan_batch(keys, min_shared=7).gate == (None, 0, None)
    assert plan_batch(keys, min_shared=100).gate == (None, None, None)
    assert plan_batch(keys, min_shared=2).gate == (None, 0, 0)


def test_plan_duplicates_and_prefix_keys() -> None:
    keys: list[bytes | None] = [b"abc", b"abc", b"ab", b"abcd"]
    plan = plan_batch(keys, min_shared=2)
    # Entry 0 has the smallest index under "ab", so it leads (and is sent first) even
    # though entry 2's key is the shorter one; the others follow it.
    assert plan.order == (0, 1, 3, 2)
    assert plan.gate == (None, 0, 0, 0)


def test_radix_tree_splits_edges_and_counts() -> None:
    tree = RadixTree()
    for index, key in enumerate([b"hello world", b"hello there", b"help"]):
        tree.insert(key, index)
    root = tree.root
    assert root.count == 3
    (hel,) = root.children.values()
    assert hel.label == b"hel" and hel.count == 3 and hel.first == 0
    lo = hel.children[ord("l")]
    assert lo.label == b"lo " and lo.depth == 6 and lo.count == 2
    assert tree.shared(b"hello world", b"hello there") == 6


# ---------------------------------------------------------------------- running


async def test_followers_wait_for_the_leaders_first_token() -> None:
    backend = Scripted()
    backend.gates["q0"] = anyio.Event()
    requests = [{"messages": _msgs(f"q{i}")} for i in range(5)]
    requests.append({"messages": _msgs("lonely", system="a different system prompt")})
    async with _client(backend) as client:
        async with anyio.create_task_group() as tg:
            results: list[BatchResult] = []

            async def run() -> None:
                results.extend(await client.batch(requests, concurrency=8))

            tg.start_soon(run)
            await backend.wait_for(lambda: len(backend.opened) == 2)
            await anyio.sleep(0.05)  # room for a wrong early start to show (not a timing check)
            assert sorted(backend.opened) == ["lonely", "q0"]  # followers still held
            backend.gates["q0"].set()
    assert [result.index for result in results] == list(range(6))
    assert [result.unwrap().text for result in results[:5]] == [f"re: q{i}" for i in range(5)]
    assert backend.opened[:2] == ["q0", "lonely"] or backend.opened[:2] == ["lonely", "q0"]
    assert sorted(backend.opened[2:]) == ["q1", "q2", "q3", "q4"]
    assert all(result.waited >= 0.0 for result in results)


async def test_entries_with_their_own_headers_are_grouped_and_send_them() -> None:
    # extra_headers made an entry's prompt unreadable to the planner: it never grouped
    backend = Scripted()
    backend.gates["q0"] = anyio.Event()
    requests = [{"messages": _msgs(f"q{i}"), "extra_headers": {"x-n": f"{i}"}} for i in range(3)]
    async with _client(backend) as client:
        async with anyio.create_task_group() as tg:
            results: list[BatchResult] = []

            async def run() -> None:
                results.extend(await client.batch(requests + [{"messages": _msgs("q3")}]))

            tg.start_soon(run)
            await backend.wait_for(lambda: len(backend.opened) == 1)
            await anyio.sleep(0.05)  # room for a wrong early start to show (not a timing check)
            assert backend.opened == ["q0"]  # the others wait for its first token
            backend.gates["q0"].set()
        results.extend(await client.batch(["q4"], extra_headers={"x-n": "all"}))
    assert [result.unwrap().text for result in results] == [f"re: q{i}" for i in range(5)]
    sent = dict(zip(backend.opened, backend.headers, strict=True))
    assert sent == {f"q{i}": {"x-n": f"{i}"} for i in range(3)} | {"q3": {}, "q4": {"x-n": "all"}}


async def test_errors_stay_with_their_entry_and_results_keep_input_order() -> None:
    backend = Scripted()
    backend.fail = {"q1"}
    requests: list[Any] = [
        {"messages": _msgs("q0")},
        {"messages": _msgs("q1")},
        {"messages": _msgs("q2"), "temperature": 9.0},  # invalid: fails on its own
        ChatRequest(model="m", messages=_msgs("q3")),
        {"messages": _msgs("q4")},
    ]
    seen: list[BatchProgress] = []
    async with _client(backend) as client:
        results = await client.batch(requests, concurrency=2, on_progress=seen.append)
    assert [result.index for result in results] == [0, 1, 2, 3, 4]
    assert [result.ok for result in results] == [True, False, False, True, True]
    assert isinstance(results[1].error, InternalServerError)
    assert isinstance(results[2].error, ConfigurationError)
    with pytest.raises(InternalServerError):
        results[1].unwrap()
    assert results[3].unwrap().text == "re: q3"
    assert [progress.done for progress in seen] == [1, 2, 3, 4, 5]
    assert seen[-1].failed == 2 and seen[-1].total == 5


async def test_a_failed_leader_releases_its_followers() -> None:
    backend = Scripted()
    backend.fail = {"q0"}
    async with _client(backend) as client:
        results = await client.batch([{"messages": _msgs(f"q{i}")} for i in range(4)])
    assert [result.ok for result in results] == [False, True, True, True]
    assert backend.opened[0] == "q0"


async def test_concurrency_bounds_open_calls_and_async_progress_is_awaited() -> None:
    backend = Scripted()
    heard: list[int] = []

    async def progress(state: BatchProgress) -> None:
        await anyio.lowlevel.checkpoint()
        heard.append(state.done)

    requests = [{"messages": _msgs(f"q{i}", system=f"distinct {i}")} for i in range(12)]
    async with _client(backend) as client:
        results = await client.batch(requests, concurrency=3, on_progress=progress)
    assert all(result.ok for result in results)
    assert backend.most_open <= 3
    assert sorted(heard) == list(range(1, 13))


async def test_batch_iter_yields_as_entries_finish_and_cancels_the_rest_on_exit() -> None:
    backend = Scripted()
    held = anyio.Event()
    for i in range(1, 4):
        backend.gates[f"slow{i}"] = held  # never set
    requests = [{"messages": _msgs("fast", system="s0")}]
    requests += [{"messages": _msgs(f"slow{i}", system=f"s{i}")} for i in range(1, 4)]
    async with _client(backend) as client:
        with anyio.fail_after(LIMIT):
            async with client.batch_iter(requests, concurrency=4) as results:
                async for result in results:
                    assert result.index == 0 and result.ok
                    break
        assert backend.open_now == 0  # the held streams were cancelled and closed


async def test_empty_batch_and_bad_arguments() -> None:
    backend = Scripted()
    async with _client(backend) as client:
        assert await client.batch([]) == []
        with pytest.raises(ConfigurationError, match="concurrency"):
            await client.batch([{"messages": "hi"}], concurrency=0)
        with pytest.raises(ConfigurationError, match="iterable of requests"):
            await client.batch({"messages": "hi"})
        with pytest.raises(ConfigurationError, match="no 'messages'"):
            await client.batch([{"model": "m"}])
        with pytest.raises(ConfigurationError, match="'stream' is not a batch argument"):
            await client.batch([{"messages": "hi", "stream": True}])
        with pytest.raises(ConfigurationError, match="a list of messages or a mapping"):
            await client.batch([42])  # type: ignore[list-item]
        # A misspelt argument is refused before anything is sent, naming the closest one
        # (it failed every entry, one by one, as each was sent).
        with pytest.raises(
            ConfigurationError,
            match=r"batch\(\): unknown argument 'max_token' \(did you mean 'max_tokens'\?\)",
        ):
            await client.batch(["hi", "there"], max_token=3)
        with pytest.raises(
            ConfigurationError, match=r"requests\[1\]: unknown argument 'temprature'"
        ):
            await client.batch(["hi", {"messages": "x", "temprature": 0.5}])
        with pytest.raises(ConfigurationError) as refused:
            await client.batch(["hi"], response_model=dict)
        assert "'response_model' is not a batch argument" in str(refused.value)
        assert "stream" not in str(refused.value)  # named only what was given
        assert backend.opened == []
        with pytest.raises(ConfigurationError, match="iterable of requests"):
            await client.batch("hi")  # one string is not a batch of one-letter requests


async def test_a_string_entry_is_one_user_message_as_chat_takes_it() -> None:
    backend = Scripted()
    async with _client(backend) as client:
        results = await client.batch(["hi", {"messages": "there"}], max_tokens=3)
        assert [result.unwrap().text for result in results] == ["re: hi", "re: there"]
        async with client.batch_iter(["again"]) as finished:
            assert [result.unwrap().text async for result in finished] == ["re: again"]


async def test_a_list_entry_is_its_messages() -> None:
    backend = Scripted()
    conversation = Conversation("s")
    conversation.user("conv")
    async with _client(backend) as client:
        results = await client.batch(
            [[{"role": "user", "content": "listed"}], conversation], max_tokens=3
        )
        assert [result.unwrap().text for result in results] == ["re: listed", "re: conv"]


async def test_defaults_apply_to_mapping_entries() -> None:
    backend = Scripted()
    async with _client(backend) as client:
        results = await client.batch(
            [{"messages": "hi"}, {"messages": "there", "temperature": 0.5}],
            temperature=0.1,
            max_tokens=3,
        )
    assert [result.unwrap().text for result in results] == ["re: hi", "re: there"]


async def test_errors_of_the_callers_block_and_of_the_callback_arrive_unwrapped() -> None:
    backend = Scripted()
    held = anyio.Event()
    backend.gates["slow"] = held  # never set: cancelled when the batch ends
    requests = [{"messages": _msgs("fast", system="s0")}, {"messages": _msgs("slow", system="s1")}]
    async with _client(backend) as client:
        with anyio.fail_after(LIMIT), pytest.raises(KeyError, match="mine"):
            async with client.batch_iter(requests) as results:
                async for _ in results:
                    raise KeyError("mine")
        assert backend.open_now == 0

        def progress(state: BatchProgress) -> None:
            raise LookupError("callback failed")

        with anyio.fail_after(LIMIT), pytest.raises(LookupError, match="callback failed"):
            await client.batch(requests, on_progress=progress)
        assert backend.open_now == 0


async def test_equal_tools_under_different_system_prompts_form_no_group() -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": f"tool_{i}",
                "description": "A tool with a long description. " * 20,
                "parameters": {"type": "object", "properties": {"x": {"type": "string"}}},
            },
        }
        for i in range(4)
    ]
    backend = Scripted()
    backend.gates["a0"] = anyio.Event()  # would hold a follower of a0's group
    requests = [
        {"messages": _msgs("a0", system="agent A"), "tools": tools},
        {"messages": _msgs("b0", system="agent B"), "tools": tools},
        {"messages": _msgs("a1", system="agent A"), "tools": tools},
    ]
    async with _client(backend) as client:
        async with anyio.create_task_group() as tg:
            results: list[BatchResult] = []

            async def run() -> None:
                results.extend(await client.batch(requests))

            tg.start_soon(run)
            # b0 goes at once (another system prompt); a1 waits for a0's first token.
            await backend.wait_for(lambda: sorted(backend.opened) == ["a0", "b0"])
            assert "a1" not in backend.opened
            backend.gates["a0"].set()
    assert [result.ok for result in results] == [True, True, True]


async def test_layout_marks_are_applied_before_grouping() -> None:
    from swiftclient.prompt_cache import static, turn

    backend = Scripted()
    backend.gates["q0"] = anyio.Event()

    def marked(question: str, note: str) -> list[Any]:
        # The per-call note is written first but marked as turn content: it moves after the
        # shared static system prompt, so the two requests share that prefix.
        return [
            turn({"role": "user", "content": note}),
            static({"role": "system", "content": SHARED}),
            turn({"role": "user", "content": question}),
        ]

    requests = [{"messages": marked("q0", "note A")}, {"messages": marked("q1", "note B")}]
    async with _client(backend) as client:
        async with anyio.create_task_group() as tg:
            results: list[BatchResult] = []

            async def run() -> None:
                results.extend(await client.batch(requests))

            tg.start_soon(run)
            await backend.wait_for(lambda: backend.opened == ["q0"])
            await anyio.sleep(0.05)  # room for a wrong early start to show (not a timing check)
            assert backend.opened == ["q0"]  # q1 waits: its static prefix is q0's
            backend.gates["q0"].set()
    assert [result.unwrap().text for result in results] == ["re: q0", "re: q1"]
