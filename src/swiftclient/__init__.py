"""swiftclient: a fast, dependable async client for OpenAI-compatible LLM APIs.

``await AsyncClient(...).chat(messages, model=...)``; see the README for a tour. The
machinery behind the call path (attempt observers, the policy hub, deadlines), for whoever
extends swiftclient, is in :mod:`swiftclient.extend`.
"""

from ._batch import BatchProgress, BatchResult
from ._canonical import PromptPrefix
from ._client import AsyncClient, BackendNameWarning
from ._cost import CallCost, HedgeStats, Price, Pricing
from ._deadline import Timeout
from ._retry import RetryPolicy
from ._stream import ChatStream
from ._sync import Client, SyncChatStream
from .backends.anthropic import AnthropicBackend
from .backends.base import Backend
from .backends.http import HTTPBackend
from .backends.replicas import ReplicaBackend, ReplicaStats
from .backends.responses import ResponsesBackend
from .conversation import Conversation, PrefixBrokenWarning
from .errors import (
    APIConnectionError,
    APIError,
    APIResponseValidationError,
    APIStatusError,
    APITimeoutError,
    AuthenticationError,
    BadRequestError,
    ClientClosedError,
    ConfigurationError,
    ConflictError,
    ConnectTimeout,
    DeadlineExceeded,
    EngineError,
    FirstTokenTimeout,
    InternalServerError,
    NotFoundError,
    OverloadedError,
    PermissionDeniedError,
    PoolTimeout,
    ProviderOverloadedError,
    RateLimited,
    RateLimitError,
    ResponseTooLarge,
    StreamError,
    StreamStalled,
    StructuredOutputError,
    SwiftClientError,
    UnprocessableEntityError,
)
from .hedging import Hedge
from .prompt_cache import CacheUsage, PrefixBreak, VolatilePrefixWarning
from .telemetry import Telemetry
from .types import (
    AssistantMessage,
    Attempt,
    ChatCompletion,
    ChatCompletionChunk,
    ChatRequest,
    Message,
    Timing,
    Tool,
    ToolCall,
    Usage,
)

__version__ = "0.1.0"

__all__ = [
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
