"""Packages depend one way: ``local_engine`` uses swiftclient's public contract only, and
swiftclient never imports ``local_engine`` (it finds the engine through entry points).

Checked on the source with ``ast``, so an import inside a function, under ``TYPE_CHECKING``
or in a module no test imports is caught as well. The engine core (everything but the
OpenAI-compatible layer: service, server, backend adapter and the chat formatting and
telemetry they use) does not depend on swiftclient at all: each core module is imported in
a fresh interpreter where importing swiftclient fails. Inside swiftclient, modules import
each other without a cycle, lazy imports included (imports for annotations only, under
``TYPE_CHECKING``, do not count).
"""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
from collections.abc import Iterator
from importlib.metadata import entry_points
from pathlib import Path

import pytest

import swiftclient
import swiftclient.extend
from swiftclient import cli, providers
from swiftclient.cli._common import TargetOptions, build_target
from swiftclient.errors import ConfigurationError
from swiftclient.providers import from_env, local_server, preset

ROOT = Path(__file__).resolve().parents[1]
ENGINE = ROOT / "local_engine"
CLIENT = ROOT / "src" / "swiftclient"

# Uses of swiftclient internals that another change removes, with the reason. Each entry
# must still be found (the test fails once it is gone, so the entry is deleted with it).
PENDING: dict[tuple[str, str], str] = {}


def _modules(root: Path) -> list[Path]:
    found = sorted(root.rglob("*.py"))
    assert found, root
    return found


def _relative(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _imports(tree: ast.AST) -> Iterator[tuple[ast.AST, str, list[str]]]:
    """(node, absolute module, names imported from it) for every import in ``tree``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node, alias.name, []
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node, node.module, [alias.name for alias in node.names]


def _dynamic_imports(tree: ast.AST) -> Iterator[tuple[ast.AST, str]]:
    """``importlib.import_module("x")`` / ``__import__("x")`` calls with a literal name."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        first = node.args[0]
        if name in ("import_module", "__import__") and isinstance(first, ast.Constant):
            if isinstance(first.value, str):
                yield node, first.value


def _private(module: str) -> bool:
    return any(part.startswith("_") for part in module.split("."))


def _public_name(module: str, name: str) -> bool:
    """``name`` is part of ``module``'s public surface: in its ``__all__``, or a public
    submodule of it."""
    if name.startswith("_"):
        return False
    exported = getattr(importlib.import_module(module), "__all__", None)
    if exported is not None and name in exported:
        return True
    try:
        importlib.import_module(f"{module}.{name}")
    except ModuleNotFoundError:
        return False
    return True


def _engine_violations(source: str, label: str) -> list[tuple[str, str]]:
    """(what, detail) for each use of swiftclient beyond its public contract in ``source``
    (the text of the module ``label``)."""
    tree = ast.parse(source, filename=label)
    found: list[tuple[str, str]] = []
    bound: set[str] = set()
    for node, module, names in _imports(tree):
        if module != "swiftclient" and not module.startswith("swiftclient."):
            continue
        where = f"{label}:{getattr(node, 'lineno', 0)}"
        if _private(module):
            found.append((module, f"{where} imports the private module {module}"))
            continue
        if isinstance(node, ast.Import):
            bound.update(a.asname or a.name.split(".")[0] for a in node.names)
        for name in names:
            if not _public_name(module, name):
                found.append((f"{module}.{name}", f"{where} imports {module}.{name}"))
    for node, module in _dynamic_imports(tree):
        if module.startswith("swiftclient") and _private(module):
            where = f"{label}:{getattr(node, 'lineno', 0)}"
            found.append((module, f"{where} imports the private module {module} dynamically"))
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in bound
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ):
            where = f"{label}:{node.lineno}"
            found.append((node.attr, f"{where} reaches swiftclient's private {node.attr}"))
    return found


def test_local_engine_uses_only_swiftclients_public_contract() -> None:
    problems: list[str] = []
    pending_seen: set[tuple[str, str]] = set()
    for path in _modules(ENGINE):
        label = _relative(path)
        for what, detail in _engine_violations(path.read_text(), label):
            key = (label, what)
            if key in PENDING:
                pending_seen.add(key)
            else:
                problems.append(detail)
    assert not problems, "\n".join(problems)
    stale = sorted(set(PENDING) - pending_seen)
    assert not stale, f"remove these PENDING entries, the import is gone: {stale}"


def test_swiftclient_never_imports_local_engine() -> None:
    problems = []
    for path in _modules(CLIENT):
        tree = ast.parse(path.read_text(), filename=str(path))
        imported = [(node, module) for node, module, _ in _imports(tree)]
        imported += list(_dynamic_imports(tree))
        for node, module in imported:
            if module == "local_engine" or module.startswith("local_engine."):
                problems.append(f"{_relative(path)}:{getattr(node, 'lineno', 0)} imports {module}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from swiftclient._deadline import Deadline", "swiftclient._deadline"),
        ("import swiftclient._httpserver", "swiftclient._httpserver"),
        ("from swiftclient.types import _percentile", "swiftclient.types._percentile"),
        ("from swiftclient.types import statistics", "swiftclient.types.statistics"),
        ("from swiftclient.backends.http import _ChunkStream", "swiftclient.backends.http."),
        ("import swiftclient\nswiftclient._client.AsyncClient", "_client"),
        ("import importlib\nimportlib.import_module('swiftclient._sse')", "swiftclient._sse"),
        ("def f():\n    from swiftclient.errors import _SECRET_PATTERNS", "_SECRET_PATTERNS"),
    ],
)
def test_the_direction_check_catches_each_kind_of_reach(source: str, expected: str) -> None:
    found = [what for what, _ in _engine_violations(source, "probe.py")]
    assert any(expected in what for what in found), found


def test_public_contract_is_accepted() -> None:
    for module, name in [
        ("swiftclient.extend", "Deadline"),
        ("swiftclient", "errors"),
        ("swiftclient.types", "ChatRequest"),
        ("swiftclient.backends", "check_backend_name"),
    ]:
        assert _public_name(module, name), (module, name)
    assert "Deadline" in swiftclient.extend.__all__ and "Timeout" in swiftclient.__all__


def test_swiftclient_finds_the_local_engine_through_its_entry_points() -> None:
    from local_engine import LocalBackend
    from local_engine.server import main

    backends = entry_points(group="swiftclient.backends", name="local")
    servers = entry_points(group="swiftclient.servers", name="local")
    assert [ep.load() for ep in backends] == [LocalBackend]
    assert [ep.load() for ep in servers] == [main]


def test_the_local_provider_and_serve_command_use_the_entry_points() -> None:
    from local_engine import LocalBackend
    from local_engine.server import main

    backend = preset("local", model="/no/such/dir", default_max_tokens=7, environ={})
    assert type(backend) is LocalBackend and backend.name == "local"
    assert type(from_env({"SWIFTCLIENT_PROVIDER": "local"})) is LocalBackend
    target = build_target(TargetOptions(backend="local"))
    assert type(target.backend) is LocalBackend and target.model == "default"
    assert local_server() is main


class _Broken:
    value = "local_engine.backend:LocalBackend"

    def load(self) -> object:
        raise ImportError("No module named 'torch'")


@pytest.mark.parametrize("registered", [[], [_Broken()]], ids=["absent", "broken"])
def test_without_the_local_engine_the_local_provider_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, registered: list[object]
) -> None:
    monkeypatch.setattr(providers, "entry_points", lambda **_: registered)
    with pytest.raises(ConfigurationError, match=r"swiftclient-llm\[local\]"):
        preset("local", environ={})
    with pytest.raises(ConfigurationError, match=r"swiftclient-llm\[local\]"):
        from_env({"SWIFTCLIENT_PROVIDER": "local"})
    with pytest.raises(ConfigurationError, match=r"swiftclient-llm\[local\]"):
        local_server()
    assert cli.main(["serve"]) == 2


# The engine core: what runs a model, and its helpers. Each imports nothing from swiftclient.
CORE_MODULES = [
    "local_engine",
    "local_engine.errors",
    "local_engine.config",
    "local_engine.loader",
    "local_engine.model",
    "local_engine.fp8",
    "local_engine.quant",
    "local_engine.weight_rows",
    "local_engine.gguf_loader",
    "local_engine.gguf_tokenizer",
    "local_engine.gptq",
    "local_engine.attention",
    "local_engine.attention.base",
    "local_engine.attention.cpu",
    "local_engine.attention.native",
    "local_engine.attention.reference",
    "local_engine.attention.triton_backend",
    "local_engine.kv_cache",
    "local_engine.scheduler",
    "local_engine.sequence",
    "local_engine.sampling_params",
    "local_engine.sampler",
    "local_engine.stop",
    "local_engine.generation",
    "local_engine.grammar",
    "local_engine.structured",
    "local_engine.tokenizer",
    "local_engine.step_buffers",
    "local_engine.runner",
    "local_engine.spec",
    "local_engine.spec.config",
    "local_engine.spec.draft",
    "local_engine.spec.ngram",
    "local_engine.spec.speculator",
    "local_engine.spec.verify",
    "local_engine.cpu_threads",
    "local_engine.cpu_memory",
    "local_engine.process",
    "local_engine.default_model",
    "local_engine.engine",
    "local_engine.async_engine",
]
# The OpenAI-compatible layer, which may speak swiftclient (its public contract).
ADAPTER_MODULES = {
    "local_engine.__main__",
    "local_engine.backend",
    "local_engine.builtin_tools",
    "local_engine.chat",
    "local_engine.completions",
    "local_engine.messages",
    "local_engine.metrics",
    "local_engine.responses",
    "local_engine.server",
    "local_engine.service",
    "local_engine.templates",
    "local_engine.tool_calls",
    "local_engine.tracing",
    "local_engine._default_corpus",
    "local_engine.attention.triton_kernels",  # needs triton; imported by the backend lazily
}

# Imports each of ``sys.argv[1:]`` with swiftclient blocked (an import that reaches it fails,
# and the next module is tried); prints the failures and what got loaded of ``watched``.
_BLOCKED_IMPORT = """
import importlib, json, sys

class _NoSwiftclient:
    def find_spec(self, name, path=None, target=None):
        if name == "swiftclient" or name.startswith("swiftclient."):
            raise ImportError(f"the engine core imported {name}")
        return None

sys.meta_path.insert(0, _NoSwiftclient())
failed = {}
for module in sys.argv[1:]:
    try:
        importlib.import_module(module)
    except ImportError as exc:
        failed[module] = str(exc)
watched = ("swiftclient", "httpx", "tenacity", "opentelemetry", "pydantic", "torch")
loaded = sorted(m for m in watched if m in sys.modules)
print(json.dumps({"failed": failed, "loaded": loaded}))
"""


def _import_blocked(*modules: str) -> tuple[dict[str, str], list[str]]:
    """Import ``modules`` in a fresh interpreter where importing swiftclient fails: the
    modules that failed (with why), and the watched packages that got loaded."""
    out = subprocess.run(
        [sys.executable, "-c", _BLOCKED_IMPORT, *modules],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    return report["failed"], report["loaded"]


def test_every_engine_module_is_core_or_adapter() -> None:
    found = set()
    for path in _modules(ENGINE):
        parts = path.relative_to(ROOT).with_suffix("").parts
        found.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    known = set(CORE_MODULES) | ADAPTER_MODULES
    assert found == known, f"new: {sorted(found - known)}; gone: {sorted(known - found)}"


def test_the_engine_core_imports_nothing_from_swiftclient() -> None:
    pytest.importorskip("torch")
    failed, loaded = _import_blocked(*CORE_MODULES)
    assert failed == {}
    assert "swiftclient" not in loaded


def test_the_scheduler_loads_no_client_machinery() -> None:
    failed, loaded = _import_blocked("local_engine.scheduler")
    assert failed == {}
    assert loaded == [], loaded  # no httpx, tenacity, opentelemetry, pydantic (nor torch)


def test_the_block_catches_a_module_that_imports_swiftclient() -> None:
    failed, loaded = _import_blocked("local_engine.service", "local_engine.kv_cache")
    assert list(failed) == ["local_engine.service"]
    assert "the engine core imported swiftclient" in failed["local_engine.service"]
    assert "swiftclient" not in loaded


def test_the_server_reaches_the_engine_without_a_client_deadline() -> None:
    tree = ast.parse((ENGINE / "server.py").read_text(), filename="server.py")
    imported = {
        name
        for _, module, names in _imports(tree)
        if module == "swiftclient" or module.startswith("swiftclient.")
        for name in names
    }
    assert not imported & {"Deadline", "Timeout"}, imported


# ---------------------------------------------------------------- import cycles in swiftclient


def _under_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_imports(body: list[ast.stmt], *, lazy: bool) -> Iterator[ast.Import | ast.ImportFrom]:
    """The imports in ``body`` that run: not under ``if TYPE_CHECKING``; those inside
    functions and classes too when ``lazy``."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If):
            if not _under_type_checking(node.test):
                yield from _runtime_imports(node.body, lazy=lazy)
            yield from _runtime_imports(node.orelse, lazy=lazy)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody):
                yield from _runtime_imports(block, lazy=lazy)
            for handler in node.handlers:
                yield from _runtime_imports(handler.body, lazy=lazy)
        elif isinstance(node, ast.With):
            yield from _runtime_imports(node.body, lazy=lazy)
        elif lazy and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            yield from _runtime_imports(node.body, lazy=lazy)


def _import_graph(sources: dict[str, tuple[str, bool]], *, lazy: bool) -> dict[str, set[str]]:
    """Module -> the modules of ``sources`` it imports when it runs. ``sources`` maps each
    dotted module name to (its source, whether it is a package's ``__init__``). Importing
    ``a.b.c`` runs ``a.b`` first, so that is an edge too, except to the importer's own
    packages (which always run before it)."""
    graph: dict[str, set[str]] = {}
    for module, (source, is_package) in sources.items():
        package = module.split(".") if is_package else module.split(".")[:-1]
        targets: set[str] = set()
        for node in _runtime_imports(ast.parse(source).body, lazy=lazy):
            if isinstance(node, ast.Import):
                named = [alias.name for alias in node.names]
            else:
                base = package[: len(package) - node.level + 1] if node.level else []
                origin = ".".join([*base, node.module] if node.module else base)
                submodules = [f"{origin}.{a.name}" for a in node.names]
                named = [m for m in submodules if m in sources]
                if len(named) < len(submodules):
                    named.append(origin)  # names defined in ``origin`` itself
            for name in named:
                parts = name.split(".")
                for end in range(1, len(parts) + 1):
                    target = ".".join(parts[:end])
                    if target in sources and not f"{module}.".startswith(f"{target}."):
                        targets.add(target)
        graph[module] = targets
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (each sorted)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while (member := stack.pop()) != node:
                component.append(member)
            component.append(node)
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def _client_sources(root: Path = CLIENT) -> dict[str, tuple[str, bool]]:
    sources = {}
    for path in _modules(root):
        parts = ("swiftclient", *path.relative_to(root).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        sources[".".join(parts[:-1] if is_package else parts)] = (path.read_text(), is_package)
    return sources


# Cycles allowed for now, each with why (none: a new one fails the test).
ALLOWED_CYCLES: list[list[str]] = []


@pytest.mark.parametrize("lazy", [False, True], ids=["module_level", "with_lazy_imports"])
def test_swiftclient_modules_import_each_other_without_a_cycle(lazy: bool) -> None:
    # Imports under TYPE_CHECKING (annotations only) are not edges. With ``lazy``, imports
    # inside functions are: a lazy import must not be what keeps two modules from a cycle.
    cycles = _cycles(_import_graph(_client_sources(), lazy=lazy))
    assert cycles == ALLOWED_CYCLES


def test_an_attempt_holds_no_reference_to_its_call() -> None:
    # An attempt is given what it needs and reports through ``AttemptOwner``: _attempt.py
    # imports nothing from _stream, not even for annotations, and never names ``Call``.
    tree = ast.parse((CLIENT / "_attempt.py").read_text())
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            modules.add("." * node.level + (node.module or ""))
            modules.update(f"{'.' * node.level}{a.name}" for a in node.names if not node.module)
        elif isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
    assert not {m for m in modules if m.split(".")[-1] == "_stream"}
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    names |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)}
    assert "Call" not in names | strings
    assert "_call" not in names


def test_the_cycle_check_finds_each_kind_of_cycle() -> None:
    sources = {
        "p": ("from . import a\n", True),
        "p.a": ("from .b import x\n", False),
        "p.b": ("def f():\n    from p.a import y\n", False),
        "p.c": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import p.a\n", False),
        "p.d": ("from p import e\n", False),
        "p.e": ("import p.d\n", False),
    }
    assert _cycles(_import_graph(sources, lazy=False)) == [["p.d", "p.e"]]
    assert _cycles(_import_graph(sources, lazy=True)) == [["p.a", "p.b"], ["p.d", "p.e"]]
