"""swiftclient: a fast, dependable async client for OpenAI-compatible LLM APIs.

``await AsyncClient(...).chat(messages, model=...)``; see the README for a tour.
"""

from ._attempt import AttemptObserver, AttemptRun, Target
from ._batch import BatchProgress, BatchResult
from ._breaker import CircuitBreaker
from ._budget import HedgeBudget, RetryThrottle
from ._canonical import PromptPrefix
from ._client import NOT_GIVEN, AsyncClient, NotGiven, RouterLike
from ._cost import CallCost, HedgeStats, Price, Pricing
from ._deadline import Deadline, Timeout
from ._estimator import LatencyEstimator, prompt_bucket
from ._policies import PolicyHub
from ._retry import RetryPolicy
from ._stream import ChatStream
from ._sync import Client, SyncChatStream
from .backends.anthropic import AnthropicBackend
from .backends.base import Backend, RequestOptions
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
    "NOT_GIVEN",
    "APIConnectionError",
    "APIError",
    "APIResponseValidationError",
    "APIStatusError",
    "APITimeoutError",
    "AnthropicBackend",
    "AssistantMessage",
    "AsyncClient",
    "Attempt",
    "AttemptObserver",
    "AttemptRun",
    "AuthenticationError",
    "Backend",
    "BadRequestError",
    "BatchProgress",
    "BatchResult",
    "CacheUsage",
    "CallCost",
    "ChatCompletion",
    "ChatCompletionChunk",
    "ChatRequest",
    "ChatStream",
    "CircuitBreaker",
    "Client",
    "ConfigurationError",
    "ConflictError",
    "ConnectTimeout",
    "Conversation",
    "Deadline",
    "DeadlineExceeded",
    "EngineError",
    "FirstTokenTimeout",
    "HTTPBackend",
    "Hedge",
    "HedgeBudget",
    "HedgeStats",
    "InternalServerError",
    "LatencyEstimator",
    "Message",
    "NotFoundError",
    "NotGiven",
    "OverloadedError",
    "PermissionDeniedError",
    "PolicyHub",
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
    "RequestOptions",
    "ResponseTooLarge",
    "ResponsesBackend",
    "RetryPolicy",
    "RetryThrottle",
    "RouterLike",
    "StreamError",
    "StreamStalled",
    "StructuredOutputError",
    "SwiftClientError",
    "SyncChatStream",
    "Target",
    "Telemetry",
    "Timeout",
    "Timing",
    "Tool",
    "ToolCall",
    "UnprocessableEntityError",
    "Usage",
    "VolatilePrefixWarning",
    "__version__",
    "prompt_bucket",
]
