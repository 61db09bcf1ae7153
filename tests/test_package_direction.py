"""Packages depend one way: ``local_engine`` uses swiftclient's public contract only, and
swiftclient never imports ``local_engine`` (it finds the engine through entry points).

Checked on the source with ``ast``, so an import inside a function, under ``TYPE_CHECKING``
or in a module no test imports is caught as well.
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterator
from importlib.metadata import entry_points
from pathlib import Path

import pytest

import swiftclient
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
        ("swiftclient", "Deadline"),
        ("swiftclient", "errors"),
        ("swiftclient.types", "ChatRequest"),
        ("swiftclient.backends", "check_backend_name"),
    ]:
        assert _public_name(module, name), (module, name)
    assert "Deadline" in swiftclient.__all__ and "Timeout" in swiftclient.__all__


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
