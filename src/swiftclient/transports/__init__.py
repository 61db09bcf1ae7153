"""Put swiftclient under the openai and anthropic SDKs (and the agent frameworks built on
them): an HTTP transport that answers the SDK's requests with a swiftclient client.

::

    import httpx2, openai
    from swiftclient import AsyncClient
    from swiftclient.transports import AsyncTransport

    client = AsyncClient(...)
    sdk = openai.AsyncOpenAI(
        base_url="http://swiftclient/v1",  # any URL: nothing is sent to it
        api_key="unused",  # the backends hold the real keys
        http_client=httpx2.AsyncClient(transport=AsyncTransport(client)),
        max_retries=0,  # the client retries, under one deadline
    )

``AsyncTransport`` / ``Transport`` are for ``httpx2`` (openai-python 3.x, anthropic 1.x);
``AsyncHttpxTransport`` / ``HttpxTransport`` for plain ``httpx``. The blocking ones take a
blocking :class:`~swiftclient.Client`. Served: Chat Completions (``POST .../chat/completions``),
OpenAI Responses (``POST .../responses``, stateless) and Anthropic Messages
(``POST .../messages``, for ``anthropic.AsyncAnthropic(http_client=...)``); the last two are
translated into the client's chat call and back by :mod:`swiftclient.wire`. Other paths
answer 404. See docs/integrations.md.
"""

from ._httpx import AsyncHttpxTransport, HttpxTransport
from ._httpx2 import AsyncTransport, Transport

__all__ = ["AsyncHttpxTransport", "AsyncTransport", "HttpxTransport", "Transport"]
