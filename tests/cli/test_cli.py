"""The command line as a new user meets it: chat, models, serve, help, errors, Ctrl-C.

Each test named after a bug found by trying the old command line as a new user would
(issue 11) failed on it.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
from importlib.metadata import version
from typing import Any

import click
import pytest

from swiftclient.cli import cli, main
from swiftclient.testing import FakeProvider, Reply

from .helpers import LIMIT, clear_provider_env, run, spawn


def err_lines(text: str) -> list[str]:
    """The non-empty lines of what a command wrote to stderr."""
    return [line for line in text.splitlines() if line.strip()]


def test_version_prints_the_installed_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"swiftclient, version {version('swiftclient-llm')}"


def test_every_option_has_help_and_every_command_an_example(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from local_engine.server import command as serve_command

    assert set(cli.commands) == {"chat", "bench", "serve", "models"}
    for name, cmd in cli.commands.items():
        real = serve_command if name == "serve" else cmd
        for param in real.params:
            if isinstance(param, click.Option) and not param.hidden:
                assert param.help, f"{name} {param.opts} has no help text"
        assert main([name, "--help"]) == 0
        text = capsys.readouterr().out
        assert text.startswith(f"Usage: swiftclient {name} "), text[:80]
        examples = text.split("Examples:", 1)[1]
        assert f"swiftclient {name} " in examples
    assert main(["--help"]) == 0
    top = capsys.readouterr().out
    for name in cli.commands:
        assert f"  {name} " in top


def test_serve_takes_every_engine_flag_and_passes_them_on(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import local_engine.server as server

    assert main(["serve", "--help"]) == 0
    help_text = capsys.readouterr().out
    assert "python -m local_engine" not in help_text  # the engine's own usage line
    flags = {opt for p in server.command.params for opt in p.opts if opt.startswith("--")}
    assert {"--kv-cache-mib", "--dtype", "--max-num-seqs", "--quantization"} <= flags
    for flag in flags:
        assert flag in help_text
    built: list[Any] = []

    class Server:
        def run(self) -> None:
            pass

    def build(args: Any) -> Server:
        built.append(args)
        return Server()

    monkeypatch.setattr(server, "_build", build)
    argv = ["serve", "some-dir", "--kv-cache-mib", "16", "--max-num-seqs", "3", "--dtype"]
    assert main([*argv, "bfloat16", "--port", "0"]) == 0
    (args,) = built
    assert (args.model_dir, args.kv_cache_mib, args.max_num_seqs) == ("some-dir", 16, 3)
    assert (args.dtype, args.port) == ("bfloat16", 0)
    # python -m local_engine.server is the same command under its own name
    assert server.main(["--kv-cache-mib", "8"]) == 0
    assert built[-1].kv_cache_mib == 8


def test_usage_errors_are_one_line_with_status_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--no-such-flag"]) == 2
    (line,) = err_lines(capsys.readouterr().err)
    assert line.startswith("swiftclient serve: error: No such option")
    assert line.endswith("--no-such-flag' (see `swiftclient serve --help`)")
    assert main(["bench", "-c", "0"]) == 2
    lines = err_lines(capsys.readouterr().err)
    assert len(lines) == 1 and "--concurrency" in lines[0]


def test_unconfigured_error_names_the_flags_not_the_python_api(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    clear_provider_env(monkeypatch)
    for cmd in ("chat", "bench", "models"):
        assert main([cmd, "hello"] if cmd == "chat" else [cmd]) == 2
        (line,) = err_lines(capsys.readouterr().err)
        assert line.startswith("swiftclient: error: no backend configured")
        assert "--base-url" in line and "--backend" in line and "--local" in line
        assert "AsyncClient" not in line and "backend=" not in line
        # every preset is named (the list once missed anthropic, gemini and azure)
        assert all(name in line for name in ("anthropic", "gemini", "azure", "local"))


def test_a_missing_model_says_which_flag_to_pass(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    clear_provider_env(monkeypatch)
    assert main(["chat", "--base-url", "http://127.0.0.1:9/v1", "hi"]) == 2
    (line,) = err_lines(capsys.readouterr().err)
    assert "--model" in line and "swiftclient models" in line


@pytest.mark.parametrize("variable", ["SWIFTCLIENT_API_KEY", "OPENAI_API_KEY"])
def test_base_url_takes_the_key_from_the_environment(
    variable: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """As --help says: --base-url's key defaults to $SWIFTCLIENT_API_KEY, else
    $OPENAI_API_KEY (it sent none, and a server with a key answered 401)."""
    clear_provider_env(monkeypatch)
    monkeypatch.setenv(variable, "sk-env-key-123")
    provider = FakeProvider(Reply(text="hello back"), api_key="sk-env-key-123")
    with provider.run_in_thread() as fake:
        assert main(["models", "--base-url", fake.base_url]) == 0
        assert main(["chat", "--base-url", fake.base_url, "-m", "m", "hi"]) == 0
    assert "hello back" in capsys.readouterr().out


def test_the_local_provider_from_the_environment_refuses_a_base_url(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``SWIFTCLIENT_PROVIDER=local`` with ``--base-url`` answered from the local engine."""
    clear_provider_env(monkeypatch)
    monkeypatch.setenv("SWIFTCLIENT_PROVIDER", "local")
    assert main(["chat", "--base-url", "http://127.0.0.1:9/v1", "hi"]) == 2
    (line,) = err_lines(capsys.readouterr().err)
    assert "--base-url has no use" in line and "SWIFTCLIENT_PROVIDER=local" in line


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--local", "--backend", "openai"], "--local and --backend openai"),
        (["--backend", "openai", "--local"], "--local and --backend openai"),
        (["--local", "--base-url", "http://127.0.0.1:9/v1"], "--base-url"),
        (["--backend", "local", "--base-url", "http://127.0.0.1:9/v1"], "--base-url"),
    ],
)
def test_flags_that_name_two_targets_are_a_usage_error(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """One of them was silently ignored (the last --local/--backend won; --base-url was
    dropped beside --local)."""
    clear_provider_env(monkeypatch)
    for cmd in (["chat", *argv, "hi"], ["models", *argv], ["bench", *argv, "--requests", "1"]):
        assert main(cmd) == 2, cmd
        (line,) = err_lines(capsys.readouterr().err)
        assert line.startswith("swiftclient: error: ") and says in line, line


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["serve", "--max-tokens-limit", "0"], "'--max-tokens-limit': 0 is not in the range"),
        (["serve", "--kv-cache-mib", "0"], "'--kv-cache-mib'"),
        (["serve", "--timeout-write", "-1"], "'--timeout-write'"),
        (["chat", "--local", "--timeout", "0", "hi"], "'--timeout'"),
        (["bench", "--local", "--duration", "0ms"], "'--duration'"),
        (
            ["bench", "--base-url", "http://127.0.0.1:9/v1", "-m", "m", "--hedge", "abc"],
            "'--hedge'",
        ),
        (["bench", "--local", "--compare", "--hedge 5parsecs"], "'--hedge'"),
        (["chat", "--base-url", "notaurl", "-m", "m", "hi"], "--base-url must be an absolute"),
        (["chat", "--backend", "openai", "-m", "x", "hi"], "pass --api-key or set"),
    ],
)
def test_bad_values_are_usage_errors_naming_the_flag(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """As docs/cli.md promises; they named the library's arguments (``default_max_tokens``,
    ``Timeout.total``, ``api_key=``), or ended in an unexpected AssertionError."""
    clear_provider_env(monkeypatch)
    assert main(argv) == 2
    (line,) = err_lines(capsys.readouterr().err)
    assert line.startswith("swiftclient") and says in line, line


def test_a_host_no_resolver_knows_is_a_usage_error_naming_host(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``serve --host 999.1.1.1`` exited 1 ("cannot serve on ..."), as a server failure; the
    flag is what to fix. (The bind's error is raised here: no name is looked up.)"""
    import socket

    import local_engine.server as server

    class Unresolved:
        def run(self) -> None:
            raise OSError(socket.EAI_NONAME, "Name or service not known")

    class Busy:
        def run(self) -> None:
            raise OSError(98, "Address already in use")

    for built, status, says in ((Unresolved, 2, "'--host'"), (Busy, 1, "cannot serve on")):
        monkeypatch.setattr(server, "_build", lambda args, built=built: built())
        assert main(["serve", "--host", "999.1.1.1", "--no-access-log"]) == status
        (line,) = err_lines(capsys.readouterr().err)
        assert says in line, line


def test_chat_without_a_model_uses_the_only_one_the_backend_lists(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 22: it failed with "no model given" though /v1/models listed one model."""
    clear_provider_env(monkeypatch)
    with FakeProvider(Reply(text="hello back"), model="only-model").run_in_thread() as fake:
        assert main(["chat", "--base-url", fake.base_url, "hi"]) == 0
        monkeypatch.setenv("SWIFTCLIENT_BASE_URL", fake.base_url)  # configured otherwise
        assert main(["chat", "--json", "hi"]) == 0
        chats = [r.body for r in fake.requests if r.path.endswith("/chat/completions")]
    assert [body["model"] for body in chats] == ["only-model", "only-model"]
    captured = capsys.readouterr()
    assert captured.out.startswith("hello back\n")
    notes = [line for line in err_lines(captured.err) if "only-model" in line]
    assert notes == [
        f"swiftclient: no model given; using only-model, the only one {fake.base_url} lists",
        "swiftclient: no model given; using only-model, the only one the backend configured "
        "in the environment lists",
    ]


def test_chat_without_a_model_names_the_models_when_the_backend_lists_several(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    clear_provider_env(monkeypatch)
    with FakeProvider(models=["small", "large"]).run_in_thread() as fake:
        assert main(["chat", "--base-url", fake.base_url, "hi"]) == 2
        (line,) = err_lines(capsys.readouterr().err)
        fake.models = []
        assert main(["chat", "--base-url", fake.base_url, "hi"]) == 2
        (none,) = err_lines(capsys.readouterr().err)
        assert not [r for r in fake.requests if r.path.endswith("/chat/completions")]
    assert line == (
        "swiftclient: error: no model given: pass --model NAME or set SWIFTCLIENT_MODEL; "
        "the backend lists 2 models: small, large"
    )
    assert none.endswith("(the backend lists no model)")


@pytest.mark.parametrize(
    ("argv", "env"),
    [
        (["chat", "--local", "hello"], {}),
        (["chat", "--provider", "local", "hello"], {}),
        (["chat", "--backend", "local", "hello"], {}),
        (["chat", "hello"], {"SWIFTCLIENT_PROVIDER": "local"}),
    ],
    ids=["--local", "--provider", "--backend", "SWIFTCLIENT_PROVIDER"],
)
def test_the_local_engine_needs_no_model_and_reads_the_prompt_as_a_prompt(
    argv: list[str],
    env: dict[str, str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clear_provider_env(monkeypatch)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    # Greedy: sampled at temperature 1, the trained default model's reply to a prompt it
    # never saw can be the end token alone (no content, so no first token to time).
    assert main([*argv, "--max-tokens", "3", "--temperature", "0", "--json"]) == 0
    captured = capsys.readouterr()
    body = json.loads(captured.out)
    assert body["model"] == "default"
    assert body["usage"]["prompt_tokens"] > 1 and body["usage"]["completion_tokens"] >= 1
    assert body["timing"]["ttft"] > 0
    assert err_lines(captured.err)[-1].startswith("[ttft ")


def test_chat_streams_with_a_system_prompt_and_ends_with_a_timing_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    clear_provider_env(monkeypatch)
    with FakeProvider(Reply(text="one two three four")).run_in_thread() as fake:
        argv = ["chat", "--base-url", fake.base_url, "-m", "m", "--system", "be brief", "hi"]
        assert main(argv) == 0
        body = fake.requests[-1].body
    captured = capsys.readouterr()
    assert captured.out == "one two three four\n"
    assert body["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
    ]
    assert body["stream"] is True and body["model"] == "m"
    (line,) = err_lines(captured.err)
    assert line.startswith("[ttft ") and "itl p50" in line and "tok/s" in line
    assert "4 tokens in" in line


def test_piped_stdin_is_the_prompt(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    clear_provider_env(monkeypatch)
    monkeypatch.setattr("sys.stdin", io.StringIO("What is in this file?\nline two\n"))
    with FakeProvider().run_in_thread() as fake:
        assert main(["chat", "--base-url", fake.base_url, "-m", "m"]) == 0
        messages = fake.requests[-1].body["messages"]
    assert messages == [{"role": "user", "content": "What is in this file?\nline two"}]
    monkeypatch.setattr("sys.stdin", io.StringIO("  \n"))
    assert main(["chat", "--base-url", "http://127.0.0.1:9/v1", "-m", "m"]) == 2
    assert "no prompt" in capsys.readouterr().err
    # an empty argument is no prompt either (it sent an empty message)
    assert main(["chat", "--base-url", "http://127.0.0.1:9/v1", "-m", "m", " "]) == 2
    assert "no prompt: the PROMPT argument is empty" in capsys.readouterr().err


def test_a_temperature_out_of_range_names_its_flag(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    clear_provider_env(monkeypatch)
    for command in ("chat", "bench"):
        argv = [command, "--base-url", "http://127.0.0.1:9/v1", "-m", "m", "--temperature", "-3"]
        assert main([*argv, "hi"] if command == "chat" else argv) == 2
        assert "Invalid value for '--temperature'" in capsys.readouterr().err


def test_json_prints_the_completion_and_its_timing(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    clear_provider_env(monkeypatch)
    with FakeProvider(Reply(text="a b c", ttft=0.05)).run_in_thread() as fake:
        assert main(["chat", "--base-url", fake.base_url, "-m", "m", "--json", "hi"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["choices"][0]["message"]["content"] == "a b c"
    assert body["usage"]["completion_tokens"] == 3
    assert body["timing"]["ttft"] >= 0.05 - 0.001 and len(body["timing"]["itl"]) == 2


def test_api_errors_are_one_line_unless_debug(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    clear_provider_env(monkeypatch)
    reply = Reply(status=404, error_message="The model does not exist.")
    with FakeProvider(reply).run_in_thread() as fake:
        assert main(["chat", "--base-url", fake.base_url, "-m", "nope", "hi"]) == 1
        (line,) = err_lines(capsys.readouterr().err)
        assert line.startswith("swiftclient: error: NotFoundError: ")
        assert "The model does not exist." in line
        assert main(["--debug", "chat", "--base-url", fake.base_url, "-m", "nope", "hi"]) == 1
        err = capsys.readouterr().err
        assert "Traceback (most recent call last)" in err
        assert err_lines(err)[-1] == line
        # after the subcommand too, as docs/cli.md says every subcommand takes it (it was a
        # usage error, "No such option '--debug'")
        assert main(["chat", "--base-url", fake.base_url, "--debug", "-m", "nope", "hi"]) == 1
        err = capsys.readouterr().err
        assert "Traceback (most recent call last)" in err
        assert err_lines(err)[-1] == line
        # the value of an option stays its value: the model named "--debug", no traceback
        assert main(["chat", "--base-url", fake.base_url, "-m", "--debug", "hi"]) == 1
        err = capsys.readouterr().err
        assert "Traceback" not in err
        assert fake.requests[-1].body["model"] == "--debug"


def test_a_reply_that_breaks_off_ends_its_line_before_the_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The streamed text is left on a line of its own: on a terminal the error read
    ``...tok1swiftclient: error: ...``."""
    clear_provider_env(monkeypatch)
    with FakeProvider(Reply(tokens=5, error_event_after=2)).run_in_thread() as fake:
        assert main(["chat", "--base-url", fake.base_url, "-m", "m", "hi"]) == 1
    captured = capsys.readouterr()
    assert captured.out == "tok0 tok1\n"
    assert err_lines(captured.err)[-1].startswith("swiftclient: error: ")


def test_an_empty_reply_cut_by_the_token_limit_says_so(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reply that reached ``--max-tokens`` before any text printed an empty line and
    nothing else to explain it."""
    clear_provider_env(monkeypatch)
    with FakeProvider(Reply(text="", finish_reason="length")).run_in_thread() as fake:
        assert main(["chat", "--base-url", fake.base_url, "-m", "m", "hi"]) == 0
    err = capsys.readouterr().err
    assert "token limit before any text; raise --max-tokens" in err


def test_a_reply_cut_by_the_token_limit_after_some_text_says_so(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--max-tokens 1`` printed "Hello" with nothing to say the reply was cut short."""
    clear_provider_env(monkeypatch)
    with FakeProvider(Reply(text="Hello", finish_reason="length")).run_in_thread() as fake:
        assert main(["chat", "--base-url", fake.base_url, "-m", "m", "hi"]) == 0
    captured = capsys.readouterr()
    assert captured.out == "Hello\n"
    assert "[the reply was cut off at its token limit; raise --max-tokens]" in captured.err
    with FakeProvider(Reply(text="Hello")).run_in_thread() as fake:
        assert main(["chat", "--base-url", fake.base_url, "-m", "m", "hi"]) == 0
    assert "token limit" not in capsys.readouterr().err
    # --json too: stdout holds the document alone, stderr the notice (it said nothing)
    with FakeProvider(Reply(text="Hello", finish_reason="length")).run_in_thread() as fake:
        assert main(["chat", "--base-url", fake.base_url, "-m", "m", "--json", "hi"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["choices"][0]["finish_reason"] == "length"
    assert "[the reply was cut off at its token limit; raise --max-tokens]" in captured.err


def test_a_missing_key_is_named_as_the_problem_with_no_model_given_too(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no -m, a key the server refuses read as "no model given" (exit 2); the key is
    what to fix, as on any call (exit 1), and the error says how to pass one."""
    clear_provider_env(monkeypatch)
    with FakeProvider(api_key="sk-right-key-123").run_in_thread() as fake:
        for argv in (
            ["chat", "--base-url", fake.base_url, "hi"],
            ["chat", "--base-url", fake.base_url, "-m", "m", "hi"],
        ):
            assert main(argv) == 1
            (line,) = err_lines(capsys.readouterr().err)
            assert line.startswith("swiftclient: error: AuthenticationError: "), line
            assert "--api-key" in line and "SWIFTCLIENT_API_KEY" in line and "no model" not in line


def test_models_lists_what_the_backend_offers(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    clear_provider_env(monkeypatch)
    with FakeProvider(model="fake-model-x").run_in_thread() as fake:
        assert main(["models", "--base-url", fake.base_url]) == 0
        assert capsys.readouterr().out == "fake-model-x\n"
        monkeypatch.setenv("SWIFTCLIENT_BASE_URL", fake.base_url)
        assert main(["models", "--json"]) == 0
        assert json.loads(capsys.readouterr().out) == ["fake-model-x"]
    assert main(["models", "--local"]) == 0
    assert capsys.readouterr().out.strip()


def test_interactive_chat_keeps_history(monkeypatch: pytest.MonkeyPatch) -> None:
    clear_provider_env(monkeypatch)
    with FakeProvider(Reply(text="first answer")).run_in_thread() as fake:
        fake.script(Reply(text="first answer"), Reply(text="second answer"))
        done = run(
            "chat", "--base-url", fake.base_url, "-m", "m", "-i", "--system", "sys",
            input="hello\n\nand again\n",
        )  # fmt: skip
        bodies = [r.body for r in fake.requests]
    assert done.returncode == 0, done.stderr
    assert done.stdout == "first answer\nsecond answer\n"
    assert [len(b["messages"]) for b in bodies] == [2, 4]
    assert bodies[1]["messages"] == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "first answer"},
        {"role": "user", "content": "and again"},
    ]
    assert sum(line.startswith("[ttft ") for line in done.stderr.splitlines()) == 2


def test_interactive_chat_reports_a_failed_turn_and_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A turn the backend refuses (a prompt over the model's context, say) is reported on
    stderr and left out of the history; the conversation goes on (it used to end, exit 1)."""
    clear_provider_env(monkeypatch)
    refused = Reply(status=400, error_message="the prompt is 2069 tokens, over the context")
    with FakeProvider(Reply(text="x")).run_in_thread() as fake:
        fake.script(Reply(text="first answer"), refused, Reply(text="third answer"))
        done = run(
            "chat", "--base-url", fake.base_url, "-m", "m", "-i",
            input="hello\ntoo long\nand again\n",
        )  # fmt: skip
        bodies = [r.body for r in fake.requests]
    assert done.returncode == 0, done.stderr
    assert done.stdout == "first answer\nthird answer\n"
    assert [m["content"] for m in bodies[2]["messages"]] == ["hello", "first answer", "and again"]
    (error,) = [line for line in done.stderr.splitlines() if "error" in line]
    assert error.startswith("swiftclient: error: BadRequestError: ")
    assert "2069 tokens" in error and error.endswith("(this turn was not kept; /exit quits)")


def _first_output(process: subprocess.Popen[str]) -> str:
    assert process.stdout is not None
    return process.stdout.read(1)


def test_ctrl_c_during_a_stream_exits_130_with_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    with FakeProvider(Reply(tokens=20, stall_after=1)).run_in_thread() as fake:
        with spawn("chat", "--base-url", fake.base_url, "-m", "m", "hi") as process:
            assert _first_output(process) == "t"  # the reply is streaming: "tok0"
            process.send_signal(signal.SIGINT)
            _, err = process.communicate(timeout=LIMIT)
    assert process.returncode == 130
    assert "Traceback" not in err
    assert err_lines(err) == ["swiftclient: interrupted"]


def test_ctrl_c_in_a_conversation_stops_the_reply_not_the_program() -> None:
    with FakeProvider(Reply(text="after the stop")).run_in_thread() as fake:
        fake.script(Reply(tokens=20, stall_after=1))
        argv = ("chat", "--base-url", fake.base_url, "-m", "m", "-i")
        with spawn(*argv, stdin=subprocess.PIPE) as process:
            assert process.stdin is not None
            process.stdin.write("first\n")
            process.stdin.flush()
            assert _first_output(process) == "t"
            process.send_signal(signal.SIGINT)
            out, err = process.communicate("second\n", timeout=LIMIT)
        last = fake.requests[-1].body
    assert process.returncode == 0, err
    assert "[reply stopped]" in err and "Traceback" not in err
    assert out.endswith("after the stop\n")
    # the stopped turn left no trace in the history
    assert last["messages"] == [{"role": "user", "content": "second"}]


def test_a_reader_that_goes_away_ends_the_command_quietly() -> None:
    with FakeProvider(Reply(tokens=200)).run_in_thread() as fake:
        with spawn("chat", "--base-url", fake.base_url, "-m", "m", "hi") as process:
            assert process.stdout is not None and process.stderr is not None
            process.stdout.close()  # as `| head -0` would
            err = process.stderr.read()
            process.stderr.close()
            assert process.wait(timeout=LIMIT) == 1  # click's convention for a broken pipe
    assert err == ""


def test_ctrl_c_while_a_reply_is_starting_is_held_back_until_it_can_be_stopped() -> None:
    # The reply's task may print before start_task_soon returns; a Ctrl-C in that moment
    # must not escape as a KeyboardInterrupt with no future to cancel (it exited with 130).
    from concurrent.futures import Future

    from swiftclient.cli._chat import _start_turn

    started: Future[object] = Future()

    class Portal:
        def start_task_soon(self, func: object, *args: object) -> Future[object]:
            os.kill(os.getpid(), signal.SIGINT)  # arrives while the task is being started
            return started

    class Conversation:
        async def turn(self, prompt: str) -> None:
            raise AssertionError("the fake portal never runs it")

    future, stopped = _start_turn(Portal(), Conversation(), "hi")  # type: ignore[arg-type]
    assert future is started and stopped
    # The usual handler is back: a later Ctrl-C interrupts as before.
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_builtin_tools_are_offered_run_and_answered(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--builtin-tools``: the three definitions go with every request; a reply's calls are
    run here (one of them fails and is answered with its error) and sent back, and the
    model's answer after them is the reply."""
    clear_provider_env(monkeypatch)
    calls = [("get_weather", {"city": "Paris"}), ("calculator", {"expression": "2 ** 3"})]
    with FakeProvider().run_in_thread() as fake:
        fake.script(Reply(tool_calls=calls), Reply(text="It is cloudy in Paris."))
        argv = ["chat", "--base-url", fake.base_url, "-m", "m", "--builtin-tools", "Paris?"]
        assert main(argv) == 0
        bodies = [r.body for r in fake.requests]
    captured = capsys.readouterr()
    assert captured.out == "It is cloudy in Paris.\n"
    assert len(bodies) == 2
    # in their own order, which the embedded model knows (served by `swiftclient serve`, it
    # answered nonsense to the canonical order, sorted by name)
    names = ["get_weather", "convert_units", "calculator"]
    assert [[t["function"]["name"] for t in b["tools"]] for b in bodies] == [names, names]
    first_id, second_id = (c["id"] for c in bodies[1]["messages"][1]["tool_calls"])
    user, assistant, weather, calculator = bodies[1]["messages"]
    assert user == {"role": "user", "content": "Paris?"}
    assert assistant["role"] == "assistant" and len(assistant["tool_calls"]) == 2
    assert weather["tool_call_id"] == first_id and calculator["tool_call_id"] == second_id
    assert json.loads(weather["content"])["city"] == "Paris"
    assert "error" in json.loads(calculator["content"])
    lines = err_lines(captured.err)
    assert lines[1].startswith('[tool] get_weather({"city": "Paris"}) -> {"city": "Paris"')
    assert lines[2].startswith('[tool] calculator({"expression": "2 ** 3"}) -> {"error": ')
    assert lines[0].startswith("[ttft ") and lines[-1].startswith("[ttft ") and len(lines) == 4


def test_builtin_tools_stop_after_the_round_limit(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model that keeps calling tools is asked once more without them, so a turn ends."""
    from swiftclient.cli._chat import MAX_TOOL_ROUNDS

    clear_provider_env(monkeypatch)
    call = [("calculator", {"expression": "1 + 1"})]
    with FakeProvider().run_in_thread() as fake:
        fake.script(*[Reply(tool_calls=call)] * MAX_TOOL_ROUNDS, Reply(text="2"))
        argv = ["chat", "--base-url", fake.base_url, "-m", "m", "--builtin-tools", "1+1?"]
        assert main(argv) == 0
        bodies = [r.body for r in fake.requests]
    assert capsys.readouterr().out == "2\n"
    assert len(bodies) == MAX_TOOL_ROUNDS + 1
    assert all("tools" in b for b in bodies[:-1]) and "tools" not in bodies[-1]
    assert len(bodies[-1]["messages"]) == 1 + 2 * MAX_TOOL_ROUNDS


def test_builtin_tools_do_not_run_a_call_cut_at_the_token_limit(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reply that ended at ``max_tokens`` inside a call (``finish_reason`` "length") is not
    run with arguments the model never finished: stderr says why, and the turn ends."""
    clear_provider_env(monkeypatch)
    call = [("get_weather", {"city": "Pa"})]
    with FakeProvider().run_in_thread() as fake:
        fake.script(Reply(tool_calls=call, finish_reason="length"), Reply(text="unused"))
        argv = ["chat", "--base-url", fake.base_url, "-m", "m", "--builtin-tools", "Paris?"]
        assert main(argv) == 0
        assert len(fake.requests) == 1
    lines = err_lines(capsys.readouterr().err)
    assert not any(line.startswith("[tool] get_weather(") for line in lines)
    assert any("not run" in line and "get_weather" in line for line in lines), lines
    # with --json the cut reply is the document on stdout (stdout was empty)
    with FakeProvider().run_in_thread() as fake:
        fake.script(Reply(tool_calls=call, finish_reason="length"))
        argv = ["chat", "--base-url", fake.base_url, "-m", "m", "--builtin-tools", "--json", "?"]
        assert main(argv) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["choices"][0]["finish_reason"] == "length"


def test_builtin_tools_without_the_local_extra_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from swiftclient import providers

    clear_provider_env(monkeypatch)
    monkeypatch.setattr(providers, "entry_points", lambda **kwargs: [])
    argv = ["chat", "--base-url", "http://127.0.0.1:9/v1", "-m", "m", "--builtin-tools", "hi"]
    assert main(argv) == 2
    (line,) = err_lines(capsys.readouterr().err)
    assert "local" in line and "extra" in line


def test_builtin_tools_with_json_print_one_document_the_answer(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    clear_provider_env(monkeypatch)
    with FakeProvider().run_in_thread() as fake:
        fake.script(Reply(tool_calls=[("get_weather", {"city": "Oslo"})]), Reply(text="Cold."))
        argv = ["chat", "--base-url", fake.base_url, "-m", "m", "--builtin-tools", "--json", "?"]
        assert main(argv) == 0
    captured = capsys.readouterr()
    body = json.loads(captured.out)  # one document: the answer after the tool round
    assert body["choices"][0]["message"]["content"] == "Cold."
    assert any(line.startswith("[tool] get_weather(") for line in err_lines(captured.err))
