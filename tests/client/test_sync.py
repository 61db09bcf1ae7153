"""The blocking Client: the async client's surface, one loop in one owned thread.

Against :class:`FakeProvider` over real sockets. What must survive the interpreter (GC of
an unclosed client, exit, fork, Ctrl-C) runs in a subprocess, so a failure cannot wedge or
kill the test run.
"""

from __future__ import annotations

import gc
import os
import re
import subprocess
import sys
import textwrap
import threading
import warnings
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import anyio
import pydantic
import pytest
from anyio.from_thread import BlockingPortal

from swiftclient import (
    AsyncClient,
    BadRequestError,
    BatchProgress,
    ChatCompletionChunk,
    Client,
    ConfigurationError,
    Conversation,
    Hedge,
    HTTPBackend,
    RateLimitError,
    RetryPolicy,
    SyncChatStream,
)
from swiftclient.testing import FakeProvider, Reply

NO_RETRY = RetryPolicy.none()
RELEASE_LIMIT = 30.0  # seconds; bounds waiting for cleanup, never a speed assertion
SUBPROCESS_LIMIT = 120.0


@contextmanager
def fake(default: Reply | None = None, model: str = "fake-model") -> Iterator[FakeProvider]:
    with FakeProvider(default or Reply(text="Hello there"), model=model).run_in_thread() as f:
        yield f


def wait_idle(provider: FakeProvider) -> None:
    """Block until the fake answers no request (every stream it served has ended)."""

    async def wait() -> None:
        with anyio.fail_after(RELEASE_LIMIT):
            await provider.wait_until_idle()

    anyio.run(wait)


def loop_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "swiftclient-loop"]


def in_use(client: Client, name: str) -> int:
    """Connections the backend has checked out, read on the client's loop (after everything
    already scheduled there has run)."""
    client.health()  # a round trip through the loop: what was due there has run
    backend = client.backends[name]
    assert isinstance(backend, HTTPBackend)
    return backend.pool_stats()["in_use"]


# asyncio's debug mode (on under -X dev) logs every loop step that takes 0.1 s or more; on
# a loaded machine some do (seen with 24 such scripts on one core), and that log is about
# the machine, not the client.
_SLOW_STEP = re.compile(r"^Executing <.*> took \d+\.\d+ seconds\n", re.MULTILINE)


def run_script(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter in development mode with warnings as errors; its
    stderr without asyncio's slow-step lines."""
    done = subprocess.run(
        [sys.executable, "-X", "dev", "-W", "error", "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_LIMIT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    done.stderr = _SLOW_STEP.sub("", done.stderr)
    return done


# --------------------------------------------------------------------------- the surface


def test_the_sync_client_offers_the_async_surface() -> None:
    class City(pydantic.BaseModel):
        city: str

    with fake() as provider, Client(HTTPBackend(provider.base_url), model="m") as client:
        client.warmup()
        assert client.chat("hi").text == "Hello there"
        client.chat("hi", extra_headers={"x-beta": "on"})
        with client.stream("hi", extra_headers={"x-beta": "streamed"}) as beta:
            list(beta)
        assert [r.headers.get("x-beta") for r in provider.requests[-2:]] == ["on", "streamed"]
        with client.stream("hi") as stream:
            assert isinstance(stream, SyncChatStream)
            chunks = list(stream)
            assert all(isinstance(c, ChatCompletionChunk) for c in chunks)
            assert stream.final().text == "Hello there"
            assert stream.timing.ttft is not None
            assert stream.request.model == "m"
        with client.stream("hi") as stream:
            assert "".join(stream.text()) == "Hello there"
        # Iterated without a with block, a stream opens on the first read.
        assert "".join(client.stream("hi").text()) == "Hello there"
        assert client.stream("hi").final().text == "Hello there"

        provider.script(Reply(text='{"city": "Paris"}'))
        assert client.chat("where?", response_model=City) == City(city="Paris")

        conversation = Conversation("Be brief.")
        conversation.user("hi")
        conversation.append(client.chat(conversation))
        assert [m.role for m in conversation] == ["system", "user", "assistant"]
        conversation.user("again")
        # send() with a blocking client sends and appends (it returned a coroutine that
        # was never awaited, and the reply was lost)
        assert conversation.send(client).choices[0].message.content == "Hello there"
        assert [m.role for m in conversation][-2:] == ["user", "assistant"]

        progress: list[BatchProgress] = []
        results = client.batch(
            [{"messages": "a"}, {"messages": "b"}, {"messages": "c"}], on_progress=progress.append
        )
        assert [r.index for r in results] == [0, 1, 2]
        assert all(r.unwrap().text == "Hello there" for r in results)
        assert len(progress) == 3
        with client.batch_iter([{"messages": "a"}, "b"]) as finished:  # a string: one message
            assert sorted(r.index for r in finished) == [0, 1]
        assert client.batch(["a"])[0].unwrap().text == "Hello there"

        assert client.health() == {}
        assert client.stats().calls == 0  # unpriced one-target calls are not accounted
        assert client.cache_stats()["http"].requests >= 1
        target = client.targets("http/m")[0]
        assert (target.backend.name, target.model) == ("http", "m")
        assert client.targets(["http/a", "http/b"])[1].model == "b"
        assert isinstance(client.aclient, AsyncClient)
    assert client.closed


def test_calls_one_after_another_reuse_one_pooled_connection() -> None:
    # The case of asyncio.run(client.chat(...)) twice on one AsyncClient, which fails: each
    # run is a new loop. A Client keeps one loop, so its pool serves every call.
    with fake() as provider, Client(HTTPBackend(provider.base_url), model="m") as client:
        for _ in range(3):
            assert client.chat("hi").text == "Hello there"
        assert provider.connections_opened == 1


def test_the_constructor_takes_what_the_async_client_takes() -> None:
    import inspect

    sync = inspect.signature(Client.__init__).parameters
    twin = inspect.signature(AsyncClient.__init__).parameters
    assert list(sync) == list(twin)
    for name, parameter in twin.items():
        assert sync[name].default == parameter.default, name
        assert sync[name].kind == parameter.kind, name


def test_errors_are_the_async_clients_typed_errors() -> None:
    with fake() as provider, Client(HTTPBackend(provider.base_url), retry=NO_RETRY) as client:
        provider.script(Reply(status=429, retry_after=1), Reply(status=400))
        with pytest.raises(RateLimitError) as caught:
            client.chat("hi", model="m")
        assert caught.value.status_code == 429
        with pytest.raises(BadRequestError), client.stream("hi", model="m") as stream:
            list(stream)
        with pytest.raises(ConfigurationError, match="no model given"):
            client.chat("hi")
        with pytest.raises(ConfigurationError, match=r"messages\[0\]"):
            client.stream([{"role": "tool", "content": "x"}], model="m")
        provider.script(Reply(text="partial words here", drop_after=1))
        with pytest.raises(Exception) as dropped, client.stream("hi", model="m") as stream:
            list(stream)
        assert type(dropped.value).__module__.startswith("swiftclient")
        with pytest.raises(type(dropped.value)) as again:
            stream.final()  # the error again, not "partial" as if it were the whole reply
        assert again.value is dropped.value
        assert stream.partial().text.startswith("partial")  # what came before it broke
        with pytest.raises(TypeError):
            client.warmup(connections=1, bogus=True)  # type: ignore[call-arg]
        assert client.chat("hi", model="m").text == "Hello there"
    with pytest.raises(ConfigurationError, match="closed"):
        client.chat("hi", model="m")


# --------------------------------------------------------------------------- threads


def test_eight_threads_make_two_hundred_hedged_calls_each() -> None:
    threads, calls = 8, 200
    held = 40  # replies on target a that never send a token: only the hedge can answer them
    with fake(Reply(text="from a"), model="a") as a, fake(Reply(text="from b"), model="b") as b:
        a.script(*[Reply(stall_after=0)] * held)
        backends = {"a": HTTPBackend(a.base_url, name="a"), "b": HTTPBackend(b.base_url, name="b")}
        # Every call races both targets (delay 0), with a budget that never refuses a hedge.
        hedge = Hedge(delay=0.0, budget=1.0, budget_burst=1000.0)
        with Client(backends=backends, hedge=hedge, retry=NO_RETRY, timeout=120.0) as client:

            def worker(_: int) -> list[tuple[str, list[str]]]:
                out = []
                for _ in range(calls):
                    completion = client.chat("hi", model=["a/m", "b/m"])
                    assert completion.timing is not None
                    out.append((completion.text, [t.outcome for t in completion.timing.attempts]))
                return out

            with ThreadPoolExecutor(threads) as pool:
                done = [r for batch in pool.map(worker, range(threads)) for r in batch]

            assert len(done) == threads * calls
            for text, attempt_outcomes in done:
                assert text in ("from a", "from b")
                assert attempt_outcomes.count("ok") == 1
            assert a.pending == 0  # every held reply was served, and answered by b's hedge
            assert sum(text == "from b" for text, _ in done) >= held
            stats = client.stats()
            assert stats.calls == threads * calls
            assert stats.hedges_sent >= held
            wait_idle(a)
            wait_idle(b)
            assert in_use(client, "a") == 0
            assert in_use(client, "b") == 0
            assert a.cancelled >= held  # the held requests were cancelled, never answered


@pytest.mark.parametrize("how", ["dropped", "break"])
def test_a_stream_abandoned_in_a_thread_releases_its_connection(how: str) -> None:
    with fake() as provider, Client(HTTPBackend(provider.base_url), model="m") as client:
        provider.script(Reply(text="one two three", stall_after=1))
        got: list[str] = []

        def reader() -> None:
            if how == "dropped":
                stream = client.stream("hi")
                got.append(next(stream.text()))
                return  # neither closed nor finished: dropped with the thread's frame
            with client.stream("hi") as stream:
                for text in stream.text():
                    got.append(text)
                    break

        thread = threading.Thread(target=reader)
        thread.start()
        thread.join()
        gc.collect()
        assert got == ["one"]
        wait_idle(provider)
        assert provider.cancelled == 1
        assert in_use(client, "http") == 0
        assert client.chat("again").text == "Hello there"  # the pool still serves


# --------------------------------------------------------------------------- lifecycle


def test_an_unclosed_client_collected_leaves_no_thread_and_no_warning() -> None:
    before = len(loop_threads())
    with fake() as provider, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        client = Client(HTTPBackend(provider.base_url), model="m")
        assert len(loop_threads()) == before + 1
        with client.stream("hi") as stream:
            next(stream)
        client.chat("hi")
        del client, stream
        gc.collect()
        assert len(loop_threads()) == before
    assert [str(w.message) for w in caught] == []


def test_close_is_idempotent_and_refuses_later_calls() -> None:
    with fake() as provider:
        client = Client(HTTPBackend(provider.base_url), model="m")
        client.chat("hi")
        client.close()
        # The counters stay readable: a script reads them after its work is done.
        assert client.cache_stats()["http"].requests == 1
        assert client.stats(reset=True).calls == 0
        client.close()
        assert client.closed
        with pytest.raises(ConfigurationError, match="closed"):
            client.chat("hi")
        with pytest.raises(ConfigurationError, match="closed"):
            client.stream("hi")


def test_close_waits_for_the_loops_worker_threads() -> None:
    """close() returns only once the loop's worker threads (anyio.to_thread: the local
    engine's steps) have ended: a caller that then exits the interpreter must not race a
    thread still at work (inside torch's deallocator, say, freeing a step's tensors: the
    process aborted in 3 of 10 runs)."""
    started, done = threading.Event(), threading.Event()

    def work() -> None:
        started.set()
        threading.Event().wait(0.3)
        done.set()

    with fake() as provider:
        client = Client(HTTPBackend(provider.base_url), model="m")
        # Abandoned when the loop stops: the worker runs on after the loop has ended.
        client._loop.submit(lambda: anyio.to_thread.run_sync(work, abandon_on_cancel=True))
        assert started.wait(10)
        client.close()
        assert done.is_set()


def test_close_waits_for_a_stuck_worker_thread_only_so_long(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Work abandoned on cancellation that never ends does not hold close() for ever."""
    from swiftclient import _sync

    monkeypatch.setattr(_sync, "_WORKER_JOIN_S", 0.2)
    started, release = threading.Event(), threading.Event()
    workers: list[threading.Thread] = []

    def stuck() -> None:
        workers.append(threading.current_thread())
        started.set()
        release.wait(60)  # on a close() that waits for it, the test fails after this

    with fake() as provider:
        client = Client(HTTPBackend(provider.base_url), model="m")
        client._loop.submit(lambda: anyio.to_thread.run_sync(stuck, abandon_on_cancel=True))
        assert started.wait(10)
        try:
            client.close()
            assert client.closed and workers[0].is_alive()  # close() did not wait it out
        finally:
            release.set()
            workers[0].join(10)


def test_close_cancels_a_stream_another_thread_is_reading() -> None:
    with fake() as provider:
        client = Client(HTTPBackend(provider.base_url), model="m")
        provider.script(Reply(text="one two", stall_after=1))
        opened = threading.Event()
        failure: list[BaseException] = []

        def reader() -> None:
            with client.stream("hi") as stream:
                texts = stream.text()
                next(texts)
                opened.set()
                try:
                    next(texts)
                except BaseException as exc:
                    failure.append(exc)

        thread = threading.Thread(target=reader)
        thread.start()
        opened.wait(RELEASE_LIMIT)
        client.close()
        thread.join(RELEASE_LIMIT)
        assert not thread.is_alive()
        assert len(failure) == 1
        assert isinstance(failure[0], ConfigurationError)
        assert "closed" in str(failure[0])
        wait_idle(provider)
        assert loop_threads() == []


_EXIT_SCRIPT = """
import gc, sys, threading
from swiftclient import Client, HTTPBackend

url = sys.argv[1]
dropped = Client(HTTPBackend(url), model="m")
dropped.chat("hi")
del dropped
gc.collect()
assert not [t for t in threading.enumerate() if t.name == "swiftclient-loop"]
left_open = Client(HTTPBackend(url), model="m")
stream = left_open.stream("hi")
next(stream)
print("exiting with a client and a stream left open", flush=True)
"""


def test_exit_with_an_unclosed_client_and_stream_is_clean() -> None:
    with fake() as provider:
        provider.script(Reply(text="x"), Reply(text="one two", stall_after=1))
        done = run_script(_EXIT_SCRIPT, provider.base_url)
        assert done.returncode == 0, done.stderr
        assert "exiting" in done.stdout
        assert done.stderr == ""  # no "Unclosed ...", no "Task was destroyed", no warning
        wait_idle(provider)
        assert provider.cancelled == 1  # the open stream's request was ended at exit


_INTERRUPT_SCRIPT = """
import signal, sys, threading
from contextlib import asynccontextmanager
import anyio
from swiftclient import Client, HTTPBackend

class Gate:
    name = "gate"

    def __init__(self):
        self.entered = threading.Event()
        self.released = threading.Event()

    def stream(self, request, deadline, options=None):
        return self._held()

    async def complete(self, request, deadline, options=None):
        async with self._held():
            pass

    @asynccontextmanager
    async def _held(self):
        self.entered.set()
        try:
            await anyio.sleep_forever()
        finally:
            self.released.set()
        yield

    async def aclose(self):
        pass

gate = Gate()
client = Client(backends={"gate": gate, "fake": HTTPBackend(sys.argv[1], name="fake")})
main = threading.main_thread().ident

def interrupt_when_held():
    gate.entered.wait()
    signal.pthread_kill(main, signal.SIGINT)

for what in ("chat", "stream"):
    gate.entered.clear()
    gate.released.clear()
    threading.Thread(target=interrupt_when_held).start()
    try:
        if what == "chat":
            client.chat("hi", model="gate/m")
        else:
            with client.stream("hi", model="gate/m") as stream:
                list(stream)
    except KeyboardInterrupt:
        pass
    else:
        sys.exit(f"{what}: no KeyboardInterrupt")
    assert gate.released.wait(60), f"{what}: the interrupted call still runs on the loop"
    assert client.chat("hi", model="fake/m").text == "fine", what
client.close()
print("ok")
"""


def test_ctrl_c_in_the_calling_thread_cancels_the_call_and_the_loop_serves_on() -> None:
    with fake(Reply(text="fine")) as provider:
        done = run_script(_INTERRUPT_SCRIPT, provider.base_url)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "ok"
        assert done.stderr == ""


# The same calls, with the SIGINT's C handler run on another thread than the main one (the
# main thread blocks the signal; the thread that sends it does not): Python then runs the
# handler only once the main thread wakes. Before, the main thread waited untimed for the
# loop and so for ever: the rare hang of the test above, made certain (the same stack).
_INTERRUPT_ELSEWHERE_SCRIPT = (
    _INTERRUPT_SCRIPT.replace(
        """def interrupt_when_held():
    gate.entered.wait()
    signal.pthread_kill(main, signal.SIGINT)""",
        """def interrupt_when_held():
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
    gate.entered.wait()
    os.kill(os.getpid(), signal.SIGINT)""",
    )
    .replace("import signal, sys, threading", "import os, signal, sys, threading")
    .replace(
        "    threading.Thread(target=interrupt_when_held).start()",
        """    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGINT])
    threading.Thread(target=interrupt_when_held).start()""",
    )
    .replace(
        "    assert gate.released.wait(60)",
        """    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
    assert gate.released.wait(60)""",
    )
)


def test_ctrl_c_handled_on_another_thread_still_interrupts_the_waiting_caller() -> None:
    assert _INTERRUPT_ELSEWHERE_SCRIPT.count("pthread_sigmask") == 3  # every edit applied
    with fake(Reply(text="fine")) as provider:
        done = run_script(_INTERRUPT_ELSEWHERE_SCRIPT, provider.base_url)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "ok"
        assert done.stderr == ""


class _Held:
    """A backend whose calls hold until cancelled, with events for entered and released."""

    name = "held"

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.released = threading.Event()

    def stream(self, request: object, deadline: object, options: object = None) -> Any:
        return self._held()

    async def complete(self, request: object, deadline: object, options: object = None) -> Any:
        async with self._held():
            raise AssertionError("unreachable")

    @asynccontextmanager
    async def _held(self) -> AsyncIterator[Any]:
        self.entered.set()
        try:
            await anyio.sleep_forever()
        finally:
            self.released.set()
        yield  # pragma: no cover

    async def aclose(self) -> None:
        pass


def test_an_interrupt_while_the_task_is_spawned_still_stops_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Ctrl-C that lands while the portal spawns the stream's task (before the caller
    waits for the opening) still stops the task: before, nothing did, and the call ran on
    the loop for ever (seen as a flaky Ctrl-C test on a loaded CI machine)."""
    import swiftclient._sync as sync_module

    spawn = sync_module._Loop.submit

    held = _Held()

    def spawn_then_interrupt(self: Any, func: Any) -> Any:
        spawn(self, func)
        assert held.entered.wait(RELEASE_LIMIT)  # the call holds the backend: now Ctrl-C
        raise KeyboardInterrupt

    with fake(Reply(text="fine")) as provider:
        with Client(
            backends={"held": held, "fake": HTTPBackend(provider.base_url, name="fake")},
            retry=NO_RETRY,
        ) as client:
            monkeypatch.setattr(sync_module._Loop, "submit", spawn_then_interrupt)
            with pytest.raises(KeyboardInterrupt):
                with client.stream("hi", model="held/m") as stream:
                    list(stream)
            monkeypatch.undo()
            assert held.released.wait(RELEASE_LIMIT), "the interrupted task runs on"
            assert client.chat("hi", model="fake/m").text == "fine"


_FORK_SCRIPT = """
import os, sys
from swiftclient import Client, ConfigurationError, HTTPBackend

url = sys.argv[1]
client = Client(HTTPBackend(url), model="m")
stream = client.stream("hi")  # stalls after its first chunk
next(stream)  # the first chunk
assert client.chat("hi").text == "Hello there"
pid = os.fork()
if pid == 0:
    try:
        client.chat("hi")
    except ConfigurationError as exc:
        assert "fork" in str(exc), exc
    else:
        sys.exit("the inherited client answered in the child")
    try:  # before, this waited for ever for chunks from the parent's loop
        for _ in stream:
            pass
    except ConfigurationError as exc:
        assert "fork" in str(exc), exc
    else:
        sys.exit("the inherited stream ended in the child")
    with Client(HTTPBackend(url), model="m") as fresh:
        assert fresh.chat("hi").text == "Hello there"
    sys.exit(0)
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, status
stream.close()
assert client.chat("hi").text == "Hello there"
client.close()
print("ok")
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_gets_a_clear_error_and_a_new_client_works() -> None:
    with fake() as provider:
        provider.script(Reply(text="one two three", stall_after=1))
        done = run_script(_FORK_SCRIPT, provider.base_url)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "ok"


# ------------------------------------------------------------------ interrupted set-up and close


def _loop_threads_end(before: set[threading.Thread]) -> bool:
    """Whether every loop thread started since ``before`` ends (within the release limit)."""
    for thread in set(loop_threads()) - before:
        thread.join(RELEASE_LIMIT)
    return set(loop_threads()) <= before


class _Closing:
    """A backend that records its close."""

    name = "closing"

    def __init__(self) -> None:
        self.closed = threading.Event()

    def stream(self, request: object, deadline: object, options: object = None) -> Any:
        raise AssertionError("not called")

    async def complete(self, request: object, deadline: object, options: object = None) -> Any:
        raise AssertionError("not called")

    async def aclose(self) -> None:
        self.closed.set()


@pytest.mark.parametrize("where", ["before the portal", "after the portal", "once entered"])
def test_a_ctrl_c_while_the_client_is_made_leaves_no_thread(
    monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """A Ctrl-C that lands while ``Client(...)`` sets up leaves no loop thread (before, 17
    of 80 interrupts in a fault run each left one running for good) and closes a client it
    had already entered."""
    import swiftclient._sync as sync_module

    result = sync_module._result
    portal_call = BlockingPortal.call

    def interrupted_wait(future: Any) -> Any:
        if where == "after the portal":
            result(future)
        raise KeyboardInterrupt

    def interrupted_call(self: Any, func: Any, *args: Any) -> Any:
        if func is sync_module._loop_and_thread:
            raise KeyboardInterrupt
        return portal_call(self, func, *args)

    if where == "once entered":
        monkeypatch.setattr(BlockingPortal, "call", interrupted_call)
    else:
        monkeypatch.setattr(sync_module, "_result", interrupted_wait)
    before = set(loop_threads())
    backend = _Closing()
    with pytest.raises(KeyboardInterrupt):
        Client(backend)
    monkeypatch.undo()
    assert _loop_threads_end(before)
    assert backend.closed.is_set() == (where == "once entered")


class _FailingClose(_Closing):
    async def aclose(self) -> None:
        self.closed.set()
        raise OSError("the backend could not close")


class _InterruptedAdd:
    def add(self, loop: object) -> None:
        raise KeyboardInterrupt


@pytest.mark.parametrize("where", ["entered, its close failing", "made, not yet registered"])
def test_a_ctrl_c_at_the_end_of_making_the_client_closes_it(
    monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """A review found two more ways to leave the loop running: a backend whose close fails
    while a half-made client is closed (the thread was never stopped, and the caller saw the
    backend's error), and a Ctrl-C after the loop was made but before the client's finalizer
    held it (nothing would ever close it)."""
    import swiftclient._sync as sync_module

    portal_call = BlockingPortal.call

    def interrupted_call(self: Any, func: Any, *args: Any) -> Any:
        if func is sync_module._loop_and_thread:
            raise KeyboardInterrupt
        return portal_call(self, func, *args)

    before = set(loop_threads())
    if where == "entered, its close failing":
        backend: _Closing = _FailingClose()
        monkeypatch.setattr(BlockingPortal, "call", interrupted_call)
    else:
        backend = _Closing()
        monkeypatch.setattr(sync_module, "_LOOPS", _InterruptedAdd())
    with pytest.raises(KeyboardInterrupt) as caught:
        Client(backend)
    monkeypatch.undo()
    assert _loop_threads_end(before)
    assert backend.closed.is_set()
    if isinstance(backend, _FailingClose):
        assert "could not close" in " ".join(getattr(caught.value, "__notes__", []))


def test_a_finished_stream_gives_its_completion_after_the_client_closed() -> None:
    """``final()`` of a stream read to its end is assembled in the caller's thread: it needs
    no loop (before, it raised "this Client is closed" once the client was closed: a fault
    run). A stream left early gives what it had read, as before."""
    with fake(Reply(text="one two three four")) as provider:
        client = Client(HTTPBackend(provider.base_url), model="m")
        with client.stream("hi") as stream:
            chunks = list(stream)
        client.close()
        completion = stream.final()
        assert completion.text == "one two three four"
        assert completion.text == "".join(c.text for c in chunks)
        assert completion.timing is not None and completion.timing.ttft is not None
        assert stream.final() is completion

        provider.script(Reply(text="one two three", stall_after=1))
        with Client(HTTPBackend(provider.base_url), model="m") as client:
            with client.stream("hi") as stream:
                next(iter(stream))
            assert stream.final().text == "one"  # closed early: what had come
        wait_idle(provider)


def test_a_close_cut_short_by_ctrl_c_finishes_when_called_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before, the first close spent the client's finalizer: a second close returned at
    once and the loop thread ran on (a fault run: Ctrl-C during close)."""
    import swiftclient._sync as sync_module

    stop = sync_module._Loop._stop
    calls = 0

    def interrupted_stop(self: Any) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise KeyboardInterrupt
        stop(self)

    before = set(loop_threads())
    backend = _Closing()
    client = Client(backend)
    monkeypatch.setattr(sync_module._Loop, "_stop", interrupted_stop)
    with pytest.raises(KeyboardInterrupt):
        client.close()
    assert backend.closed.is_set() and client.closed
    assert set(loop_threads()) - before  # the thread still runs
    client.close()
    assert calls == 2
    assert _loop_threads_end(before)


# The state an import of aiohttp that a Ctrl-C cut short leaves: its submodules imported, the
# package not. A second import of the package then lacks the submodules as attributes.
_HALF_IMPORTED_AIOHTTP = """
import sys
import aiohttp.client_exceptions
for name in [n for n in sys.modules if n == "aiohttp"]:
    del sys.modules[name]
from swiftclient import HTTPBackend
HTTPBackend("http://127.0.0.1:9")
print("ok")
"""


def test_http_backend_imports_after_an_interrupted_import_of_aiohttp() -> None:
    done = run_script(_HALF_IMPORTED_AIOHTTP)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
