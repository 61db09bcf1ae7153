"""Test helpers: a real loopback OpenAI-compatible provider you script per request.

::

    from swiftclient.testing import FakeProvider, Reply

    async with FakeProvider() as fake:
        fake.script(Reply(status=429, retry_after=1), Reply(text="Hello there"))
        ...  # point any OpenAI-compatible client at fake.base_url

From synchronous code: ``with FakeProvider().run_in_thread() as fake: ...``; from a shell:
``python -m swiftclient.testing --port 8000``.
"""

from ._fake import FakeProvider, RecordedRequest
from ._prompt_cache import CacheSimulation
from ._reply import Reply, ReplyUsage

__all__ = ["CacheSimulation", "FakeProvider", "RecordedRequest", "Reply", "ReplyUsage"]
