"""Test helpers: a real loopback OpenAI-compatible provider you script per request.

::

    from swiftclient.testing import FakeProvider, Reply

    async with FakeProvider() as fake:
        fake.script(Reply(status=429, retry_after=1), Reply(text="Hello there"))
        ...  # point any OpenAI-compatible client at fake.base_url

``FakeProvider(rate_limits=ProviderLimits(rpm=60, tpm=10_000))`` enforces rate limits
(``x-ratelimit-*`` headers on every chat response, 429 with ``Retry-After`` past them).

From synchronous code: ``with FakeProvider().run_in_thread() as fake: ...``; from a shell:
``python -m swiftclient.testing --port 8000``.
"""

from ._fake import FakeProvider, RecordedRequest
from ._limits import ProviderLimits
from ._prompt_cache import CacheSimulation
from ._reply import Reply, ReplyUsage

__all__ = [
    "CacheSimulation",
    "FakeProvider",
    "ProviderLimits",
    "RecordedRequest",
    "Reply",
    "ReplyUsage",
]
