"""Every Python code block of README.md and docs/*.md runs, as a user would paste it.

The convention (docs/testing.md, "Docs that run"): each ```` ```python ```` block is a
complete program, run on its own in a subprocess; a block that defines ``test_``
functions runs under pytest; ``<!-- continues -->`` just before a block joins it to the
previous Python block of the file (run as one program); ``<!-- not run: REASON -->``
skips a block, with its reason. Shell and untagged blocks are not run.

Each program gets the environment the README's "Configure" table names, pointed at one
loopback fake provider shared by the session, and ``SWIFTCLIENT_LOCAL_MODEL`` naming the
embedded model's directory (a real Hugging Face-format model directory), so a snippet
written for a hosted provider or a downloaded checkpoint runs here unchanged.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import pytest

from swiftclient.testing import FakeProvider, Reply

ROOT = Path(__file__).resolve().parent.parent
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
_MARKER = re.compile(r"^<!--\s*(?P<body>.*?)\s*-->$")
_PYTHON = {"python", "py", "python3"}
# A loaded 2-core CI machine imports torch and loads the embedded model in well under this.
SNIPPET_TIMEOUT = 240.0
# Variables that choose a provider: cleared, then set to the fake, for every snippet.
_PROVIDER_VARS = re.compile(
    r"^(SWIFTCLIENT_|OPENAI_|OXLO_|DEEPSEEK_|VLLM_|SGLANG_|OTEL_)|^(HTTPS?|ALL|NO)_PROXY$",
    re.IGNORECASE,
)
FAKE_KEY = "sk-docs-test-key"


@dataclass(frozen=True)
class Block:
    """One fenced code block: where it starts (1-based line of the fence), its language
    (the info string's first word), its text, and the marker comment before it."""

    path: Path
    line: int
    language: str
    code: str
    marker: str | None


@dataclass(frozen=True)
class Snippet:
    """A Python program to run: one block, or a block with the fragments continuing it."""

    blocks: tuple[Block, ...]

    @property
    def id(self) -> str:
        last = self.blocks[-1]
        return f"{last.path.relative_to(ROOT)}:{last.line}"

    @property
    def code(self) -> str:
        return "\n".join(block.code for block in self.blocks)

    @property
    def is_pytest(self) -> bool:
        return re.search(r"^(async )?def test_", self.code, re.MULTILINE) is not None


def extract_blocks(path: Path) -> list[Block]:
    """The fenced code blocks of a Markdown file, in order."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    index = 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        fence = opening["fence"]
        info = opening["info"].strip()
        previous = index - 1
        while previous >= 0 and not lines[previous].strip():
            previous -= 1
        marker = _MARKER.match(lines[previous].strip()) if previous >= 0 else None
        end = index + 1
        while end < len(lines) and not (
            lines[end].startswith(fence[0] * len(fence)) and not lines[end].strip(fence[0])
        ):
            end += 1
        if end == len(lines):
            raise AssertionError(f"{path}:{index + 1}: unclosed code fence")
        blocks.append(
            Block(
                path=path,
                line=index + 1,
                language=info.split()[0].lower() if info else "",
                code="\n".join(lines[index + 1 : end]) + "\n",
                marker=marker["body"] if marker else None,
            )
        )
        index = end + 1
    return blocks


def collect(paths: list[Path]) -> tuple[list[Snippet], list[tuple[Block, str]]]:
    """The programs to run, and the blocks not run with their reasons."""
    snippets: list[Snippet] = []
    skipped: list[tuple[Block, str]] = []
    for path in paths:
        chain: list[Block] = []
        for block in extract_blocks(path):
            if block.language not in _PYTHON:
                continue
            marker = block.marker or ""
            if marker.startswith("not run"):
                reason = marker.partition(":")[2].strip()
                assert reason, f"{path}:{block.line}: `<!-- not run: REASON -->` needs a reason"
                skipped.append((block, reason))
                continue
            if marker == "continues":
                assert chain, f"{path}:{block.line}: `<!-- continues -->` with nothing before"
                chain.append(block)
                snippets[-1] = Snippet(tuple(chain))
                continue
            chain = [block]
            snippets.append(Snippet((block,)))
    return snippets, skipped


SNIPPETS, SKIPPED = collect(DOC_FILES)


def test_markers_are_known() -> None:
    """A misspelled marker would silently run (or join) a block it was meant to change."""
    for path in DOC_FILES:
        for block in extract_blocks(path):
            if block.language in _PYTHON and block.marker is not None:
                assert block.marker == "continues" or block.marker.startswith("not run:"), (
                    f"{path.name}:{block.line}: unknown marker <!-- {block.marker} -->"
                )


def test_the_docs_have_python_snippets() -> None:
    """The extraction finds the blocks (a broken parser must not pass by running none)."""
    files = {snippet.blocks[0].path.name for snippet in SNIPPETS}
    assert {"README.md", "quickstart.md", "streaming.md", "testing.md"} <= files
    assert len(SNIPPETS) >= 20
    assert len(SKIPPED) <= 3, "fragments not run should stay rare: " + str(
        [(block.path.name, block.line, reason) for block, reason in SKIPPED]
    )


def test_markers_join_and_skip_blocks(tmp_path: Path) -> None:
    """The convention as other docs will use it: a fragment joins the block before it, a
    skipped block says why, shell and untagged blocks are not run."""
    doc = tmp_path / "doc.md"
    doc.write_text(
        "```python\nx = 1\n```\n\ntext\n\n<!-- continues -->\n\n```python\nprint(x)\n```\n"
        "<!-- not run: needs a GPU -->\n```python\nimport cuda\n```\n"
        "```sh\nmake test\n```\n````\n```python\nnot code\n```\n````\n"
        "```python\nimport pytest\n\n\ndef test_it() -> None:\n    pass\n```\n",
        encoding="utf-8",
    )
    snippets, skipped = collect([doc])
    assert [snippet.code for snippet in snippets] == [
        "x = 1\n\nprint(x)\n",
        "import pytest\n\n\ndef test_it() -> None:\n    pass\n",
    ]
    assert [(s.blocks[0].line, s.blocks[-1].line, s.is_pytest) for s in snippets] == [
        (1, 9, False),
        (24, 24, True),
    ]
    assert [(block.line, reason) for block, reason in skipped] == [(13, "needs a GPU")]


@pytest.mark.parametrize("snippet", SNIPPETS, ids=[snippet.id for snippet in SNIPPETS])
def test_snippet_compiles(snippet: Snippet) -> None:
    """No top-level ``await``, no syntax error: a quick check before running anything."""
    compile(snippet.code, snippet.id, "exec", dont_inherit=True)


@pytest.fixture(scope="session")
def fake_provider() -> Iterator[FakeProvider]:
    """One fake provider for every snippet: a short text reply to any request."""
    with FakeProvider(Reply(text="Hello from the fake provider.")).run_in_thread() as fake:
        yield fake


@pytest.fixture(scope="session")
def snippet_env(fake_provider: FakeProvider) -> dict[str, str]:
    """The environment of every snippet: the documented variables, aimed at the fake."""
    from local_engine.default_model import find_default_model

    env = {name: value for name, value in os.environ.items() if not _PROVIDER_VARS.match(name)}
    env.update(
        SWIFTCLIENT_BASE_URL=fake_provider.base_url,
        SWIFTCLIENT_API_KEY=FAKE_KEY,
        SWIFTCLIENT_MODEL="fake-model",
        SWIFTCLIENT_LOCAL_MODEL=str(find_default_model()),
        OPENAI_BASE_URL=fake_provider.base_url,
        OPENAI_API_KEY=FAKE_KEY,
        OXLO_API_KEY=FAKE_KEY,
        DEEPSEEK_API_KEY=FAKE_KEY,
        NO_PROXY="*",
        PYTHONPATH=os.pathsep.join(
            [str(ROOT / "src"), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
        ),
    )
    return env


def run_snippet(snippet: Snippet, env: dict[str, str], directory: Path) -> str | None:
    """Run one snippet in ``directory``; None when it exits cleanly, else what went wrong."""
    if snippet.is_pytest:
        script = directory / "test_snippet.py"
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "error"]
        command += [str(script)]
    else:
        script = directory / "snippet.py"
        command = [sys.executable, "-W", "error", str(script)]
    script.write_text(snippet.code, encoding="utf-8")
    try:
        done = subprocess.run(
            command,
            cwd=directory,
            env=env,
            capture_output=True,
            text=True,
            timeout=SNIPPET_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        return f"{snippet.id} ran over {SNIPPET_TIMEOUT} s\n--- stderr\n{exc.stderr!r}"
    if done.returncode == 0:
        return None
    return (
        f"{snippet.id} exited with {done.returncode}\n--- code\n{snippet.code}\n"
        f"--- stdout\n{done.stdout[-4000:]}\n--- stderr\n{done.stderr[-4000:]}"
    )


@pytest.fixture(scope="session")
def snippet_runs(
    request: pytest.FixtureRequest,
    snippet_env: dict[str, str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, Future[str | None]]]:
    """Start every selected snippet at once, as many at a time as there are CPUs (each is a
    process of its own with its own directory; the shared fake provider is stateless for
    them), so the docs cost the suite their longest snippet per CPU, not their sum."""
    selected = [
        cast(Snippet, item.callspec.params["snippet"])
        for item in request.session.items
        if isinstance(item, pytest.Function) and item.originalname == "test_snippet_runs"
    ]
    with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
        futures = {
            snippet.id: pool.submit(
                run_snippet, snippet, snippet_env, tmp_path_factory.mktemp("snippet")
            )
            for snippet in selected
        }
        try:
            yield futures
        finally:
            for future in futures.values():
                future.cancel()


@pytest.mark.parametrize("snippet", SNIPPETS, ids=[snippet.id for snippet in SNIPPETS])
def test_snippet_runs(snippet: Snippet, snippet_runs: dict[str, Future[str | None]]) -> None:
    """The snippet, pasted into a file, runs to a clean exit with warnings as errors."""
    failure = snippet_runs[snippet.id].result()
    assert failure is None, failure


def test_quickstart_quotes_the_error_of_a_preset_without_its_key() -> None:
    """docs/quickstart.md quotes what `preset("oxlo")` raises without OXLO_API_KEY."""
    from swiftclient.errors import ConfigurationError
    from swiftclient.providers import preset

    with pytest.raises(ConfigurationError) as caught:
        preset("oxlo", environ={})
    quickstart = " ".join((ROOT / "docs" / "quickstart.md").read_text(encoding="utf-8").split())
    assert f"ConfigurationError: {caught.value}" in quickstart


def _layout_modules(text: str) -> list[str]:
    """The module paths the Layout block of docs/architecture.md lists, in order: each
    indented line's first word under a ``src/swiftclient/`` or ``local_engine/`` heading."""
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    listed: list[str] = []
    root = ""
    for line in block.splitlines():
        if not line.strip():
            continue
        if not line.startswith(" "):
            head = line.split()[0]
            root = head if head in ("src/swiftclient/", "local_engine/") else ""
        elif root and line.split()[0].endswith(".py"):
            listed.append(root + line.split()[0])
    return listed


def test_the_architecture_layout_lists_every_module_once() -> None:
    listed = _layout_modules((ROOT / "docs" / "architecture.md").read_text(encoding="utf-8"))
    tree = [
        path.relative_to(ROOT).as_posix()
        for base in (ROOT / "src" / "swiftclient", ROOT / "local_engine")
        for path in base.rglob("*.py")
    ]
    assert sorted(listed) == sorted(set(listed)), "listed twice"
    assert set(listed) == set(tree), (
        f"missing: {sorted(set(tree) - set(listed))}; gone: {sorted(set(listed) - set(tree))}"
    )
