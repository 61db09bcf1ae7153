"""The OpenMP wait default: set before torch loads, never over the user's own setting.

Each case runs in a fresh interpreter, since the default is decided once per process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from local_engine.cpu_threads import DEFAULTS, SPIN_COUNT_ENV, WAIT_POLICY_ENV
from local_engine.engine import EngineConfig
from local_engine.errors import EngineConfigError

_REPORT = (
    "import json, os, sys\n"
    "{before}\n"
    "import local_engine\n"
    "from local_engine.cpu_threads import openmp_setup\n"
    "s = openmp_setup()\n"
    "env = {{k: os.environ.get(k) for k in ({wait!r}, {spin!r})}}\n"
    "print(json.dumps({{'env': env, 'applied': s.applied, 'user_set': s.user_set, "
    "'loaded_first': s.runtime_loaded_first, 'spinning': s.spinning_by_default}}))\n"
)


def _clean_env() -> dict[str, str]:
    """This process's environment without the wait settings (importing local_engine here
    may have set one)."""
    return {k: v for k, v in os.environ.items() if k not in (WAIT_POLICY_ENV, SPIN_COUNT_ENV)}


def _run(before: str = "", **env: str) -> dict[str, object]:
    code = _REPORT.format(before=before, wait=WAIT_POLICY_ENV, spin=SPIN_COUNT_ENV)
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**_clean_env(), **env},
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    result: dict[str, object] = json.loads(out.stdout)
    return result


def test_default_is_set_when_the_user_set_nothing() -> None:
    report = _run()
    assert report["applied"] == DEFAULTS
    assert report["env"] == {WAIT_POLICY_ENV: None, SPIN_COUNT_ENV: None, **DEFAULTS}
    assert report["user_set"] == {} and report["loaded_first"] is False


@pytest.mark.parametrize(
    "user",
    [{WAIT_POLICY_ENV: "ACTIVE"}, {WAIT_POLICY_ENV: "passive"}, {SPIN_COUNT_ENV: "300000"}],
)
def test_the_users_setting_is_left_alone(user: dict[str, str]) -> None:
    report = _run(**user)
    assert report["applied"] == {}
    assert report["user_set"] == user
    assert report["env"] == {WAIT_POLICY_ENV: None, SPIN_COUNT_ENV: None, **user}
    assert report["spinning"] is False


def test_nothing_is_set_once_torch_is_loaded() -> None:
    report = _run(before="import torch")
    assert report["applied"] == {} and report["user_set"] == {}
    assert report["env"] == {WAIT_POLICY_ENV: None, SPIN_COUNT_ENV: None}
    assert report["loaded_first"] is True and report["spinning"] is True


@pytest.mark.parametrize("torch_first", [True, False])
def test_torch_loaded_first_is_logged_once(torch_first: bool) -> None:
    imports = "import torch, local_engine" if torch_first else "import local_engine, torch"
    code = (
        f"import logging\n{imports}\n"
        "logging.basicConfig(level=logging.INFO, format='%(message)s')\n"
        "from local_engine.cpu_threads import log_openmp_setup\n"
        "log_openmp_setup(); log_openmp_setup()\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=_clean_env(),
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    expected = 1 if torch_first else 0
    assert out.stderr.count("torch was imported before local_engine") == expected


def test_num_threads_is_validated() -> None:
    with pytest.raises(EngineConfigError, match="num_threads"):
        EngineConfig(num_threads=0)
    assert EngineConfig(num_threads=1).num_threads == 1


@pytest.mark.anyio
async def test_local_backend_applies_the_thread_setting_when_it_loads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import local_engine.process
    from local_engine import LocalBackend

    # torch's thread count is per OpenMP thread, and the model loads in a worker thread, so
    # what the backend sets is seen where it sets it.
    seen: list[int] = []
    monkeypatch.setattr(local_engine.process, "set_num_threads", seen.append)
    config = EngineConfig(num_blocks=8, num_threads=3, tune_malloc=False)
    await LocalBackend(engine_config=config).warmup()
    assert seen == [3]
