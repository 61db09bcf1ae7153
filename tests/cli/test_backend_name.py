"""The command line names a ``--base-url`` backend by its host in errors (it said ``cli``)."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest

from swiftclient.cli import main
from swiftclient.testing import FakeProvider, Reply

from .helpers import clear_provider_env


def test_an_error_names_the_base_url_host(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    clear_provider_env(monkeypatch)
    reply = Reply(status=404, error_message="The model does not exist.")
    with FakeProvider(reply).run_in_thread() as fake:
        host = urlsplit(fake.base_url).netloc
        assert main(["chat", "--base-url", fake.base_url, "-m", "nope", "hi"]) == 1
    err = capsys.readouterr().err
    assert f"NotFoundError: {host}: HTTP 404: The model does not exist." in err, err
    assert "cli:" not in err
