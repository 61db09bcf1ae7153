"""The public API lives in swiftclient/__init__.py, sorted, and importing it stays light."""

from __future__ import annotations

import subprocess
import sys

import swiftclient


def test_all_is_sorted_and_resolvable() -> None:
    names = swiftclient.__all__
    constants = [n for n in names if n.isupper()]
    others = [n for n in names if not n.isupper()]
    assert names == sorted(constants) + sorted(others)
    for name in names:
        assert hasattr(swiftclient, name), name


def test_public_members_are_exported_from_their_private_home() -> None:
    for name in swiftclient.__all__:
        obj = getattr(swiftclient, name)
        module = getattr(obj, "__module__", "swiftclient")
        assert module.startswith("swiftclient"), (name, module)


def test_import_does_not_pull_heavy_modules() -> None:
    code = (
        "import sys, swiftclient\n"
        "heavy = [m for m in ('torch', 'local_engine', 'opentelemetry.sdk', 'transformers')"
        " if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
