"""The public API lives in swiftclient/__init__.py, sorted, and importing it stays light.

The top level holds what a program that makes calls writes; the machinery an extension
needs (attempt observers, the policy hub and its parts, deadlines, request options) is in
``swiftclient.extend`` and nowhere at the top level.
"""

from __future__ import annotations

import subprocess
import sys
from types import ModuleType

import pytest

import swiftclient
import swiftclient.extend

# What a user writes: clients, backends, messages and replies, errors, the knobs.
PUBLIC = [
    "APIConnectionError",
    "APIError",
    "APIResponseValidationError",
    "APIStatusError",
    "APITimeoutError",
    "AnthropicBackend",
    "AssistantMessage",
    "AsyncClient",
    "Attempt",
    "AuthenticationError",
    "Backend",
    "BackendNameWarning",
    "BadRequestError",
    "BatchProgress",
    "BatchResult",
    "CacheUsage",
    "CallCost",
    "ChatCompletion",
    "ChatCompletionChunk",
    "ChatRequest",
    "ChatStream",
    "Client",
    "ClientClosedError",
    "ConfigurationError",
    "ConflictError",
    "ConnectTimeout",
    "Conversation",
    "DeadlineExceeded",
    "EngineError",
    "FirstTokenTimeout",
    "HTTPBackend",
    "Hedge",
    "HedgeStats",
    "InternalServerError",
    "Message",
    "NotFoundError",
    "OverloadedError",
    "PermissionDeniedError",
    "PoolTimeout",
    "PrefixBreak",
    "PrefixBrokenWarning",
    "Price",
    "Pricing",
    "PromptPrefix",
    "ProviderOverloadedError",
    "RateLimitError",
    "RateLimited",
    "ReplicaBackend",
    "ReplicaStats",
    "ResponseTooLarge",
    "ResponsesBackend",
    "RetryPolicy",
    "StreamError",
    "StreamStalled",
    "StructuredOutputError",
    "SwiftClientError",
    "SyncChatStream",
    "Telemetry",
    "Timeout",
    "Timing",
    "Tool",
    "ToolCall",
    "UnprocessableEntityError",
    "Usage",
    "VolatilePrefixWarning",
    "__version__",
]

# The machinery behind the call path, for whoever extends it.
EXTEND = [
    "NOT_GIVEN",
    "AsyncHedgeGate",
    "AttemptObserver",
    "AttemptResult",
    "Breaker",
    "CircuitBreaker",
    "Deadline",
    "HedgeBudget",
    "HedgeGate",
    "LatencyEstimator",
    "LatencySource",
    "NotGiven",
    "PolicyHub",
    "RequestOptions",
    "RetryThrottle",
    "RouterLike",
    "Target",
    "Throttle",
    "prompt_bucket",
]


def test_the_top_level_exports_what_users_write() -> None:
    assert swiftclient.__all__ == PUBLIC


def test_the_machinery_is_in_the_extension_module_only() -> None:
    assert swiftclient.extend.__all__ == EXTEND
    for name in EXTEND:
        assert hasattr(swiftclient.extend, name), name
        assert not hasattr(swiftclient, name), f"swiftclient.{name} is still at the top level"
    assert swiftclient.extend.__doc__


@pytest.mark.parametrize("module", [swiftclient, swiftclient.extend], ids=lambda m: m.__name__)
def test_all_is_sorted_and_resolvable(module: ModuleType) -> None:
    names = module.__all__
    constants = [n for n in names if n.isupper()]
    others = [n for n in names if not n.isupper()]
    assert names == sorted(constants) + sorted(others)
    for name in names:
        assert hasattr(module, name), name


@pytest.mark.parametrize("module", [swiftclient, swiftclient.extend], ids=lambda m: m.__name__)
def test_public_members_are_exported_from_their_private_home(module: ModuleType) -> None:
    for name in module.__all__:
        obj = getattr(module, name)
        home = getattr(obj, "__module__", "swiftclient")
        assert home.startswith("swiftclient"), (name, home)


def test_import_does_not_pull_heavy_modules() -> None:
    code = (
        "import sys, swiftclient\n"
        "heavy = [m for m in ('torch', 'local_engine', 'opentelemetry.sdk', 'transformers')"
        " if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_an_attempt_copies_every_field_of_its_request_options() -> None:
    """The attempt builds its options field by field (not ``dataclasses.replace``): a field
    added to ``RequestOptions`` must be added there too."""
    import dataclasses

    from swiftclient.backends.base import RequestOptions

    assert [f.name for f in dataclasses.fields(RequestOptions)] == [
        "idempotency_key",
        "headers",
        "encoding",
        "on_response",
    ]
